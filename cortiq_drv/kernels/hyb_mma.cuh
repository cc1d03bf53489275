// The small path's weight side (the reference's hy_repack, hy_mmp_{NT}_{TB}_{KS}, hy_split,
// hy_rmsnorm2): q4tp weights in the mma.sync m16n8k16 A-fragment layout, multiplied on the tensor
// cores by activations given as three bf16 planes of each f32 value.
//
// Repacked q4tp matrix of `rows` logical rows, ntile = ceil(rows / 16), gpr = cols / 32:
//   tiles  u32 [ntile][gpr][32 lanes][2]  word s of lane l = (gid, tig) = (l >> 2, l & 3) holds the
//          A registers a_0..a_3 of k-step s (columns 16s..16s+15 of the group): a_m is row
//          gid + 8 (m & 1), columns 16s + 2 tig + 8 (m >> 1) and the next one; its low nibble
//          (first column) at bits 4m, its high nibble at bits 4m + 16. Missing rows: nibble 8.
//   codes  u8  [ntile][gpr][16]           rung code of (row, group); missing rows 0.
//   lad    f32 [rows][2]                   the row's (lo, step): rung c = exp2f(lo + c * step).
// Weight = (nibble - 8) * rung. A gate/up pair repacks 2 * inter rows whose tile t holds gate rows
// 8t..8t+7 then the same up rows.
//
// Planes: x [n][stride] f32 as three bf16 planes p0, p1, p2 (put3: hi = bf16(x), mid =
// bf16(x - hi), lo = bf16(x - hi - mid)); hi + mid + lo == x except below bf16's normal range.

// One f32 into the three planes at element i.
__device__ __forceinline__ void put3(bf16* p0, bf16* p1, bf16* p2, size_t i, float y) {
    const bf16 hi = f32_to_bf16(y);
    const float r = y - bf16_to_f32(hi);
    const bf16 mid = f32_to_bf16(r);
    p0[i] = hi;
    p1[i] = mid;
    p2[i] = f32_to_bf16(r - bf16_to_f32(mid));
}

// One matrix of an hy_mmp launch (the reference's `struct HyJob`, 56 bytes).
//   w     the repacked tiles; aux0 its codes; aux1 its ladders (lo, step) per row
//   y     output: f32 [n][ystride] (kind 6), or the pair's bf16 plane hi [n][ystride] (kind 0x106)
//   res   residual f32 [n][ystride] added to the output (0: none; may equal y), or the pair's
//         second bf16 plane
//   rows  logical rows; kind 6 (q4tp) or 6 | 0x100 (gate/up pair); blk0 the job's first block
struct HyJob {
    u64 w;
    u64 aux0;
    u64 aux1;
    u64 y;
    u64 res;
    int rows;
    int kind;
    int blk0;
    int ystride;
};

#define HY_PAIR 0x100

// q4tp rows to the tensor-core layout, one thread per (tile, group, lane) of the output.
//   na, nb   nibble planes u8 [src_rows][gpr][16] of payloads A and B (B = A unless a pair)
//   ca, cb   code planes u8 [src_rows][stride] (5-bit codes, LSB first; FORMAT.md)
//   pair     0: logical row r is row r of A; 1: r is row (r >> 4) * 8 + (r & 7) of A (gate) when
//            (r & 15) < 8, of B (up) otherwise
//   t_out    u32 [ntile][gpr][32][2]; cc_out u8 [ntile][gpr][16] (layouts above)
// Grid ceil(ntile * gpr * 32 / 256), block 256. Assumes cols % 32 == 0 and the nibble planes
// 16-byte aligned; rows of a pair a multiple of 16.
__device__ __forceinline__ const unsigned char* hy_row_src(const unsigned char* a, const unsigned char* b,
                                                          int pair, int r, size_t bytes) {
    if (!pair) return a + (size_t)r * bytes;
    const int sr = (r >> 4) * 8 + (r & 7);
    return ((r & 15) >= 8 ? b : a) + (size_t)sr * bytes;
}

extern "C" __global__ void hy_repack(const unsigned char* na, const unsigned char* ca, const unsigned char* nb,
                                     const unsigned char* cb, int stride, int pair, u32* t_out,
                                     unsigned char* cc_out, int rows, int cols) {
    const int gpr = cols >> 5;
    const int ntile = (rows + 15) >> 4;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)ntile * gpr * 32) return;
    const int l = (int)(idx & 31), gid = l >> 2, tig = l & 3;
    const size_t tg = idx >> 5;
    const int tile = (int)(tg / gpr), g = (int)(tg % gpr);
    // the group's four words of rows gid and gid + 8 of the tile
    u32 w[2][4];
    for (int h = 0; h < 2; ++h) {
        const int r = tile * 16 + gid + 8 * h;
        if (r < rows) {
            const uint4 v = *(const uint4*)(hy_row_src(na, nb, pair, r, (size_t)gpr * 16) + (size_t)g * 16);
            w[h][0] = v.x, w[h][1] = v.y, w[h][2] = v.z, w[h][3] = v.w;
        } else {
            w[h][0] = w[h][1] = w[h][2] = w[h][3] = 0x88888888u;
        }
    }
    for (int s = 0; s < 2; ++s) {
        u32 x = 0;
        for (int m = 0; m < 4; ++m) {
            const u32 byte = (w[m & 1][2 * s + (m >> 1)] >> (8 * tig)) & 0xFFu;
            x |= (byte & 0xFu) << (4 * m);
            x |= (byte >> 4) << (4 * m + 16);
        }
        t_out[idx * 2 + s] = x;
    }
    if (l < 16) {
        const int r = tile * 16 + l;
        u32 code = 0;
        if (r < rows) {
            const unsigned char* cr = hy_row_src(ca, cb, pair, r, (size_t)stride);
            const int b = (5 * g) >> 3, sh = (5 * g) & 7;
            u32 v = cr[b];
            if (sh > 3) v |= (u32)cr[b + 1] << 8;
            code = (v >> sh) & 31u;
        }
        cc_out[tg * 16 + l] = (unsigned char)code;
    }
}

// Two nibbles (bits 0-3 and 16-19 of v) as the bf16 pair (n_lo - 8, n_hi - 8), exact: one lop3
// makes the nibble the mantissa of 128 + n (mask and magic in registers, so it stays one
// instruction), then fma(x, 1, -136).
__device__ __forceinline__ u32 hy_nib2(u32 v, u32 mask, u32 magic, u32 one, u32 m136) {
    u32 h, r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(h) : "r"(v), "r"(mask), "r"(magic));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(h), "r"(one), "r"(m136));
    return r;
}

// d += A (16x16 bf16, row) * B (16x8 bf16, col), f32 accumulate.
__device__ __forceinline__ void hy_mma(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared without registers (cp.async, L1 bypassed), and its group fences.
__device__ __forceinline__ void hy_cp16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void hy_cp16_if(bool p, u32 dst, const void* src) {
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %2, 0; @q cp.async.cg.shared.global [%0], [%1], 16; }" ::"r"(dst),
                 "l"(src), "r"((int)p)
                 : "memory");
}
__device__ __forceinline__ void hy_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void hy_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// An item's outputs from out_s (see hy_mmp): rows r < n of the item's tiles, per the job's kind.
template <int NC, int TB, int KS>
__device__ __forceinline__ void hy_epilogue(const HyJob& jb, int tile0, int nvt, const float (*out_s)[16][8 * NC],
                                            int n) {
    const bool pair = (jb.kind & HY_PAIR) != 0;
    const int per = pair ? 8 : 16;
    for (int k = threadIdx.x; k < n * TB * per; k += KS * 32) {
        const int r = k / (TB * per), t = (k / per) % TB, i = k % per;
        if (t >= nvt) continue;
        const float v = (out_s[t][i][3 * r] + out_s[t][i][3 * r + 1]) + out_s[t][i][3 * r + 2];
        if (pair) {
            const int o = (tile0 + t) * 8 + i;
            if (2 * o >= jb.rows) continue;
            const float u = (out_s[t][i + 8][3 * r] + out_s[t][i + 8][3 * r + 1]) + out_s[t][i + 8][3 * r + 2];
            const float a = siluf_(v) * u;
            const bf16 hi = f32_to_bf16(a);
            ((bf16*)jb.y)[(size_t)r * jb.ystride + o] = hi;
            ((bf16*)jb.res)[(size_t)r * jb.ystride + o] = f32_to_bf16((a - bf16_to_f32(hi)) * 0.5f);
        } else {
            const int row = (tile0 + t) * 16 + i;
            if (row >= jb.rows) continue;
            const size_t at = (size_t)r * jb.ystride + row;
            ((float*)jb.y)[at] = jb.res ? ((const float*)jb.res)[at] + v : v;
        }
    }
}

// Stages of each warp's ring (a power of two): S * 1088 bytes of dynamic shared memory a warp.
#define HY_STAGES 8
#define HY_STAGE 1088

// The shared tables of an hy_mmp block (see hy_mmp).
template <int NC, int TB, int KS>
struct HySmem {
    float lad[TB][16][33];
    __align__(16) float red[KS][TB][128];
    float out[TB][16][8 * NC];
};

// A group's B fragments of each n-tile (k-step 0: b0, b1; k-step 1: b0, b1), from this lane's
// column pointers advanced to the group (see hy_mmp_run); none when !ok.
template <int NTC>
__device__ __forceinline__ void hy_ldb(u32 (*b)[4], const u32* const* bq, int off, bool ok) {
#pragma unroll
    for (int j = 0; j < NTC; ++j) {
        if (ok) {
            const u32* src = bq[j] + off;
            b[j][0] = __ldg(src), b[j][1] = __ldg(src + 4), b[j][2] = __ldg(src + 8), b[j][3] = __ldg(src + 12);
        }
    }
}

// hy_mmp's work for calls whose columns fill NTC n-tiles (NTC = ceil(3 n / 8)); see hy_mmp.
template <int NC, int NTC, int TB, int KS>
__device__ __forceinline__ void hy_mmp_run(const HyJob* jobs, int nj, const bf16* p0, const bf16* p1,
                                           const bf16* p2, int xs, int n, int cols, int total,
                                           HySmem<NC, TB, KS>& sm) {
    // GS groups a stage (4 units: 2 groups of both tiles, or 4 groups of one tile)
    constexpr int GS = 4 / TB, S = HY_STAGES, STAGE = HY_STAGE;
    constexpr int LE = TB * 512 / (KS * 32);
    // the next group's B fragments held in registers while this one computes, where they fit
    constexpr bool PF = NTC <= 3;
    static_assert((S & (S - 1)) == 0 && S >= 4, "ring stages: a power of two >= 4");
    extern __shared__ __align__(16) unsigned char hy_ring[];
    int bi = blockIdx.x;
    const int gpr = cols >> 5;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gid = lane >> 2;
    const int g_lo = w * gpr / KS, g_hi = (w + 1) * gpr / KS, ng = g_hi - g_lo, nst = (ng + GS - 1) / GS;
    const u32 ring = (u32)__cvta_generic_to_shared(hy_ring) + w * S * STAGE;
    const unsigned char* ringp = hy_ring + w * S * STAGE;
    const u32 k_mask = 0x000F000Fu, k_magic = 0x43004300u, k_one = 0x3F803F80u, k_m136 = 0xC308C308u;
    // this lane's B column in each n-tile, at the warp's first group: plane q % 3 of row q / 3
    // (rows past n: row 0, read, unused)
    const u32* bq[NTC];
#pragma unroll
    for (int j = 0; j < NTC; ++j) {
        const int q = 8 * j + gid, r = q / 3, p = q - 3 * r;
        const bf16* base = p == 0 ? p0 : (p == 1 ? p1 : p2);
        bq[j] = (const u32*)(base + (size_t)(r < n ? r : 0) * xs + (size_t)g_lo * 32 + 2 * (lane & 3));
    }
    const float* lrow = &sm.lad[0][gid][0];
    // the item being fetched: its job, tiles, this lane's copy sources and the rows left from its
    // first tile. Stage i holds units u = 0..3 (256 weight bytes each, then their 16 code bytes):
    // TB 2: tile u & 1 of group g_lo + 2 i + (u >> 1); TB 1: group g_lo + 4 i + u. Lane l copies
    // chunk l and l + 32 of the weights (unit c >> 4, bytes (c & 15) 16), lanes 0-3 unit l's codes.
    int ji = 0, tile0 = 0, nvt = 0, rleft = 0;
    const unsigned char* wl = 0;
    const unsigned char* cl = 0;
    const float* lsrc = 0;
    auto locate = [&](int b) {
        while (ji + 1 < nj && jobs[ji + 1].blk0 <= b) ++ji;
        const int rows = jobs[ji].rows;
        tile0 = (b - jobs[ji].blk0) * TB;
        nvt = min(TB, ((rows + 15) >> 4) - tile0);
        rleft = rows - tile0 * 16;
        const size_t uw = lane >> 4, uc = lane & 3;
        wl = (const unsigned char*)jobs[ji].w +
             ((size_t)tile0 * gpr + (TB == 2 ? uw * gpr : uw) + g_lo) * 256 + (lane & 15) * 16;
        cl = (const unsigned char*)jobs[ji].aux0 +
             ((size_t)tile0 * gpr + (TB == 2 ? (uc & 1) * gpr + (uc >> 1) : uc) + g_lo) * 16;
        lsrc = (const float*)jobs[ji].aux1 + (size_t)tile0 * 32;
    };
    // stage i's copies into slot i % S; every lane commits a group, copies or not, so the counts
    // stay uniform
    auto issue = [&](int i) {
        const u32 slot = ring + (i & (S - 1)) * STAGE;
        const int uw = lane >> 4;
        bool ok0, ok1, okc;
        if (TB == 2) {
            ok0 = uw < nvt && 2 * i < ng;
            ok1 = uw < nvt && 2 * i + 1 < ng;
            okc = lane < 4 && (lane & 1) < nvt && 2 * i + (lane >> 1) < ng;
        } else {
            ok0 = 4 * i + uw < ng;
            ok1 = 4 * i + 2 + uw < ng;
            okc = lane < 4 && 4 * i + lane < ng;
        }
        const unsigned char* src = wl + (size_t)i * (GS * 256);
        hy_cp16_if(ok0, slot + lane * 16, src);
        hy_cp16_if(ok1, slot + 512 + lane * 16, src + (TB == 2 ? 256 : 512));
        hy_cp16_if(okc, slot + 1024 + (lane & 3) * 16, cl + (size_t)i * (GS * 16));
        hy_cp_commit();
    };
    // the item's ladder table: this thread's entries k = tid + e KS 32 of lad (row params
    // fetched early into lo_r / st_r, rungs made later); rows past the matrix get rung 0
    float lo_r[LE], st_r[LE];
    auto lad_load = [&]() {
#pragma unroll
        for (int e = 0; e < LE; ++e) {
            const int k = tid + e * KS * 32, r = (k >> 9) * 16 + ((k >> 5) & 15);
            const bool ok = r < rleft;
            lo_r[e] = ok ? lsrc[2 * r] : -__int_as_float(0x7f800000);
            st_r[e] = ok ? lsrc[2 * r + 1] : 0.0f;
        }
    };
    auto lad_store = [&]() {
#pragma unroll
        for (int e = 0; e < LE; ++e) {
            const int k = tid + e * KS * 32, c = k & 31;
            sm.lad[k >> 9][(k >> 5) & 15][c] = exp2f(__fadd_rn(lo_r[e], __fmul_rn((float)c, st_r[e])));
        }
    };
    locate(bi);
    for (int i = 0; i < S - 1; ++i) issue(i);
    lad_load();
    lad_store();
    __syncthreads();
    for (;;) {
        float acc[TB][NTC][4];
#pragma unroll
        for (int t = 0; t < TB; ++t)
#pragma unroll
            for (int j = 0; j < NTC; ++j) acc[t][j][0] = acc[t][j][1] = acc[t][j][2] = acc[t][j][3] = 0.0f;
        // B fragments of group gr in bb[gr & 1] (GS is even, so the parity is gu's)
        u32 bb[2][NTC][4];
        if (PF) hy_ldb<NTC>(bb[0], bq, 0, ng > 0);
        for (int i = 0; i < nst; ++i) {
            // this lane's copies of stage i done, then every lane's (and every lane is past
            // stage i - 1, whose slot the next issue refills)
            hy_cp_wait<S - 2>();
            __syncwarp();
            issue(i + S - 1);
            const unsigned char* st = ringp + (i & (S - 1)) * STAGE;
#pragma unroll
            for (int gu = 0; gu < GS; ++gu) {
                const int gr = i * GS + gu;  // the group, from g_lo
                if (gr >= ng) break;
                u32 (*bc)[4] = bb[gu & 1];
                if (PF)
                    hy_ldb<NTC>(bb[(gu + 1) & 1], bq, (gr + 1) * 16, gr + 1 < ng);
                else
                    hy_ldb<NTC>(bc, bq, gr * 16, true);
                // both tiles of the group (TB 2; a tile past the matrix computes stale ring
                // bytes, its codes < 256 indexing inside sm, into sums never stored), or the one
                // tile
#pragma unroll
                for (int t = 0; t < TB; ++t) {
                    const int u = TB == 2 ? 2 * gu + t : gu;
                    const uint2 wv = *(const uint2*)(st + u * 256 + lane * 8);
                    const float rl = lrow[t * 16 * 33 + st[1024 + u * 16 + gid]];
                    const float rh = lrow[t * 16 * 33 + 8 * 33 + st[1024 + u * 16 + gid + 8]];
                    const u32 x1 = wv.x >> 4, x2 = wv.x >> 8, x3 = wv.x >> 12;
                    const u32 y1 = wv.y >> 4, y2 = wv.y >> 8, y3 = wv.y >> 12;
                    const u32 a00 = hy_nib2(wv.x, k_mask, k_magic, k_one, k_m136);
                    const u32 a01 = hy_nib2(x1, k_mask, k_magic, k_one, k_m136);
                    const u32 a02 = hy_nib2(x2, k_mask, k_magic, k_one, k_m136);
                    const u32 a03 = hy_nib2(x3, k_mask, k_magic, k_one, k_m136);
                    const u32 a10 = hy_nib2(wv.y, k_mask, k_magic, k_one, k_m136);
                    const u32 a11 = hy_nib2(y1, k_mask, k_magic, k_one, k_m136);
                    const u32 a12 = hy_nib2(y2, k_mask, k_magic, k_one, k_m136);
                    const u32 a13 = hy_nib2(y3, k_mask, k_magic, k_one, k_m136);
#pragma unroll
                    for (int j = 0; j < NTC; ++j) {
                        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        hy_mma(s, a00, a01, a02, a03, bc[j][0], bc[j][1]);
                        hy_mma(s, a10, a11, a12, a13, bc[j][2], bc[j][3]);
                        acc[t][j][0] = fmaf(rl, s[0], acc[t][j][0]);
                        acc[t][j][1] = fmaf(rl, s[1], acc[t][j][1]);
                        acc[t][j][2] = fmaf(rh, s[2], acc[t][j][2]);
                        acc[t][j][3] = fmaf(rh, s[3], acc[t][j][3]);
                    }
                }
            }
        }
        // this item's outputs; then the next item's first stages and ladders go out before the
        // reduction, so its memory latency hides behind it (every lane past its last stage first:
        // the refill reuses the slots)
        __syncwarp();
        const int oji = ji, otile0 = tile0, onvt = nvt;
        const int bn = bi + (int)gridDim.x;
        if (bn < total) {
            locate(bn);
            for (int i = 0; i < S - 1; ++i) issue(i);
            lad_load();
        }
        // the warps' sums, one n-tile at a time, added in warp order into out[t][row][column]
#pragma unroll
        for (int j = 0; j < NTC; ++j) {
#pragma unroll
            for (int t = 0; t < TB; ++t)
                *(float4*)&sm.red[w][t][lane * 4] = make_float4(acc[t][j][0], acc[t][j][1], acc[t][j][2], acc[t][j][3]);
            __syncthreads();
            if (tid < TB * 128) {
                const int t = tid >> 7, f = tid & 127;
                float s = sm.red[0][t][f];
                for (int v = 1; v < KS; ++v) s += sm.red[v][t][f];
                const int fl = f >> 2, e = f & 3;
                sm.out[t][(fl >> 2) + 8 * (e >> 1)][8 * j + 2 * (fl & 3) + (e & 1)] = s;
            }
            __syncthreads();
        }
        hy_epilogue<NC, TB, KS>(jobs[oji], otile0, onvt, sm.out, n);
        if (bn >= total) break;
        lad_store();
        __syncthreads();
        bi = bn;
    }
}

// hy_mmp_{NT}_{TB}_{KS}: every job's y [n][ystride] = W x for the n rows given as planes.
//   Math: column q = 3 r + p of the B operand is plane p of row r, so one mma gives the three
//   planes' partial sums of up to 8/3 rows; per (row, group) the two k-steps' sums are scaled by
//   the rung (fmaf into the running sum, groups in order); the KS warps' sums are added in warp
//   order, then y = (sum_hi + sum_mid) + sum_lo. Nothing depends on n but which columns are read,
//   nor on TB or the grid: a row's outputs are bit for bit the same in any call with the same KS.
//   The code is specialised on the n-tiles the call fills (ceil(3 n / 8)), so a one-row call does
//   one n-tile's mma and scaling only.
//   jobs  HyJob [nj] (blk0 ascending, the first 0); p0, p1, p2 bf16 [n][xs]; cols the input width.
//   Epilogues: kind 6: y = W x, or res + W x when res != 0; kind 6 | 0x100 (a pair): o =
//   silu(gate) * up of pair row 8 tile + i, written as bf16 hi = bf16(o) into y and
//   bf16((o - hi) / 2) into res, so the planes (y, res, res) sum to hi + bf16(o - hi).
//   Work: item b (the jobs' blocks: ceil(ceil(rows / 16) / TB) each, from blk0) is TB tiles of one
//   job; block k of the grid (any size) takes items k, k + gridDim.x, ... Warp w takes groups
//   [w gpr / KS, (w + 1) gpr / KS) of the item's tiles and streams them through its own ring of
//   HY_STAGES stages (cp.async), a stage being four (tile, group) units of 256 weight bytes + 16
//   code bytes: both tiles of two groups (TB 2) or four groups of the tile (TB 1); each group's B
//   fragments are loaded (__ldg) while the group before it computes (up to 3 n-tiles). The next item's first stages and ladders are
//   fetched while this one's sums are reduced.
//   Launch: block 32 * KS threads, dynamic shared memory KS * HY_STAGES * HY_STAGE bytes (traps
//   when given less). Assumes n <= 8 NT, cols % 32 == 0, xs even, 4-byte aligned planes, 16-byte
//   aligned tiles and codes (mat_planes aligns them to 256).
template <int NT, int TB, int KS>
__device__ __forceinline__ void hy_mmp(const HyJob* jobs, int nj, const bf16* p0, const bf16* p1,
                                       const bf16* p2, int xs, int n, int cols) {
    constexpr int NC = 3 * NT;
    __shared__ HySmem<NC, TB, KS> sm;
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (u32)(KS * HY_STAGES * HY_STAGE)) asm volatile("trap;");
    const HyJob& last = jobs[nj - 1];
    const int total = last.blk0 + (((last.rows + 15) >> 4) + TB - 1) / TB;
    if ((int)blockIdx.x >= total) return;
    switch ((3 * n + 7) >> 3) {
    case 1: hy_mmp_run<NC, 1, TB, KS>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
    case 2: hy_mmp_run<NC, 2, TB, KS>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
    case 3: hy_mmp_run<NC, 3, TB, KS>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
    default:
        if (NT == 2) {
            switch ((3 * n + 7) >> 3) {
            case 4: hy_mmp_run<NC, (NT == 2 ? 4 : 1), TB, KS>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
            case 5: hy_mmp_run<NC, (NT == 2 ? 5 : 1), TB, KS>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
            default: hy_mmp_run<NC, (NT == 2 ? 6 : 1), TB, KS>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
            }
        }
    }
}

// Blocks an SM should fit of each (NT, KS): caps the registers (ptxas -v reports them).
#ifndef HY_MB_1_8
#define HY_MB_1_8 2
#endif
#ifndef HY_MB_1_16
#define HY_MB_1_16 1
#endif
#ifndef HY_MB_2_8
#define HY_MB_2_8 2
#endif
#ifndef HY_MB_2_16
#define HY_MB_2_16 1
#endif

#define HY_MMP(NT, TB, KS)                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * KS, HY_MB_##NT##_##KS) hy_mmp_##NT##_##TB##_##KS(  \
        const HyJob* jobs, int nj, const bf16* p0, const bf16* p1, const bf16* p2, int xs, int n, int cols) { \
        hy_mmp<NT, TB, KS>(jobs, nj, p0, p1, p2, xs, n, cols);                                          \
    }
HY_MMP(1, 1, 8)
HY_MMP(1, 1, 16)
HY_MMP(1, 2, 8)
HY_MMP(1, 2, 16)
HY_MMP(2, 1, 8)
HY_MMP(2, 1, 16)
HY_MMP(2, 2, 8)
HY_MMP(2, 2, 16)

// hy_split: x [n][xs] f32, its first `cols` columns, into the planes p0, p1, p2 [n][os] bf16 (put3).
// Grid ceil(n * cols / 256), block 256.
extern "C" __global__ void hy_split(const float* x, int xs, int cols, bf16* p0, bf16* p1, bf16* p2, int os, int n) {
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)n * cols) return;
    const int r = (int)(k / cols), c = (int)(k % cols);
    put3(p0, p1, p2, (size_t)r * os + c, x[(size_t)r * xs + c]);
}

// hy_rmsnorm2: row r = blockIdx.y of x [n][hidden] f32 normalised,
//   y = x / sqrt(mean(x^2) + eps) * (gemma ? 1 + w : w), w [hidden] f32,
// written to the planes p0, p1, p2 [n][ps] bf16 (put3) and, when xf != 0, to xf [n][hidden] f32.
// Grid (ceil(hidden / 1024), n), block 256: each block sums the whole row (thread t over columns
// t, t + 256, ..., then warp butterflies, then warps in order: the same sum in every block and
// call) and writes columns [1024 blockIdx.x, 1024 blockIdx.x + 1024).
extern "C" __global__ void hy_rmsnorm2(const float* x, const float* w, float* xf, int hidden, float eps, int gemma,
                                       bf16* p0, bf16* p1, bf16* p2, int ps) {
    __shared__ float red[8];
    const int r = blockIdx.y, t = threadIdx.x;
    const float* xr = x + (size_t)r * hidden;
    float ss = 0.0f;
    for (int c = t; c < hidden; c += 256) ss = fmaf(xr[c], xr[c], ss);
    ss = warp_sum(ss);
    if ((t & 31) == 0) red[t >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int k = 0; k < 8; ++k) tot += red[k];
    const float den = sqrtf(tot / (float)hidden + eps);
    for (int c = blockIdx.x * 1024 + t; c < min(hidden, (int)(blockIdx.x + 1) * 1024); c += 256) {
        const float y = xr[c] / den * (gemma ? 1.0f + w[c] : w[c]);
        if (xf) xf[(size_t)r * hidden + c] = y;
        put3(p0, p1, p2, (size_t)r * ps + c, y);
    }
}
