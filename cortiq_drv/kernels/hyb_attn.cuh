// Gated full attention of the small path (the reference's hy_qk, hy_scores, hy_values, hy_finish),
// docs/MODEL.md "Gated full attention", plus the head's helpers (hy_argmax, hy_embed_gather,
// hy_to_half) and hy_copy16, the decode step's staging copy. Compiled per geometry: HPK query
// heads per KV head, HD the head width (hyb.cu).
//
// The call record (one a layer, 8 int words, uploaded before every call so a recorded graph reads
// the current one): [0] n0 = mirror rows before the call, [1] the mirror row of the call's first
// row, [2] rb = keys a block, [3] ncap = the scratch's keys a head (a multiple of 4096), [4] nbcap =
// key blocks a head in the scratch, [5] far: 1 when block nbcap - 1 holds the far field's part
// (its maximum, P and E written between hy_scores and hy_values), [6] the far field's ring row,
// [7] any keys far. With ci == 0 the kernels take n0, slot0, rb, ncap, nbcap from their arguments
// and no far part.
//
// Row r of a call (0 <= r < n) sees the mirror rows 0 .. n0 + r (keys = n0 + r + 1), split into
// blocks of rb keys; block b of row r exists when b * rb < keys. Scratch layouts (f32):
//   S  [n][nh][ncap]        scaled scores of row r, head h, key t
//   Mx [n][nh][nbcap]       each block's maximum score
//   P  [n][nbcap][nh][HD]   sum over the block's keys of exp(s - M) v, M the row's maximum
//   E  [n][nbcap][nh]       sum over the block's keys of exp(s - M)
// A row's sums depend on its own keys and rb only, in a fixed order: never on n.

// A record word from L2 (ld.global.cg; not volatile, so an unused one is never loaded).
__device__ __forceinline__ int att_word_cg(const int* p) {
    int v;
    asm("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// The call record's n0, rb, ncap, nbcap and far over the launch's own values when ci != 0, read
// from L2 ahead of pdl_begin (PDL, common.cuh): an upload before the step or the step's first
// kernel (hy_copy16) wrote it, and the kernel that may still run (hy_qk, hy_scores or hy_values,
// before hy_scores, hy_values and hy_finish) does not write it, with everything before that
// kernel complete. A kernel's unused fields cost nothing.
__device__ __forceinline__ void att_record(const int* ci, int& n0, int& rb, int& ncap, int& nbcap, int& far) {
    if (ci) {
        n0 = att_word_cg(ci);
        rb = att_word_cg(ci + 2);
        ncap = att_word_cg(ci + 3);
        nbcap = att_word_cg(ci + 4);
        far = att_word_cg(ci + 5);
    }
}

// PDL: whether key block b of row r = blockIdx.z, KV head g = blockIdx.y, of a call with the
// record's n0 and rb has keys (b * rb < n0 + r + 1, r < n), and if so the first ATT_PF keys'
// mirror rows it will read (K for hy_scores, V for hy_values) into L2 (pf_l2), before pdl_begin:
// enough to cover the first loads' latency, and few enough (ATT_PF keys a block) that a long
// context's blocks together stay well inside L2. The kernels return at once when it is false for
// their first key block, so the grid's blocks past the keys leave without holding a slot while
// the kernel before runs.
#define ATT_PF 64
__device__ __forceinline__ bool att_rows_pf(const f16* mp, int n0, int rb, int b, int nkv, int n) {
    const int r = blockIdx.z, g = blockIdx.y, t0 = b * rb;
    if (r >= n || t0 >= n0 + r + 1) return false;
    const int t1 = min(t0 + min(rb, ATT_PF), n0 + r + 1);
    constexpr int LPR = HD >= 64 ? HD / 64 : 1;  // 128-byte lines a row
    for (int k = threadIdx.x; k < (t1 - t0) * LPR; k += blockDim.x)
        pf_l2(mp + ((size_t)(t0 + k / LPR) * nkv + g) * HD + (k % LPR) * 64);
    return true;
}

// HD / 32 consecutive f16 values from p (2 * HD / 32-byte aligned) as f32, in vector loads.
__device__ __forceinline__ void att_load_h(const f16* p, float* out) {
    const int E = HD / 32;
    if (E == 8) {
        uint4 u = *(const uint4*)p;
        unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            out[2 * e] = f16_to_f32((u16)(w[e] & 0xFFFF));
            out[2 * e + 1] = f16_to_f32((u16)(w[e] >> 16));
        }
    } else if (E == 4) {
        uint2 u = *(const uint2*)p;
        out[0] = f16_to_f32((u16)(u.x & 0xFFFF));
        out[1] = f16_to_f32((u16)(u.x >> 16));
        out[2] = f16_to_f32((u16)(u.y & 0xFFFF));
        out[3] = f16_to_f32((u16)(u.y >> 16));
    } else {
#pragma unroll
        for (int e = 0; e < E; ++e) out[e] = f16_to_f32(p[e]);
    }
}

// hy_qk: per row, q/k RMSNorm, partial rotary, output-gate split, and the K/V rows into the mirror.
//   block u < nh (query head u): x = q[r][u*(gated ? 2*HD : HD) + d]; when qn: x = x / sqrt(mean(x^2)
//     + eps) * (gemma ? 1 + qn : qn); rotary; qg[r][u][d] = x (and q16 as f16 when q16 != 0);
//     gated: gate[r][u][d] = q[r][u*2*HD + HD + d] (raw; hy_finish takes the sigmoid).
//   block nh + g (KV head g): k the same with kn; kp[slot + r][g][d] = f16(k), vp[..] = f16(v).
//   Rotary on d < 2*half, split-half: with (sn, cs) = tab[r][j], j < half,
//     (x[j], x[j+half]) -> (x[j] cs - x[j+half] sn, x[j+half] cs + x[j] sn).
// Pointers: q [n][qs] f32; k, v [n][kvs] f32 (KV head g at g*HD); qn, kn [HD] f32 or 0; qg (or 0:
// not written), gate [n][nh][HD] f32 out; kp, vp f16 mirrors [rows][nkv][HD]; tab [n][half][2]
// f32 (sin, cos); ci the call record (slot = ci[1]) or 0 (slot = slot0); q16 [n][nh][HD] f16
// out or 0.
// Grid (nh + nkv, n), block HD threads (HD a multiple of 32).
extern "C" __global__ void hy_qk(const float* q, int qs, const float* k, const float* v, int kvs, const float* qn,
                                 const float* kn, float* qg, float* gate, f16* kp, f16* vp, const float* tab, int nh,
                                 int nkv, int half, float eps, int gemma, int gated, int slot0, int n, const int* ci,
                                 f16* q16) {
    pdl_begin();
    __shared__ float red[32];
    __shared__ float xs[HD];
    const int r = blockIdx.y, u = blockIdx.x, d = threadIdx.x;
    if (r >= n) return;
    const int slot = ci ? ci[1] : slot0;
    const bool isq = u < nh;
    const float* src = isq ? q + (size_t)r * qs + (size_t)u * (gated ? 2 * HD : HD) : k + (size_t)r * kvs + (u - nh) * HD;
    const float* nw = isq ? qn : kn;
    // every global value the block reads, loaded together (one memory latency, not one after
    // each barrier): the row's element, its norm weight, rotary pair, gate or value
    const int g = u - nh, j = d < half ? d : d - half;
    const bool rot = half > 0 && d < 2 * half;
    float x = src[d];
    const float wv = nw ? nw[d] : 0.0f;
    const float sn = rot ? tab[((size_t)r * half + j) * 2] : 0.0f;
    const float cs = rot ? tab[((size_t)r * half + j) * 2 + 1] : 0.0f;
    const float gv = isq && gated ? src[HD + d] : 0.0f, vv = isq ? 0.0f : v[(size_t)r * kvs + g * HD + d];
    if (nw) {
        const float ms = block_sum(x * x, red) / (float)HD;
        x = x / sqrtf(ms + eps) * (gemma ? 1.0f + wv : wv);
    }
    if (half > 0) {
        xs[d] = x;
        __syncthreads();
        if (rot) x = d < half ? xs[d] * cs - xs[d + half] * sn : xs[d] * cs + xs[d - half] * sn;
    }
    if (isq) {
        const size_t at = ((size_t)r * nh + u) * HD + d;
        if (qg) qg[at] = x;
        if (gated) gate[at] = gv;
        if (q16) q16[at] = f32_to_f16(x);
    } else {
        const size_t at = ((size_t)(slot + r) * nkv + g) * HD + d;
        kp[at] = f32_to_f16(x);
        vp[at] = f32_to_f16(vv);
    }
}

// The key blocks of the attention grid: block x walks key blocks r0 + x, r0 + x + gridDim.x, ...
// while they hold keys of its row (so any grid covers every block from r0 on, and a block's sums
// do not depend on the grid), each as one launch's block would alone.

// hy_scores: S[r][h][t] = scale * (qg[r][h] . k_t) for the keys t of each key block b the block
// walks, of row r = blockIdx.z, the HPK query heads h of KV head g = blockIdx.y; Mx[r][h][b] = their
// maximum. One key a warp: lane l takes dims [l*HD/32, (l+1)*HD/32), a warp butterfly adds them.
// Pointers: qg [n][nh][HD] f32; kp f16 mirror [rows][nkv][HD]; S, Mx scratch (header); ci or 0.
// Grid (any, nkv, n): blocks whose first key block is past the row's keys leave (att_rows_pf).
// Block 256 threads. r0: the first key block the grid walks (0 on the small path).
extern "C" __global__ void hy_scores(const float* qg, const f16* kp, float* S, float* Mx, int n0, int r0, int nkv,
                                     float scale, int rb, int ncap, int nbcap, int n, const int* ci) {
    int far = 0;
    att_record(ci, n0, rb, ncap, nbcap, far);
    if (!att_rows_pf(kp, n0, rb, r0 + blockIdx.x, nkv, n)) return;
    pdl_begin();
    __shared__ float qsm[HPK][HD];
    __shared__ float wm[8][HPK];
    const int r = blockIdx.z, g = blockIdx.y;
    const int nh = nkv * HPK;
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    const int E = HD / 32;
    // the lane's dims of every head in registers where they fit (the same products as from
    // shared memory), and fewer keys in flight where the heads take many registers
    const bool QREG = HPK * E <= 64;
    const float* qrow = qg + ((size_t)r * nh + g * HPK) * HD;
    float qr[QREG ? HPK : 1][E];
#pragma unroll
    for (int i = 0; i < (QREG ? HPK : 0); ++i)
#pragma unroll
        for (int e = 0; e < E; ++e) qr[i][e] = qrow[i * HD + l * E + e];
    if (!QREG) {
        for (int x = threadIdx.x; x < HPK * HD; x += blockDim.x) qsm[x / HD][x % HD] = qrow[x];
        __syncthreads();
    }
    const int keys = n0 + r + 1;
    // the key blocks the block walks (the first has keys: att_rows_pf)
    for (int b = r0 + blockIdx.x; b * rb < keys; b += gridDim.x) {
        const int t0 = b * rb, t1 = min(t0 + rb, keys);
        float m[HPK];
#pragma unroll
        for (int i = 0; i < HPK; ++i) m[i] = __int_as_float(0xff800000);
        // the warp's keys t0 + w, t0 + w + 8, ... in order, SKB of them loaded before any is used
        // (past the block's last key the load repeats that key, unused: no branch between the loads)
        const int SKB = HPK * E <= 32 ? 8 : (HPK * E <= 64 ? 4 : 1);
        for (int t = t0 + w; t < t1; t += 8 * SKB) {
            float kf[SKB][E];
#pragma unroll
            for (int u = 0; u < SKB; ++u)
                att_load_h(kp + ((size_t)min(t + 8 * u, t1 - 1) * nkv + g) * HD + l * E, kf[u]);
#pragma unroll
            for (int u = 0; u < SKB; ++u) {
                if (t + 8 * u >= t1) break;
#pragma unroll
                for (int i = 0; i < HPK; ++i) {
                    float p = 0.0f;
#pragma unroll
                    for (int e = 0; e < E; ++e) p += (QREG ? qr[QREG ? i : 0][e] : qsm[i][l * E + e]) * kf[u][e];
                    const float s = warp_sum(p) * scale;
                    m[i] = fmaxf(m[i], s);
                    if (l == (i & 31)) S[((size_t)r * nh + g * HPK + i) * ncap + t + 8 * u] = s;
                }
            }
        }
        if (l == 0) {
#pragma unroll
            for (int i = 0; i < HPK; ++i) wm[w][i] = m[i];
        }
        __syncthreads();
        if (threadIdx.x < HPK) {
            float mm = wm[0][threadIdx.x];
            for (int x = 1; x < 8; ++x) mm = fmaxf(mm, wm[x][threadIdx.x]);
            Mx[((size_t)r * nh + g * HPK + threadIdx.x) * nbcap + b] = mm;
        }
        __syncthreads();  // wm read before the next key block writes it
    }
}

// hy_values: for each key block b the block walks, of row r = blockIdx.z, KV head g = blockIdx.y,
// each of its HPK heads h: M = max over the row's blocks of Mx (and the far block when the record
// says), P[r][b][h][d] = sum_t exp(S[r][h][t] - M) v_t[d], E[r][b][h] = sum_t exp(S[r][h][t] - M),
// keys in ascending order, each sum by one thread. Keys go through shared memory 64 at a time
// (their exp weights and their value rows).
// Pointers: vp f16 mirror [rows][nkv][HD]; S, Mx in, P, E out (header); ci or 0.
// Grid (any, nkv, n) as hy_scores', block 256 threads. Assumes HD <= 256: 256 / HD threads share
// a dim, each taking every (256 / HD)-th head.
extern "C" __global__ void hy_values(const float* S, const float* Mx, const f16* vp, float* P, float* E, int n0, int r0,
                                     int nkv, int rb, int ncap, int nbcap, int n, const int* ci) {
    int far = 0;
    att_record(ci, n0, rb, ncap, nbcap, far);
    int b = r0 + blockIdx.x;
    if (!att_rows_pf(vp, n0, rb, b, nkv, n)) return;
    pdl_begin();
    const int TPD = 256 / HD, NI = (HPK + TPD - 1) / TPD, VQ = (64 * HD / 8 + 255) / 256;
    __shared__ float pm[HPK][64];
    __shared__ __align__(16) u16 vs[64][HD];
    __shared__ float mx[HPK];
    const int r = blockIdx.z, g = blockIdx.y, t = threadIdx.x;
    const int keys = n0 + r + 1, nb = (keys + rb - 1) / rb;
    const int nh = nkv * HPK, d = t % HD, grp = t / HD;
    const float* srow = S + ((size_t)r * nh + g * HPK) * ncap;
    constexpr int SQ = (HPK * 64 + 255) / 256;
    // a chunk's scores and value rows (16 bytes a load) into registers, all of a thread's loads
    // in flight together; the first chunk's go out with the block maxima's
    float sv[SQ];
    uint4 vb[VQ];
    auto fetch = [&](int c0, int cn) {
#pragma unroll
        for (int k = 0; k < SQ; ++k) {
            const int x = t + k * 256, i = x / 64, tt = x % 64;
            if (x < HPK * 64 && tt < cn) sv[k] = srow[(size_t)i * ncap + c0 + tt];
        }
#pragma unroll
        for (int k = 0; k < VQ; ++k) {
            const int x = t + k * 256, tt = x / (HD / 8);
            if (tt < cn) vb[k] = *(const uint4*)(vp + ((size_t)(c0 + tt) * nkv + g) * HD + (x % (HD / 8)) * 8);
        }
    };
    // the first key block has keys (att_rows_pf)
    fetch(b * rb, min(64, min((b + 1) * rb, keys) - b * rb));
    if (t < HPK) {
        const float* mrow = Mx + ((size_t)r * nh + g * HPK + t) * nbcap;
        float mm = mrow[0];
        // unrolled: the block maxima's loads in flight together (a maximum in any order is the same)
#pragma unroll 8
        for (int x = 1; x < nb; ++x) mm = fmaxf(mm, mrow[x]);
        if (far) mm = fmaxf(mm, mrow[nbcap - 1]);
        mx[t] = mm;
    }
    for (bool first = true; b * rb < keys; b += gridDim.x, first = false) {
        const int t1 = min((b + 1) * rb, keys);
        float acc[NI];
#pragma unroll
        for (int x = 0; x < NI; ++x) acc[x] = 0.0f;
        float esum = 0.0f;
        for (int c0 = b * rb; c0 < t1; c0 += 64) {
            const int cn = min(64, t1 - c0);
            if (c0 != b * rb || !first) fetch(c0, cn);
            __syncthreads();  // mx written; pm and vs free again
#pragma unroll
            for (int k = 0; k < SQ; ++k) {
                const int x = t + k * 256, i = x / 64, tt = x % 64;
                if (x < HPK * 64) pm[i][tt] = tt < cn ? expf(sv[k] - mx[i]) : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < VQ; ++k) {
                const int x = t + k * 256, tt = x / (HD / 8);
                if (tt < cn) *(uint4*)&vs[tt][(x % (HD / 8)) * 8] = vb[k];
            }
            __syncthreads();
            if (t < HPK)
                for (int tt = 0; tt < cn; ++tt) esum += pm[t][tt];
            if (grp < TPD) {
                for (int tt = 0; tt < cn; ++tt) {
                    const float vv = f16_to_f32(vs[tt][d]);
#pragma unroll
                    for (int x = 0; x < NI; ++x)
                        if (grp + x * TPD < HPK) acc[x] += pm[grp + x * TPD][tt] * vv;
                }
            }
        }
        const size_t pb = ((size_t)r * nbcap + b) * nh + g * HPK;
        if (grp < TPD) {
#pragma unroll
            for (int x = 0; x < NI; ++x)
                if (grp + x * TPD < HPK) P[(pb + grp + x * TPD) * HD + d] = acc[x];
        }
        if (t < HPK) E[pb + t] = esum;
    }
}

// hy_finish: out[r][h][d] = (sum_b P[r][b][h][d]) / (sum_b E[r][b][h]) over the row's blocks in
// order (then the far block when the record says), times sigmoid(gate[r][h][d]) when gate != 0,
// into the planes: put3 at row r, column h*HD + d.
// Pointers: P, E scratch (header); gate [n][nh][HD] f32 or 0; p0, p1, p2 [n][ps] bf16 out; ci or 0.
// Grid (nh, n), block 256 threads; HD <= 256 (hy_values'). PDL: a call of at most HY_EARLY_ROWS
// rows lets the out projection's matvec launch before its wait (common.cuh).
extern "C" __global__ void hy_finish(const float* P, const float* E, const float* gate, bf16* p0, bf16* p1, bf16* p2,
                                     int ps, int n0, int rb, int nh, int nbcap, const int* ci) {
    int far = 0, ncap = 0;
    att_record(ci, n0, rb, ncap, nbcap, far);
    pdl_begin(pdl_early(gridDim.y));
    const int r = blockIdx.y, h = blockIdx.x;
    const int nb = (n0 + r + 1 + rb - 1) / rb;
    const float* er = E + (size_t)r * nbcap * nh + h;
    // the sums in block order, each thread's E and P sums in one loop, unrolled so that all
    // their loads are in flight together (HD <= blockDim.x: one column a thread at most)
    const int d = threadIdx.x;
    const float* pr = P + ((size_t)r * nbcap * nh + h) * HD + min(d, HD - 1);
    // the gate's value loaded with the sums' first loads, not after them
    const float gv = gate && d < HD ? gate[((size_t)r * nh + h) * HD + d] : 0.0f;
    float den = 0.0f, num = 0.0f;
#pragma unroll 8
    for (int b = 0; b < nb; ++b) {
        den += er[(size_t)b * nh];
        num += pr[(size_t)b * nh * HD];
    }
    if (far) {
        den += er[(size_t)(nbcap - 1) * nh];
        num += pr[(size_t)(nbcap - 1) * nh * HD];
    }
    if (d < HD) {
        float y = num / den;
        if (gate) y = y * sigmoidf_(gv);
        put3(p0, p1, p2, (size_t)r * ps, h * HD + d, y);
    }
}

// The running (best, idx) of hy_argmax after value v at index c: the larger value, the lower index
// among equals, NaN never taken. The pick does not depend on the order values come in.
__device__ __forceinline__ void argmax_take(float v, int c, float& best, int& idx) {
    if (v > best || (v == best && c < idx)) {
        best = v;
        idx = c;
    }
}

// The warp's lanes' (best, idx) taken together, on every lane.
__device__ __forceinline__ void argmax_warp(float& best, int& idx) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        argmax_take(ov, oi, best, idx);
    }
}

// hy_argmax: out[off + r] = the index of the largest of logits[r][0 .. rows), the lowest index
// among equals (NaN never wins; a row of NaN gives 0). Block b of row r = blockIdx.y takes the
// b-th of gridDim.x equal runs of the row's 16-byte groups (eight loads in flight a thread; block
// 0 also the columns before the first 16-byte boundary and after the last one), its pick into
// part[r][b]; the last of the row's blocks to finish (cnt[r] counts arrivals; that block puts it
// back to 0) picks among the parts. The pick does not depend on how the row is split.
// Pointers: logits [n][stride] f32, 4-byte aligned (a row may start anywhere: stride any); out
// i32; part [n][gridDim.x][2] 32-bit words (value, index) scratch; cnt i32 [n] (zero between
// launches). Grid (blocks, n), block 256.
extern "C" __global__ void __launch_bounds__(256)
    hy_argmax(const float* logits, int rows, int stride, int* out, int off, float* part, int* cnt) {
    pdl_begin();
    __shared__ float bv[8];
    __shared__ int bi[8];
    __shared__ int last;
    const int r = blockIdx.y, nb = gridDim.x, bd = blockDim.x;
    const float* x = logits + (size_t)r * stride;
    float best = __int_as_float(0xff800000);
    int idx = 0x7fffffff;
    // the columns before the row's first 16-byte boundary (x is 4-byte aligned: a whole number)
    const int a0 = min(rows, (int)((16 - ((size_t)x & 15)) & 15) / 4);
    const int nq = (rows - a0) / 4, per = (nq + nb - 1) / nb;
    const int q0 = min(nq, (int)blockIdx.x * per), q1 = min(nq, q0 + per);
    const float4* x4 = (const float4*)(x + a0);
    if (blockIdx.x == 0) {
        for (int c = threadIdx.x; c < a0; c += bd) argmax_take(x[c], c, best, idx);
        for (int c = a0 + 4 * nq + threadIdx.x; c < rows; c += bd) argmax_take(x[c], c, best, idx);
    }
    for (int q = q0 + threadIdx.x; q < q1; q += 8 * bd) {
        float4 v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e)
            if (q + e * bd < q1) v[e] = x4[q + e * bd];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            if (q + e * bd < q1) {
                const int c = a0 + 4 * (q + e * bd);
                argmax_take(v[e].x, c, best, idx);
                argmax_take(v[e].y, c + 1, best, idx);
                argmax_take(v[e].z, c + 2, best, idx);
                argmax_take(v[e].w, c + 3, best, idx);
            }
        }
    }
    argmax_warp(best, idx);
    if ((threadIdx.x & 31) == 0) {
        bv[threadIdx.x >> 5] = best;
        bi[threadIdx.x >> 5] = idx;
    }
    __syncthreads();
    float* pr = part + (size_t)r * nb * 2;
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(bd >> 5); ++w) argmax_take(bv[w], bi[w], best, idx);
        pr[2 * blockIdx.x] = best;
        ((int*)pr)[2 * blockIdx.x + 1] = idx;
        // the part visible to the row's other blocks before this one counts itself in
        __threadfence();
        last = atomicAdd(cnt + r, 1) == nb - 1;
        if (last) cnt[r] = 0;
    }
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;
    __threadfence();
    best = __int_as_float(0xff800000);
    idx = 0x7fffffff;
    for (int b = threadIdx.x; b < nb; b += 32) {
        float v;
        int i;
        // the other blocks' parts from L2 (ld.global.cg: never a stale L1 line)
        asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(pr + 2 * b));
        asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(i) : "l"(pr + 2 * b + 1));
        argmax_take(v, i, best, idx);
    }
    argmax_warp(best, idx);
    if (threadIdx.x == 0) out[off + r] = idx == 0x7fffffff ? 0 : idx;
}

// hy_copy16: dst[i] = src[i] for the n 16-byte words i < n. Either side may be pinned host memory,
// which the device reaches at its host address (unified addressing): a decode step's staged
// inputs come in and its residual row goes out inside the step's graph, with no copy call.
// Grid (ceil(n / 256), 1), block 256. Both pointers 16-byte aligned.
extern "C" __global__ void hy_copy16(const uint4* src, uint4* dst, int n) {
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

// hy_embed_gather: out[c] = row tok[j] of a q4tp matrix in the tensor-core layout (hy_repack's):
//   weight (r, c) = (nibble - 8) * exp2(lo_r + code(r, c/32) * step_r), with, for tile T = r/16,
//   i = r%16, group g = c/32, k = c%32, byte B = k/2 of the row's group (q = B/4, tig = B%4):
//   nibble = tiles[((T*gpr + g)*32 + lane)*2 + q/2] >> (4*m + 16*(k&1)) & 15, lane = (i%8)*4 + tig,
//   m = 2*(q%2) + (i >= 8); code = codes[(T*gpr + g)*16 + i]; (lo, step) = lad[r].
// A token outside [0, rows) gives a zero row. Pointers: tiles u32, codes u8, lad [rows][2] f32,
// tok i32 (token tok[j]), out [hidden] f32. Grid (ceil(hidden/256), 1), block 256. hidden % 32 == 0.
extern "C" __global__ void hy_embed_gather(const u32* tiles, const unsigned char* codes, const float* lad, int rows,
                                           int hidden, const int* tok, int j, float* out) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    const int r = tok[j];
    if (r < 0 || r >= rows) {
        out[c] = 0.0f;
        return;
    }
    const int gpr = hidden / 32, g = c / 32, k = c % 32, i = r % 16;
    const size_t tg = (size_t)(r / 16) * gpr + g;
    const int q = k / 8, tig = (k / 2) % 4;
    const int lane = (i % 8) * 4 + tig, m = 2 * (q % 2) + (i >= 8);
    const u32 word = tiles[(tg * 32 + lane) * 2 + q / 2];
    const int nib = (word >> (4 * m + 16 * (k & 1))) & 15;
    out[c] = (float)(nib - 8) * hy_rung(lad[2 * r], lad[2 * r + 1], codes[tg * 16 + i]);
}

// hy_to_half: dst[i] = f16(src[i]) (round to nearest even) for i < count. Pointers: src f32, dst
// f16. Grid (ceil(count/256), 1), block 256.
extern "C" __global__ void hy_to_half(const float* src, f16* dst, u64 count) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) dst[i] = f32_to_f16(src[i]);
}
