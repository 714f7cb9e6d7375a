/* fp8train — training data: micro-batches of (tokens, targets) [B, T].
 *
 * A stream is opened on a source and a split (train or validation) and yields micro-batch
 * number `index` as a PURE FUNCTION of (source, split, seed, B, T, index): nothing else is
 * remembered, so the stream's whole state is one integer, its position (the index of the next
 * micro-batch). Saving that integer in a checkpoint and restoring it resumes the exact order.
 *
 * Sources:
 *   "synthetic"   a built-in generated language over vocab 256 (words from a fixed random
 *                 lexicon, a topic-dependent Markov chain over words, sentences, matching
 *                 brackets, topic keys repeated after '#', a little noise); generated on the
 *                 fly, no files. The validation split is another seed of the same language.
 *   a text file   bytes are tokens (vocab 256). The last 10% is the validation split, unless
 *                 a separate validation source is given.
 *   'dir/x_*.bin' llm.c token shards (glob(3) pattern; GPT-2 shards with uint16 tokens or
 *                 Llama-3 shards with uint32). The last 10% of every shard is the validation
 *                 split unless a separate validation source is given.
 *   text or JSONL through a tokenizer.json (fp8t_data_open_tok): the tokens of the file(s),
 *                 split like a text file.
 * Each row of a micro-batch is a window of T+1 consecutive tokens at a start drawn from a
 * seeded hash of (seed, index, row); targets are the tokens shifted by one.
 */
#ifndef FP8TRAIN_DATA_H
#define FP8TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP8T_SYNTHETIC_VOCAB 256

typedef enum { FP8T_SPLIT_TRAIN = 0, FP8T_SPLIT_VAL = 1 } fp8t_data_split;

typedef struct fp8t_data fp8t_data;

/* Open a stream of [B, T] micro-batches. source: "synthetic" (or "" for it), a text file or a
 * shard glob. val_source: "" (hold out a split of source) or a separate source used whole for
 * the validation split. vocab: the model's vocabulary; every token must be < vocab (checked
 * here, once, for files). NULL + err (naming the file and the fix) on any bad input. */
fp8t_data *fp8t_data_open(const char *source, const char *val_source, fp8t_data_split split,
                          int B, int T, int vocab, uint64_t seed, char *err, size_t errlen);
/* The same, with a Hugging Face tokenizer.json (NULL or "" = bytes): text sources, and JSONL
 * sources (.jsonl: one document per line, its "text" field), are tokenized with it when the
 * stream is opened, each document starting with the tokenizer's document token (as
 * `fp8train tokenize` writes them); the tokenizer's vocabulary must fit `vocab`. */
fp8t_data *fp8t_data_open_tok(const char *source, const char *val_source, const char *tokenizer,
                              fp8t_data_split split, int B, int T, int vocab, uint64_t seed,
                              char *err, size_t errlen);
void fp8t_data_close(fp8t_data *d);

/* Micro-batch number `index`: tokens [B, T], targets [B, T] (host). Pure function. */
void fp8t_data_batch(const fp8t_data *d, int *tokens, int *targets, uint64_t index);
/* The batch at the current position, then position++. */
void fp8t_data_next(fp8t_data *d, int *tokens, int *targets);
uint64_t fp8t_data_position(const fp8t_data *d);
void fp8t_data_set_position(fp8t_data *d, uint64_t position);

/* One line for logs: "synthetic language (vocab 256), train split, seed 1234". */
const char *fp8t_data_describe(const fp8t_data *d);
/* Tokens available in this split (0 for the infinite synthetic stream). */
size_t fp8t_data_num_tokens(const fp8t_data *d);
/* Largest token id the source can produce, plus one. */
int fp8t_data_vocab_needed(const fp8t_data *d);

/* The synthetic language directly: n tokens of the document stream from `seed` (tests, and a
 * way to write a sample corpus to a file). */
void fp8t_synthetic_generate(int *out, size_t n, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
