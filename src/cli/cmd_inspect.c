/* `fp8train inspect WEIGHTS`: tensor statistics (and dumps) of trained weights, without
 * training them. Loads WEIGHTS as `fp8train eval` does (checkpoint, HF directory, llm.c file),
 * runs forward and backward on a few micro-batches under the checkpoint's precision policy (or
 * another) with the tensor inspector attached, and prints the per-site table: amax, scale,
 * underflow, saturation, SQNR and cosine of every inspected GEMM tensor, flagging cosine < 0.99
 * (the seeds' rule). --compare-bf16 runs the same micro-batches with every GEMM in BF16 and
 * compares the dumped tensors of the two passes one by one.
 * Exit status: 0 nothing flagged, 1 a tensor flagged, 2 bad input or usage. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_inspect.h"
#include "cli/cmd_weights_common.h"
#include "fp8train/backend.h"
#include "fp8train/checkpoint.h"
#include "fp8train/compare.h"
#include "fp8train/debug.h"
#include "fp8train/inject.h"
#include "fp8train/inspect_checkpoint.h"
#include "fp8train/io.h"
#include "fp8train/policy_json.h"

#define CMD "inspect"
#define MAX_OVERRIDE_ARGS 64

static void usage(FILE *f) {
    fprintf(f,
        "usage: fp8train inspect WEIGHTS [options]\n"
        "  Tensor statistics of WEIGHTS' GEMMs: forward and backward (no optimizer or scale\n"
        "  update) on a few micro-batches with the FP8 state of WEIGHTS under its precision\n"
        "  policy, then a table per layer / module / GEMM / tensor: amax, scale, underflow %%,\n"
        "  saturation %%, SQNR and cosine of the FP8 image. Cosine < 0.99 means that tensor's\n"
        "  quantization error is too large: the row is flagged.\n"
        "  WEIGHTS: a checkpoint directory (RUN/checkpoints/step_N), a Hugging Face directory\n"
        "  or an llm.c GPT-2 .bin (as for fp8train eval).\n"
        "  A checkpoint at step S is inspected on the micro-batches its step S+1 would train on\n"
        "  (its data position); rows are labelled step S+1, like `train --resume CKPT --inspect`.\n"
        "options:\n"
        "  --spec SPEC           what to inspect and dump (the --inspect syntax of train), e.g.\n"
        "                        'layers=0-1,gemms=fprop+dgrad,tensors=input+output,dump=1'\n"
        "                        (default: every GEMM tensor, no dumps)\n"
        "  --out DIR             stats.jsonl, dumps/, bf16/ and inspect.json (default:\n"
        "                        RUN/inspect/step_N for a checkpoint, else ./inspect_out)\n"
        "  --compare-bf16        also run the micro-batches with every GEMM in BF16 (into\n"
        "                        OUT/bf16) and compare the dumped tensors one by one (cosine,\n"
        "                        relative error); implies dump=1 (dumps: the first micro-batch)\n"
        "  --precision P         every GEMM in P: fp8 | delayed | current | block | rowwise |\n"
        "                        mxfp8 | fake | bf16 | fp32 (replaces the checkpoint's policy\n"
        "                        and its overrides)\n"
        "  --override SPEC       per-layer/module/GEMM precision on top (repeatable), e.g.\n"
        "                        'layers=1,gemm=dgrad,precision=bf16'\n"
        "  --inject SPEC         a fault during the passes (the train syntax, --help-inject);\n"
        "                        value faults only: amax faults need a scale update\n"
        "  --data SRC            synthetic | text file | 'dir/*.bin' (default: the checkpoint's)\n"
        "  --data-position N     index of the first training micro-batch (default: the\n"
        "                        checkpoint's data position with its data, else 0)\n"
        "  --batches N           micro-batches (default: the run's --grad-accum, else 1)\n"
        "  --batch B --seq-len T micro-batch shape (default: the run's, else 8 and\n"
        "                        min(seq_len, 256))\n"
        "  --seed S              data seed (default: the checkpoint's, else 1337)\n"
        "  --cosine-flag X       flag below this cosine (default %.2f)\n"
        "  --sort site|sqnr|cosine  row order: model order (default) or worst first\n"
        "  --top N               print at most N rows per table (default: all)\n"
        "  --device cpu|cuda     backend (default: the run's, else cpu)\n"
        "  --json                print one JSON object instead of the tables\n"
        "  --help-inject         the --inject syntax\n"
        "Weights without an amax history (an import) get delayed-scaling scales from one\n"
        "BF16 forward + backward + scale update on the inspected micro-batches first.\n"
        "exit status: 0 nothing flagged, 1 a tensor flagged (cosine below the flag, NaN/Inf,\n"
        "or with --compare-bf16 a dump whose cosine against BF16 is below it), 2 bad input\n",
        FP8T_INSPECT_COSINE_FLAG);
}

typedef enum { SORT_SITE = 0, SORT_SQNR, SORT_COSINE } sort_order;

typedef struct {
    const char *weights, *data, *spec, *out, *inject, *device, *precision;
    const char *overrides[MAX_OVERRIDE_ARGS];
    int n_overrides;
    int batches, B, T, top, json, compare_bf16, have_seed, have_position;
    uint64_t seed, position;
    float cosine_flag;
    sort_order sort;
} inspect_opts;

static int parse_args(inspect_opts *o, int argc, char **argv) {
    memset(o, 0, sizeof(*o));
    o->cosine_flag = (float)FP8T_INSPECT_COSINE_FLAG;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
        if (!strcmp(a, "--help-inject")) return 3;
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--compare-bf16")) { o->compare_bf16 = 1; continue; }
        if (a[0] != '-' || !a[1]) {
            if (o->weights) {
                fprintf(stderr, "fp8train inspect: one WEIGHTS argument expected, got '%s' and "
                        "'%s'\n", o->weights, a);
                return -1;
            }
            o->weights = a;
            continue;
        }
        if (!(v = cli_value(CMD, argc, argv, &i))) return -1;
        if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--spec")) o->spec = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--inject")) o->inject = v;
        else if (!strcmp(a, "--device")) o->device = v;
        else if (!strcmp(a, "--precision")) o->precision = v;
        else if (!strcmp(a, "--override")) {
            if (o->n_overrides == MAX_OVERRIDE_ARGS) {
                fprintf(stderr, "fp8train inspect: at most %d --override options\n",
                        MAX_OVERRIDE_ARGS);
                return -1;
            }
            o->overrides[o->n_overrides++] = v;
        } else if (!strcmp(a, "--sort")) {
            if (!strcmp(v, "site")) o->sort = SORT_SITE;
            else if (!strcmp(v, "sqnr")) o->sort = SORT_SQNR;
            else if (!strcmp(v, "cosine")) o->sort = SORT_COSINE;
            else {
                fprintf(stderr, "fp8train inspect: --sort '%s': expected site, sqnr or cosine\n",
                        v);
                return -1;
            }
        } else if (!strcmp(a, "--batches")) {
            if (cli_int(CMD, a, v, 1, 100000, &o->batches)) return -1;
        }
        else if (!strcmp(a, "--batch")) { if (cli_int(CMD, a, v, 1, 1 << 20, &o->B)) return -1; }
        else if (!strcmp(a, "--seq-len")) { if (cli_int(CMD, a, v, 1, 1 << 20, &o->T)) return -1; }
        else if (!strcmp(a, "--top")) { if (cli_int(CMD, a, v, 1, 1 << 30, &o->top)) return -1; }
        else if (!strcmp(a, "--seed")) {
            if (cli_u64(CMD, a, v, &o->seed)) return -1;
            o->have_seed = 1;
        }
        else if (!strcmp(a, "--data-position")) {
            if (cli_u64(CMD, a, v, &o->position)) return -1;
            o->have_position = 1;
        } else if (!strcmp(a, "--cosine-flag")) {
            if (cli_float(CMD, a, v, 0, 1, &o->cosine_flag)) return -1;
        } else {
            fprintf(stderr, "fp8train inspect: unknown option '%s' (see fp8train inspect --help)\n",
                    a);
            return -1;
        }
    }
    if (!o->weights) {
        fprintf(stderr, "fp8train inspect: which weights? give a checkpoint directory "
                "(RUN/checkpoints/step_N), a Hugging Face directory or an llm.c .bin (see fp8train "
                "inspect --help)\n");
        return -1;
    }
    if (o->spec) {
        char e[768];
        if (fp8t_inspector_spec_check(o->spec, e, sizeof(e)) != 0) {
            fprintf(stderr, "fp8train inspect: --spec: %s\n", e);
            return -1;
        }
    }
    if (o->inject) {
        char e[768];
        if (fp8t_injector_check(o->inject, e, sizeof(e)) != 0) {
            fprintf(stderr, "fp8train inspect: --inject: %s\n", e);
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- defaults from the run */

/* The run's grad_accum (the micro-batches of one step), else 1. */
static int run_grad_accum(const fp8t_weights *w) {
    int accum = 1;
    cJSON *c = w->config_json ? cJSON_Parse(w->config_json) : NULL;
    const cJSON *v = c ? cJSON_GetObjectItemCaseSensitive(c, "grad_accum") : NULL;
    if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 100000)
        accum = (int)v->valuedouble;
    cJSON_Delete(c);
    return accum;
}

/* RUN/inspect/step_N for RUN/checkpoints/step_N, else ./inspect_out. */
static void default_out(char *buf, size_t len, const fp8t_weights *w) {
    snprintf(buf, len, "inspect_out");
    if (strcmp(w->kind, "checkpoint") != 0) return;
    char p[1024];
    snprintf(p, sizeof(p), "%s", w->source);
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') p[--n] = 0;
    char *slash = strrchr(p, '/');
    if (!slash) return;
    *slash = 0;
    const char *step_dir = slash + 1, *parent = p;
    char *s2 = strrchr(p, '/');
    const char *parent_name = s2 ? s2 + 1 : p;
    if (strcmp(parent_name, "checkpoints") != 0) return;
    if (s2) *s2 = 0;
    const char *run = s2 ? parent : ".";
    snprintf(buf, len, "%.500s/inspect/%.400s", run, step_dir);
}

/* The policy to inspect under: the checkpoint's precisions (default, recipe, head,
 * overrides), or --precision, then --override; the rest (format, history, margin) as the
 * evaluator's model has it. -1 on a bad option. */
static int build_policy(fp8t_policy *pol, const fp8t_policy *model_pol, const fp8t_weights *w,
                        const inspect_opts *o) {
    char e[768];
    fp8t_policy saved;
    fp8t_policy_default(&saved);
    if (w->policy_json && fp8t_policy_from_json(&saved, w->policy_json, e, sizeof(e)) != 0) {
        fprintf(stderr, "fp8train inspect: the checkpoint's policy is unreadable (%s); using the "
                "default policy (fp8, delayed scaling)\n", e);
        fp8t_policy_default(&saved);
    }
    *pol = *model_pol;
    pol->default_precision = saved.default_precision;
    pol->recipe = saved.recipe;
    pol->head_precision = saved.head_precision;
    pol->n_overrides = saved.n_overrides;
    memcpy(pol->overrides, saved.overrides, sizeof(pol->overrides));
    if (o->precision) {
        fp8t_precision p;
        if (fp8t_precision_parse(&p, o->precision) != 0) {
            fprintf(stderr, "fp8train inspect: --precision '%s': expected fp8, delayed, current, "
                    "block, rowwise, mxfp8, fake, bf16 or fp32\n", o->precision);
            return -1;
        }
        pol->default_precision = p;
        pol->n_overrides = 0;
    }
    for (int i = 0; i < o->n_overrides; i++)
        if (fp8t_policy_add_overrides(pol, o->overrides[i], e, sizeof(e)) != 0) {
            fprintf(stderr, "fp8train inspect: --override '%s': %s\n", o->overrides[i], e);
            return -1;
        }
    return 0;
}

/* ---------------------------------------------------------------- printing */

static int cmp_sqnr(const void *pa, const void *pb) {
    const fp8t_inspect_site *a = pa, *b = pb;
    /* quantized operands first, worst SQNR first; the rest after, in their order */
    double x = a->quantized ? a->sqnr_db : INFINITY, y = b->quantized ? b->sqnr_db : INFINITY;
    if (isnan(x)) x = -INFINITY;
    if (isnan(y)) y = -INFINITY;
    return (x > y) - (x < y);
}

static int cmp_cosine(const void *pa, const void *pb) {
    const fp8t_inspect_site *a = pa, *b = pb;
    double x = a->quantized ? a->cosine : INFINITY, y = b->quantized ? b->cosine : INFINITY;
    if (isnan(x)) x = -INFINITY;
    if (isnan(y)) y = -INFINITY;
    return (x > y) - (x < y);
}

static void fmt_num(char *b, size_t n, const char *f, double x) {
    if (isnan(x)) snprintf(b, n, "-");
    else if (x >= 1e299) snprintf(b, n, "exact");
    else snprintf(b, n, f, x);
}

static void layer_name(char *b, size_t n, int layer) {
    if (layer < 0) snprintf(b, n, "head");
    else snprintf(b, n, "%d", layer);
}

/* The worst quantized operand by SQNR, or -1. */
static int worst_sqnr_site(const fp8t_inspect_site *s, int n) {
    int w = -1;
    for (int i = 0; i < n; i++)
        if (s[i].quantized && (w < 0 || !(s[i].sqnr_db >= s[w].sqnr_db))) w = i;
    return w;
}

static void print_sites(const fp8t_inspect_site *s, int n, int worst, int top, double flag) {
    printf("%-5s %-6s %-6s %-12s %-8s %10s %10s %7s %7s %8s %9s\n", "layer", "module", "gemm",
           "tensor", "prec", "amax", "scale", "under%", "sat%", "SQNR dB", "cosine");
    int shown = 0, unquantized = 0;
    for (int i = 0; i < n && (!top || shown < top); i++, shown++) {
        const fp8t_inspect_site *r = &s[i];
        char l[16], amax[24], scale[24], un[24], sat[24], sq[24], cs[24];
        layer_name(l, sizeof(l), r->layer);
        fmt_num(amax, sizeof(amax), "%.3e", r->amax);
        fmt_num(scale, sizeof(scale), "%.3e", r->is_operand ? r->scale : NAN);
        fmt_num(un, sizeof(un), "%.3f", r->underflow_pct);
        fmt_num(sat, sizeof(sat), "%.3f", r->saturation_pct);
        fmt_num(sq, sizeof(sq), "%.2f", r->sqnr_db);
        fmt_num(cs, sizeof(cs), "%.5f", r->cosine);
        const char *mark = "";
        char why[64] = "";
        if (r->nonfinite > 0) snprintf(why, sizeof(why), "  << %.0f NaN/Inf", r->nonfinite);
        else if (r->flagged) snprintf(why, sizeof(why), "  << cosine < %.2f", flag);
        if (i == worst && !why[0]) mark = "  < worst SQNR";
        unquantized += r->is_operand && !r->quantized;
        printf("%-5s %-6s %-6s %-12s %-8s %10s %10s %7s %7s %8s %9s%s%s\n", l, r->module, r->gemm,
               r->tensor, r->precision, amax, scale, un, sat, sq, cs, why, mark);
    }
    if (n > shown) printf("... %d more rows (--top, or OUT/inspect.json)\n", n - shown);
    if (unquantized)
        printf("(operands of bf16 / fp32 GEMMs: their statistics say what FP8 would do; never "
               "flagged)\n");
}

static void print_dumps(const fp8t_dump_diff *d, int n, int top, double flag) {
    printf("%-34s %9s %10s %11s %9s\n", "tensor (vs BF16)", "elements", "cosine", "rel. error",
           "SQNR dB");
    int shown = 0;
    for (int i = 0; i < n && (!top || shown < top); i++, shown++) {
        char sq[24];
        fmt_num(sq, sizeof(sq), "%.2f", d[i].sqnr_db);
        char why[48] = "";
        if (d[i].flagged) snprintf(why, sizeof(why), "  << cosine < %.2f", flag);
        printf("%-34s %9zu %10.6f %11.3e %9s%s\n", d[i].name, d[i].numel, d[i].cosine,
               d[i].rel_l2, sq, why);
    }
    if (n > shown) printf("... %d more tensors (--top, or OUT/inspect.json)\n", n - shown);
}

static void json_num(cJSON *o, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}

static cJSON *sites_json(const fp8t_inspect_site *s, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layer", s[i].layer);
        cJSON_AddStringToObject(o, "module", s[i].module);
        cJSON_AddStringToObject(o, "gemm", s[i].gemm);
        cJSON_AddStringToObject(o, "tensor", s[i].tensor);
        cJSON_AddStringToObject(o, "precision", s[i].precision);
        cJSON_AddBoolToObject(o, "quantized", s[i].quantized);
        cJSON_AddNumberToObject(o, "rows", s[i].n);
        json_num(o, "amax", s[i].amax);
        json_num(o, "scale", s[i].is_operand ? s[i].scale : NAN);
        json_num(o, "underflow_pct", s[i].underflow_pct);
        json_num(o, "saturation_pct", s[i].saturation_pct);
        json_num(o, "sqnr_db", s[i].sqnr_db >= 1e299 ? NAN : s[i].sqnr_db);
        json_num(o, "cosine", s[i].cosine);
        cJSON_AddNumberToObject(o, "nonfinite", s[i].nonfinite);
        cJSON_AddBoolToObject(o, "flagged", s[i].flagged);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

static cJSON *dumps_json(const fp8t_dump_diff *d, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "tensor", d[i].name);
        cJSON_AddNumberToObject(o, "step", d[i].step);
        cJSON_AddNumberToObject(o, "elements", (double)d[i].numel);
        json_num(o, "cosine", d[i].cosine);
        json_num(o, "rel_l2", d[i].rel_l2);
        json_num(o, "mse", d[i].mse);
        json_num(o, "sqnr_db", d[i].sqnr_db >= 1e299 ? NAN : d[i].sqnr_db);
        cJSON_AddBoolToObject(o, "flagged", d[i].flagged);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

/* ---------------------------------------------------------------- the command */

typedef struct {
    fp8t_weights w;
    fp8t_backend *be;
    fp8t_evaluator *ev;
    fp8t_data *d;
    fp8t_inspect_site *sites;
    fp8t_dump_diff *dumps;
    char *spec;
    cJSON *js;
} inspect_state;

static void state_free(inspect_state *s) {
    fp8t_data_close(s->d);
    fp8t_evaluator_destroy(s->ev);
    fp8t_backend_destroy(s->be);
    fp8t_weights_free(&s->w);
    free(s->sites);
    free(s->dumps);
    free(s->spec);
    cJSON_Delete(s->js);
}

static int run_pass(fp8t_evaluator *ev, const fp8t_data *d, const fp8t_policy *pol,
                    const char *spec, const char *out, const char *inject, int step,
                    uint64_t first, int batches, fp8t_inspect_pass_result *res) {
    char err[1024];
    fp8t_inspect_pass_cfg pc = {.policy = pol, .spec = spec, .out_dir = out, .inject = inject,
                                .step = step, .first_batch = first, .batches = batches};
    if (fp8t_inspect_pass(ev, d, &pc, res, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train inspect: %s\n", err);
        return -1;
    }
    return 0;
}

int fp8t_cmd_inspect(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], "inspect")) { argc--; argv++; }
    inspect_opts o;
    int pr = parse_args(&o, argc, argv);
    if (pr == 1) { usage(stdout); return 0; }
    if (pr == 3) { fputs(fp8t_injector_help(), stdout); return 0; }
    if (pr != 0) return 2;

    inspect_state s;
    memset(&s, 0, sizeof(s));
    char err[2048], desc[512], out[1024], path[1200], pol_desc[2048];
    int status = 2;
    if (fp8t_weights_load(o.weights, &s.w, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train inspect: %s\n", err);
        return 2;
    }
    const fp8t_weights *w = &s.w;
    cli_run_defaults def;
    cli_run_defaults_from(w, &def);
    const int is_ckpt = !strcmp(w->kind, "checkpoint");
    const char *data = o.data ? o.data : def.data;
    const int own_data = !o.data || !strcmp(o.data, def.data);
    const char *val_data = own_data ? def.val_data : "";
    const int B = o.B ? o.B : def.batch, T = o.T ? o.T : def.seq_len;
    const int batches = o.batches ? o.batches : run_grad_accum(w);
    const uint64_t seed = o.have_seed ? o.seed : def.seed;
    const char *device = o.device ? o.device : def.device;
    const int step = w->step + 1; /* the step these micro-batches would train */
    uint64_t first = o.have_position ? o.position : 0;
    if (!o.have_position && is_ckpt && own_data) {
        fp8t_checkpoint st;
        memset(&st, 0, sizeof(st));
        if (fp8t_checkpoint_read_state(w->source, &st, err, sizeof(err)) == 0)
            first = st.data_position;
        fp8t_checkpoint_free(&st);
    }
    if (T > w->model.seq_len) {
        fprintf(stderr, "fp8train inspect: --seq-len %d exceeds the model's maximum %d\n", T,
                w->model.seq_len);
        goto done;
    }
    cli_debug_opts dbg;
    if (cli_debug_options("inspect", &dbg) != 0) goto done;
    if (!(s.be = fp8t_backend_create(device, &dbg.backend, err, sizeof(err)))) {
        fprintf(stderr, "fp8train inspect: --device %s: %s\n", device, err);
        goto done;
    }
    if (!(s.ev = fp8t_evaluator_create(s.be, w, &dbg.model, B, T, err, sizeof(err)))) {
        fprintf(stderr, "fp8train inspect: %s\n", err);
        goto done;
    }
    fp8t_policy pol, bf16;
    if (build_policy(&pol, fp8t_model_get_policy(fp8t_evaluator_model(s.ev)), w, &o) != 0)
        goto done;
    bf16 = pol;
    bf16.default_precision = bf16.head_precision = FP8T_PREC_BF16;
    bf16.n_overrides = 0;
    /* text data goes through the run's tokenizer, if it trained with one */
    if (!(s.d = fp8t_data_open_tok(data, val_data, def.tokenizer, FP8T_SPLIT_TRAIN, B, T,
                                   w->model.vocab_size, seed, err, sizeof(err)))) {
        fprintf(stderr, "fp8train inspect: data: %s\n", err);
        goto done;
    }
    if (o.out) snprintf(out, sizeof(out), "%s", o.out);
    else default_out(out, sizeof(out), w);
    if (fp8t_inspect_prepare_out(out, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train inspect: %s\n", err);
        goto done;
    }
    /* every micro-batch gets its rows (the spec may still say micro=first); dumps stay those
     * of the first micro-batch */
    const char *user_spec = o.spec ? o.spec : "";
    size_t spec_len = strlen(user_spec) + 32;
    if (!(s.spec = malloc(spec_len))) goto done;
    snprintf(s.spec, spec_len, "micro=all,%s%s", user_spec, o.compare_bf16 ? ",dump=1" : "");
    int calibrated = fp8t_inspect_calibrate(s.ev, s.d, first, batches);
    if (calibrated && !o.json)
        fprintf(stderr, "fp8train inspect: the weights carry no FP8 amax history (%s); delayed-"
                "scaling scales were calibrated on the inspected micro-batches\n", w->kind);

    fp8t_inspect_pass_result main_res, ref_res;
    memset(&ref_res, 0, sizeof(ref_res));
    ref_res.loss = NAN;
    if (run_pass(s.ev, s.d, &pol, s.spec, out, o.inject, step, first, batches, &main_res))
        goto done;
    snprintf(path, sizeof(path), "%s/stats.jsonl", out);
    int n_sites = 0;
    if (fp8t_inspect_sites_read(&s.sites, &n_sites, path, step, o.cosine_flag, err, sizeof(err))) {
        fprintf(stderr, "fp8train inspect: %s\n", err);
        goto done;
    }
    if (n_sites == 0) {
        fprintf(stderr, "fp8train inspect: --spec '%s' selected no tensor (note: every/start/end "
                "select steps, and this inspection is step %d; layers must exist: the model has "
                "%d)\n", user_spec, step, w->model.n_layer);
        goto done;
    }
    if (o.inject && main_res.injected == 0)
        fprintf(stderr, "fp8train inspect: warning: the --inject fault never fired (amax faults "
                "need a scale update, which inspect does not make; when=fp8 faults skip BF16 "
                "GEMMs; from= must be <= step %d)\n", step);
    int n_dumps = 0, n_dumps_flagged = 0;
    char note[512] = "";
    if (o.compare_bf16) {
        char ref_out[1100], ref_dumps[1200], test_dumps[1200];
        snprintf(ref_out, sizeof(ref_out), "%s/bf16", out);
        if (run_pass(s.ev, s.d, &bf16, s.spec, ref_out, o.inject, step, first, batches, &ref_res))
            goto done;
        snprintf(ref_dumps, sizeof(ref_dumps), "%s/dumps", ref_out);
        snprintf(test_dumps, sizeof(test_dumps), "%s/dumps", out);
        if (fp8t_compare_dump_dirs(&s.dumps, &n_dumps, &n_dumps_flagged, ref_dumps, test_dumps,
                                   o.cosine_flag, note, sizeof(note), err, sizeof(err))) {
            fprintf(stderr, "fp8train inspect: --compare-bf16: %s\n", err);
            goto done;
        }
    }

    int n_flagged = 0;
    for (int i = 0; i < n_sites; i++) n_flagged += s.sites[i].flagged;
    const int worst_i = worst_sqnr_site(s.sites, n_sites);
    fp8t_inspect_site worst;
    if (worst_i >= 0) worst = s.sites[worst_i];
    status = n_flagged || n_dumps_flagged || main_res.nonfinite ? 1 : 0;
    cli_describe_weights(desc, sizeof(desc), w);
    fp8t_policy_describe(&pol, pol_desc, sizeof(pol_desc));

    /* the record: OUT/inspect.json (and stdout with --json) */
    s.js = cJSON_CreateObject();
    cJSON_AddStringToObject(s.js, "command", "inspect");
    cJSON_AddBoolToObject(s.js, "complete", 1);
    cJSON_AddStringToObject(s.js, "weights", o.weights);
    cJSON_AddStringToObject(s.js, "description", desc);
    cJSON_AddNumberToObject(s.js, "step", step);
    cJSON_AddStringToObject(s.js, "out", out);
    cJSON_AddStringToObject(s.js, "data", fp8t_data_describe(s.d));
    cJSON_AddNumberToObject(s.js, "data_position", (double)first);
    cJSON_AddNumberToObject(s.js, "batches", batches);
    cJSON_AddNumberToObject(s.js, "batch", B);
    cJSON_AddNumberToObject(s.js, "seq_len", T);
    cJSON_AddStringToObject(s.js, "spec", s.spec);
    cJSON_AddStringToObject(s.js, "policy", pol_desc);
    if (o.inject) {
        cJSON_AddStringToObject(s.js, "inject", o.inject);
        cJSON_AddNumberToObject(s.js, "injected", (double)main_res.injected);
    }
    cJSON_AddBoolToObject(s.js, "calibrated", calibrated);
    json_num(s.js, "loss", main_res.loss);
    if (main_res.nonfinite)
        cJSON_AddStringToObject(s.js, "first_nonfinite", main_res.first_nonfinite);
    json_num(s.js, "cosine_flag", o.cosine_flag);
    cJSON_AddNumberToObject(s.js, "flagged_sites", n_flagged);
    cJSON_AddItemToObject(s.js, "sites", sites_json(s.sites, n_sites));
    if (o.compare_bf16) {
        cJSON *c = cJSON_AddObjectToObject(s.js, "compare_bf16");
        json_num(c, "bf16_loss", ref_res.loss);
        cJSON_AddNumberToObject(c, "flagged", n_dumps_flagged);
        if (note[0]) cJSON_AddStringToObject(c, "note", note);
        cJSON_AddItemToObject(c, "tensors", dumps_json(s.dumps, n_dumps));
    }
    cJSON_AddNumberToObject(s.js, "exit_status", status);
    char *text = cJSON_Print(s.js);
    snprintf(path, sizeof(path), "%s/inspect.json", out);
    if (!text || fp8t_write_file_atomic(path, text, strlen(text), err, sizeof(err)) != 0)
        fprintf(stderr, "fp8train inspect: cannot write %s: %s\n", path,
                text ? err : "out of memory");
    free(text);
    if (o.json) {
        char *line = cJSON_PrintUnformatted(s.js);
        if (line) printf("%s\n", line);
        free(line);
        goto done;
    }

    printf("weights: %s (%s)\n", o.weights, desc);
    printf("data: %s; %d micro-batch%s of %d x %d tokens from position %llu (step %d)\n",
           fp8t_data_describe(s.d), batches, batches == 1 ? "" : "es", B, T,
           (unsigned long long)first, step);
    printf("policy:\n");
    for (const char *line = pol_desc; *line;) { /* the description's lines, indented */
        size_t k = strcspn(line, "\n");
        printf("  %.*s\n", (int)k, line);
        line += k + (line[k] == '\n');
    }
    if (o.inject)
        printf("fault: %s (applied %ld time%s)\n", o.inject, main_res.injected,
               main_res.injected == 1 ? "" : "s");
    printf("loss: %.6f", main_res.loss);
    if (o.compare_bf16)
        printf("   all-BF16: %.6f (%+.3f%%)", ref_res.loss,
               100.0 * (main_res.loss - ref_res.loss) / fabs(ref_res.loss));
    printf("\n");
    if (main_res.nonfinite) printf("first non-finite tensor: %s\n", main_res.first_nonfinite);
    printf("\n");
    if (o.sort == SORT_SQNR) qsort(s.sites, (size_t)n_sites, sizeof(*s.sites), cmp_sqnr);
    if (o.sort == SORT_COSINE) qsort(s.sites, (size_t)n_sites, sizeof(*s.sites), cmp_cosine);
    int worst_pos = -1;
    for (int i = 0; worst_i >= 0 && i < n_sites; i++)
        if (s.sites[i].layer == worst.layer && !strcmp(s.sites[i].module, worst.module) &&
            !strcmp(s.sites[i].gemm, worst.gemm) && !strcmp(s.sites[i].tensor, worst.tensor))
            worst_pos = i;
    print_sites(s.sites, n_sites, worst_pos, o.top, o.cosine_flag);
    if (worst_i >= 0) {
        char l[16];
        layer_name(l, sizeof(l), worst.layer);
        printf("\nworst SQNR: layer %s %s %s %s: %.2f dB, cosine %.5f\n", l, worst.module,
               worst.gemm, worst.tensor, worst.sqnr_db, worst.cosine);
    }
    printf("%d of %d tensor site%s flagged (cosine < %.2f or NaN/Inf)\n", n_flagged, n_sites,
           n_sites == 1 ? "" : "s", o.cosine_flag);
    if (o.compare_bf16) {
        printf("\nFP8 pass against an all-BF16 pass of the same micro-batches (dumps of the first "
               "micro-batch, worst cosine first):\n");
        print_dumps(s.dumps, n_dumps, o.top, o.cosine_flag);
        if (note[0]) printf("note: %s\n", note);
        printf("%d of %d dumped tensor%s below cosine %.2f against BF16%s\n", n_dumps_flagged,
               n_dumps, n_dumps == 1 ? "" : "s", o.cosine_flag,
               n_dumps_flagged ? ": that quantization error is too large (the seeds' rule)" : "");
    }
    printf("\nstats: %s/stats.jsonl  record: %s/inspect.json%s\n", out, out,
           o.compare_bf16 ? "  (BF16 pass: OUT/bf16)" : "");
done:
    state_free(&s);
    return status;
}
