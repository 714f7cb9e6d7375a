/* fp8t_path_exists, fp8t_is_regular_file, fp8t_is_dir: see src/util/fs.h. */
#include "util/fs.h"

#include <sys/stat.h>

int fp8t_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int fp8t_is_regular_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int fp8t_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}
