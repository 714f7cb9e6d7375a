/* compare internals shared by src/tools/compare*.c. */
#ifndef FP8TRAIN_COMPARE_INTERNAL_H
#define FP8TRAIN_COMPARE_INTERNAL_H

#include "fp8train/compare.h"

#define SQNR_CAP_DB 200.0 /* exact images (1e300 dB) count as this in means */

/* Append a note (fmt with two %s) to r->notes, if there is room. */
void compare_add_note(fp8t_compare_result *r, const char *fmt, const char *a, const char *b);
/* The operand sites whose FP8 error differs most (stats.jsonl of one or both runs). */
void compare_stats(fp8t_compare_result *r, const fp8t_run *a, const fp8t_run *b);
/* Dumped tensors of the same step in both runs, B against A. */
void compare_dumps(fp8t_compare_result *r, const fp8t_run *a, const fp8t_run *b,
                   const fp8t_compare_cfg *cfg);

#endif
