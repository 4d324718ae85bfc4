/* test_builtin_programs.c - every built-in program of the layer parses,
 * verifies, and round-trips through the printer; the declared arguments are
 * the ones the layer binds; the CUDA code generator accepts it. */
#include "harness.h"
#include "codegen/codegen.h"

/* name, then the expected arguments "name:kind:space" (kind as coda_arg_kind_t) */
typedef struct { const char *prog; const char *args[10]; } expect_t;

static const expect_t expected[] = {
    {"resid_norm", {"res:0:0", "g:2:0", "h:4:0", "hg:4:0", "ss:5:0"}},
    {"resid_add", {"res:0:0", "h:4:0"}},
    {"qkv_rope", {"r:1:0", "pos:1:0", "freq:2:-1", "qkv:4:0"}},
    {"gateup_swiglu", {"r:1:0", "c:4:-1"}},
    {"gateup_swiglu_train", {"r:1:0", "z:4:0", "c:4:-1"}},
    {"lmhead_lse", {"r:1:0", "t:1:0", "part:7:0"}},
    {"lmhead_bwd", {"r:1:0", "logz:1:0", "t:1:0", "scale:3:0", "dl:4:0", "s:5:0"}},
    {"swiglu_bwd", {"z:0:1", "dz:4:1", "c:4:0", "s:5:0"}},
    {"rmsnorm_bwd", {"dres:0:0", "x:0:0", "g:2:0", "r:1:0", "s:1:0", "invd:3:0", "dx:4:0", "b:4:0", "dg:6:0"}},
    {"swiglu_bwd_kept", {"z:0:1", "dz:4:1", "s:5:0"}},
};
#define N_EXPECTED ((int)(sizeof expected / sizeof expected[0]))

static void check_args(const coda_program_t *p, const expect_t *e) {
    int n = 0;
    while (n < 10 && e->args[n]) n++;
    CHECK(coda_program_num_args(p) == n, "%s: %d args, expected %d", e->prog, coda_program_num_args(p), n);
    for (int i = 0; i < n && i < coda_program_num_args(p); i++) {
        char name[32];
        int kind, space;
        if (sscanf(e->args[i], "%31[^:]:%d:%d", name, &kind, &space) != 3) continue;
        const char *got;
        coda_arg_kind_t k;
        coda_dtype_t dt;
        coda_space_t sp;
        coda_reduce_t red;
        CHECK_OK(coda_program_arg_info(p, i, &got, &k, &dt, &sp, &red));
        CHECK(strcmp(got, name) == 0, "%s: arg %d is %s, expected %s", e->prog, i, got, name);
        CHECK((int)k == kind, "%s: arg %s kind %d, expected %d", e->prog, name, (int)k, kind);
        if (kind == CODA_IN_TILE || kind == CODA_IN_COL || kind == CODA_OUT_TILE || kind == CODA_OUT_COLRED)
            CHECK((int)sp == space, "%s: arg %s space %d, expected %d", e->prog, name, (int)sp, space);
        CHECK(coda_program_find_arg(p, name) == i, "%s: find_arg(%s)", e->prog, name);
    }
}

int main(void) {
    const char *const *names = coda_builtin_program_names();
    CHECK(names != NULL, "names list is NULL");
    int count = 0;
    while (names && names[count]) count++;
    CHECK(count == N_EXPECTED, "%d built-in programs, expected %d", count, N_EXPECTED);
    CHECK(coda_builtin_program(NULL) == NULL, "NULL name must give NULL");
    CHECK(coda_builtin_program("no_such_program") == NULL, "unknown name must give NULL");
    CHECK(coda_builtin_program("") == NULL, "empty name must give NULL");

    for (int i = 0; i < count; i++) {
        for (int j = 0; j < i; j++) CHECK(strcmp(names[i], names[j]) != 0, "duplicate name %s", names[i]);
        const char *text = coda_builtin_program(names[i]);
        CHECK(text && *text, "%s: no text", names[i]);
        if (!text) continue;
        coda_program_t *p = NULL, *q = NULL;
        CHECK_OK(coda_program_parse(text, &p));
        if (!p) continue;

        /* print, parse the printed text, print again: same text */
        size_t len = 0, cap = 1 << 16;
        char *buf1 = h_alloc(cap), *buf2 = h_alloc(cap);
        CHECK_OK(coda_program_print(p, buf1, cap, &len));
        CHECK(len == strlen(buf1), "%s: print length %zu, text %zu", names[i], len, strlen(buf1));
        CHECK(strstr(buf1, names[i]) != NULL, "%s: printed text lacks the program name", names[i]);
        CHECK_OK(coda_program_parse(buf1, &q));
        if (q) {
            size_t len2 = 0;
            CHECK_OK(coda_program_print(q, buf2, cap, &len2));
            CHECK(len2 == len && strcmp(buf1, buf2) == 0, "%s: print(parse(print(p))) differs:\n%s\n---\n%s",
                  names[i], buf1, buf2);
            CHECK(coda_program_num_args(q) == coda_program_num_args(p), "%s: arg count changed", names[i]);
        }
        /* too small a buffer: error, terminated prefix */
        if (len > 4) {
            char small[4];
            CHECK_STATUS(coda_program_print(p, small, sizeof small, NULL), CODA_ERR_INVALID_ARG);
            CHECK(memchr(small, 0, sizeof small) != NULL, "%s: truncated print not terminated", names[i]);
        }
        for (int e = 0; e < N_EXPECTED; e++)
            if (strcmp(expected[e].prog, names[i]) == 0) check_args(p, &expected[e]);
        /* the GPU code generator takes it (NVRTC compiles are tested with the CUDA backend) */
        char *cu = NULL;
        CHECK_OK(coda__codegen_cuda(p, &cu));
        CHECK(cu && strstr(cu, "coda_epi_pair"), "%s: generated CUDA C lacks coda_epi_pair", names[i]);
        free(cu);
        printf("%-20s %2d args, %4zu bytes printed: parse, verify, print round trip, codegen ok\n", names[i],
               coda_program_num_args(p), len);
        free(buf1);
        free(buf2);
        coda_program_free(p);
        coda_program_free(q);
    }
    /* each expected program is present */
    for (int e = 0; e < N_EXPECTED; e++)
        CHECK(coda_builtin_program(expected[e].prog) != NULL, "missing built-in %s", expected[e].prog);
    TEST_MAIN_END();
}
