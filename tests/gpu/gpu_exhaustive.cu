/* GPU test helpers that need device code: the hardware FP8 / BF16 conversions the CUDA backend
 * uses, checked against the CUDA toolkit's software emulation on every float32 input.
 *
 * Why this closes the loop: the CPU encoders (fp8_encode, bf16_encode) are tested bit for bit
 * against the toolkit's host emulation on all 2^32 inputs (tests/test_fp8_exhaustive.cpp). The
 * device runs the same emulation source here (__nv_cvt_double_to_fp8 has no hardware path;
 * the BF16 rounding is the host branch of __float2bfloat16_rn) and compares it with the
 * hardware cvt.rn.satfinite / cvt.rn.bf16 instructions that the backend's kernels execute. */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "numerics/fp8_round_hd.h"

/* the emulation, as __nv_cvt_float_to_fp8's host branch runs it: NaN made canonical, then the
 * exact double conversion */
__device__ __forceinline__ unsigned char fp8_emulated(float x, __nv_fp8_interpretation_t f) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) u = 0x7fffffffu;
    return __nv_cvt_double_to_fp8((double)__uint_as_float(u), __NV_SATFINITE, f);
}

/* __float2bfloat16_rn's host branch */
__device__ __forceinline__ unsigned short bf16_emulated(float a) {
    unsigned int sign = 0, rem = 0;
    unsigned short r = __internal_float2bfloat16(a, sign, rem);
    if (rem > 0x80000000u || (rem == 0x80000000u && (r & 1u))) r++;
    return r;
}

__global__ void exhaustive_kernel(unsigned long long *mismatch, unsigned int *first_bad,
                                  unsigned long long start, unsigned long long count) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long bad_e4 = 0, bad_e5 = 0, bad_bf = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < count; i += stride) {
        unsigned int bits = (unsigned int)(start + i);
        float x = __uint_as_float(bits);
        unsigned char hw4 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
        unsigned char hw5 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
        if (hw4 != fp8_emulated(x, __NV_E4M3)) {
            bad_e4++;
            atomicCAS(&first_bad[0], 0xffffffffu, bits);
        }
        if (hw5 != fp8_emulated(x, __NV_E5M2)) {
            bad_e5++;
            atomicCAS(&first_bad[1], 0xffffffffu, bits);
        }
        __nv_bfloat16 hb = __float2bfloat16_rn(x);
        unsigned short hbu = *(unsigned short *)&hb;
        unsigned short eb = bf16_emulated(x);
        /* a NaN in gives a NaN out in both; the payload is not part of the contract */
        int both_nan = (hbu & 0x7fffu) > 0x7f80u && (eb & 0x7fffu) > 0x7f80u;
        if (hbu != eb && !both_nan) {
            bad_bf++;
            atomicCAS(&first_bad[2], 0xffffffffu, bits);
        }
    }
    if (bad_e4) atomicAdd(&mismatch[0], bad_e4);
    if (bad_e5) atomicAdd(&mismatch[1], bad_e5);
    if (bad_bf) atomicAdd(&mismatch[2], bad_bf);
}

/* The statistics kernels' FP8 rounding by float arithmetic (numerics/fp8_round_hd.h, device
 * build) against the hardware cast and back: fp8t_round_sat bit for bit (a NaN for a NaN),
 * fp8t_round_clamp in value and in its clipped flag (|y| above 464 / from 61440), and
 * fp8t_round_nosat in value where its caller may use it. */
__device__ __forceinline__ int fast_round_bad(float x, int e5) {
    const __nv_fp8_interpretation_t f = e5 ? __NV_E5M2 : __NV_E4M3;
    __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, f), f);
    const float ref = __half2float(__half(h));
    const float got = fp8t_round_sat(x, e5);
    if (ref != ref) return got == got;
    if (__float_as_uint(ref) != __float_as_uint(got)) return 1;
    const float a = fabsf(x);
    int cl;
    const float c = fp8t_round_clamp(x, e5, &cl);
    const int clip = e5 ? !(a < FP8T_CLIP_FROM_E5M2) : !(a <= FP8T_CLIP_ABOVE_E4M3);
    if (c != ref || cl != clip) return 1;
    if (!clip && fp8t_round_nosat(x, e5) != ref) return 1;
    return 0;
}

__global__ void fast_round_kernel(unsigned long long *mismatch, unsigned int *first_bad,
                                  unsigned long long start, unsigned long long count) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long bad4 = 0, bad5 = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < count; i += stride) {
        unsigned int bits = (unsigned int)(start + i);
        float x = __uint_as_float(bits);
        if (fast_round_bad(x, 0)) {
            bad4++;
            atomicCAS(&first_bad[0], 0xffffffffu, bits);
        }
        if (fast_round_bad(x, 1)) {
            bad5++;
            atomicCAS(&first_bad[1], 0xffffffffu, bits);
        }
    }
    if (bad4) atomicAdd(&mismatch[0], bad4);
    if (bad5) atomicAdd(&mismatch[1], bad5);
}

/* All 2^32 inputs through fast_round_kernel: mismatch counts [e4m3, e5m2] and the first
 * mismatching inputs (0xffffffff: none). 0 ok, -1 on a CUDA error (message in err). */
extern "C" int gpu_check_fast_round_exhaustive(unsigned long long counts[2],
                                               unsigned int first_bad[2], char *err,
                                               size_t errlen) {
    unsigned long long *d_counts = NULL;
    unsigned int *d_first = NULL;
    cudaError_t e = cudaMalloc(&d_counts, 2 * sizeof(unsigned long long));
    if (e == cudaSuccess) e = cudaMalloc(&d_first, 2 * sizeof(unsigned int));
    if (e == cudaSuccess) e = cudaMemset(d_counts, 0, 2 * sizeof(unsigned long long));
    if (e == cudaSuccess) e = cudaMemset(d_first, 0xff, 2 * sizeof(unsigned int));
    for (unsigned long long s = 0; e == cudaSuccess && s < (1ull << 32); s += 1ull << 30) {
        fast_round_kernel<<<132 * 16, 256>>>(d_counts, d_first, s, 1ull << 30);
        e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
    }
    if (e == cudaSuccess)
        e = cudaMemcpy(counts, d_counts, 2 * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(first_bad, d_first, 2 * sizeof(unsigned int), cudaMemcpyDeviceToHost);
    cudaFree(d_counts);
    cudaFree(d_first);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA error %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

/* Runs the check over all 2^32 inputs. Writes the mismatch counts [e4m3, e5m2, bf16] and the
 * first mismatching input bits of each (0xffffffff: none). 0 ok, -1 on a CUDA error (message
 * in err). */
extern "C" int gpu_check_conversions_exhaustive(unsigned long long counts[3],
                                                unsigned int first_bad[3], char *err,
                                                size_t errlen) {
    unsigned long long *d_counts = NULL;
    unsigned int *d_first = NULL;
    cudaError_t e = cudaMalloc(&d_counts, 3 * sizeof(unsigned long long));
    if (e == cudaSuccess) e = cudaMalloc(&d_first, 3 * sizeof(unsigned int));
    if (e == cudaSuccess) e = cudaMemset(d_counts, 0, 3 * sizeof(unsigned long long));
    if (e == cudaSuccess) e = cudaMemset(d_first, 0xff, 3 * sizeof(unsigned int));
    /* in four launches of 2^30 so a watchdog never sees one long kernel */
    for (unsigned long long s = 0; e == cudaSuccess && s < (1ull << 32); s += 1ull << 30) {
        exhaustive_kernel<<<132 * 16, 256>>>(d_counts, d_first, s, 1ull << 30);
        e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
    }
    if (e == cudaSuccess)
        e = cudaMemcpy(counts, d_counts, 3 * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(first_bad, d_first, 3 * sizeof(unsigned int), cudaMemcpyDeviceToHost);
    cudaFree(d_counts);
    cudaFree(d_first);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA error %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}
