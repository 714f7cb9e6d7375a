/* The forward pass, llm.c style: embedding, L blocks, final norm, LM head (tied to wte or its
 * own lm_head.w), loss. Attention may group its K/V heads (layer_view's attn shape).
 *
 * GPT-2 block:  ln1 = LN(x); qkv = ln1·Wqkvᵀ+b; atty = attn(qkv); x2 = x + atty·Wprojᵀ+b;
 *               ln2 = LN(x2); fch = ln2·Wfc1ᵀ+b; x3 = x2 + gelu(fch)·Wfc2ᵀ+b
 * Llama block:  ln1 = RMS(x); qkv = ln1·Wqkvᵀ(+b); atty = attn_rope(qkv); x2 = x + atty·Wprojᵀ;
 *               ln2 = RMS(x2); x3 = x2 + (silu(ln2·Wgateᵀ) * ln2·Wupᵀ)·Wdownᵀ
 * Every matrix product is a linear layer (linear.c), so the precision policy, the amax
 * tracking and the debug hooks see all of them, the head included.
 * ln1, ln2 and fch_act (v.ln1, ...) are per-layer buffers only where a Wgrad will read them in
 * FP32; elsewhere they share one layer's scratch, and the Wgrad reads the FP8 codes of them
 * its linear's Fprop saved (the plan's save_x). qkv, atty, fch (gate), up, res2 and res3 are
 * written to their layer's FP32 copy, or to one layer's scratch and a BF16 copy (or nothing,
 * qkv where the backend keeps its own attention state): the copy written by the pass that
 * makes or reads the values anyway (fc2's GELU pass, SwiGLU, the residual adds), else by
 * model_save_store (qkv, atty). */
#include <math.h>
#include <string.h>

#include "model/model_internal.h"

/* Layer l's attention state for its backward, in a training forward (a frozen one keeps
 * nothing: no backward follows it); allocated on first use. NULL when the backend keeps
 * nothing. */
static void *model_attn_saved(fp8t_model *m, int l) {
    if (m->frozen || m->no_attn_save) return NULL;
    const fp8t_model_config *c = &m->cfg;
    layer_view v;
    model_layer_view(&v, m, l);
    size_t bytes = m->ops->attention_saved_bytes(m->be, &v.attn);
    if (!bytes) return NULL;
    if (!m->attn_saved) {
        m->attn_saved = calloc((size_t)c->n_layer, sizeof(void *));
        FP8T_CHECK(m->attn_saved, "out of host memory");
    }
    if (!m->attn_saved[l]) m->attn_saved[l] = model_act_malloc(m, bytes);
    return m->attn_saved[l];
}

/* Layer l of GPT-2. pend_a: NULL, or the previous layer left its residual add to this layer's
 * first norm: res_in = pend_a + out_c is written by that norm's pass (make_operand's
 * ADD_LAYERNORM step where it is fused). Returns 1 when this layer leaves its own final add to
 * the next layer the same way (res3 is then not written yet), 0 when it wrote res3. */
static int gpt2_block_forward(fp8t_model *m, int l, float *res_in, const float *pend_a) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    const fp8t_model_config *c = &m->cfg;
    const layer_tensors *p = &m->p.layer[l];
    float *out_c = m->a.out_c; /* [N, C] */
    layer_view v;
    model_layer_view(&v, m, l);
    const int N = v.N, C = v.C, H = v.H, lin0 = v.lin0;

    /* the norms write their output straight as qkv's / fc1's operand where they can; the
     * residual adds (the norms' or add_bias) write the residual stream's BF16 saves too */
    const ln_input ln1 = {v.ln1_mean,
                          v.ln1_rstd,
                          p->ln1_w,
                          p->ln1_b,
                          c->norm_eps,
                          pend_a,
                          pend_a ? out_c : NULL,
                          pend_a ? model_save_bf16(m, l - 1, SV_RES3) : NULL,
                          0};
    linear_forward_ln(m, lin0 + 0, v.qkv, v.ln1, &ln1, res_in, p->qkv_w, p->qkv_b, N, C, 3 * C);
    model_save_store(m, l, SV_QKV, NULL);
    ops->attention_forward(be, v.atty, v.lse, model_attn_saved(m, l), v.qkv, &v.attn);
    model_save_store(m, l, SV_ATTY, NULL);
    /* proj and fc2 may leave their bias to the residual add (add_bias) */
    const int proj_defer = linear_residual_takes_bias(m, lin0 + 1);
    linear_forward(m, lin0 + 1, out_c, v.atty, p->proj_w, proj_defer ? NULL : p->proj_b, N, C, C);
    /* the residual add: by ln2's pass (below) unless the bias goes in with it */
    uint16_t *res2_16 = model_save_bf16(m, l, SV_RES2), *res3_16 = model_save_bf16(m, l, SV_RES3);
    if (proj_defer) ops->add_bias(be, v.res2, res2_16, res_in, out_c, p->proj_b, N, C);
    const ln_input ln2 = {v.ln2_mean,
                          v.ln2_rstd,
                          p->ln2_w,
                          p->ln2_b,
                          c->norm_eps,
                          proj_defer ? NULL : res_in,
                          proj_defer ? NULL : out_c,
                          proj_defer ? NULL : res2_16,
                          0};
    /* fc2 of gelu(fch): its rounding pass applies GELU where it can (no FP32 fch_act), and
     * with FP8 fc1 and fc2 fc1's bias too (fch then stays without it; the backward adds it) */
    const int defer = linear_gelu_takes_bias(m, lin0 + 2);
    m->gelu_bias_deferred[l] = defer;
    linear_forward_ln(m, lin0 + 2, v.fch, v.ln2, &ln2, v.res2, p->fc1_w, defer ? NULL : p->fc1_b,
                      N, C, H);
    const int fc2_defer = linear_residual_takes_bias(m, lin0 + 3);
    /* fch's BF16 save (where the layer keeps one) from GELU's read of fch, not a bf16_pack pass
     * of its own; it holds GELU's whole input, fc1's bias included (the same bits as without
     * the deferral: bias_add's sum, then the rounding) */
    linear_forward_gelu(m, lin0 + 3, out_c, v.fch_act, v.fch, defer ? p->fc1_b : NULL,
                        model_save_bf16(m, l, SV_FCH), p->fc2_w, fc2_defer ? NULL : p->fc2_b, N,
                        H, C);
    if (fc2_defer) {
        ops->add_bias(be, v.res3, res3_16, v.res2, out_c, p->fc2_b, N, C);
        return 0;
    }
    /* the next layer's ln1 adds (and writes res3's copy) */
    if (l + 1 < c->n_layer && !m->no_ln_fusion) return 1;
    ops->add_bias(be, v.res3, res3_16, v.res2, out_c, NULL, N, C);
    return 0;
}

/* Layer l of Llama; pend_a and the return value as gpt2_block_forward's (ADD_RMSNORM). */
static int llama_block_forward(fp8t_model *m, int l, float *res_in, const float *pend_a) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    const fp8t_model_config *c = &m->cfg;
    const layer_tensors *p = &m->p.layer[l];
    float *out_c = m->a.out_c; /* [N, C] */
    layer_view v;
    model_layer_view(&v, m, l);
    const int N = v.N, C = v.C, H = v.H, lin0 = v.lin0;
    float *gate = v.fch; /* [N, H] */

    /* the norms write their output straight as qkv's / gate's (and so up's) operand where
     * they can (linear_forward_ln); ln2's pass does the residual add before it and writes
     * res2 and its BF16 save */
    const ln_input ln1 = {.rstd = v.ln1_rstd,
                          .w = p->ln1_w,
                          .eps = c->norm_eps,
                          .res_a = pend_a,
                          .res_c = pend_a ? out_c : NULL,
                          .sum16 = pend_a ? model_save_bf16(m, l - 1, SV_RES3) : NULL,
                          .rms = 1};
    /* q|k|v rows of (NH + 2 NKV) heads; qkv_b is NULL unless qkv_bias (Qwen2) */
    linear_forward_ln(m, lin0 + 0, v.qkv, v.ln1, &ln1, res_in, p->qkv_w, p->qkv_b, N, C, v.QKV);
    model_save_store(m, l, SV_QKV, NULL);
    ops->attention_forward(be, v.atty, v.lse, model_attn_saved(m, l), v.qkv, &v.attn);
    model_save_store(m, l, SV_ATTY, NULL);
    linear_forward(m, lin0 + 1, out_c, v.atty, p->proj_w, NULL, N, C, C);
    const ln_input ln2 = {.rstd = v.ln2_rstd,
                          .w = p->ln2_w,
                          .eps = c->norm_eps,
                          .res_a = res_in,
                          .res_c = out_c,
                          .sum16 = model_save_bf16(m, l, SV_RES2),
                          .rms = 1};
    linear_forward_ln(m, lin0 + 2, gate, v.ln2, &ln2, v.res2, p->gate_w, NULL, N, C, H);
    /* up's input is gate's: it takes the operand gate's pass made (x_shared) */
    linear_forward(m, lin0 + 3, v.up, v.ln2, p->up_w, NULL, N, C, H);
    /* down of SwiGLU(gate, up): its rounding pass applies SwiGLU where it can (no FP32
     * fch_act); the BF16 saves of gate and up (where the layer keeps them) come from SwiGLU's
     * read of them either way, not a bf16_pack pass of their own */
    linear_forward_swiglu(m, lin0 + 4, out_c, v.fch_act, gate, v.up,
                          model_save_bf16(m, l, SV_FCH), model_save_bf16(m, l, SV_UP), p->down_w,
                          N, H, C);
    /* the next layer's ln1 adds (and writes res3's copy) */
    if (l + 1 < c->n_layer && !m->no_ln_fusion) return 1;
    ops->add_bias(be, v.res3, model_save_bf16(m, l, SV_RES3), v.res2, out_c, NULL, N, C);
    return 0;
}

/* Tokens must index the vocabulary; targets too, or be negative (ignored). */
static int check_inputs(const fp8t_model *m, const int *tokens, const int *targets) {
    const int N = m->B * m->T, V = m->cfg.vocab_size;
    if (!tokens) {
        fp8t_warnf("fp8t_model_forward: tokens is NULL");
        return -1;
    }
    for (int i = 0; i < N; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) {
            fp8t_warnf("fp8t_model_forward: token %d at position %d is outside the vocabulary "
                       "[0, %d); check the data's tokenizer against the model's vocab_size",
                       tokens[i], i, V);
            return -1;
        }
        if (targets && targets[i] >= V) {
            fp8t_warnf("fp8t_model_forward: target %d at position %d is outside the vocabulary "
                       "[0, %d) (negative targets are ignored)",
                       targets[i], i, V);
            return -1;
        }
    }
    return 0;
}

const float *model_final_residual(const fp8t_model *m) {
    return m->cfg.n_layer > 0 ? model_save_fwd(m, m->cfg.n_layer - 1, SV_RES3) : m->a.encoded;
}

int model_restore_logits(fp8t_model *m) {
    if (!m->xent_fused && !m->logits_missing) return 0;
    if (m->xent_epoch != m->epoch) return -1;
    const int N = m->B * m->T, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    /* the head, as in the forward: logits[N, V] = lnf[N, C] · Wᵀ (W = wte when tied) */
    linear_forward_replay(m, m->n_lin - 1, model_logits_buf(m), m->a.lnf, model_head_w(&m->p),
                          NULL, N, C, V);
    m->xent_fused = m->xent_bf16 = m->xent_f32 = 0;
    m->logits_missing = 0;
    return 0;
}

float fp8t_model_forward(fp8t_model *m, const int *tokens, const int *targets) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    const fp8t_model_config *c = &m->cfg;
    const int B = m->B, T = m->T, N = B * T, C = c->n_embd, V = c->vocab_size;
    activations *a = &m->a;
    m->have_targets = 0;
    m->xent_fused = m->xent_bf16 = m->xent_f32 = 0; /* a->logits is about to be rewritten */
    m->hc_grad = m->hc_pending = 0;
    m->last_forward_frozen = m->frozen;
    if (check_inputs(m, tokens, targets) != 0) return NAN;
    m->logits_missing = 1;         /* until the head writes them */
    m->xent_epoch = m->epoch - 1u; /* and nothing to rebuild them from before the final norm */
    /* which linears keep X's FP8 codes for their Wgrad, and where each X lives */
    model_forward_saves(m);

    ops->to_device(be, m->tokens, tokens, (size_t)N * sizeof(int));
    ops->embedding_forward(be, a->encoded, m->tokens, m->p.wte,
                           c->arch == FP8T_ARCH_GPT2 ? m->p.wpe : NULL, B, T, C);
    int pending = 0; /* the previous layer left its final residual add to this one */
    for (int l = 0; l < c->n_layer; l++) {
        float *res_in = l == 0 ? a->encoded : model_save_fwd(m, l - 1, SV_RES3);
        const float *pend_a = pending ? model_save_fwd(m, l - 1, SV_RES2) : NULL;
        pending = c->arch == FP8T_ARCH_GPT2 ? gpt2_block_forward(m, l, res_in, pend_a)
                                            : llama_block_forward(m, l, res_in, pend_a);
    }
    const float *res = model_final_residual(m);
    if (c->arch == FP8T_ARCH_GPT2)
        ops->layernorm_forward(be, a->lnf, a->lnf_mean, a->lnf_rstd, res, m->p.lnf_w, m->p.lnf_b,
                               N, C, c->norm_eps);
    else
        ops->rmsnorm_forward(be, a->lnf, a->lnf_rstd, res, m->p.lnf_w, N, C, c->norm_eps);
    /* A training forward computes the loss and, in the same pass, the gradient the backward
     * will want: (softmax - onehot) * dloss / count, with the dloss of the previous backward
     * (the exact float the plain backward would pass, so the bits are the same).
     * Not before a first backward (dloss unknown; models that only evaluate keep reading-only
     * passes), not frozen (no backward may follow), not with a hook that may write (a fault
     * at the head's output site would not be in a replay of the head GEMM, which must
     * reproduce the logits exactly). A read-only hook (fp8t_model_set_observer) sees the FP32
     * logits at that site before this pass overwrites them, and their gradient at the
     * backward's, as on the plain path.
     * When the head's GEMMs all take BF16 operands, the gradient is written straight as the
     * BF16 operand its Dgrad and Wgrad read (softmax_xent_bf16), and the logits rows are
     * padded to pad(V) floats so that the GEMM writes aligned rows (not with a writing hook);
     * a read-only hook is shown those strided rows, and the pass writes the FP32 gradient over
     * them for the backward's dY sites. Otherwise it overwrites the FP32 logits in place.
     * Where the head's three GEMMs take BF16 operands, no hook is set and the model chunks
     * its head (model_head_plan), a forward with targets, frozen or not, runs the head in
     * chunks of rows instead (head.c) and holds no [N, V] buffer: the losses, and in a
     * training forward after the first backward the head's whole gradient for the backward
     * (before it, the backward runs the chunks). */
    const int head = m->n_lin - 1, Vp = fp8t_bf16_pad(V);
    const int chunked = targets && model_head_chunked(m);
    const int fuse = targets && !m->frozen && (!m->hook || m->hook_reads) && !m->no_fused_xent &&
                     m->xent_dloss_known && !chunked;
    const int fuse_bf16 = fuse && !m->no_bf16_xent && linear_bf16_dy_fusable(m, head);
    /* the head: logits[N, V] = lnf[N, C] · Wᵀ, W = wte (tied) or lm_head.w (untied) */
    const float *head_w = model_head_w(&m->p);
    float *logits = chunked ? NULL : model_logits_buf(m);
    if (fuse_bf16)
        linear_forward_ld(m, head, logits, Vp, a->lnf, head_w, N, C, V);
    else if (!chunked)
        linear_forward(m, head, logits, a->lnf, head_w, NULL, N, C, V);
    m->logits_missing = chunked;
    if (!targets) return 0.0f;

    int count = 0;
    for (int i = 0; i < N; i++) count += targets[i] >= 0;
    ops->to_device(be, m->targets, targets, (size_t)N * sizeof(int));
    m->n_valid_targets = count;
    float d = count > 0 ? m->xent_dloss / (float)count : 0.0f;
    if (chunked) {
        model_head_forward(m);
    } else if (fuse_bf16) {
        uint16_t *dh = model_scratch(m, &m->h16[0], fp8t_bf16_bytes(N, V));
        ops->zero(be, m->scalars + 2, sizeof(float));
        /* a read-only hook sees the FP32 gradient at the head's dY sites: written over the
         * logits (their rows already shown), the same bits as the unfused path's */
        ops->softmax_xent_bf16(be, a->losses, dh, m->scalars + 2, m->hook ? a->logits : NULL,
                               a->logits, Vp, m->targets, N, V, d);
    } else if (fuse) {
        ops->softmax_xent(be, a->losses, a->logits, a->logits, m->targets, N, V, d);
    } else {
        ops->softmax_xent(be, a->losses, NULL, a->logits, m->targets, N, V, 0.0f);
    }
    m->xent_fused = fuse;
    m->xent_bf16 = fuse_bf16;
    m->xent_f32 = fuse_bf16 && m->hook;
    m->xent_epoch = m->epoch;
    ops->zero(be, m->scalars, sizeof(float));
    ops->sum(be, m->scalars, a->losses, (size_t)N);
    float loss_sum = 0.0f;
    ops->to_host(be, &loss_sum, m->scalars, sizeof(float));
    m->have_targets = !m->frozen; /* a frozen forward recorded no amax: no backward from it */
    return count > 0 ? loss_sum / (float)count : 0.0f;
}
