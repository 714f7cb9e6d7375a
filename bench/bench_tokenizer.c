/* fp8train — tokenizer.json byte-level BPE throughput on one core (src/io/bpe_tokenizer.c).
 * Usage: bench_tokenizer [TOKENIZER.json [TEXT_FILE [MB]]]
 *   default tokenizer: tests/data/tokenizer/llama3.json; default text: the test texts
 *   (tests/data/tokenizer/shakespeare.txt + multilingual.txt) repeated to MB megabytes (8).
 * Prints MB/s of text encoded with a cold word cache (a fresh tokenizer: every word of the
 * text met for the first time goes through the regex and BPE) and warm (the same text again),
 * tokens/s, and decode MB/s, against the target of 5 MB/s per core. Rates are per CPU second
 * of this thread (CLOCK_THREAD_CPUTIME_ID), so a machine shared with other jobs still measures
 * what one core does; the wall-clock rate of the cold encode is printed too. Run from the repo
 * root. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fp8train/io.h"
#include "fp8train/tokenizer.h"

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }
static double wall(void) { return clock_s(CLOCK_MONOTONIC); }

static char *slurp(const char *path, size_t *len) {
    char *d = NULL, err[512];
    if (fp8t_read_file(path, &d, len, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_tokenizer: %s\n", err);
        exit(2);
    }
    return d;
}

int main(int argc, char **argv) {
    const char *tok_path = argc > 1 ? argv[1] : "tests/data/tokenizer/llama3.json";
    double mb = argc > 3 ? atof(argv[3]) : 8.0;
    size_t len = 0;
    char *text;
    if (argc > 2) {
        text = slurp(argv[2], &len);
    } else {
        size_t a, b;
        char *s1 = slurp("tests/data/tokenizer/shakespeare.txt", &a);
        char *s2 = slurp("tests/data/tokenizer/multilingual.txt", &b);
        size_t want = (size_t)(mb * 1e6);
        text = malloc(want + a + b);
        while (len < want) {
            memcpy(text + len, s1, a);
            len += a;
            memcpy(text + len, s2, b);
            len += b;
        }
        free(s1);
        free(s2);
    }
    char err[1024];
    double t0 = now();
    fp8t_bpe *t = fp8t_bpe_load(tok_path, err, sizeof(err));
    if (!t) {
        fprintf(stderr, "bench_tokenizer: %s\n", err);
        return 2;
    }
    double t_load = now() - t0;
    printf("%s\nload: %.3f s\ntext: %.2f MB%s\n", fp8t_bpe_describe(t), t_load, len / 1e6,
           argc > 2 ? "" : " (the test texts repeated)");
    fp8t_tok_ids ids = {0};
    double best_cold = 0, best_warm = 0, best_dec = 0, best_cold_wall = 0;
    for (int rep = 0; rep < 3; rep++) {
        /* cold: a fresh tokenizer, so the word cache starts empty */
        fp8t_bpe *f = fp8t_bpe_load(tok_path, err, sizeof(err));
        ids.n = 0;
        t0 = now();
        double w0 = wall();
        if (!f || fp8t_bpe_encode(f, text, len, &ids) != 0) return 2;
        double dt = now() - t0, dw = wall() - w0;
        if (len / dt > best_cold) best_cold = len / dt;
        if (len / dw > best_cold_wall) best_cold_wall = len / dw;
        ids.n = 0;
        t0 = now();
        if (fp8t_bpe_encode(f, text, len, &ids) != 0) return 2;
        dt = now() - t0;
        if (len / dt > best_warm) best_warm = len / dt;
        fp8t_bpe_free(f);
        char *dec;
        size_t dlen;
        t0 = now();
        if (fp8t_bpe_decode(t, ids.v, ids.n, &dec, &dlen) != 0) return 2;
        dt = now() - t0;
        if (len / dt > best_dec) best_dec = len / dt;
        if (dlen != len || memcmp(dec, text, len)) {
            fprintf(stderr, "bench_tokenizer: decode(encode(text)) != text\n");
            return 1;
        }
        free(dec);
    }
    double tok_per_byte = (double)ids.n / (double)len;
    printf("tokens: %zu (%.2f bytes/token)\n", ids.n, 1.0 / tok_per_byte);
    printf("encode, cold cache: %7.2f MB/s  %6.2f M tokens/s  (per CPU second; wall clock "
           "%.2f MB/s)\n",
           best_cold / 1e6, best_cold * tok_per_byte / 1e6, best_cold_wall / 1e6);
    printf("encode, warm cache: %7.2f MB/s  %6.2f M tokens/s\n", best_warm / 1e6,
           best_warm * tok_per_byte / 1e6);
    printf("decode:             %7.2f MB/s\n", best_dec / 1e6);
    printf("target 5 MB/s per core (cold): %s\n", best_cold >= 5e6 ? "met" : "NOT met");
    free(ids.v);
    free(text);
    fp8t_bpe_free(t);
    return 0;
}
