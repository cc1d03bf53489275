// The prompt path's chunked delta rule (fla's chunked gated delta rule in the WY form), HB_C rows a
// chunk, key and value width HB_D, on the tensor cores. For value head h and a chunk of rows t
// (q_t, k_t, v_t from cq, key head h / (nv / nk); the gates from the projections a_t, b_t: log
// decay g_t = -exp(a_log_h) softplus(a_t + dt_bias_h), beta_t = sigmoid(b_t)), with G_t =
// sum_{r <= t} g_r inside the chunk (g clamped at -80 so differences stay finite) and S0 the
// state before the chunk:
//   A[t][s] = beta_t e^{G_t - G_s} (k_t . k_s) for s < t, T = (I + A)^-1;
//   W = T (beta e^G k), U = T (beta v)        (hy_gdn_wy: no state, every chunk at once)
//   D = U - W S0;  o_t = e^{G_t} S0^T q_t + sum_{s <= t} P[t][s] D_s,  P[t][s] = e^{G_t - G_s} (q_t . k_s);
//   S = e^{G_last} S0 + sum_s e^{G_last - G_s} k_s D_s^T   (hy_gdn_chunk: chunk after chunk)
// which is the serial rule S = decay S; d = (v - S^T k) beta; S += k d^T; o = S^T q regrouped. Rows
// past n count as zero rows with decay 1. The CPU reference: hybrid/kernels_big_ref.py (gdn_wy,
// gdn_chunk).
//
// Every product runs as mma.sync m16n8k8 tf32 in three terms (3xTF32): each f32 operand x splits
// into hi and lo of 11 significant bits each (hb_split); a b ~ a_lo b_hi + a_hi b_lo + a_hi b_hi,
// f32 accumulate (the dropped lo lo term and the split are ~2^-21 relative, f32-class; a single
// tf32 product would be ~2^-11, far outside the tests' 1e-5). Fragments (g = lane / 4,
// c = lane % 4): A (16 x 8) a0 (g, c), a1 (g + 8, c), a2 (g, c + 4), a3 (g + 8, c + 4); B (8 x 8)
// b0 (c, g), b1 (c + 4, g); the accumulator d0, d1 (g, 2c, 2c + 1), d2, d3 (g + 8, 2c, 2c + 1).
#define HB_C 64
#define HB_D 128
// Value columns a block of hy_gdn_chunk, its warps, and each warp's rows t in steps 1-2 and key
// columns i in step 3 (hy_gdn_chunk's header). 16 warps ran 4.5% faster than 8 on an H200 (9B
// shape, 4095 rows): more warps to hide the dependent mma chains.
#define HB_JW 32
#define HB_CW 16
#define HB_TW (2 * HB_C / HB_CW)
#define HB_IW (2 * HB_D / HB_CW)
// Row strides in floats, chosen so a warp's fragment loads hit 32 distinct banks: a matrix read as
// [m][k] (A) or [n][k] (B) rows g: stride % 32 == 4 (HB_LDK, HB_LDC); read as [k][n] (B) or
// [k][m] (A) rows c: stride % 32 == 8 (HB_LDR, HB_LDB, HB_LDJ); read at rows 2c: stride % 16 == 4
// (HB_LDU). All multiples of 4 (float4 rows, 16-byte cp.async).
#define HB_LDK (HB_D + 4)
#define HB_LDC (HB_C + 4)
#define HB_LDR (2 * HB_D + 8)
#define HB_LDB (HB_D + 8)
#define HB_LDJ (HB_JW + 8)
#define HB_LDU (HB_JW + 4)
// Dynamic shared memory (bytes) of hy_gdn_wy: k, q [C][LDK] (then the right-hand sides [C][LDR]
// over both), A [C][LDC], G, beta [C].
#define HB_WY_SMEM ((2 * HB_C * HB_LDK + HB_C * HB_LDC + 2 * HB_C) * 4)
// ... and of hy_gdn_chunk: W, q [C][LDK], k [C][LDB], P [C][LDC], U [C][LDU], S [D][LDJ], D and
// the scaled D [C][LDJ], G [2][C].
#define HB_CHUNK_SMEM \
    (4 * (2 * HB_C * HB_LDK + HB_C * HB_LDB + HB_C * HB_LDC + HB_C * HB_LDU + (HB_D + 2 * HB_C) * HB_LDJ + 2 * HB_C))

// x as tf32 hi + lo by bit operations (cvt.rna.tf32.f32 costs about five instructions on sm_90;
// this is an add, a mask and a subtraction: ptxas drops the other mask, as the tf32 mma ignores the
// low 13 bits): hi = x rounded half up to 11 significant bits (x - hi is exact in f32), lo = x - hi
// truncated to 11 (relative error <= 2^-21 of x). Finite x only.
__device__ __forceinline__ void hb_split(float x, u32& hi, u32& lo) {
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
}

__device__ __forceinline__ void hb_mma8(float* d, const u32* a, const u32* b) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}


// The lane's A fragment (split) of a 16 x 8 tile whose element (m, k) is p[m * ms + k * ks].
__device__ __forceinline__ void hb_lda(const float* p, int ms, int ks, u32* h, u32* l) {
    const int g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3;
    hb_split(p[g * ms + c * ks], h[0], l[0]);
    hb_split(p[(g + 8) * ms + c * ks], h[1], l[1]);
    hb_split(p[g * ms + (c + 4) * ks], h[2], l[2]);
    hb_split(p[(g + 8) * ms + (c + 4) * ks], h[3], l[3]);
}

// The lane's B fragment (split) of an 8 x 8 tile whose element (k, n) is p[k * ks + n * ns].
__device__ __forceinline__ void hb_ldb(const float* p, int ks, int ns, u32* h, u32* l) {
    const int g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3;
    hb_split(p[c * ks + g * ns], h[0], l[0]);
    hb_split(p[(c + 4) * ks + g * ns], h[1], l[1]);
}

// d += A B over one k-step of 8 (3xTF32, the small terms first): A the lane's split fragment
// (hb_lda), B the 8 x 8 tile at p as hb_ldb reads it.
__device__ __forceinline__ void hb_mma3(float* d, const u32* ah, const u32* al, const float* p, int ks, int ns) {
    u32 bh[2], bl[2];
    hb_ldb(p, ks, ns, bh, bl);
    hb_mma8(d, al, bh);
    hb_mma8(d, ah, bl);
    hb_mma8(d, ah, bh);
}

// cp.async of 4 bytes global -> shared (the 16-byte one and the group fences are common.cuh's).
__device__ __forceinline__ void hb_cp4(float* dst, const float* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}

// A chunk's G (inclusive sums of the clamped log decays) and beta of value head h into shared
// memory, by warp 0 (lane l: rows 2l, 2l + 1; a scan of the pairs' sums) from the projections ab
// (hy_gdn_wy's header); rows past cn: log decay 0, beta 0.
__device__ __forceinline__ void hb_gates(const float* ab, int abs, const float* a_log, const float* dt_bias, int c0,
                                         int cn, int nv, int h, float* gg, float* bb) {
    const int l = threadIdx.x;
    if (l >= 32) return;
    float lg[2], bt[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int t = 2 * l + e;
        const float* row = ab + (size_t)(c0 + t) * abs;
        lg[e] = t < cn ? fmaxf(gdn_g(row[h], a_log[h], dt_bias[h]), -80.0f) : 0.0f;
        bt[e] = t < cn ? sigmoidf_(row[nv + h]) : 0.0f;
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

// hy_gdn_wy's share of the k k^T / q k^T tiles: warp quarter wq takes one or two segments
// (16-row tile mr, 8-column tiles nt0 .. nt0 + cnt - 1), 5 column tiles each quarter, covering
// the tiles on or left of the diagonal (column tile nt <= 2 mr + 1) of the four row tiles.
__device__ __forceinline__ void hb_wy_seg(int wq, int e, int& mr, int& nt0, int& cnt) {
    // (mr, nt0, cnt) per quarter and segment: {0 0 2, 3 0 3}, {3 3 5}, {1 0 4, 2 0 1}, {2 1 5}
    switch (wq * 2 + e) {
        case 0: mr = 0, nt0 = 0, cnt = 2; break;
        case 1: mr = 3, nt0 = 0, cnt = 3; break;
        case 2: mr = 3, nt0 = 3, cnt = 5; break;
        case 4: mr = 1, nt0 = 0, cnt = 4; break;
        case 5: mr = 2, nt0 = 0, cnt = 1; break;
        case 6: mr = 2, nt0 = 1, cnt = 5; break;
        default: mr = 0, nt0 = 0, cnt = 0;
    }
}

// acc[j] = (X Y^T) over the 16 x 8 tile at rows 16 mr, columns 8 (nt0 + j), j < cnt (X, Y [C][LDK]).
__device__ __forceinline__ void hb_wy_mm(const float* xs, const float* ys, int mr, int nt0, int cnt,
                                         float (*acc)[4]) {
#pragma unroll
    for (int j = 0; j < 5; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int k0 = 0; k0 < HB_D; k0 += 8) {
        u32 ah[4], al[4];
        hb_lda(xs + mr * 16 * HB_LDK + k0, HB_LDK, 1, ah, al);
#pragma unroll
        for (int j = 0; j < 5; ++j)
            if (j < cnt) hb_mma3(acc[j], ah, al, ys + (nt0 + j) * 8 * HB_LDK + k0, 1, HB_LDK);
    }
}

// hy_gdn_wy: per (chunk, value head) the state-free part of the chunked rule: G, P, W, U above.
//   Block (c, h): rows c0 = 64 c .. c0 + cn - 1. Warps 0-3 k k^T, warps 4-7 q k^T (tensor cores,
//   only the tiles on or left of the diagonal, hb_wy_seg); A into shared memory, P to global. Then
//   (I + A) X = R for R = [beta e^G k | beta v] (64 x 256, over k and q's space) in blocks of 16
//   rows b: X_b = (I + A_bb)^-1 (R_b - A_{b,<b} X_{<b}), warp w owning the columns 32 w .. + 31:
//   the product on the tensor cores, then lane l substitutes its column 32 w + l through the
//   block's 16 rows in registers (f32 FMAs). A warp reads only its own columns of X, so the solve
//   needs no block barrier.
// Pointers: cq [n][cdim] f32 (q | k | v as hy_gdn_conv32 writes them); ab f32, row stride abs
//   (a | b, the f32 gate projections, in the first 2 nv columns of each row); a_log, dt_bias [nv]
//   f32; out: g [nv][n] f32, w [nv][n][128] f32, u [nv][n][128] f32, p [nv][n][64] f32 (row t of
//   a chunk: P[t][s] for the chunk's s, 0 past t).
// Grid (ceil(n / 64), nv), block 256, dynamic shared memory HB_WY_SMEM (over 48 KiB: opt in).
// Assumes dk == dv == 128, nv % nk == 0, cdim % 4 == 0, 16-byte aligned buffers.
extern "C" __global__ void __launch_bounds__(256, 2)
    hy_gdn_wy(const float* cq, const float* ab, int abs, const float* a_log, const float* dt_bias, float* g, float* w,
              float* u, float* p, int n, int cdim, int nv, int nk) {
    extern __shared__ __align__(16) float hb_sm[];
    float* ks = hb_sm;
    float* qs = ks + HB_C * HB_LDK;
    float* rs = hb_sm;  // the right-hand sides, then X, once k and q are done with
    float* aa = qs + HB_C * HB_LDK;
    float* gg = aa + HB_C * HB_LDC;
    float* bb = gg + HB_C;
    const int tid = threadIdx.x, wid = tid >> 5, lane = tid & 31, lg = lane >> 2, lc = lane & 3;
    const int h = blockIdx.y, c0 = blockIdx.x * HB_C, cn = min(HB_C, n - c0);
    const int hk = h / (nv / nk);
    const float* qb = cq + hk * HB_D;
    const float* kb = cq + (size_t)nk * HB_D + hk * HB_D;
    const float* vb = cq + (size_t)2 * nk * HB_D + (size_t)h * HB_D;
    const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // k, q by cp.async and v into registers (the thread's rows x / 32 of x = tid + 256 m), all in
    // flight at once; v waits there until the right-hand sides
    float4 vr[HB_C * HB_D / 4 / 256];
#pragma unroll
    for (int m = 0; m < HB_C * HB_D / 4 / 256; ++m) {
        const int x = tid + 256 * m, t = x >> 5, i = (x & 31) * 4;
        const size_t row = (size_t)(c0 + t) * cdim + i;
        if (t < cn) {
            cp_async16(ks + t * HB_LDK + i, kb + row);
            cp_async16(qs + t * HB_LDK + i, qb + row);
            vr[m] = *(const float4*)(vb + row);
        } else {
            *(float4*)(ks + t * HB_LDK + i) = z4;
            *(float4*)(qs + t * HB_LDK + i) = z4;
            vr[m] = z4;
        }
    }
    cp_async_commit();
    hb_gates(ab, abs, a_log, dt_bias, c0, cn, nv, h, gg, bb);
    cp_async_wait<0>();
    __syncthreads();
    float* pr = p + ((size_t)h * n + c0) * HB_C;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        int mr, nt0, cnt;
        hb_wy_seg(wid & 3, e, mr, nt0, cnt);
        if (cnt == 0) continue;
        float acc[5][4];
        hb_wy_mm(wid < 4 ? ks : qs, ks, mr, nt0, cnt, acc);
#pragma unroll
        for (int j = 0; j < 5; ++j) {
            if (j >= cnt) continue;
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int t = 16 * mr + lg + 8 * (r >> 1), s = 8 * (nt0 + j) + 2 * lc + (r & 1);
                const float d = s <= t ? expf(gg[t] - gg[s]) : 0.0f;
                if (wid < 4)
                    aa[t * HB_LDC + s] = s < t ? bb[t] * d * acc[j][r] : 0.0f;
                else if (t < cn)
                    pr[(size_t)t * HB_C + s] = d * acc[j][r];
            }
        }
    }
    // P right of the computed tiles is 0
    for (int x = tid; x < HB_C * HB_C / 4; x += 256) {
        const int t = x >> 4, s = (x & 15) * 4;
        if (t < cn && s >= (t & ~15) + 16) *(float4*)(pr + (size_t)t * HB_C + s) = z4;
    }
    __syncthreads();
    // the right-hand sides over k and q: beta e^G k, beta v (k through registers: R overlaps it)
    float4 kr[HB_C * HB_D / 4 / 256];
#pragma unroll
    for (int m = 0; m < HB_C * HB_D / 4 / 256; ++m) {
        const int x = tid + 256 * m, t = x >> 5, i = (x & 31) * 4;
        kr[m] = *(const float4*)(ks + t * HB_LDK + i);
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < HB_C * HB_D / 4 / 256; ++m) {
        const int x = tid + 256 * m, t = x >> 5, i = (x & 31) * 4;
        const float f = bb[t] * expf(gg[t]), bt = bb[t];
        const float4 kv = kr[m], vv = vr[m];
        *(float4*)(rs + t * HB_LDR + i) = make_float4(f * kv.x, f * kv.y, f * kv.z, f * kv.w);
        *(float4*)(rs + t * HB_LDR + HB_D + i) = make_float4(bt * vv.x, bt * vv.y, bt * vv.z, bt * vv.w);
    }
    __syncthreads();
    float* xc = rs + 32 * wid;  // the warp's 32 columns
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        const int r0 = 16 * b;
        if (b > 0) {
            float acc[4][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
            for (int k0 = 0; k0 < r0; k0 += 8) {
                u32 ah[4], al[4];
                hb_lda(aa + r0 * HB_LDC + k0, HB_LDC, 1, ah, al);
#pragma unroll
                for (int j = 0; j < 4; ++j) hb_mma3(acc[j], ah, al, xc + k0 * HB_LDR + 8 * j, HB_LDR, 1);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    float2* d = (float2*)(xc + (r0 + lg + 8 * hh) * HB_LDR + 8 * j + 2 * lc);
                    const float2 v = *d;
                    *d = make_float2(v.x - acc[j][2 * hh], v.y - acc[j][2 * hh + 1]);
                }
            __syncwarp();
        }
        float xv[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) xv[r] = xc[(r0 + r) * HB_LDR + lane];
#pragma unroll
        for (int r = 1; r < 16; ++r) {
            const float* ar = aa + (r0 + r) * HB_LDC + r0;
#pragma unroll
            for (int s = 0; s < r; s += 4) {
                const float4 av = *(const float4*)(ar + s);
                xv[r] = fmaf(-av.x, xv[s], xv[r]);
                if (s + 1 < r) xv[r] = fmaf(-av.y, xv[s + 1], xv[r]);
                if (s + 2 < r) xv[r] = fmaf(-av.z, xv[s + 2], xv[r]);
                if (s + 3 < r) xv[r] = fmaf(-av.w, xv[s + 3], xv[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < 16; ++r) xc[(r0 + r) * HB_LDR + lane] = xv[r];
        __syncwarp();
    }
    __syncthreads();
    float* wo = w + ((size_t)h * n + c0) * HB_D;
    float* uo = u + ((size_t)h * n + c0) * HB_D;
    for (int x = tid; x < cn * HB_D / 4; x += 256) {
        const int t = x >> 5, i = (x & 31) * 4;
        *(float4*)(wo + t * HB_D + i) = *(const float4*)(rs + t * HB_LDR + i);
        *(float4*)(uo + t * HB_D + i) = *(const float4*)(rs + t * HB_LDR + HB_D + i);
    }
    if (tid < cn) g[(size_t)h * n + c0 + tid] = gg[tid];
}

// hy_gdn_chunk's first cp.async group of a chunk (rows c0 .. c0 + cn - 1): W and q [C][LDK], the
// block's U columns [C][LDU], G [C]; rows past cn zero by plain stores. Blocks of HB_CW warps.
__device__ __forceinline__ void hb_fetch_wq(const float* qr, const float* wr, const float* ur, const float* gr, int cn,
                                            int cdim, float* ws, float* qs, float* us, float* gs) {
    const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int m = 0; m < HB_C * HB_D / 4 / (32 * HB_CW); ++m) {
        const int x = threadIdx.x + 32 * HB_CW * m;
        const int t = x >> 5, i = (x & 31) * 4;
        if (t < cn) {
            cp_async16(ws + t * HB_LDK + i, wr + (size_t)t * HB_D + i);
            cp_async16(qs + t * HB_LDK + i, qr + (size_t)t * cdim + i);
        } else {
            *(float4*)(ws + t * HB_LDK + i) = z4;
            *(float4*)(qs + t * HB_LDK + i) = z4;
        }
    }
#pragma unroll
    for (int m = 0; m < HB_C * HB_JW / 4 / (32 * HB_CW); ++m) {
        const int x = threadIdx.x + 32 * HB_CW * m;
        const int t = x / (HB_JW / 4), j = (x % (HB_JW / 4)) * 4;
        if (t < cn)
            cp_async16(us + t * HB_LDU + j, ur + (size_t)t * HB_D + j);
        else
            *(float4*)(us + t * HB_LDU + j) = z4;
    }
    const int t = threadIdx.x;
    if (t < cn)
        hb_cp4(gs + t, gr + t);
    else if (t < HB_C)
        gs[t] = 0.0f;
}

// ... and its second: k [C][LDB], P [C][LDC] (of row t only the columns s < (t & ~7) + 8, all
// that step 2 reads; the rest of the row is left as it was).
__device__ __forceinline__ void hb_fetch_kp(const float* kr, const float* pr, int cn, int cdim, float* kt,
                                            float* pp) {
    const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int m = 0; m < HB_C * HB_D / 4 / (32 * HB_CW); ++m) {
        const int x = threadIdx.x + 32 * HB_CW * m;
        const int t = x >> 5, i = (x & 31) * 4;
        if (t < cn)
            cp_async16(kt + t * HB_LDB + i, kr + (size_t)t * cdim + i);
        else
            *(float4*)(kt + t * HB_LDB + i) = z4;
    }
#pragma unroll
    for (int m = 0; m < HB_C * HB_C / 4 / (32 * HB_CW); ++m) {
        const int x = threadIdx.x + 32 * HB_CW * m;
        const int t = x >> 4, s = (x & 15) * 4;
        if (s >= (t & ~7) + 8) continue;
        if (t < cn)
            cp_async16(pp + t * HB_LDC + s, pr + (size_t)t * HB_C + s);
        else
            *(float4*)(pp + t * HB_LDC + s) = z4;
    }
}

// hy_gdn_chunk: the state through the chunks in order, after hy_gdn_wy. Block b takes the value
// columns j0 = 32 (b % 4) .. + 31 of head b / 4, transposed so the value column is the products'
// row: warp (mt = w % 2, qw = w / 2) of HB_CW keeps S^T rows j = 16 mt .. + 15, columns
// i = HB_IW qw .. + HB_IW - 1 as its accumulators, and a copy of the slice S [128][LDJ] sits in
// shared memory. Per chunk:
//   1. X^T = S0^T W^T, Y^T = S0^T q^T for rows mt, columns t = HB_TW qw .. + HB_TW - 1; D = U - X
//      and D' = e^{G_last - G} D into shared memory ([t][LDJ]);
//   2. o^T = e^G Y^T + D^T P^T (only the steps s <= t of P's lower triangle) to o;
//   3. S^T = e^{G_last} S0^T + D'^T k on the warp's accumulators, then the copy.
// Two cp.async groups a chunk keep loads off the path: W, q, U, G of the next chunk stream in
// after step 1, k and P after step 3.
// Pointers: cq [n][cdim] f32 (q | k | v); g, w, u, p as hy_gdn_wy wrote them; S [nv][128][128] f32
// (in/out); o [n][nv * 128] f32 out.
// Grid (nv * 4, 1), block 32 HB_CW, dynamic shared memory HB_CHUNK_SMEM (over 48 KiB: opt in).
// Assumes dk == dv == 128, nv % nk == 0, cdim % 4 == 0, 16-byte aligned buffers.
extern "C" __global__ void __launch_bounds__(32 * HB_CW, 1)
    hy_gdn_chunk(const float* cq, const float* g, const float* w, const float* u, const float* p, float* S, float* o,
                 int n, int cdim, int nv, int nk) {
    extern __shared__ __align__(16) float hb_sm[];
    float* ws = hb_sm;
    float* qs = ws + HB_C * HB_LDK;
    float* kt = qs + HB_C * HB_LDK;
    float* pp = kt + HB_C * HB_LDB;
    float* us = pp + HB_C * HB_LDC;
    float* ss = us + HB_C * HB_LDU;
    float* dd = ss + HB_D * HB_LDJ;
    float* de = dd + HB_C * HB_LDJ;
    float* gs = de + HB_C * HB_LDJ;
    const int tid = threadIdx.x, wid = tid >> 5, lane = tid & 31, lg = lane >> 2, lc = lane & 3;
    const int mt = wid & 1, qw = wid >> 1;
    const int cpb = HB_D / HB_JW, h = blockIdx.x / cpb, j0 = (blockIdx.x % cpb) * HB_JW;
    const int hk = h / (nv / nk);
    float* sg = S + (size_t)h * HB_D * HB_D + j0;
    for (int x = tid; x < HB_D * HB_JW / 4; x += 32 * HB_CW) {
        const int i = x / (HB_JW / 4), j = (x % (HB_JW / 4)) * 4;
        *(float4*)(ss + i * HB_LDJ + j) = *(const float4*)(sg + (size_t)i * HB_D + j);
    }
    const float* qb = cq + hk * HB_D;
    const float* kb = cq + (size_t)nk * HB_D + hk * HB_D;
    const float* gh = g + (size_t)h * n;
    const float* wh = w + (size_t)h * n * HB_D;
    const float* uh = u + (size_t)h * n * HB_D + j0;
    const float* ph = p + (size_t)h * n * HB_C;
    hb_fetch_wq(qb, wh, uh, gh, min(HB_C, n), cdim, ws, qs, us, gs);
    cp_async_commit();
    hb_fetch_kp(kb, ph, min(HB_C, n), cdim, kt, pp);
    cp_async_commit();
    __syncthreads();
    // the warp's accumulators: sr[nt] is the tile (rows j = 16 mt, columns i = HB_IW qw + 8 nt)
    float sr[HB_IW / 8][4];
#pragma unroll
    for (int nt = 0; nt < HB_IW / 8; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r)
            sr[nt][r] = ss[(HB_IW * qw + 8 * nt + 2 * lc + (r & 1)) * HB_LDJ + 16 * mt + lg + 8 * (r >> 1)];
    for (int c0 = 0, it = 0; c0 < n; c0 += HB_C, ++it) {
        const int cn = min(HB_C, n - c0);
        const float* gc = gs + (it & 1) * HB_C;
        cp_async_wait<1>();  // this chunk's W, q, U, G
        __syncthreads();
        const float gl = gc[cn - 1];
        float xa[HB_TW / 8][4], ya[HB_TW / 8][4];
#pragma unroll
        for (int e = 0; e < HB_TW / 8; ++e)
#pragma unroll
            for (int r = 0; r < 4; ++r) xa[e][r] = ya[e][r] = 0.0f;
#pragma unroll 4
        for (int k0 = 0; k0 < HB_D; k0 += 8) {
            u32 ah[4], al[4];
            hb_lda(ss + k0 * HB_LDJ + 16 * mt, 1, HB_LDJ, ah, al);
#pragma unroll
            for (int e = 0; e < HB_TW / 8; ++e) {
                const int t0 = HB_TW * qw + 8 * e;
                hb_mma3(xa[e], ah, al, ws + t0 * HB_LDK + k0, 1, HB_LDK);
                hb_mma3(ya[e], ah, al, qs + t0 * HB_LDK + k0, 1, HB_LDK);
            }
        }
#pragma unroll
        for (int e = 0; e < HB_TW / 8; ++e)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int j = 16 * mt + lg + 8 * (r >> 1), t = HB_TW * qw + 8 * e + 2 * lc + (r & 1);
                const float d = us[t * HB_LDU + j] - xa[e][r];
                dd[t * HB_LDJ + j] = d;
                de[t * HB_LDJ + j] = expf(gl - gc[t]) * d;
                ya[e][r] *= expf(gc[t]);
            }
        __syncthreads();  // W, q, U read; D complete
        if (c0 + HB_C < n) {
            const int c1 = c0 + HB_C;
            hb_fetch_wq(qb + (size_t)c1 * cdim, wh + (size_t)c1 * HB_D, uh + (size_t)c1 * HB_D, gh + c1,
                        min(HB_C, n - c1), cdim, ws, qs, us, gs + ((it + 1) & 1) * HB_C);
        }
        cp_async_commit();
        cp_async_wait<1>();  // this chunk's k, P
        __syncthreads();
#pragma unroll
        for (int e = 0; e < HB_TW / 8; ++e) {
            const int t0 = HB_TW * qw + 8 * e;
            for (int k0 = 0; k0 <= t0; k0 += 8) {
                u32 ah[4], al[4];
                hb_lda(dd + k0 * HB_LDJ + 16 * mt, 1, HB_LDJ, ah, al);
                hb_mma3(ya[e], ah, al, pp + t0 * HB_LDC + k0, 1, HB_LDC);
            }
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int j = 16 * mt + lg + 8 * (r >> 1), t = t0 + 2 * lc + (r & 1);
                if (t < cn) o[(size_t)(c0 + t) * nv * HB_D + (size_t)h * HB_D + j0 + j] = ya[e][r];
            }
        }
        const float dl = expf(gl);
#pragma unroll
        for (int nt = 0; nt < HB_IW / 8; ++nt)
#pragma unroll
            for (int r = 0; r < 4; ++r) sr[nt][r] *= dl;
#pragma unroll 2
        for (int k0 = 0; k0 < HB_C; k0 += 8) {
            u32 ah[4], al[4];
            hb_lda(de + k0 * HB_LDJ + 16 * mt, 1, HB_LDJ, ah, al);
#pragma unroll
            for (int nt = 0; nt < HB_IW / 8; ++nt)
                hb_mma3(sr[nt], ah, al, kt + k0 * HB_LDB + HB_IW * qw + 8 * nt, HB_LDB, 1);
        }
#pragma unroll
        for (int nt = 0; nt < HB_IW / 8; ++nt)
#pragma unroll
            for (int r = 0; r < 4; ++r)
                ss[(HB_IW * qw + 8 * nt + 2 * lc + (r & 1)) * HB_LDJ + 16 * mt + lg + 8 * (r >> 1)] = sr[nt][r];
        __syncthreads();  // k, P, D read; the state copy complete
        if (c0 + HB_C < n) {
            const int c1 = c0 + HB_C;
            hb_fetch_kp(kb + (size_t)c1 * cdim, ph + (size_t)c1 * HB_C, min(HB_C, n - c1), cdim, kt, pp);
        }
        cp_async_commit();
    }
    for (int x = tid; x < HB_D * HB_JW / 4; x += 32 * HB_CW) {
        const int i = x / (HB_JW / 4), j = (x % (HB_JW / 4)) * 4;
        *(float4*)(sg + (size_t)i * HB_D + j) = *(const float4*)(ss + i * HB_LDJ + j);
    }
}
