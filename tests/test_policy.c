/* The precision policy: names, the override parser, matching and precedence, the head rule,
 * first:N / last:N, environment overrides, the JSON round trip and the error messages. */
#include <stdlib.h>
#include <string.h>

#include "fp8train/policy.h"
#include "fp8train/policy_json.h"
#include "test.h"

#define L 8 /* layers of the model the rules are resolved against */

static fp8t_precision R(const fp8t_policy *p, int layer, fp8t_module mod, fp8t_gemm_kind g) {
    return fp8t_policy_resolve(p, L, layer, mod, g);
}

static void policy_defaults(void) {
    fp8t_policy p;
    fp8t_policy_default(&p);
    T_CHECK(p.default_precision == FP8T_PREC_FP8 && p.recipe == FP8T_PREC_DELAYED, "default");
    T_CHECK(p.hybrid == 1 && p.history_len == 1024 && p.algo == FP8T_AMAX_MAX && p.margin == 0,
            "delayed recipe defaults");
    T_CHECK(p.head_precision == FP8T_PREC_BF16, "head default %d", p.head_precision);
    T_CHECK(p.fast_accum_fprop == 1 && p.fast_accum_grad == 0, "fast accumulation defaults");
    T_CHECK(p.n_overrides == 0 && p.epsilon == 0.0f && p.pow2_scales == 0, "rest");
    T_CHECK(p.block_hybrid == 0, "block and rowwise default to E4M3 everywhere");
    /* fp8 resolves to the recipe, never to FP8T_PREC_FP8 */
    T_CHECK(R(&p, 0, FP8T_MOD_QKV, FP8T_GEMM_FPROP) == FP8T_PREC_DELAYED, "fp8 -> delayed");
    p.recipe = FP8T_PREC_CURRENT;
    T_CHECK(R(&p, 3, FP8T_MOD_FC2, FP8T_GEMM_WGRAD) == FP8T_PREC_CURRENT, "fp8 -> current");
    T_CHECK(R(&p, -1, FP8T_MOD_HEAD, FP8T_GEMM_FPROP) == FP8T_PREC_BF16, "head bf16");
}

/* rowwise: a precision of its own, on the command line, in overrides and in the switches;
 * torchao's rowwise_with_gw_hp is rowwise with an override putting the Wgrad in BF16 */
static void policy_rowwise(void) {
    fp8t_precision q;
    T_CHECK(fp8t_precision_parse(&q, "rowwise") == 0 && q == FP8T_PREC_ROWWISE, "parse");
    T_CHECK(!strcmp(fp8t_precision_name(FP8T_PREC_ROWWISE), "rowwise"), "name");
    fp8t_policy p;
    fp8t_policy_default(&p);
    p.default_precision = FP8T_PREC_ROWWISE;
    char err[512];
    T_ASSERT(fp8t_policy_add_overrides(&p, "gemm=wgrad,precision=bf16", err, sizeof(err)) == 0,
             "%s", err);
    T_CHECK(R(&p, 2, FP8T_MOD_FC1, FP8T_GEMM_FPROP) == FP8T_PREC_ROWWISE &&
                R(&p, 2, FP8T_MOD_FC1, FP8T_GEMM_DGRAD) == FP8T_PREC_ROWWISE &&
                R(&p, 2, FP8T_MOD_FC1, FP8T_GEMM_WGRAD) == FP8T_PREC_BF16 &&
                R(&p, -1, FP8T_MOD_HEAD, FP8T_GEMM_FPROP) == FP8T_PREC_BF16,
            "rowwise_with_gw_hp resolves wrong");
    fp8t_policy_default(&p);
    const char *v[1 + FP8T_GEMM_COUNT] = {NULL, NULL, "rowwise", NULL};
    const char *src[1 + FP8T_GEMM_COUNT] = {"P", "F", "D", "W"};
    T_CHECK(fp8t_policy_apply_switches(&p, v, src, err, sizeof(err)) == 0 &&
                R(&p, 0, FP8T_MOD_QKV, FP8T_GEMM_DGRAD) == FP8T_PREC_ROWWISE &&
                R(&p, 0, FP8T_MOD_QKV, FP8T_GEMM_FPROP) == FP8T_PREC_DELAYED,
            "switch: %s", err);
    /* the error lists it */
    T_CHECK(fp8t_policy_add_overrides(&p, "precision=rowise", err, sizeof(err)) != 0 &&
                strstr(err, "rowwise"),
            "message: %s", err);
}

static void policy_names(void) {
    for (int i = 0; i < FP8T_PREC_COUNT; i++) {
        fp8t_precision q;
        T_CHECK(fp8t_precision_parse(&q, fp8t_precision_name((fp8t_precision)i)) == 0 &&
                    q == (fp8t_precision)i,
                "precision %d round trip", i);
    }
    fp8t_precision q;
    T_CHECK(fp8t_precision_parse(&q, "0") == 0 && q == FP8T_PREC_BF16, "0 = bf16");
    T_CHECK(fp8t_precision_parse(&q, "1") == 0 && q == FP8T_PREC_FP8, "1 = fp8");
    T_CHECK(fp8t_precision_parse(&q, "BF16") == 0 && q == FP8T_PREC_BF16, "case-insensitive");
    T_CHECK(fp8t_precision_parse(&q, "fp16") != 0, "fp16 is not a precision");
    T_CHECK(fp8t_precision_parse(&q, "") != 0 && fp8t_precision_parse(&q, NULL) != 0, "empty");
    for (int i = 0; i < FP8T_MOD_COUNT; i++) {
        fp8t_module m;
        T_CHECK(fp8t_module_parse(&m, fp8t_module_name((fp8t_module)i)) == 0 &&
                    m == (fp8t_module)i,
                "module %d round trip", i);
    }
    fp8t_module m;
    T_CHECK(fp8t_module_parse(&m, "mlp2") != 0, "unknown module");
    T_CHECK(!strcmp(fp8t_gemm_name(FP8T_GEMM_DGRAD), "dgrad"), "gemm name");
}

static void policy_parse_fields(void) {
    fp8t_policy p;
    fp8t_policy_default(&p);
    char err[512];
    int rc = fp8t_policy_add_overrides(
        &p, "layers=2-3,module=fc2+fc1,gemm=dgrad+wgrad,precision=bf16", err, sizeof(err));
    T_ASSERT(rc == 0, "%s", err);
    T_ASSERT(p.n_overrides == 1, "n %d", p.n_overrides);
    const fp8t_override *o = &p.overrides[0];
    T_CHECK(o->layer_lo == 2 && o->layer_hi == 3, "layers %d-%d", o->layer_lo, o->layer_hi);
    T_CHECK(o->module_mask == ((1u << FP8T_MOD_FC1) | (1u << FP8T_MOD_FC2)), "mask %x",
            o->module_mask);
    T_CHECK(o->gemm_mask == ((1u << FP8T_GEMM_DGRAD) | (1u << FP8T_GEMM_WGRAD)), "gemms %x",
            o->gemm_mask);
    T_CHECK(o->precision == FP8T_PREC_BF16, "precision");

    /* several rules with ';', spaces, groups, the special layer forms */
    rc = fp8t_policy_add_overrides(&p,
                                   " module=attn , precision=fake ; layers=first:2,"
                                   "precision=current;layers=last:1,module=mlp,"
                                   "precision=fp32;layers=5,gemm=all,precision=1",
                                   err, sizeof(err));
    T_ASSERT(rc == 0, "%s", err);
    T_ASSERT(p.n_overrides == 5, "n %d", p.n_overrides);
    T_CHECK(p.overrides[1].module_mask == ((1u << FP8T_MOD_QKV) | (1u << FP8T_MOD_PROJ)) &&
                p.overrides[1].layer_lo == FP8T_LAYER_ALL && p.overrides[1].gemm_mask == 0,
            "attn group");
    T_CHECK(p.overrides[2].layer_lo == FP8T_LAYER_FIRST_BASE - 2, "first:2 -> %d",
            p.overrides[2].layer_lo);
    T_CHECK(p.overrides[3].layer_lo == FP8T_LAYER_LAST_BASE - 1, "last:1");
    T_CHECK(p.overrides[3].module_mask ==
                ((1u << FP8T_MOD_FC1) | (1u << FP8T_MOD_FC2) | (1u << FP8T_MOD_GATE) |
                 (1u << FP8T_MOD_UP) | (1u << FP8T_MOD_DOWN)),
            "mlp group");
    T_CHECK(p.overrides[4].layer_lo == 5 && p.overrides[4].layer_hi == 5 &&
                p.overrides[4].gemm_mask == 0 && p.overrides[4].precision == FP8T_PREC_FP8,
            "layers=5,gemm=all,precision=1");
}

static void policy_matching(void) {
    fp8t_policy p;
    fp8t_policy_default(&p);
    char err[512];
    T_ASSERT(fp8t_policy_add_overrides(&p, "layers=2-3,module=fc2,gemm=dgrad,precision=bf16", err,
                                       sizeof(err)) == 0,
             "%s", err);
    T_CHECK(R(&p, 2, FP8T_MOD_FC2, FP8T_GEMM_DGRAD) == FP8T_PREC_BF16, "in range");
    T_CHECK(R(&p, 3, FP8T_MOD_FC2, FP8T_GEMM_DGRAD) == FP8T_PREC_BF16, "in range (hi)");
    T_CHECK(R(&p, 1, FP8T_MOD_FC2, FP8T_GEMM_DGRAD) == FP8T_PREC_DELAYED, "below range");
    T_CHECK(R(&p, 4, FP8T_MOD_FC2, FP8T_GEMM_DGRAD) == FP8T_PREC_DELAYED, "above range");
    T_CHECK(R(&p, 2, FP8T_MOD_FC1, FP8T_GEMM_DGRAD) == FP8T_PREC_DELAYED, "other module");
    T_CHECK(R(&p, 2, FP8T_MOD_FC2, FP8T_GEMM_WGRAD) == FP8T_PREC_DELAYED, "other gemm");

    /* precedence: the later rule wins where both match */
    T_ASSERT(fp8t_policy_add_overrides(&p, "gemm=dgrad,precision=fake", err, sizeof(err)) == 0,
             "%s", err);
    T_CHECK(R(&p, 2, FP8T_MOD_FC2, FP8T_GEMM_DGRAD) == FP8T_PREC_FAKE, "later wins");
    T_CHECK(R(&p, 7, FP8T_MOD_QKV, FP8T_GEMM_DGRAD) == FP8T_PREC_FAKE, "all layers");
    T_ASSERT(fp8t_policy_add_overrides(&p, "layers=2,module=fc2,precision=bf16", err,
                                       sizeof(err)) == 0,
             "%s", err);
    T_CHECK(R(&p, 2, FP8T_MOD_FC2, FP8T_GEMM_DGRAD) == FP8T_PREC_BF16, "later wins again");
    T_CHECK(R(&p, 3, FP8T_MOD_FC2, FP8T_GEMM_DGRAD) == FP8T_PREC_FAKE, "layer 3 keeps fake");

    /* first:N / last:N */
    fp8t_policy_default(&p);
    T_ASSERT(fp8t_policy_add_overrides(&p,
                                       "layers=first:2,precision=bf16;layers=last:3,"
                                       "precision=current",
                                       err, sizeof(err)) == 0,
             "%s", err);
    const fp8t_precision want[L] = {FP8T_PREC_BF16,    FP8T_PREC_BF16,    FP8T_PREC_DELAYED,
                                    FP8T_PREC_DELAYED, FP8T_PREC_DELAYED, FP8T_PREC_CURRENT,
                                    FP8T_PREC_CURRENT, FP8T_PREC_CURRENT};
    for (int l = 0; l < L; l++)
        T_CHECK(R(&p, l, FP8T_MOD_PROJ, FP8T_GEMM_FPROP) == want[l], "layer %d: %s", l,
                fp8t_precision_name(R(&p, l, FP8T_MOD_PROJ, FP8T_GEMM_FPROP)));
}

static void policy_head(void) {
    fp8t_policy p;
    fp8t_policy_default(&p);
    char err[512];
    /* a rule without module never matches the head, even with layers=all */
    T_ASSERT(fp8t_policy_add_overrides(&p,
                                       "precision=fp32;layers=all,gemm=fprop,"
                                       "precision=current;module=all,precision=fake",
                                       err, sizeof(err)) == 0,
             "%s", err);
    for (int g = 0; g < FP8T_GEMM_COUNT; g++)
        T_CHECK(R(&p, -1, FP8T_MOD_HEAD, (fp8t_gemm_kind)g) == FP8T_PREC_BF16, "head %s: %s",
                fp8t_gemm_name((fp8t_gemm_kind)g),
                fp8t_precision_name(R(&p, -1, FP8T_MOD_HEAD, (fp8t_gemm_kind)g)));
    T_CHECK(R(&p, 0, FP8T_MOD_QKV, FP8T_GEMM_DGRAD) == FP8T_PREC_FAKE, "body follows rules");
    /* naming the head matches it, whatever its layers */
    T_ASSERT(fp8t_policy_add_overrides(&p,
                                       "module=head,gemm=wgrad,precision=fp8;"
                                       "layers=0,module=head+qkv,gemm=dgrad,precision=fake",
                                       err, sizeof(err)) == 0,
             "%s", err);
    T_CHECK(R(&p, -1, FP8T_MOD_HEAD, FP8T_GEMM_WGRAD) == FP8T_PREC_DELAYED, "head wgrad fp8");
    T_CHECK(R(&p, -1, FP8T_MOD_HEAD, FP8T_GEMM_DGRAD) == FP8T_PREC_FAKE, "head dgrad fake");
    T_CHECK(R(&p, -1, FP8T_MOD_HEAD, FP8T_GEMM_FPROP) == FP8T_PREC_BF16, "head fprop");
    T_CHECK(R(&p, 1, FP8T_MOD_QKV, FP8T_GEMM_WGRAD) == FP8T_PREC_FAKE, "head rule not layer 1");
    p.head_precision = FP8T_PREC_FP8;
    T_CHECK(R(&p, -1, FP8T_MOD_HEAD, FP8T_GEMM_FPROP) == FP8T_PREC_DELAYED, "head fp8");
}

/* The environment's switches (the option layer reads FP8TRAIN_PRECISION, FP8TRAIN_FPROP /
 * _DGRAD / _WGRAD and hands the strings over): value[0] the default, value[1 + g] GEMM g. */
static const char *const ENV_SOURCES[4] = {"FP8TRAIN_PRECISION", "FP8TRAIN_FPROP",
                                           "FP8TRAIN_DGRAD", "FP8TRAIN_WGRAD"};
static int apply(fp8t_policy *p, const char *prec, const char *fprop, const char *dgrad,
                 const char *wgrad, char *err, size_t errlen) {
    const char *const v[4] = {prec, fprop, dgrad, wgrad};
    return fp8t_policy_apply_switches(p, v, ENV_SOURCES, err, errlen);
}

static void policy_env(void) {
    fp8t_policy p;
    fp8t_policy_default(&p);
    char err[512];
    T_ASSERT(apply(&p, NULL, NULL, "0", "current", err, sizeof(err)) == 0, "%s", err);
    T_CHECK(p.n_overrides == 2, "n %d", p.n_overrides);
    for (int l = 0; l < L; l++) {
        T_CHECK(R(&p, l, FP8T_MOD_FC1, FP8T_GEMM_DGRAD) == FP8T_PREC_BF16, "dgrad=0 -> bf16");
        T_CHECK(R(&p, l, FP8T_MOD_FC1, FP8T_GEMM_WGRAD) == FP8T_PREC_CURRENT, "wgrad");
        T_CHECK(R(&p, l, FP8T_MOD_FC1, FP8T_GEMM_FPROP) == FP8T_PREC_DELAYED, "fprop");
    }
    /* the environment adds to what is there: an override added after it wins */
    T_ASSERT(fp8t_policy_add_overrides(&p, "layers=0,gemm=dgrad,precision=1", err, sizeof(err)) ==
                 0,
             "%s", err);
    T_CHECK(R(&p, 0, FP8T_MOD_FC1, FP8T_GEMM_DGRAD) == FP8T_PREC_DELAYED, "cli after env");

    fp8t_policy_default(&p);
    T_ASSERT(apply(&p, "bf16", "fp8", NULL, "", err, sizeof(err)) == 0, "%s", err);
    T_CHECK(p.default_precision == FP8T_PREC_BF16, "FP8TRAIN_PRECISION");
    T_CHECK(R(&p, 4, FP8T_MOD_QKV, FP8T_GEMM_FPROP) == FP8T_PREC_DELAYED, "fprop fp8");
    T_CHECK(R(&p, 4, FP8T_MOD_QKV, FP8T_GEMM_DGRAD) == FP8T_PREC_BF16, "dgrad default");

    fp8t_policy_default(&p);
    err[0] = 0;
    T_CHECK(apply(&p, "half", NULL, NULL, NULL, err, sizeof(err)) != 0, "bad value accepted");
    T_CHECK(strstr(err, "FP8TRAIN_PRECISION") && strstr(err, "half"), "message: %s", err);
    T_CHECK(apply(&p, NULL, NULL, NULL, "2", err, sizeof(err)) != 0, "bad value accepted");
    T_CHECK(strstr(err, "FP8TRAIN_WGRAD") && strstr(err, "'2'"), "message: %s", err);
    fp8t_policy_default(&p);
    T_CHECK(apply(&p, NULL, NULL, NULL, NULL, err, sizeof(err)) == 0 && p.n_overrides == 0 &&
                apply(&p, "", "", "", "", err, sizeof(err)) == 0 && p.n_overrides == 0,
            "nothing set: nothing added");
}

static void policy_json_roundtrip(void) {
    fp8t_policy p, q;
    fp8t_policy_default(&p);
    char err[512];
    p.default_precision = FP8T_PREC_CURRENT;
    p.recipe = FP8T_PREC_CURRENT;
    p.hybrid = 0;
    p.history_len = 16;
    p.algo = FP8T_AMAX_MOST_RECENT;
    p.margin = 2;
    p.pow2_scales = 1;
    p.epsilon = 1.5e-7f;
    p.head_precision = FP8T_PREC_FAKE;
    p.fast_accum_fprop = 0;
    p.fast_accum_grad = 1;
    p.block_hybrid = 1;
    T_ASSERT(fp8t_policy_add_overrides(
                 &p,
                 "layers=2-3,module=fc2+fc1,gemm=dgrad+wgrad,precision=bf16;"
                 "layers=first:1,precision=fp32;layers=last:2,module=head+down,"
                 "precision=block;layers=4,gemm=fprop,precision=mxfp8;precision=fp8;"
                 "layers=1,module=attn,gemm=fprop+dgrad,precision=rowwise",
                 err, sizeof(err)) == 0,
             "%s", err);
    char *js = fp8t_policy_to_json(&p);
    T_ASSERT(js, "to_json");
    int rc = fp8t_policy_from_json(&q, js, err, sizeof(err));
    T_ASSERT(rc == 0, "%s in %s", err, js);
    T_CHECK(q.default_precision == p.default_precision && q.recipe == p.recipe &&
                q.hybrid == p.hybrid && q.history_len == p.history_len && q.algo == p.algo &&
                q.margin == p.margin && q.pow2_scales == p.pow2_scales &&
                q.epsilon == p.epsilon && q.head_precision == p.head_precision &&
                q.fast_accum_fprop == p.fast_accum_fprop &&
                q.fast_accum_grad == p.fast_accum_grad && q.n_overrides == p.n_overrides &&
                q.block_hybrid == p.block_hybrid,
            "scalars differ after the round trip: %s", js);
    for (int i = 0; i < p.n_overrides && i < q.n_overrides; i++)
        T_CHECK(!memcmp(&p.overrides[i], &q.overrides[i], sizeof(fp8t_override)),
                "override %d differs", i);
    char *js2 = fp8t_policy_to_json(&q);
    T_CHECK(js2 && !strcmp(js, js2), "json differs:\n%s\n%s", js, js2);
    /* the resolved precisions agree everywhere */
    for (int l = -1; l < L; l++)
        for (int mod = 0; mod < FP8T_MOD_COUNT; mod++)
            for (int g = 0; g < FP8T_GEMM_COUNT; g++) {
                int lay = mod == FP8T_MOD_HEAD ? -1 : (l < 0 ? 0 : l);
                T_CHECK(fp8t_policy_resolve(&p, L, lay, (fp8t_module)mod, (fp8t_gemm_kind)g) ==
                            fp8t_policy_resolve(&q, L, lay, (fp8t_module)mod, (fp8t_gemm_kind)g),
                        "resolve differs at %d %d %d", lay, mod, g);
            }
    /* the formatted rules parse back to themselves */
    for (int i = 0; i < p.n_overrides; i++) {
        char buf[256];
        fp8t_policy r;
        fp8t_policy_default(&r);
        fp8t_override_format(&p.overrides[i], buf, sizeof(buf));
        T_CHECK(fp8t_policy_add_overrides(&r, buf, err, sizeof(err)) == 0 &&
                    !memcmp(&r.overrides[0], &p.overrides[i], sizeof(fp8t_override)),
                "override '%s' does not round trip", buf);
    }
    free(js);
    free(js2);

    /* a partial object keeps the defaults; bad objects are refused with the key named */
    T_CHECK(fp8t_policy_from_json(&q, "{\"default\":\"bf16\"}", err, sizeof(err)) == 0 &&
                q.default_precision == FP8T_PREC_BF16 && q.history_len == 1024,
            "partial: %s", err);
    T_CHECK(fp8t_policy_from_json(&q, "{\"defualt\":\"bf16\"}", err, sizeof(err)) != 0 &&
                strstr(err, "defualt"),
            "unknown key: %s", err);
    T_CHECK(fp8t_policy_from_json(&q, "{\"head\":\"fp16\"}", err, sizeof(err)) != 0 &&
                strstr(err, "head"),
            "bad precision: %s", err);
    T_CHECK(fp8t_policy_from_json(&q, "{\"overrides\":[\"module=fc3,precision=bf16\"]}", err,
                                  sizeof(err)) != 0 &&
                strstr(err, "fc3"),
            "bad override: %s", err);
    T_CHECK(fp8t_policy_from_json(&q, "{\"history_len\":0}", err, sizeof(err)) != 0 &&
                strstr(err, "history_len"),
            "bad history_len: %s", err);
    T_CHECK(fp8t_policy_from_json(&q, "not json", err, sizeof(err)) != 0, "not json");
    T_CHECK(fp8t_policy_from_json(&q, "[1,2]", err, sizeof(err)) != 0, "not an object");
}

/* bad spec -> -1, the policy unchanged, and a message naming the offender (+ the syntax) */
static void expect_error(const char *spec, const char *must_name, int must_show_syntax) {
    fp8t_policy p;
    fp8t_policy_default(&p);
    char err[1024] = "";
    fp8t_policy before = p;
    int rc = fp8t_policy_add_overrides(&p, spec, err, sizeof(err));
    T_CHECK(rc != 0, "'%s' was accepted", spec);
    T_CHECK(!memcmp(&p, &before, sizeof(p)), "'%s' changed the policy", spec);
    T_CHECK(strstr(err, must_name) != NULL, "'%s': message does not name '%s': %s", spec,
            must_name, err);
    if (must_show_syntax)
        T_CHECK(strstr(err, "precision=bf16") != NULL, "'%s': no example syntax in: %s", spec,
                err);
}

static void policy_errors(void) {
    expect_error("layer=1,modul=fc2,precision=bf16", "modul", 1);      /* unknown key */
    expect_error("module=fc3,precision=bf16", "fc3", 0);               /* unknown module */
    expect_error("module=fc1+,precision=bf16", "module", 1);           /* empty module */
    expect_error("gemm=backward,precision=bf16", "backward", 0);       /* unknown gemm */
    expect_error("gemm=fprop++wgrad,precision=bf16", "empty gemm", 1); /* empty gemm */
    expect_error("layers=0-2,precision=fp16", "fp16", 0);              /* unknown precision */
    expect_error("layers=0-2,module=fc1", "precision", 1);             /* precision missing */
    expect_error("layers=3-1,precision=bf16", "3-1", 0);               /* reversed range */
    expect_error("layers=x,precision=bf16", "'x'", 1);                 /* not a number */
    expect_error("layers=first:0,precision=bf16", "first:0", 1);       /* N must be >= 1 */
    expect_error("layers=last:,precision=bf16", "last:", 1);
    expect_error("precision", "precision", 1); /* not key=value */
    expect_error("precision=bf16,precision=fp32", "twice", 0);
    expect_error("precision=bf16;module=up,precision=nope", "nope", 0); /* 2nd rule bad */
    expect_error("", "empty", 1);
    expect_error(" ; ", "empty", 1);
    /* too many rules */
    fp8t_policy p;
    fp8t_policy_default(&p);
    char err[512];
    int ok = 1;
    for (int i = 0; i < FP8T_MAX_OVERRIDES; i++)
        ok &= fp8t_policy_add_overrides(&p, "precision=bf16", err, sizeof(err)) == 0;
    T_CHECK(ok && p.n_overrides == FP8T_MAX_OVERRIDES, "filling up");
    T_CHECK(fp8t_policy_add_overrides(&p, "precision=bf16", err, sizeof(err)) != 0 &&
                strstr(err, "too many"),
            "overflow: %s", err);
}

static void policy_describe(void) {
    fp8t_policy p;
    fp8t_policy_default(&p);
    char err[512], buf[4096];
    T_ASSERT(fp8t_policy_add_overrides(&p, "layers=last:2,module=fc2,gemm=dgrad,precision=bf16",
                                       err, sizeof(err)) == 0,
             "%s", err);
    fp8t_policy_describe(&p, buf, sizeof(buf));
    T_CHECK(strstr(buf, "default: fp8 (= delayed)") != NULL, "%s", buf);
    T_CHECK(strstr(buf, "head: bf16") != NULL, "%s", buf);
    T_CHECK(strstr(buf, "override 1: layers=last:2,module=fc2,gemm=dgrad,precision=bf16"), "%s",
            buf);
    char small[16];
    fp8t_policy_describe(&p, small, sizeof(small)); /* truncates, never overflows */
    T_CHECK(strlen(small) == sizeof(small) - 1, "truncated length %zu", strlen(small));
}

int main(void) {
    t_suite = "policy";
    T_RUN(policy_defaults);
    T_RUN(policy_names);
    T_RUN(policy_rowwise);
    T_RUN(policy_parse_fields);
    T_RUN(policy_matching);
    T_RUN(policy_head);
    T_RUN(policy_env);
    T_RUN(policy_json_roundtrip);
    T_RUN(policy_errors);
    T_RUN(policy_describe);
    T_MAIN_END();
}
