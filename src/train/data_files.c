/* Token corpora from files: byte-level text files and llm.c token shards. Everything is read
 * and checked when the stream is opened (existence, length, shard headers, token < vocab), so
 * a bad input fails before a run writes anything. */
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fp8train/error.h"
#include "fp8train/io.h"
#include "fp8train/tokenizer.h"
#include "train/data_internal.h"
#include "util/fs.h"

int data_source_is_shards(const char *source) {
    size_t n = strlen(source);
    if (strpbrk(source, "*?[")) return 1;
    return n >= 4 && strcmp(source + n - 4, ".bin") == 0;
}

static int corpus_add_owned(data_corpus *c, uint32_t *buf) {
    uint32_t **o = realloc(c->owned, (size_t)(c->n_owned + 1) * sizeof(*o));
    if (!o) return -1;
    c->owned = o;
    c->owned[c->n_owned++] = buf;
    return 0;
}

static int corpus_add_segment(data_corpus *c, const uint32_t *tokens, size_t len) {
    data_segment *s = realloc(c->seg, (size_t)(c->n_seg + 1) * sizeof(*s));
    if (!s) return -1;
    c->seg = s;
    c->seg[c->n_seg].tokens = tokens;
    c->seg[c->n_seg].len = len;
    c->n_seg++;
    c->n_tokens += len;
    return 0;
}

/* Cut a loaded file of n tokens into the requested part: the split point is at 90%. */
static void part_range(size_t n, int part, size_t *lo, size_t *hi) {
    size_t cut = n - n / 10;
    *lo = part == 2 ? cut : 0;
    *hi = part == 1 ? cut : n;
}

static int check_vocab(const uint32_t *tok, size_t n, int vocab, const char *path, int *max_token,
                       char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++) {
        if (tok[i] >= (uint32_t)vocab) {
            return fp8t_errorf(
                err, errlen,
                "%s: token %u at position %zu is outside the model's vocabulary of %d; "
                "use a model with --vocab %llu or more (or data made for this vocabulary)",
                path, tok[i], i, vocab, (unsigned long long)tok[i] + 1);
        }
        if ((int)tok[i] > *max_token) *max_token = (int)tok[i];
    }
    return 0;
}

static int load_text(data_corpus *c, const char *path, int part, int T, int vocab, char *err,
                     size_t errlen) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        return fp8t_errorf(err, errlen,
                           "data '%s' is not a regular file (a directory? for llm.c shards "
                           "pass a pattern such as '%s/x_*.bin')",
                           path, path);
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        return fp8t_errorf(err, errlen,
                           "cannot open data file '%s': %s (pass --data synthetic, a text "
                           "file, or 'dir/*.bin' llm.c shards)",
                           path, strerror(errno));
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        fp8t_errorf(err, errlen, "data file '%s' is not a regular file (cannot seek)", path);
        fclose(f);
        return -1;
    }
    long size = ftell(f);
    rewind(f);
    if (size <= 0) {
        fp8t_errorf(err, errlen,
                    "data file '%s' is empty; give a text file with at least %d bytes", path,
                    part ? 10 * (T + 1) + 10 : T + 1);
        fclose(f);
        return -1;
    }
    size_t n = (size_t)size;
    unsigned char *bytes = malloc(n);
    uint32_t *tok = malloc(n * sizeof(uint32_t));
    if (!bytes || !tok || fread(bytes, 1, n, f) != n) {
        fp8t_errorf(err, errlen, "cannot read data file '%s' (%zu bytes)", path, n);
        free(bytes);
        free(tok);
        fclose(f);
        return -1;
    }
    fclose(f);
    for (size_t i = 0; i < n; i++) tok[i] = bytes[i];
    free(bytes);
    if (corpus_add_owned(c, tok) != 0) {
        free(tok);
        return fp8t_errorf(err, errlen, "out of memory loading '%s'", path);
    }
    if (check_vocab(tok, n, vocab, path, &c->max_token, err, errlen) != 0) return -1;
    size_t lo, hi;
    part_range(n, part, &lo, &hi);
    if (hi - lo < (size_t)T + 1) {
        if (part)
            fp8t_errorf(
                err, errlen,
                "data file '%s' is too short: %zu bytes, of which %zu are the %s split, but "
                "a sequence needs %d (seq-len + 1); use a file of at least %d bytes, a "
                "smaller --seq-len, or a separate --val-data",
                path, n, hi - lo, part == 1 ? "training (first 90%)" : "validation (last 10%)",
                T + 1, 10 * (T + 1) + 10);
        else
            fp8t_errorf(err, errlen,
                        "data file '%s' is too short: %zu bytes, but a sequence needs %d "
                        "(seq-len + 1); use a longer file or a smaller --seq-len",
                        path, n, T + 1);
        return -1;
    }
    snprintf(c->what, sizeof(c->what), "text file '%s' (%zu bytes)", path, n);
    return corpus_add_segment(c, tok + lo, hi - lo);
}

static int load_shards(data_corpus *c, const char *pattern, int part, int T, int vocab, char *err,
                       size_t errlen) {
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc != 0) {
        fp8t_errorf(err, errlen,
                    "no llm.c token shards match '%s' (expected files made by llm.c's "
                    "data scripts, e.g. 'data/fineweb_train_*.bin')",
                    pattern);
        if (rc != GLOB_NOMATCH) globfree(&g);
        return -1;
    }
    size_t total = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *path = g.gl_pathv[i];
        uint32_t *tok = NULL;
        size_t n = 0;
        char e[FP8T_ERR_LEN];
        if (fp8t_shard_read_u32(path, &tok, &n, e, sizeof(e)) != 0) {
            fp8t_errorf(err, errlen, "bad token shard: %s", e);
            globfree(&g);
            return -1;
        }
        if (corpus_add_owned(c, tok) != 0) {
            free(tok);
            fp8t_errorf(err, errlen, "out of memory loading '%s'", path);
            globfree(&g);
            return -1;
        }
        if (check_vocab(tok, n, vocab, path, &c->max_token, err, errlen) != 0) {
            globfree(&g);
            return -1;
        }
        size_t lo, hi;
        part_range(n, part, &lo, &hi);
        total += n;
        /* a shard part too short for one window contributes nothing */
        if (hi - lo >= (size_t)T + 1 && corpus_add_segment(c, tok + lo, hi - lo) != 0) {
            fp8t_errorf(err, errlen, "out of memory loading '%s'", path);
            globfree(&g);
            return -1;
        }
    }
    snprintf(c->what, sizeof(c->what), "%zu llm.c shard%s '%s' (%zu tokens)", g.gl_pathc,
             g.gl_pathc == 1 ? "" : "s", pattern, total);
    if (c->n_seg == 0) {
        fp8t_errorf(
            err, errlen,
            "token shards '%s' hold %zu tokens, too few for one sequence of %d (seq-len + "
            "1) in the %s split; use more data, a smaller --seq-len, or --val-data",
            pattern, total, T + 1,
            part == 1   ? "training (first 90% of each shard)"
            : part == 2 ? "validation (last 10% of each shard)"
                        : "");
        globfree(&g);
        return -1;
    }
    globfree(&g);
    return 0;
}

/* Collects the documents of a file, one after the other. */
typedef struct {
    fp8t_tok_ids all;
    int oom;
} doc_collect;

static int collect_doc(void *ctx, const int32_t *ids, size_t n, uint64_t start, uint64_t end) {
    (void)start;
    (void)end;
    doc_collect *d = ctx;
    if (d->all.n + n > d->all.cap) {
        size_t cap = d->all.cap ? d->all.cap : 1 << 16;
        while (cap < d->all.n + n) cap *= 2;
        int32_t *v = realloc(d->all.v, cap * sizeof(int32_t));
        if (!v) {
            d->oom = 1;
            return -1;
        }
        d->all.v = v;
        d->all.cap = cap;
    }
    memcpy(d->all.v + d->all.n, ids, n * sizeof(int32_t));
    d->all.n += n;
    return 0;
}

/* A text or JSONL file through a tokenizer.json: its tokens, split like a text file's bytes. */
static int load_tokenized(data_corpus *c, const char *path, const char *tok_path, int part, int T,
                          int vocab, char *err, size_t errlen) {
    char e[FP8T_ERR_LEN];
    if (!fp8t_is_regular_file(path)) {
        return fp8t_errorf(err, errlen,
                           "data '%s' is not a readable file (with --tokenizer, --data is a "
                           "text file or a .jsonl file with a \"text\" field per line)",
                           path);
    }
    fp8t_bpe *t = fp8t_bpe_load(tok_path, e, sizeof(e));
    if (!t) {
        return fp8t_errorf(err, errlen, "--tokenizer: %s", e);
    }
    if (fp8t_bpe_vocab_size(t) > vocab) {
        fp8t_errorf(err, errlen,
                    "tokenizer '%s' has %d tokens but the model's vocabulary is %d; "
                    "leave out --vocab (the tokenizer then sets it) or give --vocab %d or more",
                    tok_path, fp8t_bpe_vocab_size(t), vocab, fp8t_bpe_vocab_size(t));
        fp8t_bpe_free(t);
        return -1;
    }
    doc_collect d = {{0}, 0};
    int rc = fp8t_bpe_encode_file(t, path, "text", collect_doc, &d, e, sizeof(e));
    fp8t_bpe_free(t);
    if (rc != 0) {
        fp8t_errorf(err, errlen, "%s", d.oom ? "out of memory tokenizing the data" : e);
        free(d.all.v);
        return -1;
    }
    /* the ids are below the vocab (checked above), so they fit uint32 as they are */
    uint32_t *tok = (uint32_t *)d.all.v;
    size_t n = d.all.n;
    if (corpus_add_owned(c, tok) != 0) {
        free(tok);
        return fp8t_errorf(err, errlen, "out of memory loading '%s'", path);
    }
    if (check_vocab(tok, n, vocab, path, &c->max_token, err, errlen) != 0) return -1;
    size_t lo, hi;
    part_range(n, part, &lo, &hi);
    if (hi - lo < (size_t)T + 1) {
        return fp8t_errorf(
            err, errlen,
            "data file '%s' gives %zu tokens with tokenizer '%s', of which %zu "
            "are the %s split, but a sequence needs %d (seq-len + 1); use more text, a "
            "smaller --seq-len%s",
            path, n, tok_path, hi - lo,
            part == 1   ? "training (first 90%)"
            : part == 2 ? "validation (last 10%)"
                        : "whole",
            T + 1, part ? ", or a separate --val-data" : "");
    }
    snprintf(c->what, sizeof(c->what), "'%s' through tokenizer '%s' (%zu tokens)", path, tok_path,
             n);
    return corpus_add_segment(c, tok + lo, hi - lo);
}

int data_corpus_load(data_corpus *c, const char *source, const char *tokenizer, int part, int T,
                     int vocab, char *err, size_t errlen) {
    memset(c, 0, sizeof(*c));
    int rc = data_source_is_shards(source) ? load_shards(c, source, part, T, vocab, err, errlen)
             : tokenizer && *tokenizer
                 ? load_tokenized(c, source, tokenizer, part, T, vocab, err, errlen)
                 : load_text(c, source, part, T, vocab, err, errlen);
    if (rc != 0) data_corpus_free(c);
    return rc;
}

void data_corpus_free(data_corpus *c) {
    for (int i = 0; i < c->n_owned; i++) free(c->owned[i]);
    free(c->owned);
    free(c->seg);
    memset(c, 0, sizeof(*c));
}
