/* The model's private state, shared by the files of src/model/ (and the white-box tests). */
#ifndef FP8TRAIN_MODEL_INTERNAL_H
#define FP8TRAIN_MODEL_INTERNAL_H

#include <stdio.h>
#include <stdlib.h>

#include "fp8train/error.h" /* fp8t_warnf */
#include "fp8train/model.h"
#include "util/check.h" /* FP8T_CHECK */

/* Device pointers into the parameter (or gradient) buffer for one layer. Tensors an
 * architecture does not have are NULL (GPT-2: no gate/up/down; Llama: no biases, no fc1/fc2). */
typedef struct {
    float *ln1_w, *ln1_b;   /* [C] */
    float *qkv_w, *qkv_b;   /* [QKV, C], [QKV]; QKV = (NH + 2 NKV) * HS (3C without GQA) */
    float *proj_w, *proj_b; /* [C, C], [C] */
    float *ln2_w, *ln2_b;   /* [C] */
    float *fc1_w, *fc1_b;   /* [H, C], [H] */
    float *fc2_w, *fc2_b;   /* [C, H], [C] */
    float *gate_w, *up_w;   /* [H, C] */
    float *down_w;          /* [C, H] */
} layer_tensors;

typedef struct {
    float *wte;           /* [V, C] (also the LM head when tied) */
    float *lm_head;       /* [V, C] the untied LM head, NULL when tied */
    float *wpe;           /* [maxT, C] (GPT-2 only) */
    float *lnf_w, *lnf_b; /* [C] */
    layer_tensors *layer; /* [L] (host array of device pointers) */
} model_tensors;

/* Activations of one micro-batch (N = B*T tokens), carved from one allocation. Per-layer
 * buffers are [L, ...]; the backward scratch holds one layer's gradients at a time.
 * ln1, ln2 and fch_act are read again only by a Wgrad: they are carved here only under
 * FP8T_DISABLE_FP8_SAVE; otherwise they are NULL and the model keeps them per layer only
 * where a Wgrad needs them in FP32 (wgrad_input, below). qkv, atty, fch and up are not carved
 * either: they are layer saves (layer_save, below), allocated per layer as a training forward
 * first needs them, in FP32 or BF16. */
typedef struct {
    float *encoded;  /* [N, C] embedding output = residual stream into layer 0 */
    float *ln1;      /* [L, N, C] (FP8T_DISABLE_FP8_SAVE only) */
    float *ln1_mean; /* [L, N] (GPT-2) */
    float *ln1_rstd; /* [L, N] */
    float *lse;      /* [L, B, NH, T] softmax log-sum-exp saved for the backward */
    float *ln2;      /* [L, N, C] (FP8T_DISABLE_FP8_SAVE only) */
    float *ln2_mean; /* [L, N] (GPT-2) */
    float *ln2_rstd; /* [L, N] */
    float *fch_act;  /* [L, N, H] GELU(fch) (GPT-2) / silu(gate)*up (Llama)
                          (FP8T_DISABLE_FP8_SAVE only) */
    float *lnf;      /* [N, C] */
    float *lnf_mean; /* [N] (GPT-2) */
    float *lnf_rstd; /* [N] */
    float *logits;   /* [N, pad(V)], not carved: allocated by the first forward that writes
                          the whole batch's logits (model_logits_buf; the chunked head never
                          does); holds dlogits after a plain backward */
    float *losses;   /* [N] */
    float *out_c;    /* [N, C] scratch: proj / fc2 / down output before the residual add */
    /* backward scratch; everything carved after dc1 is free during a forward and holds the
     * chunked head's buffers where they fit (head.c: model_head_plan) */
    float *dres; /* [N, C] gradient of the residual stream */
    float *dc1;  /* [N, C] gradient of a norm output / attention output */
    float *dc2;  /* [N, C] second Dgrad contribution (Llama up) */
    float *dqkv; /* [N, QKV] */
    float *dh1;  /* [N, H] gradient of fch_act */
    float *dh2;  /* [N, H] gradient of fch (gate) */
    float *dh3;  /* [N, H] gradient of up (Llama) */
} activations;

/* Layer l of one micro-batch: the dimensions of its GEMMs and its slices of the per-layer
 * activation buffers, which the block's forward writes and its backward reads. Slices of
 * buffers the architecture does not have are NULL. */
typedef struct {
    int B, T, N, C, H, NH, HS; /* N = B*T tokens, H = MLP hidden, HS = C / NH */
    int NKV, QKV;              /* K/V heads, qkv width (NH + 2 NKV) * HS */
    fp8t_attn_shape attn;      /* the attention ops' shape (RoPE for Llama) */
    int lin0;                  /* index of the layer's first linear layer */
    size_t NC, NH_;            /* N * C, N * H */
    float *ln1;                /* [N, C] */
    float *ln1_mean;           /* [N] (GPT-2) */
    float *ln1_rstd;           /* [N] */
    float *qkv;                /* [N, QKV] (the forward's: layer_save) */
    float *atty;               /* [N, C] (the forward's: layer_save) */
    float *lse;                /* [B, NH, T] */
    float *res2;               /* [N, C] (the forward's: layer_save) */
    float *ln2;                /* [N, C] */
    float *ln2_mean;           /* [N] (GPT-2) */
    float *ln2_rstd;           /* [N] */
    float *fch;                /* [N, H] fc1 output (GPT-2) / gate output (Llama) (the
                                  forward's: layer_save) */
    float *fch_act;            /* [N, H] GELU(fch) (GPT-2) / silu(gate)*up (Llama) */
    float *up;                 /* [N, H] up output (Llama) (the forward's: layer_save) */
    float *res3;               /* [N, C] (the forward's: layer_save) */
} layer_view;

/* One cached low-precision copy of a weight (made once per optimizer step): FP8 codes
 * (delayed / current slots), a BF16 operand (bf16 slot) or block- / row-scaled codes (block and
 * row slots: codes for the Fprop, codes_t for the Dgrad, each with its scale_inv array). */
typedef struct {
    uint8_t *codes;         /* [out, in] */
    uint8_t *codes_t;       /* [in, out], only when the backend wants transposed copies */
    uint16_t *bf16;         /* BF16 operand of [out, in] (fp8t_bf16_operand layout) */
    float *bsinv, *bsinv_t; /* block / row slot: the scale_inv of codes / codes_t */
    int valid;              /* block / row slot: bit 0 codes, bit 1 codes_t */
} weight_cache;

enum {
    WCACHE_DELAYED = 0,
    WCACHE_CURRENT = 1,
    WCACHE_BF16 = 2,
    WCACHE_BLOCK = 3,
    WCACHE_ROW = 4,
    WCACHE_SLOTS = 5
};

/* The inputs X that only their linear's Wgrad reads again (the norms' backward takes the
 * norm's input, GELU/SwiGLU's backward fch/gate/up; proj's input atty is also read by the
 * attention backward and the head's lnf is [N, C] once, so both stay in `activations`). */
typedef enum {
    WX_LN1 = 0,     /* qkv input, [N, C] */
    WX_LN2 = 1,     /* fc1 (GPT-2) / gate and up (Llama) input, [N, C] */
    WX_FCH_ACT = 2, /* fc2 / down input, [N, H] */
    WX_COUNT
} wgrad_input;

/* The FP8 codes of a linear's input X that its Wgrad reads, made by the Fprop's quantize
 * (the plan's save_x). Valid until the next forward: the scale they were made with does not
 * change before the backward (delayed: the recipe state's scale_inv, rewritten only by
 * fp8t_model_end_step; current: cur_scale_inv of this linear's X, written only by this
 * linear's X quantization from the same X). */
typedef struct {
    uint8_t *codes;         /* device [N, IN] codes, or [IN, N] when the backend wants
                               transposed copies (the layout the Wgrad's gemm_fp8 reads);
                               allocated at the first FP8 save, kept */
    uint16_t *bf16;         /* device BF16 operand of [N, IN] (a BF16 Fprop and Wgrad: the
                               Fprop's operand A is the Wgrad's operand B); allocated at the
                               first BF16 save, kept */
    const float *scale_inv; /* device: the scale_inv the codes were made with */
    float *bsinv;           /* device: block / rowwise: the scale_inv array of the codes, which
                               are then Xᵀ [IN, N] scaled along the tokens (the Wgrad's K-major
                               operand B); allocated at the first such save, kept */
    size_t bsinv_floats;    /* its size */
    fp8t_precision prec;    /* delayed, current, bf16, block or rowwise */
    int shared;             /* up (the plan's x_shared): the last training forward kept none
                               of its own; the Wgrad reads gate's (the linear before) */
    int saved;              /* the last training forward saved codes here instead of
                               keeping X in FP32 for the Wgrad */
} x_codes;

/* The outputs a layer's backward reads again other than the Wgrad-only inputs (the norms'
 * statistics and the embedding output stay carved in FP32). Each is kept per layer in FP32, per
 * layer in BF16, or not at all; in the last two cases its FP32 values live in one layer's
 * scratch: in the forward from its producer to its last reader, in the backward from the
 * BF16 copy's widening (model_save_restore) to its reader. */
typedef enum {
    SV_QKV = 0,  /* [N, QKV] read by the attention backward only: not kept when the backend
                    keeps its own attention state (attention_saved_bytes, the CUDA flash
                    path's BF16 q, k, v) */
    SV_ATTY = 1, /* [N, C] proj's X (where its Wgrad does not take the Fprop's operand) and
                    the attention backward's out (its rowsum(dout * out)) */
    SV_FCH = 2,  /* [N, H] GELU's input (GPT-2) / gate's output (Llama) */
    SV_UP = 3,   /* [N, H] up's output (Llama) */
    SV_RES2 = 4, /* [N, C] the residual stream after attention: ln2's input */
    SV_RES3 = 5, /* [N, C] the residual stream after the MLP: the next layer's ln1 input (the
                    final norm's after the last layer). In the forward the scratch of res3
                    holds layer l-1's output while layer l reads it and then layer l's. */
    SV_COUNT
} layer_save;

typedef enum {
    SAVE_NONE = 0, /* the scratch only: a frozen forward, or nothing reads it back */
    SAVE_F32 = 1,  /* the layer's FP32 copy, written by the producer itself */
    SAVE_BF16 = 2  /* the layer's BF16 copy (bf16_pack) of the FP32 scratch */
} save_kind;

/* The plan of one linear layer (linear_plan.c), decided once per policy, hook and option
 * change (model_plan) and read by every call: what is fused into its operands, where its
 * bias goes, what its forward keeps for the backward. Entries indexed [frozen] differ between
 * a training forward (0) and a frozen one (1, no backward follows it). */
typedef struct {
    unsigned char scaled[FP8T_GEMM_COUNT]; /* the GEMM takes the scaled-operand path
                                              (model_scaled_path of its precision) */
    unsigned char save_x;           /* a training Fprop keeps its X operand (codes, BF16, scaled)
                                   for the Wgrad instead of X in FP32 (x_codes) */
    unsigned char step_fused[2];    /* the Fprop's rounding pass applies the producer step itself
                                   (fc2: GELU; down: SwiGLU; GPT-2's qkv, fc1: the LayerNorm):
                                   its FP32 output is never written */
    unsigned char bias_gemm;        /* the Fprop's bias rides in its GEMM (else bias_add after the
                                   hook's output site) */
    unsigned char bias_gemm_replay; /* ... in a replay, which has no hook */
    unsigned char bias_residual; /* proj, fc2: the residual add after the Fprop takes the bias */
    unsigned char bias_next[2];  /* fc1: fc2's fused GELU pass takes fc1's bias */
    unsigned char dy_shared;     /* the Dgrad's dY operand can serve the Wgrad when the Wgrad
                                   runs in the Dgrad's precision (model_plan_reuse_dy) */
    unsigned char colsum;        /* the bias gradient from the Dgrad's rounding pass */
    unsigned char dgelu;         /* fc1: the Dgrad's rounding pass applies GELU's backward
                                   (where dY is shared and colsum holds) */
    unsigned char dswiglu;       /* gate, up: the Dgrad's rounding pass computes dY from
                                   SwiGLU's output gradient and its saved inputs (where dY is
                                   shared; linear_dswiglu_fused) */
    unsigned char bf16_dy;       /* all three GEMMs on BF16 operands, dY shared, no hook
                                   (linear_bf16_dy_fusable: the head's fused cross-entropy) */
    unsigned char x_shared;      /* up: the Fprop takes the X operand gate's Fprop made of the
                                   same X (BF16 operands or the scaled path in both, whose
                                   operands depend only on X), and its Wgrad the X gate kept */
    int token_chunk; /* the LM head under a read-only hook, where the unhooked model chunks it
                        (head.c): its BF16 GEMMs run in chunks of this many tokens; 0: whole */
} linear_plan;

/* The X operand gate's Fprop made, for up's (linear_plan.x_shared): valid from gate's Fprop to
 * up's, which consumes it; x identifies the FP32 X it was made of. */
typedef struct {
    const float *x;
    fp8t_fp8_operand q;  /* the scaled path's row-major operand (scratch, untouched until up) */
    fp8t_bf16_operand h; /* the BF16 operand */
    int valid;
} shared_x_operand;

/* A growable device scratch buffer. */
typedef struct {
    void *p;
    size_t bytes;
} scratch_buf;

struct fp8t_model {
    fp8t_backend *be;
    const fp8t_backend_ops *ops;
    fp8t_model_config cfg;
    fp8t_policy policy;
    int B, T;

    /* parameters */
    int n_tensors;
    fp8t_param_info *info; /* [n_tensors] host */
    size_t num_params;
    float *params, *grads, *adam_m, *adam_v; /* device, [num_params] each */
    model_tensors p, g;                      /* views into params and grads */

    /* activations */
    float *act_memory;
    activations a;
    int *tokens, *targets; /* device [N] each (one allocation) */
    int have_targets;      /* the last forward had targets and ran unfrozen (backward allowed) */
    int n_valid_targets;   /* non-ignored targets of the last forward */
    int frozen;            /* fp8t_model_set_frozen: forwards leave the training state alone */
    int last_forward_frozen; /* the last forward ran frozen (a backward is refused) */
    float *scalars;          /* device [4]: loss sum, sumsq accumulator, dlogits amax */

    /* FP8 */
    int n_lin, n_fp8, hist_len;
    int state_hybrid;     /* dY format of fp8_state (1: E5M2); policy.hybrid may differ
                                    only while frozen (the conversion waits for the unfreeze) */
    float *fp8_state;     /* device, fp8t_recipe_state layout over (n_fp8, hist_len) */
    fp8t_recipe_state st; /* views into fp8_state (device pointers) */
    float *cur;           /* device [3 * n_fp8]: current-scaling amax, scale, scale_inv */
    float *cur_amax, *cur_scale, *cur_scale_inv; /* views into cur, [n_fp8] each */
    fp8t_precision (*prec)[FP8T_GEMM_COUNT];     /* [n_lin][3] resolved precisions */
    weight_cache (*wcache)[WCACHE_SLOTS];        /* [n_lin][2] */
    int *w_amax_done;                            /* [n_lin] host: W amax recorded this step */
    linear_plan *plan;                           /* [n_lin] host (model_plan) */
    unsigned char *layer_bf16; /* [L] host: the layer keeps its saves in BF16 (model_plan) */
    scratch_buf codes[2], codes_t[2]; /* FP8 codes of the activation operands (A, B) */
    scratch_buf h16[2];               /* BF16 operands of the activations (A, B) */
    scratch_buf fq[2];                /* fake/block/MX quantized copies of the operands (A, B) */
    scratch_buf bsc[2], bsc_t[2];     /* block / rowwise: scale_inv of codes / codes_t (A, B) */
    scratch_buf wgrad_tmp;            /* dW of one micro-batch, handed to the hook */

    fp8t_tensor_hook hook;
    void *hook_ctx;
    int hook_reads;                  /* the hook only reads (fp8t_model_set_observer) */
    fp8t_grads_ready_fn grads_ready; /* fp8t_model_set_grads_ready (NULL: none) */
    void *grads_ready_ctx;

    /* Fused softmax + cross-entropy (forward.c, backward.c): a training forward writes the
     * losses AND dlogits = (softmax - onehot) * xent_dloss / count into a->logits in one pass,
     * and the backward skips its own pass when its dloss is xent_dloss. xent_dloss is the
     * dloss of the previous backward (the trainer's 1/accum is the same every micro-batch), so
     * fusion starts after a model's first backward and the result is bit-identical to the
     * plain path. */
    int no_fused_xent; /* FP8T_DISABLE_FUSED_XENT at create: always the plain path */
    int xent_fused;    /* a->logits holds the last forward's dlogits, not its logits */
    /* ... or, when xent_bf16 is also set, a->logits holds the logits with rows pad(V) apart
     * and the dlogits are the BF16 operand in h16[0], their amax in scalars[2] (the head's
     * three GEMMs in BF16: linear_bf16_dy_fusable). Off with FP8T_DISABLE_BF16_XENT. */
    int xent_bf16;
    int xent_f32; /* ... and the FP32 dlogits over those rows (a read-only hook's forward) */
    int no_bf16_xent;
    int xent_dloss_known; /* a backward has run with a finite, nonzero dloss */
    float xent_dloss;     /* that dloss, folded into the next fused forward */
    unsigned epoch;       /* bumped by whatever changes the head GEMM's result: adamw,
                              end_step, set_policy (so a stale replay is never trusted) */
    unsigned xent_epoch;  /* epoch of the fused forward */
    /* FP8T_DISABLE_CODE_REUSE at create: the Wgrad quantizes dY again instead of reusing the
     * Dgrad's codes (linear.c) */
    int no_code_reuse;
    /* FP8T_DISABLE_BF16_OPERANDS at create: a BF16 GEMM rounds its FP32 operands itself
     * (gemm_bf16) every time, as before the BF16 operands existed: no cached BF16 weights, no
     * BF16 X kept for the Wgrad, no dY shared by Dgrad and Wgrad, the bias added on its own */
    int no_bf16_operands;
    /* FP8T_DISABLE_GELU_FUSION at create: GELU writes its FP32 output and fc2 rounds it
     * (linear_forward_gelu) */
    int no_gelu_fusion;
    /* FP8T_DISABLE_BIAS_GRAD_FUSION at create: bias_backward reads dY in its own pass instead
     * of the Dgrad's rounding pass adding dY's column sums (linear.c) */
    int no_colsum_fusion;
    /* FP8T_DISABLE_GELU_BWD_FUSION at create: gelu_backward writes fc1's dY in FP32 and fc1's
     * Dgrad rounds it (linear_backward_gelu) */
    int no_gelu_bwd_fusion;
    /* FP8T_DISABLE_SWIGLU_FUSION / _SWIGLU_BWD_FUSION at create: SwiGLU writes its FP32 output
     * and down rounds it (linear_forward_swiglu); swiglu_backward writes gate's and up's dY in
     * FP32 and their Dgrads round them (linear_backward_dswiglu) */
    int no_swiglu_fusion, no_swiglu_bwd_fusion;
    int no_x_share; /* FP8T_DISABLE_X_SHARE: up rounds gate's X itself (linear_plan.x_shared) */
    shared_x_operand x_share;
    /* FP8T_DISABLE_RESIDUAL_BIAS at create: proj and fc2 add their bias themselves (in the
     * GEMM or a pass of its own) instead of the residual add (forward.c) */
    int no_residual_bias;
    /* FP8T_DISABLE_LN_FUSION at create: LayerNorm writes its FP32 output and the next linear
     * rounds it (linear_forward_ln) */
    int no_ln_fusion;
    /* The backend's attention state kept by each layer's training forward for its backward
     * (attention_saved_bytes each; the CUDA flash path's BF16 q, k, v), [L] device pointers
     * allocated by the first training forward that has any; NULL when the backend keeps
     * nothing or under FP8T_DISABLE_ATTN_SAVE (the backward rebuilds it from qkv). */
    void **attn_saved;
    int no_attn_save;
    int *gelu_bias_deferred; /* [L] host: the last forward left fc1's bias to fc2's fused GELU
                                pass, so fch holds fc1's output without it (forward.c) */

    /* FP8 codes of X kept for the Wgrad (the plan's save_x): a linear whose Fprop and Wgrad
     * share a per-tensor FP8 precision, with no hook, keeps the codes its Fprop made (1 byte
     * per element) instead of its FP32 input, and its Wgrad does not quantize X again. */
    int no_fp8_save;        /* FP8T_DISABLE_FP8_SAVE at create: keep every X in FP32, as the
                              carved [L, ...] buffers, and re-quantize it for the Wgrad */
    x_codes *xq;            /* [n_lin] */
    float *(*wx)[WX_COUNT]; /* [L][WX_COUNT] device [N, C] / [N, H]: layer l's FP32 copy of a
                              Wgrad-only input, NULL until a training forward first needs it
                              (then kept); slices of act_memory under no_fp8_save */
    float *wx_scratch;      /* device [N, max(C, H)]: the one-layer home of a Wgrad-only input
                              whose layer copy is not allocated (it lives from its norm or
                              activation to its Fprop); allocated when first needed */
    int warned_saved;       /* the backward's note on a hook/policy change was printed */
    /* the gradients are all zero (zero_grad, no backward since): a hooked Wgrad then
     * accumulates straight into dW, which is this micro-batch's alone, as the unhooked path */
    int grads_zero;
    int warned_block; /* a block or rowwise GEMM's shape left the FP8 tensor cores
                              (printed once) */

    /* Layer saves (layer_save): what the last forward kept per layer (model_forward_saves),
     * the per-layer copies (allocated when a training forward first keeps one in that
     * format, then kept) and one layer's FP32 scratch per save. */
    unsigned char (*sv_kind)[SV_COUNT]; /* [L] save_kind */
    float *(*sv32)[SV_COUNT];           /* [L] device [N, cols] */
    uint16_t *(*sv16)[SV_COUNT];        /* [L] device [N, cols] packed BF16 (bf16_pack) */
    float *sv_scratch[SV_COUNT];        /* device [N, cols] */
    /* FP8T_DISABLE_BF16_SAVES at create: layers whose GEMMs are all below FP32 keep their
     * saves in FP32 too (as a layer with an FP32 GEMM does, or any layer under a hook) */
    int no_bf16_saves;
    /* device bytes allocated after create for activations (layer saves and their scratch,
     * the Wgrad inputs' copies and codes, the attention state): fp8t_model_activation_bytes */
    size_t act_lazy_bytes;
    size_t act_carved_bytes; /* act_memory and the token buffers */
    float *act_tail;         /* act_memory past dc1 (the backward scratch a forward leaves
                                free) ... */
    size_t act_tail_bytes;   /* ... and its size */

    /* The LM head in chunks (head.c). The chunked forward leaves the head's gradient for the
     * backward: dlnf in a->dc1, this micro-batch's dW in hc_dw, the dlogits' amax in
     * scalars[2], all made with the dloss hc_dloss. */
    int hc_rows;    /* rows per chunk; 0: this model never chunks (model_head_plan) */
    int hc_grad;    /* the last forward left that gradient (a backward may follow) */
    int hc_pending; /* ... or the losses only, before the model's first backward: the
                                backward runs the chunks */
    float hc_dloss;
    float *hc_dw;                /* [V, C] FP32: in act_tail, or allocated when first needed */
    float *hc_logits;            /* [hc_rows, pad(V)] FP32 logits of one chunk (likewise) */
    uint16_t *hc_dlogits;        /* BF16 operand of one chunk's dlogits [hc_rows, V] (likewise) */
    int hc_dw_own, hc_chunk_own; /* allocated (freed by destroy), else inside act_tail */
    int logits_missing; /* a->logits does not hold the last forward's logits (packed): the
                                chunked head ran, or a BF16 fused backward left them rows
                                pad(V) apart */
};

/* The precisions whose GEMM operands are per-tensor FP8 codes (delayed, current). */
static inline int model_prec_has_codes(fp8t_precision p) {
    return p == FP8T_PREC_DELAYED || p == FP8T_PREC_CURRENT;
}

/* BF16 with BF16 operands (make_operand, gemm_bf16_rounded): not FP8T_DISABLE_BF16_OPERANDS */
static inline int model_prec_bf16_operands(const fp8t_model *m, fp8t_precision p) {
    return p == FP8T_PREC_BF16 && !m->no_bf16_operands;
}

/* The precisions whose prepared operand one GEMM can hand to another (dY Dgrad -> Wgrad,
 * X Fprop -> Wgrad): FP8 codes, and BF16 operands unless FP8T_DISABLE_BF16_OPERANDS. */
static inline int model_prec_shares_operands(const fp8t_model *m, fp8t_precision p) {
    return model_prec_has_codes(p) || model_prec_bf16_operands(m, p);
}

/* The precisions whose rounding pass needs nothing of its input beforehand (BF16 operands;
 * delayed FP8, whose scale is known before the pass), so the op that makes the input can do the
 * rounding itself (the GELU forward and backward fusions). */
static inline int model_prec_one_pass(const fp8t_model *m, fp8t_precision p) {
    return p == FP8T_PREC_DELAYED || model_prec_bf16_operands(m, p);
}

/* The block-family precisions: block- or row-scaled FP8 operands (make_operand). */
static inline int model_prec_scaled(fp8t_precision p) {
    return p == FP8T_PREC_BLOCK || p == FP8T_PREC_ROWWISE;
}

/* model.c */
void *model_scratch(fp8t_model *m, scratch_buf *s, size_t bytes);
fp8_format model_fp8_format(const fp8t_model *m, int role);
/* The FP8 format of role's operands in a block or rowwise GEMM: E4M3, or E5M2 for dY when the
 * policy's block_hybrid asks for it. */
fp8_format model_scaled_format(const fp8t_model *m, int role);
/* The format of role's operand (or result, as call_hook reports it) in GEMM g of linear lin. */
fp8_format model_gemm_format(const fp8t_model *m, int lin, fp8t_gemm_kind g, int role);
void model_invalidate_weight_caches(fp8t_model *m);
/* 1 (after a message naming fn) when the model is frozen and fn must not run */
int model_refuse_if_frozen(const fp8t_model *m, const char *fn);
int model_lin_layer(const fp8t_model *m, int lin);
void model_layer_view(layer_view *v, const fp8t_model *m, int l);
/* At the start of a forward: mark per linear whether this forward saves X's operand for the
 * Wgrad as the plan says (a training forward; a frozen one changes nothing, no backward
 * follows it), and allocate the layer copies and the one-layer scratch the forward will
 * write. */
void model_forward_saves(fp8t_model *m);
/* ops->malloc, counted in act_lazy_bytes (activation memory allocated after create) */
void *model_act_malloc(fp8t_model *m, size_t bytes);
/* The FP32 location save k of layer l is written to (and read from) in the forward: the
 * layer's FP32 copy, or the one-layer scratch */
float *model_save_fwd(const fp8t_model *m, int l, layer_save k);
/* Forward: after save k of layer l was written to its forward location (layer_view), make
 * the layer's BF16 copy where the plan keeps one; bias (may be NULL) is added first (the
 * deferred bias of fc1: the copy then holds GELU's whole input, as without the deferral). */
void model_save_store(fp8t_model *m, int l, layer_save k, const float *bias);
/* The layer's BF16 copy of save k where the plan keeps one (SAVE_BF16), else NULL: for an op
 * that writes the copy in its own pass (swiglu_forward) or reads it as it is
 * (swiglu_backward), instead of model_save_store / model_save_restore */
uint16_t *model_save_bf16(const fp8t_model *m, int l, layer_save k);
/* Backward: the FP32 values of save k of layer l: the layer's FP32 copy, or its BF16 copy
 * widened into the scratch (valid until the next restore of k); the scratch, unread, when
 * nothing was kept. */
float *model_save_restore(fp8t_model *m, int l, layer_save k);
/* Backward, for a reader that can take the BF16 copy as it is (takes16): *x16 = that copy and
 * NULL returned where the layer keeps one, else *x16 = NULL and model_save_restore's values */
const float *model_save_read(fp8t_model *m, int l, layer_save k, int takes16,
                             const uint16_t **x16);
fp8t_module model_lin_module(const fp8t_model *m, int lin);

/* The LM head's weight [V, C]: lm_head.w when untied, else wte (params or grads) */
static inline float *model_head_w(const model_tensors *t) {
    return t->lm_head ? t->lm_head : t->wte;
}

/* forward.c: the residual stream after the last block, [N, C], where the forward wrote it */
const float *model_final_residual(const fp8t_model *m);
/* forward.c: after a fused or chunked forward, put the logits back into a->logits (the head
 * GEMM again, without hooks or amax recording: the same inputs give the same bits; a->logits
 * allocated if it was not) and clear xent_fused. 0 done (or nothing to do); -1 when the
 * weights, scales or policy changed since that forward (the logits cannot be rebuilt;
 * a->logits keeps what it held). */
int model_restore_logits(fp8t_model *m);

/* head.c — the LM head in chunks, and the [N, V] logits buffer */
/* a->logits, allocated (and counted) on first use */
float *model_logits_buf(fp8t_model *m);
/* At create, after the activations are carved: the chunk rows from the option (rows, a
 * multiple of 8 (checked by create), FP8T_HEAD_CHUNK_AUTO or _OFF) and where the chunk
 * buffers live. */
void model_head_plan(fp8t_model *m, int opt);
/* Whether a forward with targets runs the head in chunks: the model chunks, no hook, the
 * head's three GEMMs on BF16 operands (linear_bf16_dy_fusable) */
int model_head_chunked(const fp8t_model *m);
/* The chunked head of a forward whose targets are on the device and counted
 * (n_valid_targets), after the final norm: the losses; in a training forward after the
 * model's first backward also the gradient for the backward (hc_grad) with that backward's
 * dloss, before it nothing more (hc_pending). */
void model_head_forward(fp8t_model *m);
/* The backward's head after a chunked forward (hc_grad or hc_pending): dlnf in a->dc1, dW +=
 * the head's gradient, dY's amax recorded; 1. With a dloss other than the forward's, the
 * chunks are computed again with it (the same bits as a forward that had it), or, when the
 * weights, scales, policy or hook changed in between, the gradient is scaled by the ratio.
 * 0 when a pending head can no longer chunk (a hook, another head precision): the logits
 * are then in a->logits (made again) for the plain path. */
int model_head_backward(fp8t_model *m, float dloss);
/* destroy: the buffers head.c allocated */
void model_head_free(fp8t_model *m);
/* linear_plan.c — the plan of each linear (linear_plan) */
/* every linear's plan and every layer's save format, from the resolved precisions, the hook,
 * the switches, the backend and the shapes: at create, set_policy, set_hook, set_observer */
void model_plan(fp8t_model *m);
/* Whether the Wgrad of linear lin, running in precision wgrad (the policy's, or the one the
 * forward kept X's operand in), takes the Dgrad's dY operand: the plan's dy_shared, in the
 * Dgrad's precision */
int model_plan_reuse_dy(const fp8t_model *m, int lin, fp8t_precision wgrad);
/* IN and OUT of linear lin; whether its GEMMs' every dimension is a multiple of 16 */
void model_lin_shape(const fp8t_model *m, int lin, int *in, int *out);
int model_lin_dims_16(const fp8t_model *m, int lin);
/* Whether linear lin's GEMMs of precision p take the scaled-operand path
 * (scaled operands from make_operand + a block- or row-scaled gemm_fp8, operands shared
 * between the GEMMs as the per-tensor FP8 ones): rowwise always (gemm_fp8 falls back to
 * decode + FP32 where the hardware has no kernel), block on a backend with fp8_block_native
 * when every dimension of the linear's GEMMs is a multiple of 16, or with power-of-two scales
 * (then the decode is exact, code * (1/scale) being code / scale); 0 for every other
 * precision. */
int model_scaled_path(const fp8t_model *m, int lin, fp8t_precision p);

/* linear.c — one linear layer Y = X·Wᵀ (+ bias), X [N, IN], W [OUT, IN], Y [N, OUT].
 * The forward records amax(X), amax(W); the backward records amax(dY) and writes dX
 * (overwrite) and accumulates dW (+=) and dbias (+=, when non-NULL). */
void linear_forward(fp8t_model *m, int lin, float *Y, float *X, const float *W, const float *bias,
                    int N, int IN, int OUT);
void linear_backward(fp8t_model *m, int lin, float *dX, float *dW, float *dbias, float *dY,
                     float *X, const float *W, int N, int IN, int OUT);
/* linear_forward of X = gelu(pre), pre [N, IN]: where the Fprop rounds its input itself (BF16
 * operands, delayed FP8) and nothing needs gelu(pre) in FP32, the rounding pass applies GELU
 * (make_operand's step GELU) and act is left alone (unless the backend has no one-pass
 * kernel for it: model_make_operand composes into act); otherwise act = gelu(pre) [N, IN] and
 * linear_forward(act). Off with FP8T_DISABLE_GELU_FUSION. pre_bias (only where
 * linear_gelu_takes_bias said so, else NULL): the bias of the linear that made pre, which it
 * left out: GELU's input is pre + pre_bias, added by the rounding pass (pre stays without it,
 * and the backward takes gelu_backward_bias). pre16 (or NULL): the layer's BF16 save of GELU's
 * input (pre + pre_bias: bf16_pack's bits), written by that pass (else by bf16_pack). */
void linear_forward_gelu(fp8t_model *m, int lin, float *Y, float *act, float *pre,
                         const float *pre_bias, uint16_t *pre16, const float *W,
                         const float *bias, int N, int IN, int OUT);
/* A norm whose output is a linear's input: its statistics outputs and parameters */
typedef struct {
    float *mean, *rstd; /* [N] each, written (RMSNorm: rstd only) */
    const float *w, *b; /* [C] each */
    float eps;
    const float *res_a, *res_c; /* NULL, or the norm's input x is res_a + res_c [N, C]: the
                                   residual add, written to x by the norm's pass */
    uint16_t *sum16;            /* with res_a (or NULL): x's BF16 copy too (a layer's save) */
    int rms;                    /* RMSNorm (Llama; mean and b NULL), else LayerNorm */
} ln_input;
/* linear_forward of X = norm(x) (x [N, IN]; LayerNorm, or RMSNorm with ln->rms): where the
 * Fprop takes BF16 operands and nothing needs the norm's output in FP32, the norm writes the
 * operand itself (make_operand's step LAYERNORM / ADD_LAYERNORM / RMSNORM / ADD_RMSNORM) and
 * ln_out is left alone (unless the backend has no one-pass kernel for it: model_make_operand
 * composes into ln_out); otherwise ln_out = norm(x) [N, IN] and linear_forward(ln_out).
 * Either way ln's statistics are written. Off with FP8T_DISABLE_LN_FUSION. */
void linear_forward_ln(fp8t_model *m, int lin, float *Y, float *ln_out, const ln_input *ln,
                       float *x, const float *W, const float *bias, int N, int IN, int OUT);
/* linear_backward of the linear whose input is gelu(pre): its dY = gelu'(pre (+ pre_bias)) *
 * dact, dact [N, OUT] being the gradient of GELU's output. Where the Dgrad rounds dY itself in
 * one pass (BF16 operands, delayed FP8) and nothing else reads dY in FP32, that pass computes
 * it (make_operand's step DGELU, with the column sums) and dpre is left alone (or composed
 * into, as act in linear_forward_gelu);
 * otherwise dpre [N, OUT] = dY (gelu_backward / gelu_backward_bias) and linear_backward(dpre).
 * Off with FP8T_DISABLE_GELU_BWD_FUSION. pre_bias: as linear_forward_gelu's (the deferred
 * bias of the linear that made pre), or NULL. pre16: instead of pre (NULL, no pre_bias), GELU's
 * input as the layer's BF16 save, read by that pass: only where linear_dgelu_fused. */
void linear_backward_gelu(fp8t_model *m, int lin, float *dX, float *dW, float *dbias, float *dpre,
                          const float *dact, const float *pre, const uint16_t *pre16,
                          const float *pre_bias, float *X, const float *W, int N, int IN,
                          int OUT);
/* Whether linear_backward_gelu of lin (with a bias gradient or not) applies GELU's backward in
 * the Dgrad's rounding pass (the plan's dgelu, dY shared with the Wgrad, the column sums there) */
int linear_dgelu_fused(const fp8t_model *m, int lin, int has_bias);
/* linear_forward of down, whose input is SwiGLU(gate, up) [N, IN]: where down's Fprop is on
 * the scaled path (block, rowwise) and nothing needs SwiGLU's output in FP32, that rounding
 * pass computes it from gate and up and also writes their BF16 saves gate16 / up16 (each may
 * be NULL) (make_operand's step SWIGLU), and act is left alone (or composed into); otherwise
 * act = SwiGLU(gate, up) (swiglu_forward, with the saves) and linear_forward(act). Off with
 * FP8T_DISABLE_SWIGLU_FUSION. */
void linear_forward_swiglu(fp8t_model *m, int lin, float *Y, float *act, const float *gate,
                           const float *up, uint16_t *gate16, uint16_t *up16, const float *W,
                           int N, int IN, int OUT);
/* Whether the Dgrads of gate and up (linears gate_lin and gate_lin + 1) compute their dY from
 * SwiGLU's output gradient in their rounding passes: both on the scaled path, dY shared with
 * their Wgrads, no hook (the plan's dswiglu). Off with FP8T_DISABLE_SWIGLU_BWD_FUSION. */
int linear_dswiglu_fused(const fp8t_model *m, int gate_lin);
/* linear_backward of gate or up (lin's module says which), whose dY is that gradient of SwiGLU
 * with dact [N, OUT] the gradient of its output and gate / up its inputs (FP32, or NULL and
 * their BF16 saves; up is read for the gate's only), made by the Dgrad's rounding pass (only
 * where linear_dswiglu_fused): no FP32 dY is written. No bias. */
void linear_backward_dswiglu(fp8t_model *m, int lin, float *dX, float *dW, const float *dact,
                             const float *gate, const uint16_t *gate16, const float *up,
                             const uint16_t *up16, float *X, const float *W, int N, int IN,
                             int OUT);
/* Whether linear lin, whose output is added to the residual stream, leaves its bias to that
 * add (add_bias: the same bits as bias_add then add, without the pass over the output that
 * an FP8 GEMM's bias costs); not where the bias rides in a BF16 GEMM's epilogue for free, not
 * with a writing hook. Off with FP8T_DISABLE_RESIDUAL_BIAS. (The plan's bias_residual.) */
int linear_residual_takes_bias(const fp8t_model *m, int lin);
/* Whether fc1 (which makes GELU's input) leaves its bias to fc2's fused GELU pass in this
 * forward: fc1's Fprop is FP8 (per-tensor or on the scaled path) and fc2's is delayed FP8 or
 * on the scaled path (block, rowwise), with the GELU fusion. (The plan's bias_next.) */
int linear_gelu_takes_bias(const fp8t_model *m, int fc1);
/* Whether lin's GEMMs all take BF16 operands, the Dgrad's dY operand serving the Wgrad, with no
 * writing hook (the plan's bf16_dy): then its dY may come already rounded (softmax_xent_bf16)
 * and its Fprop may write a strided Y (linear_forward_ld, linear_backward_bf16_dy: the head's
 * fused cross-entropy; a read-only hook is shown the strided rows). */
int linear_bf16_dy_fusable(const fp8t_model *m, int lin);
/* linear_forward without bias into Y [N, ldy], ldy >= pad(OUT) (columns >= OUT are written
 * too, with zeros); only where linear_bf16_dy_fusable. */
void linear_forward_ld(fp8t_model *m, int lin, float *Y, int ldy, float *X, const float *W, int N,
                       int IN, int OUT);
/* linear_backward (no bias) from dY's BF16 operand dy [N, OUT], both GEMMs in BF16, dY's amax
 * (device scalar dy_amax, the FP32 values' before rounding) recorded into its history; dX,
 * this micro-batch's dW and the amax scaled by r when r != 1 (dy_amax is overwritten then).
 * dy32: the FP32 values dy was rounded from, rows of stride ld, for a read-only hook's dY sites
 * (scaled by r in place when r != 1); NULL without a hook. */
void linear_backward_bf16_dy(fp8t_model *m, int lin, float *dX, float *dW,
                             const fp8t_bf16_operand *dy, float *dy_amax, float *dy32, int ld,
                             float *X, const float *W, int N, int IN, int OUT, float r);
/* The Fprop of linear_forward again, to rebuild an output that was overwritten: no hooks, no
 * amax recording, the step's weight codes from the cache. */
void linear_forward_replay(fp8t_model *m, int lin, float *Y, float *X, const float *W,
                           const float *bias, int N, int IN, int OUT);
/* The BF16 operands of linear lin's Fprop (only where linear_bf16_dy_fusable) as its Fprop
 * makes them, for a caller that runs the three GEMMs itself on row ranges of them (the
 * chunked head; xq[lin].saved must be clear: no X is kept for a later Wgrad): X [N, IN]
 * rounded into the operand scratch, W from the per-step cache. record (ignored while frozen):
 * a training forward's pass, which records amax(X) and, once per step, amax(W). Valid until
 * another linear's GEMM. */
void linear_bf16_fprop_operands(fp8t_model *m, int lin, float *X, const float *W, int N, int IN,
                                int OUT, int record, fp8t_bf16_operand *x, fp8t_bf16_operand *w);

#endif
