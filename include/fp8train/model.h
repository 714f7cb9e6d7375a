/* fp8train — the transformer model, written once over the backend op table.
 *
 * GPT-2 style: LayerNorm, GELU(tanh), learned positions, biases, tied head (by default).
 * Llama style: RMSNorm, SwiGLU, RoPE (optionally Llama-3 scaled), no biases (q/k/v biases for
 * Qwen2 with qkv_bias), grouped-query attention (n_kv_head); either style may untie its head.
 * Every linear layer runs its three GEMMs (Fprop, Dgrad, Wgrad) in the precision the policy
 * resolves for it, and the amax of its input X, weight W and output gradient dY is recorded
 * into the FP8 recipe state in every precision (BF16 too), so a run can switch precision at
 * any step without a jolt.
 */
#ifndef FP8TRAIN_MODEL_H
#define FP8TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/backend.h"
#include "fp8train/policy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FP8T_ARCH_GPT2 = 0, FP8T_ARCH_LLAMA = 1 } fp8t_arch;

/* fp8t_rope_type and fp8t_rope_scaling (RoPE frequency scaling) live in backend.h: the
 * attention ops take them. */

typedef struct {
    fp8t_arch arch;
    int n_layer;
    int n_embd;       /* C */
    int n_head;       /* NH; head size C/NH */
    int seq_len;      /* max T */
    int vocab_size;   /* V */
    int mlp_hidden;   /* fc1 out (GPT-2, 4C) or gate/up out (Llama) */
    float rope_theta; /* Llama only (10000) */
    float norm_eps;   /* 1e-5 */
    /* Fields below default to 0 = the behaviour before they existed (positional presets and
     * older checkpoints stay valid). */
    int n_kv_head; /* K/V heads, grouped-query attention (n_head % n_kv_head == 0); 0 = n_head */
    int untied_head; /* 1: the LM head has its own weight "lm_head.w" [V, C]; 0: tied to wte */
    int qkv_bias;    /* Llama arch: q, k, v projections carry biases (Qwen2); GPT-2 always has
                        them (the flag is ignored there) */
    fp8t_rope_scaling rope_scaling; /* Llama arch */
} fp8t_model_config;

/* K/V heads with n_kv_head 0 read as n_head; GPT-2 refuses any other count */
int fp8t_model_kv_heads(const fp8t_model_config *cfg);
/* rows of h.L.qkv.w: (n_head + 2 n_kv_head) * head size — q rows, then k, then v */
int fp8t_model_qkv_dim(const fp8t_model_config *cfg);

/* Presets: tiny, tiny-llama, gpt2-124m, gpt2-350m, gpt2-1.5b, llama-1b (Llama-3.2-1B's shape),
 * llama3-8b (Llama-3.1-8B's). 0 ok, -1 unknown. */
int fp8t_model_preset(fp8t_model_config *cfg, const char *name);
const char *fp8t_model_preset_names(void); /* "tiny, tiny-llama, ..." for help texts */
/* 0 if valid; else -1 and err says which field is wrong and why. */
int fp8t_model_config_check(const fp8t_model_config *cfg, char *err, size_t errlen);
const char *fp8t_arch_name(fp8t_arch a);            /* "gpt2", "llama" */
int fp8t_arch_parse(fp8t_arch *out, const char *s); /* fp8t_arch_name back; 0 ok, -1 unknown */

/* ---- parameters: one FP32 buffer carved into named tensors ---- */
#define FP8T_MAX_PARAM_TENSORS 4096
typedef struct {
    char name[64]; /* "wte", "wpe", "h.3.qkv.w", "h.3.qkv.b", "lnf.w", ... */
    int ndim;      /* 1 or 2 */
    int shape[2];  /* [out, in] for linear weights (row-major) */
    size_t offset; /* in floats from the start of the parameter buffer */
    size_t numel;
    int layer; /* -1 for embeddings / final norm */
    int decay; /* AdamW weight decay applies (2-D weights) */
} fp8t_param_info;

/* Fill info (may be NULL) and return the number of parameter tensors; *total gets the
 * number of floats. Pure function of the config (the checkpoint/export layout).
 * Llama: per layer ln1.w, qkv.w [(NH+2NKV)*HS, C], qkv.b (qkv_bias only), proj.w, ln2.w,
 * gate.w, up.w, down.w; then lnf.w. Both archs: lm_head.w [V, C] last when untied_head. */
int fp8t_model_param_table(const fp8t_model_config *cfg, fp8t_param_info *info, size_t *total);

/* ---- linear layers and FP8 metadata ----
 * Linear index lin: layer l, module slot s -> lin = l * modules_per_layer + s; the head is
 * the last (lin = n_layer * modules_per_layer). FP8 tensor index = lin * 3 + role. */
typedef enum { FP8T_ROLE_X = 0, FP8T_ROLE_W = 1, FP8T_ROLE_DY = 2 } fp8t_fp8_role;
int fp8t_model_modules_per_layer(const fp8t_model_config *cfg); /* 4 (gpt2) or 5 (llama) */
fp8t_module fp8t_model_module_of_slot(const fp8t_model_config *cfg, int slot);
int fp8t_model_num_linears(const fp8t_model_config *cfg);

/* ---- tensors seen by debug hooks ---- */
typedef enum {
    FP8T_T_INPUT = 0,   /* X, before quantization (Fprop operand, Wgrad operand) */
    FP8T_T_WEIGHT,      /* W (read-only for hooks) */
    FP8T_T_GRAD_OUTPUT, /* dY, before quantization (Dgrad and Wgrad operand) */
    FP8T_T_OUTPUT,      /* Y = Fprop result */
    FP8T_T_DGRAD,       /* dX = Dgrad result */
    FP8T_T_WGRAD,       /* dW of this micro-batch (before accumulation) */
    FP8T_T_COUNT
} fp8t_tensor_kind;
const char *fp8t_tensor_kind_name(fp8t_tensor_kind k);

typedef struct {
    int layer; /* -1 for the head */
    fp8t_module module;
    int lin;             /* linear index */
    fp8t_gemm_kind gemm; /* the GEMM this tensor belongs to */
    fp8t_tensor_kind kind;
    int fp8_index;            /* FP8 meta index of this tensor (X/W/dY), -1 for results */
    fp8t_precision precision; /* resolved precision of that GEMM */
    fp8_format fmt;           /* the FP8 format this tensor is cast to */
    int rows, cols;
    /* the row stride of x in floats: cols, or more where a read-only hook
     * (fp8t_model_set_observer) is shown rows inside a wider buffer (the head's logits and
     * their FP32 gradient, rows pad(V) apart, on the unhooked path's fused cross-entropy); the
     * floats between cols and ld are not part of the tensor. A writing hook always gets ld =
     * cols. */
    int ld;
} fp8t_tensor_site;

struct fp8t_model;
/* Called for every GEMM operand (before quantization) and result (after the GEMM), in
 * execution order, when set. x is a device pointer; a hook may modify operands of kind
 * INPUT / GRAD_OUTPUT and results (fault injection), never WEIGHT. */
typedef void (*fp8t_tensor_hook)(void *ctx, struct fp8t_model *m, const fp8t_tensor_site *site,
                                 float *x);

typedef struct fp8t_model fp8t_model;

/* The model's fused, cached and memory-saving paths, one bit each in fp8t_model_options.disable
 * to switch it back to its plain version (debugging: "turn off the recent or risky features").
 * Every plain version gives the same bits as the fused one on the same backend (tested). */
enum {
    FP8T_DISABLE_FUSED_XENT = 1u << 0,       /* loss and dlogits in two passes over the logits */
    FP8T_DISABLE_BF16_XENT = 1u << 1,        /* FP32 dlogits, rounded by the head's Dgrad */
    FP8T_DISABLE_CODE_REUSE = 1u << 2,       /* the Wgrad quantizes dY again */
    FP8T_DISABLE_BF16_OPERANDS = 1u << 3,    /* BF16 GEMMs round their FP32 operands every time */
    FP8T_DISABLE_GELU_FUSION = 1u << 4,      /* GELU writes FP32; fc2 rounds it in its own pass */
    FP8T_DISABLE_BIAS_GRAD_FUSION = 1u << 5, /* bias_backward reads dY in its own pass */
    FP8T_DISABLE_GELU_BWD_FUSION = 1u << 6,  /* gelu_backward writes fc1's dY in FP32 */
    FP8T_DISABLE_RESIDUAL_BIAS = 1u << 7,    /* proj and fc2 add their bias themselves */
    FP8T_DISABLE_LN_FUSION = 1u << 8,        /* LayerNorm writes FP32; the linear rounds it */
    FP8T_DISABLE_ATTN_SAVE = 1u << 9,        /* the attention backward rebuilds q, k, v */
    FP8T_DISABLE_FP8_SAVE = 1u << 10,        /* every linear keeps its input X in FP32 */
    /* Not a fusion and not bit-identical: layers whose GEMMs all run below FP32 keep what the
     * backward reads again (attention output, MLP pre-activations, residuals) in BF16; this bit
     * keeps them in FP32 as an FP32 layer does. */
    FP8T_DISABLE_BF16_SAVES = 1u << 11,
    FP8T_DISABLE_SWIGLU_FUSION = 1u << 12,     /* SwiGLU writes FP32; down rounds it */
    FP8T_DISABLE_SWIGLU_BWD_FUSION = 1u << 13, /* swiglu_backward writes gate's / up's dY */
    FP8T_DISABLE_X_SHARE = 1u << 14,           /* up makes and keeps its own copy of gate's X */
    /* every fusion bit (all but BF16_SAVES) */
    FP8T_DISABLE_ALL_FUSION = ((1u << 11) - 1) | FP8T_DISABLE_SWIGLU_FUSION |
                              FP8T_DISABLE_SWIGLU_BWD_FUSION | FP8T_DISABLE_X_SHARE,
    FP8T_DISABLE_KNOWN = FP8T_DISABLE_ALL_FUSION | FP8T_DISABLE_BF16_SAVES,
};

/* head_chunk: the LM head in chunks of rows (docs/model.md, "The LM head in chunks"). Where
 * the head's fused BF16 cross-entropy applies (targets, no hook, the head's three GEMMs with
 * BF16 operands; not with FP8T_DISABLE_FUSED_XENT or _BF16_XENT), a forward runs the head over
 * chunks of rows, so no [N, V] logits buffer exists: a training forward makes each chunk's
 * logits, losses, BF16 dlogits, Dgrad rows and Wgrad contribution, one after the other, and
 * the backward adds the kept head gradient; a frozen forward makes the losses. The head's dW
 * sums its tokens chunk by chunk (another FP32 summation order); the logits, losses and the
 * head's dX are the unchunked path's bits where the GEMM computes a row the same whatever the
 * rows of the call (the CPU's OpenBLAS on one thread, chunks a multiple of its row tile), else
 * FP32 rounding apart too. */
#define FP8T_HEAD_CHUNK_AUTO                                                                     \
    0 /* chunk when the whole batch's logits and BF16 dlogits would
                                  take more than FP8T_HEAD_CHUNK_AUTO_MIB, in chunks sized to
                                  the backward's free gradient scratch (at least 1024 rows) */
#define FP8T_HEAD_CHUNK_OFF (-1)
#define FP8T_HEAD_CHUNK_AUTO_MIB 256

/* Given at creation; a zeroed struct (or NULL) is the default: every path on. */
typedef struct {
    unsigned disable; /* FP8T_DISABLE_* bits */
    int head_chunk;   /* rows per chunk of the LM head (a multiple of 8; chunking when the
                         micro-batch has more tokens), FP8T_HEAD_CHUNK_AUTO (0, the default) or
                         FP8T_HEAD_CHUNK_OFF (any negative value): the unchunked head */
} fp8t_model_options;

/* The rows per chunk a forward with targets runs the LM head in now (policy and hook as they
 * are), or 0: the head unchunked. */
int fp8t_model_head_chunk_rows(const fp8t_model *m);

/* Create the model for micro-batches of B sequences of T tokens (T <= seq_len) on backend be,
 * with options opt (NULL = defaults). Params, grads, AdamW moments, the FP8 state and the
 * activations of fp8t_model_activation_bytes' first group are allocated here; forwards
 * allocate the rest when they first need it. NULL + err on failure (also a head_chunk that is
 * positive and not a multiple of 8). */
fp8t_model *fp8t_model_create(fp8t_backend *be, const fp8t_model_config *cfg,
                              const fp8t_policy *policy, const fp8t_model_options *opt, int B,
                              int T, char *err, size_t errlen);
void fp8t_model_destroy(fp8t_model *m);

const fp8t_model_config *fp8t_model_get_config(const fp8t_model *m);
fp8t_backend *fp8t_model_backend(fp8t_model *m);
const fp8t_policy *fp8t_model_get_policy(const fp8t_model *m);
/* Change the policy (recovery experiments, shadow BF16, fallback). FP8 state is kept; when
 * the dY format changes (hybrid on/off) the dY scales are carried over to the new range (while
 * frozen: deferred to the unfreeze, see below). */
void fp8t_model_set_policy(fp8t_model *m, const fp8t_policy *policy);

/* Frozen: forwards that leave the training state untouched (validation, shadow BF16), so they
 * can run on the trained model itself, between steps or before a step's first forward.
 * While frozen:
 *   - a forward records no amax (X, W) into the FP8 recipe state and does not count as the
 *     step's weight-amax recording; it may reuse or fill the cached FP8 weight codes, which
 *     depend only on the weights and the scales and so stay valid for training;
 *   - fp8t_model_set_policy changes precisions but never the FP8 state: a dY format change is
 *     applied at the unfreeze if the policy then still differs, so a switch to another policy
 *     and back while frozen leaves the state bit for bit;
 *   - backward, zero_grad, adamw and end_step are refused (a message on stderr, no effect);
 *     a backward after unfreezing needs a forward run unfrozen.
 * Hooks still run on frozen forwards; a hook can ask fp8t_model_is_frozen. */
void fp8t_model_set_frozen(fp8t_model *m, int frozen);
int fp8t_model_is_frozen(const fp8t_model *m);
/* Resolved precision of one GEMM of linear lin. */
fp8t_precision fp8t_model_gemm_precision(const fp8t_model *m, int lin, fp8t_gemm_kind g);

/* GPT-2 init: N(0, 0.02), residual projections (proj, fc2/down) scaled by 1/sqrt(2 L),
 * biases 0, norm weights 1. Deterministic in seed. */
void fp8t_model_init_weights(fp8t_model *m, uint64_t seed);

/* Device buffers, each of fp8t_model_num_params floats, laid out per fp8t_model_param_table. */
size_t fp8t_model_num_params(const fp8t_model *m);
float *fp8t_model_params(fp8t_model *m);
float *fp8t_model_grads(fp8t_model *m);
float *fp8t_model_adam_m(fp8t_model *m);
float *fp8t_model_adam_v(fp8t_model *m);

/* Forward on tokens[B*T] (host). With targets (host, [B*T]) computes the loss and returns
 * the mean loss over non-ignored targets (waits for the device); with targets NULL returns 0
 * and leaves logits [B*T, V] readable through fp8t_model_logits. */
float fp8t_model_forward(fp8t_model *m, const int *tokens, const int *targets);
/* device [B*T, V]: the last forward's logits (rebuilt by the head GEMM again where a fused or
 * chunked forward did not keep them; this allocates the buffer if no forward did), or the
 * gradient after a backward on the plain path */
const float *fp8t_model_logits(fp8t_model *m);
/* Per-position losses of the last forward with targets: device [B*T]. */
const float *fp8t_model_losses(fp8t_model *m);
/* Backward of the last forward (which must have had targets); gradients are ACCUMULATED,
 * scaled by dloss (1/grad_accum_steps). */
void fp8t_model_backward(fp8t_model *m, float dloss);
void fp8t_model_zero_grad(fp8t_model *m);
/* Told by fp8t_model_backward as the gradients become final, in this order: layer = n_layer
 * after the LM head and the final norm, n_layer-1 ... 0 after each block, -1 after the
 * embedding. From then on the backward adds nothing more to the gradients of the parameter
 * table's tensors from layer `layer` to the end of the table (-1: to all of them): the
 * data-parallel trainer starts reducing them while the backward goes on. fn NULL: none. */
typedef void (*fp8t_grads_ready_fn)(void *ctx, int layer);
void fp8t_model_set_grads_ready(fp8t_model *m, fp8t_grads_ready_fn fn, void *ctx);
/* Global L2 norm of the gradients (waits). */
float fp8t_model_grad_norm(fp8t_model *m);
/* AdamW step t (1-based) with gradient clipping at grad_clip (<=0: off) given the norm. */
void fp8t_model_adamw(fp8t_model *m, float lr, float beta1, float beta2, float eps,
                      float weight_decay, int t, float grad_clip, float grad_norm);
/* fp8t_model_adamw on the parameters [lo, hi) only, adam_m / adam_v holding the moments of
 * that range (element 0 = parameter lo): ZeRO-1, each rank updating its shard. The weight
 * caches are invalidated as by fp8t_model_adamw; the caller makes the rest of the parameters
 * current (all-gather) before the next forward. */
void fp8t_model_adamw_range(fp8t_model *m, float *adam_m, float *adam_v, size_t lo, size_t hi,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            int t, float grad_clip, float grad_norm);
/* Free the model's own AdamW moments (ZeRO-1 keeps shards of them elsewhere); adam_m/adam_v
 * return NULL afterwards and fp8t_model_adamw must not be called. */
void fp8t_model_release_adam(fp8t_model *m);
/* End of an optimizer step: delayed-scaling update of every FP8 tensor (one op, no host sync)
 * and invalidation of the cached FP8 weight copies. */
void fp8t_model_end_step(fp8t_model *m);

/* FP8 recipe state (device), layout fp8t_recipe_state over n = 3 * num_linears tensors. */
float *fp8t_model_fp8_state(fp8t_model *m);
int fp8t_model_fp8_count(const fp8t_model *m);
int fp8t_model_fp8_history_len(const fp8t_model *m);

void fp8t_model_set_hook(fp8t_model *m, fp8t_tensor_hook hook, void *ctx);
/* A hook that only reads (statistics, NaN checks): the model keeps what a writing hook turns
 * off because the hook could change a tensor between two GEMMs that read it: the forward's
 * FP8 codes of X for the Wgrad (no FP32 copy of X per layer), the Dgrad's dY codes for the
 * Wgrad and the bias gradient from the Dgrad's pass. At the Wgrad's X site of a linear whose
 * forward kept only the codes, x is NULL: the tensor is that linear's Fprop X of the same
 * micro-batch, shown to the hook before. The other fusions stay off (they leave no FP32
 * tensor to show). */
void fp8t_model_set_observer(fp8t_model *m, fp8t_tensor_hook hook, void *ctx);

/* Device bytes the model holds for activations: what create carved (embedding output, norm
 * statistics, the backward's one-layer gradients, which also hold the chunked head's buffers
 * where they fit, tokens) and what forwards allocated since (the per-layer saves for the
 * backward in FP32 or BF16 and their one-layer scratch, the Wgrad inputs' FP32 copies or
 * FP8/BF16 codes, the backend's attention state, the GEMM operands' scratch, the [B*T, V]
 * logits once a forward wrote them whole, the chunked head's buffers that did not fit). After a first training step this is the steady state of the
 * configuration and policy; parameters, gradients, optimizer moments, weight copies and the
 * backend's own scratch are not counted. */
size_t fp8t_model_activation_bytes(const fp8t_model *m);

#ifdef __cplusplus
}
#endif
#endif
