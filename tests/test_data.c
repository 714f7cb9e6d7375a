/* Data loader: determinism, position round trip, the synthetic language's structure, text and
 * llm.c shard sources with their splits, and every bad-input case. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fp8train/data.h"
#include "fp8train/io.h"
#include "test.h"

#define B 4
#define T 32

static char tmpdir[256];

static void make_tmpdir(void) {
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/fp8t_test_data_%d", (int)getpid());
    fp8t_rmtree(tmpdir);
    mkdir(tmpdir, 0777);
}

static int batch_equal(const int *a, const int *b) {
    return memcmp(a, b, B * T * sizeof(int)) == 0;
}

static void test_synthetic_deterministic(void) {
    char err[512];
    fp8t_data *d1 =
        fp8t_data_open("synthetic", "", FP8T_SPLIT_TRAIN, B, T, 256, 42, err, sizeof(err));
    fp8t_data *d2 =
        fp8t_data_open("synthetic", "", FP8T_SPLIT_TRAIN, B, T, 256, 42, err, sizeof(err));
    fp8t_data *d3 =
        fp8t_data_open("synthetic", "", FP8T_SPLIT_TRAIN, B, T, 256, 43, err, sizeof(err));
    T_ASSERT(d1 && d2 && d3, "open failed: %s", err);
    int a[B * T], at[B * T], b[B * T], bt[B * T];
    /* the same index gives the same batch, whatever was generated before */
    fp8t_data_batch(d1, a, at, 5);
    fp8t_data_batch(d2, b, bt, 2);
    fp8t_data_batch(d2, b, bt, 5);
    T_CHECK(batch_equal(a, b) && batch_equal(at, bt), "batch 5 differs between two streams");
    fp8t_data_batch(d1, b, bt, 6);
    T_CHECK(!batch_equal(a, b), "batches 5 and 6 are identical");
    fp8t_data_batch(d3, b, bt, 5);
    T_CHECK(!batch_equal(a, b), "seeds 42 and 43 give the same batch");
    /* targets are the next tokens */
    int shifted = 1;
    for (int r = 0; r < B; r++)
        for (int t = 0; t + 1 < T; t++) shifted &= at[r * T + t] == a[r * T + t + 1];
    T_CHECK(shifted, "targets are not the tokens shifted by one");
    int in_range = 1;
    for (int i = 0; i < B * T; i++)
        in_range &= a[i] >= 0 && a[i] < 256 && at[i] >= 0 && at[i] < 256;
    T_CHECK(in_range, "token outside 0..255");
    /* rows of one batch differ */
    T_CHECK(memcmp(a, a + T, T * sizeof(int)) != 0, "rows 0 and 1 are identical");
    fp8t_data_close(d1);
    fp8t_data_close(d2);
    fp8t_data_close(d3);
}

static void test_position_round_trip(void) {
    char err[512];
    fp8t_data *d =
        fp8t_data_open("synthetic", "", FP8T_SPLIT_TRAIN, B, T, 256, 7, err, sizeof(err));
    T_ASSERT(d != NULL, "%s", err);
    int x[B * T], y[B * T], want[B * T], wy[B * T];
    T_CHECK(fp8t_data_position(d) == 0, "fresh stream at position %llu",
            (unsigned long long)fp8t_data_position(d));
    for (int i = 0; i < 3; i++) fp8t_data_next(d, x, y);
    uint64_t pos = fp8t_data_position(d);
    T_CHECK(pos == 3, "position %llu after 3 batches", (unsigned long long)pos);
    fp8t_data_next(d, want, wy);
    fp8t_data_next(d, x, y);
    /* restore the saved position in another stream: the same continuation */
    fp8t_data *e =
        fp8t_data_open("synthetic", "", FP8T_SPLIT_TRAIN, B, T, 256, 7, err, sizeof(err));
    T_ASSERT(e != NULL, "%s", err);
    fp8t_data_set_position(e, pos);
    fp8t_data_next(e, x, y);
    T_CHECK(batch_equal(x, want) && batch_equal(y, wy),
            "resumed stream differs at the saved position");
    T_CHECK(fp8t_data_position(e) == pos + 1, "position not advanced");
    fp8t_data_batch(e, x, y, pos);
    T_CHECK(batch_equal(x, want), "fp8t_data_batch(pos) differs from next() at pos");
    fp8t_data_close(d);
    fp8t_data_close(e);
}

static void test_val_stream_differs(void) {
    char err[512];
    fp8t_data *tr =
        fp8t_data_open("synthetic", "", FP8T_SPLIT_TRAIN, B, T, 256, 1, err, sizeof(err));
    fp8t_data *va =
        fp8t_data_open("synthetic", "", FP8T_SPLIT_VAL, B, T, 256, 1, err, sizeof(err));
    T_ASSERT(tr && va, "%s", err);
    int a[B * T], at[B * T], b[B * T], bt[B * T];
    int same = 0;
    for (uint64_t i = 0; i < 8; i++) {
        fp8t_data_batch(tr, a, at, i);
        fp8t_data_batch(va, b, bt, i);
        same += batch_equal(a, b);
    }
    T_CHECK(same == 0, "%d of 8 validation batches equal training batches", same);
    fp8t_data_close(tr);
    fp8t_data_close(va);
}

/* The language must have learnable structure: a bigram model already predicts it far better
 * than uniform, brackets close in order, '#' repeats the document's topic key. */
static void test_synthetic_structure(void) {
    const size_t n = 400000;
    int *x = malloc(n * sizeof(int));
    T_ASSERT(x != NULL, "oom");
    fp8t_synthetic_generate(x, n, 99);
    static double uni[256], bi[256][256];
    memset(uni, 0, sizeof(uni));
    memset(bi, 0, sizeof(bi));
    for (size_t i = 0; i < n; i++) uni[x[i]]++;
    for (size_t i = 1; i < n; i++) bi[x[i - 1]][x[i]]++;
    double h1 = 0, h2 = 0;
    int used = 0;
    for (int a = 0; a < 256; a++) {
        if (uni[a]) {
            h1 -= uni[a] / n * log(uni[a] / n);
            used++;
        }
        for (int b = 0; b < 256; b++)
            if (bi[a][b]) h2 -= bi[a][b] / n * log(bi[a][b] / uni[a]);
    }
    T_CHECK(h1 < 4.0 && h2 < 3.0, "unigram %.3f / bigram %.3f nats: too close to uniform 5.55",
            h1, h2);
    T_CHECK(used > 100, "only %d distinct tokens", used);
    /* brackets: every closer matches the innermost opener of its document */
    int stack[64], depth = 0, mism = 0, topic = -1, hash_ok = 0, hash_bad = 0;
    const char *open = "([{<", *close = ")]}>";
    for (size_t i = 0; i < n; i++) {
        int c = x[i];
        if (c == 1) { /* BOS: a new document, its topic key follows */
            depth = 0;
            topic = i + 1 < n ? x[i + 1] : -1;
        }
        const char *o = c > 0 && c < 128 ? strchr(open, c) : NULL;
        const char *cl = c > 0 && c < 128 ? strchr(close, c) : NULL;
        if (o && depth < 64) stack[depth++] = (int)(o - open);
        if (cl) {
            if (depth == 0 || stack[depth - 1] != (int)(cl - close))
                mism++;
            else
                depth--;
        }
        if (c == '#' && i + 1 < n && topic >= 0) {
            if (x[i + 1] == topic)
                hash_ok++;
            else
                hash_bad++;
        }
    }
    T_CHECK(mism == 0, "%d mismatched closing brackets", mism);
    T_CHECK(hash_ok > 100 && hash_bad == 0,
            "'#' followed by the topic %d times, by another token %d times", hash_ok, hash_bad);
    free(x);
}

static void write_bytes(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (n) fwrite(b, 1, n, f);
    fclose(f);
}

/* Where does window w (T+1 tokens) start in text? -1 if nowhere. */
static long find_window(const unsigned char *text, size_t n, const int *tok, int len) {
    for (size_t s = 0; s + (size_t)len <= n; s++) {
        int k = 0;
        while (k < len && text[s + k] == tok[k]) k++;
        if (k == len) return (long)s;
    }
    return -1;
}

static void test_text_file_splits(void) {
    enum { N = 3000 };
    unsigned char text[N];
    uint32_t s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        text[i] = (unsigned char)(s >> 24);
    }
    char path[512], err[512];
    snprintf(path, sizeof(path), "%s/corpus.txt", tmpdir);
    write_bytes(path, text, N);
    fp8t_data *tr = fp8t_data_open(path, "", FP8T_SPLIT_TRAIN, B, T, 256, 3, err, sizeof(err));
    fp8t_data *va = fp8t_data_open(path, "", FP8T_SPLIT_VAL, B, T, 256, 3, err, sizeof(err));
    T_ASSERT(tr && va, "%s", err);
    T_CHECK(fp8t_data_num_tokens(tr) == N - N / 10 && fp8t_data_num_tokens(va) == N / 10,
            "split sizes %zu / %zu", fp8t_data_num_tokens(tr), fp8t_data_num_tokens(va));
    int x[B * T], y[B * T];
    const size_t cut = N - N / 10;
    int bad_train = 0, bad_val = 0;
    for (uint64_t i = 0; i < 20; i++) {
        fp8t_data_batch(tr, x, y, i);
        for (int r = 0; r < B; r++) {
            int w[T + 1];
            memcpy(w, x + r * T, T * sizeof(int));
            w[T] = y[r * T + T - 1];
            long at = find_window(text, N, w, T + 1);
            bad_train += at < 0 || (size_t)at + T + 1 > cut;
        }
        fp8t_data_batch(va, x, y, i);
        for (int r = 0; r < B; r++) {
            int w[T + 1];
            memcpy(w, x + r * T, T * sizeof(int));
            w[T] = y[r * T + T - 1];
            long at = find_window(text, N, w, T + 1);
            bad_val += at < (long)cut;
        }
    }
    T_CHECK(bad_train == 0, "%d training windows outside the first 90%%", bad_train);
    T_CHECK(bad_val == 0, "%d validation windows outside the last 10%%", bad_val);
    fp8t_data_close(tr);
    fp8t_data_close(va);
    /* a separate validation file is used whole */
    char vpath[512];
    snprintf(vpath, sizeof(vpath), "%s/val.txt", tmpdir);
    write_bytes(vpath, text, 100);
    va = fp8t_data_open(path, vpath, FP8T_SPLIT_VAL, B, T, 256, 3, err, sizeof(err));
    tr = fp8t_data_open(path, vpath, FP8T_SPLIT_TRAIN, B, T, 256, 3, err, sizeof(err));
    T_ASSERT(va && tr, "%s", err);
    T_CHECK(fp8t_data_num_tokens(va) == 100 && fp8t_data_num_tokens(tr) == N,
            "with --val-data: %zu / %zu tokens", fp8t_data_num_tokens(tr),
            fp8t_data_num_tokens(va));
    fp8t_data_close(tr);
    fp8t_data_close(va);
}

static void test_text_file_errors(void) {
    char path[512], err[512];
    snprintf(path, sizeof(path), "%s/missing.txt", tmpdir);
    fp8t_data *d = fp8t_data_open(path, "", FP8T_SPLIT_TRAIN, B, T, 256, 1, err, sizeof(err));
    T_CHECK(!d && strstr(err, "missing.txt") && strstr(err, "cannot open"), "missing file: %s",
            err);
    snprintf(path, sizeof(path), "%s/empty.txt", tmpdir);
    write_bytes(path, (const unsigned char *)"", 0);
    d = fp8t_data_open(path, "", FP8T_SPLIT_TRAIN, B, T, 256, 1, err, sizeof(err));
    T_CHECK(!d && strstr(err, "empty.txt") && strstr(err, "empty"), "empty file: %s", err);
    snprintf(path, sizeof(path), "%s/short.txt", tmpdir);
    write_bytes(path, (const unsigned char *)"hello world, a short file", 25);
    d = fp8t_data_open(path, "", FP8T_SPLIT_TRAIN, B, T, 256, 1, err, sizeof(err));
    T_CHECK(!d && strstr(err, "short.txt") && strstr(err, "too short"), "short file: %s", err);
    /* long enough to train on, too short for the held-out 10% */
    unsigned char mid[100];
    memset(mid, 'a', sizeof(mid));
    snprintf(path, sizeof(path), "%s/mid.txt", tmpdir);
    write_bytes(path, mid, sizeof(mid));
    d = fp8t_data_open(path, "", FP8T_SPLIT_VAL, B, T, 256, 1, err, sizeof(err));
    T_CHECK(!d && strstr(err, "validation") && strstr(err, "--val-data"), "short val split: %s",
            err);
    /* a byte the model cannot represent */
    unsigned char hi[400];
    memset(hi, 'a', sizeof(hi));
    hi[123] = 200;
    snprintf(path, sizeof(path), "%s/hi.txt", tmpdir);
    write_bytes(path, hi, sizeof(hi));
    d = fp8t_data_open(path, "", FP8T_SPLIT_TRAIN, B, T, 128, 1, err, sizeof(err));
    T_CHECK(!d && strstr(err, "token 200") && strstr(err, "position 123") &&
                strstr(err, "--vocab 201"),
            "token >= vocab: %s", err);
    /* the synthetic language needs a vocabulary of 256 */
    d = fp8t_data_open("synthetic", "", FP8T_SPLIT_TRAIN, B, T, 100, 1, err, sizeof(err));
    T_CHECK(!d && strstr(err, "--vocab 256"), "synthetic with vocab 100: %s", err);
    /* a directory is not a text file */
    d = fp8t_data_open(tmpdir, "", FP8T_SPLIT_TRAIN, B, T, 256, 1, err, sizeof(err));
    T_CHECK(!d && strstr(err, "not a regular file"), "directory as data file: %s", err);
    fp8t_data_close(d);
}

static void test_shards(void) {
    char dir[512], p0[600], p1[600], pat[600], err[1024];
    snprintf(dir, sizeof(dir), "%s/shards", tmpdir);
    mkdir(dir, 0777);
    enum { N0 = 1000, N1 = 600 };
    uint16_t a[N0], b[N1];
    for (int i = 0; i < N0; i++) a[i] = (uint16_t)(i % 200);
    for (int i = 0; i < N1; i++) b[i] = (uint16_t)(1000 + i % 200); /* distinguishable */
    snprintf(p0, sizeof(p0), "%s/tok_000.bin", dir);
    snprintf(p1, sizeof(p1), "%s/tok_001.bin", dir);
    T_ASSERT(fp8t_shard_write(p0, a, N0, err, sizeof(err)) == 0, "%s", err);
    T_ASSERT(fp8t_shard_write(p1, b, N1, err, sizeof(err)) == 0, "%s", err);
    snprintf(pat, sizeof(pat), "%s/tok_*.bin", dir);
    fp8t_data *tr = fp8t_data_open(pat, "", FP8T_SPLIT_TRAIN, B, T, 2048, 5, err, sizeof(err));
    fp8t_data *va = fp8t_data_open(pat, "", FP8T_SPLIT_VAL, B, T, 2048, 5, err, sizeof(err));
    T_ASSERT(tr && va, "%s", err);
    T_CHECK(fp8t_data_num_tokens(tr) == (N0 - N0 / 10) + (N1 - N1 / 10), "train tokens %zu",
            fp8t_data_num_tokens(tr));
    T_CHECK(fp8t_data_vocab_needed(tr) == 1200, "vocab needed %d", fp8t_data_vocab_needed(tr));
    /* every window is consecutive tokens of one shard, and both shards are used */
    int x[B * T], y[B * T], from0 = 0, from1 = 0, broken = 0;
    for (uint64_t i = 0; i < 50; i++) {
        fp8t_data_batch(tr, x, y, i);
        for (int r = 0; r < B; r++) {
            int *w = x + r * T;
            int shard1 = w[0] >= 1000;
            from0 += !shard1;
            from1 += shard1;
            for (int t = 0; t + 1 < T; t++) {
                int base = shard1 ? 1000 : 0;
                broken += (w[t + 1] - base) != ((w[t] - base) + 1) % 200;
            }
            broken += y[r * T + T - 1] !=
                      ((shard1 ? w[T - 1] - 1000 : w[T - 1]) + 1) % 200 + (shard1 ? 1000 : 0);
        }
    }
    T_CHECK(broken == 0 && from0 > 0 && from1 > 0, "broken %d, windows from shard 0: %d, 1: %d",
            broken, from0, from1);
    fp8t_data_close(tr);
    fp8t_data_close(va);
    /* vocabulary check names the shard */
    tr = fp8t_data_open(pat, "", FP8T_SPLIT_TRAIN, B, T, 256, 5, err, sizeof(err));
    T_CHECK(!tr && strstr(err, "tok_001.bin") && strstr(err, "vocabulary"), "vocab: %s", err);
    /* no match */
    snprintf(pat, sizeof(pat), "%s/nothing_*.bin", dir);
    tr = fp8t_data_open(pat, "", FP8T_SPLIT_TRAIN, B, T, 2048, 5, err, sizeof(err));
    T_CHECK(!tr && strstr(err, "no llm.c token shards match"), "no match: %s", err);
    /* a bad header (wrong magic) */
    char bad[600];
    snprintf(bad, sizeof(bad), "%s/bad_000.bin", dir);
    int32_t hdr[256] = {12345, 1, 10};
    FILE *f = fopen(bad, "wb");
    fwrite(hdr, sizeof(hdr), 1, f);
    uint16_t ten[10] = {0};
    fwrite(ten, sizeof(ten), 1, f);
    fclose(f);
    snprintf(pat, sizeof(pat), "%s/bad_*.bin", dir);
    tr = fp8t_data_open(pat, "", FP8T_SPLIT_TRAIN, B, T, 2048, 5, err, sizeof(err));
    T_CHECK(!tr && strstr(err, "bad token shard") && strstr(err, "bad_000.bin"), "bad magic: %s",
            err);
    /* too few tokens for one sequence */
    uint16_t few[20] = {0};
    snprintf(bad, sizeof(bad), "%s/few_000.bin", dir);
    T_ASSERT(fp8t_shard_write(bad, few, 20, err, sizeof(err)) == 0, "%s", err);
    snprintf(pat, sizeof(pat), "%s/few_*.bin", dir);
    tr = fp8t_data_open(pat, "", FP8T_SPLIT_TRAIN, B, T, 2048, 5, err, sizeof(err));
    T_CHECK(!tr && strstr(err, "too few"), "too few tokens: %s", err);
}

int main(void) {
    t_suite = "data";
    make_tmpdir();
    T_RUN(test_synthetic_deterministic);
    T_RUN(test_position_round_trip);
    T_RUN(test_val_stream_differs);
    T_RUN(test_synthetic_structure);
    T_RUN(test_text_file_splits);
    T_RUN(test_text_file_errors);
    T_RUN(test_shards);
    fp8t_rmtree(tmpdir);
    T_MAIN_END();
}
