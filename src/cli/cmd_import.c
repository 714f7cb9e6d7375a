/* `fp8train import SRC --to CKPT_DIR`: llm.c GPT-2 checkpoints and Hugging Face GPT-2/Llama
 * directories (including our own BF16/FP8 exports) as a training checkpoint at step 0 that
 * `fp8train train --resume CKPT_DIR` continues from. Exit status: 0 ok, 1 failed while
 * writing, 2 bad input or usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_weights_common.h"
#include "fp8train/error.h"
#include "fp8train/export.h"

#define CMD "import"

typedef struct {
    const char *to;
    uint64_t seed;
    int overwrite;
} import_opts;

#define F(f) FP8T_OPT_FIELD(import_opts, f)
static const fp8t_opt OPTS[] = {
    {.name = "to",
     .arg = "CKPT_DIR",
     .type = FP8T_OPT_STR,
     F(to),
     .dflt = FP8T_OPT_NO_DEFAULT,
     .help = "the checkpoint directory to write: new or empty (required)"},
    {.name = "overwrite",
     .type = FP8T_OPT_FLAG,
     F(overwrite),
     .help = "CKPT_DIR may hold files: replace the checkpoint files in it "
             "(model/optimizer/fp8_meta.safetensors, state.json), keep the rest"},
    {.name = "seed",
     .arg = "S",
     .type = FP8T_OPT_U64,
     F(seed),
     .help = "the seed recorded in the checkpoint (the data order of a resumed run; the "
             "default is fp8train train's)"},
};
#undef F

static const fp8t_opt_spec SPEC = {
    .cmd = CMD,
    .usage = "SRC --to CKPT_DIR [--seed S] [--overwrite]",
    .about =
        "SRC: an llm.c GPT-2 checkpoint (gpt2_124M.bin fp32 v3 or gpt2_124M_bf16.bin v5; the\n"
        "vocabulary padding rows Vp > V are dropped), or a Hugging Face directory with\n"
        "config.json and model.safetensors or sharded shards + model.safetensors.index.json\n"
        "(GPT2LMHeadModel, LlamaForCausalLM or Qwen2ForCausalLM: grouped-query attention,\n"
        "tied or untied head, llama3 RoPE scaling; F32/F16/BF16, or FP8 E4M3 dequantized with\n"
        "weight_scale_inv, per tensor or 128x128 blocks (export --block 128; the block rounding\n"
        "stays in the weights); input_scale seeds the FP8 activation scales).\n"
        "Writes a checkpoint at step 0 with zero AdamW moments and data position 0.\n",
    .epilog = "then: fp8train train --resume CKPT_DIR --steps N --out RUN [--data ...]\n"
              "(or skip the checkpoint: fp8train train --init SRC --steps N --out RUN)\n"
              "Exit status: 0 ok, 1 failed while writing, 2 bad input or usage.\n",
    .opts = OPTS,
    .n_opts = (int)(sizeof(OPTS) / sizeof(OPTS[0])),
    .max_pos = 1,
    .wrap = CLI_HELP_WRAP,
};

int fp8t_cmd_import(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], "import")) {
        argc--;
        argv++;
    }
    import_opts o = {.to = NULL, .seed = 1337, .overwrite = 0};
    const char *src = NULL;
    int n_pos = 0, rc = cli_parse(&SPEC, &o, sizeof(o), argc, argv, &src, &n_pos);
    if (rc >= 0) return rc;
    const char *to = o.to;
    const uint64_t seed = o.seed;
    const int overwrite = o.overwrite;
    if (!src || !to) {
        fprintf(stderr,
                "fp8train import: need SRC and --to CKPT_DIR (see fp8train import --help)\n");
        return 2;
    }
    /* before reading SRC (which may take long): a refusal comes at once */
    if (cli_check_to(CMD, to, 1, overwrite,
                     "the checkpoint files (model.safetensors, "
                     "optimizer.safetensors, fp8_meta.safetensors, state.json)"))
        return 2;
    char err[FP8T_ERR_LEN], desc[512];
    fp8t_weights w;
    if (fp8t_weights_load(src, &w, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train import: %s\n", err);
        return 2;
    }
    cli_describe_weights(desc, sizeof(desc), &w);
    printf("read %s (%s)\n", src, desc);
    if (w.notes[0]) printf("  %s\n", w.notes);
    int status = 0;
    if (fp8t_weights_save_checkpoint(&w, to, seed, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train import: %s\n", err);
        status = 1;
    } else {
        printf("wrote checkpoint %s: step 0, %zu parameters, zero AdamW moments, %s FP8 state\n",
               to, w.num_params, w.fp8_state ? "seeded" : "fresh");
        printf("continue training: fp8train train --resume %s --steps N --out RUN\n", to);
    }
    fp8t_weights_free(&w);
    return status;
}
