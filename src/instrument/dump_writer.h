/* The inspector's dump writer (dump=1): tensors are copied off the device asynchronously into
 * pinned host buffers (backend op to_host_async) and written as .npy by a background thread,
 * so an inspected step waits neither on the copy nor on the disk.
 *
 * Protocol (one producer, the training thread):
 *   buf = dump_writer_buffer(w, bytes);       a free pinned buffer (waits while the in-flight
 *                                             budget is used up by the thread's backlog; NULL
 *                                             out of memory)
 *   be->ops->to_host_async(be, buf, x, bytes);
 *   dump_writer_queue(w, &job, buf);          pending: the copy may not have landed yet
 *   ... a to_host or synchronize on the backend returns ...
 *   dump_writer_release(w);                   pending jobs go to the thread
 *   dump_writer_destroy(w);                   release (the caller has synchronized), drain,
 *                                             join, free. */
#ifndef FP8TRAIN_DUMP_WRITER_H
#define FP8TRAIN_DUMP_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "fp8train/backend.h"

typedef struct {
    char dir[1100]; /* OUT/dumps/step_NNNNNN (created by the thread) */
    char name[96];  /* <layer>.<module>.<gemm>.<tensor> */
    int rows, cols;
    int operand; /* also the .fp8.npy codes and .scale_inv.npy */
    float scale, scale_inv;
    fp8_format fmt;
} dump_job;

typedef struct dump_writer dump_writer;

/* max_bytes: pinned memory in flight before dump_writer_buffer waits. NULL on failure (the
 * caller then writes synchronously). */
dump_writer *dump_writer_create(fp8t_backend *be, size_t max_bytes);
float *dump_writer_buffer(dump_writer *w, size_t bytes);
void dump_writer_queue(dump_writer *w, const dump_job *job, float *buf);
int dump_writer_pending(const dump_writer *w);
void dump_writer_release(dump_writer *w);
void dump_writer_destroy(dump_writer *w);

/* The files of one dump from host data x (what the thread runs; also the synchronous path). */
void dump_write_files(const dump_job *job, const float *x, uint8_t **codes, size_t *codes_cap);

#endif
