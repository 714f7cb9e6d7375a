/* `fp8train train`: parse the options (command line, --config file, environment) and run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fp8train/dist.h"
#include "fp8train/error.h"
#include "fp8train/train.h"
#include "fp8train/train_options.h"

/* Exit status: 0 done, 1 failed during training (e.g. a checkpoint could not be written),
 * 2 bad usage or bad input (nothing run), 3 stopped by the NaN/Inf detector. */
int fp8t_cmd_train(int argc, char **argv) {
    fp8t_train_config *c = malloc(sizeof(*c));
    char err[FP8T_ERR_LEN] = "";
    if (!c) {
        fprintf(stderr, "fp8train train: out of memory\n");
        return 1;
    }
    int rc = fp8t_train_parse_args(c, argc, argv, err, sizeof(err));
    if (rc == 1 || rc == 2) {
        if (rc == 1)
            fp8t_train_options_help(stdout);
        else
            fp8t_train_options_list(stdout);
        free(c);
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "fp8train train: %s\n", err);
        free(c);
        return 2;
    }
    fp8t_train_result res;
    if (fp8t_train_run(c, &res, err, sizeof(err)) != 0) {
        fprintf(stderr, "fp8train train: %s\n", err);
        free(c);
        return res.last_step > 0 ? 1 : 2;
    }
    int status = 0;
    if (res.reason == FP8T_STOP_NAN && fp8t_dist_rank() != 0) {
        status = 3; /* rank 0 says it */
    } else if (res.reason == FP8T_STOP_NAN) {
        fprintf(stderr,
                "fp8train train: stopped at step %d by a non-finite loss; see %s/events.jsonl\n",
                res.last_step + 1, c->out_dir);
        status = 3;
    } else if (!c->quiet && fp8t_dist_rank() == 0) { /* one summary for a data-parallel run */
        printf("done: step %d, loss %.4f", res.last_step, res.last_loss);
        if (isfinite(res.last_val_loss)) printf(", val %.4f", res.last_val_loss);
        printf(", %.0f tok/s, %d event%s; run in %s\n", res.tokens_per_s, res.n_events,
               res.n_events == 1 ? "" : "s", c->out_dir);
    }
    free(c);
    return status;
}
