/* exp2_poly.cuh - 2^x on the FMA pipe, for softmaxes bound by the SFU.
 *
 * Hopper's special-function unit gives 16 ex2 results a clock per SM: at
 * head_dim 64 the attention forward's exponentials (one per score) take as
 * long as its tensor-core products, so a softmax can only keep up if some of
 * its exponentials are made elsewhere. coda_exp2_poly makes one from
 * floating-point adds and multiplies (about ten instructions on the FMA and
 * integer pipes, which the softmax otherwise leaves idle):
 *
 *     x = n + f,  n = round(x), f in [-1/2, 1/2]
 *     2^x = p(f) * 2^n,  p a degree-4 polynomial, |p(f) / 2^f - 1| < 3e-6
 *
 * n comes from the "magic number" addition: adding 1.5 * 2^23 + 127 to x
 * rounds it to an integer held in the low mantissa bits, n + 127, which
 * shifted into the exponent field is 2^n. Special values, as ex2.approx.ftz:
 * x < -127 (and -inf) gives 0 (x is clamped to -127, whose 2^n is the bit
 * pattern 0); NaN stays NaN (the clamp is max.NaN, so f and p are NaN).
 * The relative error of the whole is below 3e-6 for x in [-126, 1/2]
 * (tests/test_exp2_poly.c checks it on the host: this file compiles as C
 * there with CODA_EXP2_POLY_HOST defined).
 *
 * Used by attention_wgmma.cuh under CODA_AW_EMU_EVERY (an experiment). */

#ifdef CODA_EXP2_POLY_HOST
#define EXP2P_FN static inline
/* C reads a union's other member as the bits of the one written */
static inline float exp2p_bits_to_float(unsigned u) { return ((union { unsigned u; float f; }){.u = u}).f; }
static inline unsigned exp2p_float_to_bits(float f) { return ((union { float f; unsigned u; }){.f = f}).u; }
static inline float exp2p_max_nan(float a, float b) { return a != a ? a : (a > b ? a : b); }
#else
#define EXP2P_FN static __device__ __forceinline__
static __device__ __forceinline__ float exp2p_bits_to_float(unsigned u) { return __uint_as_float(u); }
static __device__ __forceinline__ unsigned exp2p_float_to_bits(float f) { return __float_as_uint(f); }
static __device__ __forceinline__ float exp2p_max_nan(float a, float b) {
    float y;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
    return y;
}
#endif

/* Near-minimax (relative) coefficients of 2^f on [-1/2, 1/2]. */
#define EXP2P_C0 9.999992847e-01f
#define EXP2P_C1 6.931217909e-01f
#define EXP2P_C2 2.402474433e-01f
#define EXP2P_C3 5.591786280e-02f
#define EXP2P_C4 9.570102207e-03f
#define EXP2P_MAGIC 12583039.0f /* 1.5 * 2^23 + 127 */

EXP2P_FN float coda_exp2_poly(float x) {
    const float xc = exp2p_max_nan(x, -127.0f);
    const float t = xc + EXP2P_MAGIC;  /* round(xc) + 127 in the low mantissa bits */
    const float f = xc - (t - EXP2P_MAGIC);
    float p = EXP2P_C4;
    p = p * f + EXP2P_C3;
    p = p * f + EXP2P_C2;
    p = p * f + EXP2P_C1;
    p = p * f + EXP2P_C0;
    return p * exp2p_bits_to_float(exp2p_float_to_bits(t) << 23); /* p * 2^n */
}
