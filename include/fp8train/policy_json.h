/* fp8train — the precision policy's JSON form, the canonical saved policy (config.json, a
 * checkpoint's state.json); implemented by the train layer (src/train/policy_json.c). */
#ifndef FP8TRAIN_POLICY_JSON_H
#define FP8TRAIN_POLICY_JSON_H

#include <stddef.h>

#include "fp8train/policy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Serialize to / parse from a JSON object string. to_json returns a malloc'd string (NULL when
 * out of memory); from_json: 0 ok, -1 with err naming the key and what it expected. */
char *fp8t_policy_to_json(const fp8t_policy *p);
int fp8t_policy_from_json(fp8t_policy *p, const char *json, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
