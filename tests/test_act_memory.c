/* Activation memory (src/model: layer saves, model_forward_saves; fp8t_model_activation_bytes):
 *  - a backend that keeps its own attention state (here: the CPU backend wrapped to keep a
 *    copy of qkv, as the CUDA flash path keeps BF16 q, k, v) gets the same bits as the plain
 *    CPU backend, and the model then keeps no per-layer qkv: exactly those bytes fewer;
 *  - the FP32 policy keeps every save in FP32: the same bits and bytes as
 *    FP8T_DISABLE_BF16_SAVES; a layer with an FP32 GEMM keeps its saves in FP32, the others
 *    in BF16 (the bytes say which);
 *  - BF16 saves under FP8 and BF16 policies: the forward is unchanged (the first loss is the
 *    same bits), the gradients are within BF16 rounding of the FP32-save ones, the losses stay
 *    close over steps;
 *  - the memory figure: per layer (the slope between two depths, so the per-model buffers
 *    cancel), a GPT-2-shaped model with BF16 saves keeps at most 0.6x the bytes of the FP32
 *    saves; the figure the CUDA flash path would give (its BF16 q, k, v in place of qkv) is
 *    computed from the wrapped backend's.
 * fp8t_model_activation_bytes is checked against the bytes the backend was asked for. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/model.h"
#include "model_state_util.h"
#include "test.h"

static fp8t_backend *cpu;
static fp8t_backend keeper; /* the CPU backend keeping its attention state */
static fp8t_backend_ops keeper_ops;

/* the kept state: an FP32 copy of qkv [B, T, QKV] */
static size_t keep_saved_bytes(fp8t_backend *b, const fp8t_attn_shape *s) {
    (void)b;
    return (size_t)s->B * s->T * (size_t)fp8t_attn_qkv_width(s) * sizeof(float);
}

static void keep_forward(fp8t_backend *b, float *out, float *lse, void *saved, const float *qkv,
                         const fp8t_attn_shape *s) {
    cpu->ops->attention_forward(b, out, lse, NULL, qkv, s);
    if (saved) cpu->ops->copy(b, saved, qkv, keep_saved_bytes(b, s));
}

/* with a saved state the model's qkv is not read (it may hold another layer's values) */
static void keep_backward(fp8t_backend *b, float *dqkv, const float *dout, const float *qkv,
                          const void *saved, const float *out, const float *lse,
                          const fp8t_attn_shape *s) {
    cpu->ops->attention_backward(b, dqkv, dout, saved ? (const float *)saved : qkv, NULL, out,
                                 lse, s);
}

static fp8t_model *make(fp8t_backend *be, const fp8t_model_config *c, const fp8t_policy *pol,
                        int B, int T, int no_bf16_saves) {
    const fp8t_model_options opt = {.disable =
                                        no_bf16_saves ? (unsigned)FP8T_DISABLE_BF16_SAVES : 0u};
    char err[256];
    fp8t_model *m = fp8t_model_create(be, c, pol, &opt, B, T, err, sizeof(err));
    if (!m)
        printf("  create: %s\n", err);
    else
        fp8t_model_init_weights(m, 4242);
    return m;
}

static fp8t_policy policy(fp8t_precision prec, const char *overrides) {
    fp8t_policy p;
    fp8t_policy_default(&p);
    p.default_precision = prec;
    p.history_len = 4;
    char err[256];
    if (overrides && fp8t_policy_add_overrides(&p, overrides, err, sizeof(err)) != 0)
        printf("  policy overrides '%s': %s\n", overrides, err);
    return p;
}

static fp8t_model_config preset(const char *name) {
    fp8t_model_config c;
    fp8t_model_preset(&c, name);
    return c;
}

static void batch(int *tok, int *tgt, int N, int V, int k) {
    for (int i = 0; i < N; i++) {
        tok[i] = (k * 31 + i * 7) % V;
        tgt[i] = (k * 31 + (i + 1) * 7 + (i % 3)) % V;
    }
}

typedef struct {
    int B, T;
    int *tok, *tgt;
} batcher;

static float train_micro(fp8t_model *m, batcher *bt, int k) {
    const int N = bt->B * bt->T, V = fp8t_model_get_config(m)->vocab_size;
    batch(bt->tok, bt->tgt, N, V, k);
    fp8t_model_zero_grad(m);
    float loss = fp8t_model_forward(m, bt->tok, bt->tgt);
    fp8t_model_backward(m, 1.0f);
    return loss;
}

static void opt_step(fp8t_model *m, int s) {
    fp8t_model_adamw(m, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, s, 1.0f, fp8t_model_grad_norm(m));
    fp8t_model_end_step(m);
}

/* Train a and b side by side for `steps` steps: losses and state bit for bit. */
static int lockstep_exact(fp8t_model *a, fp8t_model *b, int B, int T, int steps,
                          const char *what) {
    batcher bt = {B, T, malloc((size_t)B * T * sizeof(int)), malloc((size_t)B * T * sizeof(int))};
    int bad = 0;
    char when[256];
    for (int s = 1; s <= steps; s++) {
        float la = train_micro(a, &bt, s), lb = train_micro(b, &bt, s);
        snprintf(when, sizeof(when), "%s step %d", what, s);
        if (memcmp(&la, &lb, sizeof(float)) || !same_model_losses(cpu, a, b, B * T)) {
            if (!bad) printf("  %s: loss %.9g vs %.9g (or per-position losses)\n", when, la, lb);
            bad++;
        }
        bad += diff_model_state(cpu, a, b, when);
        opt_step(a, s);
        opt_step(b, s);
    }
    free(bt.tok);
    free(bt.tgt);
    return bad;
}

/* floats per token of the layer saves: qkv, atty, fch (gate), up (Llama), res2, res3 */
static size_t save_width(const fp8t_model_config *c) {
    return (size_t)fp8t_model_qkv_dim(c) + 3u * (size_t)c->n_embd + (size_t)c->mlp_hidden +
           (c->arch == FP8T_ARCH_LLAMA ? (size_t)c->mlp_hidden : 0u);
}

/* ---- the backend's attention state replaces the per-layer qkv ---- */

static void attention_state_case(const char *name, fp8t_precision prec, int no_bf16) {
    const int B = 2, T = 16, N = B * T;
    fp8t_model_config c = preset(name);
    fp8t_policy p = policy(prec, NULL);
    fp8t_model *plain = make(cpu, &c, &p, B, T, no_bf16);
    fp8t_model *kept = make(&keeper, &c, &p, B, T, no_bf16);
    if (!plain || !kept) {
        T_CHECK(0, "create %s", name);
        return;
    }
    char what[128];
    snprintf(what, sizeof(what), "%s %s%s", name, fp8t_precision_name(prec),
             no_bf16 ? " (FP32 saves)" : "");
    /* the same bits where both read the same qkv: FP32 saves (with BF16 saves the plain
     * backend's attention backward reads qkv's BF16 copy, the keeper its FP32 copy) */
    const int bf16_saves = !no_bf16 && prec != FP8T_PREC_FP32;
    if (!bf16_saves) {
        T_CHECK(lockstep_exact(kept, plain, B, T, 3, what) == 0,
                "%s: the backend's attention state changed the bits", what);
    } else {
        batcher bt = {B, T, malloc((size_t)N * sizeof(int)), malloc((size_t)N * sizeof(int))};
        train_micro(kept, &bt, 1);
        train_micro(plain, &bt, 1);
        free(bt.tok);
        free(bt.tgt);
    }
    /* bytes: no per-layer qkv (4 bytes per value, or 2 as BF16); the state per layer and one
     * layer's qkv scratch instead (the BF16 plain model has that scratch too) */
    const size_t L = (size_t)c.n_layer, qkv = (size_t)N * (size_t)fp8t_model_qkv_dim(&c);
    fp8t_attn_shape sh = {B,    T,   c.n_head, fp8t_model_kv_heads(&c), c.n_embd / c.n_head,
                          0.0f, {0}, NULL};
    const size_t state = keep_saved_bytes(NULL, &sh);
    const size_t bp = fp8t_model_activation_bytes(plain), bk = fp8t_model_activation_bytes(kept);
    const size_t want =
        bf16_saves ? bp - L * qkv * 2 + L * state : bp - L * qkv * 4 + L * state + qkv * 4;
    T_CHECK(bk == want,
            "%s: %zu activation bytes with the attention state, %zu without: "
            "expected %zu",
            what, bk, bp, want);
    fp8t_model_destroy(plain);
    fp8t_model_destroy(kept);
}

static void attention_state(void) {
    attention_state_case("tiny", FP8T_PREC_FP32, 0);
    attention_state_case("tiny", FP8T_PREC_DELAYED, 1);
    attention_state_case("tiny", FP8T_PREC_DELAYED, 0);
    attention_state_case("tiny-llama", FP8T_PREC_FP32, 0);
    attention_state_case("tiny-llama", FP8T_PREC_BF16, 1);
    attention_state_case("tiny-llama", FP8T_PREC_CURRENT, 0);
}

/* ---- which layers keep BF16 saves ---- */

static void fp32_layers_case(const char *name, fp8t_precision prec, const char *overrides,
                             int bf16_layers) {
    const int B = 2, T = 16, N = B * T;
    fp8t_model_config c = preset(name);
    fp8t_policy p = policy(prec, overrides);
    fp8t_model *a = make(cpu, &c, &p, B, T, 0), *b = make(cpu, &c, &p, B, T, 1);
    if (!a || !b) {
        T_CHECK(0, "create %s", name);
        return;
    }
    char what[160];
    snprintf(what, sizeof(what), "%s %s %s", name, fp8t_precision_name(prec),
             overrides ? overrides : "");
    if (bf16_layers == 0) {
        T_CHECK(lockstep_exact(a, b, B, T, 3, what) == 0,
                "%s: FP8T_DISABLE_BF16_SAVES changed the bits of an FP32 run", what);
    } else {
        batcher bt = {B, T, malloc((size_t)N * sizeof(int)), malloc((size_t)N * sizeof(int))};
        train_micro(a, &bt, 1);
        train_micro(b, &bt, 1);
        free(bt.tok);
        free(bt.tgt);
    }
    /* each BF16 layer keeps 2 bytes per value instead of 4; the FP32 values of a BF16 layer
     * live in one layer's scratch (4 bytes per value, once) */
    const size_t W = (size_t)N * save_width(&c);
    const size_t ba = fp8t_model_activation_bytes(a), bb = fp8t_model_activation_bytes(b);
    const size_t want = bf16_layers ? bb - (size_t)bf16_layers * W * 2 + W * 4 : bb;
    T_CHECK(ba == want, "%s: %zu activation bytes, %zu with FP32 saves: expected %zu", what, ba,
            bb, want);
    fp8t_model_destroy(a);
    fp8t_model_destroy(b);
}

static void fp32_layers(void) {
    fp32_layers_case("tiny", FP8T_PREC_FP32, NULL, 0);
    fp32_layers_case("tiny-llama", FP8T_PREC_FP32, NULL, 0);
    /* an FP32 GEMM anywhere in a layer keeps that layer's saves in FP32 */
    fp32_layers_case("tiny", FP8T_PREC_DELAYED, "layers=0,gemm=wgrad,precision=fp32", 3);
    fp32_layers_case("tiny-llama", FP8T_PREC_BF16, "layers=1-2,module=down,precision=fp32", 2);
    /* the head's precision is not a layer's */
    fp32_layers_case("tiny", FP8T_PREC_DELAYED, "module=head,precision=fp32", 4);
}

/* ---- BF16 saves against FP32 saves: close, not equal ---- */

/* ||a - b|| / ||b|| over n floats (device buffers) */
static double rel_l2(const float *a, const float *b, size_t n) {
    float *ha = host_copy(cpu, a, n * sizeof(float)), *hb = host_copy(cpu, b, n * sizeof(float));
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)ha[i] - (double)hb[i];
        num += d * d;
        den += (double)hb[i] * (double)hb[i];
    }
    free(ha);
    free(hb);
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static void bf16_close_case(const char *name, fp8t_precision prec) {
    const int B = 2, T = 32, N = B * T, steps = 8;
    fp8t_model_config c = preset(name);
    fp8t_policy p = policy(prec, NULL), p32 = policy(FP8T_PREC_FP32, NULL);
    const int fp8 = prec != FP8T_PREC_BF16;
    /* a: BF16 saves, b: FP32 saves, r (FP8 runs): the FP32 policy, the yardstick of FP8's own
     * deviation */
    fp8t_model *a = make(cpu, &c, &p, B, T, 0), *b = make(cpu, &c, &p, B, T, 1);
    fp8t_model *r = fp8 ? make(cpu, &c, &p32, B, T, 0) : NULL;
    if (!a || !b || (fp8 && !r)) {
        T_CHECK(0, "create %s", name);
        return;
    }
    char what[128];
    snprintf(what, sizeof(what), "%s %s", name, fp8t_precision_name(prec));
    batcher bt = {B, T, malloc((size_t)N * sizeof(int)), malloc((size_t)N * sizeof(int))};
    double worst = 0.0, worst_r = 0.0;
    for (int s = 1; s <= steps; s++) {
        const float la = train_micro(a, &bt, s), lb = train_micro(b, &bt, s);
        const float lr = r ? train_micro(r, &bt, s) : lb;
        if (s == 1) {
            /* the forward is the same either way: only what the backward reads is rounded */
            T_CHECK(!memcmp(&la, &lb, sizeof(float)), "%s: first loss %.9g vs %.9g", what, la,
                    lb);
            const size_t np = fp8t_model_num_params(a);
            const double e = rel_l2(fp8t_model_grads(a), fp8t_model_grads(b), np);
            T_CHECK(e > 0.0, "%s: BF16 saves left the gradients bit-identical", what);
            if (!fp8) {
                /* BF16 GEMMs: each saved value carries at most BF16's relative rounding error
                 * 2^-9, and the backward's products and sums keep the gradient's relative
                 * error within a small multiple of it */
                printf("  %s: gradient relative L2 error %.3g (BF16 unit roundoff %.3g)\n", what,
                       e, ldexp(1.0, -9));
                T_CHECK(e < 4 * ldexp(1.0, -9), "%s: gradient relative error %.3g", what, e);
            } else {
                /* FP8 GEMMs: a saved value rounded to BF16 moves some of dY's FP8 codes by a
                 * step (2^-3 relative in E5M2), so the difference is of FP8's order, not
                 * BF16's: what must hold is that the BF16-save run stays as close to the FP32
                 * policy's gradients as the FP32-save run (its own FP8 error grows by at most
                 * a quarter) */
                const double ea = rel_l2(fp8t_model_grads(a), fp8t_model_grads(r), np);
                const double eb = rel_l2(fp8t_model_grads(b), fp8t_model_grads(r), np);
                printf("  %s: gradient relative L2 error %.3g between the saves; against the "
                       "FP32 policy %.3g (BF16 saves) %.3g (FP32 saves)\n",
                       what, e, ea, eb);
                T_CHECK(ea <= 1.25 * eb,
                        "%s: FP8 gradient error %.3g with BF16 saves, %.3g "
                        "with FP32 saves",
                        what, ea, eb);
            }
        }
        const double d = fabs((double)la - (double)lb) / fabs((double)lb);
        const double dr = fabs((double)lr - (double)lb) / fabs((double)lb);
        if (d > worst) worst = d;
        if (dr > worst_r) worst_r = dr;
        opt_step(a, s);
        opt_step(b, s);
        if (r) opt_step(r, s);
    }
    printf("  %s: largest relative loss difference over %d steps %.3g", what, steps, worst);
    if (fp8) printf(" (the FP8 run against FP32: %.3g)", worst_r);
    printf("\n");
    /* BF16: within a few BF16 roundings of the loss; FP8: within the 0.25% that issue 14
     * allows FP8 against BF16 */
    T_CHECK(worst < (fp8 ? 2.5e-3 : 1e-3), "%s: losses %.3g apart", what, worst);
    free(bt.tok);
    free(bt.tgt);
    fp8t_model_destroy(a);
    fp8t_model_destroy(b);
    fp8t_model_destroy(r);
}

static void bf16_saves_close(void) {
    bf16_close_case("tiny", FP8T_PREC_DELAYED);
    bf16_close_case("tiny", FP8T_PREC_BF16);
    bf16_close_case("tiny-llama", FP8T_PREC_CURRENT);
    bf16_close_case("tiny-llama", FP8T_PREC_BF16);
}

/* ---- the memory figure ---- */

/* Activation bytes after one training step of a model of `layers` layers */
static size_t bytes_at(fp8t_backend *be, fp8t_model_config c, int layers, fp8t_precision prec,
                       int no_bf16, int B, int T) {
    c.n_layer = layers;
    fp8t_policy p = policy(prec, NULL);
    fp8t_model *m = make(be, &c, &p, B, T, no_bf16);
    if (!m) return 0;
    batcher bt = {B, T, malloc((size_t)B * T * sizeof(int)), malloc((size_t)B * T * sizeof(int))};
    train_micro(m, &bt, 1);
    opt_step(m, 1);
    train_micro(m, &bt, 2);
    const size_t n = fp8t_model_activation_bytes(m);
    free(bt.tok);
    free(bt.tgt);
    fp8t_model_destroy(m);
    return n;
}

static void figure_case(const char *name, double max_ratio) {
    /* T a multiple of the CUDA flash tile (64): its state is then 3 * N * C BF16 values */
    const int B = 2, T = 64, N = B * T;
    fp8t_model_config c = preset(name);
    c.seq_len = T;
    const fp8t_precision prec = FP8T_PREC_DELAYED;
    /* per layer: the slope between 2 and 4 layers */
    const double f32 =
        (double)(bytes_at(cpu, c, 4, prec, 1, B, T) - bytes_at(cpu, c, 2, prec, 1, B, T)) / 2.0 /
        N;
    const double b16 =
        (double)(bytes_at(cpu, c, 4, prec, 0, B, T) - bytes_at(cpu, c, 2, prec, 0, B, T)) / 2.0 /
        N;
    const double k32 = (double)(bytes_at(&keeper, c, 4, prec, 1, B, T) -
                                bytes_at(&keeper, c, 2, prec, 1, B, T)) /
                       2.0 / N;
    const double k16 = (double)(bytes_at(&keeper, c, 4, prec, 0, B, T) -
                                bytes_at(&keeper, c, 2, prec, 0, B, T)) /
                       2.0 / N;
    /* the CUDA flash path: its BF16 q, k, v (NH heads each, the group's k, v expanded) in place
     * of the keeper's FP32 qkv copy */
    const int HS = c.n_embd / c.n_head;
    const double keep_state = 4.0 * fp8t_model_qkv_dim(&c), flash_state = 2.0 * 3 * c.n_head * HS;
    const double cuda32 = k32 - keep_state + flash_state, cuda16 = k16 - keep_state + flash_state;
    printf("  %s, FP8 delayed, bytes per token and layer: FP32 saves %.0f (CPU) %.0f (CUDA "
           "flash); BF16 saves %.0f (CPU) %.0f (CUDA flash): %.3f / %.3f of the FP32 figure\n",
           name, f32, cuda32, b16, cuda16, b16 / f32, cuda16 / f32);
    /* the figure before the layer saves was the CPU FP32-save one on both backends (qkv was
     * kept per layer beside the CUDA state) */
    T_CHECK(b16 <= max_ratio * f32,
            "%s: BF16 saves keep %.0f bytes per token and layer, FP32 "
            "saves %.0f",
            name, b16, f32);
    T_CHECK(cuda16 <= max_ratio * f32, "%s: CUDA figure %.0f vs %.0f", name, cuda16, f32);
    /* the exact per-layer differences: 2 bytes per save value fewer; the state for qkv */
    T_CHECK(f32 - b16 == 2.0 * save_width(&c),
            "%s: BF16 saves take %.0f bytes fewer, expected "
            "%zu",
            name, f32 - b16, 2 * save_width(&c));
    T_CHECK(f32 - k32 == 4.0 * fp8t_model_qkv_dim(&c) - keep_state,
            "%s: the attention state takes %.0f bytes fewer", name, f32 - k32);
}

static void memory_figure(void) {
    figure_case("tiny", 0.6);
    figure_case("tiny-llama", 0.6);
}

int main(void) {
    t_suite = "act_memory";
    char err[256];
    cpu = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    if (!cpu) {
        printf("FAIL act_memory: cpu backend: %s\n", err);
        return 1;
    }
    keeper = *cpu;
    keeper_ops = *cpu->ops;
    keeper_ops.attention_saved_bytes = keep_saved_bytes;
    keeper_ops.attention_forward = keep_forward;
    keeper_ops.attention_backward = keep_backward;
    keeper.ops = &keeper_ops;
    T_RUN(attention_state);
    T_RUN(fp32_layers);
    T_RUN(bf16_saves_close);
    T_RUN(memory_figure);
    fp8t_backend_destroy(cpu);
    T_MAIN_END();
}
