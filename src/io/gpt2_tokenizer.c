/* llm.c's GPT-2 tokenizer file (gpt2_tokenizer.bin, written by llm.c's train_gpt2.py):
 * header 256 x uint32 (magic 20240328, version 1 or 2, vocab size, EOT id in version 2), then
 * for each token one length byte (1..255) and that many bytes. Decoding only: tokens -> bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "fp8train/tokenizer.h"
#include "fp8train/io.h"
#include "util/le.h"

#define TOKENIZER_MAGIC 20240328u

void fp8t_tokenizer_free(fp8t_tokenizer *t) {
    if (!t) return;
    for (int i = 0; t->piece && i < t->vocab_size; i++) free(t->piece[i]);
    free(t->piece);
    free(t->piece_len);
    memset(t, 0, sizeof(*t));
}

int fp8t_tokenizer_read(const char *path, fp8t_tokenizer *t, char *err, size_t errlen) {
    memset(t, 0, sizeof(*t));
    char *data = NULL;
    size_t len = 0;
    char e[FP8T_ERR_LEN];
    if (fp8t_read_file(path, &data, &len, e, sizeof(e)) != 0) {
        return fp8t_errorf(err, errlen, "tokenizer: %s", e);
    }
    const uint8_t *b = (const uint8_t *)data;
    int rc = -1;
    if (len < 1024) {
        fp8t_errorf(err, errlen,
                    "%s: truncated (%zu bytes; the header is 1024): not an llm.c "
                    "tokenizer file",
                    path, len);
        goto done;
    }
    uint32_t magic = fp8t_load_le32(b), version = fp8t_load_le32(b + 4);
    uint32_t vocab = fp8t_load_le32(b + 8);
    if (magic != TOKENIZER_MAGIC) {
        fp8t_errorf(err, errlen,
                    "%s: bad magic %u; an llm.c tokenizer file (gpt2_tokenizer.bin) "
                    "starts with %u",
                    path, magic, TOKENIZER_MAGIC);
        goto done;
    }
    if (version != 1 && version != 2) {
        fp8t_errorf(err, errlen, "%s: tokenizer version %u is not supported (1 or 2)", path,
                    version);
        goto done;
    }
    if (vocab < 1 || vocab > (1u << 20)) {
        fp8t_errorf(err, errlen, "%s: vocabulary size %u is not plausible", path, vocab);
        goto done;
    }
    /* version 1 predates the EOT field: GPT-2's <|endoftext|> */
    uint32_t eot = version == 2 ? fp8t_load_le32(b + 12) : 50256u;
    if (eot >= vocab) eot = vocab - 1;
    t->vocab_size = (int)vocab;
    t->eot = (int)eot;
    t->piece = calloc(vocab, sizeof(char *));
    t->piece_len = calloc(vocab, sizeof(int));
    if (!t->piece || !t->piece_len) {
        fp8t_errorf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    size_t off = 1024;
    for (uint32_t i = 0; i < vocab; i++) {
        if (off >= len) {
            fp8t_errorf(err, errlen, "%s: truncated at token %u of %u", path, i, vocab);
            goto done;
        }
        unsigned n = b[off++];
        if (n == 0 || n > len - off) {
            fp8t_errorf(err, errlen, "%s: token %u has %s", path, i,
                        n == 0 ? "length 0 (every token has at least one byte)"
                               : "bytes past the end of the file (truncated)");
            goto done;
        }
        t->piece[i] = malloc(n + 1);
        if (!t->piece[i]) {
            fp8t_errorf(err, errlen, "%s: out of memory", path);
            goto done;
        }
        memcpy(t->piece[i], b + off, n);
        t->piece[i][n] = 0;
        t->piece_len[i] = (int)n;
        off += n;
    }
    if (off != len) {
        fp8t_errorf(err, errlen,
                    "%s: %zu bytes after the last token (wrong vocabulary size in the "
                    "header?)",
                    path, len - off);
        goto done;
    }
    rc = 0;
done:
    free(data);
    if (rc != 0) fp8t_tokenizer_free(t);
    return rc;
}
