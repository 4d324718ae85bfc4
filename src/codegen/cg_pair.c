/* cg_pair.c - the program on one accumulator pair (coda_epi_pair): each
 * instruction becomes straight-line C on the pair's registers; stores go
 * to the slab (staged outputs) or straight to global memory, reductions
 * and the log-sum-exp fold into the per-tile state. */
#include "codegen/cg.h"

#include <stdio.h>
#include <stdlib.h>

/* A map's CUDA expression, a printf format with one %s per operand (the
 * CUDA column of src/program/ops.def); NULL for any other op. */
static const char *map_fn(coda_op_t op) {
    switch (op) {
#define CODA_MAP(ID, name, n, cpu, cuda, doc) case CODA_OP_##ID: return cuda;
#include "program/ops.def"
    default: return NULL;
    }
}


/* Value i's w elements from the fetched words: element e of a pair that is
 * not whole (!ok1) and lies in its second half is 0. */
static void gen_vec_decode(sb_t *b, int i, int w, coda_dtype_t dt) {
    for (int e = 0; e < w; e++) {
        char x[64];
        if (dt == CODA_BF16) snprintf(x, sizeof x, "cg_%s(L.u%d[%d])", e % 2 ? "hi" : "lo", i, e / 2);
        else snprintf(x, sizeof x, "__uint_as_float(L.u%d[%d])", i, e);
        if (w > 1 && e >= w / 2) sb_printf(b, "    const float v%d_%d = ok1 ? %s : 0.0f;\n", i, e, x);
        else sb_printf(b, "    const float v%d_%d = %s;\n", i, e, x);
    }
}


/* Vector store of w elements (names x[0..w-1]; as bf16, the packed words
 * pk[0..w/2-1]) to element pointer `q`, predicated on the pair being
 * inside (valid): all w when it is whole (ok1), else the first half. No
 * branches (see cg_st32). */
static void gen_vec_store(sb_t *b, int w, coda_dtype_t dt, const char *q, char x[4][48], char pk[2][112]) {
    sb_printf(b, "    {\n        %s *q_ = %s;\n", dt == CODA_BF16 ? "unsigned short" : "float", q);
    if (dt == CODA_BF16) {
        if (w == 1) sb_printf(b, "        cg_st16(valid, q_, cg_f32_to_bf16(%s));\n", x[0]);
        else if (w == 2)
            sb_printf(b, "        cg_st32(valid && ok1, q_, %s);\n"
                         "        if (!ok1) cg_st16(valid, q_, cg_f32_to_bf16(%s));\n", pk[0], x[0]);
        else
            sb_printf(b, "        cg_st64(valid && ok1, q_, %s, %s);\n"
                         "        if (!ok1) cg_st32(valid, q_, %s);\n",
                      pk[0], pk[1], pk[0]);
    } else {
        if (w == 1) sb_printf(b, "        cg_st32(valid, q_, __float_as_uint(%s));\n", x[0]);
        else if (w == 2)
            sb_printf(b, "        cg_st64(valid && ok1, q_, __float_as_uint(%s), __float_as_uint(%s));\n"
                         "        if (!ok1) cg_st32(valid, q_, __float_as_uint(%s));\n", x[0], x[1], x[0]);
        else
            sb_printf(b, "        cg_st128(valid && ok1, q_, __float_as_uint(%s), __float_as_uint(%s),\n"
                         "                 __float_as_uint(%s), __float_as_uint(%s));\n"
                         "        if (!ok1) cg_st64(valid, q_, __float_as_uint(%s), __float_as_uint(%s));\n",
                      x[0], x[1], x[2], x[3], x[0], x[1]);
    }
    sb_printf(b, "    }\n");
}


/* A pair's w elements of output arg k into its slab region. 4-byte pairs
 * (CG_LDSM): the word waits in S->ow<k> until the pair (h = 1) of an odd
 * chunk jj, which writes those of chunks jj - 1 and jj (matrix i: h = i % 2,
 * chunk jj - 1 + i / 2) by one stmatrix; lane l addresses row l % 8 of
 * matrix l / 8 (the per-thread part), the chunk pair enters by XOR. rs and
 * cs are constants in the unrolled loops, so the test is too. */
static void gen_stage_store(sb_t *b, const coda_arg_t *a, int k, int off, int pitch, char x[4][48], char pk[2][112]) {
    int w = space_width(a->space), esz = a->dtype == CODA_BF16 ? 2 : 4, e = w * esz;
    char addr[512];
    if (e == 4) {
        char word[256];
        if (a->dtype == CODA_BF16) snprintf(word, sizeof word, "%s", pk[0]);
        else snprintf(word, sizeof word, "__float_as_uint(%s)", x[0]);
        int rpp = pitch >= 128 ? 1 : 128 / pitch, nch = pitch / 16;
        sb_printf(b, "#if CG_LDSM\n"
                     "    { /* %s: staged by stmatrix, coda_epi_flush writes it out */\n"
                     "        const int jj_ = (cs %% (CODA_BN / 8)) %% CODA_EPI_BATCH;\n"
                     "        S->ow%d[2 * (jj_ & 1) + (rs & 1)] = %s;\n"
                     "        if ((jj_ & 1) && (rs & 1)) {\n"
                     "            const int lane_ = t.tid & 31, r_ = (lane_ & 7) + 8 * ((lane_ >> 3) & 1);\n"
                     "            const unsigned thr_ = r_ * %d + (((lane_ >> 4) ^ ((r_ / %d) & %d)) << 4);\n"
                     "            cg_stsm4(t.stage + %d + (thr_ ^ (16 * (jj_ - 1))), S->ow%d[0], S->ow%d[1], S->ow%d[2], S->ow%d[3]);\n"
                     "        }\n"
                     "    }\n"
                     "#else\n",
                  a->name, k, word, pitch, rpp, nch - 1, off, k, k, k, k);
    }
    slab_pair_addr(addr, sizeof addr, off, pitch, e, "rs & 1", "(cs % (CODA_BN / 8)) % CODA_EPI_BATCH");
    sb_printf(b, "    { /* %s: staged, coda_epi_flush writes it out */\n%s", a->name, addr);
    if (a->dtype == CODA_BF16) {
        if (w == 1) sb_printf(b, "        cg_sts16(a_, cg_f32_to_bf16(%s));\n", x[0]);
        else if (w == 2) sb_printf(b, "        cg_sts32(a_, %s);\n", pk[0]);
        else sb_printf(b, "        cg_sts64(a_, %s, %s);\n", pk[0], pk[1]);
    } else {
        if (w == 1) sb_printf(b, "        cg_sts32(a_, __float_as_uint(%s));\n", x[0]);
        else if (w == 2) sb_printf(b, "        cg_sts64(a_, __float_as_uint(%s), __float_as_uint(%s));\n", x[0], x[1]);
        else
            sb_printf(b, "        cg_sts128(a_, __float_as_uint(%s), __float_as_uint(%s), __float_as_uint(%s), "
                         "__float_as_uint(%s));\n", x[0], x[1], x[2], x[3]);
    }
    sb_printf(b, "    }\n");
    if (e == 4) sb_printf(b, "#endif\n");
}


coda_status_t gen_pair(sb_t *b, const coda_program_t *p, int even_n, const stage_plan_t *sp) {
    char e0[48], e1[48], e2[48], col[48];
    sb_printf(b,
              "static __device__ __forceinline__ void coda_epi_pair(const coda_epi_params &P_,\n"
              "        const coda_epi_tile &t, coda_epi_state &S_, int rs, int cs, int row, int col,\n"
              "        float &a0, float &a1, const coda_epi_in &L) {\n"
              "    const coda_epi_params *P = &P_;\n"
              "    coda_epi_state *S = &S_;\n"
              "    (void)t; (void)S; (void)rs; (void)cs; (void)L;\n");
    gen_pair_start(b, even_n);
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        int w = value_width(in);
        if (in->op == CODA_OP_SWAP && in->vspace == CODA_SPACE_HALF) { /* the verifier refuses it too */
            free(b->buf);
            b->buf = NULL;
            return coda__fail(CODA_ERR_UNSUPPORTED,
                              "line %d: swap in the half space pairs columns held by different GPU threads", in->line);
        }
        switch (in->op) {
        case CODA_OP_ACC:
            sb_printf(b, "    float v%d_0 = a0, v%d_1 = a1;\n", i, i);
            break;
        case CODA_OP_CONST:
            sb_printf(b, "    const float v%d_0 = %.9ef;\n", i, (double)in->imm);
            break;
        case CODA_OP_ROWIDX:
            sb_printf(b, "    const float v%d_0 = (float)row;\n", i);
            break;
        case CODA_OP_COLIDX:
            for (int e = 0; e < w; e++) {
                elem_col(in->vspace, e, col, sizeof col);
                sb_printf(b, "    const float v%d_%d = (float)%s;\n", i, e, col);
            }
            break;
        case CODA_OP_LOAD: {
            const coda_arg_t *a = &p->args[in->arg];
            if (a->kind == CODA_IN_SCALAR) {
                sb_printf(b, "    const float v%d_0 = P->scalar[%d];\n", i, in->arg);
            } else if (a->kind == CODA_IN_ROW) { /* loaded by coda_epi_preload */
                sb_printf(b, "    const float v%d_0 = S->pre.v%d[rs];\n", i, i);
            } else if (a->kind == CODA_IN_ROWPART) { /* summed by coda_epi_begin */
                sb_printf(b, "    const float v%d_0 = S->pre.pr%d[rs];\n", i, in->arg);
            } else { /* tile or column vector: fetched by coda_epi_fetch */
                gen_vec_decode(b, i, w, a->dtype);
            }
            break;
        }
        /* Pairwise maps: element c of the value is element `at` of operand
         * `from` (ops.def), in this thread's registers. */
#define CODA_PAIR(ID, name, n, dspace, from, at, doc)                                          \
        case CODA_OP_##ID:                                                                     \
            for (int c = 0; c < w; c++)                                                        \
                sb_printf(b, "    const float v%d_%d = %s;\n", i, c, el(p, in->src[from], at, e0, sizeof e0)); \
            break;
#include "program/ops.def"
        case CODA_OP_STORE: {
            const coda_arg_t *a = &p->args[in->arg];
            int wa = space_width(a->space);
            char x[4][48], q[160], pk[2][112];
            for (int e = 0; e < wa; e++) el(p, in->src[0], e, x[e], sizeof x[e]);
            /* bf16 words: a value round_bf16 made two elements at a time
             * has its words already, the rounding's (below) */
            const coda_inst_t *sv = &p->insts[in->src[0]];
            const int words = sv->op == CODA_OP_ROUND_BF16 && value_width(sv) >= 2;
            for (int h = 0; h < wa / 2; h++) {
                if (words) snprintf(pk[h], sizeof pk[h], "v%d_w%d", in->src[0], h);
                else snprintf(pk[h], sizeof pk[h], "cg_pack(%.47s, %.47s)", x[2 * h], x[2 * h + 1]);
            }
            snprintf(q, sizeof q, "(%s *)P->ptr[%d] + r * P->s0[%d] + %s",
                     a->dtype == CODA_BF16 ? "unsigned short" : "float", in->arg, in->arg, first_col(a->space));
            if (sp->off[in->arg] >= 0) {
                sb_printf(b, "#if CODA_EPI_STAGE\n");
                gen_stage_store(b, a, in->arg, sp->off[in->arg], sp->pitch[in->arg], x, pk);
                sb_printf(b, "#else\n");
                gen_vec_store(b, wa, a->dtype, q, x, pk);
                sb_printf(b, "#endif\n");
            } else {
                gen_vec_store(b, wa, a->dtype, q, x, pk);
            }
            break;
        }
        case CODA_OP_REDUCE: {
            const coda_arg_t *a = &p->args[in->arg];
            const coda_inst_t *v = &p->insts[in->src[0]];
            int wv = value_width(v);
            for (int e = 0; e < wv; e++) {
                el(p, in->src[0], e, e0, sizeof e0);
                char x[64], y[128];
                if (a->reduce == CODA_REDUCE_SUMSQ) snprintf(y, sizeof y, "%s * %s", e0, e0);
                else snprintf(y, sizeof y, "%s", e0);
                if (a->kind == CODA_OUT_ROWRED) snprintf(x, sizeof x, "S->r%d[rs]", in->arg);
                else snprintf(x, sizeof x, "S->c%d[cs * %d + %d]", in->arg, wv, e);
                /* a select, not an if: branches around these updates cut
                 * the pair code into blocks (rmsnorm_bwd had 128 a tile) */
                char f[256];
                red_expr(f, sizeof f, a->reduce, x, "y_");
                sb_printf(b, "    { const float y_ = %s; %s = (valid && %s) ? %s : %s; }\n", y, x, elem_ok(v->vspace, e), f,
                          x);
            }
            break;
        }
        case CODA_OP_LSE: {
            const coda_inst_t *v = &p->insts[in->src[0]];
            int wv = value_width(v);
            el(p, in->src[1], 0, e1, sizeof e1);
            for (int e = 0; e < wv; e++) {
                el(p, in->src[0], e, e0, sizeof e0);
                elem_col(v->vspace, e, col, sizeof col);
                /* no branch: an element outside folds in as -inf */
                sb_printf(b, "    {\n        const int in_ = valid && %s;\n"
                             "        S->lb%d[(rs * CODA_EPI_BATCH + (cs %% (CODA_BN / 8)) %% CODA_EPI_BATCH) * %d + %d] = "
                             "in_ ? %s : CG_NEG_INF;\n"
                             "        S->lp%d[rs] += in_ && (float)%s == %s ? %s : 0.0f;\n    }\n",
                          elem_ok(v->vspace, e), in->arg, wv, e, e0, in->arg, col, e1, e0);
            }
            break;
        }
        default: {
            if (in->op == CODA_OP_ROUND_BF16 && w >= 2) {
                /* two elements a conversion (cg_round_bf16x2), whose word
                 * v<i>_w<h> a store of the value writes as it is */
                for (int h = 0; h < w / 2; h++) {
                    el(p, in->src[0], 2 * h, e0, sizeof e0);
                    el(p, in->src[0], 2 * h + 1, e1, sizeof e1);
                    sb_printf(b, "    float v%d_%d, v%d_%d;\n"
                                 "    const unsigned v%d_w%d = cg_round_bf16x2(%s, %s, v%d_%d, v%d_%d);\n",
                              i, 2 * h, i, 2 * h + 1, i, h, e0, e1, i, 2 * h, i, 2 * h + 1);
                }
                break;
            }
            const char *fmt = map_fn(in->op);
            if (!fmt) {
                free(b->buf);
                b->buf = NULL;
                return coda__fail(CODA_ERR_INTERNAL, "codegen: no CUDA form for op %s", coda_op_name(in->op));
            }
            for (int e = 0; e < w; e++) {
                char expr[512];
                el(p, in->src[0], e, e0, sizeof e0);
                if (in->src[1] >= 0) el(p, in->src[1], e, e1, sizeof e1);
                if (in->src[2] >= 0) el(p, in->src[2], e, e2, sizeof e2);
                snprintf(expr, sizeof expr, fmt, e0, e1, e2);
                sb_printf(b, "    const float v%d_%d = %s;\n", i, e, expr);
            }
            break;
        }
        }
    }
    sb_printf(b, "}\n\n");
    return CODA_OK;
}
