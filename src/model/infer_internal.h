/* The inference model's private state, shared by src/model/infer*.c (not a public API). */
#ifndef FP8TRAIN_INFER_INTERNAL_H
#define FP8TRAIN_INFER_INTERNAL_H

#include "fp8train/infer.h"

/* How a linear's weight is stored and its GEMM run. */
typedef enum { INF_LIN_F32 = 0, INF_LIN_BF16 = 1, INF_LIN_FP8 = 2 } inf_lin_kind;

/* scalars of an FP8 linear, device floats sc[INF_SC_COUNT]; the two scale_inv the GEMM reads
 * 16 bytes apart from the (aligned) start, as cuBLASLt wants them (else it copies them first) */
enum {
    INF_SC_W_INV = 0, /* dequantization scales (value = code * scale_inv) */
    INF_SC_X_INV = 4,
    INF_SC_W = 8, /* quantization scales */
    INF_SC_X = 9,
    INF_SC_AMAX = 10,  /* current scaling's amax */
    INF_SC_CALIB = 11, /* calibration: the largest input amax seen */
    INF_SC_COUNT = 12
};

/* One linear layer Y[N, out] = X[N, in] · Wᵀ (+ bias). */
typedef struct inf_linear inf_linear;
struct inf_linear {
    inf_lin_kind kind;
    int out, in;
    float *w32;        /* F32: [out, in] */
    uint16_t *w16;     /* BF16: fp8t_bf16_operand data [pad(out), pad(in)] */
    uint8_t *w8;       /* FP8: E4M3 codes [out, in] */
    float *sc;         /* FP8: device [INF_SC_COUNT] */
    const float *bias; /* [out] or NULL (points into the model's FP32 small-tensor buffer) */
    int shared;        /* the weight is another tensor's (a tied head: wte's), not freed here */
    const inf_linear *next; /* the linear whose GEMM a decode step runs after this one's, or
                               NULL (the head) */
};

typedef struct {
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b; /* [C]; the b's NULL for Llama */
    inf_linear qkv, proj;
    inf_linear fc1, fc2;       /* GPT-2 */
    inf_linear gate, up, down; /* Llama */
} inf_layer;

struct fp8t_infer {
    fp8t_backend *be;
    const fp8t_backend_ops *ops;
    fp8t_model_config cfg;
    fp8t_eval_precision prec;
    fp8t_act_scale act;
    int act_static;     /* fp8: every input's scale is fixed (delayed, or calibrated) */
    int calibrating;    /* inside fp8t_infer_calibrate: amaxes recorded */
    char act_desc[128]; /* fp8t_infer_act_desc */
    int B, Tmax, R;     /* R: activation rows (tokens per prefill pass) */
    int RM;             /* rows of one MLP pass (<= R): h1, h2 and opbuf's MLP rows */
    int mlp16;          /* bf16 / fp8: fc1 / gate and up write BF16 values (h1, h2 as
                           uint16_t [RM, H]), which GELU's / SwiGLU's operand pass reads */
    int C, H, V, NH, NKV, HS, QKV;

    float *small;           /* device FP32: wpe, norms, biases, and wte in fp32 (one
                                  allocation) */
    const float *wte, *wpe; /* [V, C] (fp32 only, else NULL), [seq_len, C] (GPT-2) */
    inf_linear emb;         /* bf16 and fp8: wte as a BF16 operand [pad(V), pad(C)]: the
                                  embedding table (embedding_forward_bf16) and a tied head's
                                  weight */
    const float *lnf_w, *lnf_b;
    inf_layer *layer; /* [L] host */
    inf_linear head;

    int kv;                /* fp8t_kv_kind of the cache */
    void *kc, *vc;         /* [L] layers of [B, NKV] blocks each */
    size_t kv_layer_bytes; /* B * NKV * fp8t_kv_head_bytes */
    size_t kv_seq_bytes;   /* NKV * fp8t_kv_head_bytes: one sequence of one layer */

    /* one layer's activations for R rows */
    float *act_mem;    /* the allocation below */
    float *x;          /* [R, C] residual stream */
    float *atty;       /* [R, C] attention output; also the FP32 norm output where a
                                  linear takes FP32 values (it is free at both norms) */
    float *out;        /* [R, C] proj / fc2 / down output (added by the next norm) */
    float *qkv;        /* [R, QKV]; the same memory as out (never live at once) */
    float *h1, *h2;    /* [RM, H]: fc1 (GELU in place); gate (SwiGLU in place), up; with
                          mlp16 as BF16 [RM, H] in the same memory (half of it) */
    float *lse;        /* [R / T sequences, NH, T] of a full-window pass: R * NH */
    float *last;       /* [B, C] the rows whose next token is asked for */
    float *lnl;        /* [B, C] their final norm (FP32 head) */
    float *logits;     /* [B, V] */
    void *opbuf;       /* an activation's BF16 operand or FP8 codes, [R, C] or [RM, H] */
    int *tokens;       /* device [R] */
    int *pos;          /* device [B] */
    float *all_logits; /* [INF_HEAD_ROWS, V] full-window logits, allocated on first use */
    float *losses;     /* [R + 1] per-position losses, then their sum (loss) */
    int *targets;      /* [R] device (loss) */

    /* the decode step's recording (graph_begin/graph_end), for batches of graph_nb */
    int use_graphs;
    void *graph;
    int graph_nb;

    /* prefetch_l2 of the next linear's weight as each GEMM of a decode step starts (at most
       prefetch_bytes of it; 0: off); prefetching: inside a decode step */
    size_t prefetch_bytes;
    int prefetching;

    fp8t_infer_memory mem;
};

/* infer.c: the linears in the order a forward runs their GEMMs (each layer's qkv, proj, fc1,
 * fc2 or gate, up, down, then the head) into lin[INF_LINEARS(m)]; their number */
#define INF_LINEARS(m) ((m)->cfg.n_layer * ((m)->cfg.arch == FP8T_ARCH_GPT2 ? 4 : 5) + 1)
int infer_linears(fp8t_infer *m, inf_linear **lin);
/* the weight's device bytes as its GEMM reads them */
const void *infer_linear_weight(const inf_linear *L, size_t *bytes);

/* full-window head rows per pass (the logits [rows, V] of a loss or forward_all) */
#define INF_HEAD_ROWS 512

/* infer_forward.c: whether the backend makes the MLP's last input operand of kind (BF16, or FP8
 * with its amax-only pass) from BF16 GEMM outputs in one pass: the requests the forward makes,
 * with stand-in pointers; nothing is run */
int infer_mlp16_fused(const fp8t_infer *m, inf_lin_kind kind);

#endif
