/* cg_tile_end.c - what a generated epilogue does once a batch of column
 * chunks is done (coda_epi_flush: staged outputs out as 16-byte vectors,
 * the batch's log-sum-exp values folded) and once the tile is done
 * (coda_epi_end: row and column partials combined and stored, the
 * log-sum-exp states merged). */
#include "codegen/cg.h"

#include <stdio.h>

/* "x = x OP y" for a reduction. */
static void red_fold(sb_t *b, coda_reduce_t r, const char *x, const char *y) {
    char e[256];
    red_expr(e, sizeof e, r, x, y);
    sb_printf(b, "%s = %s;", x, e);
}


/* Fold x with its copies in the lanes sh = lo, 2 lo, .., hi apart (butterfly
 * shuffles), one line per step indented by `indent` spaces. */
static void shfl_fold(sb_t *b, coda_reduce_t r, int lo, int hi, int indent) {
    for (int sh = lo; sh <= hi; sh *= 2) {
        char y[64];
        snprintf(y, sizeof y, "__shfl_xor_sync(0xffffffffu, x, %d)", sh);
        sb_printf(b, "%*s{ float y_ = %s; ", indent, "", y);
        red_fold(b, r, "x", "y_");
        sb_printf(b, " }\n");
    }
}


/* CODA_EPI_TMA_STORES and coda_epi_slab_wait(t): whether coda_epi_flush
 * hands outputs to TMA (the store plan, codegen.h), and the wait before a
 * warp next writes its slab until TMA has read the last batch out of it
 * (the kernel calls it before the pairs of each batch; coda_epi_vput and
 * coda_epi_end, which write the slab too, call it first). In the ring form
 * the copies run while the next batch's inputs are read from the ring;
 * with staged inputs (N16 form) coda_epi_vput waits right after the flush,
 * so there they overlap nothing. */
void gen_slab_wait(sb_t *b, const stage_plan_t *sp) {
    if (sp->nmap > 0)
        sb_printf(b, "#if CODA_EPI_STAGE\n#define CODA_EPI_TMA_STORES 1\n#else\n"
                     "#define CODA_EPI_TMA_STORES 0\n#endif\n");
    else
        sb_printf(b, "#define CODA_EPI_TMA_STORES 0\n");
    sb_printf(b, "static __device__ __forceinline__ void coda_epi_slab_wait(const coda_epi_tile &t) {\n"
                 "    (void)t;\n"
                 "#if CODA_EPI_TMA_STORES\n"
                 "    if ((t.tid & 31) == 0) coda_bulk_wait_read(0);\n"
                 "    __syncwarp();\n"
                 "#endif\n"
                 "}\n\n");
}


/* coda_epi_flush(P, t, mh, j0): after the pairs of the batch at chunk j0 of
 * row block mh, the warp writes each staged region out: by one TMA bulk
 * copy per region for the store plan's outputs, else 16 bytes a lane. N
 * is a multiple of 16 and a batch starts at a multiple of 32 columns, so a
 * vector is wholly inside the output or wholly outside. */
void gen_flush(sb_t *b, const coda_program_t *p, const stage_plan_t *sp) {
    sb_printf(b,
              "static __device__ __forceinline__ void coda_epi_flush(const coda_epi_params &P_, coda_epi_state &S_,\n"
              "        const coda_epi_tile &t, int mh, int j0, const coda_store_maps &O) {\n"
              "    const coda_epi_params *P = &P_;\n"
              "    coda_epi_state *S = &S_;\n"
              "    (void)P; (void)S; (void)t; (void)mh; (void)j0; (void)O;\n");
    for (int k = 0; k < p->n_args; k++) {
        if (p->args[k].kind != CODA_OUT_LSE) continue;
        int w = lse_width(p, k);
        sb_printf(b, "#if CODA_EPI_STORE_C\n#error \"lse outputs are folded by coda_epi_flush, which the C-store path does not call\"\n#endif\n");
        sb_printf(b, "    /* %s: the batch's values of row slots 2 mh and 2 mh + 1 into their states */\n"
                     "#pragma unroll\n"
                     "    for (int h = 0; h < 2; h++) {\n"
                     "        const int rs = 2 * mh + h;\n"
                     "        cg_lse_fold(&S->lm%d[rs], &S->ll%d[rs],\n"
                     "                    &S->lb%d[rs * CODA_EPI_BATCH * %d], CODA_EPI_BATCH * %d);\n"
                     "        /* -inf again: with N odd a pair outside returns before it writes\n"
                     "         * its values (with N even every pair writes, and these die) */\n"
                     "#pragma unroll\n"
                     "        for (int i = 0; i < CODA_EPI_BATCH * %d; i++) S->lb%d[rs * CODA_EPI_BATCH * %d + i] = CG_NEG_INF;\n"
                     "    }\n",
                  p->args[k].name, k, k, k, w, w, w, k, w);
    }
    if (sp->any_out) {
        sb_printf(b, "#if CODA_EPI_STAGE\n"
                     "#if CODA_EPI_BATCH != %d\n#error \"the staged epilogue is laid out for batches of %d chunks\"\n#endif\n"
                     "    __syncwarp(); /* the pairs' slab writes are visible to the warp */\n"
                     "    const int lane = t.tid & 31;\n%s",
                  STAGE_BATCH, STAGE_BATCH, WARP_ORIGIN);
        staged_arg_t sa;
        if (sp->nmap > 0) {
            /* the store plan's outputs: one bulk copy each of the warp's 16
             * rows, clipped by TMA at the tensor's edges; every lane's slab
             * writes are ordered before the copy engine reads them */
            sb_printf(b, "#if CODA_EPI_TMA_STORES\n"
                         "    coda_fence_proxy_async();\n"
                         "    __syncwarp();\n"
                         "    if (lane == 0 && CG_ST_OK(1)) { /* CODA_PROBE_NO_EPI_STORE: none */\n");
            for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
                if (sp->map[k] < 0 || !staged_arg(p, sp, k, CODA_OUT_TILE, &sa)) continue;
                sb_printf(b, "        coda_tma_store(&O.map[%d], t.stage + %d, (int)(%s + %d * j0), (int)row0); /* %s */\n",
                          sp->map[k], sp->off[k], sa.first, sa.jmul, sa.a->name);
            }
            sb_printf(b, "        coda_bulk_commit();\n"
                         "    }\n"
                         "#endif\n");
        }
        for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
            if (!staged_arg(p, sp, k, CODA_OUT_TILE, &sa)) continue;
            if (sp->map[k] >= 0) sb_printf(b, "#if !CODA_EPI_TMA_STORES\n");
            sb_printf(b,
                      "    { /* %s */\n"
                      "        const long long c_ = %s + (lane %% %d) * %d, rem_ = %s - c_;\n"
                      "        %s *g0_ = (%s *)P->ptr[%d] + (row0 + lane / %d) * P->s0[%d] + c_;\n"
                      "        const long long step_ = %d * P->s0[%d];\n"
                      "#pragma unroll\n"
                      "        for (int i = lane; i < %d; i += 32) {\n"
                      "            const int r_ = i / %d, x_ = (i %% %d) * 16;\n"
                      "            unsigned v[4];\n"
                      "            cg_lds128(%s, v);\n"
                      "            cg_st128(row0 + r_ < P->m && %d * j0 < rem_, g0_ + (i / 32) * step_ + %d * j0,\n"
                      "                     v[0], v[1], v[2], v[3]);\n"
                      "        }\n"
                      "    }\n",
                      sa.a->name, sa.first, sa.nch, 16 / sa.esz, sa.ncols,
                      sa.esz == 2 ? "unsigned short" : "float", sa.esz == 2 ? "unsigned short" : "float", k, sa.nch, k,
                      32 / sa.nch, k, 16 * sa.nch, sa.nch, sa.nch, sa.addr, sa.jmul, sa.jmul);
            if (sp->map[k] >= 0) sb_printf(b, "#endif\n");
        }
        sb_printf(b, "    __syncwarp(); /* read out before the next batch writes */\n#endif\n");
    }
    sb_printf(b, "}\n\n");
}


void gen_end(sb_t *b, const coda_program_t *p, const stage_plan_t *sp) {
    sb_printf(b,
              "static __device__ __forceinline__ void coda_epi_end(const coda_epi_params &P_,\n"
              "        const coda_epi_tile &t, coda_epi_state &S_) {\n"
              "    const coda_epi_params *P = &P_;\n"
              "    coda_epi_state *S = &S_;\n"
              "    int rows[CODA_EPI_ROW_SLOTS]; /* slot rs = 2 mh + h: row + 8 h + 64 mh */\n"
              "#pragma unroll\n"
              "    for (int i = 0; i < CODA_EPI_ROW_SLOTS; i++) rows[i] = CG_SLOT_ROW(t.row, i);\n"
              "    const int m_tile = t.tile_m, n_tile = t.tile_n;\n"
              "    const int lane = t.tid & 31;\n"
              "    (void)P; (void)S; (void)rows; (void)m_tile; (void)n_tile; (void)lane;\n");
    int colred = 0;
    for (int k = 0; k < p->n_args; k++) colred |= p->args[k].kind == CODA_OUT_COLRED;
    if (colred && sp->nmap > 0) /* the column partials go through the slabs */
        sb_printf(b, "    coda_epi_slab_wait(t);\n");
    for (int k = 0; k < p->n_args; k++) {
        const coda_arg_t *a = &p->args[k];
        if (a->kind == CODA_OUT_ROWRED) {
            sb_printf(b, "    /* %s: the 4 lanes of a quad hold all columns of their rows */\n", a->name);
            sb_printf(b, "#pragma unroll\n    for (int i = 0; i < CODA_EPI_ROW_SLOTS; i++) {\n        float x = S->r%d[i];\n", k);
            shfl_fold(b, a->reduce, 1, 2, 8);
            sb_printf(b, "        cg_st32(CG_PART_OK((lane & 3) == 0 && rows[i] < P->m),\n"
                         "                (float *)P->ptr[%d] + (long long)rows[i] * P->s0[%d] + n_tile, __float_as_uint(x));\n    }\n",
                      k, k);
        } else if (a->kind == CODA_OUT_LSE) {
            sb_printf(b, "#pragma unroll\n    for (int i = 0; i < CODA_EPI_ROW_SLOTS; i++) {\n"
                         "        float m = S->lm%d[i], l = S->ll%d[i], pk = S->lp%d[i];\n",
                      k, k, k);
            for (int sh = 1; sh <= 2; sh *= 2)
                sb_printf(b, "        { float m2 = __shfl_xor_sync(0xffffffffu, m, %d), l2 = __shfl_xor_sync(0xffffffffu, l, %d);\n"
                             "          pk += __shfl_xor_sync(0xffffffffu, pk, %d); cg_lse_merge(&m, &l, m2, l2); }\n",
                          sh, sh, sh);
            /* no fix-up of l: a state whose m is -inf has l 0 exactly
             * (cg_lse_fold, cg_lse_merge), as the CPU's */
            sb_printf(b, "        if ((lane & 3) == 0 && rows[i] < P->m) {\n"
                         "            float *o = (float *)P->ptr[%d] + (long long)rows[i] * P->s0[%d] + (long long)n_tile * P->s1[%d];\n"
                         "            o[0] = m; o[1] = l; o[2] = pk;\n        }\n    }\n",
                      k, k, k);
        } else if (a->kind == CODA_OUT_COLRED) {
            /* Column partials of the tile's 128 rows (on the GPU tile_m is
             * 128, coda_choose_tiling), in two steps.
             * 1. In each warp: a warp holds 16 rows of a 64-row block
             *    (lanes with equal lane%4 share columns). The 8 lanes of a
             *    column group reduce-scatter their V values in three
             *    shuffle steps (lane bit 2, 3, 4): each step a lane keeps
             *    half of its values, sends the other half to its partner
             *    and adds what the partner sent, so a lane ends with V/8
             *    column sums of the warp's rows (each sum mine + partner's,
             *    in the same order as a butterfly: session 6). The lane
             *    puts them into its warp's slab, one row of sums per 16-row
             *    group (mh).
             * 2. After a barrier over the tile's consumer threads
             *    (CODA_EPI_TILE_SYNC), each thread combines one column's 8
             *    group sums, in group order (the same bits every run), and
             *    stores the tile's partial; a second barrier keeps the
             *    slabs until every thread has read them.
             * One store per column and tile: the 16-row partials of
             * sessions 1-6 took 8, scattered (session 7, bench_epilogue
             * A/B without partial stores: 11% of rmsnorm_bwd's time at
             * 2048, 5% at 4096). */
            int w = space_width(a->space);
            const char *n_w = space_count(a->space), *cw = space_per_tile(a->space);
            const char *lc = a->space == CODA_SPACE_HALF ? "(c0_ >> 1)" : a->space == CODA_SPACE_FULL ? "c0_ + e" : "2 * c0_ + e";
            const char *first = a->space == CODA_SPACE_HALF ? "(long long)n_tile * (CODA_BN / 2)"
                                : a->space == CODA_SPACE_FULL ? "(long long)n_tile * CODA_BN"
                                                              : "2LL * n_tile * CODA_BN";
            char e[256], e2[256];
            /* the shuffle first, by every lane, then the fold: never a
             * full-mask shuffle inside a conditional expression (the max's
             * NaN test was once a short-circuit, and a lane holding NaN
             * skipped the shuffle: review, session 6) */
            red_expr(e, sizeof e, a->reduce, "kp_", "y_");
            red_expr(e2, sizeof e2, a->reduce, "s_", "y_");
            sb_printf(b, "#if CODA_EPI_STORE_C\n#error \"column partials go through the slabs, which the C-store path gives to TMA\"\n#endif\n");
            sb_printf(b, "    /* %s: column partials of the tile's 128 rows */\n", a->name);
            sb_printf(b, "    {\n"
                         "        enum { V_ = CODA_EPI_COL_SLOTS * %d, CW_ = %s };\n"
                         "        float x_[V_];\n"
                         "#pragma unroll\n"
                         "        for (int i = 0; i < V_; i++) x_[i] = S->c%d[i];\n"
                         "#define CG_RS_STEP(s_) { \\\n"
                         "            const int hb_ = (lane >> (2 + (s_))) & 1; \\\n"
                         "            _Pragma(\"unroll\") for (int i = 0; i < (V_ >> ((s_) + 1)); i++) { \\\n"
                         "                const int h_ = V_ >> ((s_) + 1); \\\n"
                         "                const float kp_ = hb_ ? x_[i + h_] : x_[i], sd_ = hb_ ? x_[i] : x_[i + h_]; \\\n"
                         "                const float y_ = __shfl_xor_sync(0xffffffffu, sd_, 4 << (s_)); \\\n"
                         "                x_[i] = %s; \\\n"
                         "            } }\n"
                         "        CG_RS_STEP(0) CG_RS_STEP(1) CG_RS_STEP(2)\n"
                         "#undef CG_RS_STEP\n"
                         "        /* this lane's sums: values base_ .. base_ + V_/8 - 1, into the slab */\n"
                         "        const int base_ = ((lane >> 2) & 1) * (V_ / 2) + ((lane >> 3) & 1) * (V_ / 4) +\n"
                         "                          ((lane >> 4) & 1) * (V_ / 8);\n"
                         "#pragma unroll\n"
                         "        for (int u = 0; u < V_ / 8; u++) {\n"
                         "            const int j = base_ / %d + u / %d, e = u %% %d; /* slot j = mh (CODA_BN / 8) + jj */\n"
                         "            const int c0_ = 2 * (lane & 3) + 8 * (j %% (CODA_BN / 8)); /* the tile's even acc column */\n"
                         "            (void)e;\n"
                         "            cg_sts32(t.stage + (unsigned)((j / (CODA_BN / 8)) * CW_ + %s) * 4u, __float_as_uint(x_[u]));\n"
                         "        }\n"
                         "        CODA_EPI_TILE_SYNC(t);\n"
                         "        /* group g: rows 16 g .. of the tile; its sums are in the slab of\n"
                         "         * warp g (cooperative) or of warp g %% 4, row g / 4 (ping-pong) */\n"
                         "        const unsigned slabs_ = t.stage - (unsigned)(t.wg * 4 + (t.tid >> 5)) * 4096u;\n"
                         "        const int q_ = t.tid + (CODA_WG_MH == 1 ? 128 * t.wg : 0), np_ = CODA_WG_MH == 1 ? 256 : 128;\n"
                         "#pragma unroll\n"
                         "        for (int lc = q_; lc < CW_; lc += np_) {\n"
                         "            float s_ = 0.0f;\n"
                         "#pragma unroll\n"
                         "            for (int g = 0; g < 8; g++) {\n"
                         "                const unsigned at_ = slabs_ + (unsigned)(CODA_WG_MH == 1 ? g : t.wg * 4 + (g & 3)) * 4096u +\n"
                         "                                     (unsigned)((CODA_WG_MH == 1 ? 0 : (g >> 2) * CW_) + lc) * 4u;\n"
                         "                const float y_ = __uint_as_float(cg_lds32(at_));\n"
                         "                s_ = g == 0 ? y_ : %s;\n"
                         "            }\n"
                         "            const long long gc = %s + lc;\n"
                         "            /* m_tile inside: with 2-CTA clusters and an odd number of row\n"
                         "             * tiles, the last pair's second CTA runs a tile wholly below M */\n"
                         "            cg_st32(CG_PART_OK(gc < %s && m_tile * 128 < P->m), (float *)P->ptr[%d] + gc * P->s0[%d] + m_tile,\n"
                         "                    __float_as_uint(s_));\n"
                         "        }\n"
                         "        CODA_EPI_TILE_SYNC(t); /* the slabs are read */\n"
                         "    }\n",
                      w, cw, k, e, w, w, w, lc, e2, first, n_w, k, k);
        }
    }
    sb_printf(b, "}\n");
}
