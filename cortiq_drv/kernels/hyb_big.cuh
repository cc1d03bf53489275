// The prompt path's kernels (the reference's `big`: a chunk of more than NMAX rows on cuBLAS).
// Weights expand from the repacked q4tp layout (hyb_mma.cuh's header) into one dense f16 plane
// that cuBLAS multiplies; the kernels here are the glue between those GEMMs: norms to f16, the
// GDN chunk (conv with the L2 norms, ring, gated norm; the gates and the chunked delta rule are
// in hyb_gdn_chunk.cuh), attention's softmax and output over the two batched GEMMs a KV group (where
// hy_flash_h of hyb_flash.cuh does not take attention whole), and the FFN middle.
//
// Layouts shared with the small path (hyb_gdn.cuh, hyb_attn.cuh): raw [n][qs], ring [kk-1][cdim],
// taps [cdim][kk], cq [n][cdim] (q | k | v), S [nv][dk][dv], K/V mirrors f16 [rows][nkv][hd].
// All float math in f32; f16 values are IEEE half bit patterns (common.cuh), written with round
// to nearest even.
//
// Attention over a pass of bn query rows of a chunk of n rows (cols = bn * hpk query columns a KV
// group; istride = n * hpk): the query copy is group-major, qh [nkv][n][hpk][hd] f16, so one
// strided-batched GEMM a group reads a pass as a plain matrix; scores S and weights P are
// [nkv][cols][l_rows] (column c of group g at (g * cols + c) * l_rows); the GEMM's output is
// group-major too, ao [nkv][n][hpk][hd] f32; the row sums' inverses isum [nkv][n * hpk].

// Two f32 values as packed f16 (the first in the low half).
__device__ __forceinline__ u32 hb_h2(float lo, float hi) {
    return pack2(f32_to_f16(lo), f32_to_f16(hi));
}

// Head h = g * hpk + i of query row r (g = h / hpk, i = h % hpk) in the group-major order
// [nkv][n][hpk] (header).
__device__ __forceinline__ size_t hb_gmajor(int h, size_t r, int n, int hpk) {
    return ((size_t)(h / hpk) * n + r) * hpk + h % hpk;
}

// hy_expand_pr: the band of tiles [t0, t0 + nt) of a repacked q4tp matrix (rows x cols) as dense
// f16 rows wd [min(16 nt, rows - 16 t0)][cols] (t0 0, nt ceil(rows / 16): the whole matrix, the
// reference's hy_expand_p): band row (t - t0) * 16 + i is logical row r = 16 t + i;
// weight (r, c) = (nibble - 8) * exp2(lo_r + code(r, c / 32) * step_r).
// Thread (band row, group g, half s) writes the 16 columns 32 g + 16 s .. + 15 of its row: word s
// of lanes gid * 4 + tig (gid = i & 7, tig 0..3) holds them, register m = (i >> 3) + 2 mh giving
// columns 16 s + 8 mh + 2 tig (low nibble, bits 4m) and the next one (bits 4m + 16).
// Pointers: tiles u32 [ntile][gpr][32][2], codes u8 [ntile][gpr][16], lad f32 [rows][2] (hy_repack's
// layout); wd f16 out, 16-byte aligned. Grid ceil(nt * gpr * 32 / 256), block 256 (ntile =
// ceil(rows / 16), gpr = cols / 32). Assumes cols % 32 == 0.
extern "C" __global__ void hy_expand_pr(const u32* tiles, const unsigned char* codes, const float* lad, f16* wd,
                                        int rows, int cols, int t0, int nt) {
    const int gpr = cols >> 5;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)nt * gpr * 32) return;
    const int s = (int)(idx & 1), g = (int)((idx >> 1) % gpr);
    const size_t lr = (idx >> 1) / gpr;
    const int t = t0 + (int)(lr >> 4), i = (int)(lr & 15), r = t * 16 + i;
    if (r >= rows) return;
    const size_t tg = (size_t)t * gpr + g;
    const u32* wp = tiles + (tg * 32 + (i & 7) * 4) * 2 + s;
    const float rung = hy_rung(lad[2 * r], lad[2 * r + 1], codes[tg * 16 + i]);
    u32 out[8];
#pragma unroll
    for (int tig = 0; tig < 4; ++tig) {
        const u32 x = wp[tig * 2];
#pragma unroll
        for (int mh = 0; mh < 2; ++mh) {
            const int m = (i >> 3) + 2 * mh;
            const float w0 = (float)((int)((x >> (4 * m)) & 15u) - 8) * rung;
            const float w1 = (float)((int)((x >> (4 * m + 16)) & 15u) - 8) * rung;
            out[4 * mh + tig] = hb_h2(w0, w1);
        }
    }
    uint4* dst = (uint4*)(wd + lr * cols + (size_t)g * 32 + 16 * s);
    dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
    dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// hy_rmsnorm: y[r] = f16(x[r] / sqrt(mean(x[r]^2) + eps) * (gemma ? 1 + w : w)).
// Thread t takes the 4-column groups t, t + 256, ... of its row (16-byte loads, 8-byte stores).
// Pointers: x [n][hidden] f32, w [hidden] f32, y [n][hidden] f16 out, 16-byte aligned.
// Grid (n, 1), block 256. Assumes hidden % 4 == 0.
extern "C" __global__ void hy_rmsnorm(const float* x, const float* w, f16* y, int hidden, float eps, int gemma) {
    __shared__ float red[32];
    const float4* xr = (const float4*)(x + (size_t)blockIdx.x * hidden);
    const float4* w4 = (const float4*)w;
    const int h4 = hidden >> 2;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < h4; c += blockDim.x) {
        const float4 v = xr[c];
        ss = fmaf(v.x, v.x, ss);
        ss = fmaf(v.y, v.y, ss);
        ss = fmaf(v.z, v.z, ss);
        ss = fmaf(v.w, v.w, ss);
    }
    const float den = sqrtf(block_sum(ss, red) / (float)hidden + eps);
    uint2* yr = (uint2*)(y + (size_t)blockIdx.x * hidden);
    for (int c = threadIdx.x; c < h4; c += blockDim.x) {
        const float4 v = xr[c], g = w4[c];
        const float a = v.x / den * (gemma ? 1.0f + g.x : g.x), b = v.y / den * (gemma ? 1.0f + g.y : g.y);
        const float d = v.z / den * (gemma ? 1.0f + g.z : g.z), e = v.w / den * (gemma ? 1.0f + g.w : g.w);
        yr[c] = make_uint2(hb_h2(a, b), hb_h2(d, e));
    }
}

// hy_gdn_conv32: the causal depthwise conv + SiLU over a chunk's raw rows after the ring, then
// the q and k heads L2-normed, in one pass over the rows:
//   y[r][c] = silu(sum_j taps[c][j] * x_{r-kk+1+j}[c]), x_m = raw row m (m >= 0) or ring row
//   kk - 1 + m (m < 0); j ascending; then per row and head u < 2 nk (channels 128 u .. + 127):
//   y = y / sqrt(sum y^2 + 1e-6), q heads (u < nk) then times 1 / sqrt(128); cq = y.
// Thread k takes the channels 4 (k % (cdim / 4)) .. + 3 of rows HB_CONV_R (k / (cdim / 4)) ..
// + HB_CONV_R - 1 (16-byte row loads; its taps read once for them), so a warp holds one head of
// those rows and sums its squares by shuffles.
// Pointers: raw [n][qs] f32, ring [kk-1][cdim] f32 (read only; 0 when kk == 1), taps [cdim][kk] f32,
// cq [n][cdim] f32 out, 16-byte aligned. Grid ceil(ceil(n / HB_CONV_R) * cdim / 4 / 256) (more
// threads return at once, whole warps), block 256. Assumes dk == 128, cdim % 128 == 0, qs % 4 == 0.
#define HB_CONV_R 8
extern "C" __global__ void hy_gdn_conv32(const float* raw, int qs, const float* ring, const float* taps, float* cq,
                                         int n, int cdim, int kk, int nk) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int c4 = cdim >> 2;
    if (idx >= (size_t)((n + HB_CONV_R - 1) / HB_CONV_R) * c4) return;
    const int r0 = (int)(idx / c4) * HB_CONV_R, c = (int)(idx % c4) * 4;
    float acc[HB_CONV_R][4];
#pragma unroll
    for (int i = 0; i < HB_CONV_R; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    for (int j = 0; j < kk; ++j) {
        const float* tp = taps + (size_t)c * kk + j;
        const float t0 = tp[0], t1 = tp[kk], t2 = tp[2 * kk], t3 = tp[3 * kk];
#pragma unroll
        for (int i = 0; i < HB_CONV_R; ++i) {
            // rows past n redo row n - 1 (kept in bounds, never stored)
            const int m = min(r0 + i, n - 1) - (kk - 1) + j;
            const float4 x = m >= 0 ? *(const float4*)(raw + (size_t)m * qs + c)
                                    : *(const float4*)(ring + (size_t)(kk - 1 + m) * cdim + c);
            acc[i][0] += t0 * x.x;
            acc[i][1] += t1 * x.y;
            acc[i][2] += t2 * x.z;
            acc[i][3] += t3 * x.w;
        }
    }
    // a warp's lanes share the row and the head (cdim % 128 == 0): the branch is warp-uniform
    const bool normed = c < 2 * nk * 128;
    const float qscale = c < nk * 128 ? 1.0f / sqrtf(128.0f) : 1.0f;
#pragma unroll
    for (int i = 0; i < HB_CONV_R; ++i) {
        float y0 = siluf_(acc[i][0]), y1 = siluf_(acc[i][1]), y2 = siluf_(acc[i][2]), y3 = siluf_(acc[i][3]);
        if (normed) {
            const float den = sqrtf(warp_sum(y0 * y0 + y1 * y1 + y2 * y2 + y3 * y3) + 1e-6f);
            y0 = y0 / den * qscale;
            y1 = y1 / den * qscale;
            y2 = y2 / den * qscale;
            y3 = y3 / den * qscale;
        }
        if (r0 + i < n) *(float4*)(cq + (size_t)(r0 + i) * cdim + c) = make_float4(y0, y1, y2, y3);
    }
}

// hy_gdn_ring: the conv ring after the chunk's n raw rows (gdn_ring_move in place), channel c =
// thread.
// Pointers: ring [kk-1][cdim] f32 (in/out), raw [n][qs] f32. Grid ceil(cdim / 256), block 256.
// Launched after hy_gdn_conv32 (which reads the ring as it was), only when kk > 1.
extern "C" __global__ void hy_gdn_ring(float* ring, const float* raw, int qs, int n, int cdim, int kk) {
    gdn_ring_move(ring, ring, raw, qs, n, cdim, kk, blockIdx.x * blockDim.x + threadIdx.x);
}

// The gates and the chunked delta rule (hy_gdn_wy, hy_gdn_chunk) are in hyb_gdn_chunk.cuh.

// hy_gdn_out_h: gated RMSNorm of one head of one row to f16 (the out projection's GEMM operand):
//   y = f16(o / sqrt(mean(o^2) + eps) * norm * silu(z)) (Qwen3.5: the plain norm weight).
// Warp w of a block takes head blockIdx.x * 8 + w (row r = that / nv, head h = that % nv), lane l
// its channels 4 l + 128 q (16-byte loads), the sum of squares by shuffles.
// Pointers: o [n][nv * dv] f32; z [n][zs] f32 (head h at h * dv); norm [dv] f32; y [n][nv * dv]
// f16 out; 16-byte aligned. Grid ceil(n * nv / 8), block 256. Assumes dv % 128 == 0, zs % 4 == 0.
extern "C" __global__ void hy_gdn_out_h(const float* o, const float* z, int zs, const float* norm, f16* y, int nv,
                                        int dv, float eps, int n) {
    const int u = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (u >= n * nv) return;
    const int r = u / nv, h = u % nv;
    const float* orow = o + (size_t)r * nv * dv + (size_t)h * dv;
    float ss = 0.0f;
    for (int j = 4 * lane; j < dv; j += 128) {
        const float4 v = *(const float4*)(orow + j);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    const float den = sqrtf(warp_sum(ss) / (float)dv + eps);
    const float* zrow = z + (size_t)r * zs + (size_t)h * dv;
    for (int j = 4 * lane; j < dv; j += 128) {
        const float4 v = *(const float4*)(orow + j), g = *(const float4*)(zrow + j), w = *(const float4*)(norm + j);
        *(uint2*)(y + (size_t)r * nv * dv + (size_t)h * dv + j) =
            make_uint2(hb_h2(v.x / den * w.x * siluf_(g.x), v.y / den * w.y * siluf_(g.y)),
                       hb_h2(v.z / den * w.z * siluf_(g.z), v.w / den * w.w * siluf_(g.w)));
    }
}

// hy_q_half_g: the rotated queries (hy_qk's qg) as f16 in group-major order for the score GEMM:
//   qh[((g * n + r) * hpk + i) * hd + d] = f16(qg[r][g * hpk + i][d]).
// Pointers: qg [n][nh][hd] f32, qh [nkv][n][hpk][hd] f16 out. Grid ceil(n * nh * hd / 256), block 256.
extern "C" __global__ void hy_q_half_g(const float* qg, f16* qh, int n, int nh, int hpk, int hd) {
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)n * nh * hd) return;
    const int d = (int)(k % hd), h = (int)((k / hd) % nh);
    const size_t r = k / ((size_t)hd * nh);
    qh[hb_gmajor(h, r, n, hpk) * hd + d] = f32_to_f16(qg[k]);
}

// hy_softmax_h: one query column of a pass: its scores s = S[g][c][0 .. l_rows) (already scaled),
// the keys it may see (key k sits at position col_base + k; column c is query row p0 + c / hpk,
// which sees positions <= its own), m = max over them, P[g][c][k] = f16(e^{s_k - m}) (0 for the
// keys it may not see), isum[g * istride + c] = 1 / (sum of the rounded weights).
// Pointers: S [nkv][cols][l_rows] f32, P [nkv][cols][l_rows] f16 out, isum f32 out (header).
// Grid (nkv * cols, 1), block 256.
extern "C" __global__ void hy_softmax_h(const float* S, f16* P, float* isum, int l_rows, int p0, int col_base,
                                        int hpk, int cols, int istride) {
    __shared__ float red[32];
    const int g = blockIdx.x / cols, c = blockIdx.x % cols;
    const float* sr = S + (size_t)blockIdx.x * l_rows;
    f16* pr = P + (size_t)blockIdx.x * l_rows;
    const int lim = min(l_rows, p0 + c / hpk - col_base + 1);
    float m = __int_as_float(0xff800000);
    for (int k = threadIdx.x; k < lim; k += blockDim.x) m = fmaxf(m, sr[k]);
    m = block_max(m, red);
    float sum = 0.0f;
    for (int k = threadIdx.x; k < l_rows; k += blockDim.x) {
        const f16 e = k < lim ? f32_to_f16(expf(sr[k] - m)) : (f16)0;
        pr[k] = e;
        sum += f16_to_f32(e);
    }
    sum = block_sum(sum, red);
    if (threadIdx.x == 0) isum[(size_t)g * istride + c] = 1.0f / sum;
}

// hy_attn_out: out[r][h][d] = f16(ao[g][r][i][d] * isum[g][r * hpk + i] * (gate ? sigmoid(gate[r][h][d])
// : 1)), g = h / hpk, i = h % hpk: the weighted values normalised, the output gate, row-major for
// the o projection's GEMM.
// Pointers: ao [nkv][n][hpk][hd] f32; isum [nkv][n * hpk] f32; gate [n][nh][hd] f32 (raw, hy_qk's)
// or 0; out [n][nh][hd] f16. Grid ceil(n * nh * hd / 256), block 256.
extern "C" __global__ void hy_attn_out(const float* ao, const float* isum, const float* gate, f16* out, int nh, int n,
                                       int hpk, int hd) {
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)n * nh * hd) return;
    const int d = (int)(k % hd), h = (int)((k / hd) % nh);
    const size_t r = k / ((size_t)hd * nh);
    const size_t gi = hb_gmajor(h, r, n, hpk);
    float y = ao[gi * hd + d] * isum[gi];
    if (gate) y = y * sigmoidf_(gate[k]);
    out[k] = f32_to_f16(y);
}

// hy_silu_pair_half: the FFN middle from the gate/up pair's GEMM rows gu [n][2 inter] (pair order:
// 16-column tile t holds gate rows 8t .. 8t + 7, then the same up rows):
//   mh[r][o] = f16(silu(gate_o) * up_o / 16), gate_o = gu[r][16 (o / 8) + o % 8], up_o the same + 8.
// The 1/16 keeps large products inside f16's range; the down GEMM takes alpha 16. Thread k makes
// the 8 outputs of tile k % (inter / 8) of row k / (inter / 8): four 16-byte loads, one store.
// Pointers: gu [n][2 inter] f32, mh [n][inter] f16 out, 16-byte aligned.
// Grid ceil(n * inter / 8 / 256) (more threads return at once), block 256. Assumes inter % 8 == 0.
extern "C" __global__ void hy_silu_pair_half(const float* gu, f16* mh, int inter, int n) {
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int tpr = inter >> 3;
    if (k >= (size_t)n * tpr) return;
    const size_t r = k / tpr;
    const int t = (int)(k % tpr);
    const float4* src = (const float4*)(gu + r * 2 * inter + (size_t)t * 16);
    const float4 g0 = src[0], g1 = src[1], u0 = src[2], u1 = src[3];
    const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
    const float u[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
    u32 out[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
        out[j] = hb_h2(siluf_(g[2 * j]) * u[2 * j] * 0.0625f, siluf_(g[2 * j + 1]) * u[2 * j + 1] * 0.0625f);
    *(uint4*)(mh + r * inter + (size_t)t * 8) = make_uint4(out[0], out[1], out[2], out[3]);
}
