/* The tensor inspector (--inspect): statistics of the GEMM operands and results the model
 * hook shows it, for the selected steps and sites, one JSON object per site per step into
 * OUT/stats.jsonl, and optional .npy dumps under OUT/dumps/step_NNNNNN/.
 *
 * Which scale the statistics of an operand use: the one its GEMM really quantizes with.
 *   delayed (and bf16/fp32, where it is the scale FP8 would use): the recipe state's scale;
 *   current, fake: the current-scaling scale of this very tensor;
 *   block, rowwise, mxfp8: error statistics (mse, cosine, sqnr, underflow) of the real block /
 *   row / MX image; "scale" is then the per-tensor current scale, used for dumps and block=N
 *   stats. Block and rowwise rows also carry their tiles' worst SQNR and underflow
 *   (tile_sqnr_min_db, tile_underflow_max_pct, ...: each tile of the GEMM's own on its own).
 * Micro-batches: by default only the first micro-batch of a step is inspected (micro = 0);
 * micro=all writes one row per micro-batch (dumps stay first-micro-batch only). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "instrument/dump_writer.h"
#include "fp8train/debug.h"
#include "fp8train/error.h"
#include "fp8train/io.h"
#include "fp8train/recipe.h"
#include "fp8train/stats.h"

#define MAX_LAYER_RANGES 32
#define BLOCK_TILE 128
/* dumps: pinned host memory in flight to the writer thread before a dump waits for it */
#define DUMP_INFLIGHT_BYTES                                                                      \
    ((size_t)2 << 30) /* DeepSeek-V3 tiles: 1x128 activations/gradients, 128x128 weights */

/* What a spec selects and asks for (the debug.h syntax), as parse_spec reads it. */
typedef struct {
    int every, start, end; /* end < 0: no end */
    int n_ranges;          /* 0: every layer (and the head) */
    int range_lo[MAX_LAYER_RANGES], range_hi[MAX_LAYER_RANGES];
    int head; /* the LM head (layer -1) explicitly selected */
    unsigned module_mask, gemm_mask, tensor_mask;
    int all_micro;
    int block, block_list, dump; /* outputs */
    int whatif_mx;               /* whatif=all: the MXFP8 what-if image too */
} inspect_spec;

struct fp8t_inspector {
    inspect_spec sel;
    char out_dir[1024];
    FILE *stats;          /* OUT/stats.jsonl */
    char write_err[1200]; /* first failed write of stats.jsonl ("" none) */
    /* per step */
    int step, active;
    int *seen; /* [num_linears * GEMMS * KINDS] micro-batch counters */
    size_t seen_n;
    /* the amax each tensor's delayed scale of this step came from: taken from the recipe
     * state just before the previous step's scale update (fp8t_inspector_before_scale_update) */
    float *state; /* host copy of the recipe state before that update */
    size_t state_cap;
    float *upd_amax; /* [upd_n] */
    size_t upd_cap;
    int upd_n, upd_step; /* upd_step: the step whose scales came from upd_amax */
    /* device memory (the statistics op's results and block list), from the model's backend */
    fp8t_backend *be;
    struct pending_row *rows; /* [n_rows] sites queued since the last flush */
    size_t n_rows, rows_cap;
    fp8t_stats_raw *d_raws; /* [d_raws_cap] on the device, one per queued site */
    size_t d_raws_cap;
    fp8t_stats_raw *h_raws; /* host copies at the flush */
    size_t h_raws_cap;
    /* flushed rows whose stats.jsonl line is still to be written: formatting ~40 numbers
     * per row exactly is most of the host's time per row, so the lines are written a few at
     * a time by the next step's hook calls (while the device works on that step) and the rest
     * at the next end of step (or destroy) */
    struct ready_row *ready;
    size_t ready_n, ready_head, ready_cap;
    float last_scale; /* the scale of the last row written */
    fp8t_block_raw *d_blocks;
    size_t d_blocks_cap;
    fp8t_block_raw *blocks; /* host copy of the block list */
    size_t blocks_cap;
    dump_writer *writer;       /* dumps: pinned buffers + a background thread */
    size_t dump_budget;        /* pinned bytes in flight (--inspect-dump-mb) */
    size_t pending_dump_bytes; /* held by the dumps of queued rows */
    int writer_failed;         /* could not start it: dumps are written synchronously */
    /* host copy of a dumped tensor (synchronous dumps) */
    float *x; /* [rows, cols] */
    size_t x_cap;
    uint8_t *codes; /* [rows, cols] */
    size_t codes_cap;
    fp8t_inspect_sink sink; /* optional second destination (TensorBoard) */
    void *sink_ctx;
    int no_reuse; /* fp8t_inspector_set_reuse(in, 0): compute every site */
    /* the Fprop X rows of this step already flushed: the source of a Wgrad X site a read-only
     * hook shows without the tensor (x NULL, fp8t_model_set_observer) */
    struct pending_row *xarch;
    fp8t_stats_raw *xarch_raw;
    size_t xarch_n, xarch_cap, xarch_raw_cap;
    int warned_gone; /* a Wgrad X without tensor or source row was reported */
};

static void flush_rows(fp8t_inspector *in);
static void write_ready(fp8t_inspector *in, size_t max_rows);

/* ---- spec parsing ----
 * Messages name the key, not the option: the caller says which option the spec came from
 * (train's --inspect, inspect's --spec). */

static int parse_int(int *out, const char *v, int lo, const char *key, char *err, size_t errlen) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > 1000000000L) {
        return fp8t_errorf(err, errlen, "%s=%s: expected an integer >= %d", key, v, lo);
    }
    *out = (int)x;
    return 0;
}

/* *out = 0 for v == no, 1 for v == yes; else an error naming key and what it expects */
static int parse_choice(int *out, const char *v, const char *no, const char *yes, const char *key,
                        const char *expect, char *err, size_t errlen) {
    if (strcmp(v, no) == 0 || strcmp(v, yes) == 0) {
        *out = strcmp(v, yes) == 0;
        return 0;
    }
    return fp8t_errorf(err, errlen, "%s=%s: expected %s", key, v, expect);
}

static int parse_layers(inspect_spec *sp, const char *v, char *err, size_t errlen) {
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", v);
    for (char *save = NULL, *tok = strtok_r(buf, "+", &save); tok;
         tok = strtok_r(NULL, "+", &save)) {
        if (strcmp(tok, "all") == 0) {
            sp->n_ranges = 0;
            sp->head = 0;
            return 0;
        }
        if (strcmp(tok, "head") == 0) {
            sp->head = 1;
            continue;
        }
        char *end;
        long a = strtol(tok, &end, 10), b = a;
        if (end != tok && *end == '-') {
            char *e2;
            b = strtol(end + 1, &e2, 10);
            if (e2 == end + 1 || *e2)
                end = tok; /* malformed */
            else
                end = e2;
        }
        if (end == tok || *end || a < 0 || b < a || b > 1000000) {
            return fp8t_errorf(err, errlen,
                               "layers=%s: expected layers like 3, 0-3, 0+2+5-7, head or all", v);
        }
        if (sp->n_ranges == MAX_LAYER_RANGES) {
            return fp8t_errorf(err, errlen, "layers=%s: at most %d ranges", v, MAX_LAYER_RANGES);
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
        return 1u << FP8T_MOD_FC1 | 1u << FP8T_MOD_FC2 | 1u << FP8T_MOD_GATE | 1u << FP8T_MOD_UP |
               1u << FP8T_MOD_DOWN;
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
            return fp8t_errorf(err, errlen, "%s=%s: unknown %s '%s' (expected %s, joined by '+')",
                               key, v, what, tok, expected);
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
        return fp8t_errorf(err, errlen, "spec too long (%zu characters)", strlen(spec));
    }
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv;
         kv = strtok_r(NULL, ",", &save)) {
        while (*kv == ' ') kv++;
        if (!*kv) continue;
        char *eq = strchr(kv, '=');
        if (!eq || eq == kv || !eq[1]) {
            return fp8t_errorf(err, errlen,
                               "'%s' is not key=value (e.g. \"every=10,layers=0-3,"
                               "tensors=input+grad_output,dump=1\")",
                               kv);
        }
        *eq = 0;
        const char *k = kv, *v = eq + 1;
        int rc;
        if (strcmp(k, "every") == 0)
            rc = parse_int(&sp->every, v, 1, k, err, errlen);
        else if (strcmp(k, "start") == 0)
            rc = parse_int(&sp->start, v, 0, k, err, errlen);
        else if (strcmp(k, "end") == 0)
            rc = parse_int(&sp->end, v, 0, k, err, errlen);
        else if (strcmp(k, "layers") == 0)
            rc = parse_layers(sp, v, err, errlen);
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
                            "results or all",
                            err, errlen);
        else if (strcmp(k, "block") == 0)
            rc = parse_int(&sp->block, v, 1, k, err, errlen);
        else if (strcmp(k, "block_list") == 0)
            rc = parse_int(&sp->block_list, v, 0, k, err, errlen);
        else if (strcmp(k, "dump") == 0)
            rc = parse_int(&sp->dump, v, 0, k, err, errlen);
        else if (strcmp(k, "whatif") == 0)
            rc = parse_choice(&sp->whatif_mx, v, "default", "all", k,
                              "default (current scaling and 1x128 blocks, E4M3 and E5M2) or "
                              "all (and MXFP8)",
                              err, errlen);
        else if (strcmp(k, "micro") == 0)
            rc = parse_choice(&sp->all_micro, v, "first", "all", k, "first or all", err, errlen);
        else {
            fp8t_errorf(err, errlen,
                        "unknown key '%s' (keys: every, start, end, layers, modules, "
                        "gemms, tensors, block, block_list, dump, micro, whatif)",
                        k);
            rc = -1;
        }
        if (rc) return -1;
    }
    if (sp->end >= 0 && sp->end < sp->start) {
        return fp8t_errorf(err, errlen, "end=%d is before start=%d", sp->end, sp->start);
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
    if (!in) {
        fp8t_errorf(err, errlen, "out of memory");
        return NULL;
    }
    in->step = -1;
    in->upd_step = -1;
    in->dump_budget = DUMP_INFLIGHT_BYTES;
    if (parse_spec(&in->sel, spec, err, errlen)) goto fail;
    if (!out_dir || !*out_dir || strlen(out_dir) > 900) {
        fp8t_errorf(err, errlen, "needs an output directory (--out DIR)");
        goto fail;
    }
    snprintf(in->out_dir, sizeof(in->out_dir), "%s", out_dir);
    if (fp8t_mkdirs(in->out_dir, err, errlen)) goto fail;
    char path[1100];
    snprintf(path, sizeof(path), "%s/stats.jsonl", in->out_dir);
    /* Appending: a resumed run continues the file of the run it resumes. */
    in->stats = fopen(path, "a");
    if (!in->stats) {
        fp8t_errorf(err, errlen, "cannot open %s for writing: %s", path, strerror(errno));
        goto fail;
    }
    return in;
fail:
    fp8t_inspector_destroy(in);
    return NULL;
}

void fp8t_inspector_destroy(fp8t_inspector *in) {
    if (!in) return;
    if (in->be) flush_rows(in); /* a step that was never ended */
    write_ready(in, (size_t)-1);
    if (in->writer) {
        in->be->ops->synchronize(in->be); /* the last copies land before the thread writes */
        dump_writer_destroy(in->writer);
    }
    if (in->stats) fclose(in->stats);
    if (in->be) {
        if (in->d_raws) in->be->ops->free(in->be, in->d_raws);
        if (in->d_blocks) in->be->ops->free(in->be, in->d_blocks);
    }
    free(in->rows);
    free(in->ready);
    free(in->xarch);
    free(in->xarch_raw);
    free(in->h_raws);
    free(in->seen);
    free(in->state);
    free(in->upd_amax);
    free(in->x);
    free(in->codes);
    free(in->blocks);
    free(in);
}

static int step_selected(const fp8t_inspector *in, int step) {
    return step >= in->sel.start && (in->sel.end < 0 || step <= in->sel.end) &&
           (step - in->sel.start) % in->sel.every == 0;
}

void fp8t_inspector_begin_step(fp8t_inspector *in, int step) {
    if (!in) return;
    in->step = step;
    in->active = step_selected(in, step);
    if (in->seen) memset(in->seen, 0, in->seen_n * sizeof(int));
    in->xarch_n = 0;
}

void fp8t_inspector_set_reuse(fp8t_inspector *in, int on) {
    if (in) in->no_reuse = !on;
}

void fp8t_inspector_set_dump_budget(fp8t_inspector *in, size_t bytes) {
    if (in && bytes > 0 && !in->writer) in->dump_budget = bytes;
}

int fp8t_inspector_active(const fp8t_inspector *in) { return in && in->active; }

int fp8t_inspector_reads_only(const fp8t_inspector *in) {
    return in && !in->sel.dump && !in->sel.block_list;
}

static void check_written(fp8t_inspector *in) {
    /* a full disk shows at the flush (or as the stream's error flag from an earlier fputs) */
    if ((fflush(in->stats) != 0 || ferror(in->stats)) && !in->write_err[0])
        snprintf(in->write_err, sizeof(in->write_err), "cannot write %s/stats.jsonl: %s",
                 in->out_dir, strerror(errno ? errno : EIO));
}

void fp8t_inspector_end_step(fp8t_inspector *in, int step) {
    if (!in) return;
    /* the lines of earlier steps the hook calls did not write yet, then this step's rows */
    const int wrote = in->ready_head < in->ready_n;
    write_ready(in, (size_t)-1);
    if (in->be) flush_rows(in);
    if (!step_selected(in, step + 1)) write_ready(in, (size_t)-1);
    if (in->active || wrote) check_written(in);
    in->active = 0;
}

void fp8t_inspector_flush(fp8t_inspector *in) {
    if (!in) return;
    write_ready(in, (size_t)-1);
    check_written(in);
}

void fp8t_inspector_set_sink(fp8t_inspector *in, fp8t_inspect_sink fn, void *ctx) {
    if (!in) return;
    in->sink = fn;
    in->sink_ctx = ctx;
}

/* "layer.module.gemm.tensor" ("head" for the LM head's layer); tag: the sink's form, the layer
 * as "layer03" so that a dashboard sorting tags by name lists it before layer10; else the
 * dumps' form, the layer number alone */
static void site_label(char *buf, size_t len, const fp8t_tensor_site *s, int tag) {
    char layer[16];
    if (s->layer < 0)
        snprintf(layer, sizeof(layer), "head");
    else
        snprintf(layer, sizeof(layer), tag ? "layer%02d" : "%d", s->layer);
    snprintf(buf, len, "%s.%s.%s.%s", layer, fp8t_module_name(s->module), fp8t_gemm_name(s->gemm),
             fp8t_tensor_kind_name(s->kind));
}

static void sink_stats(fp8t_inspector *in, int step, const fp8t_tensor_site *site,
                       const fp8t_stats *st, int is_operand, float scale) {
    char name[96];
    site_label(name, sizeof(name), site, 1);
    const struct {
        const char *stat;
        double v;
        int operand_only;
    } rows[] = {
        {"underflow_pct", st->underflow_pct, 1},
        {"saturation_pct", st->saturation_pct, 1},
        {"sqnr_db", st->sqnr_db, 1},
        {"scale", scale, 1},
        {"amax", st->amax, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        /* float: the sink's consumer (TensorBoard) keeps float32; an exact image's SQNR
         * (1e300) has no float value and is left out like a non-finite one */
        if ((is_operand || !rows[i].operand_only) && isfinite((float)rows[i].v))
            in->sink(in->sink_ctx, step, name, rows[i].stat, rows[i].v);
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
    size_t need =
        (size_t)fp8t_model_num_linears(fp8t_model_get_config(m)) * FP8T_GEMM_COUNT * FP8T_T_COUNT;
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
    if (!isfinite(v)) {
        lb_put(b, "null", 4);
        return;
    }
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

static void add_array(line_buf *b, const char *k, const fp8t_block_raw *blocks, size_t nb,
                      size_t field_offset) {
    lb_key(b, k);
    lb_put(b, "[", 1);
    for (size_t i = 0; i < nb; i++) {
        if (i) lb_put(b, ",", 1);
        lb_number(b, *(const double *)((const char *)&blocks[i] + field_offset));
    }
    lb_put(b, "]", 1);
}

/* Per-block statistics of the per-tensor quantization, as the op summarized them (and the
 * per-block arrays, copied from the device, if asked). */
static void add_block_stats(fp8t_inspector *in, line_buf *o, const fp8t_stats_raw *raw) {
    const size_t nb = (size_t)raw->n_blocks;
    if (nb == 0) return;
    const double amin = raw->block_amax_min_nonzero;
    add_num(o, "block", (double)raw->block);
    add_num(o, "n_blocks", (double)nb);
    add_num(o, "block_sqnr_min_db", raw->block_sqnr_min_db);
    add_num(o, "block_sqnr_min_index", (double)raw->block_sqnr_min_index);
    add_num(o, "block_amax_max", raw->block_amax_max);
    add_num(o, "block_amax_min_nonzero", isfinite(amin) ? amin : 0.0);
    /* NaN (JSON null) when no block has a nonzero amax */
    add_num(o, "block_amax_ratio", isfinite(amin) ? raw->block_amax_max / amin : NAN);
    add_num(o, "blocks_with_underflow_pct",
            100.0 * (double)raw->blocks_with_underflow / (double)nb);
    add_num(o, "block_underflow_max_pct", raw->block_underflow_max_pct);
    if (in->sel.block_list && in->d_blocks &&
        !grow_buf((void **)&in->blocks, &in->blocks_cap, nb, sizeof(fp8t_block_raw))) {
        in->be->ops->to_host(in->be, in->blocks, in->d_blocks, nb * sizeof(fp8t_block_raw));
        add_array(o, "block_amax", in->blocks, nb, offsetof(fp8t_block_raw, amax));
        add_array(o, "block_sqnr_db", in->blocks, nb, offsetof(fp8t_block_raw, sqnr_db));
        add_array(o, "block_underflow_pct", in->blocks, nb,
                  offsetof(fp8t_block_raw, underflow_pct));
    }
}

/* The what-if images every operand gets after the one its GEMM uses (image 0): per-tensor
 * current scaling and 1x128 blocks (along the stored rows) in both formats, and with whatif=all
 * MXFP8 (last, so that the others keep their image index). Each image is about a sixth of an
 * operand's statistics on a GPU (their arithmetic bounds them), and Hopper has no MXFP8 GEMM:
 * that one is asked for. */
#define N_WHATIF 5
static const char *const whatif_names[N_WHATIF] = {"current_e4m3", "current_e5m2",
                                                   "block128_e4m3", "block128_e5m2", "mxfp8"};

/* The images of one operand (stats.h): image 0 as its GEMM quantizes it, then the what-ifs.
 * Returns the index of the image whose per-tensor scale is reported as "scale" (and used by
 * block=N): 0, or for block / MX GEMMs the current-scaling what-if of the same format. */
static int operand_images(fp8t_stats_req *req, fp8t_model *m, const fp8t_tensor_site *s,
                          int whatif_mx, const char **scale_source) {
    const fp8t_policy *pol = fp8t_model_get_policy(m);
    const float eps = pol ? pol->epsilon : 0.0f;
    const int pow2 = pol ? pol->pow2_scales : 0;
    fp8t_image_spec *im = req->img;
    const fp8t_precision p = s->precision;
    int scale_img = 0;
    memset(req, 0, sizeof *req);
    if (p == FP8T_PREC_BLOCK || p == FP8T_PREC_ROWWISE) {
        /* the model's tiles along the reduction dimension K, which runs along the stored rows
         * of the Wgrad's operands and of the Dgrad's W: block: weights 128x128, activations
         * and gradients 1x128 (128x1 for the Wgrad: along the tokens); rowwise: one tile per
         * K-major row, all of K (1 x cols, or rows x 1) */
        const int k_rows = s->gemm == FP8T_GEMM_WGRAD ||
                           (s->kind == FP8T_T_WEIGHT && s->gemm == FP8T_GEMM_DGRAD);
        int tr, tc;
        if (p == FP8T_PREC_ROWWISE) {
            tr = k_rows ? s->rows : 1;
            tc = k_rows ? 1 : s->cols;
        } else if (s->kind == FP8T_T_WEIGHT) {
            tr = tc = BLOCK_TILE;
        } else {
            tr = k_rows ? BLOCK_TILE : 1;
            tc = k_rows ? 1 : BLOCK_TILE;
        }
        im[0] = (fp8t_image_spec){
            .kind = FP8T_IMG_TILES, .fmt = s->fmt, .tile_r = tr, .tile_c = tc, .pow2 = pow2};
        req->tile_stats = 1;
        *scale_source = p == FP8T_PREC_BLOCK ? "block" : "rowwise";
    } else if (p == FP8T_PREC_MXFP8) {
        im[0] = (fp8t_image_spec){.kind = FP8T_IMG_MX, .fmt = FP8_E4M3};
        *scale_source = "mxfp8";
    } else if (p == FP8T_PREC_CURRENT || p == FP8T_PREC_FAKE || s->fp8_index < 0 ||
               s->fp8_index >= fp8t_model_fp8_count(m)) {
        im[0] = (fp8t_image_spec){
            .kind = FP8T_IMG_CURRENT, .fmt = s->fmt, .epsilon = eps, .pow2 = pow2};
        *scale_source = "current";
    } else {
        /* delayed (and bf16/fp32, where it is the scale FP8 would use): the recipe state's
         * scale on the device, read by the op as the GEMM reads it */
        fp8t_recipe_state rs;
        fp8t_recipe_state_view(&rs, fp8t_model_fp8_state(m), fp8t_model_fp8_count(m),
                               fp8t_model_fp8_history_len(m));
        im[0] = (fp8t_image_spec){
            .kind = FP8T_IMG_SCALE, .fmt = s->fmt, .scale = rs.scale + s->fp8_index};
        *scale_source = "delayed";
    }
    im[1] = (fp8t_image_spec){
        .kind = FP8T_IMG_CURRENT, .fmt = FP8_E4M3, .epsilon = eps, .pow2 = pow2};
    im[2] = (fp8t_image_spec){
        .kind = FP8T_IMG_CURRENT, .fmt = FP8_E5M2, .epsilon = eps, .pow2 = pow2};
    im[3] = (fp8t_image_spec){
        .kind = FP8T_IMG_TILES, .fmt = FP8_E4M3, .tile_r = 1, .tile_c = BLOCK_TILE};
    im[4] = (fp8t_image_spec){
        .kind = FP8T_IMG_TILES, .fmt = FP8_E5M2, .tile_r = 1, .tile_c = BLOCK_TILE};
    if (whatif_mx) im[5] = (fp8t_image_spec){.kind = FP8T_IMG_MX, .fmt = FP8_E4M3};
    req->n_images = 1 + N_WHATIF - !whatif_mx;
    if (p == FP8T_PREC_BLOCK || p == FP8T_PREC_ROWWISE || p == FP8T_PREC_MXFP8)
        scale_img = s->fmt == FP8_E5M2 ? 2 : 1;
    return scale_img;
}

void fp8t_inspector_before_scale_update(fp8t_inspector *in, fp8t_model *m, int step) {
    if (!in || !m || !step_selected(in, step + 1)) return;
    in->upd_step = -1;
    const int n = fp8t_model_fp8_count(m), len = fp8t_model_fp8_history_len(m);
    float *dstate = fp8t_model_fp8_state(m);
    if (n <= 0 || len <= 0 || !dstate) return;
    const size_t floats = fp8t_recipe_state_floats(n, len);
    if (grow_buf((void **)&in->state, &in->state_cap, floats, sizeof(float)) ||
        grow_buf((void **)&in->upd_amax, &in->upd_cap, (size_t)n, sizeof(float)))
        return;
    fp8t_backend *be = fp8t_model_backend(m);
    be->ops->to_host(be, in->state, dstate, floats * sizeof(float));
    fp8t_recipe_state rs;
    fp8t_recipe_state_view(&rs, in->state, n, len);
    const fp8t_policy *pol = fp8t_model_get_policy(m);
    /* what fp8t_delayed_update takes: the max over the whole history (this step's slot 0
     * included, before the roll drops the oldest), or slot 0 alone */
    const int recent = pol && pol->algo == FP8T_AMAX_MOST_RECENT;
    for (int t = 0; t < n; t++)
        in->upd_amax[t] = recent ? rs.history[t] : fp8t_recipe_history_max(&rs, t);
    in->upd_n = n;
    in->upd_step = step + 1;
}

/* One inspected site whose statistics are queued on the device, turned into a stats.jsonl
 * line at the next flush (end of step): the step does not wait for each site's result. */
typedef struct pending_row {
    fp8t_tensor_site site;
    int step, micro, is_operand, scale_img;
    const char *scale_source;
    double hist_max;
    float *dump_buf; /* its dump's pinned buffer (copy queued), or NULL */
    /* what the raw statistics are a function of, to find a site that repeats an earlier one */
    const float *x;
    fp8t_stats_req req;
    long same_as; /* index of the queued row whose raw statistics this row takes, or -1 */
    long arch;    /* or the index of the flushed Fprop X row (in->xarch) it takes, or -1 */
    int hidden;   /* computed only as the source of a Wgrad X shown without its tensor */
} pending_row;

/* a flushed row waiting for its stats.jsonl line (write_ready) */
typedef struct ready_row {
    pending_row pr;
    fp8t_stats_raw raw;
} ready_row;

/* The per-tensor scale reported for a site (NaN for results). */
static float row_scale(const pending_row *pr, const fp8t_stats_raw *raw) {
    return pr->is_operand ? (float)raw->img[pr->scale_img].scale : NAN;
}

/* The stats.jsonl line of one site from its raw statistics. */
static void write_line(fp8t_inspector *in, const pending_row *pr, const fp8t_stats_raw *rawp) {
    const fp8t_tensor_site *site = &pr->site;
    const fp8t_stats_raw raw = *rawp;
    const int is_operand = pr->is_operand, micro = pr->micro;
    const char *scale_source = pr->scale_source;
    const double hist_max = pr->hist_max;
    fp8t_stats st;
    fp8t_stats_from_raw(&st, &raw, is_operand ? 0 : -1);
    const float scale = row_scale(pr, &raw), scale_inv = is_operand ? 1.0f / scale : NAN;

    line_buf lb = {0}, *o = &lb;
    lb_put(o, "{", 1);
    add_num(o, "step", pr->step);
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
    add_num(o, "n_zero", (double)st.n_zero);
    if (scale_source) add_str(o, "scale_source", scale_source);
    if (is_operand) {
        /* the what-if recipes, next to the one in use */
        lb_key(o, "whatif");
        lb_put(o, "{", 1);
        for (int k = 0; k < N_WHATIF && 1 + k < raw.n_images; k++) {
            double up, sp, sq;
            fp8t_image_summary(&raw, 1 + k, &up, &sp, &sq);
            if (k) lb_put(o, ",", 1);
            lb_put(o, "\"", 1);
            lb_put(o, whatif_names[k], strlen(whatif_names[k]));
            lb_put(o, "\":{\"underflow_pct\":", 19);
            lb_number(o, up);
            lb_put(o, ",\"saturation_pct\":", 18);
            lb_number(o, sp);
            lb_put(o, ",\"sqnr_db\":", 11);
            lb_number(o, sq);
            lb_put(o, "}", 1);
        }
        lb_put(o, "}", 1);
    }
    if (is_operand && raw.n_tiles > 0) {
        /* block / rowwise: the GEMM's own tiles, each on its own */
        add_num(o, "tile_r", pr->req.img[0].tile_r);
        add_num(o, "tile_c", pr->req.img[0].tile_c);
        add_num(o, "n_tiles", (double)raw.n_tiles);
        add_num(o, "tile_sqnr_min_db", raw.tile_sqnr_min_db);
        add_num(o, "tile_sqnr_min_index", (double)raw.tile_sqnr_min_index);
        add_num(o, "tile_underflow_max_pct", raw.tile_underflow_max_pct);
        add_num(o, "tile_underflow_max_index", (double)raw.tile_underflow_max_index);
        add_num(o, "tiles_with_underflow_pct",
                100.0 * (double)raw.tiles_with_underflow / (double)raw.n_tiles);
    }
    if (is_operand && in->sel.block > 0) add_block_stats(in, o, &raw);
    lb_put(o, "}\n", 2);
    if (lb.s) fputs(lb.s, in->stats);
    free(lb.s);
}

/* The lines of up to max_rows flushed rows, oldest first. */
static void write_ready(fp8t_inspector *in, size_t max_rows) {
    for (; max_rows > 0 && in->ready_head < in->ready_n; max_rows--, in->ready_head++)
        write_line(in, &in->ready[in->ready_head].pr, &in->ready[in->ready_head].raw);
    if (in->ready_head == in->ready_n) in->ready_head = in->ready_n = 0;
}

static void dump_job_of(dump_job *job, const fp8t_inspector *in, const pending_row *pr,
                        float scale) {
    memset(job, 0, sizeof *job);
    snprintf(job->dir, sizeof(job->dir), "%s/dumps/step_%06d", in->out_dir, pr->step);
    site_label(job->name, sizeof(job->name), &pr->site, 0);
    job->rows = pr->site.rows, job->cols = pr->site.cols;
    job->operand = pr->is_operand;
    job->scale = scale, job->scale_inv = 1.0f / scale;
    job->fmt = pr->site.fmt;
}

/* Finish every queued site: one copy of their raw statistics to the host (which waits for the
 * device, so the dumps' copies have landed too), the sink's values, the dumps to the writer
 * thread with their scales, and the rows to the queue of lines to write (written here when a
 * per-block list is asked for: its one device buffer is the next site's). */
static void flush_rows(fp8t_inspector *in) {
    if (in->n_rows == 0) return;
    fp8t_backend *be = in->be;
    if (grow_buf((void **)&in->h_raws, &in->h_raws_cap, in->n_rows, sizeof(fp8t_stats_raw))) {
        fp8t_warnf("inspect: out of memory: %zu rows of step %d lost", in->n_rows, in->step);
        be->ops->synchronize(be);
        in->n_rows = 0;
        return;
    }
    be->ops->to_host(be, in->h_raws, in->d_raws, in->n_rows * sizeof(fp8t_stats_raw));
    for (size_t k = 0; k < in->n_rows; k++) {
        const pending_row *pr = &in->rows[k];
        const fp8t_stats_raw *raw = pr->arch >= 0
                                        ? &in->xarch_raw[pr->arch]
                                        : &in->h_raws[pr->same_as >= 0 ? (size_t)pr->same_as : k];
        /* an Fprop X, kept for a Wgrad X site a read-only hook may show without the tensor */
        if (pr->site.gemm == FP8T_GEMM_FPROP && pr->site.kind == FP8T_T_INPUT && pr->is_operand &&
            !grow_buf((void **)&in->xarch, &in->xarch_cap, in->xarch_n + 1,
                      sizeof(pending_row)) &&
            !grow_buf((void **)&in->xarch_raw, &in->xarch_raw_cap, in->xarch_n + 1,
                      sizeof(fp8t_stats_raw))) {
            in->xarch[in->xarch_n] = *pr;
            in->xarch_raw[in->xarch_n++] = *raw;
        }
        if (pr->hidden) continue;
        const float scale = row_scale(pr, raw);
        in->last_scale = scale;
        if (in->sink && pr->micro == 0) {
            fp8t_stats st;
            fp8t_stats_from_raw(&st, raw, pr->is_operand ? 0 : -1);
            sink_stats(in, pr->step, &pr->site, &st, pr->is_operand, scale);
        }
        if (in->sel.block_list) {
            write_ready(in, (size_t)-1);
            write_line(in, pr, raw);
        } else if (!grow_buf((void **)&in->ready, &in->ready_cap, in->ready_n + 1,
                             sizeof(ready_row))) {
            in->ready[in->ready_n].pr = *pr;
            in->ready[in->ready_n++].raw = *raw;
        } else {
            write_ready(in, (size_t)-1); /* out of memory: write it now */
            write_line(in, pr, raw);
        }
        if (pr->dump_buf) {
            /* strided rows packed in place (each row moves down, never past a later one) */
            const fp8t_tensor_site *st = &pr->site;
            if (st->ld > st->cols)
                for (int r = 1; r < st->rows; r++)
                    memmove(pr->dump_buf + (size_t)r * st->cols,
                            pr->dump_buf + (size_t)r * st->ld, (size_t)st->cols * sizeof(float));
            dump_job job;
            dump_job_of(&job, in, pr, scale);
            dump_writer_queue(in->writer, &job, pr->dump_buf);
        }
    }
    dump_writer_release(in->writer);
    in->n_rows = 0;
    in->pending_dump_bytes = 0;
}

static int image_spec_equal(const fp8t_image_spec *a, const fp8t_image_spec *b) {
    return a->kind == b->kind && a->fmt == b->fmt && a->tile_r == b->tile_r &&
           a->tile_c == b->tile_c && a->scale == b->scale && a->epsilon == b->epsilon &&
           a->pow2 == b->pow2;
}

static int stats_req_equal(const fp8t_stats_req *a, const fp8t_stats_req *b) {
    if (a->n_images != b->n_images || a->block != b->block || a->block_img != b->block_img ||
        a->block_list || b->block_list || a->tile_stats != b->tile_stats || a->ld != b->ld)
        return 0;
    for (int k = 0; k < a->n_images && k < FP8T_STATS_MAX_IMAGES; k++)
        if (!image_spec_equal(&a->img[k], &b->img[k])) return 0;
    return 1;
}

/* The queued row whose statistics this site's would repeat, or -1. An operand is seen by two
 * GEMMs of its linear: the Wgrad's dY is the Dgrad's dY (the same buffer, nothing writes it
 * in between), the Wgrad's X is the Fprop's X (the tensor the forward kept, or rebuilt
 * bit-exactly), the Dgrad's W is the Fprop's W (weights change only after the step). The
 * statistics are a function of the elements and the request (images, scales: a delayed
 * scale is a pointer into the recipe state, which changes only at the step's end), so when
 * both agree the earlier row's raw record is this row's, and the tensor is not read again.
 * Only while nothing may write the tensor between the two sites (fp8t_inspector_set_reuse:
 * the trainer turns this off when a fault injector shares the hook). */
static int same_tensor(const pending_row *q, const pending_row *pr) {
    /* x NULL: a Wgrad X shown without the tensor, which is its linear's Fprop X */
    const int same_x =
        pr->x ? q->x == pr->x : q->site.gemm == FP8T_GEMM_FPROP && q->site.kind == FP8T_T_INPUT;
    return same_x && q->is_operand && q->micro == pr->micro && q->site.lin == pr->site.lin &&
           q->site.kind == pr->site.kind && q->site.rows == pr->site.rows &&
           q->site.cols == pr->site.cols && stats_req_equal(&q->req, &pr->req);
}

static long find_same(const fp8t_inspector *in, const pending_row *pr) {
    if ((in->no_reuse && pr->x) || !pr->is_operand) return -1;
    for (size_t k = in->n_rows; k-- > 0;) {
        const pending_row *q = &in->rows[k];
        if (q->same_as < 0 && q->arch < 0 && same_tensor(q, pr)) return (long)k;
    }
    return -1;
}

/* A Wgrad X shown without its tensor whose Fprop X row was flushed already: that row. */
static long find_archived(const fp8t_inspector *in, const pending_row *pr) {
    for (size_t k = in->xarch_n; k-- > 0;)
        if (same_tensor(&in->xarch[k], pr)) return (long)k;
    return -1;
}

void fp8t_inspector_observe(fp8t_inspector *in, fp8t_model *m, const fp8t_tensor_site *site,
                            float *x) {
    if (!in || !in->active || !site) return;
    /* x NULL: a read-only hook's Wgrad X whose forward kept only FP8 codes (model.h) */
    if (!x && !(site->gemm == FP8T_GEMM_WGRAD && site->kind == FP8T_T_INPUT)) return;
    if (!layer_selected(in, site->layer) || !(in->sel.module_mask >> site->module & 1u)) return;
    int hidden = 0;
    if (!(in->sel.gemm_mask >> site->gemm & 1u) || !(in->sel.tensor_mask >> site->kind & 1u)) {
        /* an Fprop X not selected, when its Wgrad X is: computed for that row, not written */
        if (!(x && site->gemm == FP8T_GEMM_FPROP && site->kind == FP8T_T_INPUT &&
              (in->sel.gemm_mask >> FP8T_GEMM_WGRAD & 1u) &&
              (in->sel.tensor_mask >> FP8T_T_INPUT & 1u)))
            return;
        hidden = 1;
    }
    int micro = next_micro(in, m, site);
    if (micro > 0 && !in->sel.all_micro) return;
    if (site->rows <= 0 || site->cols <= 0) return;
    size_t n = (size_t)site->rows * (size_t)site->cols;
    /* rows of stride ld (a read-only hook's head logits): the floats the copy of a dump spans */
    const int ld = site->ld > site->cols ? site->ld : site->cols;
    const size_t span = (size_t)(site->rows - 1) * (size_t)ld + (size_t)site->cols;
    fp8t_backend *be = fp8t_model_backend(m);
    if (!in->be) in->be = be;
    int dump = in->sel.dump && micro == 0 && !hidden && x;
    if (dump && !in->writer && !in->writer_failed) {
        in->writer = dump_writer_create(be, in->dump_budget);
        in->writer_failed = !in->writer;
    }
    /* The dumps of queued rows hold pinned buffers the writer cannot have before the flush:
     * past half the budget, flush now, so that the writer can free buffers and a request for
     * one never waits on buffers only this thread could hand over. */
    if (dump && in->writer && in->pending_dump_bytes + span * sizeof(float) > in->dump_budget / 2)
        flush_rows(in);
    /* a slot for this site's result on the device, and its bookkeeping on the host */
    if (in->n_rows == in->d_raws_cap) {
        size_t cap = in->d_raws_cap ? 2 * in->d_raws_cap : 64;
        fp8t_stats_raw *d = be->ops->malloc(be, cap * sizeof(fp8t_stats_raw));
        if (in->d_raws) {
            be->ops->copy(be, d, in->d_raws, in->n_rows * sizeof(fp8t_stats_raw));
            be->ops->free(be, in->d_raws);
        }
        in->d_raws = d;
        in->d_raws_cap = cap;
    }
    if (grow_buf((void **)&in->rows, &in->rows_cap, in->n_rows + 1, sizeof(pending_row))) {
        fp8t_warnf("inspect: out of memory");
        return;
    }
    pending_row *pr = &in->rows[in->n_rows];
    memset(pr, 0, sizeof *pr);
    pr->site = *site;
    pr->step = in->step;
    pr->micro = micro;
    pr->is_operand = site->fp8_index >= 0;
    pr->scale_img = -1;
    pr->hist_max = NAN;
    pr->x = x;
    pr->same_as = -1;
    pr->arch = -1;
    pr->hidden = hidden;

    /* the statistics on the device; only the fp8t_stats_raw comes back */
    fp8t_stats_req req;
    memset(&req, 0, sizeof req);
    if (pr->is_operand) {
        pr->scale_img = operand_images(&req, m, site, in->sel.whatif_mx, &pr->scale_source);
        if (in->upd_step == in->step && site->fp8_index < in->upd_n &&
            strcmp(pr->scale_source, "delayed") == 0)
            pr->hist_max = in->upd_amax[site->fp8_index];
        if (in->sel.block > 0) {
            req.block = in->sel.block;
            req.block_img = pr->scale_img;
            const size_t nb = (n + (size_t)in->sel.block - 1) / (size_t)in->sel.block;
            if (in->sel.block_list && nb > in->d_blocks_cap) {
                if (in->d_blocks) be->ops->free(be, in->d_blocks);
                in->d_blocks = be->ops->malloc(be, nb * sizeof(fp8t_block_raw));
                in->d_blocks_cap = nb;
            }
            req.block_list = in->sel.block_list ? in->d_blocks : NULL;
        }
    }
    req.ld = ld;
    pr->req = req;
    pr->same_as = find_same(in, pr);
    if (pr->same_as < 0 && !x) pr->arch = find_archived(in, pr);
    if (!x && pr->same_as < 0 && pr->arch < 0) {
        if (!in->warned_gone)
            fp8t_warnf("inspect: the Wgrad X of layer %d %s has no tensor and no "
                       "Fprop X row of the same request: its row is left out",
                       site->layer, fp8t_module_name(site->module));
        in->warned_gone = 1;
        return;
    }
    if (pr->same_as < 0 && pr->arch < 0)
        be->ops->tensor_stats(be, in->d_raws + in->n_rows, x, site->rows, site->cols, &req);

    if (dump && in->writer) {
        /* copied now (later kernels may overwrite x), written after the flush */
        pr->dump_buf = dump_writer_buffer(in->writer, span * sizeof(float));
        if (pr->dump_buf) {
            be->ops->to_host_async(be, pr->dump_buf, x, span * sizeof(float));
            in->pending_dump_bytes += span * sizeof(float);
        } else {
            fp8t_warnf("inspect: out of memory: dump of a %dx%d tensor lost", site->rows,
                       site->cols);
        }
    }
    in->n_rows++;
    /* two lines of earlier rows per site: the host formats them while the device works */
    write_ready(in, 2);
    /* the per-block list has one device buffer: write its row now */
    if (in->sel.block_list && pr->is_operand && !hidden) flush_rows(in);
    if (dump && !in->writer) {
        /* no writer thread: this site's line first (its scale), then the files, here */
        dump_job job;
        const pending_row keep = *pr;
        flush_rows(in); /* no-op if the block-list flush above wrote it already */
        dump_job_of(&job, in, &keep, in->last_scale);
        if (grow_buf((void **)&in->x, &in->x_cap, n, sizeof(float))) {
            fp8t_warnf("inspect: out of memory for a %dx%d dump", site->rows, site->cols);
            return;
        }
        be->ops->to_host(be, in->x, x, n * sizeof(float));
        dump_write_files(&job, in->x, &in->codes, &in->codes_cap);
    }
}
