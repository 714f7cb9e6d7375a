/* fp8train — file formats: atomic writes, safetensors, .npy, llm.c shards and checkpoints.
 * Round trips compare bytes; golden byte strings pin the exact layout other tools read. */
#include "fp8train/error.h"
#include "fp8train/fp8.h"
#include "fp8train/io.h"
#include "test.h"

#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static const char *tpath(const char *name) {
    static char buf[8][256];
    static int k = 0;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static int write_raw(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = n ? fwrite(data, 1, n, fp) : 0;
    return (fclose(fp) == 0 && w == n) ? 0 : -1;
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Number of entries in dir whose name contains ".tmp." (leftovers of an atomic write). */
static int count_tmp_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

/* ---- atomic writes and file helpers ---- */

static void test_atomic_write_replaces_whole_file(void) {
    char err[512] = "";
    const char *p = tpath("atomic.bin");
    const char big[] = "the first version of this file is longer than the second";
    T_ASSERT(fp8t_write_file_atomic(p, big, sizeof big, err, sizeof err) == 0, "%s", err);
    T_CHECK(file_size(p) == (long)sizeof big, "size %ld", file_size(p));
    const char small[] = "v2";
    T_ASSERT(fp8t_write_file_atomic(p, small, sizeof small, err, sizeof err) == 0, "%s", err);
    char *data = NULL;
    size_t len = 0;
    T_ASSERT(fp8t_read_file(p, &data, &len, err, sizeof err) == 0, "%s", err);
    T_CHECK(len == sizeof small && memcmp(data, small, len) == 0, "len %zu", len);
    T_CHECK(data[len] == '\0', "not NUL-terminated");
    free(data);
    T_CHECK(count_tmp_files(g_dir) == 0, "%d tmp files left", count_tmp_files(g_dir));
    /* empty file */
    T_ASSERT(fp8t_write_file_atomic(p, NULL, 0, err, sizeof err) == 0, "%s", err);
    T_ASSERT(fp8t_read_file(p, &data, &len, err, sizeof err) == 0, "%s", err);
    T_CHECK(len == 0 && data && data[0] == '\0', "len %zu", len);
    free(data);
}

static void test_atomic_write_failures_leave_nothing(void) {
    char err[512] = "";
    /* directory that does not exist */
    const char *p = tpath("no/such/dir/file.bin");
    T_CHECK(fp8t_write_file_atomic(p, "x", 1, err, sizeof err) == -1, "should fail");
    T_CHECK(strstr(err, "no/such/dir/file.bin") != NULL, "error does not name the file: %s", err);
    /* rename over a non-empty directory fails after the data was written: temp must go */
    const char *d = tpath("occupied");
    err[0] = '\0';
    T_ASSERT(fp8t_mkdirs(tpath("occupied/child"), err, sizeof err) == 0, "%s", err);
    T_CHECK(fp8t_write_file_atomic(d, "abc", 3, err, sizeof err) == -1, "rename over dir");
    T_CHECK(err[0] != '\0', "no message");
    T_CHECK(count_tmp_files(g_dir) == 0, "%d tmp files left", count_tmp_files(g_dir));
    /* the old content of a file survives a failed write */
    char *data;
    size_t len;
    T_CHECK(fp8t_read_file(tpath("missing"), &data, &len, err, sizeof err) == -1 &&
                strstr(err, "missing"),
            "%s", err);
    T_CHECK(fp8t_read_file(d, &data, &len, err, sizeof err) == -1 && strstr(err, "directory"),
            "%s", err);
    fp8t_rmtree(d);
}

static void test_mkdirs_and_rmtree(void) {
    char err[512] = "";
    T_ASSERT(fp8t_mkdirs(tpath("tree/a/b/c/"), err, sizeof err) == 0, "%s", err);
    T_ASSERT(fp8t_mkdirs(tpath("tree/a/b/c"), err, sizeof err) == 0, "again: %s", err);
    T_ASSERT(fp8t_mkdirs(tpath("tree//a//x"), err, sizeof err) == 0, "double slash: %s", err);
    struct stat st;
    T_CHECK(stat(tpath("tree/a/b/c"), &st) == 0 && S_ISDIR(st.st_mode), "not created");
    T_ASSERT(fp8t_write_file_atomic(tpath("tree/a/file"), "x", 1, err, sizeof err) == 0, "%s",
             err);
    T_ASSERT(fp8t_write_file_atomic(tpath("tree/a/b/c/deep"), "y", 1, err, sizeof err) == 0, "%s",
             err);
    err[0] = '\0';
    T_CHECK(fp8t_mkdirs(tpath("tree/a/file/sub"), err, sizeof err) == -1, "through a file");
    T_CHECK(strstr(err, "not a directory") != NULL, "%s", err);
    /* a symlink inside the tree must be removed, not followed */
    T_ASSERT(fp8t_mkdirs(tpath("keep"), err, sizeof err) == 0, "%s", err);
    T_ASSERT(fp8t_write_file_atomic(tpath("keep/precious"), "z", 1, err, sizeof err) == 0, "%s",
             err);
    T_ASSERT(symlink(tpath("keep"), tpath("tree/a/link")) == 0, "symlink");
    T_CHECK(fp8t_rmtree(tpath("tree")) == 0, "rmtree failed");
    T_CHECK(stat(tpath("tree"), &st) != 0, "tree still there");
    T_CHECK(stat(tpath("keep/precious"), &st) == 0, "rmtree followed a symlink");
    T_CHECK(fp8t_rmtree(tpath("tree")) == 0, "rmtree of a missing path is not an error");
    T_CHECK(fp8t_rmtree(tpath("keep")) == 0, "rmtree keep");
}

/* ---- safetensors ---- */

static void test_st_roundtrip(void) {
    char err[512] = "";
    const char *p = tpath("model.safetensors");
    float w[2][3] = {{1, 2, 3}, {-4.5f, 1e-30f, 3e38f}};      /* [2, 3] */
    uint16_t h[5] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000}; /* [5] F16 */
    uint8_t q[3] = {0x38, 0xB8, 0x7E};                        /* [3] E4M3 */
    int64_t ids[2] = {-1, INT64_MAX};                         /* [2] I64 */
    double dd[1] = {0.1};                                     /* [] F64 scalar */
    int64_t sw[2] = {2, 3}, sh[1] = {5}, sq[1] = {3}, si[1] = {2}, se[2] = {0, 7};
    fp8t_st_writer *wr = fp8t_st_writer_new();
    T_ASSERT(wr, "writer_new");
    fp8t_st_writer_add(wr, "h.0.attn.w", FP8T_ST_F32, 2, sw, w);
    fp8t_st_writer_add(wr, "half", FP8T_ST_F16, 1, sh, h);
    fp8t_st_writer_add(wr, "fp8", FP8T_ST_F8_E4M3, 1, sq, q);
    fp8t_st_writer_add(wr, "ids", FP8T_ST_I64, 1, si, ids);
    fp8t_st_writer_add(wr, "scalar", FP8T_ST_F64, 0, NULL, dd);
    fp8t_st_writer_add(wr, "empty", FP8T_ST_BF16, 2, se, NULL);
    fp8t_st_writer_metadata(wr, "format", "pt");
    fp8t_st_writer_metadata(wr, "odd \"key\"", "tab\there, backslash \\, newline\n, caf\xc3\xa9");
    fp8t_st_writer_metadata(wr, "format", "pt2"); /* replaces */
    T_ASSERT(fp8t_st_writer_save(wr, p, err, sizeof err) == 0, "%s", err);
    fp8t_st_writer_free(wr);
    T_CHECK(count_tmp_files(g_dir) == 0, "tmp file left");

    fp8t_st_file *f = NULL;
    T_ASSERT(fp8t_st_open(&f, p, err, sizeof err) == 0, "%s", err);
    T_CHECK(fp8t_st_count(f) == 6, "count %d", fp8t_st_count(f));
    const char *names[6] = {"h.0.attn.w", "half", "fp8", "ids", "scalar", "empty"};
    const fp8t_st_dtype types[6] = {FP8T_ST_F32, FP8T_ST_F16, FP8T_ST_F8_E4M3,
                                    FP8T_ST_I64, FP8T_ST_F64, FP8T_ST_BF16};
    const void *datas[6] = {w, h, q, ids, dd, NULL};
    const size_t bytes[6] = {sizeof w, sizeof h, sizeof q, sizeof ids, sizeof dd, 0};
    const int ndims[6] = {2, 1, 1, 1, 0, 2};
    for (int i = 0; i < 6; i++) {
        const fp8t_st_tensor *t = fp8t_st_get(f, i);
        T_ASSERT(t, "get %d", i);
        T_CHECK(strcmp(t->name, names[i]) == 0, "order: %d is %s", i, t->name);
        T_CHECK(fp8t_st_find(f, names[i]) == t, "find %s", names[i]);
        T_CHECK(t->dtype == types[i], "%s dtype %d", names[i], (int)t->dtype);
        T_CHECK(t->ndim == ndims[i], "%s ndim %d", names[i], t->ndim);
        T_CHECK(t->end - t->begin == bytes[i], "%s bytes", names[i]);
        T_CHECK(t->begin % fp8t_st_dtype_size(t->dtype) == 0, "%s misaligned at %llu", names[i],
                (unsigned long long)t->begin);
        if (bytes[i])
            T_CHECK(memcmp(fp8t_st_data(f, t), datas[i], bytes[i]) == 0, "%s data", names[i]);
    }
    const fp8t_st_tensor *t = fp8t_st_find(f, "h.0.attn.w");
    T_CHECK(t && t->shape[0] == 2 && t->shape[1] == 3 && t->numel == 6, "shape");
    t = fp8t_st_find(f, "empty");
    T_CHECK(t && t->shape[0] == 0 && t->shape[1] == 7 && t->numel == 0, "empty shape");
    t = fp8t_st_find(f, "scalar");
    T_CHECK(t && t->numel == 1, "0-d numel");
    T_CHECK(fp8t_st_find(f, "nope") == NULL && fp8t_st_get(f, 6) == NULL &&
                fp8t_st_get(f, -1) == NULL,
            "missing lookups");
    T_CHECK(fp8t_st_metadata(f, "format") && strcmp(fp8t_st_metadata(f, "format"), "pt2") == 0,
            "metadata format");
    const char *odd = fp8t_st_metadata(f, "odd \"key\"");
    T_CHECK(odd && strcmp(odd, "tab\there, backslash \\, newline\n, caf\xc3\xa9") == 0,
            "escaped metadata: %s", odd ? odd : "(null)");
    T_CHECK(fp8t_st_metadata(f, "absent") == NULL, "absent metadata");
    fp8t_st_close(f);

    /* The layout rules the reference reader enforces: header length a multiple of 8, tensors
     * contiguous and covering the whole data section. */
    char *raw;
    size_t len;
    T_ASSERT(fp8t_read_file(p, &raw, &len, err, sizeof err) == 0, "%s", err);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)(uint8_t)raw[i] << (8 * i);
    T_CHECK(n % 8 == 0, "header length %llu", (unsigned long long)n);
    size_t total = 0;
    for (int i = 0; i < 6; i++) total += bytes[i];
    T_CHECK(len == 8 + n + total, "file %zu bytes, want %zu", len, (size_t)(8 + n + total));
    T_CHECK(raw[8] == '{', "header starts with %c", raw[8]);
    free(raw);
}

/* The exact bytes for a tiny file, as Python's safetensors writes them (modulo its key order):
 * a reader elsewhere depends on this layout. */
/* add copies the data at the call; add_ref borrows it until save: both write the same bytes for
 * the same data, and a change made between add and save reaches the file only through add_ref. */
static void test_st_add_ref_borrows(void) {
    char err[512] = "";
    float a[4] = {1, 2, 3, 4}, b[3] = {-1, 0.5f, 7};
    int64_t sa[1] = {4}, sb[1] = {3};
    const char *pc = tpath("copied.safetensors"), *pr = tpath("borrowed.safetensors");
    fp8t_st_writer *wc = fp8t_st_writer_new(), *wr = fp8t_st_writer_new();
    T_ASSERT(wc && wr, "writer_new");
    fp8t_st_writer_add(wc, "a", FP8T_ST_F32, 1, sa, a);
    fp8t_st_writer_add(wc, "b", FP8T_ST_F32, 1, sb, b);
    fp8t_st_writer_add_ref(wr, "a", FP8T_ST_F32, 1, sa, a);
    fp8t_st_writer_add_ref(wr, "b", FP8T_ST_F32, 1, sb, b);
    T_ASSERT(fp8t_st_writer_save(wc, pc, err, sizeof err) == 0, "%s", err);
    T_ASSERT(fp8t_st_writer_save(wr, pr, err, sizeof err) == 0, "%s", err);
    char *dc = NULL, *dr = NULL;
    size_t nc = 0, nr = 0;
    T_ASSERT(fp8t_read_file(pc, &dc, &nc, err, sizeof err) == 0, "%s", err);
    T_ASSERT(fp8t_read_file(pr, &dr, &nr, err, sizeof err) == 0, "%s", err);
    T_CHECK(nc == nr && memcmp(dc, dr, nc) == 0, "add and add_ref wrote different files");
    free(dc), free(dr);
    /* change the source after adding: only the borrowing writer sees it */
    b[1] = 42;
    T_ASSERT(fp8t_st_writer_save(wc, pc, err, sizeof err) == 0, "%s", err);
    T_ASSERT(fp8t_st_writer_save(wr, pr, err, sizeof err) == 0, "%s", err);
    fp8t_st_writer_free(wc);
    fp8t_st_writer_free(wr);
    float got[3];
    fp8t_st_file *f = NULL;
    T_ASSERT(fp8t_st_open(&f, pc, err, sizeof err) == 0, "%s", err);
    T_CHECK(fp8t_st_read_f32(f, "b", got, 3, err, sizeof err) == 0 && got[1] == 0.5f,
            "the copying writer saw a later change: %g", got[1]);
    fp8t_st_close(f);
    T_ASSERT(fp8t_st_open(&f, pr, err, sizeof err) == 0, "%s", err);
    T_CHECK(fp8t_st_read_f32(f, "b", got, 3, err, sizeof err) == 0 && got[1] == 42.0f,
            "the borrowing writer did not write the buffer as it was at save: %g", got[1]);
    fp8t_st_close(f);
}

static void test_st_golden_bytes(void) {
    char err[512] = "";
    const char *p = tpath("golden.safetensors");
    float v[2] = {1.0f, -2.0f};
    int64_t s[1] = {2};
    fp8t_st_writer *wr = fp8t_st_writer_new();
    fp8t_st_writer_add(wr, "w", FP8T_ST_F32, 1, s, v);
    fp8t_st_writer_metadata(wr, "format", "pt");
    T_ASSERT(fp8t_st_writer_save(wr, p, err, sizeof err) == 0, "%s", err);
    fp8t_st_writer_free(wr);
    const char json[] =
        "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2],"
        "\"data_offsets\":[0,8]}}";
    size_t jn = strlen(json), padded = (jn + 7) / 8 * 8;
    unsigned char want[256] = {0};
    want[0] = (unsigned char)padded;
    memcpy(want + 8, json, jn);
    memset(want + 8 + jn, ' ', padded - jn);
    memcpy(want + 8 + padded, v, 8);
    char *raw;
    size_t len;
    T_ASSERT(fp8t_read_file(p, &raw, &len, err, sizeof err) == 0, "%s", err);
    T_CHECK(len == 16 + padded && memcmp(raw, want, len) == 0, "bytes differ (len %zu): %.*s",
            len, (int)(len > 8 ? len - 8 : 0), raw + 8);
    free(raw);

    /* and a foreign file with extra whitespace and another key order reads fine */
    const char foreign[] =
        "{ \"b\" : {\"data_offsets\":[0,2],\"shape\":[1,1],\"dtype\":\"BF16\"} ,"
        "\n \"__metadata__\": {} }";
    unsigned char buf[256] = {0};
    size_t fn = strlen(foreign);
    buf[0] = (unsigned char)fn;
    memcpy(buf + 8, foreign, fn);
    buf[8 + fn] = 0x80, buf[9 + fn] = 0x3F; /* BF16 1.0 */
    T_ASSERT(write_raw(tpath("foreign.safetensors"), buf, 8 + fn + 2) == 0, "write");
    fp8t_st_file *f;
    T_ASSERT(fp8t_st_open(&f, tpath("foreign.safetensors"), err, sizeof err) == 0, "%s", err);
    float out = 0;
    T_CHECK(fp8t_st_read_f32(f, "b", &out, 1, err, sizeof err) == 0 && out == 1.0f, "%s %g", err,
            out);
    fp8t_st_close(f);
}

static void test_st_read_f32_conversions(void) {
    char err[512] = "";
    const char *p = tpath("conv.safetensors");
    /* hand-encoded bit patterns with known values (independent of any encoder) */
    uint16_t bf[4] = {0x3F80, 0xC000, 0x4049, 0x0001}; /* 1, -2, 3.140625, 2^-133 */
    uint16_t hf[8] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00, 0x8000, 0x3555, 0x7E00};
    uint8_t e4[5] = {0x38, 0xB8, 0x7E, 0x01, 0x40}; /* 1, -1, 448, 2^-9, 2 */
    uint8_t e5[4] = {0x3C, 0x7B, 0x01, 0x7C};       /* 1, 57344, 2^-16, inf */
    double f64[2] = {0.5, -1e300};
    int32_t i32[1] = {7};
    int64_t s4[1] = {4}, s8[1] = {8}, s5[1] = {5}, s2[2] = {2, 1}, s1[1] = {1};
    fp8t_st_writer *wr = fp8t_st_writer_new();
    fp8t_st_writer_add(wr, "bf", FP8T_ST_BF16, 1, s4, bf);
    fp8t_st_writer_add(wr, "hf", FP8T_ST_F16, 1, s8, hf);
    fp8t_st_writer_add(wr, "e4", FP8T_ST_F8_E4M3, 1, s5, e4);
    fp8t_st_writer_add(wr, "e5", FP8T_ST_F8_E5M2, 1, s4, e5);
    fp8t_st_writer_add(wr, "f64", FP8T_ST_F64, 2, s2, f64);
    fp8t_st_writer_add(wr, "i32", FP8T_ST_I32, 1, s1, i32);
    T_ASSERT(fp8t_st_writer_save(wr, p, err, sizeof err) == 0, "%s", err);
    fp8t_st_writer_free(wr);
    fp8t_st_file *f;
    T_ASSERT(fp8t_st_open(&f, p, err, sizeof err) == 0, "%s", err);
    float o[8];
    T_ASSERT(fp8t_st_read_f32(f, "bf", o, 4, err, sizeof err) == 0, "%s", err);
    T_CHECK(o[0] == 1.0f && o[1] == -2.0f && o[2] == 3.140625f && o[3] == ldexpf(1, -133),
            "bf16 %g %g %g %g", o[0], o[1], o[2], o[3]);
    T_ASSERT(fp8t_st_read_f32(f, "hf", o, 8, err, sizeof err) == 0, "%s", err);
    T_CHECK(o[0] == 1.0f && o[1] == -2.0f && o[2] == 65504.0f && o[3] == ldexpf(1, -24) &&
                isinf(o[4]) && o[4] > 0 && o[5] == 0 && signbit(o[5]) &&
                o[6] == 0.333251953125f && isnan(o[7]),
            "f16 %g %g %g %g %g %g %g %g", o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]);
    T_ASSERT(fp8t_st_read_f32(f, "e4", o, 5, err, sizeof err) == 0, "%s", err);
    T_CHECK(o[0] == 1.0f && o[1] == -1.0f && o[2] == 448.0f && o[3] == ldexpf(1, -9) &&
                o[4] == 2.0f,
            "e4m3 %g %g %g %g %g", o[0], o[1], o[2], o[3], o[4]);
    T_ASSERT(fp8t_st_read_f32(f, "e5", o, 4, err, sizeof err) == 0, "%s", err);
    T_CHECK(o[0] == 1.0f && o[1] == 57344.0f && o[2] == ldexpf(1, -16) && isinf(o[3]),
            "e5m2 %g %g %g %g", o[0], o[1], o[2], o[3]);
    T_ASSERT(fp8t_st_read_f32(f, "f64", o, 2, err, sizeof err) == 0, "%s", err);
    T_CHECK(o[0] == 0.5f && isinf(o[1]) && o[1] < 0, "f64 %g %g", o[0], o[1]);
    /* errors name the tensor, the file and both sizes */
    err[0] = '\0';
    T_CHECK(fp8t_st_read_f32(f, "bf", o, 5, err, sizeof err) == -1, "numel mismatch accepted");
    T_CHECK(strstr(err, "'bf'") && strstr(err, "conv.safetensors") && strstr(err, " 4 ") &&
                strstr(err, " 5 "),
            "%s", err);
    err[0] = '\0';
    T_CHECK(fp8t_st_read_f32(f, "absent", o, 1, err, sizeof err) == -1 && strstr(err, "absent"),
            "%s", err);
    err[0] = '\0';
    T_CHECK(fp8t_st_read_f32(f, "i32", o, 1, err, sizeof err) == -1 && strstr(err, "I32"), "%s",
            err);
    fp8t_st_close(f);
}

static void test_st_writer_rejects_bad_input(void) {
    struct {
        const char *why;
        const char *name;
        int dtype, ndim;
        int64_t dim;
    } cases[] = {
        {"duplicate", "a", FP8T_ST_F32, 1, 1},
        {"bad dtype", "b", 99, 1, 1},
        {"9 dims", "c", FP8T_ST_F32, 9, 1},
        {"negative dim", "d", FP8T_ST_F32, 1, -3},
        {"reserved", "__metadata__", FP8T_ST_F32, 1, 1},
        {"bad utf-8", "\xff\xfe", FP8T_ST_F32, 1, 1},
    };
    float data[16] = {0};
    int64_t shape[9];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char err[512] = "";
        for (int i = 0; i < 9; i++) shape[i] = cases[c].dim;
        fp8t_st_writer *wr = fp8t_st_writer_new();
        fp8t_st_writer_add(wr, "a", FP8T_ST_F32, 1, shape, data);
        fp8t_st_writer_add(wr, cases[c].name, (fp8t_st_dtype)cases[c].dtype, cases[c].ndim, shape,
                           data);
        const char *p = tpath("bad.safetensors");
        T_CHECK(fp8t_st_writer_save(wr, p, err, sizeof err) == -1, "%s accepted", cases[c].why);
        T_CHECK(strstr(err, "bad.safetensors") != NULL, "%s: %s", cases[c].why, err);
        T_CHECK(file_size(p) == -1, "%s: file written", cases[c].why);
        fp8t_st_writer_free(wr);
    }
    char err[512] = "";
    T_CHECK(fp8t_st_writer_save(NULL, tpath("x.safetensors"), err, sizeof err) == -1 && err[0],
            "NULL writer");
}

static void test_st_open_errors_name_file(void) {
    char err[512] = "";
    fp8t_st_file *f = (fp8t_st_file *)1;
    T_CHECK(fp8t_st_open(&f, tpath("absent.safetensors"), err, sizeof err) == -1 && f == NULL,
            "missing file");
    T_CHECK(strstr(err, "absent.safetensors") != NULL, "%s", err);
    /* a tensor whose offsets lie past the data: error names both file and tensor */
    const char hdr[] = "{\"weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    unsigned char buf[128] = {0};
    size_t n = strlen(hdr);
    buf[0] = (unsigned char)n;
    memcpy(buf + 8, hdr, n);
    T_ASSERT(write_raw(tpath("short.safetensors"), buf, 8 + n + 12) == 0, "write");
    T_CHECK(fp8t_st_open(&f, tpath("short.safetensors"), err, sizeof err) == -1, "accepted");
    T_CHECK(strstr(err, "short.safetensors") && strstr(err, "'weight'"), "%s", err);
}

/* ---- .npy ---- */

static void test_npy_roundtrip_shapes(void) {
    char err[512] = "";
    float x[24];
    for (int i = 0; i < 24; i++) x[i] = (float)i * 0.25f - 3.0f;
    struct {
        int ndim;
        int64_t shape[3];
        const char *text;
    } cases[] = {
        {0, {0}, "'shape': ()"},        {1, {5}, "'shape': (5,)"},
        {2, {3, 4}, "'shape': (3, 4)"}, {3, {2, 3, 4}, "'shape': (2, 3, 4)"},
        {1, {0}, "'shape': (0,)"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *p = tpath("a.npy");
        T_ASSERT(fp8t_npy_write(p, "<f4", cases[c].ndim, cases[c].shape, x, err, sizeof err) == 0,
                 "%s", err);
        size_t numel = 1;
        for (int i = 0; i < cases[c].ndim; i++) numel *= (size_t)cases[c].shape[i];
        char *raw;
        size_t len;
        T_ASSERT(fp8t_read_file(p, &raw, &len, err, sizeof err) == 0, "%s", err);
        size_t hlen = (uint8_t)raw[8] | ((size_t)(uint8_t)raw[9] << 8);
        T_CHECK(memcmp(raw, "\x93NUMPY\x01\x00", 8) == 0, "magic/version");
        T_CHECK((10 + hlen) % 64 == 0 && raw[10 + hlen - 1] == '\n', "header padding (%zu)",
                hlen);
        T_CHECK(len == 10 + hlen + 4 * numel, "file length %zu", len);
        T_CHECK(memcmp(raw + 10, "{'descr': '<f4', 'fortran_order': False, ", 41) == 0 &&
                    strstr(raw + 10, cases[c].text),
                "header %.*s", (int)hlen, raw + 10);
        free(raw);
        char descr[16];
        int ndim = -1;
        int64_t shape[8];
        void *data = NULL;
        size_t nbytes = 0;
        T_ASSERT(fp8t_npy_read(p, descr, &ndim, shape, &data, &nbytes, err, sizeof err) == 0,
                 "%s", err);
        T_CHECK(strcmp(descr, "<f4") == 0 && ndim == cases[c].ndim && nbytes == 4 * numel,
                "descr %s ndim %d nbytes %zu", descr, ndim, nbytes);
        for (int i = 0; i < ndim; i++) T_CHECK(shape[i] == cases[c].shape[i], "dim %d", i);
        T_CHECK(data && (numel == 0 || memcmp(data, x, 4 * numel) == 0), "data differs");
        free(data);
    }
    T_CHECK(count_tmp_files(g_dir) == 0, "tmp left");
}

static void test_npy_dtypes_and_foreign_headers(void) {
    char err[512] = "";
    uint8_t u8[3] = {1, 2, 255};
    int64_t s3[1] = {3};
    const char *p = tpath("u8.npy");
    T_ASSERT(fp8t_npy_write(p, "|u1", 1, s3, u8, err, sizeof err) == 0, "%s", err);
    char descr[16];
    int ndim;
    int64_t shape[8];
    void *data;
    size_t nbytes;
    T_ASSERT(fp8t_npy_read(p, descr, &ndim, shape, &data, &nbytes, err, sizeof err) == 0, "%s",
             err);
    T_CHECK(strcmp(descr, "|u1") == 0 && nbytes == 3 && memcmp(data, u8, 3) == 0, "u8");
    free(data);
    err[0] = '\0';
    T_CHECK(fp8t_npy_write(p, "<c8", 1, s3, u8, err, sizeof err) == -1 && strstr(err, "<c8"),
            "complex accepted: %s", err);

    /* version 2.0, double quotes, another key order, Python 2 long */
    const char h2[] = "{\"shape\": (2L, 1), \"fortran_order\": False, \"descr\": \"<i4\"}";
    unsigned char buf[256] = {0};
    memcpy(buf, "\x93NUMPY\x02\x00", 8);
    size_t hl = strlen(h2);
    buf[8] = (unsigned char)hl;
    memcpy(buf + 12, h2, hl);
    int32_t v[2] = {-7, 9};
    memcpy(buf + 12 + hl, v, 8);
    T_ASSERT(write_raw(tpath("v2.npy"), buf, 12 + hl + 8) == 0, "write");
    T_ASSERT(
        fp8t_npy_read(tpath("v2.npy"), descr, &ndim, shape, &data, &nbytes, err, sizeof err) == 0,
        "%s", err);
    T_CHECK(strcmp(descr, "<i4") == 0 && ndim == 2 && shape[0] == 2 && shape[1] == 1 &&
                memcmp(data, v, 8) == 0,
            "v2 read");
    free(data);

    /* fortran order is refused with a hint */
    const char hf[] = "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }";
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    hl = strlen(hf);
    buf[8] = (unsigned char)hl, buf[9] = 0;
    memcpy(buf + 10, hf, hl);
    T_ASSERT(write_raw(tpath("fortran.npy"), buf, 10 + hl + 4) == 0, "write");
    err[0] = '\0';
    T_CHECK(fp8t_npy_read(tpath("fortran.npy"), descr, &ndim, shape, &data, &nbytes, err,
                          sizeof err) == -1 &&
                strstr(err, "Fortran") && strstr(err, "fortran.npy"),
            "%s", err);
}

/* ---- llm.c token shards ---- */

static void test_shard_roundtrip_and_errors(void) {
    char err[512] = "";
    enum { N = 1000 };
    uint16_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)(i * 7919u);
    const char *p = tpath("shard.bin");
    T_ASSERT(fp8t_shard_write(p, tok, N, err, sizeof err) == 0, "%s", err);
    T_CHECK(file_size(p) == 1024 + 2 * N, "size %ld", file_size(p));
    char *raw;
    size_t len;
    T_ASSERT(fp8t_read_file(p, &raw, &len, err, sizeof err) == 0, "%s", err);
    int32_t hdr[3];
    memcpy(hdr, raw, sizeof hdr);
    T_CHECK(hdr[0] == 20240520 && hdr[1] == 1 && hdr[2] == N, "header %d %d %d", hdr[0], hdr[1],
            hdr[2]);
    uint16_t *t = NULL;
    size_t n = 0;
    T_ASSERT(fp8t_shard_read(p, &t, &n, err, sizeof err) == 0, "%s", err);
    T_CHECK(n == N && memcmp(t, tok, sizeof tok) == 0, "tokens differ");
    free(t);

    /* truncated by 3 tokens */
    T_ASSERT(write_raw(tpath("trunc.bin"), raw, len - 6) == 0, "write");
    err[0] = '\0';
    T_CHECK(fp8t_shard_read(tpath("trunc.bin"), &t, &n, err, sizeof err) == -1 && t == NULL,
            "truncated accepted");
    T_CHECK(strstr(err, "trunc.bin: truncated: header says 1000 tokens, file holds 997"), "%s",
            err);
    /* wrong magic */
    raw[0] = 1, raw[1] = raw[2] = raw[3] = 0;
    T_ASSERT(write_raw(tpath("magic.bin"), raw, len) == 0, "write");
    err[0] = '\0';
    T_CHECK(fp8t_shard_read(tpath("magic.bin"), &t, &n, err, sizeof err) == -1, "bad magic");
    T_CHECK(strstr(err, "magic.bin is not an llm.c token shard (magic 1, expected 20240520)"),
            "%s", err);
    free(raw);

    /* empty shard */
    T_ASSERT(fp8t_shard_write(p, NULL, 0, err, sizeof err) == 0, "%s", err);
    T_ASSERT(fp8t_shard_read(p, &t, &n, err, sizeof err) == 0, "%s", err);
    T_CHECK(n == 0 && t != NULL, "empty");
    free(t);
}

/* ---- llm.c GPT-2 checkpoints ---- */

static fp8t_llmc_gpt2 tiny_gpt2(void) {
    fp8t_llmc_gpt2 ck = {.max_seq_len = 4,
                         .vocab_size = 5,
                         .padded_vocab_size = 8,
                         .num_layers = 2,
                         .num_heads = 2,
                         .channels = 4,
                         .version = 3};
    /* wte 8*4 + wpe 4*4 + 2 * (12*16 + 13*4) + 2*4 */
    ck.num_params = 32 + 16 + 2 * (192 + 52) + 8;
    ck.params = malloc(ck.num_params * sizeof(float));
    for (size_t i = 0; i < ck.num_params; i++)
        ck.params[i] = sinf((float)i * 0.37f) * (1.0f + (float)(i % 7));
    return ck;
}

static void test_gpt2_roundtrip(void) {
    char err[512] = "";
    fp8t_llmc_gpt2 ck = tiny_gpt2(), back;
    const char *p = tpath("gpt2.bin");
    T_ASSERT(fp8t_llmc_gpt2_write(p, &ck, 3, err, sizeof err) == 0, "%s", err);
    T_CHECK(file_size(p) == (long)(1024 + 4 * ck.num_params), "v3 size %ld", file_size(p));
    char *raw;
    size_t len;
    T_ASSERT(fp8t_read_file(p, &raw, &len, err, sizeof err) == 0, "%s", err);
    int32_t hdr[8];
    memcpy(hdr, raw, sizeof hdr);
    T_CHECK(hdr[0] == 20240326 && hdr[1] == 3 && hdr[2] == 4 && hdr[3] == 5 && hdr[4] == 2 &&
                hdr[5] == 2 && hdr[6] == 4 && hdr[7] == 8,
            "header %d %d %d %d %d %d %d %d", hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], hdr[5],
            hdr[6], hdr[7]);
    T_CHECK(memcmp(raw + 1024, ck.params, 4 * ck.num_params) == 0, "v3 payload");
    free(raw);
    T_ASSERT(fp8t_llmc_gpt2_read(p, &back, err, sizeof err) == 0, "%s", err);
    T_CHECK(back.version == 3 && back.num_params == ck.num_params && back.max_seq_len == 4 &&
                back.vocab_size == 5 && back.padded_vocab_size == 8 && back.num_layers == 2 &&
                back.num_heads == 2 && back.channels == 4,
            "config");
    T_CHECK(memcmp(back.params, ck.params, 4 * ck.num_params) == 0, "v3 params differ");
    fp8t_llmc_gpt2_free(&back);
    T_CHECK(back.params == NULL, "free");

    T_ASSERT(fp8t_llmc_gpt2_write(p, &ck, 5, err, sizeof err) == 0, "%s", err);
    T_CHECK(file_size(p) == (long)(1024 + 2 * ck.num_params), "v5 size %ld", file_size(p));
    T_ASSERT(fp8t_llmc_gpt2_read(p, &back, err, sizeof err) == 0, "%s", err);
    T_CHECK(back.version == 5, "version %d", back.version);
    size_t bad = 0;
    for (size_t i = 0; i < ck.num_params; i++) {
        float want = bf16_decode(bf16_encode(ck.params[i]));
        if (back.params[i] != want ||
            fabsf(back.params[i] - ck.params[i]) > fabsf(ck.params[i]) * 0x1p-8f)
            bad++;
    }
    T_CHECK(bad == 0, "%zu bf16 params wrong", bad);
    fp8t_llmc_gpt2_free(&back);

    /* writer validation */
    err[0] = '\0';
    T_CHECK(fp8t_llmc_gpt2_write(p, &ck, 4, err, sizeof err) == -1 && err[0], "version 4");
    ck.num_params--;
    err[0] = '\0';
    T_CHECK(fp8t_llmc_gpt2_write(p, &ck, 3, err, sizeof err) == -1 && strstr(err, "parameters"),
            "%s", err);
    ck.num_params++;
    ck.num_heads = 3;
    err[0] = '\0';
    T_CHECK(fp8t_llmc_gpt2_write(p, &ck, 3, err, sizeof err) == -1 && strstr(err, "divisible"),
            "%s", err);
    free(ck.params);
}

/* The parameter count of the real GPT-2 124M config, from a header-only file: llm.c reports
 * 124475904 parameters for it. */
static void test_gpt2_124m_param_count(void) {
    char err[512] = "";
    int32_t hdr[256] = {20240326, 3, 1024, 50257, 12, 12, 768, 50304};
    T_ASSERT(write_raw(tpath("gpt2_124M_header.bin"), hdr, sizeof hdr) == 0, "write");
    fp8t_llmc_gpt2 ck;
    T_CHECK(fp8t_llmc_gpt2_read(tpath("gpt2_124M_header.bin"), &ck, err, sizeof err) == -1,
            "accepted a header-only file");
    T_CHECK(strstr(err, "needs 124475904 fp32 parameters") && strstr(err, "truncated"), "%s",
            err);
    T_CHECK(ck.params == NULL, "params left");
    /* a shard is not a checkpoint, and the message says what it is */
    hdr[0] = 20240520;
    T_ASSERT(write_raw(tpath("gpt2_wrong.bin"), hdr, sizeof hdr) == 0, "write");
    err[0] = '\0';
    T_CHECK(fp8t_llmc_gpt2_read(tpath("gpt2_wrong.bin"), &ck, err, sizeof err) == -1 &&
                strstr(err, "token shard"),
            "%s", err);
}

/* fp8t_errorf formats, truncates to the buffer, tolerates no buffer, and returns -1. */
static void test_errorf(void) {
    char e[16];
    memset(e, 'x', sizeof(e));
    T_CHECK(fp8t_errorf(e, sizeof(e), "%s: %d", "abc", 42) == -1 && !strcmp(e, "abc: 42"),
            "got '%s'", e);
    T_CHECK(fp8t_errorf(e, 8, "%s", "0123456789") == -1 && !strcmp(e, "0123456"), "got '%s'", e);
    memset(e, 'x', sizeof(e));
    T_CHECK(fp8t_errorf(e, 0, "%s", "lost") == -1 && e[0] == 'x', "wrote with errlen 0");
    T_CHECK(fp8t_errorf(NULL, 64, "%s", "lost") == -1, "NULL err");
}

int main(void) {
    t_suite = "io";
    snprintf(g_dir, sizeof g_dir, "/tmp/fp8t_test_io_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    T_RUN(test_errorf);
    T_RUN(test_atomic_write_replaces_whole_file);
    T_RUN(test_atomic_write_failures_leave_nothing);
    T_RUN(test_mkdirs_and_rmtree);
    T_RUN(test_st_roundtrip);
    T_RUN(test_st_add_ref_borrows);
    T_RUN(test_st_golden_bytes);
    T_RUN(test_st_read_f32_conversions);
    T_RUN(test_st_writer_rejects_bad_input);
    T_RUN(test_st_open_errors_name_file);
    T_RUN(test_npy_roundtrip_shapes);
    T_RUN(test_npy_dtypes_and_foreign_headers);
    T_RUN(test_shard_roundtrip_and_errors);
    T_RUN(test_gpt2_roundtrip);
    T_RUN(test_gpt2_124m_param_count);
    fp8t_rmtree(g_dir);
    T_MAIN_END();
}
