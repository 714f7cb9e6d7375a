/* The tokenizer.json byte-level BPE (src/io/bpe_tokenizer.c) against the `tokenizers` library:
 * the fixtures in tests/data/tokenizer/ (made by scripts/make_tokenizer_fixtures.py) hold three
 * small tokenizers in GPT-2, Llama-3 and Qwen2 style and the ids `tokenizers` gives for a
 * tinyshakespeare slice and a multilingual/emoji sample; the C encoder must give the same ids.
 * Also: decode(encode(x)) == x (on arbitrary bytes too), special tokens, and bad files. Run
 * from the repository root (as `make test` does) or set FP8T_TEST_DATA to tests/data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp8train/data.h"
#include "fp8train/io.h"
#include "fp8train/tokenizer.h"
#include "test.h"

static char g_data[512] = "tests/data";

static char *path_of(const char *name) {
    static char p[1024];
    snprintf(p, sizeof(p), "%s/tokenizer/%s", g_data, name);
    return p;
}

static char *read_text(const char *name, size_t *len) {
    char *d = NULL, err[512];
    if (fp8t_read_file(path_of(name), &d, len, err, sizeof(err)) != 0) {
        printf("  %s\n", err);
        return NULL;
    }
    return d;
}

/* "1 2 3\n" -> ids */
static int32_t *read_ids(const char *name, size_t *n) {
    size_t len;
    char *d = read_text(name, &len);
    if (!d) return NULL;
    int32_t *v = malloc((len / 2 + 1) * sizeof(int32_t));
    *n = 0;
    for (char *p = d, *e; v; p = e) {
        long x = strtol(p, &e, 10);
        if (e == p) break;
        v[(*n)++] = (int32_t)x;
    }
    free(d);
    return v;
}

static fp8t_bpe *load(const char *name) {
    char err[1024];
    fp8t_bpe *t = fp8t_bpe_load(path_of(name), err, sizeof(err));
    if (!t) printf("  %s\n", err);
    return t;
}

/* Encode TEXT with TOK and compare with the ids `tokenizers` gave; decode back. */
static void check_same_ids(const char *tok, const char *text) {
    char ids_name[128], text_name[128], tok_name[128];
    snprintf(tok_name, sizeof(tok_name), "%s.json", tok);
    snprintf(text_name, sizeof(text_name), "%s.txt", text);
    snprintf(ids_name, sizeof(ids_name), "%s.%s.ids", tok, text);
    fp8t_bpe *t = load(tok_name);
    size_t len, n_ref;
    char *s = read_text(text_name, &len);
    int32_t *ref = read_ids(ids_name, &n_ref);
    fp8t_tok_ids ids = {0};
    T_ASSERT(t && s && ref, "fixtures missing (run from the repository root)");
    T_ASSERT(fp8t_bpe_encode(t, s, len, &ids) == 0, "encode failed");
    size_t first = 0;
    while (first < ids.n && first < n_ref && ids.v[first] == ref[first]) first++;
    if (ids.n != n_ref || first != n_ref) {
        size_t k;
        const char *p = first < ids.n ? fp8t_bpe_piece(t, ids.v[first], &k) : NULL;
        T_FAIL("%s on %s: %zu ids, `tokenizers` %zu; first difference at %zu: %d ('%.*s') vs %d",
               tok, text, ids.n, n_ref, first, first < ids.n ? ids.v[first] : -1, p ? (int)k : 0,
               p ? p : "", first < n_ref ? ref[first] : -1);
    }
    /* a second encode runs from the word cache, a third with a cache emptied every 7 words,
     * a fourth with none: same ids */
    fp8t_tok_ids again = {0};
    T_CHECK(fp8t_bpe_encode(t, s, len, &again) == 0 && again.n == ids.n &&
                !memcmp(again.v, ids.v, ids.n * sizeof(int32_t)),
            "cached encode differs");
    for (int lim = 7; lim >= 0; lim -= 7) {
        fp8t_bpe_set_cache_limit(t, (size_t)lim);
        again.n = 0;
        T_CHECK(fp8t_bpe_encode(t, s, len, &again) == 0 && again.n == ids.n &&
                    !memcmp(again.v, ids.v, ids.n * sizeof(int32_t)),
                "encode with a cache limit of %d differs", lim);
    }
    char *dec = NULL;
    size_t dlen = 0;
    T_CHECK(fp8t_bpe_decode(t, ids.v, ids.n, &dec, &dlen) == 0 && dlen == len &&
                !memcmp(dec, s, len),
            "decode(encode(x)) != x (%zu vs %zu bytes)", dlen, len);
    free(dec);
    free(again.v);
    free(ids.v);
    free(ref);
    free(s);
    fp8t_bpe_free(t);
}

static void test_gpt2_shakespeare(void) { check_same_ids("gpt2", "shakespeare"); }
static void test_gpt2_multilingual(void) { check_same_ids("gpt2", "multilingual"); }
static void test_llama3_shakespeare(void) { check_same_ids("llama3", "shakespeare"); }
static void test_llama3_multilingual(void) { check_same_ids("llama3", "multilingual"); }
static void test_qwen2_shakespeare(void) { check_same_ids("qwen2", "shakespeare"); }
static void test_qwen2_multilingual(void) { check_same_ids("qwen2", "multilingual"); }

/* Short strings (SET.bin, NUL after each: random.bin, 400 over a pool of hard cases; nfc.bin,
 * 300 that NFC changes), one line of `tokenizers`' ids per string in TOK.SET.ids: each string
 * encoded on its own. */
static void check_strings(const char *tok, const char *set, int want_n) {
    char name[64];
    snprintf(name, sizeof(name), "%s.json", tok);
    fp8t_bpe *t = load(name);
    size_t blen, ilen;
    snprintf(name, sizeof(name), "%s.bin", set);
    char *b = read_text(name, &blen);
    snprintf(name, sizeof(name), "%s.%s.ids", tok, set);
    char *ids_text = read_text(name, &ilen);
    T_ASSERT(t && b && ids_text, "fixtures missing");
    int n_str = 0, bad = 0, changed = 0;
    char *line = ids_text;
    for (size_t s = 0, i = 0; i < blen; i++) {
        if (b[i]) continue;
        char *nl = strchr(line, '\n');
        T_ASSERT(nl, "%s has fewer lines than random.bin has strings", name);
        *nl = 0;
        fp8t_tok_ids ids = {0};
        T_ASSERT(fp8t_bpe_encode(t, b + s, i - s, &ids) == 0, "encode");
        char got[4096] = "";
        for (size_t k = 0; k < ids.n && strlen(got) < sizeof(got) - 16; k++)
            snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%d", k ? " " : "",
                     ids.v[k]);
        if (strcmp(got, line) && bad++ < 3)
            T_FAIL("%s, string %d (\"%.*s\"): got [%s], `tokenizers` [%s]", tok, n_str,
                   (int)(i - s), b + s, got, line);
        char *dec = NULL;
        size_t dlen = 0;
        T_ASSERT(fp8t_bpe_decode(t, ids.v, ids.n, &dec, &dlen) == 0, "decode");
        changed += dlen != i - s || memcmp(dec, b + s, dlen) != 0;
        free(dec);
        free(ids.v);
        line = nl + 1;
        s = i + 1;
        n_str++;
    }
    T_CHECK(n_str == want_n && bad == 0, "%d strings, %d differ", n_str, bad);
    /* decode(encode(x)) is x, except where NFC changed it (nfc.bin: most strings) */
    if (!strcmp(set, "nfc"))
        T_CHECK(changed > n_str / 2, "NFC changed only %d of %d", changed, n_str);
    else
        T_CHECK(changed == 0, "%d strings do not decode back", changed);
    free(b);
    free(ids_text);
    fp8t_bpe_free(t);
}

static void test_gpt2_random(void) { check_strings("gpt2", "random", 400); }
static void test_llama3_random(void) { check_strings("llama3", "random", 400); }
static void test_qwen2_random(void) { check_strings("qwen2", "random", 400); }
/* Qwen2's NFC normalizer on 300 strings that NFC changes */
static void test_qwen2_nfc(void) { check_strings("qwen2", "nfc", 300); }

/* Any bytes (invalid UTF-8, NULs, lone continuation bytes) survive encode + decode. */
static void test_roundtrip_random_bytes(void) {
    const char *toks[] = {"gpt2.json", "llama3.json", "qwen2.json"};
    for (int k = 0; k < 3; k++) {
        fp8t_bpe *t = load(toks[k]);
        T_ASSERT(t, "load %s", toks[k]);
        uint64_t x = 0x9E3779B97F4A7C15ULL * (uint64_t)(k + 1);
        for (int trial = 0; trial < 200; trial++) {
            unsigned char buf[300];
            size_t n = (size_t)(trial % 7 == 0 ? 0 : 1 + trial % 299);
            for (size_t i = 0; i < n; i++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                /* mostly text-like bytes with some high and control bytes */
                unsigned r = (unsigned)(x >> 24);
                buf[i] = r % 4 == 0 ? (unsigned char)(r >> 8)
                                    : (unsigned char)" aeiouxyz'\n\t0123.!<|>"[r % 22];
            }
            fp8t_tok_ids ids = {0};
            char *dec = NULL;
            size_t dlen;
            T_ASSERT(fp8t_bpe_encode(t, (const char *)buf, n, &ids) == 0, "encode");
            T_ASSERT(fp8t_bpe_decode(t, ids.v, ids.n, &dec, &dlen) == 0, "decode");
            T_CHECK(dlen == n && !memcmp(dec, buf, n),
                    "%s trial %d: round trip of %zu bytes "
                    "gave %zu",
                    toks[k], trial, n, dlen);
            for (size_t i = 0; i < ids.n; i++)
                T_CHECK(ids.v[i] >= 0 && ids.v[i] < fp8t_bpe_vocab_size(t), "id %d", ids.v[i]);
            free(dec);
            free(ids.v);
        }
        fp8t_bpe_free(t);
    }
}

static void test_special_tokens(void) {
    fp8t_bpe *t = load("llama3.json");
    T_ASSERT(t, "load");
    int bos = fp8t_bpe_token_id(t, "<|begin_of_text|>");
    int eot = fp8t_bpe_token_id(t, "<|eot_id|>");
    T_CHECK(bos == 1200 && eot == 1205, "bos %d eot %d", bos, eot);
    T_CHECK(fp8t_bpe_vocab_size(t) == 1206, "vocab %d", fp8t_bpe_vocab_size(t));
    /* the post-processor's BOS starts documents */
    T_CHECK(fp8t_bpe_doc_token(t) == bos, "doc token %d", fp8t_bpe_doc_token(t));
    const char *s = "<|begin_of_text|>hi<|eot_id|><|eot_id|>x<|begin_of_text";
    fp8t_tok_ids ids = {0};
    T_ASSERT(fp8t_bpe_encode(t, s, strlen(s), &ids) == 0, "encode");
    int n_bos = 0, n_eot = 0;
    for (size_t i = 0; i < ids.n; i++) {
        n_bos += ids.v[i] == bos;
        n_eot += ids.v[i] == eot;
    }
    T_CHECK(ids.v[0] == bos && n_bos == 1 && n_eot == 2, "first %d, %d bos, %d eot", ids.v[0],
            n_bos, n_eot);
    size_t k;
    const char *p = fp8t_bpe_piece(t, eot, &k);
    T_CHECK(p && k == strlen("<|eot_id|>") && !memcmp(p, "<|eot_id|>", k), "piece of eot");
    free(ids.v);
    fp8t_bpe_free(t);
    t = load("gpt2.json");
    T_ASSERT(t, "load gpt2");
    T_CHECK(fp8t_bpe_doc_token(t) == fp8t_bpe_token_id(t, "<|endoftext|>") &&
                fp8t_bpe_doc_token(t) == 1000,
            "gpt2 doc token %d", fp8t_bpe_doc_token(t));
    fp8t_bpe_free(t);
}

/* A hand-made tokenizer: the merge order, leftmost-first ties, ignore_merges, lstrip/rstrip,
 * add_prefix_space and the pair form of merges. The expected ids are what `tokenizers` 0.23.3
 * gives for the same JSON (merges all in pair form there: it refuses a mixed list). */
static void test_handmade(void) {
    const char *base =
        "{\"added_tokens\": [{\"id\": 9, \"content\": \"<s>\", \"lstrip\": %s, \"rstrip\": %s}],"
        " \"normalizer\": null,"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": %s, \"use_regex\": true},"
        " \"decoder\": {\"type\": \"ByteLevel\"},"
        " \"model\": {\"type\": \"BPE\", \"ignore_merges\": %s,"
        "  \"vocab\": {\"a\": 0, \"b\": 1, \"Ġ\": 2, \"ab\": 3, \"aa\": 4, \"Ġa\": 5, \"aab\": 6,"
        "             \"abb\": 7, \"bb\": 8},"
        "  \"merges\": [[\"a\", \"b\"], \"a a\", [\"Ġ\", \"a\"], \"aa b\"]}}";
    char json[2048], err[512];
    struct {
        const char *lstrip, *rstrip, *prefix, *ignore, *text, *want;
    } cases[] = {
        /* "aab": a+b has rank 0 -> a,ab; then nothing ("a ab" is not a merge) */
        {"false", "false", "false", "false", "aab", "0 3"},
        /* ignore_merges: "aab" is in the vocab, taken whole */
        {"false", "false", "false", "true", "aab", "6"},
        /* "aaaa": a a at 0 first (leftmost among equal ranks) -> aa aa */
        {"false", "false", "false", "false", "aaaa", "4 4"},
        {"false", "false", "false", "false", "aaa", "4 0"},
        /* " ab": Ġ a b -> a+b rank 0 first -> Ġ ab */
        {"false", "false", "false", "false", " ab", "2 3"},
        /* add_prefix_space: "a" -> " a" -> Ġa */
        {"false", "false", "true", "false", "a", "5"},
        /* special token, without and with stripping of the spaces next to it */
        {"false", "false", "false", "false", "a <s> b", "0 2 9 2 1"},
        {"true", "true", "false", "false", "a <s> b", "0 9 1"},
        /* b is unknown as "Ġb"? no: Ġ and b are both tokens */
        {"false", "false", "false", "false", " b", "2 1"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        snprintf(json, sizeof(json), base, cases[c].lstrip, cases[c].rstrip, cases[c].prefix,
                 cases[c].ignore);
        fp8t_bpe *t = fp8t_bpe_parse(json, strlen(json), "handmade.json", err, sizeof(err));
        T_ASSERT(t, "case %zu: %s", c, err);
        fp8t_tok_ids ids = {0};
        T_ASSERT(fp8t_bpe_encode(t, cases[c].text, strlen(cases[c].text), &ids) == 0, "encode");
        char got[256] = "";
        for (size_t i = 0; i < ids.n; i++)
            snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%d", i ? " " : "",
                     ids.v[i]);
        T_CHECK(!strcmp(got, cases[c].want), "case %zu \"%s\": got \"%s\", want \"%s\"", c,
                cases[c].text, got, cases[c].want);
        free(ids.v);
        fp8t_bpe_free(t);
    }
}

/* Split with a literal String pattern, behaviours Isolated and Removed, before ByteLevel
 * (expected ids checked against `tokenizers` 0.23.3). */
static void test_split_string(void) {
    const char *base =
        "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
        "  {\"type\": \"Split\", \"pattern\": {\"String\": \"-+\"}, \"behavior\": \"%s\"},"
        "  {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
        " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"-\": 2, \"+\": 3,"
        "  \"-+\": 4, \"a-\": 5, \"+b\": 6}, \"merges\": [\"- +\", \"a -\", \"+ b\"]}}";
    struct {
        const char *behavior, *want;
    } cases[] = {
        /* "a-+b": the literal "-+" (not a regex: '+' is no quantifier) is its own piece, so
         * "a -" and "+ b" never merge across it */
        {"Isolated", "0 4 1"},
        {"Removed", "0 1"},
    };
    for (size_t c = 0; c < 2; c++) {
        char json[1024], err[512];
        snprintf(json, sizeof(json), base, cases[c].behavior);
        fp8t_bpe *t = fp8t_bpe_parse(json, strlen(json), "split.json", err, sizeof(err));
        T_ASSERT(t, "%s", err);
        fp8t_tok_ids ids = {0};
        T_ASSERT(fp8t_bpe_encode(t, "a-+b", 4, &ids) == 0, "encode");
        char got[64] = "";
        for (size_t i = 0; i < ids.n; i++)
            snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%d", i ? " " : "",
                     ids.v[i]);
        T_CHECK(!strcmp(got, cases[c].want), "%s: got \"%s\", want \"%s\"", cases[c].behavior,
                got, cases[c].want);
        free(ids.v);
        fp8t_bpe_free(t);
    }
}

/* Bad tokenizer.json files: each error names the file and says what is wrong. */
static void test_bad_files(void) {
    char err[1024];
    struct {
        const char *json, *want;
    } cases[] = {
        {"{not json", "not valid JSON"},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "WordPiece"},
        {"{\"version\": \"1.0\"}", "no \"model\" object"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]},"
         " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "not in model.vocab"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"ab\"]},"
         " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "not two tokens"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
         " \"pre_tokenizer\": {\"type\": \"Metaspace\"}}",
         "Metaspace"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
         " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"},"
         " \"behavior\": \"Isolated\"}}",
         "does not compile"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
         " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"},"
         " \"behavior\": \"Isolated\"}}",
         "no ByteLevel"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []},"
         " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "not a token id"},
        {"{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {}, \"merges\": []}}",
         "byte_fallback"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
         " \"normalizer\": {\"type\": \"Lowercase\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "normalizer"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        err[0] = 0;
        fp8t_bpe *t =
            fp8t_bpe_parse(cases[c].json, strlen(cases[c].json), "bad.json", err, sizeof(err));
        T_CHECK(!t && strstr(err, "bad.json") && strstr(err, cases[c].want),
                "case %zu: want an error with '%s', got '%s'", c, cases[c].want, err);
        fp8t_bpe_free(t);
    }
    fp8t_bpe *t = fp8t_bpe_load("/nonexistent/tokenizer.json", err, sizeof(err));
    T_CHECK(!t && strstr(err, "/nonexistent/tokenizer.json"), "missing file: %s", err);
}

/* llm.c's Llama-3 shards (uint32 tokens) written and read back, and read by the data stream
 * with ids past 65535 intact; a GPT-2 shard reads widened. */
static void test_shard_u32(void) {
    char dir[] = "/tmp/fp8t_test_tok_XXXXXX", p32[256], p16[256], err[1024];
    T_ASSERT(mkdtemp(dir), "mkdtemp");
    snprintf(p32, sizeof(p32), "%s/train_000000.bin", dir);
    snprintf(p16, sizeof(p16), "%s/gpt2.bin", dir);
    enum { N = 5000 };
    static uint32_t tok[N];
    static uint16_t tok16[N];
    for (int i = 0; i < N; i++) {
        tok[i] = (uint32_t)(i * 7919u) % 128256u;
        tok16[i] = (uint16_t)i;
    }
    T_ASSERT(fp8t_shard_write_u32(p32, tok, N, err, sizeof(err)) == 0, "%s", err);
    T_ASSERT(fp8t_shard_write(p16, tok16, N, err, sizeof(err)) == 0, "%s", err);
    uint32_t *back = NULL;
    size_t n = 0;
    T_ASSERT(fp8t_shard_read_u32(p32, &back, &n, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(n == N && !memcmp(back, tok, sizeof(tok)), "32-bit shard round trip");
    free(back);
    T_ASSERT(fp8t_shard_read_u32(p16, &back, &n, err, sizeof(err)) == 0, "%s", err);
    int ok = n == N;
    for (size_t i = 0; ok && i < n; i++) ok = back[i] == tok16[i];
    T_CHECK(ok, "16-bit shard widened");
    free(back);
    uint16_t *b16 = NULL;
    T_CHECK(fp8t_shard_read(p32, &b16, &n, err, sizeof(err)) != 0 && strstr(err, "32-bit"),
            "the 16-bit reader must refuse a 32-bit shard clearly: %s", err);
    free(b16);
    /* the data stream: every window of the shard, ids intact */
    char pat[300];
    snprintf(pat, sizeof(pat), "%s/train_*.bin", dir);
    fp8t_data *d = fp8t_data_open(pat, "", FP8T_SPLIT_TRAIN, 2, 8, 128256, 1, err, sizeof(err));
    T_ASSERT(d, "%s", err);
    int x[16], y[16], found = 0;
    fp8t_data_batch(d, x, y, 3);
    for (int i = 0; i + 8 < N; i++) /* the window must be a stretch of the shard */
        if ((uint32_t)x[0] == tok[i] && (uint32_t)x[7] == tok[i + 7] &&
            (uint32_t)y[7] == tok[i + 8])
            found = 1;
    T_CHECK(found, "a batch of the 32-bit shard is not a window of it");
    fp8t_data_close(d);
    d = fp8t_data_open(pat, "", FP8T_SPLIT_TRAIN, 2, 8, 65536, 1, err, sizeof(err));
    T_CHECK(!d && strstr(err, "outside the model's vocabulary"), "vocab check: %s", err);
    fp8t_data_close(d);
    unlink(p32);
    unlink(p16);
    rmdir(dir);
}

int main(void) {
    t_suite = "tokenizer";
    const char *d = getenv("FP8T_TEST_DATA");
    if (d) snprintf(g_data, sizeof(g_data), "%s", d);
    T_RUN(test_gpt2_shakespeare);
    T_RUN(test_gpt2_multilingual);
    T_RUN(test_llama3_shakespeare);
    T_RUN(test_llama3_multilingual);
    T_RUN(test_qwen2_shakespeare);
    T_RUN(test_qwen2_multilingual);
    T_RUN(test_gpt2_random);
    T_RUN(test_llama3_random);
    T_RUN(test_qwen2_random);
    T_RUN(test_qwen2_nfc);
    T_RUN(test_roundtrip_random_bytes);
    T_RUN(test_special_tokens);
    T_RUN(test_handmade);
    T_RUN(test_split_string);
    T_RUN(test_bad_files);
    T_RUN(test_shard_u32);
    T_MAIN_END();
}
