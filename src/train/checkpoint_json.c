/* The model config as JSON (state.json, config.json) and a field-by-field comparison that
 * says which field differs. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/checkpoint.h"

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
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static int get_int(const cJSON *o, const char *key, int *out, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        fabs(v->valuedouble) > 1e9) {
        snprintf(err, errlen, "model config: '%s' is missing or not an integer", key);
        return -1;
    }
    *out = (int)v->valuedouble;
    return 0;
}

static int get_float(const cJSON *o, const char *key, float *out, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        snprintf(err, errlen, "model config: '%s' is missing or not a number", key);
        return -1;
    }
    *out = (float)v->valuedouble;
    return 0;
}

int fp8t_model_config_from_json(fp8t_model_config *c, const char *json, char *err,
                                size_t errlen) {
    cJSON *o = cJSON_Parse(json);
    if (!cJSON_IsObject(o)) {
        snprintf(err, errlen, "model config: not a JSON object");
        cJSON_Delete(o);
        return -1;
    }
    fp8t_model_config m;
    memset(&m, 0, sizeof(m));
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(o, "arch");
    int rc = -1;
    if (!cJSON_IsString(arch)) {
        snprintf(err, errlen, "model config: 'arch' is missing (expected \"gpt2\" or \"llama\")");
        goto done;
    }
    if (fp8t_arch_parse(&m.arch, arch->valuestring) != 0) {
        snprintf(err, errlen, "model config: arch '%s' is unknown (expected gpt2 or llama)",
                 arch->valuestring);
        goto done;
    }
    if (get_int(o, "n_layer", &m.n_layer, err, errlen) || get_int(o, "n_embd", &m.n_embd, err, errlen) ||
        get_int(o, "n_head", &m.n_head, err, errlen) || get_int(o, "seq_len", &m.seq_len, err, errlen) ||
        get_int(o, "vocab_size", &m.vocab_size, err, errlen) ||
        get_int(o, "mlp_hidden", &m.mlp_hidden, err, errlen) ||
        get_float(o, "rope_theta", &m.rope_theta, err, errlen) ||
        get_float(o, "norm_eps", &m.norm_eps, err, errlen))
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
#define DIFF_INT(field, opt)                                                                  \
    if (a->field != b->field) {                                                               \
        snprintf(err, errlen, #field " (%s) is %d in the checkpoint but %d in this run", opt,  \
                 a->field, b->field);                                                         \
        return -1;                                                                            \
    }
    if (a->arch != b->arch) {
        snprintf(err, errlen, "arch (--arch) is %s in the checkpoint but %s in this run",
                 fp8t_arch_name(a->arch), fp8t_arch_name(b->arch));
        return -1;
    }
    DIFF_INT(n_layer, "--layers")
    DIFF_INT(n_embd, "--dim")
    DIFF_INT(n_head, "--heads")
    DIFF_INT(seq_len, "--max-seq-len")
    DIFF_INT(vocab_size, "--vocab")
    DIFF_INT(mlp_hidden, "--mlp-hidden")
#undef DIFF_INT
    if (a->rope_theta != b->rope_theta || a->norm_eps != b->norm_eps) {
        snprintf(err, errlen, "rope_theta/norm_eps differ: checkpoint %g/%g, this run %g/%g",
                 a->rope_theta, a->norm_eps, b->rope_theta, b->norm_eps);
        return -1;
    }
    return 0;
}
