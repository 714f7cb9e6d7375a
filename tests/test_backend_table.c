/* The op table's list of names (FP8T_BACKEND_OPS) and the checks built on it:
 *   - it names every op of fp8t_backend_ops once, in the struct's order (backend.c asserts
 *     the order and the count at compile time; here the names themselves);
 *   - a backend's table with a required op unset is found (fp8t_backend_first_unset_op names
 *     it; the CPU backend has none unset, its graph ops are the optional ones);
 *   - the profile backend wraps every op the CPU backend has. */
#include <stddef.h>
#include <string.h>

#include "fp8train/backend.h"
#include "fp8train/profile.h"
#include "test.h"

typedef fp8t_backend_op_fn op_fn;
#define op_at fp8t_backend_op

static void names_cover_the_table(void) {
    const int n = fp8t_backend_op_count();
    T_CHECK((size_t)n == sizeof(fp8t_backend_ops) / sizeof(op_fn), "%d names for %zu ops", n,
            sizeof(fp8t_backend_ops) / sizeof(op_fn));
    T_CHECK(fp8t_backend_op_name(n) == NULL && fp8t_backend_op_name(-1) == NULL, "past the end");
    for (int i = 0; i < n; i++) {
        const char *a = fp8t_backend_op_name(i);
        T_ASSERT(a && *a, "op %d has no name", i);
        for (int j = 0; j < i; j++)
            T_CHECK(strcmp(a, fp8t_backend_op_name(j)) != 0, "'%s' twice (%d, %d)", a, j, i);
    }
    /* spot checks of the order against the struct's offsets */
    T_CHECK(!strcmp(fp8t_backend_op_name(
                        (int)(offsetof(fp8t_backend_ops, make_operand) / sizeof(op_fn))),
                    "make_operand"),
            "make_operand");
    T_CHECK(!strcmp(fp8t_backend_op_name(
                        (int)(offsetof(fp8t_backend_ops, graph_destroy) / sizeof(op_fn))),
                    "graph_destroy"),
            "graph_destroy");
}

static void unset_ops_are_found(void) {
    char err[256];
    fp8t_backend *cpu = fp8t_backend_create("cpu", NULL, err, sizeof err);
    T_ASSERT(cpu, "cpu: %s", err);
    T_CHECK(fp8t_backend_first_unset_op(cpu->ops) == -1, "the CPU table leaves op '%s' unset",
            fp8t_backend_op_name(fp8t_backend_first_unset_op(cpu->ops)));
    T_CHECK(op_at(cpu->ops, (int)(offsetof(fp8t_backend_ops, graph_begin) / sizeof(op_fn))) ==
                NULL,
            "the CPU backend records no graphs (its graph ops are the optional ones)");
    fp8t_backend_ops t = *cpu->ops;
    t.softmax_xent = NULL;
    const int i = fp8t_backend_first_unset_op(&t);
    T_CHECK(i >= 0 && !strcmp(fp8t_backend_op_name(i), "softmax_xent"), "found %d (%s)", i,
            i >= 0 ? fp8t_backend_op_name(i) : "none");
    fp8t_backend_destroy(cpu);
}

static void profile_wraps_every_op(void) {
    char err[256];
    fp8t_backend *cpu = fp8t_backend_create("cpu", NULL, err, sizeof err);
    T_ASSERT(cpu, "cpu: %s", err);
    fp8t_backend *w = fp8t_profile_wrap(cpu);
    T_ASSERT(w, "the profile backend refused to wrap the CPU backend");
    for (int i = 0; i < fp8t_backend_op_count(); i++)
        if (op_at(cpu->ops, i))
            T_CHECK(op_at(w->ops, i) != NULL, "op '%s' not wrapped", fp8t_backend_op_name(i));
    fp8t_backend_destroy(w); /* destroys the inner backend too */
}

int main(void) {
    t_suite = "backend_table";
    T_RUN(names_cover_the_table);
    T_RUN(unset_ops_are_found);
    T_RUN(profile_wraps_every_op);
    T_MAIN_END();
}
