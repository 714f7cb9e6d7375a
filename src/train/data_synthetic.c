/* The synthetic language: a deterministic generated corpus with real structure, so that a
 * small model's loss falls far below uniform (ln 256 = 5.55) and FP8/BF16 differences show.
 *
 * A document is:  BOS topic '\n' sentence sentence ... '\n'
 * A sentence is words separated by spaces and ended by '.'. Words come from a fixed lexicon of
 * SYN_WORDS letter strings; the first word is one of a few sentence starters, each next word
 * is one of SYN_SUCC likely successors of the previous word (a Markov chain whose table depends
 * on the document's topic: long-range structure). Inside sentences brackets ( [ { < open and
 * close in matching, nested order; after '#' the document's topic key is repeated (a copy task
 * across the document); rarely a random noise token appears.
 * Per-token entropy is roughly 0.4 nats: the structure, not the noise, dominates. */
#include <string.h>

#include "train/data_internal.h"
#include "train/rng.h"

enum {
    SYN_TOK_BOS = 1,
    SYN_TOK_NEWLINE = 10,
    SYN_TOK_SPACE = 32,
    SYN_TOK_HASH = 35,
    SYN_TOK_PERIOD = 46,
    SYN_TOK_NOISE0 = 128, /* noise tokens 128..199 */
    SYN_NOISE_COUNT = 72,
    SYN_TOK_TOPIC0 = 200, /* topics 200..215 */
};

static const uint8_t syn_open[4] = {'(', '[', '{', '<'};
static const uint8_t syn_close[4] = {')', ']', '}', '>'};
/* cumulative successor probabilities: 0.55, 0.25, 0.12, 0.08 */
static const double syn_succ_cdf[SYN_SUCC] = {0.55, 0.80, 0.92, 1.0};

#define SYN_LEXICON_SEED 0x5EED1E5C0FFEEULL

void syn_lexicon_build(syn_lexicon *lex) {
    uint64_t s = SYN_LEXICON_SEED;
    memset(lex, 0, sizeof(*lex));
    for (int w = 0; w < SYN_WORDS; w++) {
        int len = 2 + (int)fp8t_rng_below(&s, SYN_MAX_LETTERS - 1); /* 2..6 letters */
        lex->word_len[w] = (uint8_t)len;
        for (int i = 0; i < len; i++)
            lex->letters[w][i] = (uint8_t)('a' + fp8t_rng_below(&s, 26));
    }
    for (int d = 0; d < SYN_DIALECTS; d++) {
        for (int w = 0; w < SYN_WORDS; w++)
            for (int k = 0; k < SYN_SUCC; k++)
                lex->succ[d][w][k] = (uint8_t)fp8t_rng_below(&s, SYN_WORDS);
        for (int k = 0; k < SYN_STARTS; k++)
            lex->start[d][k] = (uint8_t)fp8t_rng_below(&s, SYN_WORDS);
    }
}

/* Output cursor: tokens past the end are dropped (a unit may overrun the buffer). */
typedef struct {
    int *out;
    size_t n, pos;
} syn_sink;

static inline void emit(syn_sink *k, int tok) {
    if (k->pos < k->n) k->out[k->pos] = tok;
    k->pos++;
}

static void emit_sentence(syn_sink *k, const syn_lexicon *lex, uint64_t *s, int dialect,
                          int topic) {
    int stack[3], depth = 0;
    int n_words = 3 + (int)fp8t_rng_below(s, 8);
    int word = lex->start[dialect][fp8t_rng_below(s, SYN_STARTS)];
    for (int i = 0; i < n_words && k->pos < k->n; i++) {
        if (i > 0) {
            double u = fp8t_rng_uniform(s);
            int j = 0;
            while (j < SYN_SUCC - 1 && u >= syn_succ_cdf[j]) j++;
            word = lex->succ[dialect][word][j];
            emit(k, SYN_TOK_SPACE);
        }
        int opened = 0;
        if (i > 0 && depth < 3 && fp8t_rng_uniform(s) < 0.10) {
            int b = (int)fp8t_rng_below(s, 4);
            stack[depth++] = b;
            emit(k, syn_open[b]);
            opened = 1;
        }
        for (int c = 0; c < lex->word_len[word]; c++) emit(k, lex->letters[word][c]);
        if (fp8t_rng_uniform(s) < 0.01)
            emit(k, SYN_TOK_NOISE0 + (int)fp8t_rng_below(s, SYN_NOISE_COUNT));
        if (!opened && depth > 0 && fp8t_rng_uniform(s) < 0.30)
            emit(k, syn_close[stack[--depth]]);
        if (fp8t_rng_uniform(s) < 0.04) {
            emit(k, SYN_TOK_SPACE);
            emit(k, SYN_TOK_HASH);
            emit(k, topic);
        }
    }
    while (depth > 0) emit(k, syn_close[stack[--depth]]);
    emit(k, SYN_TOK_PERIOD);
}

void syn_generate(const syn_lexicon *lex, int *out, size_t n, uint64_t seed) {
    uint64_t s = seed;
    syn_sink k = {out, n, 0};
    while (k.pos < n) {
        int t = (int)fp8t_rng_below(&s, SYN_TOPICS);
        int topic = SYN_TOK_TOPIC0 + t, dialect = t % SYN_DIALECTS;
        emit(&k, SYN_TOK_BOS);
        emit(&k, topic);
        emit(&k, SYN_TOK_NEWLINE);
        int n_sentences = 2 + (int)fp8t_rng_below(&s, 10);
        for (int i = 0; i < n_sentences && k.pos < n; i++) {
            if (i > 0) emit(&k, SYN_TOK_SPACE);
            emit_sentence(&k, lex, &s, dialect, topic);
        }
        emit(&k, SYN_TOK_NEWLINE);
    }
}

void fp8t_synthetic_generate(int *out, size_t n, uint64_t seed) {
    syn_lexicon lex;
    syn_lexicon_build(&lex);
    syn_generate(&lex, out, n, seed);
}
