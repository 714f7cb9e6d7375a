/* fp8train — the precision policy: which precision each linear-layer GEMM runs in.
 *
 * A policy is a run default plus ordered overrides; the last matching override wins. An
 * override matches by layer range, module and GEMM kind. Sources, in increasing precedence:
 * config file, environment (FP8TRAIN_FPROP / FP8TRAIN_DGRAD / FP8TRAIN_WGRAD, read by the option
 * layer: fp8t_policy_apply_switches), command line.
 *
 * Override syntax (one per --override, or several joined by ';'):
 *   layers=2-3,module=fc2+fc1,gemm=dgrad+wgrad,precision=bf16
 * keys: layers = A | A-B | first:N | last:N | all ;  module = qkv|proj|fc1|fc2|gate|up|down|head
 * (joined by '+'; "mlp" = fc1+fc2+gate+up+down, "attn" = qkv+proj); gemm = fprop|dgrad|wgrad
 * (joined by '+'); precision = fp8|delayed|current|block|rowwise|mxfp8|fake|bf16|fp32
 * (required).
 * Missing keys match everything except the head (the head is matched only when module names it).
 */
#ifndef FP8TRAIN_POLICY_H
#define FP8TRAIN_POLICY_H

#include <stddef.h>
#include "fp8train/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FP8T_PREC_FP8 = 0, /* the run's recipe (policy.recipe: delayed or current) */
    FP8T_PREC_DELAYED, /* per-tensor delayed scaling */
    FP8T_PREC_CURRENT, /* per-tensor current scaling */
    FP8T_PREC_BLOCK,   /* 1x128 / 128x128 block scaling (DeepSeek-V3; native on Hopper) */
    FP8T_PREC_MXFP8,   /* MXFP8 (emulated around the GEMM) */
    FP8T_PREC_FAKE,    /* quantize-dequantize (current scaling), GEMM in BF16 */
    FP8T_PREC_BF16,    /* BF16 operands, FP32 accumulation */
    FP8T_PREC_FP32,    /* FP32 (gradient checks, references) */
    FP8T_PREC_ROWWISE, /* one scale per row of each K-major operand, over K (torchao rowwise;
                           native on Hopper) */
    FP8T_PREC_COUNT
} fp8t_precision;

typedef enum {
    FP8T_GEMM_FPROP = 0,
    FP8T_GEMM_DGRAD = 1,
    FP8T_GEMM_WGRAD = 2,
    FP8T_GEMM_COUNT
} fp8t_gemm_kind;

typedef enum {
    FP8T_MOD_QKV = 0,
    FP8T_MOD_PROJ,
    FP8T_MOD_FC1,
    FP8T_MOD_FC2, /* GPT-2 */
    FP8T_MOD_GATE,
    FP8T_MOD_UP,
    FP8T_MOD_DOWN, /* Llama SwiGLU (qkv, proj too) */
    FP8T_MOD_HEAD, /* LM head (tied embedding) */
    FP8T_MOD_COUNT
} fp8t_module;

#define FP8T_MAX_OVERRIDES 64
#define FP8T_LAYER_ALL (-1000000)
#define FP8T_LAYER_FIRST_BASE (-2000000) /* layers=first:N stored as lo = BASE - N */
#define FP8T_LAYER_LAST_BASE (-3000000)  /* layers=last:N  stored as lo = BASE - N */

typedef struct {
    int layer_lo, layer_hi; /* inclusive range, or FP8T_LAYER_ALL / FIRST / LAST encodings */
    unsigned module_mask;   /* bit (1u<<fp8t_module); 0 = every module but the head */
    unsigned gemm_mask;     /* bit (1u<<fp8t_gemm_kind); 0 = all three */
    fp8t_precision precision;
} fp8t_override;

typedef struct {
    fp8t_precision default_precision; /* --precision */
    fp8t_precision recipe;            /* what "fp8" means: FP8T_PREC_DELAYED or _CURRENT */
    int hybrid;                       /* 1: E4M3 forward, E5M2 gradients; 0: E4M3 only */
    int block_hybrid;                 /* block and rowwise GEMMs: 1 E5M2 gradients (--format
                                         hybrid given), 0 E4M3 everywhere (the default, as
                                         DeepSeek-V3 and Transformer Engine) */
    int history_len;                  /* delayed: amax history length (default 1024) */
    fp8t_amax_algo algo;              /* delayed: max | most_recent */
    int margin;                       /* delayed: scale /= 2^margin */
    int pow2_scales;                  /* current, block, rowwise: round scales down to powers
                                         of two */
    float epsilon;                    /* current: amax floor */
    fp8t_precision head_precision;    /* LM head default (BF16) */
    int fast_accum_fprop;             /* Hopper fast accumulation for Fprop (default 1) */
    int fast_accum_grad;              /* ... for Dgrad/Wgrad (default 0) */
    int n_overrides;
    fp8t_override overrides[FP8T_MAX_OVERRIDES];
} fp8t_policy;

/* Defaults: precision fp8, recipe delayed, hybrid (block and rowwise: E4M3), history 1024,
 * max, margin 0, eps 0, head bf16, fast accum fprop on / grads off, no overrides. */
void fp8t_policy_default(fp8t_policy *p);

const char *fp8t_precision_name(fp8t_precision p);
int fp8t_precision_parse(fp8t_precision *out, const char *s); /* 0 ok; accepts "0"=bf16 "1"=fp8 */
const char *fp8t_gemm_name(fp8t_gemm_kind g);
const char *fp8t_module_name(fp8t_module m);
int fp8t_module_parse(fp8t_module *out, const char *s);

/* Parse one or more ';'-separated overrides and append them. 0 ok; else -1 and err says what
 * is wrong and shows the expected syntax. */
int fp8t_policy_add_overrides(fp8t_policy *p, const char *spec, char *err, size_t errlen);
/* The whole-run precision switches in the form of Transformer Engine's NVTE_FP8_DGRAD=0:
 * value[0] sets the default precision, value[1 + g] appends an override that puts GEMM kind g
 * (fprop, dgrad, wgrad) of every layer in that precision; NULL or "" = not given. Values are
 * precision names, or 0 = bf16 and 1 = fp8. source[i] names where value[i] came from, for the
 * message (the option layer passes FP8TRAIN_PRECISION, FP8TRAIN_FPROP, ... of the environment).
 * 0 ok; -1 with err on a bad value. */
int fp8t_policy_apply_switches(fp8t_policy *p, const char *const value[1 + FP8T_GEMM_COUNT],
                               const char *const source[1 + FP8T_GEMM_COUNT], char *err,
                               size_t errlen);

/* The concrete precision of one GEMM: never FP8T_PREC_FP8 (resolved to the recipe). */
fp8t_precision fp8t_policy_resolve(const fp8t_policy *p, int n_layer, int layer,
                                   fp8t_module module, fp8t_gemm_kind gemm);

/* Human-readable one-line-per-rule description (written into buf). Returns buf. */
char *fp8t_policy_describe(const fp8t_policy *p, char *buf, size_t len);
/* Format one override back to its string form. */
char *fp8t_override_format(const fp8t_override *o, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
