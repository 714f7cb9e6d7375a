/* The run directory (--out): the lock that keeps two trainings out of one directory, the
 * refusal to mix a new run into another run's directory, and a resume into its own run, which
 * moves the old run's later steps aside instead of deleting them. fp8train deletes only what
 * it wrote: checkpoints are removed by fp8t_checkpoint_remove (its own names and marker only). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "fp8train/checkpoint.h"
#include "fp8train/error.h"
#include "fp8train/io.h"
#include "train/trainer_internal.h"
#include "util/fs.h"

/* The files a run writes at the top of its directory. */
static const char *const RUN_FILES[] = {"config.json", "metrics.jsonl", "events.jsonl",
                                        "stats.jsonl"};
#define N_RUN_FILES ((int)(sizeof(RUN_FILES) / sizeof(RUN_FILES[0])))

int rundir_same_run(const char *out_dir, const char *ckpt) {
    char a[PATH_MAX], b[PATH_MAX], sub[FP8T_TRAIN_PATH_BUF];
    if (!ckpt || !ckpt[0]) return 0;
    if (fp8t_fmt(sub, sizeof(sub), "%s/checkpoints", out_dir) != 0) return 0;
    if (!realpath(sub, a) || !realpath(ckpt, b)) return 0;
    size_t n = strlen(a);
    return strncmp(a, b, n) == 0 && b[n] == '/';
}

/* The first sign that out_dir holds a run (one of RUN_FILES, or a checkpoint of fp8train's):
 * 1 and its name in what, else 0. */
static int run_sign(const char *out_dir, char *what, size_t len) {
    char p[FP8T_TRAIN_PATH_BUF];
    for (int i = 0; i < N_RUN_FILES; i++) {
        if (fp8t_fmt(p, sizeof(p), "%s/%s", out_dir, RUN_FILES[i]) == 0 && fp8t_path_exists(p)) {
            snprintf(what, len, "%s", RUN_FILES[i]);
            return 1;
        }
    }
    int step = fp8t_checkpoint_latest(out_dir, p, sizeof(p));
    if (step >= 0) {
        snprintf(what, len, "checkpoints/step_%06d", step);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the lock */

/* flock(2) on OUT/.lock, held until the process ends or trainer_free closes it: the kernel
 * drops it with the process, so a crashed run never leaves a stale lock behind. The file
 * holds the pid of the holder, for the message the next one gets. */
static int take_lock(trainer *t, int create, char *err, size_t errlen) {
    char path[FP8T_TRAIN_PATH_BUF];
    if (fp8t_fmt(path, sizeof(path), "%s/.lock", t->cfg.out_dir) != 0)
        return fp8t_errorf(err, errlen, "--out path too long");
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0666);
    /* no lock file (or no directory yet): nobody holds it */
    if (fd < 0 && !create && (errno == ENOENT || errno == ENOTDIR)) return 0;
    if (fd < 0)
        return fp8t_errorf(err, errlen,
                           "cannot create the run lock %s: %s (is --out %s "
                           "writable?)",
                           path, strerror(errno), t->cfg.out_dir);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        if (e == EWOULDBLOCK) {
            char pid[32] = "";
            ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
            pid[n > 0 ? n : 0] = 0;
            pid[strcspn(pid, "\n")] = 0;
            close(fd);
            return fp8t_errorf(err, errlen,
                               "another fp8train%s%s%s is training into %s (it "
                               "holds %s); wait for it to finish, or give this run another --out",
                               pid[0] ? " (pid " : "", pid, pid[0] ? ")" : "", t->cfg.out_dir,
                               path);
        }
        /* a file system without flock (some network mounts): go on unlocked, but say so */
        fp8t_warnf("cannot lock %s (%s); nothing stops a second training into %s meanwhile", path,
                   strerror(e), t->cfg.out_dir);
    } else if (ftruncate(fd, 0) == 0) {
        char pid[32];
        int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
        if (pwrite(fd, pid, (size_t)n, 0) != n) { /* only the message of a rival loses */
        }
    }
    t->lock_fd = fd;
    return 0;
}

void rundir_unlock(trainer *t) {
    if (t->lock_fd >= 0) close(t->lock_fd); /* releases the flock; .lock itself stays */
    t->lock_fd = -1;
}

/* ---------------------------------------------------------------- --overwrite */

/* Do a and b name the same existing directory? */
static int same_dir(const char *a, const char *b) {
    char ra[PATH_MAX], rb[PATH_MAX];
    return a && b && a[0] && b[0] && realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

/* Remove the fp8train checkpoints in dir (step_NNNNNN, each checked), then dir if it is empty;
 * never `spare` (the checkpoint this run resumes from, e.g. one under superseded/). Counts
 * into *removed / *kept. */
static void remove_own_checkpoints(const char *dir, const char *spare, int quiet, int *removed,
                                   int *kept) {
    char p[FP8T_TRAIN_PATH_BUF * 2];
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (fp8t_checkpoint_step_of_name(e->d_name) < 0) continue;
        fp8t_fmt(p, sizeof(p), "%s/%s", dir, e->d_name);
        if (same_dir(p, spare)) {
            (*kept)++;
            continue;
        }
        int r = fp8t_checkpoint_remove(p, quiet);
        *removed += r == 0;
        *kept += r != 0;
    }
    closedir(d);
    (void)rmdir(dir); /* only if nothing else is in it */
}

/* OUT/superseded/after_step_NNNNNN[.K]/ of earlier resumes: their checkpoints and logs. */
static void clear_superseded(const char *out_dir, const char *spare, int quiet, int *removed,
                             int *kept) {
    char dir[FP8T_TRAIN_PATH_BUF], sub[FP8T_TRAIN_PATH_BUF * 2], p[FP8T_TRAIN_PATH_BUF * 3];
    if (fp8t_fmt(dir, sizeof(dir), "%s/superseded", out_dir) != 0) return;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int step, len = 0;
        if (sscanf(e->d_name, "after_step_%d%n", &step, &len) != 1 || len != 17) continue;
        if (e->d_name[len] &&
            !(e->d_name[len] == '.' && e->d_name[len + 1] >= '1' &&
              strspn(e->d_name + len + 1, "0123456789") == strlen(e->d_name + len + 1)))
            continue;
        fp8t_fmt(sub, sizeof(sub), "%s/%s", dir, e->d_name);
        fp8t_fmt(p, sizeof(p), "%s/checkpoints", sub);
        remove_own_checkpoints(p, spare, quiet, removed, kept);
        for (int i = 0; i < N_RUN_FILES; i++) {
            fp8t_fmt(p, sizeof(p), "%s/%s", sub, RUN_FILES[i]);
            if (strcmp(RUN_FILES[i], "config.json") != 0) (void)unlink(p);
        }
        (void)rmdir(sub);
    }
    closedir(d);
    (void)rmdir(dir);
}

/* Remove what a run of fp8train wrote in out_dir that the new run does not rewrite itself:
 * its checkpoints (each checked to be fp8train's), superseded/ and stats.jsonl. config.json,
 * metrics.jsonl and events.jsonl are replaced as they are written. */
static int clear_own_run(const char *out_dir, const char *spare, int quiet, char *err,
                         size_t errlen) {
    char dir[FP8T_TRAIN_PATH_BUF], p[FP8T_TRAIN_PATH_BUF * 2];
    int removed = 0, kept = 0;
    if (fp8t_fmt(dir, sizeof(dir), "%s/checkpoints", out_dir) != 0)
        return fp8t_errorf(err, errlen, "--out path too long");
    fp8t_checkpoint_prune(out_dir, 0); /* crash leftovers of ours */
    remove_own_checkpoints(dir, spare, quiet, &removed, &kept);
    clear_superseded(out_dir, spare, quiet, &removed, &kept);
    if (fp8t_fmt(p, sizeof(p), "%s/stats.jsonl", out_dir) == 0) (void)unlink(p);
    if (!quiet)
        fprintf(stderr,
                "fp8train: --overwrite: replacing the run in %s (%d checkpoint%s "
                "removed%s)\n",
                out_dir, removed, removed == 1 ? "" : "s",
                kept ? "; the one resumed from and any holding other files were kept" : "");
    return 0;
}

/* ---------------------------------------------------------------- resume into its own run */

/* OUT/superseded/after_step_NNNNNN, or .2, .3, ... when an earlier resume used that name.
 * Not created here: what is moved there creates it. */
static int pick_aside_dir(trainer *t, int step, char *err, size_t errlen) {
    for (int k = 1; k < 1000; k++) {
        char sfx[16] = "";
        if (k > 1) snprintf(sfx, sizeof(sfx), ".%d", k);
        if (fp8t_fmt(t->aside_dir, sizeof(t->aside_dir), "%s/superseded/after_step_%06d%s",
                     t->cfg.out_dir, step, sfx) != 0)
            return fp8t_errorf(err, errlen, "--out path too long");
        if (!fp8t_path_exists(t->aside_dir)) return 0;
    }
    return fp8t_errorf(err, errlen,
                       "%s/superseded holds 999 directories for step %d; move "
                       "some away",
                       t->cfg.out_dir, step);
}

/* Move the run's step_NNNNNN entries of OUT/<sub> after `step` (the old run's future, which
 * the resumed run recomputes) into ASIDE/<sub>/: its checkpoints (sub "checkpoints") and its
 * --inspect dumps (sub "dumps"). */
static int move_later_steps(trainer *t, const char *sub, int step, int *moved, char *err,
                            size_t errlen) {
    char dir[FP8T_TRAIN_PATH_BUF], to_dir[FP8T_TRAIN_PATH_BUF];
    char from[FP8T_TRAIN_PATH_BUF * 2], to[FP8T_TRAIN_PATH_BUF * 2];
    *moved = 0;
    if (fp8t_fmt(dir, sizeof(dir), "%s/%s", t->cfg.out_dir, sub) != 0 ||
        fp8t_fmt(to_dir, sizeof(to_dir), "%s/%s", t->aside_dir, sub) != 0)
        return fp8t_errorf(err, errlen, "--out path too long");
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        int s = fp8t_checkpoint_step_of_name(e->d_name);
        if (s <= step) continue;
        fp8t_fmt(from, sizeof(from), "%s/%s", dir, e->d_name);
        fp8t_fmt(to, sizeof(to), "%s/%s", to_dir, e->d_name);
        if (fp8t_mkdirs(to_dir, err, errlen) != 0) {
            rc = -1;
            break;
        }
        if (rename(from, to) != 0) {
            rc = fp8t_errorf(err, errlen,
                             "cannot move %s to %s: %s (the resumed run would mix "
                             "with the old run's later steps)",
                             from, to, strerror(errno));
            break;
        }
        (*moved)++;
    }
    closedir(d);
    return rc;
}

/* ---------------------------------------------------------------- the entry */

/* Refuse a directory holding another run, unless --overwrite. 0 may go on, -1 + err. */
static int check_other_run(trainer *t, char *err, size_t errlen) {
    const char *out = t->cfg.out_dir;
    char what[128];
    if (t->same_run || t->cfg.overwrite || !run_sign(out, what, sizeof(what))) return 0;
    return fp8t_errorf(err, errlen,
                       "--out %s holds another run (%s/%s); fp8train does not mix "
                       "two runs in one directory or replace one unasked: give this run a new "
                       "--out, continue that run with --resume %s/checkpoints/step_NNNNNN, or "
                       "add --overwrite to replace its logs and checkpoints (files fp8train did "
                       "not write are kept)",
                       out, out, what, out);
}

int rundir_prepare(trainer *t, int resume_step, char *err, size_t errlen) {
    const char *out = t->cfg.out_dir;
    t->same_run = t->cfg.resume[0] && rundir_same_run(out, t->cfg.resume);
    t->aside_dir[0] = 0;
    /* a refusal writes nothing: a training in progress is named first (its lock file exists
     * already), then another run's files; only then the directory and its lock are created,
     * and the check is repeated under the lock (a run may have finished there meanwhile) */
    if (take_lock(t, 0, err, errlen) != 0 || check_other_run(t, err, errlen) != 0) return -1;
    if (fp8t_mkdirs(out, err, errlen) != 0) return -1;
    if (t->lock_fd < 0 && take_lock(t, 1, err, errlen) != 0) return -1;
    if (check_other_run(t, err, errlen) != 0) return -1;
    if (!t->same_run) {
        char what[128];
        if (!run_sign(out, what, sizeof(what))) return 0;
        return clear_own_run(out, t->cfg.resume, t->cfg.quiet, err, errlen); /* --overwrite */
    }
    /* the resumed run continues this one: what the old run did after resume_step is moved
     * to OUT/superseded/after_step_N/ (checkpoints here, log rows by runlog_open) */
    if (pick_aside_dir(t, resume_step, err, errlen) != 0) return -1;
    int moved, dumps;
    if (move_later_steps(t, "checkpoints", resume_step, &moved, err, errlen) != 0 ||
        move_later_steps(t, "dumps", resume_step, &dumps, err, errlen) != 0)
        return -1;
    char stats[FP8T_TRAIN_PATH_BUF], stats_aside[FP8T_TRAIN_PATH_BUF];
    if (fp8t_fmt(stats, sizeof(stats), "%s/stats.jsonl", out) != 0 ||
        fp8t_fmt(stats_aside, sizeof(stats_aside), "%s/stats.jsonl", t->aside_dir) != 0)
        return fp8t_errorf(err, errlen, "--out path too long");
    if (runlog_keep_prefix(stats, resume_step, NULL, stats_aside, err, errlen) != 0) return -1;
    t->moved_ckpts = moved; /* said once the log rows have moved too (runlog_open) */
    return 0;
}
