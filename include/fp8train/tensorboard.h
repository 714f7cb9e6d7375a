/* fp8train — TensorBoard event files (train --tensorboard DIR).
 *
 * A file DIR/events.out.tfevents.<unix time>.<host> is a sequence of TFRecords:
 *   uint64 length (little-endian), uint32 masked CRC32C of those 8 bytes,
 *   `length` bytes of data, uint32 masked CRC32C of the data,
 * each data a protobuf `Event` (TensorBoard's event.proto; the subset fp8train writes is in
 * src/io/proto/tfevent.proto): the first carries file_version "brain.Event:2", later ones a
 * step and either a SessionLog START (fp8t_tb_session_start) or a Summary of scalar
 * (simple_value) values. TensorBoard opens such a directory with `tensorboard --logdir DIR`. */
#ifndef FP8TRAIN_TENSORBOARD_H
#define FP8TRAIN_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP8T_TB_FILE_VERSION "brain.Event:2"

typedef struct fp8t_tb_writer fp8t_tb_writer;

/* Create DIR (and its parents) and a new event file in it, named
 * events.out.tfevents.<unix time>.<host> (".<n>" appended when a file of that name exists:
 * an existing file is never overwritten), holding the file-version record. NULL with err. */
fp8t_tb_writer *fp8t_tb_open(const char *dir, char *err, size_t errlen);
/* Mark that the run (re)starts at `step`: TensorBoard then drops the values of steps >= step
 * it read before (from this file or an older one in the directory), which a resumed or
 * rolled-back run is about to write again. 0 ok; -1 with err as fp8t_tb_write_step. */
int fp8t_tb_session_start(fp8t_tb_writer *w, int64_t step, char *err, size_t errlen);
/* The file's path. */
const char *fp8t_tb_path(const fp8t_tb_writer *w);
/* Queue a scalar for the next fp8t_tb_write_step (tags may repeat across steps, not within
 * one step). 0 ok; -1 out of memory, which the next fp8t_tb_write_step also reports. */
int fp8t_tb_add(fp8t_tb_writer *w, const char *tag, double value);
/* Number of scalars queued. */
size_t fp8t_tb_pending(const fp8t_tb_writer *w);
/* Write the queued scalars as one Event of `step` (nothing if none is queued) and flush it to
 * the operating system, so a live TensorBoard sees the step. 0 ok; -1 with err naming the file
 * when a write failed (the writer then refuses further writes). */
int fp8t_tb_write_step(fp8t_tb_writer *w, int64_t step, char *err, size_t errlen);
/* Close the file (NULL: nothing). 0 ok; -1 with err when the close failed. */
int fp8t_tb_close(fp8t_tb_writer *w, char *err, size_t errlen);

/* CRC32C (Castagnoli) of n bytes, and the masking TFRecord applies to it. */
uint32_t fp8t_crc32c(const void *data, size_t n);
uint32_t fp8t_tfrecord_mask(uint32_t crc);

#ifdef __cplusplus
}
#endif
#endif
