/* Text and JSONL files through the tokenizer.json BPE: one document per text file or per
 * JSONL line (see include/fp8train/tokenizer.h). Shared by `fp8train tokenize` (shards) and
 * the on-the-fly data path (`train --data x.txt --tokenizer tokenizer.json`), so the two give
 * the same tokens for the same file. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/error.h"
#include "fp8train/io.h"
#include "fp8train/tokenizer.h"
#include "util/fs.h"

int fp8t_bpe_is_jsonl(const char *path) {
    size_t n = strlen(path);
    return (n >= 6 && !strcmp(path + n - 6, ".jsonl")) ||
           (n >= 7 && !strcmp(path + n - 7, ".ndjson"));
}

/* Encode one document (doc token first) into ids (reset) and hand it on. */
static int one_doc(fp8t_bpe *t, const char *s, size_t len, fp8t_tok_ids *ids, fp8t_doc_fn fn,
                   void *ctx, uint64_t start, uint64_t end, const char *path, char *err,
                   size_t errlen) {
    ids->n = 0;
    int doc = fp8t_bpe_doc_token(t);
    if (doc >= 0) {
        if (ids->cap == 0) {
            ids->v = malloc(1024 * sizeof(int32_t));
            if (!ids->v) return fp8t_errorf(err, errlen, "%s: out of memory", path);
            ids->cap = 1024;
        }
        ids->v[ids->n++] = doc;
    }
    if (fp8t_bpe_encode(t, s, len, ids) != 0)
        return fp8t_errorf(err, errlen, "%s: out of memory while tokenizing", path);
    return fn(ctx, ids->v, ids->n, start, end) ? -1 : 0;
}

static int encode_jsonl(fp8t_bpe *t, const char *path, const char *field, fp8t_doc_fn fn,
                        void *ctx, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return fp8t_errorf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    uint64_t off = 0;
    long lineno = 0;
    int rc = 0;
    fp8t_tok_ids ids = {0};
    while ((got = getline(&line, &cap, f)) > 0) {
        lineno++;
        uint64_t start = off;
        off += (uint64_t)got;
        size_t k = 0;
        while (k < (size_t)got &&
               (line[k] == ' ' || line[k] == '\t' || line[k] == '\n' || line[k] == '\r'))
            k++;
        if (k == (size_t)got) continue; /* a blank line */
        cJSON *o = cJSON_ParseWithLength(line, (size_t)got);
        const cJSON *txt = cJSON_GetObjectItemCaseSensitive(o, field);
        if (!o || !cJSON_IsObject(o)) {
            rc = fp8t_errorf(err, errlen,
                             "%s:%ld: not a JSON object (a JSONL file holds one "
                             "object per line, such as {\"%s\": \"...\"})",
                             path, lineno, field);
        } else if (!cJSON_IsString(txt)) {
            rc = fp8t_errorf(
                err, errlen, "%s:%ld: no string field \"%s\" in this line's object%s", path,
                lineno, field, strcmp(field, "text") ? "" : " (name another field with --field)");
        } else {
            rc = one_doc(t, txt->valuestring, strlen(txt->valuestring), &ids, fn, ctx, start, off,
                         path, err, errlen);
        }
        cJSON_Delete(o);
        if (rc) break;
    }
    if (!rc && ferror(f))
        rc = fp8t_errorf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
    free(line);
    free(ids.v);
    fclose(f);
    return rc;
}

int fp8t_bpe_encode_file(fp8t_bpe *t, const char *path, const char *field, fp8t_doc_fn fn,
                         void *ctx, char *err, size_t errlen) {
    if (fp8t_is_dir(path))
        return fp8t_errorf(err, errlen, "'%s' is a directory; give text or .jsonl files", path);
    if (fp8t_bpe_is_jsonl(path))
        return encode_jsonl(t, path, field && *field ? field : "text", fn, ctx, err, errlen);
    char *data = NULL;
    size_t len = 0;
    char e[FP8T_ERR_LEN];
    if (fp8t_read_file(path, &data, &len, e, sizeof(e)) != 0)
        return fp8t_errorf(err, errlen, "%s", e);
    fp8t_tok_ids ids = {0};
    int rc = one_doc(t, data, len, &ids, fn, ctx, 0, len, path, err, errlen);
    free(ids.v);
    free(data);
    return rc;
}
