/* Learning-rate schedule: linear warmup, then cosine decay to lr * min_lr_frac. */
#include <math.h>

#include "train/trainer_internal.h"

float fp8t_lr_at(const fp8t_train_config *c, int t) {
    const double lr = c->lr, lr_min = (double)c->lr * c->min_lr_frac;
    if (c->warmup > 0 && t <= c->warmup) return (float)(lr * t / c->warmup);
    int span = c->steps - c->warmup;
    double progress = span > 0 ? (double)(t - c->warmup) / span : 1.0;
    if (progress < 0) progress = 0;
    if (progress > 1) progress = 1;
    return (float)(lr_min + 0.5 * (lr - lr_min) * (1.0 + cos(M_PI * progress)));
}
