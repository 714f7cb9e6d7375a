/* `fp8train bench-infer [WEIGHTS]`: inference throughput and memory of the inference model
 * (fp8train/infer.h), precisions side by side at a small and a large batch: prefill tokens/s
 * (the prompts of a batch in one forward, the KV cache written) and decode tokens/s (one token
 * per sequence per step against the cache), the model's device bytes by kind, and on the CUDA
 * backend the peak device memory of each configuration (a fresh backend per configuration,
 * so each peak is its own). Weights: a checkpoint / export / Hugging Face directory / llm.c
 * file, or a preset's shape with random weights (throughput does not depend on the values).
 * Exit status: 0 ok, 2 bad input or usage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli/cmd_weights_common.h"
#include "fp8train/backend.h"
#include "fp8train/error.h"
#include "fp8train/infer.h"
#include "fp8train/profile.h"

#define CMD "bench-infer"

/* the CUDA backend's memory accounting (cuda_backend.cu); absent in builds without CUDA */
extern int fp8t_cuda_memory_info(fp8t_backend *b, size_t *in_use, size_t *peak, size_t *dev_free,
                                 size_t *dev_total) __attribute__((weak));

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mix(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Random weights of cfg on the host, GPT-2 init's scales: matrices ~ 0.02 * (sum of 4
 * uniforms, centred: near normal), norm weights 1, biases 0. Fast, and no training model. */
static int random_weights(const fp8t_model_config *cfg, uint64_t seed, fp8t_weights *w) {
    memset(w, 0, sizeof(*w));
    size_t total;
    const int n = fp8t_model_param_table(cfg, NULL, &total);
    fp8t_param_info *info = calloc((size_t)n, sizeof(*info));
    w->params = malloc(total * sizeof(float));
    if (!info || !w->params) {
        free(info);
        free(w->params);
        w->params = NULL;
        return -1;
    }
    fp8t_model_param_table(cfg, info, &total);
    for (int i = 0; i < n; i++) {
        float *p = w->params + info[i].offset;
        const size_t k = info[i].numel;
        const size_t len = strlen(info[i].name);
        if (info[i].ndim == 2) {
            const long chunks = (long)((k + 65535) / 65536);
#pragma omp parallel for schedule(static)
            for (long c = 0; c < chunks; c++) {
                uint64_t s = seed ^ ((uint64_t)i << 40) ^ (uint64_t)c * 0x632BE59BD9B4E019ULL;
                const size_t hi = ((size_t)c + 1) * 65536 < k ? ((size_t)c + 1) * 65536 : k;
                for (size_t j = (size_t)c * 65536; j < hi; j++) {
                    const uint64_t r = mix(&s);
                    const double u = (double)(r & 0xFFFF) + (double)((r >> 16) & 0xFFFF) +
                                     (double)((r >> 32) & 0xFFFF) + (double)(r >> 48);
                    /* 4 uniforms on [0, 65536): mean 131070, sd 65536 * sqrt(4/12) */
                    p[j] = (float)(0.02 * (u - 131070.0) / 37837.2);
                }
            }
        } else {
            const float v = len >= 2 && !strcmp(info[i].name + len - 2, ".w") ? 1.0f : 0.0f;
            for (size_t j = 0; j < k; j++) p[j] = v;
        }
    }
    free(info);
    w->model = *cfg;
    w->num_params = total;
    snprintf(w->kind, sizeof(w->kind), "random");
    snprintf(w->source, sizeof(w->source), "random weights");
    return 0;
}

/* "a,b,c" of ints in [lo, hi] into v (at most max); the count, or -1 */
static int parse_int_list(const char *s, int *v, int max, int lo, int hi) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < lo || x > hi || n == max) return -1;
        v[n++] = (int)x;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return n > 0 ? n : -1;
}

#define MAX_BATCHES 16

typedef struct {
    const char *preset, *device, *out; /* preset NULL: not given (tiny without WEIGHTS) */
    fp8t_eval_precision precs[FP8T_EVAL_COUNT];
    int n_prec, have_precs; /* without --precisions: the device's default list */
    int batches[MAX_BATCHES], n_batch;
    int plen, gen, repeat, profile;
    uint64_t seed;
    cli_infer_opts io;
} bench_opts;

/* "bf16,fp8": at most one entry per precision, as strtok splits it (empty entries skipped) */
static int parse_precisions(const char *list, fp8t_eval_precision *precs, int *n) {
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", list);
    *n = 0;
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        if (*n == FP8T_EVAL_COUNT || fp8t_eval_precision_parse(&precs[*n], t) != 0) return -1;
        (*n)++;
    }
    return 0;
}
static int set_precisions(void *obj, const char *v, char *err, size_t errlen) {
    bench_opts *o = obj;
    if (parse_precisions(v, o->precs, &o->n_prec) != 0) {
        return fp8t_errorf(
            err, errlen, "--precisions: bad value '%s' (expected a list of bf16, fp8, fp32)", v);
    }
    o->have_precs = 1;
    return 0;
}
static int set_batches(void *obj, const char *v, char *err, size_t errlen) {
    bench_opts *o = obj;
    const int n = parse_int_list(v, o->batches, MAX_BATCHES, 1, 1 << 16);
    if (n < 0) {
        return fp8t_errorf(err, errlen,
                           "--batch: bad value '%s' (expected up to %d batch sizes in "
                           "1..65536 such as \"1,64\")",
                           v, MAX_BATCHES);
    }
    o->n_batch = n;
    return 0;
}
static void get_batches(const void *obj, char *buf, size_t len) {
    const bench_opts *o = obj;
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < o->n_batch && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%d", i ? "," : "", o->batches[i]);
}

/* --preset's help names the presets, which the model library lists at run time */
static char preset_help[1024];

#define F(f) FP8T_OPT_FIELD(bench_opts, f)
static const fp8t_opt OPTS[] = {
    {.name = "preset",
     .arg = "NAME",
     .type = FP8T_OPT_STR,
     F(preset),
     .dflt = "tiny",
     .help = preset_help},
    {.name = "device", .arg = "cpu|cuda", .type = FP8T_OPT_STR, F(device), .help = "backend"},
    {.name = "precisions",
     .arg = "LIST",
     .type = FP8T_OPT_SPECIAL,
     .set = set_precisions,
     .dflt = "bf16,fp8; on the CPU bf16,fp8,fp32",
     .help = "comma-separated of bf16, fp8, fp32"},
    {.name = "batch",
     .arg = "LIST",
     .type = FP8T_OPT_SPECIAL,
     .set = set_batches,
     .get = get_batches,
     .help = "batch sizes, comma-separated"},
    {.name = "prompt-len",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(plen),
     .lo = 1,
     .hi = 1 << 20,
     .help = "prompt tokens per sequence, the prefill (at most seq_len - --gen)"},
    {.name = "gen",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(gen),
     .lo = 0,
     .hi = 1 << 20,
     .help = "decode steps timed"},
    {.name = "repeat",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(repeat),
     .lo = 1,
     .hi = 1000,
     .help = "timed repetitions, the fastest kept"},
    {.name = "profile",
     .type = FP8T_OPT_FLAG,
     F(profile),
     .help = "after the timed rounds, one prefill and the decode steps again under the per-op "
             "profiler (each op waits for the device), and a table of where each went (ms per "
             "call of prefill / decode)"},
    {.name = "seed",
     .arg = "S",
     .type = FP8T_OPT_U64,
     F(seed),
     .help = "random weights and prompt tokens"},
    {.name = "out",
     .arg = "FILE",
     .type = FP8T_OPT_STR,
     F(out),
     .help = "also write the results as JSON"},
    CLI_ROW_ACT_SCALE(bench_opts, io,
                      "fp8 activation scales: each input's amax (current), the learned ones "
                      "(delayed: needs WEIGHTS with an FP8 state), or fixed from the input "
                      "amaxes of --calib-batches batches of the prompts' shape (calibrated), "
                      "from --calib-data's training split or else random tokens"),
    CLI_ROW_CALIB_DATA(bench_opts, io, "random tokens",
                       "calibration text/shards for --act-scale calibrated"),
    CLI_ROW_CALIB_BATCHES(bench_opts, io, "calibration batches"),
    CLI_ROW_KV_CACHE(bench_opts, io, "fp8",
                     "the fp8 rows' KV cache (fp8: E4M3 with a scale per position and head); "
                     "the bf16 rows keep BF16, fp32 FP32"),
    CLI_ROW_FP8_HEAD(bench_opts, io,
                     "the fp8 rows with the embedding table and the head in E4M3 too where the "
                     "vocabulary is a multiple of 16 (else BF16: the rows say which)"),
    CLI_ROW_ROWS(bench_opts, io),
    CLI_ROW_MLP_ROWS(bench_opts, io),
    CLI_ROW_PREFETCH_MB(bench_opts, io),
    CLI_ROW_NO_GRAPHS(bench_opts, io,
                      "decode steps op by op (CUDA records a step once and "
                      "replays it by default)"),
};
#undef F

static const fp8t_opt_spec SPEC = {
    .cmd = CMD,
    .usage = "[WEIGHTS] [options]",
    .about =
        "Prefill and decode tokens/s and memory of the inference model (weights in the\n"
        "inference precision only, a KV cache), precisions side by side, batch 1 and a large\n"
        "batch. WEIGHTS: a checkpoint, export, Hugging Face directory or llm.c file; without\n"
        "it, --preset's shape with random weights.\n",
    .epilog = "Columns: prefill and decode tokens/s (all sequences), the model's device bytes\n"
              "(linear weights, embeddings+norms, KV cache, one layer's activations), and peak "
              "device\nmemory (CUDA: everything the backend held, workspace and scratch "
              "included; '-' on\nthe CPU). fp8 / bf16 ratios follow each batch's rows. Times "
              "exclude copying the\nlogits to the host (sampling).\n"
              "Exit status: 0 ok, 2 bad input or usage (or a configuration that failed).\n",
    .opts = OPTS,
    .n_opts = (int)(sizeof(OPTS) / sizeof(OPTS[0])),
    .max_pos = 2, /* a second one gets its own message (below) */
    .wrap = CLI_HELP_WRAP,
};

/* The options into o and WEIGHTS (or NULL) into *weights. -1: go on; else the exit status to
 * return (0 after --help / --list-options, 2 after a message). */
static int parse_args(bench_opts *o, const char **weights, int argc, char **argv) {
    memset(o, 0, sizeof(*o));
    o->device = "cpu";
    o->batches[0] = 1, o->batches[1] = 64, o->n_batch = 2;
    o->plen = 128, o->gen = 32, o->repeat = 2;
    o->seed = 1337;
    cli_infer_opts_init(&o->io);
    snprintf(preset_help, sizeof(preset_help), "model shape when no WEIGHTS: %s",
             fp8t_model_preset_names());
    const char *pos[2] = {NULL, NULL};
    int n_pos = 0, st = cli_parse(&SPEC, o, sizeof(*o), argc, argv, pos, &n_pos);
    if (st >= 0) return st;
    *weights = pos[0];
    if (n_pos > 1) {
        fprintf(stderr,
                "fp8train bench-infer: one WEIGHTS argument expected, got '%s' and '%s'\n",
                pos[0], pos[1]);
        return 2;
    }
    if (*weights && o->preset) {
        fprintf(stderr, "fp8train bench-infer: give WEIGHTS or --preset, not both\n");
        return 2;
    }
    if (!o->have_precs) /* the default list is valid */
        parse_precisions(!strcmp(o->device, "cpu") ? "bf16,fp8,fp32" : "bf16,fp8", o->precs,
                         &o->n_prec);
    return -1;
}

typedef struct {
    fp8t_eval_precision prec;
    int batch;
    int kv, graphs;  /* the cache's kind; decode replayed as a graph */
    int fp8_head;    /* embedding table and head in E4M3 */
    int prefetch_mb; /* decode's L2 prefetch per GEMM (0: none) */
    char act[128];   /* fp8t_infer_act_desc */
    double prefill_tps, decode_tps, prefill_s, decode_s;
    fp8t_infer_memory mem;
    double peak_mb; /* < 0: unknown (CPU) */
    int ok;
} result;

/* One configuration on a fresh backend. 0 ok; -1 with err. */
static int run_one(const char *device, const fp8t_weights *w, const cli_infer_opts *io, int plen,
                   int gen, int repeat, int profile, uint64_t seed, result *r, char *err,
                   size_t errlen) {
    char e[FP8T_ERR_LEN];
    cli_debug_opts dbg;
    if (cli_debug_options("bench-infer", &dbg) != 0) {
        return fp8t_errorf(err, errlen, "the debug environment variables are not valid");
    }
    fp8t_backend *be = fp8t_backend_create(device, &dbg.backend, e, sizeof(e));
    if (!be) {
        return fp8t_errorf(err, errlen, "--device %s: %s", device, e);
    }
    fp8t_backend *inner = be; /* the real backend (memory figures) under the profiler */
    if (profile) {
        fp8t_backend *pw = fp8t_profile_wrap(be);
        if (!pw) {
            fp8t_backend_destroy(be);
            return fp8t_errorf(err, errlen, "out of host memory for the profiler");
        }
        be = pw;
    }
    const int B = r->batch, V = w->model.vocab_size;
    fp8t_infer_opts mo;
    cli_infer_model_opts(io, r->prec, &mo);
    if (r->prec != FP8T_EVAL_FP8) mo.kv = -1; /* bf16 and fp32 keep their own caches */
    /* an FP8 head where cuBLASLt's FP8 alignment allows it; the row says which */
    mo.fp8_head = io->fp8_head && w->model.vocab_size % 16 == 0;
    fp8t_infer *m = fp8t_infer_create_opts(be, w, &mo, B, plen + gen, e, sizeof(e));
    int *tok = malloc((size_t)B * plen * sizeof(int)), *lens = malloc((size_t)B * sizeof(int));
    int *next = malloc((size_t)B * sizeof(int)), *pos = malloc((size_t)B * sizeof(int));
    int *ctok = NULL;
    int rc = -1;
    if (!m) {
        fp8t_errorf(err, errlen, "%s batch %d: %s", fp8t_eval_precision_name(r->prec), B, e);
        goto done;
    }
    if (!tok || !lens || !next || !pos) {
        fp8t_errorf(err, errlen, "out of host memory");
        goto done;
    }
    uint64_t s = seed;
    for (size_t i = 0; i < (size_t)B * plen; i++) tok[i] = (int)(mix(&s) % (uint64_t)V);
    for (int b = 0; b < B; b++) lens[b] = plen, next[b] = (int)(mix(&s) % (uint64_t)V);
    if (fp8t_infer_needs_calibration(m)) {
        /* the prompts' shape; --calib-data's training split, else random tokens of their
         * own (never the timed prompts) */
        if (io->calib_data) {
            if (cli_infer_calibrate(m, io->calib_data, "", NULL, seed, io->calib_batches, B, plen,
                                    e, sizeof(e)) != 0)
                goto fail;
        } else {
            const size_t n = (size_t)io->calib_batches * B * plen;
            if (!(ctok = malloc(n * sizeof(int)))) {
                fp8t_errorf(err, errlen, "out of host memory");
                goto done;
            }
            uint64_t cs = seed ^ 0xC0FFEEull;
            for (size_t i = 0; i < n; i++) ctok[i] = (int)(mix(&cs) % (uint64_t)V);
            if (fp8t_infer_calibrate(m, ctok, io->calib_batches, B, plen, e, sizeof(e)) != 0)
                goto fail;
        }
    }
    snprintf(r->act, sizeof(r->act), "%s", fp8t_infer_act_desc(m));
    r->kv = fp8t_infer_kv(m);
    r->graphs = fp8t_infer_graphs(m);
    r->fp8_head = fp8t_infer_fp8_head(m);
    r->prefetch_mb = (int)(fp8t_infer_prefetch_bytes(m) >> 20);
    r->prefill_s = r->decode_s = INFINITY;
    /* a warm-up round (first-call setup: GEMM algorithm choice, RoPE tables, scratch growth),
     * then `repeat` timed rounds of prefill + gen decode steps; the fastest of each kept. Each
     * call waits for the device; the logits stay there (a server samples on the device: the
     * copy of [B, V] floats to the host per step is not part of the model's time). */
    for (int it = 0; it <= repeat; it++) {
        double t0 = now_s();
        if (fp8t_infer_prefill(m, tok, B, plen, lens, NULL, e, sizeof(e))) goto fail;
        double t1 = now_s();
        const int steps = it == 0 ? (gen < 2 ? gen : 2) : gen;
        for (int j = 0; j < steps; j++) {
            for (int b = 0; b < B; b++) pos[b] = plen + j;
            if (fp8t_infer_decode(m, next, pos, B, NULL, e, sizeof(e))) goto fail;
        }
        double t2 = now_s();
        if (it == 0) continue;
        r->prefill_s = t1 - t0 < r->prefill_s ? t1 - t0 : r->prefill_s;
        r->decode_s = t2 - t1 < r->decode_s ? t2 - t1 : r->decode_s;
    }
    if (profile) {
        /* one more prefill and its decode steps, each op timed on its own */
        fp8t_profile_reset(be);
        if (fp8t_infer_prefill(m, tok, B, plen, lens, NULL, e, sizeof(e))) goto fail;
        printf("-- profile: %s batch %d, prefill of %d tokens per sequence (ms per prefill)\n",
               fp8t_eval_precision_name(r->prec), B, plen);
        fp8t_profile_report(be, stdout, 1);
        fp8t_profile_reset(be);
        for (int j = 0; j < gen; j++) {
            for (int b = 0; b < B; b++) pos[b] = plen + j;
            if (fp8t_infer_decode(m, next, pos, B, NULL, e, sizeof(e))) goto fail;
        }
        printf("-- profile: %s batch %d, decode (ms per decode step, %d steps)\n",
               fp8t_eval_precision_name(r->prec), B, gen);
        fp8t_profile_report(be, stdout, gen > 0 ? gen : 1);
    }
    r->prefill_tps = (double)B * plen / r->prefill_s;
    r->decode_tps = gen > 0 ? (double)B * gen / r->decode_s : 0.0;
    fp8t_infer_memory_get(m, &r->mem);
    r->peak_mb = -1.0;
    size_t peak = 0;
    if (fp8t_cuda_memory_info && fp8t_cuda_memory_info(inner, NULL, &peak, NULL, NULL) == 0)
        r->peak_mb = (double)peak / 1e6;
    r->ok = 1;
    rc = 0;
    goto done;
fail:
    fp8t_errorf(err, errlen, "%s batch %d: %s", fp8t_eval_precision_name(r->prec), B, e);
done:
    free(tok), free(lens), free(next), free(pos), free(ctok);
    fp8t_infer_destroy(m);
    fp8t_backend_destroy(be);
    return rc;
}

static double mb(size_t b) { return (double)b / 1e6; }

/* ---------------------------------------------------------------- the command's steps */

/* WEIGHTS loaded, or --preset's shape (tiny by default) with random weights. 0 ok, 2 after a
 * message. */
static int bench_weights(const bench_opts *o, const char *weights, fp8t_weights *w) {
    char err[FP8T_ERR_LEN];
    if (weights) {
        if (fp8t_weights_load(weights, w, err, sizeof(err)) != 0) {
            fprintf(stderr, "fp8train bench-infer: %s\n", err);
            return 2;
        }
        return 0;
    }
    fp8t_model_config cfg;
    if (fp8t_model_preset(&cfg, o->preset ? o->preset : "tiny") != 0) {
        fprintf(stderr, "fp8train bench-infer: --preset '%s': expected one of %s\n", o->preset,
                fp8t_model_preset_names());
        return 2;
    }
    if (random_weights(&cfg, o->seed, w) != 0) {
        fprintf(stderr, "fp8train bench-infer: out of host memory for the weights\n");
        return 2;
    }
    return 0;
}

/* Every configuration (batch x precision, res[bi * n_prec + pi]) timed and printed as a row,
 * each batch's rows followed by its fp8 / bf16 ratios. Returns 1 if one failed (its row says
 * why), else 0. */
static int bench_table(const bench_opts *o, const fp8t_weights *w, const char *name, int random,
                       result *res) {
    const cli_infer_opts *io = &o->io;
    char err[FP8T_ERR_LEN];
    printf(
        "bench-infer: %s (%s%s), %s, prompt %d + %d decode steps, fp8 activations %s "
        "scaling%s, fp8 KV cache %s%s, decode %s, best of %d\n",
        name, fp8t_arch_name(w->model.arch), random ? ", random weights" : "", o->device, o->plen,
        o->gen, fp8t_act_scale_name(io->act),
        io->act == FP8T_ACT_SCALE_CALIBRATED ? (io->calib_data ? " (calibrated on --calib-data)"
                                                               : " (calibrated on random tokens)")
                                             : "",
        io->kv < 0 ? "fp8" : cli_kv_name(io->kv), io->fp8_head ? ", fp8 head" : "",
        io->no_graphs ? "op by op" : "recorded once per batch and replayed where the backend can",
        o->repeat);
    printf("%-9s %6s %14s %13s %11s %9s %9s %9s %9s\n", "precision", "batch", "prefill tok/s",
           "decode tok/s", "weights MB", "other MB", "kv MB", "act MB", "peak MB");
    int failed = 0;
    for (int bi = 0; bi < o->n_batch; bi++) {
        for (int pi = 0; pi < o->n_prec; pi++) {
            result *r = &res[bi * o->n_prec + pi];
            r->prec = o->precs[pi];
            r->batch = o->batches[bi];
            if (run_one(o->device, w, io, o->plen, o->gen, o->repeat, o->profile, o->seed, r, err,
                        sizeof(err)) != 0) {
                printf("%-9s %6d  failed: %s\n", fp8t_eval_precision_name(r->prec), r->batch,
                       err);
                failed = 1;
                continue;
            }
            char peak[32] = "-";
            if (r->peak_mb >= 0) snprintf(peak, sizeof(peak), "%.1f", r->peak_mb);
            char pf[32] = "";
            if (r->prefetch_mb) snprintf(pf, sizeof(pf), ", L2 prefetch %d MiB", r->prefetch_mb);
            printf("%-9s %6d %14.1f %13.1f %11.1f %9.1f %9.1f %9.1f %9s  kv %s%s%s%s\n",
                   fp8t_eval_precision_name(r->prec), r->batch, r->prefill_tps, r->decode_tps,
                   mb(r->mem.weights), mb(r->mem.other), mb(r->mem.kv_cache),
                   mb(r->mem.activations), peak, cli_kv_name(r->kv), r->graphs ? ", graph" : "",
                   r->fp8_head ? ", fp8 head" : "", pf);
            fflush(stdout);
        }
        /* fp8 against bf16 at this batch */
        const result *b16 = NULL, *f8 = NULL;
        for (int pi = 0; pi < o->n_prec; pi++) {
            const result *r = &res[bi * o->n_prec + pi];
            if (r->ok && r->prec == FP8T_EVAL_BF16) b16 = r;
            if (r->ok && r->prec == FP8T_EVAL_FP8) f8 = r;
        }
        if (b16 && f8) {
            printf("  fp8/bf16 at batch %d: prefill x%.2f, decode x%.2f, linear weights x%.2f",
                   o->batches[bi], f8->prefill_tps / b16->prefill_tps,
                   b16->decode_tps > 0 ? f8->decode_tps / b16->decode_tps : 0.0,
                   (double)f8->mem.weights / (double)b16->mem.weights);
            if (f8->peak_mb >= 0 && b16->peak_mb > 0)
                printf(", peak memory x%.2f", f8->peak_mb / b16->peak_mb);
            printf("\n");
        }
    }
    return failed;
}

/* --out: the settings and every configuration's result as JSON. 0 ok, -1 after a message. */
static int bench_write_json(const bench_opts *o, const fp8t_weights *w, const char *name,
                            int random, const result *res) {
    const cli_infer_opts *io = &o->io;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", name);
    cJSON_AddStringToObject(root, "arch", fp8t_arch_name(w->model.arch));
    cJSON_AddBoolToObject(root, "random_weights", random);
    cJSON_AddStringToObject(root, "device", o->device);
    cJSON_AddNumberToObject(root, "prompt_len", o->plen);
    cJSON_AddNumberToObject(root, "gen", o->gen);
    cJSON_AddNumberToObject(root, "repeat", o->repeat);
    cJSON_AddStringToObject(root, "act_scale", fp8t_act_scale_name(io->act));
    if (io->act == FP8T_ACT_SCALE_CALIBRATED) {
        cJSON_AddStringToObject(root, "calib_data", io->calib_data ? io->calib_data : "random");
        cJSON_AddNumberToObject(root, "calib_batches", io->calib_batches);
    }
    cJSON_AddBoolToObject(root, "graphs", !io->no_graphs);
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    for (int i = 0; i < o->n_prec * o->n_batch; i++) {
        const result *r = &res[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "precision", fp8t_eval_precision_name(r->prec));
        cJSON_AddNumberToObject(j, "batch", r->batch);
        cJSON_AddBoolToObject(j, "ok", r->ok);
        if (r->ok) {
            cJSON_AddStringToObject(j, "kv_cache", cli_kv_name(r->kv));
            cJSON_AddBoolToObject(j, "decode_graph", r->graphs);
            cJSON_AddBoolToObject(j, "fp8_head", r->fp8_head);
            cJSON_AddNumberToObject(j, "prefetch_mb", r->prefetch_mb);
            if (r->prec == FP8T_EVAL_FP8) cJSON_AddStringToObject(j, "fp8_activations", r->act);
            cJSON_AddNumberToObject(j, "prefill_tokens_per_s", r->prefill_tps);
            cJSON_AddNumberToObject(j, "decode_tokens_per_s", r->decode_tps);
            cJSON_AddNumberToObject(j, "prefill_s", r->prefill_s);
            cJSON_AddNumberToObject(j, "decode_s", r->decode_s);
            cJSON_AddNumberToObject(j, "weight_bytes", (double)r->mem.weights);
            cJSON_AddNumberToObject(j, "other_bytes", (double)r->mem.other);
            cJSON_AddNumberToObject(j, "kv_cache_bytes", (double)r->mem.kv_cache);
            cJSON_AddNumberToObject(j, "activation_bytes", (double)r->mem.activations);
            if (r->peak_mb >= 0)
                cJSON_AddNumberToObject(j, "peak_bytes", r->peak_mb * 1e6);
            else
                cJSON_AddNullToObject(j, "peak_bytes");
        }
        cJSON_AddItemToArray(arr, j);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = text ? fopen(o->out, "wb") : NULL;
    const int ok = f && fputs(text, f) >= 0 && fputc('\n', f) >= 0;
    if (f) fclose(f);
    free(text);
    if (!ok) {
        fprintf(stderr, "fp8train bench-infer: --out %s: cannot write it\n", o->out);
        return -1;
    }
    printf("wrote %s\n", o->out);
    return 0;
}

int fp8t_cmd_bench_infer(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], CMD)) {
        argc--;
        argv++;
    }
    bench_opts o;
    const char *weights = NULL;
    int status = parse_args(&o, &weights, argc, argv);
    if (status >= 0) return status;
    fp8t_weights w;
    if ((status = bench_weights(&o, weights, &w)) != 0) return status;
    status = 2;
    result *res = calloc((size_t)o.n_prec * o.n_batch, sizeof(result));
    if (!res) goto done;
    if (o.plen + o.gen > w.model.seq_len) {
        fprintf(stderr,
                "fp8train bench-infer: --prompt-len %d + --gen %d exceed the model's "
                "seq_len %d\n",
                o.plen, o.gen, w.model.seq_len);
        goto done;
    }
    const char *name = weights ? weights : (o.preset ? o.preset : "tiny");
    const int failed = bench_table(&o, &w, name, !weights, res);
    if (o.out && bench_write_json(&o, &w, name, !weights, res) != 0) goto done;
    status = failed ? 2 : 0;
done:
    free(res);
    fp8t_weights_free(&w);
    return status;
}
