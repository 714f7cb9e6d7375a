/* fp8train — llm.c formats: token shards and GPT-2 checkpoints.
 *
 * Both start with a 256 x int32 little-endian header.
 *   token shard:     [0] = 20240520, [1] = 1, [2] = token count; then uint16 tokens
 *                    (Llama-3 vocabularies: [0] = 20240801, [1] = 7; then uint32 tokens)
 *   GPT-2 checkpoint:[0] = 20240326, [1] = 3 (fp32) or 5 (bf16), [2] maxT, [3] V, [4] L,
 *                    [5] NH, [6] C, [7] Vp (padded vocab); then the parameters in llm.c order
 * The file size must match the header exactly, as llm.c itself requires. */
#include "fp8train/fp8.h"
#include "fp8train/io.h"
#include "io/io_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LLMC_HEADER_INTS 256
#define LLMC_HEADER_BYTES (LLMC_HEADER_INTS * 4)
#define LLMC_SHARD_MAGIC 20240520
#define LLMC_SHARD_VERSION 1
#define LLMC_SHARD32_MAGIC 20240801 /* llm.c's Llama-3 shards: uint32 tokens */
#define LLMC_SHARD32_VERSION 7
#define LLMC_GPT2_MAGIC 20240326
#define LLMC_CHUNK 65536 /* elements converted per write/read step for bf16 */

static int32_t header_int(const uint8_t *hdr, int i) {
    uint32_t u = fp8t_load_le32(hdr + 4 * i);
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static void header_set(uint8_t *hdr, int i, int32_t v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    fp8t_store_le32(hdr + 4 * i, u);
}

static const char *magic_hint(int32_t magic) {
    if (magic == LLMC_SHARD_MAGIC) return " (this is an llm.c token shard)";
    if (magic == LLMC_GPT2_MAGIC) return " (this is an llm.c GPT-2 checkpoint)";
    return "";
}

/* Opens path and reads the 1024-byte header. Returns the fd, or -1 with err filled. */
static int open_with_header(const char *path, const char *what, uint8_t hdr[LLMC_HEADER_BYTES],
                            uint64_t *size, char *err, size_t errlen) {
    if (!path || !*path) {
        fp8t_errorf(err, errlen, "cannot read an %s with an empty path", what);
        return -1;
    }
    int fd = fp8t_open_regular(path, size, err, errlen);
    if (fd < 0) return -1;
    if (*size < LLMC_HEADER_BYTES) {
        fp8t_errorf(err, errlen, "%s is not an %s: %llu bytes, smaller than the %d-byte header",
                    path, what, (unsigned long long)*size, LLMC_HEADER_BYTES);
        close(fd);
        return -1;
    }
    long long got = fp8t_read_full(fd, hdr, LLMC_HEADER_BYTES);
    if (got != LLMC_HEADER_BYTES) {
        fp8t_errorf(err, errlen, "cannot read the header of %s: %s", path,
                    got < 0 ? strerror(errno) : "file shrank");
        close(fd);
        return -1;
    }
    return fd;
}

/* ======================================================================================
 * Token shards
 * ====================================================================================== */

/* Reads a shard of either kind: GPT-2's (uint16 tokens) or Llama-3's (uint32). want32: the
 * caller takes uint32 tokens (GPT-2 shards are widened); otherwise only uint16 shards. */
static int shard_read(const char *path, int want32, void **tokens, size_t *n, char *err,
                      size_t errlen) {
    if (!tokens || !n) {
        fp8t_errorf(err, errlen, "fp8t_shard_read: tokens and n must not be NULL");
        return -1;
    }
    *tokens = NULL;
    *n = 0;
    uint8_t hdr[LLMC_HEADER_BYTES];
    uint64_t size;
    int fd = open_with_header(path, "llm.c token shard", hdr, &size, err, errlen);
    if (fd < 0) return -1;
    int32_t magic = header_int(hdr, 0), version = header_int(hdr, 1), count = header_int(hdr, 2);
    if (magic == LLMC_SHARD32_MAGIC && !want32) {
        fp8t_errorf(err, errlen,
                    "%s is an llm.c Llama-3 token shard (32-bit tokens); this "
                    "reader takes GPT-2 shards (16-bit tokens) only",
                    path);
        goto fail;
    }
    if (magic != LLMC_SHARD_MAGIC && magic != LLMC_SHARD32_MAGIC) {
        fp8t_errorf(err, errlen, "%s is not an llm.c token shard (magic %d, expected %d%s)%s",
                    path, magic, LLMC_SHARD_MAGIC,
                    want32 ? ", or 20240801 for 32-bit tokens" : "", magic_hint(magic));
        goto fail;
    }
    const int wide = magic == LLMC_SHARD32_MAGIC;
    const int want_version = wide ? LLMC_SHARD32_VERSION : LLMC_SHARD_VERSION;
    const uint64_t w = wide ? 4 : 2; /* bytes per token in the file */
    if (version != want_version) {
        fp8t_errorf(err, errlen,
                    "%s: llm.c token shard version %d is not supported (expected %d)", path,
                    version, want_version);
        goto fail;
    }
    if (count < 0) {
        fp8t_errorf(err, errlen, "%s: corrupt llm.c token shard: negative token count %d", path,
                    count);
        goto fail;
    }
    uint64_t body = size - LLMC_HEADER_BYTES;
    if (body != w * (uint64_t)count) {
        if (body < w * (uint64_t)count)
            fp8t_errorf(err, errlen, "%s: truncated: header says %d tokens, file holds %llu%s",
                        path, count, (unsigned long long)(body / w),
                        body % w ? " and a part" : "");
        else
            fp8t_errorf(err, errlen,
                        "%s: header says %d tokens, file holds %llu bytes of tokens (%llu "
                        "bytes too many)",
                        path, count, (unsigned long long)body,
                        (unsigned long long)(body - w * (uint64_t)count));
        goto fail;
    }
    const size_t out_w = want32 ? 4 : 2;
    void *buf = malloc(count ? (size_t)count * out_w : 1);
    if (!buf) {
        fp8t_errorf(err, errlen, "%s: out of memory for %d tokens", path, count);
        goto fail;
    }
    long long got = fp8t_read_full(fd, buf, (size_t)count * (size_t)w);
    if (got != (long long)count * (long long)w) {
        fp8t_errorf(err, errlen, "cannot read the tokens of %s: %s", path,
                    got < 0 ? strerror(errno) : "file shrank");
        free(buf);
        goto fail;
    }
    if (want32 && !wide) { /* widen in place, from the end so nothing is overwritten unread */
        const uint16_t *src = buf;
        uint32_t *dst = buf;
        for (size_t i = (size_t)count; i-- > 0;)
            dst[i] = fp8t_load_le16((const uint8_t *)(src + i));
    } else if (wide) {
        uint32_t *t = buf;
        for (size_t i = 0; i < (size_t)count; i++)
            t[i] = fp8t_load_le32((const uint8_t *)(t + i));
    }
    close(fd);
    *tokens = buf;
    *n = (size_t)count;
    return 0;
fail:
    close(fd);
    return -1;
}

int fp8t_shard_read(const char *path, uint16_t **tokens, size_t *n, char *err, size_t errlen) {
    void *t = NULL;
    int rc = shard_read(path, 0, &t, n, err, errlen);
    *tokens = t;
    return rc;
}

int fp8t_shard_read_u32(const char *path, uint32_t **tokens, size_t *n, char *err,
                        size_t errlen) {
    void *t = NULL;
    int rc = shard_read(path, 1, &t, n, err, errlen);
    if (tokens) *tokens = t;
    return rc;
}

int fp8t_shard_write_u32(const char *path, const uint32_t *tokens, size_t n, char *err,
                         size_t errlen) {
    const char *p = path ? path : "(null)";
    if (n > (size_t)INT32_MAX)
        return fp8t_errorf(err, errlen,
                           "%s: %zu tokens do not fit one llm.c shard (at most "
                           "%d; split them)",
                           p, n, INT32_MAX);
    if (n > 0 && !tokens)
        return fp8t_errorf(err, errlen, "%s: no tokens given for a shard of %zu", p, n);
    uint8_t hdr[LLMC_HEADER_BYTES] = {0};
    header_set(hdr, 0, LLMC_SHARD32_MAGIC);
    header_set(hdr, 1, LLMC_SHARD32_VERSION);
    header_set(hdr, 2, (int32_t)n);
    fp8t_atomic_file a;
    if (fp8t_atomic_open(&a, path, err, errlen) != 0) return -1;
    if (fp8t_atomic_write(&a, hdr, sizeof hdr, err, errlen) != 0) return -1;
    uint8_t chunk[4 * 4096]; /* little endian whatever the host */
    for (size_t i = 0; i < n;) {
        size_t k = n - i < 4096 ? n - i : 4096;
        for (size_t j = 0; j < k; j++) fp8t_store_le32(chunk + 4 * j, tokens[i + j]);
        if (fp8t_atomic_write(&a, chunk, 4 * k, err, errlen) != 0) return -1;
        i += k;
    }
    return fp8t_atomic_commit(&a, err, errlen);
}

int fp8t_shard_write(const char *path, const uint16_t *tokens, size_t n, char *err,
                     size_t errlen) {
    const char *p = path ? path : "(null)";
    if (n > (size_t)INT32_MAX) {
        fp8t_errorf(err, errlen,
                    "%s: %zu tokens do not fit one llm.c shard (at most %d; split them)", p, n,
                    INT32_MAX);
        return -1;
    }
    if (n > 0 && !tokens) {
        fp8t_errorf(err, errlen, "%s: no tokens given for a shard of %zu", p, n);
        return -1;
    }
    uint8_t hdr[LLMC_HEADER_BYTES] = {0};
    header_set(hdr, 0, LLMC_SHARD_MAGIC);
    header_set(hdr, 1, LLMC_SHARD_VERSION);
    header_set(hdr, 2, (int32_t)n);
    fp8t_atomic_file a;
    if (fp8t_atomic_open(&a, path, err, errlen) != 0) return -1;
    if (fp8t_atomic_write(&a, hdr, sizeof hdr, err, errlen) != 0) return -1;
    if (n && fp8t_atomic_write(&a, tokens, n * sizeof(uint16_t), err, errlen) != 0) return -1;
    return fp8t_atomic_commit(&a, err, errlen);
}

/* ======================================================================================
 * GPT-2 checkpoints
 * ====================================================================================== */

/* Number of parameters for a config, or -1 with why set (non-positive sizes, padded vocab
 * below the vocab, heads not dividing channels, overflow). */
static int gpt2_param_count(int maxT, int V, int L, int NH, int C, int Vp, uint64_t *count,
                            const char **why) {
    if (maxT <= 0 || V <= 0 || L <= 0 || NH <= 0 || C <= 0 || Vp <= 0) {
        *why = "all sizes must be positive";
        return -1;
    }
    if (Vp < V) {
        *why = "padded vocab Vp is smaller than the vocab V";
        return -1;
    }
    if (C % NH != 0) {
        *why = "channels C are not divisible by the number of heads NH";
        return -1;
    }
    /* wte Vp*C + wpe maxT*C + L * (12*C*C + 13*C) + lnf 2*C, every step overflow-checked */
    uint64_t c = (uint64_t)C, cc, per_layer, t1, t2, total;
    int ovf = __builtin_mul_overflow(c, c, &cc);
    ovf |= __builtin_mul_overflow(cc, (uint64_t)12, &per_layer);
    ovf |= __builtin_add_overflow(per_layer, 13 * c, &per_layer);
    ovf |= __builtin_mul_overflow(per_layer, (uint64_t)L, &total);
    ovf |= __builtin_mul_overflow((uint64_t)Vp, c, &t1);
    ovf |= __builtin_mul_overflow((uint64_t)maxT, c, &t2);
    ovf |= __builtin_add_overflow(total, t1, &total);
    ovf |= __builtin_add_overflow(total, t2, &total);
    ovf |= __builtin_add_overflow(total, 2 * c, &total);
    /* 4 bytes each plus the header must still be addressable */
    if (ovf || total > (SIZE_MAX - LLMC_HEADER_BYTES) / 8) {
        *why = "the parameter count overflows";
        return -1;
    }
    *count = total;
    return 0;
}

void fp8t_llmc_gpt2_free(fp8t_llmc_gpt2 *ck) {
    if (!ck) return;
    free(ck->params);
    memset(ck, 0, sizeof(*ck));
}

int fp8t_llmc_gpt2_read(const char *path, fp8t_llmc_gpt2 *out, char *err, size_t errlen) {
    if (!out) {
        fp8t_errorf(err, errlen, "fp8t_llmc_gpt2_read: out must not be NULL");
        return -1;
    }
    memset(out, 0, sizeof(*out));
    uint8_t hdr[LLMC_HEADER_BYTES];
    uint64_t size;
    int fd = open_with_header(path, "llm.c GPT-2 checkpoint", hdr, &size, err, errlen);
    if (fd < 0) return -1;
    int32_t magic = header_int(hdr, 0), version = header_int(hdr, 1);
    int maxT = header_int(hdr, 2), V = header_int(hdr, 3), L = header_int(hdr, 4),
        NH = header_int(hdr, 5), C = header_int(hdr, 6), Vp = header_int(hdr, 7);
    float *params = NULL;
    uint16_t *chunk = NULL;
    if (magic != LLMC_GPT2_MAGIC) {
        fp8t_errorf(err, errlen, "%s is not an llm.c GPT-2 checkpoint (magic %d, expected %d)%s",
                    path, magic, LLMC_GPT2_MAGIC, magic_hint(magic));
        goto fail;
    }
    if (version != 3 && version != 5) {
        fp8t_errorf(err, errlen,
                    "%s: llm.c GPT-2 checkpoint version %d is not supported (3 = fp32, 5 = "
                    "bf16)",
                    path, version);
        goto fail;
    }
    uint64_t count;
    const char *why;
    if (gpt2_param_count(maxT, V, L, NH, C, Vp, &count, &why) != 0) {
        fp8t_errorf(err, errlen,
                    "%s: invalid GPT-2 config in the header (maxT=%d V=%d L=%d NH=%d C=%d "
                    "Vp=%d): %s",
                    path, maxT, V, L, NH, C, Vp, why);
        goto fail;
    }
    size_t elem = version == 3 ? 4 : 2;
    uint64_t want = count * elem, body = size - LLMC_HEADER_BYTES;
    if (body != want) {
        fp8t_errorf(err, errlen,
                    "%s: %s: the header config (maxT=%d V=%d L=%d NH=%d C=%d Vp=%d) needs "
                    "%llu %s parameters = %llu bytes, the file holds %llu",
                    path, body < want ? "truncated" : "size mismatch", maxT, V, L, NH, C, Vp,
                    (unsigned long long)count, version == 3 ? "fp32" : "bf16",
                    (unsigned long long)want, (unsigned long long)body);
        goto fail;
    }
    params = malloc(count ? (size_t)count * sizeof(float) : 1);
    if (!params) {
        fp8t_errorf(err, errlen, "%s: out of memory for %llu parameters", path,
                    (unsigned long long)count);
        goto fail;
    }
    errno = 0; /* a short read (file shrank) leaves it 0 */
    if (version == 3) {
        if (fp8t_read_full(fd, params, (size_t)count * 4) != (long long)(count * 4)) goto io_fail;
    } else {
        chunk = malloc(LLMC_CHUNK * sizeof(uint16_t)); /* [LLMC_CHUNK] bf16 bits */
        if (!chunk) {
            fp8t_errorf(err, errlen, "%s: out of memory", path);
            goto fail;
        }
        for (uint64_t i = 0; i < count; i += LLMC_CHUNK) {
            size_t m = (size_t)(count - i < LLMC_CHUNK ? count - i : LLMC_CHUNK);
            if (fp8t_read_full(fd, chunk, m * 2) != (long long)(m * 2)) goto io_fail;
            for (size_t j = 0; j < m; j++) params[i + j] = bf16_decode(chunk[j]);
        }
        free(chunk);
        chunk = NULL;
    }
    close(fd);
    out->max_seq_len = maxT;
    out->vocab_size = V;
    out->padded_vocab_size = Vp;
    out->num_layers = L;
    out->num_heads = NH;
    out->channels = C;
    out->version = version;
    out->params = params;
    out->num_params = (size_t)count;
    return 0;
io_fail:
    fp8t_errorf(err, errlen, "cannot read the parameters of %s: %s", path,
                errno ? strerror(errno) : "file shrank");
fail:
    free(params);
    free(chunk);
    close(fd);
    return -1;
}

int fp8t_llmc_gpt2_write(const char *path, const fp8t_llmc_gpt2 *ck, int version, char *err,
                         size_t errlen) {
    const char *p = path ? path : "(null)";
    if (!ck) {
        fp8t_errorf(err, errlen, "%s: no checkpoint given", p);
        return -1;
    }
    if (version != 3 && version != 5) {
        fp8t_errorf(err, errlen,
                    "%s: llm.c GPT-2 checkpoint version %d cannot be written (3 = fp32, 5 = "
                    "bf16)",
                    p, version);
        return -1;
    }
    uint64_t count;
    const char *why;
    if (gpt2_param_count(ck->max_seq_len, ck->vocab_size, ck->num_layers, ck->num_heads,
                         ck->channels, ck->padded_vocab_size, &count, &why) != 0) {
        fp8t_errorf(err, errlen,
                    "%s: invalid GPT-2 config (maxT=%d V=%d L=%d NH=%d C=%d Vp=%d): %s", p,
                    ck->max_seq_len, ck->vocab_size, ck->num_layers, ck->num_heads, ck->channels,
                    ck->padded_vocab_size, why);
        return -1;
    }
    if (ck->num_params != count || !ck->params) {
        fp8t_errorf(err, errlen,
                    "%s: the config needs %llu parameters but the checkpoint has %zu%s", p,
                    (unsigned long long)count, ck->num_params,
                    ck->params ? "" : " and no parameter buffer");
        return -1;
    }
    uint8_t hdr[LLMC_HEADER_BYTES] = {0};
    header_set(hdr, 0, LLMC_GPT2_MAGIC);
    header_set(hdr, 1, version);
    header_set(hdr, 2, ck->max_seq_len);
    header_set(hdr, 3, ck->vocab_size);
    header_set(hdr, 4, ck->num_layers);
    header_set(hdr, 5, ck->num_heads);
    header_set(hdr, 6, ck->channels);
    header_set(hdr, 7, ck->padded_vocab_size);
    fp8t_atomic_file a;
    if (fp8t_atomic_open(&a, path, err, errlen) != 0) return -1;
    if (fp8t_atomic_write(&a, hdr, sizeof hdr, err, errlen) != 0) return -1;
    if (version == 3) {
        if (fp8t_atomic_write(&a, ck->params, (size_t)count * sizeof(float), err, errlen) != 0)
            return -1;
        return fp8t_atomic_commit(&a, err, errlen);
    }
    uint16_t *chunk = malloc(LLMC_CHUNK * sizeof(uint16_t)); /* [LLMC_CHUNK] bf16 bits */
    if (!chunk) {
        fp8t_errorf(err, errlen, "%s: out of memory", p);
        fp8t_atomic_abort(&a);
        return -1;
    }
    for (uint64_t i = 0; i < count; i += LLMC_CHUNK) {
        size_t m = (size_t)(count - i < LLMC_CHUNK ? count - i : LLMC_CHUNK);
        for (size_t j = 0; j < m; j++) chunk[j] = bf16_encode(ck->params[i + j]);
        if (fp8t_atomic_write(&a, chunk, m * 2, err, errlen) != 0) {
            free(chunk);
            return -1;
        }
    }
    free(chunk);
    return fp8t_atomic_commit(&a, err, errlen);
}
