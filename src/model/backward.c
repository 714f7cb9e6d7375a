/* The backward pass, the forward's mirror image. Gradients of parameters ACCUMULATE (+=) so
 * micro-batches add up; activation gradients live in one layer's worth of scratch:
 *   dres [N, C]  gradient of the residual stream, carried from block to block
 *   dc1, dc2 [N, C], dqkv [N, 3C], dh1..dh3 [N, H]  gradients inside one block
 * The layer saves a forward kept in BF16 are read as they are by the ops that take them (fc1's
 * fused GELU backward, SwiGLU's backward, the norms' backward), or widened back to FP32
 * (model_save_restore) into one layer's scratch each as the layer's backward starts. */
#include <math.h>
#include <string.h>

#include "model/model_internal.h"

/* What layer l's last training forward kept for this backward (model_attn_saved, which
 * allocates nothing under FP8T_DISABLE_ATTN_SAVE), or NULL */
static const void *model_attn_saved_for_backward(const fp8t_model *m, int l) {
    return m->attn_saved ? m->attn_saved[l] : NULL;
}

/* Layer l's input from the residual stream (l = L: the final norm's): the embedding output,
 * or layer l-1's res3, whose BF16 save the norm's backward reads as it is */
static const float *residual_in(fp8t_model *m, int l, const uint16_t **x16) {
    if (l == 0) {
        *x16 = NULL;
        return m->a.encoded;
    }
    return model_save_read(m, l - 1, SV_RES3, 1, x16);
}

/* res_in / res_in16: ln1's input, in FP32 or as the previous layer's BF16 save of res3 */
static void gpt2_block_backward(fp8t_model *m, int l, const float *res_in,
                                const uint16_t *res_in16) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    const layer_tensors *p = &m->p.layer[l], *g = &m->g.layer[l];
    activations *a = &m->a;
    layer_view v;
    model_layer_view(&v, m, l);
    const int N = v.N, C = v.C, H = v.H, lin0 = v.lin0;

    /* the saves this layer's backward reads, each in its own scratch or (fch where fc1's fused
     * GELU backward runs, res2 for the norm) as the BF16 copy itself */
    const uint16_t *fch16, *res2_16;
    const float *fch =
        model_save_read(m, l, SV_FCH, linear_dgelu_fused(m, lin0 + 2, g->fc1_b != NULL), &fch16);
    float *atty = model_save_restore(m, l, SV_ATTY);
    const float *qkv = model_save_restore(m, l, SV_QKV);
    const float *res2 = model_save_read(m, l, SV_RES2, 1, &res2_16);
    /* MLP: dres holds d(res3) = d(fc2 output) */
    linear_backward(m, lin0 + 3, a->dh1, g->fc2_w, g->fc2_b, a->dres, v.fch_act, p->fc2_w, N, H,
                    C);
    /* GELU's backward, by fc1's Dgrad rounding pass where it can (fch was kept without fc1's
     * bias when the forward deferred it, unless its BF16 copy took it: forward.c) */
    const int fch_has_bias = !m->gelu_bias_deferred[l] || m->sv_kind[l][SV_FCH] == SAVE_BF16;
    linear_backward_gelu(m, lin0 + 2, a->dc1, g->fc1_w, g->fc1_b, a->dh2, a->dh1, fch, fch16,
                         fch_has_bias ? NULL : p->fc1_b, v.ln2, p->fc1_w, N, C, H);
    /* dres becomes d(res2): the skip path plus the norm's contribution */
    ops->layernorm_backward(be, a->dres, g->ln2_w, g->ln2_b, a->dc1, res2, res2_16, p->ln2_w,
                            v.ln2_mean, v.ln2_rstd, N, C);
    /* attention */
    linear_backward(m, lin0 + 1, a->dc1, g->proj_w, g->proj_b, a->dres, atty, p->proj_w, N, C, C);
    ops->attention_backward(be, a->dqkv, a->dc1, qkv, model_attn_saved_for_backward(m, l), atty,
                            v.lse, &v.attn);
    linear_backward(m, lin0 + 0, a->dc1, g->qkv_w, g->qkv_b, a->dqkv, v.ln1, p->qkv_w, N, C,
                    3 * C);
    ops->layernorm_backward(be, a->dres, g->ln1_w, g->ln1_b, a->dc1, res_in, res_in16, p->ln1_w,
                            v.ln1_mean, v.ln1_rstd, N, C);
}

static void llama_block_backward(fp8t_model *m, int l, const float *res_in,
                                 const uint16_t *res_in16) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    const layer_tensors *p = &m->p.layer[l], *g = &m->g.layer[l];
    activations *a = &m->a;
    layer_view v;
    model_layer_view(&v, m, l);
    const int N = v.N, C = v.C, H = v.H, lin0 = v.lin0;
    /* the saves this layer's backward reads, each in its own scratch or (gate and up for
     * SwiGLU's backward, res2 for the norm) as the BF16 copy itself */
    const uint16_t *gate16, *up16, *res2_16;
    const float *gate = model_save_read(m, l, SV_FCH, 1, &gate16);
    const float *up = model_save_read(m, l, SV_UP, 1, &up16);
    float *atty = model_save_restore(m, l, SV_ATTY);
    const float *qkv = model_save_restore(m, l, SV_QKV);
    const float *res2 = model_save_read(m, l, SV_RES2, 1, &res2_16);

    /* SwiGLU MLP: dres holds d(res3) = d(down output) */
    linear_backward(m, lin0 + 4, a->dh1, g->down_w, NULL, a->dres, v.fch_act, p->down_w, N, H, C);
    /* reverse execution order: up, then gate; their Dgrads' rounding passes compute their dY
     * from dh1 and the saves where they can (no FP32 dh2 / dh3) */
    if (linear_dswiglu_fused(m, lin0 + 2)) {
        linear_backward_dswiglu(m, lin0 + 3, a->dc1, g->up_w, a->dh1, gate, gate16, up, up16,
                                v.ln2, p->up_w, N, C, H);
        linear_backward_dswiglu(m, lin0 + 2, a->dc2, g->gate_w, a->dh1, gate, gate16, up, up16,
                                v.ln2, p->gate_w, N, C, H);
    } else {
        ops->swiglu_backward(be, a->dh2, a->dh3, a->dh1, gate, up, gate16, up16, v.NH_);
        linear_backward(m, lin0 + 3, a->dc1, g->up_w, NULL, a->dh3, v.ln2, p->up_w, N, C, H);
        linear_backward(m, lin0 + 2, a->dc2, g->gate_w, NULL, a->dh2, v.ln2, p->gate_w, N, C, H);
    }
    ops->add(be, a->dc1, a->dc1, a->dc2, v.NC); /* ln2 feeds both gate and up */
    ops->rmsnorm_backward(be, a->dres, g->ln2_w, a->dc1, res2, res2_16, p->ln2_w, v.ln2_rstd, N,
                          C);
    /* attention with RoPE */
    linear_backward(m, lin0 + 1, a->dc1, g->proj_w, NULL, a->dres, atty, p->proj_w, N, C, C);
    ops->attention_backward(be, a->dqkv, a->dc1, qkv, model_attn_saved_for_backward(m, l), atty,
                            v.lse, &v.attn);
    linear_backward(m, lin0 + 0, a->dc1, g->qkv_w, g->qkv_b, a->dqkv, v.ln1, p->qkv_w, N, C,
                    v.QKV);
    ops->rmsnorm_backward(be, a->dres, g->ln1_w, a->dc1, res_in, res_in16, p->ln1_w, v.ln1_rstd,
                          N, C);
}

void fp8t_model_backward(fp8t_model *m, float dloss) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    const fp8t_model_config *c = &m->cfg;
    const int B = m->B, T = m->T, N = B * T, C = c->n_embd, V = c->vocab_size;
    const size_t NC = (size_t)N * C;
    activations *a = &m->a;
    if (model_refuse_if_frozen(m, "fp8t_model_backward")) return;
    if (!m->have_targets && m->last_forward_frozen) {
        fp8t_warnf("fp8t_model_backward: the last forward ran while the model was frozen "
                   "(no amax recorded); run a forward with targets on the unfrozen model "
                   "before the backward");
        return;
    }
    if (!m->have_targets) {
        fp8t_warnf("fp8t_model_backward: the last forward had no targets (or failed); "
                   "call fp8t_model_forward with targets before each backward");
        return;
    }
    m->have_targets = 0; /* the logits are overwritten by their gradient below */

    /* loss = mean over the valid targets, so each position's gradient is dloss / count.
     * A fused forward already wrote it with xent_dloss in place of dloss: nothing to do when
     * they agree; otherwise the logits are rebuilt (head GEMM again) for the plain pass, so the
     * gradient has the plain path's bits; only when that is impossible (the weights or scales
     * changed in between) is the fused gradient rescaled, which may round differently. */
    const int head = m->n_lin - 1;
    /* after a chunked forward the head's whole gradient, dlnf in a->dc1 (head.c) */
    const int chunked = (m->hc_grad || m->hc_pending) && model_head_backward(m, dloss);
    int bf16_dy = !chunked && m->xent_fused && m->xent_bf16;
    /* a hook set since that forward has no FP32 gradient to be shown: the plain path where the
     * logits can be rebuilt (else the head's dY sites are skipped) */
    if (bf16_dy && m->hook && !m->xent_f32 && model_restore_logits(m) == 0) bf16_dy = 0;
    if (bf16_dy && dloss != m->xent_dloss && model_restore_logits(m) == 0) bf16_dy = 0;
    if (bf16_dy) {
        /* the BF16 dlogits the forward wrote (softmax_xent_bf16) and their amax */
        const float r = dloss == m->xent_dloss ? 1.0f : dloss / m->xent_dloss;
        const fp8t_bf16_operand dy = {(const uint16_t *)m->h16[0].p, N, V};
        linear_backward_bf16_dy(m, head, a->dc1, model_head_w(&m->g), &dy, m->scalars + 2,
                                m->hook && m->xent_f32 ? a->logits : NULL, fp8t_bf16_pad(V),
                                a->lnf, model_head_w(&m->p), N, C, V, r);
        m->logits_missing = 1; /* a->logits has its rows pad(V) apart: rebuilt when read */
    } else if (m->xent_fused && dloss != m->xent_dloss && model_restore_logits(m) != 0) {
        ops->scale(be, a->logits, dloss / m->xent_dloss, (size_t)N * V);
    } else if (!m->xent_fused && !chunked) {
        float d = m->n_valid_targets > 0 ? dloss / (float)m->n_valid_targets : 0.0f;
        ops->softmax_xent(be, a->losses, a->logits, a->logits, m->targets, N, V, d);
    }
    m->xent_fused = m->xent_bf16 = m->xent_f32 = 0;
    /* the dloss to fold into the next training forward (the trainer's is the same each time) */
    if (isfinite(dloss) && dloss != 0.0f) {
        m->xent_dloss = dloss;
        m->xent_dloss_known = 1;
    }
    /* the head: dlnf = dlogits·W, dW += dlogitsᵀ·lnf (W = wte when tied: its gradient then
     * gathers the head's and the embedding's) */
    if (!bf16_dy && !chunked)
        linear_backward(m, head, a->dc1, model_head_w(&m->g), NULL, a->logits, a->lnf,
                        model_head_w(&m->p), N, C, V);
    ops->zero(be, a->dres, NC * sizeof(float));
    /* the final norm's input: the last layer's res3 (its BF16 copy read by the norm itself) */
    const uint16_t *res16;
    const float *res = residual_in(m, c->n_layer, &res16);
    if (c->arch == FP8T_ARCH_GPT2)
        ops->layernorm_backward(be, a->dres, m->g.lnf_w, m->g.lnf_b, a->dc1, res, res16,
                                m->p.lnf_w, a->lnf_mean, a->lnf_rstd, N, C);
    else
        ops->rmsnorm_backward(be, a->dres, m->g.lnf_w, a->dc1, res, res16, m->p.lnf_w,
                              a->lnf_rstd, N, C);
    /* each grads_ready: the gradients from that layer to the end of the table are final */
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, c->n_layer);
    for (int l = c->n_layer - 1; l >= 0; l--) {
        /* ln1's input: the previous layer's res3 (its scratch is free again by now) */
        const uint16_t *res_in16;
        const float *res_in = residual_in(m, l, &res_in16);
        if (c->arch == FP8T_ARCH_GPT2)
            gpt2_block_backward(m, l, res_in, res_in16);
        else
            llama_block_backward(m, l, res_in, res_in16);
        if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, l);
    }
    ops->embedding_backward(be, m->g.wte, c->arch == FP8T_ARCH_GPT2 ? m->g.wpe : NULL, a->dres,
                            m->tokens, B, T, C);
    m->grads_zero = 0;
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, -1);
}
