// The q4tp matvec's entry points hy_mmp_{NT}_{TB}_{KS}, hy_mmv / hy_mmvs and hy_mmr, each
// running hy_mmp_run (hyb_mmp_core.cuh) as its launch's shape asks; all give the same sums in the
// same order for one KS.

// The most n-tiles at which hy_mmp_1's and hy_mmr's calls run whole stages without per-group
// exits (hy_mmp_run's WH): the units of a stage interleave, at hy_mmp's 128 registers a thread
// up to three n-tiles, at hy_mmr's 80 up to two. H200, `bench_kernels --models 9B,27B --rows
// 3,4,8,12,16` (session 15), us at 4 / 8 rows, WH 3 against 1 at KS 8: 9B gate/up 25.8 / 33.2
// against 28.0 / 34.1, 9B head 230.3 / 305.5 against 239.1 / 318.6, 27B gate/up 45.6 / 59.5
// against 52.8 / 66.0, 27B attention in 19.8 / 26.2 against 21.6 / 26.9; hy_mmr at 3 n-tiles
// loses (9B attention in at 8 rows 21.9 against 18.6 us), at 2 it gains (27B q at 4 rows 17.3 /
// 17.6). hy_mmp_1 at KS 16 too (hy_mmr has KS 8 alone), us at 1 / 3 / 8 rows, whole against not:
// 9B o 5.65 / 6.55 / 7.88 against 5.73 / 6.92 / 8.02, 9B down 13.93 / 15.73 at 3 / 8 rows against
// 15.06 / 16.54 (12.22 against 12.77 at 2). hy_mmv (one n-tile) takes them at KS 8, and hy_mmvs
// at KS 16 too (one block an SM: 128 registers, the whole-stage loop without a spill; session 18,
// bench_kernels --models 9B,27B --rows 1 --variants all: 9B down on hy_mmvs_2_16 11.40 against
// 10.37 us, bench_decode 9b step 2.1528 / 2.1485 against 2.1112 / 2.1122 ms, 27b 6.335 against
// 6.346); under hy_mmv_{TB}_16's register cap they spill (9B gate/up at one row 24.2 against 23.5
// us, down 16.1 against 15.3).
#ifndef HY_MMP_WH
#define HY_MMP_WH 3
#endif
#ifndef HY_MMR_WH
#define HY_MMR_WH 2
#endif

// The n-tiles of 8 B columns a call of n rows fills (three plane columns a row): ceil(3 n / 8).
__device__ __forceinline__ int hy_ntc(int n) { return (3 * n + 7) >> 3; }

// Items of a job of `rows` rows at `per` tiles an item: ceil(ceil(rows / 16) / per).
__device__ __forceinline__ int hy_job_items(int rows, int per) { return (((rows + 15) >> 4) + per - 1) / per; }

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
//   code bytes: the four tiles of one group (TB 4, hy_mmp_2 at KS 8 alone), both tiles of two
//   groups (TB 2) or four groups of the tile (TB 1); each group's B
//   fragments are loaded (__ldg, 16 bytes a lane and n-tile: the planes' fragment order) while
//   the group before it computes (up to 3 n-tiles). The next item's first stages and ladders are
//   fetched while this one's sums are reduced. (A wide path that staged the B fragments once a
//   block for items of 8 tiles, each warp walking one tile's groups, served calls of 4..16 rows
//   until the planes took fragment order; since then this one is faster on every set: H200,
//   bench_kernels, us at 4 / 8 / 16 rows, wide against not: 9B gate/up 44.1 / 52.1 / 85.2 against
//   28.0 / 34.2 / 62.3, 9B head 334 / 399 / 671 against 262 / 322 / 615, 27B gate/up 85.2 / 101.8
//   / 174.9 against 53.7 / 62.7 / 122.6, 27B head 408 / 485 / 802 against 314 / 399 / 758.)
//   PDL (common.cuh): hy_mmp_run fetches the first item's weight stages and makes its rung table
//   (with PFL, also prefetches the next item's ladder rows) before pdl_begin() (weights, codes and
//   ladders are written only by hy_repack and uploads, which their callers sync after), all else
//   after it.
//   Launch: block 32 * KS threads, dynamic shared memory KS * HY_RUN_STAGES * HY_STAGE bytes (traps
//   when given less, or given planes not 16-byte aligned or, past one row, xs % 8 != 0). Assumes
//   n <= 8 NT, cols % 32 == 0, 16-byte aligned tiles and codes (mat_planes aligns them to 256).
template <int NT, int TB, int KS>
__device__ __forceinline__ void hy_mmp(const HyJob* jobs, int nj, const bf16* p0, const bf16* p1,
                                       const bf16* p2, int xs, int n, int cols) {
    constexpr int NC = 3 * NT;
    __shared__ HySmem<NC, TB, KS> sm;
    const int total = hy_items<TB>(jobs, nj, KS * HY_RUN_STAGES * HY_STAGE, p0, p1, p2, xs, n);
    if ((int)blockIdx.x >= total) return;
    const int ntc = hy_ntc(n);
    // (hy_mmp_2 runs 9..16 rows, 4..6 n-tiles, so none: the paths it has for fewer serve tests
    // alone, and whole stages there only grow its stack)
    constexpr int WH = NT == 1 ? HY_MMP_WH : 0;
    switch (ntc) {
    case 1: hy_mmp_run<NC, 1, TB, KS, HY_RUN_STAGES, WH>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
    case 2: hy_mmp_run<NC, 2, TB, KS, HY_RUN_STAGES, WH>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
    case 3: hy_mmp_run<NC, 3, TB, KS, HY_RUN_STAGES, WH>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
    default:
        // 4..6 n-tiles: hy_mmp_2's alone
        if constexpr (NT == 2) {
            switch (ntc) {
            case 4: hy_mmp_run<NC, 4, TB, KS, HY_RUN_STAGES, WH>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
            case 5: hy_mmp_run<NC, 5, TB, KS, HY_RUN_STAGES, WH>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
            default: hy_mmp_run<NC, 6, TB, KS, HY_RUN_STAGES, WH>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm); break;
            }
        }
    }
}

// hy_mmv_{TB}_{KS}: hy_mmp_1_{TB}_{KS} for calls of one or two rows (one n-tile, 3 n <= 8): the
//   same work split, sums and order (so the same bits as every hy_mmp call with this KS), each
//   warp's ring HY_MV_STAGES deep instead of HY_RUN_STAGES and the registers capped for HY_MV_MB_{KS}
//   blocks an SM, so more warps hide the tile loop's latencies; at TB 2 its whole stages run
//   unrolled by the ring's depth (hy_mmp_run's UNR). H200, session 18: the KS 8 whole-stage loop
//   drops from 200 to 171 SASS instructions a stage; bench_kernels 9B at one row: gate/up 20.77
//   -> 19.98 us, attention in 10.33 -> 9.98, head (hy_mmvs_2_8) 176.6 -> 166.3; bench_decode 9b
//   step 2.227 -> 2.148 ms, 27b the same (6.336 -> 6.338). Unrolled at TB 1 too, the 27B down
//   (hy_mmv_1_8) loses (21.32 -> 21.94 us, 27b step 6.367 -> 6.448 ms); unrolled in every
//   hy_mmp_run, every hy_mmp_1 call loses (session 17). Where its whole stages run (KS 8, and
//   hy_mmvs) it also fetches each item's ladder rows into L1 an item ahead (hy_mmp_run's PFL): ncu
//   put 7.7% of hy_mmv_2_8's stall samples on the rung table waiting for lad_load (session 19);
//   bench_kernels at one row: 9B gate/up 19.32 -> 18.82 us, down 10.35 -> 10.10, 27B gate/up
//   33.63 -> 32.58, 27B LM head 206.9 -> 199.1; bench_decode 9b step 2.0564 / 2.0676 -> 2.0364 /
//   2.0382 ms, 27b 6.1935 / 6.1901 -> 6.107 / 6.0999. In every hy_mmp_run it spills hy_mmp_1's
//   loops (stack 40 -> 144 bytes, and 8 rows lose); under hy_mmv_{TB}_16's 64 registers it grows
//   the stack. Launch: block 32 * KS threads, dynamic shared memory KS * HY_MV_STAGES * HY_STAGE
//   bytes (traps when given less); traps when n > 2. Assumptions as hy_mmp.
// hy_mmvs_{TB}_{KS}: hy_mmv_{TB}_{KS} with the call's B staged (SB, see hy_mmp_run): each warp
//   first copies its groups of the 3 n plane columns into shared memory after the rings (sm_90:
//   two bulk copies a column on the warp's two mbarriers, the first stages' groups and the rest,
//   so it waits neither for the weight stages in flight nor for the later groups before its first
//   stages; sm_80: cp.async), then reads them there rather than from L2 a group ahead (the same
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
    constexpr bool WHOLE = KS == 8 || SB;
    hy_mmp_run<3, 1, TB, KS, HY_MV_STAGES, WHOLE ? 1 : 0, SB, TB == 2, WHOLE>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm);
}

// hy_mmr_{NTC}_{TB}_8: hy_mmp_1_{TB}_8's hy_mmp_run alone, for calls that fill NTC n-tiles (2:
//   3..5 rows, 3: 6..8) over sets whose items its grid takes at once and hy_mmp_1's does not
//   (mma_rules.one_wave): the same sums, so the same bits as every KS 8 call. Its registers are
//   capped for HY_MR_MB blocks an SM (hy_mmp_1_{TB}_8: two). Launch: block 256 threads, dynamic shared
//   memory 8 HY_RUN_STAGES HY_STAGE bytes (traps when given less); traps when the call does not
//   fill NTC n-tiles. Assumptions as hy_mmp.
template <int NTC, int TB>
__device__ __forceinline__ void hy_mmr(const HyJob* jobs, int nj, const bf16* p0, const bf16* p1,
                                       const bf16* p2, int xs, int n, int cols) {
    __shared__ HySmem<3, TB, 8> sm;
    if (hy_ntc(n) != NTC) asm volatile("trap;");
    const int total = hy_items<TB>(jobs, nj, 8 * HY_RUN_STAGES * HY_STAGE, p0, p1, p2, xs, n);
    if ((int)blockIdx.x >= total) return;
    hy_mmp_run<3, NTC, TB, 8, HY_RUN_STAGES, HY_MMR_WH>(jobs, nj, p0, p1, p2, xs, n, cols, total, sm);
}

// Blocks an SM should fit of each (NT, KS), of hy_mmv's KS and of hy_mmvs' (whose staged columns
// leave room for fewer: the 9B down's 165 KB one at KS 16, where hy_mmvs_2_16 takes 128 registers
// with its whole stages, against 64 and 4 bytes under hy_mmv's cap of two): caps the registers (ptxas
// -v reports them). hy_mmv at KS 8 holds three (80 registers); four (64, its whole-stage loop
// still without a spill) lose on the H200 (session 17, bench_kernels --models 9B --rows 1: 9B
// gate/up 20.8 against 28.4 us, q 8.6 against 10.3; bench_decode 9b step 2.23 against 2.42 ms).
// hy_mmvs at KS 16 capped at 80 registers (__maxnreg__(80): no spill, 40 960 registers a block)
// lets an hy_mmv_2_8 block (20 480) fit beside it, so the one-row matvec after the norm becomes
// resident and brings in its first stages while the 9B's down, o and GDN out sets still run. It
// does not pay (session 32 call 2, not kept; GPU suite 284 passed on that tree): `bench_decode
// --shapes 9b,27b --source mem --skip-matvec --tokens 32 --windows 2,8 --prompt 64`, device ms,
// two runs each, 9b step 1.9607 / 1.9563 against 1.9471 / 1.9482. Its timeline (--timeline, us
// summed over each kernel's 64 launches in the step, against this tree's in call 1): hy_mmv_2_8's
// blocks enter earlier (lead -100.7 against -52.8) but its body barely moves (829.8 against
// 835.7), and hy_mmvs_2_16's grows (537.1 against 525.0); `bench_kernels --models 9B --rows 1
// --no-cublas`, us: down 10.32 against 10.07, o 5.82 against 5.77.
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
// and of hy_mmp_2_4_8's: one, so its 255 registers hold four tiles' sums of six n-tiles without a
// spill (hy_mmp_2_2_8, two an SM at 128 registers, spills 272 / 236 bytes; ptxas -v). Reading each
// lane's B fragments of a group once for four tiles instead of two halves what a call of five or
// six n-tiles reads from L2 (at TB 2 and 16 rows, six times the weight bytes), where its time
// goes; mma_rules.four_tiles says where it pays (11..16 rows). It is latency-bound at its two
// warps a scheduler (ncu, session 23 call 9, 9B gate/up at 16 rows: 0.46 eligible, issue slots
// 35.6% busy, the tensor pipe 26.7% active; stalls an issued instruction: wait 1.62, long
// scoreboard 0.83, no instruction 0.55); fetching the next group's B fragments a group ahead (as
// up to three n-tiles do) spills 48 bytes and loses at 12 and 16 rows (call 7: 9B gate/up 48.06 /
// 55.67 against 43.21 / 51.99 us), ties TB 2 at 10. hy_mmp_1_4_8 was tried and lost at
// 3..8 rows on every set (H200, session 23 call 1, `bench_kernels --models 9B,27B --rows 3,4,8
// --variants all`, us at 8 rows against hy_mmp_1_2_8's 32.3, 305 and 36.5): at one block an SM
// (252 registers) 9B gate/up 35.6, the 9B head 347, 27B down 45.4; at two (128 registers, a
// 192-byte stack) 44.4, 380 and 71.7.
#ifndef HY_MB_2_4_8
#define HY_MB_2_4_8 1
#endif
// and of hy_mmr's (80 registers: stacks of 72 bytes at NTC 2, 120 at NTC 3, TB 2; ptxas -v)
#ifndef HY_MR_MB
#define HY_MR_MB 3
#endif

#define HY_MMP(NT, TB, KS, MB)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * KS, MB) hy_mmp_##NT##_##TB##_##KS(                  \
        const __grid_constant__ HyJobs jt, int nj, const bf16* p0, const bf16* p1, const bf16* p2, int xs, int n, \
        int cols) {                                                                                     \
        hy_mmp<NT, TB, KS>(jt.j, nj, p0, p1, p2, xs, n, cols);                                          \
    }
HY_MMP(1, 1, 8, HY_MB_1_8)
HY_MMP(1, 1, 16, HY_MB_1_16)
HY_MMP(1, 2, 8, HY_MB_1_8)
HY_MMP(1, 2, 16, HY_MB_1_16)
HY_MMP(2, 1, 8, HY_MB_2_8)
HY_MMP(2, 1, 16, HY_MB_2_16)
HY_MMP(2, 2, 8, HY_MB_2_8)
HY_MMP(2, 2, 16, HY_MB_2_16)
HY_MMP(2, 4, 8, HY_MB_2_4_8)

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
