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
#include "fp8train/error.h"
#include "fp8train/inject.h"
#include "fp8train/inspect_checkpoint.h"
#include "fp8train/io.h"
#include "fp8train/policy_json.h"

#define CMD "inspect"
#define MAX_OVERRIDE_ARGS 64

typedef enum { SORT_SITE = 0, SORT_SQNR, SORT_COSINE } sort_order;

typedef struct {
    const char *data, *spec, *out, *inject, *device;
    const char *overrides[MAX_OVERRIDE_ARGS];
    int n_overrides;
    int batches, B, T, top, json, compare_bf16, help_inject; /* 0 (batches, B, T): the run's */
    int have_seed, have_position, have_precision;
    uint64_t seed, position;
    fp8t_precision precision; /* with have_precision: every GEMM in it */
    float cosine_flag;
    sort_order sort;
} inspect_opts;

static int set_override(void *obj, const char *v, char *err, size_t errlen) {
    inspect_opts *o = obj;
    if (o->n_overrides == MAX_OVERRIDE_ARGS) {
        return fp8t_errorf(err, errlen, "at most %d --override options", MAX_OVERRIDE_ARGS);
    }
    /* checked against the checkpoint's policy once it is loaded (build_policy) */
    o->overrides[o->n_overrides++] = v;
    return 0;
}
static int set_precision(void *obj, const char *v, char *err, size_t errlen) {
    inspect_opts *o = obj;
    if (fp8t_precision_parse(&o->precision, v) != 0) {
        return fp8t_errorf(err, errlen,
                           "--precision: bad value '%s' (expected fp8, delayed, current, "
                           "block, rowwise, mxfp8, fake, bf16 or fp32)",
                           v);
    }
    o->have_precision = 1;
    return 0;
}
static int set_seed(void *obj, const char *v, char *err, size_t errlen) {
    inspect_opts *o = obj;
    return cli_set_u64_given("seed", v, &o->seed, &o->have_seed, err, errlen);
}
static int set_position(void *obj, const char *v, char *err, size_t errlen) {
    inspect_opts *o = obj;
    return cli_set_u64_given("data-position", v, &o->position, &o->have_position, err, errlen);
}

static const fp8t_opt_choice SORTS[] = {
    {"site", SORT_SITE}, {"sqnr", SORT_SQNR}, {"cosine", SORT_COSINE}, {NULL, 0}};

#define F(f) FP8T_OPT_FIELD(inspect_opts, f)
static const fp8t_opt OPTS[] = {
    {.name = "spec",
     .arg = "SPEC",
     .type = FP8T_OPT_STR,
     F(spec),
     .dflt = "every GEMM tensor, no dumps",
     .help = "what to inspect and dump (the --inspect syntax of train), e.g. "
             "'layers=0-1,gemms=fprop+dgrad,tensors=input+output,dump=1'"},
    {.name = "out",
     .arg = "DIR",
     .type = FP8T_OPT_STR,
     F(out),
     .dflt = "RUN/inspect/step_N for a checkpoint, else ./inspect_out",
     .help = "stats.jsonl, dumps/, bf16/ and inspect.json"},
    {.name = "compare-bf16",
     .type = FP8T_OPT_FLAG,
     F(compare_bf16),
     .help = "also run the micro-batches with every GEMM in BF16 (into OUT/bf16) and compare "
             "the dumped tensors one by one (cosine, relative error); implies dump=1 (dumps: "
             "the first micro-batch)"},
    {.name = "precision",
     .arg = "P",
     .type = FP8T_OPT_SPECIAL,
     .set = set_precision,
     .dflt = "the checkpoint's policy",
     .help = "every GEMM in P: fp8 | delayed | current | block | rowwise | mxfp8 | fake | bf16 "
             "| fp32 (replaces the checkpoint's policy and its overrides)"},
    {.name = "override",
     .arg = "SPEC",
     .type = FP8T_OPT_SPECIAL,
     .set = set_override,
     .dflt = FP8T_OPT_NO_DEFAULT,
     .help = "per-layer/module/GEMM precision on top (repeatable), e.g. "
             "'layers=1,gemm=dgrad,precision=bf16'"},
    {.name = "inject",
     .arg = "SPEC",
     .type = FP8T_OPT_STR,
     F(inject),
     .dflt = FP8T_OPT_NO_DEFAULT,
     .help = "a fault during the passes (the train syntax, --help-inject); value faults only: "
             "amax faults need a scale update"},
    {.name = "data",
     .arg = "SRC",
     .type = FP8T_OPT_STR,
     F(data),
     .dflt = "the checkpoint's",
     .help = "synthetic | text file | 'dir/*.bin'"},
    {.name = "data-position",
     .arg = "N",
     .type = FP8T_OPT_SPECIAL,
     .set = set_position,
     .dflt = "the checkpoint's data position with its data, else 0",
     .help = "index of the first training micro-batch"},
    {.name = "batches",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(batches),
     .lo = 1,
     .hi = 100000,
     .dflt = "the run's --grad-accum, else 1",
     .help = "micro-batches"},
    CLI_ROW_BATCH(inspect_opts),
    CLI_ROW_SEQ_LEN(inspect_opts),
    {.name = "seed",
     .arg = "S",
     .type = FP8T_OPT_SPECIAL,
     .set = set_seed,
     .dflt = "the checkpoint's, else 1337",
     .help = "data seed"},
    {.name = "cosine-flag",
     .arg = "X",
     .type = FP8T_OPT_FLOAT,
     F(cosine_flag),
     .lo = 0,
     .hi = 1,
     .help = "flag below this cosine"},
    {.name = "sort",
     .arg = "site|sqnr|cosine",
     .type = FP8T_OPT_CHOICE,
     F(sort),
     .choices = SORTS,
     .help = "row order: model order (site) or worst first"},
    {.name = "top",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(top),
     .lo = 1,
     .hi = 1 << 30,
     .dflt = "all",
     .help = "print at most N rows per table"},
    CLI_ROW_RUN_DEVICE(inspect_opts),
    {.name = "json",
     .type = FP8T_OPT_FLAG,
     F(json),
     .help = "print one JSON object instead of the tables"},
    {.name = "help-inject",
     .type = FP8T_OPT_FLAG,
     F(help_inject),
     .dflt = FP8T_OPT_NO_DEFAULT,
     .help = "the --inject syntax"},
};
#undef F

static const fp8t_opt_spec SPEC = {
    .cmd = CMD,
    .usage = "WEIGHTS [options]",
    .about =
        "Tensor statistics of WEIGHTS' GEMMs: forward and backward (no optimizer or scale\n"
        "update) on a few micro-batches with the FP8 state of WEIGHTS under its precision\n"
        "policy, then a table per layer / module / GEMM / tensor: amax, scale, underflow %,\n"
        "saturation %, SQNR and cosine of the FP8 image. Cosine < 0.99 means that tensor's\n"
        "quantization error is too large: the row is flagged.\n"
        "WEIGHTS: a checkpoint directory (RUN/checkpoints/step_N), a Hugging Face directory\n"
        "or an llm.c GPT-2 .bin (as for fp8train eval).\n"
        "A checkpoint at step S is inspected on the micro-batches its step S+1 would train on\n"
        "(its data position); rows are labelled step S+1, like `train --resume CKPT "
        "--inspect`.\n",
    .epilog =
        "Weights without an amax history (an import) get delayed-scaling scales from one\n"
        "BF16 forward + backward + scale update on the inspected micro-batches first.\n"
        "exit status: 0 nothing flagged, 1 a tensor flagged (cosine below the flag, NaN/Inf,\n"
        "or with --compare-bf16 a dump whose cosine against BF16 is below it), 2 bad input\n",
    .opts = OPTS,
    .n_opts = (int)(sizeof(OPTS) / sizeof(OPTS[0])),
    .max_pos = 2, /* a second one gets its own message (below) */
    .wrap = CLI_HELP_WRAP,
};

/* The options into o and WEIGHTS into *weights. -1: go on; else the exit status to return
 * (0 after --help, --list-options or --help-inject; 2 after a message). */
static int parse_args(inspect_opts *o, const char **weights, int argc, char **argv) {
    memset(o, 0, sizeof(*o));
    o->cosine_flag = (float)FP8T_INSPECT_COSINE_FLAG;
    const char *pos[2] = {NULL, NULL};
    int n_pos = 0, st = cli_parse(&SPEC, o, sizeof(*o), argc, argv, pos, &n_pos);
    if (st >= 0) return st;
    if (o->help_inject) { /* a help: asked for without WEIGHTS */
        fputs(fp8t_injector_help(), stdout);
        return 0;
    }
    *weights = pos[0];
    if (n_pos > 1) {
        fprintf(stderr, "fp8train inspect: one WEIGHTS argument expected, got '%s' and '%s'\n",
                pos[0], pos[1]);
        return 2;
    }
    if (!*weights) {
        fprintf(
            stderr,
            "fp8train inspect: which weights? give a checkpoint directory "
            "(RUN/checkpoints/step_N), a Hugging Face directory or an llm.c .bin (see fp8train "
            "inspect --help)\n");
        return 2;
    }
    char e[FP8T_ERR_LEN];
    if (o->spec && fp8t_inspector_spec_check(o->spec, e, sizeof(e)) != 0) {
        fprintf(stderr, "fp8train inspect: --spec: %s\n", e);
        return 2;
    }
    if (o->inject && fp8t_injector_check(o->inject, e, sizeof(e)) != 0) {
        fprintf(stderr, "fp8train inspect: --inject: %s\n", e);
        return 2;
    }
    return -1;
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
    char e[FP8T_ERR_LEN];
    fp8t_policy saved;
    fp8t_policy_default(&saved);
    if (w->policy_json && fp8t_policy_from_json(&saved, w->policy_json, e, sizeof(e)) != 0) {
        fprintf(stderr,
                "fp8train inspect: the checkpoint's policy is unreadable (%s); using the "
                "default policy (fp8, delayed scaling)\n",
                e);
        fp8t_policy_default(&saved);
    }
    *pol = *model_pol;
    pol->default_precision = saved.default_precision;
    pol->recipe = saved.recipe;
    pol->head_precision = saved.head_precision;
    pol->n_overrides = saved.n_overrides;
    memcpy(pol->overrides, saved.overrides, sizeof(pol->overrides));
    if (o->have_precision) {
        pol->default_precision = o->precision;
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
    if (isnan(x))
        snprintf(b, n, "-");
    else if (x >= 1e299)
        snprintf(b, n, "exact");
    else
        snprintf(b, n, f, x);
}

static void layer_name(char *b, size_t n, int layer) {
    if (layer < 0)
        snprintf(b, n, "head");
    else
        snprintf(b, n, "%d", layer);
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
        if (r->nonfinite > 0)
            snprintf(why, sizeof(why), "  << %.0f NaN/Inf", r->nonfinite);
        else if (r->flagged)
            snprintf(why, sizeof(why), "  << cosine < %.2f", flag);
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
    if (isfinite(v))
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
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

/* ---------------------------------------------------------------- the command's steps */

/* One inspection: the options resolved against what the weights' run used, what is built
 * from them, the passes' results and the summary; state_free releases it all. */
typedef struct {
    const inspect_opts *o;
    const char *weights; /* the argument */
    fp8t_weights w;
    fp8t_backend *be;
    fp8t_evaluator *ev;
    fp8t_data *d;
    fp8t_policy pol, bf16; /* the policy inspected; --compare-bf16's all-BF16 one */
    int B, T, batches, step, calibrated;
    uint64_t seed, first; /* first: the data position of the first micro-batch */
    char out[1024];
    const char *user_spec; /* --spec, or "" */
    char *spec;            /* what the passes inspect: user_spec for every micro-batch */
    fp8t_inspect_pass_result main_res, ref_res; /* ref_res: the BF16 pass */
    fp8t_inspect_site *sites;
    int n_sites, n_flagged, worst_i; /* worst_i: the worst SQNR's row before sorting, or -1 */
    fp8t_inspect_site worst;
    fp8t_dump_diff *dumps;
    int n_dumps, n_dumps_flagged;
    char note[512], desc[512], pol_desc[2048];
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
    char err[FP8T_ERR_LEN];
    fp8t_inspect_pass_cfg pc = {.policy = pol,
                                .spec = spec,
                                .out_dir = out,
                                .inject = inject,
                                .step = step,
                                .first_batch = first,
                                .batches = batches};
    if (fp8t_inspect_pass(ev, d, &pc, res, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train inspect: %s\n", err);
        return -1;
    }
    return 0;
}

/* The defaults the run suggests (data, shape, seed, the micro-batches its next step would
 * train on), the backend and evaluator, the policies, the data, OUT, the pass's spec, and
 * scales for weights without an amax history. s->w is loaded. 0 ok, 2 after a message. */
static int inspect_setup(inspect_state *s) {
    const inspect_opts *o = s->o;
    const fp8t_weights *w = &s->w;
    char err[FP8T_ERR_LEN];
    cli_run_defaults def;
    cli_run_defaults_from(w, &def);
    const int is_ckpt = !strcmp(w->kind, "checkpoint");
    const char *data = o->data ? o->data : def.data;
    const int own_data = !o->data || !strcmp(o->data, def.data);
    const char *val_data = own_data ? def.val_data : "";
    s->B = o->B ? o->B : def.batch;
    s->T = o->T ? o->T : def.seq_len;
    s->batches = o->batches ? o->batches : run_grad_accum(w);
    s->seed = o->have_seed ? o->seed : def.seed;
    const char *device = o->device ? o->device : def.device;
    s->step = w->step + 1; /* the step these micro-batches would train */
    s->first = o->have_position ? o->position : 0;
    if (!o->have_position && is_ckpt && own_data) {
        fp8t_checkpoint st;
        memset(&st, 0, sizeof(st));
        if (fp8t_checkpoint_read_state(w->source, &st, err, sizeof(err)) == 0)
            s->first = st.data_position;
        fp8t_checkpoint_free(&st);
    }
    if (s->T > w->model.seq_len) {
        fprintf(stderr, "fp8train inspect: --seq-len %d exceeds the model's maximum %d\n", s->T,
                w->model.seq_len);
        return 2;
    }
    cli_debug_opts dbg;
    if (cli_debug_options("inspect", &dbg) != 0) return 2;
    if (!(s->be = fp8t_backend_create(device, &dbg.backend, err, sizeof(err)))) {
        fprintf(stderr, "fp8train inspect: --device %s: %s\n", device, err);
        return 2;
    }
    if (!(s->ev = fp8t_evaluator_create(s->be, w, &dbg.model, s->B, s->T, err, sizeof(err)))) {
        fprintf(stderr, "fp8train inspect: %s\n", err);
        return 2;
    }
    if (build_policy(&s->pol, fp8t_model_get_policy(fp8t_evaluator_model(s->ev)), w, o) != 0)
        return 2;
    s->bf16 = s->pol;
    s->bf16.default_precision = s->bf16.head_precision = FP8T_PREC_BF16;
    s->bf16.n_overrides = 0;
    /* text data goes through the run's tokenizer, if it trained with one */
    if (!(s->d = fp8t_data_open_tok(data, val_data, def.tokenizer, FP8T_SPLIT_TRAIN, s->B, s->T,
                                    w->model.vocab_size, s->seed, err, sizeof(err)))) {
        fprintf(stderr, "fp8train inspect: data: %s\n", err);
        return 2;
    }
    if (o->out)
        snprintf(s->out, sizeof(s->out), "%s", o->out);
    else
        default_out(s->out, sizeof(s->out), w);
    if (fp8t_inspect_prepare_out(s->out, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train inspect: %s\n", err);
        return 2;
    }
    /* every micro-batch gets its rows (the spec may still say micro=first); dumps stay those
     * of the first micro-batch */
    s->user_spec = o->spec ? o->spec : "";
    size_t spec_len = strlen(s->user_spec) + 32;
    if (!(s->spec = malloc(spec_len))) return 2;
    snprintf(s->spec, spec_len, "micro=all,%s%s", s->user_spec, o->compare_bf16 ? ",dump=1" : "");
    s->calibrated = fp8t_inspect_calibrate(s->ev, s->d, s->first, s->batches);
    if (s->calibrated && !o->json)
        fprintf(stderr,
                "fp8train inspect: the weights carry no FP8 amax history (%s); delayed-"
                "scaling scales were calibrated on the inspected micro-batches\n",
                w->kind);
    return 0;
}

/* The inspected pass and its rows, then with --compare-bf16 the all-BF16 pass and the dumps
 * compared. 0 ok, 2 after a message. */
static int inspect_passes(inspect_state *s) {
    const inspect_opts *o = s->o;
    char err[FP8T_ERR_LEN], path[1200];
    memset(&s->ref_res, 0, sizeof(s->ref_res));
    s->ref_res.loss = NAN;
    if (run_pass(s->ev, s->d, &s->pol, s->spec, s->out, o->inject, s->step, s->first, s->batches,
                 &s->main_res))
        return 2;
    snprintf(path, sizeof(path), "%s/stats.jsonl", s->out);
    if (fp8t_inspect_sites_read(&s->sites, &s->n_sites, path, s->step, o->cosine_flag, err,
                                sizeof(err))) {
        fprintf(stderr, "fp8train inspect: %s\n", err);
        return 2;
    }
    if (s->n_sites == 0) {
        fprintf(stderr,
                "fp8train inspect: --spec '%s' selected no tensor (note: every/start/end "
                "select steps, and this inspection is step %d; layers must exist: the model has "
                "%d)\n",
                s->user_spec, s->step, s->w.model.n_layer);
        return 2;
    }
    if (o->inject && s->main_res.injected == 0)
        fprintf(stderr,
                "fp8train inspect: warning: the --inject fault never fired (amax faults "
                "need a scale update, which inspect does not make; when=fp8 faults skip BF16 "
                "GEMMs; from= must be <= step %d)\n",
                s->step);
    if (!o->compare_bf16) return 0;
    char ref_out[1100], ref_dumps[1200], test_dumps[1200];
    snprintf(ref_out, sizeof(ref_out), "%s/bf16", s->out);
    if (run_pass(s->ev, s->d, &s->bf16, s->spec, ref_out, o->inject, s->step, s->first,
                 s->batches, &s->ref_res))
        return 2;
    snprintf(ref_dumps, sizeof(ref_dumps), "%s/dumps", ref_out);
    snprintf(test_dumps, sizeof(test_dumps), "%s/dumps", s->out);
    if (fp8t_compare_dump_dirs(&s->dumps, &s->n_dumps, &s->n_dumps_flagged, ref_dumps, test_dumps,
                               o->cosine_flag, s->note, sizeof(s->note), err, sizeof(err))) {
        fprintf(stderr, "fp8train inspect: --compare-bf16: %s\n", err);
        return 2;
    }
    return 0;
}

/* The verdict (0 nothing flagged, 1 flagged; returned) and the record: OUT/inspect.json, and
 * stdout with --json. */
static int inspect_record(inspect_state *s) {
    const inspect_opts *o = s->o;
    char err[FP8T_ERR_LEN], path[1200];
    s->n_flagged = 0;
    for (int i = 0; i < s->n_sites; i++) s->n_flagged += s->sites[i].flagged;
    s->worst_i = worst_sqnr_site(s->sites, s->n_sites);
    if (s->worst_i >= 0) s->worst = s->sites[s->worst_i];
    const int status = s->n_flagged || s->n_dumps_flagged || s->main_res.nonfinite ? 1 : 0;
    cli_describe_weights(s->desc, sizeof(s->desc), &s->w);
    fp8t_policy_describe(&s->pol, s->pol_desc, sizeof(s->pol_desc));

    cJSON *js = s->js = cJSON_CreateObject();
    cJSON_AddStringToObject(js, "command", "inspect");
    cJSON_AddBoolToObject(js, "complete", 1);
    cJSON_AddStringToObject(js, "weights", s->weights);
    cJSON_AddStringToObject(js, "description", s->desc);
    cJSON_AddNumberToObject(js, "step", s->step);
    cJSON_AddStringToObject(js, "out", s->out);
    cJSON_AddStringToObject(js, "data", fp8t_data_describe(s->d));
    cJSON_AddNumberToObject(js, "data_position", (double)s->first);
    cJSON_AddNumberToObject(js, "batches", s->batches);
    cJSON_AddNumberToObject(js, "batch", s->B);
    cJSON_AddNumberToObject(js, "seq_len", s->T);
    cJSON_AddStringToObject(js, "spec", s->spec);
    cJSON_AddStringToObject(js, "policy", s->pol_desc);
    if (o->inject) {
        cJSON_AddStringToObject(js, "inject", o->inject);
        cJSON_AddNumberToObject(js, "injected", (double)s->main_res.injected);
    }
    cJSON_AddBoolToObject(js, "calibrated", s->calibrated);
    json_num(js, "loss", s->main_res.loss);
    if (s->main_res.nonfinite)
        cJSON_AddStringToObject(js, "first_nonfinite", s->main_res.first_nonfinite);
    json_num(js, "cosine_flag", o->cosine_flag);
    cJSON_AddNumberToObject(js, "flagged_sites", s->n_flagged);
    cJSON_AddItemToObject(js, "sites", sites_json(s->sites, s->n_sites));
    if (o->compare_bf16) {
        cJSON *c = cJSON_AddObjectToObject(js, "compare_bf16");
        json_num(c, "bf16_loss", s->ref_res.loss);
        cJSON_AddNumberToObject(c, "flagged", s->n_dumps_flagged);
        if (s->note[0]) cJSON_AddStringToObject(c, "note", s->note);
        cJSON_AddItemToObject(c, "tensors", dumps_json(s->dumps, s->n_dumps));
    }
    cJSON_AddNumberToObject(js, "exit_status", status);
    char *text = cJSON_Print(js);
    snprintf(path, sizeof(path), "%s/inspect.json", s->out);
    if (!text || fp8t_write_file_atomic(path, text, strlen(text), err, sizeof(err)) != 0)
        fprintf(stderr, "fp8train inspect: cannot write %s: %s\n", path,
                text ? err : "out of memory");
    free(text);
    if (o->json) {
        char *line = cJSON_PrintUnformatted(js);
        if (line) printf("%s\n", line);
        free(line);
    }
    return status;
}

/* The tables: what was inspected, the rows (in --sort's order), the worst SQNR, and with
 * --compare-bf16 the dumps against BF16. */
static void inspect_print(inspect_state *s) {
    const inspect_opts *o = s->o;
    const fp8t_inspect_pass_result *mr = &s->main_res;
    printf("weights: %s (%s)\n", s->weights, s->desc);
    printf("data: %s; %d micro-batch%s of %d x %d tokens from position %llu (step %d)\n",
           fp8t_data_describe(s->d), s->batches, s->batches == 1 ? "" : "es", s->B, s->T,
           (unsigned long long)s->first, s->step);
    printf("policy:\n");
    for (const char *line = s->pol_desc; *line;) { /* the description's lines, indented */
        size_t k = strcspn(line, "\n");
        printf("  %.*s\n", (int)k, line);
        line += k + (line[k] == '\n');
    }
    if (o->inject)
        printf("fault: %s (applied %ld time%s)\n", o->inject, mr->injected,
               mr->injected == 1 ? "" : "s");
    printf("loss: %.6f", mr->loss);
    if (o->compare_bf16)
        printf("   all-BF16: %.6f (%+.3f%%)", s->ref_res.loss,
               100.0 * (mr->loss - s->ref_res.loss) / fabs(s->ref_res.loss));
    printf("\n");
    if (mr->nonfinite) printf("first non-finite tensor: %s\n", mr->first_nonfinite);
    printf("\n");
    const int n_sites = s->n_sites;
    if (o->sort == SORT_SQNR) qsort(s->sites, (size_t)n_sites, sizeof(*s->sites), cmp_sqnr);
    if (o->sort == SORT_COSINE) qsort(s->sites, (size_t)n_sites, sizeof(*s->sites), cmp_cosine);
    const fp8t_inspect_site *worst = &s->worst;
    int worst_pos = -1; /* where the worst row went in the sorted table */
    for (int i = 0; s->worst_i >= 0 && i < n_sites; i++)
        if (s->sites[i].layer == worst->layer && !strcmp(s->sites[i].module, worst->module) &&
            !strcmp(s->sites[i].gemm, worst->gemm) && !strcmp(s->sites[i].tensor, worst->tensor))
            worst_pos = i;
    print_sites(s->sites, n_sites, worst_pos, o->top, o->cosine_flag);
    if (s->worst_i >= 0) {
        char l[16];
        layer_name(l, sizeof(l), worst->layer);
        printf("\nworst SQNR: layer %s %s %s %s: %.2f dB, cosine %.5f\n", l, worst->module,
               worst->gemm, worst->tensor, worst->sqnr_db, worst->cosine);
    }
    printf("%d of %d tensor site%s flagged (cosine < %.2f or NaN/Inf)\n", s->n_flagged, n_sites,
           n_sites == 1 ? "" : "s", o->cosine_flag);
    if (o->compare_bf16) {
        printf(
            "\nFP8 pass against an all-BF16 pass of the same micro-batches (dumps of the first "
            "micro-batch, worst cosine first):\n");
        print_dumps(s->dumps, s->n_dumps, o->top, o->cosine_flag);
        if (s->note[0]) printf("note: %s\n", s->note);
        printf("%d of %d dumped tensor%s below cosine %.2f against BF16%s\n", s->n_dumps_flagged,
               s->n_dumps, s->n_dumps == 1 ? "" : "s", o->cosine_flag,
               s->n_dumps_flagged ? ": that quantization error is too large (the seeds' rule)"
                                  : "");
    }
    printf("\nstats: %s/stats.jsonl  record: %s/inspect.json%s\n", s->out, s->out,
           o->compare_bf16 ? "  (BF16 pass: OUT/bf16)" : "");
}

int fp8t_cmd_inspect(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], "inspect")) {
        argc--;
        argv++;
    }
    inspect_opts o;
    const char *weights = NULL;
    int status = parse_args(&o, &weights, argc, argv);
    if (status >= 0) return status;
    inspect_state s;
    memset(&s, 0, sizeof(s));
    s.o = &o;
    s.weights = weights;
    char err[FP8T_ERR_LEN];
    if (fp8t_weights_load(weights, &s.w, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train inspect: %s\n", err);
        return 2;
    }
    status = inspect_setup(&s);
    if (status == 0) status = inspect_passes(&s);
    if (status == 0) {
        status = inspect_record(&s);
        if (!o.json) inspect_print(&s);
    }
    state_free(&s);
    return status;
}
