/* The model: presets and their parameter counts, config validation, the parameter table,
 * initialization, training steps in each precision, determinism, amax tracking in every
 * precision, frozen forwards that leave the training state alone, the hook sites, gradient
 * accumulation and bad input. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/model.h"
#include "test.h"

static fp8t_backend *be;

/* independent count from the architecture's definition */
static size_t expected_params(const fp8t_model_config *c) {
    size_t C = c->n_embd, H = c->mlp_hidden, V = c->vocab_size, L = c->n_layer;
    size_t head = c->untied_head ? V * C : 0;
    if (c->arch == FP8T_ARCH_GPT2)
        return V * C + (size_t)c->seq_len * C +
               L * (2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + H * C + H + C * H + C) +
               2 * C + head;
    /* q and o are C x C; k and v NKV * HS = C * NKV / NH rows each */
    size_t kv = C * (size_t)(c->n_kv_head ? c->n_kv_head : c->n_head) / (size_t)c->n_head;
    size_t qkv = C + 2 * kv;
    return V * C + L * (C + qkv * C + (c->qkv_bias ? qkv : 0) + C * C + C + 3 * H * C) + C + head;
}

static void model_presets(void) {
    const char *names[] = {"tiny",      "tiny-llama", "gpt2-124m", "gpt2-350m",
                           "gpt2-1.5b", "llama-1b",   "llama3-8b"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        fp8t_model_config c;
        char err[256];
        T_ASSERT(fp8t_model_preset(&c, names[i]) == 0, "preset %s missing", names[i]);
        T_CHECK(fp8t_model_config_check(&c, err, sizeof(err)) == 0, "%s: %s", names[i], err);
        T_CHECK(strstr(fp8t_model_preset_names(), names[i]) != NULL, "%s not listed", names[i]);
        size_t total = 0;
        int n = fp8t_model_param_table(&c, NULL, &total);
        T_CHECK(total == expected_params(&c), "%s: %zu params, expected %zu", names[i], total,
                expected_params(&c));
        T_CHECK(n == (c.arch == FP8T_ARCH_GPT2 ? 12 * c.n_layer + 4 : 7 * c.n_layer + 2) +
                         c.untied_head,
                "%s: %d tensors", names[i], n);
    }
    /* the published figures (tied head): GPT-2 small, medium, XL */
    fp8t_model_config c;
    size_t total;
    fp8t_model_preset(&c, "gpt2-124m");
    fp8t_model_param_table(&c, NULL, &total);
    T_CHECK(total == 124439808u, "gpt2-124m: %zu", total);
    T_CHECK(c.n_layer == 12 && c.n_embd == 768 && c.n_head == 12 && c.vocab_size == 50257 &&
                c.seq_len == 1024 && c.mlp_hidden == 3072,
            "gpt2-124m shape");
    fp8t_model_preset(&c, "gpt2-350m");
    fp8t_model_param_table(&c, NULL, &total);
    T_CHECK(total == 354823168u, "gpt2-350m: %zu", total);
    fp8t_model_preset(&c, "gpt2-1.5b");
    fp8t_model_param_table(&c, NULL, &total);
    T_CHECK(total == 1557611200u, "gpt2-1.5b: %zu", total);
    fp8t_model_preset(&c, "llama-1b");
    T_CHECK(c.arch == FP8T_ARCH_LLAMA && c.n_layer == 16 && c.n_embd == 2048 && c.n_head == 32 &&
                c.mlp_hidden == 8192 && c.vocab_size == 128256 && c.seq_len == 2048 &&
                c.rope_theta == 500000.0f,
            "llama-1b shape");
    /* Llama-3.2-1B: 8 KV heads, tied, llama3 RoPE (32, 1, 4, 8192): 1,235,814,400 parameters
     * as transformers counts them */
    T_CHECK(c.n_kv_head == 8 && !c.untied_head && !c.qkv_bias &&
                c.rope_scaling.type == FP8T_ROPE_LLAMA3 && c.rope_scaling.factor == 32.0f &&
                c.rope_scaling.low_freq_factor == 1.0f &&
                c.rope_scaling.high_freq_factor == 4.0f &&
                c.rope_scaling.original_max_pos == 8192,
            "llama-1b is Llama-3.2-1B");
    fp8t_model_param_table(&c, NULL, &total);
    T_CHECK(total == 1235814400u, "llama-1b: %zu", total);
    fp8t_param_info *info = calloc(FP8T_MAX_PARAM_TENSORS, sizeof(*info));
    int nt = fp8t_model_param_table(&c, info, NULL);
    T_CHECK(nt == 16 * 7 + 2 && !strcmp(info[2].name, "h.0.qkv.w") &&
                info[2].shape[0] == (32 + 2 * 8) * 64 && info[2].shape[1] == 2048,
            "llama-1b qkv.w [%d, %d]", info[2].shape[0], info[2].shape[1]);
    /* Llama-3.1-8B: untied, factor 8: 8,030,261,248 parameters; lm_head.w is the last tensor */
    T_CHECK(fp8t_model_preset(&c, "llama3-8b") == 0, "llama3-8b preset");
    fp8t_model_param_table(&c, NULL, &total);
    T_CHECK(total == 8030261248u, "llama3-8b: %zu", total);
    nt = fp8t_model_param_table(&c, info, NULL);
    T_CHECK(nt == 32 * 7 + 3 && !strcmp(info[nt - 1].name, "lm_head.w") &&
                !strcmp(info[nt - 2].name, "lnf.w") && info[nt - 1].shape[0] == 128256 &&
                info[nt - 1].shape[1] == 4096 && info[nt - 1].decay,
            "llama3-8b: last tensor %s", info[nt - 1].name);
    T_CHECK(c.untied_head && c.n_kv_head == 8 && c.rope_scaling.factor == 8.0f, "llama3-8b");
    /* Qwen2-style q/k/v biases: qkv.b [(NH + 2 NKV) HS] right after qkv.w, no decay */
    fp8t_model_preset(&c, "tiny-llama");
    c.n_kv_head = 2, c.qkv_bias = 1;
    nt = fp8t_model_param_table(&c, info, NULL);
    T_CHECK(nt == 4 * 8 + 2 && !strcmp(info[3].name, "h.0.qkv.b") && info[3].ndim == 1 &&
                info[3].shape[0] == (4 + 2 * 2) * 32 && !info[3].decay &&
                info[3].offset == info[2].offset + info[2].numel,
            "qkv.b: %s", info[3].name);
    free(info);
    T_CHECK(strstr(fp8t_model_preset_names(), "llama3-8b") != NULL, "preset names");
    fp8t_model_preset(&c, "llama-1b");
    T_CHECK(fp8t_model_preset(&c, "gpt5") == -1, "unknown preset accepted");
    T_CHECK(fp8t_model_num_linears(&c) == 16 * 5 + 1, "llama linears");
    T_CHECK(fp8t_model_module_of_slot(&c, 2) == FP8T_MOD_GATE &&
                fp8t_model_module_of_slot(&c, 4) == FP8T_MOD_DOWN,
            "llama slots");
    fp8t_model_preset(&c, "tiny");
    T_CHECK(fp8t_model_modules_per_layer(&c) == 4 &&
                fp8t_model_module_of_slot(&c, 3) == FP8T_MOD_FC2,
            "gpt2 slots");
}

static void expect_bad(fp8t_model_config c, const char *field) {
    char err[256] = "";
    T_CHECK(fp8t_model_config_check(&c, err, sizeof(err)) != 0, "bad %s accepted", field);
    T_CHECK(strstr(err, field) != NULL, "message does not name %s: %s", field, err);
}

static void model_config_check(void) {
    fp8t_model_config c;
    fp8t_model_preset(&c, "tiny");
    fp8t_model_config b = c;
    b.n_head = 3;
    expect_bad(b, "n_head"); /* 128 % 3 */
    b = c;
    b.n_layer = 0;
    expect_bad(b, "n_layer");
    b = c;
    b.n_layer = 100000;
    expect_bad(b, "n_layer");
    b = c;
    b.n_embd = -4;
    expect_bad(b, "n_embd");
    b = c;
    b.vocab_size = 0;
    expect_bad(b, "vocab_size");
    b = c;
    b.seq_len = 0;
    expect_bad(b, "seq_len");
    b = c;
    b.mlp_hidden = 0;
    expect_bad(b, "mlp_hidden");
    b = c;
    b.norm_eps = 0;
    expect_bad(b, "norm_eps");
    b = c;
    b.norm_eps = NAN;
    expect_bad(b, "norm_eps");
    b = c;
    b.arch = (fp8t_arch)7;
    expect_bad(b, "arch");
    fp8t_model_preset(&c, "tiny-llama");
    b = c;
    b.n_embd = 12;
    b.n_head = 4;
    expect_bad(b, "RoPE"); /* head size 3 */
    b = c;
    b.rope_theta = 0;
    expect_bad(b, "rope_theta");
    b = c;
    b.n_kv_head = 3;
    expect_bad(b, "n_kv_head"); /* 4 % 3 */
    b = c;
    b.n_kv_head = 8;
    expect_bad(b, "n_kv_head"); /* > n_head */
    b = c;
    b.n_kv_head = -1;
    expect_bad(b, "n_kv_head");
    b = c;
    b.untied_head = 2;
    expect_bad(b, "untied_head");
    b = c;
    b.qkv_bias = -1;
    expect_bad(b, "qkv_bias");
    b = c;
    b.rope_scaling.type = FP8T_ROPE_LLAMA3;
    expect_bad(b, "factor");
    b.rope_scaling = (fp8t_rope_scaling){FP8T_ROPE_LLAMA3, 8.0f, 4.0f, 1.0f, 8192};
    expect_bad(b, "high_freq_factor");
    b.rope_scaling = (fp8t_rope_scaling){FP8T_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 0};
    expect_bad(b, "original_max_pos");
    b = c;
    b.rope_scaling.type = (fp8t_rope_type)9;
    expect_bad(b, "rope_scaling");
    b = c;
    b.n_kv_head = 1;
    b.untied_head = 1;
    b.qkv_bias = 1; /* MQA is fine */
    b.rope_scaling = (fp8t_rope_scaling){FP8T_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192};
    {
        char e2[256];
        T_CHECK(fp8t_model_config_check(&b, e2, sizeof(e2)) == 0, "%s", e2);
    }
    b = c;
    b.arch = FP8T_ARCH_GPT2;
    b.n_kv_head = 2;
    expect_bad(b, "n_kv_head"); /* no GQA */
    b.n_kv_head = 4;
    b.untied_head = 1; /* = n_head: fine */
    {
        char e2[256];
        T_CHECK(fp8t_model_config_check(&b, e2, sizeof(e2)) == 0, "%s", e2);
    }
    b = c;
    b.n_embd = 12;
    b.n_head = 4;
    b.arch = FP8T_ARCH_GPT2; /* fine for GPT-2 */
    char err[256];
    T_CHECK(fp8t_model_config_check(&b, err, sizeof(err)) == 0, "%s", err);
    /* create refuses bad batch shapes with a message */
    err[0] = 0;
    T_CHECK(fp8t_model_create(be, &c, NULL, NULL, 2, c.seq_len + 1, err, sizeof(err)) == NULL &&
                strstr(err, "seq_len"),
            "T > seq_len: %s", err);
    b = c;
    b.n_head = 5;
    T_CHECK(fp8t_model_create(be, &b, NULL, NULL, 2, 8, err, sizeof(err)) == NULL &&
                strstr(err, "n_head"),
            "bad config: %s", err);
}

static void model_param_table(void) {
    fp8t_model_config c;
    fp8t_model_preset(&c, "tiny");
    fp8t_param_info info[64];
    size_t total;
    int n = fp8t_model_param_table(&c, info, &total);
    T_ASSERT(n == 52, "n %d", n);
    const char *want[] = {"wte",       "wpe",        "h.0.ln1.w",  "h.0.ln1.b", "h.0.qkv.w",
                          "h.0.qkv.b", "h.0.proj.w", "h.0.proj.b", "h.0.ln2.w", "h.0.ln2.b",
                          "h.0.fc1.w", "h.0.fc1.b",  "h.0.fc2.w",  "h.0.fc2.b", "h.1.ln1.w"};
    for (int i = 0; i < 15; i++)
        T_CHECK(!strcmp(info[i].name, want[i]), "%d: %s", i, info[i].name);
    T_CHECK(!strcmp(info[n - 2].name, "lnf.w") && !strcmp(info[n - 1].name, "lnf.b"), "lnf");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        T_CHECK(info[i].offset == off, "%s offset", info[i].name);
        off += info[i].numel;
        T_CHECK(info[i].decay == (info[i].ndim == 2), "%s decay", info[i].name);
    }
    T_CHECK(off == total, "total");
    T_CHECK(info[4].shape[0] == 384 && info[4].shape[1] == 128 && info[4].layer == 0, "qkv.w");
    T_CHECK(info[12].shape[0] == 128 && info[12].shape[1] == 512, "fc2.w [C, H]");
    T_CHECK(info[0].layer == -1 && info[0].shape[0] == 256, "wte");
    fp8t_model_preset(&c, "tiny-llama");
    n = fp8t_model_param_table(&c, info, &total);
    const char *want_l[] = {"wte",        "h.0.ln1.w", "h.0.qkv.w",  "h.0.proj.w", "h.0.ln2.w",
                            "h.0.gate.w", "h.0.up.w",  "h.0.down.w", "h.1.ln1.w"};
    for (int i = 0; i < 9; i++)
        T_CHECK(!strcmp(info[i].name, want_l[i]), "%d: %s", i, info[i].name);
    T_CHECK(n == 30 && !strcmp(info[n - 1].name, "lnf.w"), "llama lnf");
}

/* ---- helpers ---- */

static fp8t_model *make(const char *preset, fp8t_precision prec, int B, int T) {
    fp8t_model_config c;
    fp8t_model_preset(&c, preset);
    fp8t_policy p;
    fp8t_policy_default(&p);
    p.default_precision = prec;
    p.history_len = 16;
    char err[256];
    fp8t_model *m = fp8t_model_create(be, &c, &p, NULL, B, T, err, sizeof(err));
    if (!m)
        printf("  create %s: %s\n", preset, err);
    else
        fp8t_model_init_weights(m, 1234);
    return m;
}

static void batch(int *tokens, int *targets, int N, int V, uint64_t seed) {
    /* a tiny repeating pattern: the next token is predictable */
    for (int i = 0; i < N; i++) {
        tokens[i] = (int)((seed + (uint64_t)i * 7) % (uint64_t)V);
        targets[i] = (int)((seed + (uint64_t)(i + 1) * 7) % (uint64_t)V);
    }
}

static float train_step(fp8t_model *m, const int *tok, const int *tgt, int t) {
    fp8t_model_zero_grad(m);
    float loss = fp8t_model_forward(m, tok, tgt);
    fp8t_model_backward(m, 1.0f);
    float norm = fp8t_model_grad_norm(m);
    fp8t_model_adamw(m, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, t, 1.0f, norm);
    fp8t_model_end_step(m);
    return loss;
}

static void model_init_stats(void) {
    fp8t_model *m = make("tiny", FP8T_PREC_FP32, 1, 8);
    T_ASSERT(m, "create");
    size_t np = fp8t_model_num_params(m);
    float *p = malloc(np * sizeof(float)), *q = malloc(np * sizeof(float));
    be->ops->to_host(be, p, fp8t_model_params(m), np * sizeof(float));
    fp8t_param_info info[64];
    int n = fp8t_model_param_table(fp8t_model_get_config(m), info, NULL);
    for (int i = 0; i < n; i++) {
        double s = 0, s2 = 0;
        for (size_t k = 0; k < info[i].numel; k++) {
            s += p[info[i].offset + k];
            s2 += (double)p[info[i].offset + k] * p[info[i].offset + k];
        }
        double mean = s / info[i].numel, std = sqrt(s2 / info[i].numel - mean * mean);
        if (info[i].ndim == 2) {
            int resid = strstr(info[i].name, "proj.w") || strstr(info[i].name, "fc2.w");
            double want = resid ? 0.02 / sqrt(2.0 * 4) : 0.02;
            T_CHECK(fabs(std - want) < 0.1 * want && fabs(mean) < 0.1 * want,
                    "%s: std %g (want %g) mean %g", info[i].name, std, want, mean);
        } else {
            double want = strstr(info[i].name, ".w") ? 1.0 : 0.0;
            T_CHECK(mean == want && std == 0.0, "%s: mean %g std %g", info[i].name, mean, std);
        }
    }
    fp8t_model_init_weights(m, 1234);
    be->ops->to_host(be, q, fp8t_model_params(m), np * sizeof(float));
    T_CHECK(!memcmp(p, q, np * sizeof(float)), "same seed, different weights");
    fp8t_model_init_weights(m, 1235);
    be->ops->to_host(be, q, fp8t_model_params(m), np * sizeof(float));
    T_CHECK(memcmp(p, q, np * sizeof(float)) != 0, "another seed, same weights");
    free(p);
    free(q);
    fp8t_model_destroy(m);
}

/* three steps on one repeating batch: the loss goes down at each step */
static void loss_decreases(const char *preset, fp8t_precision prec) {
    const int B = 2, T = 32, N = B * T;
    fp8t_model *m = make(preset, prec, B, T);
    T_ASSERT(m, "create");
    int tok[64], tgt[64];
    batch(tok, tgt, N, fp8t_model_get_config(m)->vocab_size, 3);
    float prev = train_step(m, tok, tgt, 1), first = prev;
    T_CHECK(fabsf(first - logf(256.0f)) < 0.1f, "%s %s: initial loss %g, expected ~ln(V)", preset,
            fp8t_precision_name(prec), first);
    for (int t = 2; t <= 4; t++) {
        float loss = train_step(m, tok, tgt, t);
        T_CHECK(loss < prev, "%s %s: step %d loss %g not below %g", preset,
                fp8t_precision_name(prec), t, loss, prev);
        prev = loss;
    }
    float last = fp8t_model_forward(m, tok, tgt);
    printf("  %-10s %-8s loss %.4f -> %.4f after 4 steps\n", preset, fp8t_precision_name(prec),
           first, last);
    T_CHECK(last < first - 0.05f, "%s %s: %g -> %g", preset, fp8t_precision_name(prec), first,
            last);
    fp8t_model_destroy(m);
}

static void model_train_fp32(void) {
    loss_decreases("tiny", FP8T_PREC_FP32);
    loss_decreases("tiny-llama", FP8T_PREC_FP32);
}
static void model_train_bf16(void) {
    loss_decreases("tiny", FP8T_PREC_BF16);
    loss_decreases("tiny-llama", FP8T_PREC_BF16);
}
static void model_train_fp8(void) {
    loss_decreases("tiny", FP8T_PREC_DELAYED);
    loss_decreases("tiny-llama", FP8T_PREC_DELAYED);
    loss_decreases("tiny", FP8T_PREC_CURRENT);
}

/* two identical runs give identical bits: losses, weights, moments, FP8 state */
static void model_determinism(void) {
    const int B = 2, T = 16, N = B * T;
    int tok[32], tgt[32];
    float loss[2][3];
    float *params[2], *state[2];
    size_t np = 0, ns = 0;
    for (int run = 0; run < 2; run++) {
        fp8t_model *m = make("tiny-llama", FP8T_PREC_FP8, B, T);
        T_ASSERT(m, "create");
        np = fp8t_model_num_params(m);
        ns = fp8t_recipe_state_floats(fp8t_model_fp8_count(m), fp8t_model_fp8_history_len(m));
        for (int t = 0; t < 3; t++) {
            batch(tok, tgt, N, 256, (uint64_t)t * 11);
            loss[run][t] = train_step(m, tok, tgt, t + 1);
        }
        params[run] = malloc(2 * np * sizeof(float));
        be->ops->to_host(be, params[run], fp8t_model_params(m), np * sizeof(float));
        be->ops->to_host(be, params[run] + np, fp8t_model_adam_v(m), np * sizeof(float));
        state[run] = malloc(ns * sizeof(float));
        be->ops->to_host(be, state[run], fp8t_model_fp8_state(m), ns * sizeof(float));
        fp8t_model_destroy(m);
    }
    T_CHECK(!memcmp(loss[0], loss[1], sizeof(loss[0])), "losses differ: %.9g %.9g", loss[0][2],
            loss[1][2]);
    T_CHECK(!memcmp(params[0], params[1], 2 * np * sizeof(float)), "weights differ");
    T_CHECK(!memcmp(state[0], state[1], ns * sizeof(float)), "FP8 state differs");
    for (int r = 0; r < 2; r++) {
        free(params[r]);
        free(state[r]);
    }
}

/* BF16 and FP32 runs track the amax of every X, W and dY, so FP8 can take over at any step */
static void model_amax_tracked(void) {
    fp8t_precision precs[2] = {FP8T_PREC_BF16, FP8T_PREC_FP32};
    for (int pi = 0; pi < 2; pi++) {
        const int B = 2, T = 16, N = B * T;
        fp8t_model *m = make("tiny", precs[pi], B, T);
        T_ASSERT(m, "create");
        int n = fp8t_model_fp8_count(m), len = fp8t_model_fp8_history_len(m);
        size_t ns = fp8t_recipe_state_floats(n, len);
        float *st = malloc(ns * sizeof(float));
        int tok[32], tgt[32];
        batch(tok, tgt, N, 256, 1);
        fp8t_model_zero_grad(m);
        fp8t_model_forward(m, tok, tgt);
        be->ops->to_host(be, st, fp8t_model_fp8_state(m), ns * sizeof(float));
        int fwd_ok = 1, dy_zero = 1;
        for (int t = 0; t < n; t++) {
            if (t % 3 != FP8T_ROLE_DY && !(st[t] > 0)) fwd_ok = 0;
            if (t % 3 == FP8T_ROLE_DY && st[t] != 0) dy_zero = 0;
        }
        T_CHECK(fwd_ok, "%s: forward left an X or W amax at 0", fp8t_precision_name(precs[pi]));
        T_CHECK(dy_zero, "%s: dY amax recorded before the backward",
                fp8t_precision_name(precs[pi]));
        fp8t_model_backward(m, 1.0f);
        be->ops->to_host(be, st, fp8t_model_fp8_state(m), ns * sizeof(float));
        int all = 1;
        for (int t = 0; t < n; t++) all &= st[t] > 0 && isfinite(st[t]);
        T_CHECK(all, "%s: some amax of the %d FP8 tensors is not recorded",
                fp8t_precision_name(precs[pi]), n);
        fp8t_model_end_step(m);
        be->ops->to_host(be, st, fp8t_model_fp8_state(m), ns * sizeof(float));
        fp8t_recipe_state v;
        fp8t_recipe_state_view(&v, st, n, len);
        int scaled = 1;
        for (int t = 0; t < n; t++) {
            scaled &= v.scale[t] != 1.0f && v.history[t] == 0.0f;
            scaled &= v.fmt_max[t] == (t % 3 == FP8T_ROLE_DY ? 57344.0f : 448.0f);
        }
        T_CHECK(scaled, "%s: end_step did not turn the amaxes into scales",
                fp8t_precision_name(precs[pi]));
        free(st);
        fp8t_model_destroy(m);
    }
}

/* train in BF16, switch to FP8 delayed: the first FP8 loss matches BF16 (no jolt) */
static void model_switch_without_jolt(void) {
    const int B = 2, T = 32, N = B * T;
    fp8t_model *m = make("tiny", FP8T_PREC_BF16, B, T);
    T_ASSERT(m, "create");
    int tok[64], tgt[64];
    for (int t = 1; t <= 3; t++) {
        batch(tok, tgt, N, 256, (uint64_t)t);
        train_step(m, tok, tgt, t);
    }
    batch(tok, tgt, N, 256, 99);
    float bf16 = fp8t_model_forward(m, tok, tgt);
    fp8t_policy p = *fp8t_model_get_policy(m);
    p.default_precision = FP8T_PREC_FP8;
    fp8t_model_set_policy(m, &p);
    T_CHECK(fp8t_model_gemm_precision(m, 0, FP8T_GEMM_FPROP) == FP8T_PREC_DELAYED, "switched");
    T_CHECK(fp8t_model_gemm_precision(m, fp8t_model_num_linears(fp8t_model_get_config(m)) - 1,
                                      FP8T_GEMM_FPROP) == FP8T_PREC_BF16,
            "head stays bf16");
    float fp8 = fp8t_model_forward(m, tok, tgt);
    printf("  loss after switching BF16 -> FP8 delayed: %.5f vs %.5f\n", fp8, bf16);
    T_CHECK(fabsf(fp8 - bf16) < 0.01f * bf16, "jolt: %g vs %g", fp8, bf16);
    fp8t_model_destroy(m);

    /* a model starting in FP8 with no history quantizes with scale 1 */
    fp8t_model *f = make("tiny", FP8T_PREC_FP8, B, T);
    T_ASSERT(f, "create");
    float first = fp8t_model_forward(f, tok, tgt);
    T_CHECK(isfinite(first), "fresh fp8 loss %g", first);
    fp8t_model_destroy(f);
}

/* hybrid on/off: dY switches E5M2 <-> E4M3 in the FP8 state, with its scale carried over */
static void model_set_policy_hybrid(void) {
    fp8t_model *m = make("tiny", FP8T_PREC_FP8, 1, 8);
    T_ASSERT(m, "create");
    int tok[8], tgt[8];
    batch(tok, tgt, 8, 256, 5);
    train_step(m, tok, tgt, 1);
    int n = fp8t_model_fp8_count(m), len = fp8t_model_fp8_history_len(m);
    size_t ns = fp8t_recipe_state_floats(n, len);
    float *a = malloc(ns * sizeof(float)), *b = malloc(ns * sizeof(float));
    be->ops->to_host(be, a, fp8t_model_fp8_state(m), ns * sizeof(float));
    fp8t_policy p = *fp8t_model_get_policy(m);
    p.hybrid = 0;
    p.history_len = 999; /* cannot change after create: ignored */
    fp8t_model_set_policy(m, &p);
    T_CHECK(fp8t_model_get_policy(m)->history_len == len, "history_len changed");
    be->ops->to_host(be, b, fp8t_model_fp8_state(m), ns * sizeof(float));
    fp8t_recipe_state va, vb;
    fp8t_recipe_state_view(&va, a, n, len);
    fp8t_recipe_state_view(&vb, b, n, len);
    int ok = 1;
    for (int t = 0; t < n; t++) {
        if (t % 3 == FP8T_ROLE_DY)
            ok &= vb.fmt_max[t] == 448.0f &&
                  fabsf(vb.scale[t] - va.scale[t] * (448.0f / 57344.0f)) <= 1e-6f * vb.scale[t];
        else
            ok &= vb.fmt_max[t] == va.fmt_max[t] && vb.scale[t] == va.scale[t];
    }
    T_CHECK(ok, "fmt_max / scale of the dY tensors not switched to E4M3");
    float loss = train_step(m, tok, tgt, 2);
    T_CHECK(isfinite(loss), "loss %g", loss);
    free(a);
    free(b);
    fp8t_model_destroy(m);
}

/* ---- frozen forwards (validation and shadow BF16 on the trained model) ---- */

typedef struct {
    float *params, *grads, *state; /* host copies */
    size_t np, ns;
} model_snapshot;

static void snapshot(model_snapshot *s, fp8t_model *m) {
    s->np = fp8t_model_num_params(m);
    s->ns = fp8t_recipe_state_floats(fp8t_model_fp8_count(m), fp8t_model_fp8_history_len(m));
    s->params = malloc(s->np * sizeof(float));
    s->grads = malloc(s->np * sizeof(float));
    s->state = malloc(s->ns * sizeof(float));
    be->ops->to_host(be, s->params, fp8t_model_params(m), s->np * sizeof(float));
    be->ops->to_host(be, s->grads, fp8t_model_grads(m), s->np * sizeof(float));
    be->ops->to_host(be, s->state, fp8t_model_fp8_state(m), s->ns * sizeof(float));
}

static void snapshot_free(model_snapshot *s) {
    free(s->params);
    free(s->grads);
    free(s->state);
}

/* bit-for-bit equality of the parts of two snapshots (params, grads, FP8 state) */
static int same_params(const model_snapshot *a, const model_snapshot *b) {
    return !memcmp(a->params, b->params, a->np * sizeof(float));
}
static int same_grads(const model_snapshot *a, const model_snapshot *b) {
    return !memcmp(a->grads, b->grads, a->np * sizeof(float));
}
static int same_state(const model_snapshot *a, const model_snapshot *b) {
    return !memcmp(a->state, b->state, a->ns * sizeof(float));
}

/* A policy as far from p as a detour can be: all BF16, the other dY format, another epsilon
 * and power-of-two scales (which invalidate the current-scaled weight caches). */
static fp8t_policy detour_policy(const fp8t_policy *p) {
    fp8t_policy d = *p;
    d.default_precision = FP8T_PREC_BF16;
    d.head_precision = FP8T_PREC_BF16;
    d.n_overrides = 0;
    d.hybrid = !p->hybrid;
    d.epsilon = 1e-3f;
    d.pow2_scales = !p->pow2_scales;
    return d;
}

/* While frozen, a forward leaves the FP8 state, the gradients and the weights as they are,
 * gives the loss an unfrozen forward gives, and every training call is refused. */
static void model_frozen_forward(void) {
    const int B = 2, T = 16, N = B * T;
    fp8t_model *m = make("tiny", FP8T_PREC_FP8, B, T);
    T_ASSERT(m, "create");
    int tok[32], tgt[32];
    for (int t = 1; t <= 2; t++) { /* real scales and a filled history */
        batch(tok, tgt, N, 256, (uint64_t)t);
        train_step(m, tok, tgt, t);
    }
    /* accumulated gradients (and recorded amaxes) of a first micro-batch */
    batch(tok, tgt, N, 256, 16);
    fp8t_model_zero_grad(m);
    fp8t_model_forward(m, tok, tgt);
    fp8t_model_backward(m, 0.5f);
    batch(tok, tgt, N, 256, 17);
    model_snapshot s0, s1;
    snapshot(&s0, m);

    T_CHECK(!fp8t_model_is_frozen(m), "a new model is frozen");
    fp8t_model_set_frozen(m, 1);
    T_CHECK(fp8t_model_is_frozen(m), "set_frozen(1) did not freeze");
    float frozen_loss = fp8t_model_forward(m, tok, tgt);
    /* a shadow-BF16 detour: another policy (dY format too) and back, forward in between */
    fp8t_policy run = *fp8t_model_get_policy(m), detour = detour_policy(&run);
    fp8t_model_set_policy(m, &detour);
    float bf16_loss = fp8t_model_forward(m, tok, tgt);
    fp8t_model_set_policy(m, &run);
    /* every training call is refused while frozen */
    printf("  (expected refusals follow)\n");
    fflush(stdout);
    fp8t_model_backward(m, 1.0f);
    fp8t_model_zero_grad(m);
    fp8t_model_adamw(m, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 3, 1.0f, 1.0f);
    fp8t_model_end_step(m);
    snapshot(&s1, m);
    T_CHECK(same_state(&s0, &s1),
            "a frozen forward (or the policy detour) changed the FP8 state");
    T_CHECK(same_grads(&s0, &s1), "a backward or zero_grad ran on a frozen model");
    T_CHECK(same_params(&s0, &s1), "adamw ran on a frozen model");
    snapshot_free(&s1);
    fp8t_model_set_frozen(m, 0);
    T_CHECK(!fp8t_model_is_frozen(m), "set_frozen(0) did not unfreeze");
    snapshot(&s1, m);
    T_CHECK(same_state(&s0, &s1), "unfreezing after a detour and back changed the FP8 state");
    snapshot_free(&s1);
    /* the last forward was frozen: no backward from it */
    fp8t_model_backward(m, 1.0f);
    snapshot(&s1, m);
    T_CHECK(same_grads(&s0, &s1), "a backward ran after a frozen forward");
    snapshot_free(&s1);

    /* the frozen forward computed what a training forward computes with the same state */
    float train_loss = fp8t_model_forward(m, tok, tgt);
    T_CHECK(frozen_loss == train_loss, "frozen loss %.9g vs training loss %.9g", frozen_loss,
            train_loss);
    T_CHECK(isfinite(bf16_loss) && bf16_loss != frozen_loss &&
                fabsf(bf16_loss - frozen_loss) < 0.05f * bf16_loss,
            "BF16 detour loss %.9g vs FP8 %.9g", bf16_loss, frozen_loss);
    snapshot(&s1, m);
    T_CHECK(!same_state(&s0, &s1), "an unfrozen forward recorded no amax");
    snapshot_free(&s1);
    fp8t_model_backward(m, 0.5f); /* the step goes on as if nothing had happened */
    snapshot(&s1, m);
    T_CHECK(!same_grads(&s0, &s1), "no backward after a training forward");
    snapshot_free(&s1);

    /* a format change made while frozen that stays is applied at the unfreeze */
    fp8t_model_set_frozen(m, 1);
    fp8t_policy e4m3 = run;
    e4m3.hybrid = 0;
    fp8t_model_set_policy(m, &e4m3);
    snapshot(&s1, m);
    fp8t_recipe_state v;
    int n = fp8t_model_fp8_count(m), len = fp8t_model_fp8_history_len(m);
    fp8t_recipe_state_view(&v, s1.state, n, len);
    T_CHECK(v.fmt_max[FP8T_ROLE_DY] == 57344.0f, "the dY format changed while frozen");
    snapshot_free(&s1);
    fp8t_model_set_frozen(m, 0);
    snapshot(&s1, m);
    fp8t_recipe_state_view(&v, s1.state, n, len);
    T_CHECK(v.fmt_max[FP8T_ROLE_DY] == 448.0f,
            "the dY format change was not applied at the "
            "unfreeze: fmt_max %g",
            v.fmt_max[FP8T_ROLE_DY]);
    snapshot_free(&s1);
    snapshot_free(&s0);
    fp8t_model_destroy(m);
}

/* Two models trained alike, one with frozen forwards between its steps (validation) and a
 * frozen all-BF16 forward on each step's batch before its first training forward (shadow):
 * losses, weights, moments' effect and FP8 state stay bit-identical, in delayed scaling with
 * an FP8 head and in current scaling. */
static void model_frozen_keeps_trajectory(void) {
    const int B = 2, T = 16, N = B * T, steps = 4;
    const char *what[2] = {"delayed, fp8 head", "current"};
    for (int v = 0; v < 2; v++) {
        fp8t_model *m[2];
        float loss[2][4];
        model_snapshot s[2];
        for (int k = 0; k < 2; k++) {
            m[k] = make("tiny", FP8T_PREC_FP8, B, T);
            T_ASSERT(m[k], "create");
            fp8t_policy p = *fp8t_model_get_policy(m[k]);
            if (v == 0)
                p.head_precision = FP8T_PREC_DELAYED;
            else
                p.recipe = FP8T_PREC_CURRENT;
            fp8t_model_set_policy(m[k], &p);
        }
        for (int t = 1; t <= steps; t++) {
            int tok[32], tgt[32], vtok[32], vtgt[32];
            batch(tok, tgt, N, 256, (uint64_t)t * 5);
            batch(vtok, vtgt, N, 256, 1000);
            for (int k = 0; k < 2; k++) {
                if (k == 1) {
                    fp8t_policy run = *fp8t_model_get_policy(m[k]), d = detour_policy(&run);
                    fp8t_model_set_frozen(m[k], 1);
                    fp8t_model_forward(m[k], vtok, vtgt); /* validation */
                    fp8t_model_set_policy(m[k], &d);
                    fp8t_model_forward(m[k], tok, tgt); /* shadow BF16 */
                    fp8t_model_set_policy(m[k], &run);
                    fp8t_model_set_frozen(m[k], 0);
                }
                loss[k][t - 1] = train_step(m[k], tok, tgt, t);
                if (k == 1) { /* validation between steps, with the fresh scales */
                    fp8t_model_set_frozen(m[k], 1);
                    fp8t_model_forward(m[k], vtok, vtgt);
                    fp8t_model_forward(m[k], vtok, NULL);
                    fp8t_model_set_frozen(m[k], 0);
                }
            }
        }
        for (int k = 0; k < 2; k++) snapshot(&s[k], m[k]);
        T_CHECK(!memcmp(loss[0], loss[1], sizeof(loss[0])), "%s: losses differ: %.9g vs %.9g",
                what[v], loss[0][steps - 1], loss[1][steps - 1]);
        T_CHECK(same_params(&s[0], &s[1]) && same_grads(&s[0], &s[1]),
                "%s: weights or gradients differ", what[v]);
        T_CHECK(same_state(&s[0], &s[1]), "%s: FP8 state differs", what[v]);
        for (int k = 0; k < 2; k++) {
            snapshot_free(&s[k]);
            fp8t_model_destroy(m[k]);
        }
    }
}

/* gradients accumulate: two backwards with dloss 0.5 equal one with dloss 1 (FP32: exact) */
static void model_grad_accumulation(void) {
    const int B = 2, T = 16, N = B * T;
    fp8t_model *m = make("tiny-llama", FP8T_PREC_FP32, B, T);
    T_ASSERT(m, "create");
    int tok[32], tgt[32];
    batch(tok, tgt, N, 256, 8);
    tgt[3] = -1;
    size_t np = fp8t_model_num_params(m);
    float *g1 = malloc(np * sizeof(float)), *g2 = malloc(np * sizeof(float));
    fp8t_model_zero_grad(m);
    fp8t_model_forward(m, tok, tgt);
    fp8t_model_backward(m, 1.0f);
    be->ops->to_host(be, g1, fp8t_model_grads(m), np * sizeof(float));
    float n1 = fp8t_model_grad_norm(m);
    fp8t_model_zero_grad(m);
    for (int k = 0; k < 2; k++) {
        fp8t_model_forward(m, tok, tgt);
        fp8t_model_backward(m, 0.5f);
    }
    be->ops->to_host(be, g2, fp8t_model_grads(m), np * sizeof(float));
    /* equal up to the rounding of the accumulation order (+= twice vs once) */
    double d2 = 0, n2 = 0;
    for (size_t i = 0; i < np; i++) {
        d2 += ((double)g1[i] - g2[i]) * ((double)g1[i] - g2[i]);
        n2 += (double)g1[i] * g1[i];
    }
    T_CHECK(sqrt(d2) <= 1e-6 * sqrt(n2), "2 x 0.5 differs from 1: |diff| %g, |g| %g", sqrt(d2),
            sqrt(n2));
    double s = 0;
    for (size_t i = 0; i < np; i++) s += (double)g1[i] * g1[i];
    T_CHECK(n1 > 0 && fabs(n1 - sqrt(s)) < 1e-5 * sqrt(s), "grad norm %g vs %g", n1, sqrt(s));
    /* the losses: per position, ignored target -> 0 */
    float losses[32];
    be->ops->to_host(be, losses, fp8t_model_losses(m), sizeof(losses));
    T_CHECK(losses[3] == 0.0f && losses[4] > 0.0f, "ignored target loss %g", losses[3]);
    free(g1);
    free(g2);
    fp8t_model_destroy(m);
}

/* logits-only forward = the forward with targets; adamw with clipping and decay */
static void model_logits_and_adamw(void) {
    const int B = 1, T = 8;
    fp8t_model *m = make("tiny", FP8T_PREC_BF16, B, T);
    T_ASSERT(m, "create");
    int tok[8], tgt[8];
    batch(tok, tgt, 8, 256, 2);
    size_t nl = (size_t)8 * 256;
    float *l1 = malloc(nl * sizeof(float)), *l2 = malloc(nl * sizeof(float));
    T_CHECK(fp8t_model_forward(m, tok, NULL) == 0.0f, "no targets: 0");
    be->ops->to_host(be, l1, fp8t_model_logits(m), nl * sizeof(float));
    float loss = fp8t_model_forward(m, tok, tgt);
    be->ops->to_host(be, l2, fp8t_model_logits(m), nl * sizeof(float));
    T_CHECK(!memcmp(l1, l2, nl * sizeof(float)), "logits differ");
    double ref = 0;
    for (int i = 0; i < 8; i++) {
        double mx = -1e30, s = 0;
        for (int v = 0; v < 256; v++) mx = fmax(mx, l1[i * 256 + v]);
        for (int v = 0; v < 256; v++) s += exp(l1[i * 256 + v] - mx);
        ref += mx + log(s) - l1[i * 256 + tgt[i]];
    }
    T_CHECK(fabs(loss - ref / 8) < 1e-5 * fabs(ref / 8), "loss %g vs %g", loss, ref / 8);
    /* lr 0: nothing moves */
    size_t np = fp8t_model_num_params(m);
    float *p0 = malloc(np * sizeof(float)), *p1 = malloc(np * sizeof(float));
    fp8t_model_zero_grad(m);
    fp8t_model_backward(m, 1.0f);
    be->ops->to_host(be, p0, fp8t_model_params(m), np * sizeof(float));
    float norm = fp8t_model_grad_norm(m);
    fp8t_model_adamw(m, 0.0f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f, norm);
    be->ops->to_host(be, p1, fp8t_model_params(m), np * sizeof(float));
    T_CHECK(!memcmp(p0, p1, np * sizeof(float)), "lr 0 moved weights");
    /* zero gradients: only weight decay moves, and only the decayed (2-D) tensors */
    fp8t_model_zero_grad(m);
    be->ops->zero(be, fp8t_model_adam_m(m), np * sizeof(float));
    be->ops->zero(be, fp8t_model_adam_v(m), np * sizeof(float));
    fp8t_model_adamw(m, 0.1f, 0.9f, 0.95f, 1e-8f, 0.5f, 2, 0.0f, 0.0f);
    be->ops->to_host(be, p1, fp8t_model_params(m), np * sizeof(float));
    fp8t_param_info info[64];
    int n = fp8t_model_param_table(fp8t_model_get_config(m), info, NULL);
    int ok = 1;
    for (int i = 0; i < n; i++) {
        size_t o = info[i].offset;
        for (size_t k = 0; k < info[i].numel; k++) {
            float want = info[i].decay ? p0[o + k] - 0.1f * 0.5f * p0[o + k] : p0[o + k];
            if (fabsf(p1[o + k] - want) > 1e-6f * fabsf(want) + 1e-12f) ok = 0;
        }
    }
    T_CHECK(ok, "weight decay applied to the wrong tensors");
    free(p0);
    free(p1);
    free(l1);
    free(l2);
    fp8t_model_destroy(m);
}

/* the hook sees 9 sites per linear per micro-batch, in execution order */
typedef struct {
    int n;
    int bad_order;
    int last_lin;
    int phase;
    int counts[FP8T_T_COUNT];
} site_log;
static void log_hook(void *ctx, fp8t_model *m, const fp8t_tensor_site *s, float *x) {
    (void)m;
    (void)x;
    site_log *L = ctx;
    int backward = s->gemm != FP8T_GEMM_FPROP;
    if (!backward && s->lin < L->last_lin) L->bad_order++;
    if (backward && L->phase == 0) {
        L->phase = 1;
        L->last_lin = 1 << 30;
    }
    if (backward && s->lin > L->last_lin) L->bad_order++;
    L->last_lin = s->lin;
    L->counts[s->kind]++;
    L->n++;
}

static void model_hook_sites(void) {
    const int B = 1, T = 8;
    fp8t_model *m = make("tiny-llama", FP8T_PREC_FP8, B, T);
    T_ASSERT(m, "create");
    site_log log;
    memset(&log, 0, sizeof(log));
    log.last_lin = -1;
    fp8t_model_set_hook(m, log_hook, &log);
    int tok[8], tgt[8];
    batch(tok, tgt, 8, 256, 4);
    fp8t_model_forward(m, tok, tgt);
    fp8t_model_backward(m, 1.0f);
    int nl = fp8t_model_num_linears(fp8t_model_get_config(m));
    T_CHECK(log.n == 9 * nl, "%d sites for %d linears", log.n, nl);
    T_CHECK(log.counts[FP8T_T_INPUT] == 2 * nl && log.counts[FP8T_T_WEIGHT] == 2 * nl &&
                log.counts[FP8T_T_GRAD_OUTPUT] == 2 * nl && log.counts[FP8T_T_OUTPUT] == nl &&
                log.counts[FP8T_T_DGRAD] == nl && log.counts[FP8T_T_WGRAD] == nl,
            "site kinds");
    T_CHECK(log.bad_order == 0, "%d sites out of execution order", log.bad_order);
    T_CHECK(!strcmp(fp8t_tensor_kind_name(FP8T_T_GRAD_OUTPUT), "grad_output"), "kind name");
    fp8t_model_destroy(m);
}

static void model_bad_input(void) {
    fp8t_model *m = make("tiny", FP8T_PREC_BF16, 1, 8);
    T_ASSERT(m, "create");
    int tok[8], tgt[8];
    batch(tok, tgt, 8, 256, 4);
    tok[2] = 256;
    printf("  (expected error messages follow)\n");
    T_CHECK(isnan(fp8t_model_forward(m, tok, tgt)), "token out of range accepted");
    tok[2] = 1;
    tgt[5] = 1000;
    T_CHECK(isnan(fp8t_model_forward(m, tok, tgt)), "target out of range accepted");
    size_t np = fp8t_model_num_params(m);
    float *g = malloc(np * sizeof(float));
    fp8t_model_zero_grad(m);
    fp8t_model_backward(m, 1.0f); /* refused: the forward failed */
    be->ops->to_host(be, g, fp8t_model_grads(m), np * sizeof(float));
    int zero = 1;
    for (size_t i = 0; i < np; i++) zero &= g[i] == 0.0f;
    T_CHECK(zero, "backward ran after a failed forward");
    tgt[5] = -7; /* negative: ignored */
    T_CHECK(isfinite(fp8t_model_forward(m, tok, tgt)), "negative target");
    for (int i = 0; i < 8; i++) tgt[i] = -1;
    T_CHECK(fp8t_model_forward(m, tok, tgt) == 0.0f, "all ignored: loss 0");
    free(g);
    fp8t_model_destroy(m);
}

int main(void) {
    t_suite = "model";
    char err[256];
    be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    if (!be) {
        printf("FAIL model: cpu backend: %s\n", err);
        return 1;
    }
    T_RUN(model_presets);
    T_RUN(model_config_check);
    T_RUN(model_param_table);
    T_RUN(model_init_stats);
    T_RUN(model_train_fp32);
    T_RUN(model_train_bf16);
    T_RUN(model_train_fp8);
    T_RUN(model_determinism);
    T_RUN(model_amax_tracked);
    T_RUN(model_switch_without_jolt);
    T_RUN(model_set_policy_hybrid);
    T_RUN(model_frozen_forward);
    T_RUN(model_frozen_keeps_trajectory);
    T_RUN(model_grad_accumulation);
    T_RUN(model_logits_and_adamw);
    T_RUN(model_hook_sites);
    T_RUN(model_bad_input);
    fp8t_backend_destroy(be);
    T_MAIN_END();
}
