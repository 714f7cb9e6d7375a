/* fp8train — little-endian loads and stores of the file formats (llm.c, safetensors, .npy,
 * eval tasks), byte by byte: never an unaligned access, whatever the host's alignment rules.
 * Private to the library (src/). */
#ifndef FP8TRAIN_UTIL_LE_H
#define FP8TRAIN_UTIL_LE_H

#include <stdint.h>

static inline uint16_t fp8t_load_le16(const void *p) {
    const uint8_t *b = (const uint8_t *)p;
    return (uint16_t)(b[0] | (b[1] << 8));
}
static inline uint32_t fp8t_load_le32(const void *p) {
    const uint8_t *b = (const uint8_t *)p;
    return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
           ((uint32_t)b[3] << 24);
}
static inline uint64_t fp8t_load_le64(const void *p) {
    const uint8_t *b = (const uint8_t *)p;
    return (uint64_t)fp8t_load_le32(b) | ((uint64_t)fp8t_load_le32(b + 4) << 32);
}
static inline void fp8t_store_le16(void *p, uint16_t v) {
    uint8_t *b = (uint8_t *)p;
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
}
static inline void fp8t_store_le32(void *p, uint32_t v) {
    uint8_t *b = (uint8_t *)p;
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static inline void fp8t_store_le64(void *p, uint64_t v) {
    uint8_t *b = (uint8_t *)p;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

#endif
