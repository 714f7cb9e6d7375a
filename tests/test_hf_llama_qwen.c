/* Llama-3 / Qwen2 Hugging Face checkpoints made by transformers itself (tests/data/hf, written by
 * tests/data/hf/make_fixtures.py, sharded): grouped-query attention 4:1 and 2:1, an untied head,
 * Llama-3 RoPE scaling, Qwen2's q/k/v biases, FP32 and BF16 files.
 *   - the config is read into the right model (K/V heads, head tie, biases, RoPE), from
 *     transformers 5's rope_parameters and from the older rope_theta + rope_scaling alike;
 *   - import, then the FP32 loss on the fixture's token windows equals transformers' to 1e-5
 *     relative (expected.json holds transformers' loss; no Python runs here);
 *   - export -> import is bit-exact (FP32 export; BF16 export of BF16 weights) and writes the
 *     very tensor names and shapes transformers wrote; FP8 export -> import stays within the
 *     FP8 tolerance of the loss;
 *   - import -> training checkpoint -> load keeps the config and every bit. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <unistd.h>

#include "fp8train/backend.h"
#include "fp8train/checkpoint.h" /* fp8t_model_config_diff */
#include "fp8train/eval.h"
#include "fp8train/export.h"
#include "fp8train/io.h"
#include "fp8train/model.h"
#include "test.h"
#include "util/fs.h"

static char g_data[512]; /* tests/data/hf */
static char g_root[512]; /* scratch */

typedef struct {
    const char *name;
    int n_head, n_kv_head, untied, qkv_bias, rope_llama3;
    fp8t_export_dtype stored;
} fixture;

static const fixture FIX[] = {
    {"llama_gqa4_untied_rope3", 4, 1, 1, 0, 1, FP8T_EXPORT_FP32},
    {"llama_gqa2_tied_bf16", 8, 4, 0, 0, 0, FP8T_EXPORT_BF16},
    {"qwen2_gqa2_untied", 4, 2, 1, 1, 0, FP8T_EXPORT_FP32},
};
#define N_FIX ((int)(sizeof(FIX) / sizeof(FIX[0])))

static void fixture_dir(char *buf, size_t len, const fixture *f) {
    snprintf(buf, len, "%s/%s", g_data, f->name);
}

/* expected.json of a fixture: windows [n][B][T + 1] and transformers' mean loss. */
typedef struct {
    int n, B, T;
    int *win; /* [n * B * (T + 1)] */
    double loss;
} expected;

static int read_expected(const fixture *f, expected *e) {
    char path[700], err[512];
    memset(e, 0, sizeof(*e));
    snprintf(path, sizeof(path), "%s/%s/expected.json", g_data, f->name);
    char *text = NULL;
    size_t len;
    if (fp8t_read_file(path, &text, &len, err, sizeof(err)) != 0) {
        printf("  %s\n", err);
        return -1;
    }
    cJSON *o = cJSON_Parse(text);
    free(text);
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "windows");
    const cJSON *B = cJSON_GetObjectItemCaseSensitive(o, "B");
    const cJSON *T = cJSON_GetObjectItemCaseSensitive(o, "T");
    const cJSON *L = cJSON_GetObjectItemCaseSensitive(o, "loss");
    if (!cJSON_IsArray(w) || !cJSON_IsNumber(B) || !cJSON_IsNumber(T) || !cJSON_IsNumber(L)) {
        printf("  %s: windows/B/T/loss missing\n", path);
        cJSON_Delete(o);
        return -1;
    }
    e->n = cJSON_GetArraySize(w);
    e->B = B->valueint;
    e->T = T->valueint;
    e->loss = L->valuedouble;
    e->win = malloc((size_t)e->n * e->B * (e->T + 1) * sizeof(int));
    size_t k = 0;
    const cJSON *win, *row, *tok;
    cJSON_ArrayForEach(win, w) {
        cJSON_ArrayForEach(row, win) { cJSON_ArrayForEach(tok, row) e->win[k++] = tok->valueint; }
    }
    cJSON_Delete(o);
    return k == (size_t)e->n * e->B * (e->T + 1) ? 0 : -1;
}

/* The FP32 loss of w on the windows, as transformers computes it: the mean over windows of the
 * mean token loss. */
static double fp32_loss(const fp8t_weights *w, const expected *e) {
    char err[512];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    fp8t_evaluator *ev =
        be ? fp8t_evaluator_create(be, w, NULL, e->B, e->T, err, sizeof(err)) : NULL;
    double total = NAN;
    if (ev) {
        fp8t_evaluator_set_precision(ev, FP8T_EVAL_FP32);
        int *tok = malloc((size_t)e->B * e->T * sizeof(int));
        int *tgt = malloc((size_t)e->B * e->T * sizeof(int));
        total = 0.0;
        for (int i = 0; i < e->n; i++) {
            for (int b = 0; b < e->B; b++) {
                const int *row = e->win + ((size_t)i * e->B + b) * (e->T + 1);
                for (int t = 0; t < e->T; t++) {
                    tok[b * e->T + t] = row[t];
                    tgt[b * e->T + t] = row[t + 1];
                }
            }
            total += fp8t_evaluator_batch_loss(ev, tok, tgt);
        }
        total /= e->n;
        free(tok);
        free(tgt);
    } else {
        printf("  evaluator: %s\n", err);
    }
    fp8t_evaluator_destroy(ev);
    fp8t_backend_destroy(be);
    return total;
}

static int same_params(const fp8t_weights *a, const fp8t_weights *b) {
    return a->num_params == b->num_params &&
           memcmp(a->params, b->params, a->num_params * sizeof(float)) == 0;
}

static int same_config(const fp8t_model_config *a, const fp8t_model_config *b) {
    char why[256];
    return fp8t_model_config_diff(a, b, why, sizeof(why)) == 0;
}

static void test_config(void) {
    for (int i = 0; i < N_FIX; i++) {
        const fixture *f = &FIX[i];
        char dir[700], err[1024];
        fixture_dir(dir, sizeof(dir), f);
        fp8t_weights w;
        T_ASSERT(fp8t_weights_load(dir, &w, err, sizeof(err)) == 0, "%s: %s", f->name, err);
        const fp8t_model_config *c = &w.model;
        T_CHECK(c->arch == FP8T_ARCH_LLAMA && c->n_layer == 2 && c->n_embd == 64 &&
                    c->vocab_size == 256 && c->mlp_hidden == 128 && c->seq_len == 128,
                "%s: shape", f->name);
        T_CHECK(c->n_head == f->n_head && c->n_kv_head == f->n_kv_head, "%s: heads %d/%d",
                f->name, c->n_head, c->n_kv_head);
        T_CHECK(c->untied_head == f->untied && c->qkv_bias == f->qkv_bias, "%s: head/bias",
                f->name);
        T_CHECK((c->rope_scaling.type == FP8T_ROPE_LLAMA3) == f->rope_llama3, "%s: rope type",
                f->name);
        T_CHECK(w.stored_dtype == f->stored, "%s: stored %s", f->name,
                fp8t_export_dtype_name(w.stored_dtype));
        T_CHECK(!strcmp(w.kind, f->qkv_bias ? "hf-qwen2" : "hf-llama"), "%s: kind %s", f->name,
                w.kind);
        if (f->rope_llama3)
            T_CHECK(c->rope_theta == 100.0f && c->rope_scaling.factor == 4.0f &&
                        c->rope_scaling.low_freq_factor == 1.0f &&
                        c->rope_scaling.high_freq_factor == 4.0f &&
                        c->rope_scaling.original_max_pos == 32,
                    "%s: llama3 parameters", f->name);
        if (f->qkv_bias) T_CHECK(c->rope_theta == 1e6f, "qwen2 rope_theta %g", c->rope_theta);
        fp8t_weights_free(&w);
    }
}

/* transformers 4.x writes rope_theta at the top and "rope_scaling"; 5.x "rope_parameters" with
 * rope_theta inside: both must give the same model. */
static void test_legacy_rope_config(void) {
    const fixture *f = &FIX[0];
    char src[700], dir[700], path[800], cmd[2200], err[1024];
    fixture_dir(src, sizeof(src), f);
    snprintf(dir, sizeof(dir), "%s/legacy_rope", g_root);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s'", dir, src, dir);
    T_ASSERT(system(cmd) == 0, "copy");
    snprintf(path, sizeof(path), "%s/config.json", dir);
    char *text;
    size_t len;
    T_ASSERT(fp8t_read_file(path, &text, &len, err, sizeof(err)) == 0, "%s", err);
    cJSON *o = cJSON_Parse(text);
    free(text);
    cJSON *rp = cJSON_DetachItemFromObjectCaseSensitive(o, "rope_parameters");
    T_ASSERT(rp != NULL, "the fixture has rope_parameters");
    cJSON *th = cJSON_DetachItemFromObjectCaseSensitive(rp, "rope_theta");
    cJSON_AddItemToObject(o, "rope_theta", th);
    cJSON_AddItemToObject(o, "rope_scaling", rp);
    text = cJSON_Print(o);
    cJSON_Delete(o);
    T_ASSERT(fp8t_write_file_atomic(path, text, strlen(text), err, sizeof(err)) == 0, "%s", err);
    free(text);
    fp8t_weights a, b;
    T_ASSERT(fp8t_weights_load(src, &a, err, sizeof(err)) == 0, "%s", err);
    if (fp8t_weights_load(dir, &b, err, sizeof(err)) != 0) {
        fp8t_weights_free(&a);
        T_ASSERT(0, "legacy: %s", err);
    }
    T_CHECK(same_config(&a.model, &b.model), "legacy rope_scaling reads as rope_parameters");
    T_CHECK(b.model.rope_theta == 100.0f && b.model.rope_scaling.type == FP8T_ROPE_LLAMA3,
            "legacy values");
    T_CHECK(same_params(&a, &b), "same weights");
    fp8t_weights_free(&a);
    fp8t_weights_free(&b);
}

static void test_loss_matches_transformers(void) {
    for (int i = 0; i < N_FIX; i++) {
        const fixture *f = &FIX[i];
        char dir[700], err[1024];
        fixture_dir(dir, sizeof(dir), f);
        expected e;
        T_ASSERT(read_expected(f, &e) == 0, "%s: expected.json", f->name);
        fp8t_weights w;
        if (fp8t_weights_load(dir, &w, err, sizeof(err)) != 0) {
            free(e.win);
            T_ASSERT(0, "%s: %s", f->name, err);
        }
        double ours = fp32_loss(&w, &e);
        double rel = fabs(ours - e.loss) / fabs(e.loss);
        printf("  %-26s fp8train fp32 %.7f  transformers %.7f  rel %.2e\n", f->name, ours, e.loss,
               rel);
        T_CHECK(rel <= 1e-5, "%s: relative difference %.3g > 1e-5", f->name, rel);
        free(e.win);
        fp8t_weights_free(&w);
    }
}

/* The tensor names and shapes of every safetensors file in dir (sharded or not), sorted into a
 * "name:shape\n" list. */
static char *tensor_list(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "ls '%s' | grep '\\.safetensors$'", dir);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    char line[512], err[512];
    char **items = NULL;
    int n = 0;
    while (fgets(line, sizeof(line), p)) {
        line[strcspn(line, "\n")] = 0;
        char path[1200];
        snprintf(path, sizeof(path), "%s/%s", dir, line);
        fp8t_st_file *f;
        if (fp8t_st_open(&f, path, err, sizeof(err)) != 0) continue;
        for (int i = 0; i < fp8t_st_count(f); i++) {
            const fp8t_st_tensor *t = fp8t_st_get(f, i);
            char *s = malloc(400);
            int o = snprintf(s, 400, "%s:", t->name);
            for (int d = 0; d < t->ndim; d++)
                o += snprintf(s + o, 400 - o, "%lld,", (long long)t->shape[d]);
            items = realloc(items, (size_t)(n + 1) * sizeof(*items));
            items[n++] = s;
        }
        fp8t_st_close(f);
    }
    pclose(p);
    for (int i = 1; i < n; i++) /* insertion sort: a few dozen names */
        for (int j = i; j > 0 && strcmp(items[j - 1], items[j]) > 0; j--) {
            char *t = items[j];
            items[j] = items[j - 1];
            items[j - 1] = t;
        }
    size_t total = 1;
    for (int i = 0; i < n; i++) total += strlen(items[i]) + 1;
    char *out = calloc(total, 1);
    for (int i = 0; i < n; i++) {
        strcat(out, items[i]);
        strcat(out, "\n");
        free(items[i]);
    }
    free(items);
    return out;
}

static void test_export_roundtrip(void) {
    for (int i = 0; i < N_FIX; i++) {
        const fixture *f = &FIX[i];
        char dir[700], out[700], err[1024];
        fixture_dir(dir, sizeof(dir), f);
        fp8t_weights w, back;
        T_ASSERT(fp8t_weights_load(dir, &w, err, sizeof(err)) == 0, "%s: %s", f->name, err);
        /* FP32 always, and BF16 where the weights are BF16 already: bit for bit */
        for (int k = 0; k < 2; k++) {
            fp8t_export_dtype dt = k == 0 ? FP8T_EXPORT_FP32 : FP8T_EXPORT_BF16;
            if (dt == FP8T_EXPORT_BF16 && f->stored != FP8T_EXPORT_BF16) continue;
            snprintf(out, sizeof(out), "%s/%s_%s", g_root, f->name, fp8t_export_dtype_name(dt));
            T_CHECK(fp8t_export_hf(&w, out, dt, NULL, err, sizeof(err)) == 0, "%s", err);
            if (fp8t_weights_load(out, &back, err, sizeof(err)) != 0) {
                T_FAIL("%s: re-import of the %s export: %s", f->name, fp8t_export_dtype_name(dt),
                       err);
                continue;
            }
            T_CHECK(same_config(&w.model, &back.model), "%s %s: config", f->name,
                    fp8t_export_dtype_name(dt));
            T_CHECK(same_params(&w, &back), "%s %s: weights bit for bit", f->name,
                    fp8t_export_dtype_name(dt));
            T_CHECK(!strcmp(w.kind, back.kind), "%s: kind %s vs %s", f->name, w.kind, back.kind);
            char *ours = tensor_list(out), *theirs = tensor_list(dir);
            T_CHECK(ours && theirs && !strcmp(ours, theirs),
                    "%s: the export's tensors differ from transformers':\n%s---\n%s", f->name,
                    ours ? ours : "", theirs ? theirs : "");
            free(ours);
            free(theirs);
            fp8t_weights_free(&back);
        }
        /* FP8: linear weights as E4M3 codes with their scales; the loss moves by FP8 rounding */
        snprintf(out, sizeof(out), "%s/%s_fp8", g_root, f->name);
        fp8t_export_report rep;
        T_CHECK(fp8t_export_hf(&w, out, FP8T_EXPORT_FP8, &rep, err, sizeof(err)) == 0, "%s", err);
        T_CHECK(rep.n_fp8 == 2 * 7, "%s: %d FP8 matrices (2 layers x q,k,v,o,gate,up,down)",
                f->name, rep.n_fp8);
        if (fp8t_weights_load(out, &back, err, sizeof(err)) == 0) {
            expected e;
            T_CHECK(same_config(&w.model, &back.model), "%s fp8: config", f->name);
            if (read_expected(f, &e) == 0) {
                double a = fp32_loss(&w, &e), b = fp32_loss(&back, &e);
                T_CLOSE(b, a, 0.0, FP8T_EXPORT_TOL_FP8);
                printf("  %-26s fp8 export: fp32 loss %.6f -> %.6f\n", f->name, a, b);
            }
            free(e.win);
            fp8t_weights_free(&back);
        } else {
            T_FAIL("%s: re-import of the FP8 export: %s", f->name, err);
        }
        fp8t_weights_free(&w);
    }
}

/* --max-shard-size: shards + index that import to the same bits (FP32, FP8), and a directory
 * holding a model.safetensors refused before anything is written. */
static void test_sharded_export(void) {
    const fixture *f = &FIX[2]; /* Qwen2: biases and an untied head cross shard borders too */
    char dir[700], out[700], path[800], err[1024];
    fixture_dir(dir, sizeof(dir), f);
    fp8t_weights w, back, single;
    T_ASSERT(fp8t_weights_load(dir, &w, err, sizeof(err)) == 0, "%s", err);
    for (int k = 0; k < 2; k++) {
        const fp8t_export_dtype dt = k == 0 ? FP8T_EXPORT_FP32 : FP8T_EXPORT_FP8;
        fp8t_export_report rep;
        snprintf(out, sizeof(out), "%s/sharded_%s", g_root, fp8t_export_dtype_name(dt));
        T_CHECK(fp8t_export_hf_sharded(&w, out, dt, 100000, &rep, err, sizeof(err)) == 0, "%s",
                err);
        T_CHECK(rep.n_shards >= 2, "%s: %d shards", fp8t_export_dtype_name(dt), rep.n_shards);
        snprintf(path, sizeof(path), "%s/model.safetensors.index.json", out);
        T_CHECK(fp8t_is_regular_file(path), "index written");
        snprintf(path, sizeof(path), "%s/model.safetensors", out);
        T_CHECK(!fp8t_path_exists(path), "no single file beside the shards");
        snprintf(path, sizeof(path), "%s/single_%s", g_root, fp8t_export_dtype_name(dt));
        T_CHECK(fp8t_export_hf(&w, path, dt, NULL, err, sizeof(err)) == 0, "%s", err);
        if (fp8t_weights_load(out, &back, err, sizeof(err)) != 0) {
            T_FAIL("re-import of the sharded %s export: %s", fp8t_export_dtype_name(dt), err);
            continue;
        }
        if (fp8t_weights_load(path, &single, err, sizeof(err)) == 0) {
            T_CHECK(same_config(&single.model, &back.model) && same_params(&single, &back),
                    "%s: sharded == single file, bit for bit", fp8t_export_dtype_name(dt));
            if (dt == FP8T_EXPORT_FP32) T_CHECK(same_params(&w, &back), "fp32: == the source");
            fp8t_weights_free(&single);
        } else {
            T_FAIL("%s", err);
        }
        fp8t_weights_free(&back);
    }
    /* into the single-file export's directory: refused, the directory left as it was */
    snprintf(out, sizeof(out), "%s/single_fp32", g_root);
    T_CHECK(fp8t_export_hf_sharded(&w, out, FP8T_EXPORT_FP32, 100000, NULL, err, sizeof(err)) !=
                    0 &&
                strstr(err, "model.safetensors exists"),
            "shards over a single file: %s", err);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", out);
    T_CHECK(!fp8t_path_exists(path), "nothing written by the refused export");
    fp8t_weights_free(&w);
}

/* GPT-2 with its own head (tie_word_embeddings false): lm_head.weight out and back in. */
static void test_gpt2_untied(void) {
    char out[700], path[800], err[1024];
    fp8t_weights w, back;
    memset(&w, 0, sizeof(w));
    T_ASSERT(fp8t_model_preset(&w.model, "tiny") == 0, "preset");
    w.model.untied_head = 1;
    fp8t_model_param_table(&w.model, NULL, &w.num_params);
    w.params = malloc(w.num_params * sizeof(float));
    T_ASSERT(w.params != NULL, "oom");
    uint64_t x = 12345;
    for (size_t i = 0; i < w.num_params; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        w.params[i] = (float)((double)(x >> 40) / (double)(1u << 24) - 0.5);
    }
    snprintf(out, sizeof(out), "%s/gpt2_untied", g_root);
    T_CHECK(fp8t_export_hf(&w, out, FP8T_EXPORT_FP32, NULL, err, sizeof(err)) == 0, "%s", err);
    snprintf(path, sizeof(path), "%s/config.json", out);
    char *text = NULL;
    size_t len;
    T_CHECK(fp8t_read_file(path, &text, &len, err, sizeof(err)) == 0 && text &&
                strstr(text, "\"tie_word_embeddings\":\tfalse"),
            "config.json says untied");
    free(text);
    char *names = tensor_list(out), want[64];
    snprintf(want, sizeof(want), "lm_head.weight:%d,%d,", w.model.vocab_size, w.model.n_embd);
    T_CHECK(names && strstr(names, want), "%s written", want);
    free(names);
    if (fp8t_weights_load(out, &back, err, sizeof(err)) == 0) {
        T_CHECK(back.model.untied_head == 1 && same_config(&w.model, &back.model), "config");
        T_CHECK(same_params(&w, &back), "bit for bit");
        fp8t_weights_free(&back);
    } else {
        T_FAIL("%s", err);
    }
    fp8t_weights_free(&w);
}

static void test_checkpoint_roundtrip(void) {
    for (int i = 0; i < N_FIX; i++) {
        const fixture *f = &FIX[i];
        char dir[700], ck[700], err[1024];
        fixture_dir(dir, sizeof(dir), f);
        snprintf(ck, sizeof(ck), "%s/ck_%s", g_root, f->name);
        fp8t_weights w, back;
        T_ASSERT(fp8t_weights_load(dir, &w, err, sizeof(err)) == 0, "%s: %s", f->name, err);
        T_CHECK(fp8t_weights_save_checkpoint(&w, ck, 1337, err, sizeof(err)) == 0, "%s", err);
        if (fp8t_weights_load(ck, &back, err, sizeof(err)) == 0) {
            T_CHECK(same_config(&w.model, &back.model), "%s: checkpoint config", f->name);
            T_CHECK(same_params(&w, &back), "%s: checkpoint weights", f->name);
            fp8t_weights_free(&back);
        } else {
            T_FAIL("%s: %s", f->name, err);
        }
        fp8t_weights_free(&w);
    }
}

int main(void) {
    t_suite = "hf_llama_qwen";
    const char *d = getenv("FP8TRAIN_TEST_DATA");
    snprintf(g_data, sizeof(g_data), "%s/hf", d && *d ? d : "tests/data");
    char probe[700];
    snprintf(probe, sizeof(probe), "%s/%s/config.json", g_data, FIX[0].name);
    if (!fp8t_is_regular_file(probe)) {
        printf("FAIL hf_llama_qwen: fixtures not found at %s (run from the repository root or "
               "set FP8TRAIN_TEST_DATA=.../tests/data)\n",
               g_data);
        return 1;
    }
    snprintf(g_root, sizeof(g_root), "/tmp/fp8t_hfllama_%ld", (long)getpid());
    fp8t_rmtree(g_root);
    fp8t_mkdirs(g_root, NULL, 0);
    T_RUN(test_config);
    T_RUN(test_legacy_rope_config);
    T_RUN(test_export_roundtrip);
    T_RUN(test_sharded_export);
    T_RUN(test_gpt2_untied);
    T_RUN(test_checkpoint_roundtrip);
    T_RUN(test_loss_matches_transformers);
    if (t_failed_total == 0) fp8t_rmtree(g_root);
    T_MAIN_END();
}
