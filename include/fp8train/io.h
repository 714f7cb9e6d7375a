/* fp8train — file formats: safetensors, .npy, llm.c token shards and GPT-2 checkpoints,
 * atomic file writes. Every reader validates everything it is given (header length, JSON,
 * dtypes, shapes, offsets in bounds, sizes) and reports a clear error naming the file;
 * nothing here aborts on bad input. Functions return 0 on success, -1 with err filled. */
#ifndef FP8TRAIN_IO_H
#define FP8TRAIN_IO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- atomic writes ---- */
/* Write data to path via path.tmp.<pid> + fsync + rename. */
int fp8t_write_file_atomic(const char *path, const void *data, size_t len, char *err,
                           size_t errlen);
/* Read a whole file (malloc'd, NUL-terminated for convenience; *len excludes the NUL). */
int fp8t_read_file(const char *path, char **data, size_t *len, char *err, size_t errlen);
/* mkdir -p */
int fp8t_mkdirs(const char *path, char *err, size_t errlen);
/* Remove a directory tree (used to replace an old checkpoint directory). */
int fp8t_rmtree(const char *path);

/* ---- safetensors ----
 * 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets},
 * "__metadata__": {str: str}}, then the data. */
typedef enum {
    FP8T_ST_F32 = 0,
    FP8T_ST_F16,
    FP8T_ST_BF16,
    FP8T_ST_F8_E4M3,
    FP8T_ST_F8_E5M2,
    FP8T_ST_I64,
    FP8T_ST_I32,
    FP8T_ST_I16,
    FP8T_ST_I8,
    FP8T_ST_U8,
    FP8T_ST_F64,
    FP8T_ST_DTYPE_COUNT
} fp8t_st_dtype;
const char *fp8t_st_dtype_name(fp8t_st_dtype d); /* "F32", "BF16", "F8_E4M3", ... */
size_t fp8t_st_dtype_size(fp8t_st_dtype d);

#define FP8T_ST_MAX_DIMS 8
typedef struct {
    char name[256];
    fp8t_st_dtype dtype;
    int ndim;
    int64_t shape[FP8T_ST_MAX_DIMS];
    size_t numel;
    uint64_t begin, end; /* byte offsets into the data section */
} fp8t_st_tensor;

typedef struct fp8t_st_file fp8t_st_file;
int fp8t_st_open(fp8t_st_file **out, const char *path, char *err, size_t errlen);
void fp8t_st_close(fp8t_st_file *f);
int fp8t_st_count(const fp8t_st_file *f);
const fp8t_st_tensor *fp8t_st_get(const fp8t_st_file *f, int i);
/* by name (binary search; names are unique). The tensors are one array in header order: the
 * result minus fp8t_st_get(f, 0) is its index. */
const fp8t_st_tensor *fp8t_st_find(const fp8t_st_file *f, const char *name);
const void *fp8t_st_data(const fp8t_st_file *f, const fp8t_st_tensor *t);
/* __metadata__ value for key, or NULL. */
const char *fp8t_st_metadata(const fp8t_st_file *f, const char *key);
/* Read tensor `name` as FP32 into out (numel floats expected; F32/BF16/F16/F8 converted). A
 * missing tensor or a numel mismatch is an error naming the tensor, file and both sizes. */
int fp8t_st_read_f32(const fp8t_st_file *f, const char *name, float *out, size_t numel, char *err,
                     size_t errlen);

typedef struct fp8t_st_writer fp8t_st_writer;
fp8t_st_writer *fp8t_st_writer_new(void);
/* data is copied. */
void fp8t_st_writer_add(fp8t_st_writer *w, const char *name, fp8t_st_dtype dtype, int ndim,
                        const int64_t *shape, const void *data);
/* Like fp8t_st_writer_add, but borrows data: it must stay valid and unchanged until
 * fp8t_st_writer_save returns. Saves a copy of every tensor (checkpoints of large models). */
void fp8t_st_writer_add_ref(fp8t_st_writer *w, const char *name, fp8t_st_dtype dtype, int ndim,
                            const int64_t *shape, const void *data);
void fp8t_st_writer_metadata(fp8t_st_writer *w, const char *key, const char *value);
/* Written atomically. */
int fp8t_st_writer_save(fp8t_st_writer *w, const char *path, char *err, size_t errlen);
void fp8t_st_writer_free(fp8t_st_writer *w);

/* ---- .npy (format 1.0, C order, little endian) ----
 * descr: "<f4" float32, "|u1" uint8, "<i4" int32, "<f8" float64, "<u2" uint16, "<i8" int64 */
int fp8t_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape,
                   const void *data, char *err, size_t errlen);
/* Reads a .npy file; *data malloc'd. descr receives the dtype string (e.g. "<f4"). */
int fp8t_npy_read(const char *path, char descr[16], int *ndim, int64_t shape[8], void **data,
                  size_t *nbytes, char *err, size_t errlen);

/* ---- llm.c token shards: 256 x int32 header (magic 20240520, version 1, token count),
 * then uint16 tokens ---- */
int fp8t_shard_read(const char *path, uint16_t **tokens, size_t *n, char *err, size_t errlen);
int fp8t_shard_write(const char *path, const uint16_t *tokens, size_t n, char *err,
                     size_t errlen);
/* llm.c's Llama-3 shards (vocabularies past 65536): magic 20240801, version 7, uint32 tokens.
 * fp8t_shard_read_u32 reads both kinds (GPT-2 shards widened to uint32); fp8t_shard_read
 * refuses a 32-bit shard with a message saying so. */
int fp8t_shard_read_u32(const char *path, uint32_t **tokens, size_t *n, char *err, size_t errlen);
int fp8t_shard_write_u32(const char *path, const uint32_t *tokens, size_t n, char *err,
                         size_t errlen);

/* ---- llm.c GPT-2 checkpoints: 256 x int32 header (magic 20240326, version 3 = fp32 or 5 =
 * bf16; maxT, V, L, NH, C, Vp), then the parameters in llm.c order:
 * wte[Vp,C] wpe[maxT,C] ln1w[L,C] ln1b[L,C] qkvw[L,3C,C] qkvb[L,3C] attprojw[L,C,C]
 * attprojb[L,C] ln2w[L,C] ln2b[L,C] fcw[L,4C,C] fcb[L,4C] fcprojw[L,C,4C] fcprojb[L,C]
 * lnfw[C] lnfb[C] */
typedef struct {
    int max_seq_len, vocab_size, padded_vocab_size, num_layers, num_heads, channels;
    int version;   /* 3 or 5 */
    float *params; /* all parameters as FP32, llm.c order (malloc'd) */
    size_t num_params;
} fp8t_llmc_gpt2;
int fp8t_llmc_gpt2_read(const char *path, fp8t_llmc_gpt2 *out, char *err, size_t errlen);
int fp8t_llmc_gpt2_write(const char *path, const fp8t_llmc_gpt2 *ck, int version, char *err,
                         size_t errlen);
void fp8t_llmc_gpt2_free(fp8t_llmc_gpt2 *ck);

#ifdef __cplusplus
}
#endif
#endif
