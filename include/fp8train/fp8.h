/* fp8train — FP8 and BF16 formats: scalar encode/decode and bulk quantize/dequantize.
 *
 * E4M3 is the OCP "fn" variant (max 448, no Inf, NaN = S.1111.111).
 * E5M2 is IEEE-like (max 57344, Inf, NaN).
 * All encoders round to nearest, ties to even; subnormals are kept; NaN in gives NaN out;
 * the sign of zero is kept. These agree bit for bit with the CUDA toolkit's
 * __nv_cvt_float_to_fp8 / __float2bfloat16_rn (tested on every float32 input). */
#ifndef FP8TRAIN_FP8_H
#define FP8TRAIN_FP8_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FP8_E4M3 = 0, FP8_E5M2 = 1 } fp8_format;

#define FP8_E4M3_MAX 448.0f
#define FP8_E5M2_MAX 57344.0f

uint8_t fp8_encode(float x, fp8_format fmt, int saturate); /* round to nearest even */
float fp8_decode(uint8_t bits, fp8_format fmt);
uint16_t bf16_encode(float x); /* round to nearest even */
float bf16_decode(uint16_t bits);

float fp8_format_max(fp8_format fmt);        /* 448 or 57344 */
const char *fp8_format_name(fp8_format fmt); /* "e4m3" / "e5m2" */

/* ---- bulk operations (CPU reference; OpenMP-parallel where large) ----
 * quantize:   out[i] = fp8_encode(x[i] * scale, fmt, saturate)
 * dequantize: out[i] = fp8_decode(codes[i], fmt) * scale_inv
 * amax:       max |x[i]|; NaN if any element is NaN (so non-finite data is never hidden),
 *             0 for n == 0
 * quantize_amax: quantize and return amax of x in one pass
 * fake_quantize: out[i] = fp8_decode(fp8_encode(x[i]*scale, fmt, 1), fmt) / scale
 *             (quantize-dequantize, saturating); out may alias x
 * bf16_round: out[i] = bf16_decode(bf16_encode(x[i])); out may alias x
 * bf16_encode_n / bf16_decode_n: the scalar conversions over n elements */
void fp8_quantize(uint8_t *out, const float *x, size_t n, float scale, fp8_format fmt,
                  int saturate);
void fp8_dequantize(float *out, const uint8_t *codes, size_t n, float scale_inv, fp8_format fmt);
float fp8_amax(const float *x, size_t n);
float fp8_quantize_amax(uint8_t *out, const float *x, size_t n, float scale, fp8_format fmt,
                        int saturate);
void fp8_fake_quantize(float *out, const float *x, size_t n, float scale, fp8_format fmt);
void bf16_round(float *out, const float *x, size_t n);
void bf16_encode_n(uint16_t *out, const float *x, size_t n);
void bf16_decode_n(float *out, const uint16_t *bits, size_t n);

#ifdef __cplusplus
}
#endif
#endif
