/* fp8train — the command line: `fp8train <command> [options]`.
 *
 * Each subcommand lives in its own src/cli/cmd_<name>.c and defines
 *     int fp8t_cmd_<name>(int argc, char **argv);   (argv[0]: the first argument after <name>)
 * returning the process exit status. The table below names every subcommand; its function is
 * a weak reference, so a subcommand whose file is not written yet links as NULL and answers
 * "not built yet". Adding a subcommand = adding its file and one line here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp8train/train_options.h"

typedef int (*command_fn)(int argc, char **argv);

#define WEAK __attribute__((weak))
WEAK int fp8t_cmd_train(int argc, char **argv);
WEAK int fp8t_cmd_curves(int argc, char **argv);
WEAK int fp8t_cmd_compare(int argc, char **argv);
WEAK int fp8t_cmd_bisect(int argc, char **argv);
WEAK int fp8t_cmd_inspect(int argc, char **argv);
WEAK int fp8t_cmd_eval(int argc, char **argv);
WEAK int fp8t_cmd_generate(int argc, char **argv);
WEAK int fp8t_cmd_bench_infer(int argc, char **argv);
WEAK int fp8t_cmd_export(int argc, char **argv);
WEAK int fp8t_cmd_import(int argc, char **argv);
WEAK int fp8t_cmd_tokenize(int argc, char **argv);
WEAK int fp8t_cmd_tensorboard(int argc, char **argv);

typedef struct {
    const char *name;
    command_fn fn;
    const char *help; /* one line */
} command;

static const command COMMANDS[] = {
    {"train", fp8t_cmd_train, "train a model in FP8/BF16: metrics, checkpoints, detectors"},
    {"curves", fp8t_cmd_curves, "print runs' loss curves side by side (table + ASCII plot)"},
    {"compare", fp8t_cmd_compare,
     "compare two runs: gap over time, spike/drift/NaN, HTML report"},
    {"bisect", fp8t_cmd_bisect, "find the GEMM kind and layers behind an FP8 gap, and the fix"},
    {"inspect", fp8t_cmd_inspect, "tensor statistics and dumps of a run or a checkpoint"},
    {"eval", fp8t_cmd_eval, "evaluate a checkpoint's loss on data"},
    {"generate", fp8t_cmd_generate,
     "sample text from a checkpoint (KV cache, batches of prompts)"},
    {"bench-infer", fp8t_cmd_bench_infer,
     "inference tokens/s and memory: bf16 vs fp8, batch 1 and large"},
    {"export", fp8t_cmd_export,
     "export a checkpoint (Hugging Face layout, BF16 or FP8 + scales)"},
    {"import", fp8t_cmd_import, "import llm.c / Hugging Face weights as a checkpoint"},
    {"tokenize", fp8t_cmd_tokenize, "text/JSONL -> llm.c token shards with a tokenizer.json"},
    {"tensorboard", fp8t_cmd_tensorboard, "TensorBoard event files from a run's logs"},
};
#define N_COMMANDS ((int)(sizeof(COMMANDS) / sizeof(COMMANDS[0])))

static void usage(FILE *f) {
    fprintf(f,
            "fp8train %s — train transformer language models in FP8 and debug FP8 training\n\n"
            "usage: fp8train <command> [options]     (fp8train <command> --help for its "
            "options)\n\ncommands:\n",
            FP8T_VERSION);
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-11s %s%s\n", COMMANDS[i].name, COMMANDS[i].help,
                COMMANDS[i].fn ? "" : " (not built yet)");
    fprintf(f,
            "\nother:\n  --help     this text\n  --version  the version\n\n"
            "example: fp8train train --preset tiny --precision fp8 --steps 300 --out runs/fp8\n");
}

/* OpenMP threads that wait for work by spinning (libgomp's default) steal the cores from
 * whatever else runs on a busy machine and from each other: with two busy processes beside it,
 * training ran 27x slower than on an idle machine (issue 13), 5x slower than with
 * OMP_WAIT_POLICY=passive. So passive is the default here, unless the user set the variable
 * (OMP_WAIT_POLICY=active brings the spinning back). libgomp reads it once, in its library
 * constructor, before main runs: setting it now only takes effect in a new process image, so
 * the command re-executes itself once with the variable set (the variable marks the second
 * pass). If that exec fails (no /proc), the run goes on with libgomp's default. */
static void default_omp_wait_policy(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
}

int main(int argc, char **argv) {
    default_omp_wait_policy(argv);
    fp8t_dist_launch launch;
    fp8t_options_launch(&launch);
    fp8t_dist_set_launch(&launch);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        if (!strcmp(name, "help") && argc > 2) { /* fp8train help <command> */
            name = argv[2];
            for (int i = 0; i < N_COMMANDS; i++)
                if (!strcmp(COMMANDS[i].name, name) && COMMANDS[i].fn) {
                    char *args[] = {"--help", NULL};
                    return COMMANDS[i].fn(1, args);
                }
        }
        usage(stdout);
        return 0;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "-V") || !strcmp(name, "version")) {
        printf("fp8train %s\n", FP8T_VERSION);
        return 0;
    }
    for (int i = 0; i < N_COMMANDS; i++) {
        if (strcmp(COMMANDS[i].name, name) != 0) continue;
        if (!COMMANDS[i].fn) {
            fprintf(stderr, "fp8train: the '%s' command is not built yet in this version\n",
                    name);
            return 2;
        }
        return COMMANDS[i].fn(argc - 2, argv + 2);
    }
    fprintf(stderr, "fp8train: unknown command '%s' (expected one of:", name);
    for (int i = 0; i < N_COMMANDS; i++) fprintf(stderr, " %s", COMMANDS[i].name);
    fprintf(stderr, "; see fp8train --help)\n");
    return 2;
}
