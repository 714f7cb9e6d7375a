/* Model configuration: presets, validation, the parameter table (the checkpoint layout) and
 * the numbering of linear layers. Everything here is a pure function of the config. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fp8train/error.h"
#include "fp8train/model.h"

typedef struct {
    const char *name;
    fp8t_model_config cfg;
} preset;

static const preset PRESETS[] = {
    {"tiny",
     {.arch = FP8T_ARCH_GPT2,
      .n_layer = 4,
      .n_embd = 128,
      .n_head = 4,
      .seq_len = 128,
      .vocab_size = 256,
      .mlp_hidden = 512,
      .rope_theta = 10000.0f,
      .norm_eps = 1e-5f}},
    /* SwiGLU hidden ~ 8C/3 rounded up to a multiple of 128, as Llama does */
    {"tiny-llama",
     {.arch = FP8T_ARCH_LLAMA,
      .n_layer = 4,
      .n_embd = 128,
      .n_head = 4,
      .seq_len = 128,
      .vocab_size = 256,
      .mlp_hidden = 384,
      .rope_theta = 10000.0f,
      .norm_eps = 1e-5f}},
    {"gpt2-124m",
     {.arch = FP8T_ARCH_GPT2,
      .n_layer = 12,
      .n_embd = 768,
      .n_head = 12,
      .seq_len = 1024,
      .vocab_size = 50257,
      .mlp_hidden = 3072,
      .rope_theta = 10000.0f,
      .norm_eps = 1e-5f}},
    {"gpt2-350m",
     {.arch = FP8T_ARCH_GPT2,
      .n_layer = 24,
      .n_embd = 1024,
      .n_head = 16,
      .seq_len = 1024,
      .vocab_size = 50257,
      .mlp_hidden = 4096,
      .rope_theta = 10000.0f,
      .norm_eps = 1e-5f}},
    {"gpt2-1.5b",
     {.arch = FP8T_ARCH_GPT2,
      .n_layer = 48,
      .n_embd = 1600,
      .n_head = 25,
      .seq_len = 1024,
      .vocab_size = 50257,
      .mlp_hidden = 6400,
      .rope_theta = 10000.0f,
      .norm_eps = 1e-5f}},
    /* Llama-3.2-1B's shape: 8 KV heads, tied head, llama3 RoPE scaling (factor 32) */
    {"llama-1b",
     {.arch = FP8T_ARCH_LLAMA,
      .n_layer = 16,
      .n_embd = 2048,
      .n_head = 32,
      .seq_len = 2048,
      .vocab_size = 128256,
      .mlp_hidden = 8192,
      .rope_theta = 500000.0f,
      .norm_eps = 1e-5f,
      .n_kv_head = 8,
      .rope_scaling = {.type = FP8T_ROPE_LLAMA3,
                       .factor = 32.0f,
                       .low_freq_factor = 1.0f,
                       .high_freq_factor = 4.0f,
                       .original_max_pos = 8192}}},
    /* Llama-3.1-8B's shape (for memory planning): 8 KV heads, untied head, factor 8 */
    {"llama3-8b",
     {.arch = FP8T_ARCH_LLAMA,
      .n_layer = 32,
      .n_embd = 4096,
      .n_head = 32,
      .seq_len = 8192,
      .vocab_size = 128256,
      .mlp_hidden = 14336,
      .rope_theta = 500000.0f,
      .norm_eps = 1e-5f,
      .n_kv_head = 8,
      .untied_head = 1,
      .rope_scaling = {.type = FP8T_ROPE_LLAMA3,
                       .factor = 8.0f,
                       .low_freq_factor = 1.0f,
                       .high_freq_factor = 4.0f,
                       .original_max_pos = 8192}}},
};
#define N_PRESETS ((int)(sizeof(PRESETS) / sizeof(PRESETS[0])))

int fp8t_model_preset(fp8t_model_config *cfg, const char *name) {
    for (int i = 0; i < N_PRESETS; i++) {
        if (name && strcmp(name, PRESETS[i].name) == 0) {
            *cfg = PRESETS[i].cfg;
            return 0;
        }
    }
    return -1;
}

const char *fp8t_model_preset_names(void) {
    return "tiny, tiny-llama, gpt2-124m, gpt2-350m, gpt2-1.5b, llama-1b, llama3-8b";
}

const char *fp8t_arch_name(fp8t_arch a) {
    switch (a) {
    case FP8T_ARCH_GPT2: return "gpt2";
    case FP8T_ARCH_LLAMA: return "llama";
    }
    return "unknown";
}

int fp8t_arch_parse(fp8t_arch *out, const char *s) {
    const fp8t_arch all[] = {FP8T_ARCH_GPT2, FP8T_ARCH_LLAMA};
    for (size_t i = 0; s && i < sizeof(all) / sizeof(all[0]); i++)
        if (strcmp(s, fp8t_arch_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    return -1;
}

const char *fp8t_tensor_kind_name(fp8t_tensor_kind k) {
    static const char *names[FP8T_T_COUNT] = {"input",  "weight", "grad_output",
                                              "output", "dgrad",  "wgrad"};
    return (k >= 0 && k < FP8T_T_COUNT) ? names[k] : "unknown";
}

/* Parameter tensors per layer and outside layers, used to bound n_layer. */
static int tensors_per_layer(const fp8t_model_config *c) {
    return c->arch == FP8T_ARCH_GPT2 ? 12 : 7 + (c->qkv_bias != 0);
}
static int tensors_outside_layers(const fp8t_model_config *c) {
    return (c->arch == FP8T_ARCH_GPT2 ? 4 : 2) + (c->untied_head != 0);
}

int fp8t_model_kv_heads(const fp8t_model_config *c) {
    return c->n_kv_head > 0 ? c->n_kv_head : c->n_head;
}

int fp8t_model_qkv_dim(const fp8t_model_config *c) {
    return (c->n_head + 2 * fp8t_model_kv_heads(c)) * (c->n_embd / c->n_head);
}

/* Each size is bounded so that every product the model forms (B*T*V, V*C, ...) stays well
 * inside size_t and every GEMM dimension fits an int. */
#define MAX_DIM (1 << 20)

int fp8t_model_config_check(const fp8t_model_config *c, char *err, size_t errlen) {
#define BAD(...)                                                                                 \
    do {                                                                                         \
        if (err && errlen) fp8t_errorf(err, errlen, __VA_ARGS__);                                \
        return -1;                                                                               \
    } while (0)
    if (!c) BAD("model config is NULL");
    if (c->arch != FP8T_ARCH_GPT2 && c->arch != FP8T_ARCH_LLAMA)
        BAD("model.arch = %d is not a known architecture (expected gpt2 or llama)", (int)c->arch);
    if (c->n_layer <= 0) BAD("model.n_layer = %d must be positive", c->n_layer);
    int max_layers = (FP8T_MAX_PARAM_TENSORS - tensors_outside_layers(c)) / tensors_per_layer(c);
    if (c->n_layer > max_layers)
        BAD("model.n_layer = %d is too large: at most %d layers fit the %d-tensor parameter "
            "table of the %s architecture",
            c->n_layer, max_layers, FP8T_MAX_PARAM_TENSORS, fp8t_arch_name(c->arch));
    if (c->n_embd <= 0 || c->n_embd > MAX_DIM)
        BAD("model.n_embd = %d must be in 1..%d", c->n_embd, MAX_DIM);
    if (c->n_head <= 0 || c->n_head > c->n_embd)
        BAD("model.n_head = %d must be in 1..n_embd (%d)", c->n_head, c->n_embd);
    if (c->n_embd % c->n_head != 0)
        BAD("model.n_embd = %d must be divisible by model.n_head = %d (head size C/NH)",
            c->n_embd, c->n_head);
    if (c->arch == FP8T_ARCH_LLAMA && (c->n_embd / c->n_head) % 2 != 0)
        BAD("model head size n_embd/n_head = %d must be even for RoPE (rotates pairs)",
            c->n_embd / c->n_head);
    if (c->seq_len <= 0 || c->seq_len > MAX_DIM)
        BAD("model.seq_len = %d must be in 1..%d", c->seq_len, MAX_DIM);
    if (c->vocab_size <= 0 || c->vocab_size > MAX_DIM)
        BAD("model.vocab_size = %d must be in 1..%d", c->vocab_size, MAX_DIM);
    if (c->mlp_hidden <= 0 || c->mlp_hidden > MAX_DIM)
        BAD("model.mlp_hidden = %d must be in 1..%d", c->mlp_hidden, MAX_DIM);
    if (!(c->norm_eps > 0.0f) || !isfinite(c->norm_eps))
        BAD("model.norm_eps = %g must be a positive finite number (e.g. 1e-5)",
            (double)c->norm_eps);
    if (c->arch == FP8T_ARCH_LLAMA && (!(c->rope_theta > 0.0f) || !isfinite(c->rope_theta)))
        BAD("model.rope_theta = %g must be a positive finite number (e.g. 10000)",
            (double)c->rope_theta);
    if (c->n_kv_head < 0 || c->n_kv_head > c->n_head ||
        (c->n_kv_head && c->n_head % c->n_kv_head))
        BAD("model.n_kv_head = %d must divide model.n_head = %d (grouped-query attention: "
            "1 = multi-query, n_head or 0 = multi-head)",
            c->n_kv_head, c->n_head);
    /* GPT-2 checkpoints never group their heads; its fused c_attn layout has no place for it */
    if (c->arch == FP8T_ARCH_GPT2 && c->n_kv_head && c->n_kv_head != c->n_head)
        BAD("model.n_kv_head = %d: grouped-query attention is for the llama architecture; "
            "GPT-2 has n_kv_head = n_head (%d) (use --arch llama, or drop --kv-heads)",
            c->n_kv_head, c->n_head);
    if (c->untied_head != 0 && c->untied_head != 1)
        BAD("model.untied_head = %d must be 0 (LM head tied to wte) or 1 (own lm_head.w)",
            c->untied_head);
    if (c->qkv_bias != 0 && c->qkv_bias != 1)
        BAD("model.qkv_bias = %d must be 0 or 1", c->qkv_bias);
    if (c->arch == FP8T_ARCH_LLAMA) {
        const fp8t_rope_scaling *r = &c->rope_scaling;
        if (r->type != FP8T_ROPE_DEFAULT && r->type != FP8T_ROPE_LLAMA3)
            BAD("model.rope_scaling.type = %d is not known (0 = none, 1 = llama3)", (int)r->type);
        if (r->type == FP8T_ROPE_LLAMA3) {
            if (!(r->factor > 0.0f) || !isfinite(r->factor))
                BAD("model.rope_scaling.factor = %g must be a positive finite number (llama3: "
                    "e.g. 8 or 32)",
                    (double)r->factor);
            if (!(r->low_freq_factor > 0.0f) || !isfinite(r->high_freq_factor) ||
                !(r->high_freq_factor > r->low_freq_factor))
                BAD("model.rope_scaling low_freq_factor = %g, high_freq_factor = %g: llama3 "
                    "needs 0 < low_freq_factor < high_freq_factor (e.g. 1 and 4)",
                    (double)r->low_freq_factor, (double)r->high_freq_factor);
            if (r->original_max_pos <= 0)
                BAD("model.rope_scaling.original_max_pos = %d must be positive (llama3: the "
                    "pre-training context, e.g. 8192)",
                    r->original_max_pos);
        }
    }
    return 0;
#undef BAD
}

int fp8t_model_modules_per_layer(const fp8t_model_config *cfg) {
    return cfg->arch == FP8T_ARCH_LLAMA ? 5 : 4;
}

fp8t_module fp8t_model_module_of_slot(const fp8t_model_config *cfg, int slot) {
    static const fp8t_module gpt2[4] = {FP8T_MOD_QKV, FP8T_MOD_PROJ, FP8T_MOD_FC1, FP8T_MOD_FC2};
    static const fp8t_module llama[5] = {FP8T_MOD_QKV, FP8T_MOD_PROJ, FP8T_MOD_GATE, FP8T_MOD_UP,
                                         FP8T_MOD_DOWN};
    if (cfg->arch == FP8T_ARCH_LLAMA)
        return (slot >= 0 && slot < 5) ? llama[slot] : FP8T_MOD_HEAD;
    return (slot >= 0 && slot < 4) ? gpt2[slot] : FP8T_MOD_HEAD;
}

int fp8t_model_num_linears(const fp8t_model_config *cfg) {
    return cfg->n_layer * fp8t_model_modules_per_layer(cfg) + 1;
}

/* Appends one tensor to the table (when info is non-NULL) and advances the running offset. */
static void add_tensor(fp8t_param_info *info, int *count, size_t *offset, const char *name,
                       int layer, int rows, int cols) {
    size_t numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    if (info) {
        fp8t_param_info *p = &info[*count];
        memset(p, 0, sizeof(*p));
        if (layer >= 0)
            snprintf(p->name, sizeof(p->name), "h.%d.%s", layer, name);
        else
            snprintf(p->name, sizeof(p->name), "%s", name);
        p->ndim = cols > 0 ? 2 : 1;
        p->shape[0] = rows;
        p->shape[1] = cols > 0 ? cols : 0;
        p->offset = *offset;
        p->numel = numel;
        p->layer = layer;
        p->decay = cols > 0; /* weight decay on matrices only, not on norms and biases */
    }
    (*count)++;
    *offset += numel;
}

int fp8t_model_param_table(const fp8t_model_config *cfg, fp8t_param_info *info, size_t *total) {
    const int C = cfg->n_embd, H = cfg->mlp_hidden, V = cfg->vocab_size, L = cfg->n_layer;
    const int QKV = fp8t_model_qkv_dim(cfg);
    int count = 0;
    size_t off = 0;
    add_tensor(info, &count, &off, "wte", -1, V, C);
    if (cfg->arch == FP8T_ARCH_GPT2) {
        add_tensor(info, &count, &off, "wpe", -1, cfg->seq_len, C);
        for (int l = 0; l < L; l++) {
            add_tensor(info, &count, &off, "ln1.w", l, C, 0);
            add_tensor(info, &count, &off, "ln1.b", l, C, 0);
            add_tensor(info, &count, &off, "qkv.w", l, 3 * C, C);
            add_tensor(info, &count, &off, "qkv.b", l, 3 * C, 0);
            add_tensor(info, &count, &off, "proj.w", l, C, C);
            add_tensor(info, &count, &off, "proj.b", l, C, 0);
            add_tensor(info, &count, &off, "ln2.w", l, C, 0);
            add_tensor(info, &count, &off, "ln2.b", l, C, 0);
            add_tensor(info, &count, &off, "fc1.w", l, H, C);
            add_tensor(info, &count, &off, "fc1.b", l, H, 0);
            add_tensor(info, &count, &off, "fc2.w", l, C, H);
            add_tensor(info, &count, &off, "fc2.b", l, C, 0);
        }
        add_tensor(info, &count, &off, "lnf.w", -1, C, 0);
        add_tensor(info, &count, &off, "lnf.b", -1, C, 0);
    } else {
        for (int l = 0; l < L; l++) {
            add_tensor(info, &count, &off, "ln1.w", l, C, 0);
            /* rows: q (NH*HS), then k and v (NKV*HS each) */
            add_tensor(info, &count, &off, "qkv.w", l, QKV, C);
            if (cfg->qkv_bias) add_tensor(info, &count, &off, "qkv.b", l, QKV, 0);
            add_tensor(info, &count, &off, "proj.w", l, C, C);
            add_tensor(info, &count, &off, "ln2.w", l, C, 0);
            add_tensor(info, &count, &off, "gate.w", l, H, C);
            add_tensor(info, &count, &off, "up.w", l, H, C);
            add_tensor(info, &count, &off, "down.w", l, C, H);
        }
        add_tensor(info, &count, &off, "lnf.w", -1, C, 0);
    }
    /* the untied LM head comes last, so a tied model's table is the prefix of an untied one */
    if (cfg->untied_head) add_tensor(info, &count, &off, "lm_head.w", -1, V, C);
    if (total) *total = off;
    return count;
}
