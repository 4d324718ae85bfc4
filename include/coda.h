/*
 * coda.h - GEMMs whose epilogues are small programs.
 *
 * coda runs the non-attention work of a LLaMA-style Transformer block, forward
 * and backward, as a chain of matrix products whose epilogues (the code that
 * post-processes each output tile while it is still in registers) are small
 * programs: residual adds, RMSNorm, RoPE, SwiGLU and the cross-entropy loss.
 *
 * This header is the documentation. Conventions, everywhere:
 *
 *   - Every call returns a coda_status_t. CODA_OK is 0. On failure nothing the
 *     caller owns has been modified, and coda_last_error() returns a message
 *     naming the argument and the problem (per thread, valid until the next
 *     failing call on that thread). One exception: a call that makes an
 *     object (coda_*_create, coda_program_new / _parse) first sets its
 *     *out to NULL, so a failed one leaves NULL there.
 *   - Every *_free(NULL) is harmless.
 *   - Matrices are row-major; tensor descriptors carry byte strides.
 *   - Shape comments read  // (M, N) bf16  : rows, columns, element type.
 *   - The library never exits or aborts the process.
 *
 * The pieces, in the order a newcomer meets them:
 *   1. status and errors        coda_status_t, coda_last_error
 *   2. tensors                  coda_tensor_t, coda_dtype_t
 *   3. context                  coda_context_t (backends, caches, threads)
 *   4. plain GEMM               coda_gemm, three training layouts
 *   5. epilogue programs        text form, C builder, verifier
 *   6. fused GEMM               coda_gemm_epilogue, bindings, tiling
 *   7. finishing steps          coda_finish_* (combine tile partials)
 *   8. the LLaMA layer          built-in programs, forward and backward
 *   9. the block, split         around any attention, caller-owned activations
 *  10. LM head + cross-entropy  coda_lm_loss, forward and backward in one call
 *  11. attention                coda_attention_*, causal grouped-query
 */
#ifndef CODA_H
#define CODA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every function declared here is exported from libcoda.so, and nothing else
 * is: the library is built with -fvisibility=hidden, so its internal
 * functions stay internal (tests/check_exports.py holds the two lists
 * equal). Static linking is unaffected. */
#if defined(__GNUC__)
#define CODA_API __attribute__((visibility("default")))
#else
#define CODA_API
#endif

#define CODA_VERSION_MAJOR 0
#define CODA_VERSION_MINOR 1
#define CODA_VERSION_STRING "0.1.0"

/* ---------------------------------------------------------------------------
 * 1. Status and errors
 * ------------------------------------------------------------------------- */

typedef enum coda_status {
    CODA_OK = 0,
    CODA_ERR_INVALID_ARG = 1,  /* null pointer, bad enum value, bad option      */
    CODA_ERR_SHAPE = 2,        /* extents disagree or are out of range          */
    CODA_ERR_STRIDE = 3,       /* bad stride or misaligned pointer              */
    CODA_ERR_DTYPE = 4,        /* dtype not supported here                      */
    CODA_ERR_OVERLAP = 5,      /* an output overlaps an input or another output */
    CODA_ERR_DEVICE = 6,       /* tensor on the wrong device, no device, driver */
    CODA_ERR_PARSE = 7,        /* epilogue program text does not parse          */
    CODA_ERR_VERIFY = 8,       /* epilogue program is ill-formed                */
    CODA_ERR_BINDING = 9,      /* program bindings missing or mismatched        */
    CODA_ERR_COMPILE = 10,     /* run-time compilation (NVRTC) failed           */
    CODA_ERR_NO_MEMORY = 11,   /* host or device allocation failed              */
    CODA_ERR_UNSUPPORTED = 12, /* valid request this build/backend cannot do    */
    CODA_ERR_INTERNAL = 13     /* a bug in coda: please report                  */
} coda_status_t;

/* Short constant name of a status, e.g. "CODA_ERR_SHAPE". Never NULL. */
CODA_API const char *coda_status_name(coda_status_t status);

/* Message of the last failing call on this thread ("" if none). Never NULL. */
CODA_API const char *coda_last_error(void);

/* ---------------------------------------------------------------------------
 * 2. Tensors
 *
 * A descriptor, not an owner: coda never frees tensor data. Strides are in
 * bytes. A 2-D row-major (rows, cols) tensor has stride = {row_bytes, elem_bytes}.
 * The innermost stride must equal the element size (contiguous rows); row
 * strides must be multiples of 16 bytes for the GPU copy engine (the CPU
 * backend accepts any multiple of the element size).
 * ------------------------------------------------------------------------- */

typedef enum coda_dtype {
    CODA_BF16 = 0,
    CODA_F32 = 1,
    CODA_F16 = 2,      /* reserved: rejected with CODA_ERR_DTYPE for now */
    CODA_FP8_E4M3 = 3, /* reserved: rejected with CODA_ERR_DTYPE for now */
    CODA_I32 = 4,      /* integer row vectors only (cross-entropy targets) */
    CODA_I64 = 5       /* coda_lm_loss's targets only (converted on the device) */
} coda_dtype_t;

typedef enum coda_device {
    CODA_DEVICE_CPU = 0,
    CODA_DEVICE_CUDA = 1
} coda_device_t;

#define CODA_MAX_DIMS 4
/* Widest value an lse statement takes (section 5), and so the largest
 * vocabulary of the layer (section 8) and of coda_lm_loss (section 10):
 * 2^24 = 16,777,216 columns, the last whole numbers f32 holds exactly. */
#define CODA_LSE_MAX_COLS ((int64_t)1 << 24)
/* Widest qkv projection a layer takes ((n_heads + 2 n_kv_heads) * head_dim,
 * section 8; CODA_ERR_SHAPE past it): 2^24 columns. A block keeps a RoPE
 * angle for each column pair (a table of 4 bytes a pair on its device), so
 * the cap bounds what coda_block_create allocates; LLaMA-3 405B has 18,432. */
#define CODA_LLAMA_MAX_QKV ((int64_t)1 << 24)

typedef struct coda_tensor {
    void *data;
    coda_dtype_t dtype;
    coda_device_t device;
    int device_index;               /* CUDA ordinal; 0 for the CPU         */
    int ndim;                       /* 1..CODA_MAX_DIMS                    */
    int64_t shape[CODA_MAX_DIMS];   /* extents, outermost first            */
    int64_t stride[CODA_MAX_DIMS];  /* byte strides, outermost first       */
} coda_tensor_t;

/* Size of one element in bytes (0 for an unknown dtype). */
CODA_API size_t coda_dtype_size(coda_dtype_t dtype);
/* "bf16", "f32", "f16", "fp8e4m3", "i32", or NULL for an unknown dtype. */
CODA_API const char *coda_dtype_name(coda_dtype_t dtype);

/* Contiguous descriptors on the CPU (set .device after for CUDA data). */
CODA_API coda_tensor_t coda_tensor_1d(void *data, coda_dtype_t dtype, int64_t n);
CODA_API coda_tensor_t coda_tensor_2d(void *data, coda_dtype_t dtype, int64_t rows, int64_t cols);
CODA_API coda_tensor_t coda_tensor_3d(void *data, coda_dtype_t dtype, int64_t d0, int64_t d1, int64_t d2);

/* Number of elements, and the byte span from data to one past the last byte. */
CODA_API int64_t coda_tensor_numel(const coda_tensor_t *t);
CODA_API int64_t coda_tensor_span_bytes(const coda_tensor_t *t);

/* ---------------------------------------------------------------------------
 * 3. Context
 *
 * Holds the backends: the CPU reference backend (always), and CUDA when the
 * build has it and a device answers. Thread-compatible: use one context per
 * thread, or serialise calls on a shared one.
 * ------------------------------------------------------------------------- */

typedef struct coda_context coda_context_t;

typedef struct coda_context_options {
    int cpu_threads;        /* 0: number of online CPUs                         */
    const char *cache_dir;  /* compiled-module cache; NULL: $CODA_CACHE_DIR,
                               else $XDG_CACHE_HOME/coda, else ~/.cache/coda   */
} coda_context_options_t;

CODA_API coda_status_t coda_context_create(const coda_context_options_t *opts /* may be NULL */,
                                           coda_context_t **out);
CODA_API void coda_context_free(coda_context_t *ctx);

/* Writes a human-readable description of the build and devices found. */
CODA_API coda_status_t coda_context_describe(coda_context_t *ctx, char *buf, size_t cap);

/* 1 if CUDA tensors can be used with this context, else 0. */
CODA_API int coda_context_has_cuda(const coda_context_t *ctx);

/* ---------------------------------------------------------------------------
 * 4. Plain GEMM: the three layouts of training
 *
 * bf16 inputs (the CPU backend also takes f32), fp32 accumulation, bf16 or
 * f32 output C (M, N):
 *   C = alpha * op(A) op(B) + beta * C      (beta == 0: C is not read)
 *
 * Any M, N. On CUDA: K a multiple of 8, base pointers 16-byte aligned, row
 * strides multiples of 16 bytes (the copy engine), extents below 2^31.
 * Overlap checks compare byte spans, so they are conservative: two disjoint
 * strided views of one buffer count as overlapping.
 * A, B, C must all live on the same device; CPU tensors run on the CPU
 * reference backend. `stream` is a cudaStream_t (NULL: the default stream),
 * ignored on the CPU.
 *
 * Big CUDA GEMMs (at least 8 waves of tiles over the GPU, with a partial
 * last wave; plain and fused, coda_gemm_epilogue too) share the last waves'
 * work out by k-blocks ("stream-K"); below 8 whole waves the partial last
 * wave is cut into 2-4 aligned k-ranges instead (the split tail). That needs a workspace per stream,
 * which the context allocates on the stream's first such GEMM and keeps
 * until coda_context_free: 128 KiB per SM (16.5 MiB on an H200) per
 * stream, for at most 8 workspaces. A ninth stream is handed the
 * workspace of one whose GEMMs have all finished (unless a graph captured
 * a GEMM that used it). A GEMM that cannot have one (every workspace busy;
 * a stream being captured into a CUDA graph before it has its workspace;
 * a failed allocation) runs without stream-K, which changes only the
 * order of f32 sums. GEMMs on one stream run one after another and
 * never use the workspace at the same time; what is not safe is a CUDA
 * graph captured on a stream that already had a workspace and then
 * replayed on another stream while GEMMs of the same context run on the
 * first, or two replays of such graphs at once (capture on a fresh stream,
 * or set $CODA_STREAMK=0, which turns stream-K off). Results are bitwise
 * reproducible run to run for a given shape, device and stream-K choice.
 * ------------------------------------------------------------------------- */

typedef enum coda_layout {
    CODA_LAYOUT_NT = 0, /* forward: C (M,N) = A (M,K) . B (N,K)^T   y  = x W^T  */
    CODA_LAYOUT_NN = 1, /* dgrad:   C (M,N) = A (M,K) . B (K,N)     dx = dy W   */
    CODA_LAYOUT_TN = 2  /* wgrad:   C (M,N) = A (K,M)^T . B (K,N)   dW = dy^T x */
} coda_layout_t;

CODA_API coda_status_t coda_gemm(coda_context_t *ctx, coda_layout_t layout,
                                 const coda_tensor_t *a, const coda_tensor_t *b,
                                 coda_tensor_t *c, float alpha, float beta, void *stream);

/* ---------------------------------------------------------------------------
 * 5. Epilogue programs
 *
 * An epilogue program runs once per output element of a GEMM, on the fp32
 * accumulator `acc`, and may read and write other tensors. Values are fp32
 * and have a shape class:
 *     scalar   one value
 *     row      one value per output row     (M)
 *     col      one value per column         (W)
 *     tile     one value per element        (M, W)
 * where W, the width of the value's column space, is N (full), N/2 (half) or
 * 2N (double) for a GEMM with N output columns. Binary ops broadcast
 * (row op col gives a tile); mixing two different column spaces is an error.
 *
 * Pairwise maps work on adjacent columns (2j, 2j+1), which on Hopper sit in
 * adjacent registers of one thread:
 *     even v, odd v   2->1: the even / odd columns of v, one space lower
 *                     (full -> half, double -> full)
 *     interleave a b  1->2: a at 2j, b at 2j+1, one space higher
 *                     (half -> full, full -> double)
 *     swap v          2->2: exchanges the two columns of every pair
 * RoPE and SwiGLU are compositions of these with elementwise maps.
 *
 * Text form (one statement per line, '#' starts a comment):
 *
 *     program oproj                       # optional name, first statement
 *     in  x   tile bf16                   # residual stream (M, N)
 *     in  g   col  bf16                   # norm weight (N)
 *     in  eps scalar                      # f32 scalar bound at run time
 *     out h   tile bf16                   # extra output (M, N)
 *     out ss  rowsum                      # partials (M, n_tiles) f32
 *     a  = acc
 *     xr = load x
 *     s  = add a xr
 *     h1 = round_bf16 s                   # what a bf16 store would keep
 *     store h h1
 *     sq = mul h1 h1
 *     reduce ss sq
 *
 * Declarations (space is one of full (default), half, double):
 *     in  NAME tile   DTYPE [SPACE]       (M, W) tensor, bf16 or f32
 *     in  NAME row    DTYPE               (M) tensor, bf16, f32 or i32
 *     in  NAME col    DTYPE [SPACE]       (W) tensor, bf16 or f32
 *     in  NAME scalar                     f32 value
 *     in  NAME rowpart                    f32 row partials (M, T), 1 <= T < 2^31
 *     out NAME tile   DTYPE [SPACE]       (M, W) tensor, bf16 or f32
 *     out NAME rowsum|rowmax|rowsumsq      f32 partials (M, n_tiles)
 *     out NAME colsum|colmax|colsumsq [SPACE]  f32 partials (W, m_tiles)
 *     out NAME lse                        f32 partials (M, n_tiles, 3)
 * Values:
 *     NAME = acc | load ARG | const NUMBER | rowidx | colidx [SPACE]
 *     NAME = UNARY v      neg abs exp log sqrt rsqrt recip sin cos tanh
 *                         sigmoid silu dsilu square round_bf16
 *     NAME = BINARY a b   add sub mul div max min pow eq lt mod
 *     NAME = fma a b c    a*b + c
 *     NAME = select c a b (c != 0 ? a : b)
 *     NAME = even v | odd v | interleave a b | swap v
 * Statements:
 *     store  OUT v        write v (converted to OUT's dtype, round to nearest even)
 *     reduce OUT v        per-tile partial row or column reduction of v
 *     lse    OUT v t      online log-sum-exp of v along the row, and pick of
 *                         v at column t (t: a row value holding column indices)
 *
 * Tile partials. The GEMM output is cut into tiles of tile_m x tile_n
 * accumulator elements (coda_tiling_t). For a value in space s the tile spans
 * tile_n * 2^s of its columns. A row reduction writes one partial per row per
 * column tile: partials (M, ceil(N/tile_n)), element [i][t] = reduction over
 * tile t's columns of row i. A column reduction writes partials
 * (W, ceil(M/tile_m)). An lse output writes, per row and column tile,
 * (m, l, p): running max, sum of exp(v - m), and v at the target column if
 * it falls in the tile (else 0; a target with a fraction names no column).
 * Targets and column numbers are compared as f32 values (an i32 target is
 * loaded as one), which are exact only below 2^24: a fused GEMM whose lse
 * value has more than CODA_LSE_MAX_COLS columns in its space is refused
 * with CODA_ERR_SHAPE, so a pick never lands on a neighbouring column.
 * Within a tile each backend reduces in a fixed order of its own (the CPU in increasing column / row order, the GPU
 * over its register layout, lane shuffles and, for column reductions, the
 * tile's warps through shared memory), and the finishing steps
 * (section 7) combine the partials in increasing t: results are bitwise
 * reproducible on a backend, and agree across backends up to rounding.
 *
 * NaN and infinities. The rule: a NaN reaches every output computed from
 * it, on both backends, in exactly the same elements (a NaN's payload bits
 * may differ). Maps follow IEEE arithmetic, max and min included (unlike
 * C's fmaxf/fminf, they return NaN for a NaN operand); the exceptions are
 * what tests rather than computes: eq and lt give 0 for a NaN operand (an
 * unordered comparison is false), select c a b gives a where c is NaN
 * (NaN != 0) and passes on only the operand it picks, and pow is C's powf
 * (pow(x, 0) = 1 and pow(1, y) = 1 even for a NaN x or y). Scalars are
 * bound by value and must be finite (CODA_ERR_INVALID_ARG). Loads, pairwise
 * maps and stores move a NaN as they move any value (a bf16 store keeps it
 * NaN); a rowpart load is a sum, so one NaN partial makes the row's value
 * NaN. A NaN element makes the partial of its row (row reductions) or of
 * its column (column reductions) in its tile NaN, for sum, sumsq and max
 * alike, and no other partial. An lse output's (m, l, p) of a row in a
 * tile, from the tile's values v of the row:
 *     some v NaN         m = NaN,  l = NaN
 *     else max v = +inf  m = +inf, l = +inf
 *     else all v -inf    m = -inf, l = 0
 *     else               m = max v, l = sum exp(v - m), 1 <= l <= width
 * and p is the value at the target column as it is (NaN, +inf or -inf
 * included), 0 if the target is not one of the tile's columns (a NaN target
 * is none). No NaN comes from infinities alone (never -inf - -inf or
 * +inf - +inf). Section 7 says what the finishing steps make of these.
 *
 * Partials read by the next GEMM. An `in NAME rowpart` argument takes the
 * row partials (M, T) of an earlier GEMM's row reduction (`out NAME
 * rowsum` or rowsumsq, whatever its T) and `load NAME` gives, per row, their
 * sum in increasing t, the sum coda_finish_reduce and coda_finish_rstd make,
 * bit for bit. So the consumer of an RMSNorm finishes it itself and no
 * finishing step runs between the two GEMMs:
 *     in  ss  rowpart                     # the previous epilogue's sum of x^2
 *     in  d   scalar                      # the normalised width
 *     in  eps scalar
 *     q = load ss
 *     dd = load d
 *     m = div q dd
 *     e = load eps
 *     v = add m e
 *     r = rsqrt v                         # rstd, one per row
 * On the CPU this is coda_finish_rstd's arithmetic, bit for bit; on the GPU
 * div and rsqrt are the fast approximate ones, so r may differ in the last
 * bits (multiplying by a scalar 1/d instead of dividing is cheaper, and
 * differs from coda_finish_rstd unless d is a power of two).
 * ------------------------------------------------------------------------- */

typedef struct coda_program coda_program_t;

typedef enum coda_space {
    CODA_SPACE_HALF = -1,   /* N/2 columns */
    CODA_SPACE_FULL = 0,    /* N columns   */
    CODA_SPACE_DOUBLE = 1   /* 2N columns  */
} coda_space_t;

/* The kinds' values do not split inputs from outputs: rowpart, an input,
 * came last. */
typedef enum coda_arg_kind {
    CODA_IN_TILE = 0,
    CODA_IN_ROW = 1,
    CODA_IN_COL = 2,
    CODA_IN_SCALAR = 3,
    CODA_OUT_TILE = 4,
    CODA_OUT_ROWRED = 5,
    CODA_OUT_COLRED = 6,
    CODA_OUT_LSE = 7,
    CODA_IN_ROWPART = 8  /* an input: (M, T) f32 row partials, loaded as their sum */
} coda_arg_kind_t;

typedef enum coda_reduce {
    CODA_REDUCE_SUM = 0,
    CODA_REDUCE_MAX = 1,
    CODA_REDUCE_SUMSQ = 2
} coda_reduce_t;

typedef enum coda_op {
    /* sources */
    CODA_OP_ACC = 0, CODA_OP_LOAD, CODA_OP_CONST, CODA_OP_ROWIDX, CODA_OP_COLIDX,
    /* unary maps */
    CODA_OP_NEG, CODA_OP_ABS, CODA_OP_EXP, CODA_OP_LOG, CODA_OP_SQRT, CODA_OP_RSQRT,
    CODA_OP_RECIP, CODA_OP_SIN, CODA_OP_COS, CODA_OP_TANH, CODA_OP_SIGMOID,
    CODA_OP_SILU, CODA_OP_DSILU, CODA_OP_SQUARE, CODA_OP_ROUND_BF16,
    /* binary maps */
    CODA_OP_ADD, CODA_OP_SUB, CODA_OP_MUL, CODA_OP_DIV, CODA_OP_MAX, CODA_OP_MIN,
    CODA_OP_POW, CODA_OP_EQ, CODA_OP_LT, CODA_OP_MOD,
    /* ternary maps */
    CODA_OP_FMA, CODA_OP_SELECT,
    /* pairwise maps */
    CODA_OP_EVEN, CODA_OP_ODD, CODA_OP_INTERLEAVE, CODA_OP_SWAP,
    /* statements (define no value) */
    CODA_OP_STORE, CODA_OP_REDUCE, CODA_OP_LSE,
    CODA_OP_COUNT_
} coda_op_t;

/* Text name of an op ("add", ...), NULL for an unknown one. */
CODA_API const char *coda_op_name(coda_op_t op);

/* Parse and verify a program. On CODA_ERR_PARSE / CODA_ERR_VERIFY (and
 * CODA_ERR_DTYPE for a reserved dtype) the message reads "line N: problem"
 * and *out is left NULL. */
CODA_API coda_status_t coda_program_parse(const char *text, coda_program_t **out);

/* Print a program in the text form; parse(print(p)) is the same program.
 * Writes at most cap bytes including the terminating NUL; *len (may be NULL)
 * receives the full length needed, excluding the NUL. CODA_ERR_INVALID_ARG if
 * the text did not fit (buf then holds a truncated, terminated prefix).
 * buf == NULL with cap == 0 is a size query: CODA_OK, only *len is set. */
CODA_API coda_status_t coda_program_print(const coda_program_t *p, char *buf, size_t cap, size_t *len);

CODA_API void coda_program_free(coda_program_t *p);

/* The C builder. Build with the calls below, then coda_program_finish() runs
 * the verifier. Builder calls return a value id (>= 0) or an argument index
 * (>= 0); on a bad call they return -1 and the program remembers the first
 * error, which coda_program_finish() reports. Name may be NULL (a name is then
 * made up for printing). */
CODA_API coda_status_t coda_program_new(const char *name /* may be NULL */, coda_program_t **out);
CODA_API int coda_program_arg(coda_program_t *p, const char *name, coda_arg_kind_t kind,
                              coda_dtype_t dtype, coda_space_t space, coda_reduce_t reduce);
CODA_API int coda_program_value(coda_program_t *p, const char *name, coda_op_t op,
                                int src0, int src1, int src2);           /* maps; -1 unused */
CODA_API int coda_program_load(coda_program_t *p, const char *name, int arg);
CODA_API int coda_program_const(coda_program_t *p, const char *name, float value);
CODA_API int coda_program_colidx(coda_program_t *p, const char *name, coda_space_t space);
CODA_API int coda_program_store(coda_program_t *p, int arg, int value);  /* also reduce */
CODA_API int coda_program_lse(coda_program_t *p, int arg, int value, int target);
CODA_API coda_status_t coda_program_finish(coda_program_t *p);

/* Introspection, for binding code and tools. */
CODA_API int coda_program_num_args(const coda_program_t *p);
CODA_API coda_status_t coda_program_arg_info(const coda_program_t *p, int index, const char **name,
                                             coda_arg_kind_t *kind, coda_dtype_t *dtype,
                                             coda_space_t *space, coda_reduce_t *reduce);
/* Index of the argument called name, or -1. */
CODA_API int coda_program_find_arg(const coda_program_t *p, const char *name);

/* ---------------------------------------------------------------------------
 * 6. Fused GEMM: a GEMM whose epilogue is a program
 *
 * Runs C = op(A) op(B) (layouts as in coda_gemm) and then the program on every
 * element of C. The accumulator itself is not written anywhere unless the
 * program stores it. Each program argument is bound by name to a tensor
 * (tiles, vectors, partials) or a scalar; every argument must be bound once.
 * Shapes are checked against M, N, the argument's space and the tiling.
 * No output may overlap A, B, another output or an input, with one
 * exception: a tile output may be bound to exactly the view of a tile input
 * of the same column space (same base, dtype, shape and strides) when every
 * `load` of the input comes before the first `store` into the output in the
 * program, an update in place: every element is read before it is
 * overwritten (swiglu_bwd's dz over z, say). Otherwise CODA_ERR_OVERLAP.
 * A program with a half-space value or argument, or a full-space swap, needs
 * N even. Tilings: 1 <= tile_m <= 1024; tile_n even, 2 <= tile_n <= 1024.
 *
 * On CUDA (the program becomes CUDA C inside the Hopper GEMM, compiled by
 * NVRTC on first use and cached on disk): tile_n is the mainloop's block
 * width, 256 or 128 (see coda_choose_program_tiling); tile_m is 128 for
 * programs with column reductions (any
 * for the others: row partials do not depend on it); at most 16 arguments;
 * tile and column tensors need their base and row stride aligned to one
 * accumulator pair's elements (e.g. 4 bytes for a full-space bf16 tile, 16
 * for a double-space f32 tile); M and N below 2^29. Fastest when N is a
 * multiple of 16 and every tile's base and row stride are multiples of 16
 * bytes: tiles then move through shared memory as 16-byte vectors (and a
 * program's tile outputs, when it has two or more, leave by TMA bulk
 * copies). Every bound tensor's pointer must be CUDA memory of a's device,
 * as the driver reports it (host memory unknown to CUDA, or memory of
 * another device: CODA_ERR_DEVICE, nothing written; the check asks the
 * driver for the pointer's device, so pinned host memory it maps may pass). Use coda_choose_program_tiling
 * (or coda_choose_tiling).
 * ------------------------------------------------------------------------- */

typedef struct coda_binding {
    const char *name;       /* argument name in the program                */
    coda_tensor_t tensor;   /* for tile/row/col/partials arguments         */
    float scalar;           /* for scalar arguments                        */
} coda_binding_t;

typedef struct coda_tiling {
    int tile_m;   /* rows per output tile;    0: backend default */
    int tile_n;   /* columns per output tile; 0: backend default */
} coda_tiling_t;

/* The tiling a backend will use for a GEMM of this shape on this device when
 * given {0, 0} (CUDA: that of device 0; without a GPU, an H100/H200's);
 * use it to size partial outputs before the call. */
CODA_API coda_status_t coda_choose_tiling(coda_context_t *ctx, coda_device_t device, coda_layout_t layout,
                                          int64_t m, int64_t n, int64_t k, coda_tiling_t *tiling);

/* The same for one program (NULL: as coda_choose_tiling). On CUDA tile_n
 * also picks the GPU schedule: the choice is the plain GEMM's (256 on big
 * problems, the cooperative schedule), which measured as fast as or faster
 * than the alternative for every built-in program (H200, bench/HISTORY.md);
 * a caller may still pass tile_n 128, which on big problems runs the
 * ping-pong schedule (one consumer warpgroup's epilogue beside the other's
 * mainloop). The CPU's tiling is the same either way. */
CODA_API coda_status_t coda_choose_program_tiling(coda_context_t *ctx, coda_device_t device,
                                                  coda_layout_t layout, int64_t m, int64_t n, int64_t k,
                                                  const coda_program_t *program, coda_tiling_t *tiling);

/* The tensor program argument `index` must be bound to, for a GEMM of m rows
 * and n columns cut by `tiling` (NULL or zeros: the CPU default; for CUDA
 * pass coda_choose_tiling's result): its number of dims (0 for a scalar),
 * extents and dtype. Use it to allocate outputs. For an in rowpart the
 * second extent is 0: any T with 1 <= T < 2^31 is taken (the producing
 * GEMM's). */
CODA_API coda_status_t coda_program_arg_shape(const coda_program_t *p, int index, int64_t m, int64_t n,
                                              const coda_tiling_t *tiling, int *ndim,
                                              int64_t shape[3], coda_dtype_t *dtype);

CODA_API coda_status_t coda_gemm_epilogue(coda_context_t *ctx, coda_layout_t layout,
                                          const coda_tensor_t *a, const coda_tensor_t *b,
                                          const coda_program_t *program,
                                          const coda_binding_t *bindings, int n_bindings,
                                          const coda_tiling_t *tiling /* NULL: default */,
                                          void *stream);

/* ---------------------------------------------------------------------------
 * 7. Finishing steps: combine tile partials, in a fixed order, no atomics
 * ------------------------------------------------------------------------- */

/* NaN and infinities, every finishing step, on both backends: a NaN partial
 * makes the result of its row NaN (max included: a NaN is never dropped),
 * and no NaN comes from infinities where the math has a value (below).
 * With the partials of section 5, NaN in (logits, activations) is NaN out. */

/* out[i] = reduce_t partials[i][t] for t = 0..T-1 in order.
 * partials (R, T) f32, out (R) f32. Used for row partials (R = M) and column
 * partials (R = W). For CODA_REDUCE_SUMSQ the partials are already squared and
 * are summed. A NaN partial gives out[i] = NaN, for every op. */
CODA_API coda_status_t coda_finish_reduce(coda_context_t *ctx, coda_reduce_t op,
                                          const coda_tensor_t *partials, coda_tensor_t *out, void *stream);

/* RMSNorm's inverse root mean square from sum-of-squares partials:
 * rstd[i] = (sum_t partials[i][t] / d + eps)^(-1/2).
 * partials (M, T) f32, rstd (M) f32. A NaN partial gives rstd[i] = NaN;
 * a sum of +inf gives 0. */
CODA_API coda_status_t coda_finish_rstd(coda_context_t *ctx, const coda_tensor_t *partials, int64_t d,
                                        float eps, coda_tensor_t *rstd, void *stream);

/* Cross-entropy from lse partials (M, T, 3) f32 and targets (M) i32:
 * lse[i] = m + log(sum_t l_t exp(m_t - m)) with m = max_t m_t,
 * loss[i] = lse[i] - sum_t p_t, or 0 where targets[i] == ignore_index.
 * lse (M) f32, loss (M) f32. Targets are not range-checked: one outside the
 * logits' columns picks nothing (p = 0), so its loss is lse[i].
 * NaN and infinities (partials as section 5 makes them; exp(m_t - m) is
 * taken as 1 where m_t == m, so equal infinite maxima give no NaN):
 *   - a NaN m_t or l_t (a NaN logit anywhere in the row) makes lse[i] and
 *     loss[i] NaN; a NaN p_t (the target's logit) makes loss[i] NaN. An
 *     ignored row's loss is 0 all the same (its lse is still NaN).
 *   - a +inf logit (m_t = l_t = +inf) gives lse[i] = +inf, and loss[i] =
 *     +inf where the target's logit is finite, NaN where it is +inf too
 *     (+inf - +inf: the limit depends on how many logits are +inf).
 *   - a row whose logits are all -inf gives lse[i] = -inf, and loss[i] NaN
 *     where the target is one of its columns (p = -inf: -inf - -inf, the
 *     softmax is 0/0), -inf where it is not (p = 0).
 *   - -inf logits in a row with a finite one add nothing (a tile of them
 *     has m_t = -inf, l_t = 0); a target at one gets loss +inf. */
CODA_API coda_status_t coda_finish_lse(coda_context_t *ctx, const coda_tensor_t *partials,
                                       const coda_tensor_t *targets, int32_t ignore_index,
                                       coda_tensor_t *lse, coda_tensor_t *loss, void *stream);

/* ---------------------------------------------------------------------------
 * 8. The LLaMA layer (src/layer; docs/layer.md)
 *
 * One pre-norm LLaMA block, optionally followed by the final RMSNorm, the LM
 * head and the cross-entropy loss, forward and backward, run as the GEMM-
 * epilogue programs of docs/layer.md (attention itself is a plain
 * causal grouped-query attention, not an epilogue program):
 *
 *   a  = x + Wo attn(rope(q, k), v),  (q, k, v) = RMSNorm(x; g1) Wqkv^T
 *   y  = a + Wd (silu(gate) * up),    (gate, up) = RMSNorm(a; g2) Wgu^T
 *   loss_i = CE(RMSNorm(y; gf) Wlm^T, target_i)          (if vocab > 0)
 *
 * M = batch * seq tokens, row-major (token i is position i % seq of sequence
 * i / seq). RoPE uses rotate-half pairs (i, i + head_dim/2) and angle
 * pos * theta^(-2i/head_dim), as in LLaMA / PyTorch reference code.
 * ------------------------------------------------------------------------- */

typedef struct coda_llama_config {
    int64_t d;           /* hidden size                                   */
    int64_t n_heads;     /* query heads                                   */
    int64_t n_kv_heads;  /* key/value heads; divides n_heads (GQA)        */
    int64_t head_dim;    /* even; (n_heads + 2 n_kv_heads) * head_dim at
                            most CODA_LLAMA_MAX_QKV                       */
    int64_t ffn;         /* I, the FFN width                              */
    int64_t vocab;       /* LM-head rows; 0: no LM head and no loss; at most
                            CODA_LSE_MAX_COLS (2^24)                      */
    float eps;           /* RMSNorm epsilon, e.g. 1e-5                    */
    float rope_theta;    /* RoPE base, e.g. 500000                        */
} coda_llama_config_t;

/* Weights in coda's layout, all bf16 on the layer's device. Gradients use the
 * same struct with f32 (or bf16) tensors of the same shapes. nq = n_heads *
 * head_dim, nkv = n_kv_heads * head_dim. */
typedef struct coda_llama_weights {
    coda_tensor_t g1;    /* (d)              attention RMSNorm weight          */
    coda_tensor_t wqkv;  /* (nq + 2 nkv, d)  q, k, v rows; within each q and k
                                             head, row i and i + head_dim/2 are
                                             moved to 2i and 2i+1 (pack_qkv)   */
    coda_tensor_t wo;    /* (d, nq)          output projection                 */
    coda_tensor_t g2;    /* (d)              FFN RMSNorm weight                */
    coda_tensor_t wgu;   /* (2 ffn, d)       row 2j = gate j, 2j+1 = up j      */
    coda_tensor_t wd;    /* (d, ffn)         down projection                   */
    coda_tensor_t gf;    /* (d)              final RMSNorm weight (vocab > 0)  */
    coda_tensor_t wlm;   /* (vocab, d)       LM head (vocab > 0)               */
} coda_llama_weights_t;

/* From PyTorch's layout (wq (nq, d), wk (nkv, d), wv (nkv, d)) to coda's wqkv,
 * and back (for gradients). CPU tensors, bf16 or f32, same dtype throughout. */
CODA_API coda_status_t coda_llama_pack_qkv(const coda_llama_config_t *cfg, const coda_tensor_t *wq,
                                           const coda_tensor_t *wk, const coda_tensor_t *wv,
                                           coda_tensor_t *wqkv);
CODA_API coda_status_t coda_llama_unpack_qkv(const coda_llama_config_t *cfg, const coda_tensor_t *wqkv,
                                             coda_tensor_t *wq, coda_tensor_t *wk, coda_tensor_t *wv);
/* w_gate (ffn, d), w_up (ffn, d)  <->  wgu (2 ffn, d). */
CODA_API coda_status_t coda_llama_pack_gate_up(const coda_llama_config_t *cfg, const coda_tensor_t *w_gate,
                                               const coda_tensor_t *w_up, coda_tensor_t *wgu);
CODA_API coda_status_t coda_llama_unpack_gate_up(const coda_llama_config_t *cfg, const coda_tensor_t *wgu,
                                                 coda_tensor_t *w_gate, coda_tensor_t *w_up);

/* A layer instance: configuration, batch shape, device, and the activations
 * the forward pass saves for the backward pass. On CUDA (device 0 of the
 * context) d, n_heads * head_dim, (n_heads + 2 n_kv_heads) * head_dim, ffn
 * and vocab must be multiples of 8 (each is some GEMM's contraction).
 * Attention is coda_attention_* (section 11): on the GPU for head_dim 64 or
 * 128, so that the whole layer runs on the device; for other head_dims on
 * the CPU, on host copies. The forward checks the targets on a host copy
 * (it waits for the stream there). */
typedef struct coda_llama coda_llama_t;

CODA_API coda_status_t coda_llama_create(coda_context_t *ctx, const coda_llama_config_t *cfg,
                                         int64_t batch, int64_t seq, coda_device_t device,
                                         coda_llama_t **out);
CODA_API void coda_llama_free(coda_llama_t *layer);

/* Forward. x (M, d) bf16 the layer input; y (M, d) bf16 the layer output.
 * If cfg->vocab > 0 and targets != NULL: targets (M) i32 (ignore_index -100
 * gives loss 0) and loss (M) f32 receives the per-token loss. */
CODA_API coda_status_t coda_llama_forward(coda_llama_t *layer, const coda_llama_weights_t *w,
                                          const coda_tensor_t *x, const coda_tensor_t *targets,
                                          coda_tensor_t *y, coda_tensor_t *loss, void *stream);

/* Backward of  L = loss_scale * sum_i loss_i + sum_ij dy_ij y_ij  (either
 * term may be absent: dy == NULL, or no loss in the forward pass), using the
 * activations saved by the last forward call. dx (M, d) bf16 receives dL/dx;
 * grads (may be NULL) receives dL/dW for every weight, in coda's layout. */
CODA_API coda_status_t coda_llama_backward(coda_llama_t *layer, const coda_llama_weights_t *w,
                                           const coda_tensor_t *dy, float loss_scale, coda_tensor_t *dx,
                                           coda_llama_weights_t *grads, void *stream);

/* ---------------------------------------------------------------------------
 * 9. The block split at attention: any attention, activations the caller owns
 *
 * The block of section 8 without the LM head, as four calls around an
 * attention the caller runs (PyTorch's SDPA, FlashAttention, coda's own):
 *
 *   coda_block_forward_pre    x -> acts.r1, acts.qkv         RMSNorm, QKV, RoPE
 *     attention               acts.qkv -> o                  (the caller's)
 *   coda_block_forward_post   x, o -> acts.h, .r2, .z; y     O-proj + residual,
 *                                                            RMSNorm, gate/up,
 *                                                            SwiGLU, down + residual
 *   coda_block_backward_post  dy -> do, dh; grads wo g2 wgu wd
 *     attention backward      do -> dqkv                     (the caller's)
 *   coda_block_backward_pre   dqkv, dh -> dx; grads g1 wqkv
 *     (or _split: dq, dk, dv)
 *
 * Everything a forward saves for its backward is in the caller's tensors
 * (acts, and x, pos, o), so any number of forwards may be in flight
 * (gradient accumulation, activation checkpointing, pipeline
 * micro-batches), each with its own number of tokens. Scratch is a
 * workspace the caller passes to every call: coda_block_workspace_size
 * bytes for M tokens (for that call, or CODA_BLOCK_ANY for all), 256-byte aligned, on the block's device; calls that
 * run one after another (one stream) may share it, calls that may overlap
 * need one each. No call copies to or from the host or waits for the
 * stream, so a whole step can be captured into a CUDA graph.
 *
 * Shapes, M tokens of the call (any M >= 1 on the CPU, a multiple of 8 on
 * CUDA: the weight gradients contract over tokens), nq = n_heads head_dim,
 * nkv = n_kv_heads head_dim, nqkv = nq + 2 nkv, I = cfg->ffn:
 *   x    (M, d) bf16      block input          pos (M) f32  each token's position
 *   o    (M, nq) bf16     attention output     y   (M, d) bf16  block output
 *   acts->qkv (M, nqkv) bf16: q (heads of head_dim), k, v; within each q and
 *        k head pair (i, i + head_dim/2) sits at columns (2i, 2i+1), as in
 *        wqkv (coda_llama_pack_qkv). The same permutation of q's and k's
 *        columns leaves every q.k unchanged, so an attention reads q, k and
 *        v as they are; dq and dk come back in the same order.
 *   dqkv (M, nqkv) f32 or bf16, the attention's input gradient, same order.
 * RoPE angle pos * theta^(-2i/head_dim) for pair i. Weights as section 8
 * (w->gf and w->wlm are not read); gradients are written (not accumulated)
 * into the fields each call names, f32 or bf16; grads may be NULL. Outputs
 * must not overlap inputs, weights or each other. On failure before the
 * first kernel nothing is written. cfg->vocab is ignored. */
typedef struct coda_block coda_block_t;

typedef struct coda_block_acts {
    coda_tensor_t r1;   /* (M) f32        rstd of x: written by forward_pre, or the
                                          previous block's r_next                 */
    coda_tensor_t qkv;  /* (M, nqkv) bf16 roped q, k and v: the attention's input */
    coda_tensor_t h;    /* (M, d) bf16    residual stream after attention        */
    coda_tensor_t r2;   /* (M) f32        rstd of h                              */
    coda_tensor_t z;    /* (M, 2I) bf16   gate/up pre-activation: gate j at 2j, up
                                          j at 2j+1. forward_post with z.data NULL
                                          (a zeroed tensor) does not save it: a
                                          forward for inference, with no backward */
    int spend_z;        /* backward_post: nonzero lets it write dL/dz over z (in
                           place, instead of an (M, 2I) bf16 workspace buffer:
                           size it with CODA_BLOCK_BACKWARD_POST_SPEND_Z); z is
                           then spent, and a second backward_post from the same
                           forward is wrong; z is then an output, and overlapping
                           any input, weight or gradient is CODA_ERR_OVERLAP.
                           0: z is only read. */
    coda_tensor_t c;    /* (M, I) bf16, optional: c = silu(gate) * up, the down
                           projection's input. With c.data set, forward_post
                           writes c here (instead of into its workspace) and
                           backward_post reads it for dL/dWd instead of
                           recomputing it in the down dgrad's epilogue: one
                           (M, I) store fewer in the backward (about 8% of
                           that GEMM at K = 2048, bench/HISTORY.md
                           "swiglu_bwd_no_c") for M*I*2 bytes kept from the
                           forward to the backward. Size the workspaces with
                           the _KEPT_C calls: forward_post's then has no room
                           for c, backward_post's only (M, d) where c's
                           (M, I) was (the slot c shared with the gate/up
                           dgrad's b; the same size when I <= d). c.data
                           NULL (a zeroed tensor): not kept, the default.
                           The same bits either way. Measured: the 1B down
                           dgrad 0.056-0.067 ms faster without the c store
                           (5-6%, stops 60 and 61, H100), which the block
                           benchmark does not resolve (stops 59-61;
                           bench/RESULTS.md). */
} coda_block_acts_t;

CODA_API coda_status_t coda_block_create(coda_context_t *ctx, const coda_llama_config_t *cfg,
                                         coda_device_t device, coda_block_t **out);
CODA_API void coda_block_free(coda_block_t *block);
/* The four calls, and backward_post's forms, for coda_block_workspace_size. */
typedef enum coda_block_call {
    CODA_BLOCK_ANY = -1,          /* the most any call needs */
    CODA_BLOCK_FORWARD_PRE = 0,
    CODA_BLOCK_FORWARD_POST = 1,
    CODA_BLOCK_BACKWARD_POST = 2,
    CODA_BLOCK_BACKWARD_PRE = 3,
    CODA_BLOCK_BACKWARD_POST_SPEND_Z = 4, /* backward_post with acts->spend_z set */
    CODA_BLOCK_BACKWARD_POST_KEPT_C = 5,  /* backward_post with acts->c kept */
    CODA_BLOCK_BACKWARD_POST_SPEND_Z_KEPT_C = 6, /* both */
    CODA_BLOCK_FORWARD_POST_KEPT_C = 7    /* forward_post writing acts->c */
} coda_block_call_t;

/* Bytes of workspace `call` of the block needs for m tokens (CODA_BLOCK_ANY:
 * enough for every call, so that one workspace serves them all). */
CODA_API coda_status_t coda_block_workspace_size(const coda_block_t *block, coda_block_call_t call, int64_t m,
                                                 size_t *bytes);

/* acts->r1, acts->qkv from x. xg (may be NULL): x * g1, with acts->r1
 * already holding rstd(x), both from the previous block's forward_post
 * (its g_next = this block's g1): the norm prologue is then skipped. */
CODA_API coda_status_t coda_block_forward_pre(coda_block_t *block, const coda_llama_weights_t *w,
                                              const coda_tensor_t *x, const coda_tensor_t *xg,
                                              const coda_tensor_t *pos, coda_block_acts_t *acts,
                                              void *workspace, size_t workspace_bytes, void *stream);
/* acts->h, acts->r2, acts->z and y from x and o. g_next (d) bf16, y_g (M, d)
 * bf16 and r_next (M) f32 (all three, or all NULL): the next RMSNorm's
 * first half in the down projection's epilogue, y_g = y * g_next and
 * r_next = rstd(y): the next block's xg and r1, or the final norm of an LM
 * head. */
CODA_API coda_status_t coda_block_forward_post(coda_block_t *block, const coda_llama_weights_t *w,
                                               const coda_tensor_t *x, const coda_tensor_t *o,
                                               coda_block_acts_t *acts, coda_tensor_t *y,
                                               const coda_tensor_t *g_next, coda_tensor_t *y_g,
                                               coda_tensor_t *r_next, void *workspace,
                                               size_t workspace_bytes, void *stream);
/* From dy (M, d) bf16 = dL/dy: do_ (M, nq) bf16 = dL/do for the attention's
 * backward, dh (M, d) bf16 = dL/dh for backward_pre, and grads->wo, g2,
 * wgu, wd. do_ NULL leaves the O projection's backward to the caller (o and
 * grads->wo are then neither checked nor used): do_ = dh wo and
 * dwo = dh^T o, coda_gemm NN and TN, which give the same bits as this call
 * would. Run after this call, with its workspace freed, those two outputs
 * need not exist beside the workspace (they are 256 + 128 MiB in bf16 at
 * LLaMA-3 70B with 2 x 8192 tokens). */
CODA_API coda_status_t coda_block_backward_post(coda_block_t *block, const coda_llama_weights_t *w,
                                                const coda_tensor_t *o, const coda_block_acts_t *acts,
                                                const coda_tensor_t *dy, coda_tensor_t *do_, coda_tensor_t *dh,
                                                coda_llama_weights_t *grads, void *workspace,
                                                size_t workspace_bytes, void *stream);
/* From dqkv and dh: dx (M, d) bf16 = dL/dx, and grads->g1, wqkv. */
CODA_API coda_status_t coda_block_backward_pre(coda_block_t *block, const coda_llama_weights_t *w,
                                               const coda_tensor_t *x, const coda_tensor_t *pos,
                                               const coda_block_acts_t *acts, const coda_tensor_t *dqkv,
                                               const coda_tensor_t *dh, coda_tensor_t *dx,
                                               coda_llama_weights_t *grads, void *workspace,
                                               size_t workspace_bytes, void *stream);
/* The same with dqkv's three column blocks as three tensors, as an
 * attention library returns them (PyTorch's SDPA: dq, dk, dv, each its own
 * buffer): dq (M, nq), dk and dv (M, nkv), all f32 or all bf16, any row
 * strides (4-byte aligned on the GPU). No concatenation is made: the RoPE
 * backward reads them where they are. The results are those of
 * coda_block_backward_pre on their concatenation, bit for bit. */
CODA_API coda_status_t coda_block_backward_pre_split(coda_block_t *block, const coda_llama_weights_t *w,
                                                     const coda_tensor_t *x, const coda_tensor_t *pos,
                                                     const coda_block_acts_t *acts, const coda_tensor_t *dq,
                                                     const coda_tensor_t *dk, const coda_tensor_t *dv,
                                                     const coda_tensor_t *dh, coda_tensor_t *dx,
                                                     coda_llama_weights_t *grads, void *workspace,
                                                     size_t workspace_bytes, void *stream);

/* ---------------------------------------------------------------------------
 * 10. LM head and cross-entropy, forward and backward in one call
 *     (src/layer/lm_loss.c; docs/lm_loss.md)
 *
 * For hidden states x (M, d) (after the final norm), the LM head's weight
 * w (V, d) and targets (M):
 *     z_ij   = x_i . w_j                       logits, (M, V)
 *            = softcap tanh(x_i . w_j / softcap)   if softcap > 0
 *     lse_i  = log sum_j exp z_ij
 *     loss_i = lse_i - (1 - eps) z_it - (eps / V) sum_j z_ij + z_loss lse_i^2
 *              (eps = label_smoothing, t = targets[i]; PyTorch's smoothing)
 *     loss_i = 0 where targets[i] == ignore_index
 *     total  = sum_i loss_i, divided by the number of rows not ignored for
 *              CODA_LM_MEAN (all ignored: 0 / 0, NaN, as PyTorch)
 * and, in the same call, the gradients of  grad_scale * total  (the mean's
 * or sum's): dx (M, d) = dz w, dw (V, d) = dz^T x, with
 *     dz_ij = s_i ((1 + 2 z_loss lse_i) softmax_ij - (1 - eps) [j == t]
 *             - eps / V) (1 - (z_ij / softcap)^2 if softcap > 0),
 *     s_i   = grad_scale (/ count for CODA_LM_MEAN), 0 on ignored rows.
 *
 * The (M, V) logits never exist at once: the rows go through in chunks of
 * chunk_rows, each chunk's logits are stored in bf16 in the workspace by the
 * logits GEMM's epilogue (which also makes the log-sum-exp partials), one
 * memory-bound pass turns them into dz in place (and writes the chunk's
 * loss), then dx's rows and dw (accumulated over chunks in dw's dtype) come
 * from two GEMMs. The softmax is taken of the bf16 logits, as PyTorch's
 * cross_entropy takes it of a bf16 matmul's output, and dz is rounded to
 * bf16 before the two GEMMs, as PyTorch's bf16 gradient is.
 *
 * Tensors: x (M, d) bf16; w (V, d) bf16; targets (M) i32 or i64 (what
 * PyTorch's int64 class indices are: read as they are, an i64 value
 * compared with ignore_index and [0, V) before it is narrowed; i32 ones
 * contiguous, CODA_ERR_STRIDE otherwise); loss (M) f32,
 * each row's loss (required); total (1) f32 or NULL; dx (M, d) bf16 or f32
 * or NULL; dw (V, d) f32 or bf16 or NULL (f32 accumulates the chunks in
 * f32; bf16 rounds after each chunk). dx = dw = NULL: forward only (the
 * logits are still stored per chunk, but not turned into dz). With
 * accumulate = 1 the gradients are added to dx's and dw's contents, else
 * they overwrite them. All on one device; outputs apart from the inputs,
 * from each other and from the workspace, which is
 * coda_lm_loss_workspace_size bytes, 256-byte aligned. M, d, V >= 1, M and
 * d below 2^31, V at most CODA_LSE_MAX_COLS (2^24; CODA_ERR_SHAPE); on
 * CUDA d is a multiple of 8 (x's and w's rows are whole 16-byte vectors).
 *
 * Targets: a target outside [0, V) that is not ignore_index makes its row's
 * loss and its dz (so dx's row, and all of dw) NaN; the GPU cannot refuse
 * it without waiting for the stream. NaN or infinite logits follow the
 * epilogue rule (section 5): a NaN anywhere in a row that is not ignored
 * gives that row NaN loss and gradients, never a masked value.
 * ------------------------------------------------------------------------- */

typedef enum coda_lm_reduction {
    CODA_LM_MEAN = 0,   /* total and gradients over the rows not ignored */
    CODA_LM_SUM = 1
} coda_lm_reduction_t;

typedef struct coda_lm_loss_opts {
    int32_t ignore_index;     /* rows with this target count for nothing (-100)  */
    float label_smoothing;    /* eps, 0 <= eps <= 1                              */
    float z_loss;             /* weight of lse^2, >= 0                           */
    float softcap;            /* 0: none; > 0: logits = softcap tanh(z/softcap)  */
    float grad_scale;         /* the gradients are of grad_scale * total         */
    coda_lm_reduction_t reduction;
    int accumulate;           /* 1: add into dx and dw                           */
    int64_t chunk_rows;       /* rows per chunk, rounded up to a multiple of 8
                                 when below M; 0: coda_lm_loss_opts_init's     */
} coda_lm_loss_opts_t;

/* The defaults: ignore_index -100, no smoothing, z-loss or softcap,
 * grad_scale 1, CODA_LM_MEAN, overwrite, chunk_rows 0 (chosen so that a
 * chunk's bf16 logits take at most the larger of 1 GiB and twice w's
 * bytes, a multiple of 256 rows: 4096 rows for V = 128256 at d = 2048,
 * 8192 at d = 4096; never fewer than 256 rows, so where 256 rows of
 * logits pass that limit (d < 128 with V > 2^21) a chunk takes 512 V
 * bytes). */
CODA_API void coda_lm_loss_opts_init(coda_lm_loss_opts_t *opts);

/* Bytes of workspace coda_lm_loss needs for M rows, hidden size d,
 * vocabulary V and these options (NULL: the defaults) on `device`. */
CODA_API coda_status_t coda_lm_loss_workspace_size(coda_context_t *ctx, coda_device_t device, int64_t m,
                                                   int64_t d, int64_t vocab, const coda_lm_loss_opts_t *opts,
                                                   size_t *bytes);

CODA_API coda_status_t coda_lm_loss(coda_context_t *ctx, const coda_tensor_t *x, const coda_tensor_t *w,
                                    const coda_tensor_t *targets, const coda_lm_loss_opts_t *opts,
                                    coda_tensor_t *loss, coda_tensor_t *total, coda_tensor_t *dx,
                                    coda_tensor_t *dw, void *workspace, size_t workspace_bytes,
                                    void *stream);

/* t *= s[0], in place, for gradients made before their scale is known:
 * coda_lm_loss makes dx and dw in the forward call, and the backward that
 * follows learns grad_output only as a device value (a framework's autograd
 * passes a 0-dim tensor). s (1) f32 on t's device; t (R, C) or (C) bf16 or
 * f32, any row stride, elements of a row contiguous. s[0] is rounded to t's
 * dtype first and each product is taken in f32 and rounded once (what
 * PyTorch's t.mul_(s.to(t.dtype)) does, bit for bit). On CUDA the value is
 * never copied to the host (no stream sync; capturable in a CUDA graph), and
 * when the rounded s[0] is exactly 1 the kernel reads s and stops: t is not
 * read or written. NaN or infinite s[0] propagate by IEEE arithmetic. */
CODA_API coda_status_t coda_scale(coda_context_t *ctx, coda_tensor_t *t, const coda_tensor_t *s, void *stream);

/* ---------------------------------------------------------------------------
 * 11. Causal grouped-query attention, forward and backward
 *     (src/api/attention.c; CUDA: src/cuda/attention.c, kernels/attention.cuh,
 *     kernels/attention_wgmma.cuh;
 *     CPU: src/layer/attention.c; docs/attention.md)
 *
 * The attention between the block's halves (section 9), on the block's own
 * layout: M = batch * seq rows, row r is position r % seq of sequence
 * r / seq; qkv (M, nq + 2 nkv) holds q | k | v column blocks, head h in
 * columns h * head_dim .. of its block (nq = n_heads head_dim, nkv =
 * n_kv_heads head_dim); query head h reads kv head h / (n_heads /
 * n_kv_heads). Token i attends to tokens j <= i of its own sequence:
 *     s_ij  = q_i . k_j / sqrt(head_dim)
 *     o_i   = sum_j softmax_j(s_ij) v_j,   lse_i = log sum_j exp s_ij
 * per head. The backward takes o (as stored) and lse from the forward and
 * do = dL/do, and writes dqkv = dL/dqkv in the same column blocks (every
 * element written, nothing accumulated):
 *     P = exp(s - lse), dP_ij = do_i . v_j, D_i = do_i . o_i,
 *     dS = P (dP - D), dq = dS k / sqrt(hd), dk = dS^T q / sqrt(hd), dv = P^T do.
 * The columns of q and k may be permuted within each head alike (coda's
 * RoPE order): q . k does not change.
 *
 * Tensors: qkv (M, nq + 2 nkv) bf16; o (M, nq) bf16; lse (M, n_heads) f32;
 * do_ (M, nq) bf16; dqkv (M, nq + 2 nkv) f32. Row strides are free (views
 * of wider buffers work); all on one device; outputs apart from the inputs
 * and from each other.
 *
 * CPU: f32 arithmetic, exact softmax (not tiled), any even head_dim >= 2
 * (an odd one is CODA_ERR_SHAPE: the layer's RoPE rotates pairs), the
 * context's threads with a fixed partition (results do not depend on the
 * thread count); the oracle the CUDA kernels are tested against.
 * CUDA: head_dim 64 or 128; unit column strides; qkv, o and do_ with base
 * and row stride 16-byte aligned, dqkv 8-byte, lse 4-byte. bf16 tensor-core products with f32
 * accumulation and an online softmax (FlashAttention's algorithm; the
 * forward on warpgroup MMAs with tiles of 128 keys, the backward on
 * warpgroup MMAs in one kernel per 128 keys over tiles of 64 queries; causal
 * tiles past the diagonal skipped); the probabilities are rounded to bf16
 * for their products (as FlashAttention does). The forward's work items,
 * ceil(seq / 128) x n_heads x batch, must be below 2^31 (CODA_ERR_SHAPE).
 * Deterministic: dk and dv rows are each owned by one warpgroup (where a
 * kv group's query heads are shared over blocks, as at LLaMA-3 8B and 70B,
 * the blocks add theirs in a fixed order through a counter); dq is
 * added into dqkv by TMA reduce-adds that take turns in the key blocks'
 * fixed order (a counter per query tile in the workspace), so results are
 * bitwise the same run to run. (Where dqkv is not 16-byte aligned, a split
 * form runs: a dk/dv kernel and a dq kernel, nothing accumulated.) The
 * backward needs coda_attention_workspace_size bytes of device workspace
 * (the rows' D = do . o and lse, 2 x batch x n_heads x seq rounded up to
 * 128, f32, and 2 counters per 64 of those rows), 256-byte aligned; the
 * forward needs none.
 *
 * NaN: a NaN in a q, k or v that row i attends to gives NaN in o_i (and in
 * the gradients that depend on it), never a masked or finite value. Keys
 * of other sequences, and on the CPU every key after i, never reach row i.
 * On CUDA a non-finite k or v at position j may also make NaN of the rows
 * i < j of its own 128-key forward tile (128 floor(j / 128) <= i < j:
 * probability 0 times NaN inside the tile's matrix products, as in
 * FlashAttention), and so of their gradients; earlier tiles stay clean.
 * ------------------------------------------------------------------------- */

typedef struct coda_attention_shape {
    int64_t batch, seq;              /* M = batch * seq rows                */
    int64_t n_heads, n_kv_heads;     /* n_kv_heads divides n_heads (GQA)    */
    int64_t head_dim;
} coda_attention_shape_t;

/* Bytes of workspace coda_attention_backward needs on `device` (0 on the CPU). */
CODA_API coda_status_t coda_attention_workspace_size(coda_context_t *ctx, coda_device_t device,
                                                     const coda_attention_shape_t *shape, size_t *bytes);

CODA_API coda_status_t coda_attention_forward(coda_context_t *ctx, const coda_attention_shape_t *shape,
                                              const coda_tensor_t *qkv, coda_tensor_t *o, coda_tensor_t *lse,
                                              void *stream);

CODA_API coda_status_t coda_attention_backward(coda_context_t *ctx, const coda_attention_shape_t *shape,
                                               const coda_tensor_t *qkv, const coda_tensor_t *o,
                                               const coda_tensor_t *lse, const coda_tensor_t *do_,
                                               coda_tensor_t *dqkv, void *workspace, size_t workspace_bytes,
                                               void *stream);

/* Text of a built-in epilogue program of the layer, by name, or NULL. */
CODA_API const char *coda_builtin_program(const char *name);
/* NULL-terminated list of built-in program names. */
CODA_API const char *const *coda_builtin_program_names(void);

#ifdef __cplusplus
}
#endif
#endif /* CODA_H */
