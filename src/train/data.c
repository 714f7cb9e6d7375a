/* The data stream: micro-batch `index` as a pure function of (source, split, seed, index).
 * Row b of micro-batch i is a window of T+1 tokens chosen by hash(stream_seed, i, b): for the
 * synthetic language a freshly generated stretch of the document stream (from a random offset,
 * so windows start mid-document too), for files a random start among all windows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "train/data_internal.h"
#include "train/rng.h"

struct fp8t_data {
    int synthetic;
    fp8t_data_split split;
    int B, T;
    uint64_t stream_seed;
    uint64_t position;
    syn_lexicon *lex;      /* synthetic */
    int *scratch;          /* synthetic: [2T + 1] generated tokens */
    data_corpus corpus;    /* files */
    uint64_t *cum_windows; /* [n_seg + 1] prefix sums of windows per segment */
    char desc[512];
};

static int is_synthetic(const char *s) { return !s || !*s || strcmp(s, "synthetic") == 0; }

fp8t_data *fp8t_data_open(const char *source, const char *val_source, fp8t_data_split split,
                          int B, int T, int vocab, uint64_t seed, char *err, size_t errlen) {
    return fp8t_data_open_tok(source, val_source, NULL, split, B, T, vocab, seed, err, errlen);
}

fp8t_data *fp8t_data_open_tok(const char *source, const char *val_source, const char *tokenizer,
                              fp8t_data_split split, int B, int T, int vocab, uint64_t seed,
                              char *err, size_t errlen) {
    if (B <= 0 || T <= 0) {
        fp8t_errorf(err, errlen, "data: batch (%d) and seq-len (%d) must be positive", B, T);
        return NULL;
    }
    int separate_val = val_source && *val_source;
    const char *src = split == FP8T_SPLIT_VAL && separate_val ? val_source : source;
    fp8t_data *d = calloc(1, sizeof(*d));
    if (!d) {
        fp8t_errorf(err, errlen, "data: out of memory");
        return NULL;
    }
    d->split = split;
    d->B = B;
    d->T = T;
    /* the two splits of one seed are independent streams */
    d->stream_seed =
        fp8t_hash3(seed, split == FP8T_SPLIT_VAL ? 0x76616cULL : 0x747261696eULL, 0xDA7AULL);
    const char *split_name = split == FP8T_SPLIT_VAL ? "validation" : "train";
    if (is_synthetic(src) && tokenizer && *tokenizer) {
        fp8t_errorf(err, errlen,
                    "--tokenizer %s is for text: give --data a text file or a .jsonl "
                    "file (the synthetic language has its own 256 tokens)",
                    tokenizer);
        free(d);
        return NULL;
    }
    if (is_synthetic(src)) {
        if (vocab < FP8T_SYNTHETIC_VOCAB) {
            fp8t_errorf(err, errlen,
                        "the synthetic language uses %d tokens but the model's vocabulary is %d; "
                        "use --vocab %d or more",
                        FP8T_SYNTHETIC_VOCAB, vocab, FP8T_SYNTHETIC_VOCAB);
            free(d);
            return NULL;
        }
        d->synthetic = 1;
        d->lex = malloc(sizeof(syn_lexicon));
        d->scratch = malloc((size_t)(2 * T + 1) * sizeof(int));
        if (!d->lex || !d->scratch) {
            fp8t_errorf(err, errlen, "data: out of memory");
            fp8t_data_close(d);
            return NULL;
        }
        syn_lexicon_build(d->lex);
        snprintf(d->desc, sizeof(d->desc), "synthetic language (vocab %d), %s stream",
                 FP8T_SYNTHETIC_VOCAB, split_name);
        return d;
    }
    int part = separate_val ? 0 : (split == FP8T_SPLIT_VAL ? 2 : 1);
    if (data_corpus_load(&d->corpus, src, tokenizer, part, T, vocab, err, errlen) != 0) {
        free(d);
        return NULL;
    }
    d->cum_windows = malloc((size_t)(d->corpus.n_seg + 1) * sizeof(uint64_t));
    if (!d->cum_windows) {
        fp8t_errorf(err, errlen, "data: out of memory");
        fp8t_data_close(d);
        return NULL;
    }
    d->cum_windows[0] = 0;
    for (int i = 0; i < d->corpus.n_seg; i++)
        d->cum_windows[i + 1] = d->cum_windows[i] + (d->corpus.seg[i].len - (size_t)T);
    snprintf(d->desc, sizeof(d->desc), "%s, %s split%s: %zu tokens", d->corpus.what, split_name,
             part == 1   ? " (first 90%)"
             : part == 2 ? " (last 10%)"
                         : "",
             d->corpus.n_tokens);
    return d;
}

void fp8t_data_close(fp8t_data *d) {
    if (!d) return;
    free(d->lex);
    free(d->scratch);
    free(d->cum_windows);
    data_corpus_free(&d->corpus);
    free(d);
}

/* Window number w (0 <= w < total windows) -> its first token. */
static const uint32_t *corpus_window(const fp8t_data *d, uint64_t w) {
    int lo = 0, hi = d->corpus.n_seg - 1; /* find the segment with cum[s] <= w < cum[s+1] */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->cum_windows[mid] <= w)
            lo = mid;
        else
            hi = mid - 1;
    }
    return d->corpus.seg[lo].tokens + (w - d->cum_windows[lo]);
}

void fp8t_data_batch(const fp8t_data *d, int *tokens, int *targets, uint64_t index) {
    const int T = d->T;
    for (int b = 0; b < d->B; b++) {
        uint64_t s = fp8t_hash3(d->stream_seed, index, (uint64_t)b);
        int *tok = tokens + (size_t)b * T;  /* [T] */
        int *tgt = targets + (size_t)b * T; /* [T] */
        if (d->synthetic) {
            int offset = (int)fp8t_rng_below(&s, (uint64_t)T);
            /* the scratch buffer is the stream's private workspace; batches are generated one
             * at a time (the stream is not shared between threads) */
            int *buf = d->scratch; /* [offset + T + 1] */
            syn_generate(d->lex, buf, (size_t)offset + T + 1, fp8t_rng_next(&s));
            for (int t = 0; t < T; t++) {
                tok[t] = buf[offset + t];
                tgt[t] = buf[offset + t + 1];
            }
        } else {
            uint64_t total = d->cum_windows[d->corpus.n_seg];
            const uint32_t *w = corpus_window(d, fp8t_rng_below(&s, total));
            for (int t = 0; t < T; t++) {
                tok[t] = (int)w[t];
                tgt[t] = (int)w[t + 1];
            }
        }
    }
}

void fp8t_data_next(fp8t_data *d, int *tokens, int *targets) {
    fp8t_data_batch(d, tokens, targets, d->position);
    d->position++;
}

uint64_t fp8t_data_position(const fp8t_data *d) { return d->position; }
void fp8t_data_set_position(fp8t_data *d, uint64_t position) { d->position = position; }
const char *fp8t_data_describe(const fp8t_data *d) { return d->desc; }
size_t fp8t_data_num_tokens(const fp8t_data *d) { return d->synthetic ? 0 : d->corpus.n_tokens; }
int fp8t_data_vocab_needed(const fp8t_data *d) {
    return d->synthetic ? FP8T_SYNTHETIC_VOCAB : d->corpus.max_token + 1;
}
