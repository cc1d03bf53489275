// The prompt path's attention in one kernel (flash style: the scores never leave the chip), in
// place of the score GEMM, hy_softmax_h, the value GEMM and hy_attn_out a pass (hyb_big.cuh) when
// the head width allows (HD % 16 == 0, HD <= 256: the output accumulators are HD / 2 registers).
//
// Block (row block, KV group g): query rows r0 = 16 rb .. + 15 of the chunk's n rows, warp i the
// query head g * HPK + i over them (the HPK heads of a group share every K/V tile and, their rows
// being the same, the causal mask). Keys come HB_FK at a time from the f16 mirror (key k at
// position k), double-buffered by cp.async; per tile each warp takes
//   s = scale (q . k) (mma.sync m16n8k16, f16 in, f32 accumulate), masked to the keys its row
//   sees (positions <= p0 + r), a running max m (log2 domain), p = f16(2^(s log2e - m)), the row
//   sum of the rounded p and the output O rescaled by 2^(m_old - m_new), O += p V;
// at the end out[r][h][d] = f16(O / sum * (gate ? sigmoid(gate[r][h][d]) : 1)): hy_softmax_h then
// hy_attn_out's values up to where the running max moved (a rounding of p in f16 either way).
// Shared rows are HD + 8 halves apart, so the 8 rows an ldmatrix reads start 16 bytes apart (no
// bank conflicts).
#define HB_FQ 16
#define HB_FK 32
#define HB_FLD (HD + 8)
// Dynamic shared memory (bytes): Q [HPK][16][FLD], K and V [2][HB_FK][FLD] each.
#define HB_FLASH_SMEM ((HPK * HB_FQ + 4 * HB_FK) * HB_FLD * 2)
// Blocks an SM keeps (the accumulators need about 200 registers a thread).
#define HB_FMIN (HPK <= 4 ? 2 : 1)

// d += A B, A 16 x 16 f16 (row), B 16 x 8 f16 (col), f32 accumulate.
__device__ __forceinline__ void hb_mma16(float* d, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Keys [k0, k0 + HB_FK) of group g's K and V rows into the tile buffers; keys past nkeys zero (a
// row past the mirror's stored rows may hold anything, and p = 0 times a NaN is NaN).
__device__ __forceinline__ void hb_flash_kv(const f16* kp, const f16* vp, int kvs, int g, int k0, int nkeys, f16* kt,
                                            f16* vt) {
    for (int x = threadIdx.x; x < HB_FK * (HD / 8); x += blockDim.x) {
        const int t = x / (HD / 8), d = (x % (HD / 8)) * 8;
        f16* kd = kt + t * HB_FLD + d;
        f16* vd = vt + t * HB_FLD + d;
        if (k0 + t < nkeys) {
            const size_t at = (size_t)(k0 + t) * kvs + (size_t)g * HD + d;
            cp_async16(kd, kp + at);
            cp_async16(vd, vp + at);
        } else {
            *(uint4*)kd = make_uint4(0u, 0u, 0u, 0u);
            *(uint4*)vd = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

// hy_flash_h: the chunk's causal attention (header). Query row r of the chunk sits at position
// p0 + r and sees the mirror's keys 0 .. p0 + r.
// Pointers: q16 [n][nh][HD] f16 (rotated queries, hy_qk's q16); kp, vp the f16 mirrors
// [rows][nkv][HD] (holding rows 0 .. p0 + n - 1); gate [n][nh][HD] f32 (raw, hy_qk's) or 0;
// out [n][nh][HD] f16, 16-byte aligned. nh = nkv * HPK.
// Grid (ceil(n / 16), nkv), block 32 HPK, dynamic shared memory HB_FLASH_SMEM (opt in).
extern "C" __global__ void __launch_bounds__(32 * HPK, HB_FMIN)
    hy_flash_h(const f16* q16, const f16* kp, const f16* vp, const float* gate, f16* out, int n, int p0, int nkv,
               float scale) {
    extern __shared__ __align__(16) f16 hb_fsm[];
    f16* qs = hb_fsm;
    f16* ks = qs + HPK * HB_FQ * HB_FLD;
    f16* vs = ks + 2 * HB_FK * HB_FLD;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, lg = lane >> 2, lc = lane & 3;
    // the row blocks with the most keys first (the grid's tail then has the short ones)
    const int r0 = (gridDim.x - 1 - blockIdx.x) * HB_FQ, g = blockIdx.y, nh = nkv * HPK, kvs = nkv * HD;
    const int rn = min(HB_FQ, n - r0), nkeys = p0 + r0 + rn, ntile = (nkeys + HB_FK - 1) / HB_FK;
    for (int x = threadIdx.x; x < HB_FQ * HPK * (HD / 8); x += blockDim.x) {
        const int t = x / (HPK * (HD / 8)), i = (x / (HD / 8)) % HPK, d = (x % (HD / 8)) * 8;
        f16* qd = qs + (i * HB_FQ + t) * HB_FLD + d;
        if (t < rn)
            cp_async16(qd, q16 + ((size_t)(r0 + t) * nh + (size_t)g * HPK + i) * HD + d);
        else
            *(uint4*)qd = make_uint4(0u, 0u, 0u, 0u);
    }
    hb_flash_kv(kp, vp, kvs, g, 0, nkeys, ks, vs);
    cp_async_commit();
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mx[2] = {__int_as_float(0xff800000), __int_as_float(0xff800000)}, ls[2] = {0.0f, 0.0f};
    const float sl = scale * 1.4426950408889634f;
    const int pos[2] = {p0 + r0 + lg, p0 + r0 + lg + 8};
    const f16* qw = qs + wid * HB_FQ * HB_FLD + (lane & 15) * HB_FLD + (lane >> 4) * 8;
    for (int it = 0; it < ntile; ++it) {
        if (it + 1 < ntile)
            hb_flash_kv(kp, vp, kvs, g, (it + 1) * HB_FK, nkeys, ks + ((it + 1) & 1) * HB_FK * HB_FLD,
                        vs + ((it + 1) & 1) * HB_FK * HB_FLD);
        cp_async_commit();
        cp_async_wait<1>();  // this tile (and the queries)
        __syncthreads();
        const f16* kt = ks + (it & 1) * HB_FK * HB_FLD;
        const f16* vt = vs + (it & 1) * HB_FK * HB_FLD;
        float s[HB_FK / 8][4];
#pragma unroll
        for (int j = 0; j < HB_FK / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < HD; k0 += 16) {
            u32 a[4];
            ldsm4(a, qw + k0);
#pragma unroll
            for (int j = 0; j < HB_FK / 8; j += 2) {
                u32 b[4];
                ldsm4(b, kt + (8 * j + (lane & 7) + (lane >> 4) * 8) * HB_FLD + k0 + ((lane >> 3) & 1) * 8);
                hb_mma16(s[j], a, b[0], b[1]);
                hb_mma16(s[j + 1], a, b[2], b[3]);
            }
        }
        // the causal mask only where a key of the tile passes the block's first row
        const int kb = it * HB_FK;
        const bool edge = kb + HB_FK - 1 > p0 + r0;
        float tm[2] = {__int_as_float(0xff800000), __int_as_float(0xff800000)};
#pragma unroll
        for (int j = 0; j < HB_FK / 8; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                float v = s[j][r] * sl;
                if (edge && kb + 8 * j + 2 * lc + (r & 1) > pos[r >> 1]) v = __int_as_float(0xff800000);
                s[j][r] = v;
                tm[r >> 1] = fmaxf(tm[r >> 1], v);
            }
        float al[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            tm[e] = fmaxf(tm[e], __shfl_xor_sync(0xffffffffu, tm[e], 1));
            tm[e] = fmaxf(tm[e], __shfl_xor_sync(0xffffffffu, tm[e], 2));
            const float mn = fmaxf(mx[e], tm[e]);
            al[e] = exp2f(mx[e] - mn);
            mx[e] = mn;
            ls[e] *= al[e];
        }
#pragma unroll
        for (int j = 0; j < HD / 8; ++j) {
            o[j][0] *= al[0];
            o[j][1] *= al[0];
            o[j][2] *= al[1];
            o[j][3] *= al[1];
        }
        u32 pa[HB_FK / 8][2];
#pragma unroll
        for (int j = 0; j < HB_FK / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const u16 h0 = f32_to_f16(exp2f(s[j][2 * e] - mx[e]));
                const u16 h1 = f32_to_f16(exp2f(s[j][2 * e + 1] - mx[e]));
                ls[e] += f16_to_f32(h0) + f16_to_f32(h1);
                pa[j][e] = pack2(h0, h1);
            }
#pragma unroll
        for (int kk = 0; kk < HB_FK / 16; ++kk) {
            const u32 a[4] = {pa[2 * kk][0], pa[2 * kk][1], pa[2 * kk + 1][0], pa[2 * kk + 1][1]};
#pragma unroll
            for (int j = 0; j < HD / 8; j += 2) {
                u32 b[4];
                ldsm4t(b, vt + (16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * HB_FLD + 8 * j + (lane >> 4) * 8);
                hb_mma16(o[j], a, b[0], b[1]);
                hb_mma16(o[j + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();  // this tile's buffers are the load's two tiles on
    }
    const int h = g * HPK + wid;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        ls[e] += __shfl_xor_sync(0xffffffffu, ls[e], 1);
        ls[e] += __shfl_xor_sync(0xffffffffu, ls[e], 2);
        const int t = lg + 8 * e;
        if (t >= rn) continue;
        const float inv = 1.0f / ls[e];
        const size_t row = ((size_t)(r0 + t) * nh + h) * HD;
#pragma unroll
        for (int j = 0; j < HD / 8; ++j) {
            const int d = 8 * j + 2 * lc;
            float y0 = o[j][2 * e] * inv, y1 = o[j][2 * e + 1] * inv;
            if (gate) {
                const float2 gv = *(const float2*)(gate + row + d);
                y0 = y0 * sigmoidf_(gv.x);
                y1 = y1 * sigmoidf_(gv.y);
            }
            *(u32*)(out + row + d) = hb_h2(y0, y1);
        }
    }
}
