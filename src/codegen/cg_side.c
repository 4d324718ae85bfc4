/* cg_side.c - side work: the tile outputs that do not wait for the k-loop.
 *
 * A tile output whose value does not depend on the accumulator (rmsnorm_bwd's
 * b = r x g, swiglu_bwd's c = silu(g) u, both recomputed for a weight
 * gradient) can be made while the tile's k-blocks run. In the N16 and RING
 * forms the GPU runs such stores in the producer warpgroup's three idle warps
 * (coda_epi_side, called by gemm_mainloop.cuh for every tile the CTA owns,
 * beside the k-loop), and the consumers' epilogue is the program without
 * them (its "consumer" part). Session 9 measured one bf16 tile output in the
 * epilogue at 8-10% of the GEMM at 2048 and 2.5-4% at 4096 and 8192
 * (bench/RESULTS.md).
 *
 * A store is side work when its argument is a tile output (the verifier
 * allows one store an output) and its value depends neither on `acc` nor
 * on a row-partial input
 * (summed by coda_epi_begin). The split is made once per program and kept
 * with it (coda__codegen_gpu_consumer); the host's plans (ring, store maps)
 * are made from the consumer part, and so is the text of the consumers'
 * hooks, so the two agree.
 *
 * The side code works on chunks of 8 accumulator columns of one row (4
 * pairs): in the N16 forms no chunk straddles N and every tile argument is
 * 16-byte aligned in base and row stride, so a chunk's elements of each tile
 * input, column vector and output are one to four 16-byte vectors (8 bytes
 * for bf16 in the half space). Lane l of a side warp takes chunk l of 32
 * consecutive chunks of the tile, row by row, so a warp's access is 256 to
 * 2048 contiguous bytes. The values are computed by the same text as the
 * consumers' (gen_value), so they are the same bits. */
#include "codegen/cg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIDE_PAIRS 4 /* accumulator pairs in a chunk of 8 columns */

/* Backward closure: keep[i] for every value the statements marked in keep
 * read, directly or not. */
static void close_over_sources(const coda_program_t *p, unsigned char *keep) {
    for (int i = p->n_insts - 1; i >= 0; i--)
        if (keep[i])
            for (int s = 0; s < 3; s++)
                if (p->insts[i].src[s] >= 0) keep[p->insts[i].src[s]] = 1;
}

/* side[i]: instruction i belongs to the side work (a side store or a value
 * only side stores need); consumer[i]: to the consumers' part. Returns the
 * number of side stores. */
static int split_masks(const coda_program_t *p, unsigned char *side, unsigned char *consumer) {
    unsigned char late[CODA_MAX_INSTS]; /* depends on acc or on a row-partial input */
    memset(side, 0, (size_t)p->n_insts);
    memset(consumer, 0, (size_t)p->n_insts);
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        late[i] = in->op == CODA_OP_ACC || (in->op == CODA_OP_LOAD && p->args[in->arg].kind == CODA_IN_ROWPART);
        for (int s = 0; s < 3; s++)
            if (in->src[s] >= 0 && late[in->src[s]]) late[i] = 1;
    }
    int n = 0;
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (coda__op_arity(in->op) >= 0) continue; /* values: kept if a statement needs them */
        /* (the verifier allows one store an output: its one writer) */
        if (!p->gpu_no_side && in->op == CODA_OP_STORE && p->args[in->arg].kind == CODA_OUT_TILE && !late[in->src[0]]) {
            side[i] = 1;
            n++;
        } else {
            consumer[i] = 1;
        }
    }
    close_over_sources(p, side);
    close_over_sources(p, consumer);
    return n;
}

/* A new program of p's arguments and the instructions marked in keep, in
 * order, their operands renumbered. */
static coda_status_t extract(const coda_program_t *p, const unsigned char *keep, coda_program_t **out) {
    coda_program_t *q = calloc(1, sizeof *q);
    if (!q) return coda__fail(CODA_ERR_NO_MEMORY, "codegen: out of memory");
    int renum[CODA_MAX_INSTS];
    memcpy(q->name, p->name, sizeof q->name);
    q->n_args = p->n_args;
    memcpy(q->args, p->args, sizeof q->args);
    q->error = CODA_OK;
    q->verified = 1;
    for (int i = 0; i < p->n_insts; i++) {
        renum[i] = -1;
        if (!keep[i]) continue;
        coda_inst_t *in = &q->insts[q->n_insts];
        *in = p->insts[i];
        for (int s = 0; s < 3; s++)
            if (in->src[s] >= 0) in->src[s] = renum[in->src[s]];
        renum[i] = q->n_insts++;
    }
    *out = q;
    return CODA_OK;
}

int coda__codegen_side_stores(const coda_program_t *p) {
    unsigned char side[CODA_MAX_INSTS], consumer[CODA_MAX_INSTS];
    return p ? split_masks(p, side, consumer) : 0;
}

coda_status_t coda__codegen_gpu_consumer(const coda_program_t *p, const coda_program_t **out) {
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: out is NULL");
    *out = p;
    if (!p || !p->verified) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: program is NULL or not verified");
    coda_program_t *cur = atomic_load(&((coda_program_t *)p)->gpu_consumer);
    if (cur) {
        *out = cur;
        return CODA_OK;
    }
    unsigned char side[CODA_MAX_INSTS], consumer[CODA_MAX_INSTS];
    if (split_masks(p, side, consumer) == 0) return CODA_OK;
    coda_program_t *made;
    CODA_TRY(extract(p, consumer, &made));
    /* another thread may have been first: keep its split */
    if (atomic_compare_exchange_strong(&((coda_program_t *)p)->gpu_consumer, &cur, made)) cur = made;
    else coda_program_free(made);
    *out = cur;
    return CODA_OK;
}

coda_status_t coda__codegen_gpu_side(const coda_program_t *p, coda_program_t **out) {
    *out = NULL;
    unsigned char side[CODA_MAX_INSTS], consumer[CODA_MAX_INSTS];
    if (split_masks(p, side, consumer) == 0) return CODA_OK;
    return extract(p, side, out);
}


/* Bytes a chunk (4 pairs) of argument a takes: 8 to 64. */
static int chunk_bytes(const coda_arg_t *a) {
    return SIDE_PAIRS * space_width(a->space) * (a->dtype == CODA_BF16 ? 2 : 4);
}

/* The chunk's first element of argument a, from the chunk's first
 * accumulator column col0 (C text). */
static const char *chunk_first(const coda_arg_t *a) {
    return a->space == CODA_SPACE_HALF ? "(col0 >> 1)" : a->space == CODA_SPACE_FULL ? "col0" : "(2 * col0)";
}

/* Words of the fetch struct a load takes (its chunk, or a row value). */
static int fetch_words(const coda_program_t *p, const coda_inst_t *in) {
    const coda_arg_t *a = &p->args[in->arg];
    if (a->kind == CODA_IN_TILE || a->kind == CODA_IN_COL) return chunk_bytes(a) / 4;
    return a->kind == CODA_IN_ROW ? 1 : 0;
}

/* coda_side_fetch: the chunk's inputs as raw words, every load predicated
 * on the chunk being inside (zeros when not). */
static void gen_side_fetch(sb_t *b, const coda_program_t *p) {
    sb_printf(b, "struct coda_side_in {\n    unsigned unused_;\n");
    for (int i = 0; i < p->n_insts; i++)
        if (p->insts[i].op == CODA_OP_LOAD && fetch_words(p, &p->insts[i]))
            sb_printf(b, "    unsigned u%d[%d]; /* %s */\n", i, fetch_words(p, &p->insts[i]), p->args[p->insts[i].arg].name);
    sb_printf(b, "};\n\n"
                 "static __device__ __forceinline__ void coda_side_fetch(const coda_epi_params &P_, int row, int col0,\n"
                 "        int inside, coda_side_in &L) {\n"
                 "    const coda_epi_params *P = &P_;\n"
                 "    const int valid = inside && row < P->m && col0 < P->n;\n"
                 "    (void)P; (void)L; (void)valid;\n");
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (in->op != CODA_OP_LOAD || !fetch_words(p, in)) continue;
        const coda_arg_t *a = &p->args[in->arg];
        const char *t = a->dtype == CODA_BF16 ? "unsigned short" : a->dtype == CODA_I32 ? "int" : "float";
        if (a->kind == CODA_IN_ROW) {
            sb_printf(b, "    L.u%d[0] = %s(valid, (const %s *)P->ptr[%d] + (long long)row * P->s0[%d]); /* %s */\n", i,
                      a->dtype == CODA_BF16 ? "cg_ld16p" : "cg_ld32p", t, in->arg, in->arg, a->name);
            continue;
        }
        char q[192];
        if (a->kind == CODA_IN_TILE)
            snprintf(q, sizeof q, "(const %s *)P->ptr[%d] + (long long)row * P->s0[%d] + %s", t, in->arg, in->arg,
                     chunk_first(a));
        else
            snprintf(q, sizeof q, "(const %s *)P->ptr[%d] + %s", t, in->arg, chunk_first(a));
        sb_printf(b, "    { /* %s */\n        const %s *q_ = %s;\n", a->name, t, q);
        int bytes = chunk_bytes(a);
        if (bytes == 8) sb_printf(b, "        cg_ld64p(valid, q_, &L.u%d[0], &L.u%d[1]);\n", i, i);
        for (int v = 0; v < bytes / 16; v++)
            sb_printf(b, "        cg_ld128p(valid, (const char *)q_ + %d, &L.u%d[%d], &L.u%d[%d], &L.u%d[%d], &L.u%d[%d]);\n",
                      16 * v, i, 4 * v, i, 4 * v + 1, i, 4 * v + 2, i, 4 * v + 3);
        sb_printf(b, "    }\n");
    }
    sb_printf(b, "}\n\n");
}

/* coda_side_chunk: the side program on the chunk's 4 pairs (one block of
 * straight-line code each: the generator unrolls), each store's elements
 * gathered, then written as vectors. */
static coda_status_t gen_side_chunk(sb_t *b, const coda_program_t *p) {
    sb_printf(b, "static __device__ __forceinline__ void coda_side_chunk(const coda_epi_params &P_, int row, int col0,\n"
                 "        int inside, const coda_side_in &L) {\n"
                 "    const coda_epi_params *P = &P_;\n"
                 "    const int valid = inside && row < P->m && col0 < P->n;\n"
                 "    const int ok1 = 1; /* N16: every pair whole */\n"
                 "    (void)P; (void)L; (void)ok1;\n");
    for (int i = 0; i < p->n_insts; i++)
        if (p->insts[i].op == CODA_OP_STORE)
            sb_printf(b, "    float o%d_[%d]; /* %s */\n", i, SIDE_PAIRS * space_width(p->args[p->insts[i].arg].space),
                      p->args[p->insts[i].arg].name);
    for (int q = 0; q < SIDE_PAIRS; q++) {
        sb_printf(b, "    { /* pair %d */\n    const int col = col0 + %d;\n    (void)col;\n", q, 2 * q);
        for (int i = 0; i < p->n_insts; i++) {
            const coda_inst_t *in = &p->insts[i];
            if (in->op == CODA_OP_LOAD) {
                const coda_arg_t *a = &p->args[in->arg];
                if (a->kind == CODA_IN_SCALAR) {
                    sb_printf(b, "    const float v%d_0 = P->scalar[%d];\n", i, in->arg);
                } else if (a->kind == CODA_IN_ROW) {
                    if (a->dtype == CODA_BF16)
                        sb_printf(b, "    const float v%d_0 = cg_bf16_to_f32((unsigned short)L.u%d[0]);\n", i, i);
                    else if (a->dtype == CODA_I32) sb_printf(b, "    const float v%d_0 = (float)(int)L.u%d[0];\n", i, i);
                    else sb_printf(b, "    const float v%d_0 = __uint_as_float(L.u%d[0]);\n", i, i);
                } else {
                    int w = value_width(in);
                    for (int e = 0; e < w; e++) {
                        int x = q * w + e; /* element in the chunk */
                        if (a->dtype == CODA_BF16)
                            sb_printf(b, "    const float v%d_%d = cg_%s(L.u%d[%d]);\n", i, e, x % 2 ? "hi" : "lo", i, x / 2);
                        else sb_printf(b, "    const float v%d_%d = __uint_as_float(L.u%d[%d]);\n", i, e, i, x);
                    }
                }
            } else if (in->op == CODA_OP_STORE) {
                int wa = space_width(p->args[in->arg].space);
                char x[48];
                for (int e = 0; e < wa; e++)
                    sb_printf(b, "    o%d_[%d] = %s;\n", i, q * wa + e, el(p, in->src[0], e, x, sizeof x));
            } else {
                CODA_TRY(gen_value(b, p, i));
            }
        }
        sb_printf(b, "    }\n");
    }
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (in->op != CODA_OP_STORE) continue;
        const coda_arg_t *a = &p->args[in->arg];
        int n = SIDE_PAIRS * space_width(a->space), bf = a->dtype == CODA_BF16, nw = bf ? n / 2 : n;
        sb_printf(b, "    { /* %s */\n        unsigned w_[%d];\n", a->name, nw);
        for (int k = 0; k < nw; k++) {
            if (bf) sb_printf(b, "        w_[%d] = cg_pack(o%d_[%d], o%d_[%d]);\n", k, i, 2 * k, i, 2 * k + 1);
            else sb_printf(b, "        w_[%d] = __float_as_uint(o%d_[%d]);\n", k, i, k);
        }
        sb_printf(b, "        char *q_ = (char *)((%s *)P->ptr[%d] + (long long)row * P->s0[%d] + %s);\n",
                  bf ? "unsigned short" : "float", in->arg, in->arg, chunk_first(a));
        if (nw == 2) sb_printf(b, "        cg_st64(valid, q_, w_[0], w_[1]);\n");
        for (int v = 0; v < nw / 4; v++)
            sb_printf(b, "        cg_st128(valid, q_ + %d, w_[%d], w_[%d], w_[%d], w_[%d]);\n", 16 * v, 4 * v, 4 * v + 1,
                      4 * v + 2, 4 * v + 3);
        sb_printf(b, "    }\n");
    }
    sb_printf(b, "}\n\n");
    return CODA_OK;
}

/* The chunks in flight per lane: as many as keep the fetched words within
 * about 20 registers (the producer warpgroup runs at 40 a thread), 1 to 4. */
static int side_batch(const coda_program_t *p) {
    int words = 0;
    for (int i = 0; i < p->n_insts; i++)
        if (p->insts[i].op == CODA_OP_LOAD) words += fetch_words(p, &p->insts[i]);
    int n = words ? 20 / words : 4;
    return n < 1 ? 1 : n > 4 ? 4 : n;
}

coda_status_t gen_side(sb_t *b, const coda_program_t *ps) {
    if (!ps) {
        sb_printf(b, "#define CODA_EPI_SIDE 0 /* no side work (cg_side.c) */\n\n");
        return CODA_OK;
    }
    sb_printf(b, "/* side work (cg_side.c): the tile outputs that do not depend on the\n"
                 " * accumulator, made by the producer warpgroup's idle warps during the k-loop */\n"
                 "#define CODA_EPI_SIDE 1\n"
                 "#define CG_SIDE_BATCH %d /* chunks in flight per lane */\n\n",
              side_batch(ps));
    gen_side_fetch(b, ps);
    CODA_TRY(gen_side_chunk(b, ps));
    /* The tile's 128 rows x CODA_BN / 8 chunks, in row order: warp w of nw
     * takes 32 consecutive chunks at a time, CG_SIDE_BATCH such runs (nw
     * runs apart) fetched before any is computed. */
    sb_printf(b, "static __device__ __forceinline__ void coda_epi_side(const coda_epi_params &P, int tile_m, int tile_n,\n"
                 "        int w, int nw, int lane) {\n"
                 "#ifndef CODA_X_NO_SIDE /* experiment: no side work (its outputs are not written) */\n"
                 "    const int per_row = CODA_BN / 8, units = 128 * per_row;\n"
                 "    for (int u0 = 32 * w + lane; u0 < units; u0 += 32 * nw * CG_SIDE_BATCH) {\n"
                 "        coda_side_in L[CG_SIDE_BATCH];\n"
                 "#pragma unroll\n"
                 "        for (int i = 0; i < CG_SIDE_BATCH; i++) {\n"
                 "            const int u = u0 + 32 * nw * i;\n"
                 "            coda_side_fetch(P, tile_m * 128 + u / per_row, tile_n * CODA_BN + 8 * (u %% per_row), u < units, L[i]);\n"
                 "        }\n"
                 "#pragma unroll\n"
                 "        for (int i = 0; i < CG_SIDE_BATCH; i++) {\n"
                 "            const int u = u0 + 32 * nw * i;\n"
                 "            coda_side_chunk(P, tile_m * 128 + u / per_row, tile_n * CODA_BN + 8 * (u %% per_row), u < units, L[i]);\n"
                 "        }\n"
                 "    }\n"
                 "#else\n"
                 "    (void)P; (void)tile_m; (void)tile_n; (void)w; (void)nw; (void)lane;\n"
                 "#endif\n"
                 "}\n\n");
    return CODA_OK;
}
