/* make_operand on the CPU backend: each request a one-pass kernel makes (operand_kind.h) gives
 * the bits of the CPU kernel it dispatches to (cpu_internal.h), called directly; a request with
 * no kernel (composed) gives the bits of its unfused ops run one after another;
 * make_operand_fuses says which is which. And the model's own composition
 * (model_compose_operand: the producer step by its op, then the plain operand), which it runs
 * where a backend says it does not fuse a request, gives each kernel's bits too. Codes,
 * scale_inv, amax, column sums and side outputs compared byte for byte. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "fp8train/backend.h"
#include "model/operand.h"
#include "operand_ops.h"
#include "test.h"

static fp8t_backend *be;
#define OPS (be->ops)
enum { R = 37, C = 160 }; /* not multiples of 8 or 128: padding and partial blocks */

static float *fill(size_t n, unsigned seed, float scale) {
    float *x = (float *)OPS->malloc(be, n * sizeof(float));
    srand(seed);
    for (size_t i = 0; i < n; i++) x[i] = scale * ((float)rand() / (float)RAND_MAX - 0.5f);
    return x;
}
static void *zalloc(size_t bytes) { return OPS->malloc(be, bytes ? bytes : 1); }
static int same(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

static const float *scale_one(void) {
    static float *s;
    if (!s) {
        s = (float *)zalloc(sizeof(float));
        *s = 37.5f;
    }
    return s;
}

static fp8t_operand_req fp8_req(fp8t_operand_step step, const float *x, uint8_t *c, uint8_t *ct,
                                float *amax) {
    fp8t_operand_req r = model_operand_req(c, x, R, C, FP8T_OPERAND_E4M3, scale_one());
    r.out.data_t = ct;
    r.out.amax = amax;
    r.step = step;
    return r;
}

static void test_fp8_fused_kinds(void) {
    const size_t n = (size_t)R * C;
    float *x = fill(n, 1, 8.0f), *x2 = fill(n, 2, 6.0f), *bias = fill(C, 3, 1.0f);
    uint8_t *c1 = zalloc(n), *t1 = zalloc(n), *c2 = zalloc(n), *t2 = zalloc(n);
    float *a1 = zalloc(4), *a2 = zalloc(4), *s1 = zalloc(C * 4), *s2 = zalloc(C * 4);
    for (int kind = 0; kind < 4; kind++) {
        memset(c1, 0, n), memset(t1, 0, n), memset(c2, 0, n), memset(t2, 0, n);
        *a1 = *a2 = 0.0f;
        memset(s1, 0, C * 4), memset(s2, 0, C * 4);
        fp8t_operand_req r = fp8_req(kind < 2    ? FP8T_STEP_NONE
                                     : kind == 2 ? FP8T_STEP_GELU
                                                 : FP8T_STEP_DGELU,
                                     x, c1, t1, a1);
        if (kind == 1 || kind == 3) r.colsum = s1;
        if (kind >= 2) r.bias = bias;
        if (kind == 3) r.x2 = x2;
        T_CHECK(OPS->make_operand_fuses(be, &r), "kind %d is one of the kernels", kind);
        OPS->make_operand(be, &r);
        const float *sc = scale_one();
        if (kind == 0) cpu_quantize(be, c2, t2, a2, x, R, C, FP8_E4M3, sc);
        if (kind == 1) cpu_quantize_colsum(be, c2, t2, a2, s2, x, R, C, FP8_E4M3, sc);
        if (kind == 2) cpu_quantize_gelu(be, c2, t2, a2, NULL, x, bias, R, C, FP8_E4M3, sc, NULL);
        if (kind == 3)
            cpu_gelu_backward_quantize_colsum(be, c2, t2, a2, s2, x, x2, NULL, bias, R, C,
                                              FP8_E4M3, sc, NULL);
        T_CHECK(same(c1, c2, n) && same(t1, t2, n), "kind %d: codes", kind);
        T_CHECK(same(a1, a2, 4), "kind %d: amax %g vs %g", kind, *a1, *a2);
        T_CHECK(same(s1, s2, C * 4), "kind %d: column sums", kind);
    }
    float *ptrs[] = {x, x2, bias, a1, a2, s1, s2};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) OPS->free(be, ptrs[i]);
    OPS->free(be, c1), OPS->free(be, t1), OPS->free(be, c2), OPS->free(be, t2);
}

static void test_bf16_kinds(void) {
    const size_t n = (size_t)R * C, hb = fp8t_bf16_bytes(R, C);
    float *x = fill(n, 4, 5.0f), *w = fill(C, 5, 2.0f), *bias = fill(C, 6, 1.0f);
    uint16_t *h1 = zalloc(hb), *h2 = zalloc(hb);
    float *a1 = zalloc(4), *a2 = zalloc(4), *m1 = zalloc(R * 4), *m2 = zalloc(R * 4);
    float *r1 = zalloc(R * 4), *r2 = zalloc(R * 4);
    for (int kind = 0; kind < 3; kind++) {
        memset(h1, 0xff, hb), memset(h2, 0xff, hb);
        *a1 = *a2 = 0.0f;
        fp8t_operand_req r = model_operand_req(h1, x, R, C, FP8T_OPERAND_BF16, NULL);
        r.out.amax = a1;
        r.step = kind == 0 ? FP8T_STEP_NONE : kind == 1 ? FP8T_STEP_GELU : FP8T_STEP_LAYERNORM;
        if (kind == 2) r.norm_w = w, r.norm_b = bias, r.eps = 1e-5f, r.mean = m1, r.rstd = r1;
        T_CHECK(OPS->make_operand_fuses(be, &r), "bf16 kind %d is one of the kernels", kind);
        OPS->make_operand(be, &r);
        if (kind == 0) cpu_to_bf16(be, h2, a2, x, R, C);
        if (kind == 1) cpu_gelu_forward_bf16(be, h2, a2, NULL, x, R, C);
        if (kind == 2) cpu_layernorm_forward_bf16(be, h2, a2, m2, r2, x, w, bias, R, C, 1e-5f);
        T_CHECK(same(h1, h2, hb), "bf16 kind %d: operand (padding included)", kind);
        T_CHECK(same(a1, a2, 4), "bf16 kind %d: amax", kind);
        if (kind == 2) T_CHECK(same(m1, m2, R * 4) && same(r1, r2, R * 4), "mean / rstd");
    }
    float *ptrs[] = {x, w, bias, a1, a2, m1, m2, r1, r2};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) OPS->free(be, ptrs[i]);
    OPS->free(be, h1), OPS->free(be, h2);
}

static void test_scaled_gelu(void) {
    const size_t n = (size_t)R * C;
    const size_t sf = fp8t_block_scale_floats(FP8T_SCALING_VEC128, R, C);
    const size_t sft = fp8t_block_scale_floats(FP8T_SCALING_VEC128, C, R);
    float *x = fill(n, 7, 9.0f), *bias = fill(C, 8, 1.0f);
    uint8_t *c1 = zalloc(n), *t1 = zalloc(n), *c2 = zalloc(n), *t2 = zalloc(n);
    float *si1 = zalloc(sf * 4), *sti1 = zalloc(sft * 4), *si2 = zalloc(sf * 4),
          *sti2 = zalloc(sft * 4), *a1 = zalloc(4), *a2 = zalloc(4);
    fp8t_operand_req r = fp8_req(FP8T_STEP_GELU, x, c1, t1, a1);
    r.out.scale = NULL;
    r.out.scaling = FP8T_SCALING_VEC128;
    r.out.scale_inv = si1;
    r.out.scale_inv_t = sti1;
    r.bias = bias;
    T_CHECK(OPS->make_operand_fuses(be, &r), "scaled GELU is one of the kernels");
    OPS->make_operand(be, &r);
    /* the ops it stands for: bias_add, gelu_forward, amax, block_quantize of each orientation */
    float *v = zalloc(n * 4), *g = zalloc(n * 4);
    memcpy(v, x, n * 4);
    OPS->bias_add(be, v, bias, R, C);
    OPS->gelu_forward(be, g, v, n);
    OPS->amax(be, a2, g, n);
    fp8t_scaled_quant q;
    memset(&q, 0, sizeof q);
    q.codes = c2, q.scale_inv = si2, q.codes_t = t2, q.scale_inv_t = sti2;
    q.x = g, q.rows = R, q.cols = C;
    q.scaling = FP8T_SCALING_VEC128, q.fmt = FP8_E4M3;
    cpu_quantize_scaled(be, &q);
    T_CHECK(same(c1, c2, n) && same(t1, t2, n), "scaled codes");
    T_CHECK(same(si1, si2, sf * 4) && same(sti1, sti2, sft * 4), "scaled scale_inv");
    T_CHECK(same(a1, a2, 4), "scaled amax");
    T_CHECK(*a1 > 0.0f, "the amax was taken");
    float *ptrs[] = {x, bias, si1, sti1, si2, sti2, a1, a2, v, g};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) OPS->free(be, ptrs[i]);
    OPS->free(be, c1), OPS->free(be, t1), OPS->free(be, c2), OPS->free(be, t2);
}

/* requests no kernel makes: the unfused ops' bits */
static void test_composed(void) {
    const size_t n = (size_t)R * C;
    float *x = fill(n, 9, 7.0f), *bias = fill(C, 10, 1.0f), *w = fill(C, 11, 2.0f);
    float *v = zalloc(n * 4), *rs1 = zalloc(R * 4), *rs2 = zalloc(R * 4);
    uint8_t *c1 = zalloc(n), *c2 = zalloc(n);
    float *a1 = zalloc(4), *a2 = zalloc(4), *s1 = zalloc(C * 4), *s2 = zalloc(C * 4);
    /* x + bias into FP8 with amax and column sums */
    fp8t_operand_req r = fp8_req(FP8T_STEP_BIAS, x, c1, NULL, a1);
    r.bias = bias;
    r.colsum = s1;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "the bias step has no one-pass kernel");
    OPS->make_operand(be, &r);
    memcpy(v, x, n * 4);
    OPS->bias_add(be, v, bias, R, C);
    OPS->bias_backward(be, s2, v, R, C);
    cpu_quantize(be, c2, NULL, a2, v, R, C, FP8_E4M3, scale_one());
    T_CHECK(same(c1, c2, n) && same(a1, a2, 4) && same(s1, s2, C * 4), "bias step composed");
    /* RMSNorm into FP8 with an amax (the inference kernel takes none) and rstd kept */
    *a1 = *a2 = 0.0f;
    r = fp8_req(FP8T_STEP_RMSNORM, x, c1, NULL, a1);
    r.norm_w = w, r.eps = 1e-6f, r.rstd = rs1;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "RMSNorm with an amax has no one-pass kernel");
    OPS->make_operand(be, &r);
    OPS->rmsnorm_forward(be, v, rs2, x, w, R, C, 1e-6f);
    cpu_quantize(be, c2, NULL, a2, v, R, C, FP8_E4M3, scale_one());
    T_CHECK(same(c1, c2, n) && same(a1, a2, 4) && same(rs1, rs2, R * 4), "RMSNorm composed");
    T_CHECK(*a1 > 0.0f, "the amax was taken");
    float *ptrs[] = {x, bias, w, v, rs1, rs2, a1, a2, s1, s2};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) OPS->free(be, ptrs[i]);
    OPS->free(be, c1), OPS->free(be, c2);
}

/* ---- the model's composition against the kernels ---- */

/* every output a request may write, zeroed */
typedef struct {
    void *data, *data_t;
    float *si, *sit, *amax, *colsum, *sum, *mean, *rstd;
    uint16_t *save16, *sum16;
} outputs;

static outputs outputs_new(void) {
    const size_t n = (size_t)R * C, hb = fp8t_bf16_bytes(R, C);
    const size_t sf = fp8t_block_scale_floats(FP8T_SCALING_VEC128, R, C);
    const size_t sft = fp8t_block_scale_floats(FP8T_SCALING_VEC128, C, R);
    outputs o = {zalloc(hb > n ? hb : n), zalloc(n),     zalloc(sf * 4),
                 zalloc(sft * 4),         zalloc(4),     zalloc(C * 4),
                 zalloc(n * 4),           zalloc(R * 4), zalloc(R * 4),
                 zalloc(n * 2),           zalloc(n * 2)};
    return o;
}

static void outputs_free(outputs *o) {
    void *p[] = {o->data, o->data_t, o->si,   o->sit,    o->amax, o->colsum,
                 o->sum,  o->mean,   o->rstd, o->save16, o->sum16};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) OPS->free(be, p[i]);
}

/* r with each output it asks for redirected into o */
static fp8t_operand_req into(fp8t_operand_req r, const outputs *o) {
#define INTO(field, buf)                                                                         \
    if (r.field) r.field = (void *)(buf)
    INTO(out.data, o->data);
    INTO(out.data_t, o->data_t);
    INTO(out.scale_inv, o->si);
    INTO(out.scale_inv_t, o->sit);
    INTO(out.amax, o->amax);
    INTO(colsum, o->colsum);
    INTO(sum, o->sum);
    INTO(mean, o->mean);
    INTO(rstd, o->rstd);
    INTO(save16, o->save16);
    INTO(sum16, o->sum16);
#undef INTO
    return r;
}

static int outputs_same(const outputs *a, const outputs *b) {
    const size_t n = (size_t)R * C, hb = fp8t_bf16_bytes(R, C);
    const size_t sf = fp8t_block_scale_floats(FP8T_SCALING_VEC128, R, C);
    const size_t sft = fp8t_block_scale_floats(FP8T_SCALING_VEC128, C, R);
    return same(a->data, b->data, hb > n ? hb : n) && same(a->data_t, b->data_t, n) &&
           same(a->si, b->si, sf * 4) && same(a->sit, b->sit, sft * 4) &&
           same(a->amax, b->amax, 4) && same(a->colsum, b->colsum, C * 4) &&
           same(a->sum, b->sum, n * 4) && same(a->mean, b->mean, R * 4) &&
           same(a->rstd, b->rstd, R * 4) && same(a->save16, b->save16, n * 2) &&
           same(a->sum16, b->sum16, n * 2);
}

/* r (a request a kernel makes) by make_operand and by the model's composition: the same bits */
static void check_composes(const char *what, const fp8t_operand_req *r, float *values) {
    T_CHECK(OPS->make_operand_fuses(be, r), "%s is one of the kernels", what);
    outputs k = outputs_new(), c = outputs_new();
    const fp8t_operand_req rk = into(*r, &k);
    OPS->make_operand(be, &rk);
    fp8t_operand_req rc = into(*r, &c);
    model_compose_operand(OPS, be, &rc, values);
    T_CHECK(outputs_same(&k, &c), "%s: the kernel and the model's composition differ", what);
    outputs_free(&k), outputs_free(&c);
}

static void test_model_composes(void) {
    const size_t n = (size_t)R * C;
    float *x = fill(n, 12, 6.0f), *x2 = fill(n, 13, 4.0f), *bias = fill(C, 14, 1.0f);
    float *w = fill(C, 15, 2.0f), *nb = fill(C, 16, 0.5f), *values = zalloc(n * 4);
    void *nz = values; /* a non-NULL output: into() redirects it */
    fp8t_operand_req r = fp8_req(FP8T_STEP_GELU, x, nz, nz, nz);
    r.bias = bias;
    check_composes("FP8 GELU with a bias", &r, values);
    r = fp8_req(FP8T_STEP_DGELU, x, nz, nz, nz);
    r.x2 = x2, r.bias = bias, r.colsum = nz;
    check_composes("FP8 dGELU with a bias and column sums", &r, values);
    r.out.format = FP8T_OPERAND_BF16, r.out.data_t = NULL, r.out.scale = NULL, r.bias = NULL;
    check_composes("BF16 dGELU with column sums", &r, values);
    r = fp8_req(FP8T_STEP_GELU, x, nz, NULL, nz);
    r.out.format = FP8T_OPERAND_BF16, r.out.scale = NULL;
    check_composes("BF16 GELU", &r, values);
    r.step = FP8T_STEP_LAYERNORM;
    r.norm_w = w, r.norm_b = nb, r.eps = 1e-5f, r.mean = nz, r.rstd = nz;
    check_composes("BF16 LayerNorm", &r, values);
    r.step = FP8T_STEP_ADD_LAYERNORM, r.x2 = x2, r.sum = nz;
    check_composes("BF16 add + LayerNorm", &r, values);
    r.sum16 = (uint16_t *)nz;
    check_composes("BF16 add + LayerNorm with the sum's BF16 copy", &r, values);
    r.sum16 = NULL;
    /* RMSNorm (Llama's training norms): rstd kept, no mean, no bias */
    r.step = FP8T_STEP_RMSNORM, r.x2 = NULL, r.sum = NULL, r.mean = NULL, r.norm_b = NULL;
    r.eps = 1e-6f;
    T_CHECK(fp8t_operand_kernel_of(&r) == FP8T_OPK_BF16_RMSNORM, "BF16 RMSNorm: its kernel");
    check_composes("BF16 RMSNorm", &r, values);
    r.step = FP8T_STEP_ADD_RMSNORM, r.x2 = x2, r.sum = nz, r.sum16 = (uint16_t *)nz;
    T_CHECK(fp8t_operand_kernel_of(&r) == FP8T_OPK_BF16_ADD_RMSNORM,
            "BF16 add + RMSNorm: its kernel");
    check_composes("BF16 add + RMSNorm with the sum's BF16 copy", &r, values);
    r.norm_b = nb;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "RMSNorm with a norm bias: composed");
    r.norm_b = NULL, r.sum16 = NULL;
    r = fp8_req(FP8T_STEP_ADD_RMSNORM, x, nz, NULL, NULL);
    r.x2 = x2, r.bias = bias, r.sum = nz, r.norm_w = w, r.eps = 1e-6f;
    check_composes("FP8 add + RMSNorm (the inference kernel)", &r, values);
    r = fp8_req(FP8T_STEP_LAYERNORM, x, nz, NULL, NULL);
    r.out.format = FP8T_OPERAND_BF16, r.out.scale = NULL;
    r.norm_w = w, r.norm_b = nb, r.eps = 1e-5f;
    check_composes("BF16 LayerNorm (the inference kernel)", &r, values);
    r = fp8_req(FP8T_STEP_SWIGLU, x, nz, NULL, NULL);
    r.x2 = x2;
    check_composes("FP8 SwiGLU", &r, values);
    r = fp8_req(FP8T_STEP_DGELU, x, nz, nz, nz);
    r.out.scale = NULL, r.out.scaling = FP8T_SCALING_VEC128;
    r.out.scale_inv = nz, r.out.scale_inv_t = nz;
    r.x2 = x2, r.bias = bias, r.colsum = nz;
    check_composes("scaled dGELU with a bias and column sums", &r, values);
    /* SwiGLU's gradients, one at a time (swiglu_grad) */
    float *up = fill(n, 17, 3.0f);
    r.step = FP8T_STEP_DSWIGLU_GATE, r.bias = NULL, r.colsum = NULL, r.x2 = x2, r.x3 = up;
    check_composes("scaled dSwiGLU (the gate's)", &r, values);
    r.step = FP8T_STEP_DSWIGLU_UP, r.x3 = NULL;
    check_composes("scaled dSwiGLU (up's)", &r, values);
    OPS->free(be, up);
    /* GELU's input kept in BF16 by the GELU pass, read back by the dGELU pass */
    uint16_t *x2_16 = zalloc(n * 2);
    OPS->bf16_pack(be, x2_16, x2, bias, R, C);
    for (int fam = 0; fam < 3; fam++) { /* per-tensor FP8, BF16, scaled */
        static const char *const names[3] = {"FP8", "BF16", "scaled"};
        char what[96];
        r = fp8_req(FP8T_STEP_GELU, x, nz, fam == 1 ? NULL : nz, nz);
        if (fam == 1) r.out.format = FP8T_OPERAND_BF16, r.out.scale = NULL;
        if (fam == 2) {
            r.out.scale = NULL, r.out.scaling = FP8T_SCALING_VEC128;
            r.out.scale_inv = nz, r.out.scale_inv_t = nz;
        }
        if (fam != 1) r.bias = bias; /* the BF16 GELU kernel takes no bias */
        r.save16 = (uint16_t *)nz;
        snprintf(what, sizeof what, "%s GELU writing its input's BF16 save", names[fam]);
        check_composes(what, &r, values);
        r.step = FP8T_STEP_DGELU, r.bias = NULL, r.x2_16 = x2_16, r.save16 = NULL, r.colsum = nz;
        snprintf(what, sizeof what, "%s dGELU reading GELU's input from its BF16 save",
                 names[fam]);
        check_composes(what, &r, values);
    }
    OPS->free(be, x2_16);
    float *ptrs[] = {x, x2, bias, w, nb, values};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) OPS->free(be, ptrs[i]);
}

/* GELU's input kept in BF16 by the pass that applies GELU: bf16_pack's bits, and the codes as
 * without the save; the dGELU pass reading that copy: the bits of the same pass reading it
 * widened to FP32 (bf16_unpack), for the per-tensor, BF16 and scaled kernels */
static void test_gelu_bf16_save(void) {
    const size_t n = (size_t)R * C;
    float *x = fill(n, 17, 6.0f), *g = fill(n, 18, 3.0f), *bias = fill(C, 19, 1.0f);
    float *gw = zalloc(n * 4);
    uint16_t *s1 = zalloc(n * 2), *s2 = zalloc(n * 2);
    OPS->bf16_pack(be, s2, g, bias, R, C);
    OPS->bf16_unpack(be, gw, s2, n);
    for (int fam = 0; fam < 3; fam++) {
        outputs a = outputs_new(), b = outputs_new();
        void *nz = gw;
        fp8t_operand_req r = fp8_req(FP8T_STEP_GELU, g, nz, fam == 1 ? NULL : nz, nz);
        if (fam == 1) r.out.format = FP8T_OPERAND_BF16, r.out.scale = NULL;
        if (fam == 2) {
            r.out.scale = NULL, r.out.scaling = FP8T_SCALING_VEC128;
            r.out.scale_inv = nz, r.out.scale_inv_t = nz;
        }
        r.bias = fam == 1 ? NULL : bias;
        fp8t_operand_req ra = into(r, &a), rb = into(r, &b);
        ra.save16 = s1;
        memset(s1, 0, n * 2);
        OPS->make_operand(be, &ra);
        OPS->make_operand(be, &rb);
        T_CHECK(outputs_same(&a, &b), "family %d: the save changes the operand", fam);
        if (fam == 1) OPS->bf16_pack(be, s2, g, NULL, R, C);
        T_CHECK(same(s1, s2, n * 2), "family %d: the save is not bf16_pack's", fam);
        if (fam == 1) OPS->bf16_pack(be, s2, g, bias, R, C);
        outputs_free(&a), outputs_free(&b);
        /* the backward: dout x with GELU's input from s2, or from gw = its widened copy */
        a = outputs_new(), b = outputs_new();
        r.step = FP8T_STEP_DGELU, r.x = x, r.bias = NULL, r.colsum = nz;
        ra = into(r, &a), rb = into(r, &b);
        ra.x2_16 = s2, rb.x2 = gw;
        T_CHECK(OPS->make_operand_fuses(be, &ra), "family %d: dGELU from BF16 fuses", fam);
        OPS->make_operand(be, &ra);
        OPS->make_operand(be, &rb);
        T_CHECK(outputs_same(&a, &b), "family %d: dGELU from the BF16 save differs", fam);
        T_CHECK(*a.amax > 0.0f, "family %d: the amax was taken", fam);
        outputs_free(&a), outputs_free(&b);
    }
    /* no kernel reads the save next to another GELU input or a bias, nor writes one outside GELU */
    uint8_t *c = (uint8_t *)s1;
    fp8t_operand_req r = fp8_req(FP8T_STEP_DGELU, x, c, c, NULL);
    r.x2_16 = s2, r.bias = bias;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "dGELU from the save with a bias: composed");
    r = fp8_req(FP8T_STEP_NONE, x, c, c, NULL);
    r.save16 = s1;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "a save without GELU: composed");
    float *ptrs[] = {x, g, bias, gw};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) OPS->free(be, ptrs[i]);
    OPS->free(be, s1), OPS->free(be, s2);
}

/* SwiGLU's inputs: gate, up, the output's gradient d, the BF16 copies of gate and up and
 * their widenings, and where a SwiGLU step writes its saves */
typedef struct {
    float *g, *u, *d, *gw, *uw, *dg, *du;
    uint16_t *g16, *u16, *s1, *s2;
} swiglu_bufs;

/* Case st of SwiGLU's steps into r (0 SwiGLU writing the saves, 1 / 2 the gate's gradient from
 * FP32 / the saves, 3 / 4 up's), and the values of its unfused op (swiglu_forward, or
 * swiglu_backward on the same values) into v */
static void swiglu_step_case(fp8t_operand_req *r, int st, const swiglu_bufs *b, float *v) {
    const size_t n = (size_t)R * C;
    const int from16 = st == 2 || st == 4;
    if (st == 0) {
        r->step = FP8T_STEP_SWIGLU, r->x = b->g, r->x2 = b->u;
        r->save16 = b->s1, r->save16_2 = b->s2;
        memset(b->s1, 0, n * 2), memset(b->s2, 0, n * 2);
        OPS->swiglu_forward(be, v, b->g, b->u, NULL, NULL, n);
        return;
    }
    r->step = st <= 2 ? FP8T_STEP_DSWIGLU_GATE : FP8T_STEP_DSWIGLU_UP;
    if (from16)
        r->x2_16 = b->g16;
    else
        r->x2 = b->g;
    if (st <= 2 && from16) r->x3_16 = b->u16;
    if (st <= 2 && !from16) r->x3 = b->u;
    OPS->swiglu_backward(be, b->dg, b->du, b->d, from16 ? b->gw : b->g, from16 ? b->uw : b->u,
                         NULL, NULL, n);
    memcpy(v, st <= 2 ? b->dg : b->du, n * 4);
}

/* SwiGLU into an operand (the Fprop of Llama's down) and its two gradients into dY operands
 * (the Dgrads of gate and up), each in one pass: the bits of swiglu_forward (with the saves of
 * gate and up it writes) or swiglu_backward, then the plain operand; the gradients from the
 * FP32 inputs or from their BF16 saves. Scaled, per-tensor FP8 and BF16 operands; no bias, no
 * column sums. */
static void test_swiglu_steps(void) {
    const size_t n = (size_t)R * C;
    static const fp8t_fp8_scaling kinds[3] = {FP8T_SCALING_VEC128, FP8T_SCALING_BLK128,
                                              FP8T_SCALING_ROW};
    static const char *const kind_names[3] = {"vec128", "blk128", "row"};
    const swiglu_bufs sb = {.g = fill(n, 21, 8.0f),
                            .u = fill(n, 22, 5.0f),
                            .d = fill(n, 23, 3.0f),
                            .gw = zalloc(n * 4),
                            .uw = zalloc(n * 4),
                            .dg = zalloc(n * 4),
                            .du = zalloc(n * 4),
                            .g16 = zalloc(n * 2),
                            .u16 = zalloc(n * 2),
                            .s1 = zalloc(n * 2),
                            .s2 = zalloc(n * 2)};
    float *g = sb.g, *u = sb.u, *d = sb.d, *v = zalloc(n * 4);
    uint16_t *g16 = sb.g16, *u16 = sb.u16, *s1 = sb.s1, *s2 = sb.s2;
    OPS->bf16_pack(be, g16, g, NULL, R, C);
    OPS->bf16_pack(be, u16, u, NULL, R, C);
    OPS->bf16_unpack(be, sb.gw, g16, n);
    OPS->bf16_unpack(be, sb.uw, u16, n);
    for (int ki = 0; ki < 3; ki++) {
        const size_t sf = fp8t_block_scale_floats(kinds[ki], R, C);
        const size_t sft = fp8t_block_scale_floats(kinds[ki], C, R);
        for (int st = 0; st < 5; st++) {
            /* 0 SwiGLU, 1 / 2 the gate's gradient from FP32 / the saves, 3 / 4 up's */
            uint8_t *c1 = zalloc(n), *t1 = zalloc(n), *c2 = zalloc(n), *t2 = zalloc(n);
            float *si1 = zalloc(sf * 4), *sit1 = zalloc(sft * 4), *si2 = zalloc(sf * 4),
                  *sit2 = zalloc(sft * 4), *a1 = zalloc(4), *a2 = zalloc(4);
            fp8t_operand_req r = fp8_req(FP8T_STEP_NONE, d, c1, t1, a1);
            r.out.scale = NULL, r.out.scaling = kinds[ki], r.out.pow2 = st & 1;
            r.out.scale_inv = si1, r.out.scale_inv_t = sit1;
            fp8t_operand_req plain = r;
            plain.out.data = c2, plain.out.data_t = t2, plain.out.amax = a2;
            plain.out.scale_inv = si2, plain.out.scale_inv_t = sit2, plain.x = v;
            swiglu_step_case(&r, st, &sb, v);
            T_CHECK(OPS->make_operand_fuses(be, &r), "%s: scaled step %d is one of the kernels",
                    kind_names[ki], st);
            OPS->make_operand(be, &r);
            OPS->make_operand(be, &plain);
            T_CHECK(same(c1, c2, n) && same(t1, t2, n) && same(si1, si2, sf * 4) &&
                        same(sit1, sit2, sft * 4) && same(a1, a2, 4),
                    "%s: step %d differs from its unfused op then the plain operand",
                    kind_names[ki], st);
            T_CHECK(*a1 > 0.0f, "%s: step %d took the amax", kind_names[ki], st);
            if (st == 0)
                T_CHECK(same(s1, g16, n * 2) && same(s2, u16, n * 2),
                        "%s: SwiGLU's saves are not bf16_pack's of gate and up", kind_names[ki]);
            float *ptrs[] = {si1, sit1, si2, sit2, a1, a2};
            for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) OPS->free(be, ptrs[i]);
            OPS->free(be, c1), OPS->free(be, t1), OPS->free(be, c2), OPS->free(be, t2);
        }
    }
    /* per-tensor FP8 (both orientations, or the row-major codes alone) and BF16 operands */
    for (int fam = 0; fam < 3; fam++) {
        static const char *const fam_names[3] = {"FP8", "FP8 codes only", "BF16"};
        const size_t bytes = fam == 2 ? fp8t_bf16_bytes(R, C) : n;
        for (int st = 0; st < 5; st++) {
            uint8_t *c1 = zalloc(bytes), *t1 = zalloc(n), *c2 = zalloc(bytes), *t2 = zalloc(n);
            float *a1 = zalloc(4), *a2 = zalloc(4);
            fp8t_operand_req r = fp8_req(FP8T_STEP_NONE, d, c1, fam == 0 ? t1 : NULL, a1);
            if (fam == 2) r.out.format = FP8T_OPERAND_BF16, r.out.scale = NULL;
            fp8t_operand_req plain = r;
            plain.out.data = c2, plain.out.data_t = fam == 0 ? t2 : NULL, plain.out.amax = a2;
            plain.x = v;
            swiglu_step_case(&r, st, &sb, v);
            T_CHECK(OPS->make_operand_fuses(be, &r), "%s: step %d is one of the kernels",
                    fam_names[fam], st);
            T_CHECK(fp8t_operand_kernel_of(&r) ==
                        (fam == 2 ? FP8T_OPK_BF16_SWIGLU : FP8T_OPK_QUANTIZE_SWIGLU),
                    "%s: step %d goes to the %s kernel", fam_names[fam], st,
                    fp8t_operand_kernel_name(fp8t_operand_kernel_of(&r)));
            OPS->make_operand(be, &r);
            OPS->make_operand(be, &plain);
            T_CHECK(same(c1, c2, bytes) && (fam != 0 || same(t1, t2, n)) && same(a1, a2, 4),
                    "%s: step %d differs from its unfused op then the plain operand",
                    fam_names[fam], st);
            T_CHECK(*a1 > 0.0f, "%s: step %d took the amax", fam_names[fam], st);
            if (st == 0)
                T_CHECK(same(s1, g16, n * 2) && same(s2, u16, n * 2),
                        "%s: SwiGLU's saves are not bf16_pack's of gate and up", fam_names[fam]);
            OPS->free(be, a1), OPS->free(be, a2);
            OPS->free(be, c1), OPS->free(be, t1), OPS->free(be, c2), OPS->free(be, t2);
        }
    }
    /* the combinations no kernel makes */
    uint8_t *c = (uint8_t *)s1;
    float *sc = v;
    fp8t_operand_req r = fp8_req(FP8T_STEP_DSWIGLU_UP, d, c, c, NULL);
    r.x2 = g;
    T_CHECK(OPS->make_operand_fuses(be, &r), "per-tensor dSwiGLU: a kernel");
    r.out.data = NULL;
    T_CHECK(!OPS->make_operand_fuses(be, &r),
            "per-tensor dSwiGLU, transposed codes only: composed");
    r.out.data = c, r.colsum = sc;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "per-tensor dSwiGLU with column sums: composed");
    r.colsum = NULL;
    r.out.scale = NULL, r.out.scaling = FP8T_SCALING_VEC128;
    r.out.scale_inv = sc, r.out.scale_inv_t = sc;
    T_CHECK(OPS->make_operand_fuses(be, &r), "scaled dSwiGLU (up): a kernel");
    r.x3 = u;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "up's gradient reading up: composed");
    r.x3 = NULL, r.colsum = sc;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "scaled dSwiGLU with column sums: composed");
    r.colsum = NULL, r.step = FP8T_STEP_DSWIGLU_GATE, r.x3 = u, r.x3_16 = u16;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "up both in FP32 and BF16: composed");
    r = fp8_req(FP8T_STEP_SWIGLU, g, c, NULL, NULL);
    r.x2 = u, r.save16 = s1;
    T_CHECK(fp8t_operand_kernel_of(&r) == FP8T_OPK_QUANTIZE_SWIGLU,
            "per-tensor SwiGLU with a save: the training kernel");
    r.bias = sc;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "per-tensor SwiGLU with a bias: composed");
    r.bias = NULL, r.save16 = NULL;
    T_CHECK(fp8t_operand_kernel_of(&r) == FP8T_OPK_SWIGLU_OPERAND,
            "the inference model's SwiGLU: its kernel");
    float *ptrs[] = {g, u, d, v, sb.dg, sb.du, sb.gw, sb.uw};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) OPS->free(be, ptrs[i]);
    OPS->free(be, g16), OPS->free(be, u16), OPS->free(be, s1), OPS->free(be, s2);
}

/* SwiGLU of BF16 gate and up (an inference model's GEMM outputs: x_16, x2_16) into per-tensor
 * FP8 codes or a BF16 operand, its amax taken or not, or the amax alone (out NULL: current
 * scaling's first pass): the bits of swiglu_forward of the widened values, then the amax op and
 * the plain operand; nothing written but what is asked for. Every other combination with BF16
 * inputs (saves, scaled or transposed codes, column sums, a bias, another step, up in FP32) is
 * no kernel's, and has no composition either: the model asks first. */
static void test_swiglu_bf16_inputs(void) {
    const size_t n = (size_t)R * C, hb = fp8t_bf16_bytes(R, C);
    float *g = fill(n, 21, 8.0f), *u = fill(n, 22, 4.0f), *gw = zalloc(n * 4),
          *uw = zalloc(n * 4);
    float *v = zalloc(n * 4), *a1 = zalloc(4), *a2 = zalloc(4), *sc = (float *)scale_one();
    uint16_t *g16 = zalloc(n * 2), *u16 = zalloc(n * 2);
    OPS->bf16_pack(be, g16, g, NULL, R, C), OPS->bf16_pack(be, u16, u, NULL, R, C);
    OPS->bf16_unpack(be, gw, g16, n), OPS->bf16_unpack(be, uw, u16, n);
    OPS->swiglu_forward(be, v, gw, uw, NULL, NULL, n);
    uint8_t *o1 = zalloc(hb), *o2 = zalloc(hb);
    for (int k = 0; k < 5; k++) { /* fp8, fp8 + amax, bf16, bf16 + amax, amax alone */
        const int bf16 = k == 2 || k == 3, amax = k == 1 || k == 3 || k == 4;
        memset(o1, 0xA5, hb), memset(o2, 0xA5, hb);
        *a1 = *a2 = 0.0f;
        fp8t_operand_req r = t_swiglu16_req(k == 4 ? NULL : o1, g16, u16, R, C, bf16 ? NULL : sc,
                                            amax ? a1 : NULL);
        T_CHECK(OPS->make_operand_fuses(be, &r) &&
                    fp8t_operand_kernel_of(&r) == FP8T_OPK_SWIGLU_OPERAND,
                "case %d: the inference SwiGLU kernel", k);
        OPS->make_operand(be, &r);
        if (amax) cpu_amax(be, a2, v, n);
        if (k < 2) cpu_quantize(be, o2, NULL, NULL, v, R, C, FP8_E4M3, sc);
        if (bf16) cpu_to_bf16(be, (uint16_t *)o2, NULL, v, R, C);
        T_CHECK(same(o1, o2, hb), "case %d: the operand (untouched past it, or at all)", k);
        T_CHECK(same(a1, a2, 4) && (!amax || *a1 > 0.0f), "case %d: amax %g vs %g", k, *a1, *a2);
    }
    /* what no kernel makes */
    uint8_t *c = o1;
    float *si = v;
    fp8t_operand_req r = t_swiglu16_req(c, g16, u16, R, C, sc, NULL);
    r.save16 = g16;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "BF16 inputs with a save: none");
    r = t_swiglu16_req(c, g16, u16, R, C, sc, NULL);
    r.out.data_t = c;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "BF16 inputs, transposed codes: none");
    r = t_swiglu16_req(c, g16, u16, R, C, NULL, NULL);
    r.out.format = FP8T_OPERAND_E4M3, r.out.scaling = FP8T_SCALING_VEC128;
    r.out.scale_inv = si;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "BF16 inputs, scaled codes: none");
    r = t_swiglu16_req(c, g16, u16, R, C, sc, NULL);
    r.colsum = si;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "BF16 inputs with column sums: none");
    r = t_swiglu16_req(NULL, g16, u16, R, C, NULL, NULL);
    T_CHECK(!OPS->make_operand_fuses(be, &r), "BF16 inputs, nothing asked for: none");
    r = t_swiglu16_req(c, g16, u16, R, C, NULL, NULL);
    r.x2_16 = NULL, r.x2 = u;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "a BF16 gate with an FP32 up: none");
    r = t_swiglu16_req(c, g16, u16, R, C, sc, NULL);
    r.step = FP8T_STEP_LAYERNORM;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "x_16 for a norm: none");
    float *ptrs[] = {g, u, gw, uw, v, a1, a2};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) OPS->free(be, ptrs[i]);
    OPS->free(be, g16), OPS->free(be, u16), OPS->free(be, o1), OPS->free(be, o2);
}

/* GELU of BF16 x (fc1's output in the inference model: x_16) plus fc1's bias or none, into
 * per-tensor FP8 codes or a BF16 operand, its amax taken or not, or the amax alone: the bits of
 * the widened values through bias_add and gelu_forward, then the amax op and the plain operand */
static void test_gelu_bf16_input(void) {
    const size_t n = (size_t)R * C, hb = fp8t_bf16_bytes(R, C);
    float *x = fill(n, 31, 8.0f), *bias = fill(C, 32, 2.0f), *v = zalloc(n * 4);
    float *a1 = zalloc(4), *a2 = zalloc(4), *sc = (float *)scale_one();
    uint16_t *x16 = zalloc(n * 2);
    uint8_t *o1 = zalloc(hb), *o2 = zalloc(hb);
    OPS->bf16_pack(be, x16, x, NULL, R, C);
    for (int k = 0; k < 10; k++) { /* (fp8, fp8 + amax, bf16, bf16 + amax, amax) x (bias, none) */
        const int kind = k % 5, with_bias = k < 5;
        const int bf16 = kind == 2 || kind == 3, amax = kind == 1 || kind == 3 || kind == 4;
        memset(o1, 0xA5, hb), memset(o2, 0xA5, hb);
        *a1 = *a2 = 0.0f;
        fp8t_operand_req r = t_gelu16_req(kind == 4 ? NULL : o1, x16, with_bias ? bias : NULL, R,
                                          C, bf16 ? NULL : sc, amax ? a1 : NULL);
        T_CHECK(OPS->make_operand_fuses(be, &r) &&
                    fp8t_operand_kernel_of(&r) == FP8T_OPK_GELU16_OPERAND,
                "case %d: the inference GELU kernel", k);
        OPS->make_operand(be, &r);
        OPS->bf16_unpack(be, v, x16, n);
        if (with_bias) OPS->bias_add(be, v, bias, R, C);
        OPS->gelu_forward(be, v, v, n);
        if (amax) cpu_amax(be, a2, v, n);
        if (kind < 2) cpu_quantize(be, o2, NULL, NULL, v, R, C, FP8_E4M3, sc);
        if (bf16) cpu_to_bf16(be, (uint16_t *)o2, NULL, v, R, C);
        T_CHECK(same(o1, o2, hb), "case %d: the operand (untouched past it, or at all)", k);
        T_CHECK(same(a1, a2, 4) && (!amax || *a1 > 0.0f), "case %d: amax %g vs %g", k, *a1, *a2);
    }
    fp8t_operand_req r = t_gelu16_req(o1, x16, NULL, R, C, sc, NULL);
    r.x2_16 = x16;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "GELU with a second BF16 input: none");
    r.x2_16 = NULL, r.save16 = x16;
    T_CHECK(!OPS->make_operand_fuses(be, &r), "GELU of BF16 x with a save: none");
    float *ptrs[] = {x, bias, v, a1, a2};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) OPS->free(be, ptrs[i]);
    OPS->free(be, x16), OPS->free(be, o1), OPS->free(be, o2);
}

/* step NONE making codes or a BF16 operand is always a kernel (backend.h): the last step of
 * every composition, so that a GPU can finish what the model composes */
static void test_plain_always_fuses(void) {
    uint8_t c[1], ct[1];
    float a[1], cs[1], si[1], sit[1];
    for (int k = 0; k < 3 * 2 * 2 * 2; k++) {
        const int orient = k % 3, amax = k / 3 % 2, colsum = k / 6 % 2, scaled = k / 12;
        fp8t_operand_req r = fp8_req(FP8T_STEP_NONE, NULL, orient != 1 ? c : NULL,
                                     orient != 0 ? ct : NULL, amax ? a : NULL);
        if (colsum) r.colsum = cs;
        if (scaled) {
            r.out.scale = NULL, r.out.scaling = FP8T_SCALING_ROW;
            r.out.scale_inv = r.out.data ? si : NULL,
            r.out.scale_inv_t = r.out.data_t ? sit : NULL;
        }
        /* per-tensor transposed codes alone: the plain quantize kernel's, without column sums */
        if (!scaled && orient == 1 && colsum) continue;
        T_CHECK(OPS->make_operand_fuses(be, &r),
                "FP8 (scaled %d) orientations %d, amax %d, "
                "colsum %d",
                scaled, orient, amax, colsum);
        if (orient != 0 || scaled) continue;
        r.out.format = FP8T_OPERAND_BF16, r.out.data_t = NULL, r.out.data = c;
        T_CHECK(OPS->make_operand_fuses(be, &r), "BF16, amax %d, colsum %d", amax, colsum);
    }
}

int main(void) {
    t_suite = "make_operand";
    char err[256] = "";
    be = fp8t_backend_create("cpu", NULL, err, sizeof err);
    if (!be) {
        printf("FAIL make_operand: backend create: %s\n", err);
        return 1;
    }
    T_RUN(test_fp8_fused_kinds);
    T_RUN(test_bf16_kinds);
    T_RUN(test_scaled_gelu);
    T_RUN(test_composed);
    T_RUN(test_plain_always_fuses);
    T_RUN(test_model_composes);
    T_RUN(test_gelu_bf16_save);
    T_RUN(test_swiglu_steps);
    T_RUN(test_swiglu_bf16_inputs);
    T_RUN(test_gelu_bf16_input);
    fp8t_backend_destroy(be);
    T_MAIN_END();
}
