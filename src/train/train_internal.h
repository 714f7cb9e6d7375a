/* Private helpers shared by the files of src/train. */
#ifndef FP8TRAIN_TRAIN_INTERNAL_H
#define FP8TRAIN_TRAIN_INTERNAL_H

#include <stddef.h>

#include "util/fmt.h" /* fp8t_fmt */

#define FP8T_TRAIN_PATH_BUF 4096

#endif
