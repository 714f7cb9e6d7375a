/* Export and import: the Hugging Face name/layout mapping, FP32/BF16/FP8 round trips of trained
 * GPT-2 and Llama checkpoints (weights and validation loss), llm.c GPT-2 import against the
 * documented llm.c parameter order, imports turned into resumable checkpoints, and malformed
 * Hugging Face directories rejected with clear errors. */
#include <cjson/cJSON.h>
#include <math.h>

#include "fp8train/eval.h"
#include "fp8train/fp8.h"
#include "test.h"
#include "export_test_util.h"

static char g_root[512], g_ckpt_gpt2[600], g_ckpt_llama[600];

/* Validation loss of weights w (3 synthetic batches) in precision p. */
static double val_loss(const fp8t_weights *w, fp8t_eval_precision p) {
    char err[512];
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    fp8t_evaluator *ev = fp8t_evaluator_create(be, w, NULL, TU_B, TU_T, err, sizeof(err));
    fp8t_data *d = fp8t_data_open("synthetic", "", FP8T_SPLIT_VAL, TU_B, TU_T,
                                  w->model.vocab_size, 1234, err, sizeof(err));
    double l = NAN;
    if (ev && d) {
        if (p == FP8T_EVAL_FP8 && fp8t_evaluator_needs_calibration(ev))
            fp8t_evaluator_calibrate(ev, d, 1);
        fp8t_evaluator_set_precision(ev, p);
        l = fp8t_evaluator_loss(ev, d, 3);
    } else {
        printf("  val_loss: %s\n", err);
    }
    fp8t_data_close(d);
    fp8t_evaluator_destroy(ev);
    fp8t_backend_destroy(be);
    return l;
}

static const fp8t_param_info *param_named(const fp8t_param_info *info, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(info[i].name, name)) return &info[i];
    return NULL;
}

/* ------------------------------------------------------------------ the mapping */

static void test_map_gpt2(void) {
    fp8t_model_config c;
    fp8t_model_preset(&c, "tiny");
    int n = fp8t_hf_tensor_map(&c, NULL);
    T_ASSERT(n == 2 + 12 * c.n_layer + 2, "GPT-2 tensor count %d", n);
    fp8t_hf_tensor *map = calloc((size_t)n, sizeof(*map));
    fp8t_hf_tensor_map(&c, map);
    const int C = c.n_embd;
    int found = 0;
    for (int i = 0; i < n; i++) {
        const fp8t_hf_tensor *t = &map[i];
        if (!strcmp(t->name, "transformer.h.1.attn.c_attn.weight")) {
            found++;
            T_CHECK(t->shape[0] == C && t->shape[1] == 3 * C, "c_attn [%lld, %lld]",
                    (long long)t->shape[0], (long long)t->shape[1]);
            T_CHECK(t->transform == FP8T_HF_TRANSPOSE && t->lin == 1 * 4 + 0, "lin %d", t->lin);
            T_CHECK(!strcmp(t->module, "transformer.h.1.attn.c_attn"), "module %s", t->module);
        }
        if (!strcmp(t->name, "transformer.h.3.mlp.c_proj.weight")) {
            found++;
            T_CHECK(t->shape[0] == c.mlp_hidden && t->shape[1] == C, "mlp.c_proj shape");
            T_CHECK(t->lin == 3 * 4 + 3, "fc2 lin %d", t->lin);
        }
        if (!strcmp(t->name, "transformer.h.0.attn.c_attn.bias")) {
            found++;
            T_CHECK(t->ndim == 1 && t->shape[0] == 3 * C && t->lin == -1, "c_attn.bias");
        }
        if (!strcmp(t->name, "transformer.wpe.weight")) {
            found++;
            T_CHECK(t->shape[0] == c.seq_len && t->shape[1] == C, "wpe shape");
        }
        T_CHECK(strncmp(t->name, "lm_head", 7) != 0, "lm_head must not be written (tied)");
    }
    T_CHECK(found == 4, "found %d of 4 probed names", found);
    free(map);
}

static void test_map_llama(void) {
    fp8t_model_config c;
    fp8t_model_preset(&c, "tiny-llama");
    int n = fp8t_hf_tensor_map(&c, NULL);
    T_ASSERT(n == 1 + 9 * c.n_layer + 1, "Llama tensor count %d", n);
    fp8t_hf_tensor *map = calloc((size_t)n, sizeof(*map));
    fp8t_hf_tensor_map(&c, map);
    const int C = c.n_embd;
    int q = 0, k = 0, v = 0;
    for (int i = 0; i < n; i++) {
        const fp8t_hf_tensor *t = &map[i];
        if (!strcmp(t->name, "model.layers.2.self_attn.q_proj.weight")) {
            q = 1;
            T_CHECK(t->transform == FP8T_HF_ROWS && t->row0 == 0 && t->rows == C, "q rows");
            T_CHECK(t->lin == 2 * 5 && t->shape[0] == C && t->shape[1] == C, "q lin/shape");
        }
        if (!strcmp(t->name, "model.layers.2.self_attn.k_proj.weight")) k = t->row0 == C;
        if (!strcmp(t->name, "model.layers.2.self_attn.v_proj.weight")) v = t->row0 == 2 * C;
        if (!strcmp(t->name, "model.layers.0.mlp.down_proj.weight"))
            T_CHECK(t->shape[0] == C && t->shape[1] == c.mlp_hidden && t->lin == 4, "down_proj");
    }
    T_CHECK(q && k && v, "q/k/v rows of the fused qkv: %d %d %d", q, k, v);
    free(map);
}

/* ------------------------------------------------------------------ round trips */

typedef struct {
    fp8t_weights orig, back;
    fp8t_export_report rep;
    char dir[700];
} roundtrip;

static int do_roundtrip(roundtrip *r, const char *ckpt, fp8t_export_dtype dt, const char *tag) {
    char err[1024];
    memset(r, 0, sizeof(*r));
    if (fp8t_weights_load(ckpt, &r->orig, err, sizeof(err)) != 0) {
        printf("  load %s: %s\n", ckpt, err);
        return -1;
    }
    snprintf(r->dir, sizeof(r->dir), "%s/export_%s", g_root, tag);
    if (fp8t_export_hf(&r->orig, r->dir, dt, &r->rep, err, sizeof(err)) != 0) {
        printf("  export: %s\n", err);
        return -1;
    }
    if (fp8t_weights_load(r->dir, &r->back, err, sizeof(err)) != 0) {
        printf("  import %s: %s\n", r->dir, err);
        return -1;
    }
    return 0;
}

static void roundtrip_free(roundtrip *r) {
    fp8t_weights_free(&r->orig);
    fp8t_weights_free(&r->back);
}

static void check_fp32(const char *ckpt, const char *tag) {
    roundtrip r;
    T_ASSERT(do_roundtrip(&r, ckpt, FP8T_EXPORT_FP32, tag) == 0, "round trip failed");
    T_CHECK(r.back.stored_dtype == FP8T_EXPORT_FP32, "stored dtype %d", (int)r.back.stored_dtype);
    T_CHECK(!strncmp(r.back.kind, "hf-", 3), "kind %s", r.back.kind);
    T_CHECK(r.back.num_params == r.orig.num_params, "param count");
    T_CHECK(memcmp(&r.back.model, &r.orig.model, sizeof(r.orig.model)) == 0,
            "model config differs after the round trip");
    size_t diff = 0;
    for (size_t i = 0; i < r.orig.num_params; i++) diff += r.back.params[i] != r.orig.params[i];
    T_CHECK(diff == 0, "%zu parameters changed in an FP32 round trip", diff);
    double a = val_loss(&r.orig, FP8T_EVAL_BF16), b = val_loss(&r.back, FP8T_EVAL_BF16);
    printf("  %s fp32 export: loss %.7f -> %.7f\n", tag, a, b);
    T_CHECK(a == b && isfinite(a), "identical weights must give identical losses");
    roundtrip_free(&r);
}

static void test_roundtrip_fp32_gpt2(void) { check_fp32(g_ckpt_gpt2, "fp32_gpt2"); }
static void test_roundtrip_fp32_llama(void) { check_fp32(g_ckpt_llama, "fp32_llama"); }

static void check_bf16(const char *ckpt, const char *tag) {
    roundtrip r;
    T_ASSERT(do_roundtrip(&r, ckpt, FP8T_EXPORT_BF16, tag) == 0, "round trip failed");
    T_CHECK(r.back.stored_dtype == FP8T_EXPORT_BF16, "stored dtype");
    size_t diff = 0;
    for (size_t i = 0; i < r.orig.num_params; i++)
        diff += r.back.params[i] != bf16_decode(bf16_encode(r.orig.params[i]));
    T_CHECK(diff == 0, "%zu parameters are not the BF16 rounding of the original", diff);
    double a = val_loss(&r.orig, FP8T_EVAL_BF16), b = val_loss(&r.back, FP8T_EVAL_BF16);
    printf("  %s bf16 export: loss %.7f -> %.7f (rel %.2e)\n", tag, a, b, fabs(b - a) / a);
    T_CLOSE(b, a, 0.0, FP8T_EXPORT_TOL_BF16);
    roundtrip_free(&r);
}

static void test_roundtrip_bf16_gpt2(void) { check_bf16(g_ckpt_gpt2, "bf16_gpt2"); }
static void test_roundtrip_bf16_llama(void) { check_bf16(g_ckpt_llama, "bf16_llama"); }

static void check_fp8(const char *ckpt, const char *tag) {
    roundtrip r;
    T_ASSERT(do_roundtrip(&r, ckpt, FP8T_EXPORT_FP8, tag) == 0, "round trip failed");
    const fp8t_model_config *c = &r.orig.model;
    const int mpl = fp8t_model_modules_per_layer(c);
    T_CHECK(r.back.stored_dtype == FP8T_EXPORT_FP8, "stored dtype");
    int n_mats = c->arch == FP8T_ARCH_GPT2 ? 4 * c->n_layer : 7 * c->n_layer;
    T_CHECK(r.rep.n_fp8 == n_mats, "%d FP8 matrices, expected %d", r.rep.n_fp8, n_mats);
    T_CHECK(r.rep.n_act_fallback == 0, "%d linears without amax history", r.rep.n_act_fallback);
    /* the file: F8 weights with [1] scales, BF16 elsewhere, metadata format pt */
    char path[800], err[512];
    snprintf(path, sizeof(path), "%s/model.safetensors", r.dir);
    fp8t_st_file *f;
    T_ASSERT(fp8t_st_open(&f, path, err, sizeof(err)) == 0, "%s", err);
    const char *fmt = fp8t_st_metadata(f, "format");
    T_CHECK(fmt && !strcmp(fmt, "pt"), "metadata format %s", fmt ? fmt : "missing");
    const char *wname =
        c->arch == FP8T_ARCH_GPT2 ? "transformer.h.1.mlp.c_fc" : "model.layers.1.mlp.up_proj";
    char name[256];
    snprintf(name, sizeof(name), "%s.weight", wname);
    const fp8t_st_tensor *wt = fp8t_st_find(f, name);
    snprintf(name, sizeof(name), "%s.weight_scale_inv", wname);
    const fp8t_st_tensor *st = fp8t_st_find(f, name);
    snprintf(name, sizeof(name), "%s.input_scale", wname);
    const fp8t_st_tensor *it = fp8t_st_find(f, name);
    T_ASSERT(wt && st && it, "FP8 tensors of %s missing", wname);
    T_CHECK(wt->dtype == FP8T_ST_F8_E4M3, "weight dtype %s", fp8t_st_dtype_name(wt->dtype));
    T_CHECK(st->dtype == FP8T_ST_F32 && st->numel == 1 && it->dtype == FP8T_ST_F32 &&
                it->numel == 1,
            "scales must be F32 [1]");
    const char *emb =
        c->arch == FP8T_ARCH_GPT2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
    const fp8t_st_tensor *et = fp8t_st_find(f, emb);
    T_CHECK(et && et->dtype == FP8T_ST_BF16, "embedding must stay BF16");
    /* input_scale = max(amax history of that linear's X) / 448 */
    float is;
    T_ASSERT(fp8t_st_read_f32(f, name, &is, 1, err, sizeof(err)) == 0, "%s", err);
    fp8t_recipe_state rs;
    fp8t_recipe_state_view(&rs, r.orig.fp8_state, r.orig.fp8_n, r.orig.fp8_len);
    const int lin = 1 * mpl + (c->arch == FP8T_ARCH_GPT2 ? 2 : 3);
    float want = fp8t_recipe_history_max(&rs, 3 * lin + FP8T_ROLE_X) / 448.0f;
    T_CHECK(want > 0 && is == want, "input_scale %g, history max/448 = %g", (double)is,
            (double)want);
    /* codes * scale_inv: within half an FP8 step of the weight (current scaling from its amax) */
    float sinv;
    snprintf(name, sizeof(name), "%s.weight_scale_inv", wname);
    fp8t_st_read_f32(f, name, &sinv, 1, err, sizeof(err));
    int n_info = fp8t_model_param_table(c, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)n_info, sizeof(*info));
    fp8t_model_param_table(c, info, NULL);
    const fp8t_param_info *p =
        param_named(info, n_info, c->arch == FP8T_ARCH_GPT2 ? "h.1.fc1.w" : "h.1.up.w");
    float amax = fp8_amax(r.orig.params + p->offset, p->numel);
    T_CLOSE(sinv, amax / 448.0f, 0.0, 1e-6);
    double worst = 0.0;
    for (size_t i = 0; i < p->numel; i++) {
        double x = r.orig.params[p->offset + i], y = r.back.params[p->offset + i];
        /* E4M3 has 3 mantissa bits: relative error <= 2^-4 for normals; below the smallest
         * normal (2^-6 * scale_inv) the absolute error is <= 2^-10 * scale_inv */
        double bound = fmax(fabs(x) * 0.0625, 0x1p-10 * sinv) * (1 + 1e-6);
        if (fabs(x - y) > bound) worst = fmax(worst, fabs(x - y) / bound);
    }
    T_CHECK(worst == 0.0, "dequantized weight off by %.3g x the FP8 rounding bound", worst);
    /* Conv1D orientation: element [i][j] of the stored GPT-2 matrix is our [j][i] */
    if (c->arch == FP8T_ARCH_GPT2) {
        const uint8_t *codes = fp8t_st_data(f, wt);
        const int OUT = p->shape[0], IN = p->shape[1];
        int bad = 0;
        for (int o = 0; o < OUT; o += 37)
            for (int i = 0; i < IN; i += 11) {
                float x = r.orig.params[p->offset + (size_t)o * IN + i];
                bad += codes[(size_t)i * OUT + o] != fp8_encode(x * (1.0f / sinv), FP8_E4M3, 1);
            }
        T_CHECK(bad == 0, "%d stored codes are not the transposed quantized weight", bad);
    }
    fp8t_st_close(f);
    /* the learned activation scales come back as the X scales of the imported FP8 state */
    T_ASSERT(r.back.fp8_state && r.back.fp8_n == r.orig.fp8_n,
             "import did not seed an FP8 state");
    fp8t_recipe_state bs;
    fp8t_recipe_state_view(&bs, r.back.fp8_state, r.back.fp8_n, r.back.fp8_len);
    T_CLOSE(bs.scale_inv[3 * lin + FP8T_ROLE_X], is, 0.0, 1e-6);
    double a = val_loss(&r.orig, FP8T_EVAL_BF16), b = val_loss(&r.back, FP8T_EVAL_BF16);
    double a8 = val_loss(&r.orig, FP8T_EVAL_FP8), b8 = val_loss(&r.back, FP8T_EVAL_FP8);
    printf(
        "  %s fp8 export: bf16 loss %.6f -> %.6f (rel %.2e); fp8 loss %.6f -> %.6f (rel %.2e)\n",
        tag, a, b, fabs(b - a) / a, a8, b8, fabs(b8 - a8) / a8);
    T_CLOSE(b, a, 0.0, FP8T_EXPORT_TOL_FP8);
    T_CLOSE(b8, a8, 0.0, FP8T_EXPORT_TOL_FP8);
    free(info);
    roundtrip_free(&r);
}

static void test_roundtrip_fp8_gpt2(void) { check_fp8(g_ckpt_gpt2, "fp8_gpt2"); }
static void test_roundtrip_fp8_llama(void) { check_fp8(g_ckpt_llama, "fp8_llama"); }

/* The GPT-2 FP32 export in the transformers layout: Conv1D transposed, config.json keys. */
static void test_gpt2_layout_and_config(void) {
    roundtrip r;
    T_ASSERT(do_roundtrip(&r, g_ckpt_gpt2, FP8T_EXPORT_FP32, "layout") == 0, "round trip failed");
    const fp8t_model_config *c = &r.orig.model;
    char path[800], err[512];
    snprintf(path, sizeof(path), "%s/model.safetensors", r.dir);
    fp8t_st_file *f;
    T_ASSERT(fp8t_st_open(&f, path, err, sizeof(err)) == 0, "%s", err);
    const fp8t_st_tensor *t = fp8t_st_find(f, "transformer.h.1.attn.c_attn.weight");
    T_ASSERT(t && t->ndim == 2 && t->shape[0] == c->n_embd && t->shape[1] == 3 * c->n_embd,
             "c_attn.weight must be [C, 3C]");
    int n_info = fp8t_model_param_table(c, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)n_info, sizeof(*info));
    fp8t_model_param_table(c, info, NULL);
    const fp8t_param_info *p = param_named(info, n_info, "h.1.qkv.w");
    const float *hf = fp8t_st_data(f, t);
    const int C = c->n_embd;
    int bad = 0;
    for (int o = 0; o < 3 * C; o++)
        for (int i = 0; i < C; i++)
            bad += hf[(size_t)i * 3 * C + o] != r.orig.params[p->offset + (size_t)o * C + i];
    T_CHECK(bad == 0, "%d elements of c_attn.weight are not our qkv.w transposed", bad);
    T_CHECK(fp8t_st_find(f, "lm_head.weight") == NULL, "lm_head written despite tying");
    fp8t_st_close(f);
    free(info);
    snprintf(path, sizeof(path), "%s/config.json", r.dir);
    char *text;
    size_t len;
    T_ASSERT(fp8t_read_file(path, &text, &len, err, sizeof(err)) == 0, "%s", err);
    cJSON *o = cJSON_Parse(text);
    free(text);
    T_ASSERT(o, "config.json is not JSON");
    cJSON *a = cJSON_GetObjectItem(o, "architectures");
    T_CHECK(cJSON_IsArray(a) && !strcmp(cJSON_GetArrayItem(a, 0)->valuestring, "GPT2LMHeadModel"),
            "architectures");
    T_CHECK(!strcmp(cJSON_GetObjectItem(o, "model_type")->valuestring, "gpt2"), "model_type");
    T_CHECK(cJSON_GetObjectItem(o, "n_embd")->valueint == c->n_embd, "n_embd");
    T_CHECK(cJSON_GetObjectItem(o, "n_layer")->valueint == c->n_layer, "n_layer");
    T_CHECK(cJSON_GetObjectItem(o, "n_head")->valueint == c->n_head, "n_head");
    T_CHECK(cJSON_GetObjectItem(o, "n_positions")->valueint == c->seq_len, "n_positions");
    T_CHECK(cJSON_GetObjectItem(o, "vocab_size")->valueint == c->vocab_size, "vocab_size");
    T_CHECK(!strcmp(cJSON_GetObjectItem(o, "activation_function")->valuestring, "gelu_new"),
            "act");
    T_CHECK(cJSON_IsTrue(cJSON_GetObjectItem(o, "tie_word_embeddings")), "tied");
    T_CHECK(!strcmp(cJSON_GetObjectItem(o, "torch_dtype")->valuestring, "float32"),
            "torch_dtype");
    T_CHECK(fabs(cJSON_GetObjectItem(o, "layer_norm_epsilon")->valuedouble - 1e-5) < 1e-9, "eps");
    cJSON_Delete(o);
    roundtrip_free(&r);
}

/* ------------------------------------------------------------------ llm.c */

/* The llm.c GPT-2 file built by hand in llm.c's documented order, each tensor filled with
 * its own pattern, must land in the right fp8train tensors; the vocabulary padding rows
 * (junk here) are dropped. */
static void test_llmc_import_order(void) {
    const int L = 2, C = 16, NH = 2, V = 100, Vp = 128, maxT = 8;
    fp8t_llmc_gpt2 ck = {maxT, V, Vp, L, NH, C, 3, NULL, 0};
    const size_t sizes[16] = {(size_t)Vp * C,
                              (size_t)maxT * C,
                              (size_t)L * C,
                              (size_t)L * C,
                              (size_t)L * 3 * C * C,
                              (size_t)L * 3 * C,
                              (size_t)L * C * C,
                              (size_t)L * C,
                              (size_t)L * C,
                              (size_t)L * C,
                              (size_t)L * 4 * C * C,
                              (size_t)L * 4 * C,
                              (size_t)L * C * 4 * C,
                              (size_t)L * C,
                              (size_t)C,
                              (size_t)C};
    size_t off[16], total = 0;
    for (int k = 0; k < 16; k++) {
        off[k] = total;
        total += sizes[k];
    }
    ck.num_params = total;
    ck.params = malloc(total * sizeof(float));
    /* value = tensor k + element fraction: unique per position, exact in FP32 */
    for (int k = 0; k < 16; k++)
        for (size_t i = 0; i < sizes[k]; i++)
            ck.params[off[k] + i] = (float)(k + 1) * 1000.0f + (float)(i % 977);
    char path[700], err[512];
    snprintf(path, sizeof(path), "%s/llmc_v3.bin", g_root);
    T_ASSERT(fp8t_llmc_gpt2_write(path, &ck, 3, err, sizeof(err)) == 0, "%s", err);
    fp8t_weights w;
    T_ASSERT(fp8t_weights_load(path, &w, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(!strcmp(w.kind, "llmc-gpt2"), "kind %s", w.kind);
    T_CHECK(w.model.vocab_size == V && w.model.n_layer == L && w.model.n_embd == C &&
                w.model.n_head == NH && w.model.seq_len == maxT && w.model.mlp_hidden == 4 * C,
            "config from the llm.c header");
    T_CHECK(strstr(w.notes, "padding") != NULL, "notes should say the padding was dropped: %s",
            w.notes);
    int n_info = fp8t_model_param_table(&w.model, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)n_info, sizeof(*info));
    fp8t_model_param_table(&w.model, info, NULL);
    static const char *per_layer[12] = {"ln1.w", "ln1.b", "qkv.w", "qkv.b", "proj.w", "proj.b",
                                        "ln2.w", "ln2.b", "fc1.w", "fc1.b", "fc2.w",  "fc2.b"};
    int bad = 0;
    const fp8t_param_info *p = param_named(info, n_info, "wte");
    for (size_t i = 0; i < p->numel; i++) bad += w.params[p->offset + i] != ck.params[off[0] + i];
    T_CHECK(p->numel == (size_t)V * C, "wte keeps V rows");
    p = param_named(info, n_info, "wpe");
    for (size_t i = 0; i < p->numel; i++) bad += w.params[p->offset + i] != ck.params[off[1] + i];
    for (int k = 0; k < 12; k++)
        for (int l = 0; l < L; l++) {
            char nm[64];
            snprintf(nm, sizeof(nm), "h.%d.%s", l, per_layer[k]);
            p = param_named(info, n_info, nm);
            const size_t per = sizes[2 + k] / (size_t)L;
            for (size_t i = 0; i < p->numel; i++)
                bad += w.params[p->offset + i] != ck.params[off[2 + k] + (size_t)l * per + i];
        }
    p = param_named(info, n_info, "lnf.w");
    for (size_t i = 0; i < p->numel; i++)
        bad += w.params[p->offset + i] != ck.params[off[14] + i];
    p = param_named(info, n_info, "lnf.b");
    for (size_t i = 0; i < p->numel; i++)
        bad += w.params[p->offset + i] != ck.params[off[15] + i];
    T_CHECK(bad == 0, "%d parameters landed in the wrong place", bad);
    /* and back out: our llm.c export reproduces the file's tensors (padding zeroed) */
    char path2[700];
    snprintf(path2, sizeof(path2), "%s/llmc_back.bin", g_root);
    T_ASSERT(fp8t_export_llmc(&w, path2, 3, err, sizeof(err)) == 0, "%s", err);
    fp8t_llmc_gpt2 back;
    T_ASSERT(fp8t_llmc_gpt2_read(path2, &back, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(back.padded_vocab_size == Vp && back.num_params == total, "Vp %d",
            back.padded_vocab_size);
    int diff = 0;
    for (size_t i = 0; i < total; i++) {
        int in_padding = i >= (size_t)V * C && i < (size_t)Vp * C;
        diff += back.params[i] != (in_padding ? 0.0f : ck.params[i]);
    }
    T_CHECK(diff == 0, "%d values differ after llm.c export", diff);
    fp8t_llmc_gpt2_free(&back);
    free(info);
    fp8t_weights_free(&w);
    fp8t_llmc_gpt2_free(&ck);
}

/* A trained tiny GPT-2 through llm.c v3 and v5: same logits (v3), BF16-rounded weights (v5). */
static void test_llmc_roundtrip_logits(void) {
    char err[512], p3[700], p5[700];
    fp8t_weights w, w3, w5;
    T_ASSERT(fp8t_weights_load(g_ckpt_gpt2, &w, err, sizeof(err)) == 0, "%s", err);
    snprintf(p3, sizeof(p3), "%s/tiny_v3.bin", g_root);
    snprintf(p5, sizeof(p5), "%s/tiny_v5.bin", g_root);
    T_ASSERT(fp8t_export_llmc(&w, p3, 3, err, sizeof(err)) == 0, "%s", err);
    T_ASSERT(fp8t_export_llmc(&w, p5, 5, err, sizeof(err)) == 0, "%s", err);
    T_ASSERT(fp8t_import_llmc(p3, &w3, err, sizeof(err)) == 0, "%s", err);
    T_ASSERT(fp8t_import_llmc(p5, &w5, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(w5.stored_dtype == FP8T_EXPORT_BF16 && w3.stored_dtype == FP8T_EXPORT_FP32, "dtypes");
    /* logits of the same tokens from the original and the v3 import */
    fp8t_backend *be = fp8t_backend_create("cpu", NULL, err, sizeof(err));
    fp8t_evaluator *e0 = fp8t_evaluator_create(be, &w, NULL, 1, 16, err, sizeof(err));
    fp8t_evaluator *e3 = fp8t_evaluator_create(be, &w3, NULL, 1, 16, err, sizeof(err));
    T_ASSERT(e0 && e3, "%s", err);
    int tok[16];
    for (int i = 0; i < 16; i++) tok[i] = (i * 37 + 5) % 256;
    fp8t_model_forward(fp8t_evaluator_model(e0), tok, NULL);
    fp8t_model_forward(fp8t_evaluator_model(e3), tok, NULL);
    const size_t n = 16 * (size_t)w.model.vocab_size;
    float *l0 = malloc(n * sizeof(float)), *l3 = malloc(n * sizeof(float));
    be->ops->to_host(be, l0, fp8t_model_logits(fp8t_evaluator_model(e0)), n * sizeof(float));
    be->ops->to_host(be, l3, fp8t_model_logits(fp8t_evaluator_model(e3)), n * sizeof(float));
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += l0[i] != l3[i];
    T_CHECK(diff == 0, "%zu logits differ after an llm.c v3 round trip", diff);
    size_t bad5 = 0;
    for (size_t i = 0; i < w.num_params; i++)
        bad5 += w5.params[i] != bf16_decode(bf16_encode(w.params[i]));
    T_CHECK(bad5 == 0, "%zu v5 parameters are not BF16 roundings", bad5);
    free(l0);
    free(l3);
    fp8t_evaluator_destroy(e0);
    fp8t_evaluator_destroy(e3);
    fp8t_backend_destroy(be);
    fp8t_weights_free(&w);
    fp8t_weights_free(&w3);
    fp8t_weights_free(&w5);
}

/* ------------------------------------------------------------------ import -> checkpoint */

static void test_import_to_checkpoint(void) {
    roundtrip r;
    T_ASSERT(do_roundtrip(&r, g_ckpt_llama, FP8T_EXPORT_BF16, "to_ckpt") == 0,
             "round trip failed");
    char dir[700], err[512];
    snprintf(dir, sizeof(dir), "%s/imported_ckpt", g_root);
    T_ASSERT(fp8t_weights_save_checkpoint(&r.back, dir, 42, err, sizeof(err)) == 0, "%s", err);
    fp8t_checkpoint ck;
    T_ASSERT(fp8t_checkpoint_load(dir, &r.back.model, &ck, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(ck.step == 0 && ck.data_position == 0 && ck.seed == 42, "step %d pos %llu seed %llu",
            ck.step, (unsigned long long)ck.data_position, (unsigned long long)ck.seed);
    size_t nz = 0, diff = 0;
    for (size_t i = 0; i < ck.num_params; i++) {
        nz += ck.adam_m[i] != 0.0f || ck.adam_v[i] != 0.0f;
        diff += ck.params[i] != r.back.params[i];
    }
    T_CHECK(nz == 0, "%zu nonzero AdamW moments", nz);
    T_CHECK(diff == 0, "%zu parameters differ", diff);
    T_CHECK(ck.fp8_n == 3 * fp8t_model_num_linears(&ck.model), "fp8 n %d", ck.fp8_n);
    fp8t_recipe_state st;
    fp8t_recipe_state_view(&st, ck.fp8_state, ck.fp8_n, ck.fp8_len);
    int fresh = 1;
    for (int t = 0; t < ck.fp8_n; t++)
        fresh &= st.scale[t] == 1.0f && fp8t_recipe_history_max(&st, t) == 0.0f &&
                 st.fmt_max[t] == (t % 3 == 2 ? 57344.0f : 448.0f);
    T_CHECK(fresh, "a BF16 import must start with a fresh FP8 state");
    fp8t_checkpoint_free(&ck);
    /* and the loaded checkpoint is itself a weights source with the same loss */
    fp8t_weights w2;
    T_ASSERT(fp8t_weights_load(dir, &w2, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(!strcmp(w2.kind, "checkpoint") && w2.step == 0, "kind %s", w2.kind);
    T_CHECK(val_loss(&w2, FP8T_EVAL_BF16) == val_loss(&r.back, FP8T_EVAL_BF16), "loss differs");
    fp8t_weights_free(&w2);
    roundtrip_free(&r);
}

/* ------------------------------------------------------------------ malformed input */

/* Copy export `from` (a directory under g_root) to a fresh dir, apply a config edit, import,
 * expect an error containing `expect`. */
static int import_with_config_edit(const char *from, const char *tag, void (*edit)(cJSON *),
                                   const char *expect) {
    char src[700], dir[700], cmd[4096], err[1024], path[800];
    snprintf(src, sizeof(src), "%s/%s", g_root, from);
    snprintf(dir, sizeof(dir), "%s/bad_%s", g_root, tag);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s'", dir, src, dir);
    if (system(cmd) != 0) return -1;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    char *text;
    size_t len;
    if (fp8t_read_file(path, &text, &len, err, sizeof(err)) != 0) return -1;
    cJSON *o = cJSON_Parse(text);
    free(text);
    edit(o);
    char *out = cJSON_Print(o);
    cJSON_Delete(o);
    fp8t_write_file_atomic(path, out, strlen(out), err, sizeof(err));
    free(out);
    fp8t_weights w;
    int rc = fp8t_weights_load(dir, &w, err, sizeof(err));
    if (rc == 0) {
        printf("  %s: import succeeded but should have failed\n", tag);
        fp8t_weights_free(&w);
        return -1;
    }
    printf("  %s: %s\n", tag, err);
    if (!strstr(err, expect)) {
        printf("  %s: error does not mention '%s'\n", tag, expect);
        return -1;
    }
    return 0;
}

/* the FP32 GPT-2 export */
static int gpt2_edit(const char *tag, void (*edit)(cJSON *), const char *expect) {
    return import_with_config_edit("export_layout", tag, edit, expect);
}

static void drop_n_embd(cJSON *o) { cJSON_DeleteItemFromObject(o, "n_embd"); }
static void wider(cJSON *o) { cJSON_ReplaceItemInObject(o, "n_embd", cJSON_CreateNumber(256)); }
static void deeper(cJSON *o) { cJSON_ReplaceItemInObject(o, "n_layer", cJSON_CreateNumber(3)); }
static void shallower(cJSON *o) {
    cJSON_ReplaceItemInObject(o, "n_layer", cJSON_CreateNumber(1));
}
static void other_arch(cJSON *o) {
    cJSON_ReplaceItemInObject(o, "model_type", cJSON_CreateString("mistral"));
}
static void erf_gelu(cJSON *o) {
    cJSON_ReplaceItemInObject(o, "activation_function", cJSON_CreateString("gelu"));
}
static void bad_type(cJSON *o) {
    cJSON_ReplaceItemInObject(o, "n_head", cJSON_CreateString("four"));
}
static void bad_heads(cJSON *o) { cJSON_ReplaceItemInObject(o, "n_head", cJSON_CreateNumber(3)); }

static void test_malformed_config(void) {
    T_CHECK(gpt2_edit("no_n_embd", drop_n_embd, "\"n_embd\" is missing") == 0, "n_embd");
    T_CHECK(gpt2_edit("wider", wider, "has shape") == 0, "shape mismatch");
    T_CHECK(gpt2_edit("deeper", deeper, "is missing") == 0, "missing tensor");
    T_CHECK(gpt2_edit("shallower", shallower, "do not belong") == 0, "extra tensors");
    T_CHECK(gpt2_edit("arch", other_arch, "not supported") == 0, "model_type");
    T_CHECK(gpt2_edit("gelu", erf_gelu, "gelu_new") == 0, "activation");
    T_CHECK(gpt2_edit("type", bad_type, "positive integer") == 0, "n_head type");
    T_CHECK(gpt2_edit("heads", bad_heads, "divisible") == 0, "n_head");
}

/* GQA, llama3 RoPE and untied heads are supported: what stays wrong is a config that does not
 * fit the weights or names a variant fp8train lacks */
static void llama_gqa(cJSON *o) {
    cJSON_ReplaceItemInObject(o, "num_key_value_heads", cJSON_CreateNumber(2));
}
static void llama_gqa3(cJSON *o) {
    cJSON_ReplaceItemInObject(o, "num_key_value_heads", cJSON_CreateNumber(3));
}
static void llama_rope(cJSON *o) {
    cJSON *rs = cJSON_CreateObject();
    cJSON_AddStringToObject(rs, "rope_type", "llama3");
    cJSON_ReplaceItemInObject(o, "rope_scaling", rs);
}
static void llama_yarn(cJSON *o) {
    cJSON *rs = cJSON_CreateObject();
    cJSON_AddStringToObject(rs, "rope_type", "yarn");
    cJSON_AddItemToObject(o, "rope_parameters", rs);
}
static void llama_untied(cJSON *o) {
    cJSON_ReplaceItemInObject(o, "tie_word_embeddings", cJSON_CreateFalse());
}
static void llama_attn_bias(cJSON *o) {
    cJSON_ReplaceItemInObject(o, "attention_bias", cJSON_CreateTrue());
}

/* the BF16 Llama export */
static int llama_edit(const char *tag, void (*edit)(cJSON *), const char *expect) {
    return import_with_config_edit("export_bf16_llama", tag, edit, expect);
}

static void test_malformed_llama_config(void) {
    T_CHECK(llama_edit("gqa", llama_gqa,
                       "k_proj.weight' has shape [64, 64] but config.json "
                       "implies [32, 64]") == 0,
            "GQA config on MHA weights");
    T_CHECK(llama_edit("gqa3", llama_gqa3, "must divide") == 0, "K/V heads not dividing");
    T_CHECK(llama_edit("rope", llama_rope, "needs \"factor\"") == 0, "llama3 without factor");
    T_CHECK(llama_edit("yarn", llama_yarn, "\"rope_parameters\" has rope_type \"yarn\"") == 0,
            "yarn");
    T_CHECK(llama_edit("untied", llama_untied, "'lm_head.weight' is missing") == 0,
            "untied head without lm_head.weight");
    T_CHECK(llama_edit("attn_bias", llama_attn_bias, "o_proj") == 0, "Llama attention_bias");
}

/* Hand-written safetensors: an FP8 weight without scale, a truncated file, an integer weight,
 * the Hub's unprefixed GPT-2 names with attention-mask buffers (accepted). */
static void test_malformed_tensors(void) {
    char err[1024], dir[700], path[800], cmd[4096];
    fp8t_weights w;
    T_ASSERT(fp8t_weights_load(g_ckpt_gpt2, &w, err, sizeof(err)) == 0, "%s", err);
    int n = fp8t_hf_tensor_map(&w.model, NULL);
    fp8t_hf_tensor *map = calloc((size_t)n, sizeof(*map));
    fp8t_hf_tensor_map(&w.model, map);
    int n_info = fp8t_model_param_table(&w.model, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)n_info, sizeof(*info));
    fp8t_model_param_table(&w.model, info, NULL);
    size_t maxn = 0;
    for (int i = 0; i < n_info; i++) maxn = info[i].numel > maxn ? info[i].numel : maxn;
    float *buf = malloc(maxn * sizeof(float));
    uint8_t *codes = calloc(maxn, 1);
    for (int variant = 0; variant < 4; variant++) {
        /* 0: Hub names + buffers (ok); 1: FP8 c_attn.weight w/o scale; 2: I32 c_attn.weight;
         * 3: truncated */
        snprintf(dir, sizeof(dir), "%s/tensors_%d", g_root, variant);
        snprintf(cmd, sizeof(cmd),
                 "rm -rf '%s' && mkdir -p '%s' && cp '%s/export_layout/config.json' '%s/'", dir,
                 dir, g_root, dir);
        T_ASSERT(system(cmd) == 0, "setup");
        fp8t_st_writer *wr = fp8t_st_writer_new();
        for (int i = 0; i < n; i++) {
            const fp8t_hf_tensor *t = &map[i];
            const fp8t_param_info *p = &info[t->param];
            /* the HF layout of the tensor */
            if (t->transform == FP8T_HF_TRANSPOSE) {
                for (int r = 0; r < p->shape[0]; r++)
                    for (int c = 0; c < p->shape[1]; c++)
                        buf[(size_t)c * p->shape[0] + r] =
                            w.params[p->offset + (size_t)r * p->shape[1] + c];
            } else {
                memcpy(buf, w.params + p->offset, p->numel * sizeof(float));
            }
            const char *name = variant == 0 ? t->name + strlen("transformer.") : t->name;
            if (variant == 1 && i == 4)
                fp8t_st_writer_add(wr, name, FP8T_ST_F8_E4M3, t->ndim, t->shape, codes);
            else if (variant == 2 && i == 4)
                fp8t_st_writer_add(wr, name, FP8T_ST_I32, t->ndim, t->shape, buf);
            else
                fp8t_st_writer_add(wr, name, FP8T_ST_F32, t->ndim, t->shape, buf);
        }
        if (variant == 0) {
            int64_t shp[4] = {1, 1, w.model.seq_len, w.model.seq_len};
            float *mask = calloc((size_t)w.model.seq_len * w.model.seq_len, sizeof(float));
            for (int l = 0; l < w.model.n_layer; l++) {
                char nm[64];
                snprintf(nm, sizeof(nm), "h.%d.attn.bias", l);
                fp8t_st_writer_add(wr, nm, FP8T_ST_F32, 4, shp, mask);
            }
            free(mask);
        }
        fp8t_st_writer_metadata(wr, "format", "pt");
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        T_ASSERT(fp8t_st_writer_save(wr, path, err, sizeof(err)) == 0, "%s", err);
        fp8t_st_writer_free(wr);
        if (variant == 3) T_ASSERT(truncate(path, 4000) == 0, "truncate");
        fp8t_weights b;
        int rc = fp8t_weights_load(dir, &b, err, sizeof(err));
        if (variant == 0) {
            T_CHECK(rc == 0, "Hub-style names must import: %s", err);
            if (rc == 0) {
                size_t diff = 0;
                for (size_t i = 0; i < w.num_params; i++) diff += b.params[i] != w.params[i];
                T_CHECK(diff == 0, "%zu parameters differ", diff);
                T_CHECK(strstr(b.notes, "ignored") != NULL, "notes: %s", b.notes);
                fp8t_weights_free(&b);
            }
        } else {
            printf("  variant %d: %s\n", variant, rc ? err : "(accepted!)");
            T_CHECK(rc != 0, "variant %d must fail", variant);
            if (rc == 0) fp8t_weights_free(&b);
            const char *want = variant == 1   ? "weight_scale_inv"
                               : variant == 2 ? "dtype"
                                              : "model.safetensors";
            T_CHECK(rc != 0 && strstr(err, want), "variant %d error should mention '%s'", variant,
                    want);
        }
    }
    /* no config.json / no weights / a run directory instead of a checkpoint */
    snprintf(dir, sizeof(dir), "%s/empty_dir", g_root);
    fp8t_mkdirs(dir, NULL, 0);
    fp8t_weights e2;
    T_CHECK(fp8t_weights_load(dir, &e2, err, sizeof(err)) != 0 && strstr(err, "neither"),
            "empty dir: %s", err);
    snprintf(dir, sizeof(dir), "%s/no_weights", g_root);
    snprintf(cmd, sizeof(cmd),
             "rm -rf '%s' && mkdir -p '%s' && cp '%s/export_layout/config.json' '%s/'", dir, dir,
             g_root, dir);
    T_ASSERT(system(cmd) == 0, "setup");
    fp8t_weights b;
    T_CHECK(fp8t_weights_load(dir, &b, err, sizeof(err)) != 0 && strstr(err, "model.safetensors"),
            "no weights: %s", err);
    T_CHECK(fp8t_weights_load("/nonexistent/x", &b, err, sizeof(err)) != 0 &&
                strstr(err, "does not exist"),
            "missing path: %s", err);
    free(buf);
    free(codes);
    free(info);
    free(map);
    fp8t_weights_free(&w);
}

int main(void) {
    t_suite = "export";
    tu_tmpdir(g_root, sizeof(g_root), "export");
    snprintf(g_ckpt_gpt2, sizeof(g_ckpt_gpt2), "%s/gpt2/checkpoints/step_000006", g_root);
    snprintf(g_ckpt_llama, sizeof(g_ckpt_llama), "%s/llama/checkpoints/step_000006", g_root);
    if (tu_train_checkpoint("tiny", 6, g_ckpt_gpt2) != 0 ||
        tu_train_checkpoint("tiny-llama", 6, g_ckpt_llama) != 0) {
        printf("FAIL export: setup (training the tiny checkpoints)\n");
        return 1;
    }
    T_RUN(test_map_gpt2);
    T_RUN(test_map_llama);
    T_RUN(test_roundtrip_fp32_gpt2);
    T_RUN(test_roundtrip_fp32_llama);
    T_RUN(test_roundtrip_bf16_gpt2);
    T_RUN(test_roundtrip_bf16_llama);
    T_RUN(test_roundtrip_fp8_gpt2);
    T_RUN(test_roundtrip_fp8_llama);
    T_RUN(test_gpt2_layout_and_config);
    T_RUN(test_llmc_import_order);
    T_RUN(test_llmc_roundtrip_logits);
    T_RUN(test_import_to_checkpoint);
    T_RUN(test_malformed_config);
    T_RUN(test_malformed_llama_config);
    T_RUN(test_malformed_tensors);
    if (t_failed_total == 0) fp8t_rmtree(g_root);
    T_MAIN_END();
}
