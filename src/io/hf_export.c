/* Export: a Hugging Face directory (config.json + model.safetensors) in FP32, BF16 or FP8
 * E4M3 with per-tensor or 128x128 block scales, and llm.c GPT-2 checkpoints.
 *
 * FP8 layout, per linear weight "<m>.weight" (m = e.g. model.layers.0.mlp.up_proj):
 *   <m>.weight            F8_E4M3, the Hugging Face shape (GPT-2 Conv1D: [in, out])
 *   <m>.weight_scale_inv  F32 [1]  weight ≈ float(fp8) * weight_scale_inv; the scale comes from
 *                                  the weight's own amax (current scaling: 448 / amax)
 *   <m>.input_scale       F32 [1]  x_fp8 = x / input_scale: the activation scale learned in
 *                                  training, max(amax history of the layer's input) / 448
 * Per-tensor scales do not depend on the orientation, so the transposed Conv1D matrix holds
 * exactly the codes of our [out, in] matrix, transposed.
 *
 * Block-scaled FP8 (fp8_block 128, transformers' fine-grained FP8 layout, Llama/Qwen2 only):
 *   <m>.weight            F8_E4M3 [N, K]
 *   <m>.weight_scale_inv  F32 [ceil(N/128), ceil(K/128)]  weight ≈ float(fp8) * scale_inv of its
 *                                  128x128 block; codes and scales come from fp8t_block_quantize
 *                                  (the `block` precision's weight rule: scale = 448 / block amax)
 * and no input_scale: activation_scheme "dynamic", the runtime scales each 1x128 activation tile
 * itself. Each HF matrix is quantized in its own layout (q/k/v separately), as a loader reads it. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "fp8train/export.h"
#include "fp8train/fp8.h"
#include "fp8train/io.h"
#include "fp8train/recipe.h"
#include "util/fs.h" /* fp8t_is_regular_file */

/* The parameter table of w, after checking that w's buffer matches its config. */
static fp8t_param_info *checked_table(const fp8t_weights *w, int *count, char *err,
                                      size_t errlen) {
    char e[FP8T_ERR_LEN];
    if (!w || !w->params) {
        fp8t_errorf(err, errlen, "export: no weights given");
        return NULL;
    }
    if (fp8t_model_config_check(&w->model, e, sizeof(e)) != 0) {
        fp8t_errorf(err, errlen, "export: invalid model config: %s", e);
        return NULL;
    }
    size_t total;
    int n = fp8t_model_param_table(&w->model, NULL, &total);
    if (total != w->num_params) {
        fp8t_errorf(err, errlen,
                    "export: the model config needs %zu parameters but %zu were given", total,
                    w->num_params);
        return NULL;
    }
    fp8t_param_info *info = calloc((size_t)n, sizeof(*info));
    if (!info) {
        fp8t_errorf(err, errlen, "export: out of memory");
        return NULL;
    }
    fp8t_model_param_table(&w->model, info, NULL);
    /* a NaN or Inf would be exported silently and poison every consumer */
    for (int i = 0; i < n; i++) {
        const float *x = w->params + info[i].offset;
        for (size_t j = 0; j < info[i].numel; j++) {
            if (!isfinite(x[j])) {
                fp8t_errorf(err, errlen,
                            "export: parameter '%s' holds a non-finite value (%g at "
                            "element %zu); export a checkpoint from before the run diverged",
                            info[i].name, (double)x[j], j);
                free(info);
                return NULL;
            }
        }
    }
    *count = n;
    return info;
}

/* The Hugging Face tensor t as FP32 in its Hugging Face layout, into out. */
static void gather(float *out, const fp8t_hf_tensor *t, const fp8t_param_info *p,
                   const float *params) {
    const float *src = params + p->offset;
    if (t->transform == FP8T_HF_TRANSPOSE) {
        const int R = p->shape[0], Cc = p->shape[1]; /* ours [R, Cc] -> HF [Cc, R] */
        for (int r = 0; r < R; r++)
            for (int c = 0; c < Cc; c++) out[(size_t)c * R + r] = src[(size_t)r * Cc + c];
    } else if (t->transform == FP8T_HF_ROWS) {
        const size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : 1; /* 1: a bias slice */
        memcpy(out, src + (size_t)t->row0 * cols, (size_t)t->rows * cols * sizeof(float));
    } else {
        memcpy(out, src, p->numel * sizeof(float));
    }
}

static size_t numel_of(const fp8t_hf_tensor *t) {
    return (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
}

/* The learned input scale of linear `lin`: max(amax history of its X) / 448, or the state's
 * scale_inv when the history is empty (counted as a fallback). */
static float input_scale(const fp8t_weights *w, int lin, int *fallback) {
    const int n_lin = fp8t_model_num_linears(&w->model);
    if (!w->fp8_state || w->fp8_n != 3 * n_lin || w->fp8_len < 1) {
        *fallback = 1;
        return 1.0f;
    }
    fp8t_recipe_state st;
    fp8t_recipe_state_view(&st, w->fp8_state, w->fp8_n, w->fp8_len);
    const int t = lin * 3 + FP8T_ROLE_X;
    float hmax = fp8t_recipe_history_max(&st, t);
    if (hmax > 0.0f && isfinite(hmax)) {
        *fallback = 0;
        return hmax / FP8_E4M3_MAX;
    }
    *fallback = 1;
    float si = st.scale_inv[t];
    return (si > 0.0f && isfinite(si)) ? si : 1.0f;
}

/* A float as the shortest decimal that reads back as it (1e-05, not 9.99999974737875e-06). */
static double clean(float x) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%.9g", (double)x);
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, (double)x);
        if ((float)strtod(buf, NULL) == x) break;
    }
    return strtod(buf, NULL);
}

/* How both architectures' config.json begin: the transformers class, model_type and
 * vocab_size. */
static void add_model_kind(cJSON *o, const char *cls, const char *model_type, int vocab_size) {
    cJSON *a = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(cls));
    cJSON_AddStringToObject(o, "model_type", model_type);
    cJSON_AddNumberToObject(o, "vocab_size", vocab_size);
}

static cJSON *config_json(const fp8t_weights *w, fp8t_export_dtype dtype, int block, int pow2) {
    const fp8t_model_config *c = &w->model;
    cJSON *o = cJSON_CreateObject();
    const char *torch_dtype = dtype == FP8T_EXPORT_FP32 ? "float32" : "bfloat16";
    /* GPT-2's tokenizer has <|endoftext|> = 50256; other vocabularies have no known EOS */
    const int gpt2_vocab = c->vocab_size == 50257;
    if (c->arch == FP8T_ARCH_GPT2) {
        add_model_kind(o, "GPT2LMHeadModel", "gpt2", c->vocab_size);
        cJSON_AddNumberToObject(o, "n_positions", c->seq_len);
        cJSON_AddNumberToObject(o, "n_ctx", c->seq_len);
        cJSON_AddNumberToObject(o, "n_embd", c->n_embd);
        cJSON_AddNumberToObject(o, "n_layer", c->n_layer);
        cJSON_AddNumberToObject(o, "n_head", c->n_head);
        cJSON_AddNumberToObject(o, "n_inner", c->mlp_hidden);
        cJSON_AddStringToObject(o, "activation_function", "gelu_new");
        cJSON_AddNumberToObject(o, "layer_norm_epsilon", clean(c->norm_eps));
        cJSON_AddNumberToObject(o, "resid_pdrop", 0);
        cJSON_AddNumberToObject(o, "embd_pdrop", 0);
        cJSON_AddNumberToObject(o, "attn_pdrop", 0);
        cJSON_AddBoolToObject(o, "scale_attn_weights", 1);
        cJSON_AddBoolToObject(o, "scale_attn_by_inverse_layer_idx", 0);
        cJSON_AddBoolToObject(o, "reorder_and_upcast_attn", 0);
    } else {
        /* q/k/v biases are Qwen2's architecture (Llama's attention_bias would add o_proj's) */
        const int qwen2 = c->qkv_bias != 0;
        add_model_kind(o, qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM",
                       qwen2 ? "qwen2" : "llama", c->vocab_size);
        cJSON_AddNumberToObject(o, "hidden_size", c->n_embd);
        cJSON_AddNumberToObject(o, "intermediate_size", c->mlp_hidden);
        cJSON_AddNumberToObject(o, "num_hidden_layers", c->n_layer);
        cJSON_AddNumberToObject(o, "num_attention_heads", c->n_head);
        cJSON_AddNumberToObject(o, "num_key_value_heads",
                                c->n_kv_head > 0 ? c->n_kv_head : c->n_head);
        cJSON_AddNumberToObject(o, "head_dim", c->n_embd / c->n_head);
        cJSON_AddNumberToObject(o, "max_position_embeddings", c->seq_len);
        cJSON_AddNumberToObject(o, "rms_norm_eps", clean(c->norm_eps));
        /* rope_theta + rope_scaling: what transformers 4.x reads and newer versions still
         * accept (they fold both into rope_parameters on load) */
        cJSON_AddNumberToObject(o, "rope_theta", clean(c->rope_theta));
        if (c->rope_scaling.type == FP8T_ROPE_LLAMA3) {
            cJSON *r = cJSON_AddObjectToObject(o, "rope_scaling");
            cJSON_AddStringToObject(r, "rope_type", "llama3");
            cJSON_AddNumberToObject(r, "factor", clean(c->rope_scaling.factor));
            cJSON_AddNumberToObject(r, "low_freq_factor", clean(c->rope_scaling.low_freq_factor));
            cJSON_AddNumberToObject(r, "high_freq_factor",
                                    clean(c->rope_scaling.high_freq_factor));
            cJSON_AddNumberToObject(r, "original_max_position_embeddings",
                                    c->rope_scaling.original_max_pos);
        } else {
            cJSON_AddNullToObject(o, "rope_scaling");
        }
        cJSON_AddStringToObject(o, "hidden_act", "silu");
        if (qwen2) {
            cJSON_AddBoolToObject(o, "use_sliding_window", 0);
            cJSON_AddNumberToObject(o, "sliding_window", c->seq_len);
            cJSON_AddNumberToObject(o, "max_window_layers", c->n_layer);
        } else {
            cJSON_AddBoolToObject(o, "attention_bias", 0);
            cJSON_AddBoolToObject(o, "mlp_bias", 0);
            cJSON_AddNumberToObject(o, "pretraining_tp", 1);
        }
        cJSON_AddNumberToObject(o, "attention_dropout", 0);
    }
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    if (gpt2_vocab) {
        cJSON_AddNumberToObject(o, "bos_token_id", 50256);
        cJSON_AddNumberToObject(o, "eos_token_id", 50256);
    } else {
        cJSON_AddNullToObject(o, "bos_token_id");
        cJSON_AddNullToObject(o, "eos_token_id");
    }
    cJSON_AddBoolToObject(o, "tie_word_embeddings", !c->untied_head);
    cJSON_AddBoolToObject(o, "use_cache", 1);
    cJSON_AddStringToObject(o, "torch_dtype", torch_dtype);
    if (dtype == FP8T_EXPORT_FP8 && block > 0) {
        /* what transformers' FineGrainedFP8Config reads (and DeepSeek-V3 ships): FP8Linear for
         * every nn.Linear but lm_head, dynamic 1x128 activation scales at run time */
        cJSON *q = cJSON_AddObjectToObject(o, "quantization_config");
        cJSON_AddStringToObject(q, "quant_method", "fp8");
        cJSON_AddStringToObject(q, "fmt", "e4m3");
        cJSON_AddStringToObject(q, "activation_scheme", "dynamic");
        cJSON *bs = cJSON_AddArrayToObject(q, "weight_block_size");
        cJSON_AddItemToArray(bs, cJSON_CreateNumber(block));
        cJSON_AddItemToArray(bs, cJSON_CreateNumber(block));
        cJSON *skip = cJSON_AddArrayToObject(q, "modules_to_not_convert");
        cJSON_AddItemToArray(skip, cJSON_CreateString("lm_head"));
    } else if (dtype == FP8T_EXPORT_FP8) {
        cJSON *q = cJSON_AddObjectToObject(o, "quantization_config");
        cJSON_AddStringToObject(q, "quant_method", "fp8");
        cJSON_AddStringToObject(q, "fmt", "e4m3");
        cJSON_AddStringToObject(q, "activation_scheme", "static");
        cJSON_AddStringToObject(q, "weight_scheme", "per-tensor");
        cJSON_AddNullToObject(q, "weight_block_size");
        cJSON_AddStringToObject(q, "weight_scale_name", "weight_scale_inv");
        cJSON_AddStringToObject(q, "weight_scale_semantics",
                                "weight = float(fp8) * weight_scale_inv; scale from the weight's "
                                "own amax (current scaling)");
        cJSON_AddStringToObject(q, "input_scale_semantics",
                                "x_fp8 = x / input_scale; input_scale = max(training amax "
                                "history) / 448 (delayed scaling)");
        if (c->arch == FP8T_ARCH_GPT2)
            cJSON_AddStringToObject(q, "weight_orientation",
                                    "Conv1D [in, out], as transformers stores GPT-2 weights");
        cJSON *skip = cJSON_AddArrayToObject(q, "modules_to_not_convert");
        cJSON_AddItemToArray(skip, cJSON_CreateString("lm_head"));
    }
    cJSON *f = cJSON_AddObjectToObject(o, "fp8train");
    cJSON_AddStringToObject(f, "arch", fp8t_arch_name(c->arch));
    cJSON_AddStringToObject(f, "export_dtype", fp8t_export_dtype_name(dtype));
    if (dtype == FP8T_EXPORT_FP8) {
        char how[160];
        snprintf(how, sizeof(how), "%s: scale_inv = 1 / %s(448 / %samax)",
                 block > 0 ? "128x128 blocks" : "per tensor", pow2 ? "pow2_floor" : "",
                 block > 0 ? "block " : "");
        cJSON_AddStringToObject(f, "fp8_weight_scales", how);
    }
    cJSON_AddNumberToObject(f, "step", w->step);
    if (w->source[0]) cJSON_AddStringToObject(f, "source", w->source);
    return o;
}

/* "<module>.<what>": one FP32 value, shape [1] (the scales beside an FP8 weight) */
static void add_module_scalar(fp8t_st_writer *wr, const char *module, const char *what,
                              float value) {
    char name[160];
    const int64_t one = 1;
    snprintf(name, sizeof(name), "%s.%s", module, what);
    fp8t_st_writer_add(wr, name, FP8T_ST_F32, 1, &one, &value);
}

/* Scale blocks of a 2-D HF tensor t under block edge b: ceil(rows/b) * ceil(cols/b). */
static size_t n_blocks(const fp8t_hf_tensor *t, int b) {
    const size_t r = (size_t)t->shape[0], c = (size_t)(t->ndim == 2 ? t->shape[1] : 1);
    return ((r + (size_t)b - 1) / (size_t)b) * ((c + (size_t)b - 1) / (size_t)b);
}

/* Bytes tensor t takes in the file (an FP8 weight brings two F32 [1] scales, or one F32 per
 * block). */
static size_t stored_bytes(const fp8t_hf_tensor *t, fp8t_export_dtype dtype, int block) {
    const size_t n = numel_of(t);
    if (dtype == FP8T_EXPORT_FP32) return 4 * n;
    if (dtype == FP8T_EXPORT_FP8 && t->lin >= 0)
        return n + (block > 0 ? 4 * n_blocks(t, block) : 8);
    return 2 * n;
}

/* model.safetensors.index.json as transformers writes it: total_size and the weight_map. */
static int write_index(const char *dir, const fp8t_hf_tensor *map, int n, const int *shard,
                       int n_shards, fp8t_export_dtype dtype, int block, size_t total, char *err,
                       size_t errlen) {
    cJSON *o = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(o, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON *wm = cJSON_AddObjectToObject(o, "weight_map");
    char file[64], name[192];
    for (int i = 0; i < n; i++) {
        snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", shard[i] + 1, n_shards);
        cJSON_AddStringToObject(wm, map[i].name, file);
        if (dtype == FP8T_EXPORT_FP8 && map[i].lin >= 0) {
            snprintf(name, sizeof(name), "%s.weight_scale_inv", map[i].module);
            cJSON_AddStringToObject(wm, name, file);
            if (block > 0) continue; /* dynamic activations: no input_scale */
            snprintf(name, sizeof(name), "%s.input_scale", map[i].module);
            cJSON_AddStringToObject(wm, name, file);
        }
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    char path[4200];
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    int rc = text ? fp8t_write_file_atomic(path, text, strlen(text), err, errlen)
                  : fp8t_errorf(err, errlen, "export: out of memory");
    free(text);
    return rc;
}

int fp8t_export_hf(const fp8t_weights *w, const char *dir, fp8t_export_dtype dtype,
                   fp8t_export_report *rep, char *err, size_t errlen) {
    return fp8t_export_hf_sharded(w, dir, dtype, 0, rep, err, errlen);
}

int fp8t_export_hf_sharded(const fp8t_weights *w, const char *dir, fp8t_export_dtype dtype,
                           size_t max_shard_bytes, fp8t_export_report *rep, char *err,
                           size_t errlen) {
    fp8t_export_options o = {dtype, max_shard_bytes, 0, 0};
    return fp8t_export_hf_opts(w, dir, &o, rep, err, errlen);
}

int fp8t_export_options_check(const fp8t_model_config *c, const fp8t_export_options *o, char *err,
                              size_t errlen) {
    const fp8t_export_dtype dtype = o->dtype;
    if (dtype != FP8T_EXPORT_BF16 && dtype != FP8T_EXPORT_FP8 && dtype != FP8T_EXPORT_FP32)
        return fp8t_errorf(err, errlen, "export: unknown dtype %d (bf16, fp8 or fp32)",
                           (int)dtype);
    if (o->pow2_scales && dtype != FP8T_EXPORT_FP8)
        return fp8t_errorf(err, errlen,
                           "export: power-of-two scales (--pow2-scales) need --dtype "
                           "fp8 (this export's dtype is %s)",
                           fp8t_export_dtype_name(dtype));
    if (o->fp8_block == 0) return 0;
    if (dtype != FP8T_EXPORT_FP8)
        return fp8t_errorf(err, errlen,
                           "export: block scales (--block %d) need --dtype fp8 "
                           "(this export's dtype is %s)",
                           o->fp8_block, fp8t_export_dtype_name(dtype));
    if (o->fp8_block != FP8T_EXPORT_FP8_BLOCK)
        return fp8t_errorf(err, errlen,
                           "export: --block %d is not supported: the block-scaled "
                           "FP8 layout uses %dx%d weight blocks (the DeepSeek-V3 blocks of the "
                           "`block` precision, and the size transformers' FP8 kernels take)",
                           o->fp8_block, FP8T_EXPORT_FP8_BLOCK, FP8T_EXPORT_FP8_BLOCK);
    if (c && c->arch == FP8T_ARCH_GPT2)
        return fp8t_errorf(
            err, errlen,
            "export: --block %d needs a Llama or Qwen2 model: "
            "transformers' fine-grained FP8 loader converts nn.Linear modules, and "
            "GPT-2's are Conv1D (it would load the E4M3 codes without their "
            "scales); export GPT-2 with --dtype fp8 (per-tensor scales) or bf16",
            o->fp8_block);
    return 0;
}

int fp8t_export_hf_opts(const fp8t_weights *w, const char *dir, const fp8t_export_options *o,
                        fp8t_export_report *rep, char *err, size_t errlen) {
    fp8t_export_report r;
    memset(&r, 0, sizeof(r));
    r.min_input_scale = INFINITY;
    r.max_input_scale = 0.0f;
    const fp8t_export_dtype dtype = o->dtype;
    const size_t max_shard_bytes = o->max_shard_bytes;
    const int block = o->fp8_block, pow2 = o->pow2_scales;
    if (fp8t_export_options_check(w ? &w->model : NULL, o, err, errlen) != 0) return -1;
    if (!dir || !*dir)
        return fp8t_errorf(err, errlen, "export: no output directory given (--to DIR)");
    r.fp8_block = dtype == FP8T_EXPORT_FP8 ? block : 0;
    int n_info;
    fp8t_param_info *info = checked_table(w, &n_info, err, errlen);
    if (!info) return -1;
    int n = fp8t_hf_tensor_map(&w->model, NULL);
    fp8t_hf_tensor *map = n > 0 ? calloc((size_t)n, sizeof(*map)) : NULL;
    int *shard = n > 0 ? calloc((size_t)n, sizeof(int)) : NULL; /* [n] shard of each tensor */
    fp8t_st_writer **wrs = NULL;
    int n_shards = 1;
    float *buf = NULL, *bsc = NULL;
    void *enc = NULL;
    char *text = NULL;
    int rc = -1;
    size_t total = 0;
    if (!map || !shard) {
        fp8t_errorf(err, errlen, "export: out of memory");
        goto done;
    }
    fp8t_hf_tensor_map(&w->model, map);
    /* shards in file order, as transformers' save_pretrained(max_shard_size) cuts them: a
     * tensor larger than the limit gets a shard of its own */
    {
        size_t in_shard = 0;
        for (int i = 0; i < n; i++) {
            const size_t b = stored_bytes(&map[i], dtype, block);
            if (max_shard_bytes && in_shard > 0 && in_shard + b > max_shard_bytes) {
                n_shards++;
                in_shard = 0;
            }
            shard[i] = n_shards - 1;
            in_shard += b;
            total += b;
        }
    }
    wrs = calloc((size_t)n_shards, sizeof(*wrs));
    for (int k = 0; wrs && k < n_shards; k++)
        if (!(wrs[k] = fp8t_st_writer_new())) break;
    if (!wrs || !wrs[n_shards - 1]) {
        fp8t_errorf(err, errlen, "export: out of memory");
        goto done;
    }
    char path[4200];
    if (n_shards > 1) {
        /* a single model.safetensors next to the shards would win over them in every loader */
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        if (fp8t_is_regular_file(path)) {
            fp8t_errorf(err, errlen,
                        "export: %s exists (an earlier single-file export?) and "
                        "loaders would read it instead of the shards; remove it or export to "
                        "a new directory",
                        path);
            goto done;
        }
    }
    size_t maxn = 0, maxb = 1;
    for (int i = 0; i < n; i++) {
        maxn = numel_of(&map[i]) > maxn ? numel_of(&map[i]) : maxn;
        if (block > 0 && map[i].lin >= 0 && n_blocks(&map[i], block) > maxb)
            maxb = n_blocks(&map[i], block);
    }
    buf = malloc(maxn * sizeof(float));    /* [maxn] one tensor in the HF layout */
    enc = malloc(maxn * sizeof(uint16_t)); /* [maxn] its BF16 bits or FP8 codes */
    bsc = malloc(maxb * sizeof(float));    /* [ceil(N/b), ceil(K/b)] its block scales */
    if (!buf || !enc || !bsc) {
        fp8t_errorf(err, errlen, "export: out of memory (%zu-element tensor)", maxn);
        goto done;
    }
    if (fp8t_mkdirs(dir, err, errlen) != 0) goto done;

    for (int i = 0; i < n; i++) {
        const fp8t_hf_tensor *t = &map[i];
        const size_t numel = numel_of(t);
        fp8t_st_writer *wr = wrs[shard[i]];
        gather(buf, t, &info[t->param], w->params);
        if (dtype == FP8T_EXPORT_FP32) {
            fp8t_st_writer_add(wr, t->name, FP8T_ST_F32, t->ndim, t->shape, buf);
        } else if (dtype == FP8T_EXPORT_FP8 && t->lin >= 0 && block > 0) {
            /* [N, K] in the HF (nn.Linear) layout: the blocks transformers' FP8Linear reads */
            const int R = (int)t->shape[0], K = (int)t->shape[1];
            const int64_t sshape[2] = {(R + block - 1) / block, (K + block - 1) / block};
            fp8t_block_quantize_pow2((uint8_t *)enc, bsc, buf, R, K, block, block, FP8_E4M3,
                                     pow2);
            /* the quantizer keeps the multiplier x -> code; the file wants code -> x */
            for (int64_t j = 0; j < sshape[0] * sshape[1]; j++) bsc[j] = 1.0f / bsc[j];
            fp8t_st_writer_add(wr, t->name, FP8T_ST_F8_E4M3, 2, t->shape, enc);
            char sname[160];
            snprintf(sname, sizeof(sname), "%s.weight_scale_inv", t->module);
            fp8t_st_writer_add(wr, sname, FP8T_ST_F32, 2, sshape, bsc);
            r.n_fp8++;
        } else if (dtype == FP8T_EXPORT_FP8 && t->lin >= 0) {
            float amax = fp8_amax(buf, numel);
            float scale = fp8t_current_scale(amax, FP8_E4M3_MAX, 0.0f, pow2);
            float scale_inv = 1.0f / scale;
            fp8_quantize((uint8_t *)enc, buf, numel, scale, FP8_E4M3, 1);
            fp8t_st_writer_add(wr, t->name, FP8T_ST_F8_E4M3, t->ndim, t->shape, enc);
            add_module_scalar(wr, t->module, "weight_scale_inv", scale_inv);
            int fb;
            float is = input_scale(w, t->lin, &fb);
            add_module_scalar(wr, t->module, "input_scale", is);
            r.n_fp8++;
            r.n_act_fallback += fb;
            r.min_input_scale = is < r.min_input_scale ? is : r.min_input_scale;
            r.max_input_scale = is > r.max_input_scale ? is : r.max_input_scale;
        } else {
            uint16_t *bits = enc;
            for (size_t j = 0; j < numel; j++) bits[j] = bf16_encode(buf[j]);
            fp8t_st_writer_add(wr, t->name, FP8T_ST_BF16, t->ndim, t->shape, bits);
        }
    }
    /* Llama q/k/v share one input: the same input_scale appears three times (one per module,
     * as the per-module layout wants); counted once per matrix above. */
    for (int k = 0; k < n_shards; k++) {
        fp8t_st_writer_metadata(wrs[k], "format", "pt");
        fp8t_st_writer_metadata(wrs[k], "fp8train_export_dtype", fp8t_export_dtype_name(dtype));
        if (n_shards > 1)
            snprintf(path, sizeof(path), "%s/model-%05d-of-%05d.safetensors", dir, k + 1,
                     n_shards);
        else
            snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        if (fp8t_st_writer_save(wrs[k], path, err, errlen) != 0) goto done;
        FILE *f = fopen(path, "rb");
        if (f) {
            fseek(f, 0, SEEK_END);
            long sz = ftell(f);
            r.bytes += sz > 0 ? (size_t)sz : 0;
            fclose(f);
        }
    }
    if (n_shards > 1 &&
        write_index(dir, map, n, shard, n_shards, dtype, block, total, err, errlen) != 0)
        goto done;
    r.n_shards = n_shards;
    r.n_tensors = n + (block > 0 ? 1 : 2) * r.n_fp8;
    cJSON *cj = config_json(w, dtype, block, pow2);
    text = cJSON_Print(cj);
    cJSON_Delete(cj);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if (!text || fp8t_write_file_atomic(path, text, strlen(text), err, errlen) != 0) {
        if (!text) fp8t_errorf(err, errlen, "export: out of memory");
        goto done;
    }
    if (r.n_fp8 == 0 || block > 0) r.min_input_scale = 0.0f; /* block: no input scales */
    if (rep) *rep = r;
    rc = 0;
done:
    free(text);
    free(buf);
    free(bsc);
    free(enc);
    free(map);
    free(shard);
    free(info);
    for (int k = 0; wrs && k < n_shards; k++) fp8t_st_writer_free(wrs[k]);
    free(wrs);
    return rc;
}

/* ---------------------------------------------------------------- llm.c */

int fp8t_export_llmc(const fp8t_weights *w, const char *path, int version, char *err,
                     size_t errlen) {
    int n_info;
    fp8t_param_info *info = checked_table(w, &n_info, err, errlen);
    if (!info) return -1;
    const fp8t_model_config *c = &w->model;
    if (c->arch != FP8T_ARCH_GPT2 || c->mlp_hidden != 4 * c->n_embd) {
        free(info);
        return fp8t_errorf(
            err, errlen,
            "export to llm.c: only GPT-2 models with mlp_hidden = 4 * n_embd "
            "fit llm.c's format (this model: %s, n_embd %d, mlp_hidden %d); export to a "
            "Hugging Face directory instead",
            fp8t_arch_name(c->arch), c->n_embd, c->mlp_hidden);
    }
    const size_t V = (size_t)c->vocab_size;
    const size_t Vp = (V + 127) / 128 * 128; /* llm.c pads to a multiple of 128 */
    fp8t_llmc_gpt2 ck;
    memset(&ck, 0, sizeof(ck));
    ck.max_seq_len = c->seq_len;
    ck.vocab_size = (int)V;
    ck.padded_vocab_size = (int)Vp;
    ck.num_layers = c->n_layer;
    ck.num_heads = c->n_head;
    ck.channels = c->n_embd;
    size_t *at = malloc((size_t)n_info * sizeof(*at)); /* [n_info] llm.c offset of each tensor */
    ck.num_params = at ? fp8t_llmc_param_offsets(c, Vp, at) : 0;
    ck.params = ck.num_params ? calloc(ck.num_params, sizeof(float)) : NULL; /* zero: padding */
    if (!ck.params) {
        free(at);
        free(info);
        return fp8t_errorf(err, errlen, "export to llm.c: out of memory");
    }
    for (int i = 0; i < n_info; i++)
        memcpy(ck.params + at[i], w->params + info[i].offset, info[i].numel * sizeof(float));
    int rc = fp8t_llmc_gpt2_write(path, &ck, version, err, errlen);
    free(ck.params);
    free(at);
    free(info);
    return rc;
}
