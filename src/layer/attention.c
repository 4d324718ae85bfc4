/* attention.c - causal grouped-query attention on the CPU (see attention.h).
 *
 * Plain exact softmax per (row, head): scores for keys j <= i, max, exp, sum.
 * Backward follows FlashAttention's formulation with the saved lse:
 *   P_ij = exp(s_ij - lse_i),  dP_ij = do_i . v_j,  D_i = do_i . o_i,
 *   dS_ij = P_ij (dP_ij - D_i),
 *   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i,  dv_j = sum_i P_ij do_i.
 * dq is computed per query row, dk/dv per key row (recomputing P): each output
 * element is owned by exactly one task, so there are no atomics or locks and
 * the summation order, hence the result, is independent of the thread count.
 */
#include "layer/attention.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

/* ---- a tiny fixed-partition parallel-for ---- */

typedef void (*task_fn)(void *ctx, int64_t begin, int64_t end, int worker);

typedef struct {
    task_fn fn;
    void *ctx;
    int64_t begin, end;
    int worker;
} chunk_t;

static void *run_chunk(void *p) {
    chunk_t *c = (chunk_t *)p;
    c->fn(c->ctx, c->begin, c->end, c->worker);
    return NULL;
}

enum { MAX_THREADS = 256 };

/* The workers parallel_for runs n tasks on with `threads` asked for (what
 * per-worker scratch is sized by). */
static int workers(int threads, int64_t n) {
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > n) threads = (int)(n > 0 ? n : 1);
    return threads < 1 ? 1 : threads;
}

/* Run fn over [0, n) split into workers(threads, n) contiguous chunks. If a
 * thread cannot be started its chunk runs on the calling thread: slower,
 * never wrong. */
static void parallel_for(task_fn fn, void *ctx, int64_t n, int threads) {
    threads = workers(threads, n);
    chunk_t chunks[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    int started[MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        chunks[t].fn = fn;
        chunks[t].ctx = ctx;
        chunks[t].begin = n * t / threads;
        chunks[t].end = n * (t + 1) / threads;
        chunks[t].worker = t;
        started[t] = 0;
    }
    for (int t = 1; t < threads; t++)
        started[t] = pthread_create(&tids[t], NULL, run_chunk, &chunks[t]) == 0;
    run_chunk(&chunks[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t]) pthread_join(tids[t], NULL);
        else run_chunk(&chunks[t]);
    }
}

/* ---- shared state of one call ---- */

typedef struct {
    int64_t seq, n_heads, group, hd;  /* group = n_heads / n_kv_heads    */
    int64_t nq, nkv, w;               /* w = nq + 2 nkv, the qkv width     */
    float scale;
    const float *qkv;    // (M, w) f32 copy of qkv
    const float *dout;   // (M, nq) f32 copy of do (backward)
    const float *lse;    // (M, n_heads) f32 (backward, contiguous copy)
    const float *delta;  // (M, n_heads) D_i = do_i . o_i (backward)
    float *scratch;      // (threads, seq) scores per worker (forward)
    float *out;          // forward: (M, nq) o in f32;  backward: (M, w) dqkv
    float *out_lse;      // (M, n_heads) forward lse
} attn_t;

/* Eight independent partial sums, combined in a fixed order: the compiler can
 * keep them in one vector register (no -ffast-math needed), and the result
 * still does not depend on anything but the inputs. */
static float dot(const float *a, const float *b, int64_t n) {
    float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t d = 0;
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; l++) p[l] += a[d + l] * b[d + l];
    float s = ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
    for (; d < n; d++) s += a[d] * b[d];
    return s;
}

/* Task index = row * n_heads + head. */
static void forward_task(void *p, int64_t begin, int64_t end, int worker) {
    const attn_t *a = (const attn_t *)p;
    float *s = a->scratch + (int64_t)worker * a->seq;
    for (int64_t t = begin; t < end; t++) {
        int64_t r = t / a->n_heads, h = t % a->n_heads, kvh = h / a->group;
        int64_t r0 = r - r % a->seq; /* first row of this sequence */
        const float *q = a->qkv + r * a->w + h * a->hd;
        float m = -INFINITY;
        for (int64_t j = r0; j <= r; j++) {
            const float *k = a->qkv + j * a->w + a->nq + kvh * a->hd;
            s[j - r0] = dot(q, k, a->hd) * a->scale;
            if (s[j - r0] > m) m = s[j - r0];
        }
        float l = 0.0f;
        for (int64_t j = r0; j <= r; j++) {
            s[j - r0] = expf(s[j - r0] - m);
            l += s[j - r0];
        }
        float *o = a->out + r * a->nq + h * a->hd;
        for (int64_t d = 0; d < a->hd; d++) o[d] = 0.0f;
        for (int64_t j = r0; j <= r; j++) {
            const float *v = a->qkv + j * a->w + a->nq + a->nkv + kvh * a->hd;
            float pj = s[j - r0] / l;
            for (int64_t d = 0; d < a->hd; d++) o[d] += pj * v[d];
        }
        a->out_lse[r * a->n_heads + h] = m + logf(l);
    }
}

/* dq. Task index = row * n_heads + head. */
static void dq_task(void *p, int64_t begin, int64_t end, int worker) {
    const attn_t *a = (const attn_t *)p;
    for (int64_t t = begin; t < end; t++) {
        int64_t i = t / a->n_heads, h = t % a->n_heads, kvh = h / a->group;
        int64_t r0 = i - i % a->seq;
        const float *q = a->qkv + i * a->w + h * a->hd;
        const float *dout = a->dout + i * a->nq + h * a->hd;
        float lse = a->lse[i * a->n_heads + h], delta = a->delta[i * a->n_heads + h];
        float *dq = a->out + i * a->w + h * a->hd;
        for (int64_t d = 0; d < a->hd; d++) dq[d] = 0.0f;
        for (int64_t j = r0; j <= i; j++) {
            const float *k = a->qkv + j * a->w + a->nq + kvh * a->hd;
            const float *v = k + a->nkv;
            float pij = expf(dot(q, k, a->hd) * a->scale - lse);
            float ds = pij * (dot(dout, v, a->hd) - delta);
            for (int64_t d = 0; d < a->hd; d++) dq[d] += ds * k[d];
        }
        for (int64_t d = 0; d < a->hd; d++) dq[d] *= a->scale;
    }
}

/* dk, dv. Task index = key row * n_kv_heads + kv head. */
static void dkv_task(void *p, int64_t begin, int64_t end, int worker) {
    const attn_t *a = (const attn_t *)p;
    int64_t n_kv = a->n_heads / a->group;
    for (int64_t t = begin; t < end; t++) {
        int64_t j = t / n_kv, kvh = t % n_kv;
        int64_t r1 = j - j % a->seq + a->seq; /* one past the last row of the sequence */
        const float *k = a->qkv + j * a->w + a->nq + kvh * a->hd;
        const float *v = k + a->nkv;
        float *dk = a->out + j * a->w + a->nq + kvh * a->hd;
        float *dv = dk + a->nkv;
        for (int64_t d = 0; d < a->hd; d++) dk[d] = dv[d] = 0.0f;
        for (int64_t h = kvh * a->group; h < (kvh + 1) * a->group; h++) {
            for (int64_t i = j; i < r1; i++) {
                const float *q = a->qkv + i * a->w + h * a->hd;
                const float *dout = a->dout + i * a->nq + h * a->hd;
                float pij = expf(dot(q, k, a->hd) * a->scale - a->lse[i * a->n_heads + h]);
                float ds = pij * (dot(dout, v, a->hd) - a->delta[i * a->n_heads + h]);
                for (int64_t d = 0; d < a->hd; d++) {
                    dk[d] += ds * q[d];
                    dv[d] += pij * dout[d];
                }
            }
        }
        for (int64_t d = 0; d < a->hd; d++) dk[d] *= a->scale;
    }
}

/* ---- argument checks ---- */

static coda_status_t check_common(const coda_llama_config_t *cfg, int64_t batch, int64_t seq,
                                  int threads, attn_t *a) {
    if (!cfg) return coda__fail(CODA_ERR_INVALID_ARG, "cfg: is NULL");
    if (cfg->n_heads < 1 || cfg->n_kv_heads < 1)
        return coda__fail(CODA_ERR_SHAPE, "cfg: n_heads %lld and n_kv_heads %lld must be >= 1",
                          (long long)cfg->n_heads, (long long)cfg->n_kv_heads);
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return coda__fail(CODA_ERR_SHAPE, "cfg: n_kv_heads %lld does not divide n_heads %lld",
                          (long long)cfg->n_kv_heads, (long long)cfg->n_heads);
    if (cfg->head_dim < 2 || cfg->head_dim % 2 != 0)
        return coda__fail(CODA_ERR_SHAPE, "cfg: head_dim %lld must be even and >= 2",
                          (long long)cfg->head_dim);
    if (cfg->n_heads > (1 << 16) || cfg->head_dim > (1 << 16))
        return coda__fail(CODA_ERR_SHAPE, "cfg: n_heads %lld or head_dim %lld too large",
                          (long long)cfg->n_heads, (long long)cfg->head_dim);
    if (batch < 1 || seq < 1)
        return coda__fail(CODA_ERR_SHAPE, "batch %lld and seq %lld must be >= 1", (long long)batch,
                          (long long)seq);
    if (batch > ((int64_t)1 << 30) / seq)
        return coda__fail(CODA_ERR_SHAPE, "batch*seq = %lld*%lld is too large", (long long)batch,
                          (long long)seq);
    if (threads < 1) return coda__fail(CODA_ERR_INVALID_ARG, "threads: %d must be >= 1", threads);
    memset(a, 0, sizeof *a);
    a->seq = seq;
    a->n_heads = cfg->n_heads;
    a->group = cfg->n_heads / cfg->n_kv_heads;
    a->hd = cfg->head_dim;
    a->nq = cfg->n_heads * cfg->head_dim;
    a->nkv = cfg->n_kv_heads * cfg->head_dim;
    a->w = a->nq + 2 * a->nkv;
    a->scale = (float)(1.0 / sqrt((double)cfg->head_dim));
    return CODA_OK;
}

static coda_status_t check_2d(const coda_tensor_t *t, const char *what, int64_t rows, int64_t cols,
                              coda_dtype_t dtype) {
    int64_t shape[2] = {rows, cols};
    CODA_TRY(coda__check_shape(t, what, 2, shape));
    CODA_TRY(coda__check_dtype(t, what, &dtype, 1));
    if (t->device != CODA_DEVICE_CPU)
        return coda__fail(CODA_ERR_DEVICE, "%s: CPU attention needs a CPU tensor", what);
    return CODA_OK;
}

static coda_status_t check_no_overlap(const coda_tensor_t *out, const char *oname,
                                      const coda_tensor_t *in, const char *iname) {
    if (coda__tensors_overlap(out, in))
        return coda__fail(CODA_ERR_OVERLAP, "%s overlaps %s", oname, iname);
    return CODA_OK;
}

/* Copy a 2-D tensor of any supported dtype into a contiguous f32 array. */
static void load_f32(const coda_tensor_t *t, float *dst) {
    for (int64_t i = 0; i < t->shape[0]; i++)
        for (int64_t j = 0; j < t->shape[1]; j++)
            dst[i * t->shape[1] + j] = coda__load_f32(coda__at2(t, i, j), t->dtype);
}

/* ---- entry points ---- */

coda_status_t coda__attention_forward(const coda_llama_config_t *cfg, int64_t batch, int64_t seq,
                                      const coda_tensor_t *qkv, coda_tensor_t *o,
                                      coda_tensor_t *lse, int threads) {
    attn_t a;
    CODA_TRY(check_common(cfg, batch, seq, threads, &a));
    int64_t m = batch * seq;
    CODA_TRY(check_2d(qkv, "qkv", m, a.w, CODA_BF16));
    CODA_TRY(check_2d(o, "o", m, a.nq, CODA_BF16));
    CODA_TRY(check_2d(lse, "lse", m, a.n_heads, CODA_F32));
    CODA_TRY(check_no_overlap(o, "o", qkv, "qkv"));
    CODA_TRY(check_no_overlap(lse, "lse", qkv, "qkv"));
    CODA_TRY(check_no_overlap(o, "o", lse, "lse"));

    float *buf_qkv = malloc((size_t)(m * a.w) * sizeof(float));
    float *buf_o = malloc((size_t)(m * a.nq) * sizeof(float));
    float *buf_lse = malloc((size_t)(m * a.n_heads) * sizeof(float));
    /* a row of scores per worker (not per thread asked for: a context may
     * ask for far more than parallel_for starts) */
    float *scratch = malloc((size_t)workers(threads, m * a.n_heads) * (size_t)seq * sizeof(float));
    if (!buf_qkv || !buf_o || !buf_lse || !scratch) {
        free(buf_qkv); free(buf_o); free(buf_lse); free(scratch);
        return coda__fail(CODA_ERR_NO_MEMORY, "attention forward: out of host memory (M = %lld)",
                          (long long)m);
    }
    load_f32(qkv, buf_qkv);
    a.qkv = buf_qkv;
    a.scratch = scratch;
    a.out = buf_o;
    a.out_lse = buf_lse;
    parallel_for(forward_task, &a, m * a.n_heads, threads);

    for (int64_t i = 0; i < m; i++) {
        for (int64_t c = 0; c < a.nq; c++)
            *(uint16_t *)coda__at2(o, i, c) = coda__f32_to_bf16(buf_o[i * a.nq + c]);
        for (int64_t h = 0; h < a.n_heads; h++)
            *(float *)coda__at2(lse, i, h) = buf_lse[i * a.n_heads + h];
    }
    free(buf_qkv); free(buf_o); free(buf_lse); free(scratch);
    return CODA_OK;
}

coda_status_t coda__attention_backward(const coda_llama_config_t *cfg, int64_t batch, int64_t seq,
                                       const coda_tensor_t *qkv, const coda_tensor_t *o,
                                       const coda_tensor_t *lse, const coda_tensor_t *do_,
                                       coda_tensor_t *dqkv, int threads) {
    attn_t a;
    CODA_TRY(check_common(cfg, batch, seq, threads, &a));
    int64_t m = batch * seq;
    CODA_TRY(check_2d(qkv, "qkv", m, a.w, CODA_BF16));
    CODA_TRY(check_2d(o, "o", m, a.nq, CODA_BF16));
    CODA_TRY(check_2d(lse, "lse", m, a.n_heads, CODA_F32));
    CODA_TRY(check_2d(do_, "do", m, a.nq, CODA_BF16));
    CODA_TRY(check_2d(dqkv, "dqkv", m, a.w, CODA_F32));
    CODA_TRY(check_no_overlap(dqkv, "dqkv", qkv, "qkv"));
    CODA_TRY(check_no_overlap(dqkv, "dqkv", o, "o"));
    CODA_TRY(check_no_overlap(dqkv, "dqkv", lse, "lse"));
    CODA_TRY(check_no_overlap(dqkv, "dqkv", do_, "do"));

    float *buf_qkv = malloc((size_t)(m * a.w) * sizeof(float));
    float *buf_do = malloc((size_t)(m * a.nq) * sizeof(float));
    float *buf_lse = malloc((size_t)(m * a.n_heads) * sizeof(float));
    float *buf_delta = malloc((size_t)(m * a.n_heads) * sizeof(float));
    float *buf_out = malloc((size_t)(m * a.w) * sizeof(float));
    if (!buf_qkv || !buf_do || !buf_lse || !buf_delta || !buf_out) {
        free(buf_qkv); free(buf_do); free(buf_lse); free(buf_delta); free(buf_out);
        return coda__fail(CODA_ERR_NO_MEMORY, "attention backward: out of host memory (M = %lld)",
                          (long long)m);
    }
    load_f32(qkv, buf_qkv);
    load_f32(do_, buf_do);
    load_f32(lse, buf_lse);
    /* D_i = do_i . o_i with o as stored (bf16), as PyTorch's backward does. */
    for (int64_t i = 0; i < m; i++)
        for (int64_t h = 0; h < a.n_heads; h++) {
            float s = 0.0f;
            for (int64_t d = 0; d < a.hd; d++)
                s += buf_do[i * a.nq + h * a.hd + d] *
                     coda__bf16_to_f32(*(const uint16_t *)coda__at2(o, i, h * a.hd + d));
            buf_delta[i * a.n_heads + h] = s;
        }
    a.qkv = buf_qkv;
    a.dout = buf_do;
    a.lse = buf_lse;
    a.delta = buf_delta;
    a.out = buf_out;
    parallel_for(dq_task, &a, m * a.n_heads, threads);
    parallel_for(dkv_task, &a, m * cfg->n_kv_heads, threads);

    for (int64_t i = 0; i < m; i++)
        for (int64_t c = 0; c < a.w; c++) *(float *)coda__at2(dqkv, i, c) = buf_out[i * a.w + c];
    free(buf_qkv); free(buf_do); free(buf_lse); free(buf_delta); free(buf_out);
    return CODA_OK;
}
