/* Model lifetime and bookkeeping: creation (every buffer carved from one allocation each for
 * parameters, gradients, AdamW moments, activations), the precision table, the optimizer step
 * and the end-of-step FP8 update. The inputs only a Wgrad reads again are the exception:
 * allocated per layer when a forward first needs them in FP32 (model_forward_saves). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "fp8train/error.h"
#include "model/model_internal.h"

/* ---- small helpers shared by the model files ---- */

void *model_scratch(fp8t_model *m, scratch_buf *s, size_t bytes) {
    if (bytes > s->bytes) {
        /* grows only while the first step meets ever larger operands (exact sizes, so a
         * model whose head stays BF16 never pays for an FP8 copy of the [N, V] logits) */
        if (s->p) m->ops->free(m->be, s->p);
        s->p = m->ops->malloc(m->be, bytes);
        s->bytes = bytes;
    }
    return s->p;
}

void *model_act_malloc(fp8t_model *m, size_t bytes) {
    m->act_lazy_bytes += bytes;
    return m->ops->malloc(m->be, bytes);
}

fp8_format model_fp8_format(const fp8t_model *m, int role) {
    return (role == FP8T_ROLE_DY && m->policy.hybrid) ? FP8_E5M2 : FP8_E4M3;
}

fp8_format model_scaled_format(const fp8t_model *m, int role) {
    return (role == FP8T_ROLE_DY && m->policy.block_hybrid) ? FP8_E5M2 : FP8_E4M3;
}

fp8_format model_gemm_format(const fp8t_model *m, int lin, fp8t_gemm_kind g, int role) {
    if (lin >= 0 && lin < m->n_lin && model_prec_scaled(m->prec[lin][g]))
        return model_scaled_format(m, role);
    return model_fp8_format(m, role);
}

int model_lin_layer(const fp8t_model *m, int lin) {
    int mpl = fp8t_model_modules_per_layer(&m->cfg);
    return lin >= m->cfg.n_layer * mpl ? -1 : lin / mpl;
}

fp8t_module model_lin_module(const fp8t_model *m, int lin) {
    int mpl = fp8t_model_modules_per_layer(&m->cfg);
    if (lin >= m->cfg.n_layer * mpl) return FP8T_MOD_HEAD;
    return fp8t_model_module_of_slot(&m->cfg, lin % mpl);
}

void model_invalidate_weight_caches(fp8t_model *m) {
    for (int l = 0; l < m->n_lin; l++) {
        for (int s = 0; s < WCACHE_SLOTS; s++) m->wcache[l][s].valid = 0;
        m->w_amax_done[l] = 0;
    }
}

static void resolve_precisions(fp8t_model *m) {
    for (int lin = 0; lin < m->n_lin; lin++)
        for (int g = 0; g < FP8T_GEMM_COUNT; g++)
            m->prec[lin][g] =
                fp8t_policy_resolve(&m->policy, m->cfg.n_layer, model_lin_layer(m, lin),
                                    model_lin_module(m, lin), (fp8t_gemm_kind)g);
}

/* Views of one layer's tensors inside a buffer laid out by the parameter table. */
static void bind_tensors(fp8t_model *m, model_tensors *t, float *base) {
    for (int i = 0; i < m->n_tensors; i++) {
        const fp8t_param_info *p = &m->info[i];
        float *x = base + p->offset;
        if (p->layer < 0) {
            if (!strcmp(p->name, "wte"))
                t->wte = x;
            else if (!strcmp(p->name, "wpe"))
                t->wpe = x;
            else if (!strcmp(p->name, "lnf.w"))
                t->lnf_w = x;
            else if (!strcmp(p->name, "lnf.b"))
                t->lnf_b = x;
            else if (!strcmp(p->name, "lm_head.w"))
                t->lm_head = x;
            continue;
        }
        layer_tensors *lt = &t->layer[p->layer];
        const char *n = strchr(p->name + 2, '.') + 1; /* skip "h.<l>." */
        struct {
            const char *name;
            float **slot;
        } map[] = {
            {"ln1.w", &lt->ln1_w},   {"ln1.b", &lt->ln1_b},   {"qkv.w", &lt->qkv_w},
            {"qkv.b", &lt->qkv_b},   {"proj.w", &lt->proj_w}, {"proj.b", &lt->proj_b},
            {"ln2.w", &lt->ln2_w},   {"ln2.b", &lt->ln2_b},   {"fc1.w", &lt->fc1_w},
            {"fc1.b", &lt->fc1_b},   {"fc2.w", &lt->fc2_w},   {"fc2.b", &lt->fc2_b},
            {"gate.w", &lt->gate_w}, {"up.w", &lt->up_w},     {"down.w", &lt->down_w},
        };
        for (size_t k = 0; k < sizeof(map) / sizeof(map[0]); k++)
            if (!strcmp(n, map[k].name)) *map[k].slot = x;
    }
}

/* base + off, or NULL for a buffer the architecture does not have */
static float *slice(float *base, size_t off) { return base ? base + off : NULL; }

/* ---- inputs read again only by a Wgrad: FP32 layer copies or FP8 codes ---- */

/* Which Wgrad-only input linear lin reads, or -1. */
static int wgrad_input_of(const fp8t_model *m, int lin) {
    if (model_lin_layer(m, lin) < 0) return -1; /* head: lnf is [N, C] once, always kept */
    switch (model_lin_module(m, lin)) {
    case FP8T_MOD_QKV: return WX_LN1;
    case FP8T_MOD_FC1:
    case FP8T_MOD_GATE:
    case FP8T_MOD_UP: return WX_LN2;
    case FP8T_MOD_FC2:
    case FP8T_MOD_DOWN: return WX_FCH_ACT;
    default: return -1; /* proj: atty is read by the attention backward too */
    }
}

/* Layer l's copy of input k, or the one-layer scratch when the layer has none. */
static float *wgrad_input_ptr(const fp8t_model *m, int l, int k) {
    return m->wx[l][k] ? m->wx[l][k] : m->wx_scratch;
}

/* ---- layer saves (layer_save): per layer in FP32 or BF16, or one layer's scratch ---- */

static size_t save_cols(const fp8t_model *m, int k) {
    switch (k) {
    case SV_QKV: return (size_t)fp8t_model_qkv_dim(&m->cfg);
    case SV_FCH:
    case SV_UP: return (size_t)m->cfg.mlp_hidden;
    default: return (size_t)m->cfg.n_embd; /* atty, res2, res3 */
    }
}

/* What each layer keeps of each save in this forward; allocates what that needs. */
static void plan_layer_saves(fp8t_model *m) {
    const fp8t_model_config *c = &m->cfg;
    const size_t N = (size_t)m->B * m->T;
    /* the backend's attention state replaces qkv in the backward (the same for every layer:
     * one shape) */
    layer_view v0;
    model_layer_view(&v0, m, 0);
    const int attn_state =
        !m->no_attn_save && c->n_layer > 0 && m->ops->attention_saved_bytes(m->be, &v0.attn) > 0;
    for (int l = 0; l < c->n_layer; l++) {
        const int bf16 = m->layer_bf16[l];
        for (int k = 0; k < SV_COUNT; k++) {
            save_kind kind = bf16 ? SAVE_BF16 : SAVE_F32;
            if (m->frozen) kind = SAVE_NONE; /* no backward follows */
            if (k == SV_QKV && attn_state) kind = SAVE_NONE;
            if (k == SV_UP && c->arch != FP8T_ARCH_LLAMA) kind = SAVE_NONE; /* no up */
            m->sv_kind[l][k] = (unsigned char)kind;
            const size_t cols = save_cols(m, k);
            if (kind == SAVE_F32 && !m->sv32[l][k])
                m->sv32[l][k] = model_act_malloc(m, N * cols * sizeof(float));
            if (kind == SAVE_BF16 && !m->sv16[l][k])
                m->sv16[l][k] = model_act_malloc(m, N * cols * sizeof(uint16_t));
            if (kind != SAVE_F32 && !m->sv_scratch[k] &&
                (k != SV_UP || c->arch == FP8T_ARCH_LLAMA))
                m->sv_scratch[k] = model_act_malloc(m, N * cols * sizeof(float));
        }
    }
}

void model_save_store(fp8t_model *m, int l, layer_save k, const float *bias) {
    if (m->sv_kind[l][k] != SAVE_BF16) return;
    m->ops->bf16_pack(m->be, m->sv16[l][k], m->sv_scratch[k], bias, m->B * m->T,
                      (int)save_cols(m, k));
}

float *model_save_restore(fp8t_model *m, int l, layer_save k) {
    switch (m->sv_kind[l][k]) {
    case SAVE_F32: return m->sv32[l][k];
    case SAVE_BF16:
        m->ops->bf16_unpack(m->be, m->sv_scratch[k], m->sv16[l][k],
                            (size_t)m->B * m->T * save_cols(m, k));
        return m->sv_scratch[k];
    default: return m->sv_scratch[k];
    }
}

uint16_t *model_save_bf16(const fp8t_model *m, int l, layer_save k) {
    return m->sv_kind[l][k] == SAVE_BF16 ? m->sv16[l][k] : NULL;
}

const float *model_save_read(fp8t_model *m, int l, layer_save k, int takes16,
                             const uint16_t **x16) {
    *x16 = takes16 ? model_save_bf16(m, l, k) : NULL;
    return *x16 ? NULL : model_save_restore(m, l, k);
}

float *model_save_fwd(const fp8t_model *m, int l, layer_save k) {
    return m->sv_kind[l][k] == SAVE_F32 ? m->sv32[l][k] : m->sv_scratch[k];
}

void model_forward_saves(fp8t_model *m) {
    const fp8t_model_config *c = &m->cfg;
    const size_t N = (size_t)m->B * m->T;
    plan_layer_saves(m);
    if (!m->frozen)
        for (int lin = 0; lin < m->n_lin; lin++) m->xq[lin].saved = m->plan[lin].save_x;
    /* A layer copy is needed when a linear reading it keeps X in FP32 for its Wgrad. A frozen
     * forward has no backward: it writes the copies that exist, else the scratch. */
    int need_scratch = 0;
    for (int l = 0; l < c->n_layer; l++) {
        for (int k = 0; k < WX_COUNT; k++) {
            if (m->wx[l][k]) continue;
            int need = 0;
            for (int s = 0; !m->frozen && s < fp8t_model_modules_per_layer(c); s++) {
                const int lin = l * fp8t_model_modules_per_layer(c) + s;
                need |= wgrad_input_of(m, lin) == k && !m->xq[lin].saved;
            }
            if (need) {
                const size_t cols = k == WX_FCH_ACT ? (size_t)c->mlp_hidden : (size_t)c->n_embd;
                m->wx[l][k] = model_act_malloc(m, N * cols * sizeof(float));
            } else {
                need_scratch = 1;
            }
        }
    }
    if (need_scratch && !m->wx_scratch) {
        const size_t cols = (size_t)(c->mlp_hidden > c->n_embd ? c->mlp_hidden : c->n_embd);
        m->wx_scratch = model_act_malloc(m, N * cols * sizeof(float));
    }
}

void model_layer_view(layer_view *v, const fp8t_model *m, int l) {
    const fp8t_model_config *c = &m->cfg;
    const activations *a = &m->a;
    v->B = m->B;
    v->T = m->T;
    v->N = m->B * m->T;
    v->C = c->n_embd;
    v->H = c->mlp_hidden;
    v->NH = c->n_head;
    v->HS = v->C / v->NH;
    v->NKV = fp8t_model_kv_heads(c);
    v->QKV = fp8t_model_qkv_dim(c);
    memset(&v->attn, 0, sizeof(v->attn));
    v->attn.B = v->B;
    v->attn.T = v->T;
    v->attn.NH = v->NH;
    v->attn.NKV = v->NKV;
    v->attn.HS = v->HS;
    if (c->arch == FP8T_ARCH_LLAMA) {
        v->attn.rope_theta = c->rope_theta;
        v->attn.rope_scaling = c->rope_scaling;
    }
    v->lin0 = l * fp8t_model_modules_per_layer(c);
    v->NC = (size_t)v->N * v->C;
    v->NH_ = (size_t)v->N * v->H;
    const size_t L = (size_t)l, N = (size_t)v->N;
    v->ln1 = wgrad_input_ptr(m, l, WX_LN1);
    v->ln1_mean = slice(a->ln1_mean, L * N);
    v->ln1_rstd = slice(a->ln1_rstd, L * N);
    v->qkv = model_save_fwd(m, l, SV_QKV);
    v->atty = model_save_fwd(m, l, SV_ATTY);
    v->lse = slice(a->lse, L * N * (size_t)v->NH);
    v->res2 = model_save_fwd(m, l, SV_RES2);
    v->ln2 = wgrad_input_ptr(m, l, WX_LN2);
    v->ln2_mean = slice(a->ln2_mean, L * N);
    v->ln2_rstd = slice(a->ln2_rstd, L * N);
    v->fch = model_save_fwd(m, l, SV_FCH);
    v->fch_act = wgrad_input_ptr(m, l, WX_FCH_ACT);
    v->up = c->arch == FP8T_ARCH_LLAMA ? model_save_fwd(m, l, SV_UP) : NULL;
    v->res3 = model_save_fwd(m, l, SV_RES3);
}

/* Carve the activation buffers; with base NULL only counts. Returns floats needed. */
static size_t carve_activations(activations *a, float *base, const fp8t_model_config *c, int B,
                                int T, int carve_wgrad_inputs) {
    const size_t N = (size_t)B * T, C = c->n_embd, H = c->mlp_hidden, L = c->n_layer,
                 NH = c->n_head, QKV = (size_t)fp8t_model_qkv_dim(c);
    const int gpt2 = c->arch == FP8T_ARCH_GPT2, llama = !gpt2;
    const size_t wx = carve_wgrad_inputs ? L : 0; /* ln1, ln2, fch_act: see activations */
    size_t off = 0;
#define CARVE(field, count)                                                                      \
    do {                                                                                         \
        size_t n_ = (count);                                                                     \
        a->field = (base && n_) ? base + off : NULL;                                             \
        off += n_;                                                                               \
    } while (0)
    CARVE(encoded, N * C);
    CARVE(ln1, wx * N * C);
    CARVE(ln1_mean, gpt2 ? L * N : 0);
    CARVE(ln1_rstd, L * N);
    CARVE(lse, L * N * NH);
    CARVE(ln2, wx * N * C);
    CARVE(ln2_mean, gpt2 ? L * N : 0);
    CARVE(ln2_rstd, L * N);
    CARVE(fch_act, wx * N * H);
    CARVE(lnf, N * C);
    CARVE(lnf_mean, gpt2 ? N : 0);
    CARVE(lnf_rstd, N);
    /* (the logits [N, pad(V)] are not carved: model_logits_buf allocates them when a forward
     * first writes them) */
    CARVE(losses, N);
    CARVE(out_c, N * C);
    CARVE(dres, N * C);
    CARVE(dc1, N * C);
    /* from here to the end: act_tail (model_head_plan) */
    CARVE(dc2, llama ? N * C : 0);
    CARVE(dqkv, N * QKV);
    CARVE(dh1, N * H);
    CARVE(dh2, N * H);
    CARVE(dh3, llama ? N * H : 0);
#undef CARVE
    return off;
}

static int set_err(char *err, size_t errlen, const char *msg) {
    if (err && errlen) fp8t_errorf(err, errlen, "%s", msg);
    return -1;
}

fp8t_model *fp8t_model_create(fp8t_backend *be, const fp8t_model_config *cfg,
                              const fp8t_policy *policy, const fp8t_model_options *opt, int B,
                              int T, char *err, size_t errlen) {
    char buf[256];
    if (!be) {
        set_err(err, errlen, "fp8t_model_create: no backend");
        return NULL;
    }
    const unsigned disable = opt ? opt->disable : 0;
    if (disable & ~(unsigned)FP8T_DISABLE_KNOWN) {
        snprintf(buf, sizeof(buf), "fp8t_model_create: unknown disable bits 0x%x",
                 disable & ~(unsigned)FP8T_DISABLE_KNOWN);
        set_err(err, errlen, buf);
        return NULL;
    }
    if (opt && opt->head_chunk > 0 && opt->head_chunk % 8 != 0) {
        /* chunks start at multiples of 8 rows: a GEMM that pads a dimension to 8 (the GPU's
         * Wgrad pads K, the chunk's tokens) reads past a chunk's last row into zero padding
         * only then */
        snprintf(buf, sizeof(buf),
                 "fp8t_model_create: head_chunk %d: the rows per chunk must "
                 "be a multiple of 8 (0: auto, negative: off)",
                 opt->head_chunk);
        set_err(err, errlen, buf);
        return NULL;
    }
    if (fp8t_model_config_check(cfg, buf, sizeof(buf)) != 0) {
        set_err(err, errlen, buf);
        return NULL;
    }
    if (B <= 0 || T <= 0 || T > cfg->seq_len) {
        snprintf(buf, sizeof(buf),
                 "batch shape B=%d T=%d is invalid: need B >= 1 and 1 <= T <= seq_len (%d)", B, T,
                 cfg->seq_len);
        set_err(err, errlen, buf);
        return NULL;
    }
    if ((size_t)B * (size_t)T > (size_t)(1 << 24)) {
        snprintf(buf, sizeof(buf), "batch B*T = %zu tokens is too large (max %d)", (size_t)B * T,
                 1 << 24);
        set_err(err, errlen, buf);
        return NULL;
    }
    fp8t_model *m = calloc(1, sizeof(*m));
    FP8T_CHECK(m, "out of host memory");
    m->be = be;
    m->ops = be->ops;
    m->cfg = *cfg;
    if (policy)
        m->policy = *policy;
    else
        fp8t_policy_default(&m->policy);
    if (m->policy.history_len < 1) m->policy.history_len = 1;
    m->B = B;
    m->T = T;
    const fp8t_backend_ops *ops = m->ops;

    /* parameters, gradients, moments: one allocation each */
    m->n_tensors = fp8t_model_param_table(cfg, NULL, &m->num_params);
    m->info = calloc((size_t)m->n_tensors, sizeof(fp8t_param_info));
    FP8T_CHECK(m->info, "out of host memory");
    fp8t_model_param_table(cfg, m->info, NULL);
    const size_t pbytes = m->num_params * sizeof(float);
    m->params = ops->malloc(be, pbytes);
    m->grads = ops->malloc(be, pbytes);
    m->adam_m = ops->malloc(be, pbytes);
    m->adam_v = ops->malloc(be, pbytes);
    m->p.layer = calloc((size_t)cfg->n_layer, sizeof(layer_tensors));
    m->g.layer = calloc((size_t)cfg->n_layer, sizeof(layer_tensors));
    FP8T_CHECK(m->p.layer && m->g.layer, "out of host memory");
    bind_tensors(m, &m->p, m->params);
    bind_tensors(m, &m->g, m->grads);

    /* activations: one allocation (the Wgrad-only inputs too, under FP8T_DISABLE_FP8_SAVE;
     * otherwise model_forward_saves allocates the layer copies a forward needs) */
    m->no_fp8_save = (disable & FP8T_DISABLE_FP8_SAVE) != 0;
    size_t act_floats = carve_activations(&m->a, NULL, cfg, B, T, m->no_fp8_save);
    m->act_memory = ops->malloc(be, act_floats * sizeof(float));
    m->act_carved_bytes = act_floats * sizeof(float) + 2 * (size_t)B * T * sizeof(int);
    carve_activations(&m->a, m->act_memory, cfg, B, T, m->no_fp8_save);
    const size_t N = (size_t)B * T;
    const size_t nl = (size_t)(cfg->n_layer > 0 ? cfg->n_layer : 1);
    m->wx = calloc(nl, sizeof(*m->wx));
    m->sv_kind = calloc(nl, sizeof(*m->sv_kind));
    m->sv32 = calloc(nl, sizeof(*m->sv32));
    m->sv16 = calloc(nl, sizeof(*m->sv16));
    FP8T_CHECK(m->wx && m->sv_kind && m->sv32 && m->sv16, "out of host memory");
    m->no_bf16_saves = (disable & FP8T_DISABLE_BF16_SAVES) != 0;
    if (m->no_fp8_save) {
        const size_t NC = N * (size_t)cfg->n_embd, NH_ = N * (size_t)cfg->mlp_hidden;
        for (int l = 0; l < cfg->n_layer; l++) {
            m->wx[l][WX_LN1] = m->a.ln1 + (size_t)l * NC;
            m->wx[l][WX_LN2] = m->a.ln2 + (size_t)l * NC;
            m->wx[l][WX_FCH_ACT] = m->a.fch_act + (size_t)l * NH_;
        }
    }
    m->tokens = ops->malloc(be, 2 * N * sizeof(int));
    m->targets = m->tokens + N;
    m->scalars = ops->malloc(be, 4 * sizeof(float));

    /* FP8 state: reset on the host, then copied to the device */
    m->n_lin = fp8t_model_num_linears(cfg);
    m->n_fp8 = 3 * m->n_lin;
    m->hist_len = m->policy.history_len;
    m->state_hybrid = m->policy.hybrid != 0;
    size_t st_floats = fp8t_recipe_state_floats(m->n_fp8, m->hist_len);
    float *host_state = malloc(st_floats * sizeof(float));
    fp8_format *fmts = malloc((size_t)m->n_fp8 * sizeof(fp8_format));
    FP8T_CHECK(host_state && fmts, "out of host memory");
    for (int t = 0; t < m->n_fp8; t++) fmts[t] = model_fp8_format(m, t % 3);
    fp8t_recipe_state hst;
    fp8t_recipe_state_view(&hst, host_state, m->n_fp8, m->hist_len);
    fp8t_recipe_state_reset(&hst, fmts);
    m->fp8_state = ops->malloc(be, st_floats * sizeof(float));
    ops->to_device(be, m->fp8_state, host_state, st_floats * sizeof(float));
    fp8t_recipe_state_view(&m->st, m->fp8_state, m->n_fp8, m->hist_len);
    free(host_state);
    free(fmts);
    m->cur = ops->malloc(be, 3 * (size_t)m->n_fp8 * sizeof(float));
    m->cur_amax = m->cur;
    m->cur_scale = m->cur + m->n_fp8;
    m->cur_scale_inv = m->cur + 2 * m->n_fp8;

    m->prec = calloc((size_t)m->n_lin, sizeof(*m->prec));
    m->wcache = calloc((size_t)m->n_lin, sizeof(*m->wcache));
    m->w_amax_done = calloc((size_t)m->n_lin, sizeof(int));
    m->xq = calloc((size_t)m->n_lin, sizeof(*m->xq));
    m->plan = calloc((size_t)m->n_lin, sizeof(*m->plan));
    m->layer_bf16 = calloc(nl, 1);
    FP8T_CHECK(m->prec && m->wcache && m->w_amax_done && m->xq && m->plan && m->layer_bf16,
               "out of host memory");
    resolve_precisions(m);
    /* switches back to the plain paths, fixed at creation (fused paths are bit-identical to
     * them) */
    m->no_fused_xent = (disable & FP8T_DISABLE_FUSED_XENT) != 0;
    m->no_bf16_xent = (disable & FP8T_DISABLE_BF16_XENT) != 0;
    m->no_code_reuse = (disable & FP8T_DISABLE_CODE_REUSE) != 0;
    m->no_bf16_operands = (disable & FP8T_DISABLE_BF16_OPERANDS) != 0;
    m->no_gelu_fusion = (disable & FP8T_DISABLE_GELU_FUSION) != 0;
    m->no_colsum_fusion = (disable & FP8T_DISABLE_BIAS_GRAD_FUSION) != 0;
    m->no_gelu_bwd_fusion = (disable & FP8T_DISABLE_GELU_BWD_FUSION) != 0;
    m->no_residual_bias = (disable & FP8T_DISABLE_RESIDUAL_BIAS) != 0;
    m->no_ln_fusion = (disable & FP8T_DISABLE_LN_FUSION) != 0;
    m->no_attn_save = (disable & FP8T_DISABLE_ATTN_SAVE) != 0;
    m->no_swiglu_fusion = (disable & FP8T_DISABLE_SWIGLU_FUSION) != 0;
    m->no_swiglu_bwd_fusion = (disable & FP8T_DISABLE_SWIGLU_BWD_FUSION) != 0;
    m->no_x_share = (disable & FP8T_DISABLE_X_SHARE) != 0;
    m->gelu_bias_deferred = calloc((size_t)(cfg->n_layer > 0 ? cfg->n_layer : 1), sizeof(int));
    FP8T_CHECK(m->gelu_bias_deferred, "out of host memory");
    /* the chunked LM head (head.c), in the backward scratch past dc1 where it fits */
    m->act_tail = m->a.dc1 + N * (size_t)cfg->n_embd;
    m->act_tail_bytes = (size_t)((char *)(m->act_memory + act_floats) - (char *)m->act_tail);
    model_head_plan(m, opt ? opt->head_chunk : FP8T_HEAD_CHUNK_AUTO);
    /* (FP8T_DISABLE_FP8_SAVE is applied above, with the activations it shapes) */
    model_plan(m);
    return m;
}

void fp8t_model_destroy(fp8t_model *m) {
    if (!m) return;
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    ops->free(be, m->params);
    ops->free(be, m->grads);
    ops->free(be, m->adam_m);
    ops->free(be, m->adam_v);
    ops->free(be, m->act_memory);
    ops->free(be, m->tokens);
    ops->free(be, m->scalars);
    ops->free(be, m->fp8_state);
    ops->free(be, m->cur);
    for (int l = 0; l < m->n_lin; l++)
        for (int s = 0; s < WCACHE_SLOTS; s++) {
            if (m->wcache[l][s].codes) ops->free(be, m->wcache[l][s].codes);
            if (m->wcache[l][s].codes_t) ops->free(be, m->wcache[l][s].codes_t);
            if (m->wcache[l][s].bf16) ops->free(be, m->wcache[l][s].bf16);
            if (m->wcache[l][s].bsinv) ops->free(be, m->wcache[l][s].bsinv);
            if (m->wcache[l][s].bsinv_t) ops->free(be, m->wcache[l][s].bsinv_t);
        }
    for (int l = 0; l < m->n_lin; l++) {
        if (m->xq[l].codes) ops->free(be, m->xq[l].codes);
        if (m->xq[l].bf16) ops->free(be, m->xq[l].bf16);
        if (m->xq[l].bsinv) ops->free(be, m->xq[l].bsinv);
    }
    if (!m->no_fp8_save) /* else slices of act_memory */
        for (int l = 0; l < m->cfg.n_layer; l++)
            for (int k = 0; k < WX_COUNT; k++)
                if (m->wx[l][k]) ops->free(be, m->wx[l][k]);
    if (m->wx_scratch) ops->free(be, m->wx_scratch);
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int k = 0; k < SV_COUNT; k++) {
            if (m->sv32[l][k]) ops->free(be, m->sv32[l][k]);
            if (m->sv16[l][k]) ops->free(be, m->sv16[l][k]);
        }
    for (int k = 0; k < SV_COUNT; k++)
        if (m->sv_scratch[k]) ops->free(be, m->sv_scratch[k]);
    free(m->sv_kind);
    free(m->sv32);
    free(m->sv16);
    scratch_buf *bufs[] = {&m->codes[0], &m->codes[1], &m->codes_t[0], &m->codes_t[1], &m->h16[0],
                           &m->h16[1],   &m->fq[0],    &m->fq[1],      &m->bsc[0],     &m->bsc[1],
                           &m->bsc_t[0], &m->bsc_t[1], &m->wgrad_tmp};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i]->p) ops->free(be, bufs[i]->p);
    free(m->prec);
    free(m->wcache);
    free(m->w_amax_done);
    free(m->xq);
    free(m->plan);
    free(m->layer_bf16);
    free(m->gelu_bias_deferred);
    model_head_free(m);
    if (m->attn_saved)
        for (int l = 0; l < m->cfg.n_layer; l++) m->ops->free(m->be, m->attn_saved[l]);
    free(m->attn_saved);
    free(m->wx);
    free(m->p.layer);
    free(m->g.layer);
    free(m->info);
    free(m);
}

size_t fp8t_model_activation_bytes(const fp8t_model *m) {
    size_t n = m->act_carved_bytes + m->act_lazy_bytes;
    const scratch_buf *bufs[] = {&m->codes[0], &m->codes[1], &m->codes_t[0], &m->codes_t[1],
                                 &m->h16[0],   &m->h16[1],   &m->fq[0],      &m->fq[1],
                                 &m->bsc[0],   &m->bsc[1],   &m->bsc_t[0],   &m->bsc_t[1]};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) n += bufs[i]->bytes;
    return n;
}

const fp8t_model_config *fp8t_model_get_config(const fp8t_model *m) { return &m->cfg; }
fp8t_backend *fp8t_model_backend(fp8t_model *m) { return m->be; }
const fp8t_policy *fp8t_model_get_policy(const fp8t_model *m) { return &m->policy; }

int model_refuse_if_frozen(const fp8t_model *m, const char *fn) {
    if (!m->frozen) return 0;
    fp8t_warnf("%s: the model is frozen (fp8t_model_set_frozen), so the training state may "
               "not change; call fp8t_model_set_frozen(m, 0) first",
               fn);
    return 1;
}

/* Bring the dY entries of the FP8 state to the policy's format: switch their fmt_max and carry
 * their scale over to the new range, so the next step quantizes with the same relative
 * headroom. A no-op when the state is already in that format. */
static void convert_dy_format(fp8t_model *m) {
    if (m->state_hybrid == (m->policy.hybrid != 0)) return;
    size_t n = fp8t_recipe_state_floats(m->n_fp8, m->hist_len);
    float *h = malloc(n * sizeof(float));
    FP8T_CHECK(h, "out of host memory");
    m->ops->to_host(m->be, h, m->fp8_state, n * sizeof(float));
    fp8t_recipe_state hs;
    fp8t_recipe_state_view(&hs, h, m->n_fp8, m->hist_len);
    float new_max = fp8_format_max(model_fp8_format(m, FP8T_ROLE_DY));
    for (int t = FP8T_ROLE_DY; t < m->n_fp8; t += 3) {
        float ratio = new_max / hs.fmt_max[t];
        hs.fmt_max[t] = new_max;
        hs.scale[t] *= ratio;
        if (!isfinite(hs.scale[t])) hs.scale[t] = FLT_MAX; /* as the delayed update does */
        hs.scale_inv[t] = 1.0f / hs.scale[t];
    }
    m->ops->to_device(m->be, m->fp8_state, h, n * sizeof(float));
    free(h);
    m->state_hybrid = m->policy.hybrid != 0;
}

void fp8t_model_set_policy(fp8t_model *m, const fp8t_policy *policy) {
    fp8t_policy old = m->policy, def;
    if (!policy) { /* NULL: the defaults, as at create */
        fp8t_policy_default(&def);
        policy = &def;
    }
    m->policy = *policy;
    m->policy.history_len = m->hist_len; /* the state's history length is fixed at create */
    resolve_precisions(m);
    model_plan(m);
    m->epoch++; /* the head may now run in another precision */
    /* current-scaled weight codes depend on epsilon / pow2 (delayed ones on the weights and
     * the state's W scales only, which no policy change touches: W is always E4M3) */
    if (old.epsilon != m->policy.epsilon || old.pow2_scales != m->policy.pow2_scales)
        for (int l = 0; l < m->n_lin; l++) m->wcache[l][WCACHE_CURRENT].valid = 0;
    /* a frozen forward never quantizes dY, so a frozen model keeps its state as it is: a
     * switch to another format and back leaves no rounding of the dY scales behind */
    if (!m->frozen) convert_dy_format(m);
}

void fp8t_model_set_frozen(fp8t_model *m, int frozen) {
    m->frozen = frozen != 0;
    if (!m->frozen) convert_dy_format(m); /* a format change made while frozen, if it stayed */
}

int fp8t_model_is_frozen(const fp8t_model *m) { return m->frozen; }

fp8t_precision fp8t_model_gemm_precision(const fp8t_model *m, int lin, fp8t_gemm_kind g) {
    if (lin < 0 || lin >= m->n_lin || g < 0 || g >= FP8T_GEMM_COUNT) return FP8T_PREC_FP32;
    return m->prec[lin][g];
}

size_t fp8t_model_num_params(const fp8t_model *m) { return m->num_params; }
float *fp8t_model_params(fp8t_model *m) { return m->params; }
float *fp8t_model_grads(fp8t_model *m) { return m->grads; }
float *fp8t_model_adam_m(fp8t_model *m) { return m->adam_m; }
void fp8t_model_release_adam(fp8t_model *m) {
    m->ops->free(m->be, m->adam_m);
    m->ops->free(m->be, m->adam_v);
    m->adam_m = m->adam_v = NULL;
}
float *fp8t_model_adam_v(fp8t_model *m) { return m->adam_v; }
/* After a fused training forward the buffer holds dlogits, after a chunked one nothing: the
 * logits are rebuilt first. */
const float *fp8t_model_logits(fp8t_model *m) {
    if ((m->xent_fused || m->logits_missing) && model_restore_logits(m) != 0)
        fp8t_warnf("fp8t_model_logits: the last forward kept no logits (fused or chunked "
                   "cross-entropy) and the weights, FP8 scales or policy changed since, "
                   "so they cannot be rebuilt: run the forward again, or create the model "
                   "with FP8T_DISABLE_FUSED_XENT (--disable fused-xent)");
    return model_logits_buf(m);
}
const float *fp8t_model_losses(fp8t_model *m) { return m->a.losses; }

void fp8t_model_zero_grad(fp8t_model *m) {
    if (model_refuse_if_frozen(m, "fp8t_model_zero_grad")) return;
    m->ops->zero(m->be, m->grads, m->num_params * sizeof(float));
    m->grads_zero = 1;
}

float fp8t_model_grad_norm(fp8t_model *m) {
    float sumsq = 0.0f;
    m->ops->zero(m->be, m->scalars + 1, sizeof(float));
    m->ops->sumsq(m->be, m->scalars + 1, m->grads, m->num_params);
    m->ops->to_host(m->be, &sumsq, m->scalars + 1, sizeof(float));
    return sqrtf(sumsq);
}

void fp8t_model_adamw(fp8t_model *m, float lr, float beta1, float beta2, float eps,
                      float weight_decay, int t, float grad_clip, float grad_norm) {
    fp8t_model_adamw_range(m, m->adam_m, m->adam_v, 0, m->num_params, lr, beta1, beta2, eps,
                           weight_decay, t, grad_clip, grad_norm);
}

void fp8t_model_adamw_range(fp8t_model *m, float *adam_m, float *adam_v, size_t lo, size_t hi,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            int t, float grad_clip, float grad_norm) {
    if (model_refuse_if_frozen(m, "fp8t_model_adamw")) return;
    float grad_scale = 1.0f;
    if (grad_clip > 0.0f && grad_norm > grad_clip) grad_scale = grad_clip / grad_norm;
    m->epoch++; /* the weights move */
    /* one call per contiguous run of tensors with the same decay flag, cut to [lo, hi) */
    int i = 0;
    while (i < m->n_tensors) {
        int j = i;
        while (j + 1 < m->n_tensors && m->info[j + 1].decay == m->info[i].decay) j++;
        size_t off = m->info[i].offset;
        size_t end = m->info[j].offset + m->info[j].numel;
        if (off < lo) off = lo;
        if (end > hi) end = hi;
        if (off < end)
            m->ops->adamw(m->be, m->params + off, adam_m + (off - lo), adam_v + (off - lo),
                          m->grads + off, end - off, lr, beta1, beta2, eps,
                          m->info[i].decay ? weight_decay : 0.0f, t, grad_scale);
        i = j + 1;
    }
    /* the cached weight copies are stale now (end_step also invalidates them; this keeps a
     * forward between the two from reading the old weights) */
    for (int l = 0; l < m->n_lin; l++)
        for (int s = 0; s < WCACHE_SLOTS; s++) m->wcache[l][s].valid = 0;
}

void fp8t_model_end_step(fp8t_model *m) {
    if (model_refuse_if_frozen(m, "fp8t_model_end_step")) return;
    m->ops->delayed_update(m->be, m->fp8_state, m->n_fp8, m->hist_len, m->policy.algo,
                           m->policy.margin);
    model_invalidate_weight_caches(m);
    m->epoch++; /* new delayed scales, weight codes to be remade */
}

float *fp8t_model_fp8_state(fp8t_model *m) { return m->fp8_state; }
int fp8t_model_fp8_count(const fp8t_model *m) { return m->n_fp8; }
int fp8t_model_fp8_history_len(const fp8t_model *m) { return m->hist_len; }

void fp8t_model_set_hook(fp8t_model *m, fp8t_tensor_hook hook, void *ctx) {
    m->hook = hook;
    m->hook_ctx = ctx;
    m->hook_reads = 0;
    model_plan(m);
}

void fp8t_model_set_observer(fp8t_model *m, fp8t_tensor_hook hook, void *ctx) {
    fp8t_model_set_hook(m, hook, ctx);
    m->hook_reads = hook != NULL;
    model_plan(m);
}

void fp8t_model_set_grads_ready(fp8t_model *m, fp8t_grads_ready_fn fn, void *ctx) {
    m->grads_ready = fn;
    m->grads_ready_ctx = ctx;
}
