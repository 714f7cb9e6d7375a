/* The operand requests the model makes on a Hopper-shaped backend are ones the CUDA backend
 * has a kernel for. CUDA's make_operand refuses a combination with no one-pass kernel
 * (fp8t_operand_kernel_of's COMPOSE: the CPU composes it, CUDA exits), so a request the CPU
 * suite accepts could still stop a GPU run. Here the CPU backend takes Hopper's two flags
 * (fp8_wants_transpose: every FP8 operand also in transposed codes, some only so;
 * fp8_block_native: block and rowwise on the scaled-operand path) and CUDA's answer to
 * make_operand_fuses, its make_operand is wrapped to record every request's kernel, and training steps of both architectures run in every
 * precision, plainly, under an observer, with the chunked head and with every fusion off:
 * none may ask for COMPOSE, and the operand path must be in use (requests made; but by BF16
 * GEMMs with every fusion off, which round their FP32 operands themselves). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/operand_kind.h"
#include "fp8train/backend.h"
#include "fp8train/model.h"
#include "fp8train/policy.h"
#include "test.h"

static fp8t_backend *cpu;
static fp8t_backend hopper; /* the CPU backend with Hopper's flags and a wrapped make_operand */
static fp8t_backend_ops hopper_ops;
static long n_requests, n_compose;
static char first_compose[256];

static void record_make_operand(fp8t_backend *b, const fp8t_operand_req *r) {
    n_requests++;
    if (fp8t_operand_kernel_of(r) == FP8T_OPK_COMPOSE) {
        if (!n_compose++)
            snprintf(first_compose, sizeof first_compose,
                     "step %d, format %d, scaling %d%s%s%s%s, %dx%d", (int)r->step,
                     (int)r->out.format, (int)r->out.scaling, r->out.data ? ", data" : "",
                     r->out.data_t ? ", data_t" : "", r->out.amax ? ", amax" : "",
                     r->colsum ? ", colsum" : "", r->out.rows, r->out.cols);
    }
    cpu->ops->make_operand(b, r);
}

/* CUDA's answer (cuda_make_operand_fuses): a request with a producer step fuses where a
 * one-pass kernel exists; the model composes the others itself before make_operand */
static int cuda_fuses(fp8t_backend *b, const fp8t_operand_req *r) {
    (void)b;
    return fp8t_operand_kernel_of(r) != FP8T_OPK_COMPOSE;
}

static void observe(void *ctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    (void)ctx, (void)m, (void)s, (void)x;
}

/* Two training steps of preset in precision prec with options opt (observer: a read-only
 * hook on both); returns the requests made, or -1 after a failure. */
static long run_steps(const char *preset, fp8t_precision prec, const fp8t_model_options *opt,
                      int observer) {
    fp8t_model_config c;
    if (fp8t_model_preset(&c, preset) != 0) {
        T_FAIL("preset %s", preset);
        return -1;
    }
    fp8t_policy p;
    fp8t_policy_default(&p);
    p.default_precision = prec;
    char err[256];
    const int B = 2, T = 64;
    fp8t_model *m = fp8t_model_create(&hopper, &c, &p, opt, B, T, err, sizeof err);
    if (!m) {
        T_FAIL("%s: %s", preset, err);
        return -1;
    }
    fp8t_model_init_weights(m, 7);
    if (observer) fp8t_model_set_observer(m, observe, NULL);
    int tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 37 + 11) % c.vocab_size;
    for (int i = 0; i < B * T; i++) tgt[i] = tok[(i + 1) % (B * T)];
    const long before = n_requests;
    for (int s = 1; s <= 2; s++) {
        fp8t_model_zero_grad(m);
        (void)fp8t_model_forward(m, tok, tgt);
        fp8t_model_backward(m, 1.0f);
        const float norm = fp8t_model_grad_norm(m);
        fp8t_model_adamw(m, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, s, 1.0f, norm);
        fp8t_model_end_step(m);
    }
    fp8t_model_destroy(m);
    return n_requests - before;
}

static void no_compose_requests(void) {
    static const char *presets[] = {"tiny", "tiny-llama"};
    static const fp8t_precision precs[] = {FP8T_PREC_BF16, FP8T_PREC_DELAYED, FP8T_PREC_CURRENT,
                                           FP8T_PREC_BLOCK, FP8T_PREC_ROWWISE};
    for (size_t a = 0; a < 2; a++)
        for (size_t k = 0; k < sizeof precs / sizeof precs[0]; k++)
            for (int variant = 0; variant < 4; variant++) {
                fp8t_model_options o;
                memset(&o, 0, sizeof o);
                if (variant == 2) o.head_chunk = 64;
                if (variant == 3) o.disable = FP8T_DISABLE_ALL_FUSION;
                n_compose = 0;
                const long made = run_steps(presets[a], precs[k], &o, variant == 1);
                if (made < 0) return;
                /* with every fusion off a BF16 GEMM rounds its FP32 operands itself
                 * (gemm_bf16): no operand is made */
                const int plain_bf16 = precs[k] == FP8T_PREC_BF16 && variant == 3;
                T_CHECK(made > 0 || plain_bf16, "%s %s variant %d: no make_operand request",
                        presets[a], fp8t_precision_name(precs[k]), variant);
                T_CHECK(n_compose == 0,
                        "%s %s variant %d: %ld requests CUDA has no kernel for, "
                        "the first: %s",
                        presets[a], fp8t_precision_name(precs[k]), variant, n_compose,
                        first_compose);
            }
}

int main(void) {
    t_suite = "operand_requests";
    char err[256];
    cpu = fp8t_backend_create("cpu", NULL, err, sizeof err);
    if (!cpu) {
        printf("FAIL operand_requests: cpu backend: %s\n", err);
        return 1;
    }
    hopper_ops = *cpu->ops;
    hopper_ops.make_operand = record_make_operand;
    hopper_ops.make_operand_fuses = cuda_fuses;
    hopper = *cpu;
    hopper.ops = &hopper_ops;
    hopper.fp8_wants_transpose = 1;
    hopper.fp8_block_native = 1;
    T_RUN(no_compose_requests);
    fp8t_backend_destroy(cpu);
    T_MAIN_END();
}
