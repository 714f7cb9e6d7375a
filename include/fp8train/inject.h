/* fp8train — fault injection, the parts beyond the hook interface declared in debug.h:
 * the spec help text and a spec check that needs no model (option parsing, bisect).
 *
 * A fault emulates an FP8 problem in ONE GEMM: it perturbs a tensor in the model hook before
 * that GEMM quantizes it (or its result after the GEMM), or edits the tensor's amax history
 * before the delayed-scaling update. See fp8t_injector_help() for the syntax. */
#ifndef FP8TRAIN_INJECT_H
#define FP8TRAIN_INJECT_H

#include <stddef.h>

#include "fp8train/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Multi-line help for --inject (syntax, kinds, defaults, the when=fp8 modelling rule). */
const char *fp8t_injector_help(void);

/* 0 if spec parses; else -1 and err names the bad key/value and shows the syntax. */
int fp8t_injector_check(const char *spec, char *err, size_t errlen);

/* -1 with err when a fault of inj names a layer (layer=99 on 4 layers) or a module
 * (module=gate on GPT-2) that the model `cfg` does not have, so it could never fire; 0 ok. */
struct fp8t_injector;
int fp8t_injector_check_model(const struct fp8t_injector *inj, const fp8t_model_config *cfg,
                              char *err, size_t errlen);

/* How many perturbations the injector has applied so far (value faults: one per matching
 * tensor per micro-batch; amax faults: one per edited history slot per step). */
struct fp8t_injector;
long fp8t_injector_fired(const struct fp8t_injector *inj);

#ifdef __cplusplus
}
#endif
#endif
