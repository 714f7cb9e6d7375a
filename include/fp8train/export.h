/* fp8train — weights in and out: Hugging Face export/import, llm.c GPT-2 import/export, and
 * turning any of them into a training checkpoint.
 *
 * The common currency is fp8t_weights: a model config plus its FP32 parameters in the
 * fp8t_model_param_table layout, and (when known) the FP8 recipe state. A checkpoint
 * directory, a Hugging Face directory (config.json + model.safetensors, ours or the Hub's) and
 * an llm.c GPT-2 .bin all load into one; export and checkpoint writing take one.
 *
 * Hugging Face layout (docs/export.md has the full table):
 *   GPT-2 -> GPT2LMHeadModel: transformer.wte/wpe, transformer.h.N.{ln_1, attn.c_attn,
 *     attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}, transformer.ln_f. Conv1D weights are stored
 *     [in, out], i.e. TRANSPOSED relative to fp8train's [out, in].
 *   Llama -> LlamaForCausalLM (Qwen2ForCausalLM with q/k/v biases): model.embed_tokens,
 *     model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
 *     mlp.{gate,up,down}_proj}, model.norm. The fused qkv [(NH + 2 NKV) HS, C] is split by rows
 *     into q [NH HS, C], k and v [NKV HS, C] (grouped-query attention), its bias likewise; RoPE
 *     needs no permutation (fp8train's attention rotates the pairs (i, i + HS/2), the Hugging
 *     Face convention).
 *   An untied LM head is lm_head.weight; a tied one is not written.
 * FP8 export: every linear weight is F8_E4M3 with "<module>.weight_scale_inv" (F32 [1], weight ≈
 *   fp8 * weight_scale_inv, from the weight's own amax: current scaling) and
 *   "<module>.input_scale" (F32 [1], the activation's dequantization scale learned in training:
 *   max of the FP8 amax history / 448); embeddings, norms and biases are BF16.
 * Block-scaled FP8 export (fp8_block 128, Llama/Qwen2): transformers' fine-grained FP8 layout,
 *   "<module>.weight_scale_inv" F32 [ceil(N/128), ceil(K/128)] (one dequantization multiplier
 *   per 128x128 block of the [N, K] weight, the DeepSeek-V3 rule of fp8t_block_quantize), no
 *   input_scale (activation_scheme "dynamic": the runtime scales activations per 1x128 tile). */
#ifndef FP8TRAIN_EXPORT_H
#define FP8TRAIN_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Storage dtype of exported weights (also: what an import found). */
typedef enum {
    FP8T_EXPORT_BF16 = 0,
    FP8T_EXPORT_FP8 = 1,
    FP8T_EXPORT_FP32 = 2
} fp8t_export_dtype;
const char *fp8t_export_dtype_name(fp8t_export_dtype d);            /* "bf16", "fp8", "fp32" */
int fp8t_export_dtype_parse(fp8t_export_dtype *out, const char *s); /* 0 ok, -1 unknown */

typedef struct {
    fp8t_model_config model;
    size_t num_params;
    float *params;      /* [num_params] FP32, fp8t_model_param_table layout (malloc'd) */
    int fp8_n, fp8_len; /* FP8 recipe state: n tensors, history length (0 when none) */
    float *fp8_state;   /* [(fp8_len + 3) * fp8_n] or NULL (malloc'd) */
    int step;           /* training step of a checkpoint, else 0 */
    uint64_t seed;      /* the run's seed of a checkpoint, else 0 */
    char *config_json;  /* a checkpoint's run config (JSON text) or NULL (malloc'd) */
    char *policy_json;  /* a checkpoint's policy (JSON text) or NULL (malloc'd) */
    fp8t_export_dtype stored_dtype; /* precision the weights were stored in (imports) */
    char kind[32];     /* "checkpoint", "hf-gpt2", "hf-llama", "hf-qwen2", "llmc-gpt2" */
    char source[1024]; /* the path loaded */
    char notes[1024];  /* what the import did that a user should know ("" none) */
} fp8t_weights;

void fp8t_weights_free(fp8t_weights *w);

/* Load weights from any supported source, chosen by what `src` is:
 *   a directory with state.json          fp8train training checkpoint
 *   a directory with config.json         Hugging Face GPT-2 / Llama (ours or the Hub's;
 *                                        F32/BF16/F16/F8 tensors, single file or sharded
 *                                        model.safetensors.index.json)
 *   a regular file                       llm.c GPT-2 checkpoint (version 3 fp32 / 5 bf16)
 * 0 ok; -1 with err naming the file and what is wrong. */
int fp8t_weights_load(const char *src, fp8t_weights *w, char *err, size_t errlen);
/* The model config of what fp8t_weights_load would load, reading only config.json /
 * state.json where there is one. 0 ok; -1 with err. */
int fp8t_weights_read_config(const char *src, fp8t_model_config *cfg, char *err, size_t errlen);
int fp8t_weights_from_checkpoint(const char *dir, fp8t_weights *w, char *err, size_t errlen);
/* FP8 tensors are dequantized with their weight_scale_inv (per tensor, or 2-D block scales
 * with quantization_config.weight_block_size); input_scale, when present, seeds the X scales
 * of the FP8 state so the learned activation scales survive an export/import round trip. */
int fp8t_import_hf(const char *dir, fp8t_weights *w, char *err, size_t errlen);
/* llm.c pads the vocabulary to Vp rows for speed; the padding rows are dropped (the model's
 * vocab is V, as llm.c's own loss only ever looks at the first V logits). */
int fp8t_import_llmc(const char *path, fp8t_weights *w, char *err, size_t errlen);

/* Write w as a fresh training checkpoint in `dir`: step 0, data position 0, zero AdamW
 * moments, the given seed, and w's FP8 state if it has one of the right size (else a fresh
 * state with the default history length). `fp8train train --resume dir` continues from it. */
int fp8t_weights_save_checkpoint(const fp8t_weights *w, const char *dir, uint64_t seed, char *err,
                                 size_t errlen);

typedef struct {
    int n_tensors;      /* tensors written to model.safetensors */
    size_t bytes;       /* size of model.safetensors (all shards) */
    int n_shards;       /* safetensors files written (1: model.safetensors) */
    int n_fp8;          /* FP8 weight matrices */
    int n_act_fallback; /* FP8: linears without an amax history (input_scale from the
                               state's scale_inv instead) */
    float min_input_scale, max_input_scale; /* FP8: range of the input scales written */
    int fp8_block; /* FP8: 0 per-tensor scales, else the block edge (128) */
} fp8t_export_report;

/* How to write a Hugging Face directory. Zero-initialized = BF16, one file. */
typedef struct {
    fp8t_export_dtype dtype;
    size_t max_shard_bytes; /* 0: one model.safetensors; else shards of at most this size */
    int fp8_block;          /* FP8 only: 0 per-tensor scales (+ input_scale); 128: 128x128 block
                               scales in transformers' fine-grained layout (Llama/Qwen2 only:
                               transformers converts nn.Linear, not GPT-2's Conv1D) */
    int pow2_scales;        /* FP8 only: weight scales rounded down to powers of two (the
                               current-scaling option), so weight_scale_inv is exactly 1/scale */
} fp8t_export_options;

/* The block sizes fp8_block may take (what fp8t_block_quantize's weight rule uses). */
#define FP8T_EXPORT_FP8_BLOCK 128
/* 0 when o fits w's model; -1 with err saying why (wrong dtype for a block, block size, GPT-2).
 * fp8t_export_hf_opts checks the same before it writes anything. */
int fp8t_export_options_check(const fp8t_model_config *c, const fp8t_export_options *o, char *err,
                              size_t errlen);

/* Write a Hugging Face directory: config.json + model.safetensors (metadata format=pt). The
 * directory is created. FP8 needs w's FP8 state for the input scales (without it, or for
 * linears whose amax history is empty, the state's scale_inv is used and counted in
 * rep->n_act_fallback). rep may be NULL. */
int fp8t_export_hf(const fp8t_weights *w, const char *dir, fp8t_export_dtype dtype,
                   fp8t_export_report *rep, char *err, size_t errlen);
/* The same, cut into shards of at most max_shard_bytes each (0: one file) where it does not
 * fit one: model-0000K-of-0000N.safetensors + model.safetensors.index.json, as transformers'
 * save_pretrained(max_shard_size=...) writes them. Refuses a directory that holds a
 * model.safetensors (it would shadow the shards). */
int fp8t_export_hf_sharded(const fp8t_weights *w, const char *dir, fp8t_export_dtype dtype,
                           size_t max_shard_bytes, fp8t_export_report *rep, char *err,
                           size_t errlen);

/* The general form of the two above. */
int fp8t_export_hf_opts(const fp8t_weights *w, const char *dir, const fp8t_export_options *o,
                        fp8t_export_report *rep, char *err, size_t errlen);

/* Write an llm.c GPT-2 checkpoint (version 3 fp32 or 5 bf16), vocab padded to a multiple of
 * 128 with zero rows as llm.c does. GPT-2 architecture with mlp_hidden = 4 * n_embd only. */
int fp8t_export_llmc(const fp8t_weights *w, const char *path, int version, char *err,
                     size_t errlen);

/* ---- the name mapping, for tests and tools ---- */
typedef enum {
    FP8T_HF_COPY = 0,      /* same layout */
    FP8T_HF_TRANSPOSE = 1, /* ours [r, c] -> HF [c, r] (GPT-2 Conv1D) */
    FP8T_HF_ROWS = 2,      /* rows [row0, row0 + rows) of ours (Llama q/k/v from qkv) */
} fp8t_hf_transform;

typedef struct {
    char name[128]; /* Hugging Face tensor name, e.g. "transformer.h.0.attn.c_attn.weight" */
    int ndim;
    int64_t shape[2]; /* Hugging Face shape */
    int param;        /* index into fp8t_model_param_table */
    fp8t_hf_transform transform;
    int row0, rows;   /* FP8T_HF_ROWS slice */
    int lin;          /* linear index (FP8 state) for linear weights, else -1 */
    char module[128]; /* "<name without .weight>" for linear weights (scale names) */
} fp8t_hf_tensor;

/* The Hugging Face tensors of a model config, in file order. Returns the count (fills map when
 * non-NULL; map needs room for the count: call once with NULL to size it). */
int fp8t_hf_tensor_map(const fp8t_model_config *cfg, fp8t_hf_tensor *map);

/* llm.c's GPT-2 parameter order (io.h): offset[i] is where our parameter tensor i (the
 * fp8t_model_param_table index) starts among llm.c's parameters, wte holding the first V of
 * padded_vocab rows. Returns llm.c's parameter count (0: out of memory). GPT-2 configs only;
 * offset needs room for the table's count. */
size_t fp8t_llmc_param_offsets(const fp8t_model_config *cfg, size_t padded_vocab, size_t *offset);

#ifdef __cplusplus
}
#endif
#endif
