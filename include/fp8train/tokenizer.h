/* fp8train — Hugging Face `tokenizer.json` byte-level BPE (GPT-2, Llama-3, Qwen2 styles):
 * encode text to ids and decode ids to bytes, with the same ids as the `tokenizers` library's
 * encode(text, add_special_tokens=False).
 *
 * What is read: added tokens (matched in the raw text first, leftmost-longest, before any
 * pre-tokenization; lstrip/rstrip honoured), the normalizer (none, or NFC: Unicode canonical
 * composition, from tables of Unicode 14 made by scripts/make_nfc_tables.py), the
 * pre-tokenizer (ByteLevel with or without its built-in GPT-2 regex, Split with a regex or a
 * string and behaviour Isolated/Removed, a Sequence of them; regexes run through PCRE2 with
 * UTF + UCP, so \p{L} and \p{N} are Unicode classes), the BPE model (vocab, merges in the
 * "a b" string form or the [a, b] pair form, ignore_merges) and the ByteLevel decoder.
 * Anything else (WordPiece, Metaspace, byte_fallback, ...) is refused with an error naming the
 * file and the field. Invalid UTF-8 in the text is kept: its bytes become byte tokens, so
 * decode(encode(x)) == x for any bytes (== NFC(x) with an NFC normalizer, as in `tokenizers`). */
#ifndef FP8TRAIN_TOKENIZER_H
#define FP8TRAIN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fp8t_bpe fp8t_bpe;

/* A growable id array; encode appends to it. Zero-initialise, free with free(ids.v). */
typedef struct {
    int32_t *v;
    size_t n, cap;
} fp8t_tok_ids;

/* Read a tokenizer.json (path may also be a model directory holding one). NULL + err (naming
 * the file and what to do) on any bad input. */
fp8t_bpe *fp8t_bpe_load(const char *path, char *err, size_t errlen);
/* The same from JSON text; `name` stands for the file in messages. */
fp8t_bpe *fp8t_bpe_parse(const char *json, size_t len, const char *name, char *err,
                         size_t errlen);
void fp8t_bpe_free(fp8t_bpe *t);

/* Largest id + 1 over the vocab and the added tokens. */
int fp8t_bpe_vocab_size(const fp8t_bpe *t);
/* The token that starts each document in fp8train's shards and on-the-fly data: the special
 * token the post-processor puts first (Llama-3's <|begin_of_text|>), else <|endoftext|> (GPT-2,
 * Qwen2, as llm.c puts it before every document); -1 if neither exists. */
int fp8t_bpe_doc_token(const fp8t_bpe *t);
/* Id of a token given as its tokenizer.json string (a vocab entry or an added token), or -1. */
int fp8t_bpe_token_id(const fp8t_bpe *t, const char *s);
/* One line: "byte-level BPE, vocab 128256 (256 added), pre-tokenizer Split+ByteLevel". */
const char *fp8t_bpe_describe(const fp8t_bpe *t);

/* Encode len bytes of text, appending ids to out. Not thread-safe (a cache of pre-tokenized
 * words is kept inside t): use one fp8t_bpe per thread. 0 ok, -1 out of memory. */
int fp8t_bpe_encode(fp8t_bpe *t, const char *text, size_t len, fp8t_tok_ids *out);
/* At most `entries` words in the cache (default 1M); when full it is emptied. 0 = no cache.
 * The ids never depend on it (tests use a tiny limit to run the emptying path). */
void fp8t_bpe_set_cache_limit(fp8t_bpe *t, size_t entries);
/* The bytes one token decodes to (NULL, *len 0 for an id with no token). */
const char *fp8t_bpe_piece(const fp8t_bpe *t, int id, size_t *len);
/* Decode ids to bytes: *out malloc'd (NUL-terminated), *len bytes. Ids with no token decode to
 * nothing. 0 ok, -1 out of memory. */
int fp8t_bpe_decode(const fp8t_bpe *t, const int32_t *ids, size_t n, char **out, size_t *len);

/* ---- files of text ----
 * A text file is one document; a JSONL file (name ending in .jsonl or .ndjson) holds one
 * document per line, the string `field` of each line's object (lines with only whitespace are
 * skipped). Each document is encoded with the tokenizer's document token first (see
 * fp8t_bpe_doc_token; none if it has none) and handed to fn with its byte range [start, end)
 * in the file. fn returns 0 to go on, nonzero to stop (fp8t_bpe_encode_file then returns -1 and
 * leaves err to fn). Errors name the file (and the line of a JSONL file). */
typedef int (*fp8t_doc_fn)(void *ctx, const int32_t *ids, size_t n, uint64_t start, uint64_t end);
int fp8t_bpe_is_jsonl(const char *path);
int fp8t_bpe_encode_file(fp8t_bpe *t, const char *path, const char *field, fp8t_doc_fn fn,
                         void *ctx, char *err, size_t errlen);

/* ---- llm.c's GPT-2 tokenizer file (decoding only): header 256 x uint32 (magic 20240328,
 * version 1 or 2, vocab size, EOT id in version 2), then per token a length byte and bytes. */
typedef struct {
    int vocab_size;
    int eot;        /* end-of-text token id */
    char **piece;   /* [vocab_size] bytes of each token (NUL-terminated copies) */
    int *piece_len; /* [vocab_size] */
} fp8t_tokenizer;

int fp8t_tokenizer_read(const char *path, fp8t_tokenizer *t, char *err, size_t errlen);
void fp8t_tokenizer_free(fp8t_tokenizer *t);

#ifdef __cplusplus
}
#endif
#endif
