/* fp8train — header fuzzing of every reader in src/io: truncations at every byte of small
 * valid files, random byte flips (fixed seed), hand-written malformed headers and randomly
 * generated ones. Nothing may crash (this suite also runs under ASan/UBSan); every reject
 * returns -1 with a message naming the file; whatever is accepted must be self-consistent. */
#include "fp8train/io.h"
#include "test.h"

#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char g_dir[64];
static char g_path[128]; /* the one file every case is written to */
static long g_cases, g_rejected;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { /* xorshift64*: fixed seed, same cases on every run */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 2685821657736338717ull;
}
static size_t rnd_below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static int write_raw(const char *path, const void *data, size_t n) {
    /* a fresh file each time: truncating and rewriting one makes ext4 flush it to disk */
    unlink(path);
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = n ? fwrite(data, 1, n, fp) : 0;
    return (fclose(fp) == 0 && w == n) ? 0 : -1;
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* ---- readers: 0 accepted and consistent, -1 rejected, -2 accepted but inconsistent ---- */

typedef int (*reader_fn)(const char *path, char *err, size_t errlen);

static int read_st(const char *path, char *err, size_t errlen) {
    fp8t_st_file *f = NULL;
    if (fp8t_st_open(&f, path, err, errlen) != 0) return f == NULL ? -1 : -2;
    /* data section size, computed independently from the raw file */
    FILE *fp = fopen(path, "rb");
    unsigned char len8[8] = {0};
    size_t got = fp ? fread(len8, 1, 8, fp) : 0;
    if (fp) fclose(fp);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)len8[i] << (8 * i);
    uint64_t data_len = (uint64_t)file_size(path) - 8 - n;
    int rc = got == 8 ? 0 : -2;
    for (int i = 0; i < fp8t_st_count(f) && rc == 0; i++) {
        const fp8t_st_tensor *t = fp8t_st_get(f, i);
        size_t elem = fp8t_st_dtype_size(t->dtype);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (uint64_t)t->shape[d];
        if (elem == 0 || t->ndim < 0 || t->ndim > FP8T_ST_MAX_DIMS || numel != t->numel ||
            t->begin > t->end || t->end > data_len || t->end - t->begin != numel * elem ||
            memchr(t->name, '\0', sizeof t->name) == NULL || fp8t_st_find(f, t->name) != t) {
            rc = -2;
            break;
        }
        float *buf = malloc(t->numel * sizeof(float) + 1);
        char e2[256];
        int r = fp8t_st_read_f32(f, t->name, buf, t->numel, e2, sizeof e2);
        int is_float = t->dtype == FP8T_ST_F32 || t->dtype == FP8T_ST_F16 ||
                       t->dtype == FP8T_ST_BF16 || t->dtype == FP8T_ST_F8_E4M3 ||
                       t->dtype == FP8T_ST_F8_E5M2 || t->dtype == FP8T_ST_F64;
        if ((r == 0) != is_float) rc = -2;
        /* touch every byte of integer tensors too */
        const unsigned char *d = fp8t_st_data(f, t);
        volatile unsigned sum = 0;
        for (uint64_t k = 0; k < t->end - t->begin; k++) sum += d[k];
        free(buf);
    }
    fp8t_st_close(f);
    return rc;
}

static int read_npy(const char *path, char *err, size_t errlen) {
    char descr[16];
    int ndim = -1;
    int64_t shape[8];
    void *data = NULL;
    size_t nbytes = 0;
    if (fp8t_npy_read(path, descr, &ndim, shape, &data, &nbytes, err, errlen) != 0)
        return data == NULL ? -1 : -2;
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= (uint64_t)shape[i];
    size_t elem = (size_t)(descr[2] - '0');
    int ok = data && ndim >= 0 && ndim <= 8 && strlen(descr) == 3 && numel * elem == nbytes;
    volatile unsigned sum = 0;
    for (size_t i = 0; ok && i < nbytes; i++) sum += ((unsigned char *)data)[i];
    free(data);
    return ok ? 0 : -2;
}

static int read_shard(const char *path, char *err, size_t errlen) {
    uint16_t *t = NULL;
    size_t n = 0;
    if (fp8t_shard_read(path, &t, &n, err, errlen) != 0) return t == NULL ? -1 : -2;
    int ok = t && (long)(1024 + 2 * n) == file_size(path);
    volatile unsigned sum = 0;
    for (size_t i = 0; ok && i < n; i++) sum += t[i];
    free(t);
    return ok ? 0 : -2;
}

static int read_gpt2(const char *path, char *err, size_t errlen) {
    fp8t_llmc_gpt2 ck;
    if (fp8t_llmc_gpt2_read(path, &ck, err, errlen) != 0) return ck.params == NULL ? -1 : -2;
    int ok = ck.params && (ck.version == 3 || ck.version == 5) &&
             (long)(1024 + (ck.version == 3 ? 4 : 2) * ck.num_params) == file_size(path);
    volatile float sum = 0;
    for (size_t i = 0; ok && i < ck.num_params; i++) sum += ck.params[i];
    fp8t_llmc_gpt2_free(&ck);
    return ok ? 0 : -2;
}

/* Runs one case; fails the current test (once) on a broken contract. */
enum { MAY_ACCEPT = 0, MUST_REJECT = 1, MUST_ACCEPT = 2 };
static int run_case(reader_fn rd, const void *buf, size_t n, int expect, const char *what,
                    long index) {
    if (write_raw(g_path, buf, n) != 0) {
        T_FAIL("cannot write %s", g_path);
        return -1;
    }
    char err[512];
    err[0] = '\0';
    int rc = rd(g_path, err, sizeof err);
    g_cases++;
    if (rc == -1) g_rejected++;
    if (rc == -2)
        T_FAIL("%s #%ld: accepted but inconsistent", what, index);
    else if (rc == -1 && strstr(err, g_path) == NULL)
        T_FAIL("%s #%ld: rejected without naming the file: \"%s\"", what, index, err);
    else if (rc == 0 && expect == MUST_REJECT)
        T_FAIL("%s #%ld: malformed input accepted", what, index);
    else if (rc == -1 && expect == MUST_ACCEPT)
        T_FAIL("%s #%ld: valid input rejected: %s", what, index, err);
    return rc;
}

/* Every strict prefix must be rejected; random flips must not break anything. */
static void truncate_and_flip(reader_fn rd, const char *what, int extension_rejected,
                              size_t hot_bytes, int flips) {
    char err[512];
    unsigned char *orig;
    size_t n;
    {
        char *tmp;
        if (fp8t_read_file(g_path, &tmp, &n, err, sizeof err) != 0) {
            T_FAIL("%s", err);
            return;
        }
        orig = (unsigned char *)tmp;
    }
    run_case(rd, orig, n, MUST_ACCEPT, what, -1);
    for (size_t len = 0; len < n; len++) run_case(rd, orig, len, MUST_REJECT, what, (long)len);
    unsigned char *buf = malloc(n + 16);
    memcpy(buf, orig, n);
    memset(buf + n, 0xAB, 16);
    run_case(rd, buf, n + 1, extension_rejected ? MUST_REJECT : MAY_ACCEPT, what, -2);
    run_case(rd, buf, n + 16, extension_rejected ? MUST_REJECT : MAY_ACCEPT, what, -3);
    for (int k = 0; k < flips; k++) {
        memcpy(buf, orig, n);
        int m = 1 + (int)rnd_below(4);
        for (int j = 0; j < m; j++) {
            /* half the flips land in the header, where the parsing happens */
            size_t at = (rnd() & 1) ? rnd_below(hot_bytes < n ? hot_bytes : n) : rnd_below(n);
            if (rnd() & 1)
                buf[at] ^= (unsigned char)(1u << rnd_below(8));
            else
                buf[at] = (unsigned char)rnd();
        }
        run_case(rd, buf, n, MAY_ACCEPT, what, k);
    }
    free(buf);
    free(orig);
}

/* ---- safetensors ---- */

static void make_valid_st(void) {
    char err[512];
    float f[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3F80, 0x4000, 0xC040};
    uint8_t q[5] = {0x38, 0x40, 0x7E, 0xFE, 0x01};
    int64_t i[1] = {42};
    int64_t s23[2] = {2, 3}, s3[1] = {3}, s5[1] = {5};
    fp8t_st_writer *w = fp8t_st_writer_new();
    fp8t_st_writer_add(w, "w", FP8T_ST_F32, 2, s23, f);
    fp8t_st_writer_add(w, "b", FP8T_ST_BF16, 1, s3, b);
    fp8t_st_writer_add(w, "q", FP8T_ST_F8_E4M3, 1, s5, q);
    fp8t_st_writer_add(w, "i", FP8T_ST_I64, 0, NULL, i);
    fp8t_st_writer_metadata(w, "k", "v");
    if (fp8t_st_writer_save(w, g_path, err, sizeof err) != 0) T_FAIL("%s", err);
    fp8t_st_writer_free(w);
}

static void test_fuzz_st_truncate_and_flip(void) {
    make_valid_st();
    truncate_and_flip(read_st, "safetensors", 0, 200, 3000);
}

/* A file with header length field n (maybe lying), header text json, data bytes of zeros. */
static int st_case(uint64_t n, const char *json, size_t json_len, size_t data, int expect,
                   const char *what, long index) {
    size_t total = 8 + json_len + data;
    unsigned char *buf = calloc(1, total + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(n >> (8 * i));
    memcpy(buf + 8, json, json_len);
    int rc = run_case(read_st, buf, total, expect, what, index);
    free(buf);
    return rc;
}

static void test_fuzz_st_malformed_headers(void) {
    static const char *bad[] = {
        "",
        " ",
        "not json",
        "[]",
        "123",
        "\"str\"",
        "null",
        "{",
        "{}}",
        "{} x",
        "{\"a\":1}",
        "{\"a\":[]}",
        "{\"a\":null}",
        "{\"a\":{}}",
        "{\"a\":\"F32\"}",
        "{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,6]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[18446744073709551617],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
        "\"data_offsets\":[0,0]}}",
        "{\"a\":{\"dtype\":\"F64\",\"shape\":[9007199254740992,9007199254740992],"
        "\"data_offsets\":[0,0]}}",
        "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,68]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[64,68]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0,4\"}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.5,4.5]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1e20,1e20]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[null,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        "{\"__metadata__\":[]}",
        "{\"__metadata__\":\"x\"}",
        "{\"__metadata__\":{\"k\":1}}",
        "{\"__metadata__\":{\"k\":null}}",
        "{\"__metadata__\":{\"k\":{}}}",
        "{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}",
        "{\"__metadata__\":{},\"__metadata__\":{}}",
        "{\"\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        "{\"a\xc0\x80\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        "{\"\\ud800\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} ,",
    };
    long idx = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++, idx++)
        st_case(strlen(bad[i]), bad[i], strlen(bad[i]), 64, MUST_REJECT, "st-bad-json", idx);
    /* a NUL inside the header */
    st_case(8, "{}\0     ", 8, 0, MUST_REJECT, "st-nul", idx++);
    /* a name too long for fp8t_st_tensor.name */
    char longname[400];
    snprintf(longname, sizeof longname,
             "{\"%0300d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 7);
    st_case(strlen(longname), longname, strlen(longname), 64, MUST_REJECT, "st-longname", idx++);
    /* nesting deep enough to blow a naive recursive parser */
    size_t depth = 5000;
    char *deep = malloc(2 * depth + 16);
    size_t k = 0;
    deep[k++] = '{', memcpy(deep + k, "\"a\":", 4), k += 4;
    for (size_t d = 0; d < depth; d++) deep[k++] = '[';
    for (size_t d = 0; d < depth; d++) deep[k++] = ']';
    deep[k++] = '}';
    st_case(k, deep, k, 0, MUST_REJECT, "st-deep", idx++);
    free(deep);
    /* header length lies */
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    size_t okn = strlen(ok);
    const uint64_t lens[] = {0,
                             1,
                             okn + 5,
                             okn + 100,
                             UINT64_MAX,
                             UINT64_MAX - 7,
                             (uint64_t)1 << 63,
                             0xFFFFFFFFull,
                             okn - 1};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        st_case(lens[i], ok, okn, 4, MUST_REJECT, "st-len", (long)i);
    /* the same header told the truth is accepted, as are padding and an empty file */
    st_case(okn, ok, okn, 4, MUST_ACCEPT, "st-ok", 0);
    char padded[128];
    snprintf(padded, sizeof padded, "%s \n\t\r   ", ok);
    st_case(strlen(padded), padded, strlen(padded), 4, MUST_ACCEPT, "st-ok", 1);
    st_case(2, "{}", 2, 0, MUST_ACCEPT, "st-ok", 2);
    st_case(8, "{}      ", 8, 0, MUST_ACCEPT, "st-ok", 3);
    /* a header length above the 100 MB limit in a (sparse) file that is large enough */
    unsigned char len8[8] = {0, 0, 0, 0x10, 0, 0, 0, 0}; /* 256 MiB */
    FILE *fp = fopen(g_path, "wb");
    if (fp) {
        fwrite(len8, 1, 8, fp);
        fclose(fp);
    }
    if (truncate(g_path, (off_t)300 << 20) == 0) {
        char err[512] = "";
        fp8t_st_file *f = NULL;
        g_cases++;
        if (fp8t_st_open(&f, g_path, err, sizeof err) != -1 || !strstr(err, "limit"))
            T_FAIL("256 MiB header accepted or unclear: %s", err);
        fp8t_st_close(f);
    }
    unlink(g_path);
    /* not a regular file */
    {
        char err[512] = "";
        fp8t_st_file *f = NULL;
        g_cases++;
        if (fp8t_st_open(&f, g_dir, err, sizeof err) != -1 || !strstr(err, g_dir))
            T_FAIL("directory accepted: %s", err);
    }
}

/* Randomly generated headers from plausible and implausible pieces. */
static void test_fuzz_st_generated(void) {
    static const char *dtypes[] = {"F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32",
                                   "I16", "I8",  "U8",   "F64",     "BOOL",    "",    "F8"};
    static const char *nums[] = {
        "0",     "1",     "2",    "3",    "4",          "8",
        "16",    "-1",    "1.5",  "1e3",  "4294967296", "9007199254740993",
        "1e400", "\"2\"", "null", "true", "[]",         "{}"};
    char *json = malloc(1 << 16);
    long accepted = 0;
    for (int c = 0; c < 1500; c++) {
        size_t k = 0, cap = 1 << 16;
#define PUT(...) k += (size_t)snprintf(json + k, cap - k, __VA_ARGS__)
        PUT("{");
        int nt = (int)rnd_below(4);
        for (int t = 0; t < nt; t++) {
            if (t) PUT(",");
            PUT("\"t%d\":{", (int)rnd_below(3)); /* names may repeat */
            int fields = 0;
            if (rnd_below(8))
                PUT("%s\"dtype\":\"%s\"", fields++ ? "," : "", dtypes[rnd_below(14)]);
            if (rnd_below(8)) {
                PUT("%s\"shape\":[", fields++ ? "," : "");
                int nd = (int)rnd_below(rnd_below(4) ? 4 : 11);
                for (int d = 0; d < nd; d++)
                    PUT("%s%s", d ? "," : "", nums[rnd_below(rnd_below(2) ? 6 : 18)]);
                PUT("]");
            }
            if (rnd_below(8)) {
                PUT("%s\"data_offsets\":[", fields++ ? "," : "");
                int no = rnd_below(6) ? 2 : (int)rnd_below(4);
                for (int d = 0; d < no; d++)
                    PUT("%s%s", d ? "," : "", nums[rnd_below(rnd_below(2) ? 7 : 18)]);
                PUT("]");
            }
            PUT("}");
        }
        if (rnd_below(3) == 0)
            PUT("%s\"__metadata__\":{\"a\":%s}", nt ? "," : "",
                rnd_below(2) ? "\"b\"" : nums[rnd_below(18)]);
        PUT("}");
#undef PUT
        accepted += st_case(k, json, k, rnd_below(40), MAY_ACCEPT, "st-generated", c) == 0;
    }
    free(json);
    printf("  generated safetensors headers: %ld of 1500 accepted\n", accepted);
    T_CHECK(accepted >= 100, "the generator should make some valid headers (%ld)", accepted);
}

/* ---- .npy ---- */

static void test_fuzz_npy_truncate_and_flip(void) {
    char err[512];
    float x[6] = {1, 2, 3, 4, 5, 6};
    int64_t s[2] = {2, 3};
    if (fp8t_npy_write(g_path, "<f4", 2, s, x, err, sizeof err) != 0) T_FAIL("%s", err);
    truncate_and_flip(read_npy, "npy", 1, 128, 2000);
}

static int npy_case(int major, const char *header, size_t data, int expect, const char *what,
                    long index) {
    size_t hl = strlen(header), pre = major == 1 ? 10 : 12, total = pre + hl + data;
    unsigned char *buf = calloc(1, total + 1);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[8] = (unsigned char)hl, buf[9] = (unsigned char)(hl >> 8);
    memcpy(buf + pre, header, hl);
    int rc = run_case(read_npy, buf, total, expect, what, index);
    free(buf);
    return rc;
}

static void test_fuzz_npy_malformed_headers(void) {
    static const char *bad[] = {
        "",
        "{",
        "}",
        "{}",
        "[]",
        "{'descr': '<f4', 'fortran_order': False}",
        "{'descr': '<f4', 'shape': (4,)}",
        "{'fortran_order': False, 'shape': (4,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'extra': 1}",
        "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,)}",
        "{'descr': '>f4', 'fortran_order': False, 'shape': (4,)}",
        "{'descr': '<f3', 'fortran_order': False, 'shape': (4,)}",
        "{'descr': '<c8', 'fortran_order': False, 'shape': (2,)}",
        "{'descr': 'f4', 'fortran_order': False, 'shape': (4,)}",
        "{'descr': '<f4 ', 'fortran_order': False, 'shape': (4,)}",
        "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,)}",
        "{'descr': '<f4', 'fortran_order': True, 'shape': (4,)}",
        "{'descr': '<f4', 'fortran_order': 'False', 'shape': (4,)}",
        "{'descr': '<f4', 'fortran_order': Fals, 'shape': (4,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': [4]}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-4,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4.0,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4,,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,4)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (5,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4,)} x",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4,)",
        "{'descr: '<f4', 'fortran_order': False, 'shape': (4,)}",
        "{'descr': '<f4\", 'fortran_order': False, 'shape': (4,)}",
        "{'descr' '<f4', 'fortran_order': False, 'shape': (4,)}",
        "{'descr': '<f4' 'fortran_order': False, 'shape': (4,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4,),,}",
        "{'descr': '<f4\\n', 'fortran_order': False, 'shape': (4,)}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        npy_case(1, bad[i], 16, MUST_REJECT, "npy-bad", (long)i);
    const char *ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }";
    npy_case(1, ok, 16, MUST_ACCEPT, "npy-ok", 0);
    npy_case(2, ok, 16, MUST_ACCEPT, "npy-ok", 1);
    npy_case(3, ok, 16, MUST_ACCEPT, "npy-ok", 2);
    npy_case(4, ok, 16, MUST_REJECT, "npy-version", 0);
    npy_case(0, ok, 16, MUST_REJECT, "npy-version", 1);
    /* header length larger than the file, and not a .npy at all */
    unsigned char buf[64] = "\x93NUMPY\x01\x00\xff\xff{}";
    run_case(read_npy, buf, 12, MUST_REJECT, "npy-len", 0);
    memcpy(buf, "\x93NUMPX", 6);
    run_case(read_npy, buf, 64, MUST_REJECT, "npy-magic", 0);
    /* random dicts: the three keys in a random order, each value right most of the time */
    static const char *keys[] = {"'descr'", "'fortran_order'", "'shape'"};
    static const char *odd_keys[] = {"'x'", "\"shape\"", "'descr", "descr"};
    static const char *descrs[] = {"'<f4'", "'|u1'", "'<i8'", "\"<u2\"", "'<f4", "''", "'<f5'"};
    static const size_t descr_size[] = {4, 1, 8, 2, 0, 0, 0};
    static const char *orders[] = {"False", "False", "True", "false", "0"};
    static const char *shapes[] = {"()",  "(2,)",   "(2, 2)",    "(3,1,)", "(4)",  "(-1,)",
                                   "(2,", "(0, 5)", "( 1 , 2 )", "(2L,)",  "(2 2)"};
    static const size_t shape_numel[] = {1, 2, 4, 3, 0, 0, 0, 0, 2, 2, 0};
    char h[512];
    long accepted = 0;
    for (int c = 0; c < 1500; c++) {
        size_t k = 0, numel = 1, elem = 0;
        int perm[3] = {0, 1, 2}, nkeys = rnd_below(8) ? 3 : (int)rnd_below(5);
        for (int i = 2; i > 0; i--) {
            int j = (int)rnd_below((size_t)i + 1), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        k += (size_t)snprintf(h + k, sizeof h - k, "{");
        for (int i = 0; i < nkeys; i++) {
            int key = perm[i % 3];
            const char *kname = rnd_below(16) ? keys[key] : odd_keys[rnd_below(4)];
            const char *v;
            if (key == 0) {
                size_t d = rnd_below(4) ? rnd_below(4) : rnd_below(7);
                v = descrs[d], elem = descr_size[d];
            } else if (key == 1) {
                v = orders[rnd_below(4) ? 0 : rnd_below(5)];
            } else {
                size_t d = rnd_below(3) ? rnd_below(4) : rnd_below(11);
                v = shapes[d], numel = shape_numel[d];
            }
            k += (size_t)snprintf(h + k, sizeof h - k, "%s: %s%s", kname, v,
                                  (i < nkeys - 1 || rnd_below(2)) ? ", " : "");
        }
        if (rnd_below(16)) k += (size_t)snprintf(h + k, sizeof h - k, "}");
        if (rnd_below(2))
            k += (size_t)snprintf(h + k, sizeof h - k, "%*s\n", (int)rnd_below(40), "");
        size_t data = rnd_below(4) ? numel * elem : rnd_below(20);
        accepted += npy_case(1 + (int)rnd_below(2), h, data, MAY_ACCEPT, "npy-generated", c) == 0;
    }
    printf("  generated .npy headers: %ld of 1500 accepted\n", accepted);
    T_CHECK(accepted >= 10, "the generator should make some valid headers (%ld)", accepted);
}

/* ---- llm.c ---- */

static void test_fuzz_shard(void) {
    char err[512];
    uint16_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = (uint16_t)(i * 4099);
    if (fp8t_shard_write(g_path, tok, 16, err, sizeof err) != 0) T_FAIL("%s", err);
    truncate_and_flip(read_shard, "shard", 1, 12, 1500);
    /* header fields set to extremes */
    int32_t hdr[256 + 8] = {20240520, 1, 16}; /* 16 uint16 tokens = 8 int32 */
    const int32_t extremes[] = {0, -1, 1, 17, 15, INT32_MAX, INT32_MIN, 20240326, 20240520, 2};
    for (int field = 0; field < 3; field++)
        for (size_t e = 0; e < sizeof extremes / sizeof extremes[0]; e++) {
            int32_t h2[256 + 8];
            memcpy(h2, hdr, sizeof hdr);
            h2[field] = extremes[e];
            int valid = h2[0] == 20240520 && h2[1] == 1 && h2[2] == 16;
            run_case(read_shard, h2, sizeof h2, valid ? MUST_ACCEPT : MUST_REJECT, "shard-hdr",
                     field * 100 + (long)e);
        }
}

static void test_fuzz_gpt2(void) {
    char err[512];
    /* maxT 2, V 3, Vp 4, L 1, NH 1, C 2: 8 + 4 + (48 + 26) + 4 = 90 parameters */
    fp8t_llmc_gpt2 ck = {.max_seq_len = 2,
                         .vocab_size = 3,
                         .padded_vocab_size = 4,
                         .num_layers = 1,
                         .num_heads = 1,
                         .channels = 2,
                         .num_params = 90};
    float p[90];
    for (int i = 0; i < 90; i++) p[i] = (float)i - 45.0f;
    ck.params = p;
    for (int version = 3; version <= 5; version += 2) {
        if (fp8t_llmc_gpt2_write(g_path, &ck, version, err, sizeof err) != 0) T_FAIL("%s", err);
        truncate_and_flip(read_gpt2, version == 3 ? "gpt2-v3" : "gpt2-v5", 1, 32, 1500);
    }
    /* every config field at extremes, including overflowing products */
    const int32_t base[8] = {20240326, 3, 2, 3, 1, 1, 2, 4};
    const int32_t extremes[] = {0, -1, 1, 2, 3, 4, 5, 65536, 46341, INT32_MAX, INT32_MIN};
    int32_t *buf = calloc(256 + 90, sizeof(int32_t));
    for (int field = 1; field < 8; field++)
        for (size_t e = 0; e < sizeof extremes / sizeof extremes[0]; e++) {
            memcpy(buf, base, sizeof base);
            buf[field] = extremes[e];
            const int32_t *b = buf;
            int valid = b[1] == 3; /* then the config must be sane and hold 90 parameters */
            for (int i = 2; i < 8; i++) valid &= b[i] > 0 && b[i] <= 1000;
            if (valid) {
                int64_t maxT = b[2], V = b[3], L = b[4], NH = b[5], C = b[6], Vp = b[7];
                valid = Vp >= V && C % NH == 0 &&
                        Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C == 90;
            }
            run_case(read_gpt2, buf, (256 + 90) * sizeof(int32_t),
                     valid ? MUST_ACCEPT : MUST_REJECT, "gpt2-hdr", field * 100 + (long)e);
        }
    free(buf);
}

int main(void) {
    t_suite = "io_fuzz";
    snprintf(g_dir, sizeof g_dir, "/tmp/fp8t_test_io_fuzz_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(g_path, sizeof g_path, "%s/case.bin", g_dir);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    T_RUN(test_fuzz_st_truncate_and_flip);
    T_RUN(test_fuzz_st_malformed_headers);
    T_RUN(test_fuzz_st_generated);
    T_RUN(test_fuzz_npy_truncate_and_flip);
    T_RUN(test_fuzz_npy_malformed_headers);
    T_RUN(test_fuzz_shard);
    T_RUN(test_fuzz_gpt2);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("  %ld cases, %ld rejected, %.2f s\n", g_cases, g_rejected,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    fp8t_rmtree(g_dir);
    T_MAIN_END();
}
