/* Unicode NFC (canonical composition), for tokenizer.json files whose normalizer is NFC
 * (Qwen2). Private to src/io. */
#ifndef FP8TRAIN_IO_NFC_H
#define FP8TRAIN_IO_NFC_H

#include <stddef.h>

/* NFC of the n bytes at s. Returns 0 when s is NFC already (nothing written: use s as it is,
 * the common case, found by a quick check), 1 with the normal form in *out (*outn bytes; the
 * buffer *out of *cap bytes is grown as needed and reused across calls), -1 out of memory.
 * Bytes that are not valid UTF-8 are kept as they are and take part in nothing. */
int fp8t_nfc(const char *s, size_t n, char **out, size_t *outn, size_t *cap);

#endif
