/* cg_layout.c - where a generated epilogue keeps its tile inputs and
 * outputs: regions of each consumer warp's 4 KiB shared-memory slab (staged
 * tile inputs and outputs, column vectors), their swizzled addresses, and
 * the tile inputs that come through the mainloop's stage ring. */
#include "codegen/cg.h"

#include <stdio.h>
#include <string.h>

/* Staging of tile outputs (form N16; the kernel sets CODA_EPI_STAGE; the
 * plan's struct, stage_plan_t, is defined above): each
 * consumer warp owns a 4 KiB shared-memory slab (t.stage). For one batch of
 * CODA_EPI_BATCH (4) column chunks the pairs write their outputs into the
 * slab in the fragment layout (16 rows of the warp x the batch's columns, one
 * region per output), and coda_epi_flush writes them out as 16-byte vectors
 * or, for the store plan's outputs, by TMA bulk copies (codegen.h).
 * Stored straight from the fragment, every store instruction would put 4 to
 * 8 bytes into each of 8 rows: measured on the H200, resid_add's one bf16
 * output then cost 0.075 ms at M = N = K = 4096, 40% of the GEMM. Regions
 * are rows of `pitch` bytes with their 16-byte units swizzled by row, so
 * that neither the fragment writes nor the vector reads conflict on banks. */
static int stage_pitch(const coda_arg_t *a) {
    return STAGE_BATCH * 4 * space_width(a->space) * (a->dtype == CODA_BF16 ? 2 : 4); /* 4 lanes a chunk */
}

/* Argument k is loaded, and only in its own space. */
int loaded_in_own_space(const coda_program_t *p, int k) {
    int loads = 0;
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (in->arg != k || in->op != CODA_OP_LOAD) continue;
        if (in->vspace != p->args[k].space) return 0;
        loads++;
    }
    return loads > 0;
}

int coda__codegen_col_staged(const coda_program_t *p, int k) {
    return p && k >= 0 && k < p->n_args && p->args[k].kind == CODA_IN_COL && loaded_in_own_space(p, k);
}

/* Tile outputs stored once and tile inputs loaded in their own space get a
 * region while the slab has room. Inputs and outputs share the slab: the
 * inputs are read into registers (coda_epi_fetch) before any pair writes an
 * output, with a __syncwarp between. */
void plan_staging(const coda_program_t *p, int n16, const coda_ring_plan_t *rp, stage_plan_t *sp) {
    int used_in = 0, used_out = 0;
    for (int k = 0; k < CODA_EPI_MAX_ARGS; k++) sp->off[k] = sp->col_off[k] = sp->map[k] = -1, sp->pitch[k] = 0;
    sp->any_in = sp->any_out = sp->any_col = sp->nmap = 0;
    if (!n16) return;
    for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
        const coda_arg_t *a = &p->args[k];
        if (rp->first_box[k] >= 0) continue; /* comes through the stage ring */
        int stores = 0;
        for (int i = 0; i < p->n_insts; i++) stores += p->insts[i].arg == k && p->insts[i].op == CODA_OP_STORE;
        int pitch = stage_pitch(a), *used;
        if (a->kind == CODA_OUT_TILE && stores == 1) used = &used_out;
        else if (a->kind == CODA_IN_TILE && loaded_in_own_space(p, k)) used = &used_in;
        else continue;
        if (*used + 16 * pitch > STAGE_BYTES) continue;
        sp->off[k] = *used;
        sp->pitch[k] = pitch;
        *used += 16 * pitch;
        if (a->kind == CODA_IN_TILE) sp->any_in = 1;
        else sp->any_out = 1;
        /* TMA stores (codegen.h): rows of 32, 64 or 128 bytes, the region
         * aligned to its swizzle's period of 8 rows */
        if (a->kind == CODA_OUT_TILE && pitch <= 128 && sp->off[k] % (8 * pitch) == 0 &&
            sp->nmap < CODA_STORE_MAX_MAP)
            sp->map[k] = sp->nmap++;
    }
    /* ... for two outputs or more. Measured on the H200 (bench_epilogue,
     * A/B against the vector stores): with two staged outputs
     * TMA was 0.1-3.7% faster (resid_norm, gateup_swiglu_train, swiglu_bwd,
     * rmsnorm_bwd at 2048-8192), with one 0-2.7% slower (qkv_rope,
     * gateup_swiglu, lmhead_bwd at 2048), double-buffered or not: its
     * fence and copy cost more than the vector stores they replace. */
    if (sp->nmap < 2) {
        for (int k = 0; k < CODA_EPI_MAX_ARGS; k++) sp->map[k] = -1;
        sp->nmap = 0;
    }
    /* Column vectors loaded in their own space: the tile's slice of each
     * after the staged regions, while it fits (sized for CODA_BN = 256). */
    int used = used_in > used_out ? used_in : used_out;
    for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
        const coda_arg_t *a = &p->args[k];
        if (!coda__codegen_col_staged(p, k)) continue;
        int bytes = 256 * space_width(a->space) / 2 * (a->dtype == CODA_BF16 ? 2 : 4);
        if (used + bytes > STAGE_BYTES) continue;
        sp->col_off[k] = used;
        used += bytes;
        sp->any_col = 1;
    }
}


void coda__codegen_store_plan(const coda_program_t *p, coda_cg_form_t form, coda_store_plan_t *plan) {
    memset(plan, 0, sizeof *plan);
    for (int k = 0; k < CODA_EPI_MAX_ARGS; k++) plan->map_of[k] = -1;
    if (!p || (form != CODA_CG_N16 && form != CODA_CG_RING)) return;
    coda_ring_plan_t rp;
    coda__codegen_ring_plan(form == CODA_CG_RING ? p : NULL, &rp);
    stage_plan_t sp;
    plan_staging(p, 1, &rp, &sp);
    for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
        int s = sp.map[k];
        if (s < 0) continue;
        plan->arg[s] = k;
        plan->cols[s] = sp.pitch[k] / (p->args[k].dtype == CODA_BF16 ? 2 : 4);
        plan->map_of[k] = s;
    }
    plan->nmap = sp.nmap;
}


/* The slab address of a pair's elements (e bytes) in row half h and chunk
 * jj of the batch (C expressions, constants once the kernel's loops are
 * unrolled): the lane's part (its row, its bytes, the swizzle key) and the
 * chunk's part (a 16-byte unit, and for e = 2 the upper 8 bytes) have
 * disjoint bits, so the chunk enters by an XOR and an add to a per-thread
 * value instead of the whole swizzle for every pair. */
void slab_pair_addr(char *buf, size_t cap, int off, int pitch, int e, const char *h, const char *jj) {
    int rp = pitch >= 128 ? 1 : 128 / pitch, nch = pitch / 16;
    snprintf(buf, cap,
             "        const int r_ = 8 * (%s) + ((t.tid & 31) >> 2), xl_ = (t.tid & 3) * %d, xc_ = (%s) * %d;\n"
             "        const unsigned a_ = t.stage + %d + ((r_ * %d + ((((xl_ >> 4) ^ ((r_ / %d) & %d))) << 4) + "
             "(xl_ & 15)) ^ (xc_ & ~15)) + (xc_ & 15);\n",
             h, e, jj, 4 * e, off, pitch, rp, nch - 1);
}

/* The swizzled slab address of byte x_ of staged row r_ (C expressions). */
void stage_addr(char *buf, size_t cap, int off, int pitch) {
    int rp = pitch >= 128 ? 1 : 128 / pitch, nch = pitch / 16;
    snprintf(buf, cap, "t.stage + %d + r_ * %d + ((((x_ >> 4) ^ ((r_ / %d) & %d))) << 4) + (x_ & 15)", off, pitch,
             rp, nch - 1);
}


/* Tile inputs through the stage ring (form RING, codegen.h). */
void coda__codegen_ring_plan(const coda_program_t *p, coda_ring_plan_t *plan) {
    memset(plan, 0, sizeof *plan);
    for (int k = 0; k < CODA_EPI_MAX_ARGS; k++) plan->first_box[k] = -1;
    if (!p) return;
    for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
        const coda_arg_t *a = &p->args[k];
        if (a->kind != CODA_IN_TILE || (a->dtype != CODA_BF16 && a->dtype != CODA_F32)) continue;
        if (a->space != CODA_SPACE_FULL && a->space != CODA_SPACE_DOUBLE) continue;
        if (!loaded_in_own_space(p, k)) continue;
        /* bytes of one row of a 64-column chunk, in 128-byte boxes */
        int per_col = (a->space == CODA_SPACE_DOUBLE ? 2 : 1) * (a->dtype == CODA_BF16 ? 2 : 4);
        int boxes = 64 * per_col / 128, elems = 128 / (a->dtype == CODA_BF16 ? 2 : 4);
        if (plan->nbox + boxes > CODA_RING_MAX_BOX) continue;
        plan->first_box[k] = plan->nbox;
        for (int b = 0; b < boxes; b++) {
            plan->arg[plan->nbox] = k;
            plan->xmul[plan->nbox] = a->space == CODA_SPACE_DOUBLE ? 2 : 1;
            plan->xadd[plan->nbox] = b * elems;
            plan->nbox++;
        }
    }
}


int staged_arg(const coda_program_t *p, const stage_plan_t *sp, int k, coda_arg_kind_t kind,
                      staged_arg_t *sa) {
    if (sp->off[k] < 0 || p->args[k].kind != kind) return 0;
    coda_space_t sw = p->args[k].space;
    sa->a = &p->args[k];
    sa->esz = sa->a->dtype == CODA_BF16 ? 2 : 4;
    sa->pitch = sp->pitch[k];
    sa->nch = sa->pitch / 16;
    sa->first = sw == CODA_SPACE_HALF ? "(col0 >> 1)" : sw == CODA_SPACE_FULL ? "col0" : "(2 * col0)";
    sa->jmul = sw == CODA_SPACE_HALF ? 4 : sw == CODA_SPACE_FULL ? 8 : 16;
    sa->ncols = sw == CODA_SPACE_HALF ? "(P->n / 2)" : sw == CODA_SPACE_FULL ? "(long long)P->n" : "(2LL * P->n)";
    stage_addr(sa->addr, sizeof sa->addr, sp->off[k], sa->pitch);
    return 1;
}

/* The warp's first row and the tile's first accumulator column. The
 * batch's columns (j0) are added last, as a constant: the address of a
 * lane's vector is then one per-tile register and an immediate offset for
 * every batch, and its bounds test one compare (session 6: the 64-bit
 * address arithmetic had been redone for every vector of every batch). */
const char coda__cg_warp_origin[] =
    "    const long long row0 = t.row - (lane >> 2) + 64 * mh; /* the warp's first row */\n"
    "    const long long col0 = t.col - 2 * (lane & 3); /* the tile's first acc column */\n";

int stsm_out(const coda_program_t *p, const stage_plan_t *sp, int k) {
    const coda_arg_t *a = &p->args[k];
    return sp->off[k] >= 0 && a->kind == CODA_OUT_TILE &&
           space_width(a->space) * (a->dtype == CODA_BF16 ? 2 : 4) == 4;
}
