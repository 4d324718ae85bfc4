/* nan_programs.h - the NaN rule's test programs, one or more per primitive
 * class, shared by tests/test_epilogue_nan.c (the CPU backend against the
 * rule itself) and tests/gpu/test_nan_gpu.c (the GPU against the CPU). Each
 * keeps to 16 arguments, the GPU's limit. The map programs take
 * p = |x| + 1.5 and q = |y| + 0.75, finite wherever x and y are, so that a
 * NaN out comes from a NaN in. */
#ifndef CODA_TEST_NAN_PROGRAMS_H
#define CODA_TEST_NAN_PROGRAMS_H

static const char prog_unary[] =
    "program nan_unary\nin x tile f32\n"
    "out o1 tile f32\nout o2 tile f32\nout o3 tile f32\nout o4 tile f32\nout o5 tile f32\nout o6 tile f32\n"
    "out o7 tile f32\nout o8 tile f32\nout o9 tile f32\nout o10 tile f32\nout o11 tile f32\nout o12 tile f32\n"
    "out o13 tile f32\nout o14 tile bf16\nout o15 tile f32\n"
    "xv = load x\nu = abs xv\nc = const 1.5\np = add u c\n" /* p >= 1.5: every map finite where p is */
    "y1 = neg p\nstore o1 y1\ny2 = exp p\nstore o2 y2\ny3 = log p\nstore o3 y3\ny4 = sqrt p\nstore o4 y4\n"
    "y5 = rsqrt p\nstore o5 y5\ny6 = recip p\nstore o6 y6\ny7 = sin p\nstore o7 y7\ny8 = cos p\nstore o8 y8\n"
    "y9 = tanh p\nstore o9 y9\ny10 = sigmoid p\nstore o10 y10\ny11 = silu p\nstore o11 y11\n"
    "y12 = dsilu p\nstore o12 y12\ny13 = square p\nstore o13 y13\ny14 = round_bf16 p\nstore o14 y14\n"
    "y15 = abs xv\nstore o15 y15\n";

/* p (NaN where x is) on the left, q (finite, >= 0.75) on the right */
static const char prog_binary_l[] =
    "program nan_binary_l\nin x tile f32\nin y tile f32\n"
    "out b1 tile f32\nout b2 tile f32\nout b3 tile f32\nout b4 tile f32\nout b5 tile f32\nout b6 tile f32\n"
    "out b7 tile f32\nout b8 tile f32\nout b9 tile f32\nout b10 tile f32\n"
    "xv = load x\nu = abs xv\nc = const 1.5\np = add u c\nyv = load y\nw = abs yv\nc2 = const 0.75\nq = add w c2\n"
    "z1 = add p q\nstore b1 z1\nz2 = sub p q\nstore b2 z2\nz3 = mul p q\nstore b3 z3\nz4 = div p q\nstore b4 z4\n"
    "z5 = max p q\nstore b5 z5\nz6 = min p q\nstore b6 z6\nz7 = pow p q\nstore b7 z7\nz8 = mod p q\nstore b8 z8\n"
    "big = const 100\nz9 = max p big\nstore b9 z9\nsmall = const -100\nz10 = min p small\nstore b10 z10\n";

/* the NaN on the right, and in each slot of fma, and picked by select */
static const char prog_binary_r[] =
    "program nan_binary_r\nin x tile f32\nin y tile f32\n"
    "out b1 tile f32\nout b2 tile f32\nout b3 tile f32\nout b4 tile f32\nout b5 tile f32\nout b6 tile f32\n"
    "out b7 tile f32\nout b8 tile f32\nout f1 tile f32\nout f2 tile f32\nout f3 tile f32\nout s1 tile f32\n"
    "out s2 tile f32\nout b9 tile f32\n"
    "xv = load x\nu = abs xv\nc = const 1.5\np = add u c\nyv = load y\nw = abs yv\nc2 = const 0.75\nq = add w c2\n"
    "z1 = add q p\nstore b1 z1\nz2 = sub q p\nstore b2 z2\nz3 = mul q p\nstore b3 z3\nz4 = div q p\nstore b4 z4\n"
    "z5 = max q p\nstore b5 z5\nz6 = min q p\nstore b6 z6\nz7 = pow q p\nstore b7 z7\nz8 = mod q p\nstore b8 z8\n"
    "g1 = fma p q q\nstore f1 g1\ng2 = fma q p q\nstore f2 g2\ng3 = fma q q p\nstore f3 g3\n"
    "one = const 1\nh1 = select one p q\nstore s1 h1\nzero = const 0\nh2 = select zero q p\nstore s2 h2\n"
    "big = const 100\nz9 = max big p\nstore b9 z9\n";

/* what tests rather than computes: no NaN comes out (k_ outputs) */
static const char prog_except[] =
    "program nan_except\nin x tile f32\nin y tile f32\n"
    "out k_eq tile f32\nout k_lt tile f32\nout k_sel tile f32\nout k_pow0 tile f32\nout k_pow1 tile f32\n"
    "xv = load x\nu = abs xv\nc = const 1.5\np = add u c\nyv = load y\nw = abs yv\nc2 = const 0.75\nq = add w c2\n"
    "e1 = eq p p\nstore k_eq e1\ne2 = lt p q\nstore k_lt e2\n"
    "d0 = sub p p\nnq = neg q\ne3 = select d0 q nq\nstore k_sel e3\n" /* d0: 0, or NaN where p is: picks q */
    "zero = const 0\ne4 = pow p zero\nstore k_pow0 e4\none = const 1\ne5 = pow one p\nstore k_pow1 e5\n";

static const char prog_pairs[] =
    "program nan_pairs\nin x tile f32\nin xb tile bf16\nin xd tile f32 double\nin xh tile bf16 half\n"
    "out e tile f32 half\nout o tile bf16 half\nout w tile f32\nout il tile f32 double\nout ieo tile bf16\n"
    "out sb tile bf16\nout sd tile f32\nout dd tile bf16 double\nout sh tile bf16 half\n"
    "a = acc\nxv = load x\ns = add a xv\n"
    "ev = even s\nstore e ev\nov = odd s\nstore o ov\nwv = swap s\nstore w wv\nil2 = interleave s s\nstore il il2\n"
    "ie = interleave ev ov\nstore ieo ie\n"
    "xbv = load xb\nsbv = add a xbv\nstore sb sbv\n"
    "xdv = load xd\nde = even xdv\ndo = odd xdv\nsdv = add de do\nstore sd sdv\nstore dd xdv\n"
    "xhv = load xh\nae = even a\nshv = add ae xhv\nstore sh shv\n";

static const char prog_vectors[] =
    "program nan_vectors\nin r row f32\nin rb row bf16\nin g col f32\nin gb col bf16\nin gh col f32 half\n"
    "in gd col bf16 double\nin sc scalar\n"
    "out y1 tile f32\nout y2 tile bf16\nout y3 tile f32\nout y4 tile f32\nout y5 tile f32 half\n"
    "out y6 tile bf16 double\nout y7 tile f32\nout y8 tile f32\n"
    "a = acc\nrv = load r\nv1 = mul a rv\nstore y1 v1\nrbv = load rb\nv2 = mul a rbv\nstore y2 v2\n"
    "gv = load g\nv3 = add a gv\nstore y3 v3\ngbv = load gb\nv4 = add a gbv\nstore y4 v4\n"
    "ghv = load gh\nae = even a\nv5 = add ae ghv\nstore y5 v5\n"
    "gdv = load gd\nad = interleave a a\nv6 = add ad gdv\nstore y6 v6\n"
    "scv = load sc\nv7 = add a scv\nstore y7 v7\nstore y8 rv\n";

static const char prog_red_full[] =
    "program nan_red_full\nin x tile f32\n"
    "out rs rowsum\nout rm rowmax\nout rq rowsumsq\nout cs colsum\nout cm colmax\nout cq colsumsq\n"
    "a = acc\nxv = load x\ns = add a xv\n"
    "reduce rs s\nreduce rm s\nreduce rq s\nreduce cs s\nreduce cm s\nreduce cq s\n";

static const char prog_lse[] =
    "program nan_lse\nin r row f32\nin x tile f32\nin t row i32\nin th row i32\nout part lse\nout parth lse\n"
    "a = acc\nrv = load r\nz0 = mul a rv\nxv = load x\nz = add z0 xv\ntv = load t\nlse part z tv\n"
    "e = even z\nthv = load th\nlse parth e thv\n";

static const char prog_rowpart[] =
    "program nan_rowpart\nin ss rowpart\nout y tile f32\nout sv tile f32\n"
    "a = acc\ns = load ss\ny1 = mul a s\nstore y y1\nstore sv s\n";

#endif
