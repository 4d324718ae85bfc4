/* gemm_wgmma.cuh - wgmma.mma_async wrappers, written out in full because inline
 * asm must name every accumulator register (m64nNk16: N/2 f32 per thread).
 * The accumulator operand lists ("+f"(d[0]) ... ; each the smaller one
 * twice) and the register lists of the instruction text are the macros
 * CODA_WGMMA_D<n> and CODA_WGMMA_R<n>, one per accumulator count, shared by
 * every form below.
 *
 * A and B come from shared memory through matrix descriptors. CODA_TA / CODA_TB
 * are the transpose bits: 0 = K-major, 1 = MN-major (M-major A, N-major B).
 * scale-d goes in as a predicate set from a register, never as an immediate:
 * NVRTC (CUDA 13.0) segfaults on the immediate form.
 *
 * coda_wgmma_rs_n64 / _n128 take A from registers (attention's P . V and the
 * backward's dS . K, P^T . dO, dS^T . Q: the probabilities never leave the
 * registers) and B N-major; they accumulate (scale-d 1). */

#define CODA_WGMMA_R32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define CODA_WGMMA_D32(d) \
    "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]), "+f"((d)[4]), "+f"((d)[5]), "+f"((d)[6]), "+f"((d)[7]), \
    "+f"((d)[8]), "+f"((d)[9]), "+f"((d)[10]), "+f"((d)[11]), "+f"((d)[12]), "+f"((d)[13]), "+f"((d)[14]), "+f"((d)[15]), \
    "+f"((d)[16]), "+f"((d)[17]), "+f"((d)[18]), "+f"((d)[19]), "+f"((d)[20]), "+f"((d)[21]), "+f"((d)[22]), "+f"((d)[23]), \
    "+f"((d)[24]), "+f"((d)[25]), "+f"((d)[26]), "+f"((d)[27]), "+f"((d)[28]), "+f"((d)[29]), "+f"((d)[30]), "+f"((d)[31])

#define CODA_WGMMA_R64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define CODA_WGMMA_D64(d) CODA_WGMMA_D32(d), CODA_WGMMA_D32((d) + 32)

#define CODA_WGMMA_R128 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define CODA_WGMMA_D128(d) CODA_WGMMA_D64(d), CODA_WGMMA_D64((d) + 64)

/* d (64 x N f32) (+)= a (64 x 16) . b (16 x N), both from shared memory,
 * with transpose bits ta, tb: CODA_WGMMA_SS(name, N, accumulators, ...). */
#define CODA_WGMMA_SS(name, n, acc, ta, tb)                                                     \
    static __device__ __forceinline__ void name(float *d, unsigned long long da, unsigned long long db, \
                                                int scale_d) {                                 \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" CODA_XSTR(CODA_WGMMA_I##acc) ", 0;\n"    \
                     "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.bf16.bf16 {" CODA_WGMMA_R##acc   \
                     "}, %" #acc ", %" CODA_XSTR(CODA_WGMMA_J##acc) ", p, 1, 1, " CODA_XSTR(ta) ", "  \
                     CODA_XSTR(tb) ";\n}\n"                                                      \
                     : CODA_WGMMA_D##acc(d)                                                     \
                     : "l"(da), "l"(db), "r"(scale_d));                                         \
    }
/* operand numbers after the accumulators: b's descriptor, scale-d */
#define CODA_WGMMA_J32 33
#define CODA_WGMMA_I32 34
#define CODA_WGMMA_J64 65
#define CODA_WGMMA_I64 66
#define CODA_WGMMA_J128 129
#define CODA_WGMMA_I128 130

/* the GEMM's and the attention's K-major products (transpose bits from
 * the -D options) */
CODA_WGMMA_SS(coda_wgmma_n64, 64, 32, CODA_TA, CODA_TB)
CODA_WGMMA_SS(coda_wgmma_n128, 128, 64, CODA_TA, CODA_TB)
CODA_WGMMA_SS(coda_wgmma_n256, 256, 128, CODA_TA, CODA_TB)
/* both operands MN-major: the attention backward's dq = dS k, with dS
 * stored key-major (its transpose) and k as it is */
CODA_WGMMA_SS(coda_wgmma_mn_n64, 64, 32, 1, 1)
CODA_WGMMA_SS(coda_wgmma_mn_n128, 128, 64, 1, 1)
/* a K-major, b MN-major: the fused attention backward's dv += P^T do and
 * dk += dS^T q, with P^T and dS^T from shared memory */
CODA_WGMMA_SS(coda_wgmma_kn_n64, 64, 32, 0, 1)
CODA_WGMMA_SS(coda_wgmma_kn_n128, 128, 64, 0, 1)

/* d (64 x 64 f32) += a (64 x 16 bf16, registers) . b (16 x 64, N-major in shared memory) */
static __device__ __forceinline__ void coda_wgmma_rs_n64(float *d, const unsigned *a, unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" CODA_WGMMA_R32
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : CODA_WGMMA_D32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* d (64 x 128 f32) += a (64 x 16 bf16, registers) . b (16 x 128, N-major in shared memory) */
static __device__ __forceinline__ void coda_wgmma_rs_n128(float *d, const unsigned *a, unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" CODA_WGMMA_R64
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : CODA_WGMMA_D64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
