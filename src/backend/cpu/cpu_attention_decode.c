/* CPU backend — the inference ops: the KV cache (the prefill's K/V write and the one-token
 * decode attention) and the embedding lookup from a BF16 table (the references the CUDA
 * kernels of cuda_attention_decode.cu are checked against).
 *
 * Cache layout per layer: kc, vc [B, NKV] blocks of positions [Tmax, HS] (backend.h:
 * fp8t_kv_head_bytes), K after RoPE, FP32, BF16 bits, or E4M3 codes with one scale_inv per
 * position (the current-scaling scale of that position's HS values). The RoPE
 * angle of position t and pair i is t * fp8t_rope_inv_freq(s, i) in double, rounded once to
 * float cos/sin: the values of cpu_attention.c's table, so a token's K in the cache is the
 * rotated K attention_forward computes for it.
 *
 * Decode, per (sequence b, query head h): s_t = scale * q·k_t for t = 0..pos[b], softmax in
 * FP32 (max subtracted), out = sum_t p_t v_t. Each (b, h) is one work item computed by one
 * thread in a fixed order, so results do not depend on the number of threads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "fp8train/fp8.h"

/* cos[i], sin[i] of the rotation pairs at position t (HS/2 each) */
static void rope_row(float *cs, float *sn, const fp8t_attn_shape *s, int t) {
    for (int i = 0; i < s->HS / 2; i++) {
        const double ang = (double)t * fp8t_rope_inv_freq(s, i);
        cs[i] = (float)cos(ang);
        sn[i] = (float)sin(ang);
    }
}

/* dst = rope(src) at the angles cs/sn (NULL: a copy) — cpu_attention.c's rope_apply */
static void rotate(float *dst, const float *src, const float *cs, const float *sn, int HS) {
    if (!cs) {
        memcpy(dst, src, (size_t)HS * sizeof(float));
        return;
    }
    const int half = HS / 2;
    for (int i = 0; i < half; i++) {
        float x1 = src[i], x2 = src[i + half];
        dst[i] = x1 * cs[i] - x2 * sn[i];
        dst[i + half] = x2 * cs[i] + x1 * sn[i];
    }
}

/* the (sequence, K/V head) block blk of a cache, and its position t's values */
static char *cache_block(void *cache, int kv, size_t blk, int Tmax, int HS) {
    return (char *)cache + blk * fp8t_kv_head_bytes(kv, Tmax, HS);
}

/* store one head row (HS floats) at position t of block blk; FP8: the row's own scale */
static void put_row(void *cache, int kv, size_t blk, int t, const float *x, int Tmax, int HS) {
    char *p = cache_block(cache, kv, blk, Tmax, HS);
    const size_t off = (size_t)t * HS;
    if (kv == FP8T_KV_FP8) {
        const float scale = fp8t_current_scale(fp8_amax(x, (size_t)HS), FP8_E4M3_MAX, 0.0f, 0);
        fp8_quantize((uint8_t *)p + off, x, (size_t)HS, scale, FP8_E4M3, 1);
        ((float *)(p + fp8t_kv_scale_offset(Tmax, HS)))[t] = 1.0f / scale;
    } else if (kv == FP8T_KV_BF16) {
        bf16_encode_n((uint16_t *)p + off, x, (size_t)HS);
    } else {
        memcpy((float *)p + off, x, (size_t)HS * sizeof(float));
    }
}

/* x = the values position t of block blk holds (FP8: code * scale_inv) */
static void get_row(float *x, const void *cache, int kv, size_t blk, int t, int Tmax, int HS) {
    const char *p = cache_block((void *)cache, kv, blk, Tmax, HS);
    const size_t off = (size_t)t * HS;
    if (kv == FP8T_KV_FP8)
        fp8_dequantize(x, (const uint8_t *)p + off, (size_t)HS,
                       ((const float *)(p + fp8t_kv_scale_offset(Tmax, HS)))[t], FP8_E4M3);
    else if (kv == FP8T_KV_BF16)
        bf16_decode_n(x, (const uint16_t *)p + off, (size_t)HS);
    else
        memcpy(x, (const float *)p + off, (size_t)HS * sizeof(float));
}

/* K (rotated at t) and V of token row tok (one qkv row) into position t of sequence bi */
static void write_token(void *kc, void *vc, int kv, const float *tok, const fp8t_attn_shape *s,
                        int Tmax, int bi, int t, float *tmp) {
    const int NH = s->NH, NKV = fp8t_attn_nkv(s), HS = s->HS;
    float cs[512], sn[512]; /* HS <= 1024 (checked by the callers) */
    const int rope = s->rope_theta > 0.0f;
    if (rope) rope_row(cs, sn, s, t);
    for (int g = 0; g < NKV; g++) {
        const size_t blk = (size_t)bi * NKV + g;
        rotate(tmp, tok + (size_t)(NH + g) * HS, rope ? cs : NULL, sn, HS);
        put_row(kc, kv, blk, t, tmp, Tmax, HS);
        put_row(vc, kv, blk, t, tok + (size_t)(NH + NKV + g) * HS, Tmax, HS);
    }
}

static void check_shape(const fp8t_attn_shape *s, int kv, int Tmax, int T) {
    if (s->HS > 1024 || (s->rope_theta > 0.0f && s->HS % 2) || T > Tmax || kv < FP8T_KV_FP32 ||
        kv > FP8T_KV_FP8) {
        FP8T_FATAL("KV cache: head size %d (at most 1024, even with RoPE), %d "
                   "tokens for a cache of %d positions, cache kind %d",
                   s->HS, T, Tmax, kv);
    }
}

void cpu_kv_cache_write(fp8t_backend *b, void *kc, void *vc, int kv, const float *qkv,
                        const fp8t_attn_shape *s, int Tmax) {
    check_shape(s, kv, Tmax, s->T);
    const int B = s->B, T = s->T, W = fp8t_attn_qkv_width(s);
    qkv = cpu_qkv_biased(b, qkv, s, (size_t)B * T);
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        float tmp[1024];
        write_token(kc, vc, kv, qkv + (size_t)bt * W, s, Tmax, bt / T, bt % T, tmp);
    }
}

void cpu_attention_decode(fp8t_backend *b, float *out, void *kc, void *vc, int kv,
                          const float *qkv, const int *pos, const fp8t_attn_shape *s, int Tmax) {
    check_shape(s, kv, Tmax, 1);
    const int B = s->B, NH = s->NH, NKV = fp8t_attn_nkv(s), HS = s->HS, G = NH / NKV;
    const int W = fp8t_attn_qkv_width(s);
    qkv = cpu_qkv_biased(b, qkv, s, (size_t)B);
    for (int bi = 0; bi < B; bi++)
        if (pos[bi] < 0 || pos[bi] >= Tmax) {
            FP8T_FATAL("attention_decode: sequence %d at position %d, outside the "
                       "cache's %d positions",
                       bi, pos[bi], Tmax);
        }
        /* the new tokens' K and V first: every query head of a group reads them */
#pragma omp parallel for schedule(static)
    for (int bi = 0; bi < B; bi++) {
        float tmp[1024];
        write_token(kc, vc, kv, qkv + (size_t)bi * W, s, Tmax, bi, pos[bi], tmp);
    }
    const float scale = 1.0f / sqrtf((float)HS);
    float *sc = cpu_scratch(b, CPU_SCRATCH_ATTN, (size_t)B * NH * Tmax * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        const int bi = bh / NH, h = bh % NH, g = h / G, p = pos[bi];
        float q[1024], row[1024], cs[512], sn[512];
        const int rope = s->rope_theta > 0.0f;
        if (rope) rope_row(cs, sn, s, p);
        rotate(q, qkv + (size_t)bi * W + (size_t)h * HS, rope ? cs : NULL, sn, HS);
        float *srow = sc + (size_t)bh * Tmax; /* scores of keys 0..p */
        const size_t blk = (size_t)bi * NKV + g;
        float mx = -INFINITY;
        for (int t = 0; t <= p; t++) {
            get_row(row, kc, kv, blk, t, Tmax, HS);
            float d = 0.0f;
            for (int i = 0; i < HS; i++) d += q[i] * row[i];
            srow[t] = d * scale;
            mx = srow[t] > mx ? srow[t] : mx;
        }
        float sum = 0.0f;
        for (int t = 0; t <= p; t++) {
            srow[t] = cpu_expf(srow[t] - mx);
            sum += srow[t];
        }
        float *o = out + (size_t)bi * NH * HS + (size_t)h * HS;
        for (int i = 0; i < HS; i++) o[i] = 0.0f;
        for (int t = 0; t <= p; t++) {
            get_row(row, vc, kv, blk, t, Tmax, HS);
            const float w = srow[t];
            for (int i = 0; i < HS; i++) o[i] += w * row[i];
        }
        const float inv = 1.0f / sum;
        for (int i = 0; i < HS; i++) o[i] *= inv;
    }
}

void cpu_embedding_forward_bf16(fp8t_backend *b, float *out, const int *tokens,
                                const uint16_t *wte, int ld, const float *wpe, const int *pos,
                                int B, int T, int C) {
    (void)b;
    const int N = B * T;
#pragma omp parallel for schedule(static) if ((long)N * C > 65536)
    for (int i = 0; i < N; i++) {
        const uint16_t *we = wte + (size_t)tokens[i] * ld; /* [C] */
        const int t = pos ? pos[i] : i % T;
        const float *pe = wpe ? wpe + (size_t)t * C : NULL; /* [C] */
        float *o = out + (size_t)i * C;                     /* [C] */
        for (int c = 0; c < C; c++) o[c] = bf16_decode(we[c]) + (pe ? pe[c] : 0.0f);
    }
}

void cpu_embedding_forward_fp8(fp8t_backend *b, float *out, const int *tokens,
                               const uint8_t *codes, int ld, const float *scale_inv,
                               const float *wpe, const int *pos, int B, int T, int C) {
    (void)b;
    const int N = B * T;
    const float si = *scale_inv;
#pragma omp parallel for schedule(static) if ((long)N * C > 65536)
    for (int i = 0; i < N; i++) {
        const uint8_t *we = codes + (size_t)tokens[i] * ld; /* [C] */
        const int t = pos ? pos[i] : i % T;
        const float *pe = wpe ? wpe + (size_t)t * C : NULL; /* [C] */
        float *o = out + (size_t)i * C;                     /* [C] */
        for (int c = 0; c < C; c++) o[c] = fp8_decode(we[c], FP8_E4M3) * si + (pe ? pe[c] : 0.0f);
    }
}
