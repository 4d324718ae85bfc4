/* test_attention_gpu.c - coda_attention_forward/backward on CUDA tensors
 * (kernels/attention.cuh) against float64, on odd shapes.
 *
 * The rule (docs/testing.md): every output within 2 x the error of the
 * unfused bf16 computation (scores, probabilities, o, dP, dS and each
 * gradient rounded to bf16 where PyTorch's eager bf16 attention rounds
 * them) + 1e-6, relative Frobenius error against the float64 attention of
 * the same bf16 inputs. Also: the CPU oracle's error beside it; bitwise
 * determinism run to run; views with padded row strides give the same
 * bits and leave the padding alone; NaN in a key reaches exactly the rows
 * that attend to it; each with every kernel set (kernel_names); refused
 * calls return the documented status and write nothing. With "bench": the
 * LLaMA-3 shapes (batch 2 x 8192), ms and TFLOP/s counting the causal half;
 * "benchonly": the timings alone (for a profiler); "fwdab": the forward's
 * ring and consumer variants, "bwdab" the fused backward's layouts, "dqab" its dq
 * forms, timed in turns and tested ("benchonly" beside them: timed only).
 * Needs an sm_90a GPU. */
#include "harness.h"
#include "gpu/cuda_check.h"
#include "tuning.h"

/* The kernels under test (every pass of main runs every test with one):
 * 0 the defaults (attention_wgmma.cuh's forward, attention_bwd_wgmma.cuh's
 * fused backward), 1 the same with the backward's separate dk/dv and dq
 * kernels (CODA_DEBUG_ATTN_SPLIT_BWD), 2 the mma.sync kernels of attention.cuh
 * (CODA_DEBUG_ATTN_MMA), 3 the wgmma kernels' serial schedules (the
 * forward's warpgroups without ping-pong, the dq kernel one step at a time:
 * CODA_DEBUG_ATTN_PIPE=0), 4 the wgmma forward's other ring: 3 stages, k
 * and v freed together after P v (CODA_DEBUG_ATTN_FWD_STAGES=3, _APART=0;
 * the default of stop 49; since stop 50 2 stages, k freed after S),
 * 5 the fused backward with one query head a block, dk and dv added over the
 * group in order, key blocks launched fastest (CODA_DEBUG_ATTN_BWD_PARTS=h,
 * _ORDER=1), 6 two parts a group launched in chunks of 3 (part, sequence)
 * pairs (the two parts of a group then fall into two chunks where the
 * pairs are 4 or more, and the last chunk is short: the orders the dq and
 * dk/dv adds wait for must still hold; LLaMA-3 70B's shape gets 2 parts,
 * which no test shape is large enough to choose:
 * CODA_DEBUG_ATTN_BWD_PARTS=2, _ORDER=3), 7 the fused backward's dq as
 * before stop 44: both warpgroups' 64-key parts, summed in the staging
 * (CODA_DEBUG_OPTS=-DCODA_AB_DQ_ONE=0, attention_bwd_wgmma.cuh), 8 the
 * forward a block an item (CODA_DEBUG_ATTN_FWD_PERSIST=0; the default since
 * stop 50 is persistent, a block a multiprocessor looping over its items,
 * which the shapes with more items than the 132 multiprocessors exercise),
 * 9 the forward with two consumer warpgroups at head_dim 64
 * (CODA_DEBUG_ATTN_FWD_CONSUMERS=2: items of 128 rows; the default since
 * stop 51 is three, items of 192 rows over 128-key tiles, where a
 * warpgroup may need a tile fewer than its block loads, or hold rows
 * wholly past the sequence's end: seq 300, 200 and 1000 make both).
 * The other
 * sets keep the environment's attn_pipe, forward ring, backward layout and
 * CODA_DEBUG_OPTS (the A/B runs of "bench"). */
#define N_KERNEL_SETS 10
#define DQ_SUM_OPT "-DCODA_AB_DQ_ONE=0"
static const char *const kernel_names[N_KERNEL_SETS] = {
    "wgmma (fused backward)", "wgmma, split backward: dk/dv and dq kernels (CODA_DEBUG_ATTN_SPLIT_BWD)",
    "mma.sync (CODA_DEBUG_ATTN_MMA)", "wgmma, serial schedules (CODA_DEBUG_ATTN_PIPE=0)",
    "wgmma, the forward's other ring: 3 stages, k and v freed together (CODA_DEBUG_ATTN_FWD_STAGES=3, _APART=0)",
    "wgmma, backward one head a block, key blocks fastest (CODA_DEBUG_ATTN_BWD_PARTS=h, _ORDER=1)",
    "wgmma, backward 2 parts a group, chunks of 3 pairs (CODA_DEBUG_ATTN_BWD_PARTS=2, _ORDER=3)",
    "wgmma, backward dq as two warpgroups' parts, summed (CODA_DEBUG_OPTS=" DQ_SUM_OPT ")",
    "wgmma, the forward a block an item, not persistent (CODA_DEBUG_ATTN_FWD_PERSIST=0)",
    "wgmma, the forward with two consumer warpgroups at head_dim 64 (CODA_DEBUG_ATTN_FWD_CONSUMERS=2)"};
static int use_mma, env_pipe = -2, env_fwd_stages, env_fwd_apart, env_fwd_persist, env_bwd_parts, env_bwd_order,
    env_fwd_consumers;
static char env_opts[CODA_TUNING_OPTS_CAP];
static void tune_attn(coda_context_t *ctx, int kernels) {
    coda__tuning_t t = coda__get_tuning(ctx);
    if (env_pipe == -2) {
        env_pipe = t.attn_pipe;
        env_fwd_stages = t.attn_fwd_stages;
        env_fwd_apart = t.attn_fwd_apart;
        env_fwd_persist = t.attn_fwd_persist;
        env_fwd_consumers = t.attn_fwd_consumers;
        env_bwd_parts = t.attn_bwd_parts;
        env_bwd_order = t.attn_bwd_order;
        memcpy(env_opts, t.extra_opts, sizeof env_opts);
    }
    t.attn_mma = kernels == 2;
    t.attn_split_bwd = kernels == 1;
    t.attn_pipe = kernels == 3 ? 0 : env_pipe;
    t.attn_fwd_stages = kernels == 4 ? 3 : env_fwd_stages;
    t.attn_fwd_apart = kernels == 4 ? 0 : env_fwd_apart;
    t.attn_fwd_persist = kernels == 8 ? 0 : env_fwd_persist;
    t.attn_fwd_consumers = kernels == 9 ? 2 : env_fwd_consumers;
    t.attn_bwd_parts = kernels == 5 ? -1 : kernels == 6 ? 2 : env_bwd_parts;
    t.attn_bwd_order = kernels == 5 ? 1 : kernels == 6 ? 3 : env_bwd_order;
    snprintf(t.extra_opts, sizeof t.extra_opts, "%s", kernels == 7 ? DQ_SUM_OPT : env_opts);
    tune_set(ctx, &t);
    use_mma = kernels == 2;
}
/* Keys per forward tile: a NaN v at j may reach rows of its own tile (coda.h). */
static int fwd_tile(void) { return use_mma ? 64 : 128; }

typedef struct {
    int64_t batch, seq, nh, nkv, hd;
} shape_t;

typedef struct {
    shape_t s;
    int64_t m, nq, nk, w; /* nk = nkv * hd; w = nq + 2 nk */
    uint16_t *qkv, *dout; /* host bf16 inputs */
    double *o, *lse, *dqkv;   /* float64 reference */
    double *ou, *lseu, *dqkvu; /* unfused bf16 baseline */
} prob_t;

static double bfr(double x) { return (double)h_bf2f(h_f2bf((float)x)); }

/* Forward and backward in float64 (bf = 0) or with the unfused bf16
 * roundings (bf = 1). o, lse, dqkv (M, w) written. */
static void reference(const prob_t *p, int bf, double *o, double *lse, double *dqkv) {
    const int64_t seq = p->s.seq, nh = p->s.nh, hd = p->s.hd, g = nh / p->s.nkv, w = p->w;
    const double scale = 1.0 / sqrt((double)hd);
#define R(x) (bf ? bfr(x) : (x))
#define X(r, c) ((double)h_bf2f(p->qkv[(r) * w + (c)]))
#define DO(r, c) ((double)h_bf2f(p->dout[(r) * p->nq + (c)]))
    double *pr = h_alloc(sizeof(double) * (size_t)seq), *dp = h_alloc(sizeof(double) * (size_t)seq);
    memset(dqkv, 0, sizeof(double) * (size_t)(p->m * w));
    for (int64_t b = 0; b < p->s.batch; b++)
        for (int64_t h = 0; h < nh; h++) {
            const int64_t qc = h * hd, kc = p->nq + (h / g) * hd, vc = kc + p->nk;
            for (int64_t i = 0; i < seq; i++) {
                const int64_t ri = b * seq + i;
                double mx = -INFINITY, l = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double d = 0;
                    for (int64_t c = 0; c < hd; c++) d += X(ri, qc + c) * X(b * seq + j, kc + c);
                    pr[j] = R(R(d) * scale);
                    if (pr[j] > mx) mx = pr[j];
                }
                for (int64_t j = 0; j <= i; j++) l += exp(pr[j] - mx);
                lse[ri * nh + h] = mx + log(l);
                for (int64_t j = 0; j <= i; j++) pr[j] = R(exp(pr[j] - mx) / l);
                for (int64_t c = 0; c < hd; c++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= i; j++) acc += pr[j] * X(b * seq + j, vc + c);
                    o[ri * p->nq + qc + c] = R(acc);
                }
                /* backward of row i: dP, D = sum_j P dP, dS */
                double D = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double d = 0;
                    for (int64_t c = 0; c < hd; c++) d += DO(ri, qc + c) * X(b * seq + j, vc + c);
                    dp[j] = R(d);
                    D += pr[j] * dp[j];
                }
                for (int64_t j = 0; j <= i; j++) {
                    const int64_t rj = b * seq + j;
                    const double ds = R(pr[j] * (dp[j] - D));
                    for (int64_t c = 0; c < hd; c++) {
                        dqkv[ri * w + qc + c] += ds * X(rj, kc + c) * scale;
                        dqkv[rj * w + kc + c] += ds * X(ri, qc + c) * scale;
                        dqkv[rj * w + vc + c] += pr[j] * DO(ri, qc + c);
                    }
                }
            }
        }
    if (bf)
        for (int64_t i = 0; i < p->m * w; i++) dqkv[i] = bfr(dqkv[i]);
    free(pr);
    free(dp);
#undef R
#undef X
#undef DO
}

static prob_t make(shape_t s, uint64_t seed, float amp) {
    prob_t p;
    memset(&p, 0, sizeof p);
    p.s = s;
    p.m = s.batch * s.seq;
    p.nq = s.nh * s.hd;
    p.nk = s.nkv * s.hd;
    p.w = p.nq + 2 * p.nk;
    h_rng r = rng_new(seed);
    p.qkv = h_alloc(2 * (size_t)(p.m * p.w));
    p.dout = h_alloc(2 * (size_t)(p.m * p.nq));
    rng_fill_bf16(&r, p.qkv, p.m * p.w, amp);
    rng_fill_bf16(&r, p.dout, p.m * p.nq, 1.0f);
    p.o = h_alloc(sizeof(double) * (size_t)(p.m * p.nq));
    p.ou = h_alloc(sizeof(double) * (size_t)(p.m * p.nq));
    p.lse = h_alloc(sizeof(double) * (size_t)(p.m * s.nh));
    p.lseu = h_alloc(sizeof(double) * (size_t)(p.m * s.nh));
    p.dqkv = h_alloc(sizeof(double) * (size_t)(p.m * p.w));
    p.dqkvu = h_alloc(sizeof(double) * (size_t)(p.m * p.w));
    reference(&p, 0, p.o, p.lse, p.dqkv);
    reference(&p, 1, p.ou, p.lseu, p.dqkvu);
    return p;
}

static void unmake(prob_t *p) {
    free(p->qkv), free(p->dout), free(p->o), free(p->ou), free(p->lse), free(p->lseu), free(p->dqkv),
        free(p->dqkvu);
}

static double rel_err_d(const double *out, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(out[i])) return INFINITY;
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The (rows, cols) block at column c0 of a (rows, ld) array, gathered. */
static void gather_f(const float *src, int64_t rows, int64_t ld, int64_t c0, int64_t cols, double *dst) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) dst[i * cols + j] = src[i * ld + c0 + j];
}
static void gather_d(const double *src, int64_t rows, int64_t ld, int64_t c0, int64_t cols, double *dst) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) dst[i * cols + j] = src[i * ld + c0 + j];
}

/* ---- device buffers ---- */

static void *dev(size_t bytes) {
    void *p;
    CUDA_OK(cudaMalloc(&p, bytes > 0 ? bytes : 1));
    return p;
}
static void dfree(void *p) { CUDA_OK(cudaFree(p)); }
static coda_tensor_t dmat(void *p, coda_dtype_t dt, int64_t rows, int64_t cols, int64_t ld) {
    coda_tensor_t t = coda_tensor_2d(p, dt, rows, cols);
    t.stride[0] = ld * (int64_t)coda_dtype_size(dt);
    t.device = CODA_DEVICE_CUDA;
    return t;
}

/* One run on the device: qkv, do copied in with row strides (ld_in extra
 * columns of padding), o/lse/dqkv out with `pad` columns of padding filled
 * with a sentinel and checked afterwards. Host results returned. */
typedef struct {
    uint16_t *o;  /* (M, nq) */
    float *lse;   /* (M, nh) */
    float *dqkv;  /* (M, w)  */
    int pad_ok;
} run_t;

static coda_status_t run(coda_context_t *ctx, const prob_t *p, int pad, run_t *out) {
    const int64_t m = p->m, nh = p->s.nh, lq = p->w + pad, lo = p->nq + pad, ll = nh + pad, ld = p->w + pad;
    coda_attention_shape_t sh = {p->s.batch, p->s.seq, p->s.nh, p->s.nkv, p->s.hd};
    uint16_t *dq = dev(2 * (size_t)(m * lq)), *dd = dev(2 * (size_t)(m * lo)), *dout = dev(2 * (size_t)(m * lo));
    float *dl = dev(4 * (size_t)(m * ll)), *dg = dev(4 * (size_t)(m * ld));
    CUDA_OK(cudaMemset(dq, 0xff, 2 * (size_t)(m * lq)));
    CUDA_OK(cudaMemset(dout, 0xff, 2 * (size_t)(m * lo)));
    CUDA_OK(cudaMemset(dd, 0x7f, 2 * (size_t)(m * lo)));
    CUDA_OK(cudaMemset(dl, 0x7f, 4 * (size_t)(m * ll)));
    CUDA_OK(cudaMemset(dg, 0x7f, 4 * (size_t)(m * ld)));
    CUDA_OK(cudaMemcpy2D(dq, 2 * (size_t)lq, p->qkv, 2 * (size_t)p->w, 2 * (size_t)p->w, (size_t)m,
                         cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy2D(dout, 2 * (size_t)lo, p->dout, 2 * (size_t)p->nq, 2 * (size_t)p->nq, (size_t)m,
                         cudaMemcpyHostToDevice));
    coda_tensor_t tq = dmat(dq, CODA_BF16, m, p->w, lq), to = dmat(dd, CODA_BF16, m, p->nq, lo);
    coda_tensor_t tl = dmat(dl, CODA_F32, m, nh, ll), tdo = dmat(dout, CODA_BF16, m, p->nq, lo);
    coda_tensor_t tg = dmat(dg, CODA_F32, m, p->w, ld);
    size_t wsb = 0;
    coda_status_t s = coda_attention_workspace_size(ctx, CODA_DEVICE_CUDA, &sh, &wsb);
    void *ws = dev(wsb);
    if (wsb) CUDA_OK(cudaMemset(ws, 0x5a, wsb)); /* garbage: the backward must not read what it did not write */
    if (s == CODA_OK) s = coda_attention_forward(ctx, &sh, &tq, &to, &tl, NULL);
    if (s == CODA_OK) s = coda_attention_backward(ctx, &sh, &tq, &to, &tl, &tdo, &tg, ws, wsb, NULL);
    CUDA_OK(cudaDeviceSynchronize());
    uint16_t *ho = h_alloc(2 * (size_t)(m * lo));
    float *hl = h_alloc(4 * (size_t)(m * ll)), *hg = h_alloc(4 * (size_t)(m * ld));
    CUDA_OK(cudaMemcpy(ho, dd, 2 * (size_t)(m * lo), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hl, dl, 4 * (size_t)(m * ll), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hg, dg, 4 * (size_t)(m * ld), cudaMemcpyDeviceToHost));
    out->o = h_alloc(2 * (size_t)(m * p->nq));
    out->lse = h_alloc(4 * (size_t)(m * nh));
    out->dqkv = h_alloc(4 * (size_t)(m * p->w));
    out->pad_ok = 1;
    for (int64_t i = 0; i < m; i++) {
        memcpy(out->o + i * p->nq, ho + i * lo, 2 * (size_t)p->nq);
        memcpy(out->lse + i * nh, hl + i * ll, 4 * (size_t)nh);
        memcpy(out->dqkv + i * p->w, hg + i * ld, 4 * (size_t)p->w);
        for (int64_t c = p->nq; c < lo; c++) out->pad_ok &= ho[i * lo + c] == 0x7f7f;
        for (int64_t c = nh; c < ll; c++) out->pad_ok &= ((uint32_t *)hl)[i * ll + c] == 0x7f7f7f7fu;
        for (int64_t c = p->w; c < ld; c++) out->pad_ok &= ((uint32_t *)hg)[i * ld + c] == 0x7f7f7f7fu;
    }
    free(ho), free(hl), free(hg);
    dfree(dq);
    dfree(dd);
    dfree(dout);
    dfree(dl);
    dfree(dg);
    dfree(ws);
    return s;
}
static void unrun(run_t *r) { free(r->o), free(r->lse), free(r->dqkv); }

/* The CPU oracle's outputs (coda_attention_* on host tensors). */
static void run_cpu(coda_context_t *ctx, const prob_t *p, run_t *out) {
    coda_attention_shape_t sh = {p->s.batch, p->s.seq, p->s.nh, p->s.nkv, p->s.hd};
    out->o = h_alloc(2 * (size_t)(p->m * p->nq));
    out->lse = h_alloc(4 * (size_t)(p->m * p->s.nh));
    out->dqkv = h_alloc(4 * (size_t)(p->m * p->w));
    coda_tensor_t tq = coda_tensor_2d(p->qkv, CODA_BF16, p->m, p->w), to = coda_tensor_2d(out->o, CODA_BF16, p->m, p->nq);
    coda_tensor_t tl = coda_tensor_2d(out->lse, CODA_F32, p->m, p->s.nh);
    coda_tensor_t tdo = coda_tensor_2d(p->dout, CODA_BF16, p->m, p->nq), tg = coda_tensor_2d(out->dqkv, CODA_F32, p->m, p->w);
    CHECK_OK(coda_attention_forward(ctx, &sh, &tq, &to, &tl, NULL));
    CHECK_OK(coda_attention_backward(ctx, &sh, &tq, &to, &tl, &tdo, &tg, NULL, 0, NULL));
}

/* Errors of one run: o, lse, dq, dk, dv. */
static void errors(const prob_t *p, const run_t *r, double e[5]) {
    const int64_t m = p->m;
    double *a = h_alloc(sizeof(double) * (size_t)(m * p->w)), *b = h_alloc(sizeof(double) * (size_t)(m * p->w));
    for (int64_t i = 0; i < m * p->nq; i++) a[i] = h_bf2f(r->o[i]);
    e[0] = rel_err_d(a, p->o, m * p->nq);
    for (int64_t i = 0; i < m * p->s.nh; i++) a[i] = r->lse[i];
    e[1] = rel_err_d(a, p->lse, m * p->s.nh);
    const int64_t c0[3] = {0, p->nq, p->nq + p->nk}, cn[3] = {p->nq, p->nk, p->nk};
    for (int k = 0; k < 3; k++) {
        gather_f(r->dqkv, m, p->w, c0[k], cn[k], a);
        gather_d(p->dqkv, m, p->w, c0[k], cn[k], b);
        e[2 + k] = rel_err_d(a, b, m * cn[k]);
    }
    free(a), free(b);
}
static void baseline(const prob_t *p, double e[5]) {
    const int64_t m = p->m;
    double *a = h_alloc(sizeof(double) * (size_t)(m * p->w)), *b = h_alloc(sizeof(double) * (size_t)(m * p->w));
    e[0] = rel_err_d(p->ou, p->o, m * p->nq);
    e[1] = rel_err_d(p->lseu, p->lse, m * p->s.nh);
    const int64_t c0[3] = {0, p->nq, p->nq + p->nk}, cn[3] = {p->nq, p->nk, p->nk};
    for (int k = 0; k < 3; k++) {
        gather_d(p->dqkvu, m, p->w, c0[k], cn[k], a);
        gather_d(p->dqkv, m, p->w, c0[k], cn[k], b);
        e[2 + k] = rel_err_d(a, b, m * cn[k]);
    }
    free(a), free(b);
}

static void test_shapes(coda_context_t *ctx) {
    static const shape_t shapes[] = {
        {1, 1, 1, 1, 64},   {2, 77, 4, 2, 64},  {1, 64, 2, 1, 128}, {3, 129, 6, 3, 128},
        {1, 300, 4, 4, 64}, {2, 191, 8, 2, 128}, {1, 520, 2, 1, 128}, {1, 257, 4, 1, 64},
        {1, 1100, 2, 1, 128}, /* 9 key tiles of 128: the stage ring wraps four times */
        {1, 1000, 2, 1, 64},  /* and at 64: 192-row items with a tile fewer for some warpgroups */
        /* many short sequences and heads: more blocks than the H200 has SMs */
        {8, 130, 24, 8, 128}, {6, 200, 24, 8, 64},
        /* seq a multiple of 8 but not of 64, several sequences: the fused
         * backward's permuted dq map (whole 8-position groups) must stop at
         * each sequence's end, not write into the next one's rows */
        {3, 136, 4, 2, 128}, {2, 72, 4, 1, 64},
    };
    static const char *names[5] = {"o", "lse", "dq", "dk", "dv"};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const shape_t s = shapes[k];
        prob_t p = make(s, 100 + k, k % 2 ? 2.5f : 1.0f); /* amp 2.5: peaked softmax rows */
        run_t g, g2, gp, c;
        CHECK_OK(run(ctx, &p, 0, &g));
        CHECK_OK(run(ctx, &p, 0, &g2));
        CHECK_OK(run(ctx, &p, 8, &gp));
        run_cpu(ctx, &p, &c);
        double eg[5], ec[5], eb[5];
        errors(&p, &g, eg);
        errors(&p, &c, ec);
        baseline(&p, eb);
        printf("  b %lld seq %lld heads %lld/%lld hd %lld:\n", (long long)s.batch, (long long)s.seq,
               (long long)s.nh, (long long)s.nkv, (long long)s.hd);
        for (int i = 0; i < 5; i++) {
            printf("    %-4s cuda %.3e  cpu %.3e  bf16 unfused %.3e  %s\n", names[i], eg[i], ec[i], eb[i],
                   within_tol(eg[i], eb[i]) ? "ok" : "FAIL");
            CHECK(within_tol(eg[i], eb[i]), "%s: %s error %.3e above 2 x %.3e", "shape", names[i], eg[i], eb[i]);
        }
        const size_t no = 2 * (size_t)(p.m * p.nq), nl = 4 * (size_t)(p.m * s.nh), ng = 4 * (size_t)(p.m * p.w);
        CHECK(!memcmp(g.o, g2.o, no) && !memcmp(g.lse, g2.lse, nl) && !memcmp(g.dqkv, g2.dqkv, ng),
              "two runs differ (not deterministic)");
        CHECK(!memcmp(g.o, gp.o, no) && !memcmp(g.lse, gp.lse, nl) && !memcmp(g.dqkv, gp.dqkv, ng),
              "padded row strides change the result");
        CHECK(gp.pad_ok, "a call wrote into the padding of a view");
        unrun(&g), unrun(&g2), unrun(&gp), unrun(&c);
        unmake(&p);
    }
}

/* NaN in key j0 of sequence 0 and in value j1 of sequence 1 (kv head 0):
 * rows >= j of the group's heads get NaN o; rows of an earlier key tile of
 * the forward stay finite, and so does the other sequence, all of it (rows
 * between the tile's start and j may be NaN: 0 * NaN in the tile's
 * products; coda.h). */
static void test_nan(coda_context_t *ctx) {
    shape_t s = {2, 300, 4, 2, 64};
    prob_t p;
    memset(&p, 0, sizeof p);
    p.s = s;
    p.m = s.batch * s.seq, p.nq = s.nh * s.hd, p.nk = s.nkv * s.hd, p.w = p.nq + 2 * p.nk;
    h_rng r = rng_new(7);
    p.qkv = h_alloc(2 * (size_t)(p.m * p.w));
    p.dout = h_alloc(2 * (size_t)(p.m * p.nq));
    rng_fill_bf16(&r, p.qkv, p.m * p.w, 1.0f);
    rng_fill_bf16(&r, p.dout, p.m * p.nq, 1.0f);
    const int64_t j[2] = {170, 230};
    p.qkv[j[0] * p.w + p.nq + 5] = 0x7fc0;                   /* k of row j0, sequence 0 */
    p.qkv[(s.seq + j[1]) * p.w + p.nq + p.nk + 9] = 0x7fc0;  /* v of row j1, sequence 1 */
    run_t g;
    CHECK_OK(run(ctx, &p, 0, &g));
    int wrong = 0, leaked = 0;
    for (int64_t i = 0; i < p.m; i++)
        for (int64_t h = 0; h < s.nh; h++) {
            const int64_t b = i / s.seq, pos = i % s.seq;
            const int in_group = h / (s.nh / s.nkv) == 0;
            int any = 0, anyq = 0;
            for (int64_t c = 0; c < s.hd; c++) {
                any |= isnan(h_bf2f(g.o[i * p.nq + h * s.hd + c]));
                anyq |= isnan(g.dqkv[i * p.w + h * s.hd + c]);
            }
            if (in_group && pos >= j[b]) wrong += !any;                      /* must be NaN */
            if (!in_group || pos < j[b] / fwd_tile() * fwd_tile()) leaked += any || anyq; /* finite */
        }
    CHECK(wrong == 0, "NaN in a key or value: %d (row, head) outputs that attend to it are not NaN", wrong);
    CHECK(leaked == 0, "NaN leaked into %d (row, head) outputs of earlier tiles, other heads or sequences",
          leaked);
    unrun(&g);
    free(p.qkv), free(p.dout);
}

/* Refusals: status, message, nothing written. */
static void test_refusals(coda_context_t *ctx) {
    const int64_t m = 64, nq = 128, w = 256;
    coda_attention_shape_t sh = {1, 64, 2, 1, 64};
    uint16_t *q = dev(2 * (size_t)(m * w + 64)), *o = dev(2 * (size_t)(m * nq));
    float *l = dev(4 * (size_t)(m * 2));
    CUDA_OK(cudaMemset(q, 0, 2 * (size_t)(m * w + 64)));
    CUDA_OK(cudaMemset(o, 0x7f, 2 * (size_t)(m * nq)));
    coda_tensor_t tq = dmat(q, CODA_BF16, m, w, w), to = dmat(o, CODA_BF16, m, nq, nq), tl = dmat(l, CODA_F32, m, 2, 2);
    coda_attention_shape_t bad = sh;
    bad.head_dim = 96;
    CHECK_STATUS(coda_attention_forward(ctx, &bad, &tq, &to, &tl, NULL), CODA_ERR_UNSUPPORTED);
    bad = sh;
    bad.n_kv_heads = 3;
    CHECK_STATUS(coda_attention_forward(ctx, &bad, &tq, &to, &tl, NULL), CODA_ERR_SHAPE);
    CHECK_STATUS(coda_attention_forward(ctx, NULL, &tq, &to, &tl, NULL), CODA_ERR_INVALID_ARG);
    coda_tensor_t mis = dmat((char *)q + 2, CODA_BF16, m, w, w);
    CHECK_STATUS(coda_attention_forward(ctx, &sh, &mis, &to, &tl, NULL), CODA_ERR_STRIDE);
    coda_tensor_t ov = dmat(q, CODA_BF16, m, nq, w); /* o inside qkv */
    CHECK_STATUS(coda_attention_forward(ctx, &sh, &tq, &ov, &tl, NULL), CODA_ERR_OVERLAP);
    coda_tensor_t hostl = coda_tensor_2d(h_alloc(4 * (size_t)(m * 2)), CODA_F32, m, 2);
    CHECK_STATUS(coda_attention_forward(ctx, &sh, &tq, &to, &hostl, NULL), CODA_ERR_DEVICE);
    coda_tensor_t lie = hostl;
    lie.device = CODA_DEVICE_CUDA; /* host memory claimed to be the GPU's */
    CHECK_STATUS(coda_attention_forward(ctx, &sh, &tq, &to, &lie, NULL), CODA_ERR_DEVICE);
    free(hostl.data);
    coda_tensor_t wrong = dmat(q, CODA_F32, m, nq, nq); /* f32 where bf16 is due */
    CHECK_STATUS(coda_attention_forward(ctx, &sh, &tq, &wrong, &tl, NULL), CODA_ERR_DTYPE);
    float *g = dev(4 * (size_t)(m * w));
    coda_tensor_t tg = dmat(g, CODA_F32, m, w, w);
    size_t wsb;
    CHECK_OK(coda_attention_workspace_size(ctx, CODA_DEVICE_CUDA, &sh, &wsb));
    void *ws = dev(wsb);
    CHECK_STATUS(coda_attention_backward(ctx, &sh, &tq, &to, &tl, &to, &tg, ws, wsb - 4, NULL),
                 CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_attention_backward(ctx, &sh, &tq, &to, &tl, &to, &tg, NULL, wsb, NULL), CODA_ERR_INVALID_ARG);
    CUDA_OK(cudaDeviceSynchronize());
    uint16_t *ho = h_alloc(2 * (size_t)(m * nq));
    CUDA_OK(cudaMemcpy(ho, o, 2 * (size_t)(m * nq), cudaMemcpyDeviceToHost));
    int same = 1;
    for (int64_t i = 0; i < m * nq; i++) same &= ho[i] == 0x7f7f;
    CHECK(same, "a refused call wrote o");
    free(ho);
    dfree(q);
    dfree(o);
    dfree(l);
    dfree(g);
    dfree(ws);
}

/* ---- timing ---- */

/* Forward and backward (dirs 2) or the forward alone (dirs 1) at the LLaMA-3
 * attention shapes, batch 2 x 8192: median of 15 timed calls after 3. */
static void bench(coda_context_t *ctx, int dirs) {
    static const struct { const char *name; shape_t s; } shapes[] = {
        {"LLaMA-3 1B", {2, 8192, 32, 8, 64}}, {"LLaMA-3 8B", {2, 8192, 32, 8, 128}},
        {"LLaMA-3 70B", {2, 8192, 64, 8, 128}}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const shape_t s = shapes[k].s;
        const int64_t m = s.batch * s.seq, nq = s.nh * s.hd, w = nq + 2 * s.nkv * s.hd;
        coda_attention_shape_t sh = {s.batch, s.seq, s.nh, s.nkv, s.hd};
        uint16_t *hq = h_alloc(2 * (size_t)(m * w));
        h_rng r = rng_new(5);
        rng_fill_bf16(&r, hq, m * w, 1.0f);
        uint16_t *q = dev(2 * (size_t)(m * w)), *o = dev(2 * (size_t)(m * nq)), *dout = dev(2 * (size_t)(m * nq));
        float *l = dev(4 * (size_t)(m * s.nh)), *g = dev(4 * (size_t)(m * w));
        CUDA_OK(cudaMemcpy(q, hq, 2 * (size_t)(m * w), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dout, hq, 2 * (size_t)(m * nq), cudaMemcpyHostToDevice));
        coda_tensor_t tq = dmat(q, CODA_BF16, m, w, w), to = dmat(o, CODA_BF16, m, nq, nq);
        coda_tensor_t tl = dmat(l, CODA_F32, m, s.nh, s.nh), tdo = dmat(dout, CODA_BF16, m, nq, nq);
        coda_tensor_t tg = dmat(g, CODA_F32, m, w, w);
        size_t wsb;
        REQUIRE_OK(coda_attention_workspace_size(ctx, CODA_DEVICE_CUDA, &sh, &wsb));
        void *ws = dev(wsb);
        cudaEvent_t e0, e1;
        CUDA_OK(cudaEventCreate(&e0));
        CUDA_OK(cudaEventCreate(&e1));
        float tf = 0, tb = 0;
        for (int dir = 0; dir < dirs; dir++) {
            float best[15];
            for (int it = 0; it < 18; it++) {
                CUDA_OK(cudaEventRecord(e0, NULL));
                if (dir == 0) REQUIRE_OK(coda_attention_forward(ctx, &sh, &tq, &to, &tl, NULL));
                else REQUIRE_OK(coda_attention_backward(ctx, &sh, &tq, &to, &tl, &tdo, &tg, ws, wsb, NULL));
                CUDA_OK(cudaEventRecord(e1, NULL));
                CUDA_OK(cudaEventSynchronize(e1));
                float ms;
                CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
                if (it >= 3) best[it - 3] = ms;
            }
            for (int i = 0; i < 15; i++) /* median of 15 */
                for (int j = i + 1; j < 15; j++)
                    if (best[j] < best[i]) { float t = best[i]; best[i] = best[j]; best[j] = t; }
            if (dir == 0) tf = best[7];
            else tb = best[7];
        }
        const double fl = 4.0 * (double)s.batch * (double)s.seq * (double)s.seq * (double)s.nh * (double)s.hd / 2;
        printf("  bench %-12s fwd %7.3f ms %6.1f TFLOP/s   bwd %7.3f ms %6.1f TFLOP/s\n", shapes[k].name, tf,
               fl / tf * 1e-9, tb, 2.5 * fl / tb * 1e-9);
        dfree(q);
        dfree(o);
        dfree(dout);
        dfree(l);
        dfree(g);
        dfree(ws);
        free(hq);
    }
}

/* "fwdab": the forward's variants (tuning attn_fwd_stages x
 * attn_fwd_apart x attn_fwd_consumers); "bwdab": the fused backward's (attn_bwd_parts x
 * attn_bwd_order); "dqab": its dq forms (CODA_AB_DQ_ONE 0; 1 with
 * CODA_AB_PT_REG 0 and 1, the default; the default with CODA_AB_DQ_LAG 1, 2;
 * LAG 1 with CODA_AB_DST_REG 1;
 * "dqforms=2,3" picks some; the default layout). Each timed in
 * turns, two rounds, then each tested (unless `timed_only`). "bwdab"'s
 * layouts are n_layouts of `layouts` when given (the argument
 * "layouts=P:C,P:C,..."), else the list below. */
#define MAX_LAYOUTS 16
static int layouts[MAX_LAYOUTS][2], n_layouts;
/* "dqab"'s forms: dq_forms[0 .. n_dq) when given ("dqforms=2,3"), else all */
#define N_DQ_FORMS 6
static int dq_forms[N_DQ_FORMS], n_dq;
static void variants_ab(coda_context_t *ctx, char mode, int timed_only) {
    /* (stages, k and v freed apart, persistent, consumer warpgroups: 3 at head_dim 64 only) */
    static const int fwd[6][4] = {{2, 1, 1, 2}, {3, 0, 1, 2}, {2, 1, 1, 3}, {3, 1, 1, 3}, {2, 0, 1, 3}, {3, 0, 1, 3}};
    /* (parts, launch chunk): 0 all pairs (kv heads fastest), 1 key blocks fastest, else pairs a chunk */
    static const int bwd0[9][2] = {{1, 0}, {1, 1}, {1, 4}, {2, 0}, {2, 1}, {2, 2}, {2, 4}, {-1, 0}, {-1, 1}};
    const int(*bwd)[2] = n_layouts ? (const int(*)[2])layouts : bwd0;
    static const char *const dq[N_DQ_FORMS] = {"-DCODA_AB_DQ_ONE=0", "-DCODA_AB_DQ_ONE=1 -DCODA_AB_PT_REG=0",
                                               "-DCODA_AB_DQ_ONE=1 -DCODA_AB_PT_REG=1 -DCODA_AB_DQ_LAG=0",
                                               "-DCODA_AB_DQ_ONE=1 -DCODA_AB_PT_REG=1 -DCODA_AB_DQ_LAG=1",
                                               "-DCODA_AB_DQ_ONE=1 -DCODA_AB_PT_REG=1 -DCODA_AB_DQ_LAG=2",
                                               "-DCODA_AB_DQ_ONE=1 -DCODA_AB_PT_REG=1 -DCODA_AB_DQ_LAG=1 "
                                               "-DCODA_AB_DST_REG=1"};
    static const char *const dq_name[N_DQ_FORMS] = {
        "both warpgroups, staged sum", "one warpgroup a step, 128 keys",
        "one warpgroup a step, P^T from registers (the default until stop 54)",
        "the same, each step's dq a step late, dS^T double-buffered (the default)",
        "the same, warpgroup 1 started half a step late",
        "a step late, dk's dS^T from registers, no warpgroup barrier a step (head_dim 64; 128 as the default)"};
    const int backward = mode != 'f';
    const int n = mode == 'b' ? (n_layouts ? n_layouts : 9) : mode == 'd' ? (n_dq ? n_dq : N_DQ_FORMS) : 6;
    tune_attn(ctx, 0);
    const coda__tuning_t t0 = coda__get_tuning(ctx);
    for (int round = 0; round < (timed_only ? 2 : 3); round++)
        for (int i = 0; i < n; i++) {
            coda__tuning_t t = t0;
            const char *tag = round == 2 ? " (tests)" : "";
            if (mode == 'd') {
                const int f = n_dq ? dq_forms[i] : i;
                snprintf(t.extra_opts, sizeof t.extra_opts, "%s", dq[f]);
                printf("== fused backward's dq: %s%s\n", dq_name[f], tag);
            } else if (backward) {
                t.attn_bwd_parts = bwd[i][0];
                t.attn_bwd_order = bwd[i][1];
                printf("== fused backward: %s%.0d, %s%.0d%s\n",
                       bwd[i][0] == -1  ? "one head a block"
                       : bwd[i][0] == 1 ? "a kv group a block"
                                        : "parts a group: ",
                       bwd[i][0] > 1 ? bwd[i][0] : 0,
                       bwd[i][1] == 0   ? "kv heads fastest"
                       : bwd[i][1] == 1 ? "key blocks fastest"
                                        : "chunks of (part, sequence) pairs: ",
                       bwd[i][1] > 1 ? bwd[i][1] : 0, tag);
            } else {
                t.attn_fwd_stages = fwd[i][0];
                t.attn_fwd_apart = fwd[i][1];
                t.attn_fwd_persist = fwd[i][2];
                t.attn_fwd_consumers = fwd[i][3];
                printf("== forward ring: %d stages, k and v freed %s, %s, %d consumers at head_dim 64%s\n", fwd[i][0],
                       fwd[i][1] ? "apart" : "together", fwd[i][2] ? "persistent" : "a block an item", fwd[i][3],
                       tag);
            }
            tune_set(ctx, &t);
            fflush(stdout);
            if (round == 2) {
                test_shapes(ctx);
                test_nan(ctx);
                printf("   checks so far %d, failures %d\n", h_checks, h_failures);
            } else {
                bench(ctx, backward ? 2 : 1);
            }
            fflush(stdout);
        }
    tune_set(ctx, &t0);
}

int main(int argc, char **argv) {
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    test_refusals(ctx);
    int timed_only = 0;
    for (int i = 1; i < argc; i++) {
        timed_only |= !strcmp(argv[i], "benchonly");
        if (!strncmp(argv[i], "layouts=", 8))
            for (const char *c = argv[i] + 8; *c && n_layouts < MAX_LAYOUTS; c += strcspn(c, ","), c += *c == ',') {
                int parts, chunk, used = 0;
                if (sscanf(c, "%d:%d%n", &parts, &chunk, &used) != 2 || (c[used] && c[used] != ',')) {
                    fprintf(stderr, "layouts=: '%s' is not parts:chunk\n", c);
                    return 2;
                }
                layouts[n_layouts][0] = parts, layouts[n_layouts++][1] = chunk;
            }
        if (!strncmp(argv[i], "dqforms=", 8))
            for (const char *c = argv[i] + 8; *c && n_dq < N_DQ_FORMS; c += strcspn(c, ","), c += *c == ',') {
                const int f = atoi(c);
                if (f < 0 || f >= N_DQ_FORMS) {
                    fprintf(stderr, "dqforms=: %d is not a form (0-%d)\n", f, N_DQ_FORMS - 1);
                    return 2;
                }
                dq_forms[n_dq++] = f;
            }
    }
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "fwdab") || !strcmp(argv[i], "bwdab") || !strcmp(argv[i], "dqab")) {
            variants_ab(ctx, argv[i][0], timed_only);
            coda_context_free(ctx);
            TEST_MAIN_END();
        }
    /* "pass=N": only kernel set N (a sanitizer run of one set);
     * "benchonly": the timings without the tests (a profiler's run) */
    int only = -1, bench_it = 0, tests = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "bench")) bench_it = 1;
        else if (!strcmp(argv[i], "benchonly")) bench_it = 1, tests = 0;
        else if (!strncmp(argv[i], "pass=", 5)) only = atoi(argv[i] + 5);
    }
    for (int k = 0; k < N_KERNEL_SETS; k++) {
        if (only >= 0 && k != only) continue;
        tune_attn(ctx, k);
        printf("== attention: %s\n", kernel_names[k]);
        if (tests) {
            test_shapes(ctx);
            test_nan(ctx);
        }
        if (bench_it) bench(ctx, 2);
    }
    coda_context_free(ctx);
    TEST_MAIN_END();
}
