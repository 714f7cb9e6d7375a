/* fp8train — the inference model: the architectures of model.h (GPT-2; Llama/Qwen2 with
 * grouped-query attention, RoPE; tied or untied head) built for inference only.
 *
 * What lives on the device:
 *   - the linear weights in the inference precision ONLY: FP8 E4M3 codes + a per-tensor scale
 *     (current scaling from the weight's own amax, taken where it is loaded) for fp8; BF16
 *     operands (fp8t_bf16_operand) for bf16; FP32 for fp32 (the exact reference). The LM head
 *     stays BF16 in fp8 (as in training and the FP8 export). No FP32 master copy, no
 *     gradients, no optimizer state, no FP8 history: a weight goes up once through a staging
 *     buffer of one tensor's size, is converted, and the staging buffer is freed.
 *   - the token embedding as a BF16 table in bf16/fp8 (embedding_forward_bf16; it is a tied
 *     head's weight too), FP32 in fp32; positions, norm weights and biases in FP32.
 *   - the KV cache [L, B, NKV] blocks of [Tmax, HS] for K (after RoPE) and V: BF16 in bf16,
 *     FP32 in fp32, E4M3 with one scale per position and head in fp8 (fp8t_infer_opts.kv
 *     chooses another).
 *   - the activations of one layer for at most `rows` tokens (the prefill runs whole sequences
 *     `rows` tokens at a time; a decode step uses B rows): nothing is kept per layer but the
 *     cache.
 * FP8 activations are quantized per tensor with a scale that is either taken from each
 * input's amax at every call (current), or fixed: the delayed scale the checkpoint learned in
 * training (its FP8 state's X scales; an FP8 export's input_scale seeds them on import), or
 * calibrated by fp8t_infer_calibrate from the amaxes each linear's input reaches over a few
 * batches. With a fixed scale a linear's input is quantized by the op that produces it (the
 * norm, GELU, SwiGLU: add_norm_operand, quantize_gelu, swiglu_operand), with no amax pass.
 *
 * Generation: a prefill of the prompts (right-padded to the longest; causal attention never
 * lets a prompt see its padding) writes the cache and gives each prompt's next-token logits;
 * each decode step then feeds one token per sequence at its own position. On a backend that
 * records graphs (CUDA), a decode step in bf16/fp8 is recorded once per batch size and
 * replayed: the step reads its tokens and positions from device buffers, so one recording
 * serves every step. */
#ifndef FP8TRAIN_INFER_H
#define FP8TRAIN_INFER_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/export.h"
#include "fp8train/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The inference precisions (the evaluation's too: fp8train/eval.h) */
typedef enum {
    FP8T_EVAL_BF16 = 0,
    FP8T_EVAL_FP8 = 1,
    FP8T_EVAL_FP32 = 2,
    FP8T_EVAL_COUNT
} fp8t_eval_precision;
const char *fp8t_eval_precision_name(fp8t_eval_precision p); /* "bf16", "fp8", "fp32" */
int fp8t_eval_precision_parse(fp8t_eval_precision *out, const char *s); /* 0 ok, -1 unknown */

/* Where an FP8 linear's activation scale comes from. */
typedef enum {
    FP8T_ACT_SCALE_CURRENT = 0,    /* amax of the input at every call (no calibration needed) */
    FP8T_ACT_SCALE_DELAYED = 1,    /* the checkpoint's learned X scale (FP8 state), fixed */
    FP8T_ACT_SCALE_CALIBRATED = 2, /* fixed, from the input amaxes fp8t_infer_calibrate saw */
} fp8t_act_scale;
const char *fp8t_act_scale_name(fp8t_act_scale a); /* "current", "delayed", "calibrated" */
int fp8t_act_scale_parse(fp8t_act_scale *out, const char *s); /* 0 ok, -1 unknown */

typedef struct fp8t_infer fp8t_infer;

/* The defaults of fp8t_infer_opts.rows and .mlp_rows (the commands' --rows, --mlp-rows) */
#define FP8T_INFER_ROWS_DEFAULT 8192
#define FP8T_INFER_MLP_ROWS_DEFAULT 4096
/* The default of fp8t_infer_opts.prefetch_mb (--prefetch-mb) */
#define FP8T_INFER_PREFETCH_MB_DEFAULT 0

/* How to build an inference model; fp8t_infer_opts_default fills the defaults. */
typedef struct {
    fp8t_eval_precision prec;
    fp8t_act_scale act; /* fp8 only */
    int kv;             /* the cache's fp8t_kv_kind (backend.h), or -1 (default): FP32 in
                             fp32, BF16 in bf16, FP8 in fp8. FP8 needs prec bf16 or fp8 */
    int rows;           /* activation rows: tokens per prefill pass (0: the default above; at
                             least B and Tmax) */
    int mlp_rows;       /* rows of one MLP pass within a layer (0: the default; at least B,
                             at most rows): the MLP's hidden rows [mlp_rows, H] (BF16 values
                             in bf16 and fp8, which fc1 / gate and up write so; FP32 in fp32)
                             are a layer's largest buffers, so a long prefill pass runs its MLP
                             in row chunks; every op of the MLP is per row, so the chunks
                             change no value but FP8 current scaling's amax, taken per chunk
                             (and so a calibration whose batches span several chunks, as its
                             forward runs current scaling) */
    int no_graphs;      /* never record decode steps (every op runs as it is called) */
    int prefetch_mb;    /* decode steps: as each GEMM starts, the next linear's weight (its
                             first prefetch_mb MiB) starts on its way into the GPU's L2 cache
                             (prefetch_l2), so that a GEMM of a few rows reads it from there;
                             -1: the default above, 0: off. No value changes */
    int fp8_head;       /* fp8: the token embedding and the LM head in E4M3 too (one
                             per-tensor scale, the head's input quantized as the linears'
                             are); needs a vocabulary that is a multiple of 16 (cuBLASLt's
                             FP8 GEMM alignment) */
} fp8t_infer_opts;
void fp8t_infer_opts_default(fp8t_infer_opts *o, fp8t_eval_precision prec, fp8t_act_scale act);

/* Build the inference model of w (fp8t_weights_load: checkpoint, export, HF directory, llm.c
 * file) for up to B sequences of up to Tmax tokens each (prompt + generated; Tmax <=
 * seq_len). DELAYED needs w's FP8 state with an amax history for every linear's input (else
 * an error that says what to use instead); CALIBRATED needs fp8t_infer_calibrate before the
 * first forward. NULL + err on failure. */
fp8t_infer *fp8t_infer_create_opts(fp8t_backend *be, const fp8t_weights *w,
                                   const fp8t_infer_opts *o, int B, int Tmax, char *err,
                                   size_t errlen);
/* fp8t_infer_create_opts with the default options of prec and act */
fp8t_infer *fp8t_infer_create(fp8t_backend *be, const fp8t_weights *w, fp8t_eval_precision prec,
                              fp8t_act_scale act, int B, int Tmax, char *err, size_t errlen);
void fp8t_infer_destroy(fp8t_infer *m);

/* CALIBRATED: run the full-window forward over n_batches batches tokens [n_batches, nb, T]
 * (host) with current scaling, record the largest amax each FP8 linear's input reaches, and
 * fix every input's scale to the current-scaling scale of that amax (E4M3, epsilon 0); from
 * then on the model runs with those scales. Calling it again recalibrates. Other modes and
 * precisions: nothing to do, 0. 0 ok; -1 with err (sizes, tokens). */
int fp8t_infer_calibrate(fp8t_infer *m, const int *tokens, int n_batches, int nb, int T,
                         char *err, size_t errlen);
/* What the FP8 activations use, for the record: "current scaling", "delayed (learned)
 * scales", "calibrated scales (3 batches of 8 x 256 tokens)", "calibrated scales (not yet
 * calibrated)"; "-" outside fp8. */
const char *fp8t_infer_act_desc(const fp8t_infer *m);
/* 1: a CALIBRATED fp8 model that fp8t_infer_calibrate has not run on yet */
int fp8t_infer_needs_calibration(const fp8t_infer *m);
int fp8t_infer_kv(const fp8t_infer *m);       /* the cache's fp8t_kv_kind */
int fp8t_infer_graphs(const fp8t_infer *m);   /* 1: decode steps are recorded and replayed */
int fp8t_infer_fp8_head(const fp8t_infer *m); /* 1: embedding table and head in E4M3 */
/* bytes of the next weight a decode step's GEMM prefetches into L2 (0: none; prefetch_mb) */
size_t fp8t_infer_prefetch_bytes(const fp8t_infer *m);

/* Device bytes held, by kind. */
typedef struct {
    size_t weights; /* linear weights (codes, BF16 or FP32) and their scales */
    size_t other;   /* embeddings, norms, biases */
    size_t kv_cache;
    size_t activations; /* one layer's buffers for B x Tmax, the logits, operand scratch */
} fp8t_infer_memory;
void fp8t_infer_memory_get(const fp8t_infer *m, fp8t_infer_memory *mem);
const fp8t_model_config *fp8t_infer_config(const fp8t_infer *m);
int fp8t_infer_B(const fp8t_infer *m);
int fp8t_infer_Tmax(const fp8t_infer *m);

/* Prefill: tokens [nb, T] (host, row-major, right-padded; nb <= B, T <= Tmax), lens[nb] each
 * in 1..T. Runs the forward over the nb x T tokens, writes positions 0..T-1 of sequences
 * 0..nb-1 into the cache, and gives logits [nb, V] (host) of each sequence's last prompt
 * token (row lens[b] - 1); logits NULL: they are computed but not copied (benchmarks; the
 * call still waits for the device). 0 ok; -1 with err (bad sizes, tokens outside the
 * vocabulary). */
int fp8t_infer_prefill(fp8t_infer *m, const int *tokens, int nb, int T, const int *lens,
                       float *logits, char *err, size_t errlen);
/* Decode: one token per sequence, tok[nb] at position pos[nb] (host; pos[b] < Tmax, every
 * position before it already in b's cache). The tokens' K/V go into the cache at pos; logits
 * [nb, V] (host) of the next token (NULL: not copied, as prefill's). 0 ok; -1 with err. */
int fp8t_infer_decode(fp8t_infer *m, const int *tok, const int *pos, int nb, float *logits,
                      char *err, size_t errlen);
/* Logits of every position of tokens [nb, T] (host) into logits [nb * T, V] (host), no
 * cache written: the full-window forward (tests, loss evaluation). */
int fp8t_infer_forward_all(fp8t_infer *m, const int *tokens, int nb, int T, float *logits,
                           char *err, size_t errlen);

/* The mean next-token loss of tokens/targets [nb, T] (host; targets < 0 ignored) through the
 * full-window forward, the logits and losses kept on the device (softmax_xent). NaN with err
 * on bad sizes or tokens. */
double fp8t_infer_loss(fp8t_infer *m, const int *tokens, const int *targets, int nb, int T,
                       char *err, size_t errlen);
/* The same mean loss through the KV cache: a prefill of each sequence's first token, then a
 * decode step per position feeding the next token (teacher forcing), each step's logits
 * scored on the device; what the cache's precision does to the predictions. NaN with err. */
double fp8t_infer_loss_decode(fp8t_infer *m, const int *tokens, const int *targets, int nb, int T,
                              char *err, size_t errlen);
/* The per-position losses [nb, T] (host; 0 where the target is < 0) of the same forward. 0 ok;
 * -1 with err. */
int fp8t_infer_losses(fp8t_infer *m, const int *tokens, const int *targets, int nb, int T,
                      float *losses, char *err, size_t errlen);
#ifdef __cplusplus
}
#endif
#endif
