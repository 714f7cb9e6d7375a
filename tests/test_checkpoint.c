/* Checkpoint files: exact round trip, atomic replacement, pruning, and a clear error (naming
 * the file) for every kind of damage: missing, truncated or corrupt files, bad JSON, a model
 * that does not match, files of different checkpoints mixed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "fp8train/checkpoint.h"
#include "fp8train/io.h"
#include "fp8train/recipe.h"
#include "test.h"

static char root[256];

static fp8t_model_config small_config(void) {
    fp8t_model_config c = {.arch = FP8T_ARCH_GPT2,
                           .n_layer = 2,
                           .n_embd = 16,
                           .n_head = 2,
                           .seq_len = 8,
                           .vocab_size = 32,
                           .mlp_hidden = 64,
                           .rope_theta = 10000.0f,
                           .norm_eps = 1e-5f};
    return c;
}

/* A checkpoint with recognizable contents. */
static void make_ck(fp8t_checkpoint *ck, int step) {
    memset(ck, 0, sizeof(*ck));
    ck->model = small_config();
    fp8t_model_param_table(&ck->model, NULL, &ck->num_params);
    ck->step = step;
    ck->data_position = 123456789012345ULL; /* beyond 2^32: must survive JSON */
    ck->seed = 18446744073709551557ULL;     /* beyond 2^53 */
    ck->loss = 3.25f;
    ck->params = malloc(ck->num_params * sizeof(float));
    ck->adam_m = malloc(ck->num_params * sizeof(float));
    ck->adam_v = malloc(ck->num_params * sizeof(float));
    for (size_t i = 0; i < ck->num_params; i++) {
        ck->params[i] = (float)i * 1e-3f - 0.5f + (float)step;
        ck->adam_m[i] = -(float)i * 1e-4f;
        ck->adam_v[i] = (float)i * 1e-6f + 1e-30f;
    }
    ck->fp8_n = 3 * fp8t_model_num_linears(&ck->model);
    ck->fp8_len = 4;
    size_t nst = fp8t_recipe_state_floats(ck->fp8_n, ck->fp8_len);
    ck->fp8_state = malloc(nst * sizeof(float));
    for (size_t i = 0; i < nst; i++) ck->fp8_state[i] = 0.5f + (float)i;
    ck->config_json = strdup("{\"precision\":\"fp8\",\"steps\":100}");
    ck->policy_json = strdup("{\"default\":\"fp8\"}");
}

static int count_entries(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

static void path_of(char *buf, size_t len, const char *dir, const char *file) {
    snprintf(buf, len, "%s/%s", dir, file);
}

static void test_round_trip(void) {
    fp8t_checkpoint ck, back;
    make_ck(&ck, 7);
    char dir[512], err[1024];
    fp8t_checkpoint_dir(dir, sizeof(dir), root, 7);
    T_ASSERT(fp8t_checkpoint_save(dir, &ck, err, sizeof(err)) == 0, "save: %s", err);
    fp8t_model_config expect = small_config();
    T_ASSERT(fp8t_checkpoint_load(dir, &expect, &back, err, sizeof(err)) == 0, "load: %s", err);
    T_CHECK(back.step == 7 && back.data_position == ck.data_position && back.seed == ck.seed,
            "step %d position %llu seed %llu", back.step, (unsigned long long)back.data_position,
            (unsigned long long)back.seed);
    T_CHECK(back.loss == 3.25f, "loss %g", back.loss);
    T_CHECK(back.num_params == ck.num_params, "num_params");
    T_CHECK(!memcmp(back.params, ck.params, ck.num_params * 4) &&
                !memcmp(back.adam_m, ck.adam_m, ck.num_params * 4) &&
                !memcmp(back.adam_v, ck.adam_v, ck.num_params * 4),
            "tensors differ after the round trip");
    T_CHECK(back.fp8_n == ck.fp8_n && back.fp8_len == 4 &&
                !memcmp(back.fp8_state, ck.fp8_state,
                        fp8t_recipe_state_floats(ck.fp8_n, 4) * sizeof(float)),
            "FP8 state differs");
    T_CHECK(back.config_json && strstr(back.config_json, "\"steps\":100"), "config: %s",
            back.config_json);
    T_CHECK(back.policy_json && strstr(back.policy_json, "fp8"), "policy: %s", back.policy_json);
    /* the safetensors files are readable with their documented names */
    char p[600];
    path_of(p, sizeof(p), dir, "model.safetensors");
    fp8t_st_file *f;
    T_ASSERT(fp8t_st_open(&f, p, err, sizeof(err)) == 0, "%s", err);
    const fp8t_st_tensor *t = fp8t_st_find(f, "h.1.fc1.w");
    T_CHECK(t && t->ndim == 2 && t->shape[0] == 64 && t->shape[1] == 16, "h.1.fc1.w shape");
    fp8t_st_close(f);
    path_of(p, sizeof(p), dir, "optimizer.safetensors");
    T_ASSERT(fp8t_st_open(&f, p, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(fp8t_st_find(f, "exp_avg.wte") && fp8t_st_find(f, "exp_avg_sq.lnf.b") &&
                fp8t_st_find(f, "step"),
            "optimizer tensor names");
    fp8t_st_close(f);
    fp8t_checkpoint_free(&back);
    fp8t_checkpoint_free(&ck);
}

static void test_replace_is_atomic(void) {
    fp8t_checkpoint ck, back;
    char dir[512], parent[512], err[1024];
    make_ck(&ck, 9);
    fp8t_checkpoint_dir(dir, sizeof(dir), root, 9);
    T_ASSERT(fp8t_checkpoint_save(dir, &ck, err, sizeof(err)) == 0, "%s", err);
    ck.params[0] = 42.0f;
    T_ASSERT(fp8t_checkpoint_save(dir, &ck, err, sizeof(err)) == 0, "second save: %s", err);
    T_ASSERT(fp8t_checkpoint_load(dir, NULL, &back, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(back.params[0] == 42.0f, "the replaced checkpoint was not written");
    fp8t_checkpoint_free(&back);
    snprintf(parent, sizeof(parent), "%s/checkpoints", root);
    T_CHECK(count_entries(parent, ".tmp.") == 0 && count_entries(parent, ".old.") == 0,
            "temporaries left behind");
    /* a failed save (inconsistent sizes) leaves neither a step dir nor a temporary */
    ck.num_params -= 1;
    fp8t_checkpoint_dir(dir, sizeof(dir), root, 10);
    T_CHECK(fp8t_checkpoint_save(dir, &ck, err, sizeof(err)) != 0, "inconsistent save accepted");
    ck.num_params += 1;
    struct stat st;
    T_CHECK(stat(dir, &st) != 0, "a failed save left %s", dir);
    T_CHECK(count_entries(parent, ".tmp.") == 0, "a failed save left a temporary");
    /* a parent that cannot be created */
    char blocked[600];
    snprintf(blocked, sizeof(blocked), "%s/file", root);
    FILE *fp = fopen(blocked, "w");
    fclose(fp);
    snprintf(dir, sizeof(dir), "%s/file/checkpoints/step_000001", root);
    T_CHECK(fp8t_checkpoint_save(dir, &ck, err, sizeof(err)) != 0 && strlen(err) > 0,
            "save under a file succeeded");
    fp8t_checkpoint_free(&ck);
}

/* Save a fresh checkpoint at step, damage it with `damage`, expect an error containing both
 * needles. */
static void expect_damage(int step, void (*damage)(const char *dir), const char *n1,
                          const char *n2) {
    fp8t_checkpoint ck, back;
    char dir[512], err[1536] = "";
    make_ck(&ck, step);
    fp8t_checkpoint_dir(dir, sizeof(dir), root, step);
    if (fp8t_checkpoint_save(dir, &ck, err, sizeof(err)) != 0) {
        T_FAIL("save: %s", err);
        fp8t_checkpoint_free(&ck);
        return;
    }
    damage(dir);
    fp8t_model_config expect = small_config();
    int rc = fp8t_checkpoint_load(dir, &expect, &back, err, sizeof(err));
    T_CHECK(rc != 0, "damaged checkpoint loaded");
    if (getenv("SHOW_ERRORS")) printf("    %s\n", err);
    T_CHECK(strstr(err, n1) && (!n2 || strstr(err, n2)), "error lacks '%s'/'%s': %s", n1,
            n2 ? n2 : "", err);
    T_CHECK(back.params == NULL, "buffers left after a failed load");
    fp8t_checkpoint_free(&ck);
}

static void rm_optimizer(const char *dir) {
    char p[600];
    path_of(p, sizeof(p), dir, "optimizer.safetensors");
    remove(p);
}
static void rm_state(const char *dir) {
    char p[600];
    path_of(p, sizeof(p), dir, "state.json");
    remove(p);
}
static void truncate_model(const char *dir) {
    char p[600];
    path_of(p, sizeof(p), dir, "model.safetensors");
    struct stat st;
    stat(p, &st);
    if (truncate(p, st.st_size / 2) != 0) perror("truncate");
}
static void corrupt_fp8_header(const char *dir) {
    char p[600];
    path_of(p, sizeof(p), dir, "fp8_meta.safetensors");
    FILE *f = fopen(p, "r+b");
    fseek(f, 8, SEEK_SET);
    fwrite("#garbage#", 1, 9, f);
    fclose(f);
}
static void bad_json(const char *dir) {
    char p[600];
    path_of(p, sizeof(p), dir, "state.json");
    FILE *f = fopen(p, "w");
    fputs("{\"format\": \"fp8train-checkpoint\", \"step\": ", f);
    fclose(f);
}
/* model.safetensors of another model (wider) under the same state.json */
static void other_model(const char *dir) {
    fp8t_checkpoint ck;
    make_ck(&ck, 1);
    ck.model.n_embd = 32;
    ck.model.mlp_hidden = 128;
    free(ck.params);
    free(ck.adam_m);
    free(ck.adam_v);
    fp8t_model_param_table(&ck.model, NULL, &ck.num_params);
    ck.params = calloc(ck.num_params, sizeof(float));
    ck.adam_m = calloc(ck.num_params, sizeof(float));
    ck.adam_v = calloc(ck.num_params, sizeof(float));
    char other[600], err[512], src[700], dst[700];
    snprintf(other, sizeof(other), "%s/other_model", root);
    if (fp8t_checkpoint_save(other, &ck, err, sizeof(err)) != 0) printf("save: %s\n", err);
    snprintf(src, sizeof(src), "%s/model.safetensors", other);
    snprintf(dst, sizeof(dst), "%s/model.safetensors", dir);
    rename(src, dst);
    fp8t_rmtree(other);
    fp8t_checkpoint_free(&ck);
}
/* optimizer.safetensors of another step */
static void other_step(const char *dir) {
    fp8t_checkpoint ck;
    make_ck(&ck, 3);
    char other[600], err[512], src[700], dst[700];
    snprintf(other, sizeof(other), "%s/other_step", root);
    if (fp8t_checkpoint_save(other, &ck, err, sizeof(err)) != 0) printf("save: %s\n", err);
    snprintf(src, sizeof(src), "%s/optimizer.safetensors", other);
    snprintf(dst, sizeof(dst), "%s/optimizer.safetensors", dir);
    rename(src, dst);
    fp8t_rmtree(other);
    fp8t_checkpoint_free(&ck);
}

static void test_missing_file(void) {
    expect_damage(20, rm_optimizer, "optimizer.safetensors", "missing");
}
static void test_missing_state(void) { expect_damage(21, rm_state, "state.json", "cannot read"); }
static void test_truncated(void) {
    expect_damage(22, truncate_model, "model.safetensors", "resume from another");
}
static void test_corrupt_header(void) {
    expect_damage(23, corrupt_fp8_header, "fp8_meta.safetensors", NULL);
}
static void test_bad_json(void) { expect_damage(24, bad_json, "state.json", "not valid JSON"); }
static void test_shape_mismatch(void) {
    expect_damage(25, other_model, "tensor 'wte' is F32 [32, 32]", "needs F32 [32, 16]");
}
static void test_mixed_files(void) {
    expect_damage(26, other_step, "optimizer step 3", "state.json step 26");
}

static void test_model_mismatch_and_missing_dir(void) {
    fp8t_checkpoint ck, back;
    char dir[512], err[1536];
    make_ck(&ck, 30);
    fp8t_checkpoint_dir(dir, sizeof(dir), root, 30);
    T_ASSERT(fp8t_checkpoint_save(dir, &ck, err, sizeof(err)) == 0, "%s", err);
    fp8t_model_config other = small_config();
    other.n_layer = 3;
    T_CHECK(fp8t_checkpoint_load(dir, &other, &back, err, sizeof(err)) != 0,
            "wrong model accepted");
    T_CHECK(strstr(err, "n_layer") && strstr(err, "--layers") && strstr(err, "checkpoint"), "%s",
            err);
    char missing[600];
    snprintf(missing, sizeof(missing), "%s/checkpoints/step_999999", root);
    T_CHECK(fp8t_checkpoint_load(missing, NULL, &back, err, sizeof(err)) != 0 &&
                strstr(err, "step_999999") && strstr(err, "not a directory"),
            "missing dir: %s", err);
    fp8t_checkpoint_free(&ck);
}

static void test_prune_and_latest(void) {
    char out[512], dir[600], err[512];
    snprintf(out, sizeof(out), "%s/prune", root);
    fp8t_checkpoint ck;
    make_ck(&ck, 0);
    int steps[] = {5, 10, 15, 20, 100};
    for (int i = 0; i < 5; i++) {
        ck.step = steps[i];
        fp8t_checkpoint_dir(dir, sizeof(dir), out, steps[i]);
        T_ASSERT(fp8t_checkpoint_save(dir, &ck, err, sizeof(err)) == 0, "%s", err);
    }
    /* a temporary left by a crash */
    snprintf(dir, sizeof(dir), "%s/checkpoints/.tmp.step_000200.99999", out);
    fp8t_mkdirs(dir, err, sizeof(err));
    char latest[700];
    T_CHECK(fp8t_checkpoint_latest(out, latest, sizeof(latest)) == 100 &&
                strstr(latest, "step_000100"),
            "latest: %s", latest);
    int removed = fp8t_checkpoint_prune(out, 2);
    T_CHECK(removed == 3, "removed %d", removed);
    snprintf(dir, sizeof(dir), "%s/checkpoints", out);
    T_CHECK(count_entries(dir, "step_") == 2 && count_entries(dir, ".tmp.") == 0, "after prune");
    fp8t_checkpoint_dir(latest, sizeof(latest), out, 20);
    struct stat st;
    T_CHECK(stat(latest, &st) == 0, "step 20 pruned");
    T_CHECK(fp8t_checkpoint_latest("/nonexistent/dir", latest, sizeof(latest)) == -1,
            "latest of nothing");
    fp8t_checkpoint_free(&ck);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* fp8train deletes only what it wrote: names matched exactly, a checkpoint recognised by its
 * state.json marker, and inside it only its own files. */
static void test_only_own_checkpoints_removed(void) {
    T_CHECK(fp8t_checkpoint_step_of_name("step_000020") == 20, "step_000020");
    T_CHECK(fp8t_checkpoint_step_of_name("step_1234567") == 1234567, "step_1234567");
    const char *not_ours[] = {"step_20",     "step_0000020", "step_000020.bak", "step_",
                              "step_-00001", "xstep_000020", "step_00002a",     "model_final.pt"};
    for (size_t i = 0; i < sizeof(not_ours) / sizeof(not_ours[0]); i++)
        T_CHECK(fp8t_checkpoint_step_of_name(not_ours[i]) == -1, "'%s' taken for ours",
                not_ours[i]);

    char out[512], dir[600], p[700], err[512];
    snprintf(out, sizeof(out), "%s/own", root);
    fp8t_checkpoint ck;
    make_ck(&ck, 0);
    for (int s = 1; s <= 4; s++) {
        ck.step = s;
        fp8t_checkpoint_dir(dir, sizeof(dir), out, s);
        T_ASSERT(fp8t_checkpoint_save(dir, &ck, err, sizeof(err)) == 0, "%s", err);
    }
    /* foreign things in checkpoints/: a step-named directory without our state.json, one
     * named almost like ours holding a copy of our files, a file, and a user file inside one
     * of our checkpoints */
    snprintf(p, sizeof(p), "%s/checkpoints/step_000000", out);
    mkdir(p, 0777);
    snprintf(p, sizeof(p), "%s/checkpoints/step_000000/weights.bin", out);
    write_text(p, "user");
    snprintf(p, sizeof(p), "%s/checkpoints/step_0", out);
    ck.step = 0;
    T_ASSERT(fp8t_checkpoint_save(p, &ck, err, sizeof(err)) == 0, "%s", err);
    snprintf(p, sizeof(p), "%s/checkpoints/model_final.pt", out);
    write_text(p, "user");
    snprintf(p, sizeof(p), "%s/checkpoints/step_000001/NOTES", out);
    write_text(p, "user");
    snprintf(p, sizeof(p), "%s/checkpoints/.tmp.step_000009.123", out); /* crash leftover */
    mkdir(p, 0777);
    snprintf(p, sizeof(p), "%s/checkpoints/.tmp.step_000009.123/model.safetensors.tmp.123", out);
    write_text(p, "partial");
    snprintf(p, sizeof(p), "%s/checkpoints/.tmp.mine", out); /* not ours */
    mkdir(p, 0777);

    char latest[700];
    T_CHECK(fp8t_checkpoint_latest(out, latest, sizeof(latest)) == 4, "latest %s", latest);
    /* keep 1: steps 1..3 go; step 1 only loses its own files */
    T_CHECK(fp8t_checkpoint_prune(out, 1) == 2, "prune count");
    struct stat st;
    const char *kept[] = {"step_000000/weights.bin", "step_0/state.json",      "model_final.pt",
                          "step_000001/NOTES",       "step_000004/state.json", ".tmp.mine"};
    for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++) {
        snprintf(p, sizeof(p), "%s/checkpoints/%s", out, kept[i]);
        T_CHECK(stat(p, &st) == 0, "%s was deleted", kept[i]);
    }
    const char *gone[] = {"step_000001/model.safetensors", "step_000002", "step_000003",
                          ".tmp.step_000009.123"};
    for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++) {
        snprintf(p, sizeof(p), "%s/checkpoints/%s", out, gone[i]);
        T_CHECK(stat(p, &st) != 0, "%s was kept", gone[i]);
    }
    /* remove refuses a directory that is not one of fp8train's checkpoints */
    snprintf(p, sizeof(p), "%s/checkpoints/step_000000", out);
    T_CHECK(fp8t_checkpoint_remove(p, 1) == -1, "removed a foreign step_000000");
    fp8t_checkpoint_dir(dir, sizeof(dir), out, 4);
    T_CHECK(fp8t_checkpoint_remove(dir, 1) == 0 && stat(dir, &st) != 0,
            "own checkpoint not removed");

    /* a step_NNNNNN directory of somebody else's holding only a file named like ours: a save
     * of that step moves it aside (.old.step_000005.<pid>), never deletes it, and a later prune
     * leaves it too */
    snprintf(p, sizeof(p), "%s/checkpoints/step_000005", out);
    mkdir(p, 0777);
    snprintf(p, sizeof(p), "%s/checkpoints/step_000005/model.safetensors", out);
    write_text(p, "user's own model");
    ck.step = 5;
    fp8t_checkpoint_dir(dir, sizeof(dir), out, 5);
    T_ASSERT(fp8t_checkpoint_save(dir, &ck, err, sizeof(err)) == 0, "%s", err);
    fp8t_checkpoint_prune(out, 0);
    snprintf(p, sizeof(p), "%s/checkpoints/.old.step_000005.%ld/model.safetensors", out,
             (long)getpid());
    T_CHECK(stat(p, &st) == 0 && st.st_size == 16, "the user's model.safetensors was deleted");

    /* saving into a directory that holds other files: theirs stay, ours load */
    snprintf(dir, sizeof(dir), "%s/user_dir", out);
    mkdir(dir, 0777);
    snprintf(p, sizeof(p), "%s/README", dir);
    write_text(p, "user");
    ck.step = 7;
    T_ASSERT(fp8t_checkpoint_save(dir, &ck, err, sizeof(err)) == 0, "%s", err);
    fp8t_checkpoint back;
    T_CHECK(stat(p, &st) == 0, "README deleted by the save");
    T_CHECK(fp8t_checkpoint_load(dir, NULL, &back, err, sizeof(err)) == 0 && back.step == 7,
            "load after an in-place save: %s", err);
    fp8t_checkpoint_free(&back);
    T_CHECK(count_entries(out, ".tmp.") == 0, "temporary left in %s", out);
    fp8t_checkpoint_free(&ck);
}

static void test_model_config_json(void) {
    fp8t_model_config c = small_config(), d;
    c.arch = FP8T_ARCH_LLAMA;
    c.rope_theta = 500000.0f;
    char *j = fp8t_model_config_to_json(&c), err[512];
    T_ASSERT(fp8t_model_config_from_json(&d, j, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(fp8t_model_config_diff(&c, &d, err, sizeof(err)) == 0, "round trip differs: %s", err);
    free(j);
    T_CHECK(fp8t_model_config_from_json(&d, "{\"arch\":\"gpt3\"}", err, sizeof(err)) != 0 &&
                strstr(err, "gpt3"),
            "bad arch: %s", err);
    T_CHECK(fp8t_model_config_from_json(&d, "{\"arch\":\"gpt2\",\"n_layer\":2}", err,
                                        sizeof(err)) != 0 &&
                strstr(err, "n_embd"),
            "missing field: %s", err);
    d = c;
    d.n_head = 4;
    T_CHECK(fp8t_model_config_diff(&c, &d, err, sizeof(err)) != 0 && strstr(err, "--heads"), "%s",
            err);
    /* the config without the GQA-era fields writes none of them (old files stay the same) */
    j = fp8t_model_config_to_json(&c);
    T_CHECK(!strstr(j, "n_kv_head") && !strstr(j, "untied") && !strstr(j, "qkv_bias") &&
                !strstr(j, "rope_scaling"),
            "defaults written: %s", j);
    free(j);
    /* GQA, untied head, QKV bias, llama3 RoPE round-trip */
    c.n_kv_head = 1, c.untied_head = 1, c.qkv_bias = 1;
    c.rope_scaling = (fp8t_rope_scaling){FP8T_ROPE_LLAMA3, 32.0f, 1.0f, 4.0f, 8192};
    j = fp8t_model_config_to_json(&c);
    T_ASSERT(fp8t_model_config_from_json(&d, j, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(d.n_kv_head == 1 && d.untied_head == 1 && d.qkv_bias == 1 &&
                d.rope_scaling.type == FP8T_ROPE_LLAMA3 && d.rope_scaling.factor == 32.0f &&
                d.rope_scaling.low_freq_factor == 1.0f &&
                d.rope_scaling.high_freq_factor == 4.0f &&
                d.rope_scaling.original_max_pos == 8192,
            "new fields lost: %s", j);
    T_CHECK(fp8t_model_config_diff(&c, &d, err, sizeof(err)) == 0, "round trip differs: %s", err);
    free(j);
    /* each new field is compared when resuming */
    d = c, d.n_kv_head = 2;
    T_CHECK(fp8t_model_config_diff(&c, &d, err, sizeof(err)) != 0 && strstr(err, "--kv-heads"),
            "%s", err);
    d = c, d.untied_head = 0;
    T_CHECK(fp8t_model_config_diff(&c, &d, err, sizeof(err)) != 0 && strstr(err, "untied_head"),
            "%s", err);
    d = c, d.qkv_bias = 0;
    T_CHECK(fp8t_model_config_diff(&c, &d, err, sizeof(err)) != 0 && strstr(err, "--qkv-bias"),
            "%s", err);
    d = c, d.rope_scaling.factor = 8.0f;
    T_CHECK(fp8t_model_config_diff(&c, &d, err, sizeof(err)) != 0 && strstr(err, "rope_scaling"),
            "%s", err);
    /* n_kv_head 0 and n_kv_head = n_head are the same model */
    d = c, c.n_kv_head = 0, d.n_kv_head = c.n_head;
    T_CHECK(fp8t_model_config_diff(&c, &d, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(fp8t_model_config_from_json(&d,
                                        "{\"arch\":\"llama\",\"n_layer\":2,\"n_embd\":16,"
                                        "\"n_head\":2,\"seq_len\":8,\"vocab_size\":32,"
                                        "\"mlp_hidden\":64,\"rope_theta\":1e4,"
                                        "\"norm_eps\":1e-5,\"rope_scaling\":{\"type\":\"yarn\"}}",
                                        err, sizeof(err)) != 0 &&
                strstr(err, "yarn"),
            "unknown rope scaling: %s", err);
}

/* A ZeRO-1 checkpoint written as W ranks write it (begin, a shard per rank, commit), one
 * process playing every rank: rank r's moments are its slice of make_ck's. */
static int save_sharded(const char *dir, fp8t_checkpoint *full, int W, char *err, size_t errlen) {
    char tmp[1024];
    if (fp8t_checkpoint_begin(dir, tmp, sizeof(tmp), err, errlen) != 0) return -1;
    fp8t_checkpoint part = *full;
    for (int r = 0; r < W; r++) {
        fp8t_checkpoint_shard(full->num_params, W, r, &part.adam_lo, &part.adam_hi);
        part.adam_m = full->adam_m + part.adam_lo;
        part.adam_v = full->adam_v + part.adam_lo;
        if (fp8t_checkpoint_write_shard(tmp, &part, r, W, err, errlen) != 0) {
            fp8t_checkpoint_abandon(tmp);
            return -1;
        }
    }
    part.shards = W; /* rank 0's: its own moments' range, the shards' count */
    fp8t_checkpoint_shard(full->num_params, W, 0, &part.adam_lo, &part.adam_hi);
    return fp8t_checkpoint_commit(tmp, dir, &part, err, errlen);
}

static void test_sharded(void) {
    fp8t_checkpoint ck, back;
    char dir[512], path[1024], err[1024];
    make_ck(&ck, 30);
    fp8t_checkpoint_dir(dir, sizeof(dir), root, 30);
    /* the split: even, the first n % W ranks one more, covering [0, n) in rank order */
    const size_t n = ck.num_params;
    size_t lo, hi, end = 0;
    for (int r = 0; r < 3; r++) {
        fp8t_checkpoint_shard(n, 3, r, &lo, &hi);
        T_CHECK(lo == end && hi - lo == n / 3 + ((size_t)r < n % 3), "shard %d of 3: [%zu, %zu)",
                r, lo, hi);
        end = hi;
    }
    T_CHECK(end == n, "the shards end at %zu of %zu", end, n);
    T_ASSERT(save_sharded(dir, &ck, 3, err, sizeof(err)) == 0, "sharded save: %s", err);
    for (int r = 0; r < 3; r++) {
        char name[96];
        fp8t_checkpoint_shard_name(name, sizeof(name), r, 3);
        path_of(path, sizeof(path), dir, name);
        T_CHECK(access(path, F_OK) == 0, "%s missing", path);
    }
    path_of(path, sizeof(path), dir, "optimizer.safetensors");
    T_CHECK(access(path, F_OK) != 0, "a sharded checkpoint has no optimizer.safetensors");
    /* everything back, as one layout */
    T_ASSERT(fp8t_checkpoint_load(dir, NULL, &back, err, sizeof(err)) == 0, "load: %s", err);
    T_CHECK(back.shards == 3 && back.adam_lo == 0 && back.adam_hi == n, "shards %d, [%zu, %zu)",
            back.shards, back.adam_lo, back.adam_hi);
    T_CHECK(!memcmp(back.params, ck.params, n * sizeof(float)) &&
                !memcmp(back.adam_m, ck.adam_m, n * sizeof(float)) &&
                !memcmp(back.adam_v, ck.adam_v, n * sizeof(float)),
            "the sharded round trip differs");
    fp8t_checkpoint_free(&back);
    /* a range across shard boundaries (another N's shard: resharding on load) */
    lo = n / 3 - 5, hi = 2 * n / 3 + 7;
    T_ASSERT(fp8t_checkpoint_load_range(dir, NULL, lo, hi, &back, err, sizeof(err)) == 0, "%s",
             err);
    T_CHECK(back.adam_lo == lo && back.adam_hi == hi &&
                !memcmp(back.adam_m, ck.adam_m + lo, (hi - lo) * sizeof(float)) &&
                !memcmp(back.adam_v, ck.adam_v + lo, (hi - lo) * sizeof(float)) &&
                !memcmp(back.params, ck.params, n * sizeof(float)),
            "the range [%zu, %zu) differs", lo, hi);
    fp8t_checkpoint_free(&back);
    /* and a range of a plain checkpoint */
    char plain[512];
    fp8t_checkpoint_dir(plain, sizeof(plain), root, 31);
    T_ASSERT(fp8t_checkpoint_save(plain, &ck, err, sizeof(err)) == 0, "%s", err);
    T_ASSERT(fp8t_checkpoint_load_range(plain, NULL, lo, hi, &back, err, sizeof(err)) == 0, "%s",
             err);
    T_CHECK(back.shards == 0 && !memcmp(back.adam_v, ck.adam_v + lo, (hi - lo) * sizeof(float)),
            "range of a plain checkpoint");
    fp8t_checkpoint_free(&back);
    /* a range that reads only shard 2 does not need the others */
    path_of(path, sizeof(path), dir, "optimizer.rank-00000-of-00003.safetensors");
    char aside[1100];
    snprintf(aside, sizeof(aside), "%s.aside", path);
    T_ASSERT(rename(path, aside) == 0, "rename");
    T_CHECK(fp8t_checkpoint_load_range(dir, NULL, n - 3, n, &back, err, sizeof(err)) == 0,
            "the last shard alone: %s", err);
    fp8t_checkpoint_free(&back);
    /* a missing shard that is needed is named */
    T_CHECK(fp8t_checkpoint_load(dir, NULL, &back, err, sizeof(err)) != 0 &&
                strstr(err, "optimizer.rank-00000-of-00003.safetensors") &&
                strstr(err, "missing"),
            "missing shard: %s", err);
    T_ASSERT(rename(aside, path) == 0, "rename back");
    /* shards of another step are refused */
    fp8t_checkpoint other;
    make_ck(&other, 5);
    char odir[512];
    fp8t_checkpoint_dir(odir, sizeof(odir), root, 5);
    T_ASSERT(save_sharded(odir, &other, 3, err, sizeof(err)) == 0, "%s", err);
    char from[1024];
    path_of(from, sizeof(from), odir, "optimizer.rank-00001-of-00003.safetensors");
    path_of(path, sizeof(path), dir, "optimizer.rank-00001-of-00003.safetensors");
    T_ASSERT(rename(from, path) == 0, "rename");
    T_CHECK(fp8t_checkpoint_load(dir, NULL, &back, err, sizeof(err)) != 0 &&
                strstr(err, "optimizer step 5"),
            "mixed shard: %s", err);
    fp8t_checkpoint_free(&other);
    /* a shard that is not the rank's is refused at the write */
    char tmp[1024];
    fp8t_checkpoint part = ck;
    T_ASSERT(fp8t_checkpoint_begin(odir, tmp, sizeof(tmp), err, sizeof(err)) == 0, "%s", err);
    fp8t_checkpoint_shard(n, 2, 0, &part.adam_lo, &part.adam_hi);
    T_CHECK(fp8t_checkpoint_write_shard(tmp, &part, 1, 2, err, sizeof(err)) != 0 &&
                strstr(err, "shard 1 of 2"),
            "wrong shard accepted: %s", err);
    /* a commit without every shard is refused and leaves nothing */
    part.shards = 2;
    T_CHECK(fp8t_checkpoint_commit(tmp, odir, &part, err, sizeof(err)) != 0 &&
                strstr(err, "was not written") && access(tmp, F_OK) != 0,
            "commit without its shards: %s", err);
    /* removal takes the shard files (and their crash temporaries), never a foreign file */
    path_of(path, sizeof(path), dir, "optimizer.rank-00002-of-00003.safetensors.tmp.123");
    write_text(path, "x");
    path_of(path, sizeof(path), dir, "optimizer.rank-00003-of-00003.safetensors");
    write_text(path, "not ours: rank 3 of 3 is no name fp8train writes");
    T_CHECK(fp8t_checkpoint_remove(dir, 1) == 1 && access(path, F_OK) == 0 &&
                count_entries(dir, "optimizer.rank-0000") == 1 &&
                count_entries(dir, "state") == 0,
            "remove: %d shard names left", count_entries(dir, "optimizer.rank-"));
    unlink(path);
    rmdir(dir);
    fp8t_checkpoint_free(&ck);
}

int main(void) {
    t_suite = "checkpoint";
    snprintf(root, sizeof(root), "/tmp/fp8t_test_ckpt_%d", (int)getpid());
    fp8t_rmtree(root);
    mkdir(root, 0777);
    T_RUN(test_round_trip);
    T_RUN(test_only_own_checkpoints_removed);
    T_RUN(test_replace_is_atomic);
    T_RUN(test_missing_file);
    T_RUN(test_missing_state);
    T_RUN(test_truncated);
    T_RUN(test_corrupt_header);
    T_RUN(test_bad_json);
    T_RUN(test_shape_mismatch);
    T_RUN(test_mixed_files);
    T_RUN(test_model_mismatch_and_missing_dir);
    T_RUN(test_prune_and_latest);
    T_RUN(test_model_config_json);
    T_RUN(test_sharded);
    fp8t_rmtree(root);
    T_MAIN_END();
}
