// The prompt path's kernels (the reference's `big`: a chunk of more than NMAX rows on cuBLAS).
// Weights expand from the repacked q4tp layout (hyb_mma.cuh's header) into one dense f16 plane
// that cuBLAS multiplies; the kernels here are the glue between those GEMMs: norms to f16, the
// GDN chunk (conv, ring, L2 norms, gates, the chunked delta rule, gated norm), attention's
// softmax and output over the two batched GEMMs a KV group, and the FFN middle.
//
// Layouts shared with the small path (hyb_gdn.cuh, hyb_attn.cuh): raw [n][qs], ring [kk-1][cdim],
// taps [cdim][kk], cq [n][cdim] (q | k | v), gb [n][2*nv] (decay | beta), S [nv][dk][dv], K/V
// mirrors f16 [rows][nkv][hd]. All float math in f32; f16 values are IEEE half bit patterns
// (common.cuh), written with round to nearest even.
//
// Attention over a pass of bn query rows of a chunk of n rows (cols = bn * hpk query columns a KV
// group; istride = n * hpk): the query copy is group-major, qh [nkv][n][hpk][hd] f16, so one
// strided-batched GEMM a group reads a pass as a plain matrix; scores S and weights P are
// [nkv][cols][l_rows] (column c of group g at (g * cols + c) * l_rows); the GEMM's output is
// group-major too, ao [nkv][n][hpk][hd] f32; the row sums' inverses isum [nkv][n * hpk].

// Sum / max over the block (blockDim.x a multiple of 32, at most 1024), in a fixed order: warp
// butterflies, then the warps' values in warp order. red: __shared__ float[32]. Every thread of
// the block must call it; every thread gets the result.
__device__ __forceinline__ float hb_block_sum(float v, float* red) {
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) s += red[w];
    return s;
}

__device__ __forceinline__ float hb_block_max(float v, float* red) {
    v = warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, red[w]);
    return m;
}

// Tiles [t0, t0 + nt) of a repacked q4tp matrix as f16 rows: band row (t - t0) * 16 + i is
// logical row r = 16 t + i; weight (r, c) = (nibble - 8) * exp2(lo_r + code(r, c / 32) * step_r).
// Thread (band row, group g, half s) writes the 16 columns 32 g + 16 s .. + 15 of its row: word s
// of lanes gid * 4 + tig (gid = i & 7, tig 0..3) holds them, register m = (i >> 3) + 2 mh giving
// columns 16 s + 8 mh + 2 tig (low nibble, bits 4m) and the next one (bits 4m + 16).
__device__ __forceinline__ void hb_expand(const u32* tiles, const unsigned char* codes, const float* lad, f16* wd,
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
    // no contraction: lo + code * step rounded as the host's float32 arithmetic rounds it
    const float rung = exp2f(__fadd_rn(lad[2 * r], __fmul_rn((float)codes[tg * 16 + i], lad[2 * r + 1])));
    u32 out[8];
#pragma unroll
    for (int tig = 0; tig < 4; ++tig) {
        const u32 x = wp[tig * 2];
#pragma unroll
        for (int mh = 0; mh < 2; ++mh) {
            const int m = (i >> 3) + 2 * mh;
            const float w0 = (float)((int)((x >> (4 * m)) & 15u) - 8) * rung;
            const float w1 = (float)((int)((x >> (4 * m + 16)) & 15u) - 8) * rung;
            out[4 * mh + tig] = (u32)f32_to_f16(w0) | ((u32)f32_to_f16(w1) << 16);
        }
    }
    uint4* dst = (uint4*)(wd + lr * cols + (size_t)g * 32 + 16 * s);
    dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
    dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// hy_expand_p: a whole repacked q4tp matrix (rows x cols) to the dense f16 plane wd [rows][cols].
// Pointers: tiles u32 [ntile][gpr][32][2], codes u8 [ntile][gpr][16], lad f32 [rows][2] (hy_repack's
// layout); wd f16 out, 16-byte aligned. Grid ceil(ntile * gpr * 32 / 256), block 256 (ntile =
// ceil(rows / 16), gpr = cols / 32). Assumes cols % 32 == 0.
extern "C" __global__ void hy_expand_p(const u32* tiles, const unsigned char* codes, const float* lad, f16* wd,
                                       int rows, int cols) {
    hb_expand(tiles, codes, lad, wd, rows, cols, 0, (rows + 15) >> 4);
}

// hy_expand_pr: the band of tiles [t0, t0 + nt) of the matrix: wd [min(16 nt, rows - 16 t0)][cols]
// f16, its row 0 being logical row 16 t0. Pointers as hy_expand_p. Grid ceil(nt * gpr * 32 / 256),
// block 256.
extern "C" __global__ void hy_expand_pr(const u32* tiles, const unsigned char* codes, const float* lad, f16* wd,
                                        int rows, int cols, int t0, int nt) {
    hb_expand(tiles, codes, lad, wd, rows, cols, t0, nt);
}

// hy_rmsnorm: y[r] = f16(x[r] / sqrt(mean(x[r]^2) + eps) * (gemma ? 1 + w : w)).
// Pointers: x [n][hidden] f32, w [hidden] f32, y [n][hidden] f16 out. Grid (n, 1), block 256.
extern "C" __global__ void hy_rmsnorm(const float* x, const float* w, f16* y, int hidden, float eps, int gemma) {
    __shared__ float red[32];
    const float* xr = x + (size_t)blockIdx.x * hidden;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) ss = fmaf(xr[c], xr[c], ss);
    const float den = sqrtf(hb_block_sum(ss, red) / (float)hidden + eps);
    f16* yr = y + (size_t)blockIdx.x * hidden;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x)
        yr[c] = f32_to_f16(xr[c] / den * (gemma ? 1.0f + w[c] : w[c]));
}

// hy_gdn_conv32: the causal depthwise conv + SiLU over a chunk's raw rows after the ring:
//   cq[r][c] = silu(sum_j taps[c][j] * x_{r-kk+1+j}[c]), x_m = raw row m (m >= 0) or ring row
//   kk - 1 + m (m < 0); j ascending.
// Pointers: raw [n][qs] f32, ring [kk-1][cdim] f32 (read only; 0 when kk == 1), taps [cdim][kk] f32,
// cq [n][cdim] f32 out. Grid ceil(n * cdim / 256), block 256.
extern "C" __global__ void hy_gdn_conv32(const float* raw, int qs, const float* ring, const float* taps, float* cq,
                                         int n, int cdim, int kk) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)n * cdim) return;
    const int r = (int)(idx / cdim), c = (int)(idx % cdim);
    float acc = 0.0f;
    for (int j = 0; j < kk; ++j) {
        const int m = r - (kk - 1) + j;
        const float x = m >= 0 ? raw[(size_t)m * qs + c] : ring[(size_t)(kk - 1 + m) * cdim + c];
        acc += taps[(size_t)c * kk + j] * x;
    }
    cq[idx] = siluf_(acc);
}

// hy_gdn_ring: the conv ring after the chunk's n raw rows: ring'[j] = ([ring ; raw])[n + j],
// j < kk - 1, channel c = thread. In place: row j reads row n + j > j, not yet written.
// Pointers: ring [kk-1][cdim] f32 (in/out), raw [n][qs] f32. Grid ceil(cdim / 256), block 256.
// Launched after hy_gdn_conv32 (which reads the ring as it was), only when kk > 1.
extern "C" __global__ void hy_gdn_ring(float* ring, const float* raw, int qs, int n, int cdim, int kk) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cdim) return;
    for (int j = 0; j < kk - 1; ++j) {
        const int m = n + j;
        ring[(size_t)j * cdim + c] = m < kk - 1 ? ring[(size_t)m * cdim + c] : raw[(size_t)(m - (kk - 1)) * qs + c];
    }
}

// hy_gdn_prep32: the q and k heads of the conv rows L2-normed in place, x / sqrt(sum x^2 + 1e-6),
// q heads then times 1 / sqrt(dk). Block b: row b / (2 nk), head u = b % (2 nk) (u < nk: q head u;
// else k head u - nk), thread t its channel u * dk + t.
// Pointers: cq [n][cdim] f32 (in/out). Grid (n * 2 * nk, 1), block dk (a multiple of 32, <= 1024).
extern "C" __global__ void hy_gdn_prep32(float* cq, int cdim, int nk, int dk) {
    __shared__ float red[32];
    const int r = blockIdx.x / (2 * nk), u = blockIdx.x % (2 * nk);
    float* p = cq + (size_t)r * cdim + (size_t)u * dk + threadIdx.x;
    float y = *p;
    y = y / sqrtf(hb_block_sum(y * y, red) + 1e-6f);
    if (u < nk) y = y * (1.0f / sqrtf((float)dk));
    *p = y;
}

// hy_gdn_gb32: the gates of each row and value head from the f32 projections ab [n][2 nv] (a | b):
//   g = -exp(a_log[h]) * softplus(a + dt_bias[h]); gb[r][h] = exp(g); gb[r][nv + h] = sigmoid(b).
// Pointers: ab [n][2 nv] f32, a_log, dt_bias [nv] f32, gb [n][2 nv] f32 out.
// Grid ceil(n * nv / 256), block 256.
extern "C" __global__ void hy_gdn_gb32(const float* ab, const float* a_log, const float* dt_bias, float* gb, int n,
                                       int nv) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)n * nv) return;
    const size_t r = idx / nv;
    const int h = (int)(idx % nv);
    const float g = -expf(a_log[h]) * softplusf_(ab[r * 2 * nv + h] + dt_bias[h]);
    gb[r * 2 * nv + h] = expf(g);
    gb[r * 2 * nv + nv + h] = sigmoidf_(ab[r * 2 * nv + nv + h]);
}

// The chunked delta rule, HB_C rows a chunk, key and value width HB_D (fla's chunked gated delta
// rule in the WY form). For value head h and a chunk of rows t (q_t, k_t, v_t from cq, key head
// h / (nv / nk); decay_t, beta_t from gb), with G_t = sum_{r <= t} log decay_r inside the chunk (log
// decay clamped at -80 so differences stay finite) and S0 the state before the chunk:
//   A[t][s] = beta_t e^{G_t - G_s} (k_t . k_s) for s < t, T = (I + A)^-1;
//   W = T (beta e^G k), U = T (beta v)        (hy_gdn_wy: no state, every chunk at once)
//   D = U - W S0;  o_t = e^{G_t} S0^T q_t + sum_{s <= t} P[t][s] D_s,  P[t][s] = e^{G_t - G_s} (q_t . k_s);
//   S = e^{G_last} S0 + sum_s e^{G_last - G_s} k_s D_s^T   (hy_gdn_chunk: chunk after chunk)
// which is the serial rule S = decay S; d = (v - S^T k) beta; S += k d^T; o = S^T q regrouped. Rows
// past n count as zero rows with decay 1.
#define HB_C 64
#define HB_D 128
#define HB_JW 32
// Row strides in floats: multiples of 4 so rows take float4 reads; 4 * 132 % 32 == 16 and
// 4 * 68 % 32 == 16 keep the two row groups a warp reads (rows 4 ty, 4 ty + 4) on other banks.
#define HB_LDK (HB_D + 4)
#define HB_LDC (HB_C + 4)
#define HB_LDJ (HB_JW + 4)
// Dynamic shared memory (bytes) of hy_gdn_wy: k, q (then the right-hand sides) [C][LDK], A [C][LDC],
// G, beta [C].
#define HB_WY_SMEM ((2 * HB_C * HB_LDK + HB_C * HB_LDC + 2 * HB_C) * 4)
// ... and of hy_gdn_chunk: q, w, scaled k [C][LDK], S [D][JW], P [C][LDC], U / D [C][LDJ], G [C].
#define HB_CHUNK_SMEM ((3 * HB_C * HB_LDK + HB_D * HB_JW + HB_C * HB_LDC + HB_C * HB_LDJ + HB_C) * 4)

// Component e (a compile-time constant after unrolling) of a float4.
__device__ __forceinline__ float hb_c4(const float4& v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }

// A chunk's G (inclusive sums of the clamped log decays) and beta into shared memory, by warp 0
// (lane l: rows 2l, 2l + 1; a scan of the pairs' sums); rows past cn: log decay 0, beta 0.
__device__ __forceinline__ void hb_gates(const float* gb, int c0, int cn, int nv, int h, float* gg, float* bb) {
    const int l = threadIdx.x;
    if (l >= 32) return;
    float lg[2], bt[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int t = 2 * l + e;
        const size_t at = (size_t)(c0 + t) * 2 * nv + h;
        lg[e] = t < cn ? fmaxf(logf(gb[at]), -80.0f) : 0.0f;
        bt[e] = t < cn ? gb[at + nv] : 0.0f;
    }
    const float pair = lg[0] + lg[1];
    float inc = pair;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const float u = __shfl_up_sync(0xffffffffu, inc, d);
        if (l >= d) inc += u;
    }
    const float ex = inc - pair;
    gg[2 * l] = ex + lg[0];
    gg[2 * l + 1] = ex + lg[0] + lg[1];
    bb[2 * l] = bt[0];
    bb[2 * l + 1] = bt[1];
}

// hy_gdn_wy: per (chunk, value head) the state-free part of the chunked rule: G, P, W, U above.
//   Block (c, h): rows c0 = 64 c .. c0 + cn - 1. k k^T and q k^T by 4x4 register tiles (rows
//   ty + 16a, columns tx + 16b, float4 steps along the key width); then (I + A) X = R solved by
//   rows for 256 right-hand columns at once, thread i < 128 the column i of beta e^G k, thread
//   128 + j the column j of beta v, each in shared memory in place (no block barrier inside the
//   substitution; four partial sums a row break the FMA chain, A's zeros past the diagonal pad
//   the last step of four).
// Pointers: cq [n][cdim] f32 (q | k | v, q and k normed), gb [n][2 nv] f32 (decay | beta); out:
//   g [nv][n] f32, w [nv][n][128] f32, u [nv][n][128] f32, p [nv][n][64] f32 (row t of a chunk:
//   P[t][s] for the chunk's s, 0 past t).
// Grid (ceil(n / 64), nv), block 256, dynamic shared memory HB_WY_SMEM (over 48 KiB: opt in).
// Assumes dk == dv == 128, nv % nk == 0, cdim % 4 == 0, 16-byte aligned buffers.
extern "C" __global__ void __launch_bounds__(256, 1) hy_gdn_wy(const float* cq, const float* gb, float* g, float* w,
                                                            float* u, float* p, int n, int cdim, int nv, int nk) {
    extern __shared__ __align__(16) float hb_sm[];
    float* ks = hb_sm;
    float* qs = ks + HB_C * HB_LDK;
    float* aa = qs + HB_C * HB_LDK;
    float* gg = aa + HB_C * HB_LDC;
    float* bb = gg + HB_C;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int h = blockIdx.y, c0 = blockIdx.x * HB_C, cn = min(HB_C, n - c0);
    const int hk = h / (nv / nk);
    const float* qb = cq + hk * HB_D;
    const float* kb = cq + (size_t)nk * HB_D + hk * HB_D;
    const float* vb = cq + (size_t)2 * nk * HB_D + (size_t)h * HB_D;
    const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int x = tid; x < HB_C * HB_D / 4; x += 256) {
        const int t = x >> 5, i = (x & 31) * 4;
        const size_t row = (size_t)(c0 + t) * cdim + i;
        *(float4*)(ks + t * HB_LDK + i) = t < cn ? *(const float4*)(kb + row) : z4;
        *(float4*)(qs + t * HB_LDK + i) = t < cn ? *(const float4*)(qb + row) : z4;
    }
    hb_gates(gb, c0, cn, nv, h, gg, bb);
    __syncthreads();
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) kk[a][b] = qk[a][b] = 0.0f;
    for (int i = 0; i < HB_D; i += 4) {
        float4 kt[4], qt[4], kc[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            kt[a] = *(const float4*)(ks + (ty + 16 * a) * HB_LDK + i);
            qt[a] = *(const float4*)(qs + (ty + 16 * a) * HB_LDK + i);
            kc[a] = *(const float4*)(ks + (tx + 16 * a) * HB_LDK + i);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    kk[a][b] = fmaf(hb_c4(kt[a], e), hb_c4(kc[b], e), kk[a][b]);
                    qk[a][b] = fmaf(hb_c4(qt[a], e), hb_c4(kc[b], e), qk[a][b]);
                }
    }
    float* pr = p + ((size_t)h * n + c0) * HB_C;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int t = ty + 16 * a, s = tx + 16 * b;
            const float d = s <= t ? expf(gg[t] - gg[s]) : 0.0f;
            aa[t * HB_LDC + s] = s < t ? bb[t] * d * kk[a][b] : 0.0f;
            if (t < cn) pr[(size_t)t * HB_C + s] = d * qk[a][b];
        }
    __syncthreads();
    // the right-hand sides in place of k and q: beta e^G k, beta v
    for (int x = tid; x < HB_C * HB_D / 4; x += 256) {
        const int t = x >> 5, i = (x & 31) * 4;
        const float f = bb[t] * expf(gg[t]), bt = bb[t];
        float4 kv = *(float4*)(ks + t * HB_LDK + i);
        kv.x *= f;
        kv.y *= f;
        kv.z *= f;
        kv.w *= f;
        *(float4*)(ks + t * HB_LDK + i) = kv;
        float4 vv = t < cn ? *(const float4*)(vb + (size_t)(c0 + t) * cdim + i) : z4;
        vv.x *= bt;
        vv.y *= bt;
        vv.z *= bt;
        vv.w *= bt;
        *(float4*)(qs + t * HB_LDK + i) = vv;
    }
    __syncthreads();
    float* col = (tid < HB_D ? ks : qs) + (tid & (HB_D - 1));
    for (int t = 1; t < cn; ++t) {
        const float* ar = aa + t * HB_LDC;
        float a0 = col[t * HB_LDK], a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        for (int s = 0; s < t; s += 4) {
            const float4 av = *(const float4*)(ar + s);
            a0 = fmaf(-av.x, col[s * HB_LDK], a0);
            a1 = fmaf(-av.y, col[(s + 1) * HB_LDK], a1);
            a2 = fmaf(-av.z, col[(s + 2) * HB_LDK], a2);
            a3 = fmaf(-av.w, col[(s + 3) * HB_LDK], a3);
        }
        col[t * HB_LDK] = (a0 + a1) + (a2 + a3);
    }
    __syncthreads();
    float* wo = w + ((size_t)h * n + c0) * HB_D;
    float* uo = u + ((size_t)h * n + c0) * HB_D;
    for (int x = tid; x < cn * HB_D / 4; x += 256) {
        const int t = x >> 5, i = (x & 31) * 4;
        *(float4*)(wo + t * HB_D + i) = *(const float4*)(ks + t * HB_LDK + i);
        *(float4*)(uo + t * HB_D + i) = *(const float4*)(qs + t * HB_LDK + i);
    }
    if (tid < cn) g[(size_t)h * n + c0 + tid] = gg[tid];
}

// A chunk's q and W rows (row stride HB_LDK) into shared memory by cp.async (one commit group;
// rows past cn zero by plain stores). qr: q of the chunk's row 0 (row stride cdim); wr: W's row 0.
__device__ __forceinline__ void hb_fetch_qw(const float* qr, const float* wr, int cn, int cdim, float* qs, float* ws) {
    for (int x = threadIdx.x; x < HB_C * HB_D / 4; x += blockDim.x) {
        const int t = x >> 5, i = (x & 31) * 4;
        float* dq = qs + t * HB_LDK + i;
        float* dw = ws + t * HB_LDK + i;
        if (t < cn) {
            hy_cp16((u32)__cvta_generic_to_shared(dq), qr + (size_t)t * cdim + i);
            hy_cp16((u32)__cvta_generic_to_shared(dw), wr + (size_t)t * HB_D + i);
        } else {
            *(float4*)dq = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            *(float4*)dw = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    hy_cp_commit();
}

// hy_gdn_chunk: the state through the chunks in order, after hy_gdn_wy. Block b takes the value
// columns 32 (b % 4) .. + 31 of head b / 4; its state slice lives in registers (rows 8 ty + a,
// columns 2 tx + b of 8x2 tiles) with a copy in shared memory for the products. Per chunk, rows
// t = 4 ty + a and columns j = 2 tx + b of 4x2 tiles, float4 steps along the inner dimension:
// X = W S0 and Y = S0^T q; D = U - X; o = e^G Y + P D (P is 0 past the diagonal, so each warp runs
// s up to its own last row); S = e^{G_last} S0 + (e^{G_last - G} k)^T D, k scaled as it loads.
// The next chunk's q and W stream in by cp.async while this chunk's output and state update run.
// Pointers: cq [n][cdim] f32 (q | k | v); g, w, u, p as hy_gdn_wy wrote them; S [nv][128][128] f32
// (in/out); o [n][nv * 128] f32 out.
// Grid (nv * 4, 1), block 256, dynamic shared memory HB_CHUNK_SMEM (over 48 KiB: opt in).
// Assumes dk == dv == 128, nv % nk == 0, cdim % 4 == 0, 16-byte aligned buffers.
extern "C" __global__ void __launch_bounds__(256, 1) hy_gdn_chunk(const float* cq, const float* g, const float* w,
                                                               const float* u, const float* p, float* S, float* o,
                                                               int n, int cdim, int nv, int nk) {
    extern __shared__ __align__(16) float hb_sm[];
    float* qs = hb_sm;
    float* ws = qs + HB_C * HB_LDK;
    float* ks = ws + HB_C * HB_LDK;
    float* ss = ks + HB_C * HB_LDK;
    float* pp = ss + HB_D * HB_JW;
    float* ud = pp + HB_C * HB_LDC;
    float* gg = ud + HB_C * HB_LDJ;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int cpb = HB_D / HB_JW, h = blockIdx.x / cpb, j0 = (blockIdx.x % cpb) * HB_JW;
    const int hk = h / (nv / nk);
    const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float* sg = S + (size_t)h * HB_D * HB_D + j0 + 2 * tx;
    float sr[8][2];
#pragma unroll
    for (int a = 0; a < 8; ++a) {
        const float2 v = *(const float2*)(sg + (size_t)(8 * ty + a) * HB_D);
        sr[a][0] = v.x;
        sr[a][1] = v.y;
        *(float2*)(ss + (8 * ty + a) * HB_JW + 2 * tx) = v;
    }
    const float* qb = cq + hk * HB_D;
    const float* kb = cq + (size_t)nk * HB_D + hk * HB_D;
    const float* gh = g + (size_t)h * n;
    hb_fetch_qw(qb, w + (size_t)h * n * HB_D, min(HB_C, n), cdim, qs, ws);
    for (int c0 = 0; c0 < n; c0 += HB_C) {
        const int cn = min(HB_C, n - c0);
        const float gl = gh[c0 + cn - 1];
        __syncthreads();  // the previous chunk is done with k, P, U / D; its state is in ss
        for (int x = tid; x < HB_C * HB_D / 4; x += 256) {
            const int t = x >> 5, i = (x & 31) * 4;
            float4 v = z4;
            if (t < cn) {
                v = *(const float4*)(kb + (size_t)(c0 + t) * cdim + i);
                const float f = expf(gl - gh[c0 + t]);
                v.x *= f;
                v.y *= f;
                v.z *= f;
                v.w *= f;
            }
            *(float4*)(ks + t * HB_LDK + i) = v;
        }
        const float* pr = p + ((size_t)h * n + c0) * HB_C;
        for (int x = tid; x < HB_C * HB_C / 4; x += 256) {
            const int t = x >> 4, s = (x & 15) * 4;
            *(float4*)(pp + t * HB_LDC + s) = t < cn ? *(const float4*)(pr + (size_t)t * HB_C + s) : z4;
        }
        const float* ur = u + ((size_t)h * n + c0) * HB_D + j0;
        for (int x = tid; x < HB_C * HB_JW / 4; x += 256) {
            const int t = x >> 3, j = (x & 7) * 4;
            *(float4*)(ud + t * HB_LDJ + j) = t < cn ? *(const float4*)(ur + (size_t)t * HB_D + j) : z4;
        }
        if (tid < HB_C) gg[tid] = tid < cn ? gh[c0 + tid] : 0.0f;
        hy_cp_wait<0>();
        __syncthreads();
        float xw[4][2], xq[4][2];
#pragma unroll
        for (int a = 0; a < 4; ++a) xw[a][0] = xw[a][1] = xq[a][0] = xq[a][1] = 0.0f;
        for (int i = 0; i < HB_D; i += 4) {
            float4 wv[4], qv[4];
            float2 sv[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                wv[a] = *(const float4*)(ws + (4 * ty + a) * HB_LDK + i);
                qv[a] = *(const float4*)(qs + (4 * ty + a) * HB_LDK + i);
                sv[a] = *(const float2*)(ss + (i + a) * HB_JW + 2 * tx);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int a = 0; a < 4; ++a) {
                    xw[a][0] = fmaf(hb_c4(wv[a], e), sv[e].x, xw[a][0]);
                    xw[a][1] = fmaf(hb_c4(wv[a], e), sv[e].y, xw[a][1]);
                    xq[a][0] = fmaf(hb_c4(qv[a], e), sv[e].x, xq[a][0]);
                    xq[a][1] = fmaf(hb_c4(qv[a], e), sv[e].y, xq[a][1]);
                }
        }
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            float2* dp = (float2*)(ud + (4 * ty + a) * HB_LDJ + 2 * tx);
            const float2 uv = *dp;
            *dp = make_float2(uv.x - xw[a][0], uv.y - xw[a][1]);
        }
        __syncthreads();  // D complete; q, W and ss free
        if (c0 + HB_C < n)
            hb_fetch_qw(qb + (size_t)(c0 + HB_C) * cdim, w + ((size_t)h * n + c0 + HB_C) * HB_D,
                        min(HB_C, n - c0 - HB_C), cdim, qs, ws);
        float oa[4][2];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            const float e = expf(gg[4 * ty + a]);
            oa[a][0] = e * xq[a][0];
            oa[a][1] = e * xq[a][1];
        }
        const int send = 8 * (tid >> 5) + 8;  // past the warp's last row (rows 4 ty + a of two ty)
        for (int s = 0; s < send; s += 4) {
            float4 pv[4];
            float2 dv[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                pv[a] = *(const float4*)(pp + (4 * ty + a) * HB_LDC + s);
                dv[a] = *(const float2*)(ud + (s + a) * HB_LDJ + 2 * tx);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int a = 0; a < 4; ++a) {
                    oa[a][0] = fmaf(hb_c4(pv[a], e), dv[e].x, oa[a][0]);
                    oa[a][1] = fmaf(hb_c4(pv[a], e), dv[e].y, oa[a][1]);
                }
        }
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            const int t = 4 * ty + a;
            if (t < cn)
                *(float2*)(o + (size_t)(c0 + t) * nv * HB_D + (size_t)h * HB_D + j0 + 2 * tx) =
                    make_float2(oa[a][0], oa[a][1]);
        }
        const float dl = expf(gl);
#pragma unroll
        for (int a = 0; a < 8; ++a) {
            sr[a][0] *= dl;
            sr[a][1] *= dl;
        }
        for (int s = 0; s < cn; ++s) {
            const float4 k0 = *(const float4*)(ks + s * HB_LDK + 8 * ty);
            const float4 k1 = *(const float4*)(ks + s * HB_LDK + 8 * ty + 4);
            const float2 dv = *(const float2*)(ud + s * HB_LDJ + 2 * tx);
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                sr[a][0] = fmaf(hb_c4(k0, a), dv.x, sr[a][0]);
                sr[a][1] = fmaf(hb_c4(k0, a), dv.y, sr[a][1]);
                sr[a + 4][0] = fmaf(hb_c4(k1, a), dv.x, sr[a + 4][0]);
                sr[a + 4][1] = fmaf(hb_c4(k1, a), dv.y, sr[a + 4][1]);
            }
        }
#pragma unroll
        for (int a = 0; a < 8; ++a) *(float2*)(ss + (8 * ty + a) * HB_JW + 2 * tx) = make_float2(sr[a][0], sr[a][1]);
    }
#pragma unroll
    for (int a = 0; a < 8; ++a) *(float2*)(sg + (size_t)(8 * ty + a) * HB_D) = make_float2(sr[a][0], sr[a][1]);
}

// hy_gdn_out_h: gated RMSNorm of one head of one row to f16 (the out projection's GEMM operand):
//   y = f16(o / sqrt(mean(o^2) + eps) * norm * silu(z)) (Qwen3.5: the plain norm weight).
// Pointers: o [n][nv * dv] f32; z [n][zs] f32 (head h at h * dv); norm [dv] f32; y [n][nv * dv]
// f16 out. Grid (n * nv, 1), block dv threads (a multiple of 32, at most 1024).
extern "C" __global__ void hy_gdn_out_h(const float* o, const float* z, int zs, const float* norm, f16* y, int nv,
                                        int dv, float eps) {
    __shared__ float red[32];
    const int r = blockIdx.x / nv, h = blockIdx.x % nv, j = threadIdx.x;
    const size_t at = (size_t)r * nv * dv + (size_t)h * dv + j;
    const float x = o[at];
    const float ms = hb_block_sum(x * x, red) / (float)dv;
    y[at] = f32_to_f16(x / sqrtf(ms + eps) * norm[j] * siluf_(z[(size_t)r * zs + (size_t)h * dv + j]));
}

// hy_q_half_g: the rotated queries (hy_qk's qg) as f16 in group-major order for the score GEMM:
//   qh[((g * n + r) * hpk + i) * hd + d] = f16(qg[r][g * hpk + i][d]).
// Pointers: qg [n][nh][hd] f32, qh [nkv][n][hpk][hd] f16 out. Grid ceil(n * nh * hd / 256), block 256.
extern "C" __global__ void hy_q_half_g(const float* qg, f16* qh, int n, int nh, int hpk, int hd) {
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)n * nh * hd) return;
    const int d = (int)(k % hd), h = (int)((k / hd) % nh);
    const size_t r = k / ((size_t)hd * nh);
    qh[(((size_t)(h / hpk) * n + r) * hpk + h % hpk) * hd + d] = f32_to_f16(qg[k]);
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
    m = hb_block_max(m, red);
    float sum = 0.0f;
    for (int k = threadIdx.x; k < l_rows; k += blockDim.x) {
        const f16 e = k < lim ? f32_to_f16(expf(sr[k] - m)) : (f16)0;
        pr[k] = e;
        sum += f16_to_f32(e);
    }
    sum = hb_block_sum(sum, red);
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
    const size_t gi = ((size_t)(h / hpk) * n + r) * hpk + h % hpk;
    float y = ao[gi * hd + d] * isum[gi];
    if (gate) y = y * sigmoidf_(gate[k]);
    out[k] = f32_to_f16(y);
}

// hy_silu_pair_half: the FFN middle from the gate/up pair's GEMM rows gu [n][2 inter] (pair order:
// 16-column tile t holds gate rows 8t .. 8t + 7, then the same up rows):
//   mh[r][o] = f16(silu(gate_o) * up_o / 16), gate_o = gu[r][16 (o / 8) + o % 8], up_o the same + 8.
// The 1/16 keeps large products inside f16's range; the down GEMM takes alpha 16.
// Pointers: gu [n][2 inter] f32, mh [n][inter] f16 out. Grid ceil(n * inter / 256), block 256.
// Assumes inter % 8 == 0.
extern "C" __global__ void hy_silu_pair_half(const float* gu, f16* mh, int inter, int n) {
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)n * inter) return;
    const size_t r = k / inter;
    const int o = (int)(k % inter);
    const float* row = gu + r * 2 * inter + (size_t)(o >> 3) * 16 + (o & 7);
    mh[k] = f32_to_f16(siluf_(row[0]) * row[8] * 0.0625f);
}
