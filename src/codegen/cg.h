/* cg.h - what the pieces of the CUDA epilogue generator share (internal to
 * src/codegen; the generator's entry points are in codegen.h).
 *
 * The generator writes CUDA C text for one program: epilogue_cuda.c drives it,
 * cg_values.c holds the text helpers and the value geometry, cg_layout.c
 * where inputs and outputs live (the warp's slab, the stage ring),
 * cg_inputs.c the hooks that bring inputs in (coda_epi_preload,
 * coda_epi_begin, coda_epi_fetch, coda_epi_vload/vput), cg_pair.c the
 * program on one accumulator pair (coda_epi_pair), cg_tile_end.c what
 * happens once a batch or a tile is done (coda_epi_flush, coda_epi_end).
 * The short names below are what the code reads; the coda__cg_ names are
 * what the linker sees. */
#ifndef CODA_CG_H
#define CODA_CG_H

#include "codegen/codegen.h"

#include <stddef.h>

/* ---- a growable string ---- */

typedef struct sb {
    char *buf;
    size_t len, cap;
    int oom;
} sb_t;

#define sb_printf coda__cg_sb_printf
void sb_printf(sb_t *b, const char *fmt, ...) CODA_PRINTF(2, 3);

/* ---- value geometry and text (cg_values.c) ---- */

#define space_width coda__cg_space_width
#define value_width coda__cg_value_width
#define el coda__cg_el
#define elem_ok coda__cg_elem_ok
#define elem_col coda__cg_elem_col
#define load_text coda__cg_load_text
#define red_init coda__cg_red_init
#define red_expr coda__cg_red_expr
#define lse_width coda__cg_lse_width
#define first_col coda__cg_first_col
#define first_col_split coda__cg_first_col_split
#define first_col_load coda__cg_first_col_load
#define vec_words coda__cg_vec_words
#define space_count coda__cg_space_count
#define space_per_tile coda__cg_space_per_tile
#define gen_pair_start coda__cg_gen_pair_start
/* Elements of a space per accumulator pair. */
int space_width(coda_space_t s);
/* Registers a value takes per pair: its space's width, or 1 if it does not
 * vary along columns. */
int value_width(const coda_inst_t *in);
/* Name of element e of value v (broadcast if v does not vary along columns). */
const char *el(const coda_program_t *p, int v, int e, char *buf, size_t cap);
/* Is element e of a value in space s inside the matrix (C text)? */
const char *elem_ok(coda_space_t s, int e);
/* Column index of element e of space s, as C text. */
void elem_col(coda_space_t s, int e, char *buf, size_t cap);
/* C text that reads element `idx` of row vector a (argument k) as float. */
void load_text(const coda_arg_t *a, int k, const char *idx, char *buf, size_t cap);
/* A reduction's start value, and "x OP y" for it into buf. */
const char *red_init(coda_reduce_t r);
void red_expr(char *buf, size_t cap, coda_reduce_t r, const char *x, const char *y);
/* Elements a pair gives the lse output k (the width of its value). */
int lse_width(const coda_program_t *p, int k);
/* First column of the elements a pair covers, in space s (C text): as it
 * stands, split as the thread's first column plus the chunk's offset, and
 * from the clamped column cl (loads). */
const char *first_col(coda_space_t s);
const char *first_col_split(coda_space_t s);
const char *first_col_load(coda_space_t s);
/* Elements of a row of C in space s, and of a tile's row (C text). */
const char *space_count(coda_space_t s);
const char *space_per_tile(coda_space_t s);
/* 32-bit words a pair's w elements of type dt take (the fetch struct). */
int vec_words(int w, coda_dtype_t dt);
/* The lines coda_epi_fetch and coda_epi_pair start with (valid, r, cl, ok1). */
void gen_pair_start(sb_t *b, int even_n);

/* ---- where inputs and outputs live (cg_layout.c) ---- */

/* How a program uses each consumer warp's 4 KiB slab (t.stage) in the
 * N16 and RING forms: staged tile inputs and outputs (plan_staging, below),
 * then the tile's slice of each column vector (coda_epi_preload). */
#define STAGE_BATCH 4
#define STAGE_BYTES 4096
typedef struct stage_plan {
    int off[CODA_EPI_MAX_ARGS];   /* region offset in the slab; -1: not staged */
    int pitch[CODA_EPI_MAX_ARGS]; /* bytes per staged row */
    int any_in, any_out;
    int col_off[CODA_EPI_MAX_ARGS]; /* column vector's region; -1: read from global memory */
    int any_col;
    int map[CODA_EPI_MAX_ARGS]; /* staged output's TMA map (the store plan, codegen.h); -1: vector stores */
    int nmap;
} stage_plan_t;

#define loaded_in_own_space coda__cg_loaded_in_own_space
#define plan_staging coda__cg_plan_staging
#define slab_pair_addr coda__cg_slab_pair_addr
#define stage_addr coda__cg_stage_addr
#define staged_arg coda__cg_staged_arg
/* Argument k is loaded, and only in its own space. */
int loaded_in_own_space(const coda_program_t *p, int k);
/* The slab plan of a program in a form with staging (n16) or without. */
void plan_staging(const coda_program_t *p, int n16, const coda_ring_plan_t *rp, stage_plan_t *sp);
/* The slab address of a pair's e bytes in row half h and chunk jj of the
 * batch, and of byte x_ of staged row r_ (C text into buf). */
void slab_pair_addr(char *buf, size_t cap, int off, int pitch, int e, const char *h, const char *jj);
void stage_addr(char *buf, size_t cap, int off, int pitch);
/* A staged argument as the flush and the input staging need it: element
 * size, region pitch and 16-byte units per row, C expressions for its first
 * column at accumulator column col0 and for its number of columns, and the
 * swizzled slab address of unit x_ of row r_. */
typedef struct staged_arg {
    const coda_arg_t *a;
    int esz, pitch, nch;
    int jmul;                  /* the arg's columns per unit of j0 (8 accumulator columns) */
    const char *first, *ncols; /* the warp's first column in the tile (j0 = 0); the arg's columns */
    char addr[160];
} staged_arg_t;

int staged_arg(const coda_program_t *p, const stage_plan_t *sp, int k, coda_arg_kind_t kind, staged_arg_t *sa);
#define stsm_out coda__cg_stsm_out
/* Output k is staged in 4-byte pairs (bf16 full space, f32 half space), so
 * its pairs go into the slab by stmatrix (CG_LDSM: coda_epi_pair keeps the
 * words of two chunks in S->ow<k> and writes the four at once). */
int stsm_out(const coda_program_t *p, const stage_plan_t *sp, int k);
/* The warp's first row and the tile's first accumulator column (C text). */
extern const char coda__cg_warp_origin[];
#define WARP_ORIGIN coda__cg_warp_origin

/* ---- the hooks (cg_inputs.c, cg_pair.c, cg_tile_end.c) ---- */

#define gen_vec_fetch coda__cg_gen_vec_fetch
#define gen_state coda__cg_gen_state
#define gen_fetch coda__cg_gen_fetch
#define gen_stage_in coda__cg_gen_stage_in
#define gen_pair coda__cg_gen_pair
#define gen_flush coda__cg_gen_flush
#define gen_slab_wait coda__cg_gen_slab_wait
#define gen_end coda__cg_gen_end
/* Fetch value i's w elements as raw words from element pointer q into
 * L.u<i>[] (pred: C text of the load's predicate, or NULL). */
void gen_vec_fetch(sb_t *b, int i, int w, coda_dtype_t dt, const char *q, const char *pred);
/* coda_epi_pre, coda_epi_preload, coda_epi_state and coda_epi_begin. */
void gen_state(sb_t *b, const coda_program_t *p, const stage_plan_t *sp);
/* coda_epi_in and coda_epi_fetch. */
void gen_fetch(sb_t *b, const coda_program_t *p, int even_n, const coda_ring_plan_t *rp, const stage_plan_t *sp);
/* coda_epi_vin, coda_epi_vload and coda_epi_vput. */
void gen_stage_in(sb_t *b, const coda_program_t *p, const stage_plan_t *sp);
/* coda_epi_pair. */
coda_status_t gen_pair(sb_t *b, const coda_program_t *p, int even_n, const stage_plan_t *sp);
/* CODA_EPI_TMA_STORES and coda_epi_slab_wait (before every other hook). */
void gen_slab_wait(sb_t *b, const stage_plan_t *sp);
/* coda_epi_flush and coda_epi_end. */
void gen_flush(sb_t *b, const coda_program_t *p, const stage_plan_t *sp);
void gen_end(sb_t *b, const coda_program_t *p, const stage_plan_t *sp);

#endif
