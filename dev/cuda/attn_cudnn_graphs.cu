/* dev/cuda/attn_cudnn_graphs.cu — the cuDNN SDPA operation graphs of
 * src/backend/cuda/cuda_attention_cudnn.cu, built and finalized on the host: every tensor,
 * operation and the operation graph itself, for the forward and both backward forms
 * (deterministic and atomic dq), at the shapes the backend meets (multi-head and grouped-query,
 * head sizes 32/64/128, T not a multiple of 64). No GPU is needed: cuDNN checks the graph's
 * attributes, types and shapes at finalize time without a handle, so a wrong attribute fails
 * here, named, instead of costing a GPU session. What it cannot check without a GPU is whether
 * a fused-attention engine takes the graph (the heuristics and the plan): that is
 * `build/gpu_test --attn-bench` and the FP8TRAIN_CUDA_ATTN=cudnn rows of `make gpu-test`.
 *
 * Built by `make` with the other dev tools when cuDNN is present (links -lcudnn); run:
 *   build/dev/cuda/attn_cudnn_graphs      (exit status 0 when every graph finalizes) */
#include "../../src/backend/cuda/cuda_attention_cudnn.cu"

/* the backend's scratch allocator, never reached here (nothing executes) */
void *cuda_scratch(fp8t_backend *b, int slot, size_t bytes) {
    (void)b, (void)slot, (void)bytes;
    return NULL;
}

int main(void) {
#ifdef FP8T_HAVE_CUDNN
    static const int shapes[][5] = {
        /* B, NH, NKV, T, HS */
        {8, 16, 16, 2048, 128}, {16, 32, 8, 1024, 64}, {1, 4, 2, 100, 128}, {2, 6, 2, 64, 64},
        {1, 4, 1, 130, 64},     {2, 3, 3, 17, 32},     {1, 1, 1, 1, 32}};
    int fails = 0;
    printf("cuDNN %zu (built against %d)\n", cudnnGetVersion(), CUDNN_VERSION);
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        const int *sh = shapes[i];
        const sdpa_dims z = {sh[0],
                             sh[1],
                             sh[2],
                             sh[3],
                             sh[4],
                             (int64_t)(sh[1] + 2 * sh[2]) * sh[4],
                             (int64_t)sh[1] * sh[4]};
        static const char *names[3] = {"forward", "backward (deterministic)",
                                       "backward (atomic dq)"};
        for (int k = 0; k < 3; k++) {
            cudnnBackendDescriptor_t desc[SDPA_MAX_DESC];
            sdpa_graph g;
            memset(&g, 0, sizeof(g));
            g.desc = desc, g.next_uid = UID_VIRTUAL, g.what = names[k];
            int rc = k == 0 ? build_fwd_ops(&g, &z) : build_bwd_ops(&g, &z, k == 1);
            cudnnBackendDescriptor_t og = NULL;
            if (!rc) { /* the operation graph without a handle (the plan needs one) */
                cudnnStatus_t st =
                    cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &og);
                if (st == CUDNN_STATUS_SUCCESS)
                    st = cudnnBackendSetAttribute(og, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops, g.ops);
                if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(og);
                if (st != CUDNN_STATUS_SUCCESS) rc = sdpa_fail(&g, "operation graph", st);
            }
            printf("%-4s B%-2d NH%-2d NKV%-2d T%-4d HS%-3d %-24s %2d operations%s%s\n",
                   rc ? "FAIL" : "ok", sh[0], sh[1], sh[2], sh[3], sh[4], names[k], g.nops,
                   rc ? ": " : "", rc ? g.err : "");
            fails += rc != 0;
            if (og) cudnnBackendDestroyDescriptor(og);
            for (int j = g.ndesc - 1; j >= 0; j--) cudnnBackendDestroyDescriptor(desc[j]);
        }
    }
    printf("%s\n", fails ? "some graphs did not finalize" : "every graph finalized");
    return fails ? 1 : 0;
#else
    printf("built without cuDNN: nothing to check\n");
    return 0;
#endif
}
