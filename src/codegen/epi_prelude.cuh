/* epi_prelude.cuh - the device code every generated epilogue starts with:
 * src/codegen/epilogue_cuda.c puts it in front of the code it generates
 * (the build embeds this file as a string, tools/embed.c).
 *
 * The text then goes into the GEMM kernel between gemm_wgmma.cuh and
 * gemm_mainloop.cuh, or into the test harness (tests/codegen_harness.h),
 * both behind src/cuda/kernels/probes.cuh (the predicates CG_LD_OK,
 * CG_ST_OK, CG_PART_OK); it needs no CUDA header (NVRTC compiles it
 * bare). In it:
 *   coda_epi_params    the parameter block, the mirror of coda_epi_params_t
 *                      (src/codegen/codegen.h): one pointer, two strides and
 *                      one scalar per program argument, M and N, then each
 *                      argument's dim-1 extent (an in rowpart's T)
 *   cg_ld*, cg_st*     global loads (of read-only inputs) and stores; the
 *                      predicated forms (cg_ld*p, cg_st*) have no branch
 *   cg_lds*, cg_sts*   the warp's shared-memory slab (the N16 form)
 *   math               bf16 rounding, division, sigmoid and silu, sin and
 *                      cos, the online log-sum-exp
 * Helpers are named cg_ so that they cannot collide with the kernel's
 * coda_ ones. */
#ifndef CODA_EPI_PRELUDE
#define CODA_EPI_PRELUDE
/* offsetof for the layout checks below: NVRTC has neither <stddef.h> nor
 * __builtin_offsetof, and __INTADDR__ (a builtin of its EDG front end) is
 * what folds a member's address to a constant there. */
#ifndef CODA_OFFSETOF
#define CODA_OFFSETOF(T, f) __INTADDR__(&((T *)0)->f)
#endif
struct coda_epi_params {
    unsigned long long ptr[16];
    long long s0[16];
    long long s1[16];
    float scalar[16];
    int m, n;
    int e1[16]; /* last: kernels that do not read it are unchanged */
};
/* codegen.h asserts the same numbers for coda_epi_params_t */
static_assert(CODA_OFFSETOF(coda_epi_params, s0) == 128 && CODA_OFFSETOF(coda_epi_params, s1) == 256 &&
                  CODA_OFFSETOF(coda_epi_params, scalar) == 384 && CODA_OFFSETOF(coda_epi_params, m) == 448 &&
                  CODA_OFFSETOF(coda_epi_params, n) == 452 && CODA_OFFSETOF(coda_epi_params, e1) == 456 &&
                  sizeof(coda_epi_params) == 520,
              "coda_epi_params: the layout of coda_epi_params_t (src/codegen/codegen.h)");
/* the kernel's fragment geometry (src/cuda/kernels/gemm_mainloop.cuh):
 * CODA_WG_MH 64-row blocks per thread, 2 rows and CODA_BN / 8 column
 * pairs in each */
#ifndef CODA_WG_MH
#define CODA_WG_MH 1
#endif
#define CODA_EPI_ROW_SLOTS (2 * CODA_WG_MH)
#define CODA_EPI_COL_SLOTS (CODA_BN / 8 * CODA_WG_MH)
#define CODA_EPI_TILE_N CODA_BN
/* row of slot rs = 2 mh + h for a thread whose first row is row0 */
#define CG_SLOT_ROW(row0, rs) ((row0) + 8 * ((rs) & 1) + 64 * ((rs) >> 1))
/* A barrier over the consumer threads of one tile (column partials in
 * coda_epi_end); gemm_prelude.cuh defines it for the kernel (and the
 * stand-in harness, which includes it); anything else gets
 * __syncthreads, right for one 256-thread block a tile. */
#ifndef CODA_EPI_TILE_SYNC
#define CODA_EPI_TILE_SYNC(t) __syncthreads()
#endif
#ifndef CODA_EPI_STAGE /* 1: the kernel gives each warp a staging slab (t.stage) */
#define CODA_EPI_STAGE 0
#endif
/* 1: column vectors are copied into the slab before the k-loop (N16 and
 * RING forms), so that the k-loop hides their loads' latency */
#if CODA_EPI_STAGE
#define CG_COL_SLAB 1
#else
#define CG_COL_SLAB 0
#endif
static __device__ __forceinline__ float cg_bf16_to_f32(unsigned short h) {
    return __uint_as_float(((unsigned)h) << 16);
}
/* round to nearest even, NaN stays NaN: one cvt instruction */
static __device__ __forceinline__ unsigned short cg_f32_to_bf16(float f) {
    unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
static __device__ __forceinline__ float cg_round_bf16(float f) {
    return cg_bf16_to_f32(cg_f32_to_bf16(f));
}
/* Inputs are read-only for the whole kernel (the front end refuses outputs
 * that overlap them), so their loads use the non-coherent path, and as asm
 * without a memory clobber the compiler may hoist them above the stores of
 * earlier pairs: the loads of many pairs are in flight at once. */
static __device__ __forceinline__ unsigned cg_ld16(const void *p) {
    unsigned short v; asm("ld.global.nc.b16 %0, [%1];" : "=h"(v) : "l"(p)); return v;
}
static __device__ __forceinline__ unsigned cg_ld32(const void *p) {
    unsigned v; asm("ld.global.nc.b32 %0, [%1];" : "=r"(v) : "l"(p)); return v;
}
/* The same, volatile: coda_epi_preload's loads stay where they are issued,
 * before the tile's k-loop, instead of sinking to their use. */
static __device__ __forceinline__ unsigned cg_ld16v(const void *p) {
    unsigned short v; asm volatile("ld.global.nc.b16 %0, [%1];" : "=h"(v) : "l"(p)); return v;
}
static __device__ __forceinline__ unsigned cg_ld32v(const void *p) {
    unsigned v; asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(v) : "l"(p)); return v;
}
static __device__ __forceinline__ void cg_ld64(const void *p, unsigned *a, unsigned *b) {
    asm("ld.global.nc.v2.b32 {%0, %1}, [%2];" : "=r"(*a), "=r"(*b) : "l"(p));
}
static __device__ __forceinline__ void cg_ld128(const void *p, unsigned *a, unsigned *b, unsigned *c, unsigned *d) {
    asm("ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(*a), "=r"(*b), "=r"(*c), "=r"(*d) : "l"(p));
}
/* Loads predicated on ok (0 when off): the address needs no clamping, so
 * the pairs of a row share one base address and immediate offsets.
 * CG_LD_OK, CG_ST_OK, CG_PART_OK: the predicates as the measurement
 * probes leave them (src/cuda/kernels/probes.cuh). */
static __device__ __forceinline__ unsigned cg_ld16p(int ok, const void *p) {
    unsigned short v; asm("{ .reg .pred q; setp.ne.s32 q, %2, 0; mov.b16 %0, 0; @q ld.global.nc.b16 %0, [%1]; }"
                          : "=h"(v) : "l"(p), "r"(CG_LD_OK(ok))); return v;
}
static __device__ __forceinline__ unsigned cg_ld32p(int ok, const void *p) {
    unsigned v; asm("{ .reg .pred q; setp.ne.s32 q, %2, 0; mov.b32 %0, 0; @q ld.global.nc.b32 %0, [%1]; }"
                    : "=r"(v) : "l"(p), "r"(CG_LD_OK(ok))); return v;
}
static __device__ __forceinline__ void cg_ld64p(int ok, const void *p, unsigned *a, unsigned *b) {
    asm("{ .reg .pred q; setp.ne.s32 q, %3, 0; mov.b32 %0, 0; mov.b32 %1, 0;\n\t"
        "@q ld.global.nc.v2.b32 {%0, %1}, [%2]; }" : "=r"(*a), "=r"(*b) : "l"(p), "r"(CG_LD_OK(ok)));
}
static __device__ __forceinline__ void cg_ld128p(int ok, const void *p, unsigned *a, unsigned *b, unsigned *c,
                                                 unsigned *d) {
    asm("{ .reg .pred q; setp.ne.s32 q, %5, 0; mov.b32 %0, 0; mov.b32 %1, 0; mov.b32 %2, 0; mov.b32 %3, 0;\n\t"
        "@q ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4]; }"
        : "=r"(*a), "=r"(*b), "=r"(*c), "=r"(*d) : "l"(p), "r"(CG_LD_OK(ok)));
}
static __device__ __forceinline__ float cg_lo(unsigned u) { return __uint_as_float(u << 16); }
static __device__ __forceinline__ float cg_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
/* a (lower address) and b as packed bf16x2 */
static __device__ __forceinline__ unsigned cg_pack(float a, float b) {
    unsigned u; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(b), "f"(a)); return u;
}
/* Conversions run on a narrow pipe (a warp instruction holds it for
 * several cycles), so round_bf16 converts two values at once (one
 * conversion, where one a value and a repacking one measured slower) and
 * returns the packed word, which a store of the rounded values writes as
 * it is (packing the rounded floats again took a byte permute a word). */
static __device__ __forceinline__ unsigned cg_round_bf16x2(float a, float b, float &ra, float &rb) {
    const unsigned u = cg_pack(a, b);
    ra = cg_lo(u);
    rb = cg_hi(u);
    return u;
}
/* Stores predicated on ok, with no branch: an if around each store (or
 * a division's slow path) cuts the pair code into small basic blocks, and
 * ptxas then cannot interleave the pairs' dependency chains - the
 * epilogue ran at a fraction of its issue rate. */
static __device__ __forceinline__ void cg_st16(int ok, void *p, unsigned short v) {
    asm volatile("{ .reg .pred q; setp.ne.s32 q, %0, 0; @q st.global.b16 [%1], %2; }"
                 :: "r"(CG_ST_OK(ok)), "l"(p), "h"(v) : "memory");
}
static __device__ __forceinline__ void cg_st32(int ok, void *p, unsigned v) {
    asm volatile("{ .reg .pred q; setp.ne.s32 q, %0, 0; @q st.global.b32 [%1], %2; }"
                 :: "r"(CG_ST_OK(ok)), "l"(p), "r"(v) : "memory");
}
static __device__ __forceinline__ void cg_st64(int ok, void *p, unsigned a, unsigned b) {
    asm volatile("{ .reg .pred q; setp.ne.s32 q, %0, 0; @q st.global.v2.b32 [%1], {%2, %3}; }"
                 :: "r"(CG_ST_OK(ok)), "l"(p), "r"(a), "r"(b) : "memory");
}
static __device__ __forceinline__ void cg_st128(int ok, void *p, unsigned a, unsigned b, unsigned c,
                                                unsigned d) {
    asm volatile("{ .reg .pred q; setp.ne.s32 q, %0, 0; @q st.global.v4.b32 [%1], {%2, %3, %4, %5}; }"
                 :: "r"(CG_ST_OK(ok)), "l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
static __device__ __forceinline__ void cg_sts16(unsigned a, unsigned short v) {
    asm volatile("st.shared.b16 [%0], %1;" :: "r"(a), "h"(v) : "memory");
}
static __device__ __forceinline__ void cg_sts32(unsigned a, unsigned v) {
    asm volatile("st.shared.b32 [%0], %1;" :: "r"(a), "r"(v) : "memory");
}
static __device__ __forceinline__ void cg_sts64(unsigned a, unsigned v0, unsigned v1) {
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};" :: "r"(a), "r"(v0), "r"(v1) : "memory");
}
static __device__ __forceinline__ void cg_sts128(unsigned a, unsigned v0, unsigned v1, unsigned v2, unsigned v3) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" :: "r"(a), "r"(v0), "r"(v1), "r"(v2),
                 "r"(v3) : "memory");
}
/* A warp's fragment words to and from shared memory, four 8 x 8 b16
 * matrices an instruction (ldmatrix / stmatrix, sm_90): lane l gives the
 * address of row l % 8 of matrix l / 8, and word i of lane l is row l / 4,
 * bytes 4 (l % 4) .. +3 of matrix i: the accumulator fragment's pair
 * layout. One instruction moves what four 4-byte ld/st.shared move (the
 * same bytes through the shared-memory pipe, a quarter of the issue
 * slots). CG_LDSM (where the kernel has slabs): staged and ring inputs,
 * column vectors in the slab and staged outputs of 4-byte pairs go this
 * way. */
#if CODA_EPI_STAGE
#define CG_LDSM 1
#else
#define CG_LDSM 0
#endif
#if CG_LDSM && defined(CODA_EPI_STORE_C) && CODA_EPI_STORE_C
#error "the C-store path fetches pair by pair (coda_epi_fetch), which leaves the ldmatrix inputs unread"
#endif
static __device__ __forceinline__ void cg_ldsm4(unsigned a, unsigned &v0, unsigned &v1, unsigned &v2, unsigned &v3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(a) : "memory");
}
static __device__ __forceinline__ void cg_stsm4(unsigned a, unsigned v0, unsigned v1, unsigned v2, unsigned v3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                 :: "r"(a), "r"(v0), "r"(v1), "r"(v2), "r"(v3) : "memory");
}
static __device__ __forceinline__ unsigned cg_lds16(unsigned a) {
    unsigned short v; asm volatile("ld.shared.b16 %0, [%1];" : "=h"(v) : "r"(a) : "memory"); return v;
}
static __device__ __forceinline__ unsigned cg_lds32(unsigned a) {
    unsigned v; asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(a) : "memory"); return v;
}
static __device__ __forceinline__ void cg_lds64(unsigned a, unsigned *v) {
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(v[0]), "=r"(v[1]) : "r"(a) : "memory");
}
static __device__ __forceinline__ void cg_lds128(unsigned a, unsigned *v) {
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]),
                 "=r"(v[3]) : "r"(a) : "memory");
}
/* Asynchronous copies into shared memory (cp.async, 16 bytes; bytes past
 * `n` of them are zero-filled): the column vectors' tile slices, copied
 * before the k-loop and waited for after it. */
static __device__ __forceinline__ void cg_cp_async16(unsigned dst, const void *src, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(n) : "memory");
}
static __device__ __forceinline__ void cg_cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
static __device__ __forceinline__ void cg_cp_async_wait_all(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }
/* Branch-free math. Division and reciprocal: MUFU.RCP and a multiply
 * (<= 2 ulp; 0 for |y| > 2^126) instead of IEEE division's slow path. */
static __device__ __forceinline__ float cg_div(float x, float y) { return __fdividef(x, y); }
/* e^x as __expf computes it (2^(x log2 e), MUFU.EX2), but with results
 * below 2^-126 flushed to zero: __expf's ex2.approx.f32 gets them right
 * with a range test and two predicated multiplies, 5 instructions an exp
 * where this takes 2. Only where such a term cannot change the result:
 * in 1 + e^-x (sigmoid, silu), and in the log-sum-exp's sums, which hold
 * a term exp(0) = 1 whenever their maximum is finite (against __expf:
 * lmhead_lse 2954 -> 2514 SASS lines, swiglu_bwd up to 2% faster). */
static __device__ __forceinline__ float cg_exp_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}
static __device__ __forceinline__ float cg_sigmoid(float x) { return __fdividef(1.0f, 1.0f + cg_exp_ftz(-x)); }
static __device__ __forceinline__ float cg_silu(float x) { return __fdividef(x, 1.0f + cg_exp_ftz(-x)); }
/* sin and cos: x less k 2pi (2pi in two parts, fma: r is exact to ~1 ulp
 * for |x| < 2^24), then MUFU.SIN/COS on [-pi, pi] (abs error < 1e-6).
 * sinf/cosf branch to a slow path with a local-memory table. */
static __device__ __forceinline__ float cg_reduce_2pi(float x) {
    const float k = rintf(x * 0.159154943091895336f);
    return fmaf(-k, -1.74845553e-7f, fmaf(-k, 6.28318548f, x));
}
static __device__ __forceinline__ float cg_sin(float x) { return __sinf(cg_reduce_2pi(x)); }
static __device__ __forceinline__ float cg_cos(float x) { return __cosf(cg_reduce_2pi(x)); }
/* exp: the accurate expf (about 8 instructions, one MUFU.EX2). __expf
 * (2 instructions, a relative error that grows with |x|, ~|x| 2^-24)
 * measured lmhead_bwd 3% faster at 2048, 1% at 4096-8192: not worth the
 * accuracy of a general exp. */
static __device__ __forceinline__ float cg_exp(float x) { return expf(x); }
static __device__ __forceinline__ float cg_dsilu(float x) {
    float s = cg_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}
static __device__ __forceinline__ float cg_square(float x) { return x * x; }
#define CG_NEG_INF __int_as_float(0xff800000)
#define CG_INF __int_as_float(0x7f800000)
/* max and min that keep a NaN: max.NaN / min.NaN (sm_80+), one FMNMX each,
 * as fmaxf / fminf, which drop a NaN (fmaxf(NaN, 1) = 1). The NaN rule
 * (coda.h section 5: a NaN reaches every output computed from it) needs
 * them wherever a max or min decides an output: the max and min maps, max
 * reductions (row and column partials, their shuffles) and the
 * log-sum-exp's running max. Nowhere else: the other maps carry a NaN by
 * IEEE arithmetic at no cost. The CPU's nan_max / nan_min
 * (src/cpu/cpu_epilogue.c) are the same functions. */
static __device__ __forceinline__ float cg_max_nan(float a, float b) {
    float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
static __device__ __forceinline__ float cg_min_nan(float a, float b) {
    float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
/* online log-sum-exp, a batch at a time: fold the n values v[] (a row's
 * elements of one batch of column chunks; -inf for elements outside) into
 * (m, l), branch-free. One max over the batch, one rescale of l, then
 * exp(v - max) for each value: 4 instructions and an exp a value, where
 * folding one element at a time took about 10 and a chain of dependent
 * exps (session 6).
 * The state, on the CPU too (src/cpu/cpu_epilogue.c): l is the sum of
 * exp(v - ms) with ms = m where m is finite, else 0, so
 *   m NaN  : l NaN   a NaN makes the max NaN (cg_max_nan, where fmaxf
 *                    would drop it: a row of NaN gave m = -inf, l = 0,
 *                    issue #18), and NaN - NaN makes the sum NaN
 *   m -inf : l 0     only -inf so far: exp(-inf - 0) = 0, no -inf - -inf
 *   m +inf : l +inf  exp(+inf - 0) = +inf, no +inf - +inf; finite terms
 *                    and the old l * exp(old m) add nothing NaN
 *   m finite: the ordinary sum (>= 1)
 * The NaN-keeping max costs nothing (one FMNMX either way), and testing
 * |mn| == inf instead of mn == -inf neither (|x| is an operand modifier).
 * v - ms is __fsub_rn: a v that the program computed as a product (z = acc
 * * rstd) must not be fused into it as fma(acc, rstd, -ms), which the
 * compiler did in some kernels and not in others (the same program's
 * sums then differed in the last bit between kernel variants). */
static __device__ __forceinline__ void cg_lse_fold(float *m, float *l, const float *v, int n) {
    float bm = v[0];
#pragma unroll
    for (int i = 1; i < n; i++) bm = cg_max_nan(bm, v[i]);
    const float mn = cg_max_nan(*m, bm), ms = fabsf(mn) == CG_INF ? 0.0f : mn;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < n; i++) s += cg_exp_ftz(__fsub_rn(v[i], ms));
    *l = fmaf(*l, cg_exp_ftz(*m - ms), s);
    *m = mn;
}
/* merge state (m2, l2) into (m, l): the 4 lanes sharing a row, at the
 * tile's end (one state per row slot and lane: a batch's exps are
 * independent, where the element-at-a-time update had needed 4 chains).
 * A state whose m equals the new maximum is scaled by 1, never by
 * exp(inf - inf) = NaN (two -inf or two +inf states), as in
 * coda_finish_lse; a -inf state has l 0 and adds 0; a NaN in either makes
 * mn NaN and so l NaN. (Equivalent forms, `m == mn ? l : l * expf(..)`
 * or expf of a selected argument, made ptxas spill in some of
 * lmhead_lse's kernel configurations; this one spills in none and has
 * fewer instructions than the -inf test it replaces.) The sum is one
 * explicit fma, so that no kernel variant fuses the other product. */
static __device__ __forceinline__ void cg_lse_merge(float *m, float *l, float m2, float l2) {
    const float mn = cg_max_nan(*m, m2);
    const float b = l2 * (m2 == mn ? 1.0f : expf(m2 - mn));
    *l = fmaf(*l, *m == mn ? 1.0f : expf(*m - mn), b);
    *m = mn;
}
#endif
