/* The precision policy, the model's core concept: names, defaults, parsing of override rules,
 * the whole-run switches, and the resolution of one GEMM's precision. Its JSON form (the
 * canonical saved policy of config.json and state.json) is the train layer's
 * (src/train/policy_json.c). */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "fp8train/policy.h"

#define OVERRIDE_SYNTAX                                                                          \
    "expected comma-separated key=value pairs, e.g. "                                            \
    "'layers=2-3,module=fc1+fc2,gemm=dgrad+wgrad,precision=bf16'; keys: "                        \
    "layers=A|A-B|first:N|last:N|all, module=qkv|proj|fc1|fc2|gate|up|down|head|attn|mlp|all "   \
    "(joined by '+'), gemm=fprop|dgrad|wgrad|all (joined by '+'), "                              \
    "precision=fp8|delayed|current|block|rowwise|mxfp8|fake|bf16|fp32 (required); several "      \
    "rules are joined by ';'"

static const char *PREC_NAMES[FP8T_PREC_COUNT] = {"fp8",  "delayed", "current", "block",  "mxfp8",
                                                  "fake", "bf16",    "fp32",    "rowwise"};
static const char *GEMM_NAMES[FP8T_GEMM_COUNT] = {"fprop", "dgrad", "wgrad"};
static const char *MODULE_NAMES[FP8T_MOD_COUNT] = {"qkv",  "proj", "fc1",  "fc2",
                                                   "gate", "up",   "down", "head"};

#define MASK_ALL_BUT_HEAD ((1u << FP8T_MOD_HEAD) - 1u)
#define MASK_ATTN ((1u << FP8T_MOD_QKV) | (1u << FP8T_MOD_PROJ))
#define MASK_MLP                                                                                 \
    ((1u << FP8T_MOD_FC1) | (1u << FP8T_MOD_FC2) | (1u << FP8T_MOD_GATE) | (1u << FP8T_MOD_UP) | \
     (1u << FP8T_MOD_DOWN))
#define MASK_ALL_GEMMS ((1u << FP8T_GEMM_COUNT) - 1u)

void fp8t_policy_default(fp8t_policy *p) {
    memset(p, 0, sizeof(*p));
    p->default_precision = FP8T_PREC_FP8;
    p->recipe = FP8T_PREC_DELAYED;
    p->hybrid = 1;
    p->history_len = 1024;
    p->algo = FP8T_AMAX_MAX;
    p->margin = 0;
    p->pow2_scales = 0;
    p->epsilon = 0.0f;
    p->head_precision = FP8T_PREC_BF16;
    p->fast_accum_fprop = 1;
    p->fast_accum_grad = 0;
    p->n_overrides = 0;
}

const char *fp8t_precision_name(fp8t_precision p) {
    return (p >= 0 && p < FP8T_PREC_COUNT) ? PREC_NAMES[p] : "unknown";
}

const char *fp8t_gemm_name(fp8t_gemm_kind g) {
    return (g >= 0 && g < FP8T_GEMM_COUNT) ? GEMM_NAMES[g] : "unknown";
}

const char *fp8t_module_name(fp8t_module m) {
    return (m >= 0 && m < FP8T_MOD_COUNT) ? MODULE_NAMES[m] : "unknown";
}

/* case-insensitive equality of s[0..n) with a NUL-terminated word */
static int word_eq(const char *s, size_t n, const char *word) {
    if (strlen(word) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (tolower((unsigned char)s[i]) != word[i]) return 0;
    return 1;
}

static int precision_parse_n(fp8t_precision *out, const char *s, size_t n) {
    for (int i = 0; i < FP8T_PREC_COUNT; i++)
        if (word_eq(s, n, PREC_NAMES[i])) {
            *out = (fp8t_precision)i;
            return 0;
        }
    /* the seed's NVTE_FP8_DGRAD=0 style: 0 = off (bf16), 1 = on (the run's fp8 recipe) */
    if (word_eq(s, n, "0")) {
        *out = FP8T_PREC_BF16;
        return 0;
    }
    if (word_eq(s, n, "1")) {
        *out = FP8T_PREC_FP8;
        return 0;
    }
    return -1;
}

int fp8t_precision_parse(fp8t_precision *out, const char *s) {
    if (!s) return -1;
    return precision_parse_n(out, s, strlen(s));
}

static int module_parse_n(fp8t_module *out, const char *s, size_t n) {
    for (int i = 0; i < FP8T_MOD_COUNT; i++)
        if (word_eq(s, n, MODULE_NAMES[i])) {
            *out = (fp8t_module)i;
            return 0;
        }
    return -1;
}

int fp8t_module_parse(fp8t_module *out, const char *s) {
    if (!s) return -1;
    return module_parse_n(out, s, strlen(s));
}

/* strict non-negative decimal integer in s[0..n) */
static int parse_uint_n(const char *s, size_t n, int *out) {
    if (n == 0 || n > 9) return -1;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

static int parse_layers(fp8t_override *o, const char *v, size_t n, const char *rule, char *err,
                        size_t errlen) {
    int a, b;
    if (word_eq(v, n, "all")) {
        o->layer_lo = o->layer_hi = FP8T_LAYER_ALL;
        return 0;
    }
    if (n > 6 && word_eq(v, 6, "first:")) {
        if (parse_uint_n(v + 6, n - 6, &a) != 0 || a < 1)
            return fp8t_errorf(err, errlen,
                               "bad layers value '%.*s' in override '%s': first:N needs "
                               "a positive layer count N; " OVERRIDE_SYNTAX,
                               (int)n, v, rule);
        o->layer_lo = o->layer_hi = FP8T_LAYER_FIRST_BASE - a;
        return 0;
    }
    if (n > 5 && word_eq(v, 5, "last:")) {
        if (parse_uint_n(v + 5, n - 5, &a) != 0 || a < 1)
            return fp8t_errorf(err, errlen,
                               "bad layers value '%.*s' in override '%s': last:N needs "
                               "a positive layer count N; " OVERRIDE_SYNTAX,
                               (int)n, v, rule);
        o->layer_lo = o->layer_hi = FP8T_LAYER_LAST_BASE - a;
        return 0;
    }
    const char *dash = memchr(v, '-', n);
    if (!dash) {
        if (parse_uint_n(v, n, &a) != 0)
            return fp8t_errorf(
                err, errlen,
                "bad layers value '%.*s' in override '%s' (expected a "
                "layer index A, a range A-B, first:N, last:N or all); " OVERRIDE_SYNTAX,
                (int)n, v, rule);
        o->layer_lo = o->layer_hi = a;
        return 0;
    }
    size_t na = (size_t)(dash - v);
    if (parse_uint_n(v, na, &a) != 0 || parse_uint_n(dash + 1, n - na - 1, &b) != 0)
        return fp8t_errorf(err, errlen,
                           "bad layers value '%.*s' in override '%s' (expected a layer "
                           "index A, a range A-B, first:N, last:N or all); " OVERRIDE_SYNTAX,
                           (int)n, v, rule);
    if (b < a)
        return fp8t_errorf(err, errlen,
                           "bad layers range '%.*s' in override '%s': the range A-B "
                           "needs A <= B",
                           (int)n, v, rule);
    o->layer_lo = a;
    o->layer_hi = b;
    return 0;
}

/* The bits of one word of a '+'-joined list (module=, gemm=), 0 if unknown. */
typedef unsigned (*word_bits_fn)(const char *w, size_t n);

static unsigned module_bits(const char *w, size_t n) {
    fp8t_module mod;
    if (module_parse_n(&mod, w, n) == 0) return 1u << mod;
    if (word_eq(w, n, "attn")) return MASK_ATTN;
    if (word_eq(w, n, "mlp")) return MASK_MLP;
    if (word_eq(w, n, "all")) return MASK_ALL_BUT_HEAD;
    return 0;
}

static unsigned gemm_bits(const char *w, size_t n) {
    for (int g = 0; g < FP8T_GEMM_COUNT; g++)
        if (word_eq(w, n, GEMM_NAMES[g])) return 1u << g;
    return word_eq(w, n, "all") ? MASK_ALL_GEMMS : 0;
}

/* *mask = the union of the bits of the '+'-joined words of v[0..n); -1 with err at an empty or
 * unknown word. what names the words in the message, expected lists them. */
static int parse_list(unsigned *mask, const char *v, size_t n, word_bits_fn bits,
                      const char *what, const char *expected, const char *rule, char *err,
                      size_t errlen) {
    *mask = 0;
    for (size_t i = 0; i <= n;) {
        size_t j = i;
        while (j < n && v[j] != '+') j++;
        const char *w = v + i;
        size_t wn = j - i;
        if (wn == 0)
            return fp8t_errorf(err, errlen,
                               "empty %s name in '%.*s' of override '%s'; " OVERRIDE_SYNTAX, what,
                               (int)n, v, rule);
        unsigned b = bits(w, wn);
        if (!b)
            return fp8t_errorf(err, errlen,
                               "unknown %s '%.*s' in override '%s' (expected %s, "
                               "joined by '+')",
                               what, (int)wn, w, rule, expected);
        *mask |= b;
        i = j + 1;
    }
    return 0;
}

/* Parse one rule s[0..n) (no ';'). */
static int parse_one(fp8t_override *o, const char *s, size_t n, char *err, size_t errlen) {
    char rule[256];
    snprintf(rule, sizeof(rule), "%.*s", (int)(n < 255 ? n : 255), s);
    o->layer_lo = o->layer_hi = FP8T_LAYER_ALL;
    o->module_mask = 0;
    o->gemm_mask = 0;
    int have_prec = 0, seen_layers = 0, seen_module = 0, seen_gemm = 0;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && s[j] != ',') j++;
        const char *kv = s + i;
        size_t kvn = j - i;
        /* trim spaces */
        while (kvn && isspace((unsigned char)kv[0])) {
            kv++;
            kvn--;
        }
        while (kvn && isspace((unsigned char)kv[kvn - 1])) kvn--;
        if (kvn == 0) {
            i = j + 1;
            continue;
        }
        const char *eq = memchr(kv, '=', kvn);
        if (!eq)
            return fp8t_errorf(err, errlen,
                               "'%.*s' in override '%s' is not key=value; " OVERRIDE_SYNTAX,
                               (int)kvn, kv, rule);
        size_t kn = (size_t)(eq - kv), vn = kvn - kn - 1;
        const char *v = eq + 1;
        if (vn == 0)
            return fp8t_errorf(err, errlen,
                               "key '%.*s' in override '%s' has an empty value; " OVERRIDE_SYNTAX,
                               (int)kn, kv, rule);
        int rc;
        if (word_eq(kv, kn, "layers") || word_eq(kv, kn, "layer")) {
            if (seen_layers++)
                return fp8t_errorf(err, errlen, "key 'layers' given twice in override '%s'",
                                   rule);
            rc = parse_layers(o, v, vn, rule, err, errlen);
        } else if (word_eq(kv, kn, "module") || word_eq(kv, kn, "modules")) {
            if (seen_module++)
                return fp8t_errorf(err, errlen, "key 'module' given twice in override '%s'",
                                   rule);
            rc = parse_list(&o->module_mask, v, vn, module_bits, "module",
                            "qkv, proj, fc1, fc2, gate, up, down, head, attn, mlp or all", rule,
                            err, errlen);
        } else if (word_eq(kv, kn, "gemm") || word_eq(kv, kn, "gemms")) {
            if (seen_gemm++)
                return fp8t_errorf(err, errlen, "key 'gemm' given twice in override '%s'", rule);
            rc = parse_list(&o->gemm_mask, v, vn, gemm_bits, "gemm", "fprop, dgrad, wgrad or all",
                            rule, err, errlen);
            if (o->gemm_mask == MASK_ALL_GEMMS) o->gemm_mask = 0; /* 0: every GEMM */
        } else if (word_eq(kv, kn, "precision")) {
            if (have_prec++)
                return fp8t_errorf(err, errlen, "key 'precision' given twice in override '%s'",
                                   rule);
            rc = precision_parse_n(&o->precision, v, vn) == 0
                     ? 0
                     : fp8t_errorf(err, errlen,
                                   "unknown precision '%.*s' in override '%s' (expected "
                                   "fp8, delayed, current, block, rowwise, mxfp8, fake, bf16 or "
                                   "fp32)",
                                   (int)vn, v, rule);
        } else {
            rc = fp8t_errorf(err, errlen, "unknown key '%.*s' in override '%s'; " OVERRIDE_SYNTAX,
                             (int)kn, kv, rule);
        }
        if (rc) return rc;
        i = j + 1;
    }
    if (!have_prec)
        return fp8t_errorf(err, errlen, "override '%s' has no precision=...; " OVERRIDE_SYNTAX,
                           rule);
    return 0;
}

int fp8t_policy_add_overrides(fp8t_policy *p, const char *spec, char *err, size_t errlen) {
    if (!spec) return fp8t_errorf(err, errlen, "override spec is NULL");
    /* parse everything first so a bad rule leaves the policy untouched */
    fp8t_override parsed[FP8T_MAX_OVERRIDES];
    int n = 0;
    const char *s = spec;
    for (;;) {
        const char *semi = strchr(s, ';');
        size_t len = semi ? (size_t)(semi - s) : strlen(s);
        size_t k = 0;
        while (k < len && isspace((unsigned char)s[k])) k++;
        if (k < len) {
            if (p->n_overrides + n >= FP8T_MAX_OVERRIDES)
                return fp8t_errorf(err, errlen, "too many precision overrides (at most %d)",
                                   FP8T_MAX_OVERRIDES);
            if (parse_one(&parsed[n], s, len, err, errlen) != 0) return -1;
            n++;
        }
        if (!semi) break;
        s = semi + 1;
    }
    if (n == 0)
        return fp8t_errorf(err, errlen, "empty override spec '%s'; " OVERRIDE_SYNTAX, spec);
    memcpy(&p->overrides[p->n_overrides], parsed, (size_t)n * sizeof(parsed[0]));
    p->n_overrides += n;
    return 0;
}

int fp8t_policy_apply_switches(fp8t_policy *p, const char *const value[1 + FP8T_GEMM_COUNT],
                               const char *const source[1 + FP8T_GEMM_COUNT], char *err,
                               size_t errlen) {
    const char *v = value[0];
    if (v && *v) {
        fp8t_precision prec;
        if (fp8t_precision_parse(&prec, v) != 0)
            return fp8t_errorf(
                err, errlen,
                "%s='%s' is not a precision (expected fp8, delayed, current, block, rowwise, "
                "mxfp8, fake, bf16, fp32, 0 or 1)",
                source[0], v);
        p->default_precision = prec;
    }
    for (int g = 0; g < FP8T_GEMM_COUNT; g++) {
        v = value[1 + g];
        if (!v || !*v) continue;
        fp8t_override o = {FP8T_LAYER_ALL, FP8T_LAYER_ALL, 0, 1u << g, FP8T_PREC_FP8};
        if (fp8t_precision_parse(&o.precision, v) != 0)
            return fp8t_errorf(err, errlen,
                               "%s='%s' is not a precision (expected fp8, delayed, "
                               "current, fake, bf16, fp32, block, rowwise, mxfp8, 0 = bf16 or "
                               "1 = fp8)",
                               source[1 + g], v);
        if (p->n_overrides >= FP8T_MAX_OVERRIDES)
            return fp8t_errorf(err, errlen, "too many precision overrides (at most %d) to add %s",
                               FP8T_MAX_OVERRIDES, source[1 + g]);
        p->overrides[p->n_overrides++] = o;
    }
    return 0;
}

static int layer_matches(const fp8t_override *o, int n_layer, int layer) {
    int lo = o->layer_lo;
    if (lo == FP8T_LAYER_ALL) return 1;
    if (lo <= FP8T_LAYER_LAST_BASE) return layer >= n_layer - (FP8T_LAYER_LAST_BASE - lo);
    if (lo <= FP8T_LAYER_FIRST_BASE) return layer < FP8T_LAYER_FIRST_BASE - lo;
    return layer >= o->layer_lo && layer <= o->layer_hi;
}

fp8t_precision fp8t_policy_resolve(const fp8t_policy *p, int n_layer, int layer,
                                   fp8t_module module, fp8t_gemm_kind gemm) {
    const int head = module == FP8T_MOD_HEAD;
    fp8t_precision prec = head ? p->head_precision : p->default_precision;
    for (int i = 0; i < p->n_overrides; i++) {
        const fp8t_override *o = &p->overrides[i];
        if (o->gemm_mask && !(o->gemm_mask & (1u << gemm))) continue;
        if (head) {
            /* the head sits in no layer: only a rule naming it matches, whatever its layers */
            if (!(o->module_mask & (1u << FP8T_MOD_HEAD))) continue;
        } else {
            if (o->module_mask && !(o->module_mask & (1u << module))) continue;
            if (!layer_matches(o, n_layer, layer)) continue;
        }
        prec = o->precision; /* later rules win */
    }
    if (prec == FP8T_PREC_FP8)
        prec = p->recipe == FP8T_PREC_CURRENT ? FP8T_PREC_CURRENT : FP8T_PREC_DELAYED;
    return prec;
}

/* ---- formatting ---- */

char *fp8t_override_format(const fp8t_override *o, char *buf, size_t len) {
    char tmp[256];
    size_t k = 0;
#define PUT(...)                                                                                 \
    k += (size_t)snprintf(tmp + k, k < sizeof(tmp) ? sizeof(tmp) - k : 0, __VA_ARGS__)
    int lo = o->layer_lo;
    if (lo == FP8T_LAYER_ALL) {
    } else if (lo <= FP8T_LAYER_LAST_BASE)
        PUT("layers=last:%d,", FP8T_LAYER_LAST_BASE - lo);
    else if (lo <= FP8T_LAYER_FIRST_BASE)
        PUT("layers=first:%d,", FP8T_LAYER_FIRST_BASE - lo);
    else if (o->layer_lo == o->layer_hi)
        PUT("layers=%d,", o->layer_lo);
    else
        PUT("layers=%d-%d,", o->layer_lo, o->layer_hi);
    if (o->module_mask) {
        PUT("module=");
        int first = 1;
        for (int i = 0; i < FP8T_MOD_COUNT; i++)
            if (o->module_mask & (1u << i)) {
                PUT("%s%s", first ? "" : "+", MODULE_NAMES[i]);
                first = 0;
            }
        PUT(",");
    }
    if (o->gemm_mask) {
        PUT("gemm=");
        int first = 1;
        for (int g = 0; g < FP8T_GEMM_COUNT; g++)
            if (o->gemm_mask & (1u << g)) {
                PUT("%s%s", first ? "" : "+", GEMM_NAMES[g]);
                first = 0;
            }
        PUT(",");
    }
    PUT("precision=%s", fp8t_precision_name(o->precision));
#undef PUT
    if (buf && len) snprintf(buf, len, "%s", tmp);
    return buf;
}

char *fp8t_policy_describe(const fp8t_policy *p, char *buf, size_t len) {
    if (!buf || !len) return buf;
    size_t k = 0;
#define PUT(...) k += (size_t)snprintf(buf + k, k < len ? len - k : 0, __VA_ARGS__)
    PUT("default: %s", fp8t_precision_name(p->default_precision));
    if (p->default_precision == FP8T_PREC_FP8)
        PUT(" (= %s)", fp8t_precision_name(p->recipe == FP8T_PREC_CURRENT ? FP8T_PREC_CURRENT
                                                                          : FP8T_PREC_DELAYED));
    PUT("\nrecipe: %s, format %s (block/rowwise %s), history %d, amax %s, margin %d, epsilon %g, "
        "pow2 scales %s\n",
        fp8t_precision_name(p->recipe), p->hybrid ? "hybrid (E4M3 fwd, E5M2 grads)" : "E4M3",
        p->block_hybrid ? "hybrid" : "E4M3", p->history_len,
        p->algo == FP8T_AMAX_MOST_RECENT ? "most_recent" : "max", p->margin, (double)p->epsilon,
        p->pow2_scales ? "on" : "off");
    PUT("head: %s\n", fp8t_precision_name(p->head_precision));
    PUT("fast accumulation: fprop %s, dgrad/wgrad %s\n", p->fast_accum_fprop ? "on" : "off",
        p->fast_accum_grad ? "on" : "off");
    for (int i = 0; i < p->n_overrides; i++) {
        char o[256];
        PUT("override %d: %s\n", i + 1, fp8t_override_format(&p->overrides[i], o, sizeof(o)));
    }
#undef PUT
    return buf;
}
