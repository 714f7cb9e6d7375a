/* fp8train — what a path names, asked with stat(2): so symbolic links are followed (a link
 * to a directory is a directory) and a broken link does not exist. Each answers 0 for "no"
 * and for "cannot tell" (permission denied, name too long) alike; callers that must tell
 * those apart open the file and report errno. Private to the library (src/). */
#ifndef FP8TRAIN_UTIL_FS_H
#define FP8TRAIN_UTIL_FS_H

/* 1 when path names anything at all (file, directory, device, ...), else 0. */
int fp8t_path_exists(const char *path);
/* 1 when path names a regular file, else 0. */
int fp8t_is_regular_file(const char *path);
/* 1 when path names a directory, else 0. */
int fp8t_is_dir(const char *path);

#endif
