/* The Hugging Face name and layout of every fp8train parameter tensor (GPT2LMHeadModel,
 * LlamaForCausalLM and Qwen2ForCausalLM, which share Llama's names), shared by the export and the import so the two can never disagree.
 *
 * GPT-2's transformers implementation uses Conv1D modules whose weight is [in, out]: the
 * transpose of our nn.Linear-style [out, in]. Llama uses nn.Linear [out, in] like us; our
 * fused qkv [(NH + 2 NKV) HS, C] holds q | k | v by rows (q [NH, HS], k and v [NKV, HS] per
 * token), which is exactly torch.cat([q_proj, k_proj, v_proj]) of the Hugging Face weights;
 * Qwen2's q/k/v biases concatenate the same way into qkv.b. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/export.h"

typedef struct {
    fp8t_hf_tensor *map;
    int count;
} map_builder;

static void add(map_builder *b, const fp8t_param_info *info, int param, const char *name,
                fp8t_hf_transform tr, int row0, int rows, int lin) {
    if (b->map) {
        fp8t_hf_tensor *t = &b->map[b->count];
        memset(t, 0, sizeof(*t));
        snprintf(t->name, sizeof(t->name), "%s", name);
        const fp8t_param_info *p = &info[param];
        t->ndim = p->ndim;
        t->param = param;
        t->transform = tr;
        t->row0 = row0;
        t->rows = rows;
        t->lin = lin;
        if (p->ndim == 1) {
            t->shape[0] = tr == FP8T_HF_ROWS ? rows : p->shape[0]; /* a slice of a bias */
        } else if (tr == FP8T_HF_TRANSPOSE) {
            t->shape[0] = p->shape[1];
            t->shape[1] = p->shape[0];
        } else if (tr == FP8T_HF_ROWS) {
            t->shape[0] = rows;
            t->shape[1] = p->shape[1];
        } else {
            t->shape[0] = p->shape[0];
            t->shape[1] = p->shape[1];
        }
        if (lin >= 0) {
            /* "x.y.weight" -> module "x.y" (the prefix of its scale tensors) */
            snprintf(t->module, sizeof(t->module), "%s", name);
            char *dot = strrchr(t->module, '.');
            if (dot) *dot = 0;
        }
    }
    b->count++;
}

/* Index of our tensor `name` ("h.3.qkv.w", "wte") in the table, -1 if absent. */
static int find(const fp8t_param_info *info, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(info[i].name, name) == 0) return i;
    return -1;
}

int fp8t_hf_tensor_map(const fp8t_model_config *cfg, fp8t_hf_tensor *map) {
    int n = fp8t_model_param_table(cfg, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)n, sizeof(*info));
    if (!info) return -1;
    fp8t_model_param_table(cfg, info, NULL);
    map_builder b = {map, 0};
    const int C = cfg->n_embd, mpl = fp8t_model_modules_per_layer(cfg);
    const int NH = cfg->n_head, HS = C / NH, NKV = cfg->n_kv_head > 0 ? cfg->n_kv_head : NH;
    char hf[128], ours[64];
#define P(fmt_ours, ...)                                                                         \
    (snprintf(ours, sizeof(ours), fmt_ours, __VA_ARGS__), find(info, n, ours))
    if (cfg->arch == FP8T_ARCH_GPT2) {
        add(&b, info, find(info, n, "wte"), "transformer.wte.weight", FP8T_HF_COPY, 0, 0, -1);
        add(&b, info, find(info, n, "wpe"), "transformer.wpe.weight", FP8T_HF_COPY, 0, 0, -1);
        for (int l = 0; l < cfg->n_layer; l++) {
            /* ours, HF suffix, transform, linear slot (-1: not a linear weight) */
            static const struct {
                const char *ours, *hf;
                fp8t_hf_transform tr;
                int slot;
            } G[] = {
                {"ln1.w", "ln_1.weight", FP8T_HF_COPY, -1},
                {"ln1.b", "ln_1.bias", FP8T_HF_COPY, -1},
                {"qkv.w", "attn.c_attn.weight", FP8T_HF_TRANSPOSE, 0},
                {"qkv.b", "attn.c_attn.bias", FP8T_HF_COPY, -1},
                {"proj.w", "attn.c_proj.weight", FP8T_HF_TRANSPOSE, 1},
                {"proj.b", "attn.c_proj.bias", FP8T_HF_COPY, -1},
                {"ln2.w", "ln_2.weight", FP8T_HF_COPY, -1},
                {"ln2.b", "ln_2.bias", FP8T_HF_COPY, -1},
                {"fc1.w", "mlp.c_fc.weight", FP8T_HF_TRANSPOSE, 2},
                {"fc1.b", "mlp.c_fc.bias", FP8T_HF_COPY, -1},
                {"fc2.w", "mlp.c_proj.weight", FP8T_HF_TRANSPOSE, 3},
                {"fc2.b", "mlp.c_proj.bias", FP8T_HF_COPY, -1},
            };
            for (size_t k = 0; k < sizeof(G) / sizeof(G[0]); k++) {
                snprintf(hf, sizeof(hf), "transformer.h.%d.%s", l, G[k].hf);
                add(&b, info, P("h.%d.%s", l, G[k].ours), hf, G[k].tr, 0, 0,
                    G[k].slot >= 0 ? l * mpl + G[k].slot : -1);
            }
        }
        add(&b, info, find(info, n, "lnf.w"), "transformer.ln_f.weight", FP8T_HF_COPY, 0, 0, -1);
        add(&b, info, find(info, n, "lnf.b"), "transformer.ln_f.bias", FP8T_HF_COPY, 0, 0, -1);
    } else {
        add(&b, info, find(info, n, "wte"), "model.embed_tokens.weight", FP8T_HF_COPY, 0, 0, -1);
        for (int l = 0; l < cfg->n_layer; l++) {
            const int lin0 = l * mpl;
            snprintf(hf, sizeof(hf), "model.layers.%d.input_layernorm.weight", l);
            add(&b, info, P("h.%d.ln1.w", l), hf, FP8T_HF_COPY, 0, 0, -1);
            /* q, k, v: the row blocks [0, NH*HS), [NH*HS, (NH+NKV)*HS), [(NH+NKV)*HS, ...) of
             * our fused qkv (weight and, for Qwen2, bias) */
            static const char *QKV[3] = {"q_proj", "k_proj", "v_proj"};
            const int row0[3] = {0, NH * HS, (NH + NKV) * HS};
            const int rows[3] = {NH * HS, NKV * HS, NKV * HS};
            for (int s = 0; s < 3; s++) {
                snprintf(hf, sizeof(hf), "model.layers.%d.self_attn.%s.weight", l, QKV[s]);
                add(&b, info, P("h.%d.qkv.w", l), hf, FP8T_HF_ROWS, row0[s], rows[s], lin0 + 0);
            }
            if (cfg->qkv_bias) {
                for (int s = 0; s < 3; s++) {
                    snprintf(hf, sizeof(hf), "model.layers.%d.self_attn.%s.bias", l, QKV[s]);
                    add(&b, info, P("h.%d.qkv.b", l), hf, FP8T_HF_ROWS, row0[s], rows[s], -1);
                }
            }
            snprintf(hf, sizeof(hf), "model.layers.%d.self_attn.o_proj.weight", l);
            add(&b, info, P("h.%d.proj.w", l), hf, FP8T_HF_COPY, 0, 0, lin0 + 1);
            snprintf(hf, sizeof(hf), "model.layers.%d.post_attention_layernorm.weight", l);
            add(&b, info, P("h.%d.ln2.w", l), hf, FP8T_HF_COPY, 0, 0, -1);
            snprintf(hf, sizeof(hf), "model.layers.%d.mlp.gate_proj.weight", l);
            add(&b, info, P("h.%d.gate.w", l), hf, FP8T_HF_COPY, 0, 0, lin0 + 2);
            snprintf(hf, sizeof(hf), "model.layers.%d.mlp.up_proj.weight", l);
            add(&b, info, P("h.%d.up.w", l), hf, FP8T_HF_COPY, 0, 0, lin0 + 3);
            snprintf(hf, sizeof(hf), "model.layers.%d.mlp.down_proj.weight", l);
            add(&b, info, P("h.%d.down.w", l), hf, FP8T_HF_COPY, 0, 0, lin0 + 4);
        }
        add(&b, info, find(info, n, "lnf.w"), "model.norm.weight", FP8T_HF_COPY, 0, 0, -1);
    }
    /* an untied head: its own [V, C] matrix, BF16 like the embedding in an FP8 export (lin -1:
     * the head's GEMM runs in BF16 by default and transformers' FP8 loaders skip lm_head) */
    if (cfg->untied_head)
        add(&b, info, find(info, n, "lm_head.w"), "lm_head.weight", FP8T_HF_COPY, 0, 0, -1);
#undef P
    free(info);
    return b.count;
}

size_t fp8t_llmc_param_offsets(const fp8t_model_config *cfg, size_t padded_vocab,
                               size_t *offset) {
    int n = fp8t_model_param_table(cfg, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)n, sizeof(*info));
    if (!info) return 0;
    fp8t_model_param_table(cfg, info, NULL);
    /* our table: wte, wpe, 12 tensors per layer in the order llm.c stacks them (ln1w ln1b qkvw
     * qkvb projw projb ln2w ln2b fcw fcb fcprojw fcprojb), lnf.w, lnf.b */
    const size_t C = (size_t)cfg->n_embd, L = (size_t)cfg->n_layer;
    size_t at = 0;
    offset[0] = at; /* wte: the first V of llm.c's Vp rows */
    at += padded_vocab * C;
    offset[1] = at;
    at += info[1].numel;
    for (size_t k = 0; k < 12; k++) {
        for (size_t l = 0; l < L; l++) {
            offset[2 + l * 12 + k] = at;
            at += info[2 + l * 12 + k].numel;
        }
    }
    offset[n - 2] = at;
    at += info[n - 2].numel;
    offset[n - 1] = at;
    at += info[n - 1].numel;
    free(info);
    return at;
}

const char *fp8t_export_dtype_name(fp8t_export_dtype d) {
    switch (d) {
    case FP8T_EXPORT_BF16: return "bf16";
    case FP8T_EXPORT_FP8: return "fp8";
    case FP8T_EXPORT_FP32: return "fp32";
    }
    return "unknown";
}

int fp8t_export_dtype_parse(fp8t_export_dtype *out, const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))
        *out = FP8T_EXPORT_BF16;
    else if (!strcmp(s, "fp8") || !strcmp(s, "e4m3") || !strcmp(s, "fp8-e4m3"))
        *out = FP8T_EXPORT_FP8;
    else if (!strcmp(s, "fp32") || !strcmp(s, "float32") || !strcmp(s, "f32"))
        *out = FP8T_EXPORT_FP32;
    else
        return -1;
    return 0;
}
