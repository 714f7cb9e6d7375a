/* Block-scaled FP8 export (fp8train export --dtype fp8 --block 128): transformers' fine-grained
 * FP8 layout. A Llama whose matrices are not multiples of 128 (C = 160, H = 200, GQA 5:1 with
 * 32-row k/v, an untied head) is exported; the file must hold E4M3 codes and F32
 * weight_scale_inv [ceil(N/128), ceil(K/128)] per linear, each block's scale worked out here from
 * the block's own amax (448 / amax, 1 for an all-zero block) and each code the E4M3 rounding of
 * x * scale; config.json the quantization_config transformers reads; the import every weight
 * exactly float(code) * scale_inv; sharding the same tensors; and wrong requests (another block
 * size, another dtype, GPT-2) refused before anything is written. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp8train/export.h"
#include "fp8train/fp8.h"
#include "fp8train/io.h"
#include "fp8train/model.h"
#include "fp8train/recipe.h"
#include "test.h"
#include "util/fs.h"

static char g_root[512];

/* A Llama with partial 128-blocks everywhere, weights from a fixed LCG; each 61x47 patch gets
 * its own magnitude (so 128x128 blocks have different amaxes), and the last rows of layer 1's
 * down_proj are zero (an all-zero partial block). */
static void make_weights(fp8t_weights *w) {
    memset(w, 0, sizeof(*w));
    fp8t_model_preset(&w->model, "tiny-llama");
    fp8t_model_config *c = &w->model;
    c->n_layer = 2;
    c->n_embd = 160;
    c->n_head = 5;
    c->n_kv_head = 1;
    c->mlp_hidden = 200;
    c->seq_len = 64;
    c->vocab_size = 256;
    c->untied_head = 1;
    fp8t_model_param_table(c, NULL, &w->num_params);
    w->params = malloc(w->num_params * sizeof(float));
    snprintf(w->kind, sizeof(w->kind), "test");
    int n = fp8t_model_param_table(c, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)n, sizeof(*info));
    fp8t_model_param_table(c, info, NULL);
    uint32_t s = 12345u;
    for (int i = 0; i < n; i++) {
        const int cols = info[i].ndim == 2 ? info[i].shape[1] : 1;
        for (size_t j = 0; j < info[i].numel; j++) {
            s = s * 1664525u + 1013904223u;
            const float u = (float)(s >> 8) / 16777216.0f - 0.5f; /* [-0.5, 0.5) */
            const int r = (int)(j / (size_t)cols), cc = (int)(j % (size_t)cols);
            const float mag = ldexpf(1.0f, ((r / 61) * 3 + (cc / 47)) % 9 - 6);
            w->params[info[i].offset + j] = u * mag;
        }
        if (!strcmp(info[i].name, "h.1.down.w")) /* [C, H]: rows 128..159 = the last block row */
            memset(w->params + info[i].offset + (size_t)128 * info[i].shape[1], 0,
                   (size_t)32 * info[i].shape[1] * sizeof(float));
    }
    free(info);
}

/* The Hugging Face matrix of map entry t ([rows, cols], Llama: a copy or a row slice). */
static void hf_matrix(float *out, const fp8t_hf_tensor *t, const fp8t_param_info *p,
                      const float *params) {
    const size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : 1;
    const size_t row0 = t->transform == FP8T_HF_ROWS ? (size_t)t->row0 : 0;
    const size_t rows = (size_t)t->shape[0];
    memcpy(out, params + p->offset + row0 * cols, rows * cols * sizeof(float));
}

static int shape_is(const fp8t_st_tensor *t, int ndim, int64_t a, int64_t b) {
    return t && t->ndim == ndim && t->shape[0] == a && (ndim < 2 || t->shape[1] == b);
}

typedef struct {
    fp8t_weights w;
    int n, n_info;
    fp8t_hf_tensor *map;
    fp8t_param_info *info;
    float *x, *y; /* [largest tensor] */
} fixture;

static void fixture_init(fixture *f) {
    make_weights(&f->w);
    f->n = fp8t_hf_tensor_map(&f->w.model, NULL);
    f->map = calloc((size_t)f->n, sizeof(*f->map));
    fp8t_hf_tensor_map(&f->w.model, f->map);
    f->n_info = fp8t_model_param_table(&f->w.model, NULL, NULL);
    f->info = calloc((size_t)f->n_info, sizeof(*f->info));
    fp8t_model_param_table(&f->w.model, f->info, NULL);
    size_t maxn = 0;
    for (int i = 0; i < f->n_info; i++) maxn = f->info[i].numel > maxn ? f->info[i].numel : maxn;
    f->x = malloc(maxn * sizeof(float));
    f->y = malloc(maxn * sizeof(float));
}

static void fixture_free(fixture *f) {
    fp8t_weights_free(&f->w);
    free(f->map);
    free(f->info);
    free(f->x);
    free(f->y);
}

static int export_block(const fixture *f, const char *dir, size_t shard, int pow2,
                        fp8t_export_report *rep) {
    char err[1024];
    fp8t_export_options o = {.dtype = FP8T_EXPORT_FP8,
                             .max_shard_bytes = shard,
                             .fp8_block = 128,
                             .pow2_scales = pow2};
    if (fp8t_export_hf_opts(&f->w, dir, &o, rep, err, sizeof(err)) != 0) {
        printf("  export %s: %s\n", dir, err);
        return -1;
    }
    return 0;
}

/* the file: codes, block scales, BF16 elsewhere, no input_scale; then the import. pow2: scales
 * rounded down to powers of two (export --pow2-scales). */
static void check_block_export(int pow2) {
    fixture f;
    fixture_init(&f);
    char dir[700], path[800], err[1024], name[256];
    snprintf(dir, sizeof(dir), "%s/block%s", g_root, pow2 ? "_pow2" : "");
    fp8t_export_report rep;
    T_ASSERT(export_block(&f, dir, 0, pow2, &rep) == 0, "export failed");
    const int n_mats = 7 * f.w.model.n_layer;
    T_CHECK(rep.n_fp8 == n_mats && rep.fp8_block == 128 && rep.n_shards == 1,
            "report: %d FP8 matrices (want %d), block %d, %d shards", rep.n_fp8, n_mats,
            rep.fp8_block, rep.n_shards);
    T_CHECK(rep.n_tensors == f.n + n_mats, "%d tensors, want %d", rep.n_tensors, f.n + n_mats);

    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    fp8t_st_file *sf;
    T_ASSERT(fp8t_st_open(&sf, path, err, sizeof(err)) == 0, "%s", err);
    const char *fmt = fp8t_st_metadata(sf, "format");
    T_CHECK(fmt && !strcmp(fmt, "pt"), "metadata format %s", fmt ? fmt : "missing");
    T_CHECK(fp8t_st_count(sf) == f.n + n_mats, "%d tensors in the file", fp8t_st_count(sf));
    int bad_shape = 0, bad_scale = 0, bad_code = 0, bad_other = 0, zero_blocks = 0, partial = 0;
    for (int i = 0; i < f.n; i++) {
        const fp8t_hf_tensor *t = &f.map[i];
        const fp8t_st_tensor *wt = fp8t_st_find(sf, t->name);
        hf_matrix(f.x, t, &f.info[t->param], f.w.params);
        if (t->lin < 0) { /* embeddings, norms, the untied head: BF16 */
            const size_t numel = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
            if (!wt || wt->dtype != FP8T_ST_BF16 ||
                !shape_is(wt, t->ndim, t->shape[0], t->shape[1])) {
                bad_other++;
                continue;
            }
            const uint16_t *bits = fp8t_st_data(sf, wt);
            for (size_t j = 0; j < numel; j++) bad_other += bits[j] != bf16_encode(f.x[j]);
            continue;
        }
        const int N = (int)t->shape[0], K = (int)t->shape[1];
        const int nbr = (N + 127) / 128, nbc = (K + 127) / 128;
        partial += N % 128 != 0 || K % 128 != 0;
        snprintf(name, sizeof(name), "%s.weight_scale_inv", t->module);
        const fp8t_st_tensor *st = fp8t_st_find(sf, name);
        snprintf(name, sizeof(name), "%s.input_scale", t->module);
        bad_other += fp8t_st_find(sf, name) != NULL; /* dynamic activations: none */
        if (!wt || wt->dtype != FP8T_ST_F8_E4M3 || !shape_is(wt, 2, N, K) || !st ||
            st->dtype != FP8T_ST_F32 || !shape_is(st, 2, nbr, nbc)) {
            if (bad_shape++ < 3)
                printf("  %s: weight or scale missing, wrong dtype or shape\n", t->name);
            continue;
        }
        const uint8_t *codes = fp8t_st_data(sf, wt);
        const float *sinv = fp8t_st_data(sf, st);
        for (int br = 0; br < nbr; br++)
            for (int bc = 0; bc < nbc; bc++) {
                const int r1 = (br + 1) * 128 < N ? (br + 1) * 128 : N;
                const int c1 = (bc + 1) * 128 < K ? (bc + 1) * 128 : K;
                float amax = 0.0f;
                for (int r = br * 128; r < r1; r++)
                    for (int c = bc * 128; c < c1; c++)
                        amax = fmaxf(amax, fabsf(f.x[(size_t)r * K + c]));
                /* the DeepSeek-V3 rule: scale = 448 / amax, 1 for a block of zeros; with pow2
                 * the largest power of two not above it */
                float scale = amax > 0.0f ? 448.0f / amax : 1.0f;
                if (pow2) scale = ldexpf(1.0f, ilogbf(scale));
                const float si = sinv[(size_t)br * nbc + bc];
                zero_blocks += amax == 0.0f;
                const double want = pow2 ? 1.0 / scale : amax / 448.0;
                if (si != 1.0f / scale || (amax > 0.0f && fabs(si - want) > 1e-6 * want) ||
                    (pow2 && si != ldexpf(1.0f, ilogbf(si)))) {
                    if (bad_scale++ < 3)
                        printf("  %s block (%d,%d): scale_inv %.9g, amax/448 = %.9g\n", t->name,
                               br, bc, (double)si, (double)amax / 448.0);
                }
                for (int r = br * 128; r < r1; r++)
                    for (int c = bc * 128; c < c1; c++) {
                        const size_t j = (size_t)r * K + c;
                        bad_code += codes[j] != fp8_encode(f.x[j] * scale, FP8_E4M3, 1);
                    }
            }
    }
    fp8t_st_close(sf);
    T_CHECK(bad_shape == 0, "%d FP8 weights lack F8_E4M3 [N, K] + F32 [ceil(N/128), ceil(K/128)]",
            bad_shape);
    T_CHECK(bad_scale == 0, "%d block scales are not 1 / (448 / block amax)", bad_scale);
    T_CHECK(bad_code == 0, "%d codes are not the E4M3 rounding of x * block scale", bad_code);
    T_CHECK(bad_other == 0, "%d BF16 tensors/elements wrong or input_scale present", bad_other);
    T_CHECK(zero_blocks == 2 && partial == n_mats,
            "%d all-zero blocks (want 2), %d matrices with "
            "partial blocks (want %d)",
            zero_blocks, partial, n_mats);

    /* config.json: what transformers' FineGrainedFP8Config reads */
    snprintf(path, sizeof(path), "%s/config.json", dir);
    char *text;
    size_t len;
    T_ASSERT(fp8t_read_file(path, &text, &len, err, sizeof(err)) == 0, "%s", err);
    cJSON *o = cJSON_Parse(text);
    free(text);
    T_ASSERT(o, "config.json is not JSON");
    const cJSON *q = cJSON_GetObjectItem(o, "quantization_config");
    T_ASSERT(cJSON_IsObject(q), "no quantization_config");
    const cJSON *qm = cJSON_GetObjectItem(q, "quant_method"),
                *as = cJSON_GetObjectItem(q, "activation_scheme");
    const cJSON *bs = cJSON_GetObjectItem(q, "weight_block_size"),
                *skip = cJSON_GetObjectItem(q, "modules_to_not_convert");
    T_CHECK(cJSON_IsString(qm) && !strcmp(qm->valuestring, "fp8"), "quant_method");
    T_CHECK(cJSON_IsString(as) && !strcmp(as->valuestring, "dynamic"), "activation_scheme");
    T_CHECK(cJSON_IsArray(bs) && cJSON_GetArraySize(bs) == 2 &&
                cJSON_GetArrayItem(bs, 0)->valuedouble == 128 &&
                cJSON_GetArrayItem(bs, 1)->valuedouble == 128,
            "weight_block_size [128, 128]");
    T_CHECK(cJSON_IsArray(skip) && cJSON_GetArraySize(skip) == 1 &&
                !strcmp(cJSON_GetArrayItem(skip, 0)->valuestring, "lm_head"),
            "modules_to_not_convert [\"lm_head\"]");
    T_CHECK(!strcmp(cJSON_GetObjectItem(o, "torch_dtype")->valuestring, "bfloat16"),
            "torch_dtype");
    T_CHECK(cJSON_IsFalse(cJSON_GetObjectItem(o, "tie_word_embeddings")), "untied head");
    cJSON_Delete(o);

    /* import: every linear weight is float(code) * its block's scale_inv, exactly */
    fp8t_weights b;
    T_ASSERT(fp8t_weights_load(dir, &b, err, sizeof(err)) == 0, "import: %s", err);
    T_CHECK(b.stored_dtype == FP8T_EXPORT_FP8, "stored dtype %d", (int)b.stored_dtype);
    T_CHECK(b.fp8_state == NULL, "no input scales: the import must not seed an FP8 state");
    T_CHECK(strstr(b.notes, "128x128 block scales") != NULL, "notes: %s", b.notes);
    T_CHECK(memcmp(&b.model, &f.w.model, sizeof(b.model)) == 0, "model config differs");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    T_ASSERT(fp8t_st_open(&sf, path, err, sizeof(err)) == 0, "%s", err);
    size_t bad = 0, checked = 0, bad_pow2 = 0;
    for (int i = 0; i < f.n; i++) {
        const fp8t_hf_tensor *t = &f.map[i];
        hf_matrix(f.x, t, &f.info[t->param], f.w.params);
        hf_matrix(f.y, t, &f.info[t->param], b.params);
        const size_t numel = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        if (t->lin < 0) {
            for (size_t j = 0; j < numel; j++) bad += f.y[j] != bf16_decode(bf16_encode(f.x[j]));
            continue;
        }
        snprintf(name, sizeof(name), "%s.weight_scale_inv", t->module);
        const uint8_t *codes = fp8t_st_data(sf, fp8t_st_find(sf, t->name));
        const float *sinv = fp8t_st_data(sf, fp8t_st_find(sf, name));
        const int N = (int)t->shape[0], K = (int)t->shape[1], nbc = (K + 127) / 128;
        for (size_t j = 0; j < numel; j++) {
            const float want = fp8_decode(codes[j], FP8_E4M3) *
                               sinv[(j / (size_t)K / 128) * (size_t)nbc + (j % (size_t)K) / 128];
            bad += memcmp(&f.y[j], &want, sizeof(float)) != 0;
            checked++;
        }
        if (pow2) { /* the `block` precision's own dequantization (code / scale) agrees bit for
                     * bit: 1 / scale_inv is exact for a power of two */
            const int nb = ((N + 127) / 128) * nbc;
            float *sc = malloc((size_t)nb * sizeof(float));
            for (int k = 0; k < nb; k++) sc[k] = 1.0f / sinv[k];
            fp8t_block_dequantize(f.x, codes, sc, N, K, 128, 128, FP8_E4M3);
            bad_pow2 += memcmp(f.x, f.y, numel * sizeof(float)) != 0;
            free(sc);
        }
    }
    fp8t_st_close(sf);
    T_CHECK(bad == 0,
            "%zu imported values are not float(code) * scale_inv (BF16 ones: their "
            "rounding)",
            bad);
    T_CHECK(bad_pow2 == 0, "%zu matrices: code * scale_inv differs from code / scale", bad_pow2);
    printf("  %d FP8 matrices, %zu weights checked against code * block scale_inv%s\n", n_mats,
           checked, pow2 ? " (power-of-two scales)" : "");
    fp8t_weights_free(&b);
    fixture_free(&f);
}

/* sharded: the same tensors, scales in their weight's shard, no input_scale in the index */
static void test_block_file_and_import(void) { check_block_export(0); }
static void test_block_pow2(void) { check_block_export(1); }

static void test_block_sharded(void) {
    fixture f;
    fixture_init(&f);
    char one[700], many[700], path[800], err[1024];
    snprintf(one, sizeof(one), "%s/block_one", g_root);
    snprintf(many, sizeof(many), "%s/block_shards", g_root);
    fp8t_export_report r1, r2;
    T_ASSERT(export_block(&f, one, 0, 0, &r1) == 0 && export_block(&f, many, 100000, 0, &r2) == 0,
             "export failed");
    T_CHECK(r2.n_shards > 1, "%d shards", r2.n_shards);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", many);
    char *text;
    size_t len;
    T_ASSERT(fp8t_read_file(path, &text, &len, err, sizeof(err)) == 0, "%s", err);
    cJSON *o = cJSON_Parse(text);
    free(text);
    const cJSON *wm = cJSON_GetObjectItem(o, "weight_map");
    int n_scale = 0, n_input = 0, n_keys = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        n_keys++;
        n_scale += strstr(e->string, ".weight_scale_inv") != NULL;
        n_input += strstr(e->string, ".input_scale") != NULL;
    }
    cJSON_Delete(o);
    T_CHECK(n_scale == r2.n_fp8 && n_input == 0 && n_keys == r2.n_tensors,
            "index: %d keys, %d weight_scale_inv, %d input_scale", n_keys, n_scale, n_input);
    fp8t_weights a, b;
    T_ASSERT(fp8t_weights_load(one, &a, err, sizeof(err)) == 0, "%s", err);
    T_ASSERT(fp8t_weights_load(many, &b, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(a.num_params == b.num_params &&
                memcmp(a.params, b.params, a.num_params * sizeof(float)) == 0,
            "sharded and single-file block exports import differently");
    fp8t_weights_free(&a);
    fp8t_weights_free(&b);
    fixture_free(&f);
}

/* wrong requests: refused with the reason, nothing written */
static void test_block_refused(void) {
    fixture f;
    fixture_init(&f);
    char dir[700], err[1024];
    static const struct {
        fp8t_export_dtype dt;
        int block;
        int gpt2;
        const char *want;
    } C[] = {
        {FP8T_EXPORT_FP8, 64, 0, "128x128"},
        {FP8T_EXPORT_FP8, 256, 0, "--block 256 is not supported"},
        {FP8T_EXPORT_BF16, 128, 0, "need --dtype fp8"},
        {FP8T_EXPORT_FP32, 128, 0, "need --dtype fp8"},
        {FP8T_EXPORT_FP8, 128, 1, "Conv1D"},
        {FP8T_EXPORT_BF16, 0, 0, "--pow2-scales"},
    };
    fp8t_weights g;
    memset(&g, 0, sizeof(g));
    fp8t_model_preset(&g.model, "tiny");
    g.model.n_layer = 1;
    fp8t_model_param_table(&g.model, NULL, &g.num_params);
    g.params = calloc(g.num_params, sizeof(float));
    for (size_t k = 0; k < sizeof(C) / sizeof(C[0]); k++) {
        snprintf(dir, sizeof(dir), "%s/refused_%zu", g_root, k);
        fp8t_export_options o = {
            .dtype = C[k].dt, .fp8_block = C[k].block, .pow2_scales = C[k].block == 0};
        const fp8t_weights *w = C[k].gpt2 ? &g : &f.w;
        err[0] = 0;
        int rc = fp8t_export_hf_opts(w, dir, &o, NULL, err, sizeof(err));
        printf("  case %zu: %s\n", k, err);
        T_CHECK(rc != 0 && strstr(err, C[k].want), "case %zu: rc %d, error should mention '%s'",
                k, rc, C[k].want);
        T_CHECK(!fp8t_path_exists(dir), "case %zu: %s was created", k, dir);
        char e2[1024] = "";
        T_CHECK(fp8t_export_options_check(&w->model, &o, e2, sizeof(e2)) != 0 && !strcmp(e2, err),
                "case %zu: fp8t_export_options_check disagrees ('%s')", k, e2);
    }
    /* the per-tensor layout is still the default: block 0 passes the check for GPT-2 too */
    fp8t_export_options o = {.dtype = FP8T_EXPORT_FP8};
    T_CHECK(fp8t_export_options_check(&g.model, &o, err, sizeof(err)) == 0, "per-tensor refused");
    fp8t_weights_free(&g);
    fixture_free(&f);
}

int main(void) {
    t_suite = "export_block";
    snprintf(g_root, sizeof(g_root), "/tmp/fp8t_export_block_%ld", (long)getpid());
    fp8t_rmtree(g_root);
    fp8t_mkdirs(g_root, NULL, 0);
    T_RUN(test_block_file_and_import);
    T_RUN(test_block_pow2);
    T_RUN(test_block_sharded);
    T_RUN(test_block_refused);
    if (t_failed_total == 0) fp8t_rmtree(g_root);
    T_MAIN_END();
}
