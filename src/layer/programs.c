/* programs.c - the built-in epilogue programs of the LLaMA layer.
 *
 * Each program is the text form of include/coda.h section 5. The layer
 * (llama.c) parses them once per layer instance and runs them through
 * coda_gemm_epilogue; tools and bindings can fetch the texts by name.
 *
 * Notation (docs/layer.md): M tokens, d hidden, I FFN width, nq / nkv
 * query / key-value widths, V vocabulary, N the GEMM's output columns.
 * "acc" is the fp32 accumulator of the GEMM the program is attached to:
 *   forward GEMMs   acc = A B^T  (CODA_LAYOUT_NT, B is a weight (N, K))
 *   dgrad GEMMs     acc = A B    (CODA_LAYOUT_NN, B is a weight (K, N))
 * RMSNorm is split around the GEMM: the producer stores x*g and partial sums
 * of squares, coda_finish_rstd turns them into r, and the consumer multiplies
 * its accumulator rows by r (r is one scalar per row, so it commutes with the
 * GEMM).
 *
 * gate/up and QKV + RoPE round the accumulator to bf16 before anything
 * else. On the GPU that lets each tile's epilogue run beside the next
 * tile's k-loop (src/cuda/kernels/gemm_overlap.cuh, which holds a finished
 * tile as bf16) with the same bits: 2.9-5.3% off the 1B-70B gate/up
 * GEMMs, 1.2-2.4% off QKV (an H100, bench/RESULTS.md, stop 62, timed
 * before these programs rounded acc themselves). It costs some accuracy, the
 * same on every backend: up to 1.3x the error of the unrounded programs on
 * test_layer's rows, all within the rule (2x the unfused bf16 error;
 * worst row at 0.54 of its bound, against 0.49 before).
 */
#include "core/internal.h"

#include <string.h>

/* resid_norm - O projection (A = o, B = Wo) or down projection (A = c,
 * B = Wd) followed by the residual add and the first half of the next
 * RMSNorm:
 *     h  = acc + res                       (M, N=d) bf16
 *     hg = h * g                           (M, d)   bf16, next GEMM's A
 *     ss[i][t] = sum over tile t of h_ij^2 (M, n_tiles) f32
 * The squares are of the bf16 value stored, so r matches the unfused
 * computation, which normalises the stored residual stream. */
static const char prog_resid_norm[] =
    "program resid_norm\n"
    "in  res tile bf16        # (M, N) residual stream entering\n"
    "in  g   col  bf16        # (N) weight of the next RMSNorm\n"
    "out h   tile bf16        # (M, N) residual stream leaving\n"
    "out hg  tile bf16        # (M, N) h * g, A operand of the next GEMM\n"
    "out ss  rowsum           # (M, n_tiles) partial sums of h^2\n"
    "a   = acc\n"
    "rv  = load res\n"
    "s   = add a rv\n"
    "h1  = round_bf16 s       # the value the store keeps\n"
    "store h h1\n"
    "gv  = load g\n"
    "hg1 = mul h1 gv\n"
    "store hg hg1\n"
    "sq  = mul h1 h1\n"
    "reduce ss sq\n";

/* resid_add - the down projection of a layer with no LM head after it:
 *     h = acc + res                        (M, N) bf16 */
static const char prog_resid_add[] =
    "program resid_add\n"
    "in  res tile bf16        # (M, N) residual stream entering\n"
    "out h   tile bf16        # (M, N) residual stream leaving\n"
    "a  = acc\n"
    "rv = load res\n"
    "s  = add a rv\n"
    "store h s\n";

/* qkv_rope - the QKV projection (A = x*g1, B = Wqkv, N = nq + 2 nkv) with
 * the RMSNorm row scale and RoPE:
 *     z = r *row bf16(acc)
 *     (y_2j, y_2j+1) = rotate (z_2j, z_2j+1) by pos_i * freq_j
 * Wqkv's q and k rows are packed (coda_llama_pack_qkv) so that the
 * rotate-half pairs (i, i + head_dim/2) are adjacent columns (2i, 2i+1).
 * freq_j = theta^(-2i/head_dim) for pair i of a q or k head, and 0 for the v
 * columns: cos 0 = 1 and sin 0 = 0 exactly, so v passes unchanged.
 *     r    (M)     f32  rstd of the layer input
 *     pos  (M)     f32  token position within its sequence (i % seq)
 *     freq (N/2)   f32  per column pair
 *     qkv  (M, N)  bf16 rotated q, k and plain v, the attention input */
static const char prog_qkv_rope[] =
    "program qkv_rope\n"
    "in  r    row f32         # (M) rstd of the layer input\n"
    "in  pos  row f32         # (M) position of each token in its sequence\n"
    "in  freq col f32 half    # (N/2) RoPE frequency per column pair, 0 for v\n"
    "out qkv  tile bf16       # (M, N) roped q and k, plain v\n"
    "a0 = acc\n"
    "a  = round_bf16 a0       # the accumulator in bf16 (above)\n"
    "rv = load r\n"
    "z  = mul a rv\n"
    "ze = even z\n"
    "zo = odd z\n"
    "p  = load pos\n"
    "f  = load freq\n"
    "th = mul p f             # angle, (M, N/2)\n"
    "c  = cos th\n"
    "s  = sin th\n"
    "t0 = mul ze c\n"
    "t1 = mul zo s\n"
    "ye = sub t0 t1           # x1 cos - x2 sin\n"
    "t2 = mul ze s\n"
    "t3 = mul zo c\n"
    "yo = add t2 t3           # x2 cos + x1 sin\n"
    "y  = interleave ye yo\n"
    "store qkv y\n";

/* gateup_swiglu - the gate/up projection (A = h*g2, B = Wgu, N = 2I, gate
 * and up columns interleaved) with the RMSNorm row scale and SwiGLU as a
 * 2->1 pairwise map (inference: nothing saved):
 *     z = bf16(r *row bf16(acc))
 *     c_j = silu(z_2j) * z_2j+1            (M, I) bf16, half space
 * z is rounded to bf16 first, as the unfused computation stores it. */
static const char prog_gateup_swiglu[] =
    "program gateup_swiglu\n"
    "in  r  row f32           # (M) rstd of h\n"
    "out c  tile bf16 half    # (M, I) silu(gate) * up\n"
    "a0 = acc\n"
    "a  = round_bf16 a0       # the accumulator in bf16 (above)\n"
    "rv = load r\n"
    "z0 = mul a rv\n"
    "z  = round_bf16 z0\n"
    "g  = even z\n"
    "u  = odd z\n"
    "sg = silu g\n"
    "cv = mul sg u\n"
    "store c cv\n";

/* gateup_swiglu_train - gateup_swiglu that also saves the pre-activation
 *     z (M, 2I) bf16  (gate, up interleaved)
 * for the SwiGLU backward (swiglu_bwd). The c computed here and the c the
 * backward recomputes from the saved z are the same bits. */
static const char prog_gateup_swiglu_train[] =
    "program gateup_swiglu_train\n"
    "in  r  row f32           # (M) rstd of h\n"
    "out z  tile bf16         # (M, 2I) saved pre-activation\n"
    "out c  tile bf16 half    # (M, I) silu(gate) * up\n"
    "a0 = acc\n"
    "a  = round_bf16 a0       # the accumulator in bf16 (above)\n"
    "rv = load r\n"
    "z0 = mul a rv\n"
    "z1 = round_bf16 z0\n"
    "store z z1\n"
    "g  = even z1\n"
    "u  = odd z1\n"
    "sg = silu g\n"
    "cv = mul sg u\n"
    "store c cv\n";

/* lmhead_lse - the LM head (A = y*gf, B = Wlm, N = V) with the final
 * RMSNorm row scale and the cross-entropy's online log-sum-exp:
 *     z = rf *row acc                      logits, never stored
 *     part[i][t] = (max, sum exp(z - max), z at column target_i) over tile t
 * coda_finish_lse turns the partials into lse_i and loss_i. */
static const char prog_lmhead_lse[] =
    "program lmhead_lse\n"
    "in  r    row f32         # (M) rstd of y\n"
    "in  t    row i32         # (M) target token, -100: ignored\n"
    "out part lse             # (M, n_tiles, 3) online log-sum-exp partials\n"
    "a  = acc\n"
    "rv = load r\n"
    "z  = mul a rv\n"
    "tv = load t\n"
    "lse part z tv\n";

/* lmhead_bwd - the LM head recomputed (same GEMM as lmhead_lse, so the same
 * logits bit for bit) with the cross-entropy backward:
 *     dl = scale * (exp(z - lse) - onehot(target)) * valid   (M, V) bf16
 *     s[i][t] = sum over tile t of z_ij dl_ij               (M, n_tiles)
 * s is the row statistic of the final RMSNorm's backward (docs/layer.md: the
 * sum of b*db equals the sum of z*dz of the GEMM b feeds). It uses the
 * rounded dl, the value the next GEMM consumes. */
static const char prog_lmhead_bwd[] =
    "program lmhead_bwd\n"
    "in  r     row f32        # (M) rstd of y\n"
    "in  logz  row f32        # (M) log-sum-exp of each row's logits\n"
    "in  t     row i32        # (M) target token, -100: ignored\n"
    "in  scale scalar         # loss_scale\n"
    "out dl    tile bf16      # (M, V) dL/dlogits\n"
    "out s     rowsum         # (M, n_tiles) partial sums of z * dl\n"
    "a   = acc\n"
    "rv  = load r\n"
    "z   = mul a rv\n"
    "lv  = load logz\n"
    "zl  = sub z lv\n"
    "p   = exp zl             # softmax\n"
    "tv  = load t\n"
    "ci  = colidx\n"
    "hit = eq ci tv\n"
    "q   = sub p hit\n"
    "ign = const -100\n"
    "no  = eq tv ign\n"
    "zer = const 0\n"
    "sc  = load scale\n"
    "w   = select no zer sc   # 0 on ignored rows\n"
    "dv  = mul q w\n"
    "dr  = round_bf16 dv\n"
    "store dl dr\n"
    "zd  = mul z dr\n"
    "reduce s zd\n";

/* swiglu_bwd - the down projection's dgrad (A = dy, B = Wd, N = I; so
 * acc = dc) with the SwiGLU backward. The saved z is read as a tile of the
 * double space (2I columns), split into gate g and up u (full space):
 *     dg = dc * u * silu'(g),  du = dc * silu(g)
 *     dz = interleave(dg, du)               (M, 2I) bf16, double space
 *     s[i][t] = sum over tile t of z * dz   (M, n_tiles) partials
 *     c  = silu(g) * u                      (M, I) bf16, for dWd = dy^T c
 * s is the statistic of the RMSNorm backward of h (z = r2 (h g2) Wgu^T). */
/* the parts swiglu_bwd and swiglu_bwd_kept share: z in, dz out; then g,
 * u and silu(g); then dz, its rounding and the partials of z * dz */
#define SWIGLU_BWD_Z_DZ \
    "in  z  tile bf16 double  # (M, 2I) saved pre-activation\n" \
    "out dz tile bf16 double  # (M, 2I) (dgate, dup) interleaved\n"
#define SWIGLU_BWD_S "out s  rowsum            # (M, n_tiles) partial sums of z * dz\n"
#define SWIGLU_BWD_GATE \
    "dc = acc\n"         \
    "zz = load z\n"      \
    "g  = even zz\n"     \
    "u  = odd zz\n"      \
    "sg = silu g\n"
#define SWIGLU_BWD_DZ_S                                                  \
    "ds = dsilu g\n"                                                     \
    "t0 = mul dc u\n"                                                    \
    "dg = mul t0 ds\n"                                                   \
    "du = mul dc sg\n"                                                   \
    "d2 = interleave dg du\n"                                            \
    "dr = round_bf16 d2       # the value the next GEMM consumes\n"      \
    "store dz dr\n"                                                      \
    "p  = mul zz dr\n"                                                   \
    "reduce s p\n"

static const char prog_swiglu_bwd[] =
    "program swiglu_bwd\n"
    SWIGLU_BWD_Z_DZ
    "out c  tile bf16         # (M, I) silu(gate) * up, recomputed\n"
    SWIGLU_BWD_S
    SWIGLU_BWD_GATE
    "cv = mul sg u\n"
    "store c cv\n"
    SWIGLU_BWD_DZ_S;

/* swiglu_bwd_kept - swiglu_bwd without c, for a c kept from the forward
 * (coda_block_acts_t.c): dz and s, the same bits. */
static const char prog_swiglu_bwd_kept[] =
    "program swiglu_bwd_kept\n"
    SWIGLU_BWD_Z_DZ
    SWIGLU_BWD_S
    SWIGLU_BWD_GATE
    SWIGLU_BWD_DZ_S;

/* rmsnorm_bwd - the dgrad GEMM of a GEMM fed by b = r x g (acc = dz W = db,
 * N = d) with the RMSNorm backward (docs/layer.md):
 *     dx = dres + r (g db - x r s / d)      (M, d) bf16
 *     b  = r x g                            (M, d) bf16, for dW = dz^T b
 *     dg[j][t] = sum over tile t of db r x  (d, m_tiles) column partials
 * s_i = sum_k z_ik dz_ik comes from the downstream GEMM's epilogue. Used for
 * the LM head (x = y, g = gf), gate/up (x = h, g = g2) and QKV (x = x, g = g1).
 *     dres (M, d) bf16  gradient arriving through the residual path
 *     x    (M, d) bf16  RMSNorm input;  g (d) bf16;  r, s (M) f32
 *     invd              1 / d */
static const char prog_rmsnorm_bwd[] =
    "program rmsnorm_bwd\n"
    "in  dres tile bf16       # (M, N) gradient through the residual path\n"
    "in  x    tile bf16       # (M, N) RMSNorm input\n"
    "in  g    col  bf16       # (N) RMSNorm weight\n"
    "in  r    row  f32        # (M) rstd\n"
    "in  s    row  f32        # (M) rowsum(z * dz) of the downstream GEMM\n"
    "in  invd scalar          # 1 / N\n"
    "out dx   tile bf16       # (M, N) gradient of x\n"
    "out b    tile bf16       # (M, N) r x g, for the weight gradient\n"
    "out dg   colsum          # (N, m_tiles) partials of the gradient of g\n"
    "db  = acc\n"
    "xv  = load x\n"
    "gv  = load g\n"
    "rv  = load r\n"
    "sv  = load s\n"
    "id  = load invd\n"
    "xr  = mul xv rv\n"
    "gdb = mul gv db\n"
    "si  = mul sv id\n"
    "t1  = mul xr si\n"
    "t2  = sub gdb t1\n"
    "t3  = mul rv t2\n"
    "dr  = load dres\n"
    "dxv = add dr t3\n"
    "store dx dxv\n"
    "bv  = mul xr gv\n"
    "store b bv\n"
    "dgv = mul db xr\n"
    "reduce dg dgv\n";

static const char *const names[] = {
    "resid_norm",  "resid_add",  "qkv_rope",   "gateup_swiglu", "gateup_swiglu_train",
    "lmhead_lse",  "lmhead_bwd", "swiglu_bwd", "rmsnorm_bwd",   "swiglu_bwd_kept", NULL,
};
static const char *const texts[] = {
    prog_resid_norm, prog_resid_add, prog_qkv_rope,   prog_gateup_swiglu, prog_gateup_swiglu_train,
    prog_lmhead_lse, prog_lmhead_bwd, prog_swiglu_bwd, prog_rmsnorm_bwd,  prog_swiglu_bwd_kept, NULL,
};

const char *coda_builtin_program(const char *name) {
    if (!name) return NULL;
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], name) == 0) return texts[i];
    return NULL;
}

const char *const *coda_builtin_program_names(void) { return names; }
