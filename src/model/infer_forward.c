/* The inference model's forward: prefill (N = nb x T rows, the cache written), decode (nb
 * rows, one token per sequence at its own position), and the full-window forward.
 *
 * GPT-2 block:  x += proj(attn(qkv(LN1(x)))); x += fc2(gelu(fc1(LN2(x))))
 * Llama block:  x += proj(attn_rope(qkv(RMS1(x)))); x += down(silu(gate(h)) * up(h)), h = RMS2(x)
 * Every buffer is one layer's: the layers run one after another over the same x. Only the
 * rows whose next token is asked for go through the final norm and the head. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/infer_internal.h"

void infer_linear(fp8t_infer *m, const inf_linear *L, float *Y, const float *X, int N) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    switch (L->kind) {
    case INF_LIN_F32:
        ops->gemm_f32(be, Y, X, L->w32, N, L->out, L->in, 0, 1, 0);
        if (L->bias) ops->bias_add(be, Y, L->bias, N, L->out);
        return;
    case INF_LIN_BF16: {
        ops->to_bf16(be, (uint16_t *)m->opbuf, NULL, X, N, L->in);
        const fp8t_bf16_operand a = {(const uint16_t *)m->opbuf, N, L->in};
        const fp8t_bf16_operand w = {L->w16, L->out, L->in};
        ops->gemm_bf16_rounded(be, Y, &a, &w, N, L->out, L->in, 0, 1, 0, L->bias, 0);
        return;
    }
    case INF_LIN_FP8: {
        float *sc = L->sc;
        if (m->act == FP8T_ACT_SCALE_CURRENT) { /* this input's own amax, every call */
            ops->zero(be, sc + INF_SC_AMAX, sizeof(float));
            ops->amax(be, sc + INF_SC_AMAX, X, (size_t)N * L->in);
            ops->compute_scale(be, sc + INF_SC_X, sc + INF_SC_X_INV, sc + INF_SC_AMAX,
                               fp8_format_max(FP8_E4M3), 0.0f, 0);
        }
        ops->quantize(be, (uint8_t *)m->opbuf, NULL, NULL, X, N, L->in, FP8_E4M3, sc + INF_SC_X);
        /* Y = X·Wᵀ: X [N, in] and W [out, in] are both stored K-major, the layout a TN FP8
         * GEMM reads, so no transposed copies are needed */
        const fp8t_fp8_operand a = {(const uint8_t *)m->opbuf, NULL, sc + INF_SC_X_INV,
                                    FP8_E4M3, N, L->in, FP8T_SCALING_TENSOR};
        const fp8t_fp8_operand w = {L->w8, NULL, sc + INF_SC_W_INV, FP8_E4M3, L->out, L->in,
                                    FP8T_SCALING_TENSOR};
        ops->gemm_fp8(be, Y, &a, &w, N, L->out, L->in, 0, 1, 0, 1, NULL, L->bias);
        return;
    }
    }
}

/* the attention shape of nb sequences of T tokens */
static fp8t_attn_shape attn_shape(const fp8t_infer *m, int nb, int T) {
    fp8t_attn_shape s;
    memset(&s, 0, sizeof(s));
    s.B = nb;
    s.T = T;
    s.NH = m->NH;
    s.NKV = m->NKV;
    s.HS = m->HS;
    if (m->cfg.arch == FP8T_ARCH_LLAMA) {
        s.rope_theta = m->cfg.rope_theta;
        s.rope_scaling = m->cfg.rope_scaling;
    }
    return s;
}

typedef enum { ATT_FULL = 0, ATT_PREFILL = 1, ATT_DECODE = 2 } att_mode;

static void norm(fp8t_infer *m, float *out, const float *x, const float *w, const float *b,
                 int N) {
    if (m->cfg.arch == FP8T_ARCH_GPT2)
        m->ops->layernorm_forward(m->be, out, m->mean, m->rstd, x, w, b, N, m->C,
                                  m->cfg.norm_eps);
    else m->ops->rmsnorm_forward(m->be, out, m->rstd, x, w, N, m->C, m->cfg.norm_eps);
}

/* Layer l over the N rows of m->x (nb sequences of T tokens; decode: T = 1). */
static void layer_forward(fp8t_infer *m, int l, int nb, int T, att_mode mode) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    const inf_layer *y = &m->layer[l];
    const int N = nb * T;
    const size_t NC = (size_t)N * m->C, NH_ = (size_t)N * m->H;
    const fp8t_attn_shape sh = attn_shape(m, nb, T);
    const size_t kv_off = (size_t)l * m->kv_layer_elems * (m->kv_bf16 ? 2 : 4); /* bytes */
    void *kc = (char *)m->kc + kv_off, *vc = (char *)m->vc + kv_off;

    norm(m, m->ln, m->x, y->ln1_w, y->ln1_b, N);
    infer_linear(m, &y->qkv, m->qkv, m->ln, N);
    if (mode == ATT_DECODE) {
        ops->attention_decode(be, m->atty, kc, vc, m->kv_bf16, m->qkv, m->pos, &sh, m->Tmax);
    } else {
        ops->attention_forward(be, m->atty, m->lse, NULL, m->qkv, &sh);
        if (mode == ATT_PREFILL) ops->kv_cache_write(be, kc, vc, m->kv_bf16, m->qkv, &sh, m->Tmax);
    }
    infer_linear(m, &y->proj, m->out, m->atty, N);
    ops->add(be, m->x, m->x, m->out, NC);
    norm(m, m->ln, m->x, y->ln2_w, y->ln2_b, N);
    if (m->cfg.arch == FP8T_ARCH_GPT2) {
        infer_linear(m, &y->fc1, m->h1, m->ln, N);
        ops->gelu_forward(be, m->h2, m->h1, NH_);
        infer_linear(m, &y->fc2, m->out, m->h2, N);
    } else {
        infer_linear(m, &y->gate, m->h1, m->ln, N);
        infer_linear(m, &y->up, m->h2, m->ln, N);
        ops->swiglu_forward(be, m->h3, m->h1, m->h2, NH_);
        infer_linear(m, &y->down, m->out, m->h3, N);
    }
    ops->add(be, m->x, m->x, m->out, NC);
}

/* x [nb*T, C] = the embedding of m->tokens at positions t = i % T, or (decode: T = 1, pos
 * the host copy of m->pos) each row at its own position */
static void embed(fp8t_infer *m, int nb, int T, const int *pos) {
    const fp8t_backend_ops *ops = m->ops;
    if (!m->wte) {
        ops->embedding_forward_bf16(m->be, m->x, m->tokens, m->emb.w16, fp8t_bf16_pad(m->C),
                                    m->wpe, pos ? m->pos : NULL, nb, T, m->C);
        return;
    }
    ops->embedding_forward(m->be, m->x, m->tokens, m->wte, pos ? NULL : m->wpe, nb, T, m->C);
    if (pos && m->wpe) /* fp32: wte[tok] + wpe[pos] row by row, embedding_forward's sum */
        for (int b = 0; b < nb; b++)
            ops->accumulate(m->be, m->x + (size_t)b * m->C, m->wpe + (size_t)pos[b] * m->C,
                            (size_t)m->C);
}

static int check_tokens(const fp8t_infer *m, const int *tok, size_t n, char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= m->V) {
            snprintf(err, errlen, "token %d (index %zu) is outside the vocabulary [0, %d)",
                     tok[i], i, m->V);
            return -1;
        }
    return 0;
}

/* The layers over nb x T tokens (host) already embedded into m->x. */
static void blocks(fp8t_infer *m, int nb, int T, att_mode mode) {
    for (int l = 0; l < m->cfg.n_layer; l++) layer_forward(m, l, nb, T, mode);
}

/* logits [nb, V] (host) of the rows in m->last; logits NULL: computed, not copied (the
 * device is waited for) */
static void head(fp8t_infer *m, int nb, float *logits) {
    norm(m, m->lnl, m->last, m->lnf_w, m->lnf_b, nb);
    infer_linear(m, &m->head, m->logits, m->lnl, nb);
    if (logits) m->ops->to_host(m->be, logits, m->logits, (size_t)nb * m->V * sizeof(float));
    else m->ops->synchronize(m->be);
}

int fp8t_infer_prefill(fp8t_infer *m, const int *tokens, int nb, int T, const int *lens,
                       float *logits, char *err, size_t errlen) {
    if (nb < 1 || nb > m->B || T < 1 || T > m->Tmax) {
        snprintf(err, errlen, "prefill: %d sequences of %d tokens for a model built for %d of "
                 "at most %d", nb, T, m->B, m->Tmax);
        return -1;
    }
    for (int b = 0; b < nb; b++)
        if (lens[b] < 1 || lens[b] > T) {
            snprintf(err, errlen, "prefill: sequence %d has %d tokens (1..%d)", b, lens[b], T);
            return -1;
        }
    const size_t N = (size_t)nb * T;
    if (check_tokens(m, tokens, N, err, errlen)) return -1;
    const fp8t_backend_ops *ops = m->ops;
    ops->to_device(m->be, m->tokens, tokens, N * sizeof(int));
    embed(m, nb, T, NULL);
    blocks(m, nb, T, ATT_PREFILL);
    const size_t rowb = (size_t)m->C * sizeof(float);
    for (int b = 0; b < nb; b++) /* each prompt's last token */
        ops->copy(m->be, m->last + (size_t)b * m->C,
                  m->x + ((size_t)b * T + (size_t)lens[b] - 1) * m->C, rowb);
    head(m, nb, logits);
    return 0;
}

int fp8t_infer_decode(fp8t_infer *m, const int *tok, const int *pos, int nb, float *logits,
                      char *err, size_t errlen) {
    if (nb < 1 || nb > m->B) {
        snprintf(err, errlen, "decode: %d sequences for a model built for %d", nb, m->B);
        return -1;
    }
    for (int b = 0; b < nb; b++)
        if (pos[b] < 0 || pos[b] >= m->Tmax) {
            snprintf(err, errlen, "decode: sequence %d at position %d: the cache holds %d "
                     "positions", b, pos[b], m->Tmax);
            return -1;
        }
    if (check_tokens(m, tok, (size_t)nb, err, errlen)) return -1;
    const fp8t_backend_ops *ops = m->ops;
    ops->to_device(m->be, m->tokens, tok, (size_t)nb * sizeof(int));
    ops->to_device(m->be, m->pos, pos, (size_t)nb * sizeof(int));
    embed(m, nb, 1, pos);
    blocks(m, nb, 1, ATT_DECODE);
    ops->copy(m->be, m->last, m->x, (size_t)nb * m->C * sizeof(float));
    head(m, nb, logits);
    return 0;
}

/* The full-window forward of tokens [nb, T] (host): the logits of every position into
 * m->all_logits [nb * T, V] (grown on first use, with losses and targets). 0 ok; -1 with err. */
static int forward_logits(fp8t_infer *m, const int *tokens, int nb, int T, char *err,
                          size_t errlen) {
    if (nb < 1 || nb > m->B || T < 1 || T > m->Tmax) {
        snprintf(err, errlen, "forward: %d sequences of %d tokens for a model built for %d of "
                 "at most %d", nb, T, m->B, m->Tmax);
        return -1;
    }
    const size_t N = (size_t)nb * T;
    if (check_tokens(m, tokens, N, err, errlen)) return -1;
    const fp8t_backend_ops *ops = m->ops;
    if (m->all_logits_rows < N) {
        ops->free(m->be, m->all_logits);
        ops->free(m->be, m->losses);
        ops->free(m->be, m->targets);
        m->all_logits = ops->malloc(m->be, N * m->V * sizeof(float));
        m->losses = ops->malloc(m->be, (N + 1) * sizeof(float));
        m->targets = ops->malloc(m->be, N * sizeof(int));
        m->all_logits_rows = N;
    }
    ops->to_device(m->be, m->tokens, tokens, N * sizeof(int));
    embed(m, nb, T, NULL);
    blocks(m, nb, T, ATT_FULL);
    norm(m, m->ln, m->x, m->lnf_w, m->lnf_b, (int)N);
    infer_linear(m, &m->head, m->all_logits, m->ln, (int)N);
    return 0;
}

int fp8t_infer_forward_all(fp8t_infer *m, const int *tokens, int nb, int T, float *logits,
                           char *err, size_t errlen) {
    if (forward_logits(m, tokens, nb, T, err, errlen)) return -1;
    m->ops->to_host(m->be, logits, m->all_logits, (size_t)nb * T * m->V * sizeof(float));
    return 0;
}

double fp8t_infer_loss(fp8t_infer *m, const int *tokens, const int *targets, int nb, int T,
                       char *err, size_t errlen) {
    const size_t N = (size_t)nb * T;
    if (forward_logits(m, tokens, nb, T, err, errlen)) return NAN;
    int count = 0;
    for (size_t i = 0; i < N; i++) {
        if (targets[i] >= m->V) {
            snprintf(err, errlen, "target %d (index %zu) is outside the vocabulary [0, %d)",
                     targets[i], i, m->V);
            return NAN;
        }
        count += targets[i] >= 0;
    }
    const fp8t_backend_ops *ops = m->ops;
    ops->to_device(m->be, m->targets, targets, N * sizeof(int));
    ops->softmax_xent(m->be, m->losses, NULL, m->all_logits, m->targets, (int)N, m->V, 0.0f);
    ops->zero(m->be, m->losses + N, sizeof(float));
    ops->sum(m->be, m->losses + N, m->losses, N);
    float sum = 0.0f;
    ops->to_host(m->be, &sum, m->losses + N, sizeof(float));
    return count > 0 ? (double)sum / count : 0.0;
}
