/* The options of `fp8train train`: one table drives the command line, --config JSON files,
 * config.json and the help text, so the three can never disagree. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/checkpoint.h"
#include "fp8train/export.h" /* fp8t_weights_read_config (--init) */
#include "fp8train/error.h"
#include "fp8train/inject.h"
#include "fp8train/io.h"
#include "fp8train/policy_json.h"
#include "fp8train/tokenizer.h"
#include "fp8train/train_options.h"
#include "util/fs.h"
#include "util/opt_table.h"

/* the table's own bits of fp8t_opt.user */
#define IN_OBJECT 1u /* written inside "model" / "policy" in config.json, not as a key */
#define IS_MODEL 2u  /* sets the model config (decides --resume's model adoption) */

#define FIELD(f) FP8T_OPT_FIELD(fp8t_train_config, f)

/* ---------------------------------------------------------------- special options */

static int fail(char *err, size_t errlen, const char *name, const char *v, const char *expect) {
    return fp8t_errorf(err, errlen, "--%s: bad value '%s' (expected %s)", name, v, expect);
}

static int set_preset(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    fp8t_model_config m;
    if (fp8t_model_preset(&m, v) != 0)
        return fail(err, errlen, "preset", v, fp8t_model_preset_names());
    if (strlen(v) >= sizeof(c->preset)) return fail(err, errlen, "preset", v, "a shorter name");
    strcpy(c->preset, v);
    c->model = m;
    return 0;
}
static void get_preset(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    snprintf(b, n, "%s", c->preset);
}

static int set_arch(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    if (fp8t_arch_parse(&c->model.arch, v) != 0)
        return fail(err, errlen, "arch", v, "gpt2 or llama");
    return 0;
}
static void get_arch(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    snprintf(b, n, "%s", fp8t_arch_name(c->model.arch));
}

static int set_tie_head(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    if (strcmp(v, "1") == 0)
        c->model.untied_head = 0;
    else if (strcmp(v, "0") == 0)
        c->model.untied_head = 1;
    else
        return fail(err, errlen, "tie-head", v,
                    "1 (the LM head is wte) or 0 (its own lm_head.w)");
    return 0;
}
static void get_tie_head(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    snprintf(b, n, "%d", !c->model.untied_head);
}

/* none | llama3:FACTOR[,LOW,HIGH,ORIGINAL_MAX_POS] (defaults 1, 4, 8192 as Llama 3.1) */
static int set_rope_scaling(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    fp8t_rope_scaling r = {FP8T_ROPE_DEFAULT, 0.0f, 0.0f, 0.0f, 0};
    if (strcmp(v, "none") != 0) {
        float f = 0, lo = 1.0f, hi = 4.0f;
        int orig = 8192, used = 0;
        int n = sscanf(v, "llama3:%f%n,%f,%f,%d%n", &f, &used, &lo, &hi, &orig, &used);
        if (strncmp(v, "llama3:", 7) != 0 || (n != 1 && n != 4) || v[used] != 0 || !(f > 0) ||
            !(hi > lo) || !(lo > 0) || orig <= 0)
            return fail(err, errlen, "rope-scaling", v,
                        "none or llama3:FACTOR[,LOW_FREQ,HIGH_FREQ,ORIGINAL_MAX_POS], e.g. "
                        "llama3:32 or llama3:8,1,4,8192");
        r.type = FP8T_ROPE_LLAMA3;
        r.factor = f, r.low_freq_factor = lo, r.high_freq_factor = hi, r.original_max_pos = orig;
    }
    c->model.rope_scaling = r;
    return 0;
}
static void get_rope_scaling(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    const fp8t_rope_scaling *r = &c->model.rope_scaling;
    if (r->type != FP8T_ROPE_LLAMA3)
        snprintf(b, n, "none");
    else
        snprintf(b, n, "llama3:%g,%g,%g,%d", (double)r->factor, (double)r->low_freq_factor,
                 (double)r->high_freq_factor, r->original_max_pos);
}

#define PRECISIONS "fp8, delayed, current, block, rowwise, mxfp8, fake, bf16 or fp32"
static int set_precision(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    fp8t_precision p;
    if (fp8t_precision_parse(&p, v) != 0) return fail(err, errlen, "precision", v, PRECISIONS);
    c->policy.default_precision = p;
    return 0;
}
static void get_precision(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    snprintf(b, n, "%s", fp8t_precision_name(c->policy.default_precision));
}

static int set_head_precision(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    fp8t_precision p;
    if (fp8t_precision_parse(&p, v) != 0)
        return fail(err, errlen, "head-precision", v, PRECISIONS);
    c->policy.head_precision = p;
    return 0;
}
static void get_head_precision(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    snprintf(b, n, "%s", fp8t_precision_name(c->policy.head_precision));
}

static int set_recipe(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    if (strcmp(v, "delayed") == 0)
        c->policy.recipe = FP8T_PREC_DELAYED;
    else if (strcmp(v, "current") == 0)
        c->policy.recipe = FP8T_PREC_CURRENT;
    else
        return fail(err, errlen, "recipe", v, "delayed or current");
    return 0;
}
static void get_recipe(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    snprintf(b, n, "%s", c->policy.recipe == FP8T_PREC_CURRENT ? "current" : "delayed");
}

/* Given explicitly, the format applies to the block and rowwise GEMMs too (whose default is
 * E4M3 everywhere, as DeepSeek-V3 and Transformer Engine's block scaling). */
static int set_format(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    if (strcmp(v, "hybrid") == 0)
        c->policy.hybrid = c->policy.block_hybrid = 1;
    else if (strcmp(v, "e4m3") == 0)
        c->policy.hybrid = c->policy.block_hybrid = 0;
    else
        return fail(err, errlen, "format", v, "hybrid (E4M3 forward, E5M2 gradients) or e4m3");
    return 0;
}
static void get_format(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    snprintf(b, n, "%s", c->policy.hybrid ? "hybrid" : "e4m3");
}

static int set_amax_algo(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    if (strcmp(v, "max") == 0)
        c->policy.algo = FP8T_AMAX_MAX;
    else if (strcmp(v, "most_recent") == 0 || strcmp(v, "most-recent") == 0)
        c->policy.algo = FP8T_AMAX_MOST_RECENT;
    else
        return fail(err, errlen, "amax-algo", v, "max or most_recent");
    return 0;
}
static void get_amax_algo(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    snprintf(b, n, "%s", c->policy.algo == FP8T_AMAX_MOST_RECENT ? "most_recent" : "max");
}

static int set_override(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    char e[FP8T_ERR_LEN];
    if (fp8t_policy_add_overrides(&c->policy, v, e, sizeof(e)) != 0) {
        return fp8t_errorf(err, errlen, "--override '%s': %s", v, e);
    }
    return 0;
}
static void get_override(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    size_t o = 0;
    b[0] = 0;
    for (int i = 0; i < c->policy.n_overrides && o < n; i++) {
        char one[256];
        fp8t_override_format(&c->policy.overrides[i], one, sizeof(one));
        o += (size_t)snprintf(b + o, n - o, "%s%s", i ? ";" : "", one);
    }
}

static int set_device(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    if (strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0)
        return fail(err, errlen, "device", v, "cpu or cuda");
    strcpy(c->device, v);
    return 0;
}
static void get_device(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    snprintf(b, n, "%s", c->device);
}

int fp8t_shadow_action_parse(const char *s, int *fallback_steps) {
    if (fallback_steps) *fallback_steps = 0;
    if (strcmp(s, "warn") == 0) return 0;
    if (strcmp(s, "rollback") == 0) return 2;
    if (strncmp(s, "fallback:", 9) == 0) {
        char *end;
        errno = 0;
        long m = strtol(s + 9, &end, 10);
        if (errno || end == s + 9 || *end || m < 1 || m > 1000000000) return -1;
        if (fallback_steps) *fallback_steps = (int)m;
        return 1;
    }
    return -1;
}
static int set_shadow_action(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    if (fp8t_shadow_action_parse(v, NULL) < 0 || strlen(v) >= sizeof(c->shadow_action))
        return fail(err, errlen, "shadow-action", v,
                    "warn, fallback:M (M >= 1 steps in BF16) or rollback");
    strcpy(c->shadow_action, v);
    return 0;
}
static void get_shadow_action(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    snprintf(b, n, "%s", c->shadow_action);
}

static int set_dp_reduce(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    if (strcmp(v, "fp32") == 0)
        c->dp_bf16_reduce = 0;
    else if (strcmp(v, "bf16") == 0)
        c->dp_bf16_reduce = 1;
    else
        return fail(err, errlen, "dp-reduce", v, "fp32 or bf16");
    return 0;
}
static void get_dp_reduce(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    snprintf(b, n, "%s", c->dp_bf16_reduce ? "bf16" : "fp32");
}

/* --disable: the model's FP8T_DISABLE_* bits and the CUDA backend's two switches, one list.
 * Each name's environment variable (the spelling before the option existed) adds it to the
 * list of a config file; the command line replaces the list. */
#define DIS_CUDA_FUSION (1u << 30) /* fp8t_backend_options.plain */
#define DIS_CUDA_LT_FP8 (1u << 31) /* fp8t_backend_options.no_lt_fp8 */
static const struct {
    const char *name, *env;
    unsigned bit;
} DISABLE_NAMES[] = {
    {"fused-xent", "FP8TRAIN_NO_FUSED_XENT", FP8T_DISABLE_FUSED_XENT},
    {"bf16-xent", "FP8TRAIN_NO_BF16_XENT", FP8T_DISABLE_BF16_XENT},
    {"code-reuse", "FP8TRAIN_NO_CODE_REUSE", FP8T_DISABLE_CODE_REUSE},
    {"bf16-operands", "FP8TRAIN_NO_BF16_OPERANDS", FP8T_DISABLE_BF16_OPERANDS},
    {"gelu-fusion", "FP8TRAIN_NO_GELU_FUSION", FP8T_DISABLE_GELU_FUSION},
    {"bias-grad-fusion", "FP8TRAIN_NO_BIAS_GRAD_FUSION", FP8T_DISABLE_BIAS_GRAD_FUSION},
    {"gelu-bwd-fusion", "FP8TRAIN_NO_GELU_BWD_FUSION", FP8T_DISABLE_GELU_BWD_FUSION},
    {"residual-bias", "FP8TRAIN_NO_RESIDUAL_BIAS", FP8T_DISABLE_RESIDUAL_BIAS},
    {"ln-fusion", "FP8TRAIN_NO_LN_FUSION", FP8T_DISABLE_LN_FUSION},
    {"attn-save", "FP8TRAIN_NO_ATTN_SAVE", FP8T_DISABLE_ATTN_SAVE},
    {"fp8-save", "FP8TRAIN_NO_FP8_SAVE", FP8T_DISABLE_FP8_SAVE},
    {"swiglu-fusion", "FP8TRAIN_NO_SWIGLU_FUSION", FP8T_DISABLE_SWIGLU_FUSION},
    {"swiglu-bwd-fusion", "FP8TRAIN_NO_SWIGLU_BWD_FUSION", FP8T_DISABLE_SWIGLU_BWD_FUSION},
    {"x-share", "FP8TRAIN_NO_X_SHARE", FP8T_DISABLE_X_SHARE},
    {"bf16-saves", "FP8TRAIN_NO_BF16_SAVES", FP8T_DISABLE_BF16_SAVES},
    {"cuda-fusion", "FP8TRAIN_CUDA_PLAIN", DIS_CUDA_FUSION},
    {"cuda-lt-fp8", "FP8TRAIN_CUDA_NO_LT_FP8", DIS_CUDA_LT_FP8},
};
#define N_DISABLE_NAMES ((int)(sizeof(DISABLE_NAMES) / sizeof(DISABLE_NAMES[0])))
/* every fused, cached or memory-saving path of the model and the backend; not cuda-lt-fp8,
 * which swaps the FP8 GEMM library for an exact emulation rather than unfusing anything */
#define DIS_ALL_FUSION ((unsigned)FP8T_DISABLE_ALL_FUSION | DIS_CUDA_FUSION)

static unsigned disable_mask(const fp8t_model_options *m, const fp8t_backend_options *b) {
    return m->disable | (b->plain ? DIS_CUDA_FUSION : 0) | (b->no_lt_fp8 ? DIS_CUDA_LT_FP8 : 0);
}
static void disable_store(fp8t_model_options *m, fp8t_backend_options *b, unsigned mask) {
    m->disable = mask & (unsigned)FP8T_DISABLE_KNOWN;
    b->plain = (mask & DIS_CUDA_FUSION) != 0;
    b->no_lt_fp8 = (mask & DIS_CUDA_LT_FP8) != 0;
}

static int set_disable(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    unsigned mask = 0;
    const char *s = v;
    while (*s && strcmp(v, "none") != 0) {
        size_t len = strcspn(s, ",");
        int found = 0;
        if (len == 0) { /* "a,,b" or a trailing comma */
            s++;
            continue;
        }
        if (len == strlen("all-fusion") && !strncmp(s, "all-fusion", len)) {
            mask |= DIS_ALL_FUSION;
            found = 1;
        }
        for (int i = 0; i < N_DISABLE_NAMES && !found; i++)
            if (strlen(DISABLE_NAMES[i].name) == len && !strncmp(s, DISABLE_NAMES[i].name, len)) {
                mask |= DISABLE_NAMES[i].bit;
                found = 1;
            }
        if (!found) {
            char expect[512] = "a comma-separated list of";
            for (int i = 0; i < N_DISABLE_NAMES; i++) {
                size_t n = strlen(expect);
                snprintf(expect + n, sizeof(expect) - n, " %s,", DISABLE_NAMES[i].name);
            }
            size_t n = strlen(expect);
            snprintf(expect + n, sizeof(expect) - n,
                     " all-fusion (all but cuda-lt-fp8), or none");
            return fail(err, errlen, "disable", v, expect);
        }
        s += len;
        if (*s == ',') s++;
    }
    disable_store(&c->model_opts, &c->backend_opts, mask);
    return 0;
}
static void get_disable(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    unsigned mask = disable_mask(&c->model_opts, &c->backend_opts);
    size_t o = 0;
    b[0] = 0;
    if ((mask & DIS_ALL_FUSION) == DIS_ALL_FUSION) {
        o += (size_t)snprintf(b, n, "all-fusion");
        mask &= ~DIS_ALL_FUSION;
    }
    for (int i = 0; i < N_DISABLE_NAMES && o < n; i++)
        if (mask & DISABLE_NAMES[i].bit)
            o += (size_t)snprintf(b + o, n - o, "%s%s", o ? "," : "", DISABLE_NAMES[i].name);
    if (!b[0]) snprintf(b, n, "none");
}

/* --head-chunk auto | 0 (off) | N rows: fp8t_model_options.head_chunk (0 there is auto) */
static int set_head_chunk(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    if (!strcmp(v, "auto")) {
        c->model_opts.head_chunk = FP8T_HEAD_CHUNK_AUTO;
        return 0;
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < 0 || x > (1L << 24) || x % 8 != 0)
        return fail(err, errlen, "head-chunk", v,
                    "auto, 0 (off) or the rows per chunk, a positive multiple of 8");
    c->model_opts.head_chunk = x == 0 ? FP8T_HEAD_CHUNK_OFF : (int)x;
    return 0;
}
static void get_head_chunk(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    const int h = c->model_opts.head_chunk;
    if (h == FP8T_HEAD_CHUNK_AUTO)
        snprintf(b, n, "auto");
    else
        snprintf(b, n, "%d", h < 0 ? 0 : h);
}

static int set_cuda_attn(void *obj, const char *v, char *err, size_t errlen) {
    fp8t_train_config *c = obj;
    if (fp8t_attn_impl_parse(&c->backend_opts.attn, v) != 0) {
        char expect[160];
        snprintf(expect, sizeof(expect), "default, %s", fp8t_attn_impl_names());
        return fail(err, errlen, "cuda-attn", v, expect);
    }
    return 0;
}
static void get_cuda_attn(const void *obj, char *b, size_t n) {
    const fp8t_train_config *c = obj;
    const char *name = fp8t_attn_impl_name(c->backend_opts.attn);
    snprintf(b, n, "%s", name ? name : "?");
}

/* ---------------------------------------------------------------- the table */

#define G_MODEL "Model"
#define G_DATA "Data"
#define G_OPT "Optimizer"
#define G_PREC "Precision"
#define G_RUN "Run"
#define G_CKPT "Checkpoints"
#define G_DEBUG "Debugging"
#define G_DP "Data parallel (mpirun -np N fp8train train ...)"

#define NUM(name_, arg_, type_, field_, lo_, hi_, group_, help_)                                 \
    {                                                                                            \
        .name = name_, .arg = arg_, .help = help_, .group = group_, .type = type_,               \
        FIELD(field_), .lo = lo_, .hi = hi_                                                      \
    }
#define MODEL_INT(name_, field_, help_)                                                          \
    {                                                                                            \
        .name = name_, .arg = "N", .help = help_, .group = G_MODEL, .type = OT_INT,              \
        FIELD(field_), .lo = 1, .hi = 1 << 20, .user = IN_OBJECT | IS_MODEL                      \
    }
#define POLICY_NUM(name_, arg_, type_, field_, lo_, hi_, help_)                                  \
    {                                                                                            \
        .name = name_, .arg = arg_, .help = help_, .group = G_PREC, .type = type_,               \
        FIELD(field_), .lo = lo_, .hi = hi_, .user = IN_OBJECT                                   \
    }
#define SPECIAL(name_, arg_, set_, get_, group_, in_obj_, model_, help_)                         \
    {                                                                                            \
        .name = name_, .arg = arg_, .help = help_, .group = group_, .type = OT_SPECIAL,          \
        .set = set_, .get = get_,                                                                \
        .user = ((in_obj_) ? IN_OBJECT : 0u) | ((model_) ? IS_MODEL : 0u)                        \
    }
#define STR(name_, arg_, field_, group_, help_)                                                  \
    { .name = name_, .arg = arg_, .help = help_, .group = group_, .type = OT_STR, FIELD(field_) }

/* the short names of the engine's types, for the rows below */
#define OT_INT FP8T_OPT_INT
#define OT_FLOAT FP8T_OPT_FLOAT
#define OT_U64 FP8T_OPT_U64
#define OT_STR FP8T_OPT_STRBUF
#define OT_FLAG FP8T_OPT_FLAG
#define OT_BOOL FP8T_OPT_BOOL
#define OT_SPECIAL FP8T_OPT_SPECIAL

typedef fp8t_opt opt;

static const opt OPTIONS[] = {
    /* read by fp8t_train_parse_args itself (a file of options, applied before the others);
     * a row so that --help lists it and the command line finds it */
    {.name = "config",
     .arg = "FILE",
     .help = "JSON file of options (see above)",
     .group = G_MODEL,
     .type = OT_SPECIAL,
     .dflt = FP8T_OPT_NO_DEFAULT,
     .user = IN_OBJECT},
    SPECIAL(
        "preset", "NAME", set_preset, get_preset, G_MODEL, 0, 1,
        "model preset: tiny, tiny-llama, gpt2-124m, gpt2-350m, gpt2-1.5b, llama-1b, llama3-8b"),
    SPECIAL("arch", "gpt2|llama", set_arch, get_arch, G_MODEL, 1, 1,
            "architecture (GPT-2: LayerNorm, GELU, biases; Llama: RMSNorm, SwiGLU, RoPE)"),
    MODEL_INT("layers", model.n_layer, "transformer layers"),
    MODEL_INT("dim", model.n_embd, "model width C"),
    MODEL_INT("heads", model.n_head, "attention heads (must divide --dim)"),
    MODEL_INT("vocab", model.vocab_size, "vocabulary size (>= the data's largest token + 1)"),
    MODEL_INT("mlp-hidden", model.mlp_hidden, "MLP hidden size (fc1 / gate / up outputs)"),
    MODEL_INT("max-seq-len", model.seq_len, "the model's maximum sequence length (positions)"),
    {.name = "kv-heads",
     .arg = "N",
     .help = "key/value heads (grouped-query attention, llama; "
             "must divide --heads; 0 = --heads)",
     .group = G_MODEL,
     .type = OT_INT,
     FIELD(model.n_kv_head),
     .lo = 0,
     .hi = 1 << 20,
     .user = IN_OBJECT | IS_MODEL},
    SPECIAL("tie-head", "0|1", set_tie_head, get_tie_head, G_MODEL, 1, 1,
            "1: the LM head is the token embedding wte; 0: its own weight lm_head.w"),
    {.name = "qkv-bias",
     .arg = "0|1",
     .help = "llama: biases on the q, k, v projections (Qwen2)",
     .group = G_MODEL,
     .type = OT_BOOL,
     FIELD(model.qkv_bias),
     .lo = 0,
     .hi = 1,
     .user = IN_OBJECT | IS_MODEL},
    SPECIAL("rope-scaling", "SPEC", set_rope_scaling, get_rope_scaling, G_MODEL, 1, 1,
            "llama RoPE frequency scaling: none or llama3:FACTOR[,LOW,HIGH,ORIG_MAX_POS]"),

    STR("data", "SRC", data, G_DATA,
        "synthetic | a text file (bytes; tokens with --tokenizer) | 'dir/x_*.bin' llm.c shards"),
    STR("val-data", "SRC", val_data, G_DATA,
        "separate validation data; without it the last 10% of --data is held out"),
    STR("tokenizer", "FILE", tokenizer, G_DATA,
        "Hugging Face tokenizer.json: tokenize text/JSONL --data on the fly (vocab from it)"),
    NUM("batch", "N", OT_INT, batch, 1, 1 << 20, G_DATA, "sequences per micro-batch (B)"),
    NUM("seq-len", "N", OT_INT, seq_len, 0, 1 << 20, G_DATA,
        "tokens per sequence (T; 0 = the model's maximum)"),
    NUM("grad-accum", "N", OT_INT, grad_accum, 1, 1 << 20, G_DATA,
        "micro-batches per optimizer step"),
    NUM("steps", "N", OT_INT, steps, 1, 1e9, G_DATA,
        "optimizer steps to reach (absolute: a resumed run stops where the original would)"),

    NUM("lr", "X", OT_FLOAT, lr, 1e-12, 1e3, G_OPT, "peak learning rate"),
    NUM("min-lr-frac", "X", OT_FLOAT, min_lr_frac, 0, 1, G_OPT,
        "cosine decay ends at lr * this at --steps"),
    NUM("warmup", "N", OT_INT, warmup, 0, 1e9, G_OPT, "linear warmup steps"),
    NUM("weight-decay", "X", OT_FLOAT, weight_decay, 0, 1e3, G_OPT,
        "AdamW decoupled weight decay (2-D weights only)"),
    NUM("beta1", "X", OT_FLOAT, beta1, 0, 0.999999, G_OPT, "AdamW beta1"),
    NUM("beta2", "X", OT_FLOAT, beta2, 0, 0.99999999, G_OPT, "AdamW beta2"),
    NUM("adam-eps", "X", OT_FLOAT, adam_eps, 1e-30, 1, G_OPT, "AdamW epsilon"),
    NUM("grad-clip", "X", OT_FLOAT, grad_clip, 0, 1e9, G_OPT,
        "clip the global gradient norm to this (0 = off)"),
    NUM("seed", "N", OT_U64, seed, 0, 0, G_OPT, "seed of the init and of the data order"),

    SPECIAL("precision", "P", set_precision, get_precision, G_PREC, 1, 0,
            "GEMM precision: fp8 (the --recipe), delayed, current, block (1x128/128x128 tiles), "
            "rowwise (per-row scales), mxfp8, fake, bf16, fp32. block and rowwise run on the "
            "FP8 tensor cores on Hopper (cuBLASLt >= 12.9); mxfp8 is emulated everywhere "
            "(Hopper has no MXFP8 hardware): its numerics, not its speed"),
    SPECIAL("recipe", "delayed|current", set_recipe, get_recipe, G_PREC, 1, 0,
            "what 'fp8' means: delayed or current per-tensor scaling"),
    SPECIAL("format", "hybrid|e4m3", set_format, get_format, G_PREC, 1, 0,
            "hybrid: E4M3 forward, E5M2 gradients; e4m3: E4M3 everywhere (default of block and "
            "rowwise unless this is given)"),
    POLICY_NUM("amax-history", "N", OT_INT, policy.history_len, 1, 1 << 20,
               "delayed scaling: amax history length"),
    SPECIAL("amax-algo", "max|most_recent", set_amax_algo, get_amax_algo, G_PREC, 1, 0,
            "delayed scaling: amax from the history's max or the most recent step"),
    POLICY_NUM("margin", "N", OT_INT, policy.margin, -64, 64,
               "delayed scaling: scale /= 2^margin"),
    POLICY_NUM("pow2-scales", NULL, OT_FLAG, policy.pow2_scales, 0, 1,
               "current, block and rowwise scaling: round scales down to powers of two"),
    POLICY_NUM("amax-epsilon", "X", OT_FLOAT, policy.epsilon, 0, 1e30,
               "current scaling: amax floor"),
    SPECIAL("head-precision", "P", set_head_precision, get_head_precision, G_PREC, 1, 0,
            "precision of the LM head GEMMs"),
    POLICY_NUM("fast-accum-fprop", "0|1", OT_BOOL, policy.fast_accum_fprop, 0, 1,
               "Hopper fast accumulation for Fprop GEMMs"),
    POLICY_NUM("fast-accum-grad", "0|1", OT_BOOL, policy.fast_accum_grad, 0, 1,
               "Hopper fast accumulation for Dgrad/Wgrad GEMMs"),
    SPECIAL("override", "SPEC", set_override, get_override, G_PREC, 1, 0,
            "per-layer/module/GEMM precision, repeatable, e.g. 'gemm=dgrad,precision=bf16' or "
            "'layers=0-1,module=fc2,precision=current'"),

    SPECIAL("device", "cpu|cuda", set_device, get_device, G_RUN, 0, 0, "backend"),
    STR("out", "DIR", out_dir, G_RUN,
        "run directory: config.json, metrics.jsonl, events.jsonl, checkpoints/"),
    NUM("overwrite", NULL, OT_FLAG, overwrite, 0, 1, G_RUN,
        "--out may hold another run: replace its logs and checkpoints (files fp8train did not "
        "write are kept)"),
    NUM("val-every", "N", OT_INT, val_every, 0, 1e9, G_RUN,
        "validation every N steps and at the end (0 = no validation)"),
    NUM("val-batches", "N", OT_INT, val_batches, 1, 1e6, G_RUN,
        "micro-batches per validation (the same ones every time)"),
    SPECIAL("head-chunk", "auto|0|N", set_head_chunk, get_head_chunk, G_RUN, 0, 0,
            "the LM head of a forward with targets in chunks of N rows (a multiple of 8), so "
            "the [tokens, vocab] logits are never held: auto = chunk where they and their BF16 "
            "gradient would pass 256 MiB, in chunks that fit the backward's free scratch (at "
            "least 1024 rows); 0 = off. Where the head's GEMMs are BF16 and no hook is set; "
            "not bit-identical: the head's weight gradient sums its tokens chunk by chunk"),
    NUM("progress-every", "N", OT_INT, progress_every, 1, 1e9, G_RUN,
        "print a progress line every N steps"),
    NUM("quiet", NULL, OT_FLAG, quiet, 0, 1, G_RUN, "no progress lines"),
    STR("tensorboard", "DIR", tensorboard, G_RUN,
        "TensorBoard event files in DIR: loss, val_loss, lr, grad_norm, tokens/s, --inspect "
        "statistics"),

    NUM("ckpt-every", "N", OT_INT, ckpt_every, 0, 1e9, G_CKPT,
        "checkpoint every N steps (0 = only at the end)"),
    NUM("keep-ckpts", "K", OT_INT, keep_ckpts, 0, 1e9, G_CKPT,
        "keep the last K checkpoints (0 = all)"),
    STR("resume", "DIR", resume, G_CKPT,
        "resume from a checkpoint directory (weights, optimizer, FP8 state, data position)"),
    NUM("reset-fp8", NULL, OT_FLAG, resume_reset_fp8, 0, 1, G_CKPT,
        "on --resume, start the FP8 scaling state fresh"),
    STR("init", "SRC", init, G_CKPT,
        "start from the weights of SRC (Hugging Face directory, checkpoint or llm.c .bin): "
        "its model, fresh AdamW moments, step 0, data from the start"),

    NUM("zero", "0|1", OT_INT, zero, 0, 1, G_DP,
        "1: ZeRO-1, the AdamW moments sharded across ranks (reduce-scatter of the gradients, "
        "AdamW on the rank's shard, all-gather of the weights)"),
    SPECIAL("dp-reduce", "fp32|bf16", set_dp_reduce, get_dp_reduce, G_DP, 0, 0,
            "precision of the gradient all-reduce"),
    NUM("amax-reduce", "0|1", OT_BOOL, amax_reduce, 0, 1, G_DP,
        "all-reduce (max) the amaxes before each scale update so every rank uses the same "
        "scales (0: per-rank scales, for the debugging procedure)"),
    NUM("bucket-mb", "X", OT_FLOAT, bucket_mb, 0, 1e6, G_DP,
        "gradient reduction in buckets of at least X MiB of whole layers, each started as soon "
        "as the last micro-batch's backward has finished them (0 = one reduction after it)"),
    NUM("dp-force", NULL, OT_FLAG, dp_force, 0, 1, G_DP,
        "run the data-parallel path (collectives, shards) in a single process too, to check "
        "it against the plain path"),

    STR("inspect", "SPEC", inspect, G_DEBUG,
        "tensor statistics to OUT/stats.jsonl, e.g. 'every=10,layers=0-1,gemms=fprop,dump=1' "
        "(whatif=all adds the MXFP8 what-if; data parallel: ranks=0 (default) or ranks=all, "
        "OUT/rank-R/stats.jsonl per rank; docs/debugging.md lists every key)"),
    NUM("inspect-dump-mb", "N", OT_INT, inspect_dump_mb, 1, 1 << 20, G_DEBUG,
        "--inspect dump=1: MiB of pinned host memory the dumps may hold while the writer thread "
        "catches up (beyond it a dump waits for the disk)"),
    STR("inject", "SPEC", inject, G_DEBUG,
        "fault injection, e.g. 'layer=1,module=fc2,gemm=dgrad,kind=scale:64,from=50'"),
    STR("baseline", "RUN", baseline, G_DEBUG,
        "baseline run directory for the drift detector (its metrics.jsonl)"),
    NUM("drift-threshold", "X", OT_FLOAT, drift_threshold, 0, 1e9, G_DEBUG,
        "relative loss gap vs --baseline that raises a drift event"),
    NUM("spike-window", "N", OT_INT, spike_window, 0, 1e6, G_DEBUG,
        "loss spike detector: robust z-score window (at least 3; 0 turns the detector off)"),
    NUM("spike-z", "X", OT_FLOAT, spike_z, 0.1, 1e9, G_DEBUG, "loss spike detector: z threshold"),
    NUM("detect-nan", "0|1", OT_BOOL, detect_nan, 0, 1, G_DEBUG,
        "stop on a non-finite loss and name the first non-finite tensor"),
    NUM("shadow-every", "K", OT_INT, shadow_every, 0, 1e9, G_DEBUG,
        "every K steps recompute the loss in BF16 on the same batch (0 = off)"),
    SPECIAL("shadow-action", "A", set_shadow_action, get_shadow_action, G_DEBUG, 0, 0,
            "above the threshold: warn | fallback:M (M steps in BF16) | rollback"),
    NUM("shadow-threshold", "X", OT_FLOAT, shadow_threshold, 0, 1e9, G_DEBUG,
        "relative |loss - loss_bf16| / loss_bf16 that triggers the shadow action"),
    SPECIAL(
        "disable", "LIST", set_disable, get_disable, G_DEBUG, 0, 0,
        "fused/cached paths back to their plain versions, comma-separated: fused-xent, "
        "bf16-xent, code-reuse, bf16-operands, gelu-fusion, bias-grad-fusion, "
        "gelu-bwd-fusion, residual-bias, ln-fusion, attn-save, fp8-save, swiglu-fusion, "
        "swiglu-bwd-fusion, x-share (the model's, "
        "bit-identical), bf16-saves (activations kept for the backward in FP32: not "
        "bit-identical, not in all-fusion), cuda-fusion (every CUDA one), cuda-lt-fp8 (FP8 GEMMs by exact "
        "decode), all-fusion (all but cuda-lt-fp8), none; FP8TRAIN_NO_GELU_FUSION=1 ..., "
        "FP8TRAIN_CUDA_PLAIN=1, FP8TRAIN_CUDA_NO_LT_FP8=1 add to it"),
    SPECIAL("cuda-attn", "IMPL", set_cuda_attn, get_cuda_attn, G_DEBUG, 0, 0,
            "CUDA attention kernels: default (flash), flash (BF16 tensor cores), gemm "
            "(cuBLASLt), tiled (FP32: the CPU's arithmetic), simple (FP32); FP8TRAIN_CUDA_ATTN"),
    NUM("cuda-sync", "0|1", OT_BOOL, backend_opts.sync_each_op, 0, 1, G_DEBUG,
        "CUDA: synchronize and check after every op, naming the op that failed (slow); "
        "FP8TRAIN_CUDA_SYNC=1"),
};
#define N_OPTIONS ((int)(sizeof(OPTIONS) / sizeof(OPTIONS[0])))

static const fp8t_opt_spec TRAIN_SPEC = {
    .cmd = "train",
    .usage = "[options]",
    .about = "Trains a model and writes OUT/config.json, metrics.jsonl, events.jsonl and\n"
             "checkpoints/step_NNNNNN/. Options may also come from --config FILE (a JSON\n"
             "object with the same names, e.g. {\"precision\": \"fp8\", \"overrides\":\n"
             "[\"layers=0,precision=bf16\"]}; a run's config.json is one) and from the\n"
             "environment (FP8TRAIN_PRECISION, FP8TRAIN_FPROP/_DGRAD/_WGRAD=bf16|...;\n"
             "FP8TRAIN_NO_*, FP8TRAIN_CUDA_* for the debugging switches, see --disable).\n"
             "Precedence: config file < environment < command line.\n",
    .epilog = "Model options after --preset change the preset's values; --seq-len must not\n"
              "exceed the model's --max-seq-len. With --resume and no model option, the model\n"
              "is the checkpoint's; with --init SRC it is always SRC's. Exit status: 0 done, 2 "
              "bad usage, 3 stopped by a NaN/Inf.\n",
    .opts = OPTIONS,
    .n_opts = N_OPTIONS,
};

/* The row of a name as the command line or a config file spells it ("seq-len", "seq_len"). */
static const opt *find_option(const char *name) {
    while (*name == '-') name++;
    char canon[64];
    size_t n = strlen(name);
    if (n >= sizeof(canon)) return NULL;
    for (size_t i = 0; i <= n; i++) canon[i] = name[i] == '_' ? '-' : name[i];
    return fp8t_opt_find(OPTIONS, N_OPTIONS, canon);
}

int fp8t_train_option_set(fp8t_train_config *c, const char *name, const char *value, char *err,
                          size_t errlen) {
    const opt *o = find_option(name);
    if (!o) {
        return fp8t_errorf(err, errlen, "unknown option '%s' (see fp8train train --help)", name);
    }
    return fp8t_opt_set(o, c, value, err, errlen);
}

/* ---------------------------------------------------------------- JSON */

/* A JSON value as the option string it stands for. */
static int json_value_string(const cJSON *v, char *buf, size_t len) {
    if (cJSON_IsString(v))
        snprintf(buf, len, "%s", v->valuestring);
    else if (cJSON_IsBool(v))
        snprintf(buf, len, "%d", cJSON_IsTrue(v) ? 1 : 0);
    else if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0)
            snprintf(buf, len, "%.0f", d);
        else
            snprintf(buf, len, "%.17g", d);
    } else
        return -1;
    return 0;
}

/* Apply one key of a config object. Handles the whole-object keys "model" and "policy" and
 * the list form of "override"/"overrides". */
static int apply_json_key(fp8t_train_config *c, const cJSON *it, int *model_set, char *err,
                          size_t errlen) {
    const char *key = it->string;
    char e[FP8T_ERR_LEN];
    if (!strcmp(key, "version") || !strcmp(key, "policy_description") ||
        !strcmp(key, "fp8train_version") || !strcmp(key, "config"))
        return 0; /* informational keys of a written config.json */
    if (!strcmp(key, "model")) {
        char *s = cJSON_PrintUnformatted(it);
        int rc = fp8t_model_config_from_json(&c->model, s, e, sizeof(e));
        free(s);
        if (rc != 0) {
            return fp8t_errorf(err, errlen, "\"model\": %s", e);
        }
        *model_set = 1;
        return 0;
    }
    if (!strcmp(key, "policy")) {
        char *s = cJSON_PrintUnformatted(it);
        int rc = fp8t_policy_from_json(&c->policy, s, e, sizeof(e));
        free(s);
        if (rc != 0) {
            return fp8t_errorf(err, errlen, "\"policy\": %s", e);
        }
        return 0;
    }
    const opt *o = find_option(!strcmp(key, "overrides") ? "override" : key);
    if (!o) {
        return fp8t_errorf(err, errlen,
                           "unknown key \"%s\" (keys are the option names of fp8train train "
                           "--help, e.g. \"precision\", \"seq_len\", \"overrides\")",
                           key);
    }
    if (o->user & IS_MODEL) *model_set = 1;
    if (cJSON_IsArray(it)) {
        if (o->set != set_override) {
            return fp8t_errorf(err, errlen, "\"%s\": a list is only allowed for \"overrides\"",
                               key);
        }
        const cJSON *x;
        cJSON_ArrayForEach(x, it) {
            if (!cJSON_IsString(x)) {
                return fp8t_errorf(err, errlen,
                                   "\"%s\": every element must be a string like "
                                   "\"layers=0,precision=bf16\"",
                                   key);
            }
            if (fp8t_opt_set(o, c, x->valuestring, err, errlen) != 0) return -1;
        }
        return 0;
    }
    char v[FP8T_PATH_MAX + 64];
    if (json_value_string(it, v, sizeof(v)) != 0) {
        return fp8t_errorf(err, errlen, "\"%s\": expected a string, number or boolean", key);
    }
    if (o->set == set_override && !*v) return 0; /* "" = no overrides */
    return fp8t_opt_set(o, c, v, err, errlen);
}

/* preset first (it resets the model), then "policy" and "model" (whole objects), then the
 * remaining keys in file order. */
static int apply_json_object(fp8t_train_config *c, const cJSON *obj, int skip_preset,
                             int *model_set, char *err, size_t errlen) {
    const cJSON *it;
    if (!skip_preset) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(obj, "preset");
        if (p) {
            char v[128];
            if (json_value_string(p, v, sizeof(v)) != 0 || set_preset(c, v, err, errlen) != 0) {
                if (!cJSON_IsString(p)) fp8t_errorf(err, errlen, "\"preset\": expected a string");
                return -1;
            }
            *model_set = 1;
        }
    }
    static const char *first[] = {"policy", "model"};
    for (int k = 0; k < 2; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, first[k]);
        if (x && apply_json_key(c, x, model_set, err, errlen) != 0) return -1;
    }
    cJSON_ArrayForEach(it, obj) {
        if (!strcmp(it->string, "preset") || !strcmp(it->string, "policy") ||
            !strcmp(it->string, "model"))
            continue;
        if (apply_json_key(c, it, model_set, err, errlen) != 0) return -1;
    }
    return 0;
}

int fp8t_train_config_apply_json(fp8t_train_config *c, const char *json, char *err,
                                 size_t errlen) {
    cJSON *obj = cJSON_Parse(json);
    if (!cJSON_IsObject(obj)) {
        fp8t_errorf(err, errlen, "not a JSON object");
        cJSON_Delete(obj);
        return -1;
    }
    int model_set = 0;
    int rc = apply_json_object(c, obj, 0, &model_set, err, errlen);
    cJSON_Delete(obj);
    return rc;
}

char *fp8t_train_config_to_json(const fp8t_train_config *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "fp8train_version", FP8T_VERSION);
    char buf[FP8T_PATH_MAX + 64];
    for (int i = 0; i < N_OPTIONS; i++) {
        const opt *p = &OPTIONS[i];
        if ((p->user & IN_OBJECT)) continue;
        /* a permission for this invocation, not a property of the run: a --config FILE made
         * from this config.json must not replace runs unasked */
        if (p->off == offsetof(fp8t_train_config, overwrite)) continue;
        char key[64];
        snprintf(key, sizeof(key), "%s", p->name);
        for (char *k = key; *k; k++)
            if (*k == '-') *k = '_';
        const char *base = (const char *)c + p->off;
        switch (p->type) {
        case OT_INT: cJSON_AddNumberToObject(o, key, *(const int *)base); break;
        case OT_FLOAT: cJSON_AddNumberToObject(o, key, *(const float *)base); break;
        case OT_U64: {
            uint64_t x = *(const uint64_t *)base;
            if (x < (1ULL << 53))
                cJSON_AddNumberToObject(o, key, (double)x);
            else {
                fp8t_opt_get(p, c, buf, sizeof(buf));
                cJSON_AddStringToObject(o, key, buf);
            }
            break;
        }
        case OT_FLAG: cJSON_AddBoolToObject(o, key, *(const int *)base); break;
        case OT_BOOL: cJSON_AddNumberToObject(o, key, *(const int *)base); break;
        default: /* strings and the special rows: their text */
            fp8t_opt_get(p, c, buf, sizeof(buf));
            cJSON_AddStringToObject(o, key, buf);
            break;
        }
    }
    char *mj = fp8t_model_config_to_json(&c->model);
    cJSON_AddItemToObject(o, "model", cJSON_Parse(mj));
    free(mj);
    char *pj = fp8t_policy_to_json(&c->policy);
    cJSON *pol = pj ? cJSON_Parse(pj) : NULL;
    cJSON_AddItemToObject(o, "policy", pol ? pol : cJSON_CreateNull());
    free(pj);
    char desc[8192];
    fp8t_policy_describe(&c->policy, desc, sizeof(desc));
    cJSON_AddStringToObject(o, "policy_description", desc);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

/* ---------------------------------------------------------------- validation */

int fp8t_train_config_check(fp8t_train_config *c, char *err, size_t errlen) {
    char e[FP8T_ERR_LEN];
    if (fp8t_model_config_check(&c->model, e, sizeof(e)) != 0) {
        return fp8t_errorf(err, errlen,
                           "impossible model (from --preset %s and --layers/--dim/--heads/"
                           "--kv-heads/--vocab/--mlp-hidden/--max-seq-len/--rope-scaling): %s",
                           c->preset, e);
    }
    if (c->seq_len == 0) c->seq_len = c->model.seq_len;
    if (c->seq_len < 1 || c->seq_len > c->model.seq_len) {
        return fp8t_errorf(err, errlen,
                           "--seq-len %d is more than the model's maximum sequence length %d; "
                           "use --seq-len <= %d or a model with --max-seq-len >= %d",
                           c->seq_len, c->model.seq_len, c->model.seq_len, c->seq_len);
    }
    if (c->batch < 1 || c->grad_accum < 1 || c->steps < 1) {
        return fp8t_errorf(err, errlen, "--batch, --grad-accum and --steps must be at least 1");
    }
    if (!(c->lr > 0) || !isfinite(c->lr) || !(c->min_lr_frac >= 0 && c->min_lr_frac <= 1)) {
        return fp8t_errorf(err, errlen, "--lr must be positive and --min-lr-frac in [0, 1]");
    }
    if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1) ||
        !(c->adam_eps > 0)) {
        return fp8t_errorf(err, errlen,
                           "--beta1/--beta2 must be in [0, 1) and --adam-eps positive");
    }
    if (c->warmup < 0 || c->ckpt_every < 0 || c->keep_ckpts < 0 || c->val_every < 0 ||
        c->val_batches < 1 || c->shadow_every < 0 || c->progress_every < 1 ||
        !(c->grad_clip >= 0) || !(c->weight_decay >= 0)) {
        return fp8t_errorf(err, errlen,
                           "a count option is out of range (see fp8train train --help)");
    }
    if (c->spike_window != 0 && c->spike_window < 3) {
        return fp8t_errorf(err, errlen,
                           "--spike-window %d: a window needs at least 3 losses (0 turns the "
                           "spike detector off)",
                           c->spike_window);
    }
    if (strcmp(c->device, "cpu") != 0 && strcmp(c->device, "cuda") != 0) {
        return fp8t_errorf(err, errlen, "--device: bad value '%s' (expected cpu or cuda)",
                           c->device);
    }
    if (fp8t_shadow_action_parse(c->shadow_action, NULL) < 0) {
        return fp8t_errorf(err, errlen,
                           "--shadow-action: bad value '%s' (expected warn, fallback:M or "
                           "rollback)",
                           c->shadow_action);
    }
    if (c->policy.history_len < 1) {
        return fp8t_errorf(err, errlen, "--amax-history must be at least 1");
    }
    if (c->policy.default_precision < 0 || c->policy.default_precision >= FP8T_PREC_COUNT) {
        return fp8t_errorf(err, errlen, "--precision: invalid");
    }
    if (!c->out_dir[0]) {
        return fp8t_errorf(err, errlen, "--out must name a directory");
    }
    /* checked here so that a bad --tensorboard stops the run before its directory is written */
    if (c->tensorboard[0] && fp8t_path_exists(c->tensorboard) && !fp8t_is_dir(c->tensorboard)) {
        return fp8t_errorf(err, errlen,
                           "--tensorboard %s: exists and is not a directory (name a "
                           "directory for the event files, e.g. --tensorboard %s/tb)",
                           c->tensorboard, c->out_dir[0] ? c->out_dir : "runs/x");
    }
    if (c->inject[0] && fp8t_injector_check(c->inject, e, sizeof(e)) != 0) {
        return fp8t_errorf(err, errlen, "--inject: %s", e);
    }
    return 0;
}

/* ---------------------------------------------------------------- command line */

typedef struct {
    const opt *o;
    const char *value;
} arg_pair;

/* --init SRC: the model is SRC's. Model options (a preset, --layers, a config file's "model")
 * may only restate it: a differing one would leave weights without a place in the model. */
static int adopt_init_model(fp8t_train_config *c, int model_set, char *err, size_t errlen) {
    if (c->resume[0]) {
        return fp8t_errorf(
            err, errlen,
            "--init and --resume exclude each other: --resume %s continues a "
            "run (weights, optimizer, step, data position); --init starts a new run from "
            "weights only",
            c->resume);
    }
    fp8t_model_config src;
    char e[FP8T_ERR_LEN], why[512];
    if (fp8t_weights_read_config(c->init, &src, e, sizeof(e)) != 0) {
        return fp8t_errorf(err, errlen, "--init: %s", e);
    }
    if (model_set && fp8t_model_config_diff(&src, &c->model, why, sizeof(why)) != 0) {
        return fp8t_errorf(
            err, errlen,
            "--init %s: the model comes from it (%s, %d layers, n_embd %d), "
            "but the model options given ask for another: %s (\"checkpoint\" = %s); drop "
            "--preset and the model options, or make them match",
            c->init, fp8t_arch_name(src.arch), src.n_layer, src.n_embd, why, c->init);
    }
    c->model = src;
    return 0;
}

static int adopt_checkpoint_model(fp8t_train_config *c, char *err, size_t errlen) {
    fp8t_checkpoint ck;
    char e[FP8T_ERR_LEN];
    if (fp8t_checkpoint_read_state(c->resume, &ck, e, sizeof(e)) != 0) {
        return fp8t_errorf(err, errlen, "--resume: %s", e);
    }
    c->model = ck.model;
    if (ck.config_json) {
        cJSON *cfg = cJSON_Parse(ck.config_json);
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(cfg, "preset");
        if (cJSON_IsString(p) && strlen(p->valuestring) < sizeof(c->preset))
            strcpy(c->preset, p->valuestring);
        cJSON_Delete(cfg);
    }
    fp8t_checkpoint_free(&ck);
    return 0;
}

/* ---- the environment: the settings that had a variable before they had an option ---- */

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

int fp8t_options_debug_env(fp8t_model_options *m, fp8t_backend_options *b, char *err,
                           size_t errlen) {
    unsigned mask = disable_mask(m, b);
    for (int i = 0; i < N_DISABLE_NAMES; i++)
        if (env_flag(DISABLE_NAMES[i].env)) mask |= DISABLE_NAMES[i].bit;
    disable_store(m, b, mask);
    if (env_flag("FP8TRAIN_CUDA_SYNC")) b->sync_each_op = 1;
    const char *attn = getenv("FP8TRAIN_CUDA_ATTN");
    if (attn && *attn && fp8t_attn_impl_parse(&b->attn, attn) != 0) {
        return fp8t_errorf(err, errlen,
                           "FP8TRAIN_CUDA_ATTN=%s is not an attention implementation; use one "
                           "of default, %s (or unset it)",
                           attn, fp8t_attn_impl_names());
    }
    return 0;
}

/* Between a config file and the command line: the precision switches (FP8TRAIN_PRECISION,
 * FP8TRAIN_FPROP / _DGRAD / _WGRAD) and the debug switches above. */
static int apply_env(fp8t_train_config *c, char *err, size_t errlen) {
    static const char *const vars[1 + FP8T_GEMM_COUNT] = {"FP8TRAIN_PRECISION", "FP8TRAIN_FPROP",
                                                          "FP8TRAIN_DGRAD", "FP8TRAIN_WGRAD"};
    const char *values[1 + FP8T_GEMM_COUNT];
    for (int i = 0; i < 1 + FP8T_GEMM_COUNT; i++) values[i] = getenv(vars[i]);
    if (fp8t_policy_apply_switches(&c->policy, values, vars, err, errlen) != 0) return -1;
    return fp8t_options_debug_env(&c->model_opts, &c->backend_opts, err, errlen);
}

int fp8t_train_parse_args(fp8t_train_config *c, int argc, char **argv, char *err, size_t errlen) {
    fp8t_train_config_default(c);
    /* shown in the banner, not an option (libgomp read it at start; fp8train's main sets
     * passive unless the user set it) */
    const char *wait = getenv("OMP_WAIT_POLICY");
    snprintf(c->omp_wait_policy, sizeof(c->omp_wait_policy), "%s", wait ? wait : "unset");
    arg_pair *pairs = calloc((size_t)(argc > 0 ? argc : 1), sizeof(*pairs));
    const char *config_path = NULL;
    int n_pairs = 0, rc = -1, model_set = 0;
    char *text = NULL;
    cJSON *json = NULL;
    if (!pairs) {
        return fp8t_errorf(err, errlen, "out of memory");
    }
    /* pass 1: split into (option, value) pairs, checking names and missing values */
    for (int i = 0;;) {
        const opt *o;
        const char *value;
        fp8t_opt_step st = fp8t_opt_next(&TRAIN_SPEC, argc, argv, &i, &o, &value, err, errlen);
        if (st == FP8T_OPT_END) break;
        if (st == FP8T_OPT_HELP) {
            rc = 1;
            goto done;
        }
        if (st == FP8T_OPT_LIST) {
            rc = 2;
            goto done;
        }
        if (st != FP8T_OPT_OPTION) goto done; /* err says why (no positionals here) */
        if (!strcmp(o->name, "config")) {
            config_path = value;
            continue;
        }
        pairs[n_pairs].o = o;
        pairs[n_pairs].value = value ? value : "1"; /* a flag alone */
        n_pairs++;
    }
    /* the preset, from the command line or else the config file, comes before any tweak */
    const arg_pair *preset = NULL;
    for (int i = 0; i < n_pairs; i++)
        if (pairs[i].o->set == set_preset) preset = &pairs[i];
    if (config_path) {
        size_t len;
        char e[FP8T_ERR_LEN];
        if (fp8t_read_file(config_path, &text, &len, e, sizeof(e)) != 0) {
            fp8t_errorf(err, errlen, "--config: %s", e);
            goto done;
        }
        json = cJSON_Parse(text);
        if (!cJSON_IsObject(json)) {
            fp8t_errorf(err, errlen,
                        "--config %s: not a JSON object (expected e.g. {\"precision\": "
                        "\"fp8\", \"overrides\": [\"layers=0,precision=bf16\"]})",
                        config_path);
            goto done;
        }
    }
    /* --init on the command line: its model is the base the model options then adjust (so
     * --layers 4 reads as "4 layers instead of SRC's 2", refused below) */
    for (int i = 0; i < n_pairs; i++) {
        if (strcmp(pairs[i].o->name, "init") != 0) continue;
        char e[FP8T_ERR_LEN];
        if (fp8t_weights_read_config(pairs[i].value, &c->model, e, sizeof(e)) != 0) {
            fp8t_errorf(err, errlen, "--init: %s", e);
            goto done;
        }
    }
    if (preset) {
        if (set_preset(c, preset->value, err, errlen) != 0) goto done;
        model_set = 1;
    }
    if (json) {
        char e[FP8T_ERR_LEN];
        if (apply_json_object(c, json, preset != NULL, &model_set, e, sizeof(e)) != 0) {
            fp8t_errorf(err, errlen, "--config %s: %s", config_path, e);
            goto done;
        }
    }
    {
        char e[FP8T_ERR_LEN];
        if (apply_env(c, e, sizeof(e)) != 0) {
            fp8t_errorf(err, errlen, "environment: %s", e);
            goto done;
        }
    }
    for (int i = 0; i < n_pairs; i++) {
        if (pairs[i].o->set == set_preset) continue;
        if (pairs[i].o->user & IS_MODEL) model_set = 1;
        if (fp8t_opt_set(pairs[i].o, c, pairs[i].value, err, errlen) != 0) goto done;
    }
    if (c->init[0] && adopt_init_model(c, model_set, err, errlen) != 0) goto done;
    if (c->resume[0] && !model_set && adopt_checkpoint_model(c, err, errlen) != 0) goto done;
    /* --tokenizer without --vocab: the model's vocabulary is the tokenizer's. A model given
     * otherwise (--vocab, a config's "model", --resume's checkpoint) keeps its own, and the data
     * loader says so if the tokenizer does not fit it. */
    int vocab_given = (c->resume[0] && !model_set) ||
                      (json && (cJSON_GetObjectItemCaseSensitive(json, "vocab") ||
                                cJSON_GetObjectItemCaseSensitive(json, "model")));
    for (int i = 0; i < n_pairs; i++)
        if (!strcmp(pairs[i].o->name, "vocab")) vocab_given = 1;
    if (c->tokenizer[0] && !vocab_given) {
        char e[FP8T_ERR_LEN];
        fp8t_bpe *t = fp8t_bpe_load(c->tokenizer, e, sizeof(e));
        if (!t) {
            fp8t_errorf(err, errlen, "--tokenizer: %s", e);
            goto done;
        }
        c->model.vocab_size = fp8t_bpe_vocab_size(t);
        fp8t_bpe_free(t);
    }
    rc = fp8t_train_config_check(c, err, errlen);
done:
    cJSON_Delete(json);
    free(text);
    free(pairs);
    return rc;
}

/* ---------------------------------------------------------------- help */

void fp8t_train_options_help(FILE *f) {
    fp8t_train_config d;
    fp8t_train_config_default(&d);
    fp8t_opt_help(f, &TRAIN_SPEC, &d);
}

void fp8t_train_options_list(FILE *f) { fp8t_opt_list(f, &TRAIN_SPEC); }

/* ---- the launcher's environment ---- */

static int env_int(const char *const *names, int dflt) {
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) {
            char *end;
            long x = strtol(v, &end, 10);
            if (end != v && *end == 0 && x >= 0 && x < INT_MAX) return (int)x;
        }
    }
    return dflt;
}

void fp8t_options_launch(fp8t_dist_launch *l) {
    static const char *const size_vars[] = {"OMPI_COMM_WORLD_SIZE",  "PMIX_SIZE",    "PMI_SIZE",
                                            "MPI_LOCALNRANKS_WORLD", "SLURM_NTASKS", NULL};
    static const char *const local_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                             "SLURM_LOCALID", NULL};
    l->size = 1;
    /* SLURM_NTASKS alone (an sbatch shell without srun) is not a launch of this process */
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") ||
        getenv("SLURM_PROCID")) {
        l->size = env_int(size_vars, 1);
        if (l->size < 1) l->size = 1;
    }
    l->local_rank = env_int(local_vars, 0);
    const char *t = getenv("FP8TRAIN_NCCL_TIMEOUT");
    l->nccl_timeout_s = t && atof(t) > 0 ? atof(t) : 300.0;
}
