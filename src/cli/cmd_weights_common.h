/* Helpers shared by the weight-handling subcommands (eval, generate, export, import): the
 * defaults a checkpoint's run config suggests, FP8 calibration of weights. */
#ifndef FP8TRAIN_CMD_WEIGHTS_COMMON_H
#define FP8TRAIN_CMD_WEIGHTS_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "cli/cli_args.h" /* cli_parse, cli_set_u64_given */
#include "fp8train/eval.h"
#include "fp8train/export.h"
#include "fp8train/infer.h"

/* What the run that wrote a checkpoint used (its config in state.json), or general defaults
 * for other weights: data "synthetic", batch 8, seq_len min(model's, 256), 10 validation
 * micro-batches, seed 1337, device cpu. */
typedef struct {
    char data[1024], val_data[1024];
    char tokenizer[1024]; /* the run's --tokenizer (tokenizer.json), "" if none */
    int batch, seq_len, val_batches;
    uint64_t seed;
    char device[16];
} cli_run_defaults;
void cli_run_defaults_from(const fp8t_weights *w, cli_run_defaults *d);

/* One line describing w: "checkpoint, gpt2 4x128 (4 heads), vocab 256, step 300". */
void cli_describe_weights(char *buf, size_t len, const fp8t_weights *w);

/* If ev's FP8 state never saw an amax, calibrate it on `batches` micro-batches of the TRAIN
 * split of data/val_data (never the data it is evaluated on) and store the new state in w, so
 * later evaluators built from w share it. Prints what it did unless quiet. Returns 1
 * calibrated, 0 not needed, -1 error (err filled). */
int cli_calibrate(fp8t_evaluator *ev, fp8t_weights *w, const char *data, const char *val_data,
                  uint64_t seed, int batches, int quiet, char *err, size_t errlen);
/* The same with text data through a tokenizer.json (NULL or "" = bytes). */
int cli_calibrate_tok(fp8t_evaluator *ev, fp8t_weights *w, const char *data, const char *val_data,
                      const char *tokenizer, uint64_t seed, int batches, int quiet, char *err,
                      size_t errlen);

/* The inference model's options shared by generate, eval --infer and bench-infer:
 *   --act-scale current|delayed|calibrated, --kv-cache bf16|fp8|fp32, --calib-data SRC,
 *   --calib-batches N, --rows N, --mlp-rows N, --prefetch-mb N (value options) and --no-graphs,
 *   --fp8-head (flags). */
typedef struct {
    fp8t_act_scale act;
    int kv;                 /* fp8t_kv_kind, -1: the precision's default */
    const char *calib_data; /* NULL: the command's default data */
    int calib_batches;      /* default 4 */
    int rows;               /* 0: the default */
    int mlp_rows;           /* 0: the default */
    int prefetch_mb;        /* -1: the default */
    int no_graphs, fp8_head;
} cli_infer_opts;
void cli_infer_opts_init(cli_infer_opts *o);
/* The same options as rows of a command's option table, for a cli_infer_opts at member M of
 * the command's options struct T; each command gives the help in its own words (and the
 * default of --kv-cache and --calib-data, which depend on it). */
extern const fp8t_opt_choice CLI_ACT_SCALES[], CLI_KV_CACHES[], CLI_EVAL_PRECISIONS[];
#define CLI_ROW_ACT_SCALE(T, M, help_)                                                           \
    {                                                                                            \
        .name = "act-scale", .arg = "current|delayed|calibrated", .type = FP8T_OPT_CHOICE,       \
        FP8T_OPT_FIELD(T, M.act), .choices = CLI_ACT_SCALES, .help = help_                       \
    }
#define CLI_ROW_KV_CACHE(T, M, dflt_, help_)                                                     \
    {                                                                                            \
        .name = "kv-cache", .arg = "bf16|fp8|fp32", .type = FP8T_OPT_CHOICE,                     \
        FP8T_OPT_FIELD(T, M.kv), .choices = CLI_KV_CACHES, .dflt = dflt_, .help = help_          \
    }
#define CLI_ROW_CALIB_DATA(T, M, dflt_, help_)                                                   \
    {                                                                                            \
        .name = "calib-data", .arg = "SRC", .type = FP8T_OPT_STR,                                \
        FP8T_OPT_FIELD(T, M.calib_data), .dflt = dflt_, .help = help_                            \
    }
#define CLI_ROW_CALIB_BATCHES(T, M, help_)                                                       \
    {                                                                                            \
        .name = "calib-batches", .arg = "N", .type = FP8T_OPT_INT,                               \
        FP8T_OPT_FIELD(T, M.calib_batches), .lo = 1, .hi = 100000, .help = help_                 \
    }
/* --rows and --mlp-rows as a row's fields (a command that groups its options adds .group),
 * their defaults the library's (infer.h) */
#define CLI_STR_(x) #x
#define CLI_STR(x) CLI_STR_(x)
#define CLI_FIELDS_ROWS(T, M)                                                                    \
    .name = "rows", .arg = "N", .type = FP8T_OPT_INT, FP8T_OPT_FIELD(T, M.rows), .lo = 1,        \
    .hi = 1 << 24, .dflt = CLI_STR(FP8T_INFER_ROWS_DEFAULT),                                     \
    .help = "activation rows, the tokens of one prefill pass"
#define CLI_FIELDS_MLP_ROWS(T, M)                                                                \
    .name = "mlp-rows", .arg = "N", .type = FP8T_OPT_INT, FP8T_OPT_FIELD(T, M.mlp_rows),         \
    .lo = 1, .hi = 1 << 24, .dflt = CLI_STR(FP8T_INFER_MLP_ROWS_DEFAULT),                        \
    .help = "rows of one MLP pass within a prefill pass (at least the batch, at most --rows): "  \
            "the MLP's hidden activations are a layer's largest buffers"
#define CLI_FIELDS_PREFETCH_MB(T, M)                                                             \
    .name = "prefetch-mb", .arg = "MIB", .type = FP8T_OPT_INT, FP8T_OPT_FIELD(T, M.prefetch_mb), \
    .lo = 0, .hi = 1024, .dflt = CLI_STR(FP8T_INFER_PREFETCH_MB_DEFAULT),                        \
    .help =                                                                                      \
        "decode (GPU): as each GEMM starts, bring the first MIB MiB of the next weight into "    \
        "L2, which a GEMM of a few rows reads faster than memory (0: off; changes no value)"
#define CLI_ROW_PREFETCH_MB(T, M)                                                                \
    { CLI_FIELDS_PREFETCH_MB(T, M) }
#define CLI_ROW_ROWS(T, M)                                                                       \
    { CLI_FIELDS_ROWS(T, M) }
#define CLI_ROW_MLP_ROWS(T, M)                                                                   \
    { CLI_FIELDS_MLP_ROWS(T, M) }
#define CLI_ROW_NO_GRAPHS(T, M, help_)                                                           \
    { .name = "no-graphs", .type = FP8T_OPT_FLAG, FP8T_OPT_FIELD(T, M.no_graphs), .help = help_ }
/* The micro-batch shape of a command that runs a checkpoint on data (eval, inspect): --batch
 * and --seq-len into int members B and T of T_, by default the run's */
#define CLI_ROW_BATCH(T_)                                                                        \
    {                                                                                            \
        .name = "batch", .arg = "B", .type = FP8T_OPT_INT, FP8T_OPT_FIELD(T_, B), .lo = 1,       \
        .hi = 1 << 20, .dflt = "the run's, else 8", .help = "micro-batch size"                   \
    }
#define CLI_ROW_SEQ_LEN(T_)                                                                      \
    {                                                                                            \
        .name = "seq-len", .arg = "T", .type = FP8T_OPT_INT, FP8T_OPT_FIELD(T_, T), .lo = 1,     \
        .hi = 1 << 20, .dflt = "the run's, else min(seq_len, 256)",                              \
        .help = "micro-batch sequence length"                                                    \
    }
/* --device of a command that runs a checkpoint (eval, generate, inspect): a string member
 * device of T_, by default the run's */
#define CLI_ROW_RUN_DEVICE(T_)                                                                   \
    {                                                                                            \
        .name = "device", .arg = "cpu|cuda", .type = FP8T_OPT_STR, FP8T_OPT_FIELD(T_, device),   \
        .dflt = "the run's, else cpu", .help = "backend"                                         \
    }
#define CLI_ROW_FP8_HEAD(T, M, help_)                                                            \
    { .name = "fp8-head", .type = FP8T_OPT_FLAG, FP8T_OPT_FIELD(T, M.fp8_head), .help = help_ }

/* the model options of prec with o's choices */
void cli_infer_model_opts(const cli_infer_opts *o, fp8t_eval_precision prec,
                          fp8t_infer_opts *out);
/* "bf16" / "fp8" / "fp32" for a cache kind */
const char *cli_kv_name(int kv);
/* A calibrated fp8 model's scales from `batches` micro-batches [nb, T] of the TRAIN split of
 * data (val_data, tokenizer as fp8t_data_open_tok; never the data it is evaluated on); other
 * models: nothing. 0 ok; -1 with err. */
int cli_infer_calibrate(fp8t_infer *m, const char *data, const char *val_data,
                        const char *tokenizer, uint64_t seed, int batches, int nb, int T,
                        char *err, size_t errlen);

/* May `cmd` (import, export) write to --to `to`? A path that does not exist, or an empty
 * directory: yes. A non-empty directory (dir_target) or an existing file (!dir_target): only
 * with --overwrite, which then replaces only the files `cmd` writes (`writes`, for the
 * message); anything else there is never touched. 0 yes; 2 after printing why not. */
int cli_check_to(const char *cmd, const char *to, int dir_target, int overwrite,
                 const char *writes);

/* The model and backend options of a command without options of its own for them: the
 * environment's debugging switches (fp8t_options_debug_env, e.g. FP8TRAIN_CUDA_ATTN=tiled for
 * an exact comparison). 0 ok; -1 after printing why, as "fp8train CMD: ...". */
typedef struct {
    fp8t_model_options model;
    fp8t_backend_options backend;
} cli_debug_opts;
int cli_debug_options(const char *cmd, cli_debug_opts *o);

#endif
