/* `fp8train export WEIGHTS --to DIR`: a Hugging Face directory (GPT2LMHeadModel /
 * LlamaForCausalLM layout) in BF16, FP8 E4M3 with scales, or FP32; or an llm.c GPT-2 .bin.
 * Exit status: 0 ok, 1 failed while writing, 2 bad input or usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h> /* strcasecmp */

#include "cli/cmd_weights_common.h"
#include "fp8train/backend.h"
#include "fp8train/error.h"
#include "fp8train/eval.h"
#include "fp8train/export.h"

#define CMD "export"

/* "5GB", "500MB", "100KB" (powers of 10, as transformers reads them), "2GiB", or bytes. */
static int parse_size(const char *v, size_t *out) {
    char *end;
    double x = strtod(v, &end);
    static const struct {
        const char *suffix;
        double mul;
    } U[] = {{"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},          {"GB", 1e9},
             {"TB", 1e12}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
    if (end == v || !(x > 0)) return -1;
    for (size_t i = 0; i < sizeof(U) / sizeof(U[0]); i++)
        if (!strcasecmp(end, U[i].suffix) && x * U[i].mul >= 1 && x * U[i].mul < 1e18) {
            *out = (size_t)(x * U[i].mul);
            return 0;
        }
    return -1;
}

typedef struct {
    const char *to, *calib_data, *device;
    int llmc; /* --format */
    fp8t_export_dtype dtype;
    int calib_batches, overwrite, block, pow2;
    size_t max_shard;
} export_opts;

static int set_dtype(void *obj, const char *v, char *err, size_t errlen) {
    if (fp8t_export_dtype_parse(&((export_opts *)obj)->dtype, v) == 0) return 0;
    return fp8t_errorf(err, errlen, "--dtype: bad value '%s' (expected bf16, fp8 or fp32)", v);
}
static void get_dtype(const void *obj, char *b, size_t n) {
    snprintf(b, n, "%s", fp8t_export_dtype_name(((const export_opts *)obj)->dtype));
}
static int set_max_shard(void *obj, const char *v, char *err, size_t errlen) {
    if (parse_size(v, &((export_opts *)obj)->max_shard) == 0) return 0;
    return fp8t_errorf(err, errlen,
                       "--max-shard-size: bad value '%s' (expected a size like 5GB, 500MB, "
                       "2GiB or a number of bytes)",
                       v);
}

static const fp8t_opt_choice FORMATS[] = {{"hf", 0}, {"llmc", 1}, {NULL, 0}};

#define F(f) FP8T_OPT_FIELD(export_opts, f)
static const fp8t_opt OPTS[] = {
    {.name = "to",
     .arg = "DIR",
     .type = FP8T_OPT_STR,
     F(to),
     .dflt = FP8T_OPT_NO_DEFAULT,
     .help = "output directory (config.json + model.safetensors), new or empty; or the .bin "
             "file with --format llmc, new (required)"},
    {.name = "overwrite",
     .type = FP8T_OPT_FLAG,
     F(overwrite),
     .help = "DIR may hold files: replace config.json and model.safetensors in it and keep the "
             "rest (with llmc: replace the .bin)"},
    {.name = "dtype",
     .arg = "D",
     .type = FP8T_OPT_SPECIAL,
     .set = set_dtype,
     .get = get_dtype,
     .help = "bf16 | fp8 | fp32. fp8: linear weights F8_E4M3 + <module>.weight_scale_inv (F32 "
             "[1], weight = fp8 * weight_scale_inv, from the weight's own amax) + "
             "<module>.input_scale (F32 [1], the activation scale learned in training: max of "
             "the FP8 amax history / 448); embeddings, norms, biases BF16; config.json gets a "
             "quantization_config (docs/export.md)"},
    {.name = "block",
     .arg = "B",
     .type = FP8T_OPT_INT,
     F(block),
     .lo = 1,
     .hi = 1 << 20,
     .dflt = "off",
     .help = "with --dtype fp8 (Llama/Qwen2), B = 128: transformers' fine-grained FP8 layout "
             "instead, which AutoModelForCausalLM loads as it is: <module>.weight_scale_inv F32 "
             "[ceil(N/128), ceil(K/128)], one per 128x128 block (the `block` precision's "
             "DeepSeek-V3 rule), no input_scale (activation_scheme dynamic); no calibration "
             "needed"},
    {.name = "pow2-scales",
     .type = FP8T_OPT_FLAG,
     F(pow2),
     .help = "with --dtype fp8: weight scales rounded down to powers of two (weight_scale_inv "
             "exactly 1/scale; at most 1 bit of range lost)"},
    {.name = "max-shard-size",
     .arg = "S",
     .type = FP8T_OPT_SPECIAL,
     .set = set_max_shard,
     .dflt = "one file",
     .help = "cut the safetensors into shards of at most S (e.g. 5GB, 500MB, 2GiB, or bytes) "
             "with model.safetensors.index.json, as transformers' save_pretrained does"},
    {.name = "format",
     .arg = "F",
     .type = FP8T_OPT_CHOICE,
     F(llmc),
     .choices = FORMATS,
     .help = "hf | llmc (llm.c GPT-2 checkpoint; --dtype fp32 -> v3, bf16 -> v5)"},
    {.name = "calib-data",
     .arg = "SRC",
     .type = FP8T_OPT_STR,
     F(calib_data),
     .dflt = "the run's data, else synthetic",
     .help = "data to calibrate FP8 input scales on when the weights carry no amax history"},
    {.name = "calib-batches",
     .arg = "N",
     .type = FP8T_OPT_INT,
     F(calib_batches),
     .lo = 1,
     .hi = 100000,
     .help = "calibration micro-batches"},
    {.name = "device",
     .arg = "cpu|cuda",
     .type = FP8T_OPT_STR,
     F(device),
     .help = "backend used for calibration"},
};
#undef F

static const fp8t_opt_spec SPEC = {
    .cmd = CMD,
    .usage = "WEIGHTS --to DIR [options]",
    .about = "Export WEIGHTS (usually a checkpoint, RUN/checkpoints/step_N) for other tools.\n",
    .epilog = "exit status: 0 ok, 1 failed while writing, 2 bad input\n",
    .opts = OPTS,
    .n_opts = (int)(sizeof(OPTS) / sizeof(OPTS[0])),
    .max_pos = 1,
    .wrap = CLI_HELP_WRAP,
};

int fp8t_cmd_export(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], "export")) {
        argc--;
        argv++;
    }
    export_opts o = {.to = NULL,
                     .calib_data = NULL,
                     .device = "cpu",
                     .llmc = 0,
                     .dtype = FP8T_EXPORT_BF16,
                     .calib_batches = 4};
    const char *weights = NULL;
    int n_pos = 0, st = cli_parse(&SPEC, &o, sizeof(o), argc, argv, &weights, &n_pos);
    if (st >= 0) return st;
    const char *to = o.to, *calib_data = o.calib_data, *device = o.device;
    const fp8t_export_dtype dtype = o.dtype;
    const int calib_batches = o.calib_batches, overwrite = o.overwrite, block = o.block,
              pow2 = o.pow2, llmc = o.llmc;
    const size_t max_shard = o.max_shard;
    if (!weights || !to) {
        fprintf(stderr,
                "fp8train export: need WEIGHTS and --to DIR (see fp8train export --help)\n");
        return 2;
    }
    if (llmc && dtype == FP8T_EXPORT_FP8) {
        fprintf(stderr, "fp8train export: llm.c checkpoints hold fp32 (v3) or bf16 (v5) weights, "
                        "not fp8\n");
        return 2;
    }
    char err[FP8T_ERR_LEN], desc[512];
    fp8t_export_options xo = {dtype, max_shard, block, pow2};
    /* the FP8 options alone (the model's architecture is checked once it is read) */
    if ((block || pow2) &&
        (llmc || fp8t_export_options_check(NULL, &xo, err, sizeof(err)) != 0)) {
        if (llmc)
            snprintf(err, sizeof(err),
                     "--block and --pow2-scales are for Hugging Face FP8 "
                     "exports, not --format llmc");
        fprintf(stderr, "fp8train export: %s\n", err);
        return 2;
    }
    if (cli_check_to(CMD, to, !llmc, overwrite, "config.json and model.safetensors")) return 2;
    fp8t_weights w;
    if (fp8t_weights_load(weights, &w, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train export: %s\n", err);
        return 2;
    }
    int status = 2;
    fp8t_backend *be = NULL;
    fp8t_evaluator *ev = NULL;
    cli_describe_weights(desc, sizeof(desc), &w);
    printf("weights: %s (%s)\n", weights, desc);
    if (fp8t_export_options_check(&w.model, &xo, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train export: %s\n", err);
        goto done; /* status 2: nothing written */
    }
    if (llmc) {
        if (fp8t_export_llmc(&w, to, dtype == FP8T_EXPORT_FP32 ? 3 : 5, err, sizeof(err)) != 0) {
            fprintf(stderr, "fp8train export: %s\n", err);
            status = 1;
            goto done;
        }
        printf("wrote %s (llm.c GPT-2 checkpoint, version %d, %s)\n", to,
               dtype == FP8T_EXPORT_FP32 ? 3 : 5, dtype == FP8T_EXPORT_FP32 ? "fp32" : "bf16");
        status = 0;
        goto done;
    }
    if (dtype == FP8T_EXPORT_FP8 && !block) {
        /* input scales need an amax history; weights that never ran a step get one here (block
         * scaling writes none: its activations are scaled at run time) */
        cli_run_defaults def;
        cli_run_defaults_from(&w, &def);
        cli_debug_opts dbg;
        if (cli_debug_options("export", &dbg) != 0) goto done;
        if (!(be = fp8t_backend_create(device, &dbg.backend, err, sizeof(err)))) {
            fprintf(stderr, "fp8train export: --device %s: %s\n", device, err);
            goto done;
        }
        if (!(ev = fp8t_evaluator_create(be, &w, &dbg.model, def.batch, def.seq_len, err,
                                         sizeof(err)))) {
            fprintf(stderr, "fp8train export: %s\n", err);
            goto done;
        }
        if (cli_calibrate(ev, &w, calib_data ? calib_data : def.data,
                          calib_data ? "" : def.val_data, def.seed, calib_batches, 0, err,
                          sizeof(err)) < 0) {
            fprintf(stderr, "fp8train export: %s\n", err);
            goto done;
        }
    }
    fp8t_export_report rep;
    if (fp8t_export_hf_opts(&w, to, &xo, &rep, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train export: %s\n", err);
        status = 1;
        goto done;
    }
    char files[64];
    if (rep.n_shards > 1)
        snprintf(files, sizeof(files), "%d shards + model.safetensors.index.json", rep.n_shards);
    else
        snprintf(files, sizeof(files), "model.safetensors");
    printf("wrote %s/%s (%d tensors, %.2f MB, %s) and %s/config.json (%s)\n", to, files,
           rep.n_tensors, rep.bytes / 1e6, fp8t_export_dtype_name(dtype), to,
           w.model.arch == FP8T_ARCH_GPT2 ? "GPT2LMHeadModel"
           : w.model.qkv_bias             ? "Qwen2ForCausalLM"
                                          : "LlamaForCausalLM");
    if (dtype == FP8T_EXPORT_FP8 && block) {
        printf(
            "fp8: %d weight matrices in E4M3 with %dx%d block weight_scale_inv%s "
            "(quantization_config: fp8, weight_block_size [%d, %d], activation_scheme dynamic)\n",
            rep.n_fp8, block, block, pow2 ? " (powers of two)" : "", block, block);
    } else if (dtype == FP8T_EXPORT_FP8) {
        printf(
            "fp8: %d weight matrices in E4M3 with per-tensor weight_scale_inv%s; input_scale in "
            "[%.4g, %.4g]\n",
            rep.n_fp8, pow2 ? " (power of two)" : "", (double)rep.min_input_scale,
            (double)rep.max_input_scale);
        if (rep.n_act_fallback)
            fprintf(stderr,
                    "fp8train export: warning: %d linear layers had no amax history; their "
                    "input_scale is the state's scale_inv\n",
                    rep.n_act_fallback);
    }
    printf("check it: fp8train eval %s --check-export %s\n", weights, to);
    status = 0;
done:
    fp8t_evaluator_destroy(ev);
    fp8t_backend_destroy(be);
    fp8t_weights_free(&w);
    return status;
}
