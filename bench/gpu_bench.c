/* gpu_bench — training-step throughput of the CUDA backend through the public model API:
 * tokens/s, step time, device memory and MFU for each precision, on one model shape.
 *
 *   gpu_bench [--model gpt2-124m] [--batch 32] [--seq 1024] [--warmup 3] [--steps 10]
 *             [--prec bf16,fp8-delayed,fp8-current] [--profile]
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
#include "fp8train/model.h"
#include "fp8train/policy.h"
#include "fp8train/profile.h"

/* from src/backend/cuda (weak: absent in CPU-only builds) */
extern int fp8t_cuda_memory_info(fp8t_backend *b, size_t *in_use, size_t *peak,
                                 size_t *dev_free, size_t *dev_total) __attribute__((weak));
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
    } else if (!strcmp(name, "fp32")) {
        p->default_precision = FP8T_PREC_FP32;
        p->head_precision = FP8T_PREC_FP32;
    } else {
        return -1;
    }
    return 0;
}

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--model NAME] [--batch B] [--seq T] [--warmup N] [--steps N] "
            "[--prec LIST] [--profile]\n"
            "  --model  a preset: %s (default gpt2-124m)\n"
            "  --prec   comma-separated: bf16, fp8-delayed, fp8-current, fp32\n"
            "           (default bf16,fp8-delayed,fp8-current)\n"
            "  --profile  per-op time table of the timed steps (synchronizes around each op)\n",
            argv0, fp8t_model_preset_names());
}

int main(int argc, char **argv) {
    const char *model = "gpt2-124m", *precs = "bf16,fp8-delayed,fp8-current";
    int B = 32, T = 1024, warmup = 3, steps = 10, profile = 0;
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
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--batch")) B = atoi(v);
        else if (!strcmp(a, "--seq")) T = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--prec")) precs = v;
        else {
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
    fp8t_backend *be = fp8t_backend_create("cuda", err, sizeof(err));
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
    printf("%-12s %10s %12s %8s %10s %10s %8s  %s\n", "precision", "step ms", "tokens/s", "MFU",
           "held GiB", "device GiB", "loss", "fp8 GEMMs cuBLASLt/fallback");
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
        fp8t_model *m = fp8t_model_create(be, &cfg, &pol, B, T, err, sizeof(err));
        if (!m) {
            printf("%-12s model create failed: %s\n", name, err);
            status = 1;
            continue;
        }
        fp8t_model_init_weights(m, 42);
        long lt0 = 0, fb0 = 0, lt1 = 0, fb1 = 0;
        if (fp8t_cuda_gemm_counts) fp8t_cuda_gemm_counts(cuda, &lt0, &fb0);
        float loss = 0;
        double t0 = 0;
        for (int s = 1; s <= warmup + steps; s++) {
            if (s == warmup + 1) {
                be->ops->synchronize(be);
                if (profile) fp8t_profile_reset(be);
                t0 = now_s();
            }
            fp8t_model_zero_grad(m);
            loss = fp8t_model_forward(m, tok, tgt);
            fp8t_model_backward(m, 1.0f);
            float norm = fp8t_model_grad_norm(m);
            fp8t_model_adamw(m, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, s, 1.0f, norm);
            fp8t_model_end_step(m);
        }
        be->ops->synchronize(be);
        double dt = (now_s() - t0) / steps;
        double tps = (double)N / dt;
        double mfu = 6.0 * (double)nparams * tps / PEAK_BF16_FLOPS;
        size_t in_use = 0, peak = 0, dfree = 0, dtotal = 0;
        if (fp8t_cuda_memory_info)
            fp8t_cuda_memory_info(cuda, &in_use, &peak, &dfree, &dtotal);
        if (fp8t_cuda_gemm_counts) fp8t_cuda_gemm_counts(cuda, &lt1, &fb1);
        (void)peak;
        printf("%-12s %10.1f %12.0f %7.1f%% %10.2f %10.2f %8.4f  %ld/%ld\n", name, dt * 1e3, tps,
               100.0 * mfu, (double)in_use / (1 << 30), (double)(dtotal - dfree) / (1 << 30),
               (double)loss, lt1 - lt0, fb1 - fb0);
        if (profile) fp8t_profile_report(be, stdout, steps);
        fflush(stdout);
        fp8t_model_destroy(m);
    }
    free(tok), free(tgt);
    fp8t_backend_destroy(be);
    return status;
}
