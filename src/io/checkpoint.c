/* Checkpoints: write a directory atomically, read it back validating every file. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fp8train/checkpoint.h"
#include "fp8train/error.h"
#include "fp8train/io.h"
#include "fp8train/recipe.h"
#include "util/fmt.h"
#include "util/fs.h"

#define CKPT_FORMAT "fp8train-checkpoint"
#define FP8T_CKPT_PATH_MAX_INTERNAL 4096

void fp8t_checkpoint_dir(char *buf, size_t len, const char *out_dir, int step) {
    snprintf(buf, len, "%s/checkpoints/step_%06d", out_dir, step);
}

/* Split "a/b/c" into parent "a/b" and base "c" (parent "." when there is no slash). */
static void split_path(const char *path, char *parent, size_t plen, char *base, size_t blen) {
    char tmp[FP8T_CKPT_PATH_MAX_INTERNAL];
    fp8t_fmt(tmp, sizeof(tmp), "%s", path);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0; /* "dir/" -> "dir" */
    char *slash = strrchr(tmp, '/');
    if (!slash) {
        snprintf(parent, plen, ".");
        snprintf(base, blen, "%s", tmp);
    } else if (slash == tmp) {
        snprintf(parent, plen, "/");
        snprintf(base, blen, "%s", slash + 1);
    } else {
        *slash = 0;
        snprintf(parent, plen, "%s", tmp);
        snprintf(base, blen, "%s", slash + 1);
    }
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* ---------------------------------------------------------------- what is ours */

/* The files a checkpoint directory holds, and nothing else fp8train ever writes there. */
static const char *const CKPT_FILES[] = {"model.safetensors", "optimizer.safetensors",
                                         "fp8_meta.safetensors", "state.json"};
#define N_CKPT_FILES ((int)(sizeof(CKPT_FILES) / sizeof(CKPT_FILES[0])))

/* "<prefix><digits>" exactly (at least one digit, nothing after): the pid suffixes of our
 * temporaries. */
static int is_prefix_digits(const char *name, const char *prefix) {
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0 || !name[n]) return 0;
    for (const char *p = name + n; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

void fp8t_checkpoint_shard_name(char *buf, size_t len, int rank, int world) {
    snprintf(buf, len, "optimizer.rank-%05d-of-%05d.safetensors", rank, world);
}

void fp8t_checkpoint_shard(size_t n, int world, int rank, size_t *lo, size_t *hi) {
    const size_t w = (size_t)(world > 0 ? world : 1), r = (size_t)rank;
    *lo = r * (n / w) + (r < n % w ? r : n % w);
    *hi = *lo + n / w + (r < n % w);
}

/* Length of the optimizer shard file name name starts with, exactly as
 * fp8t_checkpoint_shard_name writes it (rank < world), else 0. */
static size_t shard_name_len(const char *name) {
    int r = -1, w = -1, n = 0;
    if (sscanf(name, "optimizer.rank-%5d-of-%5d.safetensors%n", &r, &w, &n) != 2 || n <= 0 ||
        r < 0 || w < 1 || r >= w)
        return 0;
    char canon[96];
    fp8t_checkpoint_shard_name(canon, sizeof(canon), r, w);
    return strlen(canon) == (size_t)n && !strncmp(name, canon, (size_t)n) ? (size_t)n : 0;
}

/* A file fp8train writes inside a checkpoint directory: one of CKPT_FILES or an optimizer
 * shard, or the temporary of one (fp8t_atomic_open's "<file>.tmp.<pid>", left behind only by
 * a crash). */
static int is_ckpt_file(const char *name) {
    for (int i = 0; i < N_CKPT_FILES; i++) {
        size_t n = strlen(CKPT_FILES[i]);
        if (!strcmp(name, CKPT_FILES[i])) return 1;
        if (!strncmp(name, CKPT_FILES[i], n) && is_prefix_digits(name + n, ".tmp.")) return 1;
    }
    size_t n = shard_name_len(name);
    return n && (!name[n] || is_prefix_digits(name + n, ".tmp."));
}

int fp8t_checkpoint_step_of_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    const char *p = name + 5;
    if (!*p) return -1;
    long v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || v > 100000000) return -1;
        v = v * 10 + (*p - '0');
    }
    /* exactly what fp8t_checkpoint_dir writes ("step_%06d"): "step_20" or "step_0000020" is
     * somebody else's */
    char canon[32];
    snprintf(canon, sizeof(canon), "step_%06ld", v);
    return strcmp(canon, name) == 0 ? (int)v : -1;
}

/* Does dir hold a state.json that fp8train wrote (its "format" marker)? */
static int has_own_state(const char *dir) {
    char path[FP8T_CKPT_PATH_MAX_INTERNAL * 2 + 64], e[256];
    fp8t_fmt(path, sizeof(path), "%s/state.json", dir);
    char *text = NULL;
    size_t len = 0;
    if (fp8t_read_file(path, &text, &len, e, sizeof(e)) != 0) return 0;
    cJSON *o = cJSON_Parse(text);
    free(text);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    int ok = cJSON_IsString(fmt) && strcmp(fmt->valuestring, CKPT_FORMAT) == 0;
    cJSON_Delete(o);
    return ok;
}

/* First entry of dir that is not a checkpoint file (into foreign), 1 if there is one, 0 if
 * every entry is ours, -1 if dir cannot be read. */
static int foreign_entry(const char *dir, char *foreign, size_t len) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (!is_ckpt_file(e->d_name)) {
            snprintf(foreign, len, "%s", e->d_name);
            found = 1;
        }
    }
    closedir(d);
    return found;
}

/* Delete the checkpoint files in dir and then dir itself, if nothing else is in it. Files
 * fp8train did not write stay, and so then does the directory: 0 removed, 1 kept (a note on
 * stderr names the file), -1 not a directory. */
static int remove_ckpt_files(const char *dir, int quiet) {
    char foreign[256] = "";
    int f = foreign_entry(dir, foreign, sizeof(foreign));
    if (f < 0) return -1;
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    char path[FP8T_CKPT_PATH_MAX_INTERNAL * 3];
    while ((e = readdir(d))) {
        if (!is_ckpt_file(e->d_name)) continue;
        fp8t_fmt(path, sizeof(path), "%s/%s", dir, e->d_name);
        (void)unlink(path);
    }
    closedir(d);
    if (f == 0 && rmdir(dir) == 0) return 0;
    if (!quiet)
        fp8t_warnf("kept %s: it holds %s, which fp8train did not write (its "
                   "checkpoint files were removed)",
                   dir, foreign[0] ? foreign : "other files");
    return 1;
}

int fp8t_checkpoint_remove(const char *dir, int quiet) {
    if (!fp8t_is_dir(dir) || !has_own_state(dir)) return -1;
    return remove_ckpt_files(dir, quiet);
}

/* ---------------------------------------------------------------- save */

static fp8t_param_info *param_table(const fp8t_model_config *m, int *count, size_t *total) {
    fp8t_param_info *info = calloc(FP8T_MAX_PARAM_TENSORS, sizeof(*info));
    if (!info) return NULL;
    *count = fp8t_model_param_table(m, info, total);
    return info;
}

/* The tensors are borrowed (add_ref): ck outlives each save, and a copy of every weight and
 * moment would double the host memory a checkpoint of a large model needs. */
static void add_params(fp8t_st_writer *w, const char *prefix, const fp8t_param_info *info,
                       int count, const float *base) {
    for (int i = 0; i < count; i++) {
        char name[128];
        snprintf(name, sizeof(name), "%s%s", prefix, info[i].name);
        int64_t shape[2] = {info[i].shape[0], info[i].shape[1]};
        fp8t_st_writer_add_ref(w, name, FP8T_ST_F32, info[i].ndim, shape, base + info[i].offset);
    }
}

static char *state_json(const fp8t_checkpoint *ck) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", CKPT_FORMAT);
    cJSON_AddNumberToObject(o, "version",
                            ck->shards > 0 ? FP8T_CKPT_VERSION_SHARDED : FP8T_CKPT_VERSION);
    if (ck->shards > 0) cJSON_AddNumberToObject(o, "optimizer_shards", ck->shards);
    cJSON_AddNumberToObject(o, "step", ck->step);
    if (isfinite(ck->loss)) cJSON_AddNumberToObject(o, "loss", ck->loss);
    char num[32];
    cJSON *data = cJSON_AddObjectToObject(o, "data");
    /* 64-bit integers as decimal strings: JSON numbers are doubles for most readers */
    snprintf(num, sizeof(num), "%llu", (unsigned long long)ck->data_position);
    cJSON_AddStringToObject(data, "position", num);
    cJSON *rng = cJSON_AddObjectToObject(o, "rng");
    snprintf(num, sizeof(num), "%llu", (unsigned long long)ck->seed);
    cJSON_AddStringToObject(rng, "seed", num);
    char *mj = fp8t_model_config_to_json(&ck->model);
    cJSON_AddItemToObject(o, "model", cJSON_Parse(mj));
    free(mj);
    cJSON *fp8 = cJSON_AddObjectToObject(o, "fp8");
    cJSON_AddNumberToObject(fp8, "n", ck->fp8_n);
    cJSON_AddNumberToObject(fp8, "history_len", ck->fp8_len);
    if (ck->policy_json) {
        cJSON *p = cJSON_Parse(ck->policy_json);
        cJSON_AddItemToObject(o, "policy", p ? p : cJSON_CreateString(ck->policy_json));
    }
    if (ck->config_json) {
        cJSON *c = cJSON_Parse(ck->config_json);
        cJSON_AddItemToObject(o, "config", c ? c : cJSON_CreateString(ck->config_json));
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

static int write_files(const char *tmp, const fp8t_checkpoint *ck, char *err, size_t errlen) {
    int count;
    size_t total;
    fp8t_param_info *info = param_table(&ck->model, &count, &total);
    if (!info) {
        return fp8t_errorf(err, errlen, "out of memory writing checkpoint %s", tmp);
    }
    if (count <= 0 || total != ck->num_params) {
        fp8t_errorf(err, errlen,
                    "checkpoint: the model config gives %zu parameters but %zu were "
                    "given",
                    total, ck->num_params);
        free(info);
        return -1;
    }
    if (!ck->shards && ck->adam_hi && (ck->adam_lo || ck->adam_hi != ck->num_params)) {
        fp8t_errorf(err, errlen,
                    "checkpoint: the moments of parameters [%zu, %zu) only were given; "
                    "one optimizer file needs all %zu (a ZeRO-1 run writes shards: "
                    "fp8t_checkpoint_write_shard)",
                    ck->adam_lo, ck->adam_hi, ck->num_params);
        free(info);
        return -1;
    }
    char path[FP8T_CKPT_PATH_MAX_INTERNAL * 2 + 64], num[32];
    int rc = -1;
    char *mj = fp8t_model_config_to_json(&ck->model);
    snprintf(num, sizeof(num), "%d", ck->step);

    fp8t_st_writer *w = fp8t_st_writer_new();
    add_params(w, "", info, count, ck->params);
    fp8t_st_writer_metadata(w, "format", "fp8train");
    fp8t_st_writer_metadata(w, "model_config", mj);
    fp8t_st_writer_metadata(w, "step", num);
    fp8t_fmt(path, sizeof(path), "%s/model.safetensors", tmp);
    if (fp8t_st_writer_save(w, path, err, errlen) != 0) goto fail;
    fp8t_st_writer_free(w);

    /* the moments: here in one file, or already in tmp as the ranks' shards */
    w = fp8t_st_writer_new();
    if (!ck->shards) {
        add_params(w, "exp_avg.", info, count, ck->adam_m);
        add_params(w, "exp_avg_sq.", info, count, ck->adam_v);
        int64_t one = 1, step64 = ck->step;
        fp8t_st_writer_add(w, "step", FP8T_ST_I64, 1, &one, &step64);
        fp8t_st_writer_metadata(w, "format", "fp8train");
        fp8t_st_writer_metadata(w, "optimizer", "adamw");
        fp8t_fmt(path, sizeof(path), "%s/optimizer.safetensors", tmp);
        if (fp8t_st_writer_save(w, path, err, errlen) != 0) goto fail;
    }
    fp8t_st_writer_free(w);

    w = fp8t_st_writer_new();
    int64_t nfl = (int64_t)fp8t_recipe_state_floats(ck->fp8_n, ck->fp8_len);
    fp8t_st_writer_add_ref(w, "recipe_state", FP8T_ST_F32, 1, &nfl, ck->fp8_state);
    snprintf(num, sizeof(num), "%d", ck->fp8_n);
    fp8t_st_writer_metadata(w, "n", num);
    snprintf(num, sizeof(num), "%d", ck->fp8_len);
    fp8t_st_writer_metadata(w, "history_len", num);
    fp8t_st_writer_metadata(w, "layout",
                            "history[len][n], scale[n], scale_inv[n], fmt_max[n]; "
                            "tensor t = linear*3 + role (0 x, 1 w, 2 dy)");
    fp8t_fmt(path, sizeof(path), "%s/fp8_meta.safetensors", tmp);
    if (fp8t_st_writer_save(w, path, err, errlen) != 0) goto fail;
    fp8t_st_writer_free(w);
    w = NULL;

    char *sj = state_json(ck);
    fp8t_fmt(path, sizeof(path), "%s/state.json", tmp);
    rc = fp8t_write_file_atomic(path, sj, strlen(sj), err, errlen);
    free(sj);
fail:
    fp8t_st_writer_free(w);
    free(mj);
    free(info);
    return rc;
}

/* Move the checkpoint files of the complete directory tmp into dir, state.json last (a reader
 * that sees the new state.json sees the new tensors). err stays "" on success. */
static void move_files_in(const char *tmp, const char *dir, char *err, size_t errlen) {
    err[0] = 0;
    DIR *d = opendir(tmp);
    if (!d) {
        fp8t_errorf(err, errlen, "cannot read %s: %s", tmp, strerror(errno));
        return;
    }
    /* every file of the checkpoint (the optimizer shards too), state.json last */
    for (int last = 0; last < 2 && !err[0]; last++) {
        rewinddir(d);
        struct dirent *e;
        while (!err[0] && (e = readdir(d))) {
            if (!is_ckpt_file(e->d_name) || strstr(e->d_name, ".tmp.") ||
                (strcmp(e->d_name, "state.json") == 0) != last)
                continue;
            char from[FP8T_CKPT_PATH_MAX_INTERNAL * 3], to[FP8T_CKPT_PATH_MAX_INTERNAL * 3];
            fp8t_fmt(from, sizeof(from), "%s/%s", tmp, e->d_name);
            fp8t_fmt(to, sizeof(to), "%s/%s", dir, e->d_name);
            if (rename(from, to) != 0)
                fp8t_errorf(err, errlen, "cannot move %s to %s: %s", from, to, strerror(errno));
        }
    }
    closedir(d);
    if (!err[0]) fsync_dir(dir);
}

int fp8t_checkpoint_begin(const char *dir, char *tmp, size_t tmplen, char *err, size_t errlen) {
    if (strlen(dir) >= FP8T_CKPT_PATH_MAX_INTERNAL - 64) {
        return fp8t_errorf(err, errlen, "checkpoint path too long: %s", dir);
    }
    char parent[FP8T_CKPT_PATH_MAX_INTERNAL], base[FP8T_CKPT_PATH_MAX_INTERNAL];
    split_path(dir, parent, sizeof(parent), base, sizeof(base));
    if (fp8t_mkdirs(parent, err, errlen) != 0) return -1;
    if (fp8t_fmt(tmp, tmplen, "%s/.tmp.%s.%ld", parent, base, (long)getpid()) != 0) {
        return fp8t_errorf(err, errlen, "checkpoint path too long: %s", dir);
    }
    (void)remove_ckpt_files(tmp, 1); /* a leftover of a crashed process with our pid */
    if (mkdir(tmp, 0777) != 0) {
        return fp8t_errorf(err, errlen, "cannot create checkpoint directory %s: %s", tmp,
                           strerror(errno));
    }
    return 0;
}

void fp8t_checkpoint_abandon(const char *tmp) { (void)remove_ckpt_files(tmp, 1); }

int fp8t_checkpoint_write_shard(const char *tmp, const fp8t_checkpoint *ck, int rank, int world,
                                char *err, size_t errlen) {
    size_t lo, hi;
    fp8t_checkpoint_shard(ck->num_params, world, rank, &lo, &hi);
    if (rank < 0 || rank >= world || ck->adam_lo != lo || ck->adam_hi != hi) {
        return fp8t_errorf(err, errlen,
                           "checkpoint shard %d of %d: the moments given are of parameters "
                           "[%zu, %zu), its shard is [%zu, %zu)",
                           rank, world, ck->adam_lo, ck->adam_hi, lo, hi);
    }
    char path[FP8T_CKPT_PATH_MAX_INTERNAL * 2 + 64], name[96], num[32];
    fp8t_checkpoint_shard_name(name, sizeof(name), rank, world);
    fp8t_fmt(path, sizeof(path), "%s/%s", tmp, name);
    fp8t_st_writer *w = fp8t_st_writer_new();
    int64_t k = (int64_t)(hi - lo), one = 1, step64 = ck->step;
    /* a shard cuts across tensors: the flat vectors' slice, as 1-D tensors */
    fp8t_st_writer_add_ref(w, "exp_avg", FP8T_ST_F32, 1, &k, ck->adam_m);
    fp8t_st_writer_add_ref(w, "exp_avg_sq", FP8T_ST_F32, 1, &k, ck->adam_v);
    fp8t_st_writer_add(w, "step", FP8T_ST_I64, 1, &one, &step64);
    fp8t_st_writer_metadata(w, "format", "fp8train");
    fp8t_st_writer_metadata(w, "optimizer", "adamw");
    snprintf(num, sizeof(num), "%zu", lo);
    fp8t_st_writer_metadata(w, "offset", num);
    snprintf(num, sizeof(num), "%zu", hi - lo);
    fp8t_st_writer_metadata(w, "count", num);
    snprintf(num, sizeof(num), "%d", rank);
    fp8t_st_writer_metadata(w, "rank", num);
    snprintf(num, sizeof(num), "%d", world);
    fp8t_st_writer_metadata(w, "world_size", num);
    snprintf(num, sizeof(num), "%zu", ck->num_params);
    fp8t_st_writer_metadata(w, "num_params", num);
    int rc = fp8t_st_writer_save(w, path, err, errlen);
    fp8t_st_writer_free(w);
    return rc;
}

/* tmp (complete) becomes dir: see fp8t_checkpoint_save */
static int install(const char *tmp, const char *dir, char *err, size_t errlen) {
    char parent[FP8T_CKPT_PATH_MAX_INTERNAL], base[FP8T_CKPT_PATH_MAX_INTERNAL];
    char old[FP8T_CKPT_PATH_MAX_INTERNAL * 2];
    split_path(dir, parent, sizeof(parent), base, sizeof(base));
    fp8t_fmt(old, sizeof(old), "%s/.old.%s.%ld", parent, base, (long)getpid());
    fsync_dir(tmp);
    /* replace an existing checkpoint of the same name: move it aside first, so that at every
     * moment `dir` is either the old complete checkpoint or the new complete one */
    int had_old = fp8t_path_exists(dir);
    char foreign[256];
    if (had_old && fp8t_is_dir(dir) && foreign_entry(dir, foreign, sizeof(foreign)) != 0) {
        /* the directory holds files fp8train did not write (an import --to --overwrite into
         * a user's directory): they stay where they are, and each checkpoint file is moved
         * in by its own atomic rename */
        move_files_in(tmp, dir, err, errlen);
        int failed = err[0] != 0;
        (void)remove_ckpt_files(tmp, 1); /* what was not moved, then tmp */
        return failed ? -1 : 0;
    }
    if (had_old && rename(dir, old) != 0) {
        fp8t_errorf(err, errlen, "cannot move the old checkpoint %s aside: %s", dir,
                    strerror(errno));
        (void)remove_ckpt_files(tmp, 1);
        return -1;
    }
    if (rename(tmp, dir) != 0) {
        fp8t_errorf(err, errlen, "cannot rename %s to %s: %s", tmp, dir, strerror(errno));
        if (had_old) (void)rename(old, dir);
        (void)remove_ckpt_files(tmp, 1);
        return -1;
    }
    fsync_dir(parent);
    /* what was there before: deleted only if it was a checkpoint of fp8train's (a directory of
     * somebody else's that happened to hold only files named like ours stays, aside) */
    if (had_old && has_own_state(old))
        remove_ckpt_files(old, 0);
    else if (had_old)
        fp8t_warnf("%s was not an fp8train checkpoint; its contents were moved to "
                   "%s",
                   dir, old);
    return 0;
}

int fp8t_checkpoint_commit(const char *tmp, const char *dir, const fp8t_checkpoint *ck, char *err,
                           size_t errlen) {
    if (strlen(dir) >= FP8T_CKPT_PATH_MAX_INTERNAL - 64) {
        fp8t_errorf(err, errlen, "checkpoint path too long: %s", dir);
        (void)remove_ckpt_files(tmp, 1);
        return -1;
    }
    for (int r = 0; r < ck->shards; r++) { /* every rank's shard is there before state.json */
        char name[96], path[FP8T_CKPT_PATH_MAX_INTERNAL * 2 + 128];
        fp8t_checkpoint_shard_name(name, sizeof(name), r, ck->shards);
        fp8t_fmt(path, sizeof(path), "%s/%s", tmp, name);
        if (!fp8t_path_exists(path)) {
            fp8t_errorf(err, errlen, "checkpoint: the optimizer shard %s was not written", path);
            (void)remove_ckpt_files(tmp, 1);
            return -1;
        }
    }
    if (write_files(tmp, ck, err, errlen) != 0) {
        (void)remove_ckpt_files(tmp, 1);
        return -1;
    }
    return install(tmp, dir, err, errlen);
}

int fp8t_checkpoint_save(const char *dir, const fp8t_checkpoint *ck, char *err, size_t errlen) {
    if (ck->shards) {
        return fp8t_errorf(err, errlen,
                           "checkpoint: a sharded checkpoint is written by its ranks "
                           "(fp8t_checkpoint_begin, write_shard, commit)");
    }
    char tmp[FP8T_CKPT_PATH_MAX_INTERNAL * 2];
    if (fp8t_checkpoint_begin(dir, tmp, sizeof(tmp), err, errlen) != 0) return -1;
    return fp8t_checkpoint_commit(tmp, dir, ck, err, errlen);
}

/* ---------------------------------------------------------------- load */

void fp8t_checkpoint_free(fp8t_checkpoint *ck) {
    free(ck->params);
    free(ck->adam_m);
    free(ck->adam_v);
    free(ck->fp8_state);
    free(ck->config_json);
    free(ck->policy_json);
    memset(ck, 0, sizeof(*ck));
}

static int parse_u64(const cJSON *v, uint64_t *out) {
    if (cJSON_IsString(v)) {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v->valuestring, &end, 10);
        if (errno || end == v->valuestring || *end) return -1;
        *out = x;
        return 0;
    }
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 9007199254740992.0 &&
        v->valuedouble == floor(v->valuedouble)) {
        *out = (uint64_t)v->valuedouble;
        return 0;
    }
    return -1;
}

#define DAMAGED                                                                                  \
    "the checkpoint is damaged or was not written by fp8train; resume from another "             \
    "checkpoint (ls the checkpoints directory) or start fresh without --resume"

int fp8t_checkpoint_read_state(const char *dir, fp8t_checkpoint *ck, char *err, size_t errlen) {
    memset(ck, 0, sizeof(*ck));
    if (!fp8t_is_dir(dir)) {
        return fp8t_errorf(err, errlen,
                           "checkpoint '%s' is not a directory; pass a checkpoint directory "
                           "such as RUN/checkpoints/step_000100",
                           dir);
    }
    char path[FP8T_CKPT_PATH_MAX_INTERNAL * 2 + 64];
    fp8t_fmt(path, sizeof(path), "%s/state.json", dir);
    char *text = NULL;
    size_t len = 0;
    char e[FP8T_ERR_LEN];
    if (fp8t_read_file(path, &text, &len, e, sizeof(e)) != 0) {
        return fp8t_errorf(err, errlen, "%s: cannot read (%s); %s", path, e, DAMAGED);
    }
    cJSON *o = cJSON_Parse(text);
    free(text);
    int rc = -1;
    if (!cJSON_IsObject(o)) {
        fp8t_errorf(err, errlen, "%s: not valid JSON; %s", path, DAMAGED);
        goto done;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, CKPT_FORMAT) != 0) {
        fp8t_errorf(err, errlen, "%s: \"format\" is not \"%s\"; %s", path, CKPT_FORMAT, DAMAGED);
        goto done;
    }
    if (!cJSON_IsNumber(ver) || (ver->valuedouble != FP8T_CKPT_VERSION &&
                                 ver->valuedouble != FP8T_CKPT_VERSION_SHARDED)) {
        fp8t_errorf(err, errlen,
                    "%s: checkpoint format version %g, this fp8train reads versions "
                    "%d and %d; use the fp8train that wrote it",
                    path, cJSON_IsNumber(ver) ? ver->valuedouble : -1.0, FP8T_CKPT_VERSION,
                    FP8T_CKPT_VERSION_SHARDED);
        goto done;
    }
    const cJSON *nsh = cJSON_GetObjectItemCaseSensitive(o, "optimizer_shards");
    if (ver->valuedouble == FP8T_CKPT_VERSION_SHARDED) {
        if (!cJSON_IsNumber(nsh) || nsh->valuedouble < 1 || nsh->valuedouble > 99999 ||
            nsh->valuedouble != floor(nsh->valuedouble)) {
            fp8t_errorf(err, errlen,
                        "%s: \"optimizer_shards\" is missing or not a rank count; %s", path,
                        DAMAGED);
            goto done;
        }
        ck->shards = (int)nsh->valuedouble;
    }
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    if (!cJSON_IsNumber(step) || step->valuedouble < 0 || step->valuedouble > 1e9 ||
        step->valuedouble != floor(step->valuedouble)) {
        fp8t_errorf(err, errlen, "%s: \"step\" is missing or not a non-negative integer; %s",
                    path, DAMAGED);
        goto done;
    }
    ck->step = (int)step->valuedouble;
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss");
    ck->loss = cJSON_IsNumber(loss) ? (float)loss->valuedouble : NAN;
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(o, "data");
    if (parse_u64(cJSON_GetObjectItemCaseSensitive(data, "position"), &ck->data_position) != 0) {
        fp8t_errorf(err, errlen, "%s: \"data.position\" is missing or not an integer; %s", path,
                    DAMAGED);
        goto done;
    }
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(o, "rng");
    if (parse_u64(cJSON_GetObjectItemCaseSensitive(rng, "seed"), &ck->seed) != 0) {
        fp8t_errorf(err, errlen, "%s: \"rng.seed\" is missing or not an integer; %s", path,
                    DAMAGED);
        goto done;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    char *mj = model ? cJSON_PrintUnformatted(model) : NULL;
    if (!mj || fp8t_model_config_from_json(&ck->model, mj, e, sizeof(e)) != 0) {
        fp8t_errorf(err, errlen, "%s: \"model\": %s; %s", path, mj ? e : "missing", DAMAGED);
        free(mj);
        goto done;
    }
    free(mj);
    const cJSON *fp8 = cJSON_GetObjectItemCaseSensitive(o, "fp8");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(fp8, "n");
    const cJSON *fl = cJSON_GetObjectItemCaseSensitive(fp8, "history_len");
    if (!cJSON_IsNumber(fn) || !cJSON_IsNumber(fl) || fn->valuedouble < 0 ||
        fl->valuedouble < 1 || fn->valuedouble > 1e7 || fl->valuedouble > 1e6) {
        fp8t_errorf(err, errlen, "%s: \"fp8\" {n, history_len} is missing or invalid; %s", path,
                    DAMAGED);
        goto done;
    }
    ck->fp8_n = (int)fn->valuedouble;
    ck->fp8_len = (int)fl->valuedouble;
    const cJSON *pol = cJSON_GetObjectItemCaseSensitive(o, "policy");
    if (pol) ck->policy_json = cJSON_PrintUnformatted(pol);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(o, "config");
    if (cfg) ck->config_json = cJSON_PrintUnformatted(cfg);
    rc = 0;
done:
    cJSON_Delete(o);
    if (rc != 0) fp8t_checkpoint_free(ck);
    return rc;
}

static void format_shape(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* Open a safetensors file of the checkpoint with an error that names it and the fix. */
static fp8t_st_file *open_st(const char *dir, const char *file, char *err, size_t errlen) {
    char path[FP8T_CKPT_PATH_MAX_INTERNAL * 2 + 64], e[768];
    fp8t_fmt(path, sizeof(path), "%s/%s", dir, file);
    fp8t_st_file *f = NULL;
    if (!fp8t_path_exists(path)) {
        fp8t_errorf(err, errlen, "%s is missing; %s", path, DAMAGED);
        return NULL;
    }
    if (fp8t_st_open(&f, path, e, sizeof(e)) != 0) {
        fp8t_errorf(err, errlen, "%s; %s", e, DAMAGED);
        return NULL;
    }
    return f;
}

/* Read every parameter tensor `prefix<name>` into base, checking dtype and shape. */
static int read_params(fp8t_st_file *f, const char *path, const char *prefix,
                       const fp8t_param_info *info, int count, float *base, char *err,
                       size_t errlen) {
    for (int i = 0; i < count; i++) {
        char name[128];
        snprintf(name, sizeof(name), "%s%s", prefix, info[i].name);
        const fp8t_st_tensor *t = fp8t_st_find(f, name);
        if (!t) {
            return fp8t_errorf(err, errlen,
                               "%s: tensor '%s' is missing; the file does not match the model "
                               "in state.json; %s",
                               path, name, DAMAGED);
        }
        int64_t want[2] = {info[i].shape[0], info[i].shape[1]};
        int same = t->ndim == info[i].ndim && t->dtype == FP8T_ST_F32;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == want[d];
        if (!same) {
            char got[96], exp[96];
            format_shape(got, sizeof(got), t->ndim, t->shape);
            format_shape(exp, sizeof(exp), info[i].ndim, want);
            return fp8t_errorf(
                err, errlen,
                "%s: tensor '%s' is %s %s but the model config in state.json "
                "needs F32 %s; the checkpoint was written for another model, or is damaged",
                path, name, fp8t_st_dtype_name(t->dtype), got, exp);
        }
        if (fp8t_st_read_f32(f, name, base + info[i].offset, info[i].numel, err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* The moments of [lo, hi) from the W shard files into adam_m/adam_v (hi - lo floats): only the
 * files whose shard overlaps the range are opened, each checked against the split. */
static int read_shards(const char *dir, fp8t_checkpoint *ck, size_t lo, size_t hi, char *err,
                       size_t errlen) {
    const int W = ck->shards;
    for (int r = 0; r < W; r++) {
        size_t a, b;
        fp8t_checkpoint_shard(ck->num_params, W, r, &a, &b);
        const size_t from = a > lo ? a : lo, to = b < hi ? b : hi;
        if (from >= to) continue;
        char name[96], path[FP8T_CKPT_PATH_MAX_INTERNAL * 2 + 128];
        fp8t_checkpoint_shard_name(name, sizeof(name), r, W);
        fp8t_fmt(path, sizeof(path), "%s/%s", dir, name);
        fp8t_st_file *f = open_st(dir, name, err, errlen);
        if (!f) return -1;
        const char *mo = fp8t_st_metadata(f, "offset"), *mc = fp8t_st_metadata(f, "count");
        const fp8t_st_tensor *st = fp8t_st_find(f, "step");
        int rc = -1;
        float *buf = malloc((b - a) * sizeof(float) + 1);
        if (!buf) {
            fp8t_errorf(err, errlen, "out of memory loading %s", path);
        } else if (!mo || !mc || strtoull(mo, NULL, 10) != a || strtoull(mc, NULL, 10) != b - a) {
            fp8t_errorf(err, errlen,
                        "%s: metadata offset/count (%s/%s) are not shard %d of %d of "
                        "%zu parameters ([%zu, %zu)); %s",
                        path, mo ? mo : "missing", mc ? mc : "missing", r, W, ck->num_params, a,
                        b, DAMAGED);
        } else if (!st || st->dtype != FP8T_ST_I64 || st->numel != 1) {
            fp8t_errorf(err, errlen, "%s: tensor 'step' (I64 [1]) is missing; %s", path, DAMAGED);
        } else {
            int64_t ostep;
            memcpy(&ostep, fp8t_st_data(f, st), sizeof(ostep));
            if (ostep != ck->step)
                fp8t_errorf(err, errlen,
                            "%s: optimizer step %lld does not match state.json step "
                            "%d; files of different checkpoints were mixed; %s",
                            path, (long long)ostep, ck->step, DAMAGED);
            else if (fp8t_st_read_f32(f, "exp_avg", buf, b - a, err, errlen) == 0) {
                memcpy(ck->adam_m + (from - lo), buf + (from - a), (to - from) * sizeof(float));
                if (fp8t_st_read_f32(f, "exp_avg_sq", buf, b - a, err, errlen) == 0) {
                    memcpy(ck->adam_v + (from - lo), buf + (from - a),
                           (to - from) * sizeof(float));
                    rc = 0;
                }
            }
        }
        free(buf);
        fp8t_st_close(f);
        if (rc != 0) return -1;
    }
    return 0;
}

static int load_impl(const char *dir, const fp8t_model_config *expect, size_t lo, size_t hi,
                     fp8t_checkpoint *ck, char *err, size_t errlen);

int fp8t_checkpoint_load(const char *dir, const fp8t_model_config *expect, fp8t_checkpoint *ck,
                         char *err, size_t errlen) {
    return load_impl(dir, expect, 0, SIZE_MAX, ck, err, errlen);
}

int fp8t_checkpoint_load_range(const char *dir, const fp8t_model_config *expect, size_t lo,
                               size_t hi, fp8t_checkpoint *ck, char *err, size_t errlen) {
    return load_impl(dir, expect, lo, hi, ck, err, errlen);
}

/* hi SIZE_MAX: all the moments */
static int load_impl(const char *dir, const fp8t_model_config *expect, size_t lo, size_t hi,
                     fp8t_checkpoint *ck, char *err, size_t errlen) {
    if (strlen(dir) >= FP8T_CKPT_PATH_MAX_INTERNAL - 64) {
        return fp8t_errorf(err, errlen, "checkpoint path too long: %s", dir);
    }
    if (fp8t_checkpoint_read_state(dir, ck, err, errlen) != 0) return -1;
    char e[FP8T_ERR_LEN];
    if (expect && fp8t_model_config_diff(&ck->model, expect, e, sizeof(e)) != 0) {
        fp8t_errorf(err, errlen,
                    "checkpoint %s was written for another model: %s; resume with the "
                    "model options of the run that wrote it (see its state.json \"model\")",
                    dir, e);
        fp8t_checkpoint_free(ck);
        return -1;
    }
    int count;
    size_t total;
    fp8t_param_info *info = param_table(&ck->model, &count, &total);
    fp8t_st_file *f = NULL;
    char path[FP8T_CKPT_PATH_MAX_INTERNAL * 2 + 64];
    int rc = -1;
    if (!info) {
        fp8t_errorf(err, errlen, "out of memory");
        goto done;
    }
    ck->num_params = total;
    if (hi == SIZE_MAX) hi = total;
    if (lo > hi || hi > total) {
        fp8t_errorf(err, errlen,
                    "checkpoint %s: moments of parameters [%zu, %zu) asked for, it has "
                    "%zu parameters",
                    dir, lo, hi, total);
        goto done;
    }
    ck->adam_lo = lo;
    ck->adam_hi = hi;
    ck->params = malloc(total * sizeof(float));
    ck->adam_m = malloc((hi - lo) * sizeof(float) + 1);
    ck->adam_v = malloc((hi - lo) * sizeof(float) + 1);
    size_t nfl = fp8t_recipe_state_floats(ck->fp8_n, ck->fp8_len);
    ck->fp8_state = malloc((nfl ? nfl : 1) * sizeof(float));
    if (!ck->params || !ck->adam_m || !ck->adam_v || !ck->fp8_state) {
        fp8t_errorf(err, errlen, "out of memory loading checkpoint %s (%zu parameters)", dir,
                    total);
        goto done;
    }

    /* model.safetensors */
    fp8t_fmt(path, sizeof(path), "%s/model.safetensors", dir);
    if (!(f = open_st(dir, "model.safetensors", err, errlen))) goto done;
    if (fp8t_st_count(f) != count) {
        fp8t_errorf(err, errlen, "%s holds %d tensors but the model in state.json has %d; %s",
                    path, fp8t_st_count(f), count, DAMAGED);
        goto done;
    }
    if (read_params(f, path, "", info, count, ck->params, err, errlen) != 0) goto done;
    fp8t_st_close(f);

    /* the moments: the shard files of a ZeRO-1 run, or optimizer.safetensors */
    f = NULL;
    if (ck->shards) {
        if (read_shards(dir, ck, lo, hi, err, errlen) != 0) goto done;
        goto fp8_meta;
    }
    fp8t_fmt(path, sizeof(path), "%s/optimizer.safetensors", dir);
    if (!(f = open_st(dir, "optimizer.safetensors", err, errlen))) goto done;
    if (lo == 0 && hi == total) {
        if (read_params(f, path, "exp_avg.", info, count, ck->adam_m, err, errlen) != 0 ||
            read_params(f, path, "exp_avg_sq.", info, count, ck->adam_v, err, errlen) != 0)
            goto done;
    } else { /* a slice: through one full copy at a time */
        float *full = malloc(total * sizeof(float) + 1);
        int bad = !full;
        if (bad) fp8t_errorf(err, errlen, "out of memory loading checkpoint %s", dir);
        if (!bad) bad = read_params(f, path, "exp_avg.", info, count, full, err, errlen) != 0;
        if (!bad) memcpy(ck->adam_m, full + lo, (hi - lo) * sizeof(float));
        if (!bad) bad = read_params(f, path, "exp_avg_sq.", info, count, full, err, errlen) != 0;
        if (!bad) memcpy(ck->adam_v, full + lo, (hi - lo) * sizeof(float));
        free(full);
        if (bad) goto done;
    }
    const fp8t_st_tensor *st = fp8t_st_find(f, "step");
    if (!st || st->dtype != FP8T_ST_I64 || st->numel != 1) {
        fp8t_errorf(err, errlen, "%s: tensor 'step' (I64 [1]) is missing; %s", path, DAMAGED);
        goto done;
    }
    int64_t ostep;
    memcpy(&ostep, fp8t_st_data(f, st), sizeof(ostep));
    if (ostep != ck->step) {
        fp8t_errorf(err, errlen,
                    "%s: optimizer step %lld does not match state.json step %d; files of "
                    "different checkpoints were mixed; %s",
                    path, (long long)ostep, ck->step, DAMAGED);
        goto done;
    }
    fp8t_st_close(f);
    f = NULL;

fp8_meta:
    /* fp8_meta.safetensors */
    fp8t_fmt(path, sizeof(path), "%s/fp8_meta.safetensors", dir);
    if (!(f = open_st(dir, "fp8_meta.safetensors", err, errlen))) goto done;
    const char *mn = fp8t_st_metadata(f, "n"), *ml = fp8t_st_metadata(f, "history_len");
    if (!mn || !ml || atoi(mn) != ck->fp8_n || atoi(ml) != ck->fp8_len) {
        fp8t_errorf(err, errlen,
                    "%s: metadata n/history_len (%s/%s) do not match state.json "
                    "(%d/%d); %s",
                    path, mn ? mn : "missing", ml ? ml : "missing", ck->fp8_n, ck->fp8_len,
                    DAMAGED);
        goto done;
    }
    if (fp8t_st_read_f32(f, "recipe_state", ck->fp8_state, nfl, err, errlen) != 0) goto done;
    rc = 0;
done:
    fp8t_st_close(f);
    free(info);
    if (rc != 0) fp8t_checkpoint_free(ck);
    return rc;
}

/* ---------------------------------------------------------------- listing */

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Steps of the complete checkpoints fp8train wrote under OUT/checkpoints (a step_NNNNNN name
 * exactly and its state.json), sorted ascending (malloc'd). */
static int list_steps(const char *out_dir, int **steps) {
    char path[FP8T_CKPT_PATH_MAX_INTERNAL * 2 + 64];
    fp8t_fmt(path, sizeof(path), "%s/checkpoints", out_dir);
    *steps = NULL;
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int s = fp8t_checkpoint_step_of_name(e->d_name);
        if (s < 0) continue;
        char sub[FP8T_CKPT_PATH_MAX_INTERNAL * 3];
        fp8t_fmt(sub, sizeof(sub), "%s/%s", path, e->d_name);
        if (!has_own_state(sub)) continue; /* not ours, or not complete */
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int *p = realloc(*steps, (size_t)cap * sizeof(int));
            if (!p) break;
            *steps = p;
        }
        (*steps)[n++] = s;
    }
    closedir(d);
    if (n) qsort(*steps, (size_t)n, sizeof(int), cmp_int);
    return n;
}

int fp8t_checkpoint_latest(const char *out_dir, char *buf, size_t len) {
    int *steps;
    int n = list_steps(out_dir, &steps);
    int best = n ? steps[n - 1] : -1;
    free(steps);
    if (best >= 0) fp8t_checkpoint_dir(buf, len, out_dir, best);
    return best;
}

/* A crash leftover of fp8t_checkpoint_save: ".tmp.step_NNNNNN.<pid>" or ".old.step_NNNNNN.<pid>"
 * exactly. */
static int is_own_temporary(const char *name) {
    if (strncmp(name, ".tmp.", 5) != 0 && strncmp(name, ".old.", 5) != 0) return 0;
    const char *dot = strrchr(name + 5, '.');
    if (!dot) return 0;
    char step[64];
    size_t n = (size_t)(dot - (name + 5));
    if (n >= sizeof(step)) return 0;
    memcpy(step, name + 5, n);
    step[n] = 0;
    return fp8t_checkpoint_step_of_name(step) >= 0 && is_prefix_digits(dot, ".");
}

int fp8t_checkpoint_prune(const char *out_dir, int keep) {
    int removed = 0;
    char path[FP8T_CKPT_PATH_MAX_INTERNAL * 2];
    /* temporaries of this process are in use only inside fp8t_checkpoint_save; any other of
     * ours is left over from a crash. Only our file names in them are deleted. */
    fp8t_fmt(path, sizeof(path), "%s/checkpoints", out_dir);
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (is_own_temporary(e->d_name)) {
                char p[FP8T_CKPT_PATH_MAX_INTERNAL * 3];
                fp8t_fmt(p, sizeof(p), "%s/%s", path, e->d_name);
                /* .tmp.: a checkpoint being written, ours from the start; .old.: what a
                 * replaced step_NNNNNN held, ours only with our state.json */
                if (e->d_name[1] == 't' || has_own_state(p)) (void)remove_ckpt_files(p, 0);
            }
        }
        closedir(d);
    }
    if (keep <= 0) return 0;
    int *steps;
    int n = list_steps(out_dir, &steps);
    for (int i = 0; i < n - keep; i++) {
        fp8t_checkpoint_dir(path, sizeof(path), out_dir, steps[i]);
        if (fp8t_checkpoint_remove(path, 0) == 0) removed++;
    }
    free(steps);
    return removed;
}
