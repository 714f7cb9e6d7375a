/* The block and rowwise precisions' scaled-operand path (linear.c: make_operand's scaled
 * kernel, "quantize_scaled" below, + a scaled gemm_fp8) against its switches back to the
 * plain paths, on a CPU backend that announces block-scaled GEMMs (fp8_block_native, as
 * Hopper's cuBLASLt) and counts its ops:
 *  - every fusion on (X's codes of both orientations from the Fprop's pass, kept for the
 *    Wgrad instead of FP32 X; dY's from the Dgrad's pass for the Wgrad; the bias gradient and
 *    GELU's forward and backward folded into those passes; W's two orientations in one pass
 *    per step) gives the bits of FP8T_DISABLE_ALL_FUSION (each operand quantized on its own,
 *    X kept in FP32): losses, gradients, parameters and recipe state, GPT-2 and Llama, two
 *    micro-batches per step, block and rowwise, default (E4M3) and hybrid formats;
 *  - quantize_scaled runs twice per linear per micro-batch (plain: four) plus once per weight
 *    per step, but once less per Llama layer (up takes gate's X operand, and the amax of its X
 *    from gate's: one single-value amax per layer), the amax op over a tensor, gelu_forward,
 *    gelu_backward and bias_backward not at all, and fc1's bias goes to fc2's GELU pass
 *    (GPT-2);
 *  - a block model holds fewer activation bytes than the same model in BF16 and than itself
 *    with FP8T_DISABLE_FP8_SAVE (FP32 copies of X). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/operand_kind.h"
#include "fp8train/backend.h"
#include "fp8train/model.h"
#include "model_state_util.h"
#include "test.h"

static fp8t_backend *cpu;   /* the real backend */
static fp8t_backend native; /* a copy announcing fp8_block_native, with counting ops */
static fp8t_backend_ops counted_ops;
static long n_qs, n_qs_both, n_amax, n_amax1, n_gelu_fwd, n_gelu_bwd, n_bias_bwd, n_scaled_gemm,
    n_gemm, n_gemm_bias;

/* make_operand's scaled kernel (the one pass that makes a scaled operand) */
static void count_qs(fp8t_backend *b, const fp8t_operand_req *r) {
    if (fp8t_operand_kernel_of(r) == FP8T_OPK_SCALED) {
        n_qs++;
        n_qs_both += r->out.data && r->out.data_t;
    }
    cpu->ops->make_operand(b, r);
}
/* n_amax: amax passes over a tensor; n_amax1: merges of a single value (one amax into
 * another) */
static void count_amax(fp8t_backend *b, float *out, const float *x, size_t n) {
    if (n > 1)
        n_amax++;
    else
        n_amax1++;
    cpu->ops->amax(b, out, x, n);
}
static void count_gelu_fwd(fp8t_backend *b, float *out, const float *x, size_t n) {
    n_gelu_fwd++;
    cpu->ops->gelu_forward(b, out, x, n);
}
static void count_gelu_bwd(fp8t_backend *b, float *dx, const float *x, const float *dout,
                           size_t n) {
    n_gelu_bwd++;
    cpu->ops->gelu_backward(b, dx, x, dout, n);
}
static void count_bias_bwd(fp8t_backend *b, float *dbias, const float *dout, int N, int OC) {
    n_bias_bwd++;
    cpu->ops->bias_backward(b, dbias, dout, N, OC);
}
static void count_gemm_fp8(fp8t_backend *b, float *C, const fp8t_fp8_operand *A,
                           const fp8t_fp8_operand *B, int M, int N, int K, int transA, int transB,
                           int acc, int fast_accum, float *amax_out, const float *bias) {
    n_gemm++;
    n_gemm_bias += bias != NULL;
    n_scaled_gemm += A->scaling != FP8T_SCALING_TENSOR && B->scaling != FP8T_SCALING_TENSOR;
    cpu->ops->gemm_fp8(b, C, A, B, M, N, K, transA, transB, acc, fast_accum, amax_out, bias);
}

static fp8t_model *make(const char *preset, const fp8t_policy *pol, int B, int T,
                        unsigned disable) {
    fp8t_model_config c;
    fp8t_model_preset(&c, preset);
    const fp8t_model_options opt = {.disable = disable};
    char err[256];
    fp8t_model *m = fp8t_model_create(&native, &c, pol, &opt, B, T, err, sizeof(err));
    if (!m)
        printf("  create %s: %s\n", preset, err);
    else
        fp8t_model_init_weights(m, 2468);
    return m;
}

static fp8t_policy policy(fp8t_precision prec, int block_hybrid) {
    fp8t_policy p;
    fp8t_policy_default(&p);
    p.default_precision = prec;
    p.head_precision = prec;
    p.block_hybrid = block_hybrid;
    p.history_len = 4;
    return p;
}

static void batch(int *tok, int *tgt, int N, int V, int k) {
    for (int i = 0; i < N; i++) {
        tok[i] = (k * 11 + i * 5) % V;
        tgt[i] = i % 9 == 2 ? -1 : (k * 11 + (i + 1) * 5 + (i % 3)) % V;
    }
}

typedef struct {
    long qs, qs_both, amax, amax1, gelu_fwd, gelu_bwd, bias_bwd, scaled_gemm, gemm, gemm_bias;
} counts;

static void snap(counts *c) {
    *c = (counts){n_qs,       n_qs_both,  n_amax,        n_amax1, n_gelu_fwd,
                  n_gelu_bwd, n_bias_bwd, n_scaled_gemm, n_gemm,  n_gemm_bias};
}
static void add_since(counts *acc, const counts *t0) {
    acc->qs += n_qs - t0->qs, acc->qs_both += n_qs_both - t0->qs_both;
    acc->amax += n_amax - t0->amax, acc->amax1 += n_amax1 - t0->amax1;
    acc->gelu_fwd += n_gelu_fwd - t0->gelu_fwd;
    acc->gelu_bwd += n_gelu_bwd - t0->gelu_bwd, acc->bias_bwd += n_bias_bwd - t0->bias_bwd;
    acc->scaled_gemm += n_scaled_gemm - t0->scaled_gemm, acc->gemm += n_gemm - t0->gemm;
    acc->gemm_bias += n_gemm_bias - t0->gemm_bias;
}

/* a (every path on) and b (FP8T_DISABLE_ALL_FUSION) side by side, `steps` steps of two
 * micro-batches: every loss, gradient, parameter and state entry bit for bit */
static void lockstep(const char *what, fp8t_model *a, fp8t_model *b, int B, int T, int steps,
                     counts out[2]) {
    const int N = B * T, V = fp8t_model_get_config(a)->vocab_size;
    int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
    fp8t_model *m[2] = {a, b};
    memset(out, 0, 2 * sizeof(counts));
    int bad_loss = 0, bad_state = 0, bad_pos = 0;
    char when[160];
    for (int s = 1; s <= steps; s++) {
        for (int k = 0; k < 2; k++) fp8t_model_zero_grad(m[k]);
        for (int j = 0; j < 2; j++) {
            batch(tok, tgt, N, V, s * 2 + j);
            float loss[2];
            for (int k = 0; k < 2; k++) {
                counts t0;
                snap(&t0);
                loss[k] = fp8t_model_forward(m[k], tok, tgt);
                fp8t_model_backward(m[k], 0.5f);
                add_since(&out[k], &t0);
            }
            if (memcmp(&loss[0], &loss[1], sizeof(float)) && !bad_loss++)
                printf("  %s step %d micro %d: loss %.9g vs %.9g\n", what, s, j, loss[0],
                       loss[1]);
            if (!same_model_losses(cpu, a, b, N)) bad_pos++;
            snprintf(when, sizeof(when), "%s step %d micro %d", what, s, j);
            if (diff_model_state(cpu, a, b, when)) bad_state++;
        }
        for (int k = 0; k < 2; k++) {
            counts t0;
            snap(&t0);
            float norm = fp8t_model_grad_norm(m[k]);
            fp8t_model_adamw(m[k], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, s, 1.0f, norm);
            fp8t_model_end_step(m[k]);
            add_since(&out[k], &t0);
        }
    }
    T_CHECK(!bad_loss, "%s: %d micro-batches with different losses", what, bad_loss);
    T_CHECK(!bad_pos, "%s: %d micro-batches with different per-position losses", what, bad_pos);
    T_CHECK(!bad_state, "%s: %d micro-batches with different gradients/state", what, bad_state);
    snprintf(when, sizeof(when), "%s after the last step", what);
    T_CHECK(diff_model_state(cpu, a, b, when) == 0, "%s: params or FP8 state differ", what);
    free(tok);
    free(tgt);
}

static void fast_case(const char *preset, fp8t_precision prec, int block_hybrid) {
    const int B = 2, T = 16, steps = 3, micro = steps * 2;
    fp8t_policy p = policy(prec, block_hybrid);
    /* both with FP32 layer saves: the plain paths read those tensors again */
    fp8t_model *a = make(preset, &p, B, T, FP8T_DISABLE_BF16_SAVES);
    fp8t_model *b = make(preset, &p, B, T, FP8T_DISABLE_ALL_FUSION | FP8T_DISABLE_BF16_SAVES);
    if (!a || !b) {
        T_FAIL("create %s", preset);
        fp8t_model_destroy(a);
        fp8t_model_destroy(b);
        return;
    }
    char what[96];
    snprintf(what, sizeof(what), "%s %s%s", preset, fp8t_precision_name(prec),
             block_hybrid ? " hybrid" : "");
    counts c[2];
    lockstep(what, a, b, B, T, steps, c);
    const fp8t_model_config *cfg = fp8t_model_get_config(a);
    const long lins = fp8t_model_num_linears(cfg);
    const int gpt2 = cfg->arch == FP8T_ARCH_GPT2;
    printf("  %-24s quantize_scaled %ld (plain %ld), both orientations %ld, amax %ld, "
           "scaled GEMMs %ld of %ld\n",
           what, c[0].qs, c[1].qs, c[0].qs_both, c[0].amax, c[0].scaled_gemm, c[0].gemm);
    /* every linear's three GEMMs scaled, in both models */
    T_CHECK(c[0].scaled_gemm == 3 * lins * micro && c[0].gemm == c[0].scaled_gemm &&
                c[1].scaled_gemm == c[0].scaled_gemm,
            "%s: %ld / %ld scaled GEMMs of %ld", what, c[0].scaled_gemm, c[1].scaled_gemm,
            3 * lins * micro);
    /* X in the Fprop, dY in the Dgrad (both orientations each), W once per step (both); the
     * plain model quantizes the Wgrad's dYᵀ and Xᵀ again; Llama's up takes gate's X operand
     * and its amax (x-share) */
    const long shared = gpt2 ? 0 : (long)cfg->n_layer * micro;
    T_CHECK(c[0].qs == 2 * lins * micro + lins * steps - shared,
            "%s: %ld quantize_scaled calls, want %ld", what, c[0].qs,
            2 * lins * micro + lins * steps - shared);
    T_CHECK(c[0].qs_both == c[0].qs, "%s: %ld of %ld passes made one orientation only", what,
            c[0].qs - c[0].qs_both, c[0].qs);
    T_CHECK(c[1].qs == 4 * lins * micro + lins * steps, "%s: plain: %ld quantize_scaled calls",
            what, c[1].qs);
    /* the amaxes of the history, GELU and the bias gradient come from those passes */
    T_CHECK(c[0].amax == 0, "%s: %ld amax passes of their own", what, c[0].amax);
    T_CHECK(c[0].amax1 == shared, "%s: %ld single-value amax merges, want %ld", what, c[0].amax1,
            shared);
    T_CHECK(c[0].gelu_fwd == 0 && c[0].gelu_bwd == 0 && c[0].bias_bwd == 0,
            "%s: gelu_forward %ld, gelu_backward %ld, bias_backward %ld with the fusions on",
            what, c[0].gelu_fwd, c[0].gelu_bwd, c[0].bias_bwd);
    /* GPT-2's biases: proj's and fc2's go to the residual add, fc1's to fc2's GELU pass
     * (linear_gelu_takes_bias), so only qkv's rides in its GEMM; the plain model gives each
     * linear's to its GEMM */
    const long layers = cfg->n_layer;
    T_CHECK(c[0].gemm_bias == (gpt2 ? layers * micro : 0) &&
                c[1].gemm_bias == (gpt2 ? 4 * layers * micro : 0),
            "%s: %ld / %ld GEMMs given a bias", what, c[0].gemm_bias, c[1].gemm_bias);
    if (gpt2)
        T_CHECK(c[1].gelu_fwd > 0 && c[1].gelu_bwd > 0 && c[1].bias_bwd > 0,
                "%s: plain: gelu_forward %ld, gelu_backward %ld, bias_backward %ld", what,
                c[1].gelu_fwd, c[1].gelu_bwd, c[1].bias_bwd);
    fp8t_model_destroy(a);
    fp8t_model_destroy(b);
}

static void scaled_fast_block(void) {
    fast_case("tiny", FP8T_PREC_BLOCK, 0);
    fast_case("tiny-llama", FP8T_PREC_BLOCK, 0);
    fast_case("tiny", FP8T_PREC_BLOCK, 1);
}

static void scaled_fast_rowwise(void) {
    fast_case("tiny", FP8T_PREC_ROWWISE, 0);
    fast_case("tiny-llama", FP8T_PREC_ROWWISE, 0);
    fast_case("tiny-llama", FP8T_PREC_ROWWISE, 1);
}

/* activation bytes after one training step */
static size_t act_bytes(const char *preset, fp8t_precision prec, unsigned disable) {
    fp8t_policy p = policy(prec, 0);
    p.head_precision = FP8T_PREC_BF16;
    const int B = 2, T = 64, N = B * T;
    fp8t_model *m = make(preset, &p, B, T, disable);
    if (!m) return 0;
    int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
    batch(tok, tgt, N, fp8t_model_get_config(m)->vocab_size, 1);
    fp8t_model_zero_grad(m);
    fp8t_model_forward(m, tok, tgt);
    fp8t_model_backward(m, 1.0f);
    const size_t bytes = fp8t_model_activation_bytes(m);
    fp8t_model_destroy(m);
    free(tok);
    free(tgt);
    return bytes;
}

static void scaled_memory(void) {
    const char *presets[2] = {"tiny", "tiny-llama"};
    for (int i = 0; i < 2; i++) {
        const size_t blk = act_bytes(presets[i], FP8T_PREC_BLOCK, 0);
        const size_t row = act_bytes(presets[i], FP8T_PREC_ROWWISE, 0);
        const size_t bf16 = act_bytes(presets[i], FP8T_PREC_BF16, 0);
        const size_t nosave = act_bytes(presets[i], FP8T_PREC_BLOCK, FP8T_DISABLE_FP8_SAVE);
        printf("  %-10s activation bytes: block %zu, rowwise %zu, bf16 %zu, block with FP32 X "
               "%zu\n",
               presets[i], blk, row, bf16, nosave);
        T_CHECK(blk > 0 && blk < bf16 && blk < nosave,
                "%s: block %zu bytes, bf16 %zu, nosave %zu", presets[i], blk, bf16, nosave);
        T_CHECK(row > 0 && row < bf16, "%s: rowwise %zu bytes, bf16 %zu", presets[i], row, bf16);
    }
}

int main(void) {
    t_suite = "scaled_fast";
    char err[256];
    cpu = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    if (!cpu) {
        printf("FAIL scaled_fast: cpu backend: %s\n", err);
        return 1;
    }
    counted_ops = *cpu->ops;
    counted_ops.make_operand = count_qs;
    counted_ops.amax = count_amax;
    counted_ops.gelu_forward = count_gelu_fwd;
    counted_ops.gelu_backward = count_gelu_bwd;
    counted_ops.bias_backward = count_bias_bwd;
    counted_ops.gemm_fp8 = count_gemm_fp8;
    native = *cpu;
    native.ops = &counted_ops;
    native.fp8_block_native = 1;
    T_RUN(scaled_fast_block);
    T_RUN(scaled_fast_rowwise);
    T_RUN(scaled_memory);
    fp8t_backend_destroy(cpu);
    T_MAIN_END();
}
