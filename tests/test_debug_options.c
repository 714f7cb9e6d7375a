/* The debugging switches as options (issue 14, item 4): the library takes them in
 * fp8t_model_options / fp8t_backend_options at creation, and only the option layer
 * (src/train/options.c) reads their environment variables:
 *  - --disable LIST sets the model's FP8T_DISABLE_* bits and the backend's plain / no_lt_fp8;
 *    all-fusion is every fusion bit and cuda-fusion; none and "" clear; a bad name is refused
 *    with the list of names;
 *  - --cuda-attn and --cuda-sync set the backend options; a bad implementation is refused;
 *  - config.json records them, and reading it back gives the same options;
 *  - the old variables (FP8TRAIN_NO_GELU_FUSION=1, FP8TRAIN_CUDA_PLAIN=1, FP8TRAIN_CUDA_ATTN, ...)
 *    are the defaults: they add to a config file, the command line replaces them;
 *  - fp8t_options_debug_env (the other commands) reads the same variables;
 *  - the attention names table and fp8t_backend_create's range check. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/train_options.h"
#include "test.h"

static const char *const ENV_VARS[] = {"FP8TRAIN_NO_FUSED_XENT",
                                       "FP8TRAIN_NO_BF16_XENT",
                                       "FP8TRAIN_NO_CODE_REUSE",
                                       "FP8TRAIN_NO_BF16_OPERANDS",
                                       "FP8TRAIN_NO_GELU_FUSION",
                                       "FP8TRAIN_NO_BIAS_GRAD_FUSION",
                                       "FP8TRAIN_NO_GELU_BWD_FUSION",
                                       "FP8TRAIN_NO_RESIDUAL_BIAS",
                                       "FP8TRAIN_NO_LN_FUSION",
                                       "FP8TRAIN_NO_ATTN_SAVE",
                                       "FP8TRAIN_NO_FP8_SAVE",
                                       "FP8TRAIN_NO_SWIGLU_FUSION",
                                       "FP8TRAIN_NO_SWIGLU_BWD_FUSION",
                                       "FP8TRAIN_NO_X_SHARE",
                                       "FP8TRAIN_CUDA_PLAIN",
                                       "FP8TRAIN_CUDA_NO_LT_FP8",
                                       "FP8TRAIN_CUDA_SYNC",
                                       "FP8TRAIN_CUDA_ATTN",
                                       "FP8TRAIN_PRECISION",
                                       "FP8TRAIN_FPROP",
                                       "FP8TRAIN_DGRAD",
                                       "FP8TRAIN_WGRAD"};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof(ENV_VARS) / sizeof(ENV_VARS[0]); i++) unsetenv(ENV_VARS[i]);
}

/* parse `train` arguments (a NULL-terminated list) on a fresh config; the return code */
static int parse(fp8t_train_config *c, char *err, size_t errlen, ...) {
    char *argv[32];
    int argc = 0;
    va_list ap;
    va_start(ap, errlen);
    for (char *a; argc < 31 && (a = va_arg(ap, char *)) != NULL;) argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    err[0] = 0;
    return fp8t_train_parse_args(c, argc, argv, err, errlen);
}

/* --format: the block and rowwise GEMMs follow it only when it is given (their default is E4M3
 * everywhere, the per-tensor recipes' hybrid); --precision rowwise parses */
static void format_and_rowwise(void) {
    clear_env();
    fp8t_train_config c;
    char err[1024];
    T_ASSERT(parse(&c, err, sizeof(err), "--precision", "rowwise", NULL) == 0, "%s", err);
    T_CHECK(c.policy.default_precision == FP8T_PREC_ROWWISE && c.policy.hybrid == 1 &&
                c.policy.block_hybrid == 0,
            "default: rowwise, hybrid %d, block_hybrid %d", c.policy.hybrid,
            c.policy.block_hybrid);
    T_ASSERT(parse(&c, err, sizeof(err), "--precision", "block", "--format", "hybrid", NULL) == 0,
             "%s", err);
    T_CHECK(c.policy.hybrid == 1 && c.policy.block_hybrid == 1, "--format hybrid: %d %d",
            c.policy.hybrid, c.policy.block_hybrid);
    T_ASSERT(parse(&c, err, sizeof(err), "--format", "e4m3", NULL) == 0, "%s", err);
    T_CHECK(c.policy.hybrid == 0 && c.policy.block_hybrid == 0, "--format e4m3: %d %d",
            c.policy.hybrid, c.policy.block_hybrid);
    T_CHECK(parse(&c, err, sizeof(err), "--precision", "rowwize", NULL) != 0 &&
                strstr(err, "rowwise"),
            "the error lists rowwise: %s", err);
}

static void disable_list(void) {
    clear_env();
    fp8t_train_config c;
    char err[1024];
    T_ASSERT(parse(&c, err, sizeof(err), NULL) == 0, "%s", err);
    T_CHECK(c.model_opts.disable == 0 && !c.backend_opts.plain && !c.backend_opts.no_lt_fp8 &&
                !c.backend_opts.sync_each_op && c.backend_opts.attn == FP8T_ATTN_DEFAULT,
            "defaults: every path on (disable 0x%x)", c.model_opts.disable);

    T_ASSERT(parse(&c, err, sizeof(err), "--disable", "gelu-fusion,ln-fusion", NULL) == 0, "%s",
             err);
    T_CHECK(c.model_opts.disable == (FP8T_DISABLE_GELU_FUSION | FP8T_DISABLE_LN_FUSION) &&
                !c.backend_opts.plain,
            "gelu-fusion,ln-fusion: 0x%x", c.model_opts.disable);

    T_ASSERT(parse(&c, err, sizeof(err), "--disable", "all-fusion", NULL) == 0, "%s", err);
    T_CHECK(c.model_opts.disable == FP8T_DISABLE_ALL_FUSION && c.backend_opts.plain &&
                !c.backend_opts.no_lt_fp8,
            "all-fusion: 0x%x plain %d lt %d", c.model_opts.disable, c.backend_opts.plain,
            c.backend_opts.no_lt_fp8);

    T_ASSERT(parse(&c, err, sizeof(err), "--disable=cuda-lt-fp8,fp8-save,cuda-fusion", NULL) == 0,
             "%s", err);
    T_CHECK(c.model_opts.disable == FP8T_DISABLE_FP8_SAVE && c.backend_opts.plain &&
                c.backend_opts.no_lt_fp8,
            "cuda-lt-fp8,fp8-save,cuda-fusion: 0x%x", c.model_opts.disable);

    /* the last --disable wins, as for every option; none clears */
    T_ASSERT(parse(&c, err, sizeof(err), "--disable", "all-fusion", "--disable", "none", NULL) ==
                 0,
             "%s", err);
    T_CHECK(c.model_opts.disable == 0 && !c.backend_opts.plain, "none after all-fusion: 0x%x",
            c.model_opts.disable);

    T_CHECK(parse(&c, err, sizeof(err), "--disable", "gelu-fusion,gelu", NULL) == -1 &&
                strstr(err, "--disable") && strstr(err, "'gelu-fusion,gelu'") &&
                strstr(err, "bias-grad-fusion") && strstr(err, "all-fusion"),
            "a bad name: %s", err);
    T_CHECK(parse(&c, err, sizeof(err), "--disable", "ln-fusion,,", NULL) == 0 &&
                c.model_opts.disable == FP8T_DISABLE_LN_FUSION,
            "empty items are skipped: %s", err);
}

static void cuda_options(void) {
    clear_env();
    fp8t_train_config c;
    char err[1024];
    T_ASSERT(parse(&c, err, sizeof(err), "--cuda-attn", "tiled", "--cuda-sync", "1", NULL) == 0,
             "%s", err);
    T_CHECK(c.backend_opts.attn == FP8T_ATTN_TILED && c.backend_opts.sync_each_op == 1,
            "attn %d sync %d", (int)c.backend_opts.attn, c.backend_opts.sync_each_op);
    T_CHECK(parse(&c, err, sizeof(err), "--cuda-attn", "fast", NULL) == -1 &&
                strstr(err, "--cuda-attn") && strstr(err, "'fast'") && strstr(err, "flash") &&
                strstr(err, "simple"),
            "a bad implementation: %s", err);
}

/* s without blanks (cJSON's layout), in place */
static char *squeeze(char *s) {
    char *o = s;
    for (const char *p = s; *p; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n') *o++ = *p;
    *o = 0;
    return s;
}

static void config_json_records(void) {
    clear_env();
    fp8t_train_config c, d;
    char err[1024];
    T_ASSERT(parse(&c, err, sizeof(err), "--disable", "bf16-xent,attn-save,cuda-lt-fp8",
                   "--cuda-attn", "gemm", "--cuda-sync", "1", NULL) == 0,
             "%s", err);
    char *js = fp8t_train_config_to_json(&c);
    T_ASSERT(js, "no JSON");
    squeeze(js);
    T_CHECK(strstr(js, "\"disable\":\"bf16-xent,attn-save,cuda-lt-fp8\"") &&
                strstr(js, "\"cuda_attn\":\"gemm\"") && strstr(js, "\"cuda_sync\":1"),
            "config.json lacks the options: %s", js);
    fp8t_train_config_default(&d);
    T_CHECK(fp8t_train_config_apply_json(&d, js, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(d.model_opts.disable == c.model_opts.disable &&
                d.backend_opts.no_lt_fp8 == c.backend_opts.no_lt_fp8 &&
                d.backend_opts.plain == c.backend_opts.plain &&
                d.backend_opts.attn == c.backend_opts.attn &&
                d.backend_opts.sync_each_op == c.backend_opts.sync_each_op,
            "read back: disable 0x%x vs 0x%x, attn %d vs %d", d.model_opts.disable,
            c.model_opts.disable, (int)d.backend_opts.attn, (int)c.backend_opts.attn);
    free(js);
    /* the defaults are written too ("none", "default"), so a run's config.json states them */
    fp8t_train_config_default(&d);
    js = fp8t_train_config_to_json(&d);
    T_CHECK(js && strstr(squeeze(js), "\"disable\":\"none\"") &&
                strstr(js, "\"cuda_attn\":\"default\""),
            "defaults not recorded: %s", js ? js : "(null)");
    free(js);
}

static void environment_defaults(void) {
    clear_env();
    fp8t_train_config c;
    char err[1024];
    setenv("FP8TRAIN_NO_GELU_FUSION", "1", 1);
    setenv("FP8TRAIN_NO_FP8_SAVE", "0", 1); /* "0" and "" leave it on */
    setenv("FP8TRAIN_NO_LN_FUSION", "", 1);
    setenv("FP8TRAIN_CUDA_PLAIN", "1", 1);
    setenv("FP8TRAIN_CUDA_ATTN", "simple", 1);
    setenv("FP8TRAIN_CUDA_SYNC", "yes", 1);
    T_ASSERT(parse(&c, err, sizeof(err), NULL) == 0, "%s", err);
    T_CHECK(c.model_opts.disable == FP8T_DISABLE_GELU_FUSION && c.backend_opts.plain &&
                c.backend_opts.attn == FP8T_ATTN_SIMPLE && c.backend_opts.sync_each_op,
            "from the environment: 0x%x plain %d attn %d sync %d", c.model_opts.disable,
            c.backend_opts.plain, (int)c.backend_opts.attn, c.backend_opts.sync_each_op);
    /* the command line replaces them */
    T_ASSERT(parse(&c, err, sizeof(err), "--disable", "code-reuse", "--cuda-attn", "flash",
                   "--cuda-sync", "0", NULL) == 0,
             "%s", err);
    T_CHECK(c.model_opts.disable == FP8T_DISABLE_CODE_REUSE && !c.backend_opts.plain &&
                c.backend_opts.attn == FP8T_ATTN_FLASH && !c.backend_opts.sync_each_op,
            "command line over the environment: 0x%x plain %d", c.model_opts.disable,
            c.backend_opts.plain);
    /* the other commands read the same variables */
    fp8t_model_options mo = {0};
    fp8t_backend_options bo = {0};
    T_CHECK(fp8t_options_debug_env(&mo, &bo, err, sizeof(err)) == 0, "%s", err);
    T_CHECK(mo.disable == FP8T_DISABLE_GELU_FUSION && bo.plain && bo.attn == FP8T_ATTN_SIMPLE &&
                bo.sync_each_op && !bo.no_lt_fp8,
            "fp8t_options_debug_env: 0x%x", mo.disable);
    setenv("FP8TRAIN_CUDA_ATTN", "fastest", 1);
    T_CHECK(parse(&c, err, sizeof(err), NULL) == -1 && strstr(err, "environment") &&
                strstr(err, "FP8TRAIN_CUDA_ATTN=fastest"),
            "a bad variable: %s", err);
    T_CHECK(fp8t_options_debug_env(&mo, &bo, err, sizeof(err)) == -1 &&
                strstr(err, "FP8TRAIN_CUDA_ATTN"),
            "a bad variable (debug_env): %s", err);
    clear_env();
    /* the policy's variables stay where they were: config file < environment < command line */
    setenv("FP8TRAIN_DGRAD", "bf16", 1);
    T_ASSERT(parse(&c, err, sizeof(err), NULL) == 0, "%s", err);
    T_CHECK(c.policy.n_overrides == 1 && fp8t_policy_resolve(&c.policy, 4, 1, FP8T_MOD_FC1,
                                                             FP8T_GEMM_DGRAD) == FP8T_PREC_BF16,
            "FP8TRAIN_DGRAD=bf16: %d overrides", c.policy.n_overrides);
    setenv("FP8TRAIN_DGRAD", "half", 1);
    T_CHECK(parse(&c, err, sizeof(err), NULL) == -1 && strstr(err, "FP8TRAIN_DGRAD='half'"),
            "bad FP8TRAIN_DGRAD: %s", err);
    clear_env();
}

/* --head-chunk: auto (the default, 0 in fp8t_model_options), 0 (off), rows (a multiple of
 * 8); recorded in config.json and read back; a model created with a bad count is refused */
static void head_chunk_option(void) {
    clear_env();
    fp8t_train_config c, d;
    char err[1024];
    T_ASSERT(parse(&c, err, sizeof(err), NULL) == 0, "%s", err);
    T_CHECK(c.model_opts.head_chunk == FP8T_HEAD_CHUNK_AUTO, "default %d",
            c.model_opts.head_chunk);
    char *js = fp8t_train_config_to_json(&c);
    T_CHECK(js && strstr(squeeze(js), "\"head_chunk\":\"auto\""), "default not recorded: %s",
            js ? js : "(null)");
    free(js);
    T_ASSERT(parse(&c, err, sizeof(err), "--head-chunk", "0", NULL) == 0, "%s", err);
    T_CHECK(c.model_opts.head_chunk < 0, "0: %d (expected off)", c.model_opts.head_chunk);
    js = fp8t_train_config_to_json(&c);
    T_CHECK(js && strstr(squeeze(js), "\"head_chunk\":\"0\""), "off not recorded: %s",
            js ? js : "(null)");
    fp8t_train_config_default(&d);
    T_CHECK(js && fp8t_train_config_apply_json(&d, js, err, sizeof(err)) == 0 &&
                d.model_opts.head_chunk < 0,
            "off read back: %d (%s)", d.model_opts.head_chunk, err);
    free(js);
    T_ASSERT(parse(&c, err, sizeof(err), "--head-chunk", "4096", NULL) == 0, "%s", err);
    T_CHECK(c.model_opts.head_chunk == 4096, "4096: %d", c.model_opts.head_chunk);
    js = fp8t_train_config_to_json(&c);
    fp8t_train_config_default(&d);
    T_CHECK(js && fp8t_train_config_apply_json(&d, js, err, sizeof(err)) == 0 &&
                d.model_opts.head_chunk == 4096,
            "4096 read back: %d (%s)", d.model_opts.head_chunk, err);
    free(js);
    T_CHECK(parse(&c, err, sizeof(err), "--head-chunk", "100", NULL) == -1 &&
                strstr(err, "--head-chunk") && strstr(err, "multiple of 8"),
            "100 accepted: %s", err);
    T_CHECK(parse(&c, err, sizeof(err), "--head-chunk", "-8", NULL) == -1, "-8 accepted");
    T_CHECK(parse(&c, err, sizeof(err), "--head-chunk", "some", NULL) == -1, "'some' accepted");
    T_ASSERT(parse(&c, err, sizeof(err), "--head-chunk", "auto", NULL) == 0, "%s", err);
    T_CHECK(c.model_opts.head_chunk == FP8T_HEAD_CHUNK_AUTO, "auto: %d", c.model_opts.head_chunk);
}

static void attention_names(void) {
    /* every implementation has a name that parses back to it; the list names each once */
    const char *list = fp8t_attn_impl_names();
    for (int a = 0; a < FP8T_ATTN_IMPL_COUNT; a++) {
        const char *n = fp8t_attn_impl_name((fp8t_attn_impl)a);
        fp8t_attn_impl back = FP8T_ATTN_IMPL_COUNT;
        T_CHECK(n && fp8t_attn_impl_parse(&back, n) == 0 && back == (fp8t_attn_impl)a,
                "implementation %d: name %s", a, n ? n : "(null)");
        if (a != FP8T_ATTN_DEFAULT) T_CHECK(n && strstr(list, n), "%s not in '%s'", n, list);
    }
    int commas = 0;
    for (const char *p = list; *p; p++) commas += *p == ',';
    T_CHECK(commas == FP8T_ATTN_IMPL_COUNT - 2, "'%s' does not list %d implementations", list,
            FP8T_ATTN_IMPL_COUNT - 1);
    fp8t_attn_impl x;
    T_CHECK(fp8t_attn_impl_parse(&x, "Flash") == -1 && fp8t_attn_impl_parse(&x, "") == -1 &&
                fp8t_attn_impl_name(FP8T_ATTN_IMPL_COUNT) == NULL,
            "unknown names");
    /* the backend refuses a value outside the enum instead of guessing */
    char err[256] = "";
    fp8t_backend_options bad = {.attn = FP8T_ATTN_IMPL_COUNT};
    fp8t_backend *b = fp8t_backend_create("cpu", &bad, err, sizeof(err));
    T_CHECK(!b && strstr(err, "attention"), "attn out of range accepted: %s", err);
    fp8t_backend_destroy(b);
    fp8t_backend_options tiled = {.attn = FP8T_ATTN_TILED, .plain = 1};
    b = fp8t_backend_create("cpu", &tiled, err, sizeof(err));
    T_CHECK(b != NULL, "cpu with options: %s", err);
    fp8t_backend_destroy(b);
}

int main(void) {
    t_suite = "debug_options";
    T_RUN(format_and_rowwise);
    T_RUN(disable_list);
    T_RUN(cuda_options);
    T_RUN(config_json_records);
    T_RUN(environment_defaults);
    T_RUN(head_chunk_option);
    T_RUN(attention_names);
    T_MAIN_END();
}
