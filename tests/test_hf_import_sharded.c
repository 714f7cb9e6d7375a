/* Sharded Hugging Face import: a GPT-2 (tiny preset) FP32 export split into three shard files
 * plus model.safetensors.index.json, as transformers' save_pretrained(max_shard_size=...)
 * writes it, must import to the very same bits as the single-file export. Broken indexes (a
 * shard file that is not there, a weight_map naming a tensor its shard lacks, a truncated
 * index.json) must fail with an error naming the file, write nothing into the directory, and
 * leave `fp8train import` without a half-written checkpoint. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <libgen.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fp8train/export.h"
#include "fp8train/io.h"
#include "fp8train/model.h"
#include "test.h"
#include "util/fs.h" /* fp8t_path_exists */

#define N_SHARDS 3

static char g_root[512];    /* scratch directory */
static char g_single[700];  /* the single-file FP32 export */
static char g_cli[1024];    /* the fp8train binary ("" when it is not built) */
static fp8t_weights g_orig; /* the weights exported */

/* Random but reproducible weights, with a few values an inexact path would change: -0.0, a
 * subnormal, the largest finite float. */
static int make_weights(fp8t_weights *w) {
    memset(w, 0, sizeof(*w));
    if (fp8t_model_preset(&w->model, "tiny") != 0) return -1;
    fp8t_model_param_table(&w->model, NULL, &w->num_params);
    w->params = malloc(w->num_params * sizeof(float)); /* [num_params] */
    if (!w->params) return -1;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < w->num_params; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        /* top 24 bits -> [-1, 1) */
        w->params[i] = (float)((double)(s >> 40) / (double)(1u << 23) - 1.0);
    }
    w->params[1] = -0.0f;
    w->params[2] = 1e-40f;
    w->params[3] = 3.4028235e38f;
    snprintf(w->kind, sizeof(w->kind), "test");
    return 0;
}

/* The shard names transformers uses. */
static void shard_name(char *buf, size_t len, int i) {
    snprintf(buf, len, "model-%05d-of-%05d.safetensors", i + 1, N_SHARDS);
}

/* How an index is spoiled. */
typedef enum {
    INDEX_OK = 0,
    INDEX_MISSING_SHARD,  /* one tensor's weight_map entry names a shard file not written */
    INDEX_WRONG_SHARD,    /* one tensor's entry names shard 1, but it is stored in shard 2 */
    INDEX_PHANTOM_TENSOR, /* a tensor is in no shard, the weight_map puts it in shard 1 */
    INDEX_TRUNCATED,      /* index.json cut in the middle */
} index_fault;

/* The tensor the faults move around: one of the second shard's (so shard 1 lacks it). */
static char g_moved[256];
#define MISSING_SHARD "model-00004-of-00003.safetensors"

/* Split the single-file export into N_SHARDS contiguous runs of its tensors (header order)
 * plus model.safetensors.index.json in dir, with config.json copied. 0 ok. */
static int write_sharded(const char *dir, index_fault fault) {
    char err[1024], path[1200], cmd[4096];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir -p '%s' && cp '%s/config.json' '%s/'", dir,
             dir, g_single, dir);
    if (system(cmd) != 0) return -1;
    fp8t_st_file *f;
    snprintf(path, sizeof(path), "%s/model.safetensors", g_single);
    if (fp8t_st_open(&f, path, err, sizeof(err)) != 0) {
        printf("  %s\n", err);
        return -1;
    }
    int n = fp8t_st_count(f);
    cJSON *index = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
    cJSON *map = cJSON_AddObjectToObject(index, "weight_map");
    double total = 0;
    int rc = 0;
    for (int sh = 0; sh < N_SHARDS && rc == 0; sh++) {
        char name[64];
        shard_name(name, sizeof(name), sh);
        fp8t_st_writer *wr = fp8t_st_writer_new();
        int first = sh * n / N_SHARDS, end = (sh + 1) * n / N_SHARDS;
        for (int i = first; i < end; i++) {
            const fp8t_st_tensor *t = fp8t_st_get(f, i);
            if (sh == 1 && i == first) snprintf(g_moved, sizeof(g_moved), "%s", t->name);
            const char *file = name;
            if (sh == 1 && i == first) {
                if (fault == INDEX_MISSING_SHARD) file = MISSING_SHARD;
                if (fault == INDEX_WRONG_SHARD || fault == INDEX_PHANTOM_TENSOR)
                    file = "model-00001-of-00003.safetensors";
            }
            cJSON_AddStringToObject(map, t->name, file);
            if (sh == 1 && i == first && fault == INDEX_PHANTOM_TENSOR) continue;
            fp8t_st_writer_add(wr, t->name, t->dtype, t->ndim, t->shape, fp8t_st_data(f, t));
            total += (double)(t->end - t->begin);
        }
        fp8t_st_writer_metadata(wr, "format", "pt");
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        if (fp8t_st_writer_save(wr, path, err, sizeof(err)) != 0) {
            printf("  %s\n", err);
            rc = -1;
        }
        fp8t_st_writer_free(wr);
    }
    fp8t_st_close(f);
    cJSON_AddNumberToObject(meta, "total_size", total);
    char *text = cJSON_Print(index);
    cJSON_Delete(index);
    size_t len = strlen(text);
    if (fault == INDEX_TRUNCATED) len /= 2;
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    if (rc == 0 && fp8t_write_file_atomic(path, text, len, err, sizeof(err)) != 0) {
        printf("  %s\n", err);
        rc = -1;
    }
    free(text);
    return rc;
}

/* Parameter tensors of b that differ from a in any bit; the first one's name into first. */
static int tensors_differing(const fp8t_weights *a, const fp8t_weights *b, char *first,
                             size_t len) {
    int n = fp8t_model_param_table(&a->model, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)n, sizeof(*info)); /* [n] */
    fp8t_model_param_table(&a->model, info, NULL);
    int bad = 0;
    first[0] = 0;
    for (int i = 0; i < n; i++) {
        if (memcmp(a->params + info[i].offset, b->params + info[i].offset,
                   info[i].numel * sizeof(float)) == 0)
            continue;
        if (!bad++) snprintf(first, len, "%s", info[i].name);
    }
    free(info);
    return bad;
}

static int file_exists(const char *dir, const char *name) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return fp8t_path_exists(path);
}

/* ------------------------------------------------------------------ the good case */

static void test_sharded_import_is_exact(void) {
    char dir[700], err[1024], first[128];
    snprintf(dir, sizeof(dir), "%s/sharded", g_root);
    T_ASSERT(write_sharded(dir, INDEX_OK) == 0, "writing the shards failed");
    T_ASSERT(!file_exists(dir, "model.safetensors"),
             "the sharded directory must not hold "
             "model.safetensors, or the import reads that instead of the shards");
    fp8t_weights w;
    T_ASSERT(fp8t_weights_load(dir, &w, err, sizeof(err)) == 0, "sharded import: %s", err);
    T_CHECK(!strcmp(w.kind, "hf-gpt2"), "kind %s", w.kind);
    T_CHECK(w.stored_dtype == FP8T_EXPORT_FP32, "stored dtype %d", (int)w.stored_dtype);
    T_CHECK(memcmp(&w.model, &g_orig.model, sizeof(w.model)) == 0, "model config differs");
    T_ASSERT(w.num_params == g_orig.num_params, "%zu parameters, expected %zu", w.num_params,
             g_orig.num_params);
    int bad = tensors_differing(&g_orig, &w, first, sizeof(first));
    T_CHECK(bad == 0, "%d tensors differ from the original (first: %s)", bad, first);
    /* and the single-file import of the same export agrees (the split changed nothing) */
    fp8t_weights one;
    T_ASSERT(fp8t_weights_load(g_single, &one, err, sizeof(err)) == 0, "single file: %s", err);
    bad = tensors_differing(&one, &w, first, sizeof(first));
    T_CHECK(bad == 0, "%d tensors differ from the single-file import (first: %s)", bad, first);
    printf("  %zu parameters in %d shards imported bit for bit\n", w.num_params, N_SHARDS);
    fp8t_weights_free(&one);
    fp8t_weights_free(&w);
}

/* ------------------------------------------------------------------ broken indexes */

/* Names in dir, sorted and joined, to see that a failed import wrote nothing there. */
static void dir_listing(char *buf, size_t len, const char *dir) {
    struct dirent **ents;
    buf[0] = 0;
    int n = scandir(dir, &ents, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        size_t u = strlen(buf);
        snprintf(buf + u, len - u, "%s/", ents[i]->d_name);
        free(ents[i]);
    }
    if (n >= 0) free(ents);
}

/* Import a broken sharded directory: it must fail with an error containing `file`, leave w
 * empty and the directory as it was; `fp8train import` must exit 2 naming `file` and create no
 * checkpoint directory. */
static void check_broken(index_fault fault, const char *tag, const char *file) {
    char dir[700], err[1024], before[4096], after[4096];
    snprintf(dir, sizeof(dir), "%s/broken_%s", g_root, tag);
    T_ASSERT(write_sharded(dir, fault) == 0, "writing the shards failed");
    dir_listing(before, sizeof(before), dir);
    fp8t_weights w;
    memset(&w, 0x5A, sizeof(w)); /* garbage: the import must clear it */
    err[0] = 0;
    int rc = fp8t_weights_load(dir, &w, err, sizeof(err));
    printf("  %s: %s\n", tag, rc ? err : "(accepted!)");
    T_CHECK(rc != 0, "%s: the import must fail", tag);
    if (rc == 0) {
        fp8t_weights_free(&w);
        return;
    }
    T_CHECK(strstr(err, file) != NULL, "%s: the error must name %s", tag, file);
    T_CHECK(w.params == NULL && w.num_params == 0 && w.fp8_state == NULL,
            "%s: a failed import must leave no weights behind", tag);
    dir_listing(after, sizeof(after), dir);
    T_CHECK(!strcmp(before, after), "%s: the import changed the directory: %s -> %s", tag, before,
            after);
    if (!g_cli[0]) return;
    /* the CLI: exit status 2, the message, and no checkpoint directory */
    char out[800], log[800], cmd[4096];
    snprintf(out, sizeof(out), "%s/ckpt_%s", g_root, tag);
    snprintf(log, sizeof(log), "%s/cli_%s.log", g_root, tag);
    snprintf(cmd, sizeof(cmd), "'%s' import '%s' --to '%s' >'%s' 2>&1", g_cli, dir, out, log);
    int st = system(cmd);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    char *text = NULL;
    size_t len = 0;
    if (fp8t_read_file(log, &text, &len, err, sizeof(err)) != 0) text = NULL;
    T_CHECK(code == 2, "%s: fp8train import exited %d, expected 2: %s", tag, code,
            text ? text : "");
    T_CHECK(text && strstr(text, file), "%s: fp8train import's message must name %s: %s", tag,
            file, text ? text : "");
    T_CHECK(!fp8t_path_exists(out), "%s: fp8train import left %s behind", tag, out);
    free(text);
}

static void test_index_names_missing_shard(void) {
    check_broken(INDEX_MISSING_SHARD, "missing_shard", MISSING_SHARD);
}

/* the tensor is in the directory (shard 2), but not where the index says it is */
static void test_index_wrong_shard(void) {
    check_broken(INDEX_WRONG_SHARD, "wrong_shard", "model-00001-of-00003.safetensors");
}

/* the tensor is in no shard at all; the index says shard 1 */
static void test_index_phantom_tensor(void) {
    check_broken(INDEX_PHANTOM_TENSOR, "phantom_tensor", "model-00001-of-00003.safetensors");
}

static void test_index_truncated(void) {
    check_broken(INDEX_TRUNCATED, "truncated_index", "model.safetensors.index.json");
}

int main(int argc, char **argv) {
    (void)argc;
    t_suite = "hf_import_sharded";
    snprintf(g_root, sizeof(g_root), "/tmp/fp8t_hf_sharded_%ld", (long)getpid());
    fp8t_rmtree(g_root);
    char err[1024];
    if (fp8t_mkdirs(g_root, err, sizeof(err)) != 0 || make_weights(&g_orig) != 0) {
        printf("FAIL hf_import_sharded: setup: %s\n", err);
        return 1;
    }
    snprintf(g_single, sizeof(g_single), "%s/single", g_root);
    if (fp8t_export_hf(&g_orig, g_single, FP8T_EXPORT_FP32, NULL, err, sizeof(err)) != 0) {
        printf("FAIL hf_import_sharded: setup: export: %s\n", err);
        return 1;
    }
    /* the CLI beside this test's build directory (make test sets FP8TRAIN_BIN) */
    const char *bin = getenv("FP8TRAIN_BIN");
    if (bin && *bin) {
        snprintf(g_cli, sizeof(g_cli), "%s", bin);
    } else {
        char self[900];
        snprintf(self, sizeof(self), "%s", argv[0]);
        snprintf(g_cli, sizeof(g_cli), "%s/../fp8train", dirname(self));
    }
    if (access(g_cli, X_OK) != 0) {
        printf("  (no fp8train binary at %s: the `fp8train import` checks are skipped; "
               "make test builds it)\n",
               g_cli);
        g_cli[0] = 0;
    }
    T_RUN(test_sharded_import_is_exact);
    T_RUN(test_index_names_missing_shard);
    T_RUN(test_index_wrong_shard);
    T_RUN(test_index_phantom_tensor);
    T_RUN(test_index_truncated);
    fp8t_weights_free(&g_orig);
    if (t_failed_total == 0) fp8t_rmtree(g_root);
    T_MAIN_END();
}
