/* The inference model's forward: prefill (whole sequences, at most R rows per pass, the cache
 * written), decode (nb rows, one token per sequence at its own position; recorded as a graph
 * and replayed where the backend can), the full-window forward (losses, calibration).
 *
 * GPT-2 block:  x += proj(attn(qkv(LN1(x)))); x += fc2(gelu(fc1(LN2(x))))
 * Llama block:  x += proj(attn_rope(qkv(RMS1(x)))); x += down(silu(gate(h)) * up(h)), h = RMS2(x)
 * Every buffer is one layer's: the layers run one after another over the same x. A residual
 * branch (proj's or the MLP's output, with the bias its GEMM left out) is added to x by the
 * next norm (make_operand's ADD_LAYERNORM / ADD_RMSNORM step: the add, the norm and the next
 * GEMM's operand in one pass); the last one by the final norm of the rows whose next token is
 * asked for.
 *
 * Every linear's input goes through make_input_operand: from its producer (the norm, the
 * attention output, GELU, SwiGLU) to what the GEMM reads (FP32 values, a BF16 operand, or FP8
 * codes), in the producer's own pass (make_operand with the producer's step) wherever the
 * scale is known beforehand (BF16; FP8 with fixed scales) and the backend fuses the step,
 * else the FP32 values first by the producer's own ops (FP32 linears, FP8 current scaling:
 * the amax pass). In bf16 and fp8 the MLP's first linears (fc1; gate and up) write BF16 values
 * (mlp16), which GELU's / SwiGLU's pass reads; FP8 current scaling then takes their amax in a
 * pass of its own. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "model/infer_internal.h"
#include "model/operand.h"

/* Where a linear's input comes from. */
typedef enum { IN_X = 0, IN_NORM, IN_GELU, IN_SWIGLU } inf_src;
typedef struct {
    inf_src kind;
    const float *x;       /* IN_X: the input; IN_NORM: the residual stream a; IN_GELU: GELU's
                             input (overwritten by GELU where FP32 values are made); IN_SWIGLU:
                             the gate (likewise); NULL with x16 */
    const float *y;       /* IN_NORM: the residual branch added to a first, or NULL */
    const float *ybias;   /* ... its bias (may be NULL) */
    float *sum;           /* IN_NORM with y: where a + (y + ybias) goes (the residual stream) */
    const float *w, *b;   /* IN_NORM: the norm's weight and bias (NULL for RMSNorm) */
    float *dst;           /* IN_NORM: where FP32 norm values go when they are made */
    const float *bias;    /* IN_GELU: the bias of GELU's input (the linear left it out) */
    const float *up;      /* IN_SWIGLU */
    const uint16_t *x16;  /* IN_GELU, IN_SWIGLU: the input (the gate) as BF16 values, or NULL */
    const uint16_t *up16; /* IN_SWIGLU with x16: up as BF16 values */
    int rows, cols;
} inf_input;

/* what a GEMM reads as its input X */
typedef struct {
    const float *x32;       /* FP32 linears */
    const void *data;       /* BF16 operand or FP8 codes (m->opbuf) */
    const float *scale_inv; /* FP8: the codes' scale_inv (device) */
} inf_operand;

/* in as the producer step of a make_operand request (out: the caller's) */
static fp8t_operand_req input_req(const fp8t_infer *m, const inf_input *in) {
    fp8t_operand_req r =
        model_operand_req(NULL, in->x, in->rows, in->cols, FP8T_OPERAND_BF16, NULL);
    const int rms = m->cfg.arch != FP8T_ARCH_GPT2;
    switch (in->kind) {
    case IN_X: break;
    case IN_NORM:
        if (in->y)
            r.step = rms ? FP8T_STEP_ADD_RMSNORM : FP8T_STEP_ADD_LAYERNORM;
        else
            r.step = rms ? FP8T_STEP_RMSNORM : FP8T_STEP_LAYERNORM;
        r.x2 = in->y, r.bias = in->y ? in->ybias : NULL, r.sum = in->y ? in->sum : NULL;
        r.norm_w = in->w, r.norm_b = in->b, r.eps = m->cfg.norm_eps;
        break;
    case IN_GELU: r.step = FP8T_STEP_GELU, r.bias = in->bias, r.x_16 = in->x16; break;
    case IN_SWIGLU:
        r.step = FP8T_STEP_SWIGLU, r.x2 = in->up;
        r.x_16 = in->x16, r.x2_16 = in->up16;
        break;
    }
    return r;
}

/* where in's FP32 values go when they are made: the norm's output buffer, else in place over
 * GELU's input or the gate, which are not read again */
static float *input_values_dst(const inf_input *in) {
    return in->kind == IN_NORM ? in->dst : (float *)in->x;
}

/* r's amax alone into amax (current scaling's first pass over BF16 inputs) */
static fp8t_operand_req amax_only(fp8t_operand_req r, float *amax) {
    r.out.data = NULL;
    r.out.format = FP8T_OPERAND_E4M3, r.out.scale = NULL;
    r.out.amax = amax;
    return r;
}

int infer_mlp16_fused(const fp8t_infer *m, inf_lin_kind kind) {
    static _Alignas(16) uint8_t probe[16]; /* stand-ins for aligned buffers */
    const int gpt2 = m->cfg.arch == FP8T_ARCH_GPT2;
    inf_input in;
    memset(&in, 0, sizeof(in));
    in.kind = gpt2 ? IN_GELU : IN_SWIGLU;
    in.x16 = (const uint16_t *)probe;
    in.up16 = gpt2 ? NULL : (const uint16_t *)probe;
    in.bias = gpt2 ? (const float *)probe : NULL;
    in.rows = in.cols = 8;
    fp8t_operand_req r = input_req(m, &in);
    r.out.data = probe;
    if (kind == INF_LIN_BF16) return m->ops->make_operand_fuses(m->be, &r);
    r.out.format = FP8T_OPERAND_E4M3, r.out.scale = (const float *)probe;
    const fp8t_operand_req a = amax_only(r, (float *)probe);
    return m->ops->make_operand_fuses(m->be, &r) && m->ops->make_operand_fuses(m->be, &a);
}

/* FP8 current scaling: the scale of the input whose amax is in sc (recorded by calibration) */
static void current_scale(fp8t_infer *m, float *sc) {
    const fp8t_backend_ops *o = m->ops;
    if (m->calibrating) o->amax(m->be, sc + INF_SC_CALIB, sc + INF_SC_AMAX, 1);
    o->compute_scale(m->be, sc + INF_SC_X, sc + INF_SC_X_INV, sc + INF_SC_AMAX,
                     fp8_format_max(FP8_E4M3), 0.0f, 0);
}

/* The operand of linear L's input in. With a scale known beforehand (BF16; FP8 with fixed
 * scales) make_operand makes it in the producer's own pass where the backend can; else the
 * FP32 values first (FP32 linears; FP8 current scaling, whose scale needs their amax), but for
 * GELU and SwiGLU of BF16 inputs, whose amax has a pass of its own. */
static void make_input_operand(fp8t_infer *m, const inf_input *in, const inf_linear *L,
                               inf_operand *op) {
    const fp8t_backend_ops *o = m->ops;
    fp8t_backend *be = m->be;
    const int N = in->rows, K = in->cols;
    const int fp8 = L->kind == INF_LIN_FP8;
    memset(op, 0, sizeof(*op));
    op->data = m->opbuf;
    op->scale_inv = fp8 ? L->sc + INF_SC_X_INV : NULL;
    fp8t_operand_req r = input_req(m, in);
    r.out.data = m->opbuf;
    if (L->kind == INF_LIN_BF16 || (fp8 && m->act_static)) {
        if (fp8) r.out.format = FP8T_OPERAND_E4M3, r.out.scale = L->sc + INF_SC_X;
        model_make_operand(o, be, &r, input_values_dst(in));
        return;
    }
    float *sc = L->sc;
    if (in->x16) { /* FP8 current scaling of BF16 inputs: the amax pass, then the codes */
        const fp8t_operand_req a = amax_only(r, sc + INF_SC_AMAX);
        o->zero(be, sc + INF_SC_AMAX, sizeof(float));
        o->make_operand(be, &a);
        current_scale(m, sc);
        r.out.format = FP8T_OPERAND_E4M3, r.out.scale = sc + INF_SC_X;
        o->make_operand(be, &r);
        return;
    }
    const float *x = fp8t_operand_step_values(o, be, &r, input_values_dst(in), NULL);
    if (L->kind == INF_LIN_F32) {
        op->x32 = x;
        op->data = NULL;
        return;
    }
    /* FP8, current scaling: this input's own amax, every call (calibration records it) */
    o->zero(be, sc + INF_SC_AMAX, sizeof(float));
    o->amax(be, sc + INF_SC_AMAX, x, (size_t)N * K);
    current_scale(m, sc);
    const fp8t_operand_req q =
        model_operand_req(m->opbuf, x, N, K, FP8T_OPERAND_E4M3, sc + INF_SC_X);
    o->make_operand(be, &q);
}

/* The GEMM views of linear L's X [N, in] (operand op) and W [out, in]: both stored K-major,
 * the layout a TN GEMM reads, so no transposed copies are needed */
static fp8t_bf16_operand x_bf16(const inf_linear *L, const inf_operand *op, int N) {
    const fp8t_bf16_operand a = {(const uint16_t *)op->data, N, L->in};
    return a;
}
static fp8t_bf16_operand w_bf16(const inf_linear *L) {
    const fp8t_bf16_operand w = {L->w16, L->out, L->in};
    return w;
}
static fp8t_fp8_operand x_fp8(const inf_linear *L, const inf_operand *op, int N) {
    const fp8t_fp8_operand a = {
        (const uint8_t *)op->data, NULL, op->scale_inv, FP8_E4M3, N, L->in, FP8T_SCALING_TENSOR};
    return a;
}
static fp8t_fp8_operand w_fp8(const inf_linear *L) {
    const fp8t_fp8_operand w = {L->w8,  NULL,  L->sc + INF_SC_W_INV, FP8_E4M3,
                                L->out, L->in, FP8T_SCALING_TENSOR};
    return w;
}

/* Inside a decode step: the weight of the linear after L (its first prefetch_bytes) on its way
 * into L2 while L's GEMM runs, which reads its own weight far below the memory's bandwidth at
 * a few rows */
static void prefetch_weight(fp8t_infer *m, const inf_linear *L) {
    size_t n;
    const void *w = infer_linear_weight(L, &n);
    m->ops->prefetch_l2(m->be, w, n < m->prefetch_bytes ? n : m->prefetch_bytes);
}
static void prefetch_next(fp8t_infer *m, const inf_linear *L) {
    if (m->prefetching && L->next) prefetch_weight(m, L->next);
}

/* Y[N, out] = X · Wᵀ (+ bias) of linear L on operand op */
static void linear_gemm(fp8t_infer *m, const inf_linear *L, const inf_operand *op, float *Y,
                        int N, const float *bias) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    prefetch_next(m, L);
    switch (L->kind) {
    case INF_LIN_F32:
        ops->gemm_f32(be, Y, op->x32, L->w32, N, L->out, L->in, 0, 1, 0);
        if (bias) ops->bias_add(be, Y, bias, N, L->out);
        return;
    case INF_LIN_BF16: {
        const fp8t_bf16_operand a = x_bf16(L, op, N), w = w_bf16(L);
        ops->gemm_bf16_rounded(be, Y, &a, &w, N, L->out, L->in, 0, 1, 0, bias, 0);
        return;
    }
    case INF_LIN_FP8: {
        const fp8t_fp8_operand a = x_fp8(L, op, N), w = w_fp8(L);
        ops->gemm_fp8(be, Y, &a, &w, N, L->out, L->in, 0, 1, 0, 1, NULL, bias);
        return;
    }
    }
}

/* Y16[N, out] = X · Wᵀ of BF16 or FP8 linear L (no bias) as BF16 values */
static void linear_gemm16(fp8t_infer *m, const inf_linear *L, const inf_operand *op,
                          uint16_t *Y16, int N) {
    prefetch_next(m, L);
    if (L->kind == INF_LIN_FP8) {
        const fp8t_fp8_operand a = x_fp8(L, op, N), w = w_fp8(L);
        m->ops->gemm_tn_bf16_out(m->be, Y16, &a, &w, NULL, NULL, N, L->out, L->in, 1);
    } else {
        const fp8t_bf16_operand a = x_bf16(L, op, N), w = w_bf16(L);
        m->ops->gemm_tn_bf16_out(m->be, Y16, NULL, NULL, &a, &w, N, L->out, L->in, 0);
    }
}

/* Where a linear's bias is added: by its GEMM (gemm_bias), or, in FP8 (cuBLASLt has no FP8
 * GEMM with an FP32 bias epilogue), by the op that reads the GEMM's output, as it loads it
 * (late_bias): the same add, without a pass of its own. */
static const float *gemm_bias(const inf_linear *L) {
    return L->kind == INF_LIN_FP8 ? NULL : L->bias;
}
static const float *late_bias(const inf_linear *L) {
    return L->kind == INF_LIN_FP8 ? L->bias : NULL;
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

/* the residual branch a layer leaves for the next norm to add: x + (y + bias) */
typedef struct {
    const float *y, *bias;
} inf_pending;

/* norm input: rows r0 .. r0 + N - 1 of x (+ the same rows of the pending branch), into the
 * operand of L (FP32 values: into those rows of dst) */
static inf_input norm_input(fp8t_infer *m, const inf_pending *p, const float *w, const float *b,
                            int r0, int N, float *dst) {
    const size_t off = (size_t)r0 * m->C;
    inf_input in;
    memset(&in, 0, sizeof(in));
    in.kind = IN_NORM;
    in.x = m->x + off;
    in.y = p->y ? p->y + off : NULL;
    in.ybias = p->bias;
    in.sum = m->x + off;
    in.w = w;
    in.b = b;
    in.dst = dst + off;
    in.rows = N;
    in.cols = m->C;
    return in;
}

/* Layer y's MLP over rows r0 .. r0 + n - 1 of x: the attention branch attn added and the
 * norm taken for those rows, the MLP's output into the same rows of m->out (whose attention
 * rows those were: read by this chunk's norm first). */
static void mlp_rows(fp8t_infer *m, const inf_layer *y, const inf_pending *attn, int r0, int n) {
    inf_input in = norm_input(m, attn, y->ln2_w, y->ln2_b, r0, n, m->atty);
    inf_operand op;
    float *out = m->out + (size_t)r0 * m->C;
    if (m->cfg.arch == FP8T_ARCH_GPT2) {
        make_input_operand(m, &in, &y->fc1, &op);
        memset(&in, 0, sizeof(in));
        in.kind = IN_GELU;
        in.rows = n;
        in.cols = m->H;
        if (m->mlp16) { /* the bias added in GELU's pass, to the rounded values */
            linear_gemm16(m, &y->fc1, &op, (uint16_t *)m->h1, n);
            in.x16 = (const uint16_t *)m->h1;
            in.bias = y->fc1.bias;
        } else {
            linear_gemm(m, &y->fc1, &op, m->h1, n, gemm_bias(&y->fc1));
            in.x = m->h1;
            in.bias = late_bias(&y->fc1); /* added in GELU's pass */
        }
        make_input_operand(m, &in, &y->fc2, &op);
        linear_gemm(m, &y->fc2, &op, out, n, NULL);
    } else {
        /* gate and up read the same operand, made once (FP8: with gate's scale); Llama's
         * MLP has no biases */
        make_input_operand(m, &in, &y->gate, &op);
        memset(&in, 0, sizeof(in));
        in.kind = IN_SWIGLU;
        in.rows = n;
        in.cols = m->H;
        if (m->mlp16) {
            uint16_t *g16 = (uint16_t *)m->h1, *u16 = (uint16_t *)m->h2;
            linear_gemm16(m, &y->gate, &op, g16, n);
            linear_gemm16(m, &y->up, &op, u16, n);
            in.x16 = g16, in.up16 = u16;
        } else {
            linear_gemm(m, &y->gate, &op, m->h1, n, NULL);
            linear_gemm(m, &y->up, &op, m->h2, n, NULL);
            in.x = m->h1, in.up = m->h2;
        }
        make_input_operand(m, &in, &y->down, &op);
        linear_gemm(m, &y->down, &op, out, n, NULL);
    }
}

/* Layer l over the N rows of m->x (nb sequences of T tokens; decode: T = 1); seq0: the first
 * sequence's index in the cache. p: the branch the previous layer left, replaced by this
 * layer's. */
static void layer_forward(fp8t_infer *m, int l, int seq0, int nb, int T, att_mode mode,
                          inf_pending *p) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    const inf_layer *y = &m->layer[l];
    const int N = nb * T;
    fp8t_attn_shape sh = attn_shape(m, nb, T);
    const size_t kv_off = (size_t)l * m->kv_layer_bytes + (size_t)seq0 * m->kv_seq_bytes;
    void *kc = (char *)m->kc + kv_off, *vc = (char *)m->vc + kv_off;
    inf_operand op;

    inf_input in = norm_input(m, p, y->ln1_w, y->ln1_b, 0, N, m->atty);
    make_input_operand(m, &in, &y->qkv, &op);
    sh.qkv_bias = late_bias(&y->qkv); /* added by the attention ops as they read qkv */
    linear_gemm(m, &y->qkv, &op, m->qkv, N, gemm_bias(&y->qkv));
    if (mode == ATT_DECODE) {
        ops->attention_decode(be, m->atty, kc, vc, m->kv, m->qkv, m->pos, &sh, m->Tmax);
    } else {
        ops->attention_forward(be, m->atty, m->lse, NULL, m->qkv, &sh);
        if (mode == ATT_PREFILL) ops->kv_cache_write(be, kc, vc, m->kv, m->qkv, &sh, m->Tmax);
    }
    memset(&in, 0, sizeof(in));
    in.kind = IN_X;
    in.x = m->atty;
    in.rows = N;
    in.cols = m->C;
    make_input_operand(m, &in, &y->proj, &op);
    linear_gemm(m, &y->proj, &op, m->out, N, NULL); /* its bias: added by the next norm */
    const inf_pending attn = {m->out, y->proj.bias};
    for (int r0 = 0; r0 < N; r0 += m->RM)
        mlp_rows(m, y, &attn, r0, N - r0 < m->RM ? N - r0 : m->RM);
    p->y = m->out;
    p->bias = m->cfg.arch == FP8T_ARCH_GPT2 ? y->fc2.bias : y->down.bias;
}

/* x [nb*T, C] = the embedding of m->tokens at positions t = i % T, or (decode: T = 1, pos
 * the host copy of m->pos) each row at its own position */
static void embed(fp8t_infer *m, int nb, int T, const int *pos) {
    const fp8t_backend_ops *ops = m->ops;
    if (m->emb.kind == INF_LIN_FP8) {
        ops->embedding_forward_fp8(m->be, m->x, m->tokens, m->emb.w8, m->C,
                                   m->emb.sc + INF_SC_W_INV, m->wpe, pos ? m->pos : NULL, nb, T,
                                   m->C);
        return;
    }
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
            return fp8t_errorf(err, errlen,
                               "token %d (index %zu) is outside the vocabulary [0, %d)", tok[i],
                               i, m->V);
        }
    return 0;
}

/* a calibrated model before its calibration cannot run */
static int check_ready(const fp8t_infer *m, const char *what, char *err, size_t errlen) {
    if (m->prec == FP8T_EVAL_FP8 && m->act == FP8T_ACT_SCALE_CALIBRATED && !m->act_static &&
        !m->calibrating) {
        return fp8t_errorf(err, errlen,
                           "%s: the FP8 activation scales are not calibrated yet (run "
                           "fp8t_infer_calibrate first: --calib-data)",
                           what);
    }
    return 0;
}

/* The layers over nb sequences of T tokens already embedded into m->x (sequence seq0 first
 * in the cache); the last layer's branch is added to x */
static void blocks(fp8t_infer *m, int seq0, int nb, int T, att_mode mode) {
    inf_pending p = {NULL, NULL};
    for (int l = 0; l < m->cfg.n_layer; l++) layer_forward(m, l, seq0, nb, T, mode, &p);
    m->ops->add_bias(m->be, m->x, NULL, m->x, p.y, p.bias, nb * T, m->C);
}

/* The layers of a decode step, then the final norm (with the last branch added) and the head
 * of the nb rows into m->logits: the whole step on the device, reading m->tokens and m->pos
 * (a graph records it) */
static void decode_step(fp8t_infer *m, int nb, const int *pos_host) {
    m->prefetching = m->prefetch_bytes > 0;
    if (m->prefetching && m->cfg.n_layer > 0) /* the first GEMM's weight: while embedding */
        prefetch_weight(m, &m->layer[0].qkv);
    embed(m, nb, 1, pos_host);
    inf_pending p = {NULL, NULL};
    for (int l = 0; l < m->cfg.n_layer; l++) layer_forward(m, l, 0, nb, 1, ATT_DECODE, &p);
    inf_input in = norm_input(m, &p, m->lnf_w, m->lnf_b, 0, nb, m->lnl);
    inf_operand op;
    make_input_operand(m, &in, &m->head, &op);
    linear_gemm(m, &m->head, &op, m->logits, nb, NULL);
    m->prefetching = 0;
}

/* logits [n, V] (device) of rows a [n, C] of the residual stream: the final norm and the
 * head (FP32 norm values into dst) */
static void head_rows(fp8t_infer *m, const float *a, int n, float *dst, float *logits) {
    inf_input in;
    memset(&in, 0, sizeof(in));
    in.kind = IN_NORM;
    in.x = a;
    in.w = m->lnf_w;
    in.b = m->lnf_b;
    in.dst = dst;
    in.rows = n;
    in.cols = m->C;
    inf_operand op;
    make_input_operand(m, &in, &m->head, &op);
    if (logits) linear_gemm(m, &m->head, &op, logits, n, NULL);
}

int fp8t_infer_prefill(fp8t_infer *m, const int *tokens, int nb, int T, const int *lens,
                       float *logits, char *err, size_t errlen) {
    if (nb < 1 || nb > m->B || T < 1 || T > m->Tmax) {
        return fp8t_errorf(err, errlen,
                           "prefill: %d sequences of %d tokens for a model built for %d of "
                           "at most %d",
                           nb, T, m->B, m->Tmax);
    }
    for (int b = 0; b < nb; b++)
        if (lens[b] < 1 || lens[b] > T) {
            return fp8t_errorf(err, errlen, "prefill: sequence %d has %d tokens (1..%d)", b,
                               lens[b], T);
        }
    const size_t N = (size_t)nb * T;
    if (check_tokens(m, tokens, N, err, errlen) || check_ready(m, "prefill", err, errlen))
        return -1;
    const fp8t_backend_ops *ops = m->ops;
    const size_t rowb = (size_t)m->C * sizeof(float);
    const int per = m->R / T; /* sequences per pass */
    for (int s0 = 0; s0 < nb; s0 += per) {
        const int ns = nb - s0 < per ? nb - s0 : per;
        ops->to_device(m->be, m->tokens, tokens + (size_t)s0 * T, (size_t)ns * T * sizeof(int));
        embed(m, ns, T, NULL);
        blocks(m, s0, ns, T, ATT_PREFILL);
        for (int b = 0; b < ns; b++) /* each prompt's last token */
            ops->copy(m->be, m->last + (size_t)(s0 + b) * m->C,
                      m->x + ((size_t)b * T + (size_t)lens[s0 + b] - 1) * m->C, rowb);
    }
    head_rows(m, m->last, nb, m->lnl, m->logits);
    if (logits)
        ops->to_host(m->be, logits, m->logits, (size_t)nb * m->V * sizeof(float));
    else
        ops->synchronize(m->be);
    return 0;
}

int fp8t_infer_decode(fp8t_infer *m, const int *tok, const int *pos, int nb, float *logits,
                      char *err, size_t errlen) {
    if (nb < 1 || nb > m->B) {
        return fp8t_errorf(err, errlen, "decode: %d sequences for a model built for %d", nb,
                           m->B);
    }
    for (int b = 0; b < nb; b++)
        if (pos[b] < 0 || pos[b] >= m->Tmax) {
            return fp8t_errorf(err, errlen,
                               "decode: sequence %d at position %d: the cache holds %d "
                               "positions",
                               b, pos[b], m->Tmax);
        }
    if (check_tokens(m, tok, (size_t)nb, err, errlen) || check_ready(m, "decode", err, errlen))
        return -1;
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    ops->to_device(be, m->tokens, tok, (size_t)nb * sizeof(int));
    ops->to_device(be, m->pos, pos, (size_t)nb * sizeof(int));
    const int replayed =
        m->use_graphs && m->graph && m->graph_nb == nb && ops->graph_launch(be, m->graph) == 0;
    if (!replayed) {
        /* run the step itself (which also sizes every scratch buffer it uses), then record
         * it for the next steps of this batch size (again when the recording went stale) */
        decode_step(m, nb, pos);
        if (m->use_graphs) {
            if (m->graph) ops->graph_destroy(be, m->graph);
            m->graph = NULL;
            if (ops->graph_begin(be) == 0) {
                decode_step(m, nb, pos);
                m->graph = ops->graph_end(be);
            }
            m->graph_nb = nb;
            if (!m->graph) m->use_graphs = 0; /* the backend could not record: run directly */
        }
    }
    if (logits)
        ops->to_host(be, logits, m->logits, (size_t)nb * m->V * sizeof(float));
    else
        ops->synchronize(be);
    return 0;
}

/* What a full-window pass does with each head pass's logits [n, V] (device) of rows
 * r0 .. r0 + n - 1 of the batch. A sink that wants neither logits nor losses (calibration's)
 * still runs the head's input operand, which records its amax, but no head GEMM: nothing of
 * [rows, V] is allocated. */
typedef struct {
    float *logits_host; /* forward_all: [nb * T, V] */
    const int *targets; /* loss / losses: [nb * T] host */
    float *losses_host; /* losses: [nb * T] */
    int want_sum;       /* loss: the sum of the losses into m->losses[R] */
} full_sink;

/* the head pass's logits to the sink (one with logits_host or targets) */
static void sink_rows(fp8t_infer *m, const full_sink *k, size_t r0, int n) {
    const fp8t_backend_ops *ops = m->ops;
    const size_t V = (size_t)m->V;
    if (k->logits_host) {
        ops->to_host(m->be, k->logits_host + r0 * V, m->all_logits,
                     (size_t)n * V * sizeof(float));
        return;
    }
    ops->to_device(m->be, m->targets, k->targets + r0, (size_t)n * sizeof(int));
    ops->softmax_xent(m->be, m->losses, NULL, m->all_logits, m->targets, n, m->V, 0.0f);
    if (k->want_sum) ops->sum(m->be, m->losses + m->R, m->losses, (size_t)n);
    if (k->losses_host) ops->to_host(m->be, k->losses_host + r0, m->losses, (size_t)n * 4);
}

/* The full-window forward of tokens [nb, T] (host), whole sequences R rows at a time, and
 * the head INF_HEAD_ROWS rows at a time into m->all_logits, each pass given to the sink (NULL:
 * no head; calibration). 0 ok; -1 with err. */
static int forward_full(fp8t_infer *m, const int *tokens, int nb, int T, const full_sink *k,
                        char *err, size_t errlen) {
    if (nb < 1 || nb > m->B || T < 1 || T > m->Tmax) {
        return fp8t_errorf(err, errlen,
                           "forward: %d sequences of %d tokens for a model built for %d of "
                           "at most %d",
                           nb, T, m->B, m->Tmax);
    }
    const size_t N = (size_t)nb * T;
    if (check_tokens(m, tokens, N, err, errlen) || check_ready(m, "forward", err, errlen))
        return -1;
    const fp8t_backend_ops *ops = m->ops;
    const int hr = m->R < INF_HEAD_ROWS ? m->R : INF_HEAD_ROWS;
    const int logits = k && (k->logits_host || k->targets);
    if (logits && !m->all_logits) {
        m->all_logits = ops->malloc(m->be, (size_t)hr * m->V * sizeof(float));
        m->losses = ops->malloc(m->be, ((size_t)m->R + 1) * sizeof(float));
        m->targets = ops->malloc(m->be, (size_t)m->R * sizeof(int));
    }
    if (k && k->want_sum) ops->zero(m->be, m->losses + m->R, sizeof(float));
    const int per = m->R / T;
    for (int s0 = 0; s0 < nb; s0 += per) {
        const int ns = nb - s0 < per ? nb - s0 : per;
        const int rows = ns * T;
        ops->to_device(m->be, m->tokens, tokens + (size_t)s0 * T, (size_t)rows * sizeof(int));
        embed(m, ns, T, NULL);
        blocks(m, s0, ns, T, ATT_FULL);
        for (int r = 0; k && r < rows; r += hr) {
            const int n = rows - r < hr ? rows - r : hr;
            head_rows(m, m->x + (size_t)r * m->C, n, m->atty + (size_t)r * m->C,
                      logits ? m->all_logits : NULL);
            if (logits) sink_rows(m, k, (size_t)s0 * T + (size_t)r, n);
        }
    }
    return 0;
}

int fp8t_infer_forward_all(fp8t_infer *m, const int *tokens, int nb, int T, float *logits,
                           char *err, size_t errlen) {
    const full_sink k = {logits, NULL, NULL, 0};
    return forward_full(m, tokens, nb, T, &k, err, errlen);
}

static int check_targets(const fp8t_infer *m, const int *targets, size_t N, int *count, char *err,
                         size_t errlen) {
    *count = 0;
    for (size_t i = 0; i < N; i++) {
        if (targets[i] >= m->V) {
            return fp8t_errorf(err, errlen,
                               "target %d (index %zu) is outside the vocabulary [0, %d)",
                               targets[i], i, m->V);
        }
        *count += targets[i] >= 0;
    }
    return 0;
}

double fp8t_infer_loss(fp8t_infer *m, const int *tokens, const int *targets, int nb, int T,
                       char *err, size_t errlen) {
    int count;
    if (check_targets(m, targets, (size_t)nb * (T > 0 ? T : 0), &count, err, errlen)) return NAN;
    const full_sink k = {NULL, targets, NULL, 1};
    if (forward_full(m, tokens, nb, T, &k, err, errlen)) return NAN;
    float sum = 0.0f;
    m->ops->to_host(m->be, &sum, m->losses + m->R, sizeof(float));
    return count > 0 ? (double)sum / count : 0.0;
}

int fp8t_infer_losses(fp8t_infer *m, const int *tokens, const int *targets, int nb, int T,
                      float *losses, char *err, size_t errlen) {
    int count;
    if (check_targets(m, targets, (size_t)nb * (T > 0 ? T : 0), &count, err, errlen)) return -1;
    const full_sink k = {NULL, targets, losses, 0};
    return forward_full(m, tokens, nb, T, &k, err, errlen);
}

int fp8t_infer_calibrate(fp8t_infer *m, const int *tokens, int n_batches, int nb, int T,
                         char *err, size_t errlen) {
    if (m->prec != FP8T_EVAL_FP8 || m->act != FP8T_ACT_SCALE_CALIBRATED) return 0;
    if (n_batches < 1) {
        return fp8t_errorf(err, errlen, "calibration: no batches");
    }
    const fp8t_backend_ops *ops = m->ops;
    /* every FP8 linear (the layers', and the head with fp8_head), in a fixed order */
    inf_linear **lin = malloc((size_t)INF_LINEARS(m) * sizeof(*lin));
    if (!lin) {
        return fp8t_errorf(err, errlen, "calibration: out of memory");
    }
    const int n = infer_linears(m, lin);
    /* their recorded amaxes from 0; the forward runs with current scaling (and an FP8 head:
     * the calibrating pass makes its input operand, which records the amax, and skips the
     * logits, so calibration holds no [rows, V] buffer) */
    for (int i = 0; i < n; i++)
        if (lin[i]->kind == INF_LIN_FP8) ops->zero(m->be, lin[i]->sc + INF_SC_CALIB, 4);
    m->act_static = 0;
    m->calibrating = 1;
    int rc = 0;
    const full_sink none = {NULL, NULL, NULL, 0};
    const int head8 = m->head.kind == INF_LIN_FP8;
    for (int i = 0; i < n_batches && rc == 0; i++)
        rc = forward_full(m, tokens + (size_t)i * nb * T, nb, T, head8 ? &none : NULL, err,
                          errlen);
    m->calibrating = 0;
    if (rc) {
        free(lin);
        snprintf(m->act_desc, sizeof(m->act_desc), "calibrated scales (not yet calibrated)");
        return -1;
    }
    /* the scale of each input's largest amax; gate's serves up too (they share an operand) */
    for (int k = 0; k < n; k++) {
        float *sc = lin[k]->sc;
        if (lin[k]->kind == INF_LIN_FP8)
            ops->compute_scale(m->be, sc + INF_SC_X, sc + INF_SC_X_INV, sc + INF_SC_CALIB,
                               fp8_format_max(FP8_E4M3), 0.0f, 0);
    }
    free(lin);
    ops->synchronize(m->be);
    m->act_static = 1;
    snprintf(m->act_desc, sizeof(m->act_desc), "calibrated scales (%d batch%s of %d x %d tokens)",
             n_batches, n_batches == 1 ? "" : "es", nb, T);
    return 0;
}

double fp8t_infer_loss_decode(fp8t_infer *m, const int *tokens, const int *targets, int nb, int T,
                              char *err, size_t errlen) {
    int count;
    if (nb < 1 || nb > m->B || T < 1 || T > m->Tmax) {
        fp8t_errorf(err, errlen,
                    "decode loss: %d sequences of %d tokens for a model built for %d "
                    "of at most %d",
                    nb, T, m->B, m->Tmax);
        return NAN;
    }
    if (check_targets(m, targets, (size_t)nb * T, &count, err, errlen)) return NAN;
    const fp8t_backend_ops *ops = m->ops;
    if (!m->all_logits) { /* the full-window buffers: losses and targets are shared */
        const int hr = m->R < INF_HEAD_ROWS ? m->R : INF_HEAD_ROWS;
        m->all_logits = ops->malloc(m->be, (size_t)hr * m->V * sizeof(float));
        m->losses = ops->malloc(m->be, ((size_t)m->R + 1) * sizeof(float));
        m->targets = ops->malloc(m->be, (size_t)m->R * sizeof(int));
    }
    int *col = malloc((size_t)nb * 2 * sizeof(int)), *pos = col ? col + nb : NULL;
    if (!col) {
        fp8t_errorf(err, errlen, "decode loss: out of memory");
        return NAN;
    }
    int rc = 0;
    ops->zero(m->be, m->losses + m->R, sizeof(float));
    for (int t = 0; t < T && rc == 0; t++) {
        for (int b = 0; b < nb; b++) col[b] = tokens[(size_t)b * T + t], pos[b] = t;
        if (t == 0) {
            int *lens = malloc((size_t)nb * sizeof(int)); /* one token each */
            if (!lens) {
                rc = -1;
                fp8t_errorf(err, errlen, "decode loss: out of memory");
                break;
            }
            for (int b = 0; b < nb; b++) lens[b] = 1;
            rc = fp8t_infer_prefill(m, col, nb, 1, lens, NULL, err, errlen);
            free(lens);
        } else {
            rc = fp8t_infer_decode(m, col, pos, nb, NULL, err, errlen);
        }
        if (rc) break;
        for (int b = 0; b < nb; b++) col[b] = targets[(size_t)b * T + t];
        ops->to_device(m->be, m->targets, col, (size_t)nb * sizeof(int));
        ops->softmax_xent(m->be, m->losses, NULL, m->logits, m->targets, nb, m->V, 0.0f);
        ops->sum(m->be, m->losses + m->R, m->losses, (size_t)nb);
    }
    free(col);
    if (rc) return NAN;
    float sum = 0.0f;
    ops->to_host(m->be, &sum, m->losses + m->R, sizeof(float));
    return count > 0 ? (double)sum / count : 0.0;
}
