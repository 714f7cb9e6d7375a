/* The inference model: creation from fp8t_weights and the weights' conversion to the
 * inference precision (include/fp8train/infer.h).
 *
 * A linear weight travels host FP32 -> a device staging buffer of at most STAGE_FLOATS floats
 * (row chunks) -> its stored form (BF16 operand rows, FP8 codes rows, or an FP32 copy). The
 * FP8 scale comes from the whole tensor's amax, taken on the host before the upload (the max
 * is exact, so it is the amax a device pass would find), then compute_scale on the device, as
 * a current-scaled training GEMM computes it. The staging buffer is freed before the model is
 * returned: the device never holds an FP32 copy of the linear weights in bf16 or fp8. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "fp8train/recipe.h"
#include "model/infer_internal.h"
#include "model/operand.h"

/* the inference model's precisions (fp8train/eval.h's enum) */
const char *fp8t_eval_precision_name(fp8t_eval_precision p) {
    switch (p) {
    case FP8T_EVAL_BF16: return "bf16";
    case FP8T_EVAL_FP8: return "fp8";
    case FP8T_EVAL_FP32: return "fp32";
    default: break;
    }
    return "unknown";
}

int fp8t_eval_precision_parse(fp8t_eval_precision *out, const char *s) {
    if (!s) return -1;
    for (int p = 0; p < FP8T_EVAL_COUNT; p++)
        if (!strcmp(s, fp8t_eval_precision_name((fp8t_eval_precision)p))) {
            *out = (fp8t_eval_precision)p;
            return 0;
        }
    return -1;
}

#define STAGE_FLOATS ((size_t)16 << 20) /* 64 MiB of staging */

const char *fp8t_act_scale_name(fp8t_act_scale a) {
    return a == FP8T_ACT_SCALE_DELAYED      ? "delayed"
           : a == FP8T_ACT_SCALE_CALIBRATED ? "calibrated"
                                            : "current";
}

int fp8t_act_scale_parse(fp8t_act_scale *out, const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "current"))
        *out = FP8T_ACT_SCALE_CURRENT;
    else if (!strcmp(s, "delayed"))
        *out = FP8T_ACT_SCALE_DELAYED;
    else if (!strcmp(s, "calibrated"))
        *out = FP8T_ACT_SCALE_CALIBRATED;
    else
        return -1;
    return 0;
}

void fp8t_infer_opts_default(fp8t_infer_opts *o, fp8t_eval_precision prec, fp8t_act_scale act) {
    memset(o, 0, sizeof(*o));
    o->prec = prec;
    o->act = act;
    o->kv = -1;
    o->prefetch_mb = -1;
}

/* the table entry named name, or NULL */
static const fp8t_param_info *find_param(const fp8t_param_info *info, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(info[i].name, name)) return &info[i];
    return NULL;
}

static const fp8t_param_info *find_layer_param(const fp8t_param_info *info, int n, int l,
                                               const char *name) {
    char full[64];
    snprintf(full, sizeof(full), "h.%d.%s", l, name);
    return find_param(info, n, full);
}

static void *dev_alloc(fp8t_infer *m, size_t bytes, size_t *counter) {
    *counter += bytes;
    return m->ops->malloc(m->be, bytes);
}

/* NaN-propagating amax of x[n] on the host */
static float host_amax(const float *x, size_t n) {
    float a = 0.0f;
    for (size_t i = 0; i < n; i++) {
        const float v = fabsf(x[i]);
        if (v != v) return v;
        a = v > a ? v : a;
    }
    return a;
}

int infer_linears(fp8t_infer *m, inf_linear **lin) {
    int n = 0;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        inf_layer *y = &m->layer[l];
        lin[n++] = &y->qkv, lin[n++] = &y->proj;
        if (m->cfg.arch == FP8T_ARCH_GPT2)
            lin[n++] = &y->fc1, lin[n++] = &y->fc2;
        else
            lin[n++] = &y->gate, lin[n++] = &y->up, lin[n++] = &y->down;
    }
    lin[n++] = &m->head;
    return n;
}

const void *infer_linear_weight(const inf_linear *L, size_t *bytes) {
    const size_t n = (size_t)L->out * (size_t)L->in;
    switch (L->kind) {
    case INF_LIN_F32: *bytes = n * sizeof(float); return L->w32;
    case INF_LIN_BF16: *bytes = fp8t_bf16_bytes(L->out, L->in); return L->w16;
    case INF_LIN_FP8: *bytes = n; return L->w8;
    }
    *bytes = 0;
    return NULL;
}

/* Store the weight w[out, in] (host FP32) as linear L of kind `kind`. stage: device staging
 * buffer of STAGE_FLOATS floats (unused for F32). */
static void load_linear(fp8t_infer *m, inf_linear *L, inf_lin_kind kind, const float *w, int out,
                        int in, float *stage, size_t *counter) {
    const fp8t_backend_ops *ops = m->ops;
    fp8t_backend *be = m->be;
    L->kind = kind;
    L->out = out;
    L->in = in;
    const size_t n = (size_t)out * (size_t)in;
    if (kind == INF_LIN_F32) {
        L->w32 = dev_alloc(m, n * sizeof(float), counter);
        ops->to_device(be, L->w32, w, n * sizeof(float));
        return;
    }
    if (kind == INF_LIN_FP8) {
        L->sc = dev_alloc(m, INF_SC_COUNT * sizeof(float), counter);
        L->w8 = dev_alloc(m, n, counter);
        const float amax = host_amax(w, n);
        ops->to_device(be, L->sc + INF_SC_AMAX, &amax, sizeof(float));
        ops->compute_scale(be, L->sc + INF_SC_W, L->sc + INF_SC_W_INV, L->sc + INF_SC_AMAX,
                           fp8_format_max(FP8_E4M3), 0.0f, 0);
    } else {
        L->w16 = dev_alloc(m, fp8t_bf16_bytes(out, in), counter);
    }
    /* row chunks, a multiple of 8 rows (so a BF16 chunk's row padding is the next chunk's
     * first rows, rewritten by it; only the last chunk pads, into the tensor's own padding) */
    size_t rows = STAGE_FLOATS / (size_t)in;
    rows = rows >= 8 ? rows / 8 * 8 : 8;
    for (size_t r0 = 0; r0 < (size_t)out; r0 += rows) {
        const int nr = (int)((size_t)out - r0 < rows ? (size_t)out - r0 : rows);
        ops->to_device(be, stage, w + r0 * in, (size_t)nr * in * sizeof(float));
        const fp8t_operand_req r =
            kind == INF_LIN_FP8 ? model_operand_req(L->w8 + r0 * in, stage, nr, in,
                                                    FP8T_OPERAND_E4M3, L->sc + INF_SC_W)
                                : model_operand_req(L->w16 + r0 * (size_t)fp8t_bf16_pad(in),
                                                    stage, nr, in, FP8T_OPERAND_BF16, NULL);
        ops->make_operand(be, &r);
    }
    ops->synchronize(be); /* the staging buffer is reused by the next weight's upload */
}

static void free_linear(fp8t_infer *m, inf_linear *L) {
    if (L->shared) return;
    m->ops->free(m->be, L->w32);
    m->ops->free(m->be, L->w16);
    m->ops->free(m->be, L->w8);
    m->ops->free(m->be, L->sc);
}

void fp8t_infer_destroy(fp8t_infer *m) {
    if (!m) return;
    const fp8t_backend_ops *ops = m->ops;
    if (m->graph) ops->graph_destroy(m->be, m->graph);
    if (m->layer) {
        for (int l = 0; l < m->cfg.n_layer; l++) {
            inf_layer *y = &m->layer[l];
            inf_linear *all[] = {&y->qkv, &y->proj, &y->fc1, &y->fc2, &y->gate, &y->up, &y->down};
            for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free_linear(m, all[i]);
        }
        free(m->layer);
    }
    free_linear(m, &m->head);
    free_linear(m, &m->emb);
    ops->free(m->be, m->small);
    ops->free(m->be, m->kc);
    ops->free(m->be, m->vc);
    ops->free(m->be, m->act_mem);
    ops->free(m->be, m->opbuf);
    ops->free(m->be, m->tokens);
    ops->free(m->be, m->all_logits);
    ops->free(m->be, m->losses);
    ops->free(m->be, m->targets);
    free(m);
}

/* The delayed X scales of w's FP8 state into each FP8 linear's sc (lin: its linear index).
 * -1 with err when a linear's input never saw an amax. */
static int set_delayed_scale(fp8t_infer *m, const fp8t_weights *w, fp8t_recipe_state *st,
                             inf_linear *L, int lin, const char *what, char *err, size_t errlen) {
    if (L->kind != INF_LIN_FP8) return 0;
    const int t = 3 * lin + FP8T_ROLE_X;
    if (!(fp8t_recipe_history_max(st, t) > 0.0f)) {
        return fp8t_errorf(
            err, errlen,
            "--act-scale delayed: %s (linear %d) has no learned activation "
            "scale in %s (its FP8 amax history is empty: the weights never trained or "
            "calibrated in FP8); use --act-scale current or calibrated",
            what, lin, w->source);
    }
    m->ops->to_device(m->be, L->sc + INF_SC_X, &st->scale[t], sizeof(float));
    m->ops->to_device(m->be, L->sc + INF_SC_X_INV, &st->scale_inv[t], sizeof(float));
    return 0;
}

fp8t_infer *fp8t_infer_create(fp8t_backend *be, const fp8t_weights *w, fp8t_eval_precision prec,
                              fp8t_act_scale act, int B, int Tmax, char *err, size_t errlen) {
    fp8t_infer_opts o;
    fp8t_infer_opts_default(&o, prec, act);
    return fp8t_infer_create_opts(be, w, &o, B, Tmax, err, errlen);
}

/* bytes of a linear's input operand [rows, cols] of kind (FP8 codes or a BF16 operand) */
static size_t operand_bytes(inf_lin_kind kind, int rows, int cols) {
    return kind == INF_LIN_FP8 ? (size_t)rows * cols : fp8t_bf16_bytes(rows, cols);
}

fp8t_infer *fp8t_infer_create_opts(fp8t_backend *be, const fp8t_weights *w,
                                   const fp8t_infer_opts *o, int B, int Tmax, char *err,
                                   size_t errlen) {
    char e[FP8T_ERR_LEN];
    const fp8t_eval_precision prec = o->prec;
    const fp8t_act_scale act = o->act;
    if (!be || !w || !w->params) {
        fp8t_errorf(err, errlen, "inference model: no backend or no weights");
        return NULL;
    }
    const fp8t_model_config *c = &w->model;
    if (fp8t_model_config_check(c, e, sizeof(e)) != 0) {
        fp8t_errorf(err, errlen, "inference model: %s", e);
        return NULL;
    }
    size_t total;
    const int n_info = fp8t_model_param_table(c, NULL, &total);
    if (total != w->num_params) {
        fp8t_errorf(err, errlen,
                    "inference model: the weights hold %zu parameters but their model "
                    "config needs %zu",
                    w->num_params, total);
        return NULL;
    }
    if (B < 1 || Tmax < 1 || Tmax > c->seq_len) {
        fp8t_errorf(err, errlen,
                    "inference model: batch %d and %d positions per sequence: need "
                    "batch >= 1 and 1 <= positions <= the model's seq_len %d",
                    B, Tmax, c->seq_len);
        return NULL;
    }
    if ((size_t)B * Tmax > (size_t)1 << 30) {
        fp8t_errorf(err, errlen, "inference model: batch %d x %d positions is too many tokens", B,
                    Tmax);
        return NULL;
    }
    const int kv = o->kv >= 0               ? o->kv
                   : prec == FP8T_EVAL_FP32 ? FP8T_KV_FP32
                   : prec == FP8T_EVAL_FP8  ? FP8T_KV_FP8
                                            : FP8T_KV_BF16;
    if (kv > FP8T_KV_FP8 || (kv == FP8T_KV_FP8 && prec == FP8T_EVAL_FP32)) {
        fp8t_errorf(err, errlen,
                    "inference model: KV cache kind %d with precision %s: the cache is "
                    "fp32, bf16, or fp8 (bf16 and fp8 precisions; fp32 is the exact reference)",
                    kv, fp8t_eval_precision_name(prec));
        return NULL;
    }
    const int fp8_head = o->fp8_head && prec == FP8T_EVAL_FP8;
    if (fp8_head && c->vocab_size % 16) {
        fp8t_errorf(
            err, errlen,
            "inference model: an FP8 head needs a vocabulary that is a "
            "multiple of 16 (cuBLASLt's FP8 GEMM alignment); this model's is %d: keep the "
            "BF16 head",
            c->vocab_size);
        return NULL;
    }
    const int n_lin_all = fp8t_model_num_linears(c);
    const int have_state = w->fp8_state && w->fp8_n == 3 * n_lin_all && w->fp8_len >= 1;
    if (prec == FP8T_EVAL_FP8 && act == FP8T_ACT_SCALE_DELAYED && !have_state) {
        fp8t_errorf(err, errlen,
                    "--act-scale delayed: %s has no FP8 state (learned activation "
                    "scales) for this model; use --act-scale current or calibrated",
                    w->source);
        return NULL;
    }
    size_t *soff = NULL;
    fp8t_param_info *info = calloc((size_t)n_info, sizeof(*info));
    fp8t_infer *m = calloc(1, sizeof(*m));
    if (!info || !m) {
        free(info);
        free(m);
        fp8t_errorf(err, errlen, "inference model: out of memory");
        return NULL;
    }
    fp8t_model_param_table(c, info, &total);
    m->be = be;
    m->ops = be->ops;
    m->cfg = *c;
    m->prec = prec;
    m->act = prec == FP8T_EVAL_FP8 ? act : FP8T_ACT_SCALE_CURRENT;
    m->act_static = m->act == FP8T_ACT_SCALE_DELAYED;
    snprintf(m->act_desc, sizeof(m->act_desc), "%s",
             prec != FP8T_EVAL_FP8                 ? "-"
             : m->act == FP8T_ACT_SCALE_DELAYED    ? "delayed (learned) scales"
             : m->act == FP8T_ACT_SCALE_CALIBRATED ? "calibrated scales (not yet calibrated)"
                                                   : "current scaling");
    m->kv = kv;
    m->B = B;
    m->Tmax = Tmax;
    m->C = c->n_embd;
    m->H = c->mlp_hidden;
    m->V = c->vocab_size;
    m->NH = c->n_head;
    m->NKV = fp8t_model_kv_heads(c);
    m->HS = c->n_embd / c->n_head;
    m->QKV = fp8t_model_qkv_dim(c);
    const int L = c->n_layer, C = m->C, H = m->H, V = m->V;
    const int gpt2 = c->arch == FP8T_ARCH_GPT2;
    const fp8t_backend_ops *ops = m->ops;
    m->layer = calloc((size_t)L, sizeof(inf_layer));
    if (!m->layer) {
        fp8t_errorf(err, errlen, "inference model: out of memory");
        goto fail;
    }

    /* the small FP32 tensors (every 1-D tensor, wpe, and wte in fp32) packed in one
     * allocation; soff[i]: tensor i's offset in it. bf16 and fp8 hold wte as BF16 only. */
    const int wte32 = prec == FP8T_EVAL_FP32;
#define IS_SMALL(i)                                                                              \
    (info[i].ndim == 1 || !strcmp(info[i].name, "wpe") || (wte32 && !strcmp(info[i].name, "wte")))
    size_t small_n = 0;
    soff = malloc((size_t)n_info * sizeof(size_t));
    if (!soff) {
        fp8t_errorf(err, errlen, "inference model: out of memory");
        goto fail;
    }
    for (int i = 0; i < n_info; i++) {
        const int is_small = IS_SMALL(i);
        soff[i] = small_n;
        small_n += is_small ? info[i].numel : 0;
    }
    m->small = dev_alloc(m, small_n * sizeof(float), &m->mem.other);
    for (int i = 0; i < n_info; i++)
        if (IS_SMALL(i))
            ops->to_device(be, m->small + soff[i], w->params + info[i].offset,
                           info[i].numel * sizeof(float));
#define SMALL(p) ((p) ? m->small + soff[(p)-info] : NULL)
    const fp8t_param_info *wte = find_param(info, n_info, "wte");
    m->wte = wte32 ? SMALL(wte) : NULL;
#undef IS_SMALL
    m->wpe = gpt2 ? SMALL(find_param(info, n_info, "wpe")) : NULL;
    m->lnf_w = SMALL(find_param(info, n_info, "lnf.w"));
    m->lnf_b = gpt2 ? SMALL(find_param(info, n_info, "lnf.b")) : NULL;

    const inf_lin_kind kind = prec == FP8T_EVAL_FP32  ? INF_LIN_F32
                              : prec == FP8T_EVAL_FP8 ? INF_LIN_FP8
                                                      : INF_LIN_BF16;
    float *stage = NULL;
    if (kind != INF_LIN_F32) {
        size_t big = 0; /* the largest matrix, capped at the staging size */
        for (int i = 0; i < n_info; i++)
            if (info[i].ndim == 2 && info[i].numel > big) big = info[i].numel;
        stage = ops->malloc(be, (big < STAGE_FLOATS ? big : STAGE_FLOATS) * sizeof(float));
    }
    fp8t_recipe_state st;
    if (have_state) fp8t_recipe_state_view(&st, w->fp8_state, w->fp8_n, w->fp8_len);
    const int mpl = fp8t_model_modules_per_layer(c);
    int rc = 0;
    for (int l = 0; l < L && rc == 0; l++) {
        inf_layer *y = &m->layer[l];
        const int lin0 = l * mpl;
#define WEIGHT(name) (w->params + find_layer_param(info, n_info, l, name)->offset)
        y->ln1_w = SMALL(find_layer_param(info, n_info, l, "ln1.w"));
        y->ln2_w = SMALL(find_layer_param(info, n_info, l, "ln2.w"));
        y->ln1_b = gpt2 ? SMALL(find_layer_param(info, n_info, l, "ln1.b")) : NULL;
        y->ln2_b = gpt2 ? SMALL(find_layer_param(info, n_info, l, "ln2.b")) : NULL;
        load_linear(m, &y->qkv, kind, WEIGHT("qkv.w"), m->QKV, C, stage, &m->mem.weights);
        y->qkv.bias = SMALL(find_layer_param(info, n_info, l, "qkv.b"));
        load_linear(m, &y->proj, kind, WEIGHT("proj.w"), C, C, stage, &m->mem.weights);
        y->proj.bias = SMALL(find_layer_param(info, n_info, l, "proj.b"));
        inf_linear *mods[5] = {&y->qkv, &y->proj, NULL, NULL, NULL};
        if (gpt2) {
            load_linear(m, &y->fc1, kind, WEIGHT("fc1.w"), H, C, stage, &m->mem.weights);
            y->fc1.bias = SMALL(find_layer_param(info, n_info, l, "fc1.b"));
            load_linear(m, &y->fc2, kind, WEIGHT("fc2.w"), C, H, stage, &m->mem.weights);
            y->fc2.bias = SMALL(find_layer_param(info, n_info, l, "fc2.b"));
            mods[2] = &y->fc1, mods[3] = &y->fc2;
        } else {
            load_linear(m, &y->gate, kind, WEIGHT("gate.w"), H, C, stage, &m->mem.weights);
            load_linear(m, &y->up, kind, WEIGHT("up.w"), H, C, stage, &m->mem.weights);
            load_linear(m, &y->down, kind, WEIGHT("down.w"), C, H, stage, &m->mem.weights);
            mods[2] = &y->gate, mods[3] = &y->up, mods[4] = &y->down;
        }
#undef WEIGHT
        for (int s = 0; s < mpl && rc == 0 && m->act == FP8T_ACT_SCALE_DELAYED; s++) {
            snprintf(e, sizeof(e), "layer %d %s", l,
                     fp8t_module_name(fp8t_model_module_of_slot(c, s)));
            rc = set_delayed_scale(m, w, &st, mods[s], lin0 + s, e, err, errlen);
        }
    }
    if (rc == 0) {
        /* bf16, fp8: the embedding table as a BF16 operand, or E4M3 codes with fp8_head
         * (counted with the embeddings) */
        const inf_lin_kind hk = wte32 ? INF_LIN_F32 : fp8_head ? INF_LIN_FP8 : INF_LIN_BF16;
        if (!wte32)
            load_linear(m, &m->emb, hk, w->params + wte->offset, V, C, stage, &m->mem.other);
        /* the head: BF16 in bf16 and fp8 (training's and the FP8 export's choice) unless
         * fp8_head, FP32 in fp32; a tied head reads the embedding table itself (and an FP8
         * one its scalars: the table uses only the weight's) */
        if (!c->untied_head) {
            m->head.kind = hk;
            m->head.out = V;
            m->head.in = C;
            m->head.w32 = (float *)m->wte;
            m->head.w16 = m->emb.w16;
            m->head.w8 = m->emb.w8;
            m->head.sc = m->emb.sc;
            m->head.shared = 1;
        } else {
            load_linear(m, &m->head, hk,
                        w->params + find_param(info, n_info, "lm_head.w")->offset, V, C, stage,
                        &m->mem.weights);
        }
        if (fp8_head && m->act == FP8T_ACT_SCALE_DELAYED)
            rc = set_delayed_scale(m, w, &st, &m->head, L * mpl, "the head", err, errlen);
    }
#undef SMALL
    if (stage) ops->free(be, stage);
    free(info);
    free(soff);
    info = NULL;
    soff = NULL;
    if (rc != 0) goto fail;

    /* the KV cache */
    m->kv_seq_bytes = (size_t)m->NKV * fp8t_kv_head_bytes(kv, Tmax, m->HS);
    m->kv_layer_bytes = (size_t)B * m->kv_seq_bytes;
    const size_t kv_bytes = (size_t)L * m->kv_layer_bytes;
    m->kc = dev_alloc(m, kv_bytes ? kv_bytes : 1, &m->mem.kv_cache);
    m->vc = dev_alloc(m, kv_bytes ? kv_bytes : 1, &m->mem.kv_cache);

    /* one layer's activations for R rows: whole sequences per prefill pass, B for a decode
     * step */
    long R = o->rows > 0 ? o->rows : FP8T_INFER_ROWS_DEFAULT;
    if (R > (long)B * Tmax) R = (long)B * Tmax;
    if (R < Tmax) R = Tmax;
    if (R < B) R = B;
    m->R = (int)R;
    long RM = o->mlp_rows > 0 ? o->mlp_rows : FP8T_INFER_MLP_ROWS_DEFAULT;
    if (RM < B) RM = B;
    if (RM > R) RM = R;
    m->RM = (int)RM;
    const size_t N = (size_t)R;
    const size_t NC = N * C;
    /* fc1 / gate and up write BF16 values where GELU's / SwiGLU's operand pass reads them so
     * (what BF16 linears give in PyTorch too): half the bytes of the MLP's largest tensors,
     * written and read */
    m->mlp16 = kind != INF_LIN_F32 && infer_mlp16_fused(m, kind);
    const size_t RH = m->mlp16 ? ((size_t)RM * H + 1) / 2 : (size_t)RM * H; /* floats */
    /* qkv and out share memory: qkv is read by the attention ops alone, before proj writes
     * out; out is read by the next norm (or the final one), before the next qkv GEMM writes
     * qkv */
    const size_t QO = N * (size_t)(m->QKV > C ? m->QKV : C);
    size_t floats =
        2 * NC + QO + (size_t)(gpt2 ? 1 : 2) * RH + N * m->NH + 2 * (size_t)B * C + (size_t)B * V;
    m->act_mem = dev_alloc(m, floats * sizeof(float), &m->mem.activations);
    float *p = m->act_mem;
    m->x = p, p += NC;
    m->atty = p, p += NC;
    m->qkv = m->out = p, p += QO;
    m->h1 = p, p += RH;
    if (!gpt2) m->h2 = p, p += RH;
    m->lse = p, p += N * m->NH;
    m->last = p, p += (size_t)B * C;
    m->lnl = p, p += (size_t)B * C;
    m->logits = p;
    if (kind != INF_LIN_F32) {
        /* a linear's input, FP8 codes or a BF16 operand: [N, C] (qkv, proj; the MLP's first
         * linears take at most RM of those rows) or [RM, H] (its last); and a BF16 head's
         * operand of at most max(B, INF_HEAD_ROWS) rows */
        const int hr = (int)N < INF_HEAD_ROWS ? (int)N : INF_HEAD_ROWS;
        size_t ob = operand_bytes(kind, (int)N, C);
        const size_t obm = operand_bytes(kind, (int)RM, H);
        const size_t hb = fp8t_bf16_bytes(B > hr ? B : hr, C);
        if (obm > ob) ob = obm;
        m->opbuf = dev_alloc(m, ob > hb ? ob : hb, &m->mem.activations);
    }
    m->tokens = dev_alloc(m, (N + (size_t)B) * sizeof(int), &m->mem.activations);
    m->pos = m->tokens + N;
    /* each linear's successor in a decode step, whose weight its GEMM's start prefetches */
    const int pmb = o->prefetch_mb < 0 ? FP8T_INFER_PREFETCH_MB_DEFAULT : o->prefetch_mb;
    m->prefetch_bytes = ops->prefetch_l2 ? (size_t)pmb << 20 : 0;
    inf_linear **lin = malloc((size_t)INF_LINEARS(m) * sizeof(*lin));
    if (!lin) {
        fp8t_errorf(err, errlen, "out of host memory");
        goto fail;
    }
    const int nl = infer_linears(m, lin);
    for (int i = 0; i + 1 < nl; i++) lin[i]->next = lin[i + 1];
    free(lin);
    /* decode steps recorded once and replayed where the backend records graphs; fp32 (the
     * exact reference) embeds positions from the host, so it always runs op by op */
    m->use_graphs = ops->graph_begin && !o->no_graphs && prec != FP8T_EVAL_FP32;
    ops->synchronize(be);
    return m;
fail:
    free(info);
    free(soff);
    fp8t_infer_destroy(m);
    return NULL;
}

void fp8t_infer_memory_get(const fp8t_infer *m, fp8t_infer_memory *mem) { *mem = m->mem; }
const fp8t_model_config *fp8t_infer_config(const fp8t_infer *m) { return &m->cfg; }
int fp8t_infer_B(const fp8t_infer *m) { return m->B; }
int fp8t_infer_Tmax(const fp8t_infer *m) { return m->Tmax; }
const char *fp8t_infer_act_desc(const fp8t_infer *m) { return m->act_desc; }
int fp8t_infer_kv(const fp8t_infer *m) { return m->kv; }
int fp8t_infer_needs_calibration(const fp8t_infer *m) {
    return m->prec == FP8T_EVAL_FP8 && m->act == FP8T_ACT_SCALE_CALIBRATED && !m->act_static;
}
int fp8t_infer_graphs(const fp8t_infer *m) { return m->use_graphs; }
int fp8t_infer_fp8_head(const fp8t_infer *m) { return m->head.kind == INF_LIN_FP8; }
size_t fp8t_infer_prefetch_bytes(const fp8t_infer *m) { return m->prefetch_bytes; }
