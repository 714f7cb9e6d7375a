/* Evaluation: BF16/FP8 validation loss with the learned FP8 scales (and no state update),
 * calibration of a fresh state, llm.c eval tasks (file format, scoring against a one-row
 * reference, a task the model must ace), sampling and llm.c's tokenizer file. */
#include <math.h>

#include "fp8train/eval.h"
#include "fp8train/fp8.h"
#include "test.h"
#include "export_test_util.h"

static char g_root[512], g_ckpt[600];
static fp8t_weights g_w;
static fp8t_backend *g_be;

static fp8t_evaluator *make_ev(const fp8t_weights *w, int B, int T) {
    char err[512];
    fp8t_evaluator *ev = fp8t_evaluator_create(g_be, w, NULL, B, T, err, sizeof(err));
    if (!ev) printf("  evaluator: %s\n", err);
    return ev;
}

static fp8t_data *val_data(int B, int T) {
    char err[512];
    fp8t_data *d =
        fp8t_data_open("synthetic", "", FP8T_SPLIT_VAL, B, T, 256, 1234, err, sizeof(err));
    if (!d) printf("  data: %s\n", err);
    return d;
}

/* ------------------------------------------------------------------ validation loss */

static void test_fp8_eval_uses_and_keeps_state(void) {
    fp8t_evaluator *ev = make_ev(&g_w, TU_B, TU_T);
    fp8t_data *d = val_data(TU_B, TU_T);
    T_ASSERT(ev && d, "setup");
    T_CHECK(!fp8t_evaluator_needs_calibration(ev), "a trained checkpoint has an amax history");
    int n, len;
    size_t nf = fp8t_recipe_state_floats(g_w.fp8_n, g_w.fp8_len);
    float *s0 = malloc(nf * sizeof(float)), *s1 = malloc(nf * sizeof(float));
    fp8t_evaluator_fp8_state(ev, s0, &n, &len);
    T_CHECK(n == g_w.fp8_n && len == g_w.fp8_len, "state size %d x %d", n, len);
    T_CHECK(memcmp(s0, g_w.fp8_state, nf * sizeof(float)) == 0,
            "the checkpoint's state was not loaded");
    double bf = fp8t_evaluator_loss(ev, d, 3);
    fp8t_evaluator_set_precision(ev, FP8T_EVAL_FP8);
    double f1 = fp8t_evaluator_loss(ev, d, 3), f2 = fp8t_evaluator_loss(ev, d, 3);
    fp8t_evaluator_set_precision(ev, FP8T_EVAL_FP32);
    double f32 = fp8t_evaluator_loss(ev, d, 3);
    printf("  loss bf16 %.6f fp8 %.6f fp32 %.6f\n", bf, f1, f32);
    T_CHECK(isfinite(bf) && isfinite(f1) && isfinite(f32), "finite losses");
    T_CHECK(f1 == f2, "FP8 evaluation must be repeatable: %.9g vs %.9g", f1, f2);
    T_CHECK(f1 != bf && f32 != bf,
            "the precisions must actually differ (bf16 %.9g fp8 %.9g fp32 %.9g)", bf, f1, f32);
    T_CLOSE(f1, bf, 0.0, 1e-2);
    T_CLOSE(f32, bf, 0.0, 1e-2);
    /* no delayed-scaling update: scales and the stored history (slots 1..len-1) unchanged */
    fp8t_evaluator_fp8_state(ev, s1, &n, &len);
    fp8t_recipe_state a, b;
    fp8t_recipe_state_view(&a, s0, n, len);
    fp8t_recipe_state_view(&b, s1, n, len);
    T_CHECK(memcmp(a.scale, b.scale, (size_t)n * sizeof(float)) == 0 &&
                memcmp(a.scale_inv, b.scale_inv, (size_t)n * sizeof(float)) == 0,
            "evaluation changed the FP8 scales");
    T_CHECK(memcmp(a.history + n, b.history + n, (size_t)(len - 1) * n * sizeof(float)) == 0,
            "evaluation rolled the amax history");
    free(s0);
    free(s1);
    fp8t_data_close(d);
    fp8t_evaluator_destroy(ev);
}

/* A fresh state (as after a BF16 import) has scale 1 everywhere. The weights are
 * reparametrized without changing the function (norm weights x1024, the following linear
 * weights /1024: exact in BF16 and FP32), so that with scale 1 the linear inputs saturate E4M3
 * and the weights underflow; calibration must fix both. */
static void test_calibration_of_fresh_state(void) {
    fp8t_weights w = g_w;
    w.fp8_state = NULL;
    w.fp8_n = w.fp8_len = 0;
    w.policy_json = NULL;
    w.params = malloc(g_w.num_params * sizeof(float));
    memcpy(w.params, g_w.params, g_w.num_params * sizeof(float));
    int n_info = fp8t_model_param_table(&w.model, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)n_info, sizeof(*info));
    fp8t_model_param_table(&w.model, info, NULL);
    for (int i = 0; i < n_info; i++) {
        float mul = 1.0f;
        if (strstr(info[i].name, ".ln1.") || strstr(info[i].name, ".ln2.")) mul = 1024.0f;
        if (strstr(info[i].name, ".qkv.w") || strstr(info[i].name, ".fc1.w"))
            mul = 1.0f / 1024.0f;
        for (size_t j = 0; j < info[i].numel; j++) w.params[info[i].offset + j] *= mul;
    }
    free(info);
    fp8t_evaluator *ev = make_ev(&w, TU_B, TU_T), *ref = make_ev(&g_w, TU_B, TU_T);
    fp8t_data *d = val_data(TU_B, TU_T);
    T_ASSERT(ev && ref && d, "setup");
    T_CHECK(fp8t_evaluator_needs_calibration(ev), "a fresh state needs calibration");
    double bf = fp8t_evaluator_loss(ev, d, 3), bf_ref = fp8t_evaluator_loss(ref, d, 3);
    T_CHECK(bf == bf_ref, "the reparametrization must not change the BF16 loss (%.9g vs %.9g)",
            bf, bf_ref);
    fp8t_evaluator_set_precision(ev, FP8T_EVAL_FP8);
    double raw = fp8t_evaluator_loss(ev, d, 3);
    fp8t_evaluator_calibrate(ev, d, 2);
    T_CHECK(fp8t_evaluator_precision(ev) == FP8T_EVAL_FP8,
            "calibration must restore the precision");
    T_CHECK(!fp8t_evaluator_needs_calibration(ev), "calibrated");
    /* every X and W scale is 448 / the amax the calibration batches recorded */
    int n, len;
    float *s = malloc(fp8t_recipe_state_floats(3 * fp8t_model_num_linears(&w.model), 1024) *
                      sizeof(float));
    fp8t_evaluator_fp8_state(ev, s, &n, &len);
    fp8t_recipe_state st;
    fp8t_recipe_state_view(&st, s, n, len);
    int bad = 0;
    for (int t = 0; t < n; t++) {
        if (t % 3 == FP8T_ROLE_DY) continue;
        float amax = fp8t_recipe_history_max(&st, t);
        bad += !(amax > 0) || st.scale[t] != fp8t_delayed_scale(amax, 1.0f, 448.0f, 0);
    }
    T_CHECK(bad == 0, "%d X/W tensors without a scale from their calibration amax", bad);
    free(s);
    double cal = fp8t_evaluator_loss(ev, d, 3);
    printf("  bf16 %.6f, fp8 with scale 1 %.6f, fp8 calibrated %.6f\n", bf, raw, cal);
    T_CHECK(fabs(raw - bf) > 1e-2 * bf, "scale 1 should have broken FP8 here (loss %.6f)", raw);
    T_CLOSE(cal, bf, 0.0, 1e-2);
    free(w.params);
    fp8t_data_close(d);
    fp8t_evaluator_destroy(ev);
    fp8t_evaluator_destroy(ref);
}

/* ------------------------------------------------------------------ tasks */

/* Logits at the last position of ctx[n] in precision p (host copy into out[V]). */
static void last_logits(fp8t_evaluator *ev, const int *ctx, int n, float *out) {
    const int T = fp8t_evaluator_T(ev), B = fp8t_evaluator_B(ev), V = g_w.model.vocab_size;
    int *tok = calloc((size_t)B * T, sizeof(int));
    memcpy(tok, ctx, (size_t)n * sizeof(int));
    fp8t_model *m = fp8t_evaluator_model(ev);
    fp8t_model_forward(m, tok, NULL);
    g_be->ops->to_host(g_be, out, fp8t_model_logits(m) + (size_t)(n - 1) * V,
                       (size_t)V * sizeof(float));
    free(tok);
}

/* Single-token completions: the model's argmax among the three lowest-logit tokens. The
 * argmax has the lowest loss by definition, so the model must score 100% in the precision
 * the argmax was taken in, and 0% when the label points at a distractor. */
static void test_task_argmax_scores_100(void) {
    const int NEX = 12, CTX = 10, V = g_w.model.vocab_size;
    for (int prec = 0; prec < 2; prec++) {
        fp8t_eval_precision p = prec ? FP8T_EVAL_FP32 : FP8T_EVAL_BF16;
        fp8t_evaluator *one = make_ev(&g_w, 1, CTX), *ev = make_ev(&g_w, 8, 16);
        T_ASSERT(one && ev, "setup");
        fp8t_evaluator_set_precision(one, p);
        fp8t_evaluator_set_precision(ev, p);
        int *stream = malloc((size_t)NEX * CTX * sizeof(int));
        fp8t_synthetic_generate(stream, (size_t)NEX * CTX, 99);
        fp8t_task good = {0}, bad = {0};
        float *lg = malloc((size_t)V * sizeof(float));
        for (int e = 0; e < NEX; e++) {
            const int *ctx = stream + (size_t)e * CTX;
            last_logits(one, ctx, CTX, lg);
            int best = 0;
            for (int v = 1; v < V; v++) best = lg[v] > lg[best] ? v : best;
            int low[3] = {-1, -1, -1}; /* three lowest logits */
            for (int k = 0; k < 3; k++)
                for (int v = 0; v < V; v++) {
                    if (v == best || v == low[0] || v == low[1]) continue;
                    if (low[k] < 0 || lg[v] < lg[low[k]]) low[k] = v;
                }
            int label = e % 4, toks[4], lens[4] = {1, 1, 1, 1};
            const int *comp[4];
            for (int c = 0, k = 0; c < 4; c++) toks[c] = c == label ? best : low[k++];
            for (int c = 0; c < 4; c++) comp[c] = &toks[c];
            T_ASSERT(fp8t_task_add(&good, label, ctx, CTX, 4, comp, lens) == 0, "add");
            T_ASSERT(fp8t_task_add(&bad, (label + 1) % 4, ctx, CTX, 4, comp, lens) == 0, "add");
        }
        int correct = -1, pred[12];
        char err[512];
        T_ASSERT(fp8t_task_eval(ev, &good, &correct, pred, err, sizeof(err)) == 0, "%s", err);
        T_CHECK(correct == NEX, "%s: the argmax task scored %d/%d", fp8t_eval_precision_name(p),
                correct, NEX);
        T_ASSERT(fp8t_task_eval(ev, &bad, &correct, NULL, err, sizeof(err)) == 0, "%s", err);
        T_CHECK(correct == 0, "%s: the distractor-labelled task scored %d/%d",
                fp8t_eval_precision_name(p), correct, NEX);
        free(lg);
        free(stream);
        fp8t_task_free(&good);
        fp8t_task_free(&bad);
        fp8t_evaluator_destroy(one);
        fp8t_evaluator_destroy(ev);
    }
}

/* Multi-token completions of different lengths and counts, packed several examples per
 * micro-batch, must choose what a one-completion-per-forward reference chooses. */
static void test_task_packing_matches_reference(void) {
    const int NEX = 10, T = 24;
    fp8t_task t = {0};
    uint64_t s = 12345;
    int stream[64];
    for (int e = 0; e < NEX; e++) {
        fp8t_synthetic_generate(stream, 64, 500 + (uint64_t)e);
        int ctx_len = 3 + e % 5, nc = 2 + e % 3, lens[4], toks[4][8];
        const int *comp[4];
        for (int c = 0; c < nc; c++) {
            lens[c] = 1 + (c * 3 + e) % 6;
            for (int k = 0; k < lens[c]; k++) {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                /* half the completions continue the synthetic text, half are random bytes */
                toks[c][k] = c % 2 ? stream[ctx_len + k] : (int)((s >> 33) % 256);
            }
            comp[c] = toks[c];
        }
        T_ASSERT(fp8t_task_add(&t, e % nc, stream, ctx_len, nc, comp, lens) == 0, "add");
    }
    T_CHECK(t.max_completions == 4 && t.longest <= T, "task shape %d %d", t.max_completions,
            t.longest);
    fp8t_evaluator *ev = make_ev(&g_w, 8, T), *one = make_ev(&g_w, 1, T);
    T_ASSERT(ev && one, "setup");
    int pred[10], correct;
    char err[512];
    T_ASSERT(fp8t_task_eval(ev, &t, &correct, pred, err, sizeof(err)) == 0, "%s", err);
    int ref_correct = 0, mismatch = 0;
    int tok[24], tgt[24];
    for (int e = 0; e < NEX; e++) {
        const fp8t_task_example *x = &t.ex[e];
        int best = -1;
        double best_loss = 0;
        for (int c = 0; c < x->n_completions; c++) {
            for (int i = 0; i < T; i++) tok[i] = 0, tgt[i] = -1;
            memcpy(tok, x->ctx, (size_t)x->ctx_len * sizeof(int));
            memcpy(tok + x->ctx_len, x->comp[c], (size_t)x->comp_len[c] * sizeof(int));
            for (int k = 0; k < x->comp_len[c]; k++) tgt[x->ctx_len - 1 + k] = x->comp[c][k];
            /* the forward's mean over non-ignored targets is the completion's mean loss */
            double l = fp8t_evaluator_batch_loss(one, tok, tgt);
            if (best < 0 || l < best_loss) best = c, best_loss = l;
        }
        ref_correct += best == x->label;
        mismatch += best != pred[e];
    }
    printf("  accuracy %d/%d (reference %d/%d)\n", correct, NEX, ref_correct, NEX);
    T_CHECK(mismatch == 0, "%d examples chose differently from the reference", mismatch);
    T_CHECK(correct == ref_correct, "accuracy %d vs reference %d", correct, ref_correct);
    /* too small a model is refused with an error, not overrun */
    fp8t_evaluator *small = make_ev(&g_w, 2, T);
    T_CHECK(small && fp8t_task_eval(small, &t, &correct, NULL, err, sizeof(err)) != 0 &&
                strstr(err, "--batch"),
            "B=2 must be refused: %s", err);
    fp8t_evaluator_destroy(small);
    fp8t_evaluator_destroy(ev);
    fp8t_evaluator_destroy(one);
    fp8t_task_free(&t);
}

static void test_task_file_format(void) {
    fp8t_task t = {0};
    int ctx[3] = {1, 2, 65534}, a[2] = {7, 8}, b[1] = {9};
    const int *comp[2] = {a, b};
    int lens[2] = {2, 1};
    T_ASSERT(fp8t_task_add(&t, 1, ctx, 3, 2, comp, lens) == 0, "add");
    T_ASSERT(fp8t_task_add(&t, 0, ctx, 2, 2, comp, lens) == 0, "add");
    T_CHECK(fp8t_task_add(&t, 2, ctx, 2, 2, comp, lens) != 0, "label out of range accepted");
    char path[700], err[512];
    snprintf(path, sizeof(path), "%s/task.bin", g_root);
    T_ASSERT(fp8t_task_write(path, &t, err, sizeof(err)) == 0, "%s", err);
    /* the bytes llm.c's writer produces for these examples */
    char *data;
    size_t len;
    T_ASSERT(fp8t_read_file(path, &data, &len, err, sizeof(err)) == 0, "%s", err);
    const uint16_t ex0[] = {65535, 28, 0, 1, 2, 3, 1, 2, 65534, 2, 7, 8, 1, 9};
    int32_t hdr[4];
    memcpy(hdr, data, sizeof(hdr));
    T_CHECK(hdr[0] == 20240522 && hdr[1] == 1 && hdr[2] == 2 && hdr[3] == 28,
            "header %d %d %d %d", hdr[0], hdr[1], hdr[2], hdr[3]);
    T_CHECK(len == 1024 + 28 + 26, "file size %zu", len);
    T_CHECK(memcmp(data + 1024, ex0, sizeof(ex0)) == 0,
            "example 0 bytes differ from llm.c's layout");
    fp8t_task r;
    T_ASSERT(fp8t_task_read(path, &r, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(r.n == 2 && r.ex[0].label == 1 && r.ex[0].ctx[2] == 65534 && r.ex[1].ctx_len == 2 &&
                r.ex[0].comp_len[0] == 2 && r.ex[0].comp[0][1] == 8 && r.ex[1].comp[1][0] == 9 &&
                r.max_token == 65534 && r.longest == 4,
            "read back differs");
    fp8t_task_free(&r);
    /* damaged copies */
    struct {
        const char *what;
        size_t at;
        uint16_t value;
        size_t cut;
        const char *expect;
    } cases[] = {
        {"magic", 0, 1234, 0, "magic"},           {"start", 1024, 7, 0, "delimiter"},
        {"label", 1024 + 6, 2, 0, "label"},       {"index", 1024 + 4, 5, 0, "index"},
        {"bytes", 1024 + 2, 24, 0, "byte count"}, {"truncated", 0, 0, 1024 + 30, "truncated"},
        {"trailing", 0, 0, 1, "after"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char bad[760];
        snprintf(bad, sizeof(bad), "%s/bad_task_%zu.bin", g_root, k);
        size_t blen = len;
        char *copy = malloc(len + 2);
        memcpy(copy, data, len);
        if (!strcmp(cases[k].what, "trailing")) {
            copy[len] = 0;
            copy[len + 1] = 0;
            blen = len + 2;
        } else if (cases[k].cut)
            blen = cases[k].cut;
        else if (cases[k].at == 0) {
            int32_t m = 1234;
            memcpy(copy, &m, 4);
        } else
            memcpy(copy + cases[k].at, &cases[k].value, 2);
        fp8t_write_file_atomic(bad, copy, blen, err, sizeof(err));
        free(copy);
        int rc = fp8t_task_read(bad, &r, err, sizeof(err));
        printf("  %s: %s\n", cases[k].what, rc ? err : "(accepted!)");
        T_CHECK(rc != 0 && strstr(err, cases[k].expect), "%s: error should mention '%s'",
                cases[k].what, cases[k].expect);
        if (rc == 0) fp8t_task_free(&r);
    }
    free(data);
    fp8t_task_free(&t);
}

/* ------------------------------------------------------------------ sampling */

static void test_sample(void) {
    const float lg[6] = {0.0f, 1.0f, 2.0f, 3.0f, 3.0f, -INFINITY};
    uint64_t rng = fp8t_sample_seed(1);
    T_CHECK(fp8t_sample(lg, 6, 0.0f, 0, &rng) == 3, "greedy: ties go to the lowest id");
    T_CHECK(fp8t_sample(lg, 6, 1.0f, 1, &rng) == 3, "top-k 1 is greedy");
    int counts[6] = {0}, outside = 0;
    const int N = 20000;
    for (int i = 0; i < N; i++) counts[fp8t_sample(lg, 6, 1.0f, 0, &rng)]++;
    double z = 0;
    for (int i = 0; i < 5; i++) z += exp(lg[i]);
    for (int i = 0; i < 5; i++) T_CLOSE((double)counts[i] / N, exp(lg[i]) / z, 0.015, 0.0);
    T_CHECK(counts[5] == 0, "a -inf logit was sampled");
    for (int i = 0; i < N; i++) {
        int v = fp8t_sample(lg, 6, 2.0f, 3, &rng);
        outside += v != 2 && v != 3 && v != 4;
    }
    T_CHECK(outside == 0, "top-k 3 sampled %d tokens outside the top 3", outside);
}

static void test_generate(void) {
    fp8t_evaluator *ev = make_ev(&g_w, 1, 16);
    T_ASSERT(ev, "setup");
    int prompt[5] = {72, 101, 108, 108, 111}, a[24], b[24], c[24], g[24], k1[24];
    char err[512];
    fp8t_sample_cfg s7 = {1.0f, 40, 7}, s8 = {1.0f, 40, 8}, greedy = {0.0f, 0, 7},
                    top1 = {1.0f, 1, 9};
    T_ASSERT(fp8t_generate(ev, prompt, 5, 24, &s7, a, err, sizeof(err)) == 0, "%s", err);
    T_ASSERT(fp8t_generate(ev, prompt, 5, 24, &s7, b, err, sizeof(err)) == 0, "%s", err);
    T_ASSERT(fp8t_generate(ev, prompt, 5, 24, &s8, c, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(memcmp(a, b, sizeof(a)) == 0, "same seed, different text");
    T_CHECK(memcmp(a, c, sizeof(a)) != 0, "different seeds gave identical 24 tokens");
    /* 24 new tokens > T = 16: the window slides; greedy equals top-k 1 */
    T_ASSERT(fp8t_generate(ev, prompt, 5, 24, &greedy, g, err, sizeof(err)) == 0, "%s", err);
    T_ASSERT(fp8t_generate(ev, prompt, 5, 24, &top1, k1, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(memcmp(g, k1, sizeof(g)) == 0, "greedy and top-k 1 differ");
    /* the first greedy token is the argmax after the prompt */
    float *lg = malloc(256 * sizeof(float));
    last_logits(ev, prompt, 5, lg);
    int best = 0;
    for (int v = 1; v < 256; v++) best = lg[v] > lg[best] ? v : best;
    T_CHECK(g[0] == best, "first greedy token %d, argmax %d", g[0], best);
    free(lg);
    int badp[2] = {1, 300};
    T_CHECK(fp8t_generate(ev, badp, 2, 3, &s7, a, err, sizeof(err)) != 0 &&
                strstr(err, "vocabulary"),
            "out-of-vocabulary prompt accepted");
    fp8t_evaluator_destroy(ev);
}

static void test_tokenizer_file(void) {
    char path[700], err[512];
    snprintf(path, sizeof(path), "%s/tok.bin", g_root);
    uint8_t buf[1024 + 64] = {0};
    uint32_t hdr[4] = {20240328, 2, 3, 2};
    memcpy(buf, hdr, sizeof(hdr));
    size_t o = 1024;
    const char *pieces[3] = {"a", " hello", "<|eot|>"};
    for (int i = 0; i < 3; i++) {
        buf[o++] = (uint8_t)strlen(pieces[i]);
        memcpy(buf + o, pieces[i], strlen(pieces[i]));
        o += strlen(pieces[i]);
    }
    T_ASSERT(fp8t_write_file_atomic(path, buf, o, err, sizeof(err)) == 0, "%s", err);
    fp8t_tokenizer t;
    T_ASSERT(fp8t_tokenizer_read(path, &t, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(t.vocab_size == 3 && t.eot == 2 && t.piece_len[1] == 6 &&
                !strcmp(t.piece[1], " hello"),
            "pieces");
    fp8t_tokenizer_free(&t);
    T_CHECK(fp8t_write_file_atomic(path, buf, o - 2, err, sizeof(err)) == 0 &&
                fp8t_tokenizer_read(path, &t, err, sizeof(err)) != 0 && strstr(err, "truncated"),
            "truncated tokenizer: %s", err);
    buf[1024] = 0;
    T_CHECK(fp8t_write_file_atomic(path, buf, o, err, sizeof(err)) == 0 &&
                fp8t_tokenizer_read(path, &t, err, sizeof(err)) != 0 && strstr(err, "length 0"),
            "zero-length token: %s", err);
    buf[0] = 1;
    T_CHECK(fp8t_write_file_atomic(path, buf, o, err, sizeof(err)) == 0 &&
                fp8t_tokenizer_read(path, &t, err, sizeof(err)) != 0 && strstr(err, "magic"),
            "bad magic: %s", err);
}

int main(void) {
    t_suite = "eval";
    char err[512];
    tu_tmpdir(g_root, sizeof(g_root), "eval");
    snprintf(g_ckpt, sizeof(g_ckpt), "%s/run/checkpoints/step_000006", g_root);
    g_be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    if (!g_be || tu_train_checkpoint("tiny", 6, g_ckpt) != 0 ||
        fp8t_weights_load(g_ckpt, &g_w, err, sizeof(err)) != 0) {
        printf("FAIL eval: setup: %s\n", err);
        return 1;
    }
    T_RUN(test_fp8_eval_uses_and_keeps_state);
    T_RUN(test_calibration_of_fresh_state);
    T_RUN(test_task_argmax_scores_100);
    T_RUN(test_task_packing_matches_reference);
    T_RUN(test_task_file_format);
    T_RUN(test_sample);
    T_RUN(test_generate);
    T_RUN(test_tokenizer_file);
    fp8t_weights_free(&g_w);
    fp8t_backend_destroy(g_be);
    if (t_failed_total == 0) fp8t_rmtree(g_root);
    T_MAIN_END();
}
