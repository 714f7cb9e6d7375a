/* Import: Hugging Face GPT-2 / Llama / Qwen2 directories (ours or the Hub's), llm.c GPT-2 checkpoints
 * and fp8train checkpoints into fp8t_weights, and fp8t_weights into a fresh training
 * checkpoint. Every reader checks the config keys, every tensor's presence, dtype and shape,
 * and rejects tensors it does not understand, naming the file and the fix. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/checkpoint.h"
#include "fp8train/error.h"
#include "fp8train/export.h"
#include "fp8train/fp8.h"
#include "fp8train/io.h"
#include "fp8train/policy.h"
#include "fp8train/recipe.h"
#include "util/fs.h"

#define PATH_BUF 4200

/* Append to w->notes ("; "-separated). */
static void note(fp8t_weights *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(fp8t_weights *w, const char *fmt, ...) {
    size_t used = strlen(w->notes);
    if (used + 3 >= sizeof(w->notes)) return;
    if (used) {
        strcat(w->notes, "; ");
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->notes + used, sizeof(w->notes) - used, fmt, ap);
    va_end(ap);
}

void fp8t_weights_free(fp8t_weights *w) {
    if (!w) return;
    free(w->params);
    free(w->fp8_state);
    free(w->config_json);
    free(w->policy_json);
    memset(w, 0, sizeof(*w));
}

static int alloc_params(fp8t_weights *w, char *err, size_t errlen) {
    char e[FP8T_ERR_LEN];
    if (fp8t_model_config_check(&w->model, e, sizeof(e)) != 0)
        return fp8t_errorf(err, errlen,
                           "%s: the model it describes is not valid for fp8train: %s", w->source,
                           e);
    fp8t_model_param_table(&w->model, NULL, &w->num_params);
    w->params = calloc(w->num_params ? w->num_params : 1, sizeof(float));
    if (!w->params)
        return fp8t_errorf(err, errlen, "%s: out of memory for %zu parameters", w->source,
                           w->num_params);
    return 0;
}

/* The formats of the FP8 tensors of a model (X, W: E4M3; dY: E5M2 with the default hybrid). */
static void default_state(float *state, int n, int len) {
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    fp8_format *fmts = malloc((size_t)n * sizeof(fp8_format));
    for (int t = 0; fmts && t < n; t++)
        fmts[t] = (t % 3 == FP8T_ROLE_DY && pol.hybrid) ? FP8_E5M2 : FP8_E4M3;
    fp8t_recipe_state st;
    fp8t_recipe_state_view(&st, state, n, len);
    fp8t_recipe_state_reset(&st, fmts);
    free(fmts);
}

/* ================================================================ fp8train checkpoint */

int fp8t_weights_from_checkpoint(const char *dir, fp8t_weights *w, char *err, size_t errlen) {
    memset(w, 0, sizeof(*w));
    fp8t_checkpoint ck;
    if (fp8t_checkpoint_load(dir, NULL, &ck, err, errlen) != 0) return -1;
    w->model = ck.model;
    w->num_params = ck.num_params;
    w->params = ck.params;
    w->fp8_n = ck.fp8_n;
    w->fp8_len = ck.fp8_len;
    w->fp8_state = ck.fp8_state;
    w->step = ck.step;
    w->seed = ck.seed;
    w->config_json = ck.config_json;
    w->policy_json = ck.policy_json;
    w->stored_dtype = FP8T_EXPORT_FP32;
    snprintf(w->kind, sizeof(w->kind), "checkpoint");
    snprintf(w->source, sizeof(w->source), "%s", dir);
    free(ck.adam_m);
    free(ck.adam_v);
    return 0;
}

/* ================================================================ llm.c GPT-2 */

int fp8t_import_llmc(const char *path, fp8t_weights *w, char *err, size_t errlen) {
    memset(w, 0, sizeof(*w));
    fp8t_llmc_gpt2 ck;
    if (fp8t_llmc_gpt2_read(path, &ck, err, errlen) != 0) return -1;
    snprintf(w->kind, sizeof(w->kind), "llmc-gpt2");
    snprintf(w->source, sizeof(w->source), "%s", path);
    w->stored_dtype = ck.version == 5 ? FP8T_EXPORT_BF16 : FP8T_EXPORT_FP32;
    fp8t_model_config *c = &w->model;
    c->arch = FP8T_ARCH_GPT2;
    c->n_layer = ck.num_layers;
    c->n_embd = ck.channels;
    c->n_head = ck.num_heads;
    c->seq_len = ck.max_seq_len;
    c->vocab_size = ck.vocab_size;
    c->mlp_hidden = 4 * ck.channels; /* llm.c's GPT-2 MLP is always 4C */
    c->rope_theta = 10000.0f;        /* unused by GPT-2 */
    c->norm_eps = 1e-5f;             /* llm.c's LayerNorm epsilon */
    if (alloc_params(w, err, errlen) != 0) {
        fp8t_llmc_gpt2_free(&ck);
        fp8t_weights_free(w);
        return -1;
    }
    int n = fp8t_model_param_table(c, NULL, NULL);
    fp8t_param_info *info = calloc((size_t)n, sizeof(*info));
    size_t *at = malloc((size_t)n * sizeof(*at)); /* [n] llm.c offset of each tensor */
    const size_t V = (size_t)c->vocab_size, Vp = (size_t)ck.padded_vocab_size;
    if (!info || !at || fp8t_llmc_param_offsets(c, Vp, at) == 0) {
        free(info);
        free(at);
        fp8t_llmc_gpt2_free(&ck);
        fp8t_weights_free(w);
        return fp8t_errorf(err, errlen, "%s: out of memory", path);
    }
    fp8t_model_param_table(c, info, NULL);
    for (int i = 0; i < n; i++) /* wte: the first V of the Vp rows */
        memcpy(w->params + info[i].offset, ck.params + at[i], info[i].numel * sizeof(float));
    if (Vp > V)
        note(w, "dropped llm.c's %zu vocabulary padding rows (Vp %zu -> vocab %zu)", Vp - V, Vp,
             V);
    free(info);
    free(at);
    fp8t_llmc_gpt2_free(&ck);
    return 0;
}

/* ================================================================ Hugging Face */

/* The tensors of a Hugging Face directory: one model.safetensors or the shards named by
 * model.safetensors.index.json. used[f][i] marks tensors consumed by the import. */
typedef struct {
    int n_files;
    fp8t_st_file **files;
    char **used; /* [n_files][count of file] */
} tensor_set;

static void tensors_close(tensor_set *s) {
    for (int i = 0; i < s->n_files; i++) {
        fp8t_st_close(s->files[i]);
        free(s->used[i]);
    }
    free(s->files);
    free(s->used);
    memset(s, 0, sizeof(*s));
}

static int tensors_add_file(tensor_set *s, const char *path, char *err, size_t errlen) {
    fp8t_st_file **nf = realloc(s->files, (size_t)(s->n_files + 1) * sizeof(*nf));
    if (!nf) return fp8t_errorf(err, errlen, "out of memory");
    s->files = nf;
    char **nu = realloc(s->used, (size_t)(s->n_files + 1) * sizeof(*nu));
    if (!nu) return fp8t_errorf(err, errlen, "out of memory");
    s->used = nu;
    fp8t_st_file *f;
    if (fp8t_st_open(&f, path, err, errlen) != 0) return -1;
    int cnt = fp8t_st_count(f);
    s->used[s->n_files] = calloc((size_t)(cnt > 0 ? cnt : 1), 1);
    if (!s->used[s->n_files]) {
        fp8t_st_close(f);
        return fp8t_errorf(err, errlen, "out of memory");
    }
    s->files[s->n_files++] = f;
    return 0;
}

static int tensors_open(tensor_set *s, const char *dir, char *err, size_t errlen) {
    memset(s, 0, sizeof(*s));
    char path[PATH_BUF];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if (fp8t_is_regular_file(path)) {
        int rc = tensors_add_file(s, path, err, errlen);
        if (rc != 0) tensors_close(s);
        return rc;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    if (!fp8t_is_regular_file(path))
        return fp8t_errorf(
            err, errlen,
            "%s: neither model.safetensors nor model.safetensors.index.json "
            "is there; a Hugging Face directory needs its weights in safetensors (convert "
            "pytorch_model.bin with transformers' save_pretrained(safe_serialization=True))",
            dir);
    char *text = NULL;
    size_t len;
    if (fp8t_read_file(path, &text, &len, err, errlen) != 0) return -1;
    cJSON *o = cJSON_ParseWithLength(text, len);
    if (!o) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= text && at <= text + len ? (long)(at - text) : -1;
        free(text);
        return fp8t_errorf(err, errlen,
                           "%s: not valid JSON (truncated or damaged near byte %ld of %zu); "
                           "copy the model's index file again",
                           path, off, len);
    }
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(o, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(o);
        return fp8t_errorf(err, errlen, "%s: not a safetensors index (no \"weight_map\" object)",
                           path);
    }
    /* open each distinct shard once (names[i] is s->files[i]) and hold the index to its word:
     * every tensor it lists is in the shard it names, as transformers' loader expects */
    const cJSON *e;
    int rc = 0;
    char **names = NULL;
    int n_names = 0;
    cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !*e->valuestring) {
            rc = fp8t_errorf(err, errlen,
                             "%s: weight_map[\"%s\"] must be a file name in the directory", path,
                             e->string ? e->string : "?");
            break;
        }
        int at = 0;
        while (at < n_names && strcmp(names[at], e->valuestring) != 0) at++;
        if (at == n_names) {
            char **nn = realloc(names, (size_t)(n_names + 1) * sizeof(*nn));
            if (!nn) {
                rc = fp8t_errorf(err, errlen, "out of memory");
                break;
            }
            names = nn;
            names[n_names++] = e->valuestring;
            char shard[PATH_BUF];
            snprintf(shard, sizeof(shard), "%s/%s", dir, e->valuestring);
            char why[PATH_BUF + 256];
            if (tensors_add_file(s, shard, why, sizeof(why)) != 0) {
                rc = fp8t_errorf(err, errlen, "%s lists the shard %s, which cannot be read: %s",
                                 path, e->valuestring, why);
                break;
            }
        }
        if (!fp8t_st_find(s->files[at], e->string)) {
            rc = fp8t_errorf(err, errlen,
                             "%s: weight_map puts tensor '%s' in %s, but %s/%s does not hold it; "
                             "the index does not belong to these shard files (copy the model "
                             "directory again, or save it again with save_pretrained)",
                             path, e->string, e->valuestring, dir, e->valuestring);
            break;
        }
    }
    free(names);
    cJSON_Delete(o);
    if (rc == 0 && s->n_files == 0)
        rc = fp8t_errorf(err, errlen, "%s: the weight_map is empty", path);
    if (rc != 0) tensors_close(s);
    return rc;
}

typedef struct {
    fp8t_st_file *file;
    const fp8t_st_tensor *t;
    char name[192]; /* the name found (with or without the "transformer."/"model." prefix) */
} found_tensor;

static int tensors_find_exact(tensor_set *s, const char *name, found_tensor *out) {
    for (int f = 0; f < s->n_files; f++) {
        const fp8t_st_tensor *t = fp8t_st_find(s->files[f], name);
        if (t) {
            s->used[f][t - fp8t_st_get(s->files[f], 0)] = 1; /* its header index */
            out->file = s->files[f];
            out->t = t;
            snprintf(out->name, sizeof(out->name), "%s", name);
            return 1;
        }
    }
    return 0;
}

/* Find `name`, also without its top-level prefix (the Hub's original gpt2 files say
 * "h.0.attn.c_attn.weight", transformers writes "transformer.h.0...."). */
static int tensors_find(tensor_set *s, const char *name, found_tensor *out) {
    if (tensors_find_exact(s, name, out)) return 1;
    const char *dot = strchr(name, '.');
    if (dot && (!strncmp(name, "transformer.", 12) || !strncmp(name, "model.", 6)))
        return tensors_find_exact(s, dot + 1, out);
    return 0;
}

static int is_float_dtype(fp8t_st_dtype d) {
    return d == FP8T_ST_F32 || d == FP8T_ST_F16 || d == FP8T_ST_BF16 || d == FP8T_ST_F64 ||
           d == FP8T_ST_F8_E4M3 || d == FP8T_ST_F8_E5M2;
}

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* ---- config.json ---- */

typedef struct {
    const char *path;
    const cJSON *o;
    char *err;
    size_t errlen;
    const char *needs; /* list of required keys, for the error message */
} cfg_reader;

/* Integer key: required (def < 0 means required) or default. */
static int cfg_int(cfg_reader *r, const char *key, int def, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->o, key);
    if (!v || cJSON_IsNull(v)) {
        if (def >= 0) {
            *out = def;
            return 0;
        }
        return fp8t_errorf(r->err, r->errlen, "%s: \"%s\" is missing; %s", r->path, key,
                           r->needs);
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > (1 << 30) ||
        v->valuedouble != floor(v->valuedouble))
        return fp8t_errorf(r->err, r->errlen, "%s: \"%s\" must be a positive integer", r->path,
                           key);
    *out = (int)v->valuedouble;
    return 0;
}

static int cfg_float(cfg_reader *r, const char *key, double def, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = (float)def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
        return fp8t_errorf(r->err, r->errlen, "%s: \"%s\" must be a positive number", r->path,
                           key);
    *out = (float)v->valuedouble;
    return 0;
}

/* A boolean key that must have `want` if present (a feature fp8train's model lacks). */
static int cfg_bool_must(cfg_reader *r, const char *key, int want, const char *why) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v))
        return fp8t_errorf(r->err, r->errlen, "%s: \"%s\" must be true or false", r->path, key);
    if (cJSON_IsTrue(v) != want)
        return fp8t_errorf(r->err, r->errlen, "%s: \"%s\": %s is not supported: %s", r->path, key,
                           want ? "false" : "true", why);
    return 0;
}

static int cfg_string_in(cfg_reader *r, const char *key, const char *def, const char *const *ok,
                         const char *why) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->o, key);
    const char *s = def;
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v))
            return fp8t_errorf(r->err, r->errlen, "%s: \"%s\" must be a string", r->path, key);
        s = v->valuestring;
    }
    for (int i = 0; ok[i]; i++)
        if (strcmp(s, ok[i]) == 0) return 0;
    return fp8t_errorf(r->err, r->errlen, "%s: \"%s\" = \"%s\" is not supported: %s", r->path,
                       key, s, why);
}

/* One number of a RoPE object; absent -> def. */
static int rope_num(const char *path, const char *obj_name, const cJSON *rs, const char *key,
                    double def, double *out, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rs, key);
    if (!v || cJSON_IsNull(v)) {
        if (def < 0)
            return fp8t_errorf(err, errlen, "%s: \"%s\" of rope type llama3 needs \"%s\"", path,
                               obj_name, key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
        return fp8t_errorf(err, errlen, "%s: \"%s\".\"%s\" must be a positive number", path,
                           obj_name, key);
    *out = v->valuedouble;
    return 0;
}

/* RoPE: rope_theta and the frequency scaling, from "rope_scaling" (transformers up to 4.x) or
 * "rope_parameters" (newer transformers, which moves rope_theta inside it too). Types
 * "default" and "llama3"; anything else (linear, dynamic, yarn, longrope) is refused. */
static int parse_rope(const char *path, const cJSON *o, fp8t_model_config *c, char *err,
                      size_t errlen) {
    const char *name = "rope_parameters";
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!rs || cJSON_IsNull(rs)) {
        name = "rope_scaling";
        rs = cJSON_GetObjectItemCaseSensitive(o, name);
    }
    if (!rs || cJSON_IsNull(rs)) return 0;
    if (!cJSON_IsObject(rs))
        return fp8t_errorf(err, errlen, "%s: \"%s\" must be an object or null", path, name);
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(rs, "rope_theta");
    if (th && !cJSON_IsNull(th)) {
        if (!cJSON_IsNumber(th) || !(th->valuedouble > 0) || !isfinite(th->valuedouble))
            return fp8t_errorf(err, errlen, "%s: \"%s\".\"rope_theta\" must be a positive number",
                               path, name);
        c->rope_theta = (float)th->valuedouble;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!ty || cJSON_IsNull(ty)) ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const char *type = cJSON_IsString(ty) ? ty->valuestring : "default";
    if (!strcmp(type, "default")) return 0;
    if (strcmp(type, "llama3") != 0)
        return fp8t_errorf(err, errlen,
                           "%s: \"%s\" has rope_type \"%s\", which fp8train does not support "
                           "(\"default\" and \"llama3\" only)",
                           path, name, type);
    double factor, lo, hi, orig;
    if (rope_num(path, name, rs, "factor", -1, &factor, err, errlen) ||
        rope_num(path, name, rs, "low_freq_factor", -1, &lo, err, errlen) ||
        rope_num(path, name, rs, "high_freq_factor", -1, &hi, err, errlen) ||
        rope_num(path, name, rs, "original_max_position_embeddings", -1, &orig, err, errlen))
        return -1;
    if (!(hi > lo) || orig != floor(orig) || orig > (1 << 30))
        return fp8t_errorf(err, errlen,
                           "%s: \"%s\": llama3 needs high_freq_factor > low_freq_factor and an "
                           "integer original_max_position_embeddings",
                           path, name);
    c->rope_scaling.type = FP8T_ROPE_LLAMA3;
    c->rope_scaling.factor = (float)factor;
    c->rope_scaling.low_freq_factor = (float)lo;
    c->rope_scaling.high_freq_factor = (float)hi;
    c->rope_scaling.original_max_pos = (int)orig;
    return 0;
}

static int parse_hf_config(const char *path, const cJSON *o, fp8t_model_config *c, int *tied,
                           char *err, size_t errlen) {
    memset(c, 0, sizeof(*c));
    cfg_reader r = {path, o, err, errlen, ""};
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    if (!cJSON_IsString(mt))
        return fp8t_errorf(err, errlen,
                           "%s: \"model_type\" is missing; fp8train imports model_type "
                           "\"gpt2\", \"llama\" or \"qwen2\"",
                           path);
    const cJSON *tw = cJSON_GetObjectItemCaseSensitive(o, "tie_word_embeddings");
    if (tw && !cJSON_IsNull(tw) && !cJSON_IsBool(tw))
        return fp8t_errorf(err, errlen, "%s: \"tie_word_embeddings\" must be true or false",
                           path);
    if (!strcmp(mt->valuestring, "gpt2")) {
        r.needs = "a GPT-2 config needs n_embd, n_layer, n_head, n_positions and vocab_size";
        c->arch = FP8T_ARCH_GPT2;
        if (cfg_int(&r, "n_embd", -1, &c->n_embd) || cfg_int(&r, "n_layer", -1, &c->n_layer) ||
            cfg_int(&r, "n_head", -1, &c->n_head) ||
            cfg_int(&r, "vocab_size", -1, &c->vocab_size))
            return -1;
        int n_ctx = -1;
        if (cfg_int(&r, "n_ctx", 0, &n_ctx)) return -1;
        if (cfg_int(&r, "n_positions", n_ctx > 0 ? n_ctx : -1, &c->seq_len)) return -1;
        if (cfg_int(&r, "n_inner", 4 * c->n_embd, &c->mlp_hidden)) return -1;
        if (cfg_float(&r, "layer_norm_epsilon", 1e-5, &c->norm_eps)) return -1;
        c->rope_theta = 10000.0f;
        static const char *const acts[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
        if (cfg_string_in(&r, "activation_function", "gelu_new", acts,
                          "fp8train's GPT-2 MLP uses the tanh GELU (gelu_new)") ||
            cfg_bool_must(&r, "scale_attn_weights", 1,
                          "fp8train scales attention by 1/sqrt(HS)") ||
            cfg_bool_must(&r, "scale_attn_by_inverse_layer_idx", 0,
                          "fp8train does not scale attention per layer") ||
            cfg_bool_must(&r, "add_cross_attention", 0, "decoder-only models only"))
            return -1;
        *tied = !tw || cJSON_IsNull(tw) || cJSON_IsTrue(tw); /* GPT2Config default: tied */
        c->untied_head = !*tied;
    } else if (!strcmp(mt->valuestring, "llama") || !strcmp(mt->valuestring, "qwen2")) {
        /* Qwen2 is Llama with biases on q, k and v (and a sliding window we refuse) */
        const int qwen2 = !strcmp(mt->valuestring, "qwen2");
        r.needs =
            "a Llama/Qwen2 config needs hidden_size, num_hidden_layers, "
            "num_attention_heads, intermediate_size, max_position_embeddings and vocab_size";
        c->arch = FP8T_ARCH_LLAMA;
        if (cfg_int(&r, "hidden_size", -1, &c->n_embd) ||
            cfg_int(&r, "num_hidden_layers", -1, &c->n_layer) ||
            cfg_int(&r, "num_attention_heads", -1, &c->n_head) ||
            cfg_int(&r, "intermediate_size", -1, &c->mlp_hidden) ||
            cfg_int(&r, "max_position_embeddings", -1, &c->seq_len) ||
            cfg_int(&r, "vocab_size", -1, &c->vocab_size))
            return -1;
        int kv, hd;
        if (cfg_int(&r, "num_key_value_heads", c->n_head, &kv)) return -1;
        if (kv > c->n_head || c->n_head % kv != 0)
            return fp8t_errorf(err, errlen,
                               "%s: num_key_value_heads = %d must divide num_attention_heads = "
                               "%d (grouped-query attention shares each K/V head among "
                               "num_attention_heads / num_key_value_heads query heads)",
                               path, kv, c->n_head);
        /* 0 = as many K/V heads as query heads: the form older fp8train configs have */
        c->n_kv_head = kv == c->n_head ? 0 : kv;
        if (c->n_embd % c->n_head != 0)
            return fp8t_errorf(err, errlen,
                               "%s: hidden_size %d is not divisible by num_attention_heads "
                               "%d",
                               path, c->n_embd, c->n_head);
        if (cfg_int(&r, "head_dim", c->n_embd / c->n_head, &hd)) return -1;
        if (hd != c->n_embd / c->n_head)
            return fp8t_errorf(err, errlen,
                               "%s: head_dim = %d differs from hidden_size / "
                               "num_attention_heads = %d: not supported (fp8train's head size "
                               "is hidden_size / num_attention_heads)",
                               path, hd, c->n_embd / c->n_head);
        if (cfg_float(&r, "rms_norm_eps", 1e-6, &c->norm_eps) ||
            cfg_float(&r, "rope_theta", 10000.0, &c->rope_theta))
            return -1;
        if (parse_rope(path, o, c, err, errlen) != 0) return -1;
        static const char *const acts[] = {"silu", "swish", NULL};
        if (cfg_string_in(&r, "hidden_act", "silu", acts,
                          "fp8train's Llama MLP is SwiGLU (silu)"))
            return -1;
        if (qwen2) {
            c->qkv_bias = 1;
            if (cfg_bool_must(
                    &r, "use_sliding_window", 0,
                    "fp8train's attention is full causal attention (no sliding window)"))
                return -1;
        } else if (cfg_bool_must(&r, "attention_bias", 0,
                                 "Llama's attention_bias adds a bias to o_proj too; fp8train's "
                                 "Llama has biases on q, k, v only (Qwen2)") ||
                   cfg_bool_must(&r, "mlp_bias", 0, "fp8train's Llama MLP has no biases")) {
            return -1;
        }
        /* LlamaConfig and Qwen2Config default to an untied head */
        *tied = tw && cJSON_IsTrue(tw);
        c->untied_head = !*tied;
    } else {
        return fp8t_errorf(
            err, errlen,
            "%s: model_type \"%s\" is not supported; fp8train imports "
            "\"gpt2\" (GPT2LMHeadModel), \"llama\" (LlamaForCausalLM) and \"qwen2\" "
            "(Qwen2ForCausalLM)",
            path, mt->valuestring);
    }
    return 0;
}

/* Known tensors a Hugging Face file may hold that carry nothing the model needs. */
static int harmless_extra(const char *name) {
    static const char *const suffixes[] = {".attn.bias", ".attn.masked_bias",
                                           "rotary_emb.inv_freq", NULL};
    size_t n = strlen(name);
    for (int i = 0; suffixes[i]; i++) {
        size_t k = strlen(suffixes[i]);
        if (n >= k && strcmp(name + n - k, suffixes[i]) == 0) return 1;
    }
    return 0;
}

/* Scale tensor `<module>.<what>` as FP32 values (count in *n, up to cap); 0 found, 1 absent,
 * -1 error. */
static int read_scale(tensor_set *s, const char *module, const char *what, float *out, size_t cap,
                      found_tensor *ft, const char *dir, char *err, size_t errlen) {
    char name[256];
    snprintf(name, sizeof(name), "%s.%s", module, what);
    if (!tensors_find_exact(s, name, ft)) return 1;
    if (!is_float_dtype(ft->t->dtype) || ft->t->numel == 0 || ft->t->numel > cap)
        return fp8t_errorf(err, errlen,
                           "%s: scale tensor '%s' must be a floating-point tensor with 1 "
                           "to %zu elements (it is %s with %zu)",
                           dir, name, cap, fp8t_st_dtype_name(ft->t->dtype), ft->t->numel);
    if (fp8t_st_read_f32(ft->file, name, out, ft->t->numel, err, errlen) != 0) return -1;
    for (size_t i = 0; i < ft->t->numel; i++)
        if (!(out[i] > 0.0f) || !isfinite(out[i]))
            return fp8t_errorf(err, errlen,
                               "%s: scale tensor '%s' holds %g at element %zu; scales must be "
                               "positive and finite",
                               dir, name, (double)out[i], i);
    return 0;
}

/* Dequantize an FP8 weight buf [R, Cc] (decoded codes) with its per-tensor or block scales. */
static int dequantize(float *buf, int R, int Cc, const float *sc, const fp8t_st_tensor *st,
                      const int *block, const char *dir, const char *name, char *err,
                      size_t errlen) {
    const size_t numel = (size_t)R * (size_t)Cc;
    if (st->numel == 1) {
        for (size_t i = 0; i < numel; i++) buf[i] *= sc[0];
        return 0;
    }
    if (block[0] > 0 && block[1] > 0 && st->ndim == 2) {
        const int64_t br = (R + block[0] - 1) / block[0], bc = (Cc + block[1] - 1) / block[1];
        if (st->shape[0] == br && st->shape[1] == bc) {
            for (int r = 0; r < R; r++)
                for (int c = 0; c < Cc; c++)
                    buf[(size_t)r * Cc + c] *=
                        sc[(size_t)(r / block[0]) * (size_t)bc + (size_t)(c / block[1])];
            return 0;
        }
    }
    char got[64];
    shape_str(got, sizeof(got), st->ndim, st->shape);
    return fp8t_errorf(err, errlen,
                       "%s: the scale of FP8 tensor '%s' has shape %s: expected one value "
                       "(per tensor) or [ceil(%d/b0), ceil(%d/b1)] with quantization_config."
                       "weight_block_size [b0, b1]",
                       dir, name, got, R, Cc);
}

/* One Hugging Face import in progress: the files, our parameter table and the HF tensor map of
 * the config, what the tensors said about FP8 (input scales, weight amaxes, block scales) */
typedef struct {
    const char *dir;
    fp8t_weights *w;
    tensor_set s;
    int n_info, n_map, n_lin;
    fp8t_param_info *info;
    fp8t_hf_tensor *map;
    float *lin_x_scale; /* [n_lin] max input_scale */
    float *lin_w_amax;  /* [n_lin] amax of FP8 weights */
    float *buf, *sc;    /* [maxn] one tensor in the HF layout, and its scales (at most one
                               per element) */
    size_t maxn;
    int block[2]; /* quantization_config.weight_block_size, or 0 0 */
    int n_fp8, n_fp8_block, n_inscale, n_dtype[FP8T_ST_DTYPE_COUNT];
} hf_import;

/* config.json: the model config (GPT-2, Llama or Qwen2), the FP8 quantization config */
static int read_hf_config(hf_import *im, char *err, size_t errlen) {
    const char *dir = im->dir;
    fp8t_weights *w = im->w;
    char cpath[PATH_BUF];
    snprintf(cpath, sizeof(cpath), "%s/config.json", dir);
    char *text = NULL;
    size_t len;
    char e[FP8T_ERR_LEN];
    if (fp8t_read_file(cpath, &text, &len, e, sizeof(e)) != 0)
        return fp8t_errorf(err, errlen,
                           "%s: cannot read config.json (%s); a Hugging Face model "
                           "directory holds config.json and model.safetensors",
                           dir, e);
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return fp8t_errorf(err, errlen, "%s: not a JSON object", cpath);
    }
    int tied = 1; /* (c->untied_head says the same; kept for the parser's GPT-2 default) */
    if (parse_hf_config(cpath, cfg, &w->model, &tied, err, errlen) != 0) {
        cJSON_Delete(cfg);
        return -1;
    }
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    if (q && !cJSON_IsNull(q)) {
        const cJSON *qm = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
        const char *qms = cJSON_IsString(qm) ? qm->valuestring : "";
        if (strcmp(qms, "fp8") != 0) {
            int rc =
                fp8t_errorf(err, errlen,
                            "%s: quantization_config.quant_method \"%s\" is not "
                            "supported (only \"fp8\": F8_E4M3 weights with weight_scale_inv)",
                            cpath, qms);
            cJSON_Delete(cfg);
            return rc;
        }
        const cJSON *bs = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
        if (cJSON_IsArray(bs) && cJSON_GetArraySize(bs) == 2) {
            const cJSON *b0 = cJSON_GetArrayItem(bs, 0), *b1 = cJSON_GetArrayItem(bs, 1);
            if (cJSON_IsNumber(b0) && cJSON_IsNumber(b1) && b0->valuedouble >= 1 &&
                b1->valuedouble >= 1 && b0->valuedouble < 1e6 && b1->valuedouble < 1e6) {
                im->block[0] = (int)b0->valuedouble;
                im->block[1] = (int)b1->valuedouble;
            }
        }
    }
    cJSON_Delete(cfg);
    snprintf(w->kind, sizeof(w->kind), "hf-%s",
             w->model.qkv_bias ? "qwen2" : fp8t_arch_name(w->model.arch));
    return 0;
}

/* The tables and buffers of the import, for the config read */
static int open_import(hf_import *im, char *err, size_t errlen) {
    const fp8t_model_config *c = &im->w->model;
    im->n_info = fp8t_model_param_table(c, NULL, NULL);
    im->n_map = fp8t_hf_tensor_map(c, NULL);
    im->n_lin = fp8t_model_num_linears(c);
    im->info = calloc((size_t)im->n_info, sizeof(*im->info));
    im->map = calloc((size_t)im->n_map, sizeof(*im->map));
    im->lin_x_scale = calloc((size_t)im->n_lin, sizeof(float));
    im->lin_w_amax = calloc((size_t)im->n_lin, sizeof(float));
    if (!im->info || !im->map || !im->lin_x_scale || !im->lin_w_amax)
        return fp8t_errorf(err, errlen, "out of memory");
    fp8t_model_param_table(c, im->info, NULL);
    fp8t_hf_tensor_map(c, im->map);
    for (int i = 0; i < im->n_map; i++) {
        const fp8t_hf_tensor *m = &im->map[i];
        size_t k = (size_t)m->shape[0] * (size_t)(m->ndim == 2 ? m->shape[1] : 1);
        im->maxn = k > im->maxn ? k : im->maxn;
    }
    im->buf = malloc(im->maxn * sizeof(float));
    im->sc = malloc(im->maxn * sizeof(float));
    if (!im->buf || !im->sc)
        return fp8t_errorf(err, errlen, "out of memory (%zu-element tensor)", im->maxn);
    return 0;
}

/* One tensor of the map: found, of the config's shape and a float dtype, dequantized when
 * FP8 (its weight_scale_inv), its input_scale noted, finite, scattered into our layout */
static int import_tensor(hf_import *im, const fp8t_hf_tensor *ht, char *err, size_t errlen) {
    const char *dir = im->dir;
    const fp8t_model_config *c = &im->w->model;
    tensor_set *s = &im->s;
    float *buf = im->buf, *sc = im->sc;
    const size_t maxn = im->maxn;
    found_tensor ft;
    if (!tensors_find(s, ht->name, &ft)) {
        return fp8t_errorf(
            err, errlen,
            "%s: tensor '%s' is missing; the %s config in config.json (%d "
            "layers, n_embd %d) needs it: the weights do not match the config, or the file "
            "is incomplete",
            dir, ht->name, fp8t_arch_name(c->arch), c->n_layer, c->n_embd);
    }
    const fp8t_st_tensor *t = ft.t;
    int same = t->ndim == ht->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == ht->shape[d];
    if (!same) {
        char got[96], want[96];
        shape_str(got, sizeof(got), t->ndim, t->shape);
        shape_str(want, sizeof(want), ht->ndim, ht->shape);
        const char *hint = ht->transform == FP8T_HF_TRANSPOSE
                               ? " (GPT-2 Conv1D weights are [in, out]: a transposed "
                                 "nn.Linear layout would cause this)"
                               : "";
        return fp8t_errorf(err, errlen,
                           "%s: tensor '%s' has shape %s but config.json implies %s%s", dir,
                           ft.name, got, want, hint);
    }
    if (!is_float_dtype(t->dtype)) {
        return fp8t_errorf(err, errlen,
                           "%s: tensor '%s' has dtype %s; weights must be F32, F16, BF16 or "
                           "F8_E4M3/F8_E5M2 (with weight_scale_inv)",
                           dir, ft.name, fp8t_st_dtype_name(t->dtype));
    }
    const size_t numel = t->numel;
    if (fp8t_st_read_f32(ft.file, ft.name, buf, numel, err, errlen) != 0) return -1;
    if (ht->lin >= 0) im->n_dtype[t->dtype]++;
    /* the module prefix as found (with or without the top-level prefix) */
    char module[192];
    snprintf(module, sizeof(module), "%s", ft.name);
    char *dot = strrchr(module, '.');
    if (dot) *dot = 0;
    const int is_fp8 = t->dtype == FP8T_ST_F8_E4M3 || t->dtype == FP8T_ST_F8_E5M2;
    if (is_fp8) {
        if (ht->lin < 0) {
            return fp8t_errorf(err, errlen,
                               "%s: tensor '%s' is FP8 but only linear-layer weights may be "
                               "(embeddings, norms and biases must be F32/F16/BF16)",
                               dir, ft.name);
        }
        found_tensor fs;
        /* weight_scale_inv (DeepSeek/transformers naming); weight_scale is what vLLM's
         * per-tensor FP8 checkpoints call the same dequantization factor */
        int r = read_scale(s, module, "weight_scale_inv", sc, maxn, &fs, dir, err, errlen);
        if (r == 1) r = read_scale(s, module, "weight_scale", sc, maxn, &fs, dir, err, errlen);
        if (r < 0) return -1;
        if (r == 1) {
            return fp8t_errorf(err, errlen,
                               "%s: FP8 tensor '%s' has no '%s.weight_scale_inv' to dequantize "
                               "it with",
                               dir, ft.name, module);
        }
        const int R = (int)ht->shape[0], Cc = ht->ndim == 2 ? (int)ht->shape[1] : 1;
        if (dequantize(buf, R, Cc, sc, fs.t, im->block, dir, ft.name, err, errlen) != 0)
            return -1;
        im->n_fp8_block += fs.t->numel > 1;
        float amax = fp8_amax(buf, numel);
        if (amax > im->lin_w_amax[ht->lin]) im->lin_w_amax[ht->lin] = amax;
        im->n_fp8++;
    }
    if (ht->lin >= 0) {
        found_tensor fi;
        float is;
        int r = read_scale(s, module, "input_scale", &is, 1, &fi, dir, err, errlen);
        if (r < 0) return -1;
        if (r == 0) {
            im->n_inscale++;
            if (is > im->lin_x_scale[ht->lin]) im->lin_x_scale[ht->lin] = is;
        }
    }
    for (size_t j = 0; j < numel; j++)
        if (!isfinite(buf[j])) {
            return fp8t_errorf(err, errlen,
                               "%s: tensor '%s' holds a non-finite value (%g at element %zu)",
                               dir, ft.name, (double)buf[j], j);
        }
    /* scatter into our layout */
    const fp8t_param_info *p = &im->info[ht->param];
    float *dst = im->w->params + p->offset;
    if (ht->transform == FP8T_HF_TRANSPOSE) {
        const int R = p->shape[0], Cc = p->shape[1]; /* HF [Cc, R] -> ours [R, Cc] */
        for (int cc = 0; cc < Cc; cc++)
            for (int r = 0; r < R; r++) dst[(size_t)r * Cc + cc] = buf[(size_t)cc * R + r];
    } else if (ht->transform == FP8T_HF_ROWS) {
        const size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : 1; /* 1: a bias slice */
        memcpy(dst + (size_t)ht->row0 * cols, buf, numel * sizeof(float));
    } else {
        memcpy(dst, buf, numel * sizeof(float));
    }
    return 0;
}

/* A tied LM head (an untied one is in the map): an lm_head.weight in the file must equal the
 * embedding, since transformers would ignore it and the model would differ */
static int check_tied_head(hf_import *im, char *err, size_t errlen) {
    fp8t_weights *w = im->w;
    const char *dir = im->dir;
    if (w->model.untied_head) return 0;
    found_tensor fh;
    if (!tensors_find_exact(&im->s, "lm_head.weight", &fh)) return 0;
    const fp8t_param_info *wte = &im->info[0];
    int ok = is_float_dtype(fh.t->dtype) && fh.t->numel == wte->numel;
    float *head = ok ? malloc(wte->numel * sizeof(float)) : NULL;
    if (ok && (!head ||
               fp8t_st_read_f32(fh.file, "lm_head.weight", head, wte->numel, err, errlen) != 0)) {
        free(head);
        return -1;
    }
    size_t diff = 0;
    for (size_t j = 0; ok && j < wte->numel; j++) diff += head[j] != w->params[wte->offset + j];
    free(head);
    if (!ok || diff)
        return fp8t_errorf(err, errlen,
                           "%s: lm_head.weight differs from the token embedding (%s) but "
                           "config.json says tie_word_embeddings is true; set it to false in "
                           "config.json to import the head as its own matrix",
                           dir, ok ? "values differ" : "shape or dtype differs");
    note(w, "lm_head.weight equals the embedding (tied)");
    return 0;
}

/* Anything left unread is a tensor this model does not have (but the attention-mask and
 * rotary buffers some exports carry) */
static int check_unread(hf_import *im, char *err, size_t errlen) {
    tensor_set *s = &im->s;
    char unknown[600] = "";
    int n_unknown = 0, n_skipped = 0;
    for (int f = 0; f < s->n_files; f++) {
        int cnt = fp8t_st_count(s->files[f]);
        for (int i = 0; i < cnt; i++) {
            if (s->used[f][i]) continue;
            const char *nm = fp8t_st_get(s->files[f], i)->name;
            if (harmless_extra(nm)) {
                n_skipped++;
                continue;
            }
            if (n_unknown++ < 4) {
                size_t u = strlen(unknown);
                snprintf(unknown + u, sizeof(unknown) - u, "%s'%s'", u ? ", " : "", nm);
            }
        }
    }
    if (n_unknown)
        return fp8t_errorf(
            err, errlen,
            "%s: %d tensor(s) do not belong to the %s model that config.json "
            "describes: %s%s; check n_layer/num_hidden_layers and the architecture",
            im->dir, n_unknown, fp8t_arch_name(im->w->model.arch), unknown,
            n_unknown > 4 ? ", ..." : "");
    if (n_skipped) note(im->w, "ignored %d attention-mask/rotary buffers", n_skipped);
    return 0;
}

/* What the weights were stored in, what the import dequantized, and the FP8 state seeded with
 * what the file knows: learned input scales and FP8 weight amaxes. Without input scales
 * (dynamic activation scaling: fine-grained FP8, per-token runtimes) there are no activation
 * scales to seed; the state stays absent so that eval and export calibrate X and W together
 * instead of running X at scale 1. */
static int finish_import(hf_import *im, char *err, size_t errlen) {
    fp8t_weights *w = im->w;
    const int *n_dtype = im->n_dtype;
    w->stored_dtype = n_dtype[FP8T_ST_F8_E4M3] + n_dtype[FP8T_ST_F8_E5M2] ? FP8T_EXPORT_FP8
                      : n_dtype[FP8T_ST_F32] + n_dtype[FP8T_ST_F64]       ? FP8T_EXPORT_FP32
                                                                          : FP8T_EXPORT_BF16;
    if (im->n_fp8 && im->n_fp8_block)
        note(w,
             "dequantized %d FP8 weight matrices with their weight_scale_inv (%d with %dx%d "
             "block scales: the block rounding is now in the FP32 weights)",
             im->n_fp8, im->n_fp8_block, im->block[0], im->block[1]);
    else if (im->n_fp8)
        note(w, "dequantized %d FP8 weight matrices with their weight_scale_inv", im->n_fp8);
    if (!im->n_inscale) return 0;
    const int n_lin = im->n_lin;
    fp8t_policy pol;
    fp8t_policy_default(&pol);
    w->fp8_n = 3 * n_lin;
    w->fp8_len = pol.history_len;
    w->fp8_state = malloc(fp8t_recipe_state_floats(w->fp8_n, w->fp8_len) * sizeof(float));
    if (!w->fp8_state) return fp8t_errorf(err, errlen, "out of memory");
    default_state(w->fp8_state, w->fp8_n, w->fp8_len);
    fp8t_recipe_state st;
    fp8t_recipe_state_view(&st, w->fp8_state, w->fp8_n, w->fp8_len);
    for (int l = 0; l < n_lin; l++) {
        float amax[2] = {im->lin_x_scale[l] * FP8_E4M3_MAX, im->lin_w_amax[l]};
        for (int role = 0; role < 2; role++) {
            if (!(amax[role] > 0.0f)) continue;
            const int t = 3 * l + role;
            /* the newest history slot that survives the next roll (len - 1) */
            st.history[(size_t)(w->fp8_len - 1) * w->fp8_n + t] = amax[role];
            st.scale[t] = fp8t_delayed_scale(amax[role], 1.0f, st.fmt_max[t], 0);
            st.scale_inv[t] = 1.0f / st.scale[t];
        }
    }
    note(w, "seeded FP8 activation scales from %d input_scale tensors", im->n_inscale);
    return 0;
}

int fp8t_import_hf(const char *dir, fp8t_weights *w, char *err, size_t errlen) {
    memset(w, 0, sizeof(*w));
    snprintf(w->source, sizeof(w->source), "%s", dir);
    hf_import im;
    memset(&im, 0, sizeof(im));
    im.dir = dir;
    im.w = w;
    if (read_hf_config(&im, err, errlen) != 0) return -1;
    if (alloc_params(w, err, errlen) != 0) {
        fp8t_weights_free(w);
        return -1;
    }
    if (tensors_open(&im.s, dir, err, errlen) != 0) {
        fp8t_weights_free(w);
        return -1;
    }
    int rc = open_import(&im, err, errlen);
    for (int i = 0; rc == 0 && i < im.n_map; i++)
        rc = import_tensor(&im, &im.map[i], err, errlen);
    if (rc == 0) rc = check_tied_head(&im, err, errlen);
    if (rc == 0) rc = check_unread(&im, err, errlen);
    if (rc == 0) rc = finish_import(&im, err, errlen);
    free(im.buf);
    free(im.sc);
    free(im.info);
    free(im.map);
    free(im.lin_x_scale);
    free(im.lin_w_amax);
    tensors_close(&im.s);
    if (rc != 0) fp8t_weights_free(w);
    return rc;
}

/* ================================================================ dispatch */

int fp8t_weights_load(const char *src, fp8t_weights *w, char *err, size_t errlen) {
    memset(w, 0, sizeof(*w));
    if (!src || !*src) return fp8t_errorf(err, errlen, "no weights source given");
    if (!fp8t_path_exists(src))
        return fp8t_errorf(err, errlen,
                           "%s does not exist; give a checkpoint directory (RUN/checkpoints/"
                           "step_N), a Hugging Face directory or an llm.c .bin checkpoint",
                           src);
    char path[PATH_BUF];
    if (fp8t_is_dir(src)) {
        snprintf(path, sizeof(path), "%s/state.json", src);
        if (fp8t_is_regular_file(path)) return fp8t_weights_from_checkpoint(src, w, err, errlen);
        snprintf(path, sizeof(path), "%s/config.json", src);
        if (fp8t_is_regular_file(path)) return fp8t_import_hf(src, w, err, errlen);
        snprintf(path, sizeof(path), "%s/checkpoints", src);
        if (fp8t_is_dir(path))
            return fp8t_errorf(err, errlen,
                               "%s is a run directory; give one of its checkpoints, e.g. "
                               "%s/checkpoints/step_N (ls %s/checkpoints)",
                               src, src, src);
        return fp8t_errorf(err, errlen,
                           "%s holds neither state.json (fp8train checkpoint) nor "
                           "config.json (Hugging Face model)",
                           src);
    }
    /* a file inside a Hugging Face directory stands for the directory */
    size_t n = strlen(src);
    if ((n >= 11 && !strcmp(src + n - 11, "config.json")) ||
        (n >= 12 && !strcmp(src + n - 12, ".safetensors"))) {
        snprintf(path, sizeof(path), "%s", src);
        char *slash = strrchr(path, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(path, sizeof(path), ".");
        return fp8t_import_hf(path, w, err, errlen);
    }
    return fp8t_import_llmc(src, w, err, errlen);
}

/* The model config alone: config.json or state.json is all that is read (an 8B model's
 * tensors stay on disk); an llm.c .bin is small enough to read whole. */
int fp8t_weights_read_config(const char *src, fp8t_model_config *cfg, char *err, size_t errlen) {
    char path[PATH_BUF];
    if (src && fp8t_is_dir(src)) {
        snprintf(path, sizeof(path), "%s/state.json", src);
        if (fp8t_is_regular_file(path)) {
            fp8t_checkpoint ck;
            if (fp8t_checkpoint_read_state(src, &ck, err, errlen) != 0) return -1;
            *cfg = ck.model;
            fp8t_checkpoint_free(&ck);
            return 0;
        }
        snprintf(path, sizeof(path), "%s/config.json", src);
        if (fp8t_is_regular_file(path)) {
            char *text = NULL;
            size_t len;
            if (fp8t_read_file(path, &text, &len, err, errlen) != 0) return -1;
            cJSON *o = cJSON_Parse(text);
            free(text);
            if (!cJSON_IsObject(o)) {
                cJSON_Delete(o);
                return fp8t_errorf(err, errlen, "%s: not a JSON object", path);
            }
            int tied, rc = parse_hf_config(path, o, cfg, &tied, err, errlen);
            cJSON_Delete(o);
            char e[FP8T_ERR_LEN];
            if (rc == 0 && fp8t_model_config_check(cfg, e, sizeof(e)) != 0)
                rc = fp8t_errorf(err, errlen,
                                 "%s: the model it describes is not valid for "
                                 "fp8train: %s",
                                 path, e);
            return rc;
        }
    }
    fp8t_weights w;
    if (fp8t_weights_load(src, &w, err, errlen) != 0) return -1;
    *cfg = w.model;
    fp8t_weights_free(&w);
    return 0;
}

/* ================================================================ to a training checkpoint */

int fp8t_weights_save_checkpoint(const fp8t_weights *w, const char *dir, uint64_t seed, char *err,
                                 size_t errlen) {
    size_t total;
    fp8t_model_param_table(&w->model, NULL, &total);
    if (!w->params || total != w->num_params)
        return fp8t_errorf(err, errlen, "import: the weights do not match their model config");
    fp8t_checkpoint ck;
    memset(&ck, 0, sizeof(ck));
    ck.step = 0;
    ck.data_position = 0;
    ck.seed = seed;
    ck.loss = NAN;
    ck.model = w->model;
    ck.num_params = w->num_params;
    ck.params = w->params;
    ck.adam_m = calloc(total ? total : 1, sizeof(float));
    ck.adam_v = calloc(total ? total : 1, sizeof(float));
    const int n_fp8 = 3 * fp8t_model_num_linears(&w->model);
    float *fresh = NULL;
    if (w->fp8_state && w->fp8_n == n_fp8 && w->fp8_len >= 1) {
        ck.fp8_n = w->fp8_n;
        ck.fp8_len = w->fp8_len;
        ck.fp8_state = w->fp8_state;
    } else {
        fp8t_policy pol;
        fp8t_policy_default(&pol);
        ck.fp8_n = n_fp8;
        ck.fp8_len = pol.history_len;
        fresh = malloc(fp8t_recipe_state_floats(ck.fp8_n, ck.fp8_len) * sizeof(float));
        if (fresh) default_state(fresh, ck.fp8_n, ck.fp8_len);
        ck.fp8_state = fresh;
    }
    int rc;
    if (!ck.adam_m || !ck.adam_v || !ck.fp8_state)
        rc = fp8t_errorf(err, errlen, "import: out of memory");
    else
        rc = fp8t_checkpoint_save(dir, &ck, err, errlen);
    free(ck.adam_m);
    free(ck.adam_v);
    free(fresh);
    return rc;
}
