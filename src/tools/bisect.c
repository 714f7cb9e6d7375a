/* bisect: the seeds' FP8 debugging procedure as a sequence of short training runs (see
 * include/fp8train/bisect.h for the experiments and how they are judged).
 *
 * Every experiment is the same run (model, data order, seed, start point, steps) under a
 * different precision policy, expressed as --override strings parsed by the policy module, so
 * the override printed at the end is exactly the one that was measured. */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tools/bisect_internal.h"
#include "fp8train/checkpoint.h"
#include "fp8train/compare.h"
#include "fp8train/dist.h"
#include "fp8train/error.h"

void fp8t_bisect_config_default(fp8t_bisect_config *c) {
    memset(c, 0, sizeof *c);
    fp8t_train_config_default(&c->train);
    c->steps = 60;
    c->threshold = 0.01;
    c->tail_frac = 0.1;
    snprintf(c->out_dir, sizeof c->out_dir, "runs/bisect");
    c->log = stdout;
}

int fp8t_bisect_exit_code(const fp8t_bisect_result *res) {
    return res->outcome == FP8T_BISECT_NO_FIX ? 1 : 0;
}

/* ---------------------------------------------------------------- noise */

/* Every experiment other than the baseline is the baseline with some of its BF16 GEMMs
 * replaced by FP8, fake-quantized (FP8 values, BF16 GEMM) or current-scaled ones (the policy
 * as configured, minus some of its FP8), or, for the recovery run, continued from an FP8
 * checkpoint: each only ADDS rounding error to the BF16 run. Rounding does not make training
 * better by a measurable amount, so an experiment that ends BELOW the baseline does so by
 * chance: the same chance (one data order, an early phase that amplifies any difference)
 * moves every gap by as much in either direction. How far the lowest one went is therefore a
 * lower bound on the spread of runs that differ only by rounding, and gaps within it prove
 * nothing. (A policy that runs some GEMM in FP32 could beat BF16 legitimately, but by far
 * less than a threshold of ~1%.) */
double fp8t_bisect_noise(const fp8t_bisect_result *r, int *which) {
    double noise = 0;
    int arg = -1;
    for (int i = 0; i < r->n_exp; i++) {
        const fp8t_bisect_exp *e = &r->exp[i];
        if (!e->ran || !strcmp(e->name, "bf16") || !isfinite(e->gap)) continue;
        if (-e->gap > noise) noise = -e->gap, arg = i;
    }
    if (which) *which = arg;
    return noise;
}

int fp8t_bisect_judge_noise(fp8t_bisect_result *r, double threshold) {
    r->noise = fp8t_bisect_noise(r, &r->noise_exp);
    r->reliable = r->noise <= threshold;
    return r->reliable;
}

/* ---------------------------------------------------------------- files */

static int mkdir_p(const char *path) {
    char buf[BPATH];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb, (void)type, (void)ftw;
    return remove(path);
}

/* Remove an experiment directory left by an earlier bisect (a run appends to its logs). */
static int rm_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int fp8t_bisect_tail_loss(double *mean, double *last, int *first_step, int *last_step,
                          const char *run_dir, int tail_steps, char *err, size_t errlen) {
    char path[BPATH];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    fp8t_metric_row *rows = NULL;
    int n = 0;
    if (fp8t_metrics_read(&rows, &n, path, err, errlen) != 0) return -1;
    int lo = -1, hi = -1;
    for (int i = 0; i < n; i++) {
        if (!rows[i].has_loss) continue;
        if (lo < 0) lo = i;
        hi = i;
    }
    if (hi < 0) {
        free(rows);
        return fp8t_errorf(err, errlen,
                           "%s has no training loss (did the run fail at its first step?)", path);
    }
    if (tail_steps < 1) tail_steps = 1;
    int from_step = rows[hi].step - tail_steps;
    double sum = 0;
    int cnt = 0;
    for (int i = lo; i <= hi; i++) {
        if (!rows[i].has_loss || rows[i].step <= from_step) continue;
        sum += rows[i].loss; /* NaN when non-finite: the mean is NaN */
        cnt++;
    }
    *mean = sum / cnt;
    *last = rows[hi].loss;
    *first_step = rows[lo].step;
    *last_step = rows[hi].step;
    free(rows);
    return 0;
}

/* Losses of steps lo..hi of RUN/metrics.jsonl into out[0..hi-lo] (NaN where the step is
 * missing or its loss non-finite). */
static int losses_of(double *out, const char *run_dir, int lo, int hi, char *err, size_t errlen) {
    char path[BPATH];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    fp8t_metric_row *rows = NULL;
    int n = 0;
    if (fp8t_metrics_read(&rows, &n, path, err, errlen) != 0) return -1;
    for (int s = lo; s <= hi; s++) out[s - lo] = NAN;
    for (int i = 0; i < n; i++)
        if (rows[i].has_loss && rows[i].step >= lo && rows[i].step <= hi)
            out[rows[i].step - lo] = rows[i].loss;
    free(rows);
    return 0;
}

int fp8t_bisect_gap(double *gap, const char *run_dir, const char *base_dir, int last_step,
                    int tail_steps, char *err, size_t errlen) {
    if (tail_steps < 1) tail_steps = 1;
    int lo = last_step - tail_steps + 1;
    double *run = malloc(2 * (size_t)tail_steps * sizeof(double));
    if (!run) {
        return fp8t_errorf(err, errlen, "out of memory");
    }
    double *base = run + tail_steps;
    if (losses_of(base, base_dir, lo, last_step, err, errlen) != 0 ||
        losses_of(run, run_dir, lo, last_step, err, errlen) != 0) {
        free(run);
        return -1;
    }
    for (int i = 0; i < tail_steps; i++) {
        if (!isfinite(base[i])) {
            fp8t_errorf(err, errlen, "baseline %s has no finite loss at step %d", base_dir,
                        lo + i);
            free(run);
            return -1;
        }
        /* a run that stopped (NaN) before the end, or went non-finite, is infinitely off */
        run[i] = isfinite(run[i]) ? (run[i] - base[i]) / fabs(base[i]) : INFINITY;
    }
    *gap = fp8t_median_inplace(run, tail_steps);
    free(run);
    return 0;
}

int fp8t_bisect_tail_steps(const fp8t_bisect_config *cfg) {
    int t = (int)lround(cfg->tail_frac * cfg->steps);
    if (t < 5) t = 5;
    if (t > cfg->steps / 2) t = cfg->steps / 2;
    return t < 1 ? 1 : t;
}

/* ---------------------------------------------------------------- the procedure */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void logf_(bisect_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(bisect_ctx *c, const char *fmt, ...) {
    if (!c->cfg->log) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(c->cfg->log, fmt, ap);
    va_end(ap);
    fflush(c->cfg->log);
}

/* Under a launcher every rank runs the same experiments (each one a data-parallel training
 * run with the same N), but only rank 0 touches bisect's own files and reads the runs' logs
 * (which rank 0 wrote). What it found, rc and on failure err, goes to every rank, so that all
 * of them take the same next step and none waits in a collective the others never reach. */
static int from_rank0(bisect_ctx *c, int rc) {
    if (fp8t_dist_size() <= 1) return rc;
    fp8t_dist_bcast(&rc, sizeof rc, 0);
    if (rc != 0) fp8t_dist_bcast(c->err, c->errlen, 0);
    return rc;
}

void bisect_gemm_set_name(char *buf, size_t len, unsigned mask) {
    buf[0] = 0;
    for (int g = 0; g < FP8T_GEMM_COUNT; g++) {
        if (!(mask & (1u << g))) continue;
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "%s%s", used ? "+" : "",
                 fp8t_gemm_name((fp8t_gemm_kind)g));
    }
}

static void layers_str(char *buf, size_t len, int lo, int hi) {
    if (lo == hi)
        snprintf(buf, len, "%d", lo);
    else
        snprintf(buf, len, "%d-%d", lo, hi);
}

void bisect_span_words(char *buf, size_t len, int n_layer, int lo, int hi) {
    char l[32];
    int last = hi < n_layer ? hi : n_layer - 1;
    layers_str(l, sizeof l, lo, last);
    const char *plural = lo == last ? "" : "s";
    if (lo >= n_layer)
        snprintf(buf, len, "the LM head");
    else if (hi >= n_layer)
        snprintf(buf, len, "layer%s %s and the LM head", plural, l);
    else
        snprintf(buf, len, "layer%s %s", plural, l);
}

/* One override rule: "[layers=L,][module=head,][gemm=G,]precision=P" (no gemm key for all
 * three kinds). */
static void rule(char *buf, size_t len, const char *layers, int head, unsigned gemms,
                 fp8t_precision prec) {
    char g[32];
    bisect_gemm_set_name(g, sizeof g, gemms);
    size_t used = 0;
    buf[0] = 0;
    if (layers) used += (size_t)snprintf(buf + used, len - used, "layers=%s,", layers);
    if (head && used < len) used += (size_t)snprintf(buf + used, len - used, "module=head,");
    if (gemms != (1u << FP8T_GEMM_COUNT) - 1 && used < len)
        used += (size_t)snprintf(buf + used, len - used, "gemm=%s,", g);
    if (used < len) snprintf(buf + used, len - used, "precision=%s", fp8t_precision_name(prec));
}

/* The override putting `gemms` of positions lo..hi (layers, then the head at n_layer) into
 * precision prec. The whole span is spelled without layers= so each set of GEMMs has one
 * spelling, hence one measured run. */
static void span_override(bisect_ctx *c, char *buf, size_t len, int lo, int hi, unsigned gemms,
                          fp8t_precision prec) {
    char a[160] = "", b[160] = "", l[32];
    int last = hi < c->n_layer ? hi : c->n_layer - 1;
    if (lo == 0 && last == c->n_layer - 1) {
        rule(a, sizeof a, NULL, 0, gemms, prec);
    } else if (lo <= last) {
        layers_str(l, sizeof l, lo, last);
        rule(a, sizeof a, l, 0, gemms, prec);
    }
    if (hi >= c->n_layer) rule(b, sizeof b, NULL, 1, gemms, prec);
    snprintf(buf, len, "%s%s%s", a, a[0] && b[0] ? ";" : "", b);
}

static void span_dirname(bisect_ctx *c, char *buf, size_t len, int lo, int hi, unsigned gemms,
                         fp8t_precision prec) {
    char g[32], l[32];
    bisect_gemm_set_name(g, sizeof g, gemms);
    int last = hi < c->n_layer ? hi : c->n_layer - 1;
    layers_str(l, sizeof l, lo, last);
    snprintf(buf, len, "%s%s%s%s-%s-%s", lo < c->n_layer ? "layers-" : "",
             lo < c->n_layer ? l : "", lo < c->n_layer && hi >= c->n_layer ? "+" : "",
             hi >= c->n_layer ? "head" : "", g, fp8t_precision_name(prec));
}

typedef enum { POL_BF16, POL_RUN } policy_base;

static int run_experiment(bisect_ctx *c, const char *name, const char *what, policy_base base,
                          const char *override, const char *resume, int ckpt_every,
                          fp8t_bisect_exp **out) {
    fp8t_bisect_result *res = c->res;
    if (res->n_exp >= FP8T_BISECT_MAX_EXP) {
        fp8t_errorf(c->err, c->errlen, "bisect: more than %d experiments", FP8T_BISECT_MAX_EXP);
        return -1;
    }
    fp8t_bisect_exp *e = &res->exp[res->n_exp++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->what, sizeof e->what, "%s", what);
    snprintf(e->override, sizeof e->override, "%s", override ? override : "");
    *out = e;

    fp8t_train_config *tc = malloc(sizeof *tc);
    if (!tc) {
        fp8t_errorf(c->err, c->errlen, "bisect: out of memory");
        return -1;
    }
    *tc = c->cfg->train;
    if (base == POL_BF16) {
        tc->policy.default_precision = FP8T_PREC_BF16;
        tc->policy.head_precision = FP8T_PREC_BF16;
        tc->policy.n_overrides = 0;
    }
    if (override && *override &&
        fp8t_policy_add_overrides(&tc->policy, override, c->err, c->errlen) != 0) {
        free(tc);
        return -1;
    }
    int n = snprintf(tc->out_dir, sizeof tc->out_dir, "%s/%s", c->root, name);
    if (n < 0 || (size_t)n >= sizeof tc->out_dir) {
        fp8t_errorf(c->err, c->errlen, "bisect: output path too long under %s", c->root);
        free(tc);
        return -1;
    }
    if (resume) {
        snprintf(tc->resume, sizeof tc->resume, "%s", resume);
        tc->init[0] = 0; /* a recovery experiment continues a checkpoint of this bisection */
    }
    tc->steps = c->start_step + c->cfg->steps;
    tc->quiet = 1;
    tc->ckpt_every = ckpt_every;
    tc->keep_ckpts = 0;
    tc->val_every = 0; /* the gap is judged on the training loss */
    tc->inspect[0] = 0;
    tc->tensorboard[0] = 0; /* the experiments would add their curves to the user's run */
    tc->baseline[0] = 0;
    tc->shadow_every = 0; /* shadow fallbacks would change the run under test */
    tc->detect_nan = 1;
    int rrc = 0;
    if (c->rank == 0 && rm_tree(tc->out_dir) != 0) {
        fp8t_errorf(c->err, c->errlen, "bisect: cannot clear %s: %s", tc->out_dir,
                    strerror(errno));
        rrc = -1;
    }
    if (from_rank0(c, rrc) != 0) {
        free(tc);
        return -1;
    }

    int idx = res->n_exp;
    logf_(c, "bisect [%d/%d] %-22s %s%s%s ...", idx, c->planned > idx ? c->planned : idx, name,
          what, *e->override ? "  --override " : "", e->override);
    double t0 = now_s();
    fp8t_train_result tr;
    memset(&tr, 0, sizeof tr);
    char terr[512] = "";
    int rc = fp8t_train_run(tc, &tr, terr, sizeof terr);
    e->seconds = now_s() - t0;
    /* the ranks agreed on rc inside the run (every one fails when one does) */
    if (rc != 0 || tr.reason == FP8T_STOP_ERROR) {
        logf_(c, " failed\n");
        fp8t_errorf(c->err, c->errlen, "bisect: experiment %s failed: %s", name,
                    terr[0] ? terr : "(no message)");
        if (c->rank != 0) /* rank 0 prints the bisect's error; a rank's own cause is here */
            fprintf(stderr, "fp8train bisect: rank %d: %s\n", c->rank, c->err);
        free(tc);
        return -1;
    }
    e->ran = 1;
    e->stop = (int)tr.reason;
    int tail = fp8t_bisect_tail_steps(c->cfg);
    int jrc = 0; /* rank 0 judges the run from its logs */
    if (c->rank == 0) {
        jrc = fp8t_bisect_tail_loss(&e->tail_loss, &e->final_loss, &e->first_step, &e->last_step,
                                    tc->out_dir, tail, c->err, c->errlen);
        if (jrc == 0 && base == POL_BF16 && !override && !resume) {
            e->gap = 0; /* the baseline itself */
        } else if (jrc == 0) {
            char base_dir[BPATH];
            snprintf(base_dir, sizeof base_dir, "%s/bf16", c->root);
            jrc = fp8t_bisect_gap(&e->gap, tc->out_dir, base_dir, tc->steps, tail, c->err,
                                  c->errlen);
        }
        e->finished = e->last_step >= tc->steps && isfinite(e->tail_loss);
        e->closes = fabs(e->gap) < c->cfg->threshold;
    }
    if (from_rank0(c, jrc) != 0) {
        logf_(c, " failed\n");
        free(tc);
        return -1;
    }
    if (fp8t_dist_size() > 1) fp8t_dist_bcast(e, sizeof *e, 0); /* the same evidence everywhere */
    c->spent += e->seconds;
    const int finished = e->finished;
    free(tc);

    int left = c->planned - idx;
    double per = c->spent / idx;
    if (finished)
        logf_(c, " %.1fs  loss %.4f  gap %+.2f%%", e->seconds, e->tail_loss, 100 * e->gap);
    else
        logf_(c, " %.1fs  %s at step %d", e->seconds,
              e->stop == FP8T_STOP_NAN ? "NaN/Inf" : "stopped", e->last_step);
    if (left > 0) logf_(c, "  (ETA ~%.0fs)", per * left);
    logf_(c, "\n");
    return 0;
}

/* The checkpoint step of the fp8 run in (after, before) nearest to `want`, or -1. */
static int checkpoint_near(const char *run_dir, int want, int after, int before) {
    char path[BPATH];
    snprintf(path, sizeof path, "%.*s/checkpoints", FP8T_PATH_MAX + 256, run_dir);
    DIR *d = opendir(path);
    if (!d) return -1;
    int best = -1;
    for (struct dirent *de; (de = readdir(d));) {
        int s;
        char tail;
        if (sscanf(de->d_name, "step_%d%c", &s, &tail) != 1) continue;
        if (s <= after || s >= before) continue;
        if (best < 0 || abs(s - want) < abs(best - want) ||
            (abs(s - want) == abs(best - want) && s < best))
            best = s;
    }
    closedir(d);
    return best;
}

static int ceil_log2(int n) {
    int k = 0;
    while ((1 << k) < n) k++;
    return k;
}

static void set_verdict(fp8t_bisect_exp *e, const char *text) {
    if (e->finished)
        snprintf(e->verdict, sizeof e->verdict, "%s", text);
    else
        snprintf(e->verdict, sizeof e->verdict, "%s (%s at step %d)", text,
                 e->stop == FP8T_STOP_NAN ? "NaN/Inf" : "stopped", e->last_step);
}

/* Run `gemms` of positions lo..hi in precision prec; *closes says whether the gap closed. */
static int try_span(bisect_ctx *c, int lo, int hi, unsigned gemms, fp8t_precision prec,
                    fp8t_bisect_exp **out) {
    char ov[256], name[96], what[200], g[32], words[96];
    span_override(c, ov, sizeof ov, lo, hi, gemms, prec);
    span_dirname(c, name, sizeof name, lo, hi, gemms, prec);
    bisect_gemm_set_name(g, sizeof g, gemms);
    bisect_span_words(words, sizeof words, c->n_layer, lo, hi);
    snprintf(what, sizeof what, "%s of %s in %s", g, words, fp8t_precision_name(prec));
    if (run_experiment(c, name, what, POL_RUN, ov, NULL, 0, out) != 0) return -1;
    set_verdict(*out, (*out)->closes ? "closes the gap" : "gap remains");
    return 0;
}

/* Does any GEMM of the head run in an FP8 precision under this policy? */
static int head_in_fp8(const fp8t_train_config *t) {
    for (int g = 0; g < FP8T_GEMM_COUNT; g++) {
        fp8t_precision p = fp8t_policy_resolve(&t->policy, t->model.n_layer, -1, FP8T_MOD_HEAD,
                                               (fp8t_gemm_kind)g);
        if (p != FP8T_PREC_BF16 && p != FP8T_PREC_FP32) return 1;
    }
    return 0;
}

/* The FP8 recipes tried for the culprit instead of BF16, cheapest first (the per-tensor
 * recipe runs at delayed scaling's speed; block's and rowwise's targets on Hopper are 1.2x and
 * 1.15x BF16). */
static const fp8t_precision bisect_alternatives[FP8T_BISECT_N_ALTS] = {
    FP8T_PREC_CURRENT, FP8T_PREC_BLOCK, FP8T_PREC_ROWWISE};

/* Do `gemms` of positions lo..hi all run in precision prec already? */
static int span_is_prec(bisect_ctx *c, int lo, int hi, unsigned gemms, fp8t_precision prec) {
    const fp8t_train_config *t = &c->cfg->train;
    int mpl = fp8t_model_modules_per_layer(&t->model);
    for (int l = lo; l <= hi; l++)
        for (int s = 0; s < (l < c->n_layer ? mpl : 1); s++)
            for (int g = 0; g < FP8T_GEMM_COUNT; g++) {
                if (!(gemms & (1u << g))) continue;
                fp8t_module mod =
                    l < c->n_layer ? fp8t_model_module_of_slot(&t->model, s) : FP8T_MOD_HEAD;
                if (fp8t_policy_resolve(&t->policy, c->n_layer, l < c->n_layer ? l : -1, mod,
                                        (fp8t_gemm_kind)g) != prec)
                    return 0;
            }
    return 1;
}

static int check_config(const fp8t_bisect_config *cfg, char *err, size_t errlen) {
    if (cfg->steps < 2) {
        return fp8t_errorf(err, errlen,
                           "bisect: --steps must be at least 2 (got %d); 40-200 short steps "
                           "are typical",
                           cfg->steps);
    }
    if (!(cfg->threshold > 0 && cfg->threshold < 1)) {
        return fp8t_errorf(err, errlen,
                           "bisect: --threshold must be in (0, 1), e.g. 0.01 (got %g)",
                           cfg->threshold);
    }
    if (!(cfg->tail_frac > 0 && cfg->tail_frac <= 1)) {
        return fp8t_errorf(err, errlen, "bisect: --tail must be in (0, 1], e.g. 0.1 (got %g)",
                           cfg->tail_frac);
    }
    if (cfg->train.policy.n_overrides + 2 > FP8T_MAX_OVERRIDES) {
        return fp8t_errorf(err, errlen,
                           "bisect: the policy has %d overrides; bisect adds up to 2 and the "
                           "limit is %d",
                           cfg->train.policy.n_overrides, FP8T_MAX_OVERRIDES);
    }
    return 0;
}

/* Step 5: one GEMM kind back in BF16 at a time; the two that helped most together when no
 * single one closes the gap; then all three. Returns the culprit mask (0: none) or -1. */
static int find_culprit_kinds(bisect_ctx *c) {
    static const fp8t_gemm_kind order[3] = {FP8T_GEMM_FPROP, FP8T_GEMM_DGRAD, FP8T_GEMM_WGRAD};
    const int all = c->n_pos - 1;
    double kind_gap[FP8T_GEMM_COUNT];
    unsigned culprit = 0;
    double best = INFINITY;
    fp8t_bisect_exp *e;
    for (int i = 0; i < 3; i++) {
        fp8t_gemm_kind g = order[i];
        char ov[256], name[96], what[160];
        span_override(c, ov, sizeof ov, 0, all, 1u << g, FP8T_PREC_BF16);
        snprintf(name, sizeof name, "%s-bf16", fp8t_gemm_name(g));
        snprintf(what, sizeof what, "%s in BF16, the rest as configured", fp8t_gemm_name(g));
        if (run_experiment(c, name, what, POL_RUN, ov, NULL, 0, &e) != 0) return -1;
        kind_gap[g] = fabs(e->gap);
        set_verdict(e, e->closes ? "closes the gap" : "gap remains");
        if (e->closes && kind_gap[g] < best) best = kind_gap[g], culprit = 1u << g;
    }
    if (culprit) return (int)culprit;
    int a = 0;
    for (int g = 1; g < FP8T_GEMM_COUNT; g++)
        if (kind_gap[g] < kind_gap[a]) a = g;
    int b = a == 0 ? 1 : 0;
    for (int g = 0; g < FP8T_GEMM_COUNT; g++)
        if (g != a && kind_gap[g] < kind_gap[b]) b = g;
    unsigned pair = (1u << a) | (1u << b);
    c->planned++;
    if (try_span(c, 0, all, pair, FP8T_PREC_BF16, &e) != 0) return -1;
    snprintf(e->what, sizeof e->what, "%s: no single kind closed the gap", e->name);
    if (e->closes) return (int)pair;
    c->planned++;
    if (try_span(c, 0, all, (1u << FP8T_GEMM_COUNT) - 1, FP8T_PREC_BF16, &e) != 0) return -1;
    if (!e->closes) set_verdict(e, "gap remains: not the FP8 GEMMs of the linear layers");
    return e->closes ? (1 << FP8T_GEMM_COUNT) - 1 : 0;
}

/* Step 6: the smallest span of positions whose BF16 override closes the gap, assuming a span
 * that contains every culprit closes it: binary search for the largest lo with [lo, end]
 * closing, then for the smallest hi with [lo, hi] closing. */
static int narrow_span(bisect_ctx *c, unsigned gemms, int *lo_out, int *hi_out) {
    const int end = c->n_pos - 1;
    fp8t_bisect_exp *e;
    int a = 0, b = end; /* [a, end] closes (the kind-level run) */
    while (a < b) {
        int m = (a + b + 1) / 2;
        if (try_span(c, m, end, gemms, FP8T_PREC_BF16, &e) != 0) return -1;
        if (e->closes)
            a = m;
        else
            b = m - 1;
    }
    int lo = a;
    a = lo, b = end; /* [lo, b] closes */
    while (a < b) {
        int m = (a + b) / 2;
        if (try_span(c, lo, m, gemms, FP8T_PREC_BF16, &e) != 0) return -1;
        if (e->closes)
            b = m;
        else
            a = m + 1;
    }
    *lo_out = lo;
    *hi_out = b;
    return 0;
}

static const fp8t_bisect_exp *find_by_override(const fp8t_bisect_result *res, const char *ov) {
    for (int i = 0; i < res->n_exp; i++)
        if (strcmp(res->exp[i].override, ov) == 0) return &res->exp[i];
    return NULL;
}

/* A new bisect owns OUT/bisect/: the run directories of an earlier one (other experiment
 * names) would otherwise sit beside this one's and confuse its evidence. Only entries that are
 * run directories (config.json or metrics.jsonl inside) and bisect's own files are removed. */
/* The name of a directory bisect writes an experiment into (run_experiment's names). */
static int is_experiment_name(const char *n) {
    static const char *fixed[] = {"bf16",       "fp8",        "recovery",  "fake",
                                  "fprop-bf16", "dgrad-bf16", "wgrad-bf16"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!strcmp(n, fixed[i])) return 1;
    return !strncmp(n, "layers-", 7) || !strncmp(n, "head-", 5);
}

#define BISECT_MARKER ".fp8train-bisect"

/* --out is the bisect's own directory (experiments in OUT/<name>/). A directory that holds
 * anything but a previous bisect (its marker or bisect.json) is refused rather than mixed
 * into: `--out runs` must not clear a user's runs/bf16. A previous bisect's files are removed,
 * and only those: bisect.json, report.html and experiment directories named as bisect names
 * them that hold a run. */
static int clear_previous_bisect(bisect_ctx *c) {
    DIR *d = opendir(c->root);
    if (!d) {
        fp8t_errorf(c->err, c->errlen, "bisect: cannot read %s: %s", c->root, strerror(errno));
        return -1;
    }
    char probe[BPATH + 32];
    snprintf(probe, sizeof probe, "%s/" BISECT_MARKER, c->root);
    int ours = access(probe, F_OK) == 0;
    snprintf(probe, sizeof probe, "%s/bisect.json", c->root);
    ours |= access(probe, F_OK) == 0;
    int rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (!ours) {
            fp8t_errorf(
                c->err, c->errlen,
                "bisect: --out %s already holds files of something else "
                "('%s'); give bisect a new or empty directory of its own, e.g. --out %s/bisect",
                c->root, de->d_name, c->root);
            closedir(d);
            return -1;
        }
        char path[BPATH];
        snprintf(path, sizeof path, "%s/%s", c->root, de->d_name);
        if (!strcmp(de->d_name, "bisect.json") || !strcmp(de->d_name, "report.html")) {
            rc = remove(path);
            continue;
        }
        if (!is_experiment_name(de->d_name)) continue;
        snprintf(probe, sizeof probe, "%s/config.json", path);
        int is_run = access(probe, F_OK) == 0;
        snprintf(probe, sizeof probe, "%s/metrics.jsonl", path);
        is_run |= access(probe, F_OK) == 0;
        if (is_run) rc = rm_tree(path);
    }
    closedir(d);
    if (rc != 0) {
        fp8t_errorf(c->err, c->errlen, "bisect: cannot clear the previous bisect in %s: %s",
                    c->root, strerror(errno));
        return rc;
    }
    snprintf(probe, sizeof probe, "%s/" BISECT_MARKER, c->root);
    FILE *m = fopen(probe, "w");
    if (!m ||
        fputs("fp8train bisect writes this directory; a new bisect with the same --out "
              "replaces its experiments\n",
              m) < 0 ||
        fclose(m) != 0) {
        fp8t_errorf(c->err, c->errlen, "bisect: cannot write %s: %s", probe, strerror(errno));
        return -1;
    }
    return 0;
}

/* The result before any experiment: nothing found, nothing run (-1 / NAN where a field is only
 * meaningful once its experiment ran), reliable until the noise says otherwise. Set before the
 * config is checked, so a refused bisect still leaves a well-defined result. */
static void init_result(fp8t_bisect_result *res, const fp8t_bisect_config *cfg) {
    memset(res, 0, sizeof *res);
    res->recovered = -1;
    res->fake_matches = -1;
    res->layer_lo = res->layer_hi = -1;
    res->fix_precision = FP8T_PREC_BF16;
    res->fix_gap = NAN;
    res->noise_exp = -1;
    res->reliable = 1;
    res->tail_steps = fp8t_bisect_tail_steps(cfg);
}

/* Rank 0's share of the preparation: the step of --resume (every experiment runs cfg->steps
 * past it) and --out made bisect's own, clear of a previous bisect's runs. root_fits: c->root
 * holds --out with room for the experiments' names. 0, or nonzero with c->err. */
static int prepare_on_rank0(bisect_ctx *c, int root_fits) {
    const fp8t_bisect_config *cfg = c->cfg;
    if (cfg->train.resume[0]) {
        fp8t_checkpoint ck;
        memset(&ck, 0, sizeof ck);
        int rc = fp8t_checkpoint_read_state(cfg->train.resume, &ck, c->err, c->errlen);
        c->start_step = ck.step;
        fp8t_checkpoint_free(&ck);
        if (rc != 0) return rc;
    }
    if (!root_fits || mkdir_p(c->root) != 0)
        return fp8t_errorf(c->err, c->errlen, "bisect: cannot create %s (check --out): %s",
                           cfg->out_dir, !root_fits ? "path too long" : strerror(errno));
    return clear_previous_bisect(c);
}

/* Everything the experiments need before the first one: the ranks (under mpirun every rank
 * runs this procedure; fp8t_dist_init is what dp_setup calls), the positions the span search
 * runs over, the start step and the output directory (rank 0 prepares them, every rank learns
 * the outcome, so that all fail together or none does), and the number of experiments
 * expected, for the ETA. */
static int prepare(bisect_ctx *c) {
    const fp8t_bisect_config *cfg = c->cfg;
    if (fp8t_dist_init(c->err, c->errlen) != 0) return -1;
    c->rank = fp8t_dist_rank();
    c->n_layer = cfg->train.model.n_layer;
    c->n_pos = c->n_layer + head_in_fp8(&cfg->train);
    c->res->n_layer = c->n_layer;
    int n = snprintf(c->root, sizeof c->root, "%s", cfg->out_dir);
    int root_fits = !(n < 0 || (size_t)n >= sizeof c->root - 128);
    if (from_rank0(c, c->rank == 0 ? prepare_on_rank0(c, root_fits) : 0) != 0) return -1;
    if (fp8t_dist_size() > 1) fp8t_dist_bcast(&c->start_step, sizeof c->start_step, 0);
    /* bf16, fp8, recovery, fake, 3 kinds, the span search, the FP8 alternatives */
    c->planned = 7 + (c->n_pos > 1 ? 2 * ceil_log2(c->n_pos) : 0) + FP8T_BISECT_N_ALTS;
    return 0;
}

/* The header of the log: what is compared from where, so that a log read later says which
 * policy (and which injected fault) the evidence below it is about. */
static void log_plan(bisect_ctx *c) {
    const fp8t_bisect_config *cfg = c->cfg;
    char pol[1024];
    fp8t_policy_describe(&cfg->train.policy, pol, sizeof pol);
    logf_(c, "bisect: %d steps per experiment from %s, threshold %.2f%%, runs in %s\n",
          cfg->steps,
          cfg->train.resume[0] ? cfg->train.resume
          : cfg->train.init[0] ? cfg->train.init
                               : "a fresh init",
          100 * cfg->threshold, c->root);
    logf_(c, "bisect: policy under test: %s\n", pol);
    if (cfg->train.inject[0]) logf_(c, "bisect: injected fault: %s\n", cfg->train.inject);
}

/* Step 1: the BF16 baseline, the reference every other gap is measured against. A baseline
 * that does not finish makes every gap meaningless, so the bisect stops there. */
static int run_baseline(bisect_ctx *c, fp8t_bisect_exp **base_out) {
    fp8t_bisect_exp *base;
    if (run_experiment(c, "bf16", "BF16 baseline (every GEMM in BF16)", POL_BF16, NULL, NULL, 0,
                       &base) != 0)
        return -1;
    if (!base->finished) {
        return fp8t_errorf(c->err, c->errlen,
                           "bisect: the BF16 baseline itself did not finish (%s at step %d): "
                           "lower --lr or check the data; FP8 cannot be judged against it",
                           base->stop == FP8T_STOP_NAN ? "NaN/Inf" : "stopped", base->last_step);
    }
    c->res->baseline_loss = base->tail_loss;
    set_verdict(base, "reference");
    *base_out = base;
    return 0;
}

/* Step 2: FP8 as configured: the gap the bisect explains. It checkpoints at the midpoint, the
 * start of the recovery experiment. */
static int run_fp8_as_configured(bisect_ctx *c, fp8t_bisect_exp **fp8_out) {
    fp8t_bisect_exp *fp8;
    if (run_experiment(c, "fp8", "FP8 as configured", POL_RUN, NULL, NULL, c->cfg->steps / 2,
                       &fp8) != 0)
        return -1;
    c->res->fp8_gap = fp8->gap;
    char v[96];
    if (fp8->closes)
        snprintf(v, sizeof v, "matches BF16: no FP8 problem");
    else if (fp8->finished)
        snprintf(v, sizeof v, "FP8 is off by %+.2f%%", 100 * fp8->gap);
    else
        snprintf(v, sizeof v, "FP8 does not finish");
    set_verdict(fp8, v);
    *fp8_out = fp8;
    return 0;
}

/* Step 3: the fp8 run's checkpoint nearest its midpoint continued in BF16: whether the loss
 * comes back tells a transient fault from permanent damage to the weights. Skipped (one
 * experiment fewer planned) when the fp8 run stopped before leaving a checkpoint. */
static int run_recovery(bisect_ctx *c, const fp8t_bisect_exp *fp8) {
    const int steps = c->cfg->steps, half = steps / 2;
    char fp8_dir[BPATH];
    snprintf(fp8_dir, sizeof fp8_dir, "%s/fp8", c->root);
    int mid = c->rank == 0 ? checkpoint_near(fp8_dir, c->start_step + half, c->start_step,
                                             c->start_step + steps)
                           : -1;
    if (fp8t_dist_size() > 1) fp8t_dist_bcast(&mid, sizeof mid, 0);
    if (mid < 0) {
        logf_(c,
              "bisect: recovery experiment skipped: the fp8 run left no checkpoint "
              "before step %d\n",
              c->start_step + steps);
        c->planned--;
        return 0;
    }
    char ck[BPATH], what[160];
    fp8t_checkpoint_dir(ck, sizeof ck, fp8_dir, mid);
    snprintf(what, sizeof what, "recovery: FP8 checkpoint of step %d continued in BF16", mid);
    fp8t_bisect_exp *e;
    if (run_experiment(c, "recovery", what, POL_BF16, NULL, ck, 0, &e) != 0) return -1;
    c->res->recovered = e->closes;
    char v[160];
    if (e->closes)
        snprintf(v, sizeof v, "recovers: back to the baseline, the damage is not permanent");
    else if (e->finished && fp8->finished && fabs(e->gap) < 0.5 * fabs(fp8->gap))
        snprintf(v, sizeof v,
                 "recovering: the gap shrinks in %d BF16 steps but is not "
                 "closed yet",
                 e->last_step - mid);
    else
        snprintf(v, sizeof v, "does not recover in %d BF16 steps", e->last_step - mid);
    set_verdict(e, v);
    return 0;
}

/* Step 4: every FP8 GEMM fake-quantized (FP8 values, BF16 GEMM): tells values that do not fit
 * FP8 from a scaling recipe that fails them. */
static int run_fake_quantized(bisect_ctx *c) {
    char ov[256];
    span_override(c, ov, sizeof ov, 0, c->n_pos - 1, (1u << FP8T_GEMM_COUNT) - 1, FP8T_PREC_FAKE);
    fp8t_bisect_exp *e;
    if (run_experiment(c, "fake", "every FP8 GEMM fake-quantized (FP8 values, BF16 GEMM)",
                       POL_RUN, ov, NULL, 0, &e) != 0)
        return -1;
    c->res->fake_matches = e->closes;
    set_verdict(e, e->closes ? "matches: the values fit FP8; suspect the scaling recipe"
                             : "off too: the values themselves lose too much in FP8");
    return 0;
}

/* Step 6: the culprit kinds (res->culprit_gemms) narrowed to the smallest span of positions
 * (res->layer_lo..layer_hi) whose BF16 override closes the gap; that override, already
 * measured by the search (or by step 5 when the span is everything), is the fix until an FP8
 * recipe does as well. */
static int locate_culprit(bisect_ctx *c) {
    fp8t_bisect_result *res = c->res;
    int lo = 0, hi = c->n_pos - 1;
    if (c->n_pos > 1 && narrow_span(c, res->culprit_gemms, &lo, &hi) != 0) return -1;
    res->layer_lo = lo;
    res->layer_hi = hi;
    span_override(c, res->override, sizeof res->override, lo, hi, res->culprit_gemms,
                  FP8T_PREC_BF16);
    const fp8t_bisect_exp *bf16_fix = find_by_override(res, res->override);
    res->fix_gap = bf16_fix ? bf16_fix->gap : NAN;
    return 0;
}

/* Step 7: the FP8 recipes that might fix the culprit instead of BF16 (the GEMM stays FP8),
 * each tried, cheapest first; the first that closes the gap replaces the BF16 fix. A recipe
 * the culprit already runs in is not tried (one experiment fewer planned). What each did goes
 * into res->alternatives for the conclusion. */
static int try_fp8_alternatives(bisect_ctx *c) {
    fp8t_bisect_result *res = c->res;
    const int lo = res->layer_lo, hi = res->layer_hi;
    char tried[sizeof res->alternatives] = "";
    size_t used = 0;
#define TRIED_ROOM (used < sizeof tried ? sizeof tried - used : 0)
    for (int k = 0; k < FP8T_BISECT_N_ALTS; k++) {
        const fp8t_precision alt = bisect_alternatives[k];
        const char *an = fp8t_precision_name(alt);
        if (span_is_prec(c, lo, hi, res->culprit_gemms, alt)) {
            logf_(c, "bisect: %s not tried: the culprit already runs in it\n", an);
            c->planned--;
            used += (size_t)snprintf(tried + used, TRIED_ROOM, "%s%s: already the culprit's",
                                     used ? "; " : "", an);
            continue;
        }
        fp8t_bisect_exp *e;
        if (try_span(c, lo, hi, res->culprit_gemms, alt, &e) != 0) return -1;
        char v[200];
        if (e->closes && res->fix_precision == FP8T_PREC_BF16) {
            snprintf(v, sizeof v, "closes the gap and keeps FP8: the cheapest fix");
            snprintf(res->override, sizeof res->override, "%s", e->override);
            res->fix_precision = alt;
            res->fix_gap = e->gap;
        } else if (e->closes) {
            snprintf(v, sizeof v, "closes the gap too, but %s is cheaper",
                     fp8t_precision_name(res->fix_precision));
        } else {
            snprintf(v, sizeof v, "gap remains: %s is not enough", an);
        }
        set_verdict(e, v);
        if (e->finished)
            used += (size_t)snprintf(tried + used, TRIED_ROOM, "%s%s %s (gap %+.2f%%)",
                                     used ? "; " : "", an,
                                     e->closes ? "closes" : "does not close", 100 * e->gap);
        else
            used += (size_t)snprintf(tried + used, TRIED_ROOM, "%s%s does not finish",
                                     used ? "; " : "", an);
    }
#undef TRIED_ROOM
    snprintf(res->alternatives, sizeof res->alternatives, "%s", tried);
    return 0;
}

/* The conclusions, one per outcome. Each is the few lines people read first, so each names
 * the gap it is about and, where the noise swamps the gaps, says the result is unconfirmed. */

/* FP8 as configured already matches the baseline: nothing to bisect. */
static void conclude_no_problem(bisect_ctx *c, const fp8t_bisect_exp *base,
                                const fp8t_bisect_exp *fp8) {
    fp8t_bisect_result *res = c->res;
    res->outcome = FP8T_BISECT_NO_PROBLEM;
    snprintf(res->conclusion, sizeof res->conclusion,
             "no FP8 problem found: FP8 as configured ends within %.2f%% of BF16 "
             "(gap %+.3f%%; tail loss %.4f vs %.4f after %d steps)",
             100 * c->cfg->threshold, 100 * fp8->gap, fp8->tail_loss, base->tail_loss,
             c->cfg->steps);
}

/* FP8 is off but not even all three GEMM kinds in BF16 close the gap: the cause lies outside
 * the FP8 GEMMs, which is all bisect can change. */
static void conclude_no_fix(bisect_ctx *c, const fp8t_bisect_exp *fp8) {
    fp8t_bisect_result *res = c->res;
    res->outcome = FP8T_BISECT_NO_FIX;
    fp8t_bisect_judge_noise(res, c->cfg->threshold);
    snprintf(res->conclusion, sizeof res->conclusion,
             "FP8 is off by %+.2f%%%s but no BF16 override of the FP8 GEMMs closes the gap: "
             "look outside them (non-GEMM code, data, the optimizer), or compare tensors "
             "with --inspect",
             100 * fp8->gap,
             res->reliable ? "" : " (UNCONFIRMED: within the noise, see the WARNING)");
}

/* The culprit (kinds and span) and the cheapest fix, with the override to paste. */
static void conclude_found(bisect_ctx *c, const fp8t_bisect_exp *fp8) {
    fp8t_bisect_result *res = c->res;
    res->outcome = FP8T_BISECT_FOUND;
    /* still the best guess when the noise swamps the gaps, but labelled as such */
    fp8t_bisect_judge_noise(res, c->cfg->threshold);
    char g[32], words[96];
    bisect_gemm_set_name(g, sizeof g, res->culprit_gemms);
    bisect_span_words(words, sizeof words, c->n_layer, res->layer_lo, res->layer_hi);
    char detail[160];
    if (fp8->finished)
        snprintf(detail, sizeof detail, "%+.2f%%", 100 * fp8->gap);
    else
        snprintf(detail, sizeof detail, "NaN/Inf at step %d", fp8->last_step);
    char fixw[64];
    if (res->fix_precision == FP8T_PREC_BF16)
        snprintf(fixw, sizeof fixw, "BF16");
    else
        snprintf(fixw, sizeof fixw, "%s scaling (keeps FP8)",
                 fp8t_precision_name(res->fix_precision));
    snprintf(res->conclusion, sizeof res->conclusion,
             "culprit%s: %s of %s (FP8 %s%s%s)\n"
             "%s: %s for those GEMMs (gap %+.2f%%)\n"
             "  --override '%s'\n"
             "FP8 alternatives to BF16, cheapest first: %s",
             res->reliable ? "" : " (UNCONFIRMED: within the noise, see the WARNING)", g, words,
             fp8->finished ? "gap " : "", detail,
             res->recovered == 1   ? "; recovers when continued in BF16"
             : res->recovered == 0 ? "; not recovered when continued in BF16"
                                   : "",
             res->reliable ? "cheapest fix" : "best guess for a fix (UNCONFIRMED)", fixw,
             100 * res->fix_gap, res->override, res->alternatives);
}

/* The end of every concluded bisect: the noise judged over all the experiments, the evidence
 * table and the conclusion printed, bisect.json and report.html written (by rank 0; every rank
 * learns whether that worked, so all return the same). */
static int report(bisect_ctx *c) {
    fp8t_bisect_result *res = c->res;
    fp8t_bisect_judge_noise(res, c->cfg->threshold);
    fp8t_bisect_print(c->cfg->log, res, c->cfg->threshold);
    if (from_rank0(c, c->rank == 0 && (bisect_write_json(c) != 0 || bisect_write_html(c) != 0)
                          ? -1
                          : 0) != 0)
        return -1;
    logf_(c, "bisect: %.0fs in %d experiments; summary %s/bisect.json, report %s/report.html\n",
          c->spent, res->n_exp, c->root, c->root);
    return 0;
}

/* The steps in order (include/fp8train/bisect.h describes the experiments); it stops at the
 * first conclusion, and on the first error with err set. */
int fp8t_bisect_run(const fp8t_bisect_config *cfg, fp8t_bisect_result *res, char *err,
                    size_t errlen) {
    init_result(res, cfg);
    if (check_config(cfg, err, errlen) != 0) return -1;
    bisect_ctx ctx, *c = &ctx;
    memset(c, 0, sizeof ctx);
    c->cfg = cfg;
    c->res = res;
    c->err = err;
    c->errlen = errlen;
    if (prepare(c) != 0) return -1;
    log_plan(c);

    fp8t_bisect_exp *base = NULL, *fp8 = NULL;
    if (run_baseline(c, &base) != 0) return -1;
    if (run_fp8_as_configured(c, &fp8) != 0) return -1;
    if (fp8->closes) {
        conclude_no_problem(c, base, fp8);
        return report(c);
    }
    if (run_recovery(c, fp8) != 0) return -1;
    if (run_fake_quantized(c) != 0) return -1;
    int culprit = find_culprit_kinds(c);
    if (culprit < 0) return -1;
    if (culprit == 0) {
        conclude_no_fix(c, fp8);
        return report(c);
    }
    res->culprit_gemms = (unsigned)culprit;
    if (locate_culprit(c) != 0) return -1;
    if (try_fp8_alternatives(c) != 0) return -1;
    conclude_found(c, fp8);
    return report(c);
}
