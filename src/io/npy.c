/* fp8train — NumPy .npy files (C order, little endian).
 *
 * Layout: "\x93NUMPY", major, minor, header length (uint16 LE in 1.0, uint32 LE in 2.0/3.0),
 * then a Python dict literal such as
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * padded with spaces and a final '\n' so that the data starts at a multiple of 64 bytes. */
#include "fp8train/io.h"
#include "io/io_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NPY_MAX_DIMS 8
#define NPY_ALIGN 64
/* numpy itself refuses headers above 10000 bytes unless told otherwise; allow more, but not
 * the gigabytes a corrupt length field could claim. */
#define NPY_MAX_HEADER (1u << 20)

static const struct {
    char kind; /* numpy type character */
    size_t size;
} npy_types[] = {{'f', 2}, {'f', 4}, {'f', 8}, {'i', 1}, {'i', 2}, {'i', 4},
                 {'i', 8}, {'u', 1}, {'u', 2}, {'u', 4}, {'u', 8}, {'b', 1}};
#define NPY_TYPE_LIST "<f2 <f4 <f8 |i1 <i2 <i4 <i8 |u1 <u2 <u4 <u8 |b1"

/* Normalizes descr to its canonical spelling ("<f4", "|u1") and gives the element size.
 * Returns 0, or -1 with a reason in why. */
static int npy_parse_descr(const char *descr, char canon[16], size_t *size, const char **why) {
    if (strlen(descr) != 3) goto unknown;
    char order = descr[0], kind = descr[1];
    if (descr[2] < '1' || descr[2] > '8') goto unknown;
    size_t sz = (size_t)(descr[2] - '0');
    int found = 0;
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (npy_types[i].kind == kind && npy_types[i].size == sz) found = 1;
    if (!found) goto unknown;
    if (order == '>' && sz > 1) {
        *why = "big-endian data is not supported (convert with arr.astype('<...'))";
        return -1;
    }
    /* '=' is native order, little endian on every host we build for; byte order is
     * meaningless for one-byte types. */
    if (order != '<' && order != '=' && !(sz == 1 && (order == '|' || order == '>')))
        goto unknown;
    snprintf(canon, 16, "%c%c%zu", sz == 1 ? '|' : '<', kind, sz);
    *size = sz;
    return 0;
unknown:
    *why = "unsupported dtype (supported: " NPY_TYPE_LIST ")";
    return -1;
}

static int npy_numel(const int64_t *shape, int ndim, size_t elem, uint64_t *bytes) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n)) return -1;
    }
    if (__builtin_mul_overflow(n, (uint64_t)elem, bytes)) return -1;
    return *bytes > SIZE_MAX / 2 ? -1 : 0;
}

int fp8t_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape,
                   const void *data, char *err, size_t errlen) {
    const char *p = path ? path : "(null)";
    if (!descr) {
        fp8t_errorf(err, errlen, "%s: no dtype given", p);
        return -1;
    }
    char canon[16];
    size_t elem;
    const char *why;
    if (npy_parse_descr(descr, canon, &elem, &why) != 0) {
        fp8t_errorf(err, errlen, "%s: dtype '%.16s': %s", p, descr, why);
        return -1;
    }
    if (ndim < 0 || ndim > NPY_MAX_DIMS || (ndim > 0 && !shape)) {
        fp8t_errorf(err, errlen, "%s: ndim %d invalid (0..%d, with a shape)", p, ndim,
                    NPY_MAX_DIMS);
        return -1;
    }
    uint64_t bytes;
    if (npy_numel(shape, ndim, elem, &bytes) != 0) {
        fp8t_errorf(err, errlen, "%s: shape has a negative dimension or overflows", p);
        return -1;
    }
    if (bytes > 0 && !data) {
        fp8t_errorf(err, errlen, "%s: no data given for %llu bytes", p,
                    (unsigned long long)bytes);
        return -1;
    }
    /* 10-byte prefix, then the dict; at most 8 dims of 19 digits, so 512 bytes is plenty. */
    char header[512];
    int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                     canon);
    for (int i = 0; i < ndim; i++)
        n += snprintf(header + n, sizeof header - (size_t)n, "%s%lld", i ? ", " : "",
                      (long long)shape[i]);
    n += snprintf(header + n, sizeof header - (size_t)n, "%s), }", ndim == 1 ? "," : "");
    while ((10 + n + 1) % NPY_ALIGN != 0) header[n++] = ' ';
    header[n++] = '\n';

    uint8_t prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    fp8t_store_le16(prefix + 8, (uint16_t)n);
    fp8t_atomic_file a;
    if (fp8t_atomic_open(&a, path, err, errlen) != 0) return -1;
    if (fp8t_atomic_write(&a, prefix, sizeof prefix, err, errlen) != 0) return -1;
    if (fp8t_atomic_write(&a, header, (size_t)n, err, errlen) != 0) return -1;
    if (bytes && fp8t_atomic_write(&a, data, (size_t)bytes, err, errlen) != 0) return -1;
    return fp8t_atomic_commit(&a, err, errlen);
}

/* ---- reading: a tiny parser for the one dict literal numpy writes ---- */

typedef struct {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int accept_char(cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A quoted string without escapes ('...' or "..."); out has room for outlen-1 chars. */
static int parse_string(cursor *c, char *out, size_t outlen) {
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return -1;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || *c->p == '\n' || n + 1 >= outlen) return -1;
        out[n++] = *c->p++;
    }
    if (c->p >= c->end) return -1;
    c->p++;
    out[n] = '\0';
    return 0;
}

static int parse_bool(cursor *c, int *v) {
    skip_ws(c);
    size_t left = (size_t)(c->end - c->p);
    if (left >= 4 && memcmp(c->p, "True", 4) == 0)
        *v = 1, c->p += 4;
    else if (left >= 5 && memcmp(c->p, "False", 5) == 0)
        *v = 0, c->p += 5;
    else
        return -1;
    return 0;
}

/* "(3, 4)", "(5,)", "()" -> shape. Returns -1 on bad syntax, -2 on too many dims, -3 on a
 * negative or overflowing dimension. */
static int parse_shape(cursor *c, int64_t shape[NPY_MAX_DIMS], int *ndim) {
    if (!accept_char(c, '(')) return -1;
    int n = 0, trailing_comma = 0;
    for (;;) {
        if (accept_char(c, ')')) break;
        if (n > 0 && !trailing_comma) return -1;
        skip_ws(c);
        if (c->p < c->end && *c->p == '-') return -3;
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') return -1;
        int64_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (v > (INT64_MAX - 9) / 10) return -3;
            v = v * 10 + (*c->p++ - '0');
        }
        if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2 long literal */
        if (n == NPY_MAX_DIMS) return -2;
        shape[n++] = v;
        trailing_comma = accept_char(c, ',');
    }
    if (n == 1 && !trailing_comma) return -1; /* "(5)" is an int in Python, not a tuple */
    *ndim = n;
    return 0;
}

int fp8t_npy_read(const char *path, char descr[16], int *ndim, int64_t shape[8], void **data,
                  size_t *nbytes, char *err, size_t errlen) {
    if (!descr || !ndim || !shape || !data || !nbytes) {
        fp8t_errorf(err, errlen, "fp8t_npy_read: output pointers must not be NULL");
        return -1;
    }
    *data = NULL;
    *nbytes = 0;
    *ndim = 0;
    descr[0] = '\0';
    if (!path || !*path) {
        fp8t_errorf(err, errlen, "cannot read a .npy file with an empty path");
        return -1;
    }
    uint64_t size;
    int fd = fp8t_open_regular(path, &size, err, errlen);
    if (fd < 0) return -1;
    char *header = NULL;
    void *buf = NULL;
    uint8_t pre[12];
    long long got = fp8t_read_full(fd, pre, 8);
    if (got < 0) goto io_error;
    if (got < 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        fp8t_errorf(err, errlen, "%s is not a .npy file (no \\x93NUMPY magic)", path);
        goto fail;
    }
    int major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0) {
        fp8t_errorf(err, errlen, "%s: .npy format version %d.%d is not supported (1.0, 2.0, 3.0)",
                    path, major, minor);
        goto fail;
    }
    size_t len_bytes = major == 1 ? 2 : 4;
    got = fp8t_read_full(fd, pre + 8, len_bytes);
    if (got < 0) goto io_error;
    if ((size_t)got < len_bytes) {
        fp8t_errorf(err, errlen, "%s: truncated .npy file (%llu bytes, no header length)", path,
                    (unsigned long long)size);
        goto fail;
    }
    uint64_t prefix_len = 8 + len_bytes;
    uint64_t hlen = major == 1 ? fp8t_load_le16(pre + 8) : fp8t_load_le32(pre + 8);
    if (hlen > size - prefix_len) {
        fp8t_errorf(err, errlen,
                    "%s: .npy header length %llu exceeds the %llu bytes in the file "
                    "(truncated?)",
                    path, (unsigned long long)hlen, (unsigned long long)(size - prefix_len));
        goto fail;
    }
    if (hlen > NPY_MAX_HEADER) {
        fp8t_errorf(err, errlen, "%s: .npy header length %llu is absurd (corrupt file?)", path,
                    (unsigned long long)hlen);
        goto fail;
    }
    header = malloc((size_t)hlen + 1);
    if (!header) {
        fp8t_errorf(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    got = fp8t_read_full(fd, header, (size_t)hlen);
    if (got < 0) goto io_error;
    if ((uint64_t)got != hlen) {
        fp8t_errorf(err, errlen, "%s: truncated .npy header", path);
        goto fail;
    }
    header[hlen] = '\0';

    /* {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } in any key order */
    cursor c = {header, header + hlen};
    char key[32], dval[16] = {0};
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0, nd = 0;
    int64_t shp[NPY_MAX_DIMS] = {0};
    const char *bad = NULL;
    if (!accept_char(&c, '{')) {
        bad = "does not start with '{'";
        goto bad_header;
    }
    for (;;) {
        if (accept_char(&c, '}')) break;
        if (parse_string(&c, key, sizeof key) != 0 || !accept_char(&c, ':')) {
            bad = "expected a quoted key followed by ':'";
            goto bad_header;
        }
        if (strcmp(key, "descr") == 0 && !have_descr) {
            if (parse_string(&c, dval, sizeof dval) != 0) {
                bad =
                    "'descr' must be a short quoted string (structured dtypes are not supported)";
                goto bad_header;
            }
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            if (parse_bool(&c, &fortran) != 0) {
                bad = "'fortran_order' must be True or False";
                goto bad_header;
            }
            have_order = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            int rc = parse_shape(&c, shp, &nd);
            if (rc == -2) {
                bad = "shape has more than 8 dimensions";
                goto bad_header;
            }
            if (rc == -3) {
                bad = "shape has a negative or huge dimension";
                goto bad_header;
            }
            if (rc != 0) {
                bad = "'shape' must be a tuple of integers such as (3, 4) or (5,)";
                goto bad_header;
            }
            have_shape = 1;
        } else {
            fp8t_errorf(err, errlen, "%s: .npy header: unexpected or repeated key '%s'", path,
                        key);
            goto fail;
        }
        if (!accept_char(&c, ',')) {
            if (accept_char(&c, '}')) break;
            bad = "expected ',' or '}'";
            goto bad_header;
        }
    }
    skip_ws(&c);
    if (c.p != c.end) {
        bad = "unexpected bytes after the dict";
        goto bad_header;
    }
    if (!have_descr || !have_order || !have_shape) {
        bad = "it must have the keys 'descr', 'fortran_order' and 'shape'";
        goto bad_header;
    }
    if (fortran) {
        fp8t_errorf(err, errlen,
                    "%s: Fortran-order arrays are not supported (save with "
                    "np.ascontiguousarray)",
                    path);
        goto fail;
    }
    size_t elem;
    const char *why;
    if (npy_parse_descr(dval, descr, &elem, &why) != 0) {
        fp8t_errorf(err, errlen, "%s: dtype '%s': %s", path, dval, why);
        goto fail;
    }
    uint64_t bytes;
    if (npy_numel(shp, nd, elem, &bytes) != 0) {
        fp8t_errorf(err, errlen, "%s: .npy shape overflows", path);
        goto fail;
    }
    uint64_t avail = size - prefix_len - hlen;
    if (avail != bytes) {
        fp8t_errorf(err, errlen,
                    "%s: the shape and dtype need %llu bytes of data but the file holds "
                    "%llu (%s)",
                    path, (unsigned long long)bytes, (unsigned long long)avail,
                    avail < bytes ? "truncated" : "trailing bytes");
        goto fail;
    }
    buf = malloc(bytes ? (size_t)bytes : 1);
    if (!buf) {
        fp8t_errorf(err, errlen, "%s: out of memory for %llu bytes", path,
                    (unsigned long long)bytes);
        goto fail;
    }
    got = fp8t_read_full(fd, buf, (size_t)bytes);
    if (got < 0) goto io_error;
    if ((uint64_t)got != bytes) {
        fp8t_errorf(err, errlen, "%s: file shrank while being read", path);
        goto fail;
    }
    close(fd);
    free(header);
    *ndim = nd;
    for (int i = 0; i < NPY_MAX_DIMS; i++) shape[i] = i < nd ? shp[i] : 0;
    *data = buf;
    *nbytes = (size_t)bytes;
    return 0;

bad_header:
    fp8t_errorf(err, errlen, "%s: malformed .npy header: %s", path, bad);
    goto fail;
io_error:
    fp8t_errorf(err, errlen, "cannot read %s: %s", path, strerror(errno));
fail:
    descr[0] = '\0';
    free(header);
    free(buf);
    close(fd);
    return -1;
}
