/* The inference model (include/fp8train/infer.h) on the CPU backend: the KV cache ops against
 * attention_forward, the FP32 inference forward against the training model's, cached
 * generation against the no-cache path (fp8t_generate: the training model's full-window
 * forward) at temperature 0 for GPT-2 and Llama with grouped-query attention, a batch of
 * prompts of different lengths against each prompt alone, FP8/BF16 weights and their memory,
 * and the learned (delayed) activation scales of a trained checkpoint. */
#include <math.h>

#include "fp8train/eval.h"
#include "fp8train/fp8.h"
#include "fp8train/infer.h"
#include "test.h"
#include "export_test_util.h"
#include "test_rng.h"

static fp8t_backend *g_be;

/* a standard normal sample (Box-Muller on the test's stream) */
static double normal(void) {
    const double u = rng_uniform() + 1e-300, v = rng_uniform();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* weights of cfg, initialized by the training model's init (seed), as fp8t_weights */
static int make_weights(const fp8t_model_config *cfg, uint64_t seed, fp8t_weights *w) {
    char err[512];
    memset(w, 0, sizeof(*w));
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    fp8t_model *m = fp8t_model_create(g_be, cfg, &pol, NULL, 1, 8, err, sizeof(err));
    if (!m) {
        printf("  model: %s\n", err);
        return -1;
    }
    fp8t_model_init_weights(m, seed);
    w->model = *cfg;
    w->num_params = fp8t_model_num_params(m);
    w->params = malloc(w->num_params * sizeof(float));
    g_be->ops->to_host(g_be, w->params, fp8t_model_params(m), w->num_params * sizeof(float));
    /* init gives zero biases and unit norms; perturb them so the test reads them */
    fp8t_param_info info[64];
    int n = fp8t_model_param_table(cfg, info, NULL);
    for (int i = 0; i < n; i++)
        if (info[i].ndim == 1)
            for (size_t j = 0; j < info[i].numel; j++)
                w->params[info[i].offset + j] += 0.1f * (float)normal();
    snprintf(w->source, sizeof(w->source), "test weights");
    fp8t_model_destroy(m);
    return 0;
}

static void cfg_gpt2(fp8t_model_config *c) {
    fp8t_model_preset(c, "tiny");
    c->n_layer = 2;
    c->n_embd = 64;
    c->n_head = 4;
    c->seq_len = 64;
    c->mlp_hidden = 256;
}

/* Llama with GQA (8 query heads, 2 K/V heads), RoPE, q/k/v biases and an untied head */
static void cfg_llama(fp8t_model_config *c) {
    fp8t_model_preset(c, "tiny-llama");
    c->n_layer = 2;
    c->n_embd = 64;
    c->n_head = 8;
    c->n_kv_head = 2;
    c->seq_len = 64;
    c->mlp_hidden = 192;
    c->qkv_bias = 1;
    c->untied_head = 1;
}

/* arch 0: cfg_gpt2, 1: cfg_llama */
static void cfg_arch(fp8t_model_config *c, int arch) {
    if (arch)
        cfg_llama(c);
    else
        cfg_gpt2(c);
}

static fp8t_infer *make_infer(const fp8t_weights *w, fp8t_eval_precision p, fp8t_act_scale a,
                              int B, int T) {
    char err[512];
    fp8t_infer *m = fp8t_infer_create(g_be, w, p, a, B, T, err, sizeof(err));
    if (!m) printf("  infer: %s\n", err);
    return m;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double d = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= d)) d = e; /* NaN sticks */
    }
    return d;
}

static double max_abs(const float *a, size_t n) {
    double d = 0.0;
    for (size_t i = 0; i < n; i++) d = fabs((double)a[i]) > d ? fabs((double)a[i]) : d;
    return d;
}

/* ------------------------------------------------------------------ the backend ops */

/* attention_decode at position t with the cache holding 0..t-1 from kv_cache_write gives
 * attention_forward's row t, FP32 cache; a BF16 cache gives the same within BF16 rounding of
 * K and V, an FP8 one within E4M3's. Sequences at different positions in one call. */
static void check_decode_op(int NH, int NKV, float theta) {
    const int B = 3, T = 19, HS = 16, Tmax = 24;
    fp8t_attn_shape s = {B, T, NH, NKV, HS, theta, {0}, NULL};
    const int W = fp8t_attn_qkv_width(&s);
    const fp8t_backend_ops *o = g_be->ops;
    float *qkv = o->malloc(g_be, (size_t)B * T * W * sizeof(float));
    float *ref = o->malloc(g_be, (size_t)B * T * NH * HS * sizeof(float));
    float *lse = o->malloc(g_be, (size_t)B * NH * T * sizeof(float));
    float *row = o->malloc(g_be, (size_t)B * W * sizeof(float));
    float *out = o->malloc(g_be, (size_t)B * NH * HS * sizeof(float));
    int *pos = o->malloc(g_be, (size_t)B * sizeof(int));
    const size_t kvb = (size_t)B * NKV * fp8t_kv_head_bytes(FP8T_KV_FP32, Tmax, HS);
    float *kc = o->malloc(g_be, kvb), *vc = o->malloc(g_be, kvb); /* FP32's: the largest */
    for (size_t i = 0; i < (size_t)B * T * W; i++) qkv[i] = (float)normal();
    o->attention_forward(g_be, ref, lse, NULL, qkv, &s);
    for (int bf = 0; bf < 3; bf++) {
        /* the prefill of all T tokens, then decode each sequence's token p again at its own
         * position (p = 18, 7, 0): the cache's later positions must not matter */
        const int P[3] = {18, 7, 0};
        o->kv_cache_write(g_be, kc, vc, bf, qkv, &s, Tmax);
        for (int b = 0; b < B; b++) {
            memcpy(row + (size_t)b * W, qkv + ((size_t)b * T + P[b]) * W, (size_t)W * 4);
            pos[b] = P[b];
        }
        fp8t_attn_shape d = s;
        d.T = 1;
        o->attention_decode(g_be, out, kc, vc, bf, row, pos, &d, Tmax);
        double worst = 0.0;
        for (int b = 0; b < B; b++) {
            const float *r = ref + ((size_t)b * T + P[b]) * NH * HS;
            double e = max_abs_diff(out + (size_t)b * NH * HS, r, (size_t)NH * HS);
            worst = e > worst ? e : worst;
        }
        /* FP32: summation order only; BF16: K, V rounded to 8 bits (2^-9 relative); E4M3 to
         * 4 bits (2^-4 relative at most, per element; measured 0.07 at worst here) */
        const double tol = bf == FP8T_KV_FP8 ? 0.2 : bf ? 2e-2 : 2e-5;
        T_CHECK(worst <= tol, "NH %d NKV %d theta %g cache kind %d: max diff %g", NH, NKV,
                (double)theta, bf, worst);
        if (bf == FP8T_KV_FP8 && theta == 0.0f) {
            /* V (and K: no RoPE) of position t: E4M3 codes of x * scale, scale from the
             * position's amax, scale_inv after the block's codes */
            int bad = 0;
            const size_t hb = fp8t_kv_head_bytes(FP8T_KV_FP8, Tmax, HS);
            for (int b = 0; b < B; b++)
                for (int g = 0; g < NKV; g++)
                    for (int t = 0; t < T; t++)
                        for (int kv = 0; kv < 2; kv++) {
                            /* (the decoded row at P[b] is the prefill's row P[b] again) */
                            const float *x =
                                qkv + ((size_t)b * T + t) * W + (size_t)(NH + kv * NKV + g) * HS;
                            const uint8_t *blk =
                                (const uint8_t *)(kv ? vc : kc) + ((size_t)b * NKV + g) * hb;
                            const float sc =
                                fp8t_current_scale(fp8_amax(x, HS), FP8_E4M3_MAX, 0.0f, 0);
                            for (int i = 0; i < HS; i++)
                                bad +=
                                    blk[(size_t)t * HS + i] != fp8_encode(x[i] * sc, FP8_E4M3, 1);
                            const float *sv =
                                (const float *)(blk + fp8t_kv_scale_offset(Tmax, HS));
                            const float si = sv[t];
                            bad += si != 1.0f / sc;
                        }
            T_CHECK(bad == 0, "NH %d NKV %d: %d FP8 cache codes or scales differ", NH, NKV, bad);
        }
    }
    float *bufs[] = {qkv, ref, lse, row, out, kc, vc};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) o->free(g_be, bufs[i]);
    o->free(g_be, pos);
}

static void test_decode_op_matches_attention_forward(void) {
    check_decode_op(4, 4, 0.0f);      /* GPT-2: multi-head, no RoPE */
    check_decode_op(4, 2, 10000.0f);  /* GQA + RoPE */
    check_decode_op(4, 1, 500000.0f); /* multi-query */
}

/* qkv_bias: each forward attention op given the bias gives the bits of the same op on qkv
 * with bias_add applied first (its one FP32 add), for every cache kind */
static void check_qkv_bias_op(int NH, int NKV, float theta) {
    const int B = 3, T = 19, HS = 16, Tmax = 24;
    fp8t_attn_shape s = {B, T, NH, NKV, HS, theta, {0}, NULL};
    const int W = fp8t_attn_qkv_width(&s);
    const fp8t_backend_ops *o = g_be->ops;
    const size_t n = (size_t)B * T * W, nout = (size_t)B * T * NH * HS;
    float *qkv = o->malloc(g_be, n * 4), *added = o->malloc(g_be, n * 4);
    float *bias = o->malloc(g_be, (size_t)W * 4);
    float *out[2], *lse[2], *dec[2];
    void *kc[2], *vc[2];
    const size_t kvb = (size_t)B * NKV * fp8t_kv_head_bytes(FP8T_KV_FP32, Tmax, HS);
    for (int k = 0; k < 2; k++) {
        out[k] = o->malloc(g_be, nout * 4), lse[k] = o->malloc(g_be, (size_t)B * NH * T * 4);
        dec[k] = o->malloc(g_be, (size_t)B * NH * HS * 4);
        kc[k] = o->malloc(g_be, kvb), vc[k] = o->malloc(g_be, kvb);
    }
    for (size_t i = 0; i < n; i++) qkv[i] = (float)normal();
    for (int i = 0; i < W; i++) bias[i] = (float)normal();
    memcpy(added, qkv, n * 4);
    o->bias_add(g_be, added, bias, B * T, W);
    int pos[3] = {18, 7, 0};
    for (int bf = 0; bf < 3; bf++) {
        for (int k = 0; k < 2; k++) { /* k 0: the bias given; 1: added before */
            fp8t_attn_shape sk = s;
            sk.qkv_bias = k ? NULL : bias;
            const float *in = k ? added : qkv;
            memset(kc[k], 0, kvb), memset(vc[k], 0, kvb);
            o->attention_forward(g_be, out[k], lse[k], NULL, in, &sk);
            o->kv_cache_write(g_be, kc[k], vc[k], bf, in, &sk, Tmax);
            sk.T = 1; /* decode the first rows again, each at its own position */
            o->attention_decode(g_be, dec[k], kc[k], vc[k], bf, in, pos, &sk, Tmax);
        }
        T_CHECK(!memcmp(out[0], out[1], nout * 4) &&
                    !memcmp(lse[0], lse[1], (size_t)B * NH * T * 4),
                "NH %d NKV %d theta %g: attention_forward with qkv_bias differs", NH, NKV,
                (double)theta);
        const size_t cb = (size_t)B * NKV * fp8t_kv_head_bytes(bf, Tmax, HS);
        T_CHECK(!memcmp(kc[0], kc[1], cb) && !memcmp(vc[0], vc[1], cb),
                "NH %d NKV %d theta %g cache kind %d: the cache written with qkv_bias differs",
                NH, NKV, (double)theta, bf);
        T_CHECK(!memcmp(dec[0], dec[1], (size_t)B * NH * HS * 4),
                "NH %d NKV %d theta %g cache kind %d: attention_decode with qkv_bias differs", NH,
                NKV, (double)theta, bf);
    }
    /* and the bias is read: without it the output moves */
    fp8t_attn_shape sn = s;
    o->attention_forward(g_be, out[0], lse[0], NULL, qkv, &sn);
    T_CHECK(memcmp(out[0], out[1], nout * 4) != 0, "the bias changed nothing");
    for (int k = 0; k < 2; k++) {
        o->free(g_be, out[k]), o->free(g_be, lse[k]), o->free(g_be, dec[k]);
        o->free(g_be, kc[k]), o->free(g_be, vc[k]);
    }
    o->free(g_be, qkv), o->free(g_be, added), o->free(g_be, bias);
}

static void test_qkv_bias_equals_bias_add(void) {
    check_qkv_bias_op(4, 4, 0.0f);     /* GPT-2 */
    check_qkv_bias_op(4, 2, 10000.0f); /* GQA + RoPE */
}

/* embedding_forward_bf16 on a BF16 table with padded rows = embedding_forward on the widened
 * table, bit for bit, without and with positions; with per-row positions = each row's
 * embedding plus its position's row (accumulate) */
static void test_embedding_bf16_op(void) {
    const int V = 37, C = 21, ld = 24, B = 3, T = 5;
    const fp8t_backend_ops *o = g_be->ops;
    uint16_t *t16 = o->malloc(g_be, (size_t)V * ld * 2);
    float *t32 = o->malloc(g_be, (size_t)V * C * 4), *wpe = o->malloc(g_be, (size_t)T * C * 4);
    float *a = o->malloc(g_be, (size_t)B * T * C * 4),
          *b = o->malloc(g_be, (size_t)B * T * C * 4);
    int *tok = o->malloc(g_be, (size_t)B * T * sizeof(int));
    int *pos = o->malloc(g_be, (size_t)B * T * sizeof(int));
    for (int v = 0; v < V; v++)
        for (int c = 0; c < ld; c++) {
            t16[(size_t)v * ld + c] = c < C ? bf16_encode((float)normal()) : 0x7FC0; /* NaN pad */
            if (c < C) t32[(size_t)v * C + c] = bf16_decode(t16[(size_t)v * ld + c]);
        }
    for (int i = 0; i < T * C; i++) wpe[i] = (float)normal();
    for (int i = 0; i < B * T; i++) tok[i] = (i * 11 + 3) % V;
    for (int k = 0; k < 2; k++) {
        o->embedding_forward(g_be, a, tok, t32, k ? wpe : NULL, B, T, C);
        o->embedding_forward_bf16(g_be, b, tok, t16, ld, k ? wpe : NULL, NULL, B, T, C);
        T_CHECK(!memcmp(a, b, (size_t)B * T * C * 4), "with%s positions: differs",
                k ? "" : "out");
    }
    for (int i = 0; i < B * T; i++) pos[i] = (i * 7 + 2) % T;
    o->embedding_forward(g_be, a, tok, t32, NULL, B * T, 1, C);
    for (int i = 0; i < B * T; i++)
        o->accumulate(g_be, a + (size_t)i * C, wpe + (size_t)pos[i] * C, (size_t)C);
    o->embedding_forward_bf16(g_be, b, tok, t16, ld, wpe, pos, B * T, 1, C);
    T_CHECK(!memcmp(a, b, (size_t)B * T * C * 4), "per-row positions: differs");
    o->free(g_be, t16), o->free(g_be, t32), o->free(g_be, wpe), o->free(g_be, a);
    o->free(g_be, b), o->free(g_be, tok), o->free(g_be, pos);
}

/* ------------------------------------------------------------------ FP32: the reference */

/* the full-window FP32 inference forward gives the training model's logits */
static void check_forward_matches_training(const fp8t_model_config *cfg) {
    char err[512];
    fp8t_weights w;
    T_ASSERT(make_weights(cfg, 5, &w) == 0, "weights");
    const int B = 2, T = 16, V = cfg->vocab_size;
    fp8t_evaluator *ev = fp8t_evaluator_create(g_be, &w, NULL, B, T, err, sizeof(err));
    fp8t_infer *m = make_infer(&w, FP8T_EVAL_FP32, FP8T_ACT_SCALE_CURRENT, B, T);
    T_ASSERT(ev && m, "setup: %s", err);
    fp8t_evaluator_set_precision(ev, FP8T_EVAL_FP32);
    int tok[2 * 16];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 37 + 11) % V;
    fp8t_model_forward(fp8t_evaluator_model(ev), tok, NULL);
    float *ref = malloc((size_t)B * T * V * sizeof(float));
    float *got = malloc((size_t)B * T * V * sizeof(float));
    g_be->ops->to_host(g_be, ref, fp8t_model_logits(fp8t_evaluator_model(ev)),
                       (size_t)B * T * V * sizeof(float));
    T_ASSERT(fp8t_infer_forward_all(m, tok, B, T, got, err, sizeof(err)) == 0, "%s", err);
    const double e = max_abs_diff(got, ref, (size_t)B * T * V),
                 a = max_abs(ref, (size_t)B * T * V);
    /* the same FP32 arithmetic up to the order of a few sums */
    T_CHECK(e <= 1e-5 * (a > 1 ? a : 1), "%s: max |diff| %g (max |logit| %g)",
            fp8t_arch_name(cfg->arch), e, a);
    free(ref);
    free(got);
    fp8t_infer_destroy(m);
    fp8t_evaluator_destroy(ev);
    fp8t_weights_free(&w);
}

static void test_fp32_forward_matches_training_model(void) {
    fp8t_model_config c;
    cfg_gpt2(&c);
    check_forward_matches_training(&c);
    cfg_llama(&c);
    check_forward_matches_training(&c);
}

/* Greedy generation with the cache = fp8t_generate without it, token for token; and each
 * decode step's logits = the full-window forward's logits at that position. */
static void check_cached_generation(const fp8t_model_config *cfg) {
    char err[512];
    fp8t_weights w;
    T_ASSERT(make_weights(cfg, 11, &w) == 0, "weights");
    const int n_prompt = 5, n_new = 30, V = cfg->vocab_size;
    const int prompt[5] = {3, 141, 59, 26, 5};
    fp8t_evaluator *ev =
        fp8t_evaluator_create(g_be, &w, NULL, 1, n_prompt + n_new, err, sizeof(err));
    fp8t_infer *m = make_infer(&w, FP8T_EVAL_FP32, FP8T_ACT_SCALE_CURRENT, 1, n_prompt + n_new);
    T_ASSERT(ev && m, "setup: %s", err);
    fp8t_evaluator_set_precision(ev, FP8T_EVAL_FP32);
    fp8t_sample_cfg greedy = {0.0f, 0, 1};
    int ref[30], got[30];
    T_ASSERT(fp8t_generate(ev, prompt, n_prompt, n_new, &greedy, ref, err, sizeof(err)) == 0,
             "%s", err);
    const int *pp = prompt;
    T_ASSERT(fp8t_infer_generate(m, &pp, &n_prompt, 1, n_new, &greedy, got, err, sizeof(err)) ==
                 0,
             "%s", err);
    int same = 0;
    while (same < n_new && got[same] == ref[same]) same++;
    T_CHECK(same == n_new, "%s: cached and uncached greedy tokens differ at %d (%d vs %d)",
            fp8t_arch_name(cfg->arch), same, same < n_new ? got[same] : -1,
            same < n_new ? ref[same] : -1);
    /* the logits the decode steps saw, against the full window over the same tokens */
    int seq[35];
    memcpy(seq, prompt, sizeof(prompt));
    memcpy(seq + n_prompt, got, sizeof(got));
    const int T = n_prompt + n_new - 1;
    float *all = malloc((size_t)T * V * sizeof(float)), *step = malloc((size_t)V * sizeof(float));
    T_ASSERT(fp8t_infer_forward_all(m, seq, 1, T, all, err, sizeof(err)) == 0, "%s", err);
    int len = n_prompt;
    T_ASSERT(fp8t_infer_prefill(m, seq, 1, n_prompt, &len, step, err, sizeof(err)) == 0, "%s",
             err);
    double worst = max_abs_diff(step, all + (size_t)(n_prompt - 1) * V, (size_t)V);
    for (int p = n_prompt; p < T; p++) {
        T_ASSERT(fp8t_infer_decode(m, &seq[p], &p, 1, step, err, sizeof(err)) == 0, "%s", err);
        double e = max_abs_diff(step, all + (size_t)p * V, (size_t)V);
        worst = e > worst ? e : worst;
    }
    T_CHECK(worst <= 1e-5 * (1 + max_abs(all, (size_t)T * V)), "%s: decode logits differ by %g",
            fp8t_arch_name(cfg->arch), worst);
    free(all);
    free(step);
    fp8t_infer_destroy(m);
    fp8t_evaluator_destroy(ev);
    fp8t_weights_free(&w);
}

static void test_cached_generation_equals_uncached(void) {
    fp8t_model_config c;
    cfg_gpt2(&c);
    check_cached_generation(&c);
    cfg_llama(&c);
    check_cached_generation(&c);
}

/* prompts of 1, 9 and 4 tokens in one batch: each sequence's tokens are those it gets alone
 * (greedy), and sampled sequence 0 those of a batch of one (its own random stream) */
static void check_batch(const fp8t_model_config *cfg) {
    char err[512];
    fp8t_weights w;
    T_ASSERT(make_weights(cfg, 17, &w) == 0, "weights");
    const int n_new = 12, lens[3] = {1, 9, 4};
    const int p0[1] = {7}, p1[9] = {1, 2, 3, 200, 5, 6, 7, 8, 9}, p2[4] = {250, 0, 17, 17};
    const int *prompts[3] = {p0, p1, p2};
    fp8t_infer *m = make_infer(&w, FP8T_EVAL_FP32, FP8T_ACT_SCALE_CURRENT, 3, 9 + n_new);
    T_ASSERT(m, "setup");
    int batch[3 * 12], alone[12];
    const fp8t_sample_cfg cfgs[2] = {{0.0f, 0, 1}, {0.8f, 20, 42}};
    for (int k = 0; k < 2; k++) {
        T_ASSERT(fp8t_infer_generate(m, prompts, lens, 3, n_new, &cfgs[k], batch, err,
                                     sizeof(err)) == 0,
                 "%s", err);
        for (int i = 0; i < (k ? 1 : 3); i++) {
            T_ASSERT(fp8t_infer_generate(m, &prompts[i], &lens[i], 1, n_new, &cfgs[k], alone, err,
                                         sizeof(err)) == 0,
                     "%s", err);
            T_CHECK(!memcmp(alone, batch + i * n_new, sizeof(alone)),
                    "%s: sequence %d (%d prompt tokens, temperature %g) differs in a batch",
                    fp8t_arch_name(cfg->arch), i, lens[i], (double)cfgs[k].temperature);
        }
    }
    fp8t_infer_destroy(m);
    fp8t_weights_free(&w);
}

static void test_batch_equals_each_prompt_alone(void) {
    fp8t_model_config c;
    cfg_gpt2(&c);
    check_batch(&c);
    cfg_llama(&c);
    check_batch(&c);
}

/* ------------------------------------------------------------------ BF16 and FP8 */

/* cosine similarity of two vectors */
static double cosine(const float *a, const float *b, size_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++)
        ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / sqrt(aa * bb);
}

/* BF16 and FP8 logits follow FP32's; FP8 weights take half BF16's bytes, BF16's KV cache half
 * FP32's; with no FP32 state beside them */
static void test_bf16_fp8_precisions_and_memory(void) {
    char err[512];
    fp8t_model_config c;
    cfg_llama(&c);
    fp8t_weights w;
    T_ASSERT(make_weights(&c, 23, &w) == 0, "weights");
    const int B = 2, T = 16, V = c.vocab_size;
    int tok[32];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 91 + 3) % V;
    float *lg[3];
    fp8t_infer_memory mem[3];
    const fp8t_eval_precision P[3] = {FP8T_EVAL_FP32, FP8T_EVAL_BF16, FP8T_EVAL_FP8};
    for (int i = 0; i < 3; i++) {
        fp8t_infer *m = make_infer(&w, P[i], FP8T_ACT_SCALE_CURRENT, B, T);
        T_ASSERT(m, "create %s", fp8t_eval_precision_name(P[i]));
        lg[i] = malloc((size_t)B * T * V * sizeof(float));
        T_ASSERT(fp8t_infer_forward_all(m, tok, B, T, lg[i], err, sizeof(err)) == 0, "%s", err);
        fp8t_infer_memory_get(m, &mem[i]);
        fp8t_infer_destroy(m);
    }
    const size_t n = (size_t)B * T * V;
    const double cb = cosine(lg[1], lg[0], n), c8 = cosine(lg[2], lg[0], n);
    /* BF16 operands: ~2^-9 relative per element; E4M3: ~2^-4 per element, averaging out */
    T_CHECK(cb > 0.9999, "bf16 logits cosine to fp32 %g", cb);
    T_CHECK(c8 > 0.99, "fp8 logits cosine to fp32 %g", c8);
    T_CHECK(c8 < 1.0 && max_abs_diff(lg[2], lg[1], n) > 0, "fp8 logits equal bf16's: not FP8");
    /* linear weights: E4M3 codes (1 byte) + the BF16 head, against BF16 everywhere */
    size_t head16 = fp8t_bf16_bytes(V, c.n_embd);
    T_CHECK(mem[2].weights - head16 < (mem[1].weights - head16) * 6 / 10,
            "fp8 linear weights %zu bytes, bf16 %zu", mem[2].weights - head16,
            mem[1].weights - head16);
    T_CHECK(mem[1].kv_cache * 2 == mem[0].kv_cache, "kv cache bf16 %zu fp32 %zu", mem[1].kv_cache,
            mem[0].kv_cache);
    for (int i = 0; i < 3; i++) free(lg[i]);
    fp8t_weights_free(&w);
}

/* A trained FP8 checkpoint's learned X scales drive --act-scale delayed, close to current
 * scaling; weights without an FP8 state are refused with the way out in the message. */
static void test_delayed_activation_scales(void) {
    char err[512], root[512], ck[600];
    tu_tmpdir(root, sizeof(root), "infer");
    snprintf(ck, sizeof(ck), "%s/ckpt", root);
    T_ASSERT(tu_train_checkpoint("tiny", 6, ck) == 0, "train");
    fp8t_weights w;
    T_ASSERT(fp8t_weights_load(ck, &w, err, sizeof(err)) == 0, "%s", err);
    const int B = 2, T = 16, V = w.model.vocab_size;
    int tok[32];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 13 + 1) % V;
    float *lg[3];
    const fp8t_eval_precision P[3] = {FP8T_EVAL_FP32, FP8T_EVAL_FP8, FP8T_EVAL_FP8};
    const fp8t_act_scale A[3] = {FP8T_ACT_SCALE_CURRENT, FP8T_ACT_SCALE_CURRENT,
                                 FP8T_ACT_SCALE_DELAYED};
    for (int i = 0; i < 3; i++) {
        fp8t_infer *m = make_infer(&w, P[i], A[i], B, T);
        T_ASSERT(m, "create %d", i);
        lg[i] = malloc((size_t)B * T * V * sizeof(float));
        T_ASSERT(fp8t_infer_forward_all(m, tok, B, T, lg[i], err, sizeof(err)) == 0, "%s", err);
        fp8t_infer_destroy(m);
    }
    const size_t n = (size_t)B * T * V;
    T_CHECK(cosine(lg[2], lg[0], n) > 0.99, "delayed fp8 cosine %g", cosine(lg[2], lg[0], n));
    T_CHECK(max_abs_diff(lg[2], lg[1], n) > 0, "delayed and current scales gave the same bits");
    /* no state: refused */
    free(w.fp8_state);
    w.fp8_state = NULL;
    fp8t_infer *bad = fp8t_infer_create(g_be, &w, FP8T_EVAL_FP8, FP8T_ACT_SCALE_DELAYED, B, T,
                                        err, sizeof(err));
    T_CHECK(!bad && strstr(err, "--act-scale current"), "no state: %s", bad ? "accepted" : err);
    fp8t_infer_destroy(bad);
    for (int i = 0; i < 3; i++) free(lg[i]);
    fp8t_weights_free(&w);
    fp8t_rmtree(root);
}

/* A view of the CPU backend that counts gemm_tn_bf16_out's calls and, with g_no_mlp16, says it
 * makes no operand from BF16 activation inputs (x_16): the inference model then keeps FP32
 * hidden values in its MLP, as the training model does */
static int g_tn16_calls, g_no_mlp16;
static fp8t_backend_ops tn16_ops;
static const fp8t_backend_ops *cpu_ops_of;
static void tn16_gemm(fp8t_backend *b, uint16_t *C16, const fp8t_fp8_operand *A8,
                      const fp8t_fp8_operand *B8, const fp8t_bf16_operand *A16,
                      const fp8t_bf16_operand *B16, int M, int N, int K, int fast) {
    g_tn16_calls++;
    cpu_ops_of->gemm_tn_bf16_out(b, C16, A8, B8, A16, B16, M, N, K, fast);
}
static int tn16_fuses(fp8t_backend *b, const fp8t_operand_req *r) {
    return g_no_mlp16 && r->x_16 ? 0 : cpu_ops_of->make_operand_fuses(b, r);
}

static fp8t_backend tn16_backend(void) {
    cpu_ops_of = g_be->ops;
    tn16_ops = *g_be->ops;
    tn16_ops.gemm_tn_bf16_out = tn16_gemm, tn16_ops.make_operand_fuses = tn16_fuses;
    fp8t_backend tb = *g_be;
    tb.ops = &tn16_ops;
    return tb;
}

/* fp8t_infer_loss = the training model's loss of the same batch, FP32 and BF16: the same
 * roundings of the same operands (BF16 operands, FP32 accumulation) in both models, so only
 * the order of a few sums differs (measured: 3e-8 relative), where the inference model keeps
 * FP32 hidden values in its MLP as training does (a backend view without the BF16-input
 * activation kernels). By default fc1 writes BF16 values, one rounding more (measured: 1.3e-6
 * relative in this loss). The inference model's BF16 embedding table rounds wte (2^-9 relative
 * per element, 2e-6 in this loss), so wte is made BF16-exact here to compare everything else
 * tightly. */
static void test_loss_matches_training_model(void) {
    char err[512];
    fp8t_model_config c;
    cfg_gpt2(&c);
    fp8t_weights w;
    T_ASSERT(make_weights(&c, 29, &w) == 0, "weights");
    bf16_round(w.params, w.params, (size_t)c.vocab_size * c.n_embd); /* wte: the table's first */
    const int B = 2, T = 16, V = c.vocab_size;
    int tok[32], tgt[32];
    for (int i = 0; i < B * T; i++)
        tok[i] = (i * 53 + 7) % V, tgt[i] = i % 7 == 3 ? -1 : (i * 29 + 1) % V;
    fp8t_evaluator *ev = fp8t_evaluator_create(g_be, &w, NULL, B, T, err, sizeof(err));
    T_ASSERT(ev, "%s", err);
    const fp8t_eval_precision P[2] = {FP8T_EVAL_FP32, FP8T_EVAL_BF16};
    fp8t_backend tb = tn16_backend();
    for (int i = 0; i < 2; i++) {
        fp8t_evaluator_set_precision(ev, P[i]);
        const double ref = fp8t_evaluator_batch_loss(ev, tok, tgt);
        for (int k = 0; k < 2; k++) {
            g_no_mlp16 = k;
            fp8t_infer *m =
                fp8t_infer_create(&tb, &w, P[i], FP8T_ACT_SCALE_CURRENT, B, T, err, sizeof(err));
            T_ASSERT(m, "create: %s", err);
            const double got = fp8t_infer_loss(m, tok, tgt, B, T, err, sizeof(err));
            T_CLOSE(got, ref, 0.0, k || i == 0 ? 1e-6 : 1e-5);
            fp8t_infer_destroy(m);
        }
    }
    g_no_mlp16 = 0;
    fp8t_evaluator_destroy(ev);
    fp8t_weights_free(&w);
}

/* ------------------------------------------------------------------ passes, scales, graphs */

/* The prefill and the full window run whole sequences `rows` tokens at a time: one sequence
 * per pass gives the logits of one pass over all of them (rows are independent in every op
 * but attention, which is per sequence); in fp32 and in fp8 with calibrated (fixed) scales.
 * Likewise the MLP in chunks of `mlp_rows` within a pass (13 rows: chunks that cut sequences
 * and a last one shorter; the calibration's batches of 12 rows are one chunk, since its
 * forward runs current scaling, whose amax would be each chunk's own). */
static void check_passes(const fp8t_model_config *cfg, fp8t_eval_precision p) {
    char err[512];
    fp8t_weights w;
    T_ASSERT(make_weights(cfg, 31, &w) == 0, "weights");
    const int B = 3, T = 12, V = cfg->vocab_size, lens[3] = {12, 5, 9};
    int tok[36], tgt[36];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 17 + 5) % V, tgt[i] = (i * 7 + 1) % V;
    float *lg[3], *pf[3], *dc[3];
    double loss[3];
    for (int k = 0; k < 3; k++) {
        fp8t_infer_opts o;
        fp8t_infer_opts_default(&o, p, FP8T_ACT_SCALE_CALIBRATED);
        o.rows = k == 1 ? T + 1 : 0;  /* one sequence per pass, or all at once */
        o.mlp_rows = k == 2 ? 13 : 0; /* the MLP 13 rows at a time */
        fp8t_infer *m = fp8t_infer_create_opts(g_be, &w, &o, B, T + 1, err, sizeof(err));
        T_ASSERT(m, "%s", err);
        /* calibration batches of one sequence: one pass in both (current scaling's amax is
         * a pass's own, so the calibrating forward itself depends on the passes) */
        T_ASSERT(fp8t_infer_calibrate(m, tok, B, 1, T, err, sizeof(err)) == 0, "%s", err);
        lg[k] = malloc((size_t)B * T * V * 4), pf[k] = malloc((size_t)B * V * 4);
        dc[k] = malloc((size_t)B * V * 4);
        T_ASSERT(fp8t_infer_forward_all(m, tok, B, T, lg[k], err, sizeof(err)) == 0, "%s", err);
        loss[k] = fp8t_infer_loss(m, tok, tgt, B, T, err, sizeof(err));
        T_ASSERT(fp8t_infer_prefill(m, tok, B, T, lens, pf[k], err, sizeof(err)) == 0, "%s", err);
        const int nx[3] = {1, 2, 3}, pos[3] = {12, 5, 9};
        T_ASSERT(fp8t_infer_decode(m, nx, pos, B, dc[k], err, sizeof(err)) == 0, "%s", err);
        fp8t_infer_destroy(m);
    }
    const char *name = fp8t_eval_precision_name(p);
    /* the same arithmetic but for the GEMM library's order of a sum at another M (OpenBLAS
     * splits the work by M across threads: bit-identical with one thread) */
    const double tol = 1e-5 * (1 + max_abs(lg[0], (size_t)B * T * V));
    for (int k = 1; k < 3; k++) {
        const double e[3] = {max_abs_diff(lg[0], lg[k], (size_t)B * T * V),
                             max_abs_diff(pf[0], pf[k], (size_t)B * V),
                             max_abs_diff(dc[0], dc[k], (size_t)B * V)};
        T_CHECK(e[0] <= tol && e[1] <= tol && e[2] <= tol,
                "%s %s, %s: full-window / prefill / decode logits differ by %g / %g / %g",
                fp8t_arch_name(cfg->arch), name, k == 1 ? "a sequence a pass" : "MLP chunks",
                e[0], e[1], e[2]);
    }
    /* the loss sums each pass's losses first: another association of the same terms */
    T_CLOSE(loss[1], loss[0], 0.0, 1e-6);
    T_CLOSE(loss[2], loss[0], 0.0, 1e-6);
    for (int k = 0; k < 3; k++) free(lg[k]), free(pf[k]), free(dc[k]);
    fp8t_weights_free(&w);
}

/* One layer's activations for R rows grow by 2 [R, C] FP32 buffers (x, the attention output),
 * [R, max(QKV, C)] for qkv and proj / the MLP's output (one buffer: never live at once),
 * the softmax's [R, NH] and the tokens: fp32 (no operand buffer), the MLP's rows fixed. The
 * shared buffer is proved right by every comparison of this file (cache, passes, training
 * model); this says it is shared. */
static void check_activation_rows(const fp8t_model_config *cfg) {
    char err[512];
    fp8t_weights w;
    T_ASSERT(make_weights(cfg, 33, &w) == 0, "weights");
    const int B = 3, T = 12;
    size_t act[2];
    for (int k = 0; k < 2; k++) {
        fp8t_infer_opts o;
        fp8t_infer_opts_default(&o, FP8T_EVAL_FP32, FP8T_ACT_SCALE_CURRENT);
        o.rows = k ? B * T : T, o.mlp_rows = T;
        fp8t_infer *m = fp8t_infer_create_opts(g_be, &w, &o, B, T, err, sizeof(err));
        T_ASSERT(m, "%s", err);
        fp8t_infer_memory mem;
        fp8t_infer_memory_get(m, &mem);
        act[k] = mem.activations;
        fp8t_infer_destroy(m);
    }
    const size_t C = (size_t)cfg->n_embd, NH = (size_t)cfg->n_head;
    const size_t QKV = (size_t)fp8t_model_qkv_dim(cfg), QO = QKV > C ? QKV : C;
    const size_t want = (size_t)(B * T - T) * ((2 * C + QO + NH) * sizeof(float) + sizeof(int));
    T_CHECK(act[1] - act[0] == want,
            "%s: activations %zu bytes at %d rows, %zu at %d: +%zu, want +%zu",
            fp8t_arch_name(cfg->arch), act[0], T, act[1], B * T, act[1] - act[0], want);
    fp8t_weights_free(&w);
}

static void test_activation_rows(void) {
    fp8t_model_config c;
    cfg_gpt2(&c);
    check_activation_rows(&c);
    cfg_llama(&c);
    check_activation_rows(&c);
}

static void test_prefill_passes_equal_one_pass(void) {
    fp8t_model_config c;
    cfg_gpt2(&c);
    check_passes(&c, FP8T_EVAL_FP32);
    check_passes(&c, FP8T_EVAL_FP8);
    cfg_llama(&c);
    check_passes(&c, FP8T_EVAL_FP32);
    check_passes(&c, FP8T_EVAL_FP8);
}

/* Calibrated scales: refused before calibration; calibrated on exactly the evaluated batch,
 * every input's fixed scale is the one current scaling computes for it, so the fused path
 * (the operand made by the norm / GELU / SwiGLU op) gives current scaling's bits; calibrated
 * on other batches the scales are fixed (not the batch's own): other bits, close logits. */
static void check_calibrated(const fp8t_model_config *cfg) {
    char err[512];
    fp8t_weights w;
    T_ASSERT(make_weights(cfg, 37, &w) == 0, "weights");
    const int B = 2, T = 16, V = cfg->vocab_size;
    int tok[32], other[3 * 32];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 29 + 3) % V;
    for (int i = 0; i < 3 * B * T; i++) other[i] = (i * 41 + 11) % V;
    const size_t n = (size_t)B * T * V;
    float *cur = malloc(n * 4), *same = malloc(n * 4), *oth = malloc(n * 4), *ref = malloc(n * 4);
    fp8t_infer *m = make_infer(&w, FP8T_EVAL_FP32, FP8T_ACT_SCALE_CURRENT, B, T);
    T_ASSERT(m && fp8t_infer_forward_all(m, tok, B, T, ref, err, sizeof(err)) == 0, "%s", err);
    fp8t_infer_destroy(m);
    m = make_infer(&w, FP8T_EVAL_FP8, FP8T_ACT_SCALE_CURRENT, B, T);
    T_ASSERT(m && fp8t_infer_forward_all(m, tok, B, T, cur, err, sizeof(err)) == 0, "%s", err);
    fp8t_infer_destroy(m);
    m = make_infer(&w, FP8T_EVAL_FP8, FP8T_ACT_SCALE_CALIBRATED, B, T);
    T_ASSERT(m, "create");
    T_CHECK(fp8t_infer_needs_calibration(m) &&
                fp8t_infer_forward_all(m, tok, B, T, same, err, sizeof(err)) != 0 &&
                strstr(err, "not calibrated"),
            "uncalibrated forward: %s", err);
    T_ASSERT(fp8t_infer_calibrate(m, tok, 1, B, T, err, sizeof(err)) == 0, "%s", err);
    T_ASSERT(fp8t_infer_forward_all(m, tok, B, T, same, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(!memcmp(same, cur, n * 4),
            "%s: calibrated on the batch itself: not current "
            "scaling's bits",
            fp8t_arch_name(cfg->arch));
    T_ASSERT(fp8t_infer_calibrate(m, other, 3, B, T, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(!fp8t_infer_needs_calibration(m) &&
                strstr(fp8t_infer_act_desc(m), "3 batches of 2 x 16 tokens"),
            "desc '%s'", fp8t_infer_act_desc(m));
    T_ASSERT(fp8t_infer_forward_all(m, tok, B, T, oth, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(memcmp(oth, cur, n * 4) != 0, "%s: scales of other batches gave current's bits",
            fp8t_arch_name(cfg->arch));
    const double c = cosine(oth, ref, n);
    T_CHECK(c > 0.99, "%s: calibrated fp8 logits cosine to fp32 %g", fp8t_arch_name(cfg->arch),
            c);
    fp8t_infer_destroy(m);
    free(cur), free(same), free(oth), free(ref);
    fp8t_weights_free(&w);
}

static void test_calibrated_activation_scales(void) {
    fp8t_model_config c;
    cfg_gpt2(&c);
    check_calibrated(&c);
    cfg_llama(&c);
    check_calibrated(&c);
}

/* An FP8 KV cache (E4M3, a scale per position and head): decode logits close to a BF16
 * cache's; the cache takes a bit over half the bytes (codes + one float per HS values). */
static void test_fp8_kv_cache_model(void) {
    char err[512];
    fp8t_model_config c;
    cfg_llama(&c);
    fp8t_weights w;
    T_ASSERT(make_weights(&c, 41, &w) == 0, "weights");
    const int n_new = 12, V = c.vocab_size, plen = 6;
    const int prompt[6] = {5, 77, 3, 190, 42, 8};
    float *lg[2];
    size_t kvb[2];
    int toks[2][12];
    for (int k = 0; k < 2; k++) {
        fp8t_infer_opts o;
        fp8t_infer_opts_default(&o, FP8T_EVAL_FP8, FP8T_ACT_SCALE_CURRENT);
        o.kv = k ? FP8T_KV_FP8 : FP8T_KV_BF16;
        fp8t_infer *m = fp8t_infer_create_opts(g_be, &w, &o, 1, plen + n_new, err, sizeof(err));
        T_ASSERT(m && fp8t_infer_kv(m) == o.kv, "%s", err);
        fp8t_infer_memory mem;
        fp8t_infer_memory_get(m, &mem);
        kvb[k] = mem.kv_cache;
        lg[k] = malloc((size_t)n_new * V * 4);
        int len = plen;
        T_ASSERT(fp8t_infer_prefill(m, prompt, 1, plen, &len, lg[k], err, sizeof(err)) == 0, "%s",
                 err);
        /* the same tokens to both: the BF16 cache's greedy choices */
        for (int j = 0; j + 1 < n_new; j++) {
            const int pos = plen + j;
            if (k == 0) toks[0][j] = fp8t_sample(lg[0] + (size_t)j * V, V, 0.0f, 0, NULL);
            T_ASSERT(fp8t_infer_decode(m, &toks[0][j], &pos, 1, lg[k] + (size_t)(j + 1) * V, err,
                                       sizeof(err)) == 0,
                     "%s", err);
        }
        fp8t_infer_destroy(m);
    }
    (void)toks[1];
    const double cs = cosine(lg[1], lg[0], (size_t)n_new * V);
    T_CHECK(cs > 0.999, "fp8 cache logits cosine to the bf16 cache's %g", cs);
    T_CHECK(memcmp(lg[1] + V, lg[0] + V, (size_t)(n_new - 1) * V * 4) != 0,
            "the fp8 cache changed nothing");
    /* HS 8 bytes of codes + 4 of scale per position against 16 bytes of BF16 */
    T_CHECK(kvb[1] * 10 < kvb[0] * 8, "kv bytes fp8 %zu bf16 %zu", kvb[1], kvb[0]);
    fp8t_infer_opts o;
    fp8t_infer_opts_default(&o, FP8T_EVAL_FP32, FP8T_ACT_SCALE_CURRENT);
    o.kv = FP8T_KV_FP8;
    fp8t_infer *bad = fp8t_infer_create_opts(g_be, &w, &o, 1, 8, err, sizeof(err));
    T_CHECK(!bad && strstr(err, "exact reference"), "fp32 with an fp8 cache: %s",
            bad ? "accepted" : err);
    fp8t_infer_destroy(bad);
    free(lg[0]), free(lg[1]);
    fp8t_weights_free(&w);
}

/* The loss through the KV cache (decode steps, teacher forced) = the full window's, FP32;
 * an FP8 cache moves it a little (it rounds K and V), a BF16 one less. */
static void test_decode_loss(void) {
    char err[512];
    fp8t_model_config c;
    cfg_llama(&c);
    fp8t_weights w;
    T_ASSERT(make_weights(&c, 53, &w) == 0, "weights");
    const int B = 2, T = 20, V = c.vocab_size;
    int tok[40], tgt[40];
    for (int i = 0; i < B * T; i++)
        tok[i] = (i * 19 + 2) % V, tgt[i] = i % 9 == 4 ? -1 : (i * 23 + 5) % V;
    fp8t_infer *m = make_infer(&w, FP8T_EVAL_FP32, FP8T_ACT_SCALE_CURRENT, B, T);
    T_ASSERT(m, "create");
    const double full = fp8t_infer_loss(m, tok, tgt, B, T, err, sizeof(err));
    const double dec = fp8t_infer_loss_decode(m, tok, tgt, B, T, err, sizeof(err));
    T_CLOSE(dec, full, 0.0, 1e-6);
    fp8t_infer_destroy(m);
    double l[2];
    for (int k = 0; k < 2; k++) {
        fp8t_infer_opts o;
        fp8t_infer_opts_default(&o, FP8T_EVAL_BF16, FP8T_ACT_SCALE_CURRENT);
        o.kv = k ? FP8T_KV_FP8 : FP8T_KV_BF16;
        m = fp8t_infer_create_opts(g_be, &w, &o, B, T, err, sizeof(err));
        T_ASSERT(m, "%s", err);
        l[k] = fp8t_infer_loss_decode(m, tok, tgt, B, T, err, sizeof(err));
        fp8t_infer_destroy(m);
    }
    T_CHECK(fabs(l[0] - full) < 1e-3 * full && l[1] != l[0] && fabs(l[1] - full) < 1e-2 * full,
            "decode loss fp32 %.6f, bf16 cache %.6f, fp8 cache %.6f", full, l[0], l[1]);
    fp8t_weights_free(&w);
}

/* the bytes allocated through a backend whose malloc is counted_malloc */
static size_t g_counted_bytes;
static const fp8t_backend_ops *g_count_inner;
static void *counted_malloc(fp8t_backend *b, size_t n) {
    g_counted_bytes += n;
    return g_count_inner->malloc(b, n);
}

/* fp8_head: the embedding table in E4M3 (embedding_forward_fp8: code * scale_inv + wpe) and
 * the tied head an FP8 linear on it; half the table's bytes, logits still close to FP32's;
 * calibrated on the evaluated batch it gives current scaling's bits as the other linears do,
 * and the calibration allocates nothing (no [rows, V] logits: only the head's input amax is
 * wanted); a vocabulary that is not a multiple of 16 is refused */
static void test_fp8_head(void) {
    char err[512];
    fp8t_model_config c;
    cfg_gpt2(&c);
    fp8t_weights w;
    T_ASSERT(make_weights(&c, 59, &w) == 0, "weights");
    const int B = 2, T = 16, V = c.vocab_size;
    int tok[32];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 43 + 9) % V;
    const size_t n = (size_t)B * T * V;
    float *lg[4];
    fp8t_infer_memory mem[2];
    for (int k = 0; k < 4; k++) {
        fp8t_infer_opts o;
        fp8t_infer_opts_default(&o, k == 0 ? FP8T_EVAL_FP32 : FP8T_EVAL_FP8,
                                k == 3 ? FP8T_ACT_SCALE_CALIBRATED : FP8T_ACT_SCALE_CURRENT);
        o.fp8_head = k >= 1;
        if (k == 1) o.fp8_head = 0;
        fp8t_backend_ops cops = *g_be->ops;
        cops.malloc = counted_malloc;
        g_count_inner = g_be->ops;
        fp8t_backend cb = *g_be;
        cb.ops = &cops;
        fp8t_infer *m = fp8t_infer_create_opts(&cb, &w, &o, B, T, err, sizeof(err));
        T_ASSERT(m && fp8t_infer_fp8_head(m) == (k >= 2), "%s", err);
        if (k == 3) {
            g_counted_bytes = 0;
            T_ASSERT(fp8t_infer_calibrate(m, tok, 1, B, T, err, sizeof(err)) == 0, "%s", err);
            T_CHECK(g_counted_bytes == 0, "calibration allocated %zu bytes", g_counted_bytes);
        }
        lg[k] = malloc(n * 4);
        T_ASSERT(fp8t_infer_forward_all(m, tok, B, T, lg[k], err, sizeof(err)) == 0, "%s", err);
        if (k == 1 || k == 2) fp8t_infer_memory_get(m, &mem[k - 1]);
        fp8t_infer_destroy(m);
    }
    const double cs = cosine(lg[2], lg[0], n);
    T_CHECK(cs > 0.99 && memcmp(lg[2], lg[1], n * 4) != 0, "fp8 head logits cosine to fp32 %g",
            cs);
    T_CHECK(!memcmp(lg[3], lg[2], n * 4), "calibrated on the batch: not current scaling's bits");
    /* the table: V x C bytes against BF16's [pad8(V), pad8(C)] x 2 (plus the small tensors) */
    const size_t tab16 = fp8t_bf16_bytes(V, c.n_embd), tab8 = (size_t)V * c.n_embd;
    T_CHECK(mem[0].other - mem[1].other + 64 * 4 >= tab16 - tab8 && mem[1].other < mem[0].other,
            "embeddings: %zu bytes with an fp8 head, %zu without", mem[1].other, mem[0].other);
    /* the op against its definition */
    const fp8t_backend_ops *o = g_be->ops;
    const int Vt = 19, C = 12, N = 5;
    uint8_t *codes = o->malloc(g_be, (size_t)Vt * C);
    float *wpe = o->malloc(g_be, (size_t)N * C * 4), *out = o->malloc(g_be, (size_t)N * C * 4);
    float *si = o->malloc(g_be, 4);
    int *tk = o->malloc(g_be, N * sizeof(int)), *ps = o->malloc(g_be, N * sizeof(int));
    for (int i = 0; i < Vt * C; i++) codes[i] = (uint8_t)((i * 37 + 1) & 0x7E);
    for (int i = 0; i < N * C; i++) wpe[i] = (float)normal();
    for (int i = 0; i < N; i++) tk[i] = (i * 7 + 3) % Vt, ps[i] = (i * 3 + 1) % N;
    *si = 0.0625f * 1.5f;
    o->embedding_forward_fp8(g_be, out, tk, codes, C, si, wpe, ps, N, 1, C);
    int bad = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < C; j++)
            bad += out[i * C + j] !=
                   fp8_decode(codes[tk[i] * C + j], FP8_E4M3) * *si + wpe[ps[i] * C + j];
    T_CHECK(bad == 0, "embedding_forward_fp8: %d elements differ", bad);
    o->free(g_be, codes), o->free(g_be, wpe), o->free(g_be, out), o->free(g_be, si);
    o->free(g_be, tk), o->free(g_be, ps);
    fp8t_weights_free(&w);
    c.vocab_size = 250;
    T_ASSERT(make_weights(&c, 61, &w) == 0, "weights");
    fp8t_infer_opts op;
    fp8t_infer_opts_default(&op, FP8T_EVAL_FP8, FP8T_ACT_SCALE_CURRENT);
    op.fp8_head = 1;
    fp8t_infer *bad_m = fp8t_infer_create_opts(g_be, &w, &op, 1, 8, err, sizeof(err));
    T_CHECK(!bad_m && strstr(err, "multiple of 16"), "vocab 250: %s", bad_m ? "accepted" : err);
    fp8t_infer_destroy(bad_m);
    for (int k = 0; k < 4; k++) free(lg[k]);
    fp8t_weights_free(&w);
}

/* the training model's task scoring through the inference model: FP32 picks the same
 * completions (the same losses up to summation order) */
static void test_task_eval_through_infer(void) {
    char err[512];
    fp8t_model_config c;
    cfg_gpt2(&c);
    fp8t_weights w;
    T_ASSERT(make_weights(&c, 43, &w) == 0, "weights");
    fp8t_task t;
    memset(&t, 0, sizeof(t));
    for (int e = 0; e < 7; e++) {
        int ctx[9], comp[4][5];
        const int *cp[4];
        int cl[4];
        const int ctx_len = 3 + e % 5, nc = 2 + e % 3;
        for (int i = 0; i < ctx_len; i++) ctx[i] = (e * 31 + i * 7 + 1) % c.vocab_size;
        for (int k = 0; k < nc; k++) {
            cl[k] = 1 + (e + k) % 5;
            for (int i = 0; i < cl[k]; i++) comp[k][i] = (e * 13 + k * 57 + i * 3) % c.vocab_size;
            cp[k] = comp[k];
        }
        T_ASSERT(fp8t_task_add(&t, e % nc, ctx, ctx_len, nc, cp, cl) == 0, "task_add");
    }
    fp8t_evaluator *ev =
        fp8t_evaluator_create(g_be, &w, NULL, t.max_completions, t.longest, err, sizeof(err));
    fp8t_infer *m =
        make_infer(&w, FP8T_EVAL_FP32, FP8T_ACT_SCALE_CURRENT, t.max_completions, t.longest);
    T_ASSERT(ev && m, "setup: %s", err);
    fp8t_evaluator_set_precision(ev, FP8T_EVAL_FP32);
    int pa[7], pb[7], ca = 0, cb = 0;
    T_ASSERT(fp8t_task_eval(ev, &t, &ca, pa, err, sizeof(err)) == 0, "%s", err);
    T_ASSERT(fp8t_infer_task_eval(m, &t, &cb, pb, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(ca == cb && !memcmp(pa, pb, sizeof(pa)), "choices differ: %d vs %d correct", cb, ca);
    fp8t_infer_destroy(m);
    fp8t_evaluator_destroy(ev);
    fp8t_task_free(&t);
    fp8t_weights_free(&w);
}

/* A CPU backend that claims to record graphs, to test the model's side of the contract:
 * between graph_begin and graph_end no op may wait, allocate or copy from or to the host.
 * Ops still run while "recording" (a decode step run twice gives the same state); a replay
 * runs nothing, so only the first step's results are read. */
static struct {
    int recording, recordings, launches, destroyed, ops_recorded, violations, stale;
} g_rec;
static fp8t_backend_ops rec_ops;

static int rec_begin(fp8t_backend *b) {
    (void)b;
    g_rec.recording = 1;
    g_rec.recordings++;
    return 0;
}
static void *rec_end(fp8t_backend *b) {
    (void)b;
    g_rec.recording = 0;
    return &g_rec;
}
static int rec_launch(fp8t_backend *b, void *g) {
    (void)b, (void)g;
    g_rec.launches++;
    return g_rec.stale ? -1 : 0;
}
static void rec_destroy(fp8t_backend *b, void *g) {
    (void)b, (void)g;
    g_rec.destroyed++;
}
static void *rec_malloc(fp8t_backend *b, size_t n) {
    g_rec.violations += g_rec.recording;
    return cpu_ops_of->malloc(b, n);
}
static void rec_free(fp8t_backend *b, void *p) {
    g_rec.violations += g_rec.recording;
    cpu_ops_of->free(b, p);
}
static void rec_to_device(fp8t_backend *b, void *d, const void *s, size_t n) {
    g_rec.violations += g_rec.recording;
    cpu_ops_of->to_device(b, d, s, n);
}
static void rec_to_host(fp8t_backend *b, void *d, const void *s, size_t n) {
    g_rec.violations += g_rec.recording;
    cpu_ops_of->to_host(b, d, s, n);
}
static void rec_sync(fp8t_backend *b) {
    g_rec.violations += g_rec.recording;
    cpu_ops_of->synchronize(b);
}
static void rec_gemm_bf16_rounded(fp8t_backend *b, float *C, const fp8t_bf16_operand *A,
                                  const fp8t_bf16_operand *B, int M, int N, int K, int ta, int tb,
                                  int acc, const float *bias, int ldc) {
    g_rec.ops_recorded += g_rec.recording;
    cpu_ops_of->gemm_bf16_rounded(b, C, A, B, M, N, K, ta, tb, acc, bias, ldc);
}
static void rec_attention_decode(fp8t_backend *b, float *out, void *kc, void *vc, int kv,
                                 const float *qkv, const int *pos, const fp8t_attn_shape *s,
                                 int Tmax) {
    g_rec.ops_recorded += g_rec.recording;
    cpu_ops_of->attention_decode(b, out, kc, vc, kv, qkv, pos, s, Tmax);
}

static void test_decode_graph_contract(void) {
    char err[512];
    fp8t_model_config c;
    cfg_llama(&c);
    fp8t_weights w;
    T_ASSERT(make_weights(&c, 47, &w) == 0, "weights");
    cpu_ops_of = g_be->ops;
    rec_ops = *g_be->ops;
    rec_ops.graph_begin = rec_begin, rec_ops.graph_end = rec_end;
    rec_ops.graph_launch = rec_launch, rec_ops.graph_destroy = rec_destroy;
    rec_ops.malloc = rec_malloc, rec_ops.free = rec_free, rec_ops.to_device = rec_to_device;
    rec_ops.to_host = rec_to_host, rec_ops.synchronize = rec_sync;
    rec_ops.gemm_bf16_rounded = rec_gemm_bf16_rounded;
    rec_ops.attention_decode = rec_attention_decode;
    fp8t_backend rb = *g_be;
    rb.ops = &rec_ops;
    const int V = c.vocab_size, lens[2] = {4, 7},
              tok[14] = {1, 2, 3, 4, 0, 0, 0, 9, 8, 7, 6, 5, 4, 3};
    float *lg = malloc(2 * (size_t)V * 4), *ref = malloc(2 * (size_t)V * 4);
    /* the reference: the same model on the plain CPU backend */
    fp8t_infer *m = make_infer(&w, FP8T_EVAL_BF16, FP8T_ACT_SCALE_CURRENT, 2, 12);
    T_ASSERT(m && !fp8t_infer_graphs(m), "the CPU backend records no graphs");
    const int nx[2] = {11, 12}, pos[2] = {4, 7};
    T_ASSERT(fp8t_infer_prefill(m, tok, 2, 7, lens, NULL, err, sizeof(err)) == 0 &&
                 fp8t_infer_decode(m, nx, pos, 2, ref, err, sizeof(err)) == 0,
             "%s", err);
    fp8t_infer_destroy(m);
    for (int p = 0; p < 3; p++) {
        const fp8t_eval_precision P = p == 0   ? FP8T_EVAL_BF16
                                      : p == 1 ? FP8T_EVAL_FP8
                                               : FP8T_EVAL_FP32;
        memset(&g_rec, 0, sizeof(g_rec));
        m = fp8t_infer_create(&rb, &w, P, FP8T_ACT_SCALE_CURRENT, 2, 12, err, sizeof(err));
        T_ASSERT(m, "%s", err);
        const int want = P != FP8T_EVAL_FP32;
        T_CHECK(fp8t_infer_graphs(m) == want, "%s: graphs %d", fp8t_eval_precision_name(P),
                fp8t_infer_graphs(m));
        T_ASSERT(fp8t_infer_prefill(m, tok, 2, 7, lens, NULL, err, sizeof(err)) == 0, "%s", err);
        T_ASSERT(fp8t_infer_decode(m, nx, pos, 2, lg, err, sizeof(err)) == 0, "%s", err);
        if (P == FP8T_EVAL_BF16)
            T_CHECK(!memcmp(lg, ref, 2 * (size_t)V * 4), "the recorded step's logits differ");
        const int pos2[2] = {5, 8}, pos3[2] = {6, 9}, one_pos = 7;
        T_ASSERT(fp8t_infer_decode(m, nx, pos2, 2, lg, err, sizeof(err)) == 0, "%s", err);
        g_rec.stale = 1; /* the next replay is refused: recorded again */
        T_ASSERT(fp8t_infer_decode(m, nx, pos3, 2, lg, err, sizeof(err)) == 0, "%s", err);
        g_rec.stale = 0;
        T_ASSERT(fp8t_infer_decode(m, nx, &one_pos, 1, lg, err, sizeof(err)) == 0, "%s", err);
        /* recorded at batch 2, replayed at its second step, refused and recorded at its third,
         * recorded again at batch 1 */
        T_CHECK(g_rec.recordings == 3 * want && g_rec.launches == 2 * want &&
                    g_rec.destroyed == 2 * want && (!want || g_rec.ops_recorded >= 2 * c.n_layer),
                "%s: %d recordings, %d launches, %d destroyed, %d ops recorded",
                fp8t_eval_precision_name(P), g_rec.recordings, g_rec.launches, g_rec.destroyed,
                g_rec.ops_recorded);
        T_CHECK(g_rec.violations == 0,
                "%s: %d waits, allocations or host copies while "
                "recording",
                fp8t_eval_precision_name(P), g_rec.violations);
        fp8t_infer_destroy(m);
    }
    fp8t_infer_opts o;
    fp8t_infer_opts_default(&o, FP8T_EVAL_BF16, FP8T_ACT_SCALE_CURRENT);
    o.no_graphs = 1;
    m = fp8t_infer_create_opts(&rb, &w, &o, 2, 12, err, sizeof(err));
    T_CHECK(m && !fp8t_infer_graphs(m), "no_graphs ignored");
    fp8t_infer_destroy(m);
    free(lg), free(ref);
    fp8t_weights_free(&w);
}

/* The MLP in bf16 and fp8: fc1 (GPT-2) or gate and up (Llama) write BF16 values
 * (gemm_tn_bf16_out, once or twice a layer a pass, 2 bytes less an element of h1 (and h2) than
 * FP32 ones) which GELU's / SwiGLU's operand pass reads; against the same model where the
 * backend says it makes no such operand (FP32 values): close logits, not the same bits (the
 * rounding is the difference). fp32 keeps FP32 values. */
static void test_mlp_bf16_values(void) {
    char err[512];
    fp8t_backend tb = tn16_backend();
    for (int arch = 0; arch < 2; arch++) {
        fp8t_model_config c;
        cfg_arch(&c, arch);
        fp8t_weights w;
        T_ASSERT(make_weights(&c, 53, &w) == 0, "weights");
        const int B = 2, T = 16, V = c.vocab_size;
        int tok[32];
        for (int i = 0; i < B * T; i++) tok[i] = (i * 37 + 2) % V;
        const size_t n = (size_t)B * T * V;
        float *lg[2] = {malloc(n * 4), malloc(n * 4)};
        const fp8t_eval_precision P[3] = {FP8T_EVAL_BF16, FP8T_EVAL_FP8, FP8T_EVAL_FP32};
        for (int p = 0; p < 3; p++) {
            const char *name = fp8t_eval_precision_name(P[p]);
            fp8t_infer_memory mem[2];
            for (int k = 0; k < 2; k++) {
                g_no_mlp16 = k, g_tn16_calls = 0;
                fp8t_infer *m = fp8t_infer_create(&tb, &w, P[p], FP8T_ACT_SCALE_CURRENT, B, T,
                                                  err, sizeof(err));
                T_ASSERT(m, "%s", err);
                T_ASSERT(fp8t_infer_forward_all(m, tok, B, T, lg[k], err, sizeof(err)) == 0, "%s",
                         err);
                fp8t_infer_memory_get(m, &mem[k]);
                fp8t_infer_destroy(m);
                const int want = P[p] != FP8T_EVAL_FP32 && k == 0 ? (arch + 1) * c.n_layer : 0;
                T_CHECK(g_tn16_calls == want, "%s %s%s: %d BF16-output GEMMs, want %d",
                        fp8t_arch_name(c.arch), name, k ? " (no such operand)" : "", g_tn16_calls,
                        want);
            }
            const int bf16_h = P[p] != FP8T_EVAL_FP32;
            const size_t RH = (size_t)B * T * c.mlp_hidden; /* the MLP's rows: the whole batch */
            T_CHECK(mem[1].activations - mem[0].activations == (bf16_h ? (arch + 1) * RH * 2 : 0),
                    "%s %s: activations %zu and %zu bytes", fp8t_arch_name(c.arch), name,
                    mem[0].activations, mem[1].activations);
            const double cs = cosine(lg[0], lg[1], n);
            T_CHECK(bf16_h ? cs > 0.9999 && memcmp(lg[0], lg[1], n * 4) != 0
                           : !memcmp(lg[0], lg[1], n * 4),
                    "%s %s: logits with and without BF16 hidden values: cosine %.9f",
                    fp8t_arch_name(c.arch), name, cs);
        }
        free(lg[0]), free(lg[1]);
        fp8t_weights_free(&w);
    }
}

/* prefetch_l2 in a decode step: the log of the prefetches and of the GEMMs' weights, in the
 * order they are queued */
typedef struct {
    int prefetch; /* 1: a prefetch of p, bytes; 0: a GEMM reading weight p of bytes */
    const void *p;
    size_t bytes;
} pf_event;
static struct {
    pf_event ev[512];
    int n, overflow;
} g_pf;
static void pf_log(int prefetch, const void *p, size_t bytes) {
    if (g_pf.n == 512) {
        g_pf.overflow = 1;
        return;
    }
    const pf_event e = {prefetch, p, bytes};
    g_pf.ev[g_pf.n++] = e;
}
static void pf_prefetch(fp8t_backend *b, const void *p, size_t bytes) {
    (void)b;
    pf_log(1, p, bytes);
}
static void pf_gemm_bf16_rounded(fp8t_backend *b, float *C, const fp8t_bf16_operand *A,
                                 const fp8t_bf16_operand *B, int M, int N, int K, int ta, int tb,
                                 int acc, const float *bias, int ldc) {
    pf_log(0, B->data, fp8t_bf16_bytes(B->rows, B->cols));
    cpu_ops_of->gemm_bf16_rounded(b, C, A, B, M, N, K, ta, tb, acc, bias, ldc);
}
static void pf_gemm_fp8(fp8t_backend *b, float *C, const fp8t_fp8_operand *A,
                        const fp8t_fp8_operand *B, int M, int N, int K, int ta, int tb, int acc,
                        int fast, float *amax, const float *bias) {
    pf_log(0, B->data ? (const void *)B->data : (const void *)B->data_t,
           (size_t)B->rows * (size_t)B->cols);
    cpu_ops_of->gemm_fp8(b, C, A, B, M, N, K, ta, tb, acc, fast, amax, bias);
}
static void pf_gemm_tn_bf16_out(fp8t_backend *b, uint16_t *C16, const fp8t_fp8_operand *A8,
                                const fp8t_fp8_operand *B8, const fp8t_bf16_operand *A16,
                                const fp8t_bf16_operand *B16, int M, int N, int K, int fast) {
    if (B8)
        pf_log(0, B8->data, (size_t)B8->rows * (size_t)B8->cols);
    else
        pf_log(0, B16->data, fp8t_bf16_bytes(B16->rows, B16->cols));
    cpu_ops_of->gemm_tn_bf16_out(b, C16, A8, B8, A16, B16, M, N, K, fast);
}

/* A decode step prefetches the first GEMM's weight, then, as each GEMM starts, the next one's
 * (qkv, proj, the MLP's, each layer's, then the head), the whole weight where it is smaller
 * than prefetch_mb; a prefill and a full-window pass prefetch nothing (their GEMMs are
 * compute-bound), nor does prefetch_mb 0; the logits are the same bits either way. */
static void test_decode_prefetch(void) {
    char err[512];
    cpu_ops_of = g_be->ops;
    static fp8t_backend_ops pf_ops;
    pf_ops = *g_be->ops;
    pf_ops.prefetch_l2 = pf_prefetch;
    pf_ops.gemm_bf16_rounded = pf_gemm_bf16_rounded;
    pf_ops.gemm_fp8 = pf_gemm_fp8;
    pf_ops.gemm_tn_bf16_out = pf_gemm_tn_bf16_out;
    fp8t_backend pb = *g_be;
    pb.ops = &pf_ops;
    for (int arch = 0; arch < 2; arch++) {
        fp8t_model_config c;
        cfg_arch(&c, arch);
        fp8t_weights w;
        T_ASSERT(make_weights(&c, 59, &w) == 0, "weights");
        const int V = c.vocab_size, lens[2] = {4, 7}, nx[2] = {11, 12}, pos[2] = {4, 7};
        const int tok[14] = {1, 2, 3, 4, 0, 0, 0, 9, 8, 7, 6, 5, 4, 3};
        const fp8t_eval_precision P[2] = {FP8T_EVAL_BF16, FP8T_EVAL_FP8};
        for (int p = 0; p < 2; p++) {
            const char *what = fp8t_eval_precision_name(P[p]);
            float *lg[2] = {malloc(2 * (size_t)V * 4), malloc(2 * (size_t)V * 4)};
            for (int k = 0; k < 2; k++) {
                fp8t_infer_opts o;
                fp8t_infer_opts_default(&o, P[p], FP8T_ACT_SCALE_CURRENT);
                o.prefetch_mb = k ? 0 : 1;
                fp8t_infer *m = fp8t_infer_create_opts(&pb, &w, &o, 2, 12, err, sizeof(err));
                T_ASSERT(m, "%s", err);
                T_CHECK(fp8t_infer_prefetch_bytes(m) == (k ? 0u : 1u << 20),
                        "%s %s: prefetch bytes %zu", fp8t_arch_name(c.arch), what,
                        fp8t_infer_prefetch_bytes(m));
                memset(&g_pf, 0, sizeof(g_pf));
                T_ASSERT(fp8t_infer_prefill(m, tok, 2, 7, lens, NULL, err, sizeof(err)) == 0,
                         "%s", err);
                int pre = 0;
                for (int i = 0; i < g_pf.n; i++) pre += g_pf.ev[i].prefetch;
                T_CHECK(pre == 0 && g_pf.n > 0, "%s %s: %d prefetches in a prefill",
                        fp8t_arch_name(c.arch), what, pre);
                memset(&g_pf, 0, sizeof(g_pf));
                T_ASSERT(fp8t_infer_decode(m, nx, pos, 2, lg[k], err, sizeof(err)) == 0, "%s",
                         err);
                fp8t_infer_destroy(m);
                T_ASSERT(!g_pf.overflow, "event log full");
                /* the GEMMs' weights in order: W0 .. Wn */
                const void *wt[256];
                size_t wb[256]; /* their bytes */
                int ng = 0, np = 0;
                for (int i = 0; i < g_pf.n; i++) {
                    if (g_pf.ev[i].prefetch) {
                        np++;
                    } else {
                        wt[ng] = g_pf.ev[i].p;
                        wb[ng++] = g_pf.ev[i].bytes;
                    }
                }
                const int per = arch ? 5 : 4;
                T_CHECK(ng == c.n_layer * per + 1, "%s %s: %d GEMMs in a decode step",
                        fp8t_arch_name(c.arch), what, ng);
                if (k) {
                    T_CHECK(np == 0, "%s %s: %d prefetches with prefetch_mb 0",
                            fp8t_arch_name(c.arch), what, np);
                    continue;
                }
                /* want: P(W0), then P(W[i+1]) right before GEMM i (none before the head's),
                 * each of the whole weight (smaller than 1 MiB here) */
                pf_event want[512];
                int nw = 0;
                want[nw++] = (pf_event){1, wt[0], wb[0]};
                for (int i = 0; i < ng; i++) {
                    if (i + 1 < ng) want[nw++] = (pf_event){1, wt[i + 1], wb[i + 1]};
                    want[nw++] = (pf_event){0, wt[i], 0};
                }
                /* the first event that differs (or the shorter log's end), -1: none */
                int bad = -1;
                for (int i = 0; bad < 0 && i < nw && i < g_pf.n; i++) {
                    const pf_event *a = &g_pf.ev[i], *b = &want[i];
                    if (a->prefetch != b->prefetch || a->p != b->p ||
                        (a->prefetch && a->bytes != b->bytes))
                        bad = i;
                }
                if (bad < 0 && nw != g_pf.n) bad = nw < g_pf.n ? nw : g_pf.n;
                T_CHECK(bad < 0, "%s %s: %d prefetches, %d GEMMs; event %d out of order",
                        fp8t_arch_name(c.arch), what, np, ng, bad);
            }
            T_CHECK(!memcmp(lg[0], lg[1], 2 * (size_t)V * 4),
                    "%s %s: decode logits differ with and without the prefetch",
                    fp8t_arch_name(c.arch), what);
            free(lg[0]), free(lg[1]);
        }
        fp8t_weights_free(&w);
    }
}

static void test_bad_sizes_refused(void) {
    char err[512];
    fp8t_model_config c;
    cfg_gpt2(&c);
    fp8t_weights w;
    T_ASSERT(make_weights(&c, 3, &w) == 0, "weights");
    fp8t_infer *m = fp8t_infer_create(g_be, &w, FP8T_EVAL_BF16, FP8T_ACT_SCALE_CURRENT, 2,
                                      c.seq_len + 1, err, sizeof(err));
    T_CHECK(!m && strstr(err, "seq_len"), "Tmax > seq_len: %s", m ? "accepted" : err);
    fp8t_infer_destroy(m);
    m = make_infer(&w, FP8T_EVAL_BF16, FP8T_ACT_SCALE_CURRENT, 2, 8);
    T_ASSERT(m, "create");
    const int p[6] = {1, 2, 3, 4, 5, 6}, len = 6, *pp = p;
    int out[4];
    fp8t_sample_cfg g = {0.0f, 0, 1};
    T_CHECK(fp8t_infer_generate(m, &pp, &len, 1, 4, &g, out, err, sizeof(err)) != 0 &&
                strstr(err, "cache positions"),
            "6 + 4 tokens in 8 positions: %s", err);
    const int badtok = 100000, pos = 0;
    float lg[256];
    T_CHECK(fp8t_infer_decode(m, &badtok, &pos, 1, lg, err, sizeof(err)) != 0 &&
                strstr(err, "vocabulary"),
            "bad token: %s", err);
    fp8t_infer_destroy(m);
    fp8t_weights_free(&w);
}

int main(void) {
    t_suite = "infer";
    char err[256];
    g_be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    if (!g_be) {
        printf("FAIL infer: backend: %s\n", err);
        return 1;
    }
    T_RUN(test_decode_op_matches_attention_forward);
    T_RUN(test_qkv_bias_equals_bias_add);
    T_RUN(test_embedding_bf16_op);
    T_RUN(test_fp32_forward_matches_training_model);
    T_RUN(test_cached_generation_equals_uncached);
    T_RUN(test_batch_equals_each_prompt_alone);
    T_RUN(test_bf16_fp8_precisions_and_memory);
    T_RUN(test_delayed_activation_scales);
    T_RUN(test_loss_matches_training_model);
    T_RUN(test_prefill_passes_equal_one_pass);
    T_RUN(test_activation_rows);
    T_RUN(test_calibrated_activation_scales);
    T_RUN(test_fp8_kv_cache_model);
    T_RUN(test_decode_loss);
    T_RUN(test_fp8_head);
    T_RUN(test_task_eval_through_infer);
    T_RUN(test_decode_graph_contract);
    T_RUN(test_mlp_bf16_values);
    T_RUN(test_decode_prefetch);
    T_RUN(test_bad_sizes_refused);
    fp8t_backend_destroy(g_be);
    T_MAIN_END();
}
