// The q4tp matvec's shared pieces and its per-tile path (hy_mmp_run): nibble decode, mma.sync,
// cp.async ring, epilogues. The layout and the planes are described in hyb_mma.cuh; the entry
// points hy_mmp_{NT}_{TB}_{KS}, hy_mmv, hy_mmvs and hy_mmr are in hyb_mmp.cuh.

// Two nibbles (bits 0-3 and 16-19 of v) as the bf16 pair (n_lo - 8, n_hi - 8), exact: one lop3
// makes the nibble the mantissa of 128 + n (mask and magic in registers, so it stays one
// instruction), then fma(x, 1, -136). Leaving the -136 out (A = 128 + n) and starting each unit's
// mma from C = -136 times the group's column sums of B (an mma of the constant A = -136, once a
// group and n-tile for both tiles) drops 8 of a unit's ~42 instructions but loses everywhere and
// costs exactness (H200, session 22, bench_kernels --models 9B --rows 1,8, two runs each, us:
// gate/up 18.98 / 19.09 -> 20.18 / 20.44 at one row, 32.29 / 32.26 -> 41.17 / 41.19 at 8; down
// 10.19 / 10.36 -> 10.76 / 10.78; head 160.2 / 160.1 -> 168.1 / 167.1; the sums of (128 + n) B,
// up to 18 times those of (n - 8) B, cancel in f32: relative RMS up to 2.17e-6 against float64,
// hy_mmvs_1_16, where the tests allow 2e-6). Nor do the nibbles as bf16 subnormals pay (session 29,
// not kept): v & 0x000F000F is n 2^-133 and v & 0x00F000F0 is 16 n 2^-133 (rows gid + 8), so a
// unit's A is a shift and eight ands (10 instructions, not 22), with B times 2^96 (one fma.bf16x2 a
// register), the offset as the mma's C (the group's column sums times -2^-34, rows gid + 8 -2^-30:
// two mma of a constant A a group) and the rungs times 2^37 / 2^33. mma.sync does not flush the
// subnormals: relative RMS 2e-8 to 5e-7 against the tree at 1, 2, 8, 16 rows on six sets. But it
// loses, and so does its floor, C from shared memory and B unscaled (H200, session 29 call 1, back-
// to-back launches over weights larger than L2, us at one / 8 rows, tree / that floor / all of it):
// 9B gate/up 17.92 / 32.09, 18.37 / 34.83, 18.56 / 40.34; 9B head 158.84 / 320.22, 161.42 / 331.43,
// 173.61 / 390.41; 9B down 10.22 / 15.48, 9.95 / 15.91, 10.52 / 19.27; 27B gate/up 31.25 / 57.66,
// 31.27 / 61.31, 31.93 / 76.67 (the group's C and scaled B stay live across its units: hy_mmv_2_8's
// stack 8 -> 24-40 bytes, hy_mmvs_2_8's 0 -> 48-56).
__device__ __forceinline__ u32 hy_nib2(u32 v, u32 mask, u32 magic, u32 one, u32 m136) {
    u32 h, r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(h) : "r"(v), "r"(mask), "r"(magic));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(h), "r"(one), "r"(m136));
    return r;
}

// The eight A registers of one unit (its two k-steps) from the lane's two nibble words: a[0..3]
// from w.x (k-step 0), a[4..7] from w.y (k-step 1), register m from the nibbles at bits 4m, 4m +
// 16. The shifts stay on the ALU pipe: ncu puts hy_mmv_2_8 (9B gate/up, one row) at 37.7% of the
// ALU pipe, its busiest, with 49.7% of the issue slots busy, so the loop waits on latencies, not on
// a pipe (session 22; at the card's own clock, 1.79 GHz, session 32 call 4, `ncu --clock-control
// none --cache-control none` over `bench_kernels --models 9B --rows 1 --matrices gate_up`: ALU
// 47.2%, FMA 22.6%, LSU 39.0%, tensor 4.5%, issue slots 63.6% busy with 5.48 warps a scheduler and
// 1.63 eligible; stalls an issued instruction: wait 1.58, not selected 1.56, long scoreboard 1.50,
// math pipe throttle 0.88, barrier 0.68, short scoreboard 0.63). Its whole-stage loop is 678 SASS
// instructions for 16 units (NVRTC 13.0, sm_90; 42.4 a unit: 8 LOP3, 8 HFMA2, 6 SHF, 2 HMMA, 4
// FFMA, 5.75 LDS, 3 IMAD and 5.5 of the stage's copies, predicates and waits), against ncu's 55.6 a
// unit over the call: a fifth of its instructions are per item (the sums' reduction, the epilogue,
// the ladders, the next item's first stages). Moving the shifts to the FMA pipe as IMAD.HI (w *
// 2^28 >> 32) loses (session 22, bench_kernels --models 9B,27B --rows 1,8, us, base against all six
// / w.y's three as IMAD.HI: 9B gate/up one row 19.06 / 18.99 against 20.82 / 20.79 and 19.79 /
// 19.79, 27B gate/up 32.9 / 32.73 against 37.55 / 37.48 and 34.64 / 34.64, 9B down 10.21 / 10.26
// against 12.02 / 12.04 and 11.02 / 10.98).
__device__ __forceinline__ void hy_unit_a(uint2 w, u32 mask, u32 magic, u32 one, u32 m136, u32* a) {
    const u32 v[8] = {w.x, w.x >> 4, w.x >> 8, w.x >> 12, w.y, w.y >> 4, w.y >> 8, w.y >> 12};
#pragma unroll
    for (int m = 0; m < 8; ++m) a[m] = hy_nib2(v[m], mask, magic, one, m136);
}

// d += A (16x16 bf16, row) * B (16x8 bf16, col), f32 accumulate. A unit's two k-steps chain
// through one accumulator (hy_mmp_run): ncu puts "wait" (fixed-latency dependencies) first among
// hy_mmp_1_2_8's stalls at 8 rows (1.94 of ~7.5 cycles an issued instruction; 0.94 of 3.8 warps
// eligible a scheduler), but two accumulators added before the rung's fma lose everywhere (H200,
// session 23 call 4, `bench_kernels --models 9B,27B --rows 1,8,16`, us, chained against two: 9B
// gate/up 18.86 / 32.01 / 51.6 against 19.91 / 38.22 / 56.03, 27B gate/up 32.7 / 56.87 / 100.44
// against 33.83 / 72.13 / 110.7, 9B head 159.7 / 320.2 / 497.9 against 164.6 / 362.2 / 556.7).
// wgmma.mma_async m64n8k16 (the four warps' A from registers in this fragment layout, B from
// shared memory, K-major without swizzle: 128 bytes between the k-halves' core matrices) gives
// the same f32 words as four warps' mma.sync here, chained the same way (H200, session 32 call 4,
// three seeds: nibbles -8..7 times three planes, and bf16 of exponents within 2^+-20; chains of 2,
// 8 and 64 k-steps from zero and from random accumulators; 512 of 512 words in each of 24 cases).
// So a warpgroup path could take the place of this one in any variant without changing a row's
// bits. But with A decoded into registers as here it is not asynchronous: ptxas serializes each
// wgmma behind the decode of the next group's A while the one before is in flight ("C7513:
// wgmma.mma_async instructions are serialized due to non wgmma instructions defining input
// registers of a wgmma between start and end of the pipeline stage", NVRTC 13.0, sm_90a, a
// prototype of hy_mmv_2_8's work as two warpgroups of four tiles, session 32; not built); waiting
// for each group's wgmma before the next decode compiles without it, and A through shared memory
// (the decoded bf16, four times the weight bytes, stored and read back) would avoid it.
// A warpgroup matvec for the windows loses too (session 33, not kept): hy_mmw, one warpgroup a
// block, four tiles an item, warp q walking tile q's groups in order with the KS 8 ranges' sums
// added in registers in hy_mmp_run's order, each group two wgmma m64n24k16 (A decoded as here, B
// the call's 24 columns in natural column order, cp.async'd a stage at a time into a K-major core-
// matrix layout, LBO 384 / SBO 128), its sums scaled after wait 0. Its y equals hy_mmp_1_2_8's
// byte for byte at 1, 3 and 8 rows on the 9B gate/up, GDN in and attention in shapes and the 27B
// gate/up (H200, call 4). But ptxas (NVRTC 13.0) still puts each group's wait right after its
// wgmma, ahead of the next decode, even with the previous A kept live in other registers; and
// every block streaming the whole B from L2 in step with the others costs most: 9B gate/up, us
// at 1 / 4 / 8 rows against the rule's 17.59 / 24.56 / 31.9: 138.37 / 105.14 / 86.98; B through
// L1 (cp.async.ca) 54.03 / 54.22 / 53.83; no B copies 31.37 / 31.55 / 31.6; no wgmma 134.64 /
// 103.2 / 84.02; neither 25.98 / 26.04 / 26.12 (call 5). So even with B free it only ties at 8
// rows.
__device__ __forceinline__ void hy_mma(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The line holding p into L1 (no register, no wait): a later load of it hits there.
__device__ __forceinline__ void hy_pf_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// The f32 at shared address a + OFF (the offset an immediate of the load, which the compiler does
// not always fold from C++); ordered with the barriers and waits as the volatile asm around it.
template <int OFF>
__device__ __forceinline__ float hy_lds_f32(u32 a) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1+%2];" : "=f"(v) : "r"(a), "n"(OFF));
    return v;
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
            const size_t at = (size_t)r * jb.ystride + hy_pcol(o);
            ((bf16*)jb.y)[at] = hi;
            ((bf16*)jb.res)[at] = f32_to_bf16((a - bf16_to_f32(hi)) * 0.5f);
        } else {
            const int row = (tile0 + t) * 16 + i;
            if (row >= jb.rows) continue;
            const size_t at = (size_t)r * jb.ystride + row;
            ((float*)jb.y)[at] = jb.res ? ((const float*)jb.res)[at] + v : v;
        }
    }
}

// Stages of each warp's ring (at least three): S * 1088 bytes of dynamic shared memory a warp;
// hy_mmp's and hy_mmr's (HY_RUN_STAGES), and hy_mmv's (more blocks an SM, see hyb_mmp.cuh).
// H200, 9B, 3..16 rows: hy_mmp_run 4 stages deep is 1-8% faster than 8 deep on every set it ran
// (down at 3 rows 18.4 against 20.0 us, at 16 rows 52.5 against 54.3). Fetching a block's next
// items into L2 ahead of its ring (cp.async.bulk.prefetch.L2, one or two items on) loses on every
// shape (session 17: 9B gate/up at one row 20.9 against 25.5-26.1 us, decode step 2.23 against
// 2.55-2.64 ms). At one row 8 deep loses too, where a block's one item could then be all in flight
// at once (session 22, bench_kernels --models 9B,27B --rows 1 --variants all, us, 4 against 8
// deep): HY_RUN_STAGES, 9B o on hy_mmp_1_2_16 5.64 against 6.11, 9B down on hy_mmp_1_2_16 12.02
// against 13.27; HY_MV_STAGES, 9B gate/up on hy_mmv_2_8 19.03 against 24.70, 27B 32.93 against
// 39.77. So it does in the step's graph, where a launch's first stages come in while the kernel
// before it runs (session 26 call 4, `bench_decode --shapes 9b,27b --source mem --skip-matvec
// --tokens 32 --windows 8 --prompt 64`, device ms, 9b step / 8-row window / 27b step): 4 deep
// 2.0049 / 3.4106 / 6.024, HY_RUN_STAGES 8 2.0181 / 3.7495 / 6.0002, HY_MV_STAGES 8 2.3913 /
// 3.4211 / 6.9592.
// What a call costs beyond its copies (H200, `bench_kernels --models 9B --no-cublas`, us, gate/up /
// down / o, the LM head's ratio to the read bandwidth where given):
// - session 24 calls 10-11, one row: as it is 18.96 / 10.18 / 5.59; the rings' copies alone, each
//   stage waited for and nothing computed, 13.36 / 8.38 / 3.45 (0.888 / 0.706 / 0.573 of the read
//   bandwidth); a third of each unit's instructions left out (half the nibble decode, no shifts)
//   17.95 / 9.48 / 5.23, the decode's fma left out 18.54 / 9.69 / 5.48, the rung lookups 18.90 /
//   9.58 / 5.42; 8 stages deep 22.65 / 12.02 / 5.61 (copies alone 15.52 / 7.57 / 3.48).
// - session 25 call 3, --rows 1,8, a tree with each part left out, one row | 8 rows: as it is 19.0
//   / 10.28 / 5.65, head 160.45 (0.766) | 32.3 / 15.82 / 7.71, head 311.69; copies alone 13.42 /
//   8.41 / 3.46, head 129.08 (0.949) | 14.14 / 8.03 / 3.91, head 136.6; no decode and no mma (the B
//   loads, shared reads, rung lookups and fma kept) 15.79 / 8.96 / 4.49, head 131.09 | 22.6 / 13.99
//   / 6.36, head 214.81; the decode kept, no mma 18.23 / 9.33 / 5.01, head 146.49 | 28.23 / 15.66 /
//   7.12, head 277.39; B a constant (no B loads) 17.93 / 10.19 / 5.13, head 159.73 | 24.63 / 12.22
//   / 6.45, head 242.46.
// - session 25 call 8, --rows 1,4,8,16, gate/up / down: as it is 19.1 / 10.35, 25.88 / 14.28, 32.26
//   / 15.74, 51.89 / 33.9; no B loads 17.74 / 10.18, 21.98 / 10.99, 24.51 / 12.16, 34.41 / 14.81;
//   every group's B loads from the warp's first group (the same instructions, all L1 hits) 17.73 /
//   9.98, 23.36 / 12.07, 29.51 / 14.68, 50.5 / 23.12.
// - session 25 call 2 (`--models 9B,27B --rows 1,8,16`, and `bench_decode --shapes 9b,27b --source
//   mem --skip-matvec --tokens 32 --windows 8,16 --prompt 64`, device ms): stage i + S - 1 issued
//   before the wait for stage i (S stages in flight while a warp waits, not S - 1) ties: 19.13 /
//   10.24 / 5.37 against 19.13 / 10.32 / 5.62, 9b step 2.0185 against 2.015, 27b 6.1271 against
//   6.0304, 9B gate/up at 16 rows 60.47 against 51.97; each stage's bytes taken into registers and
//   its slot refilled before its math (S in flight throughout; hy_mmv_2_8's stack 8 -> 56 bytes)
//   loses: 21.44 / 10.36 / 5.97, 9b 2.1584, 27b 6.8345.
// So at one row a warp's lookahead is not the limit: in the head's steady state the decode and
// the mma cost about 15 us each over the copies' 129 (latency of a stage's chain, with the issue
// slots half busy), the B loads 7% of an unstaged call (none of a staged one), and a short matrix
// loses its first and last microseconds besides (the copies alone reach 0.573 of the bandwidth on
// o, 0.949 on the head). Past one row the B loads grow (three n-tiles' fragments a group at 8
// rows, 1.5 KiB a warp against 512 weight bytes; six at 16, fetched a group at a time): a quarter
// of an 8-row call, a third to a half of a 16-row one, of which L1 hits would save about half.
// Nor does a producer warp beside the consumers win: hy_mmw_{TB}_{KS} (session 27; not kept),
// KS consumer warps with this split, sums and order (the same bits as hy_mmv at one and two rows
// on every set it ran) and one warp streaming each stage's runs (each consumer's groups of each
// tile, ng 256 weight bytes and ng 16 code bytes) by bulk copies (L2 evict_first) into a ring of
// R slots of KS TB GW 272 bytes on full / empty mbarriers, the call's B staged as hy_mmvs does,
// consumers synced by a named barrier, loses on every set at one to three blocks an SM (R 11 to
// 2), slowest at one (H200, session 27 call 2, graph of back-to-back launches over weights larger
// than L2, us, hy_mmw at its best count against the rule's variant): 27B gate/up 37.2 (3 an SM,
// TB 1) against 32.86 (hy_mmv_2_8), at one an SM 53.13; 27B down 25.96 against 20.51; o 9.8
// against 8.42; GDN in 19.53 against 16.29 (hy_mmvs_2_8); attention in 17.73 against 15.97; head
// 244.66 against 206.76 (at one an SM 350.45); 9B GDN in 12.25 against 10.24. Eight consumer
// warps an SM fed from a ring 11 stages deep reach 0.34-0.43 of the read bandwidth: the
// consumers' own pace, not the memory's, bounds the one-row call.
// Four is the best depth of hy_mmv's ring at one row, where the depths between the powers of two
// fit as many blocks an SM (hy_mmv_2_8: three up to 7 deep), and of hy_mmp's over the windows
// (H200, session 31; `bench_kernels --models 9B,27B --rows 1,2 --no-cublas --define
// HY_MV_STAGES=S`, us at one row, and `bench_decode --shapes 9b,27b --source mem --skip-matvec
// --tokens 32 --windows 2 --prompt 64`, device ms, two runs each):
// - HY_MV_STAGES 4 / 5 / 6 / 7 (call 1): 9B gate/up 17.87 / 19.62 / 21.48 / 23.13, 9B down 10.06
//   / 10.46 / 10.82 / 11.94, 9B head 158.65 / 170.76 / 182.2 / 187.8, 27B gate/up 31.47 / 31.53 /
//   37.34 / 38.43; 9b step 1.9725 / 1.9763, 2.1097 / 2.1109, 2.2109 / 2.2061, 2.2924 / 2.2941;
//   27b step 5.8957 / 5.9419, 6.0641 / 6.0818, 6.7306 / 6.7208, 6.9143 / 6.9502.
// - HY_MV_STAGES 3 (call 2, --windows 2,8): 9b step 2.0153 / 2.0167 against 1.9772 / 1.9735, 27b
//   6.0622 / 6.0312 against 5.8682 / 5.9099.
// - HY_RUN_STAGES 3 as well (call 2, --rows 1,2,4,8,16, us, against HY_MV_STAGES 3 alone): the
//   few-row calls on hy_mmp_1 gain (9B q at two rows 8.81 -> 7.53, 9B down at 2 / 4 / 8 rows 12.06
//   / 14.12 / 15.59 -> 10.24 / 12.9 / 15.25), the wide ones lose (9B gate/up at 8 / 16 rows 32.11
//   / 50.02 -> 32.92 / 62.23, 27B gate/up 56.9 / 97.96 -> 58.52 / 123.09): 9b 2-row window 2.1182
//   / 2.1056 against 4 / 4 deep's 2.1456 / 2.1461, 8-row 3.3037 / 3.2849 against 3.3079 /
//   3.3253, 27b 8-row 10.3102 / 10.3122 against 10.1357 / 10.1389.
#ifndef HY_RUN_STAGES
#define HY_RUN_STAGES 4
#endif
#ifndef HY_MV_STAGES
#define HY_MV_STAGES 4
#endif
#define HY_STAGE 1088

// The shared tables of an hy_mmp block (see hy_mmp).
// lad[t][c][r] is rung c of tile t's row r: the eight rows a lookup's lanes read (gid, or gid +
// 8) then fall in eight distinct banks whatever their codes (bank 16 (c & 1) + r), where a row of
// 33 rungs gave bank r + c and random codes cost about 1.7 wavefronts a lookup (ncu, session 19:
// 26% of hy_mmv_2_8's shared wavefronts excessive); lad_store writes it contiguously.
template <int NC, int TB, int KS>
struct HySmem {
    float lad[TB][32][16];
    __align__(16) float red[KS][TB][128];
    float out[TB][16][8 * NC];
    // each warp's mbarriers of its staged columns' bulk copies (hy_mmvs, sm_90): their first
    // groups, then the rest
    unsigned long long mbar[2][KS];
};

// A group's B fragments of each n-tile (k-step 0: b0, b1; k-step 1: b0, b1): this lane's 16
// bytes of the group in its column (planes in fragment order, hyb_mma.cuh), from its column
// pointers advanced to the group (see hy_mmp_run); none when !ok.
template <int NTC>
__device__ __forceinline__ void hy_ldb(u32 (*b)[4], const uint4* const* bq, int gr, bool ok) {
#pragma unroll
    for (int j = 0; j < NTC; ++j) {
        if (ok) {
            const uint4 v = __ldg(bq[j] + 4 * gr);
            b[j][0] = v.x, b[j][1] = v.y, b[j][2] = v.z, b[j][3] = v.w;
        }
    }
}

// Bytes between two columns of hy_mmv's staged B (hy_mmp_run with SB): a column's 64 bytes a
// group, then 0 or 64 more, so each column starts 64 bytes (mod 128) after the one before it and
// the two columns a quarter warp's 16-byte loads read (lanes 8 i .. 8 i + 7: columns 2 i, 2 i + 1)
// fall in distinct banks.
__device__ __forceinline__ int hy_sb_stride(int gpr) { return gpr * 64 + ((64 - gpr * 64) & 127); }

// The ring slot of stage i >= 0 of a ring S stages deep (a mask where S is a power of two).
template <int S>
__device__ __forceinline__ int hy_slot(int i) { return (S & (S - 1)) == 0 ? i & (S - 1) : i % S; }

// hy_mmp's work for calls whose columns fill NTC n-tiles (NTC = ceil(3 n / 8)), each warp's ring
// S stages deep, whole stages without per-group exits when NTC <= WH (the register cap the caller
// runs under decides what fits; 0: never); see hy_mmp. The sums and their order depend on KS
// alone. With SB (one n-tile):
// each warp first stages its own groups of the call's 3 n columns after the warps' rings (column
// c at c hy_sb_stride(gpr)) and reads each group's B fragments there instead of from L2 (the
// same values, so the same sums). With UNR, whole stages run S at a time (the loop unrolled by
// the ring's depth), so every stage's slot and the slot its issue refills are constants: the ring
// reads, copies and B loads take immediate offsets (the same sums). With PFL, each item's ladder
// rows go into L1 while the item before it streams (the same values).
template <int NC, int NTC, int TB, int KS, int S, int WH, bool SB = false, bool UNR = false, bool PFL = false>
__device__ __forceinline__ void hy_mmp_run(const HyJob* jobs, int nj, const bf16* p0, const bf16* p1,
                                           const bf16* p2, int xs, int n, int cols, int total,
                                           HySmem<NC, TB, KS>& sm) {
    static_assert(!SB || NTC == 1, "staged B: one n-tile");
    // GS groups a stage (4 units: one group of four tiles, 2 groups of both tiles, or 4 groups of
    // one tile)
    static_assert(TB == 1 || TB == 2 || TB == 4, "tiles a block: 1, 2 or 4");
    constexpr int GS = 4 / TB, STAGE = HY_STAGE;
    constexpr int LE = TB * 512 / (KS * 32);
    // the next group's B fragments held in registers while this one computes, where they fit.
    // Fetching them into L1 further ahead as well (prefetch.global.L1 of each lane's 16 bytes, 2
    // or 4 groups on, past one n-tile) loses everywhere (H200, session 23 call 2, `bench_kernels
    // --models 9B,27B --rows 4,8,16`, us, none / 2 / 4 ahead: 9B gate/up at 8 rows 31.9 / 42.8 /
    // 40.5, 27B down at 8 rows 36.5 / 61.8 / 57.9, 9B head at 16 rows 495 / 526 / 518), and at one
    // n-tile, where ncu puts 15% of hy_mmv_2_8's stall samples on these loads and the mma waiting
    // for them (session 32 call 7, `ncu --section SourceCounters`, 9B gate/up, one row: the group's
    // __ldg 7.2%, long scoreboard at the mma 7.6%), as well (call 8: hy_pf_l1 of group gr + D's
    // 16 bytes beside group gr + 1's load; `bench_kernels --models 9B,27B --rows 1,2 --no-cublas`,
    // us at one row, none / D 2 / 4 / 6: 9B gate/up 18.06 / 21.25 / 20.2 / 19.86, GDN in 10.36 /
    // 11.23 / 11.3 / 11.23, 27B down 19.13 / 28.41 / 26.55 / 25.74; `bench_decode --shapes 9b,27b
    // --source mem --skip-matvec --tokens 32 --windows 2,8 --prompt 64`, device ms, D 4 against
    // none: 9b step 2.257 / 2.2565 against 1.9549 / 1.9577, 27b 6.8084 / 6.7043 against 5.8621 /
    // 5.8033).
    constexpr bool PF = NTC <= 3;
    static_assert(S >= 3, "ring stages: at least three");
    extern __shared__ __align__(16) unsigned char hy_ring[];
    int bi = blockIdx.x;
    const int gpr = cols >> 5;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gid = lane >> 2;
    const int g_lo = w * gpr / KS, g_hi = (w + 1) * gpr / KS, ng = g_hi - g_lo, nst = (ng + GS - 1) / GS;
    const u32 ring = (u32)__cvta_generic_to_shared(hy_ring) + w * S * STAGE;
    const unsigned char* ringp = hy_ring + w * S * STAGE;
    const u32 k_mask = 0x000F000Fu, k_magic = 0x43004300u, k_one = 0x3F803F80u, k_m136 = 0xC308C308u;
    // this lane's 16 bytes of its B column in each n-tile (hy_bcol's q = 8 j + gid) at the warp's
    // first group
    const uint4* bq[NTC];
#pragma unroll
    for (int j = 0; j < NTC; ++j)
        bq[j] = (const uint4*)(hy_bcol(p0, p1, p2, xs, n, 8 * j + gid) + (size_t)g_lo * 32) + (lane & 3);
    // SB: the staged columns, and this lane's 16 bytes of its column there at the warp's first
    // group (past the call's 3 n columns: the last one, read, unused)
    const int sbs = hy_sb_stride(gpr);
    const u32 bsm = (u32)__cvta_generic_to_shared(hy_ring) + KS * S * STAGE;
    const u32 bsl = bsm + (u32)(min(gid, 3 * n - 1) * sbs + g_lo * 64 + (lane & 3) * 16);
    // lad[0][0][gid]'s shared address: lad[t][c][gid] is t LT + c LC bytes on, its row gid + 8 LH
    // further
    constexpr int LT = sizeof(sm.lad[0]), LC = sizeof(sm.lad[0][0]), LH = 8 * sizeof(float);
    const u32 lrow = (u32)__cvta_generic_to_shared(&sm.lad[0][0][gid]);
    // the item being fetched: its job, tiles, this lane's copy sources and the rows left from its
    // first tile. Stage i holds units u = 0..3 (256 weight bytes each, then their 16 code bytes):
    // TB 4: tile u of group g_lo + i; TB 2: tile u & 1 of group g_lo + 2 i + (u >> 1); TB 1: group
    // g_lo + 4 i + u. Lane l copies chunk l and l + 32 of the weights (unit c >> 4, bytes (c & 15)
    // 16), lanes 0-3 unit l's codes.
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
             ((size_t)tile0 * gpr + (TB > 1 ? uw * gpr : uw) + g_lo) * 256 + (lane & 15) * 16;
        cl = (const unsigned char*)jobs[ji].aux0 +
             ((size_t)tile0 * gpr + (TB == 4 ? uc * gpr : TB == 2 ? (uc & 1) * gpr + (uc >> 1) : uc) + g_lo) * 16;
        lsrc = (const float*)jobs[ji].aux1 + (size_t)tile0 * 32;
    };
    // stage i's copies into ring slot k (i % S); every lane commits a group, copies or not, so
    // the counts stay uniform. The weights and codes go as L2's first to leave (each byte is read
    // once a call), so the planes, residuals, states and K/V rows the step reads again stay there:
    // H200, session 27 call 7, `bench_decode --shapes 9b,27b --source mem --skip-matvec --tokens 32
    // --windows 8 --prompt 64`, device ms, two runs each, 9b step / 8-row window / 27b step / 8-row
    // window: evict-first 2.0019 / 3.3572 / 5.909 / 10.253 and 1.9995 / 3.3707 / 5.8956 / 10.248
    // against the default policy's 2.0055 / 3.4272 / 5.9927 / 10.3783 and 2.0028 / 3.421 / 6.0397
    // / 10.3865 (registers and spills of every weight-side kernel unchanged, ptxas -v).
    // Nor does each warp's lane 0 filling its ring by bulk copies win at one row (session 31 call
    // 4, not kept: each tile's run of a stage's groups and its codes one cp.async.bulk apiece, 512
    // and 32 bytes at TB 2, evict-first, on an mbarrier a slot, the slot's parity tracked; the same
    // bits, the GPU suite 284 passed): `bench_kernels --models 9B,27B --rows 1,8 --no-cublas`, us at
    // one row, 9B gate/up 23.15 against 17.98, 9B down 12.58 against 10.11, 9B head 211.61 against
    // 159.31, 27B gate/up 41.84 against 31.56; `bench_decode --shapes 9b,27b --source mem
    // --skip-matvec --tokens 32 --windows 2,8 --prompt 64`, device ms, 9b step 2.3512 / 2.3511
    // against 1.9791 / 1.9796, 27b 7.095 / 7.039 against 5.8907 / 5.932.
    const u64 wpol = l2_evict_first();
    auto issue = [&](int i, int k) {
        const u32 slot = ring + k * STAGE;
        const int uw = lane >> 4;
        bool ok0, ok1, okc;
        if (TB == 4) {
            ok0 = uw < nvt && i < ng;
            ok1 = 2 + uw < nvt && i < ng;
            okc = lane < 4 && lane < nvt && i < ng;
        } else if (TB == 2) {
            ok0 = uw < nvt && 2 * i < ng;
            ok1 = uw < nvt && 2 * i + 1 < ng;
            okc = lane < 4 && (lane & 1) < nvt && 2 * i + (lane >> 1) < ng;
        } else {
            ok0 = 4 * i + uw < ng;
            ok1 = 4 * i + 2 + uw < ng;
            okc = lane < 4 && 4 * i + lane < ng;
        }
        const unsigned char* src = wl + (size_t)i * (GS * 256);
        cp_async16_if(ok0, slot + lane * 16, src, wpol);
        cp_async16_if(ok1, slot + 512 + lane * 16, src + (TB == 4 ? (size_t)2 * gpr * 256 : TB == 2 ? 256 : 512), wpol);
        cp_async16_if(okc, slot + 1024 + (lane & 3) * 16, cl + (size_t)i * (GS * 16), wpol);
        cp_async_commit();
    };
    // the residual an epilogue thread adds first (hy_epilogue's k = tid, 16 rows a tile), to L1
    // with the item's first stages (a pair's res is an output plane: nothing to fetch)
    auto pf_res = [&]() {
        const HyJob& jb = jobs[ji];
        const int k = tid;
        if (!jb.res || (jb.kind & HY_PAIR) || k >= n * TB * 16) return;
        const int r = k / (TB * 16), t = (k / 16) % TB, row = (tile0 + t) * 16 + k % 16;
        if (t < nvt && row < jb.rows) hy_pf_l1((const float*)jb.res + (size_t)r * jb.ystride + row);
    };
    // PFL: the ladder rows of the item after the located one into L1 (where it is of the same
    // job), a whole item ahead of the lad_load that reads them
    auto pf_lad = [&]() {
        const int r0 = (tile0 + (int)gridDim.x * TB + tid) * 16;
        if (PFL && tid < TB && r0 < jobs[ji].rows) hy_pf_l1(lsrc + ((size_t)gridDim.x * TB + tid) * 32);
    };
    // the item's ladder table: this thread's entries k = tid + e KS 32 of lad (flat: tile k >> 9,
    // code (k >> 4) & 31, row k & 15; row params fetched early into lo_r / st_r, rungs made later);
    // rows past the matrix get rung 0
    float lo_r[LE], st_r[LE];
    auto lad_load = [&]() {
#pragma unroll
        for (int e = 0; e < LE; ++e) {
            const int k = tid + e * KS * 32, r = (k >> 9) * 16 + (k & 15);
            hy_lad(lsrc, r, rleft, lo_r[e], st_r[e]);
        }
    };
    auto lad_store = [&]() {
#pragma unroll
        for (int e = 0; e < LE; ++e) {
            const int k = tid + e * KS * 32, c = (k >> 4) & 31;
            sm.lad[k >> 9][c][k & 15] = hy_rung(lo_r[e], st_r[e], c);
        }
    };
    // B fragments of group gr in bb[gr & 1] (GS 2 or 4: the parity is gu's; GS 1: the next
    // group's go to bb[1], moved to bb[0] once this one is done); an item's
    // first group's (the same for every item: the columns and the warp's groups do not change)
    // are loaded before its rung table is stored, the first item's after pdl_begin
    u32 bb[2][NTC][4];
    auto ldb = [&](u32 (*b)[4], int gr, bool ok) {
        if (SB) {
            if (ok) lds128(b[0], bsl + gr * 64);
        } else {
            hy_ldb<NTC>(b, bq, gr, ok);
        }
    };
    // the first item's weights in flight, its rung table made and (PFL) the next item's ladder
    // rows fetched, all from data no kernel writes, before pdl_begin; the activations and the
    // residual after it. The ladder rows loaded before the weight stages rather than after them,
    // so they do not queue behind a launch's first stages, tie or lose (session 31 call 3, the
    // bench_decode command above, device ms, two runs each: 9b step 1.9716 / 1.9725 against
    // 1.9768 / 1.9687, 27b 5.9601 / 5.9038 against 5.858 / 5.865, 27b 2-row window 6.2108 /
    // 6.2099 against 6.1787 / 6.1735).
    locate(bi);
    pf_lad();
    if (TB > 1) {
        // the ring's code bytes zeroed before its first copies: a tile past the matrix reads codes
        // no copy of its item wrote, which must index lad (< 32)
        for (int c = lane; c < S * 8; c += 32)
            *(uint2*)(hy_ring + (w * S + (c >> 3)) * STAGE + 1024 + (c & 7) * 8) = make_uint2(0u, 0u);
        __syncwarp();
    }
    for (int i = 0; i < S - 1; ++i) issue(i, i);
    lad_load();
    lad_store();
    pdl_begin();
    pf_res();
    // (SB, sm_90) the shared address of the warp's mbarrier of its staged columns' copy p
    auto sb_mbar = [&](int p) { return (u32)__cvta_generic_to_shared(&sm.mbar[p][w]); };
    if (SB) {
        // the warp's own groups of the call's columns (only its lanes read them)
#if __CUDA_ARCH__ >= 900
        // two bulk copies a column, counted on the warp's own mbarriers (so waiting for them does
        // not wait for the weight stages in flight before them): the groups of the first S stages
        // and the one after them, waited for here, and the rest, waited for at stage S (sb_wait),
        // so the first stages run while the rest land. One copy a column, all waited for here,
        // gave the same bits and a longer ramp (H200, session 32 call 9, against it: `bench_kernels
        // --models 9B --rows 1 --no-cublas --variants all`, us, hy_mmvs_2_16 on the down 10.01
        // against 10.18, on o 5.63 against 5.83, hy_mmvs_2_8 on gate/up 18.81 against 20.66, GDN in
        // 10.49 against 10.92, attention in 10.09 against 10.66; `bench_decode --shapes 9b,27b
        // --source mem --skip-matvec --tokens 32 --windows 2,8 --prompt 64`, device ms, two runs
        // each: 9b step 1.958 / 1.9616 against 1.9554 / 1.9583, 27b 5.7861 / 5.7652 against 5.8499
        // / 5.8107, windows within 0.4% either way). hy_mmv's loads a group ahead still beat it on
        // the 9B gate/up, GDN in and attention in sets (18.14, 10.25, 9.25 us; those sets forced
        // onto hy_mmvs_2_8, `--force 1@768x4096=0_2_8s,1@384x4096=0_2_8s,1@320x4096=0_2_8s`: 9b
        // step 2.0227 / 2.0257).
        const u32 mb = sb_mbar(0), mb1 = sb_mbar(1);
        const int g1 = min(ng, S * GS + 1);
        if (lane == 0) {
            mbar_init(mb, 1);
            mbar_init(mb1, 1);
            mbar_init_fence();
            mbar_expect(mb, 3 * n * g1 * 64);
            mbar_expect(mb1, 3 * n * (ng - g1) * 64);
        }
        __syncwarp();
        // lane c copies column c (n <= 2: 3 n lanes)
        if (lane < 3 * n && ng > 0) {
            const u32 dst = bsm + (u32)(lane * sbs + g_lo * 64);
            const bf16* src = hy_bcol(p0, p1, p2, xs, n, lane) + (size_t)g_lo * 32;
            bulk_g2s(dst, src, g1 * 64, mb);
            if (ng > g1) bulk_g2s(dst + g1 * 64, src + (size_t)g1 * 32, (ng - g1) * 64, mb1);
        }
        __syncwarp();
        mbar_wait(mb, 0);
#else
        // 16 bytes a copy, as one more cp.async group, waited for with the first stages (issued
        // before it)
        for (int c = 0; c < 3 * n; ++c) {
            const bf16* src = hy_bcol(p0, p1, p2, xs, n, c) + (size_t)g_lo * 32;
            const u32 dst = bsm + (u32)(c * sbs + g_lo * 64);
            for (int k = lane; k < ng * 4; k += 32) cp_async16(dst + k * 16, src + k * 8);
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncwarp();
#endif
    }
    if (PF) ldb(bb[0], 0, ng > 0);
    __syncthreads();
    for (;;) {
        float acc[TB][NTC][4];
#pragma unroll
        for (int t = 0; t < TB; ++t)
#pragma unroll
            for (int j = 0; j < NTC; ++j) acc[t][j][0] = acc[t][j][1] = acc[t][j][2] = acc[t][j][3] = 0.0f;
        // stage i's units; a whole stage (all GS groups < ng, every stage but maybe the last)
        // without the per-group exit, so its units' decode, mma and scaling interleave
        // (k: stage i's slot, i % S, a constant where the caller's loop is unrolled by S)
        auto stage = [&](int i, int k, bool whole) {
            // this lane's copies of stage i done, then every lane's (and every lane is past
            // stage i - 1, whose slot the next issue refills)
            cp_async_wait<S - 2>();
            __syncwarp();
            issue(i + S - 1, hy_slot<S>(k + S - 1));
            const unsigned char* st = ringp + k * STAGE;
#pragma unroll
            for (int gu = 0; gu < GS; ++gu) {
                const int gr = i * GS + gu;  // the group, from g_lo
                if (!whole && gr >= ng) break;
                u32 (*bc)[4] = bb[GS == 1 ? 0 : gu & 1];
                if (PF)
                    ldb(bb[GS == 1 ? 1 : (gu + 1) & 1], gr + 1, gr + 1 < ng);
                else
                    ldb(bc, gr, true);
                // every tile of the group (TB 2, 4; a tile past the matrix computes stale ring
                // bytes, its codes an earlier item's or the ring's first zeros, into sums never
                // stored), or the one tile
#pragma unroll
                for (int t = 0; t < TB; ++t) {
                    const int u = TB == 4 ? t : TB == 2 ? 2 * gu + t : gu;
                    const uint2 wv = *(const uint2*)(st + u * 256 + lane * 8);
                    const u32 cl = lrow + st[1024 + u * 16 + gid] * LC, ch = lrow + st[1024 + u * 16 + gid + 8] * LC;
                    const float rl = t == 0 ? hy_lds_f32<0>(cl) : t == 1 ? hy_lds_f32<LT>(cl)
                                   : t == 2 ? hy_lds_f32<2 * LT>(cl) : hy_lds_f32<3 * LT>(cl);
                    const float rh = t == 0 ? hy_lds_f32<LH>(ch) : t == 1 ? hy_lds_f32<LT + LH>(ch)
                                   : t == 2 ? hy_lds_f32<2 * LT + LH>(ch) : hy_lds_f32<3 * LT + LH>(ch);
                    u32 a[8];
                    hy_unit_a(wv, k_mask, k_magic, k_one, k_m136, a);
#pragma unroll
                    for (int j = 0; j < NTC; ++j) {
                        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        hy_mma(s, a[0], a[1], a[2], a[3], bc[j][0], bc[j][1]);
                        hy_mma(s, a[4], a[5], a[6], a[7], bc[j][2], bc[j][3]);
                        acc[t][j][0] = fmaf(rl, s[0], acc[t][j][0]);
                        acc[t][j][1] = fmaf(rl, s[1], acc[t][j][1]);
                        acc[t][j][2] = fmaf(rh, s[2], acc[t][j][2]);
                        acc[t][j][3] = fmaf(rh, s[3], acc[t][j][3]);
                    }
                }
                if (GS == 1 && PF) {
#pragma unroll
                    for (int j = 0; j < NTC; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) bb[0][j][e] = bb[1][j][e];
                }
            }
        };
        const int nwhole = NTC <= WH ? ng / GS : 0;
        // (SB, sm_90: the staged columns' groups past the first S stages' and the group after
        // them, at stage S, before any of them is loaded)
        auto sb_wait = [&](int i) {
#if __CUDA_ARCH__ >= 900
            if (SB && i == S) mbar_wait(sb_mbar(1), 0);
#endif
        };
        // (UNR: whole stages S at a time, each one's slot a constant)
        int i = 0;
        if (UNR) {
            for (; i + S <= nwhole; i += S) {
                sb_wait(i);
#pragma unroll
                for (int k = 0; k < S; ++k) stage(i + k, k, true);
            }
        }
        for (; i < nwhole; ++i) {
            sb_wait(i);
            stage(i, hy_slot<S>(i), true);
        }
        for (; i < nst; ++i) {
            sb_wait(i);
            stage(i, hy_slot<S>(i), false);
        }
        // this item's outputs; then the next item's first stages and ladders go out before the
        // reduction, so its memory latency hides behind it (every lane past its last stage first:
        // the refill reuses the slots)
        __syncwarp();
        const int oji = ji, otile0 = tile0, onvt = nvt;
        const int bn = bi + (int)gridDim.x;
        if (bn < total) {
            locate(bn);
            pf_lad();
            for (int i = 0; i < S - 1; ++i) issue(i, i);
            pf_res();
            lad_load();
        }
        // the warps' sums, one n-tile at a time, added in warp order into out[t][row][column]
#pragma unroll
        for (int j = 0; j < NTC; ++j) {
#pragma unroll
            for (int t = 0; t < TB; ++t)
                *(float4*)&sm.red[w][t][lane * 4] = make_float4(acc[t][j][0], acc[t][j][1], acc[t][j][2], acc[t][j][3]);
            __syncthreads();
            // (TB 4 at KS 8: two entries a thread)
            constexpr int RE = (TB * 128 + KS * 32 - 1) / (KS * 32);
#pragma unroll
            for (int q = 0; q < RE; ++q) {
                const int k = tid + q * KS * 32;
                if (k < TB * 128) {
                    const int t = k >> 7, f = k & 127;
                    float s = sm.red[0][t][f];
                    for (int v = 1; v < KS; ++v) s += sm.red[v][t][f];
                    const int fl = f >> 2, e = f & 3;
                    sm.out[t][(fl >> 2) + 8 * (e >> 1)][8 * j + 2 * (fl & 3) + (e & 1)] = s;
                }
            }
            __syncthreads();
        }
        hy_epilogue<NC, TB, KS>(jobs[oji], otile0, onvt, sm.out, n);
        if (bn >= total) break;
        // The next item's rung table, and a barrier before any warp reads it. Two tables, the
        // next item's made in the other one before the reduction's last barrier (which then
        // publishes it, so no warp waits here for the epilogue's threads), give the same bits
        // (GPU suite 284 passed on that tree) but lose the one-row calls (H200, session 32 call 6;
        // `bench_kernels --models 9B,27B --rows 1,2,8 --no-cublas`, us at one row, against this
        // tree: 9B gate/up 18.36 against 18.05, GDN in 10.85 against 10.35, attention in 9.61
        // against 9.28, down 9.98 against 10.22; `bench_decode --shapes 9b,27b --source mem
        // --skip-matvec --tokens 32 --windows 2,8 --prompt 64`, device ms, two runs each: 9b step
        // 1.9787 / 1.9797 against 1.9562 / 1.9549, 2-row window 2.1866 / 2.1891 against 2.1514 /
        // 2.1512).
        if (PF) ldb(bb[0], 0, ng > 0);
        lad_store();
        __syncthreads();
        bi = bn;
    }
    hy_tl_end();
}
