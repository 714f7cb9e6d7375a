/* Unicode NFC: canonical decomposition, canonical ordering of combining marks, canonical
 * composition (UAX #15), on the tables of nfc_tables.h (generated from Python's unicodedata by
 * scripts/make_nfc_tables.py). Hangul syllables are decomposed and composed arithmetically.
 * A quick check first: text with no code point that could change (NFC quick check not Yes, or
 * a combining mark) is NFC already, which is nearly all text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/nfc.h"
#include "io/nfc_tables.h"

#define N_ROWS(t) (sizeof(t) / sizeof((t)[0]))
#define INVALID_BYTE 0x80000000u /* a byte of invalid UTF-8, kept as it is: flag | byte */

enum {
    SBASE = 0xAC00,
    LBASE = 0x1100,
    VBASE = 0x1161,
    TBASE = 0x11A7,
    LCOUNT = 19,
    VCOUNT = 21,
    TCOUNT = 28,
    NCOUNT = VCOUNT * TCOUNT,
    SCOUNT = LCOUNT * NCOUNT
};

/* Row of table t (rows of `width` uint32, sorted by the first column) with first column cp. */
static const uint32_t *find_row(const uint32_t *t, size_t rows, size_t width, uint32_t cp) {
    size_t lo = 0, hi = rows;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t v = t[mid * width];
        if (v == cp) return t + mid * width;
        if (v < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int ccc(uint32_t cp) {
    if (cp < 0x300 || (cp & INVALID_BYTE)) return 0;
    const uint32_t *r = find_row(&NFC_CCC[0][0], N_ROWS(NFC_CCC), 2, cp);
    return r ? (int)r[1] : 0;
}

static int unsafe(uint32_t cp) {
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = N_ROWS(NFC_UNSAFE);
    while (lo < hi) { /* the last range starting at or before cp */
        size_t mid = (lo + hi) / 2;
        if (NFC_UNSAFE[mid][0] <= cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && cp <= NFC_UNSAFE[lo - 1][1];
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if ((a | b) & INVALID_BYTE) return 0;
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = N_ROWS(NFC_COMPOSE);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *r = NFC_COMPOSE[mid];
        if (r[0] == a && r[1] == b) return r[2];
        if (r[0] < a || (r[0] == a && r[1] < b))
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

typedef struct {
    uint32_t *v;
    size_t n, cap;
    int oom;
} cps;

static void push(cps *c, uint32_t cp) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 256;
        uint32_t *v = realloc(c->v, cap * sizeof(uint32_t));
        if (!v) {
            c->oom = 1;
            return;
        }
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = cp;
}

/* Full canonical decomposition of cp, appended. */
static void decompose(cps *c, uint32_t cp) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        push(c, LBASE + s / NCOUNT);
        push(c, VBASE + (s % NCOUNT) / TCOUNT);
        if (s % TCOUNT) push(c, TBASE + s % TCOUNT);
        return;
    }
    const uint32_t *r = cp >= 0xC0 && !(cp & INVALID_BYTE)
                            ? find_row(&NFC_DECOMP[0][0], N_ROWS(NFC_DECOMP), 3, cp)
                            : NULL;
    if (!r) {
        push(c, cp);
        return;
    }
    decompose(c, r[1]);
    if (r[2]) decompose(c, r[2]);
}

static int utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    int len = c < 0x80                ? 1
              : c >= 0xF0 && c < 0xF8 ? 4
              : c >= 0xE0             ? (c < 0xF0 ? 3 : 0)
              : c >= 0xC2             ? 2
                                      : 0;
    if (!len || (size_t)len > n) {
        *cp = INVALID_BYTE | c;
        return 1;
    }
    uint32_t v = len == 1 ? c : c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = INVALID_BYTE | c;
            return 1;
        }
        v = v << 6 | (s[i] & 0x3F);
    }
    /* overlong forms, surrogates and values past U+10FFFF are not valid UTF-8 either */
    if ((len == 3 && (v < 0x800 || (v >= 0xD800 && v < 0xE000))) ||
        (len == 4 && (v < 0x10000 || v > 0x10FFFF))) {
        *cp = INVALID_BYTE | c;
        return 1;
    }
    *cp = v;
    return len;
}

int fp8t_nfc(const char *text, size_t n, char **out, size_t *outn, size_t *cap) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    for (; i < n; i++) { /* ASCII is NFC; look closer only past it */
        if (s[i] < 0x80) continue;
        uint32_t cp;
        int adv = utf8_next(s + i, n - i, &cp);
        if (!(cp & INVALID_BYTE) && unsafe(cp)) break;
        i += (size_t)adv - 1;
    }
    if (i == n) return 0;
    cps c = {0};
    for (size_t k = 0; k < n;) {
        uint32_t cp;
        k += (size_t)utf8_next(s + k, n - k, &cp);
        decompose(&c, cp);
    }
    if (c.oom) {
        free(c.v);
        return -1;
    }
    /* canonical ordering: each run of marks sorted by combining class, stably */
    for (size_t k = 1; k < c.n; k++) {
        int ck = ccc(c.v[k]);
        if (ck == 0) continue;
        uint32_t cur = c.v[k];
        size_t j = k;
        while (j > 0 && ccc(c.v[j - 1]) > ck) {
            c.v[j] = c.v[j - 1];
            j--;
        }
        c.v[j] = cur;
    }
    /* canonical composition: a character joins the last starter unless something between
     * blocks it (a mark of the same or a higher class, or a starter) */
    size_t starter = 0, w = 1;
    int have_starter = c.n > 0 && ccc(c.v[0]) == 0;
    int last_class = c.n > 0 ? (have_starter ? 0 : 256) : 0;
    for (size_t k = 1; k < c.n; k++) {
        uint32_t ch = c.v[k];
        int cc = ccc(ch);
        uint32_t comp = have_starter ? compose(c.v[starter], ch) : 0;
        if (comp && (last_class < cc || last_class == 0)) {
            c.v[starter] = comp;
            continue;
        }
        if (cc == 0) {
            starter = w;
            have_starter = 1;
        }
        last_class = cc;
        c.v[w++] = ch;
    }
    if (c.n) c.n = w;
    /* back to UTF-8: at most 4 bytes a code point */
    if (*cap < 4 * c.n + 1) {
        char *o = realloc(*out, 4 * c.n + 1);
        if (!o) {
            free(c.v);
            return -1;
        }
        *out = o;
        *cap = 4 * c.n + 1;
    }
    unsigned char *o = (unsigned char *)*out;
    size_t k = 0;
    for (size_t j = 0; j < c.n; j++) {
        uint32_t v = c.v[j];
        if (v & INVALID_BYTE)
            o[k++] = (unsigned char)(v & 0xFF);
        else if (v < 0x80)
            o[k++] = (unsigned char)v;
        else if (v < 0x800) {
            o[k++] = (unsigned char)(0xC0 | v >> 6);
            o[k++] = (unsigned char)(0x80 | (v & 0x3F));
        } else if (v < 0x10000) {
            o[k++] = (unsigned char)(0xE0 | v >> 12);
            o[k++] = (unsigned char)(0x80 | ((v >> 6) & 0x3F));
            o[k++] = (unsigned char)(0x80 | (v & 0x3F));
        } else {
            o[k++] = (unsigned char)(0xF0 | v >> 18);
            o[k++] = (unsigned char)(0x80 | ((v >> 12) & 0x3F));
            o[k++] = (unsigned char)(0x80 | ((v >> 6) & 0x3F));
            o[k++] = (unsigned char)(0x80 | (v & 0x3F));
        }
    }
    o[k] = 0;
    *outn = k;
    free(c.v);
    return 1;
}
