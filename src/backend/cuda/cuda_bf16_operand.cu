/* CUDA backend — BF16 GEMM operands (fp8t_bf16_operand: [pad8(rows), pad8(cols)] BF16, zero
 * padding): to_bf16 from FP32, and gelu_forward_bf16, which writes GELU's output straight into
 * that layout for the linear that follows (the FP32 activation is never written).
 * Amaxes are max-accumulated from the same loads (NaN propagates; max is order-independent, so
 * the result is deterministic). */
#include "backend/cuda/cuda_common.cuh"

/* x [rows, cols] packed FP32 -> out, a BF16 operand ([pad8(rows), pad8(cols)], zero padding,
 * round to nearest even), the general case: one block per row (rows of x start unaligned when
 * cols is odd, so the loads stay scalar; still coalesced). When amax_out is non-NULL,
 * *amax_out is max-accumulated with amax(x) (NaN propagates; max is order-independent, so the
 * result is deterministic) from the same loads. */
__global__ void to_bf16_rows_kernel(__nv_bfloat16 *out, int ld_out, int rows_out,
                                    const float *__restrict__ x, int rows, int cols,
                                    float *amax_out) {
    float am = 0.0f;
    for (int r = blockIdx.x; r < rows_out; r += gridDim.x) {
        __nv_bfloat16 *o = out + (size_t)r * ld_out;
        if (r < rows) {
            const float *xr = x + (size_t)r * cols;
            for (int c = threadIdx.x; c < ld_out; c += blockDim.x) {
                float v = c < cols ? xr[c] : 0.0f;
                am = amax_merge_dev(am, v);
                o[c] = __float2bfloat16_rn(v);
            }
        } else {
            for (int c = threadIdx.x; c < ld_out; c += blockDim.x)
                o[c] = __float2bfloat16_rn(0.0f);
        }
    }
    if (amax_out) {
        am = block_amax(am);
        if (threadIdx.x == 0) atomic_amax_merge(amax_out, am);
    }
}

/* The common case, cols a multiple of 8 and x 16-byte aligned (then the operand has no padding
 * columns): 8 elements per thread, two 16-byte loads and one 16-byte store; rows beyond rows
 * (up to pad8(rows)) are written as zeros. n8 = pad8(rows) * cols / 8 vectors. */
__global__ void to_bf16_vec8_kernel(uint4 *out, const float4 *__restrict__ x, size_t n8_data,
                                    size_t n8, float *amax_out) {
    float am = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 o = make_uint4(0u, 0u, 0u, 0u);
        if (i < n8_data) {
            float4 a = x[2 * i], c = x[2 * i + 1];
            am = amax_merge_dev(am, a.x), am = amax_merge_dev(am, a.y);
            am = amax_merge_dev(am, a.z), am = amax_merge_dev(am, a.w);
            am = amax_merge_dev(am, c.x), am = amax_merge_dev(am, c.y);
            am = amax_merge_dev(am, c.z), am = amax_merge_dev(am, c.w);
            __nv_bfloat162 p0 = __floats2bfloat162_rn(a.x, a.y),
                           p1 = __floats2bfloat162_rn(a.z, a.w);
            __nv_bfloat162 p2 = __floats2bfloat162_rn(c.x, c.y),
                           p3 = __floats2bfloat162_rn(c.z, c.w);
            o.x = *(unsigned *)&p0, o.y = *(unsigned *)&p1;
            o.z = *(unsigned *)&p2, o.w = *(unsigned *)&p3;
        }
        out[i] = o;
    }
    if (amax_out) {
        am = block_amax(am);
        if (threadIdx.x == 0) atomic_amax_merge(amax_out, am);
    }
}

void cuda_to_bf16_operand(fp8t_backend *b, uint16_t *out, float *amax_out, const float *x,
                          int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    const int rows_out = fp8t_bf16_pad(rows), ld = fp8t_bf16_pad(cols);
    if (!s->plain && cols % 8 == 0 && ((uintptr_t)x & 15u) == 0) {
        size_t n8 = (size_t)rows_out * cols / 8, n8_data = (size_t)rows * cols / 8;
        size_t blocks = (n8 + 255) / 256, cap = (size_t)s->num_sms * 16;
        to_bf16_vec8_kernel<<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, s->stream>>>(
            (uint4 *)out, (const float4 *)x, n8_data, n8, amax_out);
    } else {
        unsigned grid = (unsigned)(rows_out < s->num_sms * 64 ? rows_out : s->num_sms * 64);
        to_bf16_rows_kernel<<<grid, 256, 0, s->stream>>>((__nv_bfloat16 *)out, ld, rows_out, x,
                                                         rows, cols, amax_out);
    }
    CUDA_LAUNCH_CHECK(s);
}

/* bf16_pack: x [rows, cols] (+ bias[c]) -> out [rows, cols] packed BF16, round to nearest
 * even, the bias added in FP32 first (bias_add's sum). 8 elements per thread (two 16-byte loads,
 * one 16-byte store) when cols % 8 == 0 and x, out are 16-byte aligned; else one per thread. */
__global__ void bf16_pack_vec8_kernel(uint4 *out, const float4 *__restrict__ x,
                                      const float *__restrict__ bias, int cols, size_t n8) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        const float4 a = x[2 * i], c = x[2 * i + 1];
        float y[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        if (bias) {
            const int c0 = (int)((i * 8) % (size_t)cols); /* cols % 8 == 0: one row */
            for (int e = 0; e < 8; e++) y[e] += bias[c0 + e];
        }
        unsigned w[4];
        for (int e = 0; e < 4; e++) {
            __nv_bfloat162 p = __floats2bfloat162_rn(y[2 * e], y[2 * e + 1]);
            w[e] = *(unsigned *)&p;
        }
        out[i] = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

__global__ void bf16_pack_kernel(__nv_bfloat16 *out, const float *__restrict__ x,
                                 const float *__restrict__ bias, int cols, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        if (bias) v += bias[i % (size_t)cols];
        out[i] = __float2bfloat16_rn(v);
    }
}

void cuda_bf16_pack(fp8t_backend *b, uint16_t *out, const float *x, const float *bias, int rows,
                    int cols) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    const size_t n = (size_t)rows * cols, cap = (size_t)s->num_sms * 16;
    if (!s->plain && cols % 8 == 0 && (((uintptr_t)x | (uintptr_t)out) & 15u) == 0) {
        const size_t n8 = n / 8, blocks = (n8 + 255) / 256;
        bf16_pack_vec8_kernel<<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, s->stream>>>(
            (uint4 *)out, (const float4 *)x, bias, cols, n8);
    } else {
        const size_t blocks = (n + 255) / 256;
        bf16_pack_kernel<<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, s->stream>>>(
            (__nv_bfloat16 *)out, x, bias, cols, n);
    }
    CUDA_LAUNCH_CHECK(s);
}

/* bf16_unpack: exact (a BF16 value is its bits in the high half of a float). 8 per thread
 * when n % 8 == 0 and both pointers are 16-byte aligned. */
__global__ void bf16_unpack_vec8_kernel(float4 *out, const uint4 *__restrict__ x, size_t n8) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = x[i];
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
        float f[8];
        for (int e = 0; e < 4; e++) {
            f[2 * e] = __uint_as_float(w[e] << 16); /* the lower address: the low half */
            f[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
        }
        out[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
        out[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
}

__global__ void bf16_unpack_kernel(float *out, const uint16_t *__restrict__ x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __uint_as_float((unsigned)x[i] << 16);
}

void cuda_bf16_unpack(fp8t_backend *b, float *out, const uint16_t *x, size_t n) {
    if (n == 0) return;
    cuda_state *s = cuda_of(b);
    const size_t cap = (size_t)s->num_sms * 16;
    if (!s->plain && n % 8 == 0 && (((uintptr_t)x | (uintptr_t)out) & 15u) == 0) {
        const size_t n8 = n / 8, blocks = (n8 + 255) / 256;
        bf16_unpack_vec8_kernel<<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, s->stream>>>(
            (float4 *)out, (const uint4 *)x, n8);
    } else {
        const size_t blocks = (n + 255) / 256;
        bf16_unpack_kernel<<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, s->stream>>>(out, x,
                                                                                           n);
    }
    CUDA_LAUNCH_CHECK(s);
}

const float *cuda_bf16_widen(fp8t_backend *b, int slot, const float *x, const uint16_t *x16,
                             size_t n) {
    if (!x16) return x;
    float *y = (float *)cuda_scratch(b, slot, n * sizeof(float));
    cuda_bf16_unpack(b, y, x16, n);
    return y;
}

/* gelu(x) [rows, cols] -> out, a BF16 operand: the GELU of gelu_forward (gelu_dev, the same
 * expression), rounded to nearest even; amax of the GELU values into *amax_out. 8 elements per
 * thread when cols % 8 == 0 and x is 16-byte aligned, else one block per row. */
__global__ void gelu_bf16_vec8_kernel(uint4 *out, const float4 *__restrict__ x, size_t n8_data,
                                      size_t n8, float *amax_out, uint2 *save16) {
    float am = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 o = make_uint4(0u, 0u, 0u, 0u);
        if (i < n8_data) {
            float4 a = x[2 * i], c = x[2 * i + 1];
            if (save16) { /* GELU's input, as bf16_pack */
                save16[2 * i] = bf16x4_of(a);
                save16[2 * i + 1] = bf16x4_of(c);
            }
            float y[8] = {gelu_dev(a.x), gelu_dev(a.y), gelu_dev(a.z), gelu_dev(a.w),
                          gelu_dev(c.x), gelu_dev(c.y), gelu_dev(c.z), gelu_dev(c.w)};
            unsigned w[4];
            for (int e = 0; e < 4; e++) {
                am = amax_merge_dev(am, y[2 * e]);
                am = amax_merge_dev(am, y[2 * e + 1]);
                __nv_bfloat162 p = __floats2bfloat162_rn(y[2 * e], y[2 * e + 1]);
                w[e] = *(unsigned *)&p;
            }
            o = make_uint4(w[0], w[1], w[2], w[3]);
        }
        out[i] = o;
    }
    if (amax_out) {
        am = block_amax(am);
        if (threadIdx.x == 0) atomic_amax_merge(amax_out, am);
    }
}

__global__ void gelu_bf16_rows_kernel(__nv_bfloat16 *out, int ld_out, int rows_out,
                                      const float *__restrict__ x, int rows, int cols,
                                      float *amax_out) {
    float am = 0.0f;
    for (int r = blockIdx.x; r < rows_out; r += gridDim.x) {
        __nv_bfloat16 *o = out + (size_t)r * ld_out;
        for (int c = threadIdx.x; c < ld_out; c += blockDim.x) {
            float v = 0.0f;
            if (r < rows && c < cols) {
                v = gelu_dev(x[(size_t)r * cols + c]);
                am = amax_merge_dev(am, v);
            }
            o[c] = __float2bfloat16_rn(v);
        }
    }
    if (amax_out) {
        am = block_amax(am);
        if (threadIdx.x == 0) atomic_amax_merge(amax_out, am);
    }
}

void cuda_gelu_forward_bf16(fp8t_backend *b, uint16_t *out, float *amax_out, uint16_t *save16,
                            const float *x, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    const int rows_out = fp8t_bf16_pad(rows), ld = fp8t_bf16_pad(cols);
    if (!s->plain && cols % 8 == 0 && aligned16(x) && aligned8(save16)) {
        size_t n8 = (size_t)rows_out * cols / 8, n8_data = (size_t)rows * cols / 8;
        size_t blocks = (n8 + 255) / 256, cap = (size_t)s->num_sms * 16;
        gelu_bf16_vec8_kernel<<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, s->stream>>>(
            (uint4 *)out, (const float4 *)x, n8_data, n8, amax_out, (uint2 *)save16);
    } else {
        if (save16) cuda_bf16_pack(b, save16, x, NULL, rows, cols);
        unsigned grid = (unsigned)(rows_out < s->num_sms * 64 ? rows_out : s->num_sms * 64);
        gelu_bf16_rows_kernel<<<grid, 256, 0, s->stream>>>((__nv_bfloat16 *)out, ld, rows_out, x,
                                                           rows, cols, amax_out);
    }
    CUDA_LAUNCH_CHECK(s);
}

/* SwiGLU's step (SW 1, 2, 3: swiglu_step4) -> out, a BF16 operand, rounded to nearest even;
 * amax of the values into *amax_out; the saves (SW 1) from the same read. 8 elements per thread
 * (cols % 8 == 0: no padding columns; rows beyond rows, up to pad8(rows), written as zeros),
 * as gelu_bf16_vec8_kernel. */
template <int SW>
__global__ void swiglu_bf16_vec8_kernel(uint4 *out, const float *__restrict__ x, swiglu_in in,
                                        size_t n8_data, size_t n8, float *amax_out) {
    float am = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 o = make_uint4(0u, 0u, 0u, 0u);
        if (i < n8_data) {
            const size_t e = 8 * i;
            const float4 a = swiglu_step4<SW>(*(const float4 *)(x + e), e, in.gate, in.gate16,
                                              in.up, in.up16, in.save16, in.save16b);
            const float4 c = swiglu_step4<SW>(*(const float4 *)(x + e + 4), e + 4, in.gate,
                                              in.gate16, in.up, in.up16, in.save16, in.save16b);
            const float y[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
            unsigned w[4];
            for (int k = 0; k < 4; k++) {
                am = amax_merge_dev(am, y[2 * k]);
                am = amax_merge_dev(am, y[2 * k + 1]);
                __nv_bfloat162 p = __floats2bfloat162_rn(y[2 * k], y[2 * k + 1]);
                w[k] = *(unsigned *)&p;
            }
            o = make_uint4(w[0], w[1], w[2], w[3]);
        }
        out[i] = o;
    }
    if (amax_out) {
        am = block_amax(am);
        if (threadIdx.x == 0) atomic_amax_merge(amax_out, am);
    }
}

/* The BF16 operand of SwiGLU's step r->step (make_operand's BF16_SWIGLU): the vec8 kernel where
 * cols % 8 == 0 and the inputs are aligned; otherwise the step's op into scratch, then
 * to_bf16, which gives the same bits. */
void cuda_bf16_swiglu(fp8t_backend *b, const fp8t_operand_req *r) {
    const fp8t_operand *o = &r->out;
    const int rows = o->rows, cols = o->cols;
    if (rows <= 0 || cols <= 0) return;
    cuda_state *s = cuda_of(b);
    const swiglu_in in = swiglu_in_of(r);
    if (s->plain || cols % 8 != 0 || !aligned16(o->data) || !swiglu_in_aligned(&in, r->x)) {
        cuda_to_bf16_operand(b, (uint16_t *)o->data, o->amax, cuda_swiglu_values(b, r), rows,
                             cols);
        return;
    }
    const size_t n8 = (size_t)fp8t_bf16_pad(rows) * cols / 8, n8_data = (size_t)rows * cols / 8;
    const size_t blocks = (n8 + 255) / 256, cap = (size_t)s->num_sms * 16;
    const unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
    uint4 *out = (uint4 *)o->data;
    with_sw(in.sw, [&](auto sw) {
        swiglu_bf16_vec8_kernel<decltype(sw)::value>
            <<<grid, 256, 0, s->stream>>>(out, r->x, in, n8_data, n8, o->amax);
    });
    CUDA_LAUNCH_CHECK(s);
}

/* to_bf16 + column sums (the Dgrad's dY and its bias gradient, from one read). Needs
 * cols % 8 == 0 and x 16-byte aligned (so the operand has no padding columns). Block: 32 x 8
 * threads; thread (tx, ty) owns columns 8g .. 8g + 7 (g = blockIdx.x * 32 + tx) of the chunk's
 * rows r0 + ty, r0 + ty + 8, ... (COLSUM_ROWS rows per chunk, blockIdx.y): it converts and
 * stores them (padding rows, up to pad8(rows), as zeros) and sums them in row order; the 8 lane
 * sums are then added in lane order into part[chunk][8g ..]. cuda_column_sums_finish adds the
 * chunks in order: the result depends only on rows and cols.
 * GBWD (gelu_backward_bf16_colsum): the values are gelu_grad(gx (+ gbias), x), x being the
 * upstream gradient and gx GELU's input (16-byte aligned; gbias [cols] may be NULL), as
 * gelu_backward / gelu_backward_bias compute them. */
#define COLSUM_ROWS 128
#define COLSUM_LANES 8
template <bool GBWD>
__global__ void __launch_bounds__(32 * COLSUM_LANES)
    to_bf16_colsum_kernel(uint4 *out, float *part, float *amax_out, const float4 *__restrict__ x,
                          const float4 *__restrict__ gx, const uint2 *__restrict__ gx16,
                          const float *__restrict__ gbias, int rows, int rows_out, int G) {
    __shared__ float sh[COLSUM_LANES][32 * 8];
    const int tx = threadIdx.x, ty = threadIdx.y, g = blockIdx.x * 32 + tx;
    const int r0 = blockIdx.y * COLSUM_ROWS;
    float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, am = 0.0f;
    if (g < G) {
        float bb[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (GBWD && gbias)
            for (int e = 0; e < 8; e++) bb[e] = gbias[8 * g + e];
        for (int j = 0; j < COLSUM_ROWS / COLSUM_LANES; j++) {
            const int r = r0 + ty + COLSUM_LANES * j;
            if (r >= rows_out) break;
            uint4 o = make_uint4(0u, 0u, 0u, 0u);
            if (r < rows) {
                const size_t i = ((size_t)r * G + g) * 2;
                float4 a = x[i], c = x[i + 1];
                float v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
                if (GBWD) {
                    /* GELU's input, or its BF16 copy (which holds the bias) */
                    const float4 ga = gx16 ? f32x4_of_bf16(gx16[i]) : gx[i];
                    const float4 gc = gx16 ? f32x4_of_bf16(gx16[i + 1]) : gx[i + 1];
                    float u[8] = {ga.x, ga.y, ga.z, ga.w, gc.x, gc.y, gc.z, gc.w};
                    for (int e = 0; e < 8; e++)
                        v[e] = gelu_grad(gbias ? u[e] + bb[e] : u[e], v[e]);
                }
                unsigned w[4];
                for (int e = 0; e < 4; e++) {
                    am = amax_merge_dev(am, v[2 * e]);
                    am = amax_merge_dev(am, v[2 * e + 1]);
                    s[2 * e] += v[2 * e];
                    s[2 * e + 1] += v[2 * e + 1];
                    __nv_bfloat162 p = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
                    w[e] = *(unsigned *)&p;
                }
                o = make_uint4(w[0], w[1], w[2], w[3]);
            }
            out[(size_t)r * G + g] = o;
        }
    }
    for (int e = 0; e < 8; e++) sh[ty][8 * tx + e] = s[e];
    __syncthreads();
    if (ty == 0 && g < G) {
        float t[8];
        for (int e = 0; e < 8; e++) t[e] = sh[0][8 * tx + e];
        for (int l = 1; l < COLSUM_LANES; l++)
            for (int e = 0; e < 8; e++) t[e] += sh[l][8 * tx + e];
        float4 *pp = (float4 *)(part + (size_t)blockIdx.y * G * 8 + 8 * (size_t)g);
        pp[0] = make_float4(t[0], t[1], t[2], t[3]);
        pp[1] = make_float4(t[4], t[5], t[6], t[7]);
    }
    if (amax_out) {
        /* block_amax wants a 1-D block: the same steps on the linear thread index */
        __shared__ float sh_am[COLSUM_LANES];
        am = warp_amax(am); /* a warp is one ty row: 32 consecutive tx */
        if (tx == 0) sh_am[ty] = am;
        __syncthreads();
        if (tx == 0 && ty == 0) {
            for (int l = 1; l < COLSUM_LANES; l++) am = amax_merge_dev(am, sh_am[l]);
            atomic_amax_merge(amax_out, am);
        }
    }
}

/* Whether the fused column-sum kernel takes x (and gx) [rows, cols] */
static int colsum_fusable(const cuda_state *s, const float *x, const float *gx, int rows,
                          int cols) {
    const int nchunks = (rows + COLSUM_ROWS - 1) / COLSUM_ROWS;
    return !s->plain && cols % 8 == 0 && ((uintptr_t)x & 15u) == 0 &&
           ((uintptr_t)gx & 15u) == 0 && nchunks <= 65535;
}

template <bool GBWD>
static void to_bf16_colsum_launch(fp8t_backend *b, uint16_t *out, float *amax_out, float *colsum,
                                  const float *x, const float *gx, const uint16_t *gx16,
                                  const float *gbias, int rows, int cols) {
    cuda_state *s = cuda_of(b);
    const int nchunks = (rows + COLSUM_ROWS - 1) / COLSUM_ROWS, G = cols / 8;
    float *part = (float *)cuda_scratch(b, SCR_COLSUM, (size_t)nchunks * cols * sizeof(float));
    dim3 grid((unsigned)((G + 31) / 32), (unsigned)nchunks), block(32, COLSUM_LANES);
    to_bf16_colsum_kernel<GBWD><<<grid, block, 0, s->stream>>>(
        (uint4 *)out, part, amax_out, (const float4 *)x, (const float4 *)gx, (const uint2 *)gx16,
        gbias, rows, fp8t_bf16_pad(rows), G);
    CUDA_LAUNCH_CHECK(s);
    if (colsum) cuda_column_sums_finish(b, colsum, part, nchunks, cols);
}

void cuda_to_bf16_colsum(fp8t_backend *b, uint16_t *out, float *amax_out, float *colsum,
                         const float *x, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    if (!colsum_fusable(cuda_of(b), x, x, rows, cols)) {
        cuda_to_bf16_operand(b, out, amax_out, x, rows, cols);
        cuda_column_sums(b, colsum, x, rows, cols);
        return;
    }
    to_bf16_colsum_launch<false>(b, out, amax_out, colsum, x, NULL, NULL, NULL, rows, cols);
}

void cuda_gelu_backward_bf16_colsum(fp8t_backend *b, uint16_t *out, float *amax_out,
                                    float *colsum, const float *dout, const float *x,
                                    const uint16_t *x16, const float *bias, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    if (!colsum_fusable(cuda_of(b), dout, x16 ? dout : x, rows, cols) || !aligned8(x16)) {
        /* dx in scratch (the unfused ops' bits), then its rounding and sums */
        x = cuda_bf16_widen(b, SCR_GELU_X, x, x16, (size_t)rows * cols);
        float *dx = (float *)cuda_scratch(b, SCR_ACT, (size_t)rows * cols * sizeof(float));
        if (bias)
            cuda_gelu_backward_bias(b, dx, x, bias, dout, rows, cols);
        else
            cuda_gelu_backward(b, dx, x, dout, (size_t)rows * cols);
        cuda_to_bf16_operand(b, out, amax_out, dx, rows, cols);
        if (colsum) cuda_column_sums(b, colsum, dx, rows, cols);
        return;
    }
    to_bf16_colsum_launch<true>(b, out, amax_out, colsum, dout, x, x16, bias, rows, cols);
}
