/* Hugging Face tokenizer.json byte-level BPE: see include/fp8train/tokenizer.h.
 *
 * Encoding follows the `tokenizers` library step by step so the ids agree exactly:
 *   1. added tokens are cut out of the raw text (leftmost, then longest);
 *   2. each remaining stretch goes through the pre-tokenizer steps in order (Split regexes,
 *      then ByteLevel, which may split again with GPT-2's regex); a piece is a byte range;
 *   3. each piece is BPE-merged: its bytes start as the byte tokens (ByteLevel's byte<->char
 *      table), then the pair of lowest merge rank is merged, leftmost first, until no pair has
 *      a rank. The ids of a piece depend on nothing else, so they are cached by the piece's
 *      bytes: in running text most words repeat, and the cache skips the regex-free part.
 * Decoding concatenates each id's bytes (precomputed at load). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "fp8train/error.h"
#include "fp8train/io.h"
#include "fp8train/tokenizer.h"
#include "io/nfc.h"
#include "util/fs.h"

#define MAX_STEPS 8 /* pre-tokenizer steps */
#define MAX_TOKEN_ID (1 << 24)
#define CACHE_MAX_PIECE 128 /* longer pieces are rare and not worth caching */
#define CACHE_MAX_ENTRIES (1u << 20)

/* ---------------------------------------------------------------- hashing */

static uint64_t hash_bytes(const void *p, size_t n) {
    /* 64-bit FNV-1a over 8-byte words (then the tail), with a final mix: fast for the short
     * keys here (tokens, words), and good enough for open addressing */
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ULL ^ (n * 0x9E3779B97F4A7C15ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
        b += 8;
        n -= 8;
    }
    while (n--) h = (h ^ *b++) * 0x100000001b3ULL;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ULL;
    h ^= h >> 32;
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* A growable byte arena; strings are referred to by offset so it can move. */
typedef struct {
    char *p;
    size_t n, cap;
} arena;

static int64_t arena_add(arena *a, const void *s, size_t n) {
    if (a->n + n + 1 > a->cap) {
        size_t cap = a->cap ? a->cap : 4096;
        while (a->n + n + 1 > cap) cap *= 2;
        char *p = realloc(a->p, cap);
        if (!p) return -1;
        a->p = p;
        a->cap = cap;
    }
    int64_t off = (int64_t)a->n;
    if (n) memcpy(a->p + a->n, s, n);
    a->p[a->n + n] = 0; /* strings stay NUL-terminated for messages */
    a->n += n + 1;
    return off;
}

/* string -> int map (open addressing, power-of-two capacity, keys in an arena) */
typedef struct {
    uint64_t h;
    uint32_t off, len;
    int32_t val; /* -1: empty slot */
} smap_slot;

typedef struct {
    smap_slot *s;
    size_t cap, n;
    arena keys;
} smap;

static int smap_init(smap *m, size_t expect) {
    size_t cap = 64;
    while (cap < expect * 2) cap *= 2;
    m->s = malloc(cap * sizeof(*m->s));
    if (!m->s) return -1;
    for (size_t i = 0; i < cap; i++) m->s[i].val = -1;
    m->cap = cap;
    m->n = 0;
    return 0;
}

static void smap_free(smap *m) {
    free(m->s);
    free(m->keys.p);
    memset(m, 0, sizeof(*m));
}

static smap_slot *smap_find_slot(const smap *m, const char *k, size_t n, uint64_t h) {
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        smap_slot *s = &m->s[i];
        if (s->val < 0) return s;
        if (s->h == h && s->len == n && memcmp(m->keys.p + s->off, k, n) == 0) return s;
    }
}

static int smap_get(const smap *m, const char *k, size_t n) {
    if (!m->s) return -1;
    return smap_find_slot(m, k, n, hash_bytes(k, n))->val;
}

static int smap_grow(smap *m) {
    smap_slot *old = m->s;
    size_t oldcap = m->cap, cap = m->cap * 2;
    smap_slot *s = malloc(cap * sizeof(*s));
    if (!s) return -1;
    for (size_t i = 0; i < cap; i++) s[i].val = -1;
    m->s = s;
    m->cap = cap;
    for (size_t i = 0; i < oldcap; i++) {
        if (old[i].val < 0) continue;
        smap_slot *d = smap_find_slot(m, m->keys.p + old[i].off, old[i].len, old[i].h);
        *d = old[i];
    }
    free(old);
    return 0;
}

/* Insert or overwrite; returns the slot's key offset in the arena, or -1 out of memory. */
static int64_t smap_put(smap *m, const char *k, size_t n, int32_t val) {
    if ((m->n + 1) * 2 > m->cap && smap_grow(m) != 0) return -1;
    uint64_t h = hash_bytes(k, n);
    smap_slot *s = smap_find_slot(m, k, n, h);
    if (s->val >= 0) {
        s->val = val;
        return s->off;
    }
    int64_t off = arena_add(&m->keys, k, n);
    if (off < 0 || off > (int64_t)UINT32_MAX) return -1;
    s->h = h;
    s->off = (uint32_t)off;
    s->len = (uint32_t)n;
    s->val = val;
    m->n++;
    return off;
}

/* merge map: (left id, right id) -> (rank, merged id) */
typedef struct {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank, id;
} merge_slot;

typedef struct {
    merge_slot *s;
    size_t cap, n;
} merge_map;

static const merge_slot *merge_get(const merge_map *m, uint32_t a, uint32_t b) {
    if (!m->s) return NULL;
    uint64_t key = (uint64_t)a << 32 | b;
    for (size_t i = hash_u64(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->s[i].key == key) return &m->s[i];
        if (m->s[i].key == UINT64_MAX) return NULL;
    }
}

/* ---------------------------------------------------------------- the tokenizer */

typedef enum { STEP_SPLIT, STEP_BYTELEVEL } step_kind;
typedef enum { SPLIT_ISOLATED, SPLIT_REMOVED } split_behavior;

typedef struct {
    step_kind kind;
    pcre2_code *re; /* NULL: ByteLevel without its regex */
    pcre2_match_data *md;
    split_behavior behavior;
    int add_prefix_space; /* ByteLevel */
} pretok_step;

typedef struct {
    uint32_t off, len; /* content, in added_text */
    int32_t id;
    int lstrip, rstrip;
} added_token;

typedef struct {
    uint64_t h;
    uint32_t key_off, key_len; /* piece bytes in cache_keys */
    uint32_t ids_off, n_ids;   /* in cache_ids */
    int used;
} cache_slot;

struct fp8t_bpe {
    char name[256];
    int vocab_size;
    smap vocab; /* tokenizer.json token string (byte-mapped form) -> id */
    merge_map merges;
    int ignore_merges;
    int nfc;       /* the normalizer is NFC */
    char *nfc_buf; /* a segment's NFC when it differs */
    size_t nfc_cap;
    int unk_id;              /* -1: unknown characters are dropped, as `tokenizers` does */
    int byte_id[256];        /* the token of each single byte, -1 if the vocab lacks it */
    uint32_t byte_char[256]; /* ByteLevel: byte -> code point */
    /* decoded bytes of every id */
    uint32_t *piece_off, *piece_len;
    arena pieces;
    int *has_piece;
    /* added tokens, longest first within each first byte */
    added_token *added;
    int n_added;
    arena added_text;
    int added_first[256]; /* index of the first added token starting with that byte, -1 */
    int added_count[256];
    /* pre-tokenizer */
    pretok_step steps[MAX_STEPS];
    int n_steps;
    int doc_token;
    char desc[256];
    /* encode state: the word cache and scratch buffers */
    cache_slot *cache;
    size_t cache_cap, cache_n, cache_limit;
    arena cache_keys;
    int32_t *cache_ids;
    size_t cache_ids_n, cache_ids_cap;
    char *buf; /* prefix-space / byte-mapped scratch */
    size_t buf_cap;
    int32_t *sym, *prev, *next; /* BPE scratch, [piece length] */
    struct heap_item {
        int32_t rank, pos, id;
    } * heap;
    size_t sym_cap, heap_cap;
};

/* GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves, the other 68
 * bytes (controls, space, DEL, NBSP, soft hyphen, ...) are moved to U+0100 and up, in order,
 * so every byte is a visible character and no token contains a space. */
static void byte_level_table(uint32_t byte_char[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_char[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

static int utf8_put(char *out, uint32_t c) {
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* Next code point of valid UTF-8 at s (n bytes left); -1 if not valid. */
static int32_t utf8_get(const unsigned char *s, size_t n, int *adv) {
    if (n == 0) return -1;
    unsigned c = s[0];
    if (c < 0x80) {
        *adv = 1;
        return (int32_t)c;
    }
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (!len || (size_t)len > n) return -1;
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        v = v << 6 | (s[i] & 0x3F);
    }
    *adv = len;
    return (int32_t)v;
}

/* The bytes a token string decodes to, as the ByteLevel decoder does: every character mapped
 * back through the byte table; a token with a character outside the table (an added token
 * such as "<think> " with a real space) decodes to its own UTF-8 bytes. */
static int token_bytes(const fp8t_bpe *t, const char *s, size_t n, char *out, size_t *outn) {
    int inv[512];
    for (int i = 0; i < 512; i++) inv[i] = -1;
    for (int b = 0; b < 256; b++) inv[t->byte_char[b]] = b;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int adv;
        int32_t c = utf8_get((const unsigned char *)s + i, n - i, &adv);
        if (c < 0 || c >= 512 || inv[c] < 0) {
            memcpy(out, s, n);
            *outn = n;
            return 0;
        }
        out[k++] = (char)inv[c];
        i += (size_t)adv;
    }
    *outn = k;
    return 0;
}

static int set_piece(fp8t_bpe *t, int id, const char *s, size_t n) {
    char *tmp = malloc(n + 1);
    if (!tmp) return -1;
    size_t k;
    token_bytes(t, s, n, tmp, &k);
    int64_t off = arena_add(&t->pieces, tmp, k);
    free(tmp);
    if (off < 0 || off > (int64_t)UINT32_MAX) return -1;
    t->piece_off[id] = (uint32_t)off;
    t->piece_len[id] = (uint32_t)k;
    t->has_piece[id] = 1;
    return 0;
}

static void cache_clear(fp8t_bpe *t);

/* ---------------------------------------------------------------- loading */

#define LOADFAIL(...)                                                                            \
    do {                                                                                         \
        fp8t_errorf(err, errlen, __VA_ARGS__);                                                   \
        goto fail;                                                                               \
    } while (0)

static const char *json_type(const cJSON *o) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

static int is_null_or_missing(const cJSON *o) { return !o || cJSON_IsNull(o); }

static int flag(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* Compile a regex as `tokenizers` means it: Unicode classes (UCP), UTF-8, and invalid UTF-8
 * in the subject allowed (such bytes simply never match, so they fall between matches and are
 * kept). JIT when available: it is several times faster than the interpreter. */
static pcre2_code *compile_re(const char *pat, size_t len, int literal, const char *name,
                              char *err, size_t errlen) {
    int ec;
    PCRE2_SIZE eo;
    /* PCRE2_LITERAL refuses UCP (a literal has no classes to widen) */
    uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        fp8t_errorf(err, errlen,
                    "%s: pre-tokenizer regex does not compile (PCRE2: %s, at "
                    "offset %zu of \"%.*s\"); fix the pattern in the file",
                    name, (char *)msg, (size_t)eo, (int)(len > 200 ? 200 : len), pat);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if it fails */
    return re;
}

/* GPT-2's pre-tokenizer regex, which ByteLevel uses when use_regex is true */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_step(fp8t_bpe *t, const cJSON *p, int *have_bytelevel, char *err, size_t errlen) {
    const char *ty = json_type(p);
    if (!ty) return fp8t_errorf(err, errlen, "%s: a pre_tokenizer without a \"type\"", t->name);
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list))
            return fp8t_errorf(err, errlen,
                               "%s: pre_tokenizer Sequence without a "
                               "\"pretokenizers\" list",
                               t->name);
        const cJSON *c;
        cJSON_ArrayForEach(c, list) if (add_step(t, c, have_bytelevel, err, errlen)) return -1;
        return 0;
    }
    if (t->n_steps == MAX_STEPS)
        return fp8t_errorf(err, errlen, "%s: more than %d pre-tokenizer steps", t->name,
                           MAX_STEPS);
    pretok_step *s = &t->steps[t->n_steps];
    memset(s, 0, sizeof(*s));
    if (!strcmp(ty, "ByteLevel")) {
        if (*have_bytelevel)
            return fp8t_errorf(err, errlen, "%s: two ByteLevel pre-tokenizers", t->name);
        *have_bytelevel = 1;
        s->kind = STEP_BYTELEVEL;
        s->add_prefix_space = flag(p, "add_prefix_space", 0);
        if (flag(p, "use_regex", 1)) {
            s->re = compile_re(GPT2_PATTERN, sizeof(GPT2_PATTERN) - 1, 0, t->name, err, errlen);
            if (!s->re) return -1;
        }
    } else if (!strcmp(ty, "Split")) {
        if (*have_bytelevel)
            return fp8t_errorf(err, errlen,
                               "%s: a Split pre-tokenizer after ByteLevel is not "
                               "supported (it would split the byte-mapped text); put the Split "
                               "first, as GPT-2, Llama-3 and Qwen2 do",
                               t->name);
        s->kind = STEP_SPLIT;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *use = cJSON_IsString(rx) ? rx : str;
        if (!cJSON_IsString(use))
            return fp8t_errorf(err, errlen,
                               "%s: Split pre-tokenizer without a \"pattern\" "
                               "{\"Regex\": ...} or {\"String\": ...}",
                               t->name);
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        const char *b = cJSON_IsString(beh) ? beh->valuestring : "Isolated";
        if (!strcmp(b, "Isolated"))
            s->behavior = SPLIT_ISOLATED;
        else if (!strcmp(b, "Removed"))
            s->behavior = SPLIT_REMOVED;
        else
            return fp8t_errorf(err, errlen,
                               "%s: Split behavior \"%s\" is not supported "
                               "(Isolated or Removed)",
                               t->name, b);
        if (flag(p, "invert", 0))
            return fp8t_errorf(err, errlen, "%s: Split with \"invert\": true is not supported",
                               t->name);
        s->re = compile_re(use->valuestring, strlen(use->valuestring), use == str, t->name, err,
                           errlen);
        if (!s->re) return -1;
    } else {
        return fp8t_errorf(err, errlen,
                           "%s: pre_tokenizer \"%s\" is not supported: fp8train "
                           "reads byte-level BPE tokenizers (ByteLevel, Split, Sequence of them: "
                           "GPT-2, Llama-3, Qwen2 style)",
                           t->name, ty);
    }
    if (s->re) {
        s->md = pcre2_match_data_create_from_pattern(s->re, NULL);
        if (!s->md) return fp8t_errorf(err, errlen, "%s: out of memory", t->name);
    }
    t->n_steps++;
    return 0;
}

/* The special token a TemplateProcessing post-processor puts before $A, or -1. */
static int template_bos(const fp8t_bpe *t, const cJSON *pp) {
    if (!pp) return -1;
    const char *ty = json_type(pp);
    if (!ty) return -1;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(pp, "processors")) {
            int id = template_bos(t, c);
            if (id >= 0) return id;
        }
        return -1;
    }
    if (strcmp(ty, "TemplateProcessing")) return -1;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *first = cJSON_GetArrayItem(single, 0);
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
    return cJSON_IsString(name) ? fp8t_bpe_token_id(t, name->valuestring) : -1;
}

static int cmp_added(const void *a, const void *b, void *ctx) {
    const added_token *x = a, *y = b;
    const char *txt = ctx;
    unsigned char fx = (unsigned char)txt[x->off], fy = (unsigned char)txt[y->off];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1; /* longest first */
    return x->id < y->id ? -1 : x->id > y->id;
}

/* qsort_r is a GNU extension; a small insertion sort keeps this portable (few added tokens) */
static void sort_added(added_token *a, int n, const char *txt) {
    for (int i = 1; i < n; i++) {
        added_token k = a[i];
        int j = i - 1;
        while (j >= 0 && cmp_added(&a[j], &k, (void *)txt) > 0) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = k;
    }
}

static int load_merges(fp8t_bpe *t, const cJSON *merges, char *err, size_t errlen) {
    int n = cJSON_GetArraySize(merges);
    size_t cap = 64;
    while (cap < (size_t)n * 2 + 2) cap *= 2;
    t->merges.s = malloc(cap * sizeof(merge_slot));
    if (!t->merges.s) return fp8t_errorf(err, errlen, "%s: out of memory", t->name);
    t->merges.cap = cap;
    for (size_t i = 0; i < cap; i++) t->merges.s[i].key = UINT64_MAX;
    char *cat = NULL;
    size_t catcap = 0;
    int rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *a, *b;
        size_t la, lb;
        char two[2][512];
        if (cJSON_IsString(m)) { /* "a b" */
            const char *s = m->valuestring, *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ') || sp == s || !sp[1])
                return fp8t_errorf(err, errlen,
                                   "%s: merge %d \"%s\" is not two tokens "
                                   "separated by one space",
                                   t->name, rank, s);
            la = (size_t)(sp - s);
            lb = strlen(sp + 1);
            if (la >= sizeof(two[0]) || lb >= sizeof(two[0]))
                return fp8t_errorf(err, errlen, "%s: merge %d is too long", t->name, rank);
            memcpy(two[0], s, la);
            two[0][la] = 0;
            memcpy(two[1], sp + 1, lb + 1);
            a = two[0];
            b = two[1];
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) { /* ["a", "b"] */
            a = cJSON_GetArrayItem(m, 0)->valuestring;
            b = cJSON_GetArrayItem(m, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        } else {
            free(cat);
            return fp8t_errorf(err, errlen, "%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]",
                               t->name, rank);
        }
        int ia = smap_get(&t->vocab, a, la), ib = smap_get(&t->vocab, b, lb);
        if (la + lb + 1 > catcap) {
            catcap = 2 * (la + lb + 1);
            char *c2 = realloc(cat, catcap);
            if (!c2) {
                free(cat);
                return fp8t_errorf(err, errlen, "%s: out of memory", t->name);
            }
            cat = c2;
        }
        memcpy(cat, a, la);
        memcpy(cat + la, b, lb);
        int ic = smap_get(&t->vocab, cat, la + lb);
        if (ia < 0 || ib < 0 || ic < 0) {
            fp8t_errorf(err, errlen,
                        "%s: merge %d (\"%s\" + \"%s\") uses a token that is not in "
                        "model.vocab (\"%s\"); the vocab and merges do not belong together",
                        t->name, rank, a, b,
                        ia < 0   ? a
                        : ib < 0 ? b
                                 : "the merged token");
            free(cat);
            return -1;
        }
        uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        size_t i = hash_u64(key) & (cap - 1);
        while (t->merges.s[i].key != UINT64_MAX && t->merges.s[i].key != key)
            i = (i + 1) & (cap - 1);
        if (t->merges.s[i].key == UINT64_MAX) { /* a repeated pair keeps its first (best) rank */
            t->merges.s[i].key = key;
            t->merges.s[i].rank = rank;
            t->merges.s[i].id = ic;
            t->merges.n++;
        }
        rank++;
    }
    free(cat);
    return 0;
}

fp8t_bpe *fp8t_bpe_parse(const char *json, size_t len, const char *name, char *err,
                         size_t errlen) {
    fp8t_bpe *t = calloc(1, sizeof(*t));
    cJSON *root = NULL;
    if (!t) {
        fp8t_errorf(err, errlen, "%s: out of memory", name);
        return NULL;
    }
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->unk_id = -1;
    t->doc_token = -1;
    t->cache_limit = CACHE_MAX_ENTRIES;
    byte_level_table(t->byte_char);
    root = cJSON_ParseWithLength(json, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= json && at <= json + len ? (size_t)(at - json) : 0;
        LOADFAIL("%s: not valid JSON (error near byte %zu); expected a Hugging Face "
                 "tokenizer.json (the file `tokenizers` saves with Tokenizer.save)",
                 name, off);
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(model))
        LOADFAIL("%s: no \"model\" object: not a Hugging Face tokenizer.json (tokenizer_config."
                 "json and vocab.json/merges.txt are other files; pass tokenizer.json)",
                 name);
    const char *mty = json_type(model);
    if (mty && strcmp(mty, "BPE"))
        LOADFAIL("%s: model type \"%s\" is not supported: fp8train reads byte-level BPE "
                 "tokenizers (GPT-2, Llama-3, Qwen2 style)",
                 name, mty);
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        LOADFAIL("%s: model.vocab (an object) and model.merges (a list) are required for BPE",
                 name);
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")) && cJSON_IsTrue(v))
        LOADFAIL("%s: model.byte_fallback is true (a SentencePiece-style BPE such as Llama-2's); "
                 "fp8train reads byte-level BPE (GPT-2, Llama-3, Qwen2)",
                 name);
    v = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix");
    const cJSON *v2 = cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix");
    if ((v && cJSON_IsString(v) && v->valuestring[0]) ||
        (v2 && cJSON_IsString(v2) && v2->valuestring[0]))
        LOADFAIL("%s: continuing_subword_prefix / end_of_word_suffix are not supported "
                 "(byte-level BPE has neither)",
                 name);
    v = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(v) && v->valuedouble > 0)
        LOADFAIL("%s: BPE dropout %g would make encoding random; set \"dropout\": null", name,
                 v->valuedouble);
    t->ignore_merges = flag(model, "ignore_merges", 0);

    /* the vocab; ids may have gaps, the largest decides the size */
    int n_vocab = cJSON_GetArraySize(vocab);
    if (smap_init(&t->vocab, (size_t)n_vocab + 1024) != 0) LOADFAIL("%s: out of memory", name);
    int max_id = -1;
    cJSON_ArrayForEach(v, vocab) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= MAX_TOKEN_ID ||
            v->valuedouble != (int)v->valuedouble)
            LOADFAIL("%s: model.vocab[\"%s\"] is not a token id in [0, %d)", name, v->string,
                     MAX_TOKEN_ID);
        if (smap_put(&t->vocab, v->string, strlen(v->string), v->valueint) < 0)
            LOADFAIL("%s: out of memory", name);
        if (v->valueint > max_id) max_id = v->valueint;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsArray(added)) LOADFAIL("%s: \"added_tokens\" is not a list", name);
    cJSON_ArrayForEach(v, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(v, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= MAX_TOKEN_ID ||
            !cJSON_IsString(content) || !content->valuestring[0])
            LOADFAIL("%s: added_tokens[%d] needs an \"id\" in [0, %d) and a non-empty "
                     "\"content\"",
                     name, t->n_added, MAX_TOKEN_ID);
        if (id->valueint > max_id) max_id = id->valueint;
        added_token *a = realloc(t->added, (size_t)(t->n_added + 1) * sizeof(*a));
        if (!a) LOADFAIL("%s: out of memory", name);
        t->added = a;
        int64_t off =
            arena_add(&t->added_text, content->valuestring, strlen(content->valuestring));
        if (off < 0) LOADFAIL("%s: out of memory", name);
        a[t->n_added].off = (uint32_t)off;
        a[t->n_added].len = (uint32_t)strlen(content->valuestring);
        a[t->n_added].id = id->valueint;
        a[t->n_added].lstrip = flag(v, "lstrip", 0);
        a[t->n_added].rstrip = flag(v, "rstrip", 0);
        t->n_added++;
    }
    if (max_id < 0) LOADFAIL("%s: the vocab is empty", name);
    t->vocab_size = max_id + 1;
    if (load_merges(t, merges, err, errlen) != 0) goto fail;

    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk))
        t->unk_id = smap_get(&t->vocab, unk->valuestring, strlen(unk->valuestring));
    for (int b = 0; b < 256; b++) {
        char u[4];
        int k = utf8_put(u, t->byte_char[b]);
        t->byte_id[b] = smap_get(&t->vocab, u, (size_t)k);
    }

    /* every id's decoded bytes; an added token's content wins over a vocab entry of its id */
    size_t V = (size_t)t->vocab_size;
    t->piece_off = calloc(V, sizeof(uint32_t));
    t->piece_len = calloc(V, sizeof(uint32_t));
    t->has_piece = calloc(V, sizeof(int));
    if (!t->piece_off || !t->piece_len || !t->has_piece) LOADFAIL("%s: out of memory", name);
    cJSON_ArrayForEach(v, vocab) if (set_piece(t, v->valueint, v->string, strlen(v->string)))
        LOADFAIL("%s: out of memory", name);
    for (int i = 0; i < t->n_added; i++) {
        const added_token *a = &t->added[i];
        if (set_piece(t, a->id, t->added_text.p + a->off, a->len) ||
            smap_put(&t->vocab, t->added_text.p + a->off, a->len, a->id) < 0)
            LOADFAIL("%s: out of memory", name);
    }
    sort_added(t->added, t->n_added, t->added_text.p);
    for (int b = 0; b < 256; b++) t->added_first[b] = -1;
    for (int i = 0; i < t->n_added; i++) {
        unsigned char f = (unsigned char)t->added_text.p[t->added[i].off];
        if (t->added_first[f] < 0) t->added_first[f] = i;
        t->added_count[f]++;
    }

    /* normalizer: none or NFC */
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (!is_null_or_missing(norm)) {
        const char *nty = json_type(norm);
        int ok = nty && !strcmp(nty, "NFC");
        if (nty && !strcmp(nty, "Sequence")) {
            const cJSON *list = cJSON_GetObjectItemCaseSensitive(norm, "normalizers");
            ok = cJSON_GetArraySize(list) == 0;
            if (cJSON_GetArraySize(list) == 1) {
                const char *t0 = json_type(cJSON_GetArrayItem(list, 0));
                ok = t0 && !strcmp(t0, "NFC");
            }
        }
        if (!ok)
            LOADFAIL("%s: normalizer \"%s\" is not supported (none or NFC, as GPT-2, Llama-3 "
                     "and Qwen2 use)",
                     name, nty ? nty : "?");
        t->nfc = 1;
    }
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    int have_bl = 0;
    if (is_null_or_missing(pre) || add_step(t, pre, &have_bl, err, errlen) != 0) {
        if (is_null_or_missing(pre))
            LOADFAIL("%s: no pre_tokenizer: fp8train needs a byte-level one (ByteLevel, "
                     "possibly after a Split)",
                     name);
        goto fail;
    }
    if (!have_bl)
        LOADFAIL("%s: the pre_tokenizer has no ByteLevel step: fp8train reads byte-level BPE "
                 "only (GPT-2, Llama-3, Qwen2 style)",
                 name);
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const char *dty = json_type(dec);
    if (!is_null_or_missing(dec) && (!dty || strcmp(dty, "ByteLevel")))
        LOADFAIL("%s: decoder \"%s\" is not supported (ByteLevel)", name, dty ? dty : "?");

    t->doc_token = template_bos(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    if (t->doc_token < 0) t->doc_token = fp8t_bpe_token_id(t, "<|endoftext|>");
    char steps[96] = "";
    for (int i = 0; i < t->n_steps; i++)
        snprintf(steps + strlen(steps), sizeof(steps) - strlen(steps), "%s%s", i ? "+" : "",
                 t->steps[i].kind == STEP_SPLIT ? "Split" : "ByteLevel");
    snprintf(t->desc, sizeof(t->desc),
             "byte-level BPE '%s': vocab %d (%d added tokens), %zu "
             "merges, pre-tokenizer %s",
             name, t->vocab_size, t->n_added, t->merges.n, steps);
    cJSON_Delete(root);
    return t;
fail:
    cJSON_Delete(root);
    fp8t_bpe_free(t);
    return NULL;
}

fp8t_bpe *fp8t_bpe_load(const char *path, char *err, size_t errlen) {
    char *data = NULL;
    size_t len = 0;
    char e[FP8T_ERR_LEN], in_dir[4096];
    if (fp8t_is_dir(path)) { /* a model directory: its tokenizer.json */
        snprintf(in_dir, sizeof(in_dir), "%s/tokenizer.json", path);
        path = in_dir;
    }
    if (fp8t_read_file(path, &data, &len, e, sizeof(e)) != 0) {
        fp8t_errorf(err, errlen,
                    "tokenizer: %s (pass the tokenizer.json of a Hugging Face "
                    "model directory)",
                    e);
        return NULL;
    }
    fp8t_bpe *t = fp8t_bpe_parse(data, len, path, err, errlen);
    free(data);
    return t;
}

void fp8t_bpe_free(fp8t_bpe *t) {
    if (!t) return;
    for (int i = 0; i < t->n_steps; i++) {
        pcre2_match_data_free(t->steps[i].md);
        pcre2_code_free(t->steps[i].re);
    }
    smap_free(&t->vocab);
    free(t->merges.s);
    free(t->piece_off);
    free(t->piece_len);
    free(t->has_piece);
    free(t->pieces.p);
    free(t->added);
    free(t->added_text.p);
    free(t->cache);
    free(t->cache_keys.p);
    free(t->cache_ids);
    free(t->buf);
    free(t->nfc_buf);
    free(t->sym);
    free(t->prev);
    free(t->next);
    free(t->heap);
    free(t);
}

int fp8t_bpe_vocab_size(const fp8t_bpe *t) { return t->vocab_size; }
void fp8t_bpe_set_cache_limit(fp8t_bpe *t, size_t entries) {
    t->cache_limit = entries;
    cache_clear(t);
}
int fp8t_bpe_doc_token(const fp8t_bpe *t) { return t->doc_token; }
const char *fp8t_bpe_describe(const fp8t_bpe *t) { return t->desc; }
int fp8t_bpe_token_id(const fp8t_bpe *t, const char *s) {
    return smap_get(&t->vocab, s, strlen(s));
}

const char *fp8t_bpe_piece(const fp8t_bpe *t, int id, size_t *len) {
    if (id < 0 || id >= t->vocab_size || !t->has_piece[id]) {
        *len = 0;
        return NULL;
    }
    *len = t->piece_len[id];
    return t->pieces.p + t->piece_off[id];
}

int fp8t_bpe_decode(const fp8t_bpe *t, const int32_t *ids, size_t n, char **out, size_t *len) {
    size_t total = 0, k;
    for (size_t i = 0; i < n; i++) {
        fp8t_bpe_piece(t, ids[i], &k);
        total += k;
    }
    char *o = malloc(total + 1);
    if (!o) return -1;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = fp8t_bpe_piece(t, ids[i], &k);
        if (k) memcpy(o + at, p, k);
        at += k;
    }
    o[at] = 0;
    *out = o;
    *len = at;
    return 0;
}

/* ---------------------------------------------------------------- encoding */

static int ids_push(fp8t_tok_ids *o, int32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 1024;
        int32_t *v = realloc(o->v, cap * sizeof(*v));
        if (!v) return -1;
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return 0;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* min-heap on (rank, pos): the lowest rank first, the leftmost among equal ranks */
static int heap_less(const struct heap_item *a, const struct heap_item *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct heap_item *h, size_t *n, struct heap_item it) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static struct heap_item heap_pop(struct heap_item *h, size_t *n) {
    struct heap_item top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void push_pair(fp8t_bpe *t, size_t *hn, int32_t pos) {
    int32_t r = t->next[pos];
    if (r < 0) return;
    const merge_slot *m = merge_get(&t->merges, (uint32_t)t->sym[pos], (uint32_t)t->sym[r]);
    if (m) heap_push(t->heap, hn, (struct heap_item){m->rank, pos, m->id});
}

/* BPE of one piece (raw bytes) -> ids appended to out. */
static int bpe_word(fp8t_bpe *t, const unsigned char *w, size_t n, fp8t_tok_ids *out) {
    if (t->ignore_merges) { /* a piece that is itself a token is taken whole (Llama-3) */
        if (grow((void **)&t->buf, &t->buf_cap, 2 * n + 1, 1)) return -1;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += (size_t)utf8_put(t->buf + k, t->byte_char[w[i]]);
        int id = smap_get(&t->vocab, t->buf, k);
        if (id >= 0) return ids_push(out, id);
    }
    if (n > t->sym_cap) { /* sym, prev and next share one capacity */
        size_t cap = 2 * n;
        int32_t *a = realloc(t->sym, cap * sizeof(int32_t));
        if (a) t->sym = a;
        int32_t *b = realloc(t->prev, cap * sizeof(int32_t));
        if (b) t->prev = b;
        int32_t *c = realloc(t->next, cap * sizeof(int32_t));
        if (c) t->next = c;
        if (!a || !b || !c) return -1;
        t->sym_cap = cap;
    }
    /* each merge pushes at most two pairs: n - 1 at the start, 2 (n - 1) more at most */
    if (grow((void **)&t->heap, &t->heap_cap, 3 * n + 2, sizeof(struct heap_item))) return -1;
    /* the bytes as symbols; a byte the vocab lacks becomes unk, or is dropped without one,
     * as `tokenizers` does */
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int id = t->byte_id[w[i]];
        if (id < 0) id = t->unk_id;
        if (id < 0) continue;
        t->sym[ns] = id;
        t->prev[ns] = ns - 1;
        t->next[ns] = -1;
        if (ns) t->next[ns - 1] = ns;
        ns++;
    }
    if (ns == 0) return 0;
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < ns; i++) push_pair(t, &hn, i);
    while (hn) {
        struct heap_item top = heap_pop(t->heap, &hn);
        int32_t p = top.pos, r = t->next[p];
        if (t->sym[p] < 0 || r < 0) continue; /* merged away, or at the end now */
        /* stale entry: the pair at pos changed since it was pushed */
        const merge_slot *m = merge_get(&t->merges, (uint32_t)t->sym[p], (uint32_t)t->sym[r]);
        if (!m || m->id != top.id) continue;
        t->sym[p] = top.id;
        t->sym[r] = -1;
        t->next[p] = t->next[r];
        if (t->next[r] >= 0) t->prev[t->next[r]] = p;
        if (t->prev[p] >= 0) push_pair(t, &hn, t->prev[p]);
        push_pair(t, &hn, p);
    }
    for (int32_t i = 0; i >= 0; i = t->next[i])
        if (ids_push(out, t->sym[i])) return -1;
    return 0;
}

static void cache_clear(fp8t_bpe *t) {
    if (t->cache) memset(t->cache, 0, t->cache_cap * sizeof(*t->cache));
    t->cache_n = 0;
    t->cache_keys.n = 0;
    t->cache_ids_n = 0;
}

/* BPE through the cache of pieces seen before. */
static int bpe_cached(fp8t_bpe *t, const unsigned char *w, size_t n, fp8t_tok_ids *out) {
    if (n > CACHE_MAX_PIECE) return bpe_word(t, w, n, out);
    if (!t->cache) {
        t->cache_cap = 1u << 16;
        t->cache = calloc(t->cache_cap, sizeof(*t->cache));
        if (!t->cache) return -1;
    }
    uint64_t h = hash_bytes(w, n);
    size_t i = h & (t->cache_cap - 1);
    for (;; i = (i + 1) & (t->cache_cap - 1)) {
        cache_slot *s = &t->cache[i];
        if (!s->used) break;
        if (s->h == h && s->key_len == n && !memcmp(t->cache_keys.p + s->key_off, w, n)) {
            if (grow((void **)&out->v, &out->cap, out->n + s->n_ids, sizeof(int32_t))) return -1;
            memcpy(out->v + out->n, t->cache_ids + s->ids_off, s->n_ids * sizeof(int32_t));
            out->n += s->n_ids;
            return 0;
        }
    }
    size_t before = out->n;
    if (bpe_word(t, w, n, out)) return -1;
    size_t k = out->n - before;
    /* a full cache is emptied rather than evicted piecemeal: simple, and the words of a
     * corpus come back quickly */
    if (t->cache_n >= t->cache_limit) {
        cache_clear(t);
        return 0;
    }
    if ((t->cache_n + 1) * 2 > t->cache_cap) { /* grow: rehash every slot */
        size_t cap = t->cache_cap * 2;
        cache_slot *c = calloc(cap, sizeof(*c));
        if (!c) return 0; /* the cache is an optimisation: go on without the entry */
        for (size_t j = 0; j < t->cache_cap; j++) {
            if (!t->cache[j].used) continue;
            size_t q = t->cache[j].h & (cap - 1);
            while (c[q].used) q = (q + 1) & (cap - 1);
            c[q] = t->cache[j];
        }
        free(t->cache);
        t->cache = c;
        t->cache_cap = cap;
        i = h & (cap - 1);
        while (c[i].used) i = (i + 1) & (cap - 1);
    }
    int64_t off = arena_add(&t->cache_keys, w, n);
    if (off < 0 || off > (int64_t)UINT32_MAX ||
        grow((void **)&t->cache_ids, &t->cache_ids_cap, t->cache_ids_n + k, sizeof(int32_t)) ||
        t->cache_ids_n + k > UINT32_MAX) {
        cache_clear(t);
        return 0;
    }
    memcpy(t->cache_ids + t->cache_ids_n, out->v + before, k * sizeof(int32_t));
    cache_slot *s = &t->cache[i];
    s->h = h;
    s->key_off = (uint32_t)off;
    s->key_len = (uint32_t)n;
    s->ids_off = (uint32_t)t->cache_ids_n;
    s->n_ids = (uint32_t)k;
    s->used = 1;
    t->cache_ids_n += k;
    t->cache_n++;
    return 0;
}

static int pretok(fp8t_bpe *t, int step, const unsigned char *s, size_t n, fp8t_tok_ids *out);

/* Split s by the step's regex into matches and the stretches between them (both are pieces
 * for Isolated; only the stretches for Removed) and hand each to the next step. An empty match
 * splits without making a piece, as in `tokenizers`. */
static int split_regex(fp8t_bpe *t, int step, const unsigned char *s, size_t n,
                       fp8t_tok_ids *out) {
    const pretok_step *st = &t->steps[step];
    size_t pos = 0, last = 0;
    while (pos <= n) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, pos, 0, st->md, NULL);
        if (rc < 0) break; /* no (further) match; errors such as a match limit end it too */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        size_t ms = ov[0], me = ov[1];
        if (ms > last && pretok(t, step + 1, s + last, ms - last, out)) return -1;
        if (me > ms) {
            if (st->behavior == SPLIT_ISOLATED && pretok(t, step + 1, s + ms, me - ms, out))
                return -1;
            last = pos = me;
        } else { /* empty: step one character on */
            last = ms;
            if (ms >= n) break;
            int adv = 1;
            if (utf8_get(s + ms, n - ms, &adv) < 0) adv = 1;
            pos = ms + (size_t)adv;
        }
    }
    if (last < n && pretok(t, step + 1, s + last, n - last, out)) return -1;
    return 0;
}

/* Pre-tokenizer step `step` on s; past the last step, BPE. */
static int pretok(fp8t_bpe *t, int step, const unsigned char *s, size_t n, fp8t_tok_ids *out) {
    if (n == 0) return 0;
    if (step == t->n_steps) return bpe_cached(t, s, n, out);
    const pretok_step *st = &t->steps[step];
    if (st->kind == STEP_BYTELEVEL && st->add_prefix_space && s[0] != ' ') {
        /* prepend a space; the copy is private because the steps below reuse t->buf */
        unsigned char *c = malloc(n + 1);
        if (!c) return -1;
        c[0] = ' ';
        memcpy(c + 1, s, n);
        int rc =
            st->re ? split_regex(t, step, c, n + 1, out) : pretok(t, step + 1, c, n + 1, out);
        free(c);
        return rc;
    }
    if (!st->re) return pretok(t, step + 1, s, n, out);
    return split_regex(t, step, s, n, out);
}

/* Longest added token matching at s (n bytes left), or NULL. */
static const added_token *added_at(const fp8t_bpe *t, const unsigned char *s, size_t n) {
    int f = t->added_first[s[0]];
    if (f < 0) return NULL;
    for (int i = f; i < f + t->added_count[s[0]]; i++) { /* longest first */
        const added_token *a = &t->added[i];
        if (a->len <= n && !memcmp(t->added_text.p + a->off, s, a->len)) return a;
    }
    return NULL;
}

/* One stretch of text between added tokens: normalized (as `tokenizers` normalizes each such
 * stretch on its own), then pre-tokenized and merged. */
static int encode_segment(fp8t_bpe *t, const unsigned char *s, size_t n, fp8t_tok_ids *out) {
    if (t->nfc && n) {
        size_t m;
        int r = fp8t_nfc((const char *)s, n, &t->nfc_buf, &m, &t->nfc_cap);
        if (r < 0) return -1;
        if (r == 1) return pretok(t, 0, (const unsigned char *)t->nfc_buf, m, out);
    }
    return pretok(t, 0, s, n, out);
}

static int is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

int fp8t_bpe_encode(fp8t_bpe *t, const char *text, size_t len, fp8t_tok_ids *out) {
    const unsigned char *s = (const unsigned char *)text;
    size_t seg = 0; /* start of the text not yet encoded */
    for (size_t i = 0; i < len;) {
        const added_token *a = t->n_added ? added_at(t, s + i, len - i) : NULL;
        if (!a) {
            i++;
            continue;
        }
        size_t end = i, after = i + a->len;
        /* lstrip/rstrip: the token takes the whitespace beside it */
        if (a->lstrip)
            while (end > seg && is_space(s[end - 1])) end--;
        if (a->rstrip)
            while (after < len && is_space(s[after])) after++;
        if (encode_segment(t, s + seg, end - seg, out) || ids_push(out, a->id)) return -1;
        seg = i = after;
    }
    return encode_segment(t, s + seg, len - seg, out);
}
