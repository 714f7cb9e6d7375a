/* bench/peers/pytorch_gpt.py (the PyTorch reference of bench/gpu.sh --peers) against fp8train's
 * own presets, without PyTorch (the script imports torch only to run a model):
 *  - --dry-run: each of the four benchmark models has the shape of src/model/config.c's preset
 *    (layers, width, heads, K/V heads, vocabulary, MLP width, positions, RoPE, tied head) and
 *    the parameter count of fp8t_model_param_table;
 *  - --table: the markdown table of a results file, with the ratios to PyTorch BF16 computed
 *    from its numbers, "n/a" where a run is missing or failed;
 *  - bad arguments exit with status 2.
 * Runs the script with FP8TRAIN_PYTHON (default python3) from the repository root
 * (FP8T_PEERS_SCRIPT overrides the path); without a Python it says SKIP. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fp8train/model.h"
#include "test.h"

static const char *py, *script;
static char g_tmp[] = "/tmp/fp8t_peers_XXXXXX";

/* run "PY SCRIPT args" and capture stdout into buf; the exit status */
static int run_script(const char *args, char *buf, size_t len) {
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s %s %s 2>/dev/null", py, script, args);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int json_int(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? (int)v->valuedouble : -1;
}

static void presets_match(void) {
    static char buf[1 << 16];
    T_ASSERT(run_script("--dry-run --model all", buf, sizeof(buf)) == 0, "--dry-run failed");
    static const char *names[] = {"gpt2-124m", "gpt2-350m", "gpt2-1.5b", "llama-1b"};
    int found = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "model");
        T_ASSERT(cJSON_IsString(name), "not a model line: %s", line);
        fp8t_model_config c;
        T_CHECK(fp8t_model_preset(&c, name->valuestring) == 0, "%s is no fp8train preset",
                name->valuestring);
        size_t n = 0;
        fp8t_model_param_table(&c, NULL, &n);
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "params");
        const cJSON *arch = cJSON_GetObjectItemCaseSensitive(o, "arch");
        const int kv = c.n_kv_head > 0 ? c.n_kv_head : c.n_head;
        T_CHECK(cJSON_IsNumber(params) && (double)n == params->valuedouble,
                "%s: %zu parameters in fp8train, %.0f in the script", name->valuestring, n,
                cJSON_IsNumber(params) ? params->valuedouble : -1.0);
        T_CHECK(cJSON_IsString(arch) && !strcmp(arch->valuestring, fp8t_arch_name(c.arch)) &&
                    json_int(o, "n_layer") == c.n_layer && json_int(o, "n_embd") == c.n_embd &&
                    json_int(o, "n_head") == c.n_head && json_int(o, "n_kv_head") == kv &&
                    json_int(o, "vocab") == c.vocab_size &&
                    json_int(o, "mlp_hidden") == c.mlp_hidden &&
                    json_int(o, "max_seq") == c.seq_len && !c.untied_head && !c.qkv_bias,
                "%s: the script's shape differs from the preset: %s", name->valuestring, line);
        if (c.arch == FP8T_ARCH_LLAMA) {
            const cJSON *th = cJSON_GetObjectItemCaseSensitive(o, "rope_theta");
            const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(rs, "factor");
            T_CHECK(cJSON_IsNumber(th) && th->valuedouble == (double)c.rope_theta &&
                        c.rope_scaling.type == FP8T_ROPE_LLAMA3 && cJSON_IsNumber(f) &&
                        f->valuedouble == (double)c.rope_scaling.factor &&
                        json_int(rs, "original_max_pos") == c.rope_scaling.original_max_pos,
                    "%s: RoPE differs: %s", name->valuestring, line);
        }
        for (int i = 0; i < 4; i++) found += !strcmp(names[i], name->valuestring);
        cJSON_Delete(o);
    }
    T_CHECK(found == 4, "%d of the 4 benchmark models listed", found);
}

static void markdown_table(void) {
    char path[256];
    snprintf(path, sizeof(path), "%s/r.jsonl", g_tmp);
    FILE *f = fopen(path, "w");
    T_ASSERT(f, "cannot write %s", path);
    /* 124M: every run; llama-1b: the peers failed (an error line, a skipped torchao) */
    fputs(
        "{\"source\": \"fp8train\", \"model\": \"gpt2-124m\", \"batch\": 32, \"precision\": "
        "\"bf16\", \"tokens_per_s\": 400000, \"peak_gib\": 30.0}\n"
        "{\"source\": \"fp8train\", \"model\": \"gpt2-124m\", \"batch\": 32, \"precision\": "
        "\"fp8-delayed\", \"tokens_per_s\": 600000, \"peak_gib\": 12.0}\n"
        "{\"model\": \"gpt2-124m\", \"batch\": 32, \"precision\": \"bf16\", \"tokens_per_s\": "
        "500000, \"peak_gib\": 15.0}\n"
        "{\"model\": \"gpt2-124m\", \"batch\": 32, \"precision\": \"torchao-fp8\", "
        "\"tokens_per_s\": 480000, \"peak_gib\": 11.5}\n"
        "noise from a compiler warning\n"
        "{\"source\": \"fp8train\", \"model\": \"llama-1b\", \"batch\": 16, \"precision\": "
        "\"bf16\", \"tokens_per_s\": 55300, \"peak_gib\": 77.0}\n"
        "{\"model\": \"llama-1b\", \"batch\": 16, \"precision\": \"bf16\", \"error\": \"OOM\"}\n"
        "{\"model\": \"llama-1b\", \"batch\": 16, \"precision\": \"torchao-fp8\", \"skipped\": "
        "\"torchao not importable\"}\n",
        f);
    fclose(f);
    static char buf[8192];
    char args[300];
    snprintf(args, sizeof(args), "--table %s", path);
    T_ASSERT(run_script(args, buf, sizeof(buf)) == 0, "--table failed");
    char *l124 = strstr(buf, "| gpt2-124m, 32 |"), *lllama = strstr(buf, "| llama-1b, 16 |");
    T_ASSERT(strstr(buf, "| model, batch |") && l124 && lllama && l124 < lllama,
             "rows missing or out of order:\n%s", buf);
    char *end = strchr(l124, '\n');
    if (end) *end = 0;
    /* speed 400K / 500K = 0.80, 600K / 500K = 1.20; memory 30 / 15 = 2.00, 12 / 15 = 0.80 */
    T_CHECK(strstr(l124, "400K, 30.0 GiB") && strstr(l124, "600K, 12.0 GiB") &&
                strstr(l124, "500K, 15.0 GiB") && strstr(l124, "480K, 11.5 GiB") &&
                strstr(l124, "| 0.80 / 1.20 |") && strstr(l124, "| 2.00 / 0.80 |"),
            "124M row: %s", l124);
    T_CHECK(strstr(lllama, "55.3K, 77.0 GiB | n/a | n/a | n/a | n/a / n/a | n/a / n/a |"),
            "llama row: %s", lllama);
}

static void bad_arguments(void) {
    char buf[4096];
    T_CHECK(run_script("--model gpt2-7b --dry-run", buf, sizeof(buf)) == 2, "unknown model");
    T_CHECK(run_script("--model gpt2-124m --seq 2048 --dry-run", buf, sizeof(buf)) == 2,
            "--seq beyond the model's positions");
    T_CHECK(run_script("--batch 0 --dry-run", buf, sizeof(buf)) == 2, "--batch 0");
}

int main(void) {
    t_suite = "peers_script";
    py = getenv("FP8TRAIN_PYTHON") ? getenv("FP8TRAIN_PYTHON") : "python3";
    script =
        getenv("FP8T_PEERS_SCRIPT") ? getenv("FP8T_PEERS_SCRIPT") : "bench/peers/pytorch_gpt.py";
    char probe[512];
    snprintf(probe, sizeof(probe), "%s -c 'import json' >/dev/null 2>&1", py);
    if (system(probe) != 0 || access(script, R_OK) != 0) {
        printf("SKIP peers_script: no %s or no %s (run from the repository root)\n", py, script);
        return 0;
    }
    if (!mkdtemp(g_tmp)) {
        printf("FAIL peers_script: mkdtemp\n");
        return 1;
    }
    T_RUN(presets_match);
    T_RUN(markdown_table);
    T_RUN(bad_arguments);
    char rm[300];
    snprintf(rm, sizeof(rm), "rm -rf %s", g_tmp);
    if (system(rm) != 0) printf("  (could not remove %s)\n", g_tmp);
    T_MAIN_END();
}
