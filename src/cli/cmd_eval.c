/* `fp8train eval WEIGHTS`: validation loss and perplexity in BF16 and/or FP8 inference (and
 * FP32), the FP8 - BF16 gap against a threshold, llm.c multiple-choice tasks, and the export
 * round-trip check. Exit status: 0 ok, 1 flagged (gap above the threshold, or an export that
 * does not reproduce the checkpoint), 2 bad input or usage. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_weights_common.h"
#include "fp8train/backend.h"
#include "fp8train/checkpoint.h"
#include "fp8train/data.h"
#include "fp8train/eval.h"
#include "fp8train/export.h"
#include "fp8train/infer.h"
#include "fp8train/io.h"

#define CMD "eval"
#define MAX_TASKS 16

static void usage(FILE *f) {
    fprintf(f,
        "usage: fp8train eval WEIGHTS [options]\n"
        "  Validation loss of WEIGHTS in BF16 and FP8 inference, their difference, and more.\n"
        "  WEIGHTS: a checkpoint directory (RUN/checkpoints/step_N), a Hugging Face directory\n"
        "  (our export or a GPT-2/Llama from the Hub) or an llm.c GPT-2 .bin.\n"
        "  FP8 inference runs every linear GEMM in FP8 with delayed scaling from the weights'\n"
        "  FP8 state (the scales learned in training; no history update); weights without an\n"
        "  amax history are calibrated first on training micro-batches.\n"
        "options:\n"
        "  --data SRC            synthetic | text file | 'dir/*.bin' shards (default: the\n"
        "                        checkpoint's training data, else synthetic)\n"
        "  --val-data SRC        separate validation source (default: the held-out split)\n"
        "  --tokenizer FILE      tokenizer.json for text/JSONL data (default: the run's)\n"
        "  --precision P         bf16 | fp8 | fp32 | both (bf16 and fp8, default) | all\n"
        "  --batches N           validation micro-batches (default: the run's val_batches, else 10)\n"
        "  --batch B --seq-len T micro-batch shape (default: the run's, else 8 and min(seq_len, 256))\n"
        "  --seed S              data seed (default: the checkpoint's seed, else 1337)\n"
        "  --threshold X         flag |fp8 - bf16| / bf16 above X (default 0.01): exit 1\n"
        "  --check-export DIR    evaluate the export DIR (fp8train export) on the same batches\n"
        "                        and fail if its loss differs beyond rounding: relative %.0e\n"
        "                        (fp32), %.0e (bf16), %.0e (fp8 export)\n"
        "  --task FILE           llm.c multiple-choice eval file (HellaSwag .bin); repeatable;\n"
        "                        accuracy per precision (completion with the lowest mean loss)\n"
        "  --calib-batches N     micro-batches for FP8 calibration (default 4): the training\n"
        "                        model's when the weights carry no amax history, the inference\n"
        "                        model's with --infer --act-scale calibrated\n"
        "  --device cpu|cuda     backend (default: the run's, else cpu)\n"
        "  --dump-tokens FILE    write the evaluated windows as .npy int32 [batches, B, T+1]\n"
        "                        (compute the same loss elsewhere, e.g. tests/check_hf_transformers.py)\n"
        "  --infer               the loss (and --task accuracy) through the inference model\n"
        "                        (fp8train/infer.h: the weights in each precision only, no\n"
        "                        training state on the device) instead of the training model;\n"
        "                        not with --check-export\n"
        "  --act-scale current|delayed|calibrated  with --infer: fp8 activation scales from\n"
        "                        each input's amax (default), the learned ones (calibrated first\n"
        "                        by the training model when the weights have none), or fixed\n"
        "                        by the inference model from the input amaxes of\n"
        "                        --calib-batches training-split batches of --calib-data\n"
        "  --calib-data SRC      with --infer --act-scale calibrated: the calibration data\n"
        "                        (default: --data; its training split)\n"
        "  --kv-cache bf16|fp8|fp32  with --infer: the KV cache kind (read by --decode-loss)\n"
        "  --fp8-head            with --infer: fp8 with the embedding table and the head in\n"
        "                        E4M3 too (a vocabulary that is a multiple of 16)\n"
        "  --decode-loss         with --infer: the loss through the KV cache (the first token\n"
        "                        prefilled, then one decode step per position, teacher forced)\n"
        "                        instead of the full-window forward\n"
        "  --json                print one JSON object instead of the table\n"
        "exit status: 0 ok, 1 flagged (FP8 gap above threshold or export check failed), 2 bad input\n",
        FP8T_EXPORT_TOL_FP32, FP8T_EXPORT_TOL_BF16, FP8T_EXPORT_TOL_FP8);
}

typedef struct {
    const char *weights, *data, *val_data, *check_export, *dump_tokens, *device, *tokenizer;
    const char *tasks[MAX_TASKS];
    int n_tasks;
    int want[FP8T_EVAL_COUNT];
    int batches, B, T, json, infer, decode_loss;
    cli_infer_opts io;
    int have_seed;
    uint64_t seed;
    float threshold;
} eval_opts;

static int parse_args(eval_opts *o, int argc, char **argv) {
    memset(o, 0, sizeof(*o));
    o->want[FP8T_EVAL_BF16] = o->want[FP8T_EVAL_FP8] = 1;
    o->threshold = 0.01f;
    cli_infer_opts_init(&o->io);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--infer")) { o->infer = 1; continue; }
        if (!strcmp(a, "--decode-loss")) { o->decode_loss = 1; continue; }
        if (cli_infer_flag(a, &o->io)) continue;
        if (a[0] != '-' || !a[1]) {
            if (o->weights) {
                fprintf(stderr, "fp8train eval: one WEIGHTS argument expected, got '%s' and '%s'\n",
                        o->weights, a);
                return -1;
            }
            o->weights = a;
            continue;
        }
        if (!(v = cli_value(CMD, argc, argv, &i))) return -1;
        if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--val-data")) o->val_data = v;
        else if (!strcmp(a, "--tokenizer")) o->tokenizer = v;
        else if (!strcmp(a, "--check-export")) o->check_export = v;
        else if (!strcmp(a, "--dump-tokens")) o->dump_tokens = v;
        else if (!strcmp(a, "--device")) o->device = v;
        else if (!strcmp(a, "--task")) {
            if (o->n_tasks == MAX_TASKS) {
                fprintf(stderr, "fp8train eval: at most %d --task files\n", MAX_TASKS);
                return -1;
            }
            o->tasks[o->n_tasks++] = v;
        } else if (!strcmp(a, "--precision")) {
            memset(o->want, 0, sizeof(o->want));
            fp8t_eval_precision p;
            if (!strcmp(v, "both")) o->want[FP8T_EVAL_BF16] = o->want[FP8T_EVAL_FP8] = 1;
            else if (!strcmp(v, "all")) o->want[0] = o->want[1] = o->want[2] = 1;
            else if (fp8t_eval_precision_parse(&p, v) == 0) o->want[p] = 1;
            else {
                fprintf(stderr, "fp8train eval: --precision '%s': expected bf16, fp8, fp32, both or "
                        "all\n", v);
                return -1;
            }
        } else if (!strcmp(a, "--batches")) { if (cli_int(CMD, a, v, 1, 1000000, &o->batches)) return -1; }
        else if (!strcmp(a, "--batch")) { if (cli_int(CMD, a, v, 1, 1 << 20, &o->B)) return -1; }
        else if (!strcmp(a, "--seq-len")) { if (cli_int(CMD, a, v, 1, 1 << 20, &o->T)) return -1; }
        else if (!strcmp(a, "--seed")) { if (cli_u64(CMD, a, v, &o->seed)) return -1; o->have_seed = 1; }
        else if (!strcmp(a, "--threshold")) { if (cli_float(CMD, a, v, 0, 1e9, &o->threshold)) return -1; }
        else {
            const int r = cli_infer_option(CMD, a, v, &o->io);
            if (r < 0) return -1;
            if (r) continue;
            fprintf(stderr, "fp8train eval: unknown option '%s' (see fp8train eval --help)\n", a);
            return -1;
        }
    }
    if (!o->weights) {
        fprintf(stderr, "fp8train eval: which weights? give a checkpoint directory, a Hugging Face "
                "directory or an llm.c .bin (see fp8train eval --help)\n");
        return -1;
    }
    if (o->decode_loss && !o->infer) {
        fprintf(stderr, "fp8train eval: --decode-loss runs the inference model's KV cache; add "
                "--infer\n");
        return -1;
    }
    if (o->infer && o->check_export) {
        fprintf(stderr, "fp8train eval: --check-export compares the training model's losses; run "
                "it without --infer\n");
        return -1;
    }
    return 0;
}

/* Where a calibrated fp8 inference model takes its calibration batches from. */
typedef struct {
    const char *data, *val_data, *tokenizer;
    uint64_t seed;
} calib_src;

/* An inference model of w in precision p for [B, T], calibrated when asked. NULL after a
 * message. */
static fp8t_infer *infer_model(fp8t_backend *be, const fp8t_weights *w, fp8t_eval_precision p,
                               const cli_infer_opts *io, const calib_src *cs, int B, int T) {
    char err[1024];
    fp8t_infer_opts mo;
    cli_infer_model_opts(io, p, &mo);
    fp8t_infer *m = fp8t_infer_create_opts(be, w, &mo, B, T, err, sizeof(err));
    if (!m || cli_infer_calibrate(m, cs->data, cs->val_data, cs->tokenizer, cs->seed,
                                  io->calib_batches, B, T, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train eval: --infer %s: %s\n", fp8t_eval_precision_name(p), err);
        fp8t_infer_destroy(m);
        return NULL;
    }
    return m;
}

/* Loss in precision p through the inference model (built for [B, T] on be, destroyed after)
 * on micro-batches 0..batches-1 of d: the mean of the per-batch mean losses, as
 * fp8t_evaluator_loss. NaN after a message on failure. */
static double infer_loss(fp8t_backend *be, const fp8t_weights *w, fp8t_eval_precision p,
                         const cli_infer_opts *io, const calib_src *cs, const fp8t_data *d,
                         int batches, int B, int T, int decode) {
    char err[1024];
    fp8t_infer *m = infer_model(be, w, p, io, cs, B, T);
    int *tok = malloc((size_t)B * T * sizeof(int)), *tgt = malloc((size_t)B * T * sizeof(int));
    double sum = 0.0;
    if (!m || !tok || !tgt) {
        if (m) fprintf(stderr, "fp8train eval: --infer: out of memory\n");
        sum = NAN;
    }
    for (int i = 0; i < batches && !isnan(sum); i++) {
        fp8t_data_batch(d, tok, tgt, (uint64_t)i);
        double l = decode ? fp8t_infer_loss_decode(m, tok, tgt, B, T, err, sizeof(err))
                          : fp8t_infer_loss(m, tok, tgt, B, T, err, sizeof(err));
        if (isnan(l)) fprintf(stderr, "fp8train eval: --infer: %s\n", err);
        sum += l;
    }
    free(tok);
    free(tgt);
    fp8t_infer_destroy(m);
    return batches > 0 ? sum / batches : NAN;
}

/* Loss of the evaluator in precision p on micro-batches 0..batches-1 of d. */
static double loss_in(fp8t_evaluator *ev, const fp8t_data *d, int batches, fp8t_eval_precision p) {
    fp8t_evaluator_set_precision(ev, p);
    return fp8t_evaluator_loss(ev, d, batches);
}

static int dump_tokens(const char *path, const fp8t_data *d, int batches, int B, int T) {
    const size_t per = (size_t)B * (T + 1);
    int32_t *out = malloc((size_t)batches * per * sizeof(int32_t)); /* [batches, B, T+1] */
    int *tok = malloc((size_t)B * T * sizeof(int)), *tgt = malloc((size_t)B * T * sizeof(int));
    char err[512];
    int rc = -1;
    if (out && tok && tgt) {
        for (int i = 0; i < batches; i++) {
            fp8t_data_batch(d, tok, tgt, (uint64_t)i);
            for (int b = 0; b < B; b++) {
                int32_t *row = out + (size_t)i * per + (size_t)b * (T + 1);
                for (int t = 0; t < T; t++) row[t] = tok[(size_t)b * T + t];
                row[T] = tgt[(size_t)b * T + T - 1]; /* targets are the tokens shifted by one */
            }
        }
        int64_t shape[3] = {batches, B, T + 1};
        rc = fp8t_npy_write(path, "<i4", 3, shape, out, err, sizeof(err));
        if (rc) fprintf(stderr, "fp8train eval: --dump-tokens: %s\n", err);
    }
    free(out);
    free(tok);
    free(tgt);
    return rc;
}

int fp8t_cmd_eval(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], "eval")) { argc--; argv++; }
    eval_opts o;
    int pr = parse_args(&o, argc, argv);
    if (pr == 1) { usage(stdout); return 0; }
    if (pr != 0) return 2;
    char err[2048], desc[512];
    fp8t_weights w, wx;
    memset(&wx, 0, sizeof(wx));
    if (fp8t_weights_load(o.weights, &w, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train eval: %s\n", err);
        return 2;
    }
    cli_run_defaults def;
    cli_run_defaults_from(&w, &def);
    const char *data = o.data ? o.data : def.data;
    const char *val_data = o.val_data ? o.val_data : (o.data ? "" : def.val_data);
    /* the model's tokenizer applies to any text data given to it */
    const char *tokenizer = o.tokenizer ? o.tokenizer : def.tokenizer;
    const int B = o.B ? o.B : def.batch, batches = o.batches ? o.batches : def.val_batches;
    const int T = o.T ? o.T : def.seq_len;
    const uint64_t seed = o.have_seed ? o.seed : def.seed;
    const char *device = o.device ? o.device : def.device;
    int status = 2, n_prec = 0;
    double loss[FP8T_EVAL_COUNT] = {NAN, NAN, NAN};
    fp8t_backend *be = NULL;
    fp8t_evaluator *ev = NULL, *evx = NULL;
    fp8t_data *d = NULL;
    cJSON *js = cJSON_CreateObject();
    for (int p = 0; p < FP8T_EVAL_COUNT; p++) n_prec += o.want[p];
    if (T > w.model.seq_len) {
        fprintf(stderr, "fp8train eval: --seq-len %d exceeds the model's maximum %d\n", T, w.model.seq_len);
        goto done;
    }
    cli_debug_opts dbg;
    if (cli_debug_options("eval", &dbg) != 0) goto done;
    if (!(be = fp8t_backend_create(device, &dbg.backend, err, sizeof(err)))) {
        fprintf(stderr, "fp8train eval: --device %s: %s\n", device, err);
        goto done;
    }
    /* the training model: for its own loss, and for calibrating FP8 scales that the weights
     * lack (with --infer only when the learned scales are asked for; it is freed before the
     * inference models are built, so they never share the device with it) */
    const int need_calib =
        o.want[FP8T_EVAL_FP8] && (!o.infer || o.io.act == FP8T_ACT_SCALE_DELAYED);
    if ((!o.infer || need_calib) && !(ev = fp8t_evaluator_create(be, &w, &dbg.model, B, T, err, sizeof(err)))) {
        fprintf(stderr, "fp8train eval: %s\n", err);
        goto done;
    }
    if (!(d = fp8t_data_open_tok(data, val_data, tokenizer, FP8T_SPLIT_VAL, B, T,
                                 w.model.vocab_size, seed, err, sizeof(err)))) {
        fprintf(stderr, "fp8train eval: data: %s\n", err);
        goto done;
    }
    const calib_src cs = {o.io.calib_data ? o.io.calib_data : data,
                          o.io.calib_data ? "" : val_data, tokenizer, seed};
    if (need_calib &&
        cli_calibrate_tok(ev, &w, data, val_data, tokenizer, seed, o.io.calib_batches, o.json, err,
                          sizeof(err)) < 0) {
        fprintf(stderr, "fp8train eval: %s\n", err);
        goto done;
    }
    if (o.infer) {
        fp8t_evaluator_destroy(ev);
        ev = NULL;
    }
    cli_describe_weights(desc, sizeof(desc), &w);
    if (!o.json) {
        printf("weights: %s (%s)\n", o.weights, desc);
        if (w.notes[0]) printf("  import: %s\n", w.notes);
        printf("data: %s; %d micro-batch%s of %d x %d tokens, seed %llu\n", fp8t_data_describe(d),
               batches, batches == 1 ? "" : "es", B, T, (unsigned long long)seed);
        if (o.infer) {
            printf("model: the inference model (weights in each precision only; fp8: E4M3 per "
                   "tensor, head bf16, activations %s scaling", fp8t_act_scale_name(o.io.act));
            if (o.io.act == FP8T_ACT_SCALE_CALIBRATED)
                printf(" on %d training-split batches of %s", o.io.calib_batches, cs.data);
            printf(")%s\n", o.decode_loss ? "; loss through the KV cache (decode steps)" : "");
            if (o.decode_loss)
                printf("KV cache: %s\n", o.io.kv < 0 ? "the precision's (bf16; fp32 in fp32, "
                                                       "fp8 in fp8)"
                                                     : cli_kv_name(o.io.kv));
        }
        printf("%-10s %-10s %s\n", "precision", "loss", "perplexity");
    }
    cJSON_AddBoolToObject(js, "infer", o.infer);
    if (o.infer) {
        cJSON_AddStringToObject(js, "act_scale", fp8t_act_scale_name(o.io.act));
        if (o.io.act == FP8T_ACT_SCALE_CALIBRATED) {
            cJSON_AddStringToObject(js, "calib_data", cs.data);
            cJSON_AddNumberToObject(js, "calib_batches", o.io.calib_batches);
        }
        cJSON_AddBoolToObject(js, "decode_loss", o.decode_loss);
        cJSON_AddStringToObject(js, "kv_cache", o.io.kv < 0 ? "default" : cli_kv_name(o.io.kv));
    }
    cJSON_AddStringToObject(js, "weights", o.weights);
    cJSON_AddStringToObject(js, "description", desc);
    cJSON_AddStringToObject(js, "data", fp8t_data_describe(d));
    cJSON_AddNumberToObject(js, "batches", batches);
    cJSON_AddNumberToObject(js, "batch", B);
    cJSON_AddNumberToObject(js, "seq_len", T);
    cJSON *jl = cJSON_AddObjectToObject(js, "loss");
    int bad_tokens = 0;
    for (int p = 0; p < FP8T_EVAL_COUNT; p++) {
        if (!o.want[p]) continue;
        loss[p] = o.infer ? infer_loss(be, &w, (fp8t_eval_precision)p, &o.io, &cs, d, batches, B,
                                       T, o.decode_loss)
                          : loss_in(ev, d, batches, (fp8t_eval_precision)p);
        bad_tokens |= isnan(loss[p]);
        cJSON_AddNumberToObject(jl, fp8t_eval_precision_name((fp8t_eval_precision)p), loss[p]);
        if (!o.json)
            printf("%-10s %-10.6f %.4f\n", fp8t_eval_precision_name((fp8t_eval_precision)p), loss[p],
                   exp(loss[p]));
    }
    if (bad_tokens) {
        fprintf(stderr, "fp8train eval: the loss is not a number (see the message above: tokens "
                "outside the model's vocabulary?)\n");
        goto done;
    }
    status = 0;
    if (o.want[FP8T_EVAL_BF16] && o.want[FP8T_EVAL_FP8]) {
        double diff = loss[FP8T_EVAL_FP8] - loss[FP8T_EVAL_BF16], rel = diff / loss[FP8T_EVAL_BF16];
        int flag = fabs(rel) > o.threshold;
        if (!o.json)
            printf("fp8 - bf16 %+.6f (%+.3f%%)  %s (threshold %.3g%%)\n", diff, 100 * rel,
                   flag ? "FLAGGED: above" : "ok: within", 100.0 * o.threshold);
        cJSON_AddNumberToObject(js, "fp8_minus_bf16", diff);
        cJSON_AddNumberToObject(js, "relative_gap", rel);
        cJSON_AddBoolToObject(js, "flagged", flag);
        if (flag) status = 1;
    }
    if (o.dump_tokens && dump_tokens(o.dump_tokens, d, batches, B, T) != 0) { status = 2; goto done; }

    /* tasks: an evaluator shaped for each file, built from w (with its calibrated state) */
    cJSON *jt = o.n_tasks ? cJSON_AddArrayToObject(js, "tasks") : NULL;
    for (int k = 0; k < o.n_tasks; k++) {
        fp8t_task t;
        if (fp8t_task_read(o.tasks[k], &t, err, sizeof(err)) != 0) {
            fprintf(stderr, "fp8train eval: --task: %s\n", err);
            status = 2;
            goto done;
        }
        int tB = t.max_completions > B ? t.max_completions : B, tT = t.longest > 0 ? t.longest : 1;
        if (tT > w.model.seq_len) {
            fprintf(stderr, "fp8train eval: --task %s: an example needs %d positions but the model's "
                    "maximum sequence length is %d\n", o.tasks[k], tT, w.model.seq_len);
            fp8t_task_free(&t);
            status = 2;
            goto done;
        }
        fp8t_evaluator *te = o.infer ? NULL
                                     : fp8t_evaluator_create(be, &w, &dbg.model, tB, tT, err,
                                                             sizeof(err));
        if (!te && !o.infer) {
            fprintf(stderr, "fp8train eval: --task %s: %s\n", o.tasks[k], err);
            fp8t_task_free(&t);
            status = 2;
            goto done;
        }
        cJSON *jo = cJSON_CreateObject();
        cJSON_AddItemToArray(jt, jo);
        cJSON_AddStringToObject(jo, "file", o.tasks[k]);
        cJSON_AddNumberToObject(jo, "examples", t.n);
        cJSON *ja = cJSON_AddObjectToObject(jo, "accuracy");
        if (!o.json) printf("task %s: %d examples ", o.tasks[k], t.n);
        for (int p = 0; p < FP8T_EVAL_COUNT; p++) {
            if (!o.want[p]) continue;
            int correct = 0, trc;
            if (o.infer) { /* an inference model of this precision, shaped for the task */
                fp8t_infer *im = infer_model(be, &w, (fp8t_eval_precision)p, &o.io, &cs, tB, tT);
                trc = im ? fp8t_infer_task_eval(im, &t, &correct, NULL, err, sizeof(err)) : -1;
                if (!im) snprintf(err, sizeof(err), "cannot build the inference model");
                fp8t_infer_destroy(im);
            } else {
                fp8t_evaluator_set_precision(te, (fp8t_eval_precision)p);
                trc = fp8t_task_eval(te, &t, &correct, NULL, err, sizeof(err));
            }
            if (trc != 0) {
                fprintf(stderr, "\nfp8train eval: --task %s: %s\n", o.tasks[k], err);
                fp8t_evaluator_destroy(te);
                fp8t_task_free(&t);
                status = 2;
                goto done;
            }
            double acc = t.n ? (double)correct / t.n : 0.0;
            cJSON_AddNumberToObject(ja, fp8t_eval_precision_name((fp8t_eval_precision)p), acc);
            if (!o.json) printf(" %s %.4f (%d/%d)", fp8t_eval_precision_name((fp8t_eval_precision)p),
                                acc, correct, t.n);
        }
        if (!o.json) printf("\n");
        fp8t_evaluator_destroy(te);
        fp8t_task_free(&t);
    }

    /* the export round trip: same batches, loss within the export dtype's rounding */
    if (o.check_export) {
        if (fp8t_weights_load(o.check_export, &wx, err, sizeof(err)) != 0) {
            fprintf(stderr, "fp8train eval: --check-export: %s\n", err);
            status = 2;
            goto done;
        }
        char e2[512];
        if (fp8t_model_config_diff(&w.model, &wx.model, e2, sizeof(e2)) != 0) {
            fprintf(stderr, "fp8train eval: --check-export %s: the export is another model: %s\n",
                    o.check_export, e2);
            status = 1;
            goto done;
        }
        if (!(evx = fp8t_evaluator_create(be, &wx, &dbg.model, B, T, err, sizeof(err)))) {
            fprintf(stderr, "fp8train eval: --check-export: %s\n", err);
            status = 2;
            goto done;
        }
        const double tol = wx.stored_dtype == FP8T_EXPORT_FP32 ? FP8T_EXPORT_TOL_FP32
                           : wx.stored_dtype == FP8T_EXPORT_BF16 ? FP8T_EXPORT_TOL_BF16
                                                                 : FP8T_EXPORT_TOL_FP8;
        /* BF16 always; FP32 when asked; FP8 only when the export carries the learned scales
         * (a per-tensor FP8 export's input_scale seeds wx's FP8 state) — a BF16/FP32 export has
         * none to compare, nor has a block-scaled one (dynamic activation scales) */
        const int has_scales = wx.stored_dtype == FP8T_EXPORT_FP8 && wx.fp8_state;
        int cmp[FP8T_EVAL_COUNT] = {1, o.want[FP8T_EVAL_FP8] && has_scales, o.want[FP8T_EVAL_FP32]};
        if (!o.json && o.want[FP8T_EVAL_FP8] && wx.stored_dtype == FP8T_EXPORT_FP8 && !has_scales)
            printf("export check %s (fp8 export), fp8: not compared (the export carries no "
                   "activation scales: dynamic scaling, e.g. --block 128)\n", o.check_export);
        cJSON *jc = cJSON_AddObjectToObject(js, "export_check");
        cJSON_AddStringToObject(jc, "dir", o.check_export);
        cJSON_AddStringToObject(jc, "dtype", fp8t_export_dtype_name(wx.stored_dtype));
        cJSON_AddNumberToObject(jc, "tolerance", tol);
        int ok = 1;
        for (int p = 0; p < FP8T_EVAL_COUNT; p++) {
            if (!cmp[p]) continue;
            if (isnan(loss[p])) loss[p] = loss_in(ev, d, batches, (fp8t_eval_precision)p);
            double lx = loss_in(evx, d, batches, (fp8t_eval_precision)p);
            double rel = fabs(lx - loss[p]) / fabs(loss[p]);
            int good = rel <= tol;
            ok &= good;
            const char *pn = fp8t_eval_precision_name((fp8t_eval_precision)p);
            cJSON *jp = cJSON_AddObjectToObject(jc, pn);
            cJSON_AddNumberToObject(jp, "export_loss", lx);
            cJSON_AddNumberToObject(jp, "weights_loss", loss[p]);
            cJSON_AddNumberToObject(jp, "relative_difference", rel);
            if (!o.json)
                printf("export check %s (%s export), %s: loss %.6f vs %.6f, relative difference "
                       "%.2e %s %.0e: %s\n", o.check_export, fp8t_export_dtype_name(wx.stored_dtype),
                       pn, lx, loss[p], rel, good ? "<=" : ">", tol, good ? "ok" : "FAILED");
        }
        cJSON_AddBoolToObject(jc, "ok", ok);
        if (!ok) {
            status = 1;
            if (!o.json)
                fprintf(stderr, "fp8train eval: the export %s does not reproduce %s: a broken export "
                        "(layout, transposition, scales) is the usual cause of downstream gaps\n",
                        o.check_export, o.weights);
        }
    }
done:
    cJSON_AddNumberToObject(js, "exit_status", status);
    if (o.json) {
        char *s = cJSON_PrintUnformatted(js);
        printf("%s\n", s);
        free(s);
    }
    cJSON_Delete(js);
    fp8t_data_close(d);
    fp8t_evaluator_destroy(ev);
    fp8t_evaluator_destroy(evx);
    fp8t_backend_destroy(be);
    fp8t_weights_free(&w);
    fp8t_weights_free(&wx);
    (void)n_prec;
    return status;
}
