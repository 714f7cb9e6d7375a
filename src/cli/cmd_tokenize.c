/* `fp8train tokenize FILES... --tokenizer tokenizer.json --out DIR`: text files and JSONL
 * files (a "text" field per line) through a Hugging Face byte-level BPE tokenizer into llm.c
 * token shards, DIR/train_NNNNNN.bin and DIR/val_NNNNNN.bin, which `train --data` reads.
 *
 * The validation split is the last --val-frac of the input bytes, as the other data paths
 * hold out the last 10%: whole JSONL documents after the cut go to val; a text file that
 * straddles it is cut between tokens. Shards are GPT-2 shards (uint16 tokens) when the vocab
 * fits 16 bits and llm.c's Llama-3 shards (uint32, magic 20240801) otherwise. Every document
 * starts with the tokenizer's document token (<|endoftext|>, or Llama-3's <|begin_of_text|>),
 * as llm.c's data scripts do. Exit status: 0 ok, 2 bad input or usage, 1 a failed write. */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli_args.h"
#include "fp8train/error.h"
#include "fp8train/io.h"
#include "fp8train/tokenizer.h"
#include "util/fs.h"

#define CMD "tokenize"

typedef struct {
    const char *tokenizer, *out, *field, *text;
    float val_frac;
    uint64_t shard_tokens;
    int quiet;
} tokenize_opts;

#define F(f) FP8T_OPT_FIELD(tokenize_opts, f)
static const fp8t_opt OPTS[] = {
    {.name = "tokenizer",
     .arg = "FILE",
     .type = FP8T_OPT_STR,
     F(tokenizer),
     .dflt = FP8T_OPT_NO_DEFAULT,
     .help = "the tokenizer.json (required)"},
    {.name = "out",
     .arg = "DIR",
     .type = FP8T_OPT_STR,
     F(out),
     .dflt = FP8T_OPT_NO_DEFAULT,
     .help = "where the shards go (created; must not hold shards already)"},
    {.name = "val-frac",
     .arg = "X",
     .type = FP8T_OPT_FLOAT,
     F(val_frac),
     .lo = 0,
     .hi = 0.99,
     .help = "the last X of the input (by bytes) is the validation split; 0: no validation "
             "shards"},
    /* an llm.c shard counts its tokens in an int32 */
    {.name = "shard-tokens",
     .arg = "N",
     .type = FP8T_OPT_U64,
     F(shard_tokens),
     .lo = 1,
     .hi = INT32_MAX,
     .help = "tokens per shard, as llm.c (at most 2^31 - 1: an llm.c shard "
             "counts its tokens in an int32)"},
    {.name = "field",
     .arg = "NAME",
     .type = FP8T_OPT_STR,
     F(field),
     .help = "the JSONL field holding the text"},
    {.name = "quiet", .type = FP8T_OPT_FLAG, F(quiet), .help = "no progress bar"},
    {.name = "text",
     .arg = "STRING",
     .type = FP8T_OPT_STR,
     F(text),
     .dflt = FP8T_OPT_NO_DEFAULT,
     .help = "print the ids and pieces of STRING (no document token, as tokenizers' "
             "encode(STRING, add_special_tokens=False)) and exit"},
};
#undef F

static const fp8t_opt_spec SPEC = {
    .cmd = CMD,
    .usage = "FILES... --tokenizer tokenizer.json --out DIR [options]\n"
             "       fp8train tokenize --tokenizer tokenizer.json --text STRING   (print its "
             "tokens)",
    .about =
        "Tokenize text files (one document each) and JSONL files (.jsonl/.ndjson: one document\n"
        "per line, its \"text\" field) with a Hugging Face byte-level BPE tokenizer (GPT-2,\n"
        "Llama-3, Qwen2 style) into llm.c token shards DIR/train_NNNNNN.bin and\n"
        "DIR/val_NNNNNN.bin. Each document starts with the document token (<|endoftext|> or\n"
        "<|begin_of_text|>). Vocabularies up to 65536 give GPT-2 shards (16-bit tokens), larger\n"
        "ones llm.c's Llama-3 shards (32-bit).\n",
    .epilog =
        "example:\n"
        "  fp8train tokenize corpus.jsonl --tokenizer llama3/tokenizer.json --out data/tok\n"
        "  fp8train train --data 'data/tok/train_*.bin' --val-data 'data/tok/val_*.bin' ...\n"
        "Exit status: 0 ok, 1 a failed write, 2 bad input or usage.\n",
    .opts = OPTS,
    .n_opts = (int)(sizeof(OPTS) / sizeof(OPTS[0])),
    .max_pos = -1,
    .wrap = CLI_HELP_WRAP,
};

typedef struct {
    const char *dir, *kind; /* "train" / "val" */
    int wide;               /* uint32 shards */
    size_t shard_tokens;
    uint32_t *buf;
    size_t n, cap;
    int shards;
    size_t total;
} sink;

typedef struct {
    sink train, val;
    uint64_t base; /* bytes of the files before the current one */
    uint64_t mark; /* input bytes before the validation split */
    uint64_t total_bytes, done_bytes;
    size_t docs, tokens;
    double t0, last_print;
    int progress;
    char **written; /* shard paths written, removed again if the command fails */
    int n_written;
    char err[FP8T_ERR_LEN];
} job;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void shard_path(char *p, size_t n, const sink *s, int idx) {
    snprintf(p, n, "%s/%s_%06d.bin", s->dir, s->kind, idx);
}

static int sink_flush(job *j, sink *s) {
    if (s->n == 0) return 0;
    char path[4096];
    shard_path(path, sizeof(path), s, s->shards);
    int rc;
    if (s->wide) {
        rc = fp8t_shard_write_u32(path, s->buf, s->n, j->err, sizeof(j->err));
    } else { /* narrow in place: every id was checked to fit */
        uint16_t *u = (uint16_t *)s->buf;
        for (size_t i = 0; i < s->n; i++) u[i] = (uint16_t)s->buf[i];
        rc = fp8t_shard_write(path, u, s->n, j->err, sizeof(j->err));
    }
    if (rc != 0) return -1;
    char **w = realloc(j->written, (size_t)(j->n_written + 1) * sizeof(*w));
    if (w) {
        j->written = w;
        j->written[j->n_written++] = strdup(path);
    }
    s->shards++;
    s->total += s->n;
    s->n = 0;
    return 0;
}

static int sink_add(job *j, sink *s, const int32_t *ids, size_t n) {
    while (n > 0) {
        size_t room = s->shard_tokens - s->n, k = n < room ? n : room;
        if (s->n + k > s->cap) {
            size_t cap = s->cap ? s->cap : 1 << 16;
            while (cap < s->n + k) cap *= 2;
            if (cap > s->shard_tokens) cap = s->shard_tokens;
            uint32_t *b = realloc(s->buf, cap * sizeof(uint32_t));
            if (!b) {
                snprintf(j->err, sizeof(j->err),
                         "out of memory (a shard of %zu tokens; use a "
                         "smaller --shard-tokens)",
                         s->shard_tokens);
                return -1;
            }
            s->buf = b;
            s->cap = cap;
        }
        for (size_t i = 0; i < k; i++) s->buf[s->n + i] = (uint32_t)ids[i];
        s->n += k;
        ids += k;
        n -= k;
        if (s->n == s->shard_tokens && sink_flush(j, s) != 0) return -1;
    }
    return 0;
}

static void print_progress(job *j, int final) {
    double t = now();
    if (!j->progress || (!final && t - j->last_print < 0.25)) return;
    j->last_print = t;
    double frac = j->total_bytes ? (double)j->done_bytes / (double)j->total_bytes : 1;
    int w = 30, fill = (int)(frac * w + 0.5);
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = 0;
    double dt = t - j->t0 > 1e-9 ? t - j->t0 : 1e-9;
    fprintf(stderr, "\r[%s] %3.0f%%  %.1f/%.1f MB  %zu tokens  %.2fM tokens/s%s", bar, 100 * frac,
            j->done_bytes / 1e6, j->total_bytes / 1e6, j->tokens, j->tokens / dt / 1e6,
            final ? "\n" : "");
    fflush(stderr);
}

/* One document: to train, to val, or cut between them at the split point. */
static int on_doc(void *ctx, const int32_t *ids, size_t n, uint64_t start, uint64_t end) {
    job *j = ctx;
    uint64_t gs = j->base + start, ge = j->base + end;
    size_t cut = n;
    if (gs >= j->mark)
        cut = 0;
    else if (ge > j->mark) /* straddles the split: cut in proportion to the bytes */
        cut = (size_t)((double)n * (double)(j->mark - gs) / (double)(ge - gs));
    if (cut > 0 && sink_add(j, &j->train, ids, cut) != 0) return -1;
    if (cut < n && sink_add(j, &j->val, ids + cut, n - cut) != 0) return -1;
    j->docs++;
    j->tokens += n;
    j->done_bytes = ge;
    print_progress(j, 0);
    return 0;
}

/* --text: the ids of one string and the bytes of each (quoted, non-printable bytes escaped),
 * to compare with another tokenizer by eye or by script. */
static int print_tokens(const char *tok_path, const char *text, int n_files) {
    if (!tok_path || n_files) {
        fprintf(stderr, "fp8train tokenize: --text takes --tokenizer and no FILES\n");
        return 2;
    }
    char err[FP8T_ERR_LEN];
    fp8t_bpe *t = fp8t_bpe_load(tok_path, err, sizeof(err));
    if (!t) {
        fprintf(stderr, "fp8train tokenize: --tokenizer: %s\n", err);
        return 2;
    }
    fp8t_tok_ids ids = {0};
    if (fp8t_bpe_encode(t, text, strlen(text), &ids) != 0) {
        fprintf(stderr, "fp8train tokenize: out of memory\n");
        fp8t_bpe_free(t);
        return 1;
    }
    printf("ids:");
    for (size_t i = 0; i < ids.n; i++) printf(" %d", ids.v[i]);
    printf("\ntokens: %zu\npieces:", ids.n);
    for (size_t i = 0; i < ids.n; i++) {
        size_t k;
        const unsigned char *p = (const unsigned char *)fp8t_bpe_piece(t, ids.v[i], &k);
        /* a piece that is whole UTF-8 prints as text; one holding part of a character (byte
         * tokens) shows its high bytes as \xNN */
        int utf8 = 1;
        for (size_t j = 0; j < k && utf8;) {
            int len = p[j] < 0x80             ? 1
                      : (p[j] & 0xE0) == 0xC0 ? 2
                      : (p[j] & 0xF0) == 0xE0 ? 3
                      : (p[j] & 0xF8) == 0xF0 ? 4
                                              : 0;
            if (!len || j + (size_t)len > k) utf8 = 0;
            for (int c = 1; utf8 && c < len; c++) utf8 = (p[j + (size_t)c] & 0xC0) == 0x80;
            j += (size_t)(len ? len : 1);
        }
        printf(" \"");
        for (size_t j = 0; j < k; j++) {
            if (p[j] == '"' || p[j] == '\\')
                printf("\\%c", p[j]);
            else if (p[j] < 0x20 || p[j] == 0x7f || (p[j] >= 0x80 && !utf8))
                printf("\\x%02x", p[j]);
            else
                putchar(p[j]);
        }
        printf("\"");
    }
    printf("\n");
    free(ids.v);
    fp8t_bpe_free(t);
    return 0;
}

/* Does DIR already hold shards of ours? (Stale ones would join the new ones in a glob.) */
static const char *existing_shard(const char *dir) {
    static char first[4096];
    const char *kinds[] = {"train", "val"};
    for (int k = 0; k < 2; k++) {
        char pat[4096];
        snprintf(pat, sizeof(pat), "%s/%s_*.bin", dir, kinds[k]);
        glob_t g;
        if (glob(pat, 0, NULL, &g) == 0) {
            snprintf(first, sizeof(first), "%s", g.gl_pathv[0]);
            globfree(&g);
            return first;
        }
    }
    return NULL;
}

int fp8t_cmd_tokenize(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], CMD)) {
        argc--;
        argv++;
    }
    tokenize_opts o = {.tokenizer = NULL,
                       .out = NULL,
                       .field = "text",
                       .text = NULL,
                       .val_frac = 0.1f,
                       .shard_tokens = 100000000,
                       .quiet = 0};
    int n_files = 0;
    const char **files = calloc((size_t)argc + 1, sizeof(char *));
    if (!files) return 1;
    int st = cli_parse(&SPEC, &o, sizeof(o), argc, argv, files, &n_files);
    if (st >= 0) {
        free(files);
        return st;
    }
    const char *tok_path = o.tokenizer, *out = o.out, *field = o.field, *text = o.text;
    const float val_frac = o.val_frac;
    const uint64_t shard_tokens = o.shard_tokens;
    const int quiet = o.quiet;
    if (text) {
        int rc = print_tokens(tok_path, text, n_files);
        free(files);
        return rc;
    }
    if (!n_files || !tok_path || !out) {
        fprintf(stderr, "fp8train tokenize: %s (see fp8train tokenize --help)\n",
                !n_files    ? "which files? give one or more text or .jsonl files"
                : !tok_path ? "--tokenizer tokenizer.json is required"
                            : "--out DIR is required");
        free(files);
        return 2;
    }
    job j;
    memset(&j, 0, sizeof(j));
    int status = 2;
    fp8t_bpe *t = NULL;
    /* every input must exist before anything is written */
    for (int i = 0; i < n_files; i++) {
        struct stat st;
        if (stat(files[i], &st) != 0 || !S_ISREG(st.st_mode)) {
            fprintf(stderr, "fp8train tokenize: '%s' is not a readable file%s\n", files[i],
                    fp8t_is_dir(files[i]) ? " (a directory: give its files, e.g. dir/*.txt)"
                                          : "");
            goto done;
        }
        j.total_bytes += (uint64_t)st.st_size;
    }
    if (!(t = fp8t_bpe_load(tok_path, j.err, sizeof(j.err)))) {
        fprintf(stderr, "fp8train tokenize: --tokenizer: %s\n", j.err);
        goto done;
    }
    const char *old = existing_shard(out);
    if (old) {
        fprintf(stderr,
                "fp8train tokenize: --out %s already holds shards (%s); choose another "
                "directory or remove them first (fp8train does not overwrite data)\n",
                out, old);
        goto done;
    }
    if (fp8t_mkdirs(out, j.err, sizeof(j.err)) != 0) {
        fprintf(stderr, "fp8train tokenize: --out: %s\n", j.err);
        status = 1;
        goto done;
    }
    int wide = fp8t_bpe_vocab_size(t) > 65536;
    j.train = (sink){.dir = out, .kind = "train", .wide = wide, .shard_tokens = shard_tokens};
    j.val = (sink){.dir = out, .kind = "val", .wide = wide, .shard_tokens = shard_tokens};
    j.mark = (uint64_t)((double)j.total_bytes * (1.0 - val_frac));
    if (val_frac == 0) j.mark = j.total_bytes;
    j.progress = !quiet && isatty(2);
    j.t0 = j.last_print = now();
    printf("tokenize: %d file%s, %.2f MB, with %s\n", n_files, n_files == 1 ? "" : "s",
           j.total_bytes / 1e6, fp8t_bpe_describe(t));
    fflush(stdout);
    for (int i = 0; i < n_files; i++) {
        j.err[0] = 0;
        if (fp8t_bpe_encode_file(t, files[i], field, on_doc, &j, j.err, sizeof(j.err)) != 0) {
            if (j.progress) fprintf(stderr, "\n");
            fprintf(stderr, "fp8train tokenize: %s\n", j.err);
            /* a failed write is 1; bad input (a malformed JSONL line) is 2 */
            status = strstr(j.err, "cannot write") || strstr(j.err, "out of memory") ? 1 : 2;
            goto done;
        }
        struct stat st;
        j.base += stat(files[i], &st) == 0 ? (uint64_t)st.st_size : 0;
        j.done_bytes = j.base;
    }
    if (sink_flush(&j, &j.train) != 0 || sink_flush(&j, &j.val) != 0) {
        fprintf(stderr, "fp8train tokenize: %s\n", j.err);
        status = 1;
        goto done;
    }
    print_progress(&j, 1);
    double dt = now() - j.t0;
    if (dt < 1e-9) dt = 1e-9;
    printf("tokenize: %zu document%s -> %zu tokens in %.2f s (%.2fM tokens/s, %.1f MB/s)\n",
           j.docs, j.docs == 1 ? "" : "s", j.tokens, dt, j.tokens / dt / 1e6,
           j.total_bytes / dt / 1e6);
    printf("  train: %zu tokens in %d shard%s %s/train_*.bin\n", j.train.total, j.train.shards,
           j.train.shards == 1 ? "" : "s", out);
    if (j.val.shards)
        printf("  val:   %zu tokens in %d shard%s %s/val_*.bin\n", j.val.total, j.val.shards,
               j.val.shards == 1 ? "" : "s", out);
    else
        printf("  val:   none (--val-frac %g)\n", val_frac);
    printf("  %s shards (%d-bit tokens), vocab %d\n", wide ? "llm.c Llama-3" : "llm.c GPT-2",
           wide ? 32 : 16, fp8t_bpe_vocab_size(t));
    printf("train on them: fp8train train --data '%s/train_*.bin'%s%s%s --vocab %d ...\n", out,
           j.val.shards ? " --val-data '" : "", j.val.shards ? out : "",
           j.val.shards ? "/val_*.bin'" : "", fp8t_bpe_vocab_size(t));
    status = 0;
done:
    if (status != 0) /* remove the shards this run wrote: no half data set is left behind */
        for (int i = 0; i < j.n_written; i++)
            if (j.written[i]) unlink(j.written[i]);
    for (int i = 0; i < j.n_written; i++) free(j.written[i]);
    free(j.written);
    free(j.train.buf);
    free(j.val.buf);
    fp8t_bpe_free(t);
    free(files);
    return status;
}
