/* The LM head in chunks of rows: the training forward's fused BF16 cross-entropy (forward.c)
 * taken one step further, so that the [N, V] logits are never held. For each chunk of rows
 * [r0, r0 + n) of lnf:
 *
 *   logits[n, V]  = lnf[r0..] · Wᵀ              (BF16 operands, FP32 result, rows pad(V) apart)
 *   losses[r0..], dlogits[n, V] (BF16 operand)  (softmax_xent_bf16, d = dloss / count)
 *   dlnf[r0..]    = dlogits · W                 (the head's Dgrad rows, into a->dc1)
 *   dW_head      += dlogitsᵀ · lnf[r0..]        (its Wgrad, summed over the chunks in hc_dw)
 *
 * dW's sum over the tokens is grouped by chunk (FP32 summation order). Each row's logits, loss,
 * dlogits and dlnf are the unchunked fused path's where the GEMM computes a row the same
 * whatever the rows of the call (OpenBLAS on one thread with chunks a multiple of its row
 * tile); where it does not (its threads, cuBLASLt's kernels chosen by M) they differ in FP32
 * rounding too. The backward adds hc_dw to the head's gradient and continues from dlnf. The
 * buffers live in the backward's scratch past dc1, which a forward leaves free (act_tail),
 * where they fit. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model/model_internal.h"

/* each buffer placed in act_tail starts this aligned (cuBLASLt wants 16 bytes) */
#define HC_ALIGN 256

float *model_logits_buf(fp8t_model *m) {
    if (!m->a.logits) {
        const size_t N = (size_t)m->B * m->T;
        m->a.logits =
            model_act_malloc(m, N * (size_t)fp8t_bf16_pad(m->cfg.vocab_size) * sizeof(float));
    }
    return m->a.logits;
}

static size_t align_up(size_t x) { return (x + HC_ALIGN - 1) / HC_ALIGN * HC_ALIGN; }

static size_t chunk_logits_bytes(int rows, int V) {
    return align_up((size_t)rows * (size_t)fp8t_bf16_pad(V) * sizeof(float));
}

/* one chunk's FP32 logits and BF16 dlogits */
static size_t chunk_bytes(int rows, int V) {
    return chunk_logits_bytes(rows, V) + align_up(fp8t_bf16_bytes(rows, V));
}

void model_head_plan(fp8t_model *m, int opt) {
    const int N = m->B * m->T, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    m->hc_rows = 0;
    FP8T_CHECK(opt <= 0 || opt % 8 == 0, "head_chunk %d: not a multiple of 8", opt);
    /* the chunked head is the fused BF16 cross-entropy's: off with either of them */
    if (opt < 0 || m->no_fused_xent || m->no_bf16_xent) return;
    /* act_tail from its first aligned byte */
    const uintptr_t t0 = (uintptr_t)m->act_tail;
    const uintptr_t ta = (t0 + HC_ALIGN - 1) / HC_ALIGN * HC_ALIGN;
    const size_t room = m->act_tail_bytes > ta - t0 ? m->act_tail_bytes - (ta - t0) : 0;
    const size_t dw = align_up((size_t)V * (size_t)C * sizeof(float));
    int rows = opt;
    if (opt == 0) {
        /* auto: only where the whole batch's head buffers are large, in the rows that fit
         * beside hc_dw (or in all of act_tail when hc_dw does not fit there) */
        const size_t whole =
            (size_t)N * (size_t)fp8t_bf16_pad(V) * sizeof(float) + fp8t_bf16_bytes(N, V);
        if (whole <= ((size_t)FP8T_HEAD_CHUNK_AUTO_MIB << 20)) return;
        const size_t free_b = dw <= room ? room - dw : room;
        const size_t per_row = (size_t)fp8t_bf16_pad(V) * (sizeof(float) + sizeof(uint16_t));
        size_t r = free_b / per_row / 256 * 256;
        while (r >= 256 && chunk_bytes((int)r, V) > free_b) r -= 256;
        rows = r < 1024 ? 1024 : r > (size_t)N ? N : (int)r;
    }
    if (rows >= N) return; /* one chunk: the unchunked path */
    m->hc_rows = rows;
    /* hc_dw first (it is kept until the backward), then the chunk buffers */
    const size_t cb = chunk_bytes(rows, V);
    char *t = (char *)ta;
    m->hc_dw_own = dw > room;
    m->hc_chunk_own = cb > (m->hc_dw_own ? room : room - dw);
    if (!m->hc_dw_own) {
        m->hc_dw = (float *)t;
        t += dw;
    }
    if (!m->hc_chunk_own) {
        m->hc_logits = (float *)t;
        m->hc_dlogits = (uint16_t *)(t + chunk_logits_bytes(rows, V));
    }
}

void model_head_free(fp8t_model *m) {
    if (m->hc_dw_own && m->hc_dw) m->ops->free(m->be, m->hc_dw);
    if (m->hc_chunk_own && m->hc_logits) m->ops->free(m->be, m->hc_logits);
    if (m->hc_chunk_own && m->hc_dlogits) m->ops->free(m->be, m->hc_dlogits);
    if (m->a.logits) m->ops->free(m->be, m->a.logits);
}

int model_head_chunked(const fp8t_model *m) {
    return m->hc_rows > 0 && !m->hook && linear_bf16_dy_fusable(m, m->n_lin - 1);
}

int fp8t_model_head_chunk_rows(const fp8t_model *m) {
    return model_head_chunked(m) ? m->hc_rows : 0;
}

/* The buffers not in act_tail, allocated when first needed (then kept). */
static void chunk_buffers(fp8t_model *m) {
    const int C = m->cfg.n_embd, V = m->cfg.vocab_size, rows = m->hc_rows;
    if (m->hc_chunk_own && !m->hc_logits) {
        m->hc_logits =
            model_act_malloc(m, (size_t)rows * (size_t)fp8t_bf16_pad(V) * sizeof(float));
        m->hc_dlogits = model_act_malloc(m, fp8t_bf16_bytes(rows, V));
    }
    if (m->hc_dw_own && !m->hc_dw) m->hc_dw = model_act_malloc(m, (size_t)V * C * sizeof(float));
}

/* The chunk loop. record: the forward's rounding of lnf records amax(X) and amax(W) (a
 * recomputation in the backward records nothing but dY's amax); grad: the dlogits with
 * d = dloss / count, dlnf into a->dc1, dW into hc_dw and the dlogits' amax into scalars[2];
 * else the losses only (a frozen forward: no backward follows). */
static void chunk_loop(fp8t_model *m, int record, int grad, float d) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    activations *a = &m->a;
    const int head = m->n_lin - 1, N = m->B * m->T, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    const int Vp = fp8t_bf16_pad(V);
    chunk_buffers(m);
    fp8t_bf16_operand x, w;
    linear_bf16_fprop_operands(m, head, a->lnf, model_head_w(&m->p), N, C, V, record, &x, &w);
    if (grad) ops->zero(be, m->scalars + 2, sizeof(float));
    for (int r0 = 0; r0 < N; r0 += m->hc_rows) {
        const int n = N - r0 < m->hc_rows ? N - r0 : m->hc_rows;
        /* rows r0.. of lnf's operand (r0 a multiple of 8) */
        const fp8t_bf16_operand xs = fp8t_bf16_rows(&x, r0, n);
        /* Fprop: logits[n, V] = x·Wᵀ, rows pad(V) apart (the padding columns written as 0) */
        ops->gemm_bf16_rounded(be, m->hc_logits, &xs, &w, n, V, C, 0, 1, 0, NULL, Vp);
        ops->softmax_xent_bf16(be, a->losses + r0, m->hc_dlogits, grad ? m->scalars + 2 : NULL,
                               NULL, m->hc_logits, Vp, m->targets + r0, n, V, grad ? d : 0.0f);
        if (!grad) continue;
        const fp8t_bf16_operand dy = {m->hc_dlogits, n, V};
        /* Dgrad: dlnf[r0.., C] = dy·W; Wgrad: dW (= first chunk, += later ones) dyᵀ·x */
        ops->gemm_bf16_rounded(be, a->dc1 + (size_t)r0 * C, &dy, &w, n, C, V, 0, 0, 0, NULL, 0);
        ops->gemm_bf16_rounded(be, m->hc_dw, &dy, &xs, V, C, n, 1, 0, r0 > 0, NULL, 0);
    }
}

void model_head_forward(fp8t_model *m) {
    m->hc_grad = m->hc_pending = 0;
    /* the head's Wgrad runs in the chunks, from lnf's operand made for them (a backward that
     * makes them again rounds lnf again): no copy of it is kept for a later Wgrad */
    m->xq[m->n_lin - 1].saved = 0;
    if (m->frozen || !m->xent_dloss_known) {
        /* the losses only: no backward follows a frozen forward, and before a model's first
         * backward the dloss is unknown (a model that only evaluates never pays for the
         * gradient); the record of amax(X), amax(W) is the forward's either way */
        chunk_loop(m, 1, 0, 0.0f);
        m->hc_pending = !m->frozen;
        return;
    }
    const int count = m->n_valid_targets;
    chunk_loop(m, 1, 1, count > 0 ? m->xent_dloss / (float)count : 0.0f);
    m->hc_dloss = m->xent_dloss;
    m->hc_grad = 1;
}

int model_head_backward(fp8t_model *m, float dloss) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    const int head = m->n_lin - 1, N = m->B * m->T, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    const int count = m->n_valid_targets;
    const float d = count > 0 ? dloss / (float)count : 0.0f;
    if (m->hc_pending) {
        m->hc_pending = 0;
        if (!model_head_chunked(m)) {
            /* a hook or another head precision since the forward: the plain path, from the
             * logits made again */
            linear_forward_replay(m, head, model_logits_buf(m), m->a.lnf, model_head_w(&m->p),
                                  NULL, N, C, V);
            m->logits_missing = 0;
            return 0;
        }
        chunk_loop(m, 0, 1, d);
        m->hc_dloss = dloss;
        m->hc_grad = 1;
    }
    const fp8t_precision *p = m->prec[head];
    if ((p[FP8T_GEMM_DGRAD] != FP8T_PREC_BF16 || p[FP8T_GEMM_WGRAD] != FP8T_PREC_BF16) &&
        !m->warned_saved) {
        fp8t_warnf("fp8t_model_backward: the precision policy changed between the forward "
                   "and this backward; the head's Dgrad and Wgrad ran in BF16 in the "
                   "forward (the change applies from the next forward)");
        m->warned_saved = 1;
    }
    float r = 1.0f;
    if (dloss != m->hc_dloss) {
        if (m->xent_epoch == m->epoch && model_head_chunked(m)) {
            /* the same inputs: the chunks again with this dloss (the forward's amaxes stay) */
            chunk_loop(m, 0, 1, d);
            m->hc_dloss = dloss;
        } else {
            /* weights, scales, policy or hook changed: scale what was made */
            r = dloss / m->hc_dloss;
        }
    }
    /* dY's amax into its history slot (tensor 3 * lin + role), as the unchunked path does */
    if (r != 1.0f) {
        ops->scale(be, m->scalars + 2, fabsf(r), 1);
        ops->scale(be, m->a.dc1, r, (size_t)N * C);
        ops->scale(be, m->hc_dw, r, (size_t)V * C);
    }
    ops->amax(be, m->st.history + 3 * head + FP8T_ROLE_DY, m->scalars + 2, 1);
    ops->accumulate(be, model_head_w(&m->g), m->hc_dw, (size_t)V * C);
    m->hc_grad = 0;
    return 1;
}
