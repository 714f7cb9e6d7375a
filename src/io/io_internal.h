/* fp8train — helpers shared by the file-format readers and writers in src/io (not a public
 * API). Every writer streams into "<path>.tmp.<pid>" and renames it into place at the end, so
 * a crash or a full disk never leaves a half-written file under the real name. */
#ifndef FP8TRAIN_IO_INTERNAL_H
#define FP8TRAIN_IO_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fp8train/error.h" /* fp8t_errorf, for every reader and writer here */
#include "util/le.h"        /* fp8t_load_le32, fp8t_store_le32, ... */

/* The formats are little endian; bulk data is copied with memcpy, so the host must be too. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fp8train io: only little-endian hosts are supported"
#endif

/* An output file being written under a temporary name. */
typedef struct {
    int fd;         /* -1 when closed */
    char *path;     /* final name (malloc'd copy) */
    char *tmp_path; /* "<path>.tmp.<pid>" (malloc'd) */
} fp8t_atomic_file;

/* Create path.tmp.<pid> for writing. On failure nothing is left behind. */
int fp8t_atomic_open(fp8t_atomic_file *a, const char *path, char *err, size_t errlen);
/* Write all of data; on failure the temporary file is removed (no commit/abort needed). */
int fp8t_atomic_write(fp8t_atomic_file *a, const void *data, size_t len, char *err,
                      size_t errlen);
/* fsync, close, rename over path, fsync the directory. On failure the temp file is removed. */
int fp8t_atomic_commit(fp8t_atomic_file *a, char *err, size_t errlen);
/* Close and remove the temporary file (safe to call after a failed write or twice). */
void fp8t_atomic_abort(fp8t_atomic_file *a);

/* Open path read-only, refusing anything but a regular file: the fd, with *size its size in
 * bytes; or -1 with err ("cannot open PATH: why" / "cannot read PATH: not a regular file"). */
int fp8t_open_regular(const char *path, uint64_t *size, char *err, size_t errlen);

/* Read exactly len bytes from fd (retrying short reads and EINTR). Returns the number of
 * bytes read: less than len only at end of file; -1 on an I/O error (errno set). */
long long fp8t_read_full(int fd, void *buf, size_t len);

#endif
