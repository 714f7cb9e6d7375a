/* The op profiler (src/backend/profile_backend.c): a profiled backend computes exactly what the
 * backend it wraps computes, and its report names the ops a training step ran. */
#include <stdlib.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/model.h"
#include "fp8train/policy.h"
#include "fp8train/profile.h"
#include "test.h"

/* Two training steps of `tiny` (fp8 delayed) on be; the losses and the final parameters. */
static void train_two_steps(fp8t_backend *be, float losses[2], float **params, size_t *n) {
    fp8t_model_config cfg;
    fp8t_model_preset(&cfg, "tiny");
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    pol.default_precision = FP8T_PREC_FP8;
    char err[256];
    const int B = 2, T = 32, N = B * T;
    fp8t_model *m = fp8t_model_create(be, &cfg, &pol, NULL, B, T, err, sizeof(err));
    if (!m) {
        printf("  model create: %s\n", err);
        *params = NULL;
        return;
    }
    fp8t_model_init_weights(m, 7);
    int tok[N], tgt[N];
    for (int i = 0; i < N; i++) tok[i] = (i * 37 + 11) % cfg.vocab_size;
    for (int i = 0; i < N; i++) tgt[i] = tok[(i + 1) % N];
    for (int s = 0; s < 2; s++) {
        fp8t_model_zero_grad(m);
        losses[s] = fp8t_model_forward(m, tok, tgt);
        fp8t_model_backward(m, 1.0f);
        float norm = fp8t_model_grad_norm(m);
        fp8t_model_adamw(m, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, s + 1, 1.0f, norm);
        fp8t_model_end_step(m);
    }
    *n = fp8t_model_num_params(m);
    *params = malloc(*n * sizeof(float));
    be->ops->to_host(be, *params, fp8t_model_params(m), *n * sizeof(float));
    fp8t_model_destroy(m);
}

static void profiled_run_is_identical_and_reported(void) {
    char err[256];
    fp8t_backend *plain = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    T_ASSERT(plain, "%s", err);
    fp8t_backend *wrapped = fp8t_profile_wrap(fp8t_backend_create("cpu", NULL, err, sizeof(err)));
    T_ASSERT(wrapped, "wrap failed");
    T_CHECK(fp8t_profile_inner(wrapped) != NULL && fp8t_profile_inner(wrapped) != wrapped,
            "inner backend");
    float la[2], lb[2];
    float *pa = NULL, *pb = NULL;
    size_t na = 0, nb = 0;
    train_two_steps(plain, la, &pa, &na);
    train_two_steps(wrapped, lb, &pb, &nb);
    T_ASSERT(pa && pb && na == nb && na > 0, "training failed");
    T_CHECK(memcmp(la, lb, sizeof(la)) == 0, "losses differ: %.9g %.9g vs %.9g %.9g", la[0],
            la[1], lb[0], lb[1]);
    T_CHECK(memcmp(pa, pb, na * sizeof(float)) == 0, "parameters differ after two steps");

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    T_ASSERT(f, "open_memstream");
    fp8t_profile_report(wrapped, f, 2);
    fclose(f);
    static const char *const must[] = {"gemm_fp8",           "attention_forward",
                                       "attention_backward", "layernorm_forward",
                                       "softmax_xent",       "adamw",
                                       "quantize",           "GEMM shapes"};
    for (size_t i = 0; i < sizeof(must) / sizeof(must[0]); i++)
        T_CHECK(strstr(buf, must[i]) != NULL, "report lacks %s:\n%s", must[i], buf);
    /* tiny: 4 layers x 4 linears + head, 3 GEMMs each, 2 steps; the head is BF16 by default */
    T_CHECK(strstr(buf, "gemm_bf16") != NULL, "head GEMMs (bf16) missing:\n%s", buf);
    free(buf);

    fp8t_profile_reset(wrapped);
    f = open_memstream(&buf, &len);
    fp8t_profile_report(wrapped, f, 1);
    fclose(f);
    T_CHECK(strstr(buf, "gemm_fp8") == NULL, "reset kept the old counts:\n%s", buf);
    free(buf);
    free(pa), free(pb);
    fp8t_backend_destroy(plain);
    fp8t_backend_destroy(wrapped); /* destroys the inner CPU backend too (ASan checks) */
}

int main(void) {
    t_suite = "profile";
    T_RUN(profiled_run_is_identical_and_reported);
    T_MAIN_END();
}
