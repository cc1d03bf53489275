// The q4tp matvec's wide multi-row path (hy_mmp_wide: activations staged once a block for 8
// tiles) and the entry points hy_mmp_{NT}_{TB}_{KS}, which choose it or hy_mmp_run
// (hyb_mmp_core.cuh) by the launch's shape; both give the same sums in the same order.

// Tiles of a wide item (KS / HY_WT warps share a tile: 1 or 2) and groups of a wide stage (see
// hy_mmp_wide).
#define HY_WT 8
#define HY_WG 2
// Fewest wide items for which a call of HY_WIDE_ROWS rows or more takes the wide path (else
// hy_mmp_run's); it also needs items for at least half of the grid's blocks (few-tile sets keep
// hy_mmp_run's K split). At three rows hy_mmp_run (4-stage rings) wins: H200, bench_kernels
// --models 9B,27B --matrices gate_up,head, us wide / not: 9B gate/up 45.7 / 37.2, 27B 85.5 /
// 72.5, the heads 338.7 / 340.6 and 409.4 / 415.9; at four rows the heads lose 15-18% without it
// (339.4 / 391.4), gate/up gains 3-7% (45.1 / 42.0); from six rows the wide path wins on both.
#ifndef HY_WIDE_MIN
#define HY_WIDE_MIN 16
#endif
#ifndef HY_WIDE_ROWS
#define HY_WIDE_ROWS 4
#endif
// The n-tiles of 8 B columns a call of n rows fills (three plane columns a row): ceil(3 n / 8).
__device__ __forceinline__ int hy_ntc(int n) { return (3 * n + 7) >> 3; }

// Items of a job of `rows` rows at `per` tiles an item: ceil(ceil(rows / 16) / per).
__device__ __forceinline__ int hy_job_items(int rows, int per) { return (((rows + 15) >> 4) + per - 1) / per; }

// Wide items of a job table (HY_WT tiles each, never across jobs).
__device__ __forceinline__ int hy_wide_items(const HyJob* jobs, int nj) {
    int s = 0;
    for (int j = 0; j < nj; ++j) s += hy_job_items(jobs[j].rows, HY_WT);
    return s;
}

// hy_mmp's multi-row work (NTC >= 2 n-tiles), the same arithmetic as hy_mmp_run per output:
// item = HY_WT consecutive tiles of one job; warp w takes tile w % HY_WT over ALL groups (KS 16:
// n-tiles [w / HY_WT * JA, + JA), JA = ceil(NTC / 2); KS 8: all), keeping a running sum per chunk
// [c gpr / KS, (c + 1) gpr / KS) (fmaf per group in order: hy_mmp_run's warp c) and adding the
// chunk sums in chunk order into out (hy_mmp_run's reduction), so every output's bits equal
// hy_mmp_run's, for every n. Rungs come from a table [HY_WT][16][33] made per item where it fits
// beside four stages (KS 16), else per group from the lane's two rows' ladders (KS 8); both are
// lad_store's expression. The block streams stages of HY_WG groups through one ring
// (cp.async, one barrier a stage): the tiles' weight units and codes, and the groups' B fragments
// (NTC n-tiles of 8 columns x 64 bytes, lane l's 16 bytes at 16 l), each B fragment loaded once
// a block and read by every tile's warp with one 16-byte load a lane. Dynamic shared
// memory (ring_bytes(KS)): out [HY_WT][16][8 NC] f32, the rung table if any, then the stages; one
// more stage in the block's static tables `xs_` (hy_mmp_run's, idle here) where it fits.
template <int NC, int NTC, int KS, int XB>
__device__ __forceinline__ void hy_mmp_wide(const HyJob* jobs, int nj, const bf16* p0, const bf16* p1,
                                            const bf16* p2, int xs, int n, int cols, int total,
                                            unsigned char* xs_) {
    constexpr int T = HY_WT, G = HY_WG, TH = 32 * KS, C = KS / T;
    constexpr int JA = (NTC + C - 1) / C;  // n-tiles a warp
    constexpr int OUTB = T * 16 * 8 * NC * 4;
    constexpr int WB = T * G * 256, CB = T * G * 16, BB = G * NTC * 512;
    constexpr int STB = WB + CB + BB;
    constexpr int RING = KS * HY_STAGES * HY_STAGE;
    constexpr bool LT = RING - OUTB - T * 16 * 33 * 4 >= 4 * STB;
    constexpr int LADB = LT ? T * 16 * 33 * 4 : 0;
    constexpr int SD0 = (RING - OUTB - LADB) / STB, SD = SD0 > 8 ? 8 : SD0;
    constexpr int S = SD + (SD < 8 && XB >= STB ? 1 : 0);
    constexpr int NCH = STB / 16, NIT = (NCH + TH - 1) / TH;
    static_assert(S >= 3, "wide ring: at least three stages");
    static_assert(C == 1 || C == 2, "wide warps: HY_WT tiles x 1 or 2 n-tile halves");
    extern __shared__ __align__(16) unsigned char hy_ring[];
    float (*out_s)[16][8 * NC] = (float (*)[16][8 * NC])hy_ring;
    float* lad = (float*)(hy_ring + OUTB);
    unsigned char* ringp = hy_ring + OUTB + LADB;
    const u32 ring = (u32)__cvta_generic_to_shared(ringp), xring = (u32)__cvta_generic_to_shared(xs_);
    // slot k of the ring: SD dynamic ones, then the static one
    auto slot_of = [&](int k) -> u32 { return k < SD ? ring + (u32)k * STB : xring; };
    const int gpr = cols >> 5;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gid = lane >> 2, tig = lane & 3;
    const int tw = w % T, j0 = (w / T) * JA;
    const u32 k_mask = 0x000F000Fu, k_magic = 0x43004300u, k_one = 0x3F803F80u, k_m136 = 0xC308C308u;
    // per copy slot k = tid + it TH of a stage: its source at stage 0 and, packed, its destination
    // in the stage (bits 0-15), its group within the stage (bits 16-23; the source steps G groups
    // a stage) and whether it copies (bit 31)
    const unsigned char* csrc[NIT];
    u32 cpk[NIT];
    int ji = 0, tile0 = 0, nvt = 0, rows = 0;
    // the ladders (lo, step) of this lane's rows gid and gid + 8 of its tile
    float lo0 = 0.0f, st0 = 0.0f, lo1 = 0.0f, st1 = 0.0f;
    auto locate = [&](int b) {
        ji = 0;
        int base = 0;
        for (;;) {
            const int ni = hy_job_items(jobs[ji].rows, T);
            if (b < base + ni || ji + 1 >= nj) break;
            base += ni;
            ++ji;
        }
        const HyJob& jb = jobs[ji];
        tile0 = (b - base) * T;
        rows = jb.rows;
        nvt = min(T, ((rows + 15) >> 4) - tile0);
        const int r0 = (tile0 + tw) * 16 + gid, r1 = r0 + 8;
        hy_lad((const float*)jb.aux1, r0, rows, lo0, st0);
        hy_lad((const float*)jb.aux1, r1, rows, lo1, st1);
#pragma unroll
        for (int it = 0; it < NIT; ++it) {
            const int k = tid + it * TH;
            if (k < WB / 16) {
                const int t = k / (G * 16), g2 = (k / 16) % G, ch = k % 16;
                csrc[it] = (const unsigned char*)jb.w + ((size_t)(tile0 + t) * gpr + g2) * 256 + ch * 16;
                cpk[it] = (u32)((t * G + g2) * 256 + ch * 16) | (u32)g2 << 16 | (t < nvt ? 1u << 31 : 0u);
            } else if (k < (WB + CB) / 16) {
                const int kk = k - WB / 16, t = kk / G, g2 = kk % G;
                csrc[it] = (const unsigned char*)jb.aux0 + ((size_t)(tile0 + t) * gpr + g2) * 16;
                cpk[it] = (u32)(WB + (t * G + g2) * 16) | (u32)g2 << 16 | (t < nvt ? 1u << 31 : 0u);
            } else {
                // B chunk: n-tile j's column r (hy_bcol's q = 8 j + r), 16-byte chunk cc of the
                // group: lane l = 4 r + cc's fragments (planes in fragment order), at l 16
                const int kk = k - (WB + CB) / 16, g2 = kk / (NTC * 32), j = (kk / 32) % NTC, l = kk % 32;
                const int r = l >> 2, cc = l & 3;
                csrc[it] = (const unsigned char*)(hy_bcol(p0, p1, p2, xs, n, 8 * j + r) + g2 * 32 + cc * 8);
                cpk[it] = (u32)(WB + CB + (g2 * NTC + j) * 512 + l * 16) | (u32)g2 << 16 | (k < NCH ? 1u << 31 : 0u);
            }
        }
    };
    // stage i's copies into slot i % S; every thread commits a group, copies or not
    auto issue = [&](int i) {
        const u32 slot = slot_of(i % S);
#pragma unroll
        for (int it = 0; it < NIT; ++it) {
            const u32 pk = cpk[it], dst = pk & 0xFFFFu;
            const bool ok = (pk >> 31) && i * G + (int)((pk >> 16) & 0xFFu) < gpr;
            const u32 step = dst < (u32)WB ? G * 256 : (dst < (u32)(WB + CB) ? G * 16 : G * 64);
            cp_async16_if(ok, slot + dst, csrc[it] + (size_t)i * step);
        }
        cp_async_commit();
    };
    // the item's rung table (LT), entry k = (tile, row, code): lad_store's
    auto lad_fill = [&]() {
        const float* ls = (const float*)jobs[ji].aux1;
        for (int k = tid; k < T * 512; k += TH) {
            const int r = (tile0 + (k >> 9)) * 16 + ((k >> 5) & 15), c = k & 31;
            float lo, st;
            hy_lad(ls, r, rows, lo, st);
            lad[(k >> 9) * 528 + ((k >> 5) & 15) * 33 + c] = hy_rung(lo, st, c);
        }
    };
    const float* lrow = lad + tw * 528 + gid * 33;
    const int nst = (gpr + G - 1) / G;
    // the stages carry activations: nothing before the previous kernel is done
    pdl_begin();
    for (int bi = blockIdx.x; bi < total; bi += gridDim.x) {
        locate(bi);
        for (int i = 0; i < S - 1; ++i) issue(i);
        if (LT) lad_fill();
        const bool act = tw < nvt;
        float acc[JA][4];
#pragma unroll
        for (int j = 0; j < JA; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        // chunk c's groups end at cend; its sums go into out (chunk 0: out = its sum), each lane
        // to its own entries
        int c = 0, cend = gpr / KS;
        auto fold = [&]() {
            if (act) {
#pragma unroll
                for (int j = 0; j < JA; ++j) {
                    if (j0 + j >= NTC) break;
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float& o = out_s[tw][gid + 8 * (e >> 1)][8 * (j0 + j) + 2 * tig + (e & 1)];
                        o = c == 0 ? acc[j][e] : o + acc[j][e];
                        acc[j][e] = 0.0f;
                    }
                }
            }
            ++c;
            cend = (c + 1) * gpr / KS;
        };
        for (int i = 0; i < nst; ++i) {
            // stage i landed for every thread, and every warp is past stage i - 1 (whose slot
            // the issue refills)
            cp_async_wait<S - 2>();
            __syncthreads();
            issue(i + S - 1);
            const int k = i % S;
            const u32 slot = slot_of(k);
            const unsigned char* st = k < SD ? ringp + k * STB : xs_;
#pragma unroll
            for (int g2 = 0; g2 < G; ++g2) {
                const int g = i * G + g2;
                if (g >= gpr) break;
                while (g == cend) fold();
                if (!act) continue;
                const uint2 wv = *(const uint2*)(st + (tw * G + g2) * 256 + lane * 8);
                const unsigned char* cd = st + WB + (tw * G + g2) * 16;
                const float rl = LT ? lrow[cd[gid]] : hy_rung(lo0, st0, cd[gid]);
                const float rh = LT ? lrow[8 * 33 + cd[gid + 8]] : hy_rung(lo1, st1, cd[gid + 8]);
                u32 a[8];
                hy_unit_a(wv, k_mask, k_magic, k_one, k_m136, a);
#pragma unroll
                for (int j = 0; j < JA; ++j) {
                    if (C > 1 && j0 + j >= NTC) break;
                    u32 b[4];
                    lds128(b, slot + WB + CB + (u32)((g2 * NTC + j0 + j) * 512 + lane * 16));
                    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    hy_mma(s, a[0], a[1], a[2], a[3], b[0], b[1]);
                    hy_mma(s, a[4], a[5], a[6], a[7], b[2], b[3]);
                    acc[j][0] = fmaf(rl, s[0], acc[j][0]);
                    acc[j][1] = fmaf(rl, s[1], acc[j][1]);
                    acc[j][2] = fmaf(rh, s[2], acc[j][2]);
                    acc[j][3] = fmaf(rh, s[3], acc[j][3]);
                }
            }
        }
        while (c < KS) fold();
        // out complete (every warp's folds), and every copy landed before the next item's refill
        cp_async_wait<0>();
        __syncthreads();
        hy_epilogue<NC, T, KS>(jobs[ji], tile0, nvt, out_s, n);
        // out and the rungs read before the next item's folds and table overwrite them
        __syncthreads();
    }
}

// The work items of a job table for TB tiles a block (hy_mmp's "Work"), after checking that the
// launch gave the rings their `ring` bytes of dynamic shared memory and planes that take 16-byte
// loads (16-byte aligned and, past one row, xs % 8 == 0): a trap when not.
template <int TB>
__device__ __forceinline__ int hy_items(const HyJob* jobs, int nj, int ring, const bf16* p0, const bf16* p1,
                                        const bf16* p2, int xs, int n) {
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (u32)ring) asm volatile("trap;");
    if ((((size_t)p0 | (size_t)p1 | (size_t)p2) & 15) || (n > 1 && (xs & 7))) asm volatile("trap;");
    const HyJob& last = jobs[nj - 1];
    return last.blk0 + hy_job_items(last.rows, TB);
}

// hy_mmp_{NT}_{TB}_{KS}: every job's y [n][ystride] = W x for the n rows given as planes.
//   Math: column q = 3 r + p of the B operand is plane p of row r, so one mma gives the three
//   planes' partial sums of up to 8/3 rows; per (row, group) the two k-steps' sums are scaled by
//   the rung (fmaf into the running sum, groups in order); the KS warps' sums are added in warp
//   order, then y = (sum_hi + sum_mid) + sum_lo. Nothing depends on n but which columns are read,
//   nor on TB or the grid: a row's outputs are bit for bit the same in any call with the same KS.
//   The code is specialised on the n-tiles the call fills (ceil(3 n / 8)), so a one-row call does
//   one n-tile's mma and scaling only.
//   jobs  HyJob [nj] (blk0 ascending, the first 0; the kernels take them by value, HyJobs, nj <=
//         HY_MAXJ); p0, p1, p2 bf16 [n][xs]; cols the input width.
//   Epilogues: kind 6: y = W x, or res + W x when res != 0; kind 6 | 0x100 (a pair): o =
//   silu(gate) * up of pair row 8 tile + i, written as bf16 hi = bf16(o) into y and
//   bf16((o - hi) / 2) into res, so the planes (y, res, res) sum to hi + bf16(o - hi).
//   Work: item b (the jobs' blocks: ceil(ceil(rows / 16) / TB) each, from blk0) is TB tiles of one
//   job; block k of the grid (any size) takes items k, k + gridDim.x, ... Warp w takes groups
//   [w gpr / KS, (w + 1) gpr / KS) of the item's tiles and streams them through its own ring of
//   HY_RUN_STAGES stages (cp.async), a stage being four (tile, group) units of 256 weight bytes + 16
//   code bytes: both tiles of two groups (TB 2) or four groups of the tile (TB 1); each group's B
//   fragments are loaded (__ldg, 16 bytes a lane and n-tile: the planes' fragment order) while
//   the group before it computes (up to 3 n-tiles). The next item's first stages and ladders are
//   fetched while this one's sums are reduced. Calls of HY_WIDE_ROWS rows or more over at least
//   HY_WIDE_MIN items of HY_WT tiles (and half the grid) run hy_mmp_wide instead: the same sums
//   in the same order (so the same bits), the B fragments staged once a block.
//   PDL (common.cuh): hy_mmp_run fetches the first item's weight stages and makes its rung table
//   before pdl_begin() (weights, codes and ladders are written only by hy_repack and uploads,
//   which their callers sync after), all else after it; hy_mmp_wide, whose stages carry
//   activations, waits first.
//   Launch: block 32 * KS threads, dynamic shared memory KS * HY_STAGES * HY_STAGE bytes (traps
//   when given less, or given planes not 16-byte aligned or, past one row, xs % 8 != 0). Assumes
//   n <= 8 NT, cols % 32 == 0, 16-byte aligned tiles and codes (mat_planes aligns them to 256).
template <int NT, int TB, int KS>
__device__ __forceinline__ void hy_mmp(const HyJob* jobs, int nj, const bf16* p0, const bf16* p1,
                                       const bf16* p2, int xs, int n, int cols) {
    constexpr int NC = 3 * NT;
    static_assert(HY_RUN_STAGES <= HY_STAGES, "hy_mmp_run's rings fit the launch's shared memory");
    static_assert(HY_WIDE_ROWS >= 3, "the wide path takes two n-tiles or more");
    __shared__ HySmem<NC, TB, KS> sm;
    const int total = hy_items<TB>(jobs, nj, KS * HY_STAGES * HY_STAGE, p0, p1, p2, xs, n);
    if ((int)blockIdx.x >= total) return;
    const int ntc = hy_ntc(n);
    // calls of enough rows over enough tiles: the wide items (same bits; the choice is the same in
    // every block of a launch)
    const int witems = n >= HY_WIDE_ROWS ? hy_wide_items(jobs, nj) : 0;
    if (witems >= HY_WIDE_MIN && 2 * witems >= (int)gridDim.x) {
        constexpr int XB = (int)sizeof(HySmem<NC, TB, KS>) & ~15;
        unsigned char* xsm = (unsigned char*)&sm;
        switch (ntc) {
        case 2: hy_mmp_wide<NC, 2, KS, XB>(jobs, nj, p0, p1, p2, xs, n, cols, witems, xsm); break;
        case 3: hy_mmp_wide<NC, 3, KS, XB>(jobs, nj, p0, p1, p2, xs, n, cols, witems, xsm); break;
        default:
            if (NT == 2) {
                switch (ntc) {
                case 4: hy_mmp_wide<NC, (NT == 2 ? 4 : 2), KS, XB>(jobs, nj, p0, p1, p2, xs, n, cols, witems, xsm); break;
                case 5: hy_mmp_wide<NC, (NT == 2 ? 5 : 2), KS, XB>(jobs, nj, p0, p1, p2, xs, n, cols, witems, xsm); break;
                default: hy_mmp_wide<NC, (NT == 2 ? 6 : 2), KS, XB>(jobs, nj, p0, p1, p2, xs, n, cols, witems, xsm); break;
                }
            }
        }
        return;
    }
    switch (ntc) {
    case 1: hy_mmp_run<NC, 1, TB, KS, HY_RUN_STAGES>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
    case 2: hy_mmp_run<NC, 2, TB, KS, HY_RUN_STAGES>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
    case 3: hy_mmp_run<NC, 3, TB, KS, HY_RUN_STAGES>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
    default:
        if (NT == 2) {
            switch (ntc) {
            case 4: hy_mmp_run<NC, (NT == 2 ? 4 : 1), TB, KS, HY_RUN_STAGES>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
            case 5: hy_mmp_run<NC, (NT == 2 ? 5 : 1), TB, KS, HY_RUN_STAGES>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
            default: hy_mmp_run<NC, (NT == 2 ? 6 : 1), TB, KS, HY_RUN_STAGES>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
            }
        }
    }
}

// hy_mmv_{TB}_{KS}: hy_mmp_1_{TB}_{KS} for calls of one or two rows (one n-tile, 3 n <= 8): the
//   same work split, sums and order (so the same bits as every hy_mmp call with this KS), each
//   warp's ring HY_MV_STAGES deep instead of HY_STAGES and the registers capped for HY_MV_MB_{KS}
//   blocks an SM, so more warps hide the tile loop's latencies. Launch: block 32 * KS threads,
//   dynamic shared memory KS * HY_MV_STAGES * HY_STAGE bytes (traps when given less); traps when
//   n > 2. Assumptions as hy_mmp.
// hy_mmvs_{TB}_{KS}: hy_mmv_{TB}_{KS} with the call's B staged (SB, see hy_mmp_run): each warp
//   first copies its groups of the 3 n plane columns into shared memory after the rings (sm_90:
//   one bulk copy a column on the warp's mbarrier, so it does not wait for the weight stages in
//   flight; sm_80: cp.async), then reads them there rather than from L2 a group ahead (the same
//   values, so the same bits). For blocks that walk many groups (a long K, or many items a
//   block), where that latency is not hidden. Launch as hy_mmv with 3 n hy_sb_stride(cols / 32)
//   more bytes of dynamic shared memory (traps when given less).
template <int TB, int KS, bool SB>
__device__ __forceinline__ void hy_mmv(const HyJob* jobs, int nj, const bf16* p0, const bf16* p1,
                                       const bf16* p2, int xs, int n, int cols) {
    __shared__ HySmem<3, TB, KS> sm;
    if (n > 2) asm volatile("trap;");
    const int sb = SB ? 3 * n * hy_sb_stride(cols >> 5) : 0;
    const int total = hy_items<TB>(jobs, nj, KS * HY_MV_STAGES * HY_STAGE + sb, p0, p1, p2, xs, n);
    if ((int)blockIdx.x >= total) return;
    hy_mmp_run<3, 1, TB, KS, HY_MV_STAGES, SB>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm);
}

// hy_mmr_{NTC}_{TB}_8: hy_mmp_1_{TB}_8's hy_mmp_run alone, for calls that fill NTC n-tiles (2:
//   3..5 rows, 3: 6..8) over sets whose items its grid takes at once and hy_mmp_1's does not
//   (mma_rules.one_wave; such sets never take the wide path): the same sums, so the same bits as
//   every KS 8 call. Its rings take HY_RUN_STAGES stages of dynamic shared memory
//   (hy_mmp's launch reserves HY_STAGES, the wide path's) and its registers are capped for
//   HY_MR_MB blocks an SM (hy_mmp_1_{TB}_8: two). Launch: block 256 threads, dynamic shared
//   memory 8 HY_RUN_STAGES HY_STAGE bytes (traps when given less); traps when the call does not
//   fill NTC n-tiles. Assumptions as hy_mmp.
template <int NTC, int TB>
__device__ __forceinline__ void hy_mmr(const HyJob* jobs, int nj, const bf16* p0, const bf16* p1,
                                       const bf16* p2, int xs, int n, int cols) {
    __shared__ HySmem<3, TB, 8> sm;
    if (hy_ntc(n) != NTC) asm volatile("trap;");
    const int total = hy_items<TB>(jobs, nj, 8 * HY_RUN_STAGES * HY_STAGE, p0, p1, p2, xs, n);
    if ((int)blockIdx.x >= total) return;
    hy_mmp_run<3, NTC, TB, 8, HY_RUN_STAGES>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm);
}

// Blocks an SM should fit of each (NT, KS), of hy_mmv's KS and of hy_mmvs' (whose staged columns
// leave room for fewer: the 9B down's 165 KB one at KS 16, where hy_mmvs_2_16 takes 92 registers
// without a spill, against 64 and 4 bytes under hy_mmv's cap of two): caps the registers (ptxas
// -v reports them).
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
#ifndef HY_MV_MB_8
#define HY_MV_MB_8 3
#endif
#ifndef HY_MV_MB_16
#define HY_MV_MB_16 2
#endif
#ifndef HY_MVS_MB_8
#define HY_MVS_MB_8 3
#endif
#ifndef HY_MVS_MB_16
#define HY_MVS_MB_16 1
#endif
// and of hy_mmr's (80 registers: spills of 108 bytes at NTC 2, 216 at NTC 3, TB 2; ptxas -v)
#ifndef HY_MR_MB
#define HY_MR_MB 3
#endif

#define HY_MMP(NT, TB, KS)                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * KS, HY_MB_##NT##_##KS) hy_mmp_##NT##_##TB##_##KS(  \
        const __grid_constant__ HyJobs jt, int nj, const bf16* p0, const bf16* p1, const bf16* p2, int xs, int n, \
        int cols) {                                                                                     \
        hy_mmp<NT, TB, KS>(jt.j, nj, p0, p1, p2, xs, n, cols);                                          \
    }
HY_MMP(1, 1, 8)
HY_MMP(1, 1, 16)
HY_MMP(1, 2, 8)
HY_MMP(1, 2, 16)
HY_MMP(2, 1, 8)
HY_MMP(2, 1, 16)
HY_MMP(2, 2, 8)
HY_MMP(2, 2, 16)

#define HY_MMV(NAME, SB, MB, TB, KS)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * KS, MB) NAME##_##TB##_##KS(                         \
        const __grid_constant__ HyJobs jt, int nj, const bf16* p0, const bf16* p1, const bf16* p2, int xs, int n, \
        int cols) {                                                                                     \
        hy_mmv<TB, KS, SB>(jt.j, nj, p0, p1, p2, xs, n, cols);                                          \
    }
HY_MMV(hy_mmv, false, HY_MV_MB_8, 1, 8)
HY_MMV(hy_mmv, false, HY_MV_MB_16, 1, 16)
HY_MMV(hy_mmv, false, HY_MV_MB_8, 2, 8)
HY_MMV(hy_mmv, false, HY_MV_MB_16, 2, 16)
HY_MMV(hy_mmvs, true, HY_MVS_MB_8, 1, 8)
HY_MMV(hy_mmvs, true, HY_MVS_MB_16, 1, 16)
HY_MMV(hy_mmvs, true, HY_MVS_MB_8, 2, 8)
HY_MMV(hy_mmvs, true, HY_MVS_MB_16, 2, 16)

#define HY_MMR(NTC, TB)                                                                                  \
    extern "C" __global__ void __launch_bounds__(256, HY_MR_MB) hy_mmr_##NTC##_##TB##_8(                  \
        const __grid_constant__ HyJobs jt, int nj, const bf16* p0, const bf16* p1, const bf16* p2, int xs, int n, \
        int cols) {                                                                                     \
        hy_mmr<NTC, TB>(jt.j, nj, p0, p1, p2, xs, n, cols);                                             \
    }
HY_MMR(2, 1)
HY_MMR(2, 2)
HY_MMR(3, 1)
HY_MMR(3, 2)
