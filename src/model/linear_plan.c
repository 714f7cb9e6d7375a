/* The plan of each linear layer: what its GEMMs fuse into their operands, where its bias goes
 * and what its forward keeps for the backward, decided once from what fixes it (the resolved
 * precisions, the hook, the model's switches, the backend's flags, the shapes) whenever one of
 * those changes (model_plan: create, set_policy, set_hook / set_observer). linear.c,
 * forward.c and head.c read the plan; none of them decides per call.
 *
 * Two facts stay per call because they are facts of the last forward, not decisions: which X
 * it kept (x_codes.saved, in the precision x_codes.prec), and whether it ran frozen (the plan's
 * forward entries come in a training and a frozen variant). */
#include "model/model_internal.h"

/* IN and OUT of linear lin */
void model_lin_shape(const fp8t_model *m, int lin, int *in, int *out) {
    const fp8t_model_config *c = &m->cfg;
    const int C = c->n_embd, H = c->mlp_hidden;
    switch (model_lin_module(m, lin)) {
    case FP8T_MOD_QKV: *in = C, *out = fp8t_model_qkv_dim(c); break;
    case FP8T_MOD_PROJ: *in = C, *out = C; break;
    case FP8T_MOD_FC1:
    case FP8T_MOD_GATE:
    case FP8T_MOD_UP: *in = C, *out = H; break;
    case FP8T_MOD_FC2:
    case FP8T_MOD_DOWN: *in = H, *out = C; break;
    default: *in = C, *out = c->vocab_size; break; /* the head */
    }
}

/* FP8 tensor-core GEMMs want every dimension a multiple of 16 (a K that is not one of 128, as
 * GPT-2 1.5B's 1600, ends in a partial block, as in the emulation) */
int model_lin_dims_16(const fp8t_model *m, int lin) {
    int in, out;
    model_lin_shape(m, lin, &in, &out);
    return (m->B * m->T) % 16 == 0 && in % 16 == 0 && out % 16 == 0;
}

int model_scaled_path(const fp8t_model *m, int lin, fp8t_precision p) {
    if (p == FP8T_PREC_ROWWISE) return 1;
    if (p != FP8T_PREC_BLOCK) return 0;
    return (m->be->fp8_block_native && model_lin_dims_16(m, lin)) || m->policy.pow2_scales;
}

/* Whether GEMMs of precision p hand their prepared operand to another GEMM of the linear
 * (X: Fprop -> Wgrad, dY: Dgrad -> Wgrad): FP8 codes, BF16 operands, scaled operands */
static int shares(const fp8t_model *m, int lin, fp8t_precision p) {
    return model_prec_shares_operands(m, p) || model_scaled_path(m, lin, p);
}

/* Whether a read-only hook keeps the GELU pass of a GEMM of precision p (fc2's Fprop, fc1's
 * Dgrad): where the pass also writes GELU's output (its gradient) in FP32, the tensor the hook
 * is shown (make_operand's values: the per-tensor FP8 kernels); elsewhere it takes the unfused
 * ops, whose FP32 output it reads. */
static int observer_keeps_gelu(const fp8t_model *m, fp8t_precision p) {
    return m->hook_reads && p == FP8T_PREC_DELAYED;
}

/* The Fprop can make its operand from the producer's input itself (GELU, SwiGLU or the norm in
 * the rounding pass, in the precisions the cases below name), no hook wants the
 * producer's output in FP32 (but a read-only hook of GELU's where the pass writes it too), and,
 * in a training forward, no Wgrad reads it in FP32 later (the forward keeps the operand for the
 * Wgrad); a frozen forward has no backward. */
static void plan_step(const fp8t_model *m, int lin, linear_plan *pl) {
    const fp8t_precision f = m->prec[lin][FP8T_GEMM_FPROP];
    int can = 0;
    switch (model_lin_module(m, lin)) {
    case FP8T_MOD_FC2: /* GELU: one pass with the scale known before it, or the scaled path */
        can = !m->no_gelu_fusion && (model_prec_one_pass(m, f) || model_scaled_path(m, lin, f));
        break;
    case FP8T_MOD_DOWN: /* SwiGLU: as GELU */
        can = !m->no_swiglu_fusion && (model_prec_one_pass(m, f) || model_scaled_path(m, lin, f));
        break;
    case FP8T_MOD_QKV:
    case FP8T_MOD_FC1:  /* GPT-2's LayerNorm, Llama's RMSNorm: BF16 operands */
    case FP8T_MOD_GATE: /* ... and only where up takes gate's operand (plan_norm_gate) */
        can = !m->no_ln_fusion && model_prec_bf16_operands(m, f);
        break;
    default: break;
    }
    const int observed = model_lin_module(m, lin) == FP8T_MOD_FC2 && observer_keeps_gelu(m, f);
    can = can && (!m->hook || observed);
    pl->step_fused[1] = (unsigned char)can;
    pl->step_fused[0] = (unsigned char)(can && pl->save_x);
}

/* linear lin's plan (but fc1's bias_next, which needs fc2's: plan_gelu_bias) */
static linear_plan linear_plan_of(const fp8t_model *m, int lin) {
    const fp8t_precision *p = m->prec[lin];
    const fp8t_precision f = p[FP8T_GEMM_FPROP], d = p[FP8T_GEMM_DGRAD], w = p[FP8T_GEMM_WGRAD];
    const int hook_writes = m->hook && !m->hook_reads;
    linear_plan pl = {0};
    for (int g = 0; g < FP8T_GEMM_COUNT; g++)
        pl.scaled[g] = (unsigned char)model_scaled_path(m, lin, p[g]);
    /* X: the Wgrad takes the Fprop's operand when both round the same X (no writing hook can
     * change it in between) in the same precision, with X's format and scale */
    pl.save_x = (unsigned char)(!m->no_fp8_save && !hook_writes && f == w && shares(m, lin, f));
    plan_step(m, lin, &pl);
    /* the bias: in the GEMM where a BF16 or FP8 GEMM takes one (its epilogue on a GPU) and no
     * hook must see the output without it; else bias_add after the hook's site */
    const int gemm_bias = model_prec_shares_operands(m, f) || pl.scaled[FP8T_GEMM_FPROP];
    pl.bias_gemm_replay = (unsigned char)gemm_bias;
    pl.bias_gemm = (unsigned char)(gemm_bias && !m->hook);
    /* proj / fc2: a bias is free only in a BF16 GEMM's epilogue (cuBLASLt has no FP8 kernel
     * with an FP32 bias epilogue: gemm_fp8 adds it in a pass over the output; the other
     * precisions add it with bias_add), so elsewhere the residual add takes it. An observer
     * sees the output without the bias either way (the add comes after its site), so it keeps
     * the unhooked path's pass and bits. */
    pl.bias_residual =
        (unsigned char)(!m->no_residual_bias && !hook_writes && !model_prec_bf16_operands(m, f));
    /* dY: the Wgrad may take the Dgrad's operand (FP8 codes, BF16 or scaled operand) instead
     * of rounding dY a second time, when no hook can change dY in between and it runs in the
     * Dgrad's precision (with dY's format, and the same scale: the state's for delayed, the
     * one just computed from this dY for current) */
    pl.dy_shared = (unsigned char)(!m->no_code_reuse && !hook_writes && shares(m, lin, d));
    /* the bias gradient as column sums of dY from the Dgrad's rounding pass, unless a hook may
     * change dY before the Wgrad (bias_backward then reads it after both) */
    pl.colsum = (unsigned char)(!hook_writes && !m->no_colsum_fusion);
    /* fc1's Dgrad can apply GELU's backward in its rounding pass when that is one pass with the
     * scale known before it (BF16 operands, delayed FP8) or the scaled path, and no hook wants
     * dY in FP32 (but a read-only hook where the pass writes it too); the Wgrad must then take
     * the Dgrad's dY (model_plan_dy_shared) and the bias gradient come from the same pass
     * (linear_backward_gelu checks both) */
    pl.dgelu =
        (unsigned char)(model_lin_module(m, lin) == FP8T_MOD_FC1 && !m->no_gelu_bwd_fusion &&
                        (!m->hook || observer_keeps_gelu(m, d)) &&
                        (model_prec_one_pass(m, d) || pl.scaled[FP8T_GEMM_DGRAD]));
    /* gate's and up's Dgrads can compute their dY from SwiGLU's output gradient in their
     * rounding passes, as fc1's GELU backward, no hook wanting dY in FP32; the Wgrad must take
     * the Dgrad's dY (linear_dswiglu_fused checks it for both linears) */
    const fp8t_module mod = model_lin_module(m, lin);
    pl.dswiglu = (unsigned char)((mod == FP8T_MOD_GATE || mod == FP8T_MOD_UP) &&
                                 !m->no_swiglu_bwd_fusion && !m->hook &&
                                 (model_prec_one_pass(m, d) || pl.scaled[FP8T_GEMM_DGRAD]));
    /* all three GEMMs on BF16 operands, dY's operand shared, no writing hook: the head's dY may
     * come already rounded (softmax_xent_bf16, which also writes the FP32 gradient a read-only
     * hook is shown) and its Fprop may write a strided Y (an observer sees the strided rows) */
    pl.bf16_dy = (unsigned char)(!hook_writes && f == FP8T_PREC_BF16 && w == FP8T_PREC_BF16 &&
                                 pl.dy_shared && d == FP8T_PREC_BF16);
    /* a read-only hook is shown the head's whole-batch buffers, but its GEMMs keep the chunks
     * the unhooked model runs (model_head_chunked): the same calls, kernels and bits */
    pl.token_chunk = lin == m->n_lin - 1 && m->hook && pl.bf16_dy ? m->hc_rows : 0;
    return pl;
}

/* fc1 may leave its bias to fc2's fused GELU pass when fc1's Fprop is FP8 (whose bias costs
 * a pass of its own over the output: no FP32 bias epilogue for FP8 GEMMs; per-tensor or on
 * the scaled path) and fc2's pass knows its scale before it reads (delayed) or computes its
 * scales from what it read (the scaled path, block and rowwise) */
static void plan_gelu_bias(fp8t_model *m, int fc1) {
    const int fc2 = fc1 + 1;
    const fp8t_precision pp = m->prec[fc1][FP8T_GEMM_FPROP];
    const fp8t_precision p2 = m->prec[fc2][FP8T_GEMM_FPROP];
    const int pass_takes = p2 == FP8T_PREC_DELAYED || m->plan[fc2].scaled[FP8T_GEMM_FPROP];
    const int fp8_fc1 = model_prec_has_codes(pp) || m->plan[fc1].scaled[FP8T_GEMM_FPROP];
    for (int fr = 0; fr < 2; fr++)
        m->plan[fc1].bias_next[fr] =
            (unsigned char)(m->plan[fc2].step_fused[fr] && pass_takes && fp8_fc1);
}

/* up may take gate's X operand (both read the same X, Llama's ln2): where that operand depends
 * on X alone — BF16 operands, or the scaled path, whose scales come from the values — in the
 * same precision for both Fprops, both keeping it for their Wgrads or neither, and no hook
 * (which sees each linear's input site on its own). Per-tensor FP8 keeps a scale per linear. */
static void plan_x_share(fp8t_model *m, int up) {
    const int gate = up - 1;
    const fp8t_precision f = m->prec[up][FP8T_GEMM_FPROP];
    const int same_kind = model_prec_bf16_operands(m, f) ||
                          (model_scaled_path(m, up, f) && model_scaled_path(m, gate, f));
    m->plan[up].x_shared =
        (unsigned char)(!m->no_x_share && !m->hook && f == m->prec[gate][FP8T_GEMM_FPROP] &&
                        same_kind && m->plan[up].save_x == m->plan[gate].save_x);
    /* ln2 (gate's and up's input) is made only as gate's operand where gate's pass runs the
     * norm: up must take that operand then, having no FP32 ln2 to make its own of */
    if (!m->plan[up].x_shared) m->plan[gate].step_fused[0] = m->plan[gate].step_fused[1] = 0;
}

/* Whether layer l keeps its saves in BF16: every GEMM of its linears runs below FP32 (BF16 or
 * FP8 of any kind: each already rounds its operands at least as coarsely, so the backward
 * reading BF16 values is within the error the layer has anyway; a layer with an FP32 GEMM, as
 * the FP32 policy's or a recipe's high-precision first/last layers, stays exact), and no
 * writing hook may change the tensors (the injector's runs keep FP32 saves); an observer (the
 * inspector) leaves the numerics as they are without it. Per layer rather than per model so
 * that such a recipe loses nothing where it asked for FP32. */
static int layer_bf16_saves(const fp8t_model *m, int l) {
    if (m->no_bf16_saves || (m->hook && !m->hook_reads)) return 0;
    const int mpl = fp8t_model_modules_per_layer(&m->cfg);
    for (int lin = l * mpl; lin < (l + 1) * mpl; lin++)
        for (int g = 0; g < FP8T_GEMM_COUNT; g++)
            if (m->prec[lin][g] == FP8T_PREC_FP32) return 0;
    return 1;
}

void model_plan(fp8t_model *m) {
    for (int lin = 0; lin < m->n_lin; lin++) m->plan[lin] = linear_plan_of(m, lin);
    for (int lin = 0; lin < m->n_lin; lin++) {
        if (model_lin_module(m, lin) == FP8T_MOD_FC1) plan_gelu_bias(m, lin);
        if (model_lin_module(m, lin) == FP8T_MOD_UP) plan_x_share(m, lin);
    }
    m->x_share.valid = 0;
    for (int l = 0; l < m->cfg.n_layer; l++)
        m->layer_bf16[l] = (unsigned char)layer_bf16_saves(m, l);
}

int model_plan_reuse_dy(const fp8t_model *m, int lin, fp8t_precision wgrad) {
    return m->plan[lin].dy_shared && wgrad == m->prec[lin][FP8T_GEMM_DGRAD];
}
