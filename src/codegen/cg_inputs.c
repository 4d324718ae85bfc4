/* cg_inputs.c - the generated hooks that bring a tile's inputs in: row
 * vectors and column-vector slices before the k-loop (coda_epi_preload),
 * the per-tile state (coda_epi_begin), each pair's tile and column inputs
 * (coda_epi_fetch: from global memory, the slab or the stage ring), and
 * staged tile inputs a batch ahead (coda_epi_vload, coda_epi_vput). */
#include "codegen/cg.h"

#include <stdio.h>

/* C text of the index (in column vector a's space) of the pair at tile
 * column `col` relative to the tile's first. */
static const char *col_in_tile(const coda_arg_t *a) {
    return a->space == CODA_SPACE_HALF   ? "(((col - t.col) + 2 * (t.tid & 3)) >> 1)"
         : a->space == CODA_SPACE_FULL ? "((col - t.col) + 2 * (t.tid & 3))"
                                         : "(2 * ((col - t.col) + 2 * (t.tid & 3)))";
}

/* Column vectors (in NAME col) in the N16 and RING forms: each consumer
 * warp copies the tile's slice into its slab before the k-loop (cp.async,
 * 16 bytes a lane, zero-filled past the vector's end), coda_epi_begin waits
 * for the copies (long done by then), and coda_epi_fetch reads each pair's
 * elements from shared memory. Loaded from global memory batch by batch,
 * their latency was the largest wait in rmsnorm_bwd's epilogue (session 8,
 * Nsight Compute stall samples: about 16% of them). A warp's slab is its
 * own, and its earlier tile's readers (the column partials' second barrier)
 * are done before it copies the next slice. */
static void gen_col_copy(sb_t *b, const coda_program_t *p, const stage_plan_t *sp) {
    if (!sp->any_col) return;
    sb_printf(b, "#if CG_COL_SLAB\n"
                 "    {\n"
                 "        const int lane_ = t.tid & 31;\n"
                 "        cg_cp_async_wait_all(); /* an earlier piece's (a stream-K contributor runs no epilogue) */\n");
    for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
        if (sp->col_off[k] < 0) continue;
        const coda_arg_t *a = &p->args[k];
        int esz = a->dtype == CODA_BF16 ? 2 : 4;
        sb_printf(b, "        { /* %s */\n"
                     "            const long long e0_ = (long long)t.tile_n * %s;\n"
                     "            const long long left_ = (%s - e0_) * %d; /* bytes from the slice's start to the end */\n"
                     "            const char *g_ = (const char *)P->ptr[%d];\n"
                     "#pragma unroll\n"
                     "            for (int u = lane_; u < %s * %d / 16; u += 32) {\n"
                     "                const long long n_ = left_ - 16LL * u;\n"
                     "                cg_cp_async16(t.stage + %du + 16u * (unsigned)u, n_ > 0 ? g_ + e0_ * %d + 16LL * u : g_,\n"
                     "                              n_ >= 16 ? 16 : n_ > 0 ? (int)n_ : 0);\n"
                     "            }\n"
                     "        }\n",
                  a->name, space_per_tile(a->space), space_count(a->space), esz, k, space_per_tile(a->space), esz,
                  sp->col_off[k], esz);
    }
    sb_printf(b, "        cg_cp_async_commit();\n    }\n#endif\n");
}


/* Is argument k an in rowpart that some instruction loads? (Its sum is kept
 * once per argument, however many loads read it.) */
static int rowpart_loaded(const coda_program_t *p, int k) {
    if (p->args[k].kind != CODA_IN_ROWPART) return 0;
    for (int i = 0; i < p->n_insts; i++)
        if (p->insts[i].op == CODA_OP_LOAD && p->insts[i].arg == k) return 1;
    return 0;
}

/* Row partials (in NAME rowpart): coda_epi_preload loads a row's first
 * CG_ROWPART_REGS partials (32 registers a thread in all row slots, per
 * argument) into registers and does no arithmetic on them,
 * so nothing waits for the loads before the k-loop (summed there, the
 * first add would hold the k-loop's start for a memory latency).
 * coda_epi_begin sums them in increasing t, loading any beyond
 * CG_ROWPART_REGS then: the bits coda_finish_reduce makes.
 * Row vectors (in NAME row): coda_epi_preload reads each load's values for
 * the thread's row slots before the tile's k-loop (volatile loads, so they
 * stay there), coda_epi_begin keeps them in the state, and the pairs use
 * them from registers. Loaded at the epilogue's start, their latency had
 * been the first pair's wait in every tile. Rows past M read row M - 1
 * (their results are never stored). */
static void gen_preload(sb_t *b, const coda_program_t *p, const stage_plan_t *sp) {
    sb_printf(b, "#ifndef CG_ROWPART_REGS /* row partials a thread holds per row slot across the k-loop */\n"
                 "#define CG_ROWPART_REGS (32 / CODA_EPI_ROW_SLOTS)\n#endif\n"
                 "#if CG_ROWPART_REGS < 0\n#error \"CG_ROWPART_REGS is a count\"\n#endif\n");
    sb_printf(b, "struct coda_epi_pre {\n    int unused_;\n");
    for (int i = 0; i < p->n_insts; i++)
        if (p->insts[i].op == CODA_OP_LOAD && p->args[p->insts[i].arg].kind == CODA_IN_ROW)
            sb_printf(b, "    float v%d[CODA_EPI_ROW_SLOTS]; /* %s */\n", i, p->args[p->insts[i].arg].name);
    for (int k = 0; k < p->n_args; k++)
        if (rowpart_loaded(p, k))
            sb_printf(b, "    float pr%d[CODA_EPI_ROW_SLOTS]; /* %s: the rows' sums (coda_epi_begin) */\n"
                         "    float pq%d[CODA_EPI_ROW_SLOTS][CG_ROWPART_REGS > 0 ? CG_ROWPART_REGS : 1];\n",
                      k, p->args[k].name, k);
    sb_printf(b, "};\n\n"
                 "static __device__ __forceinline__ void coda_epi_preload(const coda_epi_params &P_,\n"
                 "        const coda_epi_tile &t, coda_epi_pre &Q) {\n"
                 "    const coda_epi_params *P = &P_;\n"
                 "    const int row0 = t.row;\n"
                 "    (void)P; (void)row0; (void)Q;\n"
                 "#pragma unroll\n"
                 "    for (int rs = 0; rs < CODA_EPI_ROW_SLOTS; rs++) {\n"
                 "        const int row = CG_SLOT_ROW(row0, rs);\n"
                 "        const long long r = row < P->m ? row : P->m - 1;\n"
                 "        (void)r;\n");
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (in->op != CODA_OP_LOAD || p->args[in->arg].kind != CODA_IN_ROW) continue;
        char idx[64], ld[256];
        snprintf(idx, sizeof idx, "r * P->s0[%d]", in->arg);
        load_text(&p->args[in->arg], in->arg, idx, ld, sizeof ld);
        sb_printf(b, "        Q.v%d[rs] = %s;\n", i, ld);
    }
    for (int k = 0; k < p->n_args; k++)
        if (rowpart_loaded(p, k))
            sb_printf(b, "        { /* %s: the row's first partials (T >= 1: partial 0 stands in past T) */\n"
                         "            const float *q_ = (const float *)P->ptr[%d] + r * P->s0[%d];\n"
                         "#pragma unroll\n"
                         "            for (int u = 0; u < CG_ROWPART_REGS; u++)\n"
                         "                Q.pq%d[rs][u] = __uint_as_float(cg_ld32v(q_ + (u < P->e1[%d] ? u : 0) * P->s1[%d]));\n"
                         "        }\n",
                      p->args[k].name, k, k, k, k, k);
    sb_printf(b, "    }\n");
    gen_col_copy(b, p, sp);
    sb_printf(b, "}\n\n");
}


void gen_state(sb_t *b, const coda_program_t *p, const stage_plan_t *sp) {
    gen_preload(b, p, sp);
    sb_printf(b, "struct coda_epi_state {\n    int unused_;\n    coda_epi_pre pre; /* row vectors */\n");
    for (int k = 0; k < p->n_args; k++) {
        const coda_arg_t *a = &p->args[k];
        if (a->kind == CODA_OUT_ROWRED)
            sb_printf(b, "    float r%d[CODA_EPI_ROW_SLOTS];  /* %s: row partials */\n", k, a->name);
        else if (a->kind == CODA_OUT_LSE)
            sb_printf(b, "    float lm%d[CODA_EPI_ROW_SLOTS], ll%d[CODA_EPI_ROW_SLOTS];\n"
                         "    float lp%d[CODA_EPI_ROW_SLOTS]; /* %s */\n"
                         "    float lb%d[CODA_EPI_ROW_SLOTS * CODA_EPI_BATCH * %d]; /* the batch's values, folded by coda_epi_flush */\n",
                      k, k, k, a->name, k, lse_width(p, k));
        else if (a->kind == CODA_OUT_COLRED)
            sb_printf(b, "    float c%d[CODA_EPI_COL_SLOTS * %d];  /* %s: column partials */\n", k,
                      space_width(a->space), a->name);
        else if (stsm_out(p, sp, k))
            sb_printf(b, "    unsigned ow%d[4]; /* %s: two chunks' words for stmatrix */\n", k, a->name);
    }
    sb_printf(b, "};\n\n");

    sb_printf(b, "static __device__ __forceinline__ void coda_epi_begin(const coda_epi_params &P_,\n"
                 "        const coda_epi_tile &t, coda_epi_state &S_, const coda_epi_pre &Q) {\n"
                 "    coda_epi_state *S = &S_;\n    const coda_epi_params *P = &P_;\n"
                 "    (void)P; (void)t;\n    S->pre = Q;\n");
    for (int k = 0; k < p->n_args; k++) {
        if (!rowpart_loaded(p, k)) continue;
        sb_printf(b, "#pragma unroll\n"
                     "    for (int rs = 0; rs < CODA_EPI_ROW_SLOTS; rs++) { /* %s: summed in increasing t */\n"
                     "        const int row = CG_SLOT_ROW(t.row, rs);\n"
                     "        const long long r = row < P->m ? row : P->m - 1;\n"
                     "        const float *q_ = (const float *)P->ptr[%d] + r * P->s0[%d];\n"
                     "        float s_ = 0.0f;\n"
                     "#pragma unroll\n"
                     "        for (int u = 0; u < CG_ROWPART_REGS; u++) s_ = u < P->e1[%d] ? s_ + Q.pq%d[rs][u] : s_;\n"
                     "        for (int u = CG_ROWPART_REGS; u < P->e1[%d]; u++) s_ += __uint_as_float(cg_ld32v(q_ + u * P->s1[%d]));\n"
                     "        S->pre.pr%d[rs] = s_;\n"
                     "    }\n",
                  p->args[k].name, k, k, k, k, k, k, k);
    }
    if (sp->any_col) /* the column vectors coda_epi_preload copied: in the slab, seen by the whole warp */
        sb_printf(b, "#if CG_COL_SLAB\n    cg_cp_async_wait_all();\n    __syncwarp();\n#endif\n");
    for (int k = 0; k < p->n_args; k++) {
        const coda_arg_t *a = &p->args[k];
        if (a->kind == CODA_OUT_ROWRED)
            sb_printf(b, "#pragma unroll\n    for (int i = 0; i < CODA_EPI_ROW_SLOTS; i++) S->r%d[i] = %s;\n", k,
                      red_init(a->reduce));
        else if (a->kind == CODA_OUT_LSE)
            sb_printf(b,
                      "#pragma unroll\n    for (int i = 0; i < CODA_EPI_ROW_SLOTS; i++) {\n"
                      "        S->lm%d[i] = CG_NEG_INF; S->ll%d[i] = 0.0f;\n    }\n"
                      "#pragma unroll\n    for (int i = 0; i < CODA_EPI_ROW_SLOTS; i++) S->lp%d[i] = 0.0f;\n"
                      "#pragma unroll\n    for (int i = 0; i < CODA_EPI_ROW_SLOTS * CODA_EPI_BATCH * %d; i++) S->lb%d[i] = CG_NEG_INF;\n",
                      k, k, k, lse_width(p, k), k);
        else if (a->kind == CODA_OUT_COLRED)
            sb_printf(b, "#pragma unroll\n    for (int i = 0; i < CODA_EPI_COL_SLOTS * %d; i++) S->c%d[i] = %s;\n",
                      space_width(a->space), k, red_init(a->reduce));
    }
    sb_printf(b, "    (void)S;\n}\n\n");
}


/* Fetch the raw words of value i's w elements from element pointer `q`
 * (bf16 or f32) into L.u<i>[]. pred (a tile, N even: every pair is whole):
 * the load is predicated on the pair being inside (valid; words 0 when
 * not). Else q is inside (clamped) and, N odd (the
 * pair function returned for pairs outside): all w when the pair is whole
 * (ok1), else the first half (missing words are 0). Alignment: rows start
 * 16-byte aligned (fused_gemm.c checks) and col is even, so a pair's
 * elements are one aligned 2, 4, 8 or 16-byte access. */
void gen_vec_fetch(sb_t *b, int i, int w, coda_dtype_t dt, const char *q, const char *pred) {
    const char *t = dt == CODA_BF16 ? "unsigned short" : "float";
    int nw = vec_words(w, dt);
    sb_printf(b, "    {\n        const %s *q_ = %s;\n        unsigned *u_ = L.u%d;\n", t, q, i);
    if (nw == 1 && dt == CODA_BF16 && w == 1) /* a half-space bf16 element: 2 bytes */
        pred ? sb_printf(b, "        u_[0] = cg_ld16p(%s, q_);\n", pred) : sb_printf(b, "        u_[0] = cg_ld16(q_);\n");
    else if (pred)
        sb_printf(b, nw == 1   ? "        u_[0] = cg_ld32p(%s, q_);\n"
                     : nw == 2 ? "        cg_ld64p(%s, q_, &u_[0], &u_[1]);\n"
                               : "        cg_ld128p(%s, q_, &u_[0], &u_[1], &u_[2], &u_[3]);\n", pred);
    else if (nw == 1)
        sb_printf(b, "        u_[0] = %s;\n", dt == CODA_F32 ? "cg_ld32(q_)" : "ok1 ? cg_ld32(q_) : cg_ld16(q_)");
    else if (nw == 2)
        sb_printf(b, "        if (ok1) cg_ld64(q_, &u_[0], &u_[1]);\n"
                     "        else { u_[0] = cg_ld32(q_); u_[1] = 0u; }\n");
    else
        sb_printf(b, "        if (ok1) cg_ld128(q_, &u_[0], &u_[1], &u_[2], &u_[3]);\n"
                     "        else { cg_ld64(q_, &u_[0], &u_[1]); u_[2] = u_[3] = 0u; }\n");
    sb_printf(b, "    }\n");
}


/* A ring input's pair from the stage (t.ring: the chunk's stage; box k at
 * k * t.ring_box bytes). Tiles start at multiples of 128 rows and 64
 * columns, so the row in the box is row & 127 and the byte in the chunk's
 * row (col & 63) times the bytes per accumulator column; 16-byte unit u of
 * box row r sits at u ^ (r & 7).
 * The address splits into a part that depends on the thread only (its
 * row, its lane's bytes, the swizzle key r & 7, the same for row + 8) and
 * one that depends on the chunk only (col - t.col and row - t.row are
 * constants once the kernel's loops are unrolled): the unit's chunk bits
 * and the lane's bits are disjoint, so the chunk enters by one XOR, and
 * ptxas keeps the per-thread part in a register instead of redoing the
 * swizzle for every pair (session 6: 4-6 integer instructions a load). */
static void gen_ring_fetch(sb_t *b, int i, const coda_arg_t *a, int first_box) {
    int esz = a->dtype == CODA_BF16 ? 2 : 4, per_col = (a->space == CODA_SPACE_DOUBLE ? 2 : 1) * esz;
    int e = 2 * per_col; /* bytes of the pair */
    sb_printf(b, "    { /* %s: copied into the stage ring by TMA */\n"
                 "        const int xl_ = (t.col & 7) * %d, xc_ = ((col - t.col) & 63) * %d;\n"
                 "        const unsigned thr_ = (t.row & 127) * 128 + ((((xl_ >> 4) ^ (t.row & 7))) << 4) + (xl_ & 15);\n"
                 "        const unsigned a_ = t.ring + (%d + (xc_ >> 7)) * t.ring_box + (thr_ ^ (xc_ & 0x70)) + "
                 "(row - t.row) * 128;\n",
              a->name, per_col, per_col, first_box);
    if (e == 4) sb_printf(b, "        L.u%d[0] = cg_lds32(a_);\n", i);
    else if (e == 8) sb_printf(b, "        cg_lds64(a_, L.u%d);\n", i);
    else sb_printf(b, "        cg_lds128(a_, L.u%d);\n", i);
    sb_printf(b, "    }\n");
}


/* Where load i's pairs come from when the kernel has slabs: the stage
 * ring, the warp's slab (staged tile inputs, column-vector slices), or
 * global memory; and whether ldmatrix can bring them (4-byte pairs: bf16
 * in the full space, f32 in the half space), in coda_epi_fetch_batch. */
typedef enum { SRC_GLOBAL, SRC_RING, SRC_STAGED, SRC_COL_SLAB } in_src_t;

static in_src_t in_source(const coda_program_t *p, const coda_inst_t *in, const coda_ring_plan_t *rp,
                          const stage_plan_t *sp) {
    const coda_arg_t *a = &p->args[in->arg];
    if (a->kind == CODA_IN_TILE && rp->first_box[in->arg] >= 0) return SRC_RING;
    if (a->kind == CODA_IN_TILE && sp->off[in->arg] >= 0) return SRC_STAGED;
    if (a->kind == CODA_IN_COL && sp->col_off[in->arg] >= 0) return SRC_COL_SLAB;
    return SRC_GLOBAL;
}

static int by_ldsm(const coda_program_t *p, const coda_inst_t *in, const coda_ring_plan_t *rp,
                   const stage_plan_t *sp) {
    if (in->op != CODA_OP_LOAD) return 0; /* only loads name an argument */
    const coda_arg_t *a = &p->args[in->arg];
    int e = value_width(in) * (a->dtype == CODA_BF16 ? 2 : 4);
    return in_source(p, in, rp, sp) != SRC_GLOBAL && e == 4;
}

/* The preprocessor test under which a source's reads are from shared
 * memory (a shared-memory source: not SRC_GLOBAL). */
static const char *src_cond(in_src_t s) {
    return s == SRC_RING ? "CODA_EPI_RING" : s == SRC_STAGED ? "CODA_EPI_STAGE" : "CG_COL_SLAB && !CODA_PROBE_NO_COL_LOAD";
}

/* coda_epi_fetch_batch: the batch's pairs (rows row and row + 8, chunks
 * col0 + 8 jj; pair (jj, h) into L[2 jj + h]), each by coda_epi_fetch, but
 * the 4-byte pairs from shared memory by ldmatrix: matrix i of an x4 is
 * rows h = i % 2 of chunk jb + i / 2 (two x4 a batch), lane l addresses
 * row l % 8 of matrix l / 8. Addresses split as the per-pair ones do: a
 * per-thread part (the lane's row, its swizzle key, its chunk bit l / 16)
 * joined by XOR to the chunk pair's constant (jb even, so its unit bits
 * and the lane's chunk bit are disjoint). A column vector's matrices are
 * its 4 chunks of the batch, all 8 rows one address (every row of the
 * fragment gets the same values). Measured: see bench/HISTORY.md session 12. */
static void gen_fetch_batch(sb_t *b, const coda_program_t *p, const coda_ring_plan_t *rp, const stage_plan_t *sp) {
    sb_printf(b,
              "static __device__ __forceinline__ void coda_epi_fetch_batch(const coda_epi_params &P_,\n"
              "        const coda_epi_tile &t, int row, int col0, coda_epi_in (&L)[2 * CODA_EPI_BATCH]) {\n"
              "#pragma unroll\n"
              "    for (int jj = 0; jj < CODA_EPI_BATCH; jj++) {\n"
              "        coda_epi_fetch(P_, t, row, col0 + 8 * jj, L[2 * jj]);\n"
              "        coda_epi_fetch(P_, t, row + 8, col0 + 8 * jj, L[2 * jj + 1]);\n"
              "    }\n");
    int any = 0;
    for (int i = 0; i < p->n_insts; i++) any |= by_ldsm(p, &p->insts[i], rp, sp);
    if (any)
        sb_printf(b, "#if CG_LDSM\n"
                     "#if CODA_EPI_BATCH != 4\n#error \"ldmatrix reads batches of 4 chunks\"\n#endif\n"
                     "    const int lane_ = t.tid & 31;\n"
                     "    const int lr_ = (lane_ & 7) + 8 * ((lane_ >> 3) & 1), lj_ = lane_ >> 4; /* its row in the warp's 16, its chunk in the two */\n"
                     "    (void)lr_; (void)lj_;\n");
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (!by_ldsm(p, in, rp, sp)) continue;
        const coda_arg_t *a = &p->args[in->arg];
        in_src_t src = in_source(p, in, rp, sp);
        sb_printf(b, "#if %s\n    { /* %s */\n", src_cond(src), a->name);
        if (src == SRC_COL_SLAB) {
            /* bf16 full and f32 half: pair (jj) at byte 16 jj + 4 (lane % 4) of the slice from col0 */
            sb_printf(b, "        const unsigned a_ = t.stage + %du + (unsigned)(col0 - t.col) * 2u + 16u * (unsigned)(lane_ >> 3);\n"
                         "        unsigned w_[4];\n"
                         "        cg_ldsm4(a_, w_[0], w_[1], w_[2], w_[3]);\n"
                         "#pragma unroll\n"
                         "        for (int jj = 0; jj < 4; jj++) L[2 * jj].u%d[0] = L[2 * jj + 1].u%d[0] = w_[jj];\n",
                      sp->col_off[in->arg], i, i);
        } else {
            /* box row: the tile's row; unit u of box row r at u ^ (r & 7). A
             * 4-byte ring pair is bf16 in the full space (the ring takes full
             * and double spaces): one 128-byte box a 64-column chunk, so no
             * box offset by column as gen_ring_fetch has for wider pairs */
            if (src == SRC_RING)
                sb_printf(b, "        const unsigned thr_ = ((t.row - ((t.tid & 31) >> 2) + lr_) & 127) * 128 + ((lj_ ^ (lane_ & 7)) << 4);\n"
                             "        const unsigned base_ = t.ring + %d * t.ring_box + (row - t.row) * 128;\n"
                             "        const int xc_ = ((col0 - t.col) & 63) * 2;\n",
                          rp->first_box[in->arg]);
            else { /* the slab region: rows of pitch bytes, unit u of row r at u ^ ((r / rp) % nch) */
                int pitch = sp->pitch[in->arg], rpp = pitch >= 128 ? 1 : 128 / pitch, nch = pitch / 16;
                sb_printf(b, "        const unsigned thr_ = lr_ * %d + ((lj_ ^ ((lr_ / %d) & %d)) << 4);\n"
                             "        const unsigned base_ = t.stage + %d;\n"
                             "        const int xc_ = 0;\n",
                          pitch, rpp, nch - 1, sp->off[in->arg]);
            }
            sb_printf(b, "#pragma unroll\n"
                         "        for (int jb = 0; jb < 4; jb += 2)\n"
                         "            cg_ldsm4(base_ + (thr_ ^ ((xc_ + 16 * jb) & 0x70)), L[2 * jb].u%d[0], L[2 * jb + 1].u%d[0],\n"
                         "                     L[2 * jb + 2].u%d[0], L[2 * jb + 3].u%d[0]);\n",
                      i, i, i, i);
        }
        sb_printf(b, "    }\n#endif\n");
    }
    if (any) sb_printf(b, "#endif\n");
    sb_printf(b, "}\n\n");
}


/* Tile and column-vector inputs are read in a separate step, coda_epi_fetch,
 * into a struct of raw words: the mainloop fetches a batch of pairs before
 * it runs the program on any of them (CODA_EPI_BATCH), so that many loads
 * are in flight at once instead of one round trip to memory per pair. */
void gen_fetch(sb_t *b, const coda_program_t *p, int even_n, const coda_ring_plan_t *rp,
                      const stage_plan_t *sp) {
    sb_printf(b, "struct coda_epi_in {\n    unsigned unused_;\n");
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (in->op != CODA_OP_LOAD) continue;
        const coda_arg_t *a = &p->args[in->arg];
        if (a->kind == CODA_IN_TILE || a->kind == CODA_IN_COL)
            sb_printf(b, "    unsigned u%d[%d]; /* %s */\n", i, vec_words(value_width(in), a->dtype), a->name);
    }
    sb_printf(b, "};\n\n");
    sb_printf(b,
              "static __device__ __forceinline__ void coda_epi_fetch(const coda_epi_params &P_,\n"
              "        const coda_epi_tile &t, int row, int col, coda_epi_in &L) {\n"
              "    const coda_epi_params *P = &P_;\n"
              "    (void)t; (void)P; (void)L;\n");
    gen_pair_start(b, even_n);
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (in->op != CODA_OP_LOAD) continue;
        const coda_arg_t *a = &p->args[in->arg];
        if (a->kind != CODA_IN_TILE && a->kind != CODA_IN_COL) continue;
        char q[160];
        const char *t = a->dtype == CODA_BF16 ? "unsigned short" : "float";
        /* Tiles, N even: unclamped row and column, the load predicated on
         * the pair being inside, the address a per-thread pointer plus the
         * chunk's columns as a constant. Column vectors: the clamped column
         * and no predicate, so that ptxas sees the same load for both rows
         * of a column and makes it once (predicated, each row kept its own:
         * session 6). N odd: the clamped row and column. */
        const char *pred = even_n && a->kind == CODA_IN_TILE ? "valid" : NULL;
        const char *c0 = pred ? first_col_split(in->vspace) : first_col_load(in->vspace);
        if (a->kind == CODA_IN_TILE)
            snprintf(q, sizeof q, "(const %s *)P->ptr[%d] + %s * P->s0[%d] + %s", t, in->arg,
                     pred ? "(long long)row" : "r", in->arg, c0);
        else /* a column vector: contiguous (innermost stride is one element) */
            snprintf(q, sizeof q, "(const %s *)P->ptr[%d] + %s", t, in->arg, c0);
        const int ldsm = by_ldsm(p, in, rp, sp);
        if (rp->first_box[in->arg] >= 0) { /* the stage ring, or global memory */
            if (ldsm) sb_printf(b, "#if CODA_EPI_RING && CG_LDSM\n    /* %s: coda_epi_fetch_batch */\n#elif CODA_EPI_RING\n", a->name);
            else sb_printf(b, "#if CODA_EPI_RING\n");
            gen_ring_fetch(b, i, a, rp->first_box[in->arg]);
            sb_printf(b, "#else\n");
            gen_vec_fetch(b, i, value_width(in), a->dtype, q, pred);
            sb_printf(b, "#endif\n");
        } else if (sp->off[in->arg] >= 0) { /* staged: the pair's elements from the slab */
            int w = value_width(in), e = w * (a->dtype == CODA_BF16 ? 2 : 4);
            char addr[512];
            slab_pair_addr(addr, sizeof addr, sp->off[in->arg], sp->pitch[in->arg], e, "((row - t.row) >> 3) & 1",
                           "((col - t.col) >> 3) % CODA_EPI_BATCH");
            if (ldsm) sb_printf(b, "#if CODA_EPI_STAGE && CG_LDSM\n    /* %s: coda_epi_fetch_batch */\n#elif CODA_EPI_STAGE\n", a->name);
            else sb_printf(b, "#if CODA_EPI_STAGE\n");
            sb_printf(b, "    { /* %s: staged by coda_epi_vput */\n%s", a->name, addr);
            if (e == 2) sb_printf(b, "        L.u%d[0] = cg_lds16(a_);\n", i);
            else if (e == 4) sb_printf(b, "        L.u%d[0] = cg_lds32(a_);\n", i);
            else if (e == 8) sb_printf(b, "        cg_lds64(a_, L.u%d);\n", i);
            else sb_printf(b, "        cg_lds128(a_, L.u%d);\n", i);
            sb_printf(b, "    }\n#else\n");
            gen_vec_fetch(b, i, w, a->dtype, q, pred);
            sb_printf(b, "#endif\n");
        } else if (a->kind == CODA_IN_COL) {
            /* from the slab where coda_epi_preload copied the tile's slice,
             * or from global memory; ones with no load under the probe
             * CODA_PROBE_NO_COL_LOAD (src/cuda/kernels/probes.cuh) */
            int w = value_width(in), e = w * (a->dtype == CODA_BF16 ? 2 : 4);
            sb_printf(b, "#if CODA_PROBE_NO_COL_LOAD\n"
                         "    for (int w_ = 0; w_ < %d; w_++) L.u%d[w_] = %s;\n",
                      vec_words(w, a->dtype), i, a->dtype == CODA_BF16 ? "0x3f803f80u" : "0x3f800000u");
            if (ldsm) sb_printf(b, "#elif CG_COL_SLAB && CG_LDSM\n    /* %s: coda_epi_fetch_batch */\n", a->name);
            if (sp->col_off[in->arg] >= 0) {
                sb_printf(b, "#elif CG_COL_SLAB\n"
                             "    { /* %s: the tile's slice, in the slab */\n"
                             "        const unsigned a_ = t.stage + %du + (unsigned)%s * %du;\n",
                          a->name, sp->col_off[in->arg], col_in_tile(a), a->dtype == CODA_BF16 ? 2u : 4u);
                if (e == 2) sb_printf(b, "        L.u%d[0] = cg_lds16(a_);\n", i);
                else if (e == 4) sb_printf(b, "        L.u%d[0] = cg_lds32(a_);\n", i);
                else if (e == 8) sb_printf(b, "        cg_lds64(a_, L.u%d);\n", i);
                else sb_printf(b, "        cg_lds128(a_, L.u%d);\n", i);
                sb_printf(b, "    }\n");
            }
            sb_printf(b, "#else\n");
            gen_vec_fetch(b, i, w, a->dtype, q, pred);
            sb_printf(b, "#endif\n");
        } else {
            gen_vec_fetch(b, i, value_width(in), a->dtype, q, pred);
        }
    }
    sb_printf(b, "}\n\n");
    gen_fetch_batch(b, p, rp, sp);
}


/* Staged tile inputs (form N16): coda_epi_vload reads the warp's 16 rows x
 * one batch's columns of each staged input into registers as 16-byte
 * vectors, coda_epi_vput stores them into the slab; coda_epi_fetch then
 * reads each pair's elements from there. The mainloop issues the next
 * batch's vload before it runs the current batch, so the global loads'
 * latency hides behind a batch of pairs. */
void gen_stage_in(sb_t *b, const coda_program_t *p, const stage_plan_t *sp) {
    int nv = 0;
    for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++)
        if (sp->off[k] >= 0 && p->args[k].kind == CODA_IN_TILE) nv += sp->pitch[k] / 32;
    sb_printf(b, "struct coda_epi_vin {\n    unsigned v[%d][4]; /* 16-byte vectors of the staged inputs */\n};\n\n",
              nv ? nv : 1);
    for (int put = 0; put < 2; put++) {
        if (put)
            sb_printf(b, "static __device__ __forceinline__ void coda_epi_vput(const coda_epi_tile &t, const coda_epi_vin &V) {\n"
                         "    (void)t; (void)V;\n");
        else
            sb_printf(b, "static __device__ __forceinline__ void coda_epi_vload(const coda_epi_params &P_,\n"
                         "        const coda_epi_tile &t, int mh, int j0, coda_epi_vin &V) {\n"
                         "    const coda_epi_params *P = &P_;\n"
                         "    (void)P; (void)t; (void)mh; (void)j0; (void)V;\n");
        if (!sp->any_in) {
            sb_printf(b, "}\n\n");
            continue;
        }
        sb_printf(b, "#if CODA_EPI_STAGE\n"
                     "#if CODA_EPI_BATCH != %d\n#error \"the staged epilogue is laid out for batches of %d chunks\"\n#endif\n"
                     "    const int lane = t.tid & 31;\n%s",
                  STAGE_BATCH, STAGE_BATCH, put ? "" : WARP_ORIGIN);
        if (put) sb_printf(b, "    coda_epi_slab_wait(t); /* TMA has read the last batch's outputs */\n");
        int v = 0;
        staged_arg_t sa;
        for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
            if (!staged_arg(p, sp, k, CODA_IN_TILE, &sa)) continue;
            for (int i = 0; i < sa.pitch / 32; i++, v++) {
                sb_printf(b, "    { /* %s, vector %d */\n        const int idx = lane + %d, r_ = idx / %d, x_ = (idx %% %d) * 16;\n",
                          sa.a->name, i, 32 * i, sa.nch, sa.nch);
                if (put)
                    sb_printf(b, "        (void)x_;\n        cg_sts128(%s, V.v[%d][0], V.v[%d][1], V.v[%d][2], V.v[%d][3]);\n",
                              sa.addr, v, v, v, v);
                else
                    sb_printf(b, "        const long long gr = row0 + r_, gc = %s + (idx %% %d) * %d;\n"
                                 "        (void)x_;\n"
                                 "        cg_ld128p(gr < P->m && %d * j0 < %s - gc,\n"
                                 "                  (const %s *)P->ptr[%d] + gr * P->s0[%d] + gc + %d * j0,\n"
                                 "                  &V.v[%d][0], &V.v[%d][1], &V.v[%d][2], &V.v[%d][3]);\n",
                              sa.first, sa.nch, 16 / sa.esz, sa.jmul, sa.ncols, sa.esz == 2 ? "unsigned short" : "float",
                              k, k, sa.jmul, v, v, v, v);
                sb_printf(b, "    }\n");
            }
        }
        if (put) sb_printf(b, "    __syncwarp(); /* the slab holds the batch's inputs */\n");
        sb_printf(b, "#endif\n}\n\n");
    }
}
