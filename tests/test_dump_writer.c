/* The inspector's background dump writer (src/instrument/dump_writer.h) on the CPU backend: every
 * queued dump is written, with the right data, FP8 codes and scale_inv, also when the pinned
 * budget holds less than one dump (the producer then waits for the thread) and when a dump is
 * larger than every buffer so far (a buffer is replaced). */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "instrument/dump_writer.h"
#include "fp8train/backend.h"
#include "fp8train/io.h"
#include "test.h"

static char g_root[256];

static void fill(float *x, size_t n, int seed) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)((i * 2654435761u + (unsigned)seed * 97u) % 2001) - 1000) / 37.0f;
}

static int check_dump(const dump_job *job, int seed) {
    char path[1400], err[512], descr[16];
    int ndim;
    int64_t shape[8];
    void *data;
    size_t nbytes, n = (size_t)job->rows * job->cols;
    snprintf(path, sizeof(path), "%.1100s/%.96s.npy", job->dir, job->name);
    if (fp8t_npy_read(path, descr, &ndim, shape, &data, &nbytes, err, sizeof(err))) {
        printf("  %s\n", err);
        return 0;
    }
    float *want = malloc(n * sizeof(float));
    fill(want, n, seed);
    int ok = ndim == 2 && shape[0] == job->rows && shape[1] == job->cols &&
             nbytes == n * sizeof(float) && !memcmp(data, want, nbytes);
    free(data);
    if (ok && job->operand) {
        snprintf(path, sizeof(path), "%.1100s/%.96s.fp8.npy", job->dir, job->name);
        ok = !fp8t_npy_read(path, descr, &ndim, shape, &data, &nbytes, err, sizeof(err));
        if (ok) {
            uint8_t *codes = malloc(n);
            fp8_quantize(codes, want, n, job->scale, job->fmt, 1);
            ok = nbytes == n && !memcmp(codes, data, n);
            free(codes);
            free(data);
        }
    }
    free(want);
    return ok;
}

/* hold: queue every dump before releasing any (the inspector queues a whole step's dumps and
 * releases them at its end): the producer then holds all buffers, which must never make it
 * wait (it did past 64 buffers once: a deadlock), whatever the budget. */
static void run(size_t budget, const char *sub, int hold) {
    char err[512];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    T_ASSERT(be, "%s", err);
    dump_writer *w = dump_writer_create(be, budget);
    T_ASSERT(w, "writer thread");
    enum { N = 100 };
    dump_job jobs[N];
    for (int k = 0; k < N; k++) {
        dump_job *j = &jobs[k];
        memset(j, 0, sizeof(*j));
        snprintf(j->dir, sizeof(j->dir), "%s/%s/step_%06d", g_root, sub, k % 3);
        snprintf(j->name, sizeof(j->name), "%d.fc1.fprop.input", k);
        j->rows = 10 + k % 5; /* sizes vary and grow: buffers are reused and replaced */
        j->cols = 50 + 7 * k;
        j->operand = k % 2;
        j->scale = 8.0f, j->scale_inv = 0.125f;
        j->fmt = k % 4 < 2 ? FP8_E4M3 : FP8_E5M2;
        size_t n = (size_t)j->rows * j->cols;
        float *dev = be->ops->malloc(be, n * sizeof(float)), *host = malloc(n * sizeof(float));
        fill(host, n, k);
        be->ops->to_device(be, dev, host, n * sizeof(float));
        float *buf = dump_writer_buffer(w, n * sizeof(float));
        be->ops->to_host_async(be, buf, dev, n * sizeof(float));
        dump_writer_queue(w, j, buf);
        T_CHECK(dump_writer_pending(w), "a queued dump is pending until released");
        be->ops->synchronize(be);
        if (!hold) dump_writer_release(w);
        be->ops->free(be, dev);
        free(host);
    }
    dump_writer_destroy(w);
    int good = 0;
    for (int k = 0; k < N; k++) good += check_dump(&jobs[k], k);
    T_CHECK(good == N, "%d of %d dumps written correctly (budget %zu)", good, N, budget);
    fp8t_backend_destroy(be);
}

/* a budget far below one dump: every buffer request waits for the thread's backlog */
static void test_tiny_budget(void) { run(64, "tiny", 0); }
/* a roomy budget: the thread lags behind, buffers pile up, all land */
static void test_large_budget(void) { run((size_t)64 << 20, "large", 0); }
static void test_hold_tiny_budget(void) { run(64, "hold_tiny", 1); }
static void test_hold_large_budget(void) { run((size_t)64 << 20, "hold_large", 1); }

int main(void) {
    t_suite = "dump_writer";
    snprintf(g_root, sizeof(g_root), "/tmp/fp8t_test_dump_writer_XXXXXX");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    T_RUN(test_tiny_budget);
    T_RUN(test_large_budget);
    T_RUN(test_hold_tiny_budget);
    T_RUN(test_hold_large_budget);
    if (!getenv("FP8T_KEEP_TEST_FILES"))
        fp8t_rmtree(g_root);
    else
        printf("kept %s\n", g_root);
    T_MAIN_END();
}
