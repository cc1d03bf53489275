// Gated DeltaNet kernels of the small path (the reference's hy_gdn_*), docs/MODEL.md "Gated
// DeltaNet" in this order: front (conv over the ring + SiLU, q/k L2 norms, gates), scan (delta rule
// over the window's rows, conv ring moved), out32 (gated RMSNorm into the matvec planes),
// scan4_out32 (the column scan and out32 in one launch, where dv <= 128), and the restore kernels a
// verify window's partial acceptance runs.
//
// Shared layouts (f32, row-major, one layer):
//   raw   [n][qs]          the in_proj_qkv rows [q (nk*dk) | k (nk*dk) | v (nv*dv)], cdim = 2*nk*dk + nv*dv
//   ring  [kk-1][cdim]     the last kk-1 raw rows, oldest first (the host state's leading part)
//   taps  [cdim][kk]       conv1d weights; tap kk-1 multiplies the current row
//   cq    [n][cdim]        front's output: q (L2-normed, times 1/sqrt(dk)) | k (L2-normed) | v (SiLU)
//   gb    [n][2*nv]        front's gates: [decay = exp(g) (nv) | beta (nv)]
//   S     [nv][dk][dv]     the delta-rule state, S[h][i][j] (i over the key, j over the value)
//   o     [n][nv*dv]       the scan's output rows
// Value head h reads key head h / (nv / nk). Every reduction runs in a fixed order that depends
// only on the block shape, never on n: a window's row i is the one-row step at that position, bit
// for bit, and a restore replays the same arithmetic.

// Rows a small-path call carries at most (hybrid.state.NMAX): hy_gdn_scan4_out32 keeps a head's
// output rows for them in shared memory.
#define HY_NMAX 16

// The conv ring after n more raw rows: ring'[j] = ([src (kk-1 rows) ; raw (n rows)])[n + j], for
// channel c. dst may equal src: row j reads row n + j > j, which no earlier step has written.
__device__ __forceinline__ void gdn_ring_move(float* dst, const float* src, const float* raw, int qs,
                                              int n, int cdim, int kk, int c) {
    if (c >= cdim) return;
    for (int j = 0; j < kk - 1; ++j) {
        int m = n + j;
        dst[(size_t)j * cdim + c] = m < kk - 1 ? src[(size_t)m * cdim + c] : raw[(size_t)(m - (kk - 1)) * qs + c];
    }
}

// The log decay of projection a: g = -exp(a_log) * softplus(a + dt_bias) (the prompt path's
// hy_gdn_wy takes it as it is).
__device__ __forceinline__ float gdn_g(float a, float a_log, float dt_bias) {
    return -expf(a_log) * softplusf_(a + dt_bias);
}

// The decay gate of projection a: exp(g) (gdn_g).
__device__ __forceinline__ float gdn_decay(float a, float a_log, float dt_bias) {
    return expf(gdn_g(a, a_log, dt_bias));
}

// p += x[c] * w[c] over the columns c, c + bd, ... while B of them fit below `hidden`, B columns'
// loads in flight before any is added; c left at the first column not taken.
template <int B>
__device__ __forceinline__ void gdn_dot_run(const float* x, const float* w, int& c, int bd, int hidden, float& p) {
    for (; c + (B - 1) * bd < hidden; c += B * bd) {
        float xv[B], wv[B];
#pragma unroll
        for (int e = 0; e < B; ++e) {
            xv[e] = x[c + e * bd];
            wv[e] = w[c + e * bd];
        }
#pragma unroll
        for (int e = 0; e < B; ++e) p += xv[e] * wv[e];
    }
}

// hy_gdn_front: conv + SiLU + L2 norms of one row's head-wide channel unit, or one gate.
//   unit u < cdim/dk of row r: y[c] = silu(sum_j taps[c][j] * x_{r-kk+1+j}[c]) for the unit's dk
//     channels (x_m = raw row m of the window, or ring row kk-1+m when m < 0); q and k units are
//     L2-normed over dk (y / sqrt(sum y^2 + 1e-6)), q units then times 1/sqrt(dk); -> cq[r].
//   unit cdim/dk + h (h < nv): a = xn[r] . aw[h]; g = -exp(a_log[h]) * softplus(a + dt_bias[h]);
//     gb[r][h] = exp(g).  Unit cdim/dk + nv + h: gb[r][nv + h] = sigmoid(xn[r] . bw[h]).
// Pointers: qkv [n][qs] f32; ring [kk-1][cdim] f32 (unused when kk == 1); taps [cdim][kk] f32;
//   cq [n][cdim] f32 out; xn [n][hidden] f32 (the normed rows); aw, bw [nv][hidden] f32 (the f32
//   in_proj_a / in_proj_b); a_log, dt_bias [nv] f32; gb [n][2*nv] f32 out.
//   tq [n][qs] f32, rs [kk-1][cdim] f32 (a verify window's tape, or 0): the raw rows' first cdim
//   columns and the ring as the window found them, each unit's channels copied by its blocks
//   (rs by row 0's; 0 when kk == 1), for spec_restore's hy_gdn_restore_ring.
// Grid (cdim/dk + 2*nv, n), block max(dk, 64) threads (a multiple of 32). Assumes cdim % dk == 0
// (dv == dk) and dk <= 512. Reads the ring, does not move it (the scan does, after).
// PDL: a gate block computes its dot before pdl_begin (xn is the norm's, two launches back: the
// rule in common.cuh); a unit block fetches its taps and ring lines into L2 (pf_l2) there.
extern "C" __global__ void __launch_bounds__(512, 1)
    hy_gdn_front(const float* qkv, int qs, const float* ring, const float* taps, float* cq, int n, int cdim, int kk,
                 int nk, int dk, const float* xn, int hidden, const float* aw, const float* bw, const float* a_log,
                 const float* dt_bias, float* gb, int nv, float* tq, float* rs) {
    __shared__ float red[32];
    const int r = blockIdx.y, u = blockIdx.x, t = threadIdx.x;
    const int units = cdim / dk;
    if (u >= units) {
        const int h = (u - units) % nv;
        const bool is_b = u - units >= nv;
        const float* w = (is_b ? bw : aw) + (size_t)h * hidden;
        const float* x = xn + (size_t)r * hidden;
        const int bd = blockDim.x;
        // thread t's products in column order t, t + bd, ...: 32 columns' loads in flight at a
        // time (the 9B's whole share at 128 threads: one memory latency; __launch_bounds__ leaves
        // ptxas the registers to issue all 64 before the first product), then 8, then one
        float p = 0.0f;
        int c = t;
        gdn_dot_run<32>(x, w, c, bd, hidden, p);
        gdn_dot_run<8>(x, w, c, bd, hidden, p);
        gdn_dot_run<1>(x, w, c, bd, hidden, p);
        const float dot = block_sum(p, red);
        pdl_begin();
        if (t != 0) return;
        if (is_b) {
            gb[(size_t)r * 2 * nv + nv + h] = sigmoidf_(dot);
        } else {
            gb[(size_t)r * 2 * nv + h] = gdn_decay(dot, a_log[h], dt_bias[h]);
        }
        return;
    }
    // a line (32 floats) a thread: the unit's dk kk taps, then its dk channels of ring rows
    // r .. kk - 2
    const int tl = dk * kk / 32, rl = dk / 32;
    for (int k = t; k < tl + (kk - 1 - r) * rl; k += (int)blockDim.x)
        pf_l2(k < tl ? taps + (size_t)u * dk * kk + 32 * k
                     : ring + (size_t)(r + (k - tl) / rl) * cdim + u * dk + 32 * ((k - tl) % rl));
    pdl_begin();
    const int c = u * dk + t;
    const bool on = t < dk;
    float acc = 0.0f;
    if (on) {
        // the taps' loads first (unrolled: one memory latency, not kk), then the sum in tap order
#pragma unroll 4
        for (int j = 0; j < kk; ++j) {
            const int m = r - (kk - 1) + j;
            const float* src = m >= 0 ? qkv + (size_t)m * qs : ring + (size_t)(kk - 1 + m) * cdim;
            acc += taps[(size_t)c * kk + j] * src[c];
        }
    }
    if (tq && on) {
        tq[(size_t)r * qs + c] = qkv[(size_t)r * qs + c];
        if (rs && r == 0)
            for (int j = 0; j < kk - 1; ++j) rs[(size_t)j * cdim + c] = ring[(size_t)j * cdim + c];
    }
    float y = on ? siluf_(acc) : 0.0f;
    if (u < 2 * nk) {
        float ss = block_sum(y * y, red);
        y = y / sqrtf(ss + 1e-6f);
        if (u < nk) y = y * (1.0f / sqrtf((float)dk));
    }
    if (on) cq[(size_t)r * cdim + c] = y;
}

// The two scans below run, for each row and each value column j of head h,
//   S = decay * S; kv = k . S[:, j]; delta = (v_j - kv) * beta; S[:, j] += k * delta; o_j = q . S[:, j]
// with the state's key rows split over threads as each describes.

// The column scan (dk = 128): 32 value columns of one head a group of 128 threads; thread (warp w,
// lane l) holds S[h][32w .. 32w+31][j0 + l] in registers over every row; the four warps' partial
// sums meet in shared memory, added in warp order. Group c = threadIdx.x / 128 of the block (at most
// four) takes column block blk + c, within one head. With osm != 0 (shared, [n][dv]) each output
// o_j of row r also goes to osm[r][j] (j within the head). With pdl, pdl_begin(early) comes
// between the state's loads and everything else (only a scan, a restore or an upload before the
// step writes S: two or more launches back, the rule in common.cuh).
__device__ __forceinline__ void gdn_cols4(const float* cq, const float* gb, const float* s_in, float* s_out,
                                          float* save, float* o, int n, int cdim, int nv, int nk, int dv,
                                          int blk, float* osm = 0, bool pdl = false, bool early = false) {
    const int DK = 128;
    __shared__ float kq[2][2][DK];  // [row parity][k | q][i]
    __shared__ float red[4][2][4][32];  // [group][kv | o][warp][lane]
    const int t = threadIdx.x & 127, c = threadIdx.x >> 7, w = t >> 5, l = t & 31;
    blk += c;
    const int h = blk / (dv / 32), j = (blk % (dv / 32)) * 32 + l;
    const int hk = h / (nv / nk);
    const size_t base = ((size_t)h * DK + w * 32) * dv + j;
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = s_in[base + (size_t)i * dv];
    if (pdl) pdl_begin(early);
    if (save) {
#pragma unroll
        for (int i = 0; i < 32; ++i) save[base + (size_t)i * dv] = s[i];
    }
    // row r's inputs (k and q by the first DK threads, decay, beta and v by every thread) into
    // registers a row ahead, so their loads wait behind the row before instead of in front of it
    float kx = 0.0f, qx = 0.0f, dx = 0.0f, bx = 0.0f, vx = 0.0f;
    auto fetch = [&](int r) {
        const float* row = cq + (size_t)r * cdim;
        if (threadIdx.x < DK) {
            kx = row[nk * DK + hk * DK + t];
            qx = row[hk * DK + t];
        }
        dx = gb[(size_t)r * 2 * nv + h];
        bx = gb[(size_t)r * 2 * nv + nv + h];
        vx = row[2 * nk * DK + h * dv + j];
    };
    if (n > 0) fetch(0);
    for (int r = 0; r < n; ++r) {
        float(*kb)[DK] = kq[r & 1];
        if (threadIdx.x < DK) {
            kb[0][t] = kx;
            kb[1][t] = qx;
        }
        const float decay = dx, beta = bx, v = vx;
        if (r + 1 < n) fetch(r + 1);
        __syncthreads();
        float p = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            s[i] = decay * s[i];
            p += kb[0][w * 32 + i] * s[i];
        }
        float(*rc)[4][32] = red[c];
        rc[0][w][l] = p;
        __syncthreads();
        const float kv = rc[0][0][l] + rc[0][1][l] + rc[0][2][l] + rc[0][3][l];
        const float d = (v - kv) * beta;
        float q = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            s[i] = s[i] + kb[0][w * 32 + i] * d;
            q += kb[1][w * 32 + i] * s[i];
        }
        rc[1][w][l] = q;
        __syncthreads();
        if (w == 0) {
            const float oj = rc[1][0][l] + rc[1][1][l] + rc[1][2][l] + rc[1][3][l];
            if (o) o[(size_t)r * nv * dv + h * dv + j] = oj;
            if (osm) osm[r * dv + j] = oj;
        }
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) s_out[base + (size_t)i * dv] = s[i];
}

// The warp scan (any dk a multiple of 32 up to 256): one value column a warp, lane l holding key
// rows l, l + 32, ...; the sums are warp butterflies.
__device__ __forceinline__ void gdn_cols1(const float* cq, const float* gb, const float* s_in, float* s_out,
                                          float* o, int n, int cdim, int nv, int nk, int dk, int dv, int col) {
    if (col >= nv * dv) return;
    const int l = threadIdx.x & 31, nr = dk / 32;
    const int h = col / dv, j = col % dv, hk = h / (nv / nk);
    const size_t base = ((size_t)h * dk + l) * dv + j;
    float s[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) s[e] = e < nr ? s_in[base + (size_t)e * 32 * dv] : 0.0f;
    for (int r = 0; r < n; ++r) {
        const float* row = cq + (size_t)r * cdim;
        const float* kr = row + nk * dk + hk * dk + l;
        const float* qr = row + hk * dk + l;
        const float decay = gb[(size_t)r * 2 * nv + h], beta = gb[(size_t)r * 2 * nv + nv + h];
        float p = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            if (e < nr) {
                s[e] = decay * s[e];
                p += kr[e * 32] * s[e];
            }
        }
        const float d = (row[2 * nk * dk + h * dv + j] - warp_sum(p)) * beta;
        float q = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            if (e < nr) {
                s[e] = s[e] + kr[e * 32] * d;
                q += qr[e * 32] * s[e];
            }
        }
        q = warp_sum(q);
        if (o && l == 0) o[(size_t)r * nv * dv + h * dv + j] = q;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e)
        if (e < nr) s_out[base + (size_t)e * 32 * dv] = s[e];
}

// hy_gdn_scan4: the delta rule over the window's n rows (dk = 128), then the conv ring moved.
// Blocks x < nv*dv/32: gdn_cols4 over cq / gb, S updated in place, o [n][nv*dv] written; when
// save != 0 the state the window starts from is copied there first (the tape's state copy).
// Blocks x >= nv*dv/32 (ceil(cdim/128) of them, only when kk > 1): channel (x - nv*dv/32)*128 + t
// of the ring moved past the window's raw rows qkv [n][qs].
// Pointers: cq [n][cdim], gb [n][2*nv], S [nv][128][dv] (in/out), o [n][nv*dv] out, ring
// [kk-1][cdim] (in/out, 0 when kk == 1), qkv [n][qs], save [nv][128][dv] or 0; all f32.
// Grid (nv*dv/32 + ring blocks, 1), block 128. Assumes dv % 32 == 0, nv % nk == 0.
// PDL: a scan block loads its state before pdl_begin (gdn_cols4).
extern "C" __global__ void hy_gdn_scan4(const float* cq, const float* gb, float* S, float* o, int n, int cdim,
                                        int nv, int nk, int dv, float* ring, const float* qkv, int qs, int kk,
                                        float* save) {
    const int nsb = nv * dv / 32;
    if ((int)blockIdx.x < nsb) {
        gdn_cols4(cq, gb, S, S, save, o, n, cdim, nv, nk, dv, blockIdx.x, 0, true);
    } else {
        pdl_begin();
        if (ring) gdn_ring_move(ring, ring, qkv, qs, n, cdim, kk, (blockIdx.x - nsb) * 128 + threadIdx.x);
    }
}

// hy_gdn_scan: hy_gdn_scan4 for any dk (a multiple of 32, at most 256): 8 value columns a block,
// one a warp (gdn_cols1), and no state copy (the host copies S for a tape). Blocks x >=
// ceil(nv*dv/8) (ceil(cdim/256) of them, only when kk > 1) move the ring.
// Pointers as hy_gdn_scan4 with S [nv][dk][dv]. Grid (ceil(nv*dv/8) + ring blocks, 1), block 256.
extern "C" __global__ void hy_gdn_scan(const float* cq, const float* gb, float* S, float* o, int n, int cdim,
                                       int nv, int nk, int dk, int dv, float* ring, const float* qkv, int qs,
                                       int kk) {
    pdl_begin();
    const int nsb = (nv * dv + 7) / 8;
    if ((int)blockIdx.x < nsb) {
        gdn_cols1(cq, gb, S, S, o, n, cdim, nv, nk, dk, dv, blockIdx.x * 8 + (threadIdx.x >> 5));
    } else if (ring) {
        gdn_ring_move(ring, ring, qkv, qs, n, cdim, kk, (blockIdx.x - nsb) * 256 + threadIdx.x);
    }
}

// hy_gdn_out32's output for the value x at column j of head h of row r, whose head has mean square
// ms, gate input zz = z[r][h dv + j] and norm weight wn (gemma ? 1 + norm[j] : norm[j]): y into of
// and the planes (pointers as hy_gdn_out32's).
__device__ __forceinline__ void gdn_norm_put(float x, float ms, float zz, float wn, int r, int h, int j, float* of,
                                             int nv, int dv, float eps, int sig, bf16* p0, bf16* p1, bf16* p2,
                                             int ps) {
    const float y = x / sqrtf(ms + eps) * wn * (sig ? sigmoidf_(zz) : siluf_(zz));
    of[(size_t)r * nv * dv + h * dv + j] = y;
    put3(p0, p1, p2, (size_t)r * ps, h * dv + j, y);
}

// hy_gdn_out32: gated RMSNorm of one head of one row into f32 and the matvec planes.
//   y = o / sqrt(mean(o^2) + eps) * wn * gate(z), wn = gemma ? 1 + norm : norm,
//   gate = sig ? sigmoid(z) : silu(z) (Qwen3.5: plain norm, silu).
// Pointers: o [n][nv*dv] f32; z [n][zs] f32 (head h at h*dv); norm [dv] f32; of [n][nv*dv] f32 out;
// p0, p1, p2 [n][ps] bf16 planes out (put3 of y at column h*dv + j).
// Grid (n*nv, 1), block dv threads (a multiple of 32, at most 1024).
// PDL: the gate input and norm weight are loaded before pdl_begin (z is the qkv matvec's, three
// launches back: the rule in common.cuh).
extern "C" __global__ void hy_gdn_out32(const float* o, const float* z, int zs, const float* norm, float* of, int nv,
                                        int dv, float eps, int sig, int gemma, bf16* p0, bf16* p1, bf16* p2,
                                        int ps) {
    __shared__ float red[32];
    const int r = blockIdx.x / nv, h = blockIdx.x % nv, j = threadIdx.x;
    const size_t at = (size_t)r * nv * dv + h * dv + j;
    const float zz = z[(size_t)r * zs + h * dv + j], wn = gemma ? 1.0f + norm[j] : norm[j];
    pdl_begin();
    const float x = o[at];
    const float ms = block_sum(x * x, red) / (float)dv;
    gdn_norm_put(x, ms, zz, wn, r, h, j, of, nv, dv, eps, sig, p0, p1, p2, ps);
}

// hy_gdn_scan4_out32: hy_gdn_scan4 and then hy_gdn_out32 in one launch, one block a value head, the
// same bits as the two. Blocks x < nv: head x's dv columns (group c of 128 threads takes columns
// 32c .. 32c + 31, as hy_gdn_scan4's block x * dv / 32 + c does), S updated in place, o written, the
// tape's state copy when save != 0; then the head's gated RMSNorm of each row as hy_gdn_out32 takes
// it (dv threads a row, four rows at a time). Blocks x >= nv (ceil(cdim / blockDim) of them,
// only when kk > 1) move the conv ring.
// Pointers: hy_gdn_scan4's (cq .. save), then hy_gdn_out32's (z .. ps; o is the scan's).
// The norm reads the head's o from shared memory (gdn_cols4's osm), and each thread's gate inputs
// (rows rr, rr + 4, ...) and its norm weight are loaded before the scan, so none costs a memory
// latency after it.
// Grid (nv + ring blocks, 1), block 4 * dv threads. Assumes dv % 32 == 0, dv <= 128, nv % nk == 0;
// traps when n > HY_NMAX.
// PDL: a head's block loads its gate inputs (z is the qkv matvec's, two launches back: the rule in
// common.cuh) and its state (gdn_cols4) before pdl_begin, which in a call of at most HY_EARLY_ROWS
// rows lets the out projection's matvec launch first (common.cuh). Capping it at 104 registers (__maxnreg__,
// 16 bytes of stack) so that a block fits on an SM beside a front block (53 248 + 10 240 registers;
// at 108 it takes 57 344) does not pay (session 29 call 5, not kept; GPU suite 284 passed on that
// tree; `bench_decode --shapes 9b --source mem --skip-matvec --tokens 32 --windows 2,8 --prompt
// 64`, device ms, two runs each): 9b step 1.9803 / 1.9879 against 1.9766 / 1.975, 2-row window
// 2.1533 / 2.1539 against 2.1506 / 2.1492, 8-row 3.3191 / 3.322 against 3.3275 / 3.3237.
extern "C" __global__ void __launch_bounds__(512)
    hy_gdn_scan4_out32(const float* cq, const float* gb, float* S, float* o, int n, int cdim, int nv, int nk, int dv,
                       float* ring, const float* qkv, int qs, int kk, float* save, const float* z, int zs,
                       const float* norm, float* of, float eps, int sig, int gemma, bf16* p0, bf16* p1, bf16* p2,
                       int ps) {
    if (n > HY_NMAX) asm volatile("trap;");
    __shared__ float ored[16];
    __shared__ float osm[HY_NMAX * 128];
    const bool early = pdl_early(n);
    if ((int)blockIdx.x >= nv) {
        pdl_begin(early);
        if (ring) gdn_ring_move(ring, ring, qkv, qs, n, cdim, kk, (blockIdx.x - nv) * blockDim.x + threadIdx.x);
        return;
    }
    // four rows at a time (block 4 dv): this thread's rows rr, rr + 4, ...
    const int h = blockIdx.x, j = threadIdx.x % dv, rr = threadIdx.x / dv;
    const float wn = gemma ? 1.0f + norm[j] : norm[j];
    float zr[HY_NMAX / 4];
#pragma unroll
    for (int k = 0; k < HY_NMAX / 4; ++k) {
        const int r = rr + 4 * k;
        zr[k] = r < n ? z[(size_t)r * zs + h * dv + j] : 0.0f;
    }
    gdn_cols4(cq, gb, S, S, save, o, n, cdim, nv, nk, dv, h * (dv / 32), osm, true, early);
    __syncthreads();  // the head's o rows, written by the block
#pragma unroll
    for (int k = 0; k < HY_NMAX / 4; ++k) {
        if (4 * k >= n) break;
        const int r = 4 * k + rr;
        const float x = r < n ? osm[r * dv + j] : 0.0f;
        // the row's sum over its dv threads (warps rr dv / 32 ..)
        const float ss = seg_sum(x * x, ored, rr * (dv / 32), dv / 32);
        if (r < n) gdn_norm_put(x, ss / (float)dv, zr[k], wn, r, h, j, of, nv, dv, eps, sig, p0, p1, p2, ps);
    }
}

// The restore table of `spec_restore`: 7 pointers a layer, in this order.
//   [0] s_save  [1] s  [2] t_cq  [3] t_gb  [4] ring_save  [5] ring  [6] t_qkv

// hy_gdn_restore_scan4: layer y = blockIdx.y of the table back to its window start and the first
// `keep` rows of its tape replayed (dk = 128): S = s_save, then gdn_cols4 over t_cq / t_gb into s.
// Grid (nv*dv/32, layers), block 128.
extern "C" __global__ void hy_gdn_restore_scan4(const u64* tab, int keep, int cdim, int nv, int nk, int dv) {
    const u64* p = tab + (size_t)blockIdx.y * 7;
    gdn_cols4((const float*)p[2], (const float*)p[3], (const float*)p[0], (float*)p[1], (float*)0, (float*)0, keep,
              cdim, nv, nk, dv, blockIdx.x);
}

// hy_gdn_restore_scan: hy_gdn_restore_scan4 for any dk (gdn_cols1). Grid (ceil(nv*dv/8), layers),
// block 256.
extern "C" __global__ void hy_gdn_restore_scan(const u64* tab, int keep, int cdim, int nv, int nk, int dk, int dv) {
    const u64* p = tab + (size_t)blockIdx.y * 7;
    gdn_cols1((const float*)p[2], (const float*)p[3], (const float*)p[0], (float*)p[1], (float*)0, keep, cdim, nv, nk,
              dk, dv, blockIdx.x * 8 + (threadIdx.x >> 5));
}

// hy_gdn_restore_ring: the ring of layer blockIdx.y as the window's first `keep` rows leave it:
// ring = ([ring_save ; t_qkv rows 0..keep-1])[keep ..], t_qkv rows `qs` floats apart.
// Grid (ceil(cdim/256), layers), block 256. Launched only when kk > 1.
extern "C" __global__ void hy_gdn_restore_ring(const u64* tab, int keep, int qs, int cdim, int kk) {
    const u64* p = tab + (size_t)blockIdx.y * 7;
    gdn_ring_move((float*)p[5], (const float*)p[4], (const float*)p[6], qs, keep, cdim, kk,
                  blockIdx.x * 256 + threadIdx.x);
}
