/* The process group of a data-parallel run: MPI when the build has it (FP8T_HAVE_MPI, set by
 * the Makefile from `mpicc --showme`), otherwise a world of one that refuses to be part of a
 * larger job. See include/fp8train/dist.h. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8train/dist.h"
#include "fp8train/error.h"
#include "fp8train/fp8.h"
#include "util/check.h"

#ifdef FP8T_HAVE_MPI
#include <mpi.h>
#endif

static int g_rank = 0, g_size = 1, g_inited = 0;

/* ---------------------------------------------------------------- the launch */

static fp8t_dist_launch g_launch = {1, 0, 300.0};

void fp8t_dist_set_launch(const fp8t_dist_launch *l) {
    g_launch = *l;
    if (g_launch.size < 1) g_launch.size = 1;
    if (g_launch.local_rank < 0) g_launch.local_rank = 0;
    if (!(g_launch.nccl_timeout_s > 0)) g_launch.nccl_timeout_s = 300.0;
}

const fp8t_dist_launch *fp8t_dist_get_launch(void) { return &g_launch; }

int fp8t_dist_have_mpi(void) {
#ifdef FP8T_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

int fp8t_dist_rank(void) { return g_rank; }
int fp8t_dist_size(void) { return g_size; }

#ifdef FP8T_HAVE_MPI

static MPI_Op g_max_nan_op, g_bf16_sum_op;
static MPI_Datatype g_bf16_type;

static void finalize_at_exit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

/* MAX that keeps NaN (MPI_MAX on floats compares with '>', which would drop it): an amax that
 * went NaN on one rank must reach every rank, as it does within one process. */
static void max_nan_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const float *a = in;
    float *b = inout;
    for (int i = 0; i < *len; i++)
        if (isnan(a[i]) || a[i] > b[i]) b[i] = a[i];
}

/* BF16 sum: each addition in FP32, rounded back to BF16 (what a BF16 reduction on the wire
 * does, e.g. NCCL's ncclBfloat16) */
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = bf16_encode(bf16_decode(a[i]) + bf16_decode(b[i]));
}

int fp8t_dist_init(char *err, size_t errlen) {
    if (g_inited) return 0;
    int want = g_launch.size;
    int already = 0;
    MPI_Initialized(&already);
    if (want <= 1 && !already) {
        g_inited = 1; /* a world of one: MPI stays untouched */
        return 0;
    }
    if (!already) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            return fp8t_errorf(err, errlen,
                               "MPI_Init_thread failed (started by mpirun with %d ranks); "
                               "check the MPI installation (mpirun --version)",
                               want);
        }
        atexit(finalize_at_exit);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    MPI_Op_create(max_nan_fn, 1, &g_max_nan_op);
    MPI_Op_create(bf16_sum_fn, 1, &g_bf16_sum_op);
    MPI_Type_contiguous(2, MPI_BYTE, &g_bf16_type);
    MPI_Type_commit(&g_bf16_type);
    /* a rank's FP8T_FATAL stops the whole world (the others would wait in a collective) */
    if (g_size > 1) fp8t_set_fatal_exit(fp8t_dist_abort);
    g_inited = 1;
    return 0;
}

/* MPI counts are ints: larger buffers go in pieces */
#define CHUNK ((size_t)1 << 30)

void fp8t_dist_barrier(void) {
    if (g_size > 1) MPI_Barrier(MPI_COMM_WORLD);
}

void fp8t_dist_bcast(void *buf, size_t bytes, int root) {
    if (g_size <= 1) return;
    for (size_t o = 0; o < bytes; o += CHUNK) {
        size_t n = bytes - o < CHUNK ? bytes - o : CHUNK;
        MPI_Bcast((char *)buf + o, (int)n, MPI_BYTE, root, MPI_COMM_WORLD);
    }
}

void fp8t_dist_allgather(const void *mine, void *all, size_t bytes_each) {
    if (g_size <= 1) {
        memmove(all, mine, bytes_each);
        return;
    }
    if (bytes_each > INT_MAX)
        FP8T_FATAL("allgather of %zu bytes per rank is too large for one MPI call", bytes_each);
    MPI_Allgather(mine, (int)bytes_each, MPI_BYTE, all, (int)bytes_each, MPI_BYTE,
                  MPI_COMM_WORLD);
}

void fp8t_dist_allreduce_f32(float *x, size_t n, fp8t_reduce_op op) {
    if (g_size <= 1) return;
    for (size_t o = 0; o < n; o += CHUNK)
        MPI_Allreduce(MPI_IN_PLACE, x + o, (int)(n - o < CHUNK ? n - o : CHUNK), MPI_FLOAT,
                      op == FP8T_RED_MAX ? g_max_nan_op : MPI_SUM, MPI_COMM_WORLD);
}

void fp8t_dist_allreduce_i32(int *x, size_t n, fp8t_reduce_op op) {
    if (g_size <= 1) return;
    MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_INT, op == FP8T_RED_MAX ? MPI_MAX : MPI_SUM,
                  MPI_COMM_WORLD);
}

void fp8t_dist_allreduce_bf16(uint16_t *x, size_t n) {
    if (g_size <= 1) return;
    for (size_t o = 0; o < n; o += CHUNK)
        MPI_Allreduce(MPI_IN_PLACE, x + o, (int)(n - o < CHUNK ? n - o : CHUNK), g_bf16_type,
                      g_bf16_sum_op, MPI_COMM_WORLD);
}

/* int counts and displacements for the v-collectives */
static void int_counts(const size_t *counts, int *c, int *d) {
    size_t off = 0;
    for (int r = 0; r < g_size; r++) {
        if (counts[r] > INT_MAX || off > INT_MAX)
            FP8T_FATAL("a shard of %zu floats is too large for one MPI call (use more ranks)",
                       counts[r]);
        c[r] = (int)counts[r];
        d[r] = (int)off;
        off += counts[r];
    }
}

void fp8t_dist_reduce_scatter_f32(float *x, const size_t *counts) {
    if (g_size <= 1) return;
    int *c = malloc(2 * sizeof(int) * (size_t)g_size);
    if (!c) FP8T_FATAL("out of memory for the counts of %d ranks", g_size);
    int_counts(counts, c, c + g_size);
    /* MPI_IN_PLACE takes the input from the receive buffer (all of x) and leaves this rank's
     * block at its start: move it to the rank's own range */
    MPI_Reduce_scatter(MPI_IN_PLACE, x, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (c[g_size + g_rank] > 0)
        memmove(x + c[g_size + g_rank], x, (size_t)c[g_rank] * sizeof(float));
    free(c);
}

void fp8t_dist_allgather_f32(float *x, const size_t *counts) {
    if (g_size <= 1) return;
    int *c = malloc(2 * sizeof(int) * (size_t)g_size);
    if (!c) FP8T_FATAL("out of memory for the counts of %d ranks", g_size);
    int_counts(counts, c, c + g_size);
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, c, c + g_size, MPI_FLOAT,
                   MPI_COMM_WORLD);
    free(c);
}

/* The non-blocking sums in flight: MPI wants the request, and a reduce-scatter's counts
 * alive until it completes and its block moved to the rank's range afterwards. */
typedef struct {
    MPI_Request req;
    int *counts; /* reduce-scatter: [2 * size] counts and displacements, else NULL */
    float *x;    /* reduce-scatter: the buffer whose start holds this rank's block */
} pending_op;
static pending_op *g_pending;
static int g_n_pending, g_cap_pending;

static pending_op *new_pending(void) {
    if (g_n_pending == g_cap_pending) {
        int cap = g_cap_pending ? 2 * g_cap_pending : 16;
        pending_op *p = realloc(g_pending, (size_t)cap * sizeof(*p));
        if (!p) FP8T_FATAL("out of memory for %d pending MPI operations", cap);
        g_pending = p, g_cap_pending = cap;
    }
    pending_op *op = &g_pending[g_n_pending++];
    memset(op, 0, sizeof(*op));
    return op;
}

/* MPI advances a non-blocking collective only inside MPI calls (no progress thread in a
 * default OpenMPI): each new start gives the earlier ones a turn, so the buckets move while
 * the backward goes on instead of all at the wait. */
static void poke_pending(void) {
    for (int i = 0; i < g_n_pending; i++) {
        int done = 0;
        if (g_pending[i].req != MPI_REQUEST_NULL)
            MPI_Test(&g_pending[i].req, &done, MPI_STATUS_IGNORE);
    }
}

void fp8t_dist_iallreduce_sum_f32(float *x, size_t n) {
    if (g_size <= 1) return;
    poke_pending();
    for (size_t o = 0; o < n; o += CHUNK)
        MPI_Iallreduce(MPI_IN_PLACE, x + o, (int)(n - o < CHUNK ? n - o : CHUNK), MPI_FLOAT,
                       MPI_SUM, MPI_COMM_WORLD, &new_pending()->req);
}

void fp8t_dist_iallreduce_bf16(uint16_t *x, size_t n) {
    if (g_size <= 1) return;
    poke_pending();
    for (size_t o = 0; o < n; o += CHUNK)
        MPI_Iallreduce(MPI_IN_PLACE, x + o, (int)(n - o < CHUNK ? n - o : CHUNK), g_bf16_type,
                       g_bf16_sum_op, MPI_COMM_WORLD, &new_pending()->req);
}

void fp8t_dist_ireduce_scatter_f32(float *x, const size_t *counts) {
    if (g_size <= 1) return;
    poke_pending();
    int *c = malloc(2 * sizeof(int) * (size_t)g_size);
    if (!c) FP8T_FATAL("out of memory for the counts of %d ranks", g_size);
    int_counts(counts, c, c + g_size);
    pending_op *op = new_pending();
    op->counts = c;
    op->x = x;
    MPI_Ireduce_scatter(MPI_IN_PLACE, x, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &op->req);
}

void fp8t_dist_wait(void) {
    for (int i = 0; i < g_n_pending; i++) {
        pending_op *op = &g_pending[i];
        MPI_Wait(&op->req, MPI_STATUS_IGNORE);
        if (op->counts) { /* as fp8t_dist_reduce_scatter_f32: the block to the rank's range */
            const int *c = op->counts;
            if (c[g_size + g_rank] > 0)
                memmove(op->x + c[g_size + g_rank], op->x, (size_t)c[g_rank] * sizeof(float));
            free(op->counts);
        }
    }
    g_n_pending = 0;
}

void fp8t_dist_abort(int code) {
    int init = 0;
    MPI_Initialized(&init);
    if (init && g_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

#else /* no MPI: a world of one */

int fp8t_dist_init(char *err, size_t errlen) {
    int want = g_launch.size;
    if (want > 1) {
        return fp8t_errorf(
            err, errlen,
            "started as one of %d processes, but this fp8train was built "
            "without MPI: install OpenMPI (apt-get install libopenmpi-dev openmpi-bin) and "
            "rebuild (make clean && make), or run a single process",
            want);
    }
    g_inited = 1;
    return 0;
}

void fp8t_dist_barrier(void) {}
void fp8t_dist_bcast(void *buf, size_t bytes, int root) { (void)buf, (void)bytes, (void)root; }
void fp8t_dist_allgather(const void *mine, void *all, size_t bytes_each) {
    memmove(all, mine, bytes_each);
}
void fp8t_dist_allreduce_f32(float *x, size_t n, fp8t_reduce_op op) {
    (void)x, (void)n, (void)op;
}
void fp8t_dist_allreduce_i32(int *x, size_t n, fp8t_reduce_op op) { (void)x, (void)n, (void)op; }
void fp8t_dist_allreduce_bf16(uint16_t *x, size_t n) { (void)x, (void)n; }
void fp8t_dist_reduce_scatter_f32(float *x, const size_t *counts) { (void)x, (void)counts; }
void fp8t_dist_allgather_f32(float *x, const size_t *counts) { (void)x, (void)counts; }
void fp8t_dist_iallreduce_sum_f32(float *x, size_t n) { (void)x, (void)n; }
void fp8t_dist_iallreduce_bf16(uint16_t *x, size_t n) { (void)x, (void)n; }
void fp8t_dist_ireduce_scatter_f32(float *x, const size_t *counts) { (void)x, (void)counts; }
void fp8t_dist_wait(void) {}
void fp8t_dist_abort(int code) { exit(code); }

#endif
