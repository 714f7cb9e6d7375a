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
 *   - the KV cache [L, B, NKV, Tmax, HS] for K (after RoPE) and V: BF16 in bf16/fp8, FP32 in
 *     fp32.
 *   - the activations of ONE layer, sized for B sequences of Tmax tokens (the prefill's rows;
 *     a decode step uses B rows of them): nothing is kept per layer but the cache.
 * FP8 activations are quantized per tensor: current scaling (an amax pass over each linear's
 * input, every call) or the delayed scale the checkpoint learned in training (its FP8 state's
 * X scales; an FP8 export's input_scale seeds them on import).
 *
 * Generation: a prefill of the prompts (right-padded to the longest; causal attention never
 * lets a prompt see its padding) writes the cache and gives each prompt's next-token logits;
 * each decode step then feeds one token per sequence at its own position. */
#ifndef FP8TRAIN_INFER_H
#define FP8TRAIN_INFER_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/eval.h"
#include "fp8train/export.h"
#include "fp8train/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where an FP8 linear's activation scale comes from. */
typedef enum {
    FP8T_ACT_SCALE_CURRENT = 0, /* amax of the input at every call (no calibration needed) */
    FP8T_ACT_SCALE_DELAYED = 1, /* the checkpoint's learned X scale (FP8 state), fixed */
} fp8t_act_scale;
const char *fp8t_act_scale_name(fp8t_act_scale a); /* "current", "delayed" */
int fp8t_act_scale_parse(fp8t_act_scale *out, const char *s); /* 0 ok, -1 unknown */

typedef struct fp8t_infer fp8t_infer;

/* Build the inference model of w (fp8t_weights_load: checkpoint, export, HF directory, llm.c
 * file) for up to B sequences of up to Tmax tokens each (prompt + generated; Tmax <=
 * seq_len) in precision prec. act applies to fp8 only; DELAYED needs w's FP8 state with an
 * amax history for every linear's input (else an error that says to use current).
 * NULL + err on failure. */
fp8t_infer *fp8t_infer_create(fp8t_backend *be, const fp8t_weights *w, fp8t_eval_precision prec,
                              fp8t_act_scale act, int B, int Tmax, char *err, size_t errlen);
void fp8t_infer_destroy(fp8t_infer *m);

/* Device bytes held, by kind. */
typedef struct {
    size_t weights;     /* linear weights (codes, BF16 or FP32) and their scales */
    size_t other;       /* embeddings, norms, biases */
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

/* Continue n prompts (prompts[i] of lens[i] >= 1 tokens, n <= B) by n_new tokens each into
 * out[i * n_new + j]: a prefill, then n_new - 1 decode steps. Sequence i samples with its
 * own random stream, fp8t_sample_seed(cfg->seed + i), so sequence 0 reproduces
 * fp8t_generate's stream. Needs max(lens) + n_new - 1 <= Tmax. 0 ok; -1 with err. */
int fp8t_infer_generate(fp8t_infer *m, const int *const *prompts, const int *lens, int n,
                        int n_new, const fp8t_sample_cfg *cfg, int *out, char *err,
                        size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
