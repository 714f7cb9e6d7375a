/* TensorBoard event files: TFRecord framing around protobuf Event messages (encoded by
 * protobuf-c from src/io/proto/tfevent.proto). Each step's scalars go out as one Event in one
 * write(2) straight to the file descriptor: no user-space buffer holds a step back from a live
 * TensorBoard, and a failed or short write is seen at once. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#include "fp8train/error.h"
#include "fp8train/io.h"
#include "fp8train/tensorboard.h"
#include "tfevent.pb-c.h"

typedef struct {
    char *tag;
    float value;
} tb_scalar;

struct fp8t_tb_writer {
    int fd;
    char path[1280];
    int failed;   /* a write failed: the file may end in a partial record */
    int oom;      /* fp8t_tb_add ran out of memory since the last write */
    tb_scalar *q; /* queued scalars of the coming step */
    size_t nq, capq;
    uint8_t *buf; /* framing buffer, grown as needed */
    size_t cap;
};

/* ---- CRC32C and the TFRecord frame ---- */

#if defined(__SSE4_2__)
/* SSE4.2's crc32 instruction computes exactly CRC32C (the default -march=x86-64-v2 has it):
 * with --inspect on every site of a large model a step's record is a few hundred KB, and the
 * bitwise loop below was then most of the writer's time (measured: 78%). */
uint32_t fp8t_crc32c(const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t crc = 0xFFFFFFFFu;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8); /* little-endian: the bytes in memory order, as the CRC wants */
        crc = _mm_crc32_u64(crc, w);
    }
    uint32_t c = (uint32_t)crc;
    for (; n > 0; n--, p++) c = _mm_crc32_u8(c, *p);
    return ~c;
}
#else
/* Bit by bit (reflected Castagnoli polynomial): no table to initialise or share. */
uint32_t fp8t_crc32c(const void *data, size_t n) {
    const uint8_t *p = data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return ~crc;
}
#endif

/* TFRecord stores a rotated and offset CRC, so that a CRC computed over data that itself
 * holds CRCs does not degenerate. */
uint32_t fp8t_tfrecord_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static int write_all(fp8t_tb_writer *w, const uint8_t *p, size_t n, char *err, size_t errlen) {
    while (n > 0) {
        ssize_t k = write(w->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            w->failed = 1;
            return fp8t_errorf(err, errlen,
                               "cannot write TensorBoard events to %s: %s (free "
                               "space there or drop --tensorboard)",
                               w->path, k < 0 ? strerror(errno) : "nothing written");
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Frame and write one Event. */
static int write_event(fp8t_tb_writer *w, const Fp8tTb__Event *ev, char *err, size_t errlen) {
    if (w->failed) return fp8t_errorf(err, errlen, "%s: an earlier write failed", w->path);
    size_t len = fp8t_tb__event__get_packed_size(ev), need = len + 16;
    if (need > w->cap) {
        uint8_t *b = realloc(w->buf, need);
        if (!b)
            return fp8t_errorf(err, errlen,
                               "out of memory for a %zu-byte TensorBoard "
                               "event",
                               len);
        w->buf = b;
        w->cap = need;
    }
    uint8_t *b = w->buf;
    put_le64(b, (uint64_t)len);
    put_le32(b + 8, fp8t_tfrecord_mask(fp8t_crc32c(b, 8)));
    fp8t_tb__event__pack(ev, b + 12);
    put_le32(b + 12 + len, fp8t_tfrecord_mask(fp8t_crc32c(b + 12, len)));
    return write_all(w, b, need, err, errlen);
}

static double wall_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

/* ---- the writer ---- */

static void free_queue(fp8t_tb_writer *w) {
    for (size_t i = 0; i < w->nq; i++) free(w->q[i].tag);
    w->nq = 0;
}

fp8t_tb_writer *fp8t_tb_open(const char *dir, char *err, size_t errlen) {
    if (!dir || !*dir) {
        fp8t_errorf(err, errlen, "--tensorboard needs a directory");
        return NULL;
    }
    char e[FP8T_ERR_LEN];
    if (fp8t_mkdirs(dir, e, sizeof(e)) != 0) {
        fp8t_errorf(err, errlen, "--tensorboard %s: %s", dir, e);
        return NULL;
    }
    fp8t_tb_writer *w = calloc(1, sizeof(*w));
    if (!w) {
        fp8t_errorf(err, errlen, "out of memory");
        return NULL;
    }
    w->fd = -1;
    /* TensorBoard finds event files by "tfevents" in the name and reads the files of a
     * directory in name order, so the time in the name orders a resumed run after the run it
     * resumes. The host tells apart the files of runs on several machines. */
    char host[256] = "localhost";
    if (gethostname(host, sizeof(host)) != 0 || !host[0])
        snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    const long long now = (long long)time(NULL);
    for (int n = 0; n < 1000 && w->fd < 0; n++) {
        int k = n == 0 ? snprintf(w->path, sizeof(w->path), "%s/events.out.tfevents.%lld.%s", dir,
                                  now, host)
                       : snprintf(w->path, sizeof(w->path), "%s/events.out.tfevents.%lld.%s.%d",
                                  dir, now, host, n);
        if (k < 0 || (size_t)k >= sizeof(w->path)) {
            fp8t_errorf(err, errlen, "--tensorboard %s: path too long", dir);
            free(w);
            return NULL;
        }
        /* O_EXCL: never truncate a file of another run (or of this host a second ago) */
        w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (w->fd < 0 && errno != EEXIST) {
            fp8t_errorf(err, errlen, "cannot create %s: %s (check --tensorboard)", w->path,
                        strerror(errno));
            free(w);
            return NULL;
        }
    }
    if (w->fd < 0) {
        fp8t_errorf(err, errlen, "cannot create an event file in %s: too many of this second",
                    dir);
        free(w);
        return NULL;
    }
    Fp8tTb__Event ev = FP8T_TB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.what_case = FP8T_TB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = (char *)FP8T_TB_FILE_VERSION;
    if (write_event(w, &ev, err, errlen) != 0) {
        /* the file is ours and holds nothing of use */
        close(w->fd);
        unlink(w->path);
        free(w->buf);
        free(w);
        return NULL;
    }
    return w;
}

int fp8t_tb_session_start(fp8t_tb_writer *w, int64_t step, char *err, size_t errlen) {
    if (!w) return 0;
    Fp8tTb__SessionLog log = FP8T_TB__SESSION_LOG__INIT;
    log.status = FP8T_TB__SESSION_LOG__SESSION_STATUS__START;
    Fp8tTb__Event ev = FP8T_TB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.what_case = FP8T_TB__EVENT__WHAT_SESSION_LOG;
    ev.session_log = &log;
    return write_event(w, &ev, err, errlen);
}

const char *fp8t_tb_path(const fp8t_tb_writer *w) { return w ? w->path : ""; }

size_t fp8t_tb_pending(const fp8t_tb_writer *w) { return w ? w->nq : 0; }

int fp8t_tb_add(fp8t_tb_writer *w, const char *tag, double value) {
    if (!w) return 0;
    if (w->nq == w->capq) {
        size_t nc = w->capq ? 2 * w->capq : 64;
        tb_scalar *q = realloc(w->q, nc * sizeof(*q));
        if (!q) {
            w->oom = 1;
            return -1;
        }
        w->q = q;
        w->capq = nc;
    }
    char *t = strdup(tag);
    if (!t) {
        w->oom = 1;
        return -1;
    }
    w->q[w->nq].tag = t;
    w->q[w->nq].value = (float)value; /* simple_value is a float */
    w->nq++;
    return 0;
}

int fp8t_tb_write_step(fp8t_tb_writer *w, int64_t step, char *err, size_t errlen) {
    if (!w) return 0;
    if (w->oom) {
        w->oom = 0;
        free_queue(w);
        return fp8t_errorf(err, errlen, "out of memory queueing TensorBoard scalars for %s",
                           w->path);
    }
    if (w->nq == 0) return 0;
    Fp8tTb__Summary__Value *vals = calloc(w->nq, sizeof(*vals));
    Fp8tTb__Summary__Value **ptrs = calloc(w->nq, sizeof(*ptrs));
    int rc = -1;
    if (!vals || !ptrs) {
        fp8t_errorf(err, errlen, "out of memory writing TensorBoard scalars to %s", w->path);
        goto done;
    }
    for (size_t i = 0; i < w->nq; i++) {
        fp8t_tb__summary__value__init(&vals[i]);
        vals[i].tag = w->q[i].tag;
        vals[i].value_case = FP8T_TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        vals[i].simple_value = w->q[i].value;
        ptrs[i] = &vals[i];
    }
    Fp8tTb__Summary sum = FP8T_TB__SUMMARY__INIT;
    sum.n_value = w->nq;
    sum.value = ptrs;
    Fp8tTb__Event ev = FP8T_TB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.what_case = FP8T_TB__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    rc = write_event(w, &ev, err, errlen);
done:
    free(vals);
    free(ptrs);
    free_queue(w);
    return rc;
}

int fp8t_tb_close(fp8t_tb_writer *w, char *err, size_t errlen) {
    if (!w) return 0;
    int rc = 0;
    if (w->fd >= 0 && close(w->fd) != 0)
        rc = fp8t_errorf(err, errlen, "cannot close %s: %s", w->path, strerror(errno));
    free_queue(w);
    free(w->q);
    free(w->buf);
    free(w);
    return rc;
}
