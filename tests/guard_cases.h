/* guard_cases.h - every entry point of coda through guarded views (guard.h),
 * on the backend whose memory g_env_t names, against the CPU backend run on
 * contiguous copies of the same data.
 *
 * A case passes when the call either
 *   - returns CODA_OK, writes nothing outside its outputs' views, leaves its
 *     inputs as they were, and its outputs match the reference run (bit for
 *     bit on the CPU, where only the views' placement differs; within
 *     tolerance on the GPU), or
 *   - fails with a status and a message, and changes nothing at all.
 * g_random() draws calls at random (shapes, placements, layouts, dtypes,
 * tilings, programs, and now and then a fault: a misaligned base, a row
 * stride the copy engine cannot take, K not a multiple of 8, a wrong
 * extent, an unsupported dtype) and checks each the same way. */
#ifndef CODA_TEST_GUARD_CASES_H
#define CODA_TEST_GUARD_CASES_H

#include "guard.h"

typedef struct g_env {
    coda_context_t *ctx;
    const g_mem_t *mem;
    double tol_bf16, tol_f32; /* vs the CPU reference; 0: bit for bit    */
    double tol_layer;         /* the layer's outputs (a chain of roundings) */
    int64_t align;            /* base and row-stride alignment of GEMM operands */
    int verbose;
    int calls, passed_ok, refused; /* counts */
} g_env_t;

static const char *const g_lname[3] = {"NT", "NN", "TN"};

static inline int g_pick(h_rng *r, int n) {
    int i = (int)((rng_uniform(r) + 1.0f) * 0.5f * (float)n);
    return i < 0 ? 0 : i >= n ? n - 1 : i;
}

static inline double g_tol(const g_env_t *E, coda_dtype_t dt) {
    return dt == CODA_BF16 ? E->tol_bf16 : E->tol_f32;
}

/* The end of a call on guarded views: a failure must have changed nothing;
 * a success must have kept to its views. Returns 1 if the outputs are to be
 * compared (the call succeeded). */
static int g_settle(g_env_t *E, const char *what, coda_status_t s, g_buf_t *const *bufs, int nbufs) {
    E->calls++;
    if (s != CODA_OK) {
        E->refused++;
        CHECK(coda_last_error()[0] != 0, "%s: failed with %s and no message", what, coda_status_name(s));
        for (int i = 0; i < nbufs; i++) g_same(bufs[i], what);
        if (E->verbose) printf("  refused  %-60s %s: %s\n", what, coda_status_name(s), coda_last_error());
        return 0;
    }
    int64_t bad = 0;
    for (int i = 0; i < nbufs; i++) bad += g_check(bufs[i], what);
    if (!bad) E->passed_ok++;
    if (E->verbose || bad) printf("  %-8s %s\n", bad ? "WROTE" : "ok", what);
    return 1;
}

/* ---- plain GEMM ---- */

static void g_gemm_case(g_env_t *E, h_rng *r, coda_layout_t layout, int64_t m, int64_t n, int64_t k,
                        coda_dtype_t cdt, float alpha, float beta, g_place_t pa, g_place_t pb, g_place_t pc,
                        int64_t a_align, coda_dtype_t adt) {
    int64_t sa[2] = {layout == CODA_LAYOUT_TN ? k : m, layout == CODA_LAYOUT_TN ? m : k};
    int64_t sb[2] = {layout == CODA_LAYOUT_NT ? n : k, layout == CODA_LAYOUT_NT ? k : n};
    int64_t sc[2] = {m, n};
    g_buf_t A, B, C;
    g_make(&A, E->mem, "a", adt, 2, sa, pa, a_align, G_IN, G_RANDOM, 1.0f, 0, r);
    g_make(&B, E->mem, "b", CODA_BF16, 2, sb, pb, E->align, G_IN, G_RANDOM, 1.0f, 0, r);
    g_make(&C, E->mem, "c", cdt, 2, sc, pc, E->align, beta != 0 ? G_INOUT : G_OUT, G_RANDOM, 1.0f, 0, r);
    char what[160];
    snprintf(what, sizeof what, "gemm %s %lldx%lldx%lld %s a=%g b=%g [a %s%s, b %s, c %s]", g_lname[layout],
             (long long)m, (long long)n, (long long)k, coda_dtype_name(cdt), alpha, beta, g_place_name[pa],
             a_align < E->align ? " misaligned" : "", g_place_name[pb], g_place_name[pc]);
    coda_status_t s = coda_gemm(E->ctx, layout, &A.t, &B.t, &C.t, alpha, beta, NULL);
    g_buf_t *all[3] = {&A, &B, &C};
    if (g_settle(E, what, s, all, 3)) {
        coda_tensor_t Ah = g_host_copy(&A), Bh = g_host_copy(&B), Ch = g_host_copy(&C);
        coda_status_t sr = coda_gemm(E->ctx, layout, &Ah, &Bh, &Ch, alpha, beta, NULL);
        CHECK(sr == CODA_OK, "%s: the CPU reference refused what the backend ran: %s", what, coda_last_error());
        if (sr == CODA_OK) {
            void *got = g_view(&C, 1);
            g_compare(what, "c", cdt, got, Ch.data, m * n, g_tol(E, cdt));
            free(got);
        }
        free(Ah.data); free(Bh.data); free(Ch.data);
    }
    g_free(&A); g_free(&B); g_free(&C);
}

/* ---- fused GEMM ---- */

#define G_MAX_ARGS 16

/* places: one per program argument (NULL: drawn at random); arg_align:
 * alignment of tile and column arguments (0: the element size; the GPU
 * needs one accumulator pair's bytes, and takes 16-byte vectors when it
 * can). fault: 0 none, 1 a tile argument one element off its alignment,
 * 2 a wrong extent on an output. */
static void g_fused_case(g_env_t *E, h_rng *r, const char *name, const char *text, coda_layout_t layout,
                         int64_t m, int64_t n, int64_t k, const g_place_t *places, int64_t arg_align, int fault) {
    coda_program_t *p = NULL;
    if (coda_program_parse(text, &p) != CODA_OK) {
        CHECK(0, "%s: program does not parse: %s", name, coda_last_error());
        return;
    }
    coda_tiling_t tl;
    REQUIRE_OK(coda_choose_program_tiling(E->ctx, E->mem->device, layout, m, n, k, p, &tl));
    int64_t sa[2] = {layout == CODA_LAYOUT_TN ? k : m, layout == CODA_LAYOUT_TN ? m : k};
    int64_t sb[2] = {layout == CODA_LAYOUT_NT ? n : k, layout == CODA_LAYOUT_NT ? k : n};
    g_buf_t bufs[G_MAX_ARGS + 2];
    memset(bufs, 0, sizeof bufs);
    g_make(&bufs[0], E->mem, "a", CODA_BF16, 2, sa, G_TIGHT, E->align, G_IN, G_RANDOM, 0.5f, 0, r);
    g_make(&bufs[1], E->mem, "b", CODA_BF16, 2, sb, places ? G_TIGHT : (g_place_t)g_pick(r, G_NPLACES), E->align,
           G_IN, G_RANDOM, 0.5f, 0, r);
    int na = coda_program_num_args(p), nb = 0, faulted = 0;
    coda_binding_t bind[G_MAX_ARGS];
    g_buf_t *used[G_MAX_ARGS + 2] = {&bufs[0], &bufs[1]};
    int nused = 2;
    char placed[96] = "";
    for (int i = 0; i < na && i < G_MAX_ARGS; i++) {
        const char *an;
        coda_arg_kind_t kind;
        coda_dtype_t dt;
        coda_space_t sp;
        coda_reduce_t red;
        int nd;
        int64_t sh[3];
        REQUIRE_OK(coda_program_arg_info(p, i, &an, &kind, &dt, &sp, &red));
        REQUIRE_OK(coda_program_arg_shape(p, i, m, n, &tl, &nd, sh, &dt));
        bind[nb].name = an;
        bind[nb].scalar = 0.0f;
        memset(&bind[nb].tensor, 0, sizeof bind[nb].tensor);
        if (kind == CODA_IN_SCALAR) {
            bind[nb++].scalar = 0.25f + 0.5f * (rng_uniform(r) + 1.0f);
            continue;
        }
        if (kind == CODA_IN_ROWPART) sh[1] = 3;
        int out = kind == CODA_OUT_TILE || kind == CODA_OUT_ROWRED || kind == CODA_OUT_COLRED ||
                  kind == CODA_OUT_LSE;
        g_place_t pl = places ? places[i] : (g_place_t)g_pick(r, G_NPLACES);
        int64_t es = (int64_t)coda_dtype_size(dt);
        int64_t al = es;
        if (kind == CODA_IN_TILE || kind == CODA_OUT_TILE || kind == CODA_IN_COL)
            al = arg_align ? arg_align : es;
        g_buf_t *gb = &bufs[2 + i];
        g_fill_t fill = kind == CODA_IN_ROWPART ? G_POSITIVE : dt == CODA_I32 ? G_TARGETS : G_RANDOM;
        g_make(gb, E->mem, an, dt, nd, sh, pl, al, out ? G_OUT : G_IN, fill, 1.0f, n / 2 > 1 ? n / 2 : 1, r);
        int64_t pair = es * (sp == CODA_SPACE_HALF ? 1 : sp == CODA_SPACE_FULL ? 2 : 4);
        if (fault == 1 && !faulted && arg_align > 0 && (kind == CODA_IN_TILE || kind == CODA_OUT_TILE) && pair > es) {
            gb->t.data = (char *)gb->t.data + es; /* one element off the pair alignment */
            faulted = 1;
        } else if (fault == 2 && !faulted && out) {
            gb->t.shape[0] += 1; /* one row too many */
            faulted = 1;
        }
        bind[nb++].tensor = gb->t;
        used[nused++] = gb;
        size_t len = strlen(placed);
        snprintf(placed + len, sizeof placed - len, "%s%s:%c", len ? " " : "", an, g_place_name[pl][0]);
    }
    char what[256];
    snprintf(what, sizeof what, "fused %s %s %lldx%lldx%lld tile %dx%d align %lld%s [%s]", name, g_lname[layout],
             (long long)m, (long long)n, (long long)k, tl.tile_m, tl.tile_n, (long long)arg_align,
             faulted == 1 ? " misaligned" : faulted ? " wrong extent" : "", placed);
    coda_status_t s = coda_gemm_epilogue(E->ctx, layout, &bufs[0].t, &bufs[1].t, p, bind, nb, &tl, NULL);
    CHECK(!faulted || s != CODA_OK, "%s: a faulty call was accepted", what);
    if (g_settle(E, what, s, used, nused)) {
        /* the reference: the CPU backend, same tiling, contiguous copies */
        coda_tensor_t hc[G_MAX_ARGS + 2];
        coda_binding_t hb[G_MAX_ARGS];
        for (int u = 0; u < nused; u++) hc[u] = g_host_copy(used[u]);
        int u = 2;
        for (int i = 0; i < nb; i++) {
            hb[i] = bind[i];
            if (bind[i].tensor.data) hb[i].tensor = hc[u++];
        }
        coda_status_t sr = coda_gemm_epilogue(E->ctx, layout, &hc[0], &hc[1], p, hb, nb, &tl, NULL);
        CHECK(sr == CODA_OK, "%s: the CPU reference refused what the backend ran: %s", what, coda_last_error());
        for (int v = 2; sr == CODA_OK && v < nused; v++) {
            if (used[v]->role == G_IN) continue;
            void *got = g_view(used[v], 1);
            g_compare(what, used[v]->name, used[v]->t.dtype, got, hc[v].data, coda_tensor_numel(&hc[v]),
                      g_tol(E, used[v]->t.dtype));
            free(got);
        }
        for (int v = 0; v < nused; v++) free(hc[v].data);
    }
    for (int v = 0; v < nused; v++) g_free(used[v]);
    coda_program_free(p);
}

/* ---- finishing steps ---- */

static void g_finish_case(g_env_t *E, h_rng *r, int which, int64_t rows, int64_t T, g_place_t pp, g_place_t po) {
    g_buf_t P, O, Tg, O2;
    memset(&Tg, 0, sizeof Tg);
    memset(&O2, 0, sizeof O2);
    char what[160];
    coda_status_t s;
    static const char *const names[5] = {"reduce sum", "reduce max", "reduce sumsq", "rstd", "lse"};
    snprintf(what, sizeof what, "finish %s %lldx%lld [partials %s, out %s]", names[which], (long long)rows,
             (long long)T, g_place_name[pp], g_place_name[po]);
    int64_t sp[3] = {rows, T, 3}, so[1] = {rows};
    g_make(&P, E->mem, "partials", CODA_F32, which == 4 ? 3 : 2, sp, pp, 4, G_IN,
           which == 3 ? G_POSITIVE : G_RANDOM, 2.0f, 0, r);
    g_make(&O, E->mem, "out", CODA_F32, 1, so, po, 4, G_OUT, G_RANDOM, 1.0f, 0, r);
    g_buf_t *all[4] = {&P, &O, NULL, NULL};
    int nall = 2;
    if (which == 4) {
        /* l (the sum of exp) must be positive: make every third element so */
        float *img = (float *)(P.init + P.off);
        (void)img;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t t = 0; t < T; t++) {
                float *l = (float *)(P.init + P.off + i * P.ld + (t * 3 + 1) * 4);
                *l = fabsf(*l) + 0.5f;
            }
        E->mem->put(P.block, P.init, P.bytes);
        g_make(&Tg, E->mem, "targets", CODA_I32, 1, so, G_OFFSET, 4, G_IN, G_TARGETS, 1.0f, 1000, r);
        g_make(&O2, E->mem, "loss", CODA_F32, 1, so, G_OFFSET, 4, G_OUT, G_RANDOM, 1.0f, 0, r);
        all[2] = &Tg, all[3] = &O2, nall = 4;
    }
    if (which < 3) s = coda_finish_reduce(E->ctx, (coda_reduce_t)which, &P.t, &O.t, NULL);
    else if (which == 3) s = coda_finish_rstd(E->ctx, &P.t, 64, 1e-5f, &O.t, NULL);
    else s = coda_finish_lse(E->ctx, &P.t, &Tg.t, -100, &O.t, &O2.t, NULL);
    if (g_settle(E, what, s, all, nall)) {
        coda_tensor_t Ph = g_host_copy(&P), Oh = g_host_copy(&O), Th = {0}, O2h = {0};
        coda_status_t sr;
        if (which < 3) sr = coda_finish_reduce(E->ctx, (coda_reduce_t)which, &Ph, &Oh, NULL);
        else if (which == 3) sr = coda_finish_rstd(E->ctx, &Ph, 64, 1e-5f, &Oh, NULL);
        else {
            Th = g_host_copy(&Tg), O2h = g_host_copy(&O2);
            sr = coda_finish_lse(E->ctx, &Ph, &Th, -100, &Oh, &O2h, NULL);
        }
        CHECK(sr == CODA_OK, "%s: CPU reference: %s", what, coda_last_error());
        void *got = g_view(&O, 1);
        if (sr == CODA_OK) g_compare(what, "out", CODA_F32, got, Oh.data, rows, E->tol_f32);
        free(got);
        if (which == 4) {
            got = g_view(&O2, 1);
            if (sr == CODA_OK) g_compare(what, "loss", CODA_F32, got, O2h.data, rows, E->tol_f32);
            free(got);
            free(Th.data); free(O2h.data);
        }
        free(Ph.data); free(Oh.data);
    }
    for (int i = 0; i < nall; i++) g_free(all[i]);
}

/* ---- the LLaMA layer, forward and backward ---- */

static void g_make_weights(g_env_t *E, h_rng *r, const coda_llama_config_t *c, coda_dtype_t dt, g_role_t role,
                           g_place_t pl, g_buf_t wb[8], coda_llama_weights_t *w) {
    int64_t nq = c->n_heads * c->head_dim, nkv = c->n_kv_heads * c->head_dim;
    static const char *const names[8] = {"g1", "wqkv", "wo", "g2", "wgu", "wd", "gf", "wlm"};
    int64_t shapes[8][2] = {{c->d, 0}, {nq + 2 * nkv, c->d}, {c->d, nq}, {c->d, 0},
                            {2 * c->ffn, c->d}, {c->d, c->ffn}, {c->d, 0}, {c->vocab, c->d}};
    coda_tensor_t *f[8] = {&w->g1, &w->wqkv, &w->wo, &w->g2, &w->wgu, &w->wd, &w->gf, &w->wlm};
    memset(w, 0, sizeof *w);
    int nw = c->vocab > 0 ? 8 : 6;
    for (int i = 0; i < 8; i++) {
        memset(&wb[i], 0, sizeof wb[i]);
        if (i >= nw) continue;
        int vec = shapes[i][1] == 0;
        g_make(&wb[i], E->mem, names[i], dt, vec ? 1 : 2, shapes[i], pl, E->align, role,
               vec ? G_POSITIVE : G_RANDOM, vec ? 1.0f : 0.15f, 0, r);
        *f[i] = wb[i].t;
    }
}

/* fault 1: the last gradient the backward writes (grads->wqkv) one f32 off
 * 16-byte alignment, which a GPU GEMM cannot write: the backward must fail
 * before it writes any other gradient. */
static void g_layer_case(g_env_t *E, h_rng *r, coda_llama_config_t c, int64_t batch, int64_t seq, g_place_t pl,
                         int with_loss, int fault) {
    int64_t m = batch * seq, sx[2] = {m, c.d}, sm[1] = {m};
    char what[160];
    snprintf(what, sizeof what, "layer d %lld ffn %lld vocab %lld M %lldx%lld%s [%s]%s", (long long)c.d,
             (long long)c.ffn, (long long)c.vocab, (long long)batch, (long long)seq, with_loss ? " loss+dy" : " dy",
             g_place_name[pl], fault ? " grads->wqkv misaligned" : "");
    coda_llama_t *L = NULL, *Lh = NULL;
    REQUIRE_OK(coda_llama_create(E->ctx, &c, batch, seq, E->mem->device, &L));
    REQUIRE_OK(coda_llama_create(E->ctx, &c, batch, seq, CODA_DEVICE_CPU, &Lh));
    g_buf_t wb[8], gb[8], X, Tg, Y, Loss, DY, DX;
    coda_llama_weights_t w, g;
    g_make_weights(E, r, &c, CODA_BF16, G_IN, pl, wb, &w);
    g_make_weights(E, r, &c, CODA_F32, G_OUT, pl, gb, &g);
    g_make(&X, E->mem, "x", CODA_BF16, 2, sx, pl, E->align, G_IN, G_RANDOM, 1.0f, 0, r);
    g_make(&Y, E->mem, "y", CODA_BF16, 2, sx, pl, E->align, G_OUT, G_RANDOM, 1.0f, 0, r);
    g_make(&DY, E->mem, "dy", CODA_BF16, 2, sx, pl, E->align, G_IN, G_RANDOM, 0.05f, 0, r);
    g_make(&DX, E->mem, "dx", CODA_BF16, 2, sx, pl, E->align, G_OUT, G_RANDOM, 1.0f, 0, r);
    g_make(&Tg, E->mem, "targets", CODA_I32, 1, sm, G_OFFSET, 4, G_IN, G_TARGETS, 1.0f, c.vocab, r);
    g_make(&Loss, E->mem, "loss", CODA_F32, 1, sm, G_OFFSET, 4, G_OUT, G_RANDOM, 1.0f, 0, r);
    g_buf_t *all[22];
    int nall = 0;
    int nw = c.vocab > 0 ? 8 : 6;
    for (int i = 0; i < nw; i++) all[nall++] = &wb[i], all[nall++] = &gb[i];
    all[nall++] = &X, all[nall++] = &Y, all[nall++] = &DY, all[nall++] = &DX, all[nall++] = &Tg, all[nall++] = &Loss;

    int lossy = with_loss && c.vocab > 0;
    coda_status_t s = coda_llama_forward(L, &w, &X.t, lossy ? &Tg.t : NULL, &Y.t, lossy ? &Loss.t : NULL, NULL);
    if (fault) {
        CHECK(s == CODA_OK, "%s: forward: %s", what, coda_last_error());
        for (int i = 0; i < nall; i++) g_rebase(all[i]);
        g.wqkv.data = (char *)g.wqkv.data + 4;
        s = coda_llama_backward(L, &w, &DY.t, 1.0f / (float)m, &DX.t, &g, NULL);
        CHECK(s != CODA_OK, "%s: accepted", what);
        g_settle(E, what, s, all, nall);
    } else if (s == CODA_OK) {
        s = coda_llama_backward(L, &w, &DY.t, 1.0f / (float)m, &DX.t, &g, NULL);
    }
    if (!fault && g_settle(E, what, s, all, nall)) {
        /* the reference: the CPU layer on contiguous copies */
        coda_tensor_t h[22];
        for (int i = 0; i < nall; i++) h[i] = g_host_copy(all[i]);
        coda_llama_weights_t wh, ghh;
        memset(&wh, 0, sizeof wh);
        memset(&ghh, 0, sizeof ghh);
        coda_tensor_t *fw[8] = {&wh.g1, &wh.wqkv, &wh.wo, &wh.g2, &wh.wgu, &wh.wd, &wh.gf, &wh.wlm};
        coda_tensor_t *fg[8] = {&ghh.g1, &ghh.wqkv, &ghh.wo, &ghh.g2, &ghh.wgu, &ghh.wd, &ghh.gf, &ghh.wlm};
        for (int i = 0; i < nw; i++) *fw[i] = h[2 * i], *fg[i] = h[2 * i + 1];
        int b = 2 * nw;
        coda_status_t sr = coda_llama_forward(Lh, &wh, &h[b], lossy ? &h[b + 4] : NULL, &h[b + 1],
                                              lossy ? &h[b + 5] : NULL, NULL);
        if (sr == CODA_OK) sr = coda_llama_backward(Lh, &wh, &h[b + 2], 1.0f / (float)m, &h[b + 3], &ghh, NULL);
        CHECK(sr == CODA_OK, "%s: CPU reference: %s", what, coda_last_error());
        for (int i = 0; sr == CODA_OK && i < nall; i++) {
            if (all[i]->role == G_IN || (!lossy && all[i] == &Loss)) continue;
            void *got = g_view(all[i], 1);
            g_compare(what, all[i]->name, all[i]->t.dtype, got, h[i].data, coda_tensor_numel(&h[i]),
                      E->tol_layer);
            free(got);
        }
        for (int i = 0; i < nall; i++) free(h[i].data);
    }
    for (int i = 0; i < nall; i++) g_free(all[i]);
    coda_llama_free(L);
    coda_llama_free(Lh);
}

/* ---- the randomized API test ---- */

/* A program from the built-ins or the per-class list of the caller. */
static void g_random(g_env_t *E, h_rng *r, int ncases, const char *const *programs, const char *const *pnames,
                     int nprog) {
    static const int64_t ms[] = {1, 7, 64, 127, 128, 129, 200, 333, 1000};
    static const int64_t ns[] = {1, 2, 8, 13, 16, 63, 64, 136, 255, 257, 264, 392};
    static const int64_t ks[] = {8, 16, 64, 72, 136, 264, 520, 12, 3};
    for (int c = 0; c < ncases; c++) {
        int kind = g_pick(r, 20);
        coda_layout_t layout = (coda_layout_t)g_pick(r, 3);
        int64_t m = ms[g_pick(r, 9)], n = ns[g_pick(r, 12)], k = ks[g_pick(r, 9)];
        int fault = g_pick(r, 4) == 0; /* a quarter of the calls carry a fault */
        if (!fault && E->mem->device == CODA_DEVICE_CUDA && k % 8) k = 8 * (k / 8 + 1);
        if (kind < 9) {
            coda_dtype_t cdt = g_pick(r, 2) ? CODA_BF16 : CODA_F32;
            float beta = g_pick(r, 3) == 0 ? 0.5f : 0.0f, alpha = g_pick(r, 2) ? 1.0f : -1.5f;
            int64_t a_align = E->align;
            coda_dtype_t adt = CODA_BF16;
            if (fault) {
                int f = g_pick(r, 3);
                if (f == 0) a_align = 2;            /* rows and base off the 16-byte grid */
                else if (f == 1) k = 8 * (k / 8) + 4; /* K % 8 */
                else adt = CODA_F16;                /* unsupported dtype */
            }
            g_gemm_case(E, r, layout, m, n, k, cdt, alpha, beta, (g_place_t)g_pick(r, G_NPLACES),
                        (g_place_t)g_pick(r, G_NPLACES), (g_place_t)g_pick(r, G_NPLACES), a_align, adt);
        } else if (kind < 18) {
            int pi = g_pick(r, nprog);
            int64_t nn = n % 2 ? n + 1 : n; /* half-space programs need N even */
            int64_t al = E->mem->device == CODA_DEVICE_CUDA ? (g_pick(r, 2) ? 16 : 8) : 0;
            g_fused_case(E, r, pnames[pi], programs[pi], layout, m, nn, k, NULL, al, fault ? 1 + g_pick(r, 2) : 0);
        } else {
            g_finish_case(E, r, g_pick(r, 5), m, 1 + g_pick(r, 5), (g_place_t)g_pick(r, G_NPLACES),
                          (g_place_t)g_pick(r, G_NPLACES));
        }
    }
}

#endif
