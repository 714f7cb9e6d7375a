/* CUDA backend — the inference ops: the KV cache (kv_cache_write, attention_decode) and the
 * embedding lookup from a BF16 table (embedding_forward_bf16); the CPU references are in
 * cpu_attention_decode.c.
 *
 * Cache layout per layer: kc, vc [B, NKV, Tmax, HS], K after RoPE, BF16 bits or FP32.
 * RoPE angles are computed in the kernel as t * inv_freq_i in double, rounded once to float
 * cos/sin: the CPU's table values (fp8t_rope_inv_freq, in double), with no table to keep per
 * position. The frequencies travel in the kernel's parameters (HS/2 doubles, HS <= 256).
 *
 * Decode: one block per (query head, sequence). Its keys 0..pos are read in chunks of
 * DEC_CHUNK: each warp scores keys (lanes over the head dimension, a warp sum), then the
 * block takes the chunk's max and exps and folds them into a running (max, sum, out) — the
 * online softmax — so any cache length fits in a fixed shared-memory budget. Each thread owns
 * out elements tid and tid + DEC_THREADS. Every sum is in a fixed order: deterministic. */
#include "backend/cuda/cuda_common.cuh"

enum { DEC_THREADS = 128, DEC_CHUNK = 1024, DEC_MAX_HS = 256 };

struct rope_freqs {
    double f[DEC_MAX_HS / 2]; /* inv_freq of pair i */
    int on;                   /* RoPE applied */
};

__device__ __forceinline__ float kv_load(const void *c, int bf16, size_t i) {
    if (bf16) return __uint_as_float((uint32_t)((const uint16_t *)c)[i] << 16);
    return ((const float *)c)[i];
}

__device__ __forceinline__ void kv_store(void *c, int bf16, size_t i, float x) {
    if (bf16) ((uint16_t *)c)[i] = (uint16_t)(__float_as_uint(bf16_round_dev(x)) >> 16);
    else ((float *)c)[i] = x;
}

/* Token rows of qkv into the cache. pos == NULL (prefill): row b*T + t goes to position t;
 * else (decode, T = 1) row b goes to position pos[b]. One thread per (row, K/V head, i < half):
 * elements i and i + HS/2 of K (rotated) and V. */
__global__ void kv_write_kernel(void *kc, void *vc, int kv_bf16, const float *__restrict__ qkv,
                                const int *__restrict__ pos, int B, int T, int NH, int NKV,
                                int HS, int Tmax, rope_freqs fr) {
    const int half = (HS + 1) / 2, W = (NH + 2 * NKV) * HS;
    const size_t total = (size_t)B * T * NKV * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(idx % half);
        size_t r = idx / half;
        const int g = (int)(r % NKV);
        r /= NKV; /* token row */
        const int bb = (int)(r / T);
        const int t = pos ? pos[bb] : (int)(r % T);
        const float *k = qkv + r * W + (size_t)(NH + g) * HS, *v = k + (size_t)NKV * HS;
        const size_t dst = (((size_t)bb * NKV + g) * Tmax + t) * HS;
        const int i2 = i + HS / 2; /* odd HS (never rotated): the middle element twice */
        float k1 = k[i], k2 = k[i2];
        if (fr.on) {
            const double ang = (double)t * fr.f[i];
            const float c = (float)cos(ang), s = (float)sin(ang);
            const float r1 = k1 * c - k2 * s, r2 = k2 * c + k1 * s;
            k1 = r1, k2 = r2;
        }
        kv_store(kc, kv_bf16, dst + i, k1);
        kv_store(kc, kv_bf16, dst + i2, k2);
        kv_store(vc, kv_bf16, dst + i, v[i]);
        kv_store(vc, kv_bf16, dst + i2, v[i2]);
    }
}

/* a block-wide max / sum every thread gets (red: DEC_THREADS/32 floats of shared memory) */
__device__ __forceinline__ float dec_block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < DEC_THREADS / 32; w++) m = fmaxf(m, red[w]);
    return m;
}
__device__ __forceinline__ float dec_block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = red[0];
    for (int w = 1; w < DEC_THREADS / 32; w++) s += red[w];
    return s;
}

__global__ void __launch_bounds__(DEC_THREADS)
attn_decode_kernel(float *out, const void *kc, const void *vc, int kv_bf16,
                   const float *__restrict__ qkv, const int *__restrict__ pos, int NH, int NKV,
                   int HS, int Tmax, float scale, rope_freqs fr) {
    __shared__ float q[DEC_MAX_HS];
    __shared__ float sc[DEC_CHUNK];
    __shared__ float red[DEC_THREADS / 32];
    const int h = blockIdx.x, bb = blockIdx.y, g = h / (NH / NKV), p = pos[bb];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float *qs = qkv + (size_t)bb * (NH + 2 * NKV) * HS + (size_t)h * HS;
    const int half = HS / 2;
    for (int i = tid; i < HS; i += DEC_THREADS) {
        float x = qs[i];
        if (fr.on) {
            const int j = i < half ? i : i - half;
            const double ang = (double)p * fr.f[j];
            const float c = (float)cos(ang), s = (float)sin(ang);
            x = i < half ? x * c - qs[i + half] * s : x * c + qs[i - half] * s;
        }
        q[i] = x;
    }
    __syncthreads();
    const size_t base = ((size_t)bb * NKV + g) * Tmax * HS;
    float m = -INFINITY, l = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
    for (int t0 = 0; t0 <= p; t0 += DEC_CHUNK) {
        const int n = min(DEC_CHUNK, p + 1 - t0);
        for (int j = warp; j < n; j += DEC_THREADS / 32) {
            const size_t row = base + (size_t)(t0 + j) * HS;
            float d = 0.0f;
            for (int i = lane; i < HS; i += 32) d += q[i] * kv_load(kc, kv_bf16, row + i);
            d = warp_sum(d);
            if (lane == 0) sc[j] = d * scale;
        }
        __syncthreads();
        float cm = -INFINITY;
        for (int j = tid; j < n; j += DEC_THREADS) cm = fmaxf(cm, sc[j]);
        const float mnew = fmaxf(m, dec_block_max(cm, red));
        float part = 0.0f;
        for (int j = tid; j < n; j += DEC_THREADS) {
            const float e = expf(sc[j] - mnew);
            sc[j] = e;
            part += e;
        }
        const float csum = dec_block_sum(part, red); /* its __syncthreads publish sc */
        const float corr = expf(m - mnew);           /* 0 on the first chunk (m = -inf) */
        l = l * corr + csum;
        acc0 *= corr;
        acc1 *= corr;
        for (int j = 0; j < n; j++) {
            const size_t row = base + (size_t)(t0 + j) * HS;
            const float w = sc[j];
            if (tid < HS) acc0 += w * kv_load(vc, kv_bf16, row + tid);
            if (tid + DEC_THREADS < HS) acc1 += w * kv_load(vc, kv_bf16, row + tid + DEC_THREADS);
        }
        m = mnew;
        __syncthreads(); /* sc is rewritten by the next chunk */
    }
    float *o = out + (size_t)bb * NH * HS + (size_t)h * HS;
    const float inv = 1.0f / l;
    if (tid < HS) o[tid] = acc0 * inv;
    if (tid + DEC_THREADS < HS) o[tid + DEC_THREADS] = acc1 * inv;
}

static rope_freqs make_freqs(const fp8t_attn_shape *s) {
    rope_freqs fr;
    memset(&fr, 0, sizeof(fr));
    fr.on = s->rope_theta > 0.0f;
    if (fr.on)
        for (int i = 0; i < s->HS / 2; i++) fr.f[i] = fp8t_rope_inv_freq(s, i);
    return fr;
}

static void check_decode_shape(const fp8t_attn_shape *s, int T, int Tmax) {
    if (s->HS > DEC_MAX_HS || (s->rope_theta > 0.0f && s->HS % 2) || T > Tmax || T < 1) {
        fprintf(stderr, "fp8train: CUDA KV cache: head size %d (at most %d, even with RoPE), %d "
                "tokens for a cache of %d positions (%s:%d)\n", s->HS, DEC_MAX_HS, T, Tmax,
                __FILE__, __LINE__);
        exit(1);
    }
}

static void launch_kv_write(fp8t_backend *b, void *kc, void *vc, int kv_bf16, const float *qkv,
                            const int *pos, const fp8t_attn_shape *s, int T, int Tmax) {
    cuda_state *st = cuda_of(b);
    const int NKV = fp8t_attn_nkv(s);
    const size_t total = (size_t)s->B * T * NKV * ((s->HS + 1) / 2);
    if (!total) return;
    const unsigned grid = cdiv_u(total, 256) < 65535u ? cdiv_u(total, 256) : 65535u;
    kv_write_kernel<<<grid, 256, 0, st->stream>>>(kc, vc, kv_bf16, qkv, pos, s->B, T, s->NH,
                                                   NKV, s->HS, Tmax, make_freqs(s));
    CUDA_LAUNCH_CHECK(st);
}

void cuda_kv_cache_write(fp8t_backend *b, void *kc, void *vc, int kv_bf16, const float *qkv,
                         const fp8t_attn_shape *s, int Tmax) {
    check_decode_shape(s, s->T, Tmax);
    launch_kv_write(b, kc, vc, kv_bf16, qkv, NULL, s, s->T, Tmax);
}

void cuda_attention_decode(fp8t_backend *b, float *out, void *kc, void *vc, int kv_bf16,
                           const float *qkv, const int *pos, const fp8t_attn_shape *s,
                           int Tmax) {
    check_decode_shape(s, 1, Tmax);
    if (s->B < 1) return;
    cuda_state *st = cuda_of(b);
    /* the new tokens' K and V first (stream order): every query head of a group reads them */
    launch_kv_write(b, kc, vc, kv_bf16, qkv, pos, s, 1, Tmax);
    dim3 grid((unsigned)s->NH, (unsigned)s->B);
    attn_decode_kernel<<<grid, DEC_THREADS, 0, st->stream>>>(
        out, kc, vc, kv_bf16, qkv, pos, s->NH, fp8t_attn_nkv(s), s->HS, Tmax,
        1.0f / sqrtf((float)s->HS), make_freqs(s));
    CUDA_LAUNCH_CHECK(st);
}

/* out[i, c] = widen(wte[tok_i * ld + c]) + wpe[t_i * C + c], t_i = pos ? pos[i] : i % T: one
 * thread per element */
__global__ void embedding_bf16_kernel(float *out, const int *__restrict__ tokens,
                                      const uint16_t *__restrict__ wte, int ld,
                                      const float *__restrict__ wpe,
                                      const int *__restrict__ pos, int T, int C, size_t n) {
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t i = idx / C;
        const int c = (int)(idx % C);
        float v = __uint_as_float((uint32_t)wte[(size_t)tokens[i] * ld + c] << 16);
        if (wpe) v += wpe[(pos ? (size_t)pos[i] : i % T) * C + c];
        out[idx] = v;
    }
}

void cuda_embedding_forward_bf16(fp8t_backend *b, float *out, const int *tokens,
                                 const uint16_t *wte, int ld, const float *wpe, const int *pos,
                                 int B, int T, int C) {
    const size_t n = (size_t)B * T * C;
    if (!n) return;
    cuda_state *st = cuda_of(b);
    const unsigned grid = cdiv_u(n, 256) < 65535u ? cdiv_u(n, 256) : 65535u;
    embedding_bf16_kernel<<<grid, 256, 0, st->stream>>>(out, tokens, wte, ld, wpe, pos, T, C,
                                                       n);
    CUDA_LAUNCH_CHECK(st);
}
