/* The model config as JSON (state.json, config.json) and a field-by-field comparison that
 * says which field differs. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/checkpoint.h"
#include "fp8train/error.h"

char *fp8t_model_config_to_json(const fp8t_model_config *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "arch", fp8t_arch_name(c->arch));
    cJSON_AddNumberToObject(o, "n_layer", c->n_layer);
    cJSON_AddNumberToObject(o, "n_embd", c->n_embd);
    cJSON_AddNumberToObject(o, "n_head", c->n_head);
    cJSON_AddNumberToObject(o, "seq_len", c->seq_len);
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(o, "mlp_hidden", c->mlp_hidden);
    cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(o, "norm_eps", c->norm_eps);
    /* the fields added with grouped-query attention are written only when they differ from
     * their zero default, so a model without them writes the JSON it always wrote */
    if (c->n_kv_head && c->n_kv_head != c->n_head)
        cJSON_AddNumberToObject(o, "n_kv_head", c->n_kv_head);
    if (c->untied_head) cJSON_AddNumberToObject(o, "untied_head", c->untied_head);
    if (c->qkv_bias) cJSON_AddNumberToObject(o, "qkv_bias", c->qkv_bias);
    if (c->rope_scaling.type == FP8T_ROPE_LLAMA3) {
        cJSON *r = cJSON_AddObjectToObject(o, "rope_scaling");
        cJSON_AddStringToObject(r, "type", "llama3");
        cJSON_AddNumberToObject(r, "factor", c->rope_scaling.factor);
        cJSON_AddNumberToObject(r, "low_freq_factor", c->rope_scaling.low_freq_factor);
        cJSON_AddNumberToObject(r, "high_freq_factor", c->rope_scaling.high_freq_factor);
        cJSON_AddNumberToObject(r, "original_max_pos", c->rope_scaling.original_max_pos);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static int get_int(const cJSON *o, const char *key, int *out, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        fabs(v->valuedouble) > 1e9) {
        return fp8t_errorf(err, errlen, "model config: '%s' is missing or not an integer", key);
    }
    *out = (int)v->valuedouble;
    return 0;
}

static int get_float(const cJSON *o, const char *key, float *out, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        return fp8t_errorf(err, errlen, "model config: '%s' is missing or not a number", key);
    }
    *out = (float)v->valuedouble;
    return 0;
}

/* an optional integer: absent = 0 (checkpoints from before the field existed) */
static int get_opt_int(const cJSON *o, const char *key, int *out, char *err, size_t errlen) {
    if (!cJSON_GetObjectItemCaseSensitive(o, key)) {
        *out = 0;
        return 0;
    }
    return get_int(o, key, out, err, errlen);
}

/* "rope_scaling": absent or null = none; else {"type": "llama3", factor, low_freq_factor,
 * high_freq_factor, original_max_pos} */
static int get_rope_scaling(const cJSON *o, fp8t_rope_scaling *r, char *err, size_t errlen) {
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    memset(r, 0, sizeof(*r));
    if (!rs || cJSON_IsNull(rs)) return 0;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsObject(rs) || !cJSON_IsString(ty)) {
        return fp8t_errorf(err, errlen,
                           "model config: 'rope_scaling' must be null or an object with a "
                           "\"type\" (\"default\" or \"llama3\")");
    }
    if (!strcmp(ty->valuestring, "default")) return 0;
    if (strcmp(ty->valuestring, "llama3") != 0) {
        return fp8t_errorf(err, errlen,
                           "model config: rope_scaling type '%s' is unknown (expected "
                           "\"default\" or \"llama3\")",
                           ty->valuestring);
    }
    r->type = FP8T_ROPE_LLAMA3;
    if (get_float(rs, "factor", &r->factor, err, errlen) ||
        get_float(rs, "low_freq_factor", &r->low_freq_factor, err, errlen) ||
        get_float(rs, "high_freq_factor", &r->high_freq_factor, err, errlen) ||
        get_int(rs, "original_max_pos", &r->original_max_pos, err, errlen))
        return -1;
    return 0;
}

int fp8t_model_config_from_json(fp8t_model_config *c, const char *json, char *err,
                                size_t errlen) {
    cJSON *o = cJSON_Parse(json);
    if (!cJSON_IsObject(o)) {
        fp8t_errorf(err, errlen, "model config: not a JSON object");
        cJSON_Delete(o);
        return -1;
    }
    fp8t_model_config m;
    memset(&m, 0, sizeof(m));
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(o, "arch");
    int rc = -1;
    if (!cJSON_IsString(arch)) {
        fp8t_errorf(err, errlen,
                    "model config: 'arch' is missing (expected \"gpt2\" or \"llama\")");
        goto done;
    }
    if (fp8t_arch_parse(&m.arch, arch->valuestring) != 0) {
        fp8t_errorf(err, errlen, "model config: arch '%s' is unknown (expected gpt2 or llama)",
                    arch->valuestring);
        goto done;
    }
    if (get_int(o, "n_layer", &m.n_layer, err, errlen) ||
        get_int(o, "n_embd", &m.n_embd, err, errlen) ||
        get_int(o, "n_head", &m.n_head, err, errlen) ||
        get_int(o, "seq_len", &m.seq_len, err, errlen) ||
        get_int(o, "vocab_size", &m.vocab_size, err, errlen) ||
        get_int(o, "mlp_hidden", &m.mlp_hidden, err, errlen) ||
        get_float(o, "rope_theta", &m.rope_theta, err, errlen) ||
        get_float(o, "norm_eps", &m.norm_eps, err, errlen) ||
        get_opt_int(o, "n_kv_head", &m.n_kv_head, err, errlen) ||
        get_opt_int(o, "untied_head", &m.untied_head, err, errlen) ||
        get_opt_int(o, "qkv_bias", &m.qkv_bias, err, errlen) ||
        get_rope_scaling(o, &m.rope_scaling, err, errlen))
        goto done;
    if (fp8t_model_config_check(&m, err, errlen) != 0) goto done;
    *c = m;
    rc = 0;
done:
    cJSON_Delete(o);
    return rc;
}

int fp8t_model_config_diff(const fp8t_model_config *a, const fp8t_model_config *b, char *err,
                           size_t errlen) {
#define DIFF_INT(field, opt)                                                                     \
    if (a->field != b->field) {                                                                  \
        fp8t_errorf(err, errlen, #field " (%s) is %d in the checkpoint but %d in this run", opt, \
                    a->field, b->field);                                                         \
        return -1;                                                                               \
    }
    if (a->arch != b->arch) {
        return fp8t_errorf(err, errlen,
                           "arch (--arch) is %s in the checkpoint but %s in this run",
                           fp8t_arch_name(a->arch), fp8t_arch_name(b->arch));
    }
    DIFF_INT(n_layer, "--layers")
    DIFF_INT(n_embd, "--dim")
    DIFF_INT(n_head, "--heads")
    DIFF_INT(seq_len, "--max-seq-len")
    DIFF_INT(vocab_size, "--vocab")
    DIFF_INT(mlp_hidden, "--mlp-hidden")
    if (fp8t_model_kv_heads(a) != fp8t_model_kv_heads(b)) {
        return fp8t_errorf(err, errlen,
                           "n_kv_head (--kv-heads) is %d in the checkpoint but %d in this run",
                           fp8t_model_kv_heads(a), fp8t_model_kv_heads(b));
    }
    DIFF_INT(untied_head, "--tie-head, inverted")
    if (a->arch == FP8T_ARCH_LLAMA) {
        DIFF_INT(qkv_bias, "--qkv-bias")
        const fp8t_rope_scaling *ra = &a->rope_scaling, *rb = &b->rope_scaling;
        if (ra->type != rb->type ||
            (ra->type == FP8T_ROPE_LLAMA3 &&
             (ra->factor != rb->factor || ra->low_freq_factor != rb->low_freq_factor ||
              ra->high_freq_factor != rb->high_freq_factor ||
              ra->original_max_pos != rb->original_max_pos))) {
            return fp8t_errorf(
                err, errlen,
                "rope_scaling (--rope-scaling) differs: checkpoint %s "
                "(factor %g), this run %s (factor %g)",
                ra->type == FP8T_ROPE_LLAMA3 ? "llama3" : "none", (double)ra->factor,
                rb->type == FP8T_ROPE_LLAMA3 ? "llama3" : "none", (double)rb->factor);
        }
    }
#undef DIFF_INT
    if (a->rope_theta != b->rope_theta || a->norm_eps != b->norm_eps) {
        return fp8t_errorf(err, errlen,
                           "rope_theta/norm_eps differ: checkpoint %g/%g, this run %g/%g",
                           a->rope_theta, a->norm_eps, b->rope_theta, b->norm_eps);
    }
    return 0;
}
