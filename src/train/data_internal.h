/* Private pieces of the data loader (src/train/data_*.c). */
#ifndef FP8TRAIN_DATA_INTERNAL_H
#define FP8TRAIN_DATA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/data.h"

/* ---- the synthetic language (data_synthetic.c) ---- */
#define SYN_WORDS 96 /* lexicon size */
#define SYN_MAX_LETTERS 6
#define SYN_TOPICS 16  /* topic keys: tokens SYN_TOK_TOPIC0 .. +15 */
#define SYN_DIALECTS 4 /* a document's topic picks one word-transition table */
#define SYN_SUCC 4     /* likely successors of each word */
#define SYN_STARTS 8   /* sentence-initial words per dialect */

typedef struct {
    uint8_t word_len[SYN_WORDS];
    uint8_t letters[SYN_WORDS][SYN_MAX_LETTERS]; /* tokens 'a'..'z' */
    uint8_t succ[SYN_DIALECTS][SYN_WORDS][SYN_SUCC];
    uint8_t start[SYN_DIALECTS][SYN_STARTS];
} syn_lexicon;

/* The fixed lexicon (built from a constant seed: every run learns the same language). */
void syn_lexicon_build(syn_lexicon *lex);
/* n tokens of the document stream from rng state `seed`, starting at a document start. */
void syn_generate(const syn_lexicon *lex, int *out, size_t n, uint64_t seed);

/* ---- token corpora from files (data_files.c) ---- */
typedef struct {
    const uint32_t *tokens; /* points into an owned buffer */
    size_t len;
} data_segment;

typedef struct {
    uint32_t **owned; /* buffers to free */
    int n_owned;
    data_segment *seg; /* the split's segments */
    int n_seg;
    size_t n_tokens; /* sum of seg[i].len */
    int max_token;   /* over everything loaded */
    char what[256];  /* "text file 'x.txt' (123456 bytes)" */
} data_corpus;

/* Load `source` (a text file or a shard glob) and cut out `part`: 0 = everything,
 * 1 = the first 90% of every file (train), 2 = the last 10% (validation). Checks tokens < vocab
 * and that some window of T+1 tokens exists. With a tokenizer (a tokenizer.json path, or NULL /
 * "" for bytes), a text or JSONL source is tokenized with it. 0 ok, -1 + err. */
int data_corpus_load(data_corpus *c, const char *source, const char *tokenizer, int part, int T,
                     int vocab, char *err, size_t errlen);
void data_corpus_free(data_corpus *c);
/* Is source a shard pattern (glob characters or a .bin name)? */
int data_source_is_shards(const char *source);

#endif
