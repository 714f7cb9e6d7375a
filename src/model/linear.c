/* The linear layer: Y = X·Wᵀ (+ bias) with its three GEMMs, each in the precision the policy
 * resolved for it.
 *
 *   Fprop  Y  = X ·Wᵀ    X [N, IN], W [OUT, IN]  -> Y  [N, OUT]   K = IN
 *   Dgrad  dX = dY·W     dY [N, OUT], W [OUT, IN] -> dX [N, IN]   K = OUT
 *   Wgrad  dW += dYᵀ·X   dY [N, OUT], X [N, IN]   -> dW [OUT, IN]  K = N
 *
 * Precisions (the operands stay FP32 tensors; what changes is what the GEMM sees):
 *   fp32     gemm_f32 on the FP32 operands
 *   bf16     BF16 operands (make_operand, recording the amax in the same pass), then
 *            gemm_bf16_rounded (FP32 accumulation; the bias added in its epilogue when no hook
 *            must see the output without it)
 *   delayed  FP8 codes with the recipe state's scale (from earlier steps' amaxes), gemm_fp8
 *            (which, like the BF16 one, takes the Fprop's bias)
 *   current  FP8 codes with a scale from this tensor's own amax, gemm_fp8
 *   fake     current-scaled quantize-dequantize of each operand, then gemm_bf16
 *   block    1x128 tiles along K for X/dY, 128x128 blocks for W (DeepSeek-V3): on the
 *            scaled-operand path (model_scaled_path: Hopper's fp8_block_native, or pow2
 *            scales) scaled operands (make_operand) + a block-scaled gemm_fp8 (the same codes
 *            and scales);
 *            elsewhere dequantized, gemm_f32 — an emulation
 *   rowwise  one scale per row of each K-major operand, over all of K (torchao's rowwise):
 *            always the scaled-operand path (row-scaled gemm_fp8; the CPU's is the exact
 *            decode + FP32 reference)
 *   mxfp8    32-element row blocks with E8M0 scales, dequantized, gemm_f32 — an emulation;
 *            the blocks run along the stored rows of each operand, which is the reduction
 *            dimension for Fprop only
 *
 * In every precision the amax of X and W (forward) and dY (backward) is recorded into slot 0
 * of the recipe state's history, so a run can switch to delayed FP8 at any step; a frozen
 * model (fp8t_model_set_frozen) records nothing.
 * The weight is quantized once per optimizer step (delayed and current): its codes are cached
 * until fp8t_model_end_step, and reused by every micro-batch and by the Dgrad. dY is quantized
 * once per backward when its Dgrad and Wgrad share an FP8 precision (the plan's dy_shared;
 * off with FP8T_DISABLE_CODE_REUSE). X is quantized once per micro-batch when its Fprop and
 * Wgrad share one (the plan's save_x): the Fprop's quantize also writes the codes the Wgrad
 * reads into m->xq[lin], and the forward keeps no FP32 copy of X for the Wgrad (off with
 * FP8T_DISABLE_FP8_SAVE).
 * Block and rowwise share their operands the same way (scaled_gemm, below).
 * BF16 operands follow the same plan: the weight's BF16 copy is cached per optimizer step, dY
 * is rounded once for its Dgrad and Wgrad, X once for its Fprop and Wgrad (kept in
 * m->xq[lin].bf16, 2 bytes per element instead of 4). All of it is off with
 * FP8T_DISABLE_BF16_OPERANDS (gemm_bf16 on the FP32 operands, bit-identical on the CPU).
 *
 * Every operand is one make_operand request (operand_step and the request builders below):
 * its format, scale and orientations from the precision, and the producer step its rounding
 * pass applies where the plan fuses one (GELU into fc2's X, dGELU into fc1's dY, LayerNorm
 * with the residual add into qkv's / fc1's X, SwiGLU into down's X and its gradients into
 * gate's and up's dY on the scaled path, the bias gradient as column sums of dY): the step's
 * FP32 output is then never written. Which steps the plan fuses is decided by precision
 * (linear_plan.c: step_fused, dgelu; a scale known before the pass, nothing reading the FP32
 * values); a backend that has no one-pass kernel for a request says so
 * (make_operand_fuses) and the model composes it instead (model_make_operand: the producer's
 * op into the caller's FP32 buffer, then the plain operand), the same bits.
 */
#include <math.h>
#include <string.h>

#include "model/model_internal.h"
#include "model/operand.h"

/* One operand of one GEMM, as stored, and the producer step its rounding pass applies (at
 * most one of gelu, dgelu_x, ln; operand_step turns them into a make_operand request's). */
typedef struct {
    float *x; /* device [rows, cols] */
    int rows, cols;
    int role;               /* FP8T_ROLE_X / _W / _DY */
    int record;             /* record amax(x) into history slot 0 during this GEMM */
    int tile_r, tile_c;     /* block-scaling tile: along K for activations, 128x128 for weights */
    int pos;                /* 0: GEMM operand A, 1: operand B (selects the scratch buffers) */
    void *save;             /* Fprop X that the Wgrad will read again, FP8 codes (the layout it
                          reads: data, or data_t when the backend wants transposed copies) or
                          a BF16 operand: written here instead of into scratch; NULL
                          otherwise */
    int gelu;               /* the operand is gelu(x): x is GELU's input, and the rounding pass
                          applies GELU itself (step GELU), so GELU's FP32 output is never
                          written (linear_forward_gelu) */
    float *colsum;          /* the Dgrad's dY with a bias: its rounding pass also adds the column
                          sums of dY into colsum (the bias gradient); NULL otherwise */
    const float *gelu_bias; /* with gelu (FP8 only): GELU's input is x + gelu_bias [cols], the
                          bias its producer left to this pass (linear_forward_gelu) */
    uint16_t *gelu_save16;  /* with gelu (or NULL): the pass also keeps GELU's input (with
                          gelu_bias) in BF16 here for the backward (the layer's save) */
    const float *dgelu_x;   /* the Dgrad's dY of the linear after GELU: x is the gradient of
                          GELU's output, dgelu_x GELU's input (+ dgelu_bias [cols], may be NULL),
                          and the rounding pass computes dY = gelu'(..) * x itself (step
                          DGELU), so dY is never written in FP32 (linear_backward_gelu); NULL
                          otherwise */
    const float *dgelu_bias;
    const uint16_t *dgelu_x16;  /* or GELU's input as that BF16 save (dgelu_x NULL, no bias) */
    const float *swiglu_up;     /* the operand is silu(x) * swiglu_up, x being the gate: the
                          rounding pass applies SwiGLU itself (step SWIGLU), so its FP32 output
                          is never written (linear_forward_swiglu); NULL otherwise */
    uint16_t *swiglu_save16[2]; /* with swiglu_up (each may be NULL): the pass also keeps the
                          gate's and up's BF16 copies here for the backward (the layer's saves) */
    fp8t_operand_step dswiglu;  /* NONE, or DSWIGLU_GATE / _UP: the Dgrad's dY of gate or up, x
                          being the gradient of SwiGLU's output: the rounding pass computes that
                          gradient itself from the forward's inputs below, so dY is never
                          written in FP32 (linear_backward_dswiglu) */
    const float *dswiglu_gate, *dswiglu_up; /* FP32, or NULL: their BF16 saves */
    const uint16_t *dswiglu_gate16, *dswiglu_up16;
    const ln_input *ln; /* the operand is layernorm(x), x being the norm's input: the rounding
                          pass is the norm itself (step LAYERNORM, or ADD_LAYERNORM with the
                          residual add), which also writes the mean and rstd, so the norm's
                          FP32 output is never written (linear_forward_ln); NULL otherwise */
    float *values;      /* with a step: [rows, cols] where its FP32 values go if the backend
                          has no one-pass kernel for the request (model_make_operand) */
} operand;

/* What a GEMM consumes after preparation: FP32 values, FP8 codes or a BF16 operand. */
typedef struct {
    const float *f;
    fp8t_fp8_operand q;
    fp8t_bf16_operand h;
    float *amax;     /* history slot gemm_bf16 records amax(f) into while rounding, or NULL
                    (FP8T_DISABLE_BF16_OPERANDS) */
    int colsum_done; /* the operand's colsum was added by its rounding pass */
} prepared;

static int fp8_index(int lin, int role) { return lin * 3 + role; }

/* op's producer step into r (x, x2, bias, the norm's parameters and side outputs, colsum) */
static void operand_step(const operand *op, fp8t_operand_req *r) {
    r->x = op->x;
    r->colsum = op->colsum;
    if (op->gelu) {
        r->step = FP8T_STEP_GELU;
        r->bias = op->gelu_bias;
        r->save16 = op->gelu_save16;
    } else if (op->dgelu_x || op->dgelu_x16) {
        r->step = FP8T_STEP_DGELU;
        r->x2 = op->dgelu_x;
        r->x2_16 = op->dgelu_x16;
        r->bias = op->dgelu_bias;
    } else if (op->swiglu_up) {
        r->step = FP8T_STEP_SWIGLU;
        r->x2 = op->swiglu_up;
        r->save16 = op->swiglu_save16[0];
        r->save16_2 = op->swiglu_save16[1];
    } else if (op->dswiglu != FP8T_STEP_NONE) {
        r->step = op->dswiglu;
        r->x2 = op->dswiglu_gate, r->x2_16 = op->dswiglu_gate16;
        if (op->dswiglu == FP8T_STEP_DSWIGLU_GATE)
            r->x3 = op->dswiglu_up, r->x3_16 = op->dswiglu_up16;
    } else if (op->ln) {
        const ln_input *ln = op->ln;
        if (ln->rms)
            r->step = ln->res_a ? FP8T_STEP_ADD_RMSNORM : FP8T_STEP_RMSNORM;
        else
            r->step = ln->res_a ? FP8T_STEP_ADD_LAYERNORM : FP8T_STEP_LAYERNORM;
        if (ln->res_a) r->x = ln->res_a, r->x2 = ln->res_c, r->sum = op->x, r->sum16 = ln->sum16;
        r->norm_w = ln->w, r->norm_b = ln->b, r->eps = ln->eps;
        r->mean = ln->mean, r->rstd = ln->rstd;
    }
}

/* The operand r describes, of op's values: its step applied in the rounding pass where the
 * backend can, else composed into op->values first. A read-only hook (the plan fuses a step
 * under one only where the pass can write the values too: plan_step) is shown op->values, which
 * the pass then writes as well. */
static void make_operand_of(fp8t_model *m, const operand *op, fp8t_operand_req *r) {
    operand_step(op, r);
    if (m->hook && r->step != FP8T_STEP_NONE) r->values = op->values;
    model_make_operand(m->ops, m->be, r, op->values);
}

/* the hook at one site; x has rows of stride ld (cols: packed; more only for an observer) */
static void call_hook_ld(fp8t_model *m, int lin, fp8t_gemm_kind g, fp8t_tensor_kind kind,
                         float *x, int rows, int cols, int ld) {
    if (!m->hook) return;
    FP8T_CHECK(ld == cols || m->hook_reads, "a writing hook is shown a strided tensor");
    fp8t_tensor_site s;
    memset(&s, 0, sizeof(s));
    s.layer = model_lin_layer(m, lin);
    s.module = model_lin_module(m, lin);
    s.lin = lin;
    s.gemm = g;
    s.kind = kind;
    s.precision = m->prec[lin][g];
    int role = -1;
    switch (kind) {
    case FP8T_T_INPUT: role = FP8T_ROLE_X; break;
    case FP8T_T_WEIGHT: role = FP8T_ROLE_W; break;
    case FP8T_T_GRAD_OUTPUT: role = FP8T_ROLE_DY; break;
    default: break;
    }
    s.fp8_index = role >= 0 ? fp8_index(lin, role) : -1;
    /* results: the output continues as an activation (E4M3), dX and dW as gradients */
    s.fmt = model_gemm_format(
        m, lin, g, role >= 0 ? role : (kind == FP8T_T_OUTPUT ? FP8T_ROLE_X : FP8T_ROLE_DY));
    s.rows = rows;
    s.cols = cols;
    s.ld = ld;
    m->hook(m->hook_ctx, m, &s, x);
}

static void call_hook(fp8t_model *m, int lin, fp8t_gemm_kind g, fp8t_tensor_kind kind, float *x,
                      int rows, int cols) {
    call_hook_ld(m, lin, g, kind, x, rows, cols, cols);
}

/* The hook's two operand sites of a GEMM that reads W as its B: x [rows, cols] (the Fprop's X,
 * the Dgrad's dY), then W [OUT, IN] */
static void call_hooks_x_w(fp8t_model *m, int lin, fp8t_gemm_kind g, fp8t_tensor_kind kind,
                           float *x, int rows, int cols, const float *W, int OUT, int IN) {
    call_hook(m, lin, g, kind, x, rows, cols);
    /* hooks get a mutable pointer type but must not write weights */
    call_hook(m, lin, g, FP8T_T_WEIGHT, (float *)W, OUT, IN);
}

/* amax -> scale -> scale_inv of tensor t from x, into the current-scaling scratch arrays. */
static void current_scale(fp8t_model *m, int t, const float *x, size_t n, fp8_format fmt) {
    const fp8t_backend_ops *ops = m->ops;
    ops->zero(m->be, m->cur_amax + t, sizeof(float));
    ops->amax(m->be, m->cur_amax + t, x, n);
    ops->compute_scale(m->be, m->cur_scale + t, m->cur_scale_inv + t, m->cur_amax + t,
                       fp8_format_max(fmt), m->policy.epsilon, m->policy.pow2_scales);
}

/* The FP8 codes of a weight for delayed or current scaling, from the per-step cache. */
static void weight_codes(fp8t_model *m, int lin, const operand *op, fp8t_precision prec,
                         fp8t_fp8_operand *q) {
    const fp8t_backend_ops *ops = m->ops;
    const int t = fp8_index(lin, op->role);
    const size_t n = (size_t)op->rows * (size_t)op->cols;
    const fp8_format fmt = model_fp8_format(m, op->role);
    const int slot = prec == FP8T_PREC_DELAYED ? WCACHE_DELAYED : WCACHE_CURRENT;
    weight_cache *c = &m->wcache[lin][slot];
    const float *scale = slot == WCACHE_DELAYED ? m->st.scale + t : m->cur_scale + t;
    const float *scale_inv = slot == WCACHE_DELAYED ? m->st.scale_inv + t : m->cur_scale_inv + t;
    if (!c->codes) { /* first use of this slot: allocate once, kept for the model's life */
        c->codes = ops->malloc(m->be, n);
        if (m->be->fp8_wants_transpose) c->codes_t = ops->malloc(m->be, n);
    }
    float *hist0 = m->st.history + t;
    if (!c->valid) {
        /* the step's amax of W, when asked, from the pass that makes the codes (delayed: the
         * scale is known before it; current scaling took it already, in current_scale) */
        if (slot == WCACHE_CURRENT) current_scale(m, t, op->x, n, fmt);
        if (slot == WCACHE_CURRENT && op->record) ops->amax(m->be, hist0, m->cur_amax + t, 1);
        fp8t_operand_req r = model_operand_req(c->codes, op->x, op->rows, op->cols,
                                               (fp8t_operand_format)fmt, scale);
        r.out.data_t = c->codes_t;
        r.out.amax = slot == WCACHE_DELAYED && op->record ? hist0 : NULL;
        ops->make_operand(m->be, &r);
        c->valid = 1;
    } else if (op->record) { /* made by a frozen forward, which records nothing */
        ops->amax(m->be, hist0, op->x, n);
    }
    q->data = c->codes;
    q->data_t = c->codes_t;
    q->scale_inv = scale_inv;
    q->fmt = fmt;
    q->rows = op->rows;
    q->cols = op->cols;
}

/* The BF16 copy of a weight, from the per-step cache; its amax recorded when asked (by the
 * rounding pass when this call makes the copy). */
static void weight_bf16(fp8t_model *m, int lin, const operand *op, fp8t_bf16_operand *h) {
    const fp8t_backend_ops *ops = m->ops;
    float *hist0 = m->st.history + fp8_index(lin, op->role);
    weight_cache *c = &m->wcache[lin][WCACHE_BF16];
    if (!c->bf16) c->bf16 = ops->malloc(m->be, fp8t_bf16_bytes(op->rows, op->cols));
    if (!c->valid) {
        fp8t_operand_req r =
            model_operand_req(c->bf16, op->x, op->rows, op->cols, FP8T_OPERAND_BF16, NULL);
        r.out.amax = op->record ? hist0 : NULL;
        ops->make_operand(m->be, &r);
        c->valid = 1;
    } else if (op->record) { /* made by a frozen forward, which records nothing */
        ops->amax(m->be, hist0, op->x, (size_t)op->rows * (size_t)op->cols);
    }
    h->data = c->bf16;
    h->rows = op->rows;
    h->cols = op->cols;
}

/* Bring one operand into the form the GEMM of precision prec consumes, recording its amax. */
static void prepare(fp8t_model *m, int lin, const operand *op, fp8t_precision prec,
                    prepared *out) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    const int t = fp8_index(lin, op->role);
    const size_t n = (size_t)op->rows * (size_t)op->cols;
    const fp8_format fmt = model_fp8_format(m, op->role);
    float *hist0 = m->st.history + t; /* slot 0 of tensor t */
    const int is_weight = op->role == FP8T_ROLE_W;
    memset(out, 0, sizeof(*out));
    out->f = op->x;
    FP8T_CHECK(!(op->dgelu_x || op->dgelu_x16) || model_prec_one_pass(m, prec),
               "the fused GELU backward needs a delayed-scaled or BF16-operand Dgrad");
    FP8T_CHECK(!op->ln || model_prec_bf16_operands(m, prec),
               "the fused LayerNorm needs a BF16-operand Fprop");
    FP8T_CHECK((!op->swiglu_up && op->dswiglu == FP8T_STEP_NONE) || model_prec_one_pass(m, prec),
               "the fused SwiGLU and its backward need a delayed-scaled or BF16-operand GEMM, or "
               "the scaled path (linear_plan.c)");

    /* the weight's amax is recorded once per step, whatever the precision; BF16 and FP8 take
     * it (as the activations' below) in the pass that rounds or quantizes the weight */
    if (is_weight && op->record && prec != FP8T_PREC_BF16 && !model_prec_has_codes(prec))
        ops->amax(be, hist0, op->x, n);
    const int record_act = op->record && !is_weight;

    switch (prec) {
    case FP8T_PREC_DELAYED:
    case FP8T_PREC_CURRENT:
        if (is_weight) {
            weight_codes(m, lin, op, prec, &out->q);
            return;
        }
        {
            /* the Wgrad's X is operand B stored [N, IN] (transB = 0): a backend that wants
             * transposed copies reads data_t there, any other reads data, the Fprop's layout */
            uint8_t *codes, *codes_t = NULL;
            if (op->save && !be->fp8_wants_transpose) {
                codes = op->save;
            } else {
                codes = model_scratch(m, &m->codes[op->pos], n);
                if (be->fp8_wants_transpose)
                    codes_t = op->save ? op->save : model_scratch(m, &m->codes_t[op->pos], n);
            }
            /* delayed: the state's scale, known before the pass, which takes the amax too;
             * current: a scale from this tensor's own amax, taken first */
            const int delayed = prec == FP8T_PREC_DELAYED;
            if (!delayed) current_scale(m, t, op->x, n, fmt);
            fp8t_operand_req r =
                model_operand_req(codes, op->x, op->rows, op->cols, (fp8t_operand_format)fmt,
                                  delayed ? m->st.scale + t : m->cur_scale + t);
            r.out.data_t = codes_t;
            r.out.amax = delayed && record_act ? hist0 : NULL;
            make_operand_of(m, op, &r);
            if (!delayed && record_act) ops->amax(be, hist0, m->cur_amax + t, 1);
            out->q.scale_inv = delayed ? m->st.scale_inv + t : m->cur_scale_inv + t;
            out->colsum_done = op->colsum != NULL;
            out->q.data = codes;
            out->q.data_t = codes_t;
            out->q.fmt = fmt;
            out->q.rows = op->rows;
            out->q.cols = op->cols;
        }
        return;
    case FP8T_PREC_FAKE: {
        float *fq = model_scratch(m, &m->fq[op->pos], n * sizeof(float));
        current_scale(m, t, op->x, n, fmt);
        ops->fake_quantize(be, fq, op->x, n, fmt, m->cur_scale + t);
        if (record_act) ops->amax(be, hist0, m->cur_amax + t, 1);
        out->f = fq;
        return;
    }
    case FP8T_PREC_BLOCK: {
        float *fq = model_scratch(m, &m->fq[op->pos], n * sizeof(float));
        if (record_act) ops->amax(be, hist0, op->x, n);
        ops->block_fake_quantize(be, fq, op->x, op->rows, op->cols, op->tile_r, op->tile_c,
                                 model_scaled_format(m, op->role));
        out->f = fq;
        return;
    }
    case FP8T_PREC_MXFP8: {
        float *fq = model_scratch(m, &m->fq[op->pos], n * sizeof(float));
        if (record_act) ops->amax(be, hist0, op->x, n);
        ops->mxfp8_fake_quantize(be, fq, op->x, op->rows, op->cols);
        out->f = fq;
        return;
    }
    case FP8T_PREC_BF16:
        if (m->no_bf16_operands) { /* gemm_bf16 rounds (and takes the amaxes) itself */
            if (op->record) out->amax = hist0;
            return;
        }
        if (is_weight) {
            weight_bf16(m, lin, op, &out->h);
            return;
        }
        {
            uint16_t *h = op->save ? op->save
                                   : model_scratch(m, &m->h16[op->pos],
                                                   fp8t_bf16_bytes(op->rows, op->cols));
            fp8t_operand_req r =
                model_operand_req(h, op->x, op->rows, op->cols, FP8T_OPERAND_BF16, NULL);
            r.out.amax = record_act ? hist0 : NULL;
            make_operand_of(m, op, &r);
            out->colsum_done = op->colsum != NULL;
            out->h.data = h;
            out->h.rows = op->rows;
            out->h.cols = op->cols;
        }
        return;
    case FP8T_PREC_FP32:
    default:
        if (record_act) ops->amax(be, hist0, op->x, n);
        return;
    }
}

/* ---- block and rowwise: the scaled-operand path ----
 * Each operand is quantized K-major by make_operand (block: 1x128 tiles along K for X and
 * dY, 128x128 blocks for W; rowwise: one scale per row over all of K), and gemm_fp8 multiplies
 * the scaled operands (Hopper's cuBLASLt VEC128 / BLK128x128 / OUTER_VEC kernels; the CPU's
 * decode + FP32 GEMM, the exact reference). An operand stored [K, ..] — the Wgrad's dY and X,
 * the Dgrad's W — is the transpose of its tensor, so its tiles (rows) run along the other
 * dimension: the Wgrad's along the tokens. The one pass over a tensor writes both orientations
 * where two GEMMs read it, as the per-tensor FP8 path shares its codes:
 *   X   the Fprop's codes (K = IN) and, when the forward keeps X for the Wgrad
 *       (the plan's save_x), Xᵀ's (K = the tokens) into m->xq[lin]: no FP32 copy of X is kept;
 *   dY  the Dgrad's codes (K = OUT) and dYᵀ's for the Wgrad (the plan's dy_shared), with the bias
 *       gradient (colsum) and GELU's backward (linear_backward_gelu) in the same pass;
 *   W   the Fprop's W and the Dgrad's Wᵀ once per optimizer step, cached;
 * and every amax the recipe history records comes from those passes. The codes and scales are
 * the emulation's (block quantization of each orientation); only the product's summation
 * differs. */

/* On a backend with scaled GEMMs, a linear whose shapes they do not take: said once. */
static void scaled_shape_note(fp8t_model *m, int lin, fp8t_precision p) {
    if (!m->be->fp8_block_native || m->warned_block || model_lin_dims_16(m, lin)) return;
    int in, out;
    model_lin_shape(m, lin, &in, &out);
    fp8t_warnf("%s precision: linear %d (%d tokens, %d in, %d out) is not a "
               "multiple of 16 in every dimension, so its GEMMs %s (reported once)",
               fp8t_precision_name(p), lin, m->B * m->T, in, out,
               p == FP8T_PREC_BLOCK
                   ? "keep the emulation (block quantize and dequantize, FP32 GEMM)"
                   : "run as decode + FP32 GEMM");
    m->warned_block = 1;
}

static fp8t_fp8_scaling scaled_kind(fp8t_precision p, int role) {
    if (p == FP8T_PREC_ROWWISE) return FP8T_SCALING_ROW;
    return role == FP8T_ROLE_W ? FP8T_SCALING_BLK128 : FP8T_SCALING_VEC128;
}

static void scaled_q(fp8t_fp8_operand *q, const uint8_t *codes, const float *sinv, fp8_format fmt,
                     int rows, int cols, fp8t_fp8_scaling k) {
    memset(q, 0, sizeof(*q));
    q->data = codes;
    q->scale_inv = sinv;
    q->fmt = fmt;
    q->rows = rows;
    q->cols = cols;
    q->scaling = k;
}

/* The request for the scaled operand of x [rows, cols]: the caller sets which orientations
 * (data / data_t with their scale_inv) and the amax */
static fp8t_operand_req scaled_req(const fp8t_model *m, const float *x, int rows, int cols,
                                   fp8_format fmt, fp8t_fp8_scaling k) {
    fp8t_operand_req r = model_operand_req(NULL, x, rows, cols, (fp8t_operand_format)fmt, NULL);
    r.out.scaling = k;
    r.out.pow2 = m->policy.pow2_scales;
    return r;
}

/* The weight's codes of orientation t (0: W [OUT, IN], the Fprop's; 1: Wᵀ [IN, OUT], the
 * Dgrad's) from the per-step cache. Making them also makes the other orientation, in the same
 * pass, when the linear's other weight GEMM runs in this precision too (not in a frozen
 * forward, which has no backward); the step's W amax, when asked, from that pass. */
static void scaled_weight(fp8t_model *m, int lin, const operand *op, fp8t_precision prec, int t,
                          fp8t_fp8_operand *q) {
    const fp8t_backend_ops *ops = m->ops;
    const fp8t_fp8_scaling k = scaled_kind(prec, FP8T_ROLE_W);
    const fp8_format fmt = model_scaled_format(m, FP8T_ROLE_W);
    const int R = op->rows, K = op->cols; /* [OUT, IN] as stored */
    const size_t n = (size_t)R * (size_t)K;
    weight_cache *c = &m->wcache[lin][prec == FP8T_PREC_ROWWISE ? WCACHE_ROW : WCACHE_BLOCK];
    const fp8t_gemm_kind other = t ? FP8T_GEMM_FPROP : FP8T_GEMM_DGRAD;
    const int share = !m->frozen && m->prec[lin][other] == prec;
    fp8t_operand_req r = scaled_req(m, op->x, R, K, fmt, k);
    if (!(c->valid & 1) && (t == 0 || share)) {
        if (!c->codes) { /* allocated once, kept for the model's life */
            c->codes = ops->malloc(m->be, n);
            c->bsinv = ops->malloc(m->be, fp8t_block_scale_floats(k, R, K) * sizeof(float));
        }
        r.out.data = c->codes, r.out.scale_inv = c->bsinv;
    }
    if (!(c->valid & 2) && (t == 1 || share)) {
        if (!c->codes_t) {
            c->codes_t = ops->malloc(m->be, n);
            c->bsinv_t = ops->malloc(m->be, fp8t_block_scale_floats(k, K, R) * sizeof(float));
        }
        r.out.data_t = c->codes_t, r.out.scale_inv_t = c->bsinv_t;
    }
    float *hist0 = m->st.history + fp8_index(lin, FP8T_ROLE_W);
    if (r.out.data || r.out.data_t) {
        r.out.amax = op->record ? hist0 : NULL;
        ops->make_operand(m->be, &r);
        c->valid |= (r.out.data ? 1 : 0) | (r.out.data_t ? 2 : 0);
    } else if (op->record) { /* made by a frozen forward, which records nothing */
        ops->amax(m->be, hist0, op->x, n);
    }
    if (t)
        scaled_q(q, c->codes_t, c->bsinv_t, fmt, K, R, k);
    else
        scaled_q(q, c->codes, c->bsinv, fmt, R, K, k);
}

static fp8t_precision wgrad_prec(const fp8t_model *m, int lin);

/* An activation operand (X or dY) in orientation t (0: as stored, 1: transposed) into *q, from
 * one make_operand pass that also writes the other orientation into *other when other is
 * non-NULL: the Fprop's X kept for the Wgrad (op->save: the codes buffer of m->xq[lin]) or the
 * Dgrad's dY for the Wgrad (scratch of slot 0, read before anything else writes it). */
static void scaled_activation(fp8t_model *m, int lin, const operand *op, fp8t_precision prec,
                              int t, fp8t_fp8_operand *q, fp8t_fp8_operand *other) {
    FP8T_CHECK(!op->ln, "the fused LayerNorm needs a BF16-operand Fprop");
    const fp8t_fp8_scaling k = scaled_kind(prec, op->role);
    const fp8_format fmt = model_scaled_format(m, op->role);
    const int rows = op->rows, cols = op->cols;
    const size_t n = (size_t)rows * (size_t)cols;
    const size_t f0 = fp8t_block_scale_floats(k, rows, cols) * sizeof(float);
    const size_t f1 = fp8t_block_scale_floats(k, cols, rows) * sizeof(float);
    const int p = op->pos;
    uint8_t *c0 = NULL, *c1 = NULL;
    float *s0 = NULL, *s1 = NULL;
    if (t == 0 || other) {
        c0 = model_scratch(m, &m->codes[p], n);
        s0 = model_scratch(m, &m->bsc[p], f0);
    }
    if (t == 1 || other) {
        if (op->save) {
            x_codes *xq = &m->xq[lin];
            if (xq->bsinv_floats < f1 / sizeof(float)) {
                if (xq->bsinv) m->ops->free(m->be, xq->bsinv);
                xq->bsinv = model_act_malloc(m, f1);
                xq->bsinv_floats = f1 / sizeof(float);
            }
            c1 = op->save;
            s1 = xq->bsinv;
        } else {
            c1 = model_scratch(m, &m->codes_t[p], n);
            s1 = model_scratch(m, &m->bsc_t[p], f1);
        }
    }
    fp8t_operand_req r = scaled_req(m, op->x, rows, cols, fmt, k);
    r.out.data = c0, r.out.scale_inv = s0, r.out.data_t = c1, r.out.scale_inv_t = s1;
    r.out.amax = op->record ? m->st.history + fp8_index(lin, op->role) : NULL;
    make_operand_of(m, op, &r);
    if (c0) scaled_q(t == 0 ? q : other, c0, s0, fmt, rows, cols, k);
    if (c1) scaled_q(t == 1 ? q : other, c1, s1, fmt, cols, rows, k);
}

/* run_gemm of a precision on the scaled path (model_scaled_path): A as [M, K] and B as [N, K].
 * keep_a (may be NULL) gets what another GEMM takes from this GEMM's A: the Dgrad's dYᵀ (the
 * Wgrad's), the Fprop's X operand itself (up's Fprop: the plan's x_shared). */
static void scaled_gemm(fp8t_model *m, int lin, fp8t_gemm_kind g, fp8t_precision prec, float *C,
                        const operand *a, const operand *b, int M, int N, int K, int transA,
                        int transB, int acc, prepared *keep_a, const prepared *given_a,
                        const prepared *given_b, const float *bias) {
    prepared pa, pb, ka;
    fp8t_fp8_operand saved; /* the Fprop's Xᵀ, written into m->xq[lin] */
    memset(&pa, 0, sizeof(pa));
    memset(&pb, 0, sizeof(pb));
    memset(&ka, 0, sizeof(ka));
    scaled_shape_note(m, lin, prec);
    if (given_a) {
        pa = *given_a;
    } else {
        /* the Dgrad's dY also makes the Wgrad's dYᵀ when the Wgrad will take it */
        const int both =
            g == FP8T_GEMM_DGRAD && keep_a && model_plan_reuse_dy(m, lin, wgrad_prec(m, lin));
        scaled_activation(m, lin, a, prec, transA, &pa.q, both ? &ka.q : a->save ? &saved : NULL);
        ka.colsum_done = a->colsum != NULL;
    }
    if (given_b) {
        pb = *given_b;
    } else if (b->role == FP8T_ROLE_W) {
        scaled_weight(m, lin, b, prec, !transB, &pb.q);
    } else {
        scaled_activation(m, lin, b, prec, !transB, &pb.q, NULL);
    }
    if (keep_a) *keep_a = g == FP8T_GEMM_FPROP ? pa : ka;
    FP8T_CHECK(pa.q.rows == M && pa.q.cols == K && pb.q.rows == N && pb.q.cols == K,
               "scaled GEMM operands [%d,%d] x [%d,%d] for M=%d N=%d K=%d", pa.q.rows, pa.q.cols,
               pb.q.rows, pb.q.cols, M, N, K);
    const int fast =
        g == FP8T_GEMM_FPROP ? m->policy.fast_accum_fprop : m->policy.fast_accum_grad;
    m->ops->gemm_fp8(m->be, C, &pa.q, &pb.q, M, N, K, 0, 1, acc, fast, NULL, bias);
}

/* The LM head's BF16 GEMMs under a read-only hook where the plan says so (token_chunk): the
 * unhooked chunked head's calls (head.c), one chunk of tokens at a time (the token dimension is
 * M of the Fprop and the Dgrad, K of the Wgrad, which sums its chunks in order), into and from
 * the whole-batch buffers the hook is shown. So the observed run gets the chunked head's
 * kernels and bits, and cuBLASLt's faster choices for those shapes (an unchunked 32768-row
 * head GEMM ran at 350-500 TFLOP/s on the H100, the chunks' at 560-730). */
static void gemm_bf16_token_chunks(fp8t_model *m, int rows, fp8t_gemm_kind g, float *C, int ldc,
                                   const fp8t_bf16_operand *A, const fp8t_bf16_operand *B, int M,
                                   int N, int K, int transA, int transB, int acc) {
    const int wgrad = g == FP8T_GEMM_WGRAD, T = wgrad ? K : M;
    for (int r0 = 0; r0 < T; r0 += rows) {
        const int n = T - r0 < rows ? T - r0 : rows;
        const fp8t_bf16_operand a = fp8t_bf16_rows(A, r0, n);
        if (wgrad) {
            const fp8t_bf16_operand b = fp8t_bf16_rows(B, r0, n);
            m->ops->gemm_bf16_rounded(m->be, C, &a, &b, M, N, n, transA, transB, acc || r0 > 0,
                                      NULL, ldc);
        } else {
            m->ops->gemm_bf16_rounded(m->be, C + (size_t)r0 * (size_t)(ldc ? ldc : N), &a, B, n,
                                      N, K, transA, transB, acc, NULL, ldc);
        }
    }
}

/* C[M,N] (row stride ldc, 0: N; only with BF16 operands) (= or +=) op(A)·op(B) in precision
 * prec. A's prepared form is copied to *keep_a
 * when keep_a is non-NULL; when given_a / given_b is non-NULL it is used instead of preparing
 * that operand (the caller vouches that it is what prepare would make now: same tensor,
 * precision, format and scale, and its codes untouched since). bias [N] (only when
 * the plan puts the bias in the GEMM, acc = 0) is added to every row. */
static void run_gemm(fp8t_model *m, int lin, fp8t_gemm_kind g, fp8t_precision prec, float *C,
                     int ldc, const operand *a, const operand *b, int M, int N, int K, int transA,
                     int transB, int acc, prepared *keep_a, const prepared *given_a,
                     const prepared *given_b, const float *bias) {
    FP8T_CHECK(ldc == 0 || model_prec_bf16_operands(m, prec),
               "a strided GEMM result needs BF16 operands (linear_bf16_dy_fusable)");
    prepared pa, pb;
    if (ldc == 0 && model_scaled_path(m, lin, prec)) {
        scaled_gemm(m, lin, g, prec, C, a, b, M, N, K, transA, transB, acc, keep_a, given_a,
                    given_b, bias);
        return;
    }
    if (prec == FP8T_PREC_BLOCK) scaled_shape_note(m, lin, prec);
    if (given_a)
        pa = *given_a;
    else
        prepare(m, lin, a, prec, &pa);
    if (keep_a) *keep_a = pa;
    if (given_b)
        pb = *given_b;
    else
        prepare(m, lin, b, prec, &pb);
    fp8t_backend *be = m->be;
    switch (prec) {
    case FP8T_PREC_DELAYED:
    case FP8T_PREC_CURRENT: {
        int fast = g == FP8T_GEMM_FPROP ? m->policy.fast_accum_fprop : m->policy.fast_accum_grad;
        m->ops->gemm_fp8(be, C, &pa.q, &pb.q, M, N, K, transA, transB, acc, fast, NULL, bias);
        break;
    }
    case FP8T_PREC_BF16:
    case FP8T_PREC_FAKE:
        /* fake's quantize-dequantized floats; bf16 under FP8T_DISABLE_BF16_OPERANDS */
        if (!model_prec_bf16_operands(m, prec))
            m->ops->gemm_bf16(be, C, pa.f, pb.f, M, N, K, transA, transB, acc, pa.amax, pb.amax);
        else if (m->plan[lin].token_chunk && !bias)
            gemm_bf16_token_chunks(m, m->plan[lin].token_chunk, g, C, ldc, &pa.h, &pb.h, M, N, K,
                                   transA, transB, acc);
        else
            m->ops->gemm_bf16_rounded(be, C, &pa.h, &pb.h, M, N, K, transA, transB, acc, bias,
                                      ldc);
        break;
    default: /* fp32, and block / mxfp8 whose operands are already quantize-dequantized */
        m->ops->gemm_f32(be, C, pa.f, pb.f, M, N, K, transA, transB, acc);
        break;
    }
}

/* replay: linear_forward_replay (no hooks, nothing recorded). step (may be NULL): an operand
 * with only its producer step set (gelu, gelu_bias, ln, values): X is GELU's input and the
 * operand is made of gelu(X (+ gelu_bias)), or X is the norm's input (only where the plan
 * fuses the step: step_fused). */
static void fprop(fp8t_model *m, int lin, float *Y, int ldy, float *X, const operand *step,
                  const float *W, const float *bias, int N, int IN, int OUT, int replay) {
    float *Wm = (float *)W; /* the operand takes a mutable pointer type; nothing writes W */
    /* with a fused step the operand's values exist only after the pass: a read-only hook (the
     * only one the plan fuses under) is shown them, and W, after the GEMM, in the same order */
    const int hooks_after = step && m->hook;
    if (!replay && !hooks_after)
        call_hooks_x_w(m, lin, FP8T_GEMM_FPROP, FP8T_T_INPUT, X, N, IN, W, OUT, IN);
    /* frozen (validation, shadow): no amax, and the step's W amax is still to be recorded by
     * its first training forward */
    const int record = !m->frozen && !replay;
    /* a training forward whose plan keeps X's codes for the Wgrad (save_x) */
    x_codes *xq = &m->xq[lin];
    const int save = record && xq->saved;
    const fp8t_precision prec = m->prec[lin][FP8T_GEMM_FPROP];
    /* up takes the operand gate's Fprop just made of the same X, and keeps none of its own */
    const linear_plan *pl = &m->plan[lin];
    shared_x_operand *sx = &m->x_share;
    const int take = !replay && pl->x_shared && sx->valid && sx->x == X && !step;
    sx->valid = 0;
    prepared given;
    if (take) {
        memset(&given, 0, sizeof(given));
        given.q = sx->q, given.h = sx->h;
        if (record) /* X's amax: gate's pass took it from the same values */
            m->ops->amax(m->be, m->st.history + fp8_index(lin, FP8T_ROLE_X),
                         m->st.history + fp8_index(lin - 1, FP8T_ROLE_X), 1);
    }
    void *save_buf = NULL; /* none where up takes gate's operand: its Wgrad reads gate's X */
    if (save && !take && prec == FP8T_PREC_BF16) {
        if (!xq->bf16) xq->bf16 = model_act_malloc(m, fp8t_bf16_bytes(N, IN));
        save_buf = xq->bf16;
    } else if (save && !take) {
        if (!xq->codes) xq->codes = model_act_malloc(m, (size_t)N * (size_t)IN);
        save_buf = xq->codes;
    }
    operand a = step ? *step : (operand){0};
    a.x = X, a.rows = N, a.cols = IN, a.role = FP8T_ROLE_X, a.record = record;
    a.tile_r = 1, a.tile_c = 128, a.pos = 0, a.save = save_buf;
    operand b = {.x = Wm,
                 .rows = OUT,
                 .cols = IN,
                 .role = FP8T_ROLE_W,
                 .record = record && !m->w_amax_done[lin],
                 .tile_r = 128,
                 .tile_c = 128,
                 .pos = 1};
    /* the bias goes into the GEMM unless a hook must see the output without it */
    const int fuse_bias = bias && (replay ? pl->bias_gemm_replay : pl->bias_gemm);
    prepared pa;
    run_gemm(m, lin, FP8T_GEMM_FPROP, prec, Y, ldy, &a, &b, N, OUT, IN, 0, 1, 0, &pa,
             take ? &given : NULL, NULL, fuse_bias ? bias : NULL);
    if (save) {
        xq->scale_inv = pa.q.scale_inv;
        xq->prec = prec;
        xq->shared = take;
    }
    /* gate: its operand for up's Fprop (the plan's x_shared) */
    if (!replay && lin + 1 < m->n_lin && m->plan[lin + 1].x_shared &&
        model_lin_module(m, lin) == FP8T_MOD_GATE) {
        sx->x = step ? step->values : X; /* the norm's output, where gate's pass made it */
        sx->q = pa.q, sx->h = pa.h;
        sx->valid = 1;
    }
    if (record) m->w_amax_done[lin] = 1;
    if (!replay && hooks_after)
        call_hooks_x_w(m, lin, FP8T_GEMM_FPROP, FP8T_T_INPUT, step->values, N, IN, W, OUT, IN);
    if (!replay) call_hook_ld(m, lin, FP8T_GEMM_FPROP, FP8T_T_OUTPUT, Y, N, OUT, ldy ? ldy : OUT);
    if (bias && !fuse_bias) m->ops->bias_add(m->be, Y, bias, N, OUT);
}

void linear_forward(fp8t_model *m, int lin, float *Y, float *X, const float *W, const float *bias,
                    int N, int IN, int OUT) {
    fprop(m, lin, Y, 0, X, NULL, W, bias, N, IN, OUT, 0);
}

void linear_forward_replay(fp8t_model *m, int lin, float *Y, float *X, const float *W,
                           const float *bias, int N, int IN, int OUT) {
    fprop(m, lin, Y, 0, X, NULL, W, bias, N, IN, OUT, 1);
}

int linear_residual_takes_bias(const fp8t_model *m, int lin) {
    return m->plan[lin].bias_residual;
}

int linear_gelu_takes_bias(const fp8t_model *m, int fc1) {
    return m->plan[fc1].bias_next[m->frozen];
}

void linear_forward_gelu(fp8t_model *m, int lin, float *Y, float *act, float *pre,
                         const float *pre_bias, uint16_t *pre16, const float *W,
                         const float *bias, int N, int IN, int OUT) {
    if (m->plan[lin].step_fused[m->frozen]) {
        FP8T_CHECK(!pre_bias || m->prec[lin][FP8T_GEMM_FPROP] == FP8T_PREC_DELAYED ||
                       m->plan[lin].scaled[FP8T_GEMM_FPROP],
                   "a deferred bias needs a delayed-scaled or scaled-path fc2 "
                   "(linear_gelu_takes_bias)");
        const operand gelu = {
            .gelu = 1, .gelu_bias = pre_bias, .gelu_save16 = pre16, .values = act};
        fprop(m, lin, Y, 0, pre, &gelu, W, bias, N, IN, OUT, 0);
        return;
    }
    FP8T_CHECK(!pre_bias, "a deferred bias without the GELU fusion (linear_gelu_takes_bias)");
    if (pre16) m->ops->bf16_pack(m->be, pre16, pre, NULL, N, IN);
    m->ops->gelu_forward(m->be, act, pre, (size_t)N * (size_t)IN);
    fprop(m, lin, Y, 0, act, NULL, W, bias, N, IN, OUT, 0);
}

void linear_forward_swiglu(fp8t_model *m, int lin, float *Y, float *act, const float *gate,
                           const float *up, uint16_t *gate16, uint16_t *up16, const float *W,
                           int N, int IN, int OUT) {
    if (m->plan[lin].step_fused[m->frozen]) {
        const operand swiglu = {.swiglu_up = up, .swiglu_save16 = {gate16, up16}, .values = act};
        fprop(m, lin, Y, 0, (float *)gate, &swiglu, W, NULL, N, IN, OUT, 0);
        return;
    }
    m->ops->swiglu_forward(m->be, act, gate, up, gate16, up16, (size_t)N * (size_t)IN);
    fprop(m, lin, Y, 0, act, NULL, W, NULL, N, IN, OUT, 0);
}

void linear_forward_ln(fp8t_model *m, int lin, float *Y, float *ln_out, const ln_input *ln,
                       float *x, const float *W, const float *bias, int N, int IN, int OUT) {
    if (m->plan[lin].step_fused[m->frozen]) {
        const operand norm = {.ln = ln, .values = ln_out};
        fprop(m, lin, Y, 0, x, &norm, W, bias, N, IN, OUT, 0);
        return;
    }
    /* the norm (after the residual add into x) composed of the unfused ops into ln_out */
    const operand norm = {.x = x, .ln = ln};
    fp8t_operand_req r;
    memset(&r, 0, sizeof(r));
    operand_step(&norm, &r);
    r.out.rows = N, r.out.cols = IN;
    fp8t_operand_step_values(m->ops, m->be, &r, ln_out, NULL);
    fprop(m, lin, Y, 0, ln_out, NULL, W, bias, N, IN, OUT, 0);
}

/* The Wgrad's X from what the forward saved: the BF16 operand, or the codes (data or data_t as
 * prepare wrote them). */
static void saved_x(const fp8t_model *m, int lin, int N, int IN, prepared *out) {
    /* up's forward kept none of its own where it took gate's operand: gate's (the same X) */
    const x_codes *xq = m->xq[lin].shared ? &m->xq[lin - 1] : &m->xq[lin];
    memset(out, 0, sizeof(*out));
    if (model_prec_scaled(xq->prec)) { /* Xᵀ [IN, N], the Wgrad's K-major B */
        scaled_q(&out->q, xq->codes, xq->bsinv, model_scaled_format(m, FP8T_ROLE_X), IN, N,
                 scaled_kind(xq->prec, FP8T_ROLE_X));
        return;
    }
    if (xq->prec == FP8T_PREC_BF16) {
        out->h.data = xq->bf16;
        out->h.rows = N;
        out->h.cols = IN;
        return;
    }
    if (m->be->fp8_wants_transpose)
        out->q.data_t = xq->codes;
    else
        out->q.data = xq->codes;
    out->q.scale_inv = xq->scale_inv;
    out->q.fmt = model_fp8_format(m, FP8T_ROLE_X);
    out->q.rows = N;
    out->q.cols = IN;
}

/* The Wgrad's precision: the one that made X's saved codes (or BF16 operand), else the
 * policy's. */
static fp8t_precision wgrad_prec(const fp8t_model *m, int lin) {
    return m->xq[lin].saved ? m->xq[lin].prec : m->prec[lin][FP8T_GEMM_WGRAD];
}

/* Whether a Wgrad accumulates straight into dW: always without a hook; with one while the
 * gradients are still zero (dW is then this micro-batch's alone, which the hook is shown, and the
 * GEMM the unhooked path's), else it goes through a scratch accumulated after the hook. */
static int wgrad_into_dw(const fp8t_model *m) { return !m->hook || m->grads_zero; }

/* linear_backward; step (may be NULL): an operand with only dY's producer step set (dgelu_x /
 * dgelu_x16 with dgelu_bias, or dswiglu with its inputs, and values): dY is then that step of
 * the gradient given as dY (linear_backward_gelu, linear_backward_dswiglu: only where the plan
 * fuses it, so that nothing reads dY in FP32), values [N, OUT] where dY goes in FP32 if the
 * backend composes the step */
static void backward(fp8t_model *m, int lin, float *dX, float *dW, float *dbias, float *dY,
                     const operand *step, float *X, const float *W, int N, int IN, int OUT) {
    float *Wm = (float *)W;
    /* X as the forward left it: FP8 codes (then X itself is gone, and the Wgrad runs in the
     * precision that made them) or FP32 */
    const int from_codes = m->xq[lin].saved;
    const fp8t_precision wprec = wgrad_prec(m, lin);
    if (from_codes && ((m->hook && !m->hook_reads) || wprec != m->prec[lin][FP8T_GEMM_WGRAD]) &&
        !m->warned_saved) {
        fp8t_warnf("fp8t_model_backward: a hook was set or the precision policy changed "
                   "between the forward and this backward; the Wgrads whose forward kept "
                   "FP8 codes of X instead of X run from those codes in the forward's "
                   "precision and show no X to the hook (the change applies from the next "
                   "forward; --disable fp8-save keeps every X)");
        m->warned_saved = 1;
    }
    /* Dgrad: dX[N,IN] = dY[N,OUT]·W[OUT,IN]; dY's amax is recorded here, once. With a fused
     * step dY exists only after the Dgrad's pass: a read-only hook is shown it (step->values,
     * which the pass writes) and W after the GEMM, in the same order. */
    const int hooks_after = step && m->hook;
    float *dy_shown = hooks_after ? step->values : dY;
    if (!hooks_after)
        call_hooks_x_w(m, lin, FP8T_GEMM_DGRAD, FP8T_T_GRAD_OUTPUT, dY, N, OUT, W, OUT, IN);
    /* the bias gradient from the Dgrad's rounding pass over dY, unless a hook may change dY
     * before the Wgrad (bias_backward reads it after both) */
    float *colsum = dbias && m->plan[lin].colsum ? dbias : NULL;
    operand dy_d = step ? *step : (operand){0};
    dy_d.x = dY, dy_d.rows = N, dy_d.cols = OUT, dy_d.role = FP8T_ROLE_DY, dy_d.record = 1;
    dy_d.tile_r = 1, dy_d.tile_c = 128, dy_d.pos = 0, dy_d.colsum = colsum;
    operand w_d = {.x = Wm,
                   .rows = OUT,
                   .cols = IN,
                   .role = FP8T_ROLE_W,
                   .tile_r = 128,
                   .tile_c = 128,
                   .pos = 1};
    const int reuse = model_plan_reuse_dy(m, lin, wprec);
    FP8T_CHECK(!step || (reuse && (colsum || !dbias)),
               "a fused dY step (GELU's or SwiGLU's backward) leaves no FP32 dY for the Wgrad "
               "or bias_backward");
    prepared dy_q; /* dY as the Dgrad took it (codes / operand), for the Wgrad when reuse */
    run_gemm(m, lin, FP8T_GEMM_DGRAD, m->prec[lin][FP8T_GEMM_DGRAD], dX, 0, &dy_d, &w_d, N, IN,
             OUT, 0, 0, 0, &dy_q, NULL, NULL, NULL);
    if (hooks_after)
        call_hooks_x_w(m, lin, FP8T_GEMM_DGRAD, FP8T_T_GRAD_OUTPUT, dy_shown, N, OUT, W, OUT, IN);
    call_hook(m, lin, FP8T_GEMM_DGRAD, FP8T_T_DGRAD, dX, N, IN);

    /* Wgrad: dW[OUT,IN] += dYᵀ·X, reduction over the N tokens (block tiles 128x1) */
    call_hook(m, lin, FP8T_GEMM_WGRAD, FP8T_T_GRAD_OUTPUT, dy_shown, N, OUT);
    /* from codes, a read-only hook gets NULL: X is the Fprop's, which it saw */
    if (!from_codes || m->hook_reads)
        call_hook(m, lin, FP8T_GEMM_WGRAD, FP8T_T_INPUT, from_codes ? NULL : X, N, IN);
    operand dy_w = {.x = dY,
                    .rows = N,
                    .cols = OUT,
                    .role = FP8T_ROLE_DY,
                    .tile_r = 128,
                    .tile_c = 1,
                    .pos = 0};
    operand x_w = {
        .x = X, .rows = N, .cols = IN, .role = FP8T_ROLE_X, .tile_r = 128, .tile_c = 1, .pos = 1};
    prepared x_q; /* X's codes from the forward, when from_codes */
    if (from_codes) saved_x(m, lin, N, IN, &x_q);
    /* dY's codes from the Dgrad where reuse allows (a read-only hook too) */
    const int direct = wgrad_into_dw(m);
    float *out = direct ? dW : model_scratch(m, &m->wgrad_tmp, (size_t)OUT * IN * sizeof(float));
    run_gemm(m, lin, FP8T_GEMM_WGRAD, wprec, out, 0, &dy_w, &x_w, OUT, IN, N, 1, 0, direct, NULL,
             reuse ? &dy_q : NULL, from_codes ? &x_q : NULL, NULL);
    call_hook(m, lin, FP8T_GEMM_WGRAD, FP8T_T_WGRAD, out, OUT, IN);
    if (!direct) m->ops->accumulate(m->be, dW, out, (size_t)OUT * IN);
    if (dbias && !dy_q.colsum_done) m->ops->bias_backward(m->be, dbias, dY, N, OUT);
}

void linear_backward(fp8t_model *m, int lin, float *dX, float *dW, float *dbias, float *dY,
                     float *X, const float *W, int N, int IN, int OUT) {
    backward(m, lin, dX, dW, dbias, dY, NULL, X, W, N, IN, OUT);
}

int linear_dgelu_fused(const fp8t_model *m, int lin, int has_bias) {
    /* the Wgrad takes the Dgrad's dY and the bias gradient comes from the same pass (nothing
     * else reads dY in FP32) */
    const linear_plan *pl = &m->plan[lin];
    return pl->dgelu && (!has_bias || pl->colsum) &&
           model_plan_reuse_dy(m, lin, wgrad_prec(m, lin));
}

void linear_backward_gelu(fp8t_model *m, int lin, float *dX, float *dW, float *dbias, float *dpre,
                          const float *dact, const float *pre, const uint16_t *pre16,
                          const float *pre_bias, float *X, const float *W, int N, int IN,
                          int OUT) {
    const int fused = linear_dgelu_fused(m, lin, dbias != NULL);
    FP8T_CHECK(!pre16 || (!pre && !pre_bias && fused),
               "GELU's input from its BF16 save: only in the fused GELU backward, which the "
               "save's bias is in (linear_dgelu_fused)");
    if (fused) {
        const operand dgelu = {
            .dgelu_x = pre, .dgelu_x16 = pre16, .dgelu_bias = pre_bias, .values = dpre};
        backward(m, lin, dX, dW, dbias, (float *)dact, &dgelu, X, W, N, IN, OUT);
        return;
    }
    if (pre_bias)
        m->ops->gelu_backward_bias(m->be, dpre, pre, pre_bias, dact, N, OUT);
    else
        m->ops->gelu_backward(m->be, dpre, pre, dact, (size_t)N * (size_t)OUT);
    backward(m, lin, dX, dW, dbias, dpre, NULL, X, W, N, IN, OUT);
}

int linear_dswiglu_fused(const fp8t_model *m, int gate_lin) {
    /* both Dgrads make their dY in the pass, and each Wgrad takes its Dgrad's dY */
    for (int lin = gate_lin; lin <= gate_lin + 1; lin++)
        if (!m->plan[lin].dswiglu || !model_plan_reuse_dy(m, lin, wgrad_prec(m, lin))) return 0;
    return 1;
}

void linear_backward_dswiglu(fp8t_model *m, int lin, float *dX, float *dW, const float *dact,
                             const float *gate, const uint16_t *gate16, const float *up,
                             const uint16_t *up16, float *X, const float *W, int N, int IN,
                             int OUT) {
    /* the gradient is the module's: gate's, or up's (operand_step leaves up out of that one) */
    const int is_gate = model_lin_module(m, lin) == FP8T_MOD_GATE;
    FP8T_CHECK((is_gate || model_lin_module(m, lin) == FP8T_MOD_UP) &&
                   linear_dswiglu_fused(m, is_gate ? lin : lin - 1),
               "linear_backward_dswiglu: linear %d is not a gate or up where "
               "linear_dswiglu_fused",
               lin);
    const operand dsw = {.dswiglu = is_gate ? FP8T_STEP_DSWIGLU_GATE : FP8T_STEP_DSWIGLU_UP,
                         .dswiglu_gate = gate,
                         .dswiglu_gate16 = gate16,
                         .dswiglu_up = up,
                         .dswiglu_up16 = up16};
    backward(m, lin, dX, dW, NULL, (float *)dact, &dsw, X, W, N, IN, OUT);
}

int linear_bf16_dy_fusable(const fp8t_model *m, int lin) { return m->plan[lin].bf16_dy; }

void linear_forward_ld(fp8t_model *m, int lin, float *Y, int ldy, float *X, const float *W, int N,
                       int IN, int OUT) {
    FP8T_CHECK(linear_bf16_dy_fusable(m, lin) && ldy >= fp8t_bf16_pad(OUT),
               "linear_forward_ld: BF16 operands and ldy >= pad(OUT) only");
    fprop(m, lin, Y, ldy, X, NULL, W, NULL, N, IN, OUT, 0);
}

void linear_backward_bf16_dy(fp8t_model *m, int lin, float *dX, float *dW,
                             const fp8t_bf16_operand *dy, float *dy_amax, float *dy32, int ld,
                             float *X, const float *W, int N, int IN, int OUT, float r) {
    const fp8t_precision bf = FP8T_PREC_BF16;
    if ((m->prec[lin][FP8T_GEMM_DGRAD] != bf || m->prec[lin][FP8T_GEMM_WGRAD] != bf) &&
        !m->warned_saved) {
        fp8t_warnf("fp8t_model_backward: the precision policy changed between the forward "
                   "and this backward; the head's Dgrad and Wgrad run in BF16 from the "
                   "gradient the forward rounded (the change applies from the next "
                   "forward)");
        m->warned_saved = 1;
    }
    FP8T_CHECK(dy->rows == N && dy->cols == OUT, "linear_backward_bf16_dy: dY is not [N, OUT]");
    FP8T_CHECK(!m->hook || (m->hook_reads && ld >= OUT),
               "linear_backward_bf16_dy: a writing hook, or dY's rows narrower than OUT");
    /* dY's amax into its history slot, as the plain path's rounding pass records it */
    if (r != 1.0f) m->ops->scale(m->be, dy_amax, fabsf(r), 1);
    m->ops->amax(m->be, m->st.history + fp8_index(lin, FP8T_ROLE_DY), dy_amax, 1);
    prepared pdy;
    memset(&pdy, 0, sizeof(pdy));
    pdy.h = *dy;
    const int from_codes = m->xq[lin].saved;
    FP8T_CHECK(!from_codes || m->xq[lin].prec == bf, "linear_backward_bf16_dy: X kept as codes");
    operand w_d = {.x = (float *)W, .rows = OUT, .cols = IN, .role = FP8T_ROLE_W, .pos = 1};
    operand x_w = {.x = X, .rows = N, .cols = IN, .role = FP8T_ROLE_X, .pos = 1};
    prepared x_q;
    if (from_codes) saved_x(m, lin, N, IN, &x_q);
    /* the hook's sites in backward's order: dY as the product scales it (the floats between
     * rows scaled too: never read) */
    if (dy32 && r != 1.0f) m->ops->scale(m->be, dy32, r, (size_t)(N - 1) * ld + OUT);
    call_hook_ld(m, lin, FP8T_GEMM_DGRAD, FP8T_T_GRAD_OUTPUT, dy32, N, OUT, ld);
    call_hook(m, lin, FP8T_GEMM_DGRAD, FP8T_T_WEIGHT, (float *)W, OUT, IN);
    /* Dgrad dX = dY·W, Wgrad dW += dYᵀ·X on the same operand. With r != 1 (the gradient the
     * forward folded in used another dloss) both products are scaled by r afterwards: the dW
     * of this micro-batch goes through scratch so that only it is scaled (and, with a hook,
     * so that the hook sees it alone). */
    run_gemm(m, lin, FP8T_GEMM_DGRAD, bf, dX, 0, NULL, &w_d, N, IN, OUT, 0, 0, 0, NULL, &pdy,
             NULL, NULL);
    if (r != 1.0f) m->ops->scale(m->be, dX, r, (size_t)N * IN);
    call_hook(m, lin, FP8T_GEMM_DGRAD, FP8T_T_DGRAD, dX, N, IN);
    call_hook_ld(m, lin, FP8T_GEMM_WGRAD, FP8T_T_GRAD_OUTPUT, dy32, N, OUT, ld);
    call_hook(m, lin, FP8T_GEMM_WGRAD, FP8T_T_INPUT, from_codes ? NULL : X, N, IN);
    if (r == 1.0f && wgrad_into_dw(m)) {
        run_gemm(m, lin, FP8T_GEMM_WGRAD, bf, dW, 0, NULL, &x_w, OUT, IN, N, 1, 0, 1, NULL, &pdy,
                 from_codes ? &x_q : NULL, NULL);
        call_hook(m, lin, FP8T_GEMM_WGRAD, FP8T_T_WGRAD, dW, OUT, IN);
        return;
    }
    float *tmp = model_scratch(m, &m->wgrad_tmp, (size_t)OUT * IN * sizeof(float));
    run_gemm(m, lin, FP8T_GEMM_WGRAD, bf, tmp, 0, NULL, &x_w, OUT, IN, N, 1, 0, 0, NULL, &pdy,
             from_codes ? &x_q : NULL, NULL);
    if (r != 1.0f) m->ops->scale(m->be, tmp, r, (size_t)OUT * IN);
    call_hook(m, lin, FP8T_GEMM_WGRAD, FP8T_T_WGRAD, tmp, OUT, IN);
    m->ops->accumulate(m->be, dW, tmp, (size_t)OUT * IN);
}

void linear_bf16_fprop_operands(fp8t_model *m, int lin, float *X, const float *W, int N, int IN,
                                int OUT, int record, fp8t_bf16_operand *x, fp8t_bf16_operand *w) {
    FP8T_CHECK(linear_bf16_dy_fusable(m, lin) && !m->xq[lin].saved,
               "linear_bf16_fprop_operands: BF16 operands (linear_bf16_dy_fusable), no X kept "
               "for a later Wgrad");
    /* fprop's operands and recording, without its GEMM and hooks */
    record = record && !m->frozen;
    operand a = {.x = X,
                 .rows = N,
                 .cols = IN,
                 .role = FP8T_ROLE_X,
                 .record = record,
                 .tile_r = 1,
                 .tile_c = 128,
                 .pos = 0};
    operand b = {.x = (float *)W,
                 .rows = OUT,
                 .cols = IN,
                 .role = FP8T_ROLE_W,
                 .record = record && !m->w_amax_done[lin],
                 .tile_r = 128,
                 .tile_c = 128,
                 .pos = 1};
    prepared pa, pb;
    prepare(m, lin, &a, FP8T_PREC_BF16, &pa);
    prepare(m, lin, &b, FP8T_PREC_BF16, &pb);
    if (record) m->w_amax_done[lin] = 1;
    *x = pa.h;
    *w = pb.h;
}
