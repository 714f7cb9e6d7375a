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
#include "fp8train/error.h"
#include "fp8train/eval.h"
#include "fp8train/export.h"
#include "fp8train/infer.h"
#include "fp8train/io.h"

#define CMD "eval"
#define MAX_TASKS 16

typedef struct {
    const char *data, *val_data, *check_export, *dump_tokens, *device, *tokenizer;
    const char *tasks[MAX_TASKS];
    int n_tasks;
    int precisions; /* bit p: evaluate in precision p (--precision) */
    int batches, B, T, json, infer, decode_loss; /* 0 (batches, B, T): the run's */
    cli_infer_opts io;
    int have_seed;
    uint64_t seed;
    float threshold;
} eval_opts;

static int set_task(void *obj, const char *v, char *err, size_t errlen) {
    eval_opts *o = obj;
    if (o->n_tasks == MAX_TASKS) {
        return fp8t_errorf(err, errlen, "at most %d --task files", MAX_TASKS);
    }
    o->tasks[o->n_tasks++] = v;
    return 0;
}
static int set_seed(void *obj, const char *v, char *err, size_t errlen) {
    eval_opts *o = obj;
    return cli_set_u64_given("seed", v, &o->seed, &o->have_seed, err, errlen);
}

/* --precision as a set of precisions: one, both (bf16 and fp8) or all three */
#define PBIT(p) (1 << (p))
static const fp8t_opt_choice PRECISION_SETS[] = {
    {"bf16", PBIT(FP8T_EVAL_BF16)},
    {"fp8", PBIT(FP8T_EVAL_FP8)},
    {"fp32", PBIT(FP8T_EVAL_FP32)},
    {"both", PBIT(FP8T_EVAL_BF16) | PBIT(FP8T_EVAL_FP8)},
    {"all", PBIT(FP8T_EVAL_BF16) | PBIT(FP8T_EVAL_FP8) | PBIT(FP8T_EVAL_FP32)},
    {NULL, 0}};

/* the export check's tolerances in its help, from the constants the check uses */
#define STR_(x) #x
#define STR(x) STR_(x)

#define F(f) FP8T_OPT_FIELD(eval_opts, f)
#define G_INFER "With --infer (the inference model)"
static const fp8t_opt OPTS[] = {
    {.name = "data",
     .arg = "SRC",
     .type = FP8T_OPT_STR,
     F(data),
     .dflt = "the checkpoint's training data, else synthetic",
     .help = "synthetic | text file | 'dir/*.bin' shards"},
    {.name = "val-data",
     .arg = "SRC",
     .type = FP8T_OPT_STR,
     F(val_data),
     .dflt = "the held-out split",
     .help = "separate validation source"},
    {.name = "tokenizer",
     .arg = "FILE",
     .type = FP8T_OPT_STR,
     F(tokenizer),
     .dflt = "the run's",
     .help = "tokenizer.json for text/JSONL data"},
    {.name = "precision",
     .arg = "P",
     .type = FP8T_OPT_CHOICE,
     F(precisions),
     .choices = PRECISION_SETS,
     .help = "bf16 | fp8 | fp32 | both (bf16 and fp8) | all (the three)"},
    {.name = "batches",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(batches),
     .lo = 1,
     .hi = 1000000,
     .dflt = "the run's val_batches, else 10",
     .help = "validation micro-batches"},
    CLI_ROW_BATCH(eval_opts),
    CLI_ROW_SEQ_LEN(eval_opts),
    {.name = "seed",
     .arg = "S",
     .type = FP8T_OPT_SPECIAL,
     .set = set_seed,
     .dflt = "the checkpoint's seed, else 1337",
     .help = "data seed"},
    {.name = "threshold",
     .arg = "X",
     .type = FP8T_OPT_FLOAT,
     F(threshold),
     .lo = 0,
     .hi = 1e9,
     .help = "flag |fp8 - bf16| / bf16 above X: exit 1"},
    {.name = "check-export",
     .arg = "DIR",
     .type = FP8T_OPT_STR,
     F(check_export),
     .help = "evaluate the export DIR (fp8train export) on the same batches and fail if its "
             "loss differs beyond rounding: relative " STR(FP8T_EXPORT_TOL_FP32) " (fp32), " STR(
                 FP8T_EXPORT_TOL_BF16) " (bf16), " STR(FP8T_EXPORT_TOL_FP8) " (fp8 export)"},
    {.name = "task",
     .arg = "FILE",
     .type = FP8T_OPT_SPECIAL,
     .set = set_task,
     .dflt = FP8T_OPT_NO_DEFAULT,
     .help = "llm.c multiple-choice eval file (HellaSwag .bin); repeatable (at most " STR(
         MAX_TASKS) "); accuracy per precision (the completion with the lowest mean "
                    "loss)"},
    CLI_ROW_CALIB_BATCHES(eval_opts, io,
                          "micro-batches for FP8 calibration: the training model's when the "
                          "weights carry no amax history, the inference model's with --infer "
                          "--act-scale calibrated"),
    CLI_ROW_RUN_DEVICE(eval_opts),
    {.name = "dump-tokens",
     .arg = "FILE",
     .type = FP8T_OPT_STR,
     F(dump_tokens),
     .help = "write the evaluated windows as .npy int32 [batches, B, T+1] (compute the same "
             "loss elsewhere, e.g. tests/check_hf_transformers.py)"},
    {.name = "json",
     .type = FP8T_OPT_FLAG,
     F(json),
     .help = "print one JSON object instead of the table"},
    {.name = "infer",
     .group = G_INFER,
     .type = FP8T_OPT_FLAG,
     F(infer),
     .help = "the loss (and --task accuracy) through the inference model (fp8train/infer.h: "
             "the weights in each precision only, no training state on the device) instead of "
             "the training model; not with --check-export"},
    {.name = "act-scale",
     .arg = "current|delayed|calibrated",
     .group = G_INFER,
     .type = FP8T_OPT_CHOICE,
     F(io.act),
     .choices = CLI_ACT_SCALES,
     .help = "fp8 activation scales from each input's amax (current), the learned ones "
             "(delayed; calibrated first by the training model when the weights have none), or "
             "fixed by the inference model from the input amaxes of --calib-batches "
             "training-split batches of --calib-data (calibrated)"},
    {.name = "calib-data",
     .arg = "SRC",
     .group = G_INFER,
     .type = FP8T_OPT_STR,
     F(io.calib_data),
     .dflt = "--data; its training split",
     .help = "with --act-scale calibrated: the calibration data"},
    {.name = "kv-cache",
     .arg = "bf16|fp8|fp32",
     .group = G_INFER,
     .type = FP8T_OPT_CHOICE,
     F(io.kv),
     .choices = CLI_KV_CACHES,
     .dflt = "the precision's: bf16; fp32 in fp32, fp8 in fp8",
     .help = "the KV cache kind (read by --decode-loss)"},
    {.name = "fp8-head",
     .group = G_INFER,
     .type = FP8T_OPT_FLAG,
     F(io.fp8_head),
     .help = "fp8 with the embedding table and the head in E4M3 too (a vocabulary that is a "
             "multiple of 16)"},
    {.name = "decode-loss",
     .group = G_INFER,
     .type = FP8T_OPT_FLAG,
     F(decode_loss),
     .help = "the loss through the KV cache (the first token prefilled, then one decode step "
             "per position, teacher forced) instead of the full-window forward"},
    {.name = "no-graphs",
     .group = G_INFER,
     .type = FP8T_OPT_FLAG,
     F(io.no_graphs),
     .help = "--decode-loss's decode steps op by op (CUDA records a decode step once and "
             "replays it by default)"},
    {CLI_FIELDS_ROWS(eval_opts, io), .group = G_INFER},
    {CLI_FIELDS_MLP_ROWS(eval_opts, io), .group = G_INFER},
    {CLI_FIELDS_PREFETCH_MB(eval_opts, io), .group = G_INFER},
};
#undef F

static const fp8t_opt_spec SPEC = {
    .cmd = CMD,
    .usage = "WEIGHTS [options]",
    .about =
        "Validation loss of WEIGHTS in BF16 and FP8 inference, their difference, and more.\n"
        "WEIGHTS: a checkpoint directory (RUN/checkpoints/step_N), a Hugging Face directory\n"
        "(our export or a GPT-2/Llama from the Hub) or an llm.c GPT-2 .bin.\n"
        "FP8 inference runs every linear GEMM in FP8 with delayed scaling from the weights'\n"
        "FP8 state (the scales learned in training; no history update); weights without an\n"
        "amax history are calibrated first on training micro-batches.\n",
    .epilog = "exit status: 0 ok, 1 flagged (FP8 gap above threshold or export check failed), 2 "
              "bad input\n",
    .opts = OPTS,
    .n_opts = (int)(sizeof(OPTS) / sizeof(OPTS[0])),
    .max_pos = 2, /* a second one gets its own message (below) */
    .wrap = CLI_HELP_WRAP,
};

/* The options into o and WEIGHTS into *weights. -1: go on; else the exit status to return
 * (0 after --help / --list-options, 2 after a message). */
static int parse_args(eval_opts *o, const char **weights, int argc, char **argv) {
    memset(o, 0, sizeof(*o));
    o->precisions = PBIT(FP8T_EVAL_BF16) | PBIT(FP8T_EVAL_FP8);
    o->threshold = 0.01f;
    cli_infer_opts_init(&o->io);
    const char *pos[2] = {NULL, NULL};
    int n_pos = 0, st = cli_parse(&SPEC, o, sizeof(*o), argc, argv, pos, &n_pos);
    if (st >= 0) return st;
    *weights = pos[0];
    if (n_pos > 1) {
        fprintf(stderr, "fp8train eval: one WEIGHTS argument expected, got '%s' and '%s'\n",
                pos[0], pos[1]);
        return 2;
    }
    if (!*weights) {
        fprintf(stderr,
                "fp8train eval: which weights? give a checkpoint directory, a Hugging Face "
                "directory or an llm.c .bin (see fp8train eval --help)\n");
        return 2;
    }
    if (o->decode_loss && !o->infer) {
        fprintf(stderr, "fp8train eval: --decode-loss runs the inference model's KV cache; add "
                        "--infer\n");
        return 2;
    }
    if (o->infer && o->check_export) {
        fprintf(stderr, "fp8train eval: --check-export compares the training model's losses; run "
                        "it without --infer\n");
        return 2;
    }
    return -1;
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
    char err[FP8T_ERR_LEN];
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
    char err[FP8T_ERR_LEN];
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
static double loss_in(fp8t_evaluator *ev, const fp8t_data *d, int batches,
                      fp8t_eval_precision p) {
    fp8t_evaluator_set_precision(ev, p);
    return fp8t_evaluator_loss(ev, d, batches);
}

static int dump_tokens(const char *path, const fp8t_data *d, int batches, int B, int T) {
    const size_t per = (size_t)B * (T + 1);
    int32_t *out = malloc((size_t)batches * per * sizeof(int32_t)); /* [batches, B, T+1] */
    int *tok = malloc((size_t)B * T * sizeof(int)), *tgt = malloc((size_t)B * T * sizeof(int));
    char err[FP8T_ERR_LEN];
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

/* ---------------------------------------------------------------- the command's steps */

static int wants(const eval_opts *o, int p) { return (o->precisions >> p) & 1; }

/* One evaluation: the options, resolved against what the weights' run used, and what is built
 * from them; eval_free releases it all. */
typedef struct {
    const eval_opts *o;
    const char *weights;  /* the argument */
    fp8t_weights w, wx;   /* wx: --check-export's */
    cli_run_defaults def; /* what the weights' run used: data, val_data, tokenizer and device
                             point into it unless given */
    const char *data, *val_data, *tokenizer, *device;
    int B, T, batches;
    uint64_t seed;
    calib_src cs;
    cli_debug_opts dbg;
    fp8t_backend *be;
    fp8t_evaluator *ev, *evx; /* ev: NULL with --infer once calibration is done */
    fp8t_data *d;
    double loss[FP8T_EVAL_COUNT]; /* NaN: not evaluated */
    char desc[512];
    cJSON *js; /* the --json record, built whether or not it is printed */
} eval_run;

/* The defaults the run suggests, the backend, the training model (for its loss and for
 * calibrating FP8 scales the weights lack), the validation data. 0 ok, 2 after a message. */
static int eval_setup(eval_run *r) {
    const eval_opts *o = r->o;
    char err[FP8T_ERR_LEN];
    cli_run_defaults_from(&r->w, &r->def);
    const cli_run_defaults *def = &r->def;
    r->data = o->data ? o->data : def->data;
    r->val_data = o->val_data ? o->val_data : (o->data ? "" : def->val_data);
    /* the model's tokenizer applies to any text data given to it */
    r->tokenizer = o->tokenizer ? o->tokenizer : def->tokenizer;
    r->B = o->B ? o->B : def->batch;
    r->batches = o->batches ? o->batches : def->val_batches;
    r->T = o->T ? o->T : def->seq_len;
    r->seed = o->have_seed ? o->seed : def->seed;
    r->device = o->device ? o->device : def->device;
    if (r->T > r->w.model.seq_len) {
        fprintf(stderr, "fp8train eval: --seq-len %d exceeds the model's maximum %d\n", r->T,
                r->w.model.seq_len);
        return 2;
    }
    if (cli_debug_options("eval", &r->dbg) != 0) return 2;
    if (!(r->be = fp8t_backend_create(r->device, &r->dbg.backend, err, sizeof(err)))) {
        fprintf(stderr, "fp8train eval: --device %s: %s\n", r->device, err);
        return 2;
    }
    /* the training model: for its own loss, and for calibrating FP8 scales that the weights
     * lack (with --infer only when the learned scales are asked for; it is freed before the
     * inference models are built, so they never share the device with it) */
    const int need_calib =
        wants(o, FP8T_EVAL_FP8) && (!o->infer || o->io.act == FP8T_ACT_SCALE_DELAYED);
    if ((!o->infer || need_calib) &&
        !(r->ev =
              fp8t_evaluator_create(r->be, &r->w, &r->dbg.model, r->B, r->T, err, sizeof(err)))) {
        fprintf(stderr, "fp8train eval: %s\n", err);
        return 2;
    }
    if (!(r->d = fp8t_data_open_tok(r->data, r->val_data, r->tokenizer, FP8T_SPLIT_VAL, r->B,
                                    r->T, r->w.model.vocab_size, r->seed, err, sizeof(err)))) {
        fprintf(stderr, "fp8train eval: data: %s\n", err);
        return 2;
    }
    r->cs = (calib_src){o->io.calib_data ? o->io.calib_data : r->data,
                        o->io.calib_data ? "" : r->val_data, r->tokenizer, r->seed};
    if (need_calib && cli_calibrate_tok(r->ev, &r->w, r->data, r->val_data, r->tokenizer, r->seed,
                                        o->io.calib_batches, o->json, err, sizeof(err)) < 0) {
        fprintf(stderr, "fp8train eval: %s\n", err);
        return 2;
    }
    if (o->infer) {
        fp8t_evaluator_destroy(r->ev);
        r->ev = NULL;
    }
    return 0;
}

/* What is evaluated, on what: the table's heading lines, and the same in the record. */
static void eval_describe(eval_run *r) {
    const eval_opts *o = r->o;
    cli_describe_weights(r->desc, sizeof(r->desc), &r->w);
    if (!o->json) {
        printf("weights: %s (%s)\n", r->weights, r->desc);
        if (r->w.notes[0]) printf("  import: %s\n", r->w.notes);
        printf("data: %s; %d micro-batch%s of %d x %d tokens, seed %llu\n",
               fp8t_data_describe(r->d), r->batches, r->batches == 1 ? "" : "es", r->B, r->T,
               (unsigned long long)r->seed);
        if (o->infer) {
            printf("model: the inference model (weights in each precision only; fp8: E4M3 per "
                   "tensor, head bf16, activations %s scaling",
                   fp8t_act_scale_name(o->io.act));
            if (o->io.act == FP8T_ACT_SCALE_CALIBRATED)
                printf(" on %d training-split batches of %s", o->io.calib_batches, r->cs.data);
            printf(")%s\n", o->decode_loss ? "; loss through the KV cache (decode steps)" : "");
            if (o->decode_loss)
                printf("KV cache: %s\n", o->io.kv < 0 ? "the precision's (bf16; fp32 in fp32, "
                                                        "fp8 in fp8)"
                                                      : cli_kv_name(o->io.kv));
        }
        printf("%-10s %-10s %s\n", "precision", "loss", "perplexity");
    }
    cJSON *js = r->js;
    cJSON_AddBoolToObject(js, "infer", o->infer);
    if (o->infer) {
        cJSON_AddStringToObject(js, "act_scale", fp8t_act_scale_name(o->io.act));
        if (o->io.act == FP8T_ACT_SCALE_CALIBRATED) {
            cJSON_AddStringToObject(js, "calib_data", r->cs.data);
            cJSON_AddNumberToObject(js, "calib_batches", o->io.calib_batches);
        }
        cJSON_AddBoolToObject(js, "decode_loss", o->decode_loss);
        cJSON_AddStringToObject(js, "kv_cache", o->io.kv < 0 ? "default" : cli_kv_name(o->io.kv));
    }
    cJSON_AddStringToObject(js, "weights", r->weights);
    cJSON_AddStringToObject(js, "description", r->desc);
    cJSON_AddStringToObject(js, "data", fp8t_data_describe(r->d));
    cJSON_AddNumberToObject(js, "batches", r->batches);
    cJSON_AddNumberToObject(js, "batch", r->B);
    cJSON_AddNumberToObject(js, "seq_len", r->T);
}

/* The loss in each precision asked for, and the FP8 - BF16 gap against --threshold. 0 ok,
 * 1 the gap flagged, 2 a loss that is not a number. */
static int eval_losses(eval_run *r) {
    const eval_opts *o = r->o;
    cJSON *jl = cJSON_AddObjectToObject(r->js, "loss");
    int bad_tokens = 0;
    for (int p = 0; p < FP8T_EVAL_COUNT; p++) {
        if (!wants(o, p)) continue;
        const fp8t_eval_precision ep = (fp8t_eval_precision)p;
        r->loss[p] = o->infer ? infer_loss(r->be, &r->w, ep, &o->io, &r->cs, r->d, r->batches,
                                           r->B, r->T, o->decode_loss)
                              : loss_in(r->ev, r->d, r->batches, ep);
        bad_tokens |= isnan(r->loss[p]);
        cJSON_AddNumberToObject(jl, fp8t_eval_precision_name(ep), r->loss[p]);
        if (!o->json)
            printf("%-10s %-10.6f %.4f\n", fp8t_eval_precision_name(ep), r->loss[p],
                   exp(r->loss[p]));
    }
    if (bad_tokens) {
        fprintf(stderr, "fp8train eval: the loss is not a number (see the message above: tokens "
                        "outside the model's vocabulary?)\n");
        return 2;
    }
    if (!wants(o, FP8T_EVAL_BF16) || !wants(o, FP8T_EVAL_FP8)) return 0;
    const double diff = r->loss[FP8T_EVAL_FP8] - r->loss[FP8T_EVAL_BF16],
                 rel = diff / r->loss[FP8T_EVAL_BF16];
    const int flag = fabs(rel) > o->threshold;
    if (!o->json)
        printf("fp8 - bf16 %+.6f (%+.3f%%)  %s (threshold %.3g%%)\n", diff, 100 * rel,
               flag ? "FLAGGED: above" : "ok: within", 100.0 * o->threshold);
    cJSON_AddNumberToObject(r->js, "fp8_minus_bf16", diff);
    cJSON_AddNumberToObject(r->js, "relative_gap", rel);
    cJSON_AddBoolToObject(r->js, "flagged", flag);
    return flag ? 1 : 0;
}

/* One --task file's accuracy in each precision, into the record's array jt: an evaluator (or
 * with --infer an inference model per precision) shaped for the file, built from w with its
 * calibrated state. 0 ok, 2 after a message. */
static int eval_task(eval_run *r, const char *path, cJSON *jt) {
    const eval_opts *o = r->o;
    char err[FP8T_ERR_LEN];
    fp8t_task t;
    if (fp8t_task_read(path, &t, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train eval: --task: %s\n", err);
        return 2;
    }
    const int tB = t.max_completions > r->B ? t.max_completions : r->B;
    const int tT = t.longest > 0 ? t.longest : 1;
    int status = 2;
    fp8t_evaluator *te = NULL;
    if (tT > r->w.model.seq_len) {
        fprintf(stderr,
                "fp8train eval: --task %s: an example needs %d positions but the model's "
                "maximum sequence length is %d\n",
                path, tT, r->w.model.seq_len);
        goto done;
    }
    if (!o->infer &&
        !(te = fp8t_evaluator_create(r->be, &r->w, &r->dbg.model, tB, tT, err, sizeof(err)))) {
        fprintf(stderr, "fp8train eval: --task %s: %s\n", path, err);
        goto done;
    }
    cJSON *jo = cJSON_CreateObject();
    cJSON_AddItemToArray(jt, jo);
    cJSON_AddStringToObject(jo, "file", path);
    cJSON_AddNumberToObject(jo, "examples", t.n);
    cJSON *ja = cJSON_AddObjectToObject(jo, "accuracy");
    if (!o->json) printf("task %s: %d examples ", path, t.n);
    for (int p = 0; p < FP8T_EVAL_COUNT; p++) {
        if (!wants(o, p)) continue;
        const fp8t_eval_precision ep = (fp8t_eval_precision)p;
        int correct = 0, trc;
        if (o->infer) { /* an inference model of this precision, shaped for the task */
            fp8t_infer *im = infer_model(r->be, &r->w, ep, &o->io, &r->cs, tB, tT);
            trc = im ? fp8t_infer_task_eval(im, &t, &correct, NULL, err, sizeof(err)) : -1;
            if (!im) snprintf(err, sizeof(err), "cannot build the inference model");
            fp8t_infer_destroy(im);
        } else {
            fp8t_evaluator_set_precision(te, ep);
            trc = fp8t_task_eval(te, &t, &correct, NULL, err, sizeof(err));
        }
        if (trc != 0) {
            fprintf(stderr, "\nfp8train eval: --task %s: %s\n", path, err);
            goto done;
        }
        const double acc = t.n ? (double)correct / t.n : 0.0;
        cJSON_AddNumberToObject(ja, fp8t_eval_precision_name(ep), acc);
        if (!o->json) printf(" %s %.4f (%d/%d)", fp8t_eval_precision_name(ep), acc, correct, t.n);
    }
    if (!o->json) printf("\n");
    status = 0;
done:
    fp8t_evaluator_destroy(te);
    fp8t_task_free(&t);
    return status;
}

/* --check-export: the export's loss on the same batches, within its dtype's rounding of the
 * weights' loss. 0 ok, 1 another model or a loss beyond the tolerance, 2 after a message. */
static int eval_check_export(eval_run *r) {
    const eval_opts *o = r->o;
    const char *dir = o->check_export;
    char err[FP8T_ERR_LEN], e2[512];
    fp8t_weights *wx = &r->wx;
    if (fp8t_weights_load(dir, wx, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train eval: --check-export: %s\n", err);
        return 2;
    }
    if (fp8t_model_config_diff(&r->w.model, &wx->model, e2, sizeof(e2)) != 0) {
        fprintf(stderr, "fp8train eval: --check-export %s: the export is another model: %s\n",
                dir, e2);
        return 1;
    }
    if (!(r->evx =
              fp8t_evaluator_create(r->be, wx, &r->dbg.model, r->B, r->T, err, sizeof(err)))) {
        fprintf(stderr, "fp8train eval: --check-export: %s\n", err);
        return 2;
    }
    const double tol = wx->stored_dtype == FP8T_EXPORT_FP32   ? FP8T_EXPORT_TOL_FP32
                       : wx->stored_dtype == FP8T_EXPORT_BF16 ? FP8T_EXPORT_TOL_BF16
                                                              : FP8T_EXPORT_TOL_FP8;
    /* BF16 always; FP32 when asked; FP8 only when the export carries the learned scales
     * (a per-tensor FP8 export's input_scale seeds wx's FP8 state) — a BF16/FP32 export has
     * none to compare, nor has a block-scaled one (dynamic activation scales) */
    const int has_scales = wx->stored_dtype == FP8T_EXPORT_FP8 && wx->fp8_state;
    const int cmp[FP8T_EVAL_COUNT] = {1, wants(o, FP8T_EVAL_FP8) && has_scales,
                                      wants(o, FP8T_EVAL_FP32)};
    if (!o->json && wants(o, FP8T_EVAL_FP8) && wx->stored_dtype == FP8T_EXPORT_FP8 && !has_scales)
        printf("export check %s (fp8 export), fp8: not compared (the export carries no "
               "activation scales: dynamic scaling, e.g. --block 128)\n",
               dir);
    cJSON *jc = cJSON_AddObjectToObject(r->js, "export_check");
    cJSON_AddStringToObject(jc, "dir", dir);
    cJSON_AddStringToObject(jc, "dtype", fp8t_export_dtype_name(wx->stored_dtype));
    cJSON_AddNumberToObject(jc, "tolerance", tol);
    int ok = 1;
    for (int p = 0; p < FP8T_EVAL_COUNT; p++) {
        if (!cmp[p]) continue;
        const fp8t_eval_precision ep = (fp8t_eval_precision)p;
        if (isnan(r->loss[p])) r->loss[p] = loss_in(r->ev, r->d, r->batches, ep);
        const double lx = loss_in(r->evx, r->d, r->batches, ep);
        const double rel = fabs(lx - r->loss[p]) / fabs(r->loss[p]);
        const int good = rel <= tol;
        ok &= good;
        const char *pn = fp8t_eval_precision_name(ep);
        cJSON *jp = cJSON_AddObjectToObject(jc, pn);
        cJSON_AddNumberToObject(jp, "export_loss", lx);
        cJSON_AddNumberToObject(jp, "weights_loss", r->loss[p]);
        cJSON_AddNumberToObject(jp, "relative_difference", rel);
        if (!o->json)
            printf("export check %s (%s export), %s: loss %.6f vs %.6f, relative difference "
                   "%.2e %s %.0e: %s\n",
                   dir, fp8t_export_dtype_name(wx->stored_dtype), pn, lx, r->loss[p], rel,
                   good ? "<=" : ">", tol, good ? "ok" : "FAILED");
    }
    cJSON_AddBoolToObject(jc, "ok", ok);
    if (ok) return 0;
    if (!o->json)
        fprintf(stderr,
                "fp8train eval: the export %s does not reproduce %s: a broken export "
                "(layout, transposition, scales) is the usual cause of downstream gaps\n",
                dir, r->weights);
    return 1;
}

static void eval_free(eval_run *r) {
    cJSON_Delete(r->js);
    fp8t_data_close(r->d);
    fp8t_evaluator_destroy(r->ev);
    fp8t_evaluator_destroy(r->evx);
    fp8t_backend_destroy(r->be);
    fp8t_weights_free(&r->w);
    fp8t_weights_free(&r->wx);
}

int fp8t_cmd_eval(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], "eval")) {
        argc--;
        argv++;
    }
    eval_opts o;
    const char *weights = NULL;
    int status = parse_args(&o, &weights, argc, argv);
    if (status >= 0) return status;
    eval_run r;
    memset(&r, 0, sizeof(r));
    r.o = &o;
    r.weights = weights;
    for (int p = 0; p < FP8T_EVAL_COUNT; p++) r.loss[p] = NAN;
    char err[FP8T_ERR_LEN];
    if (fp8t_weights_load(weights, &r.w, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train eval: %s\n", err);
        return 2; /* before the record: --json prints nothing */
    }
    r.js = cJSON_CreateObject();
    /* each step runs while nothing before it failed (status 2); a flag (1) lets the rest run
     * and stays the exit status unless a later step fails */
    status = eval_setup(&r);
    if (status == 0) {
        eval_describe(&r);
        status = eval_losses(&r);
    }
    if (status != 2 && o.dump_tokens && dump_tokens(o.dump_tokens, r.d, r.batches, r.B, r.T) != 0)
        status = 2;
    cJSON *jt = status != 2 && o.n_tasks ? cJSON_AddArrayToObject(r.js, "tasks") : NULL;
    for (int k = 0; status != 2 && k < o.n_tasks; k++)
        if (eval_task(&r, o.tasks[k], jt) != 0) status = 2;
    if (status != 2 && o.check_export) {
        const int x = eval_check_export(&r);
        if (x != 0) status = x;
    }
    cJSON_AddNumberToObject(r.js, "exit_status", status);
    if (o.json) {
        char *s = cJSON_PrintUnformatted(r.js);
        printf("%s\n", s);
        free(s);
    }
    eval_free(&r);
    return status;
}
