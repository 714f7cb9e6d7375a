/* Fault injection: perturb one GEMM's tensor from a chosen step so the debugging tools (compare,
 * detectors, bisect) can be shown to find it.
 *
 * Value faults (scale, outliers, nan) act in the model hook. On an operand (input, grad_output)
 * they act BEFORE the GEMM quantizes it, and the operand is put back when the hook reports that
 * GEMM's result, so another GEMM that reads the same buffer (X for Wgrad, dY for Wgrad) sees
 * the clean values: the fault stays inside the chosen GEMM. On a result (output, dgrad, wgrad)
 * the perturbation stays: it is a wrong GEMM result.
 *
 * Amax faults (stale-amax, corrupt-amax) edit slot 0 of the tensor's amax history after the
 * step's backward and before the delayed-scaling update, so the next scale is computed from it.
 *
 * when=fp8 (default) fires a value fault only while the GEMM runs in an FP8 precision, and an
 * amax fault only while it runs in delayed scaling (the one recipe that reads the history): the
 * fault behaves like a broken cast or scale and goes away when the GEMM is put back in BF16
 * (or, for amax faults, in current scaling) — exactly what bisect must discover. when=delayed
 * confines a value fault to delayed scaling too (a bug in the delayed-scaling path), and
 * when=always fires in every precision (then it is no FP8 problem at all), and when=bf16 only
 * while the GEMM is NOT in FP8: a broken reference run, so FP8 ends below BF16 and the tools
 * must say the comparison can't be trusted rather than blame FP8. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/debug.h"
#include "fp8train/error.h"
#include "fp8train/inject.h"
#include "util/check.h"

typedef enum { F_SCALE, F_OUTLIERS, F_NAN, F_STALE_AMAX, F_CORRUPT_AMAX } fault_kind;
typedef enum { WHEN_FP8 = 0, WHEN_DELAYED, WHEN_ALWAYS, WHEN_BF16 } fault_when;

typedef struct {
    int layer_lo, layer_hi; /* inclusive; ignored for the head */
    unsigned module_mask;   /* bit (1u << fp8t_module); 0 = every module but the head */
    unsigned named_mask;    /* the modules named one by one (not through mlp / attn): each
                                 must exist in the model */
    int layer_named;        /* layer= gave numbers (not all): they must exist in the model */
    fp8t_gemm_kind gemm;
    fp8t_tensor_kind tensor;
    fault_kind kind;
    float value;  /* S for scale, V for outliers / corrupt-amax */
    int from, to; /* inclusive step window */
    int when;     /* WHEN_FP8, WHEN_DELAYED, WHEN_ALWAYS, WHEN_BF16 */
    uint64_t seed;
    double frac; /* outliers: fraction of positions */
    /* stale-amax: slot-0 values captured at the first step >= from, per FP8 tensor */
    float *stale;            /* [n_stale] host */
    unsigned char *captured; /* [n_stale] */
    int n_stale;
    int warned; /* "matches nothing" warning printed */
} fault;

/* An operand perturbed in place, to be put back when its GEMM's result is reported. */
typedef struct {
    float *x; /* device, [n] */
    size_t n;
    int lin;
    fp8t_gemm_kind gemm;
    float *saved; /* host copy of the clean values, [cap] */
    size_t cap;
    int active;
} pending_restore;

#define INJ_MAX_PENDING 8

struct fp8t_injector {
    int n;
    fault *f;
    int step;
    long fired;
    fp8t_backend *be; /* the backend of the model being observed */
    pending_restore pend[INJ_MAX_PENDING];
    float *work; /* host copy of a tensor being edited (outliers, nan), [work_cap] */
    size_t work_cap;
};

static const char *TENSOR_NAMES[FP8T_T_COUNT] = {"input",  "weight", "grad_output",
                                                 "output", "dgrad",  "wgrad"};

static const char *SYNTAX =
    "expected e.g. 'layer=2,module=fc2,gemm=dgrad,kind=outliers:1e4,from=50,to=80' "
    "(fp8train bisect --help-inject prints the full syntax)";

const char *fp8t_injector_help(void) {
    return "--inject SPEC   fault injection, several faults joined by ';'\n"
           "  e.g. 'layer=1-2,module=fc2,gemm=dgrad,kind=scale:64,from=10'\n"
           "  layer=A | A-B | all        transformer layers (default all)\n"
           "  module=qkv|proj|fc1|fc2|gate|up|down|head, joined by '+', or mlp / attn\n"
           "                             (default every module but the head)\n"
           "  gemm=fprop|dgrad|wgrad     the GEMM to break (required)\n"
           "  tensor=input|weight|grad_output|output|dgrad|wgrad\n"
           "                             default the GEMM's FP8 operand: fprop -> input,\n"
           "                             dgrad / wgrad -> grad_output\n"
           "  kind=scale:S               multiply the tensor by S\n"
           "       outliers:V            set a seeded sparse set of positions (frac=, default\n"
           "                             0.001, at least one) to +-V\n"
           "       nan                   put a NaN at one seeded position\n"
           "       stale-amax            freeze slot 0 of the tensor's amax history at its\n"
           "                             value at step `from`: the scale stops following data\n"
           "       corrupt-amax:V        set slot 0 of the tensor's amax history to V\n"
           "  from=S,to=E                first and last step, inclusive (default 0 .. end)\n"
           "  when=fp8|delayed|always|bf16  fp8 (default): fire only while that GEMM runs in an\n"
           "                             FP8 precision (delayed, current, block, rowwise,\n"
           "                             mxfp8, fake; amax faults: delayed only, the one\n"
           "                             recipe that reads the history) -- the fault acts like\n"
           "                             a broken FP8 cast and vanishes when the GEMM goes to\n"
           "                             BF16, so bisect can find it; delayed: only in delayed\n"
           "                             scaling (a broken\n"
           "                             delayed-scaling path: current scaling avoids it too);\n"
           "                             always: in every precision (not an FP8 problem);\n"
           "                             bf16: only while it is NOT in FP8 (a broken BF16\n"
           "                             reference: FP8 then ends below it; value faults)\n"
           "  seed=N, frac=F             outlier / NaN positions\n"
           "  Operands are perturbed before quantization and restored after their GEMM, so a\n"
           "  buffer shared with another GEMM (X: Fprop+Wgrad, dY: Dgrad+Wgrad) stays clean\n"
           "  there. Weights are read-only: only amax faults may name tensor=weight.\n";
}

/* ---------------------------------------------------------------- parsing */

static int parse_int(const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < INT_MIN || v > INT_MAX) return -1;
    *out = (int)v;
    return 0;
}

static int parse_float(const char *s, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end) return -1;
    *out = v;
    return 0;
}

static int parse_modules(const char *val, unsigned *mask, unsigned *named) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", val);
    *mask = 0;
    *named = 0;
    for (char *save = NULL, *tok = strtok_r(buf, "+", &save); tok;
         tok = strtok_r(NULL, "+", &save)) {
        if (strcmp(tok, "mlp") == 0) {
            *mask |= (1u << FP8T_MOD_FC1) | (1u << FP8T_MOD_FC2) | (1u << FP8T_MOD_GATE) |
                     (1u << FP8T_MOD_UP) | (1u << FP8T_MOD_DOWN);
        } else if (strcmp(tok, "attn") == 0) {
            *mask |= (1u << FP8T_MOD_QKV) | (1u << FP8T_MOD_PROJ);
        } else {
            fp8t_module mod;
            if (fp8t_module_parse(&mod, tok) != 0) return -1;
            *mask |= 1u << mod;
            *named |= 1u << mod;
        }
    }
    return *mask ? 0 : -1;
}

static int parse_kind(fault *f, const char *val) {
    const char *colon = strchr(val, ':');
    size_t name_len = colon ? (size_t)(colon - val) : strlen(val);
    double v = 0;
    int has_value = colon != NULL;
    if (has_value && parse_float(colon + 1, &v) != 0) return -1;
#define IS(name) (name_len == strlen(name) && strncmp(val, name, name_len) == 0)
    if (IS("scale") && has_value && isfinite(v))
        f->kind = F_SCALE;
    else if (IS("outliers") && has_value && isfinite(v))
        f->kind = F_OUTLIERS;
    else if (IS("nan") && !has_value)
        f->kind = F_NAN;
    else if (IS("stale-amax") && !has_value)
        f->kind = F_STALE_AMAX;
    else if (IS("corrupt-amax") && has_value && v >= 0)
        f->kind = F_CORRUPT_AMAX;
    else
        return -1;
#undef IS
    f->value = (float)v;
    return 0;
}

static int is_amax_fault(const fault *f) {
    return f->kind == F_STALE_AMAX || f->kind == F_CORRUPT_AMAX;
}

/* Parse one fault "k=v,k=v,...". */
static int parse_fault(fault *f, const char *spec, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    f->layer_lo = 0;
    f->layer_hi = INT_MAX;
    f->gemm = FP8T_GEMM_COUNT;
    f->tensor = FP8T_T_COUNT;
    f->kind = (fault_kind)-1;
    f->to = INT_MAX;
    f->seed = 1234;
    f->frac = 0.001;
    int have_kind = 0;
    char buf[1024];
    if (strlen(spec) >= sizeof buf) {
        return fp8t_errorf(err, errlen, "spec too long (%zu characters)", strlen(spec));
    }
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ') item++;
        char *eq = strchr(item, '=');
        if (!eq) {
            return fp8t_errorf(err, errlen, "'%s' is not key=value; %s", item, SYNTAX);
        }
        *eq = 0;
        const char *key = item, *val = eq + 1;
        int bad = 0;
        if (strcmp(key, "layer") == 0 || strcmp(key, "layers") == 0) {
            const char *dash = strchr(val, '-');
            f->layer_named = strcmp(val, "all") != 0;
            if (strcmp(val, "all") == 0) {
                f->layer_lo = 0, f->layer_hi = INT_MAX;
            } else if (dash && dash != val) {
                char a[32];
                snprintf(a, sizeof a, "%.*s", (int)(dash - val), val);
                bad = parse_int(a, &f->layer_lo) || parse_int(dash + 1, &f->layer_hi) ||
                      f->layer_lo < 0 || f->layer_hi < f->layer_lo;
            } else {
                bad = parse_int(val, &f->layer_lo) || f->layer_lo < 0;
                f->layer_hi = f->layer_lo;
            }
        } else if (strcmp(key, "module") == 0 || strcmp(key, "modules") == 0) {
            bad = parse_modules(val, &f->module_mask, &f->named_mask);
        } else if (strcmp(key, "gemm") == 0) {
            bad = 1;
            for (int g = 0; g < FP8T_GEMM_COUNT; g++)
                if (strcmp(val, fp8t_gemm_name((fp8t_gemm_kind)g)) == 0)
                    f->gemm = (fp8t_gemm_kind)g, bad = 0;
        } else if (strcmp(key, "tensor") == 0) {
            bad = 1;
            for (int t = 0; t < FP8T_T_COUNT; t++)
                if (strcmp(val, TENSOR_NAMES[t]) == 0) f->tensor = (fp8t_tensor_kind)t, bad = 0;
        } else if (strcmp(key, "kind") == 0) {
            bad = parse_kind(f, val);
            have_kind = !bad;
        } else if (strcmp(key, "from") == 0) {
            bad = parse_int(val, &f->from) || f->from < 0;
        } else if (strcmp(key, "to") == 0) {
            bad = parse_int(val, &f->to) || f->to < 0;
        } else if (strcmp(key, "when") == 0) {
            if (strcmp(val, "fp8") == 0)
                f->when = WHEN_FP8;
            else if (strcmp(val, "delayed") == 0)
                f->when = WHEN_DELAYED;
            else if (strcmp(val, "always") == 0)
                f->when = WHEN_ALWAYS;
            else if (strcmp(val, "bf16") == 0)
                f->when = WHEN_BF16;
            else
                bad = 1;
        } else if (strcmp(key, "seed") == 0) {
            char *end;
            unsigned long long s = strtoull(val, &end, 10);
            bad = end == val || *end;
            f->seed = (uint64_t)s;
        } else if (strcmp(key, "frac") == 0) {
            double v = 0;
            bad = parse_float(val, &v) || !(v > 0 && v <= 1);
            f->frac = v;
        } else {
            return fp8t_errorf(err, errlen,
                               "unknown key '%s' (keys: layer, module, gemm, tensor, kind, "
                               "from, to, when, seed, frac); %s",
                               key, SYNTAX);
        }
        if (bad) {
            const char *hint =
                strcmp(key, "kind") == 0
                    ? "kind is scale:S | outliers:V | nan | stale-amax | corrupt-amax:V (V >= 0)"
                : strcmp(key, "gemm") == 0 ? "gemm is fprop | dgrad | wgrad"
                : strcmp(key, "tensor") == 0
                    ? "tensor is input | weight | grad_output | output | dgrad | wgrad"
                : strcmp(key, "module") == 0
                    ? "module is qkv|proj|fc1|fc2|gate|up|down|head joined by '+', or mlp/attn"
                : strcmp(key, "when") == 0 ? "when is fp8 | delayed | always | bf16"
                : strcmp(key, "frac") == 0 ? "frac is a fraction in (0, 1]"
                : strcmp(key, "layer") == 0 || strcmp(key, "layers") == 0
                    ? "layer is N, A-B (A <= B) or all"
                    : "expected a non-negative integer";
            return fp8t_errorf(err, errlen, "bad value '%s' for %s: %s", val, key, hint);
        }
    }
    if (f->gemm == FP8T_GEMM_COUNT) {
        return fp8t_errorf(err, errlen, "gemm= is required (fprop | dgrad | wgrad); %s", SYNTAX);
    }
    if (!have_kind) {
        return fp8t_errorf(err, errlen,
                           "kind= is required (scale:S | outliers:V | nan | stale-amax | "
                           "corrupt-amax:V); %s",
                           SYNTAX);
    }
    if (f->tensor == FP8T_T_COUNT)
        f->tensor = f->gemm == FP8T_GEMM_FPROP ? FP8T_T_INPUT : FP8T_T_GRAD_OUTPUT;
    if (f->to < f->from) {
        return fp8t_errorf(err, errlen, "to=%d is before from=%d", f->to, f->from);
    }
    /* The tensor must belong to the GEMM: Fprop reads X and W and writes Y; Dgrad reads dY
     * and W and writes dX; Wgrad reads dY and X and writes dW. */
    static const unsigned tensors_of[FP8T_GEMM_COUNT] = {
        (1u << FP8T_T_INPUT) | (1u << FP8T_T_WEIGHT) | (1u << FP8T_T_OUTPUT),
        (1u << FP8T_T_GRAD_OUTPUT) | (1u << FP8T_T_WEIGHT) | (1u << FP8T_T_DGRAD),
        (1u << FP8T_T_GRAD_OUTPUT) | (1u << FP8T_T_INPUT) | (1u << FP8T_T_WGRAD),
    };
    if (!(tensors_of[f->gemm] & (1u << f->tensor))) {
        return fp8t_errorf(
            err, errlen,
            "tensor=%s is not a tensor of the %s GEMM (fprop: input, weight, "
            "output; dgrad: grad_output, weight, dgrad; wgrad: grad_output, input, wgrad)",
            TENSOR_NAMES[f->tensor], fp8t_gemm_name(f->gemm));
    }
    if (is_amax_fault(f) && f->tensor != FP8T_T_INPUT && f->tensor != FP8T_T_WEIGHT &&
        f->tensor != FP8T_T_GRAD_OUTPUT) {
        return fp8t_errorf(err, errlen,
                           "%s needs a tensor with an amax history (input, weight or "
                           "grad_output), not %s",
                           f->kind == F_STALE_AMAX ? "stale-amax" : "corrupt-amax",
                           TENSOR_NAMES[f->tensor]);
    }
    if (is_amax_fault(f) && f->when == WHEN_BF16) {
        return fp8t_errorf(
            err, errlen,
            "when=bf16 is for value faults (scale, outliers, nan): an amax history is read "
            "only in delayed scaling, so an amax fault can't act outside FP8");
    }
    if (!is_amax_fault(f) && f->tensor == FP8T_T_WEIGHT) {
        return fp8t_errorf(
            err, errlen,
            "weights are read-only in the model hook; use tensor=input / "
            "grad_output / a result, or an amax fault (stale-amax, corrupt-amax) on the "
            "weight");
    }
    return 0;
}

static int parse_spec(const char *spec, fault **out, int *n_out, char *err, size_t errlen) {
    *out = NULL;
    *n_out = 0;
    if (!spec || !*spec) {
        return fp8t_errorf(err, errlen, "empty spec; %s", SYNTAX);
    }
    size_t len = strlen(spec);
    char *buf = malloc(len + 1);
    fault *f = calloc(len / 2 + 2, sizeof *f); /* a fault needs at least 2 characters */
    if (!buf || !f) {
        free(buf), free(f);
        return fp8t_errorf(err, errlen, "out of memory");
    }
    memcpy(buf, spec, len + 1);
    int n = 0;
    for (char *save = NULL, *one = strtok_r(buf, ";", &save); one;
         one = strtok_r(NULL, ";", &save)) {
        while (*one == ' ') one++;
        if (!*one) continue;
        if (parse_fault(&f[n], one, err, errlen) != 0) {
            free(buf), free(f);
            return -1;
        }
        n++;
    }
    free(buf);
    if (n == 0) {
        free(f);
        return fp8t_errorf(err, errlen, "empty spec; %s", SYNTAX);
    }
    *out = f;
    *n_out = n;
    return 0;
}

int fp8t_injector_check(const char *spec, char *err, size_t errlen) {
    fault *f;
    int n;
    if (parse_spec(spec, &f, &n, err, errlen) != 0) return -1;
    free(f);
    return 0;
}

fp8t_injector *fp8t_injector_create(const char *spec, char *err, size_t errlen) {
    fp8t_injector *inj = calloc(1, sizeof *inj);
    if (!inj) {
        fp8t_errorf(err, errlen, "out of memory");
        return NULL;
    }
    if (parse_spec(spec, &inj->f, &inj->n, err, errlen) != 0) {
        free(inj);
        return NULL;
    }
    inj->step = -1;
    return inj;
}

/* A fault that names a layer or a module the model lacks would never fire, and a run that
 * "survives" it proves nothing: refuse it before training. Groups (mlp, attn) only need one
 * of their modules in the model (GPT-2 has fc1/fc2, Llama gate/up/down). */
int fp8t_injector_check_model(const fp8t_injector *inj, const fp8t_model_config *cfg, char *err,
                              size_t errlen) {
    if (!inj || !cfg) return 0;
    int mpl = fp8t_model_modules_per_layer(cfg);
    unsigned have = 1u << FP8T_MOD_HEAD;
    char names[128] = "";
    for (int s = 0; s < mpl; s++) {
        fp8t_module m = fp8t_model_module_of_slot(cfg, s);
        have |= 1u << m;
        size_t len = strlen(names);
        snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", fp8t_module_name(m));
    }
    for (int i = 0; i < inj->n; i++) {
        const fault *f = &inj->f[i];
        if (f->layer_named && f->layer_hi >= cfg->n_layer) {
            return fp8t_errorf(
                err, errlen,
                "fault %d: layer=%d%s but the model has %d layer%s (0-%d): name layers "
                "0-%d, or layer=all",
                i + 1, f->layer_lo == f->layer_hi ? f->layer_lo : f->layer_hi,
                f->layer_lo == f->layer_hi ? "" : " (end of the range)", cfg->n_layer,
                cfg->n_layer == 1 ? "" : "s", cfg->n_layer - 1, cfg->n_layer - 1);
        }
        for (int m = 0; m < FP8T_MOD_COUNT; m++) {
            if (!(f->named_mask & (1u << m)) || (have & (1u << m))) continue;
            return fp8t_errorf(
                err, errlen,
                "fault %d: module=%s is not a module of this %s model (its modules: %s, "
                "head; or mlp / attn)",
                i + 1, fp8t_module_name((fp8t_module)m), fp8t_arch_name(cfg->arch), names);
        }
        if (f->module_mask && !(f->module_mask & have)) {
            return fp8t_errorf(err, errlen,
                               "fault %d: no module of module= exists in this model (its "
                               "modules: %s, head)",
                               i + 1, names);
        }
    }
    return 0;
}

void fp8t_injector_destroy(fp8t_injector *inj) {
    if (!inj) return;
    for (int i = 0; i < inj->n; i++) free(inj->f[i].stale), free(inj->f[i].captured);
    free(inj->f);
    /* host memory only: the injector may outlive the backend */
    for (int i = 0; i < INJ_MAX_PENDING; i++) free(inj->pend[i].saved);
    free(inj->work);
    free(inj);
}

long fp8t_injector_fired(const fp8t_injector *inj) { return inj ? inj->fired : 0; }

void fp8t_injector_begin_step(fp8t_injector *inj, int step) {
    if (!inj) return;
    inj->step = step;
    /* A perturbed operand whose result never came back is left as it is: its buffer now holds
     * new data, restoring would corrupt that. */
    for (int i = 0; i < INJ_MAX_PENDING; i++) inj->pend[i].active = 0;
}

/* ---------------------------------------------------------------- matching */

static int in_window(const fault *f, int step) { return step >= f->from && step <= f->to; }

static int matches_place(const fault *f, int layer, fp8t_module mod) {
    if (f->module_mask == 0) {
        if (mod == FP8T_MOD_HEAD) return 0;
    } else if (!(f->module_mask & (1u << mod))) {
        return 0;
    }
    if (mod == FP8T_MOD_HEAD) return 1;
    return layer >= f->layer_lo && layer <= f->layer_hi;
}

static int is_fp8_precision(fp8t_precision p) {
    return p == FP8T_PREC_FP8 || p == FP8T_PREC_DELAYED || p == FP8T_PREC_CURRENT ||
           p == FP8T_PREC_BLOCK || p == FP8T_PREC_ROWWISE || p == FP8T_PREC_MXFP8 ||
           p == FP8T_PREC_FAKE;
}

/* Value faults: when=fp8 fires in any FP8 precision, when=delayed only in delayed scaling
 * (a broken delayed-scaling path: current scaling and BF16 avoid it), when=always always,
 * when=bf16 only outside FP8 (a broken reference). */
static int fires_in(const fault *f, fp8t_precision p) {
    switch (f->when) {
    case WHEN_ALWAYS: return 1;
    case WHEN_DELAYED: return p == FP8T_PREC_DELAYED;
    case WHEN_BF16: return !is_fp8_precision(p);
    default: return is_fp8_precision(p);
    }
}

static fp8t_tensor_kind result_of(fp8t_gemm_kind g) {
    return g == FP8T_GEMM_FPROP   ? FP8T_T_OUTPUT
           : g == FP8T_GEMM_DGRAD ? FP8T_T_DGRAD
                                  : FP8T_T_WGRAD;
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Deterministic per (seed, step, linear, gemm, tensor): the same positions in every run. */
static uint64_t position_seed(const fault *f, int step, const fp8t_tensor_site *site) {
    uint64_t s = f->seed;
    s ^= (uint64_t)(uint32_t)step * 0x100000001B3ull;
    s ^= ((uint64_t)(uint32_t)site->lin << 20) ^ ((uint64_t)site->gemm << 8) ^
         (uint64_t)site->kind;
    splitmix64(&s);
    return s;
}

static float *grow(float *p, size_t *cap, size_t n) {
    if (n <= *cap) return p;
    free(p);
    p = malloc(n * sizeof(float));
    if (!p) {
        FP8T_FATAL("out of memory");
    }
    *cap = n;
    return p;
}

/* Save x (an operand about to be perturbed) once per GEMM, to restore at its result site. */
static void save_operand(fp8t_injector *inj, const fp8t_tensor_site *site, float *x, size_t n) {
    fp8t_backend *be = inj->be;
    int free_slot = -1;
    for (int i = 0; i < INJ_MAX_PENDING; i++) {
        pending_restore *p = &inj->pend[i];
        if (p->active && p->x == x && p->lin == site->lin && p->gemm == site->gemm)
            return; /* a second fault on the same operand: the first save holds clean values */
        if (!p->active && free_slot < 0) free_slot = i;
    }
    if (free_slot < 0) {
        fp8t_warnf("inject: more than %d operands perturbed at once; the oldest will not be "
                   "restored",
                   INJ_MAX_PENDING);
        free_slot = 0;
    }
    pending_restore *p = &inj->pend[free_slot];
    p->saved = grow(p->saved, &p->cap, n);
    be->ops->to_host(be, p->saved, x, n * sizeof(float));
    p->x = x;
    p->n = n;
    p->lin = site->lin;
    p->gemm = site->gemm;
    p->active = 1;
}

static void restore_operands(fp8t_injector *inj, const fp8t_tensor_site *site) {
    for (int i = 0; i < INJ_MAX_PENDING; i++) {
        pending_restore *p = &inj->pend[i];
        if (p->active && p->lin == site->lin && p->gemm == site->gemm) {
            inj->be->ops->to_device(inj->be, p->x, p->saved, p->n * sizeof(float));
            p->active = 0;
        }
    }
}

static void apply_value_fault(fp8t_injector *inj, const fault *f, const fp8t_tensor_site *site,
                              float *x, size_t n) {
    fp8t_backend *be = inj->be;
    if (f->kind == F_SCALE) {
        be->ops->scale(be, x, f->value, n);
        return;
    }
    uint64_t s = position_seed(f, inj->step, site);
    size_t k = 1;
    if (f->kind == F_OUTLIERS) {
        double want = f->frac * (double)n + 0.5;
        k = want < 1 ? 1 : want > (double)n ? n : (size_t)want;
    }
    /* edit a host copy: a round trip per perturbation is fine for a debugging feature */
    inj->work = grow(inj->work, &inj->work_cap, n);
    be->ops->to_host(be, inj->work, x, n * sizeof(float));
    for (size_t i = 0; i < k; i++) {
        uint64_t r = splitmix64(&s);
        size_t pos = (size_t)(splitmix64(&s) % n);
        inj->work[pos] = f->kind == F_NAN ? NAN : (r & 1) ? f->value : -f->value;
    }
    be->ops->to_device(be, x, inj->work, n * sizeof(float));
}

void fp8t_injector_observe(fp8t_injector *inj, fp8t_model *m, const fp8t_tensor_site *site,
                           float *x) {
    if (!inj || !site || !x) return;
    inj->be = fp8t_model_backend(m);
    /* A GEMM result means the GEMM has consumed its operands: put back what we perturbed. */
    if (site->kind == result_of(site->gemm)) restore_operands(inj, site);
    size_t n = (size_t)site->rows * (size_t)site->cols;
    if (n == 0) return;
    for (int i = 0; i < inj->n; i++) {
        const fault *f = &inj->f[i];
        if (is_amax_fault(f) || !in_window(f, inj->step)) continue;
        if (site->gemm != f->gemm || site->kind != f->tensor) continue;
        if (!matches_place(f, site->layer, site->module)) continue;
        if (!fires_in(f, site->precision)) continue;
        if (site->kind == FP8T_T_INPUT || site->kind == FP8T_T_GRAD_OUTPUT)
            save_operand(inj, site, x, n);
        apply_value_fault(inj, f, site, x, n);
        inj->fired++;
    }
}

/* ---------------------------------------------------------------- amax faults */

static fp8t_fp8_role role_of(fp8t_tensor_kind t) {
    return t == FP8T_T_INPUT ? FP8T_ROLE_X : t == FP8T_T_WEIGHT ? FP8T_ROLE_W : FP8T_ROLE_DY;
}

void fp8t_injector_before_scale_update(fp8t_injector *inj, fp8t_model *m, int step) {
    if (!inj || !m) return;
    fp8t_backend *be = fp8t_model_backend(m);
    const fp8t_model_config *cfg = fp8t_model_get_config(m);
    int mpl = fp8t_model_modules_per_layer(cfg);
    int n_fp8 = fp8t_model_fp8_count(m);
    float *state = fp8t_model_fp8_state(m); /* history[0][t] is state[t] */
    for (int i = 0; i < inj->n; i++) {
        fault *f = &inj->f[i];
        if (!is_amax_fault(f) || !in_window(f, step)) continue;
        if (f->kind == F_STALE_AMAX && f->n_stale != n_fp8) {
            free(f->stale), free(f->captured);
            f->stale = calloc((size_t)n_fp8, sizeof(float));
            f->captured = calloc((size_t)n_fp8, 1);
            if (!f->stale || !f->captured) {
                FP8T_FATAL("out of memory");
            }
            f->n_stale = n_fp8;
        }
        int matched = 0;
        for (int lin = 0; lin < fp8t_model_num_linears(cfg); lin++) {
            int layer = lin / mpl;
            fp8t_module mod =
                layer < cfg->n_layer ? fp8t_model_module_of_slot(cfg, lin % mpl) : FP8T_MOD_HEAD;
            if (mod == FP8T_MOD_HEAD) layer = -1;
            if (!matches_place(f, layer, mod)) continue;
            matched = 1;
            int t = lin * 3 + (int)role_of(f->tensor);
            if (t >= n_fp8) continue;
            int fire = f->when == WHEN_ALWAYS ||
                       fp8t_model_gemm_precision(m, lin, f->gemm) == FP8T_PREC_DELAYED;
            if (f->kind == F_STALE_AMAX) {
                if (!f->captured[t]) {
                    /* The first step of the window: remember this step's amax; from now on
                     * slot 0 keeps reporting it whatever the data does. */
                    be->ops->to_host(be, &f->stale[t], state + t, sizeof(float));
                    f->captured[t] = 1;
                    continue;
                }
                if (fire) {
                    be->ops->to_device(be, state + t, &f->stale[t], sizeof(float));
                    inj->fired++;
                }
            } else if (fire) {
                be->ops->to_device(be, state + t, &f->value, sizeof(float));
                inj->fired++;
            }
        }
        if (!matched && !f->warned) {
            fp8t_warnf("--inject fault %d matches no linear layer of this model (%d layers); "
                       "check layer= and module=",
                       i + 1, cfg->n_layer);
            f->warned = 1;
        }
    }
}
