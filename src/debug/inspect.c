/* The tensor inspector (--inspect): statistics of the GEMM operands and results the model
 * hook shows it, for the selected steps and sites, one JSON object per site per step into
 * OUT/stats.jsonl, and optional .npy dumps under OUT/dumps/step_NNNNNN/.
 *
 * Which scale the statistics of an operand use: the one its GEMM really quantizes with.
 *   delayed (and bf16/fp32, where it is the scale FP8 would use): the recipe state's scale;
 *   current, fake: the current-scaling scale of this very tensor;
 *   block, mxfp8: error statistics (mse, cosine, sqnr, underflow) of the real block / MX
 *   image; "scale" is then the per-tensor current scale, used for dumps and block=N stats.
 * Micro-batches: by default only the first micro-batch of a step is inspected (micro = 0);
 * micro=all writes one row per micro-batch (dumps stay first-micro-batch only). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/debug.h"
#include "fp8train/io.h"
#include "fp8train/recipe.h"
#include "fp8train/stats.h"

#define MAX_LAYER_RANGES 32
#define BLOCK_TILE 128 /* DeepSeek-V3 tiles: 1x128 activations/gradients, 128x128 weights */

/* What a spec selects and asks for (the debug.h syntax), as parse_spec reads it. */
typedef struct {
    int every, start, end;         /* end < 0: no end */
    int n_ranges;                  /* 0: every layer (and the head) */
    int range_lo[MAX_LAYER_RANGES], range_hi[MAX_LAYER_RANGES];
    int head;                      /* the LM head (layer -1) explicitly selected */
    unsigned module_mask, gemm_mask, tensor_mask;
    int all_micro;
    int block, block_list, dump;   /* outputs */
} inspect_spec;

struct fp8t_inspector {
    inspect_spec sel;
    char out_dir[1024];
    FILE *stats;                   /* OUT/stats.jsonl */
    char write_err[1200];          /* first failed write of stats.jsonl ("" none) */
    /* per step */
    int step, active;
    int *seen;                     /* [num_linears * GEMMS * KINDS] micro-batch counters */
    size_t seen_n;
    float *state;                  /* host snapshot of the FP8 recipe state */
    size_t state_cap;
    int have_state, state_n, state_len;
    /* host scratch, grown as needed */
    float *x;                      /* [rows, cols] */
    size_t x_cap;
    float *img;                    /* [rows, cols] block / MX image */
    size_t img_cap;
    uint8_t *codes;                /* [rows, cols] */
    size_t codes_cap;
    fp8t_stats *blocks;            /* [n_blocks] */
    size_t blocks_cap;
    float *bscales;                /* block scales / MX exponents */
    size_t bscales_cap;
    fp8t_inspect_sink sink;        /* optional second destination (TensorBoard) */
    void *sink_ctx;
};

/* ---- spec parsing ----
 * Messages name the key, not the option: the caller says which option the spec came from
 * (train's --inspect, inspect's --spec). */

static int parse_int(int *out, const char *v, int lo, const char *key, char *err, size_t errlen) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > 1000000000L) {
        snprintf(err, errlen, "%s=%s: expected an integer >= %d", key, v, lo);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_layers(inspect_spec *sp, const char *v, char *err, size_t errlen) {
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", v);
    for (char *save = NULL, *tok = strtok_r(buf, "+", &save); tok;
         tok = strtok_r(NULL, "+", &save)) {
        if (strcmp(tok, "all") == 0) { sp->n_ranges = 0; sp->head = 0; return 0; }
        if (strcmp(tok, "head") == 0) { sp->head = 1; continue; }
        char *end;
        long a = strtol(tok, &end, 10), b = a;
        if (end != tok && *end == '-') {
            char *e2;
            b = strtol(end + 1, &e2, 10);
            if (e2 == end + 1 || *e2) end = tok; /* malformed */
            else end = e2;
        }
        if (end == tok || *end || a < 0 || b < a || b > 1000000) {
            snprintf(err, errlen,
                     "layers=%s: expected layers like 3, 0-3, 0+2+5-7, head or all",
                     v);
            return -1;
        }
        if (sp->n_ranges == MAX_LAYER_RANGES) {
            snprintf(err, errlen, "layers=%s: at most %d ranges", v,
                     MAX_LAYER_RANGES);
            return -1;
        }
        sp->range_lo[sp->n_ranges] = (int)a;
        sp->range_hi[sp->n_ranges] = (int)b;
        sp->n_ranges++;
    }
    /* "head" alone: only the head. */
    if (sp->n_ranges == 0 && sp->head) {
        sp->range_lo[0] = 1;
        sp->range_hi[0] = 0;
        sp->n_ranges = 1;
    }
    return 0;
}

/* The bits of one word of a '+'-joined list (modules=, gemms=, tensors=), 0 if unknown. */
typedef unsigned (*word_bits_fn)(const char *word);

static unsigned module_bits(const char *w) {
    fp8t_module m;
    if (strcmp(w, "all") == 0) return (1u << FP8T_MOD_COUNT) - 1;
    if (strcmp(w, "attn") == 0) return 1u << FP8T_MOD_QKV | 1u << FP8T_MOD_PROJ;
    if (strcmp(w, "mlp") == 0)
        return 1u << FP8T_MOD_FC1 | 1u << FP8T_MOD_FC2 | 1u << FP8T_MOD_GATE |
               1u << FP8T_MOD_UP | 1u << FP8T_MOD_DOWN;
    return fp8t_module_parse(&m, w) == 0 ? 1u << m : 0;
}

static unsigned gemm_bits(const char *w) {
    if (strcmp(w, "all") == 0) return (1u << FP8T_GEMM_COUNT) - 1;
    for (int g = 0; g < FP8T_GEMM_COUNT; g++)
        if (strcmp(w, fp8t_gemm_name((fp8t_gemm_kind)g)) == 0) return 1u << g;
    return 0;
}

static unsigned tensor_bits(const char *w) {
    if (strcmp(w, "all") == 0) return (1u << FP8T_T_COUNT) - 1;
    if (strcmp(w, "operands") == 0)
        return 1u << FP8T_T_INPUT | 1u << FP8T_T_WEIGHT | 1u << FP8T_T_GRAD_OUTPUT;
    if (strcmp(w, "results") == 0)
        return 1u << FP8T_T_OUTPUT | 1u << FP8T_T_DGRAD | 1u << FP8T_T_WGRAD;
    for (int k = 0; k < FP8T_T_COUNT; k++)
        if (strcmp(w, fp8t_tensor_kind_name((fp8t_tensor_kind)k)) == 0) return 1u << k;
    return 0;
}

/* *mask = the union of the bits of the '+'-joined words of v; -1 with err at an unknown word.
 * key and what name the list and its words in the message, expected lists the words. */
static int parse_list(unsigned *mask, const char *v, word_bits_fn bits, const char *key,
                      const char *what, const char *expected, char *err, size_t errlen) {
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", v);
    *mask = 0;
    for (char *save = NULL, *tok = strtok_r(buf, "+", &save); tok;
         tok = strtok_r(NULL, "+", &save)) {
        unsigned b = bits(tok);
        if (!b) {
            snprintf(err, errlen, "%s=%s: unknown %s '%s' (expected %s, joined by '+')", key, v,
                     what, tok, expected);
            return -1;
        }
        *mask |= b;
    }
    return 0;
}

/* Fill *sp from spec (NULL or "": everything, every step, no dumps). 0 ok; -1 with err. */
static int parse_spec(inspect_spec *sp, const char *spec, char *err, size_t errlen) {
    memset(sp, 0, sizeof(*sp));
    sp->every = 1;
    sp->end = -1;
    sp->module_mask = sp->gemm_mask = sp->tensor_mask = ~0u;
    if (!spec) spec = "";
    char buf[2048];
    if (strlen(spec) >= sizeof(buf)) {
        snprintf(err, errlen, "spec too long (%zu characters)", strlen(spec));
        return -1;
    }
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv;
         kv = strtok_r(NULL, ",", &save)) {
        while (*kv == ' ') kv++;
        if (!*kv) continue;
        char *eq = strchr(kv, '=');
        if (!eq || eq == kv || !eq[1]) {
            snprintf(err, errlen,
                     "'%s' is not key=value (e.g. \"every=10,layers=0-3,"
                     "tensors=input+grad_output,dump=1\")",
                     kv);
            return -1;
        }
        *eq = 0;
        const char *k = kv, *v = eq + 1;
        int rc;
        if (strcmp(k, "every") == 0) rc = parse_int(&sp->every, v, 1, k, err, errlen);
        else if (strcmp(k, "start") == 0) rc = parse_int(&sp->start, v, 0, k, err, errlen);
        else if (strcmp(k, "end") == 0) rc = parse_int(&sp->end, v, 0, k, err, errlen);
        else if (strcmp(k, "layers") == 0) rc = parse_layers(sp, v, err, errlen);
        else if (strcmp(k, "modules") == 0 || strcmp(k, "module") == 0)
            rc = parse_list(&sp->module_mask, v, module_bits, "modules", "module",
                            "qkv, proj, fc1, fc2, gate, up, down, head, attn, mlp or all", err,
                            errlen);
        else if (strcmp(k, "gemms") == 0 || strcmp(k, "gemm") == 0)
            rc = parse_list(&sp->gemm_mask, v, gemm_bits, "gemms", "GEMM",
                            "fprop, dgrad, wgrad or all", err, errlen);
        else if (strcmp(k, "tensors") == 0 || strcmp(k, "tensor") == 0)
            rc = parse_list(&sp->tensor_mask, v, tensor_bits, "tensors", "tensor",
                            "input, weight, grad_output, output, dgrad, wgrad, operands, "
                            "results or all", err, errlen);
        else if (strcmp(k, "block") == 0) rc = parse_int(&sp->block, v, 1, k, err, errlen);
        else if (strcmp(k, "block_list") == 0)
            rc = parse_int(&sp->block_list, v, 0, k, err, errlen);
        else if (strcmp(k, "dump") == 0) rc = parse_int(&sp->dump, v, 0, k, err, errlen);
        else if (strcmp(k, "micro") == 0) {
            rc = 0;
            if (strcmp(v, "all") == 0) sp->all_micro = 1;
            else if (strcmp(v, "first") == 0) sp->all_micro = 0;
            else {
                snprintf(err, errlen, "micro=%s: expected first or all", v);
                rc = -1;
            }
        } else {
            snprintf(err, errlen,
                     "unknown key '%s' (keys: every, start, end, layers, modules, "
                     "gemms, tensors, block, block_list, dump, micro)",
                     k);
            rc = -1;
        }
        if (rc) return -1;
    }
    if (sp->end >= 0 && sp->end < sp->start) {
        snprintf(err, errlen, "end=%d is before start=%d", sp->end, sp->start);
        return -1;
    }
    return 0;
}

int fp8t_inspector_spec_check(const char *spec, char *err, size_t errlen) {
    inspect_spec sp;
    return parse_spec(&sp, spec, err, errlen);
}

fp8t_inspector *fp8t_inspector_create(const char *spec, const char *out_dir, char *err,
                                      size_t errlen) {
    fp8t_inspector *in = calloc(1, sizeof(*in));
    if (!in) { snprintf(err, errlen, "out of memory"); return NULL; }
    in->step = -1;
    if (parse_spec(&in->sel, spec, err, errlen)) goto fail;
    if (!out_dir || !*out_dir || strlen(out_dir) > 900) {
        snprintf(err, errlen, "needs an output directory (--out DIR)");
        goto fail;
    }
    snprintf(in->out_dir, sizeof(in->out_dir), "%s", out_dir);
    if (fp8t_mkdirs(in->out_dir, err, errlen)) goto fail;
    char path[1100];
    snprintf(path, sizeof(path), "%s/stats.jsonl", in->out_dir);
    /* Appending: a resumed run continues the file of the run it resumes. */
    in->stats = fopen(path, "a");
    if (!in->stats) {
        snprintf(err, errlen, "cannot open %s for writing: %s", path, strerror(errno));
        goto fail;
    }
    return in;
fail:
    fp8t_inspector_destroy(in);
    return NULL;
}

void fp8t_inspector_destroy(fp8t_inspector *in) {
    if (!in) return;
    if (in->stats) fclose(in->stats);
    free(in->seen);
    free(in->state);
    free(in->x);
    free(in->img);
    free(in->codes);
    free(in->blocks);
    free(in->bscales);
    free(in);
}

void fp8t_inspector_begin_step(fp8t_inspector *in, int step) {
    if (!in) return;
    in->step = step;
    in->active = step >= in->sel.start && (in->sel.end < 0 || step <= in->sel.end) &&
                 (step - in->sel.start) % in->sel.every == 0;
    in->have_state = 0;
    if (in->seen) memset(in->seen, 0, in->seen_n * sizeof(int));
}

void fp8t_inspector_end_step(fp8t_inspector *in, int step) {
    (void)step;
    if (!in) return;
    /* a full disk shows at the flush (or as the stream's error flag from an earlier fputs) */
    if (in->active && (fflush(in->stats) != 0 || ferror(in->stats)) && !in->write_err[0])
        snprintf(in->write_err, sizeof(in->write_err), "cannot write %s/stats.jsonl: %s",
                 in->out_dir, strerror(errno ? errno : EIO));
    in->active = 0;
}

void fp8t_inspector_set_sink(fp8t_inspector *in, fp8t_inspect_sink fn, void *ctx) {
    if (!in) return;
    in->sink = fn;
    in->sink_ctx = ctx;
}

/* The site for the sink: the layer zero-padded so that a dashboard sorting tags by name lists
 * layer03 before layer10. */
static void sink_site(char *buf, size_t len, const fp8t_tensor_site *s) {
    char layer[16];
    if (s->layer < 0) snprintf(layer, sizeof(layer), "head");
    else snprintf(layer, sizeof(layer), "layer%02d", s->layer);
    snprintf(buf, len, "%s.%s.%s.%s", layer, fp8t_module_name(s->module),
             fp8t_gemm_name(s->gemm), fp8t_tensor_kind_name(s->kind));
}

static void sink_stats(fp8t_inspector *in, const fp8t_tensor_site *site, const fp8t_stats *st,
                       int is_operand, float scale) {
    char name[96];
    sink_site(name, sizeof(name), site);
    const struct {
        const char *stat;
        double v;
        int operand_only;
    } rows[] = {
        {"underflow_pct", st->underflow_pct, 1}, {"saturation_pct", st->saturation_pct, 1},
        {"sqnr_db", st->sqnr_db, 1},             {"scale", scale, 1},
        {"amax", st->amax, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        /* float: the sink's consumer (TensorBoard) keeps float32; an exact image's SQNR
         * (1e300) has no float value and is left out like a non-finite one */
        if ((is_operand || !rows[i].operand_only) && isfinite((float)rows[i].v))
            in->sink(in->sink_ctx, in->step, name, rows[i].stat, rows[i].v);
}

const char *fp8t_inspector_write_error(const fp8t_inspector *in) {
    return in && in->write_err[0] ? in->write_err : NULL;
}

static int layer_selected(const fp8t_inspector *in, int layer) {
    if (in->sel.n_ranges == 0) return 1;
    if (layer < 0) return in->sel.head;
    for (int i = 0; i < in->sel.n_ranges; i++)
        if (layer >= in->sel.range_lo[i] && layer <= in->sel.range_hi[i]) return 1;
    return 0;
}

static int grow_buf(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    void *q = realloc(*p, need * elem);
    if (!q) return -1;
    *p = q;
    *cap = need;
    return 0;
}

/* The micro-batch index of this site within the step (0 for the first time it is seen). */
static int next_micro(fp8t_inspector *in, fp8t_model *m, const fp8t_tensor_site *site) {
    size_t need = (size_t)fp8t_model_num_linears(fp8t_model_get_config(m)) * FP8T_GEMM_COUNT *
                  FP8T_T_COUNT;
    if (need > in->seen_n) {
        int *p = realloc(in->seen, need * sizeof(int));
        if (!p) return 0;
        memset(p + in->seen_n, 0, (need - in->seen_n) * sizeof(int));
        in->seen = p;
        in->seen_n = need;
    }
    size_t idx = ((size_t)site->lin * FP8T_GEMM_COUNT + (size_t)site->gemm) * FP8T_T_COUNT +
                 (size_t)site->kind;
    if (site->lin < 0 || idx >= in->seen_n) return 0;
    return in->seen[idx]++;
}

/* Host copy of the recipe state, taken at the first hook call of an inspected step, i.e.
 * before this step's amaxes reach the history: amax_history_max is then the max over the
 * steps the current scale came from. */
static const float *state_snapshot(fp8t_inspector *in, fp8t_model *m) {
    if (in->have_state) return in->state;
    int n = fp8t_model_fp8_count(m), len = fp8t_model_fp8_history_len(m);
    size_t floats = fp8t_recipe_state_floats(n, len);
    if (grow_buf((void **)&in->state, &in->state_cap, floats, sizeof(float))) return NULL;
    fp8t_backend *be = fp8t_model_backend(m);
    be->ops->to_host(be, in->state, fp8t_model_fp8_state(m), floats * sizeof(float));
    in->state_n = n;
    in->state_len = len;
    in->have_state = 1;
    return in->state;
}

static void site_name(char *buf, size_t len, const fp8t_tensor_site *s) {
    char layer[16];
    if (s->layer < 0) snprintf(layer, sizeof(layer), "head");
    else snprintf(layer, sizeof(layer), "%d", s->layer);
    snprintf(buf, len, "%s.%s.%s.%s", layer, fp8t_module_name(s->module),
             fp8t_gemm_name(s->gemm), fp8t_tensor_kind_name(s->kind));
}

/* Error statistics of a block-scaled or MXFP8 image of x (rows x cols) into st (moments from
 * fp8t_compare_stats, underflow counted here; block scales never saturate). */
static void block_image_stats(fp8t_inspector *in, fp8t_stats *st, const fp8t_tensor_site *s) {
    size_t n = (size_t)s->rows * (size_t)s->cols;
    if (grow_buf((void **)&in->img, &in->img_cap, n, sizeof(float)) ||
        grow_buf((void **)&in->codes, &in->codes_cap, n, 1)) {
        fp8t_tensor_stats(st, in->x, n);
        return;
    }
    if (s->precision == FP8T_PREC_MXFP8) {
        size_t nb = (size_t)s->rows * (size_t)((s->cols + 31) / 32);
        if (grow_buf((void **)&in->bscales, &in->bscales_cap, nb, sizeof(float))) return;
        uint8_t *e8m0 = (uint8_t *)in->bscales; /* [rows, ceil(cols/32)] */
        fp8t_mxfp8_quantize(in->codes, e8m0, in->x, s->rows, s->cols);
        fp8t_mxfp8_dequantize(in->img, in->codes, e8m0, s->rows, s->cols);
    } else {
        /* the model's tiles: weights 128x128; activations and gradients 1x128 along the
         * reduction dimension, which for Wgrad is the token dimension (128x1) */
        int tr = 1, tc = BLOCK_TILE;
        if (s->kind == FP8T_T_WEIGHT) tr = BLOCK_TILE;
        else if (s->gemm == FP8T_GEMM_WGRAD) { tr = BLOCK_TILE; tc = 1; }
        size_t nb = (size_t)((s->rows + tr - 1) / tr) * (size_t)((s->cols + tc - 1) / tc);
        if (grow_buf((void **)&in->bscales, &in->bscales_cap, nb, sizeof(float))) return;
        fp8t_block_quantize(in->codes, in->bscales, in->x, s->rows, s->cols, tr, tc, s->fmt);
        fp8t_block_dequantize(in->img, in->codes, in->bscales, s->rows, s->cols, tr, tc, s->fmt);
    }
    fp8t_compare_stats(st, in->x, in->img, n);
    size_t nonzero = 0, under = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(in->x[i]) || in->x[i] == 0) continue;
        nonzero++;
        under += in->img[i] == 0;
    }
    st->underflow_pct = nonzero ? 100.0 * (double)under / (double)nonzero : 0.0;
    st->saturation_pct = 0.0;
}

/* ---- one JSON line, numbers printed so that they read back bit-exact ---- */

typedef struct {
    char *s;
    size_t n, cap;
} line_buf;

static void lb_put(line_buf *b, const char *text, size_t len) {
    if (b->n + len + 1 > b->cap) {
        size_t nc = (b->cap ? 2 * b->cap : 1024) + len;
        char *p = realloc(b->s, nc);
        if (!p) return;
        b->s = p;
        b->cap = nc;
    }
    memcpy(b->s + b->n, text, len);
    b->n += len;
    b->s[b->n] = 0;
}

static void lb_key(line_buf *b, const char *k) {
    lb_put(b, b->n > 1 ? ",\"" : "\"", b->n > 1 ? 2 : 1);
    lb_put(b, k, strlen(k));
    lb_put(b, "\":", 2);
}

/* The shortest %.Ng that parses back to the same double; non-finite values are null. */
static void lb_number(line_buf *b, double v) {
    char t[40];
    if (!isfinite(v)) { lb_put(b, "null", 4); return; }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(t, sizeof(t), "%.*g", prec, v);
        if (strtod(t, NULL) == v) break;
    }
    lb_put(b, t, strlen(t));
}

static void add_num(line_buf *b, const char *k, double v) {
    lb_key(b, k);
    lb_number(b, v);
}

/* Values are our own identifiers (module, gemm, tensor, precision and format names): no
 * character needs escaping. */
static void add_str(line_buf *b, const char *k, const char *v) {
    lb_key(b, k);
    lb_put(b, "\"", 1);
    lb_put(b, v, strlen(v));
    lb_put(b, "\"", 1);
}

static void add_array(line_buf *b, const char *k, const fp8t_stats *blocks, size_t nb,
                      size_t field_offset) {
    lb_key(b, k);
    lb_put(b, "[", 1);
    for (size_t i = 0; i < nb; i++) {
        if (i) lb_put(b, ",", 1);
        lb_number(b, *(const double *)((const char *)&blocks[i] + field_offset));
    }
    lb_put(b, "]", 1);
}

/* Per-block statistics of the per-tensor quantization, summarized (and listed if asked). */
static void add_block_stats(fp8t_inspector *in, line_buf *o, size_t n, float scale,
                            fp8_format fmt) {
    size_t bs = (size_t)in->sel.block;
    size_t nb = (n + bs - 1) / bs;
    if (nb == 0 || grow_buf((void **)&in->blocks, &in->blocks_cap, nb, sizeof(fp8t_stats)))
        return;
    fp8t_block_fp8_stats(in->blocks, in->x, n, bs, scale, fmt);
    double worst_sqnr = INFINITY, amax_max = 0, amax_min_nz = INFINITY, under_max = 0;
    size_t worst_i = 0, with_under = 0;
    for (size_t b = 0; b < nb; b++) {
        const fp8t_stats *s = &in->blocks[b];
        if (s->sqnr_db < worst_sqnr) { worst_sqnr = s->sqnr_db; worst_i = b; }
        if (s->amax > amax_max) amax_max = s->amax;
        if (s->amax > 0 && s->amax < amax_min_nz) amax_min_nz = s->amax;
        if (s->underflow_pct > 0) with_under++;
        if (s->underflow_pct > under_max) under_max = s->underflow_pct;
    }
    add_num(o, "block", (double)bs);
    add_num(o, "n_blocks", (double)nb);
    add_num(o, "block_sqnr_min_db", worst_sqnr);
    add_num(o, "block_sqnr_min_index", (double)worst_i);
    add_num(o, "block_amax_max", amax_max);
    add_num(o, "block_amax_min_nonzero", isfinite(amax_min_nz) ? amax_min_nz : 0.0);
    /* NaN (JSON null) when no block has a nonzero amax */
    add_num(o, "block_amax_ratio", isfinite(amax_min_nz) ? amax_max / amax_min_nz : NAN);
    add_num(o, "blocks_with_underflow_pct", 100.0 * (double)with_under / (double)nb);
    add_num(o, "block_underflow_max_pct", under_max);
    if (in->sel.block_list) {
        add_array(o, "block_amax", in->blocks, nb, offsetof(fp8t_stats, amax));
        add_array(o, "block_sqnr_db", in->blocks, nb, offsetof(fp8t_stats, sqnr_db));
        add_array(o, "block_underflow_pct", in->blocks, nb, offsetof(fp8t_stats, underflow_pct));
    }
}

static void write_dumps(fp8t_inspector *in, const fp8t_tensor_site *s, float scale,
                        float scale_inv, int is_operand) {
    char dir[1100], name[96], path[1300], err[512];
    snprintf(dir, sizeof(dir), "%s/dumps/step_%06d", in->out_dir, in->step);
    if (fp8t_mkdirs(dir, err, sizeof(err))) {
        fprintf(stderr, "fp8train: inspect: %s\n", err);
        return;
    }
    site_name(name, sizeof(name), s);
    int64_t shape[2] = {s->rows, s->cols};
    size_t n = (size_t)s->rows * (size_t)s->cols;
    snprintf(path, sizeof(path), "%s/%s.npy", dir, name);
    int rc = fp8t_npy_write(path, "<f4", 2, shape, in->x, err, sizeof(err));
    if (!rc && is_operand && !grow_buf((void **)&in->codes, &in->codes_cap, n, 1)) {
        fp8_quantize(in->codes, in->x, n, scale, s->fmt, 1);
        snprintf(path, sizeof(path), "%s/%s.fp8.npy", dir, name);
        rc = fp8t_npy_write(path, "|u1", 2, shape, in->codes, err, sizeof(err));
        int64_t one = 1;
        snprintf(path, sizeof(path), "%s/%s.scale_inv.npy", dir, name);
        if (!rc) rc = fp8t_npy_write(path, "<f4", 1, &one, &scale_inv, err, sizeof(err));
    }
    if (rc) fprintf(stderr, "fp8train: inspect: dump failed: %s\n", err);
}

void fp8t_inspector_observe(fp8t_inspector *in, fp8t_model *m, const fp8t_tensor_site *site,
                            float *x) {
    if (!in || !in->active || !site || !x) return;
    /* the recipe state as it was when the step began: the first hook call of a step comes
     * before any of its amaxes is recorded, whatever the selection */
    if (!in->have_state) state_snapshot(in, m);
    if (!layer_selected(in, site->layer) || !(in->sel.module_mask >> site->module & 1u) ||
        !(in->sel.gemm_mask >> site->gemm & 1u) || !(in->sel.tensor_mask >> site->kind & 1u))
        return;
    int micro = next_micro(in, m, site);
    if (micro > 0 && !in->sel.all_micro) return;
    if (site->rows <= 0 || site->cols <= 0) return;
    size_t n = (size_t)site->rows * (size_t)site->cols;
    if (grow_buf((void **)&in->x, &in->x_cap, n, sizeof(float))) {
        fprintf(stderr, "fp8train: inspect: out of memory for a %dx%d tensor\n", site->rows,
                site->cols);
        return;
    }
    fp8t_backend *be = fp8t_model_backend(m);
    be->ops->to_host(be, in->x, x, n * sizeof(float));

    int is_operand = site->fp8_index >= 0;
    fp8t_stats st;
    float scale = NAN, scale_inv = NAN;
    double hist_max = NAN;
    const char *scale_source = NULL;
    if (is_operand) {
        const float *state = state_snapshot(in, m);
        fp8t_recipe_state rs;
        if (state && site->fp8_index < in->state_n) {
            fp8t_recipe_state_view(&rs, (float *)state, in->state_n, in->state_len);
            hist_max = fp8t_recipe_history_max(&rs, site->fp8_index);
            scale = rs.scale[site->fp8_index];
            scale_inv = rs.scale_inv[site->fp8_index];
        }
        fp8t_precision p = site->precision;
        if (p == FP8T_PREC_CURRENT || p == FP8T_PREC_FAKE || p == FP8T_PREC_BLOCK ||
            p == FP8T_PREC_MXFP8 || !isfinite(scale)) {
            const fp8t_policy *pol = fp8t_model_get_policy(m);
            scale = fp8t_current_scale(fp8_amax(in->x, n), fp8_format_max(site->fmt),
                                       pol ? pol->epsilon : 0.0f, pol ? pol->pow2_scales : 0);
            scale_inv = 1.0f / scale;
            scale_source = (p == FP8T_PREC_BLOCK || p == FP8T_PREC_MXFP8) ? fp8t_precision_name(p)
                                                                           : "current";
        } else {
            scale_source = "delayed";
        }
        if (p == FP8T_PREC_BLOCK || p == FP8T_PREC_MXFP8) block_image_stats(in, &st, site);
        else fp8t_fp8_stats(&st, in->x, n, scale, site->fmt);
    } else {
        fp8t_tensor_stats(&st, in->x, n);
    }

    line_buf lb = {0}, *o = &lb;
    lb_put(o, "{", 1);
    add_num(o, "step", in->step);
    add_num(o, "micro", micro);
    add_num(o, "layer", site->layer);
    add_str(o, "module", fp8t_module_name(site->module));
    add_str(o, "gemm", fp8t_gemm_name(site->gemm));
    add_str(o, "tensor", fp8t_tensor_kind_name(site->kind));
    add_str(o, "precision", fp8t_precision_name(site->precision));
    add_str(o, "fmt", fp8_format_name(site->fmt));
    add_num(o, "rows", site->rows);
    add_num(o, "cols", site->cols);
    add_num(o, "min", st.min);
    add_num(o, "max", st.max);
    add_num(o, "mean", st.mean);
    add_num(o, "std", st.std);
    add_num(o, "l1", st.l1);
    add_num(o, "l2", st.l2);
    add_num(o, "amax", st.amax);
    add_num(o, "dynamic_range", st.dynamic_range);
    /* Error statistics exist for quantized operands only; results get null. */
    add_num(o, "underflow_pct", is_operand ? st.underflow_pct : NAN);
    add_num(o, "saturation_pct", is_operand ? st.saturation_pct : NAN);
    add_num(o, "mse", is_operand ? st.mse : NAN);
    add_num(o, "cosine", is_operand ? st.cosine : NAN);
    add_num(o, "sqnr_db", is_operand ? st.sqnr_db : NAN);
    add_num(o, "scale", scale);
    add_num(o, "scale_inv", scale_inv);
    add_num(o, "amax_history_max", hist_max);
    add_num(o, "n_nan", (double)st.n_nan);
    add_num(o, "n_inf", (double)st.n_inf);
    if (scale_source) add_str(o, "scale_source", scale_source);
    if (is_operand && in->sel.block > 0) add_block_stats(in, o, n, scale, site->fmt);
    lb_put(o, "}\n", 2);
    if (lb.s) fputs(lb.s, in->stats);
    free(lb.s);

    if (in->sink && micro == 0) sink_stats(in, site, &st, is_operand, scale);
    if (in->sel.dump && micro == 0) write_dumps(in, site, scale, scale_inv, is_operand);
}
