/* The plan of each linear (src/model/linear_plan.c): decided once per policy, hook and option
 * change, and read by every call.
 *   - what it decides, per precision and hook state, on GPT-2's tiny preset: which producer
 *     steps the Fprop's operand pass takes (GELU into fc2, LayerNorm into qkv / fc1), where
 *     each bias goes (GEMM, residual add, fc2's GELU pass, a pass of its own), what the
 *     forward keeps for the Wgrad, whether the Wgrad takes the Dgrad's dY;
 *   - each switch of fp8t_model_options.disable turns its entry off;
 *   - the plan is current after every change that moves it (set_policy, set_hook,
 *     set_observer, clearing them): it equals the plan a fresh model with that state makes;
 *   - training with the plan of one state after another gives the losses of a model created
 *     in that state (nothing decided per call reads a stale input). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/model.h"
#include "fp8train/policy.h"
#include "model/model_internal.h"
#include "test.h"

static fp8t_backend *cpu;
enum { B = 2, T = 32, QKV = 0, PROJ = 1, FC1 = 2, FC2 = 3 };

static void observe(void *ctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    (void)ctx, (void)m, (void)s, (void)x;
}
static void write_hook(void *ctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    (void)ctx, (void)m, (void)s, (void)x; /* may write: the model must assume it does */
}

static fp8t_model *make(const char *preset, fp8t_precision prec, unsigned disable) {
    fp8t_model_config c;
    if (fp8t_model_preset(&c, preset) != 0) return NULL;
    fp8t_policy p;
    fp8t_policy_default(&p);
    p.default_precision = prec;
    fp8t_model_options o;
    memset(&o, 0, sizeof o);
    o.disable = disable;
    char err[256];
    fp8t_model *m = fp8t_model_create(cpu, &c, &p, &o, B, T, err, sizeof err);
    if (!m)
        T_FAIL("%s: %s", preset, err);
    else
        fp8t_model_init_weights(m, 3);
    return m;
}

static void set_prec(fp8t_model *m, fp8t_precision prec) {
    fp8t_policy p = *fp8t_model_get_policy(m);
    p.default_precision = prec;
    fp8t_model_set_policy(m, &p);
}

/* layer 0's linear k's plan */
static const linear_plan *L(const fp8t_model *m, int k) { return &m->plan[k]; }

static void decides_per_precision(void) {
    fp8t_model *m = make("tiny", FP8T_PREC_DELAYED, 0);
    T_ASSERT(m, "model");
    /* delayed FP8: GELU in fc2's pass in both kinds of forward, fc1's bias to that pass, the
     * residual adds take proj's and fc2's, X kept as codes, dY shared, dGELU in fc1's Dgrad */
    T_CHECK(L(m, FC2)->step_fused[0] && L(m, FC2)->step_fused[1], "delayed: GELU into fc2");
    T_CHECK(L(m, FC1)->bias_next[0] && L(m, FC1)->bias_next[1], "delayed: fc1's bias to fc2");
    T_CHECK(L(m, PROJ)->bias_residual && L(m, FC2)->bias_residual, "delayed: residual biases");
    T_CHECK(!L(m, QKV)->step_fused[0], "delayed: LayerNorm is fused only into BF16 operands");
    for (int k = 0; k < 4; k++)
        T_CHECK(L(m, k)->save_x && L(m, k)->dy_shared && L(m, k)->bias_gemm, "delayed: lin %d",
                k);
    T_CHECK(L(m, FC1)->dgelu && !L(m, FC2)->dgelu, "delayed: dGELU in fc1's Dgrad only");
    T_CHECK(m->layer_bf16[0], "delayed: BF16 layer saves");
    /* current scaling: the scale comes from a pass over the values, so GELU is not fused */
    set_prec(m, FP8T_PREC_CURRENT);
    T_CHECK(!L(m, FC2)->step_fused[0] && !L(m, FC2)->step_fused[1], "current: no GELU fusion");
    T_CHECK(!L(m, FC1)->bias_next[0] && !L(m, FC1)->dgelu, "current: no deferral, no dGELU");
    T_CHECK(L(m, FC2)->save_x && L(m, FC2)->dy_shared, "current: codes shared");
    /* BF16: the LayerNorms write qkv's / fc1's operands, the biases ride in the epilogue */
    set_prec(m, FP8T_PREC_BF16);
    T_CHECK(L(m, QKV)->step_fused[0] && L(m, FC1)->step_fused[0] && L(m, FC2)->step_fused[0],
            "bf16: LayerNorm into qkv and fc1, GELU into fc2");
    T_CHECK(!L(m, PROJ)->bias_residual && L(m, PROJ)->bias_gemm, "bf16: bias in the epilogue");
    T_CHECK(!L(m, FC1)->bias_next[0], "bf16: fc1's bias stays in its GEMM");
    const int head = m->n_lin - 1;
    T_CHECK(m->plan[head].bf16_dy, "bf16: the head's fused cross-entropy");
    /* FP32: nothing fused, nothing kept but X, FP32 saves */
    set_prec(m, FP8T_PREC_FP32);
    for (int k = 0; k < 4; k++)
        T_CHECK(!L(m, k)->save_x && !L(m, k)->step_fused[0] && !L(m, k)->dy_shared &&
                    !L(m, k)->bias_gemm,
                "fp32: lin %d", k);
    T_CHECK(!m->layer_bf16[0], "fp32: FP32 layer saves");
    T_CHECK(m->plan[head].bf16_dy, "fp32: the head keeps the policy's head precision (BF16)");
    fp8t_model_destroy(m);
}

static void decides_per_hook(void) {
    fp8t_model *m = make("tiny", FP8T_PREC_DELAYED, 0);
    T_ASSERT(m, "model");
    /* an observer reads: the operands are still shared and kept, the residual adds still take
     * the biases; no FP32 tensor it must see may be skipped or carry a folded bias, but the
     * delayed-FP8 GELU passes stay (they write the FP32 tensors it is shown: GELU's output at
     * fc2's X, its backward's at fc1's dY), and with them fc1's bias deferred into the pass */
    fp8t_model_set_observer(m, observe, NULL);
    for (int k = 0; k < 4; k++) {
        T_CHECK(L(m, k)->save_x && L(m, k)->dy_shared && L(m, k)->colsum,
                "observer: lin %d keeps and shares", k);
        const int gelu = k == FC2, dgelu = k == FC1;
        T_CHECK(L(m, k)->step_fused[0] == gelu && L(m, k)->step_fused[1] == gelu &&
                    !L(m, k)->bias_gemm && L(m, k)->dgelu == dgelu && !L(m, k)->bf16_dy,
                "observer: lin %d fuses only the GELU passes", k);
    }
    T_CHECK(L(m, FC1)->bias_next[0], "observer: fc1's bias into GELU's pass");
    T_CHECK(L(m, PROJ)->bias_residual && m->layer_bf16[0], "observer: residual bias, BF16 saves");
    /* a hook that may write: every tensor in FP32 between the sites, nothing shared */
    fp8t_model_set_hook(m, write_hook, NULL);
    for (int k = 0; k < 4; k++)
        T_CHECK(!L(m, k)->save_x && !L(m, k)->dy_shared && !L(m, k)->colsum &&
                    !L(m, k)->bias_residual && !L(m, k)->step_fused[1],
                "writing hook: lin %d", k);
    T_CHECK(!m->layer_bf16[0], "writing hook: FP32 saves");
    /* cleared: back to the plain plan */
    fp8t_model_set_hook(m, NULL, NULL);
    T_CHECK(L(m, FC2)->step_fused[0] && L(m, FC1)->bias_next[0] && L(m, PROJ)->bias_gemm,
            "hook cleared: the fusions return");
    fp8t_model_destroy(m);
    /* in BF16 the GELU passes write no FP32 output: an observer turns them off */
    m = make("tiny", FP8T_PREC_BF16, 0);
    T_ASSERT(m, "model");
    T_CHECK(L(m, FC2)->step_fused[0] && L(m, FC1)->dgelu, "bf16: the GELU passes");
    fp8t_model_set_observer(m, observe, NULL);
    T_CHECK(!L(m, FC2)->step_fused[0] && !L(m, FC2)->step_fused[1] && !L(m, FC1)->dgelu,
            "bf16 observer: no GELU pass");
    fp8t_model_destroy(m);
}

static void switches(void) {
    static const struct {
        unsigned bit;
        const char *name;
        int lin;
        size_t off; /* the entry the switch turns off */
    } sw[] = {
        {FP8T_DISABLE_GELU_FUSION, "gelu", FC2, offsetof(linear_plan, step_fused)},
        {FP8T_DISABLE_GELU_BWD_FUSION, "gelu-bwd", FC1, offsetof(linear_plan, dgelu)},
        {FP8T_DISABLE_BIAS_GRAD_FUSION, "bias-grad", FC1, offsetof(linear_plan, colsum)},
        {FP8T_DISABLE_RESIDUAL_BIAS, "residual-bias", PROJ, offsetof(linear_plan, bias_residual)},
        {FP8T_DISABLE_CODE_REUSE, "code-reuse", FC1, offsetof(linear_plan, dy_shared)},
        {FP8T_DISABLE_FP8_SAVE, "fp8-save", FC1, offsetof(linear_plan, save_x)},
    };
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++) {
        fp8t_model *on = make("tiny", FP8T_PREC_DELAYED, 0);
        fp8t_model *off = make("tiny", FP8T_PREC_DELAYED, sw[i].bit);
        T_ASSERT(on && off, "models");
        const unsigned char a = ((const unsigned char *)L(on, sw[i].lin))[sw[i].off];
        const unsigned char b = ((const unsigned char *)L(off, sw[i].lin))[sw[i].off];
        T_CHECK(a == 1 && b == 0, "--disable %s: entry %u with it on, %u off", sw[i].name, a, b);
        fp8t_model_destroy(on);
        fp8t_model_destroy(off);
    }
    fp8t_model *ln_on = make("tiny", FP8T_PREC_BF16, 0);
    fp8t_model *ln_off = make("tiny", FP8T_PREC_BF16, FP8T_DISABLE_LN_FUSION);
    T_ASSERT(ln_on && ln_off, "models");
    T_CHECK(L(ln_on, QKV)->step_fused[0] && !L(ln_off, QKV)->step_fused[0], "--disable ln");
    T_CHECK(L(ln_off, FC2)->step_fused[0], "--disable ln leaves GELU's fusion");
    fp8t_model_destroy(ln_on);
    fp8t_model_destroy(ln_off);
    /* Llama's SwiGLU (tiny-llama's linears per layer: qkv, proj, gate, up, down): down's
     * rounding pass and gate's / up's Dgrad passes, on the scaled path (rowwise), per-tensor
     * FP8 with the scale known before the pass (delayed) and BF16 operands; not under current
     * scaling, whose scale comes from the values themselves */
    static const fp8t_precision sw_prec[4] = {FP8T_PREC_ROWWISE, FP8T_PREC_DELAYED,
                                              FP8T_PREC_BF16, FP8T_PREC_CURRENT};
    for (int i = 0; i < 4; i++) {
        const char *pn = fp8t_precision_name(sw_prec[i]);
        const unsigned char want = sw_prec[i] != FP8T_PREC_CURRENT;
        fp8t_model *sw_on = make("tiny-llama", sw_prec[i], 0);
        fp8t_model *sw_fwd = make("tiny-llama", sw_prec[i], FP8T_DISABLE_SWIGLU_FUSION);
        fp8t_model *sw_bwd = make("tiny-llama", sw_prec[i], FP8T_DISABLE_SWIGLU_BWD_FUSION);
        T_ASSERT(sw_on && sw_fwd && sw_bwd, "models");
        T_CHECK(L(sw_on, 4)->step_fused[0] == want && L(sw_on, 2)->dswiglu == want &&
                    L(sw_on, 3)->dswiglu == want,
                "%s tiny-llama: SwiGLU fused %u, its gradients %u, %u (expected %u)", pn,
                L(sw_on, 4)->step_fused[0], L(sw_on, 2)->dswiglu, L(sw_on, 3)->dswiglu, want);
        T_CHECK(!L(sw_fwd, 4)->step_fused[0] && L(sw_fwd, 2)->dswiglu == want,
                "%s: --disable swiglu-fusion", pn);
        T_CHECK(L(sw_bwd, 4)->step_fused[0] == want && !L(sw_bwd, 2)->dswiglu &&
                    !L(sw_bwd, 3)->dswiglu,
                "%s: --disable swiglu-bwd-fusion", pn);
        fp8t_model_destroy(sw_on);
        fp8t_model_destroy(sw_fwd);
        fp8t_model_destroy(sw_bwd);
    }
    /* up (tiny-llama's linear 3) takes gate's X operand where that depends on X alone */
    static const struct {
        fp8t_precision p;
        unsigned disable;
        unsigned char want;
    } xs[] = {{FP8T_PREC_BF16, 0, 1},
              {FP8T_PREC_ROWWISE, 0, 1},
              {FP8T_PREC_DELAYED, 0, 0},
              {FP8T_PREC_BF16, FP8T_DISABLE_X_SHARE, 0},
              {FP8T_PREC_BF16, FP8T_DISABLE_BF16_OPERANDS, 0}};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        fp8t_model *xm = make("tiny-llama", xs[i].p, xs[i].disable);
        T_ASSERT(xm, "model");
        T_CHECK(L(xm, 3)->x_shared == xs[i].want && !L(xm, 2)->x_shared && !L(xm, 4)->x_shared,
                "%s (disable 0x%x): up's x_shared %u (expected %u)", fp8t_precision_name(xs[i].p),
                xs[i].disable, L(xm, 3)->x_shared, xs[i].want);
        fp8t_model_destroy(xm);
    }
    fp8t_model *s_on = make("tiny", FP8T_PREC_DELAYED, 0);
    fp8t_model *s_off = make("tiny", FP8T_PREC_DELAYED, FP8T_DISABLE_BF16_SAVES);
    T_ASSERT(s_on && s_off, "models");
    T_CHECK(s_on->layer_bf16[0] && !s_off->layer_bf16[0], "--disable bf16-saves");
    fp8t_model_destroy(s_on);
    fp8t_model_destroy(s_off);
}

/* m's plan equals the plan of a model created in the same state */
static int same_plan(const fp8t_model *m, const fp8t_model *fresh) {
    return !memcmp(m->plan, fresh->plan, (size_t)m->n_lin * sizeof(linear_plan)) &&
           !memcmp(m->layer_bf16, fresh->layer_bf16, (size_t)m->cfg.n_layer);
}

/* one training step; the loss */
static float step(fp8t_model *m, int s) {
    fp8t_model_config c = *fp8t_model_get_config(m);
    int tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 37 + 11 + s) % c.vocab_size;
    for (int i = 0; i < B * T; i++) tgt[i] = tok[(i + 1) % (B * T)];
    fp8t_model_zero_grad(m);
    const float loss = fp8t_model_forward(m, tok, tgt);
    fp8t_model_backward(m, 1.0f);
    fp8t_model_adamw(m, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, s, 1.0f, fp8t_model_grad_norm(m));
    fp8t_model_end_step(m);
    return loss;
}

static void current_after_every_change(void) {
    static const char *presets[] = {"tiny", "tiny-llama"};
    static const fp8t_precision seq[] = {FP8T_PREC_BF16,   FP8T_PREC_DELAYED, FP8T_PREC_CURRENT,
                                         FP8T_PREC_BLOCK,  FP8T_PREC_ROWWISE, FP8T_PREC_FP32,
                                         FP8T_PREC_DELAYED};
    for (int a = 0; a < 2; a++) {
        fp8t_model *m = make(presets[a], FP8T_PREC_FP32, 0);
        T_ASSERT(m, "model");
        for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
            set_prec(m, seq[i]);
            for (int h = 0; h < 3; h++) {
                if (h == 1) fp8t_model_set_observer(m, observe, NULL);
                if (h == 2) fp8t_model_set_observer(m, NULL, NULL);
                fp8t_model *fresh = make(presets[a], seq[i], 0);
                T_ASSERT(fresh, "model");
                if (h == 1) fp8t_model_set_observer(fresh, observe, NULL);
                T_CHECK(same_plan(m, fresh),
                        "%s: the plan after switching to %s (%s) is not "
                        "a fresh model's",
                        presets[a], fp8t_precision_name(seq[i]),
                        h == 1   ? "observer set"
                        : h == 2 ? "observer cleared"
                                 : "no hook");
                fp8t_model_destroy(fresh);
            }
        }
        fp8t_model_destroy(m);
    }
}

/* Training follows the plan of the model's state at each step. The fused paths give the
 * unfused bits by design, so what a stale plan changes visibly is what is not bit-neutral: a
 * writing hook's plan keeps the layer saves in FP32, the plain one in BF16.
 *   hooked: a model given a writing hook trains as one created without BF16 saves, given the
 *           same hook (and, the control, unlike the plain model without it);
 *   cleared: a model whose hook was set and cleared, switched to delayed FP8, trains as one
 *           that only switched. */
static void follows_the_plan(void) {
    static const char *presets[] = {"tiny", "tiny-llama"};
    for (int a = 0; a < 2; a++) {
        fp8t_model *x = make(presets[a], FP8T_PREC_BF16, 0);
        fp8t_model *y = make(presets[a], FP8T_PREC_BF16, 0);
        fp8t_model *z = make(presets[a], FP8T_PREC_BF16, FP8T_DISABLE_BF16_SAVES);
        T_ASSERT(x && y && z, "models");
        fp8t_model_set_hook(x, write_hook, NULL);
        fp8t_model_set_hook(z, write_hook, NULL);
        int differs = 0;
        for (int s = 1; s <= 3; s++) {
            const float lx = step(x, s), ly = step(y, s), lz = step(z, s);
            T_CHECK(lx == lz, "%s hooked, step %d: %.9g vs %.9g", presets[a], s, lx, lz);
            differs |= ly != lz;
        }
        T_CHECK(differs, "%s: FP32 layer saves gave the BF16 saves' losses", presets[a]);
        fp8t_model_destroy(x), fp8t_model_destroy(y), fp8t_model_destroy(z);

        x = make(presets[a], FP8T_PREC_BF16, 0);
        y = make(presets[a], FP8T_PREC_BF16, 0);
        T_ASSERT(x && y, "models");
        step(x, 1), step(y, 1);
        fp8t_model_set_hook(x, write_hook, NULL);
        fp8t_model_set_hook(x, NULL, NULL);
        set_prec(x, FP8T_PREC_DELAYED);
        set_prec(y, FP8T_PREC_CURRENT); /* y passes through another plan on the way */
        set_prec(y, FP8T_PREC_DELAYED);
        for (int s = 2; s <= 4; s++) {
            const float l1 = step(x, s), l2 = step(y, s);
            T_CHECK(l1 == l2, "%s cleared, step %d: %.9g vs %.9g", presets[a], s, l1, l2);
        }
        fp8t_model_destroy(x), fp8t_model_destroy(y);
    }
}

int main(void) {
    t_suite = "linear_plan";
    char err[256];
    cpu = fp8t_backend_create("cpu", NULL, err, sizeof err);
    if (!cpu) {
        printf("FAIL linear_plan: cpu backend: %s\n", err);
        return 1;
    }
    T_RUN(decides_per_precision);
    T_RUN(decides_per_hook);
    T_RUN(switches);
    T_RUN(current_after_every_change);
    T_RUN(follows_the_plan);
    fp8t_backend_destroy(cpu);
    T_MAIN_END();
}
