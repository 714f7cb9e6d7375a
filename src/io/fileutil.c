/* fp8train — file helpers: atomic writes (temp name + fsync + rename), whole-file reads,
 * mkdir -p and rm -rf. */
#include "fp8train/io.h"
#include "io/io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fp8t_open_regular(const char *path, uint64_t *size, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fp8t_errorf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        fp8t_errorf(err, errlen, "cannot read %s: not a regular file", path);
        close(fd);
        return -1;
    }
    *size = (uint64_t)st.st_size;
    return fd;
}

long long fp8t_read_full(int fd, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    return (long long)got;
}

/* ---- atomic writes ---- */

int fp8t_atomic_open(fp8t_atomic_file *a, const char *path, char *err, size_t errlen) {
    a->fd = -1;
    a->path = a->tmp_path = NULL;
    if (!path || !*path) {
        fp8t_errorf(err, errlen, "cannot write a file with an empty path");
        return -1;
    }
    size_t n = strlen(path) + 32;
    a->path = strdup(path);
    a->tmp_path = malloc(n);
    if (!a->path || !a->tmp_path) {
        fp8t_errorf(err, errlen, "%s: out of memory", path);
        fp8t_atomic_abort(a);
        return -1;
    }
    snprintf(a->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    a->fd = open(a->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (a->fd < 0) {
        fp8t_errorf(err, errlen,
                    "cannot create %s (temporary file for %s): %s (does the directory "
                    "exist and is it writable?)",
                    a->tmp_path, path, strerror(errno));
        free(a->path);
        free(a->tmp_path);
        a->path = a->tmp_path = NULL;
        return -1;
    }
    return 0;
}

void fp8t_atomic_abort(fp8t_atomic_file *a) {
    if (a->fd >= 0) close(a->fd);
    a->fd = -1;
    if (a->tmp_path) unlink(a->tmp_path);
    free(a->tmp_path);
    free(a->path);
    a->tmp_path = a->path = NULL;
}

int fp8t_atomic_write(fp8t_atomic_file *a, const void *data, size_t len, char *err,
                      size_t errlen) {
    if (a->fd < 0) {
        fp8t_errorf(err, errlen, "%s: write to a file that is not open",
                    a->path ? a->path : "(unknown)");
        return -1;
    }
    const char *p = (const char *)data;
    while (len > 0) {
        ssize_t n = write(a->fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            fp8t_errorf(err, errlen, "cannot write %s: %s", a->tmp_path, strerror(errno));
            fp8t_atomic_abort(a);
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* fsync the directory holding path so that the rename itself survives a power loss. Not every
 * file system supports it; failures are ignored (the data itself was already synced). */
static void fsync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash)
        dir = strdup(".");
    else if (slash == path)
        dir = strdup("/");
    else
        dir = strndup(path, (size_t)(slash - path));
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

int fp8t_atomic_commit(fp8t_atomic_file *a, char *err, size_t errlen) {
    if (a->fd < 0) {
        fp8t_errorf(err, errlen, "%s: commit of a file that is not open",
                    a->path ? a->path : "(unknown)");
        fp8t_atomic_abort(a);
        return -1;
    }
    if (fsync(a->fd) != 0) {
        fp8t_errorf(err, errlen, "cannot fsync %s: %s", a->tmp_path, strerror(errno));
        fp8t_atomic_abort(a);
        return -1;
    }
    int rc = close(a->fd);
    a->fd = -1;
    if (rc != 0) {
        fp8t_errorf(err, errlen, "cannot close %s: %s", a->tmp_path, strerror(errno));
        fp8t_atomic_abort(a);
        return -1;
    }
    if (rename(a->tmp_path, a->path) != 0) {
        fp8t_errorf(err, errlen, "cannot rename %s to %s: %s", a->tmp_path, a->path,
                    strerror(errno));
        fp8t_atomic_abort(a);
        return -1;
    }
    fsync_parent_dir(a->path);
    free(a->tmp_path);
    free(a->path);
    a->tmp_path = a->path = NULL;
    return 0;
}

int fp8t_write_file_atomic(const char *path, const void *data, size_t len, char *err,
                           size_t errlen) {
    if (!data && len > 0) {
        fp8t_errorf(err, errlen, "%s: no data given for %zu bytes", path ? path : "(null)", len);
        return -1;
    }
    fp8t_atomic_file a;
    if (fp8t_atomic_open(&a, path, err, errlen) != 0) return -1;
    if (len > 0 && fp8t_atomic_write(&a, data, len, err, errlen) != 0) return -1;
    return fp8t_atomic_commit(&a, err, errlen);
}

/* ---- reading ---- */

int fp8t_read_file(const char *path, char **data, size_t *len, char *err, size_t errlen) {
    if (!data || !len) {
        fp8t_errorf(err, errlen, "fp8t_read_file: data and len must not be NULL");
        return -1;
    }
    *data = NULL;
    *len = 0;
    if (!path || !*path) {
        fp8t_errorf(err, errlen, "cannot read a file with an empty path");
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fp8t_errorf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fp8t_errorf(err, errlen, "cannot stat %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        fp8t_errorf(err, errlen, "cannot read %s: it is a directory", path);
        close(fd);
        return -1;
    }
    /* Sized from fstat for regular files, grown as needed otherwise (pipes, /proc files). */
    size_t cap = (S_ISREG(st.st_mode) && st.st_size > 0) ? (size_t)st.st_size + 1 : 4096;
    char *buf = malloc(cap);
    size_t used = 0;
    for (;;) {
        if (!buf) {
            fp8t_errorf(err, errlen, "%s: out of memory reading %zu bytes", path, cap);
            close(fd);
            return -1;
        }
        if (used + 1 >= cap) {
            char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!nb) free(buf);
            buf = nb;
            cap *= 2;
            continue;
        }
        ssize_t n = read(fd, buf + used, cap - 1 - used);
        if (n < 0) {
            if (errno == EINTR) continue;
            fp8t_errorf(err, errlen, "cannot read %s: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return -1;
        }
        if (n == 0) break;
        used += (size_t)n;
    }
    close(fd);
    buf[used] = '\0';
    *data = buf;
    *len = used;
    return 0;
}

/* ---- directories ---- */

static int mkdir_one(const char *dir, const char *full, char *err, size_t errlen) {
    if (mkdir(dir, 0777) == 0) return 0;
    int e = errno;
    struct stat st;
    if (e == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    if (e == EEXIST)
        fp8t_errorf(err, errlen, "cannot create directory %s: %s exists and is not a directory",
                    full, dir);
    else
        fp8t_errorf(err, errlen, "cannot create directory %s: mkdir %s: %s", full, dir,
                    strerror(e));
    return -1;
}

int fp8t_mkdirs(const char *path, char *err, size_t errlen) {
    if (!path || !*path) {
        fp8t_errorf(err, errlen, "cannot create a directory with an empty path");
        return -1;
    }
    char *buf = strdup(path);
    if (!buf) {
        fp8t_errorf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    /* Create every prefix that ends just before a '/', then the whole path. */
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/' || p[-1] == '/') continue;
        *p = '\0';
        int rc = mkdir_one(buf, path, err, errlen);
        *p = '/';
        if (rc != 0) {
            free(buf);
            return -1;
        }
    }
    int rc = mkdir_one(buf, path, err, errlen);
    free(buf);
    return rc;
}

static int rmtree_entry(const char *fpath, const struct stat *sb, int typeflag, struct FTW *ftw) {
    (void)sb;
    (void)typeflag;
    (void)ftw;
    return remove(fpath) == 0 ? 0 : -1;
}

/* rm -rf: a path that does not exist is not an error (there is nothing to replace). */
int fp8t_rmtree(const char *path) {
    if (!path || !*path) return -1;
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path) == 0 ? 0 : -1;
    /* FTW_DEPTH: children before their directory; FTW_PHYS: never follow symlinks out. */
    return nftw(path, rmtree_entry, 32, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}
