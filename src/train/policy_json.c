/* The precision policy's JSON form: the canonical saved policy, as config.json and a
 * checkpoint's state.json carry it (the policy itself is the model's: src/model/policy.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fp8train/error.h"
#include "fp8train/policy_json.h"

char *fp8t_policy_to_json(const fp8t_policy *p) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "default", fp8t_precision_name(p->default_precision));
    cJSON_AddStringToObject(o, "recipe", fp8t_precision_name(p->recipe));
    cJSON_AddBoolToObject(o, "hybrid", p->hybrid != 0);
    cJSON_AddBoolToObject(o, "block_hybrid", p->block_hybrid != 0);
    cJSON_AddNumberToObject(o, "history_len", p->history_len);
    cJSON_AddStringToObject(o, "amax_algo",
                            p->algo == FP8T_AMAX_MOST_RECENT ? "most_recent" : "max");
    cJSON_AddNumberToObject(o, "margin", p->margin);
    cJSON_AddBoolToObject(o, "pow2_scales", p->pow2_scales != 0);
    cJSON_AddNumberToObject(o, "epsilon", (double)p->epsilon);
    cJSON_AddStringToObject(o, "head", fp8t_precision_name(p->head_precision));
    cJSON_AddBoolToObject(o, "fast_accum_fprop", p->fast_accum_fprop != 0);
    cJSON_AddBoolToObject(o, "fast_accum_grad", p->fast_accum_grad != 0);
    cJSON *arr = cJSON_AddArrayToObject(o, "overrides");
    for (int i = 0; i < p->n_overrides; i++) {
        char buf[256];
        cJSON_AddItemToArray(
            arr, cJSON_CreateString(fp8t_override_format(&p->overrides[i], buf, sizeof(buf))));
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static int json_precision(fp8t_precision *out, const cJSON *v, const char *key, char *err,
                          size_t errlen) {
    if (!cJSON_IsString(v) || fp8t_precision_parse(out, v->valuestring) != 0)
        return fp8t_errorf(err, errlen,
                           "policy JSON: \"%s\" must be a precision string (fp8, "
                           "delayed, current, block, rowwise, mxfp8, fake, bf16 or fp32)",
                           key);
    return 0;
}

static int json_bool(int *out, const cJSON *v, const char *key, char *err, size_t errlen) {
    if (cJSON_IsBool(v))
        *out = cJSON_IsTrue(v);
    else if (cJSON_IsNumber(v) && (v->valuedouble == 0 || v->valuedouble == 1))
        *out = v->valuedouble != 0;
    else
        return fp8t_errorf(err, errlen, "policy JSON: \"%s\" must be true or false", key);
    return 0;
}

static int json_int(int *out, const cJSON *v, const char *key, int lo, int hi, char *err,
                    size_t errlen) {
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int)v->valuedouble ||
        v->valuedouble < lo || v->valuedouble > hi)
        return fp8t_errorf(err, errlen, "policy JSON: \"%s\" must be an integer in %d..%d", key,
                           lo, hi);
    *out = (int)v->valuedouble;
    return 0;
}

int fp8t_policy_from_json(fp8t_policy *out, const char *json, char *err, size_t errlen) {
    if (!json) return fp8t_errorf(err, errlen, "policy JSON is NULL");
    cJSON *o = cJSON_Parse(json);
    if (!o || !cJSON_IsObject(o)) {
        const char *at = cJSON_GetErrorPtr();
        cJSON_Delete(o);
        return fp8t_errorf(err, errlen, "policy JSON is not a JSON object (error near '%.20s')",
                           at ? at : "");
    }
    fp8t_policy p;
    fp8t_policy_default(&p); /* keys left out keep their defaults */
    int rc = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, o) {
        const char *k = v->string;
        if (!strcmp(k, "default"))
            rc = json_precision(&p.default_precision, v, k, err, errlen);
        else if (!strcmp(k, "recipe")) {
            rc = json_precision(&p.recipe, v, k, err, errlen);
            if (!rc && p.recipe != FP8T_PREC_DELAYED && p.recipe != FP8T_PREC_CURRENT)
                rc = fp8t_errorf(err, errlen,
                                 "policy JSON: \"recipe\" must be delayed or current");
        } else if (!strcmp(k, "hybrid"))
            rc = json_bool(&p.hybrid, v, k, err, errlen);
        else if (!strcmp(k, "block_hybrid"))
            rc = json_bool(&p.block_hybrid, v, k, err, errlen);
        else if (!strcmp(k, "history_len"))
            rc = json_int(&p.history_len, v, k, 1, 1 << 20, err, errlen);
        else if (!strcmp(k, "amax_algo")) {
            if (cJSON_IsString(v) && !strcmp(v->valuestring, "max"))
                p.algo = FP8T_AMAX_MAX;
            else if (cJSON_IsString(v) && !strcmp(v->valuestring, "most_recent"))
                p.algo = FP8T_AMAX_MOST_RECENT;
            else
                rc = fp8t_errorf(err, errlen,
                                 "policy JSON: \"amax_algo\" must be \"max\" or "
                                 "\"most_recent\"");
        } else if (!strcmp(k, "margin"))
            rc = json_int(&p.margin, v, k, -64, 64, err, errlen);
        else if (!strcmp(k, "pow2_scales"))
            rc = json_bool(&p.pow2_scales, v, k, err, errlen);
        else if (!strcmp(k, "epsilon")) {
            if (cJSON_IsNumber(v) && v->valuedouble >= 0)
                p.epsilon = (float)v->valuedouble;
            else
                rc = fp8t_errorf(err, errlen, "policy JSON: \"epsilon\" must be a number >= 0");
        } else if (!strcmp(k, "head"))
            rc = json_precision(&p.head_precision, v, k, err, errlen);
        else if (!strcmp(k, "fast_accum_fprop"))
            rc = json_bool(&p.fast_accum_fprop, v, k, err, errlen);
        else if (!strcmp(k, "fast_accum_grad"))
            rc = json_bool(&p.fast_accum_grad, v, k, err, errlen);
        else if (!strcmp(k, "overrides")) {
            if (!cJSON_IsArray(v)) {
                rc = fp8t_errorf(err, errlen,
                                 "policy JSON: \"overrides\" must be an array of rule "
                                 "strings such as \"layers=0,gemm=dgrad,precision=bf16\"");
            } else {
                const cJSON *r;
                cJSON_ArrayForEach(r, v) {
                    if (!cJSON_IsString(r)) {
                        rc = fp8t_errorf(err, errlen,
                                         "policy JSON: every entry of \"overrides\" must "
                                         "be a rule string");
                        break;
                    }
                    char e2[FP8T_ERR_LEN];
                    if (fp8t_policy_add_overrides(&p, r->valuestring, e2, sizeof(e2)) != 0) {
                        rc = fp8t_errorf(err, errlen, "policy JSON: %s", e2);
                        break;
                    }
                }
            }
        } else {
            rc = fp8t_errorf(err, errlen,
                             "policy JSON: unknown key \"%s\" (expected default, recipe, "
                             "hybrid, block_hybrid, history_len, amax_algo, margin, pow2_scales, "
                             "epsilon, head, "
                             "fast_accum_fprop, fast_accum_grad, overrides)",
                             k);
        }
        if (rc) break;
    }
    cJSON_Delete(o);
    if (rc) return rc;
    *out = p;
    return 0;
}
