/* The training loop on a small model: determinism, exact resume, evaluation without side
 * effects, FP8 state carried over (or reset) on resume, NaN stop with provenance, shadow BF16
 * fallback and rollback, and bad configurations that must fail before writing anything. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>

#include <cjson/cJSON.h>

#include "fp8train/checkpoint.h"
#include "fp8train/io.h"
#include "fp8train/train.h"
#include "fp8train/train_options.h"
#include "test.h"
#include "train/trainer_internal.h"

static char root[200];

/* snprintf through a va_list: paths here are short, truncation cannot happen */
static void fmt(char *buf, size_t len, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void fmt(char *buf, size_t len, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, len, f, ap);
    va_end(ap);
}

#define MAX_ROWS 256
typedef struct {
    int n;
    int step[MAX_ROWS];
    double loss[MAX_ROWS];   /* NaN for null */
    int has_val[MAX_ROWS], has_shadow[MAX_ROWS], fallback[MAX_ROWS];
} metrics;

static int read_metrics(metrics *m, const char *dir) {
    char path[600], *text, err[512];
    size_t len;
    memset(m, 0, sizeof(*m));
    fmt(path, sizeof(path), "%s/metrics.jsonl", dir);
    if (fp8t_read_file(path, &text, &len, err, sizeof(err)) != 0) return -1;
    for (char *line = strtok(text, "\n"); line && m->n < MAX_ROWS; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        if (!j) continue;
        const cJSON *l = cJSON_GetObjectItem(j, "loss");
        m->step[m->n] = cJSON_GetObjectItem(j, "step")->valueint;
        m->loss[m->n] = cJSON_IsNumber(l) ? l->valuedouble : NAN;
        m->has_val[m->n] = cJSON_GetObjectItem(j, "val_loss") != NULL;
        m->has_shadow[m->n] = cJSON_GetObjectItem(j, "shadow_loss") != NULL;
        m->fallback[m->n] = cJSON_IsTrue(cJSON_GetObjectItem(j, "fallback"));
        m->n++;
        cJSON_Delete(j);
    }
    free(text);
    return 0;
}

static double loss_at(const metrics *m, int step) {
    for (int i = m->n - 1; i >= 0; i--)
        if (m->step[i] == step) return m->loss[i];
    return NAN;
}

static int file_contains(const char *path, const char *needle) {
    char *text, err[256];
    size_t len;
    if (fp8t_read_file(path, &text, &len, err, sizeof(err)) != 0) return 0;
    int found = strstr(text, needle) != NULL;
    free(text);
    return found;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* A small GPT-2 on the synthetic language: a step takes milliseconds. */
static void small_config(fp8t_train_config *c, const char *name) {
    fp8t_train_config_default(c);
    c->model.n_layer = 2;
    c->model.n_embd = 32;
    c->model.n_head = 2;
    c->model.seq_len = 16;
    c->model.mlp_hidden = 64;
    c->batch = 4;
    c->seq_len = 16;
    c->grad_accum = 2;
    c->steps = 12;
    c->warmup = 3;
    c->lr = 3e-3f;
    c->val_every = 0;
    c->quiet = 1;
    c->seed = 5;
    c->policy.history_len = 16;
    fmt(c->out_dir, sizeof(c->out_dir), "%s/%s", root, name);
}

static int run(const fp8t_train_config *c, fp8t_train_result *res) {
    char err[2048] = "";
    int rc = fp8t_train_run(c, res, err, sizeof(err));
    if (rc != 0) printf("    fp8t_train_run: %s\n", err);
    return rc;
}

/* run() with stderr going to the file `path` (the quiet contract: errors only) and stdout
 * (banner, progress) to /dev/null */
static int run_stderr_to(const fp8t_train_config *c, fp8t_train_result *res, const char *path) {
    fflush(stdout);
    fflush(stderr);
    int saved_out = dup(1), saved_err = dup(2);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644), null = open("/dev/null", O_WRONLY);
    int ok = saved_out >= 0 && saved_err >= 0 && fd >= 0 && null >= 0;
    if (ok) {
        dup2(null, 1);
        dup2(fd, 2);
    }
    char err[2048] = "";
    int rc = ok ? fp8t_train_run(c, res, err, sizeof(err)) : -1;
    fflush(stdout);
    fflush(stderr);
    if (ok) {
        dup2(saved_out, 1);
        dup2(saved_err, 2);
    }
    int fds[4] = {saved_out, saved_err, fd, null};
    for (int i = 0; i < 4; i++)
        if (fds[i] >= 0) close(fds[i]);
    if (!ok) printf("    cannot redirect stderr to %s\n", path);
    else if (rc != 0) printf("    fp8t_train_run: %s\n", err);
    return rc;
}

static void test_lr_schedule(void) {
    fp8t_train_config c;
    fp8t_train_config_default(&c);
    c.lr = 1.0f;
    c.min_lr_frac = 0.1f;
    c.warmup = 10;
    c.steps = 110;
    T_CLOSE(fp8t_lr_at(&c, 1), 0.1, 1e-7, 0);
    T_CLOSE(fp8t_lr_at(&c, 5), 0.5, 1e-7, 0);
    T_CLOSE(fp8t_lr_at(&c, 10), 1.0, 1e-7, 0);
    T_CLOSE(fp8t_lr_at(&c, 60), 0.55, 1e-6, 0); /* halfway down the cosine */
    T_CLOSE(fp8t_lr_at(&c, 110), 0.1, 1e-7, 0);
    T_CHECK(fp8t_lr_at(&c, 30) > fp8t_lr_at(&c, 31), "cosine not decreasing");
}

static void test_determinism(void) {
    fp8t_train_config a, b;
    fp8t_train_result ra, rb;
    small_config(&a, "det_a");
    small_config(&b, "det_b");
    T_ASSERT(run(&a, &ra) == 0 && run(&b, &rb) == 0, "run failed");
    T_CHECK(ra.reason == FP8T_STOP_DONE && ra.last_step == 12, "reason %d step %d", ra.reason, ra.last_step);
    metrics ma, mb;
    T_ASSERT(read_metrics(&ma, a.out_dir) == 0 && read_metrics(&mb, b.out_dir) == 0, "metrics");
    T_CHECK(ma.n == 12 && mb.n == 12, "rows %d %d", ma.n, mb.n);
    int same = 1;
    for (int i = 0; i < ma.n; i++) same &= ma.loss[i] == mb.loss[i];
    T_CHECK(same, "the same seed gave different losses");
    T_CHECK(ma.loss[11] < ma.loss[0], "loss did not fall: %g -> %g", ma.loss[0], ma.loss[11]);
    /* another seed gives another run */
    small_config(&b, "det_c");
    b.seed = 6;
    T_ASSERT(run(&b, &rb) == 0, "run");
    read_metrics(&mb, b.out_dir);
    T_CHECK(mb.loss[0] != ma.loss[0], "seed 6 equals seed 5");
    /* the run directory */
    char p[600];
    fmt(p, sizeof(p), "%s/config.json", a.out_dir);
    T_CHECK(file_contains(p, "\"policy\"") && file_contains(p, "\"model\"") &&
                file_contains(p, "\"preset\""),
            "config.json incomplete");
    fmt(p, sizeof(p), "%s/checkpoints/step_000012/state.json", a.out_dir);
    T_CHECK(exists(p), "final checkpoint missing");
}

/* 0 -> 12 uninterrupted, and 0 -> 4 + resume 4 -> 12: bit-identical losses, FP8 delayed
 * scaling with its amax history, gradient accumulation and validation on. */
static void test_exact_resume(void) {
    fp8t_train_config full, res;
    fp8t_train_result r;
    small_config(&full, "resume_full");
    full.val_every = 3;
    full.ckpt_every = 4;
    full.keep_ckpts = 0;
    T_ASSERT(run(&full, &r) == 0, "run");
    /* as if the run had crashed after step 4: continue from its checkpoint elsewhere */
    small_config(&res, "resume_cont");
    res.val_every = 3;
    fmt(res.resume, sizeof(res.resume), "%s/checkpoints/step_000004", full.out_dir);
    T_ASSERT(run(&res, &r) == 0, "resumed run");
    T_CHECK(r.last_step == 12, "resumed run ended at %d", r.last_step);
    metrics mf, mr;
    read_metrics(&mf, full.out_dir);
    read_metrics(&mr, res.out_dir);
    T_CHECK(mr.n == 8 && mr.step[0] == 5, "resumed rows %d, first step %d", mr.n, mr.step[0]);
    int same = 1;
    for (int s = 5; s <= 12; s++) {
        if (loss_at(&mf, s) != loss_at(&mr, s)) {
            printf("    step %d: %.9g vs %.9g\n", s, loss_at(&mf, s), loss_at(&mr, s));
            same = 0;
        }
    }
    T_CHECK(same, "resume is not exact");
    /* resuming into the run's own directory keeps its rows up to the checkpoint */
    small_config(&res, "resume_full");
    res.val_every = 3;
    fmt(res.resume, sizeof(res.resume), "%s/checkpoints/step_000012", full.out_dir);
    res.steps = 14;
    T_ASSERT(run(&res, &r) == 0, "resume in place");
    read_metrics(&mr, full.out_dir);
    T_CHECK(mr.n == 14 && loss_at(&mr, 12) == loss_at(&mf, 12), "rows %d after an in-place resume", mr.n);
}

/* Two checkpoints hold the same weights, AdamW moments and FP8 state, bit for bit. */
static int same_checkpoint(const char *dir_a, const char *dir_b) {
    fp8t_checkpoint a, b;
    char err[1024];
    if (fp8t_checkpoint_load(dir_a, NULL, &a, err, sizeof(err)) != 0) {
        printf("    %s\n", err);
        return 0;
    }
    if (fp8t_checkpoint_load(dir_b, NULL, &b, err, sizeof(err)) != 0) {
        printf("    %s\n", err);
        fp8t_checkpoint_free(&a);
        return 0;
    }
    size_t pb = a.num_params * sizeof(float);
    int same = a.num_params == b.num_params && a.fp8_n == b.fp8_n && a.fp8_len == b.fp8_len &&
               !memcmp(a.params, b.params, pb) && !memcmp(a.adam_m, b.adam_m, pb) &&
               !memcmp(a.adam_v, b.adam_v, pb) &&
               !memcmp(a.fp8_state, b.fp8_state,
                       fp8t_recipe_state_floats(a.fp8_n, a.fp8_len) * sizeof(float));
    fp8t_checkpoint_free(&a);
    fp8t_checkpoint_free(&b);
    return same;
}

static int same_file(const char *pa, const char *pb) {
    char *ta, *tb, err[256];
    size_t la, lb;
    if (fp8t_read_file(pa, &ta, &la, err, sizeof(err)) != 0) return 0;
    if (fp8t_read_file(pb, &tb, &lb, err, sizeof(err)) != 0) {
        free(ta);
        return 0;
    }
    int same = la == lb && la > 0 && !memcmp(ta, tb, la);
    free(ta);
    free(tb);
    return same;
}

/* Validation and shadow BF16 run frozen forwards on the trained model itself: the training
 * losses (logged to 9 digits: every float exactly), the final weights, AdamW moments and FP8
 * state are bit-identical with and without them, in delayed scaling with an FP8 head, in
 * current scaling, and with a fault injector and the inspector riding along (they observe the
 * training GEMMs only, so their effects and records are the same too). */
static void test_eval_has_no_side_effects(void) {
    const char *what[3] = {"delayed", "current", "instruments"};
    for (int k = 0; k < 3; k++) {
        fp8t_train_config a, b;
        fp8t_train_result ra, rb;
        char name[64];
        fmt(name, sizeof(name), "plain_%s", what[k]);
        small_config(&a, name);
        fmt(name, sizeof(name), "observed_%s", what[k]);
        small_config(&b, name);
        for (int j = 0; j < 2; j++) {
            fp8t_train_config *c = j ? &b : &a;
            if (k == 0) c->policy.head_precision = FP8T_PREC_DELAYED;
            if (k == 1) c->policy.recipe = FP8T_PREC_CURRENT;
            if (k == 2) {
                fmt(c->inject, sizeof(c->inject),
                    "layer=1,module=fc1,gemm=fprop,kind=scale:64,from=3");
                fmt(c->inspect, sizeof(c->inspect), "every=2,layers=1,modules=fc1");
            }
        }
        b.val_every = 2;
        b.shadow_every = 3;
        b.shadow_threshold = 1e9f; /* never acts */
        T_ASSERT(run(&a, &ra) == 0 && run(&b, &rb) == 0, "%s: run", what[k]);
        T_CHECK(isfinite(rb.last_val_loss) && isnan(ra.last_val_loss), "%s: validation loss %g %g",
                what[k], rb.last_val_loss, ra.last_val_loss);
        metrics ma, mb;
        read_metrics(&ma, a.out_dir);
        read_metrics(&mb, b.out_dir);
        T_CHECK(ma.n == 12 && mb.n == 12, "%s: %d and %d rows", what[k], ma.n, mb.n);
        int same = ma.n == mb.n, vals = 0, shadows = 0;
        for (int i = 0; i < ma.n && i < mb.n; i++) {
            if (ma.loss[i] != mb.loss[i] || !isfinite(ma.loss[i])) {
                if (same) printf("    %s step %d: %.9g vs %.9g\n", what[k], ma.step[i], ma.loss[i],
                                 mb.loss[i]);
                same = 0;
            }
            vals += mb.has_val[i];
            shadows += mb.has_shadow[i];
        }
        T_CHECK(same, "%s: validation/shadow changed the training losses", what[k]);
        T_CHECK(vals == 6 && shadows == 4, "%s: %d val rows, %d shadow rows", what[k], vals,
                shadows);
        char pa[600], pb[600];
        fmt(pa, sizeof(pa), "%s/checkpoints/step_000012", a.out_dir);
        fmt(pb, sizeof(pb), "%s/checkpoints/step_000012", b.out_dir);
        T_CHECK(same_checkpoint(pa, pb), "%s: final weights, moments or FP8 state differ", what[k]);
        if (k == 2) {
            fmt(pa, sizeof(pa), "%s/stats.jsonl", a.out_dir);
            fmt(pb, sizeof(pb), "%s/stats.jsonl", b.out_dir);
            T_CHECK(same_file(pa, pb), "the inspector's stats.jsonl differs (or is empty)");
        }
    }
}

/* Resuming with --reset-fp8 changes the losses (so the normal resume really restores the FP8
 * state); resuming under BF16, another format or another history length works. */
static void test_resume_fp8_state(void) {
    fp8t_train_config c, full;
    fp8t_train_result r;
    small_config(&full, "resume_full"); /* from test_exact_resume: checkpoints 12 and 14 */
    small_config(&c, "reset_fp8");
    fmt(c.resume, sizeof(c.resume), "%s/checkpoints/step_000012", full.out_dir);
    c.steps = 14;
    c.resume_reset_fp8 = 1;
    T_ASSERT(run(&c, &r) == 0, "reset run");
    metrics mf, mc;
    read_metrics(&mf, full.out_dir);
    read_metrics(&mc, c.out_dir);
    T_CHECK(loss_at(&mc, 13) != loss_at(&mf, 13), "a fresh FP8 state gave the same loss");
    const char *what[] = {"bf16", "e4m3", "history"};
    for (int k = 0; k < 3; k++) {
        small_config(&c, what[k]);
        fmt(c.resume, sizeof(c.resume), "%s/checkpoints/step_000012", full.out_dir);
        c.steps = 14;
        if (k == 0) c.policy.default_precision = FP8T_PREC_BF16;
        if (k == 1) c.policy.hybrid = 0;
        if (k == 2) c.policy.history_len = 8;
        T_CHECK(run(&c, &r) == 0 && r.reason == FP8T_STOP_DONE && isfinite(r.last_loss),
                "resume under %s failed", what[k]);
        read_metrics(&mc, c.out_dir);
        T_CHECK(fabs(loss_at(&mc, 13) - loss_at(&mf, 13)) < 0.5, "%s: loss %g far from %g", what[k],
                loss_at(&mc, 13), loss_at(&mf, 13));
    }
}

static void test_nan_stop(void) {
    fp8t_train_config c;
    fp8t_train_result r;
    small_config(&c, "nan");
    c.ckpt_every = 2;
    fmt(c.inject, sizeof(c.inject), "layer=1,module=fc2,gemm=fprop,kind=nan,from=6");
    char p[600], errp[600];
    fmt(errp, sizeof(errp), "%s/nan_stderr.txt", root);
    T_ASSERT(run_stderr_to(&c, &r, errp) == 0, "run");
    T_CHECK(r.reason == FP8T_STOP_NAN && r.last_step == 5, "reason %d last step %d", r.reason, r.last_step);
    fmt(p, sizeof(p), "%s/events.jsonl", c.out_dir);
    T_CHECK(file_contains(p, "\"kind\":\"nan\"") && file_contains(p, "layer 1 fc2 fprop input"),
            "NaN event does not name layer 1 fc2 fprop input");
    /* quiet: the error on stderr, the advice in events.jsonl only */
    T_CHECK(file_contains(errp, "layer 1 fc2 fprop input") && !file_contains(errp, "stopped;"),
            "quiet stderr: want the NaN error and no advice");
    T_CHECK(file_contains(p, "\"advice\":\"stopped; the last good checkpoint is"),
            "the advice is not in events.jsonl");
    T_CHECK(file_contains(p, "step_000004"), "event does not name the last good checkpoint");
    fmt(p, sizeof(p), "%s/checkpoints/step_000004", c.out_dir);
    T_CHECK(exists(p), "last good checkpoint missing");
    fmt(p, sizeof(p), "%s/checkpoints/step_000006", c.out_dir);
    T_CHECK(!exists(p), "a checkpoint of the NaN step was written");
    metrics m;
    read_metrics(&m, c.out_dir);
    T_CHECK(m.n == 6 && m.step[5] == 6 && isnan(m.loss[5]), "rows %d, last loss %g", m.n, m.loss[m.n - 1]);
    /* the good checkpoint resumes (a recovery experiment in BF16 runs past the fault's step) */
    fp8t_train_config rec;
    small_config(&rec, "nan_recovery");
    fmt(rec.resume, sizeof(rec.resume), "%s/checkpoints/step_000004", c.out_dir);
    rec.policy.default_precision = FP8T_PREC_BF16;
    fmt(rec.inject, sizeof(rec.inject), "%s", c.inject); /* fires only in FP8 GEMMs */
    T_CHECK(run(&rec, &r) == 0 && r.reason == FP8T_STOP_DONE && r.last_step == 12,
            "BF16 recovery from the last good checkpoint: reason %d step %d", r.reason, r.last_step);
    /* no checkpoint yet, quiet, over an earlier run's checkpoints: errors only on stderr */
    small_config(&c, "nan");
    c.steps = 7;
    fmt(c.inject, sizeof(c.inject), "layer=0,module=qkv,gemm=fprop,kind=nan,from=2");
    T_ASSERT(run_stderr_to(&c, &r, errp) == 0, "run");
    T_CHECK(r.reason == FP8T_STOP_NAN && r.last_step == 1, "reason %d last step %d", r.reason,
            r.last_step);
    T_CHECK(file_contains(errp, "layer 0 qkv fprop input"), "quiet stderr lacks the NaN error");
    T_CHECK(!file_contains(errp, "stopped;") && !file_contains(errp, "removing checkpoints"),
            "quiet stderr has more than the error");
    fmt(p, sizeof(p), "%s/events.jsonl", c.out_dir);
    T_CHECK(file_contains(p, "no checkpoint was written before the NaN"),
            "the no-checkpoint advice is not in events.jsonl");
    /* not quiet: the advice on stderr too */
    c.quiet = 0;
    fmt(errp, sizeof(errp), "%s/nan_stderr_loud.txt", root);
    T_ASSERT(run_stderr_to(&c, &r, errp) == 0, "run");
    T_CHECK(file_contains(errp, "stopped; no checkpoint was written before the NaN"),
            "the advice is missing from stderr without --quiet");
}

static void test_shadow_fallback(void) {
    fp8t_train_config c;
    fp8t_train_result r;
    small_config(&c, "fallback");
    c.shadow_every = 4;
    c.shadow_threshold = 0; /* any FP8/BF16 difference is an alarm */
    fmt(c.shadow_action, sizeof(c.shadow_action), "fallback:2");
    T_ASSERT(run(&c, &r) == 0 && r.reason == FP8T_STOP_DONE, "run");
    metrics m;
    read_metrics(&m, c.out_dir);
    /* alarms at 4 and 8 (not at 12? 12 runs in FP8 again: alarm, no steps left) */
    int fb = 0;
    for (int i = 0; i < m.n; i++) fb += m.fallback[i];
    T_CHECK(fb == 4 && m.fallback[4] && m.fallback[5] && !m.fallback[6], "%d fallback rows", fb);
    char p[600];
    fmt(p, sizeof(p), "%s/events.jsonl", c.out_dir);
    T_CHECK(file_contains(p, "\"kind\":\"fallback\"") && file_contains(p, "next 2 steps in BF16"),
            "no fallback event");
}

static void test_shadow_rollback(void) {
    fp8t_train_config c;
    fp8t_train_result r;
    small_config(&c, "rollback");
    c.shadow_every = 5;
    c.ckpt_every = 3;
    c.shadow_threshold = 0;
    fmt(c.shadow_action, sizeof(c.shadow_action), "rollback");
    T_ASSERT(run(&c, &r) == 0 && r.reason == FP8T_STOP_DONE && r.last_step == 12, "run");
    metrics m;
    read_metrics(&m, c.out_dir);
    /* alarm at 5 -> back to 3, steps 4..5 again in BF16; alarm at 10 -> back to 9 */
    T_CHECK(m.n == 15, "%d rows (expected 12 + 3 re-run)", m.n);
    char p[600];
    fmt(p, sizeof(p), "%s/events.jsonl", c.out_dir);
    T_CHECK(file_contains(p, "\"kind\":\"rollback\"") && file_contains(p, "step_000003"),
            "no rollback event to step 3");
}

/* Each of these must fail before creating the run directory. */
static void test_bad_configs_write_nothing(void) {
    fp8t_train_config c;
    fp8t_train_result r;
    char err[2048];
    struct {
        const char *what, *needle;
    } cases[] = {
        {"heads", "divisible"},        {"seq_len", "--seq-len"},  {"data", "cannot open"},
        {"resume", "--resume"},        {"baseline", "--baseline"}, {"inject", "--inject"},
        {"resume_step", "not beyond"}, {"vocab", "--vocab 256"},   {"device", "--device"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        small_config(&c, "never");
        const char *w = cases[k].what;
        if (!strcmp(w, "heads")) c.model.n_head = 3;
        if (!strcmp(w, "seq_len")) c.seq_len = 64;
        if (!strcmp(w, "data")) fmt(c.data, sizeof(c.data), "%s/no_such_file.txt", root);
        if (!strcmp(w, "resume")) fmt(c.resume, sizeof(c.resume), "%s/no_such_ckpt", root);
        if (!strcmp(w, "baseline")) fmt(c.baseline, sizeof(c.baseline), "%s/no_run", root);
        if (!strcmp(w, "inject")) fmt(c.inject, sizeof(c.inject), "layer=1,kind=boom");
        if (!strcmp(w, "resume_step")) {
            fmt(c.resume, sizeof(c.resume), "%s/resume_full/checkpoints/step_000012", root);
            c.steps = 10;
        }
        if (!strcmp(w, "vocab")) c.model.vocab_size = 100;
        if (!strcmp(w, "device")) fmt(c.device, sizeof(c.device), "tpu");
        int rc = fp8t_train_run(&c, &r, err, sizeof(err));
        T_CHECK(rc != 0 && r.reason == FP8T_STOP_ERROR, "%s: accepted", w);
        T_CHECK(strstr(err, cases[k].needle) != NULL, "%s: error lacks '%s': %s", w, cases[k].needle, err);
        T_CHECK(!exists(c.out_dir), "%s: the run directory was created", w);
    }
}

/* The online detectors on hand-made series. */
static void test_spike_detector(void) {
    trainer t;
    memset(&t, 0, sizeof(t));
    t.cfg.quiet = 1;
    t.events = tmpfile();
    spike_init(&t.spike, 20, 6.0);
    uint32_t s = 1;
    int step = 0;
    for (; step < 30; step++) {
        s = s * 1664525u + 1013904223u;
        spike_observe(&t, step, 2.0 + 0.01 * ((s >> 16) % 100) / 100.0);
    }
    T_CHECK(t.n_events == 0, "%d events on a flat series", t.n_events);
    spike_observe(&t, step++, 4.0); /* spike at 30 */
    spike_observe(&t, step++, 3.0);
    spike_observe(&t, step++, 2.5);
    spike_observe(&t, step++, 2.004); /* back at 33 */
    T_CHECK(t.n_events == 2, "%d events (expected spike + recovery)", t.n_events);
    rewind(t.events);
    char buf[4096] = "";
    size_t n = fread(buf, 1, sizeof(buf) - 1, t.events);
    buf[n] = 0;
    T_CHECK(strstr(buf, "\"step\":30,\"kind\":\"spike\"") && strstr(buf, "\"recovery_steps\":3"),
            "events: %s", buf);
    fclose(t.events);
    spike_free(&t.spike);
}

static void test_drift_detector(void) {
    char dir[600], path[700];
    fmt(dir, sizeof(dir), "%s/baseline", root);
    mkdir(dir, 0777);
    fmt(path, sizeof(path), "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    for (int s = 1; s <= 100; s++) fprintf(f, "{\"step\":%d,\"loss\":%.6f}\n", s, 3.0 - s * 0.01);
    fclose(f);
    trainer t;
    memset(&t, 0, sizeof(t));
    t.cfg.quiet = 1;
    t.cfg.steps = 100;
    t.cfg.drift_threshold = 0.01f;
    t.events = tmpfile();
    char err[512];
    T_ASSERT(drift_load(&t.drift, dir, 1, err, sizeof(err)) == 0, "%s", err);
    double gap = NAN;
    for (int s = 1; s <= 60; s++) gap = drift_observe(&t, s, 3.0 - s * 0.01 + (s > 40 ? 0.1 : 0));
    T_CHECK(t.n_events == 1, "%d drift events", t.n_events);
    T_CHECK(gap > 0.03 && gap < 0.05, "smoothed gap %g", gap);
    rewind(t.events);
    char buf[2048] = "";
    size_t n = fread(buf, 1, sizeof(buf) - 1, t.events);
    buf[n] = 0;
    T_CHECK(strstr(buf, "\"kind\":\"drift\"") && strstr(buf, "late"), "events: %s", buf);
    fclose(t.events);
    drift_free(&t.drift);
}

int main(void) {
    t_suite = "train";
    fmt(root, sizeof(root), "/tmp/fp8t_test_train_%d", (int)getpid());
    fp8t_rmtree(root);
    mkdir(root, 0777);
    T_RUN(test_lr_schedule);
    T_RUN(test_determinism);
    T_RUN(test_exact_resume);
    T_RUN(test_eval_has_no_side_effects);
    T_RUN(test_resume_fp8_state);
    T_RUN(test_nan_stop);
    T_RUN(test_shadow_fallback);
    T_RUN(test_shadow_rollback);
    T_RUN(test_bad_configs_write_nothing);
    T_RUN(test_spike_detector);
    T_RUN(test_drift_detector);
    fp8t_rmtree(root);
    T_MAIN_END();
}
