/* The inspector's background dump writer (see dump_writer.h). */
#include "instrument/dump_writer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "fp8train/io.h"

/* A pinned buffer is free, held by the producer (handed out; its job not yet released to the
 * thread), or with the thread (queued or being written). */
enum { BUF_FREE = 0, BUF_PRODUCER, BUF_THREAD };

typedef struct {
    float *p;
    size_t cap;
    int state;
} pinned_buf;

typedef struct job_node {
    dump_job job;
    float *buf; /* its pinned buffer */
    struct job_node *next;
} job_node;

struct dump_writer {
    fp8t_backend *be;
    size_t max_bytes, total_bytes;
    pinned_buf *bufs; /* [n_bufs]; grown by the producer under mu */
    int n_bufs, bufs_cap;
    job_node *pending, *pending_tail; /* producer only: copies maybe still in flight */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_free;
    job_node *ready, *ready_tail; /* under mu: for the thread */
    int quit;
    pthread_t thread;
    uint8_t *codes; /* the thread's scratch for FP8 codes */
    size_t codes_cap;
};

void dump_write_files(const dump_job *job, const float *x, uint8_t **codes, size_t *codes_cap) {
    char path[1300], err[512];
    if (fp8t_mkdirs(job->dir, err, sizeof(err))) {
        fp8t_warnf("inspect: %s", err);
        return;
    }
    int64_t shape[2] = {job->rows, job->cols};
    size_t n = (size_t)job->rows * (size_t)job->cols;
    snprintf(path, sizeof(path), "%s/%s.npy", job->dir, job->name);
    int rc = fp8t_npy_write(path, "<f4", 2, shape, x, err, sizeof(err));
    if (!rc && job->operand) {
        if (n > *codes_cap) {
            uint8_t *c = realloc(*codes, n);
            if (!c) {
                fp8t_warnf("inspect: out of memory for the codes of %s", path);
                return;
            }
            *codes = c;
            *codes_cap = n;
        }
        fp8_quantize(*codes, x, n, job->scale, job->fmt, 1);
        snprintf(path, sizeof(path), "%s/%s.fp8.npy", job->dir, job->name);
        rc = fp8t_npy_write(path, "|u1", 2, shape, *codes, err, sizeof(err));
        int64_t one = 1;
        snprintf(path, sizeof(path), "%s/%s.scale_inv.npy", job->dir, job->name);
        if (!rc) rc = fp8t_npy_write(path, "<f4", 1, &one, &job->scale_inv, err, sizeof(err));
    }
    if (rc) fp8t_warnf("inspect: dump failed: %s", err);
}

/* under mu */
static void set_state(dump_writer *w, const float *p, int state) {
    for (int i = 0; i < w->n_bufs; i++)
        if (w->bufs[i].p == p) w->bufs[i].state = state;
}

static void *writer_main(void *arg) {
    dump_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->ready && !w->quit) pthread_cond_wait(&w->cv_work, &w->mu);
        job_node *j = w->ready;
        if (!j) break; /* quit with nothing left */
        w->ready = j->next;
        if (!w->ready) w->ready_tail = NULL;
        pthread_mutex_unlock(&w->mu);
        dump_write_files(&j->job, j->buf, &w->codes, &w->codes_cap);
        pthread_mutex_lock(&w->mu);
        set_state(w, j->buf, BUF_FREE);
        pthread_cond_broadcast(&w->cv_free);
        free(j);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

dump_writer *dump_writer_create(fp8t_backend *be, size_t max_bytes) {
    dump_writer *w = calloc(1, sizeof(*w));
    if (!w) return NULL;
    w->be = be;
    w->max_bytes = max_bytes;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv_work, NULL);
    pthread_cond_init(&w->cv_free, NULL);
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv_work);
        pthread_cond_destroy(&w->cv_free);
        free(w);
        return NULL;
    }
    return w;
}

/* Over the budget: free the free buffers first; then wait only while the thread has work
 * that will free more; with nothing in the thread's hands (everything held by the producer,
 * who releases it only after this call) allocate past the budget rather than wait forever
 * (the inspector flushes at half the budget, so this stays bounded). */
float *dump_writer_buffer(dump_writer *w, size_t bytes) {
    pthread_mutex_lock(&w->mu);
    for (;;) {
        int best = -1, with_thread = 0;
        for (int i = 0; i < w->n_bufs; i++) {
            if (w->bufs[i].state == BUF_THREAD) with_thread = 1;
            if (w->bufs[i].state == BUF_FREE && w->bufs[i].cap >= bytes &&
                (best < 0 || w->bufs[i].cap < w->bufs[best].cap))
                best = i;
        }
        if (best >= 0) {
            w->bufs[best].state = BUF_PRODUCER;
            pthread_mutex_unlock(&w->mu);
            return w->bufs[best].p;
        }
        if (w->total_bytes + bytes > w->max_bytes) {
            /* drop the free buffers (all too small for this one) */
            int k = 0;
            for (int i = 0; i < w->n_bufs; i++) {
                if (w->bufs[i].state == BUF_FREE) {
                    w->total_bytes -= w->bufs[i].cap;
                    w->be->ops->host_free(w->be, w->bufs[i].p);
                } else {
                    w->bufs[k++] = w->bufs[i];
                }
            }
            w->n_bufs = k;
        }
        if (w->total_bytes + bytes <= w->max_bytes || !with_thread) {
            if (w->n_bufs == w->bufs_cap) {
                int cap = w->bufs_cap ? 2 * w->bufs_cap : 16;
                pinned_buf *nb = realloc(w->bufs, (size_t)cap * sizeof(*nb));
                if (!nb) {
                    pthread_mutex_unlock(&w->mu);
                    return NULL;
                }
                w->bufs = nb, w->bufs_cap = cap;
            }
            float *p = w->be->ops->host_alloc(w->be, bytes);
            w->bufs[w->n_bufs++] = (pinned_buf){.p = p, .cap = bytes, .state = BUF_PRODUCER};
            w->total_bytes += bytes;
            pthread_mutex_unlock(&w->mu);
            return p;
        }
        /* the thread's backlog holds the budget: wait for it to finish one (back pressure) */
        pthread_cond_wait(&w->cv_free, &w->mu);
    }
}

void dump_writer_queue(dump_writer *w, const dump_job *job, float *buf) {
    job_node *j = malloc(sizeof(*j));
    if (!j) {
        fp8t_warnf("inspect: dump of %s lost (out of memory)", job->name);
        pthread_mutex_lock(&w->mu);
        set_state(w, buf, BUF_FREE);
        pthread_mutex_unlock(&w->mu);
        return;
    }
    j->job = *job;
    j->buf = buf;
    j->next = NULL;
    if (w->pending_tail)
        w->pending_tail->next = j;
    else
        w->pending = j;
    w->pending_tail = j;
}

int dump_writer_pending(const dump_writer *w) { return w && w->pending != NULL; }

void dump_writer_release(dump_writer *w) {
    if (!w || !w->pending) return;
    pthread_mutex_lock(&w->mu);
    for (job_node *j = w->pending; j; j = j->next) set_state(w, j->buf, BUF_THREAD);
    if (w->ready_tail)
        w->ready_tail->next = w->pending;
    else
        w->ready = w->pending;
    w->ready_tail = w->pending_tail;
    w->pending = w->pending_tail = NULL;
    pthread_cond_signal(&w->cv_work);
    pthread_mutex_unlock(&w->mu);
}

void dump_writer_destroy(dump_writer *w) {
    if (!w) return;
    dump_writer_release(w);
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_signal(&w->cv_work);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    for (int i = 0; i < w->n_bufs; i++) w->be->ops->host_free(w->be, w->bufs[i].p);
    free(w->bufs);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv_work);
    pthread_cond_destroy(&w->cv_free);
    free(w->codes);
    free(w);
}
