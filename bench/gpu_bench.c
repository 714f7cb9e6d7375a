/* gpu_bench — training-step throughput of the CUDA backend through the public model API:
 * tokens/s, step time, device memory and MFU for each precision, on one model shape.
 *
 *   gpu_bench [--model gpt2-124m] [--batch 32] [--seq 1024] [--warmup 3] [--steps 10]
 *             [--prec bf16,fp8-delayed,fp8-current,fp8-block,fp8-rowwise] [--profile]
 *             [--inspect SPEC]... [--shadow-every K]... [--inspect-out DIR]
 *             [--head-chunk auto|0|N]
 *
 * The cost of the debugging instruments: each --inspect SPEC (the trainer's --inspect syntax)
 * and each --shadow-every K adds a variant, run after the plain step of each precision on a
 * fresh model, and printed with its throughput as a ratio to the plain step's, so one call
 * measures e.g. plain vs every=100 / every=10 / every=1 / shadow-every 100. Timed steps are
 * numbered 0, 1, ...; a variant runs max(--steps, K) timed steps rounded up to a multiple of
 * K (K = its every= or shadow period), so every=100 covers one inspected step per 100. As in
 * the trainer, the model hook is installed on inspected steps only, the scale-update note
 * (fp8t_inspector_before_scale_update) is taken before each inspected step, and the shadow is
 * a frozen all-BF16 forward of the step's batch. stats.jsonl goes to --inspect-out
 * (default /tmp/gpu_bench_inspect)/PRECISION_vN/.
 *
 * --head-chunk: the model option head_chunk (train's --head-chunk): auto (the default), 0 (the
 * unchunked head, which holds the [B*T, V] logits) or N rows per chunk; the header line says
 * what the model chose, the "act GiB" column is fp8t_model_activation_bytes.
 *
 * --profile times every op of the timed steps (the device is synchronized around each op, so
 * the step time it prints is longer than an unprofiled run's) and prints where the time goes.
 *
 * A step is what the trainer does per optimizer step without data loading: zero_grad,
 * forward with targets (waits for the loss), backward, grad norm (waits), AdamW, end_step.
 * MFU = 6 * N_params * tokens/s / 989e12 (H100/H200 dense BF16 peak; the same denominator for
 * the FP8 runs, so the column compares against BF16's ceiling). Attention FLOPs are not
 * counted, as in the usual 6N estimate.
 *
 * Built without the CUDA backend (the CPU `make bench`), it says so and exits 0; bench/gpu.sh
 * builds it against the CUDA objects. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fp8train/backend.h"
#include "fp8train/debug.h"
#include "fp8train/model.h"
#include "fp8train/policy.h"
#include "fp8train/profile.h"
#include "fp8train/train_options.h" /* fp8t_options_debug_env */

/* from src/backend/cuda (weak: absent in CPU-only builds) */
extern int fp8t_cuda_memory_info(fp8t_backend *b, size_t *in_use, size_t *peak, size_t *dev_free,
                                 size_t *dev_total) __attribute__((weak));
extern int fp8t_cuda_gemm_counts(fp8t_backend *b, long *fp8_lt, long *fp8_fallback)
    __attribute__((weak));

#define PEAK_BF16_FLOPS 989e12

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_prec(const char *name, fp8t_policy *p) {
    fp8t_policy_default(p);
    if (!strcmp(name, "bf16")) {
        p->default_precision = FP8T_PREC_BF16;
    } else if (!strcmp(name, "fp8-delayed")) {
        p->default_precision = FP8T_PREC_FP8;
        p->recipe = FP8T_PREC_DELAYED;
    } else if (!strcmp(name, "fp8-current")) {
        p->default_precision = FP8T_PREC_FP8;
        p->recipe = FP8T_PREC_CURRENT;
    } else if (!strcmp(name, "fp8-block")) {
        /* DeepSeek-V3 block scaling: Hopper's block-scaled cuBLASLt GEMMs (E4M3 everywhere) */
        p->default_precision = FP8T_PREC_BLOCK;
    } else if (!strcmp(name, "fp8-rowwise")) {
        /* torchao's rowwise: per-row / per-column scales, cuBLASLt's OUTER_VEC GEMMs */
        p->default_precision = FP8T_PREC_ROWWISE;
    } else if (!strcmp(name, "fp32")) {
        p->default_precision = FP8T_PREC_FP32;
        p->head_precision = FP8T_PREC_FP32;
    } else {
        return -1;
    }
    return 0;
}

#define MAX_VARIANTS 16
typedef struct {
    const char *inspect; /* NULL: none */
    int shadow_every;    /* 0: none */
} variant;

static void inspect_hook(void *ctx, fp8t_model *m, const fp8t_tensor_site *site, float *x) {
    fp8t_inspector_observe((fp8t_inspector *)ctx, m, site, x);
}

/* The period a variant's cost repeats with: its every= (1 if absent) or shadow period. */
static int variant_period(const variant *v) {
    if (v->shadow_every > 0) return v->shadow_every;
    const char *e = v->inspect ? strstr(v->inspect, "every=") : NULL;
    int k = e ? atoi(e + 6) : 1;
    return k > 0 ? k : 1;
}

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--model NAME] [--batch B] [--seq T] [--warmup N] [--steps N] "
            "[--prec LIST] [--profile] [--inspect SPEC]... [--shadow-every K]... "
            "[--inspect-out DIR] [--head-chunk auto|0|N]\n"
            "  --inspect SPEC   a variant with the tensor inspector (train's --inspect syntax)\n"
            "  --shadow-every K a variant with a shadow BF16 forward every K steps\n"
            "                   (variants print tokens/s as a ratio to the plain step)\n"
            "  --model  a preset: %s (default gpt2-124m)\n"
            "  --prec   comma-separated: bf16, fp8-delayed, fp8-current, fp8-block, fp8-rowwise, "
            "fp32\n"
            "           (default bf16,fp8-delayed,fp8-current)\n"
            "  --profile  per-op time table of the timed steps (synchronizes around each op)\n"
            "  --head-chunk  the LM head in chunks of N rows (a multiple of 8), auto (default)\n"
            "                or 0 (off: the [B*T, V] logits are held)\n",
            argv0, fp8t_model_preset_names());
}

int main(int argc, char **argv) {
    const char *model = "gpt2-124m", *precs = "bf16,fp8-delayed,fp8-current";
    int B = 32, T = 1024, warmup = 3, steps = 10, profile = 0;
    variant vars[MAX_VARIANTS];
    int n_vars = 1; /* vars[0]: the plain step */
    memset(vars, 0, sizeof vars);
    const char *inspect_out = "/tmp/gpu_bench_inspect";
    int head_chunk = FP8T_HEAD_CHUNK_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(argv[0]);
            return 0;
        }
        if (!strcmp(a, "--profile")) {
            profile = 1;
            continue;
        }
        if (!v) {
            usage(argv[0]);
            return 2;
        }
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--batch"))
            B = atoi(v);
        else if (!strcmp(a, "--seq"))
            T = atoi(v);
        else if (!strcmp(a, "--warmup"))
            warmup = atoi(v);
        else if (!strcmp(a, "--steps"))
            steps = atoi(v);
        else if (!strcmp(a, "--prec"))
            precs = v;
        else if (!strcmp(a, "--inspect-out"))
            inspect_out = v;
        else if (!strcmp(a, "--head-chunk")) {
            char *end;
            long x = strtol(v, &end, 10);
            if (!strcmp(v, "auto"))
                head_chunk = FP8T_HEAD_CHUNK_AUTO;
            else if (end != v && !*end && x == 0)
                head_chunk = FP8T_HEAD_CHUNK_OFF;
            else if (end != v && !*end && x > 0 && x % 8 == 0 && x <= (1L << 24))
                head_chunk = (int)x;
            else {
                fprintf(stderr,
                        "gpu_bench: --head-chunk %s: expected auto, 0 or a positive "
                        "multiple of 8\n",
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--inspect") || !strcmp(a, "--shadow-every")) {
            if (n_vars == MAX_VARIANTS) {
                fprintf(stderr, "gpu_bench: at most %d variants\n", MAX_VARIANTS - 1);
                return 2;
            }
            if (a[2] == 'i') {
                char e[512];
                if (fp8t_inspector_spec_check(v, e, sizeof(e)) != 0) {
                    fprintf(stderr, "gpu_bench: --inspect: %s\n", e);
                    return 2;
                }
                vars[n_vars++].inspect = v;
            } else {
                vars[n_vars].shadow_every = atoi(v);
                if (vars[n_vars++].shadow_every <= 0) {
                    fprintf(stderr, "gpu_bench: --shadow-every %s: expected a positive integer\n",
                            v);
                    return 2;
                }
            }
        } else {
            usage(argv[0]);
            return 2;
        }
        i++;
    }
    if (B <= 0 || T <= 0 || steps <= 0 || warmup < 0) {
        fprintf(stderr, "gpu_bench: --batch, --seq and --steps must be positive\n");
        return 2;
    }
    fp8t_model_config cfg;
    if (fp8t_model_preset(&cfg, model) != 0) {
        fprintf(stderr, "gpu_bench: unknown --model %s (presets: %s)\n", model,
                fp8t_model_preset_names());
        return 2;
    }
    if (T > cfg.seq_len) {
        fprintf(stderr, "gpu_bench: --seq %d exceeds the model's seq_len %d\n", T, cfg.seq_len);
        return 2;
    }
    char err[512];
    /* the debugging switches as the environment spells them (FP8TRAIN_CUDA_PLAIN=1 ...; read by
     * the option layer, as for fp8train's commands) */
    fp8t_model_options mopt = {0};
    fp8t_backend_options bopt = {0};
    if (fp8t_options_debug_env(&mopt, &bopt, err, sizeof(err)) != 0) {
        fprintf(stderr, "gpu_bench: environment: %s\n", err);
        return 2;
    }
    mopt.head_chunk = head_chunk;
    fp8t_backend *be = fp8t_backend_create("cuda", &bopt, err, sizeof(err));
    if (!be) {
        printf("gpu_bench: skipped: %s\n", err);
        return 0;
    }
    fp8t_backend *cuda = be; /* the unwrapped backend, for the memory and GEMM-path queries */
    if (profile) {
        be = fp8t_profile_wrap(cuda);
        if (!be) {
            fprintf(stderr, "gpu_bench: out of memory\n");
            return 1;
        }
    }
    size_t nparams = 0;
    fp8t_model_param_table(&cfg, NULL, &nparams);
    printf("gpu_bench: %s (%.1fM params), B=%d T=%d, %d warmup + %d timed steps\n", model,
           (double)nparams / 1e6, B, T, warmup, steps);
    /* held: what fp8train holds on the device at the end of the timed steps (model, activations,
     * scratch, workspace; nothing is freed during a step, so this is the step's peak); device:
     * total - free as cudaMemGetInfo reports (adds the CUDA context and library memory) */
    printf("%-12s %10s %12s %8s %10s %10s %8s  %-27s %8s\n", "precision", "step ms", "tokens/s",
           "MFU", "held GiB", "device GiB", "loss", "fp8 GEMMs cuBLASLt/fallback", "act GiB");
    int N = B * T;
    int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
    uint64_t st = 88172645463325252ull;
    for (int i = 0; i < N; i++) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        tok[i] = (int)(st % (uint64_t)cfg.vocab_size);
    }
    for (int i = 0; i < N; i++) tgt[i] = tok[(i + 1) % N];
    char list[256];
    snprintf(list, sizeof(list), "%s", precs);
    int status = 0;
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
        fp8t_policy pol;
        if (parse_prec(name, &pol) != 0) {
            fprintf(stderr, "gpu_bench: unknown precision '%s'\n", name);
            status = 2;
            continue;
        }
        fp8t_policy bf16;
        parse_prec("bf16", &bf16);
        double plain_tps = 0;
        for (int vi = 0; vi < n_vars; vi++) {
            const variant *var = &vars[vi];
            fp8t_model *m = fp8t_model_create(be, &cfg, &pol, &mopt, B, T, err, sizeof(err));
            if (!m) {
                printf("%-12s model create failed: %s\n", name, err);
                status = 1;
                continue;
            }
            fp8t_model_init_weights(m, 42);
            if (vi == 0) {
                const int rows = fp8t_model_head_chunk_rows(m);
                if (rows)
                    printf("  %s: LM head in chunks of %d rows\n", name, rows);
                else
                    printf("  %s: LM head unchunked ([%d, %d] logits held)\n", name, N,
                           cfg.vocab_size);
            }
            fp8t_inspector *in = NULL;
            if (var->inspect) {
                char dir[600];
                snprintf(dir, sizeof(dir), "%s/%s_v%d", inspect_out, name, vi);
                in = fp8t_inspector_create(var->inspect, dir, err, sizeof(err));
                if (!in) {
                    printf("%-12s --inspect %s: %s\n", name, var->inspect, err);
                    status = 1;
                    fp8t_model_destroy(m);
                    continue;
                }
            }
            int period = variant_period(var);
            int nsteps = vi == 0 ? steps : (steps + period - 1) / period * period;
            int n_inspected = 0, n_shadow = 0;
            long lt0 = 0, fb0 = 0, lt1 = 0, fb1 = 0;
            if (fp8t_cuda_gemm_counts) fp8t_cuda_gemm_counts(cuda, &lt0, &fb0);
            float loss = 0;
            double t0 = 0;
            for (int s = 1; s <= warmup + nsteps; s++) {
                int k = s - warmup - 1; /* timed step index; < 0 during warmup */
                if (s == warmup + 1) {
                    be->ops->synchronize(be);
                    if (profile) fp8t_profile_reset(be);
                    t0 = now_s();
                }
                if (in) {
                    fp8t_inspector_begin_step(in, k);
                    n_inspected += fp8t_inspector_active(in);
                    /* as the trainer: a read-only hook unless dumps need every tensor */
                    if (fp8t_inspector_active(in) && fp8t_inspector_reads_only(in))
                        fp8t_model_set_observer(m, inspect_hook, in);
                    else
                        fp8t_model_set_hook(m, fp8t_inspector_active(in) ? inspect_hook : NULL,
                                            in);
                }
                fp8t_model_zero_grad(m);
                if (var->shadow_every > 0 && k >= 0 && k % var->shadow_every == 0) {
                    /* the trainer's shadow: a frozen all-BF16 forward of the same batch */
                    fp8t_model_set_frozen(m, 1);
                    fp8t_model_set_policy(m, &bf16);
                    (void)fp8t_model_forward(m, tok, tgt);
                    fp8t_model_set_policy(m, &pol);
                    fp8t_model_set_frozen(m, 0);
                    n_shadow++;
                }
                loss = fp8t_model_forward(m, tok, tgt);
                fp8t_model_backward(m, 1.0f);
                float norm = fp8t_model_grad_norm(m);
                fp8t_model_adamw(m, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, s, 1.0f, norm);
                if (in) fp8t_inspector_before_scale_update(in, m, k);
                fp8t_model_end_step(m);
                if (in) fp8t_inspector_end_step(in, k);
            }
            /* the lines end_step left to a next step: one step's worth, as in steady state */
            if (in) fp8t_inspector_flush(in);
            be->ops->synchronize(be);
            double dt = (now_s() - t0) / nsteps;
            double tps = (double)N / dt;
            double mfu = 6.0 * (double)nparams * tps / PEAK_BF16_FLOPS;
            size_t in_use = 0, peak = 0, dfree = 0, dtotal = 0;
            if (fp8t_cuda_memory_info)
                fp8t_cuda_memory_info(cuda, &in_use, &peak, &dfree, &dtotal);
            if (fp8t_cuda_gemm_counts) fp8t_cuda_gemm_counts(cuda, &lt1, &fb1);
            (void)peak;
            char gemms[64];
            snprintf(gemms, sizeof(gemms), "%ld/%ld", lt1 - lt0, fb1 - fb0);
            printf("%-12s %10.1f %12.0f %7.1f%% %10.2f %10.2f %8.4f  %-27s %8.2f\n", name,
                   dt * 1e3, tps, 100.0 * mfu, (double)in_use / (1 << 30),
                   (double)(dtotal - dfree) / (1 << 30), (double)loss, gemms,
                   (double)fp8t_model_activation_bytes(m) / (1 << 30));
            if (vi == 0) {
                plain_tps = tps;
            } else {
                char what[200];
                if (var->inspect)
                    snprintf(what, sizeof(what), "--inspect %s", var->inspect);
                else
                    snprintf(what, sizeof(what), "--shadow-every %d", var->shadow_every);
                /* ratio: tokens/s against the plain step; cost: extra time per step */
                printf("  %-40s %d timed steps, %d inspected, %d shadow: %.4fx plain tokens/s, "
                       "cost %+.2f%% step time\n",
                       what, nsteps, n_inspected, n_shadow, tps / plain_tps,
                       100.0 * (plain_tps / tps - 1.0));
            }
            if (profile) fp8t_profile_report(be, stdout, nsteps);
            fflush(stdout);
            fp8t_inspector_destroy(in);
            fp8t_model_destroy(m);
        }
    }
    free(tok), free(tgt);
    fp8t_backend_destroy(be);
    return status;
}
