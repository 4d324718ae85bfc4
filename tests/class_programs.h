/* class_programs.h - one epilogue program per primitive class, in every
 * column space: what the code generator, the guard tests and the NaN tests
 * run beside the built-in programs of the layer. */
#ifndef CODA_TEST_CLASS_PROGRAMS_H
#define CODA_TEST_CLASS_PROGRAMS_H

/* One program per primitive class, in every column space. */
static const char *const primitive_programs[] __attribute__((unused)) = {
    /* elementwise maps, scalars, constants, indices */
    "program maps\nin s scalar\nout y tile f32\na = acc\nc = const 0.5\nb = mul a c\nss = load s\nd = add b ss\n"
    "e = exp d\nf = log e\ng = sqrt f\nh = rsqrt e\ni = recip e\nj = sin a\nk = cos a\nl = tanh a\n"
    "m = sigmoid a\nn = silu a\no = dsilu a\np = square a\nq = round_bf16 a\nr = neg a\nt = abs r\n"
    "u = sub t q\nv = div u e\nw = max v p\nx = min w o\ny2 = pow e c\nz = eq a a\nz2 = lt a c\n"
    "z3 = mod a c\nz4 = fma x y2 z\nz5 = select z2 z4 z3\nri = rowidx\nci = colidx\nz6 = add z5 ri\n"
    "z7 = add z6 ci\nz8 = add z7 n\nz9 = add z8 m\nz10 = add z9 l\nz11 = add z10 k\nz12 = add z11 j\n"
    "z13 = add z12 i\nz14 = add z13 h\nz15 = add z14 g\nstore y z15\n",
    /* pairwise maps: 2->1 (even/odd), 1->2 (interleave), 2->2 (swap) */
    "program pairs\nout h tile bf16 half\nout d tile f32 double\nout s tile bf16\na = acc\ne = even a\n"
    "o = odd a\nm = mul e o\nstore h m\nw = swap a\nx = interleave a w\nstore d x\nstore s w\n",
    /* vector loads in every space, tile loads with dtype conversion */
    "program loads\nin r row bf16\nin t row i32\nin g col f32\nin gh col bf16 half\nin x tile bf16\n"
    "in z tile f32 double\nout y tile bf16\nout yh tile f32 half\na = acc\nb = load r\nc = load g\n"
    "d = load x\ne = load t\nf = fma a b c\ng2 = add f d\nh = add g2 e\nstore y h\nzz = load z\n"
    "ze = even zz\nzo = odd zz\nq = mul ze zo\nqe = even q\nk = load gh\nl = mul qe k\nstore yh l\n",
    /* tile reductions in every kind and space */
    "program reductions\nout rs rowsum\nout rm rowmax\nout rq rowsumsq\nout cs colsum\nout cm colmax half\n"
    "out cq colsumsq double\na = acc\nreduce rs a\nreduce rm a\nreduce rq a\nreduce cs a\ne = even a\n"
    "reduce cm e\nx = interleave a a\nreduce cq x\n",
    /* stateful: online log-sum-exp with the target pick */
    "program lse\nin t row i32\nin r row f32\nout st lse\nout st2 lse\na = acc\nrr = load r\nz = mul a rr\n"
    "tt = load t\nlse st z tt\ne = even z\nlse st2 e tt\n",
    /* row partials read by the next GEMM: an RMSNorm finished in the
     * epilogue; a second rowpart, and one loaded twice (one sum each) */
    "program rowpart\nin ss rowpart\nin s2 rowpart\nin inv scalar\nin eps scalar\nout y tile f32\n"
    "out sv tile f32\na = acc\ns = load ss\ni = load inv\nm = mul s i\nv = abs m\ne = load eps\n"
    "w = add v e\nr = rsqrt w\ny1 = mul a r\nt = load s2\nss2 = load ss\nu = add t ss2\ny2 = add y1 u\n"
    "store y y2\nstore sv s\n",
};
#define N_PRIMITIVE (int)(sizeof primitive_programs / sizeof primitive_programs[0])

#endif
