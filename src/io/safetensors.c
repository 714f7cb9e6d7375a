/* fp8train — safetensors reader (mmap, validated) and writer (atomic).
 *
 * Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "value"}}
 * padded with spaces, then the data section; offsets are relative to the data section. */
#include "fp8train/error.h"
#include "fp8train/fp8.h"
#include "fp8train/io.h"
#include "io/io_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The reference implementation refuses headers above 100 MB; so do we (a corrupt length
 * field must not make us allocate gigabytes). */
#define ST_MAX_HEADER_BYTES 100000000ull
#define ST_NAME_MAX ((int)sizeof(((fp8t_st_tensor *)0)->name) - 1)

static const struct {
    const char *name;
    size_t size;
} st_dtypes[FP8T_ST_DTYPE_COUNT] = {
    [FP8T_ST_F32] = {"F32", 4},         [FP8T_ST_F16] = {"F16", 2},
    [FP8T_ST_BF16] = {"BF16", 2},       [FP8T_ST_F8_E4M3] = {"F8_E4M3", 1},
    [FP8T_ST_F8_E5M2] = {"F8_E5M2", 1}, [FP8T_ST_I64] = {"I64", 8},
    [FP8T_ST_I32] = {"I32", 4},         [FP8T_ST_I16] = {"I16", 2},
    [FP8T_ST_I8] = {"I8", 1},           [FP8T_ST_U8] = {"U8", 1},
    [FP8T_ST_F64] = {"F64", 8},
};
#define ST_DTYPE_LIST "F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, F64"

const char *fp8t_st_dtype_name(fp8t_st_dtype d) {
    return (unsigned)d < FP8T_ST_DTYPE_COUNT ? st_dtypes[d].name : "INVALID";
}

size_t fp8t_st_dtype_size(fp8t_st_dtype d) {
    return (unsigned)d < FP8T_ST_DTYPE_COUNT ? st_dtypes[d].size : 0;
}

static int st_dtype_from_name(const char *s, fp8t_st_dtype *out) {
    for (int d = 0; d < FP8T_ST_DTYPE_COUNT; d++)
        if (strcmp(s, st_dtypes[d].name) == 0) {
            *out = (fp8t_st_dtype)d;
            return 0;
        }
    return -1;
}

/* Strict UTF-8 check (no overlongs, no surrogates, nothing above U+10FFFF): the reference
 * reader rejects headers that are not UTF-8, so our writer must never produce one. */
static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        unsigned min;
        if ((c & 0xE0) == 0xC0)
            len = 2, min = 0x80, c &= 0x1F;
        else if ((c & 0xF0) == 0xE0)
            len = 3, min = 0x800, c &= 0x0F;
        else if ((c & 0xF8) == 0xF0)
            len = 4, min = 0x10000, c &= 0x07;
        else
            return 0;
        if (n - i < (size_t)len) return 0;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            c = (c << 6) | (s[i + k] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
        i += (size_t)len;
    }
    return 1;
}

/* (numel, bytes) of a shape, or -1 on overflow or a negative dimension. */
static int shape_numel(const int64_t *shape, int ndim, size_t elem_size, uint64_t *numel,
                       uint64_t *bytes) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n)) return -1;
    }
    if (__builtin_mul_overflow(n, (uint64_t)elem_size, bytes)) return -1;
    if (n > SIZE_MAX) return -1;
    *numel = n;
    return 0;
}

/* ======================================================================================
 * Reader
 * ====================================================================================== */

struct fp8t_st_file {
    char *path;
    uint8_t *map; /* the whole file, read-only */
    size_t map_len;
    const uint8_t *data; /* the data section: map + 8 + N */
    uint64_t data_len;
    fp8t_st_tensor *tensors; /* [count], in header order */
    int count;
    int *by_name;                    /* [count] tensor indices sorted by name, for fp8t_st_find */
    char **meta_keys, **meta_values; /* [meta_count] */
    int meta_count;
};

/* A JSON number that is an exact non-negative integer; 2^53 bounds what a double holds
 * exactly (and any real file size). */
static int json_to_u64(const cJSON *it, uint64_t *out) {
    if (!cJSON_IsNumber(it)) return -1;
    double v = it->valuedouble;
    if (!(v >= 0.0) || v > 9007199254740992.0) return -1;
    uint64_t u = (uint64_t)v;
    if ((double)u != v) return -1;
    *out = u;
    return 0;
}

static const char *json_kind(const cJSON *it) {
    if (!it) return "missing";
    if (cJSON_IsNumber(it)) return "a number";
    if (cJSON_IsString(it)) return "a string";
    if (cJSON_IsArray(it)) return "an array";
    if (cJSON_IsObject(it)) return "an object";
    if (cJSON_IsBool(it)) return "a boolean";
    if (cJSON_IsNull(it)) return "null";
    return "invalid";
}

/* Exact-key lookup (cJSON_GetObjectItemCaseSensitive); a second copy of the key is refused so
 * a file cannot say two different things. */
static const cJSON *json_unique_field(const cJSON *obj, const char *key, int *dup) {
    const cJSON *found = NULL;
    *dup = 0;
    for (const cJSON *c = obj->child; c; c = c->next) {
        if (c->string && strcmp(c->string, key) == 0) {
            if (found) *dup = 1;
            found = c;
        }
    }
    return found;
}

static int st_parse_metadata(fp8t_st_file *f, const cJSON *meta, char *err, size_t errlen) {
    if (!cJSON_IsObject(meta)) {
        fp8t_errorf(err, errlen,
                    "%s: \"__metadata__\" must be an object of string values, got %s", f->path,
                    json_kind(meta));
        return -1;
    }
    int n = cJSON_GetArraySize(meta);
    f->meta_keys = calloc((size_t)n + 1, sizeof(char *));
    f->meta_values = calloc((size_t)n + 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values) {
        fp8t_errorf(err, errlen, "%s: out of memory", f->path);
        return -1;
    }
    for (const cJSON *c = meta->child; c; c = c->next) {
        if (!cJSON_IsString(c) || !c->valuestring) {
            fp8t_errorf(err, errlen, "%s: __metadata__[\"%.200s\"] must be a string, got %s",
                        f->path, c->string ? c->string : "", json_kind(c));
            return -1;
        }
        for (int i = 0; i < f->meta_count; i++)
            if (strcmp(f->meta_keys[i], c->string) == 0) {
                fp8t_errorf(err, errlen, "%s: __metadata__ key \"%.200s\" appears twice", f->path,
                            c->string);
                return -1;
            }
        f->meta_keys[f->meta_count] = strdup(c->string);
        f->meta_values[f->meta_count] = strdup(c->valuestring);
        f->meta_count++;
        if (!f->meta_keys[f->meta_count - 1] || !f->meta_values[f->meta_count - 1]) {
            fp8t_errorf(err, errlen, "%s: out of memory", f->path);
            return -1;
        }
    }
    return 0;
}

/* Validate one header entry into t. */
static int st_parse_tensor(const fp8t_st_file *f, const cJSON *e, fp8t_st_tensor *t, char *err,
                           size_t errlen) {
    const char *name = e->string ? e->string : "";
    const char *path = f->path;
    if (strlen(name) > (size_t)ST_NAME_MAX) {
        fp8t_errorf(err, errlen, "%s: tensor name \"%.64s...\" is %zu bytes long (at most %d)",
                    path, name, strlen(name), ST_NAME_MAX);
        return -1;
    }
    memset(t, 0, sizeof(*t));
    memcpy(t->name, name, strlen(name) + 1);
    if (!cJSON_IsObject(e)) {
        fp8t_errorf(err, errlen,
                    "%s: tensor '%s': header entry must be an object with dtype, shape and "
                    "data_offsets, got %s",
                    path, name, json_kind(e));
        return -1;
    }
    int dup;
    const cJSON *dtype = json_unique_field(e, "dtype", &dup);
    if (dup) goto duplicate_field;
    const cJSON *shape = json_unique_field(e, "shape", &dup);
    if (dup) goto duplicate_field;
    const cJSON *offs = json_unique_field(e, "data_offsets", &dup);
    if (dup) goto duplicate_field;

    if (!cJSON_IsString(dtype) || !dtype->valuestring) {
        fp8t_errorf(err, errlen, "%s: tensor '%s': \"dtype\" must be a string, got %s", path,
                    name, json_kind(dtype));
        return -1;
    }
    if (st_dtype_from_name(dtype->valuestring, &t->dtype) != 0) {
        fp8t_errorf(err, errlen,
                    "%s: tensor '%s': dtype \"%.32s\" is not supported (supported: " ST_DTYPE_LIST
                    ")",
                    path, name, dtype->valuestring);
        return -1;
    }
    if (!cJSON_IsArray(shape)) {
        fp8t_errorf(err, errlen, "%s: tensor '%s': \"shape\" must be an array, got %s", path,
                    name, json_kind(shape));
        return -1;
    }
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > FP8T_ST_MAX_DIMS) {
        fp8t_errorf(err, errlen, "%s: tensor '%s': shape has %d dimensions (at most %d)", path,
                    name, ndim, FP8T_ST_MAX_DIMS);
        return -1;
    }
    t->ndim = ndim;
    int d = 0;
    for (const cJSON *c = shape->child; c; c = c->next, d++) {
        uint64_t v;
        if (json_to_u64(c, &v) != 0 || v > (uint64_t)INT64_MAX) {
            fp8t_errorf(err, errlen,
                        "%s: tensor '%s': shape[%d] must be a non-negative integer, got %s%s",
                        path, name, d, json_kind(c),
                        cJSON_IsNumber(c) ? " that is negative, fractional or too large" : "");
            return -1;
        }
        t->shape[d] = (int64_t)v;
    }
    uint64_t numel, bytes;
    if (shape_numel(t->shape, ndim, st_dtypes[t->dtype].size, &numel, &bytes) != 0) {
        fp8t_errorf(err, errlen, "%s: tensor '%s': shape overflows (too many elements)", path,
                    name);
        return -1;
    }
    t->numel = (size_t)numel;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) {
        fp8t_errorf(err, errlen,
                    "%s: tensor '%s': \"data_offsets\" must be an array [begin, end], got %s",
                    path, name, json_kind(offs));
        return -1;
    }
    if (json_to_u64(offs->child, &t->begin) != 0 ||
        json_to_u64(offs->child->next, &t->end) != 0) {
        fp8t_errorf(err, errlen, "%s: tensor '%s': data_offsets must be non-negative integers",
                    path, name);
        return -1;
    }
    if (t->begin > t->end || t->end > f->data_len) {
        fp8t_errorf(err, errlen,
                    "%s: tensor '%s': data_offsets [%llu, %llu] out of bounds: the data "
                    "section holds %llu bytes (truncated file?)",
                    path, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                    (unsigned long long)f->data_len);
        return -1;
    }
    if (t->end - t->begin != bytes) {
        fp8t_errorf(err, errlen,
                    "%s: tensor '%s': data_offsets [%llu, %llu] span %llu bytes but %s shape "
                    "with %llu elements needs %llu",
                    path, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                    (unsigned long long)(t->end - t->begin), st_dtypes[t->dtype].name,
                    (unsigned long long)numel, (unsigned long long)bytes);
        return -1;
    }
    return 0;
duplicate_field:
    fp8t_errorf(err, errlen, "%s: tensor '%s': a field appears twice in its header entry", path,
                name);
    return -1;
}

static int cmp_by_name(const void *a, const void *b, void *tensors) {
    const fp8t_st_tensor *t = (const fp8t_st_tensor *)tensors;
    return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

static int st_parse_header(fp8t_st_file *f, const char *json, size_t n, char *err,
                           size_t errlen) {
    const char *path = f->path;
    if (!utf8_valid((const unsigned char *)json, n)) {
        fp8t_errorf(err, errlen, "%s: safetensors header is not valid UTF-8 (corrupt file?)",
                    path);
        return -1;
    }
    /* cJSON wants a NUL-terminated buffer; the mapped header is not one. */
    char *buf = malloc(n + 1);
    if (!buf) {
        fp8t_errorf(err, errlen, "%s: out of memory for a %zu-byte header", path, n);
        return -1;
    }
    memcpy(buf, json, n);
    buf[n] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, n, &end, 0);
    if (!root) {
        size_t at = end && end >= buf ? (size_t)(end - buf) : 0;
        fp8t_errorf(err, errlen,
                    "%s: safetensors header is not valid JSON (error at byte %zu of %zu; not a "
                    "safetensors file, or corrupt)",
                    path, at, n);
        free(buf);
        return -1;
    }
    /* Only padding may follow the JSON object (writers pad with spaces). */
    for (const char *p = end; p < buf + n; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            fp8t_errorf(err, errlen,
                        "%s: safetensors header has trailing bytes after the JSON object "
                        "(byte %zu of %zu)",
                        path, (size_t)(p - buf), n);
            cJSON_Delete(root);
            free(buf);
            return -1;
        }
    }
    free(buf);
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        fp8t_errorf(err, errlen, "%s: safetensors header must be a JSON object, got %s", path,
                    json_kind(root));
        goto done;
    }
    int n_entries = cJSON_GetArraySize(root);
    f->tensors = calloc((size_t)n_entries + 1, sizeof(fp8t_st_tensor));
    f->by_name = calloc((size_t)n_entries + 1, sizeof(int));
    if (!f->tensors || !f->by_name) {
        fp8t_errorf(err, errlen, "%s: out of memory for %d tensors", path, n_entries);
        goto done;
    }
    int seen_meta = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (e->string && strcmp(e->string, "__metadata__") == 0) {
            if (seen_meta++) {
                fp8t_errorf(err, errlen, "%s: \"__metadata__\" appears twice", path);
                goto done;
            }
            if (st_parse_metadata(f, e, err, errlen) != 0) goto done;
            continue;
        }
        if (st_parse_tensor(f, e, &f->tensors[f->count], err, errlen) != 0) goto done;
        f->by_name[f->count] = f->count;
        f->count++;
    }
    /* Sorted index: fast lookups, and duplicate names are easy to spot. */
    qsort_r(f->by_name, (size_t)f->count, sizeof(int), cmp_by_name, f->tensors);
    for (int i = 1; i < f->count; i++) {
        const char *a = f->tensors[f->by_name[i - 1]].name, *b = f->tensors[f->by_name[i]].name;
        if (strcmp(a, b) == 0) {
            fp8t_errorf(err, errlen, "%s: tensor '%s' appears twice in the header", path, a);
            goto done;
        }
    }
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

void fp8t_st_close(fp8t_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    for (int i = 0; i < f->meta_count; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    free(f->tensors);
    free(f->by_name);
    free(f->path);
    free(f);
}

int fp8t_st_open(fp8t_st_file **out, const char *path, char *err, size_t errlen) {
    if (!out) {
        fp8t_errorf(err, errlen, "fp8t_st_open: out must not be NULL");
        return -1;
    }
    *out = NULL;
    if (!path || !*path) {
        fp8t_errorf(err, errlen, "cannot open a safetensors file with an empty path");
        return -1;
    }
    fp8t_st_file *f = calloc(1, sizeof(*f));
    if (!f || !(f->path = strdup(path))) {
        free(f);
        fp8t_errorf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    uint64_t size;
    int fd = fp8t_open_regular(path, &size, err, errlen);
    if (fd < 0) goto fail;
    if (size < 8) {
        fp8t_errorf(err, errlen,
                    "%s is not a safetensors file: %llu bytes, less than the 8-byte header "
                    "length",
                    path, (unsigned long long)size);
        close(fd);
        goto fail;
    }
    /* Read-only shared mapping: multi-GB checkpoints are paged in on demand, never copied. */
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        fp8t_errorf(err, errlen, "cannot mmap %s (%llu bytes): %s", path,
                    (unsigned long long)size, strerror(errno));
        goto fail;
    }
    f->map = map;
    f->map_len = (size_t)size;
    uint64_t n = fp8t_load_le64(f->map);
    if (n > size - 8) {
        fp8t_errorf(err, errlen,
                    "%s: safetensors header length %llu exceeds the %llu bytes after it "
                    "(truncated, or not a safetensors file)",
                    path, (unsigned long long)n, (unsigned long long)(size - 8));
        goto fail;
    }
    if (n > ST_MAX_HEADER_BYTES) {
        fp8t_errorf(err, errlen,
                    "%s: safetensors header length %llu is above the %llu-byte limit (corrupt "
                    "file?)",
                    path, (unsigned long long)n, ST_MAX_HEADER_BYTES);
        goto fail;
    }
    if (n < 2) {
        fp8t_errorf(err, errlen, "%s: safetensors header length %llu cannot hold a JSON object",
                    path, (unsigned long long)n);
        goto fail;
    }
    f->data = f->map + 8 + n;
    f->data_len = size - 8 - n;
    if (st_parse_header(f, (const char *)f->map + 8, (size_t)n, err, errlen) != 0) goto fail;
    *out = f;
    return 0;
fail:
    fp8t_st_close(f);
    return -1;
}

int fp8t_st_count(const fp8t_st_file *f) { return f ? f->count : 0; }

const fp8t_st_tensor *fp8t_st_get(const fp8t_st_file *f, int i) {
    return (f && i >= 0 && i < f->count) ? &f->tensors[i] : NULL;
}

const fp8t_st_tensor *fp8t_st_find(const fp8t_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    int lo = 0, hi = f->count - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const fp8t_st_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* Note: the pointer is only as aligned as the file makes it; files from our writer keep every
 * tensor aligned to its element size, foreign ones need not. */
const void *fp8t_st_data(const fp8t_st_file *f, const fp8t_st_tensor *t) {
    if (!f || !t) return NULL;
    return f->data + t->begin;
}

const char *fp8t_st_metadata(const fp8t_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->meta_count; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

/* IEEE binary16 -> binary32 (exact: every half is a float). */
static float f16_decode(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31)
        bits = sign | 0x7F800000u | (man << 13); /* Inf / NaN (payload kept) */
    else
        bits = sign | ((exp + 112u) << 23) | (man << 13); /* rebias 15 -> 127 */
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static void format_shape(char *buf, size_t n, const fp8t_st_tensor *t) {
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "",
                                 (long long)t->shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
}

int fp8t_st_read_f32(const fp8t_st_file *f, const char *name, float *out, size_t numel, char *err,
                     size_t errlen) {
    if (!f || !name) {
        fp8t_errorf(err, errlen, "fp8t_st_read_f32: no file or no tensor name given");
        return -1;
    }
    const fp8t_st_tensor *t = fp8t_st_find(f, name);
    if (!t) {
        fp8t_errorf(err, errlen, "%s: tensor '%s' not found (the file holds %d tensors)", f->path,
                    name, f->count);
        return -1;
    }
    if (t->numel != numel) {
        char shp[160];
        format_shape(shp, sizeof shp, t);
        fp8t_errorf(err, errlen,
                    "%s: tensor '%s' has %zu elements (shape %s) but %zu were expected "
                    "(model config does not match the file?)",
                    f->path, name, t->numel, shp, numel);
        return -1;
    }
    if (!out && numel > 0) {
        fp8t_errorf(err, errlen, "fp8t_st_read_f32: no output buffer for tensor '%s'", name);
        return -1;
    }
    const uint8_t *src = f->data + t->begin;
    switch (t->dtype) {
    case FP8T_ST_F32:
        if (numel) memcpy(out, src, numel * sizeof(float));
        break;
    case FP8T_ST_F64:
        for (size_t i = 0; i < numel; i++) {
            double v;
            memcpy(&v, src + 8 * i, sizeof v);
            out[i] = (float)v; /* IEEE conversion: rounds, overflows to Inf */
        }
        break;
    case FP8T_ST_F16:
        for (size_t i = 0; i < numel; i++) out[i] = f16_decode(fp8t_load_le16(src + 2 * i));
        break;
    case FP8T_ST_BF16:
        for (size_t i = 0; i < numel; i++) out[i] = bf16_decode(fp8t_load_le16(src + 2 * i));
        break;
    case FP8T_ST_F8_E4M3:
        for (size_t i = 0; i < numel; i++) out[i] = fp8_decode(src[i], FP8_E4M3);
        break;
    case FP8T_ST_F8_E5M2:
        for (size_t i = 0; i < numel; i++) out[i] = fp8_decode(src[i], FP8_E5M2);
        break;
    default:
        fp8t_errorf(err, errlen,
                    "%s: tensor '%s' has integer dtype %s; only floating-point tensors are "
                    "read as FP32",
                    f->path, name, st_dtypes[t->dtype].name);
        return -1;
    }
    return 0;
}

/* ======================================================================================
 * Writer
 * ====================================================================================== */

typedef struct {
    fp8t_st_tensor info;
    const void *data; /* [bytes] an owned copy, or the caller's buffer (borrowed) */
    int owned;
    uint64_t bytes;
} st_entry;

struct fp8t_st_writer {
    st_entry *entries; /* [count], insertion order */
    int count, cap;
    char **meta_keys, **meta_values; /* [meta_count] */
    int meta_count, meta_cap;
    char err[FP8T_ERR_LEN]; /* first error from add/metadata, reported by save */
};

fp8t_st_writer *fp8t_st_writer_new(void) { return calloc(1, sizeof(fp8t_st_writer)); }

void fp8t_st_writer_free(fp8t_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->count; i++)
        if (w->entries[i].owned) free((void *)w->entries[i].data);
    free(w->entries);
    for (int i = 0; i < w->meta_count; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->meta_keys);
    free(w->meta_values);
    free(w);
}

__attribute__((format(printf, 2, 3))) static void writer_fail(fp8t_st_writer *w, const char *fmt,
                                                              ...) {
    if (w->err[0]) return; /* keep the first error: later ones are usually consequences */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
}

/* Shared by add (copies the data) and add_ref (borrows it). */
static void writer_add(fp8t_st_writer *w, const char *name, fp8t_st_dtype dtype, int ndim,
                       const int64_t *shape, const void *data, int copy) {
    if (!w) return;
    if (!name) {
        writer_fail(w, "tensor with a NULL name");
        return;
    }
    size_t name_len = strlen(name);
    if (name_len > (size_t)ST_NAME_MAX) {
        writer_fail(w, "tensor name \"%.64s...\" is %zu bytes long (at most %d)", name, name_len,
                    ST_NAME_MAX);
        return;
    }
    if (strcmp(name, "__metadata__") == 0) {
        writer_fail(w, "\"__metadata__\" is reserved and cannot name a tensor");
        return;
    }
    if (!utf8_valid((const unsigned char *)name, name_len)) {
        writer_fail(w, "tensor name \"%s\" is not valid UTF-8", name);
        return;
    }
    if ((unsigned)dtype >= FP8T_ST_DTYPE_COUNT) {
        writer_fail(w, "tensor '%s': invalid dtype %d", name, (int)dtype);
        return;
    }
    if (ndim < 0 || ndim > FP8T_ST_MAX_DIMS || (ndim > 0 && !shape)) {
        writer_fail(w, "tensor '%s': ndim %d invalid (0..%d, with a shape)", name, ndim,
                    FP8T_ST_MAX_DIMS);
        return;
    }
    uint64_t numel, bytes;
    if (shape_numel(shape, ndim, st_dtypes[dtype].size, &numel, &bytes) != 0) {
        writer_fail(w, "tensor '%s': shape has a negative dimension or overflows", name);
        return;
    }
    if (bytes > 0 && !data) {
        writer_fail(w, "tensor '%s': no data given for %llu bytes", name,
                    (unsigned long long)bytes);
        return;
    }
    for (int i = 0; i < w->count; i++)
        if (strcmp(w->entries[i].info.name, name) == 0) {
            writer_fail(w, "tensor '%s' added twice", name);
            return;
        }
    if (w->count == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        st_entry *e = realloc(w->entries, (size_t)cap * sizeof(st_entry));
        if (!e) {
            writer_fail(w, "out of memory adding tensor '%s'", name);
            return;
        }
        w->entries = e;
        w->cap = cap;
    }
    st_entry *e = &w->entries[w->count];
    memset(e, 0, sizeof(*e));
    memcpy(e->info.name, name, name_len + 1);
    e->info.dtype = dtype;
    e->info.ndim = ndim;
    for (int i = 0; i < ndim; i++) e->info.shape[i] = shape[i];
    e->info.numel = (size_t)numel;
    e->bytes = bytes;
    if (copy) {
        void *buf = malloc(bytes ? (size_t)bytes : 1);
        if (!buf) {
            writer_fail(w, "out of memory copying tensor '%s' (%llu bytes)", name,
                        (unsigned long long)bytes);
            return;
        }
        if (bytes) memcpy(buf, data, (size_t)bytes);
        e->data = buf;
        e->owned = 1;
    } else {
        e->data = data;
    }
    w->count++;
}

void fp8t_st_writer_add(fp8t_st_writer *w, const char *name, fp8t_st_dtype dtype, int ndim,
                        const int64_t *shape, const void *data) {
    writer_add(w, name, dtype, ndim, shape, data, 1);
}

void fp8t_st_writer_add_ref(fp8t_st_writer *w, const char *name, fp8t_st_dtype dtype, int ndim,
                            const int64_t *shape, const void *data) {
    writer_add(w, name, dtype, ndim, shape, data, 0);
}

void fp8t_st_writer_metadata(fp8t_st_writer *w, const char *key, const char *value) {
    if (!w) return;
    if (!key || !value) {
        writer_fail(w, "metadata with a NULL key or value");
        return;
    }
    if (!utf8_valid((const unsigned char *)key, strlen(key)) ||
        !utf8_valid((const unsigned char *)value, strlen(value))) {
        writer_fail(w, "metadata \"%.64s\" is not valid UTF-8", key);
        return;
    }
    char *v = strdup(value);
    if (!v) {
        writer_fail(w, "out of memory for metadata \"%.64s\"", key);
        return;
    }
    for (int i = 0; i < w->meta_count; i++)
        if (strcmp(w->meta_keys[i], key) == 0) { /* a later value replaces the earlier one */
            free(w->meta_values[i]);
            w->meta_values[i] = v;
            return;
        }
    if (w->meta_count == w->meta_cap) {
        int cap = w->meta_cap ? 2 * w->meta_cap : 8;
        char **k = realloc(w->meta_keys, (size_t)cap * sizeof(char *));
        if (k) w->meta_keys = k;
        char **vv = k ? realloc(w->meta_values, (size_t)cap * sizeof(char *)) : NULL;
        if (vv) w->meta_values = vv;
        if (!k || !vv) {
            free(v);
            writer_fail(w, "out of memory for metadata \"%.64s\"", key);
            return;
        }
        w->meta_cap = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(v);
        writer_fail(w, "out of memory for metadata \"%.64s\"", key);
        return;
    }
    w->meta_keys[w->meta_count] = k;
    w->meta_values[w->meta_count] = v;
    w->meta_count++;
}

/* A growable string for the JSON header. */
typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} strbuf;

static void sb_putn(strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}
static void sb_puts(strbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }
static void sb_putu64(strbuf *b, uint64_t v) {
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_putn(b, tmp, (size_t)n);
}
/* JSON string literal; input is valid UTF-8 (checked on add), so only '"', '\\' and control
 * characters need escaping. */
static void sb_json_string(strbuf *b, const char *s) {
    sb_putn(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"')
            sb_putn(b, "\\\"", 2);
        else if (*p == '\\')
            sb_putn(b, "\\\\", 2);
        else if (*p < 0x20) {
            char tmp[8];
            snprintf(tmp, sizeof tmp, "\\u%04x", *p);
            sb_putn(b, tmp, 6);
        } else
            sb_putn(b, (const char *)p, 1);
    }
    sb_putn(b, "\"", 1);
}

int fp8t_st_writer_save(fp8t_st_writer *w, const char *path, char *err, size_t errlen) {
    if (!path || !*path) {
        fp8t_errorf(err, errlen, "cannot save safetensors: empty path");
        return -1;
    }
    if (!w) {
        fp8t_errorf(err, errlen, "cannot save %s: no writer (out of memory?)", path);
        return -1;
    }
    if (w->err[0]) {
        fp8t_errorf(err, errlen, "cannot save %s: %s", path, w->err);
        return -1;
    }
    /* Data layout: largest element size first (stable within a size), so every tensor starts
     * aligned to its element size with no gaps (the reference reader refuses gaps). The JSON
     * lists tensors in insertion order; readers order by offsets. */
    int *order = malloc(((size_t)w->count + 1) * sizeof(int));
    if (!order) {
        fp8t_errorf(err, errlen, "cannot save %s: out of memory", path);
        return -1;
    }
    int k = 0;
    static const size_t sizes[] = {8, 4, 2, 1};
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < w->count; i++)
            if (st_dtypes[w->entries[i].info.dtype].size == sizes[s]) order[k++] = i;
    uint64_t off = 0;
    for (int j = 0; j < k; j++) {
        st_entry *e = &w->entries[order[j]];
        e->info.begin = off;
        off += e->bytes; /* each size < 2^64 / 8 (checked on add) and memory-backed: no wrap */
        e->info.end = off;
    }

    strbuf h = {0};
    sb_puts(&h, "{");
    int first = 1;
    if (w->meta_count > 0) {
        sb_puts(&h, "\"__metadata__\":{");
        for (int i = 0; i < w->meta_count; i++) {
            if (i) sb_puts(&h, ",");
            sb_json_string(&h, w->meta_keys[i]);
            sb_puts(&h, ":");
            sb_json_string(&h, w->meta_values[i]);
        }
        sb_puts(&h, "}");
        first = 0;
    }
    for (int i = 0; i < w->count; i++) {
        const fp8t_st_tensor *t = &w->entries[i].info;
        if (!first) sb_puts(&h, ",");
        first = 0;
        sb_json_string(&h, t->name);
        sb_puts(&h, ":{\"dtype\":");
        sb_json_string(&h, st_dtypes[t->dtype].name);
        sb_puts(&h, ",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) sb_puts(&h, ",");
            sb_putu64(&h, (uint64_t)t->shape[d]);
        }
        sb_puts(&h, "],\"data_offsets\":[");
        sb_putu64(&h, t->begin);
        sb_puts(&h, ",");
        sb_putu64(&h, t->end);
        sb_puts(&h, "]}");
    }
    sb_puts(&h, "}");
    while (h.len % 8 != 0) sb_puts(&h, " "); /* the data section starts 8-byte aligned */
    if (h.oom) {
        free(h.s);
        free(order);
        fp8t_errorf(err, errlen, "cannot save %s: out of memory for the header", path);
        return -1;
    }
    uint8_t len8[8];
    fp8t_store_le64(len8, (uint64_t)h.len);

    fp8t_atomic_file a;
    int rc = -1;
    if (fp8t_atomic_open(&a, path, err, errlen) != 0) goto done;
    if (fp8t_atomic_write(&a, len8, 8, err, errlen) != 0) goto done;
    if (fp8t_atomic_write(&a, h.s, h.len, err, errlen) != 0) goto done;
    for (int j = 0; j < k; j++) {
        const st_entry *e = &w->entries[order[j]];
        if (e->bytes && fp8t_atomic_write(&a, e->data, (size_t)e->bytes, err, errlen) != 0)
            goto done;
    }
    rc = fp8t_atomic_commit(&a, err, errlen);
done:
    free(h.s);
    free(order);
    return rc;
}
