/* test_block_gpu.c - the split block (coda.h section 9) on CUDA:
 *   - every output of the four calls (qkv, r1, h, r2, z, y, do, dh, dx and
 *     the six weight gradients) against the CPU block on the same inputs,
 *     the attention between them done once on the host so both get the
 *     same o and dqkv; relative norm error within 1e-2 (bf16 outputs of
 *     GEMMs summed in another order), the row statistics within 1e-4;
 *   - two forwards in flight on the GPU, backwards in reverse order: the
 *     same bits as each alone;
 *   - no host copy in a step: the four calls captured into one CUDA graph
 *     (a copy to the host or a wait inside would break the capture), the
 *     graph replayed, the same bits as the calls run directly;
 *   - c kept from the forward (acts->c): c = silu(gate) up of z, and the
 *     backward's results those of the default call;
 *   - dqkv in bf16, and M not a multiple of 8 refused.
 * Needs an sm_90a GPU. */
#include "harness.h"
#include "layer/attention.h"
#include "cuda_check.h"
#include "tuning.h"

typedef struct { int64_t batch, seq; } shape_t;

static coda_llama_config_t CFG = {.d = 200, .n_heads = 10, .n_kv_heads = 5, .head_dim = 8, .ffn = 136,
                                  .vocab = 0, .eps = 1e-5f, .rope_theta = 10000.0f};

/* A tensor on the host and its device twin. */
typedef struct { coda_tensor_t h, d; size_t bytes; } dual_t;

static dual_t dual(coda_dtype_t dt, int64_t rows, int64_t cols /* 0: 1-D */) {
    dual_t t;
    t.bytes = (size_t)rows * (size_t)(cols ? cols : 1) * coda_dtype_size(dt);
    void *h = h_alloc(t.bytes + 16), *d = NULL;
    memset(h, 0, t.bytes);
    CUDA_OK(cudaMalloc(&d, t.bytes + 16));
    CUDA_OK(cudaMemset(d, 0, t.bytes));
    t.h = cols ? coda_tensor_2d(h, dt, rows, cols) : coda_tensor_1d(h, dt, rows);
    t.d = t.h;
    t.d.data = d;
    t.d.device = CODA_DEVICE_CUDA;
    return t;
}
static void up(dual_t *t) { CUDA_OK(cudaMemcpy(t->d.data, t->h.data, t->bytes, cudaMemcpyHostToDevice)); }
static void *down(const dual_t *t) {
    void *p = h_alloc(t->bytes + 16);
    CUDA_OK(cudaMemcpy(p, t->d.data, t->bytes, cudaMemcpyDeviceToHost));
    return p;
}
/* Whether two device tensors hold the same bytes. */
static int same_bits(const dual_t *a, const dual_t *b) {
    void *x = down(a), *y = down(b);
    int eq = a->bytes == b->bytes && !memcmp(x, y, a->bytes);
    free(x), free(y);
    return eq;
}
static void dual_free(dual_t *t) {
    free(t->h.data);
    CUDA_OK(cudaFree(t->d.data));
}
static void fill(h_rng *r, dual_t *t, float lo, float hi) {
    int64_t n = coda_tensor_numel(&t->h);
    for (int64_t i = 0; i < n; i++) {
        float v = lo + (hi - lo) * rng_uniform(r);
        if (t->h.dtype == CODA_BF16) ((uint16_t *)t->h.data)[i] = h_f2bf(v);
        else ((float *)t->h.data)[i] = v;
    }
    up(t);
}

/* ||a - b|| / ||b|| over two host buffers of n elements of dtype dt. */
static double rel(const void *a, const void *b, int64_t n, coda_dtype_t dt) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double u = dt == CODA_BF16 ? h_bf2f(((const uint16_t *)a)[i]) : ((const float *)a)[i];
        double v = dt == CODA_BF16 ? h_bf2f(((const uint16_t *)b)[i]) : ((const float *)b)[i];
        num += (u - v) * (u - v), den += v * v;
    }
    return isfinite(num) ? sqrt(num / (den > 0 ? den : 1)) : INFINITY;
}

#define NW 6
typedef struct {
    int64_t batch, seq, m;
    dual_t x, pos, o, y, dy, do_, dh, dqkv, dqkv16, dx, r1, qkv, h, r2, z, alse;
    dual_t g[NW]; /* gradients g1 wqkv wo g2 wgu wd, f32 */
} mb_t;

static coda_block_acts_t acts_of(mb_t *b, int dev) {
    coda_block_acts_t a;
    memset(&a, 0, sizeof a); /* spend_z 0: z only read */
    a.r1 = dev ? b->r1.d : b->r1.h, a.qkv = dev ? b->qkv.d : b->qkv.h, a.h = dev ? b->h.d : b->h.h;
    a.r2 = dev ? b->r2.d : b->r2.h, a.z = dev ? b->z.d : b->z.h;
    return a;
}
static coda_llama_weights_t grads_of(mb_t *b, int dev) {
    coda_llama_weights_t g;
    memset(&g, 0, sizeof g);
    coda_tensor_t *f[NW] = {&g.g1, &g.wqkv, &g.wo, &g.g2, &g.wgu, &g.wd};
    for (int i = 0; i < NW; i++) *f[i] = dev ? b->g[i].d : b->g[i].h;
    return g;
}

static mb_t mb_new(h_rng *r, int64_t batch, int64_t seq, const int64_t wshape[NW][2]) {
    mb_t b;
    memset(&b, 0, sizeof b);
    b.batch = batch, b.seq = seq, b.m = batch * seq;
    int64_t m = b.m, d = CFG.d, nq = CFG.n_heads * CFG.head_dim, nqkv = nq + 2 * CFG.n_kv_heads * CFG.head_dim;
    b.x = dual(CODA_BF16, m, d), fill(r, &b.x, -1, 1);
    b.pos = dual(CODA_F32, m, 0);
    for (int64_t i = 0; i < m; i++) ((float *)b.pos.h.data)[i] = (float)(i % seq);
    up(&b.pos);
    b.o = dual(CODA_BF16, m, nq), b.y = dual(CODA_BF16, m, d), b.dy = dual(CODA_BF16, m, d);
    fill(r, &b.dy, -1, 1);
    b.do_ = dual(CODA_BF16, m, nq), b.dh = dual(CODA_BF16, m, d), b.dqkv = dual(CODA_F32, m, nqkv);
    b.dqkv16 = dual(CODA_BF16, m, nqkv), b.dx = dual(CODA_BF16, m, d);
    b.r1 = dual(CODA_F32, m, 0), b.qkv = dual(CODA_BF16, m, nqkv), b.h = dual(CODA_BF16, m, d);
    b.r2 = dual(CODA_F32, m, 0), b.z = dual(CODA_BF16, m, 2 * CFG.ffn), b.alse = dual(CODA_F32, m, CFG.n_heads);
    for (int i = 0; i < NW; i++) b.g[i] = dual(CODA_F32, wshape[i][0], wshape[i][1]);
    return b;
}
static void mb_free(mb_t *b) {
    dual_t *t[] = {&b->x, &b->pos, &b->o, &b->y, &b->dy, &b->do_, &b->dh, &b->dqkv, &b->dqkv16, &b->dx,
                   &b->r1, &b->qkv, &b->h, &b->r2, &b->z, &b->alse};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) dual_free(t[i]);
    for (int i = 0; i < NW; i++) dual_free(&b->g[i]);
}

int main(void) {
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    if (!coda_context_has_cuda(ctx)) {
        fprintf(stderr, "FAIL: no CUDA device: %s\n", coda_last_error());
        return 1;
    }
    h_rng r = rng_new(5);
    int64_t d = CFG.d, nq = CFG.n_heads * CFG.head_dim, nqkv = nq + 2 * CFG.n_kv_heads * CFG.head_dim;
    const int64_t ws_[NW][2] = {{d, 0}, {nqkv, d}, {d, nq}, {d, 0}, {2 * CFG.ffn, d}, {d, CFG.ffn}};
    dual_t W[NW];
    for (int i = 0; i < NW; i++) {
        W[i] = dual(CODA_BF16, ws_[i][0], ws_[i][1]);
        if (ws_[i][1] == 0) fill(&r, &W[i], 0.8f, 1.2f);
        else fill(&r, &W[i], -0.2f, 0.2f);
    }
    coda_llama_weights_t wh, wd;
    memset(&wh, 0, sizeof wh), memset(&wd, 0, sizeof wd);
    coda_tensor_t *fh[NW] = {&wh.g1, &wh.wqkv, &wh.wo, &wh.g2, &wh.wgu, &wh.wd};
    coda_tensor_t *fd[NW] = {&wd.g1, &wd.wqkv, &wd.wo, &wd.g2, &wd.wgu, &wd.wd};
    for (int i = 0; i < NW; i++) *fh[i] = W[i].h, *fd[i] = W[i].d;

    coda_block_t *Bc, *Bg;
    REQUIRE_OK(coda_block_create(ctx, &CFG, CODA_DEVICE_CPU, &Bc));
    REQUIRE_OK(coda_block_create(ctx, &CFG, CODA_DEVICE_CUDA, &Bg));
    const shape_t shapes[] = {{2, 100}, {1, 8}, {3, 336}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        mb_t c = mb_new(&r, shapes[s].batch, shapes[s].seq, ws_), g = mb_new(&r, shapes[s].batch, shapes[s].seq, ws_);
        memcpy(g.x.h.data, c.x.h.data, c.x.bytes), up(&g.x);
        memcpy(g.dy.h.data, c.dy.h.data, c.dy.bytes), up(&g.dy);
        int64_t m = c.m;
        size_t wsb, wsbh; /* the devices' tilings differ, and so do their workspaces */
        REQUIRE_OK(coda_block_workspace_size(Bg, CODA_BLOCK_ANY, m, &wsb));
        REQUIRE_OK(coda_block_workspace_size(Bc, CODA_BLOCK_ANY, m, &wsbh));
        void *wsd, *wsh = aligned_alloc(256, (wsbh + 255) / 256 * 256);
        CUDA_OK(cudaMalloc(&wsd, wsb));
        coda_block_acts_t ah = acts_of(&c, 0), ad = acts_of(&g, 1);
        coda_llama_weights_t gh = grads_of(&c, 0), gd = grads_of(&g, 1);
        /* forward: CPU block, host attention, the same o for the GPU block */
        CHECK_OK(coda_block_forward_pre(Bc, &wh, &c.x.h, NULL, &c.pos.h, &ah, wsh, wsbh, NULL));
        CHECK_OK(coda_block_forward_pre(Bg, &wd, &g.x.d, NULL, &g.pos.d, &ad, wsd, wsb, NULL));
        CUDA_OK(cudaDeviceSynchronize());
        CHECK_OK(coda__attention_forward(&CFG, c.batch, c.seq, &c.qkv.h, &c.o.h, &c.alse.h, 4));
        memcpy(g.o.h.data, c.o.h.data, c.o.bytes), up(&g.o);
        CHECK_OK(coda_block_forward_post(Bc, &wh, &c.x.h, &c.o.h, &ah, &c.y.h, NULL, NULL, NULL, wsh, wsbh, NULL));
        CHECK_OK(coda_block_forward_post(Bg, &wd, &g.x.d, &g.o.d, &ad, &g.y.d, NULL, NULL, NULL, wsd, wsb, NULL));
        CHECK_OK(coda_block_backward_post(Bc, &wh, &c.o.h, &ah, &c.dy.h, &c.do_.h, &c.dh.h, &gh, wsh, wsbh, NULL));
        CHECK_OK(coda_block_backward_post(Bg, &wd, &g.o.d, &ad, &g.dy.d, &g.do_.d, &g.dh.d, &gd, wsd, wsb, NULL));
        CHECK_OK(coda__attention_backward(&CFG, c.batch, c.seq, &c.qkv.h, &c.o.h, &c.alse.h, &c.do_.h, &c.dqkv.h, 4));
        memcpy(g.dqkv.h.data, c.dqkv.h.data, c.dqkv.bytes), up(&g.dqkv);
        CHECK_OK(coda_block_backward_pre(Bc, &wh, &c.x.h, &c.pos.h, &ah, &c.dqkv.h, &c.dh.h, &c.dx.h, &gh, wsh, wsbh,
                                         NULL));
        CHECK_OK(coda_block_backward_pre(Bg, &wd, &g.x.d, &g.pos.d, &ad, &g.dqkv.d, &g.dh.d, &g.dx.d, &gd, wsd, wsb,
                                         NULL));
        CUDA_OK(cudaDeviceSynchronize());
        struct { const char *name; dual_t *c, *g; double tol; } cmp[] = {
            {"r1", &c.r1, &g.r1, 1e-4}, {"qkv", &c.qkv, &g.qkv, 1e-2}, {"h", &c.h, &g.h, 1e-2},
            {"r2", &c.r2, &g.r2, 1e-4}, {"z", &c.z, &g.z, 1e-2},       {"y", &c.y, &g.y, 1e-2},
            {"do", &c.do_, &g.do_, 1e-2}, {"dh", &c.dh, &g.dh, 1e-2},  {"dx", &c.dx, &g.dx, 1e-2},
            {"dg1", &c.g[0], &g.g[0], 1e-2}, {"dwqkv", &c.g[1], &g.g[1], 1e-2}, {"dwo", &c.g[2], &g.g[2], 1e-2},
            {"dg2", &c.g[3], &g.g[3], 1e-2}, {"dwgu", &c.g[4], &g.g[4], 1e-2}, {"dwd", &c.g[5], &g.g[5], 1e-2},
        };
        printf("M = %lld x %lld:", (long long)c.batch, (long long)c.seq);
        for (size_t k = 0; k < sizeof cmp / sizeof cmp[0]; k++) {
            void *got = down(cmp[k].g);
            double e = rel(got, cmp[k].c->h.data, coda_tensor_numel(&cmp[k].c->h), cmp[k].c->h.dtype);
            printf(" %s %.1e", cmp[k].name, e);
            CHECK(e <= cmp[k].tol, "M %lld: %s: CUDA vs CPU %.3g > %.3g", (long long)m, cmp[k].name, e, cmp[k].tol);
            free(got);
        }
        printf("\n");

        /* a forward that does not save z, and a backward that spends z: the same bits */
        {
            dual_t y2 = dual(CODA_BF16, m, d), z2 = dual(CODA_BF16, m, 2 * CFG.ffn);
            dual_t do2 = dual(CODA_BF16, m, nq), dh2 = dual(CODA_BF16, m, d), g2[NW];
            for (int i = 0; i < NW; i++) g2[i] = dual(CODA_F32, ws_[i][0], ws_[i][1]);
            coda_block_acts_t inf = ad;
            memset(&inf.z, 0, sizeof inf.z);
            CHECK_OK(coda_block_forward_post(Bg, &wd, &g.x.d, &g.o.d, &inf, &y2.d, NULL, NULL, NULL, wsd, wsb, NULL));
            CUDA_OK(cudaMemcpy(z2.d.data, g.z.d.data, g.z.bytes, cudaMemcpyDeviceToDevice));
            coda_block_acts_t sp = ad;
            sp.z = z2.d, sp.spend_z = 1;
            coda_llama_weights_t gs;
            memset(&gs, 0, sizeof gs);
            gs.wo = g2[2].d, gs.g2 = g2[3].d, gs.wgu = g2[4].d, gs.wd = g2[5].d;
            size_t wss;
            REQUIRE_OK(coda_block_workspace_size(Bg, CODA_BLOCK_BACKWARD_POST_SPEND_Z, m, &wss));
            CHECK_OK(coda_block_backward_post(Bg, &wd, &g.o.d, &sp, &g.dy.d, &do2.d, &dh2.d, &gs, wsd, wss, NULL));
            CUDA_OK(cudaDeviceSynchronize());
            struct { const char *name; dual_t *want, *got; } same[] = {
                {"y without z", &g.y, &y2}, {"do_ spending z", &g.do_, &do2}, {"dh spending z", &g.dh, &dh2},
                {"dWo spending z", &g.g[2], &g2[2]}, {"dg2 spending z", &g.g[3], &g2[3]},
                {"dWgu spending z", &g.g[4], &g2[4]}, {"dWd spending z", &g.g[5], &g2[5]}};
            for (size_t k = 0; k < sizeof same / sizeof same[0]; k++)
                CHECK(same_bits(same[k].want, same[k].got), "M %lld: %s differs from the default call's",
                      (long long)m, same[k].name);
            if (s == sizeof shapes / sizeof shapes[0] - 1) {
                /* with stream-K forced: the down dgrad's units are shared
                 * out by k-blocks, each epilogue (and so each in-place dz
                 * write) run by the unit's owner on sums handed over; the
                 * spent z's results against the same streamed call reading z */
                tune_streamk(ctx, CODA_STREAMK_ON);
                dual_t do3 = dual(CODA_BF16, m, nq), dh3 = dual(CODA_BF16, m, d), g3[NW];
                for (int i = 0; i < NW; i++) g3[i] = dual(CODA_F32, ws_[i][0], ws_[i][1]);
                coda_llama_weights_t gr;
                memset(&gr, 0, sizeof gr);
                gr.wo = g3[2].d, gr.g2 = g3[3].d, gr.wgu = g3[4].d, gr.wd = g3[5].d;
                CHECK_OK(coda_block_backward_post(Bg, &wd, &g.o.d, &ad, &g.dy.d, &do3.d, &dh3.d, &gr, wsd, wsb, NULL));
                CUDA_OK(cudaMemcpy(z2.d.data, g.z.d.data, g.z.bytes, cudaMemcpyDeviceToDevice));
                CHECK_OK(coda_block_backward_post(Bg, &wd, &g.o.d, &sp, &g.dy.d, &do2.d, &dh2.d, &gs, wsd, wss, NULL));
                CUDA_OK(cudaDeviceSynchronize());
                tune_streamk(ctx, CODA_STREAMK_AUTO);
                dual_t *want_[] = {&do3, &dh3, &g3[2], &g3[3], &g3[4], &g3[5]}, *got_[] = {&do2, &dh2, &g2[2], &g2[3],
                                                                                           &g2[4], &g2[5]};
                for (int k = 0; k < 6; k++)
                    CHECK(same_bits(want_[k], got_[k]), "M %lld, stream-K: output %d of backward_post spending "
                          "z differs from reading it", (long long)m, k);
                dual_free(&do3), dual_free(&dh3);
                for (int i = 0; i < NW; i++) dual_free(&g3[i]);
            }
            dual_free(&y2), dual_free(&z2), dual_free(&do2), dual_free(&dh2);
            for (int i = 0; i < NW; i++) dual_free(&g2[i]);
        }

        /* c kept from the forward (acts->c): forward_post writes it, and the
         * down dgrad runs swiglu_bwd_kept (no c store); the default call's
         * bits (CUDA's tiling does not depend on the program), reading z and
         * spending it */
        {
            dual_t kc = dual(CODA_BF16, m, CFG.ffn), y2 = dual(CODA_BF16, m, d), h2 = dual(CODA_BF16, m, d);
            dual_t z2 = dual(CODA_BF16, m, 2 * CFG.ffn), r22 = dual(CODA_F32, m, 0);
            dual_t do2 = dual(CODA_BF16, m, nq), dh2 = dual(CODA_BF16, m, d), g2[NW];
            for (int i = 0; i < NW; i++) g2[i] = dual(CODA_F32, ws_[i][0], ws_[i][1]);
            coda_block_acts_t ka = ad;
            ka.h = h2.d, ka.r2 = r22.d, ka.z = z2.d, ka.c = kc.d;
            CHECK_OK(coda_block_forward_post(Bg, &wd, &g.x.d, &g.o.d, &ka, &y2.d, NULL, NULL, NULL, wsd, wsb, NULL));
            coda_llama_weights_t gk;
            memset(&gk, 0, sizeof gk);
            gk.wo = g2[2].d, gk.g2 = g2[3].d, gk.wgu = g2[4].d, gk.wd = g2[5].d;
            size_t wsk, wsr, wsf;
            REQUIRE_OK(coda_block_workspace_size(Bg, CODA_BLOCK_BACKWARD_POST_KEPT_C, m, &wsk));
            REQUIRE_OK(coda_block_workspace_size(Bg, CODA_BLOCK_BACKWARD_POST, m, &wsr));
            REQUIRE_OK(coda_block_workspace_size(Bg, CODA_BLOCK_FORWARD_POST_KEPT_C, m, &wsf));
            CHECK(wsk <= wsr && wsf <= wsb, "M %lld: workspaces keeping c %zu (backward_post) and %zu (forward_post), "
                  "the default backward_post's %zu", (long long)m, wsk, wsf, wsr);
            CHECK_OK(coda_block_backward_post(Bg, &wd, &g.o.d, &ka, &g.dy.d, &do2.d, &dh2.d, &gk, wsd, wsk, NULL));
            CUDA_OK(cudaDeviceSynchronize());
            /* c = silu(gate) * up of the saved z */
            uint16_t *zh = down(&z2), *ch = down(&kc);
            double num = 0, den = 0;
            for (int64_t i = 0; i < m * CFG.ffn; i++) {
                double gt = h_bf2f(zh[2 * i]), u = h_bf2f(zh[2 * i + 1]), want = gt / (1 + exp(-gt)) * u;
                double e = h_bf2f(ch[i]) - want;
                num += e * e, den += want * want;
            }
            CHECK(sqrt(num / (den > 0 ? den : 1)) <= 4e-3, "M %lld: kept c vs silu(g) u of z: %.3g", (long long)m,
                  sqrt(num / (den > 0 ? den : 1)));
            free(zh), free(ch);
            struct { const char *name; dual_t *want, *got; } same[] = {
                {"y keeping c", &g.y, &y2}, {"z keeping c", &g.z, &z2}, {"do_ keeping c", &g.do_, &do2},
                {"dh keeping c", &g.dh, &dh2}, {"dWo keeping c", &g.g[2], &g2[2]}, {"dg2 keeping c", &g.g[3], &g2[3]},
                {"dWgu keeping c", &g.g[4], &g2[4]}, {"dWd keeping c", &g.g[5], &g2[5]}};
            int nsame = (int)(sizeof same / sizeof same[0]), bitwise = 0;
            for (int k = 0; k < nsame; k++) {
                int eq = same_bits(same[k].want, same[k].got);
                CHECK(eq, "M %lld: %s differs from the default call's", (long long)m, same[k].name);
                bitwise += eq;
            }
            /* and spending z too, in the smaller workspace */
            size_t wsb2;
            REQUIRE_OK(coda_block_workspace_size(Bg, CODA_BLOCK_BACKWARD_POST_SPEND_Z_KEPT_C, m, &wsb2));
            CUDA_OK(cudaMemset(dh2.d.data, 0, dh2.bytes));
            CUDA_OK(cudaMemset(g2[4].d.data, 0, g2[4].bytes));
            CUDA_OK(cudaMemset(g2[5].d.data, 0, g2[5].bytes));
            coda_block_acts_t ks = ka;
            ks.spend_z = 1;
            CHECK_OK(coda_block_backward_post(Bg, &wd, &g.o.d, &ks, &g.dy.d, &do2.d, &dh2.d, &gk, wsd, wsb2, NULL));
            CUDA_OK(cudaDeviceSynchronize());
            dual_t *want2[] = {&g.dh, &g.g[4], &g.g[5]}, *got2[] = {&dh2, &g2[4], &g2[5]};
            for (int k = 0; k < 3; k++) {
                int eq = same_bits(want2[k], got2[k]);
                CHECK(eq, "M %lld: output %d of backward_post keeping c and spending z differs", (long long)m, k);
                bitwise += eq;
            }
            printf("  keeping c: %d of %d outputs the default call's bits\n", bitwise, nsame + 3);
            dual_free(&kc), dual_free(&y2), dual_free(&h2), dual_free(&z2), dual_free(&r22), dual_free(&do2),
                dual_free(&dh2);
            for (int i = 0; i < NW; i++) dual_free(&g2[i]);
        }

        /* dqkv in bf16 */
        for (int64_t i = 0; i < m * nqkv; i++)
            ((uint16_t *)g.dqkv16.h.data)[i] = h_f2bf(((float *)c.dqkv.h.data)[i]);
        up(&g.dqkv16);
        dual_t dx16 = dual(CODA_BF16, m, d);
        CHECK_OK(coda_block_backward_pre(Bg, &wd, &g.x.d, &g.pos.d, &ad, &g.dqkv16.d, &g.dh.d, &dx16.d, NULL, wsd,
                                         wsb, NULL));
        void *a16 = down(&dx16);
        double e16 = rel(a16, c.dx.h.data, m * d, CODA_BF16);
        CHECK(e16 <= 2e-2, "M %lld: dx from a bf16 dqkv: %.3g from the CPU's", (long long)m, e16);
        /* dq, dk, dv in bf16, each its own buffer, as SDPA returns them
         * (coda_block_backward_pre_split): dx16's bits */
        {
            const int64_t kv = (nqkv - nq) / 2, w3[3] = {nq, kv, kv};
            dual_t p3[3] = {dual(CODA_BF16, m, nq), dual(CODA_BF16, m, kv), dual(CODA_BF16, m, kv)};
            for (int q = 0, off = 0; q < 3; off += (int)w3[q], q++) {
                for (int64_t i = 0; i < m; i++)
                    memcpy((uint16_t *)p3[q].h.data + i * w3[q], (uint16_t *)g.dqkv16.h.data + i * nqkv + off,
                           (size_t)w3[q] * 2);
                up(&p3[q]);
            }
            dual_t dxs = dual(CODA_BF16, m, d), dxc = dual(CODA_BF16, m, d), gw[4];
            for (int i = 0; i < 4; i++) gw[i] = dual(CODA_F32, ws_[i % 2][0], ws_[i % 2][1]);
            coda_llama_weights_t gsplit = gd, gcat = gd; /* g1 and wqkv are the only ones written */
            gsplit.g1 = gw[0].d, gsplit.wqkv = gw[1].d, gcat.g1 = gw[2].d, gcat.wqkv = gw[3].d;
            CHECK_OK(coda_block_backward_pre(Bg, &wd, &g.x.d, &g.pos.d, &ad, &g.dqkv16.d, &g.dh.d, &dxc.d, &gcat, wsd,
                                             wsb, NULL));
            CHECK_OK(coda_block_backward_pre_split(Bg, &wd, &g.x.d, &g.pos.d, &ad, &p3[0].d, &p3[1].d, &p3[2].d,
                                                   &g.dh.d, &dxs.d, &gsplit, wsd, wsb, NULL));
            void *as = down(&dxs), *ac = down(&dxc);
            CHECK(memcmp(as, a16, (size_t)(m * d) * 2) == 0 && memcmp(ac, a16, (size_t)(m * d) * 2) == 0,
                  "M %lld: dx from dq, dk, dv differs from dx from their concatenation", (long long)m);
            for (int i = 0; i < 2; i++) {
                void *u = down(&gw[i]), *v = down(&gw[i + 2]);
                CHECK(memcmp(u, v, gw[i].bytes) == 0, "M %lld: %s from dq, dk, dv differs from the concatenation's",
                      (long long)m, i ? "dwqkv" : "dg1");
                free(u), free(v);
            }
            free(as), free(ac), dual_free(&dxs), dual_free(&dxc);
            for (int i = 0; i < 4; i++) dual_free(&gw[i]);
            for (int q = 0; q < 3; q++) dual_free(&p3[q]);
        }
        free(a16), dual_free(&dx16);

        /* the four calls in one CUDA graph, replayed: the same bits */
        if (s == 0) {
            void *want_y = down(&g.y), *want_dx = down(&g.dx), *want_wqkv = down(&g.g[1]);
            CUDA_OK(cudaMemset(g.y.d.data, 0xff, g.y.bytes));
            CUDA_OK(cudaMemset(g.dx.d.data, 0xff, g.dx.bytes));
            CUDA_OK(cudaMemset(g.g[1].d.data, 0xff, g.g[1].bytes));
            cudaStream_t st;
            CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            coda_status_t s1 = coda_block_forward_pre(Bg, &wd, &g.x.d, NULL, &g.pos.d, &ad, wsd, wsb, st);
            coda_status_t s2 = coda_block_forward_post(Bg, &wd, &g.x.d, &g.o.d, &ad, &g.y.d, NULL, NULL, NULL, wsd,
                                                       wsb, st);
            coda_status_t s3 = coda_block_backward_post(Bg, &wd, &g.o.d, &ad, &g.dy.d, &g.do_.d, &g.dh.d, &gd, wsd,
                                                        wsb, st);
            coda_status_t s4 = coda_block_backward_pre(Bg, &wd, &g.x.d, &g.pos.d, &ad, &g.dqkv.d, &g.dh.d, &g.dx.d,
                                                       &gd, wsd, wsb, st);
            cudaError_t ce = cudaStreamEndCapture(st, &graph);
            CHECK(s1 == CODA_OK && s2 == CODA_OK && s3 == CODA_OK && s4 == CODA_OK,
                  "captured calls: %s %s %s %s: %s", coda_status_name(s1), coda_status_name(s2),
                  coda_status_name(s3), coda_status_name(s4), coda_last_error());
            CHECK(ce == cudaSuccess, "capture of a whole step: %s (a host copy or a wait inside?)",
                  cudaGetErrorString(ce));
            if (ce == cudaSuccess) {
                size_t nodes = 0;
                CUDA_OK(cudaGraphGetNodes(graph, NULL, &nodes));
                CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
                CUDA_OK(cudaGraphLaunch(exec, st));
                CUDA_OK(cudaGraphLaunch(exec, st));
                CUDA_OK(cudaStreamSynchronize(st));
                void *got_y = down(&g.y), *got_dx = down(&g.dx), *got_wqkv = down(&g.g[1]);
                CHECK(!memcmp(got_y, want_y, g.y.bytes) && !memcmp(got_dx, want_dx, g.dx.bytes) &&
                          !memcmp(got_wqkv, want_wqkv, g.g[1].bytes),
                      "graph replay: y, dx or dWqkv differ from the direct calls");
                printf("a whole step in one CUDA graph: %zu nodes, no host copy; replayed twice, same bits\n", nodes);
                free(got_y), free(got_dx), free(got_wqkv);
                CUDA_OK(cudaGraphExecDestroy(exec));
                CUDA_OK(cudaGraphDestroy(graph));
            }
            CUDA_OK(cudaStreamDestroy(st));
            free(want_y), free(want_dx), free(want_wqkv);
        }
        free(wsh);
        CUDA_OK(cudaFree(wsd));
        mb_free(&c), mb_free(&g);
    }

    /* two forwards in flight, backwards in reverse order, as each alone */
    {
        mb_t a = mb_new(&r, 2, 64, ws_), b = mb_new(&r, 1, 96, ws_), a1 = mb_new(&r, 2, 64, ws_);
        size_t wsb;
        REQUIRE_OK(coda_block_workspace_size(Bg, CODA_BLOCK_ANY, 128, &wsb));
        void *wsd;
        CUDA_OK(cudaMalloc(&wsd, wsb));
        memcpy(a1.x.h.data, a.x.h.data, a.x.bytes), up(&a1.x);
        memcpy(a1.dy.h.data, a.dy.h.data, a.dy.bytes), up(&a1.dy);
        mb_t *all[3] = {&a, &b, &a1};
        for (int k = 0; k < 3; k++) { /* the same o and dqkv for every run: random */
            fill(&r, &all[k]->o, -1, 1);
            fill(&r, &all[k]->dqkv, -1, 1);
        }
        memcpy(a1.o.h.data, a.o.h.data, a.o.bytes), up(&a1.o);
        memcpy(a1.dqkv.h.data, a.dqkv.h.data, a.dqkv.bytes), up(&a1.dqkv);
        coda_block_acts_t aa = acts_of(&a, 1), ab = acts_of(&b, 1), aa1 = acts_of(&a1, 1);
        coda_llama_weights_t ga = grads_of(&a, 1), gb = grads_of(&b, 1), ga1 = grads_of(&a1, 1);
        /* a alone */
        CHECK_OK(coda_block_forward_pre(Bg, &wd, &a1.x.d, NULL, &a1.pos.d, &aa1, wsd, wsb, NULL));
        CHECK_OK(coda_block_forward_post(Bg, &wd, &a1.x.d, &a1.o.d, &aa1, &a1.y.d, NULL, NULL, NULL, wsd, wsb, NULL));
        CHECK_OK(coda_block_backward_post(Bg, &wd, &a1.o.d, &aa1, &a1.dy.d, &a1.do_.d, &a1.dh.d, &ga1, wsd, wsb, NULL));
        CHECK_OK(coda_block_backward_pre(Bg, &wd, &a1.x.d, &a1.pos.d, &aa1, &a1.dqkv.d, &a1.dh.d, &a1.dx.d, &ga1, wsd,
                                         wsb, NULL));
        /* a and b in flight */
        CHECK_OK(coda_block_forward_pre(Bg, &wd, &a.x.d, NULL, &a.pos.d, &aa, wsd, wsb, NULL));
        CHECK_OK(coda_block_forward_post(Bg, &wd, &a.x.d, &a.o.d, &aa, &a.y.d, NULL, NULL, NULL, wsd, wsb, NULL));
        CHECK_OK(coda_block_forward_pre(Bg, &wd, &b.x.d, NULL, &b.pos.d, &ab, wsd, wsb, NULL));
        CHECK_OK(coda_block_forward_post(Bg, &wd, &b.x.d, &b.o.d, &ab, &b.y.d, NULL, NULL, NULL, wsd, wsb, NULL));
        CHECK_OK(coda_block_backward_post(Bg, &wd, &b.o.d, &ab, &b.dy.d, &b.do_.d, &b.dh.d, &gb, wsd, wsb, NULL));
        CHECK_OK(coda_block_backward_pre(Bg, &wd, &b.x.d, &b.pos.d, &ab, &b.dqkv.d, &b.dh.d, &b.dx.d, &gb, wsd, wsb,
                                         NULL));
        CHECK_OK(coda_block_backward_post(Bg, &wd, &a.o.d, &aa, &a.dy.d, &a.do_.d, &a.dh.d, &ga, wsd, wsb, NULL));
        CHECK_OK(coda_block_backward_pre(Bg, &wd, &a.x.d, &a.pos.d, &aa, &a.dqkv.d, &a.dh.d, &a.dx.d, &ga, wsd, wsb,
                                         NULL));
        CUDA_OK(cudaDeviceSynchronize());
        void *p = down(&a.dx), *q = down(&a1.dx), *p2 = down(&a.g[4]), *q2 = down(&a1.g[4]);
        CHECK(!memcmp(p, q, a.dx.bytes) && !memcmp(p2, q2, a.g[4].bytes),
              "a forward in flight beside another: dx or dWgu differ from the same forward alone");
        free(p), free(q), free(p2), free(q2);
        /* M not a multiple of 8 */
        coda_tensor_t x7 = a.x.d;
        x7.shape[0] = 127;
        coda_block_acts_t a7 = aa;
        a7.r1.shape[0] = 127, a7.qkv.shape[0] = 127;
        coda_tensor_t pos7 = a.pos.d;
        pos7.shape[0] = 127;
        CHECK_STATUS(coda_block_forward_pre(Bg, &wd, &x7, NULL, &pos7, &a7, wsd, wsb, NULL), CODA_ERR_SHAPE);
        /* a host pointer in a CUDA descriptor */
        coda_tensor_t xh = a.x.d;
        xh.data = a.x.h.data;
        CHECK_STATUS(coda_block_forward_pre(Bg, &wd, &xh, NULL, &a.pos.d, &aa, wsd, wsb, NULL), CODA_ERR_DEVICE);
        CUDA_OK(cudaFree(wsd));
        mb_free(&a), mb_free(&b), mb_free(&a1);
    }
    for (int i = 0; i < NW; i++) dual_free(&W[i]);
    coda_block_free(Bc);
    coda_block_free(Bg);
    coda_context_free(ctx);
    TEST_MAIN_END();
}
