// The small path's weight side (the reference's hy_repack, hy_mmp_{NT}_{TB}_{KS}, hy_split,
// hy_rmsnorm2): q4tp weights in the mma.sync m16n8k16 A-fragment layout, multiplied on the tensor
// cores by activations given as three bf16 planes of each f32 value. This file: the layout, put3,
// HyJob, hy_repack, hy_split, hy_rmsnorm2; the matvec itself is in hyb_mmp_core.cuh (per-tile
// path) and hyb_mmp.cuh (the entry points).
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
// A row's columns are stored in fragment order (hy_pcol): within each group of 32, column
// 8 a + 2 t + e (a, t < 4, e < 2) at 8 t + 2 a + e, so the four column pairs an mma's B fragment
// takes from a group for lane (gid, t) (2 t + 8 a: b0, b1 of k-step 0, then of k-step 1) are its
// 16 bytes at 16 t: one 16-byte load a lane and n-tile, where the columns' natural order needs
// four 4-byte loads, each touching eight lines. The layout asks a stride of a multiple of 8 and
// 16-byte aligned planes; a row's width is a multiple of 32 (the matvec's cols).

// A row's rung of code c: exp2(lo + c * step), with no contraction (lo + c * step rounded as the
// host's float32 arithmetic rounds it).
__device__ __forceinline__ float hy_rung(float lo, float st, int c) {
    return exp2f(__fadd_rn(lo, __fmul_rn((float)c, st)));
}

// Row r's ladder (lo, step) from lad [rows][2]; a row past the matrix gets (-inf, 0): rung 0.
__device__ __forceinline__ void hy_lad(const float* lad, int r, int rows, float& lo, float& st) {
    lo = r < rows ? lad[2 * r] : -__int_as_float(0x7f800000);
    st = r < rows ? lad[2 * r + 1] : 0.0f;
}

// Column q of a call's B, three columns a row (plane q % 3 of row q / 3), as its row in that plane;
// a column past the call's 3 n columns gives row 0 (loaded, never used).
__device__ __forceinline__ const bf16* hy_bcol(const bf16* p0, const bf16* p1, const bf16* p2, int xs, int n, int q) {
    const int r = q / 3, p = q - 3 * r;
    return (p == 0 ? p0 : (p == 1 ? p1 : p2)) + (size_t)(r < n ? r : 0) * xs;
}

// One f32 as its three plane values (hi, mid, lo above).
__device__ __forceinline__ void hy_split3(float y, bf16& hi, bf16& mid, bf16& lo) {
    hi = f32_to_bf16(y);
    const float r = y - bf16_to_f32(hi);
    mid = f32_to_bf16(r);
    lo = f32_to_bf16(r - bf16_to_f32(mid));
}

// Where a row's column c is stored in its planes (fragment order, above).
__device__ __forceinline__ int hy_pcol(int c) {
    return (c & ~31) | ((c >> 1) & 3) << 3 | ((c >> 3) & 3) << 1 | (c & 1);
}

// One f32 into the three planes as column c of the row that starts at element `row`.
__device__ __forceinline__ void put3(bf16* p0, bf16* p1, bf16* p2, size_t row, int c, float y) {
    bf16 hi, mid, lo;
    hy_split3(y, hi, mid, lo);
    const size_t i = row + hy_pcol(c);
    p0[i] = hi;
    p1[i] = mid;
    p2[i] = lo;
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

// A launch's job table, passed by value in the kernel parameters (__grid_constant__), so a block
// reads its job from the constant bank the launch filled instead of a dependent global load
// before its first weight fetch; entries past nj are unused.
#define HY_MAXJ 8
struct HyJobs {
    HyJob j[HY_MAXJ];
};

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

// hy_split: x [n][xs] f32, its first `cols` columns, into the planes p0, p1, p2 [n][os] bf16 (put3).
// Grid ceil(n * cols / 256), block 256.
extern "C" __global__ void hy_split(const float* x, int xs, int cols, bf16* p0, bf16* p1, bf16* p2, int os, int n) {
    pdl_begin();
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)n * cols) return;
    const int r = (int)(k / cols), c = (int)(k % cols);
    put3(p0, p1, p2, (size_t)r * os, c, x[(size_t)r * xs + c]);
}

// hy_rmsnorm2: row r = blockIdx.y of x [n][hidden] f32 normalised,
//   y = x / sqrt(mean(x^2) + eps) * (gemma ? 1 + w : w), w [hidden] f32,
// written to the planes p0, p1, p2 [n][ps] bf16 (put3) and, when xf != 0, to xf [n][hidden] f32.
// Grid (ceil(hidden / 1024), n), block 256; hidden % 32 == 0 (16-byte rows of x and xf, whole
// groups of the planes' fragment order) and, past one row, ps % 8 == 0. Each block sums the
// whole row: thread t over the float4s t, t + 256, ... (up to eight of them loaded before any is
// added), the four lanes of each in order, then warp butterflies, then warps in order: the same
// sum in every block, row and call.
// Thread t of block bx writes columns 4q .. 4q + 3, q = 256 bx + t, from the float4 it loaded.
// PDL: a call of at most HY_EARLY_ROWS rows lets the matvec after it launch before its wait
// (common.cuh), the rest after it.
// Running the norm inside the one-row matvec after it instead (each block of an hy_mmvs-like launch
// taking the row's denominator and making its staged columns from the row; the same bits, 65
// launches fewer on the 9B) loses: the step 2.0076 / 2.011 -> 2.1512 ms device (H200, session 24
// calls 3 and 5, `bench_decode --shapes 9b --source mem --skip-matvec --tokens 16 --windows ''
// --prompt 64`; 2.337 with the prologue's loads one group at a time, call 4); the 9B gate/up set
// alone, launched back to back (call 6, us): hy_mmv_2_8 19.04, hy_mmvs_2_8 19.88, fused 22.80,
// where the norm's launch costs the step about 1.86 us (call 2: 2.0166 -> 1.8954 ms without the
// 65 norms). Running it instead in the last block to finish of the launch before it, the one that
// adds into the row (every block counting itself in on an arrival count, as hy_argmax's parts do;
// that block taking the row's parts in turn, 256 threads each; the same bits, GPU suite 305 passed
// on that tree, 214 nodes a 9b step against 277) loses too (H200, session 25 calls 9-10,
// `bench_decode --shapes 9b,27b --source mem --skip-matvec --tokens 32 --windows 8 --prompt 64`,
// device ms): 9b step 2.0108 -> 2.2653, 8-row window 3.421 -> 4.9939, 27b step 6.0219 -> 7.3427;
// a part of that block's turn costs about as much as a whole launch of this kernel, and the code
// after the matvec alone costs hy_mmv_2_8 registers (its stack 8 -> 56 bytes; `bench_kernels
// --models 9B --rows 1`, no norm run: gate/up 18.97 -> 19.9 us, GDN in 10.43 -> 11.52). Loading
// the weights before pdl_begin (no kernel writes them) changes nothing (call 11, the same
// command, two runs each: 9b 2.0104 / 2.0177 against 2.0089 / 2.0098, 27b 6.0548 / 6.0088
// against 6.0599 / 5.9916). In the step's graph (call 16, `bench_decode --shapes 9b --timeline`) a
// norm costs 3.7 us from its wait returning to the next matvec's (240.6 us for 65), where a matvec
// after a matvec costs 0.5 us; the next matvec's blocks enter pdl_begin about 1.9 us after this
// one's wait returned, their prologue's weight stages (hy_mmv_2_8: 396 blocks of 24 KiB) in flight
// while it runs. With its blocks' ends recorded too (session 26 call 2), a norm's body (its wait
// returning to its last block's end) is 1.8 us and its drain (to the next matvec's first wait
// return) 2.2 us, against 0.8 for a matvec's drain. Each way tried to shorten them loses or ties
// (session 26 calls 1-5, `bench_decode --shapes 9b,27b --source mem --skip-matvec --tokens 32
// --windows 8 --prompt 64`, device ms, 9b / 27b step, as it is first):
// - the next launch let go after the block's reduction (call 1, 2.0123 / 6.0748): 2.0714 / 6.1032;
//   with the weights loaded before the wait 2.044 / 6.0571; only at the end 2.1056 / 6.1918; every
//   kernel but the matvecs letting its next launch go only at its end 2.1909 / 6.3396;
// - let go once the row's loads are in flight (call 2, 2.018 / 6.0094): with the weights loaded
//   before the wait 2.0114 / 6.005, after it 2.0338 / 6.0912; the weights before the wait again in
//   session 29 (call 3, two runs each, the command above with --windows 2,8): 9b 1.9795 / 1.9795
//   against 1.9797 / 1.973, 27b 5.9395 / 5.8868 against 5.876 / 5.8876, windows within 0.3%
//   either way: a tie;
// - the next one-row matvec waiting on a count of this launch's blocks (each adding itself after
//   its stores and a fence; the matvec's last block to pass zeroing it) instead of on its
//   completion (call 3, 2.0193 / 5.9987): 2.0473 / 6.1356;
// - the next matvec issuing 1 or 2 of its 3 first stages before its wait, the rest after (call 5,
//   2.0158 / 6.0219): 2.0356 / 6.082 and 2.0183 / 6.046.
// Nor does splitting the norm between the launches around it pay (session 30, not kept): the
// residual matvec before it writing, in its epilogue, its outputs times w as the planes and each
// 16-row tile's sum of squares (a half warp's butterfly), the matvecs after it dividing their
// outputs (a pair's gate and up) by den from those sums, taken once a block after its first
// item's sums, and a launch of its own for the first layer alone: 64 launches fewer on the 9B, a
// row's bits the same in every call (GPU suite 332 passed, with tests of both sides against
// float64 at every variant). The norms' segments go (bench_decode --shapes 9b --timeline: 259.5
// us of 65 launches), but the one-row matvecs after them grow their bodies by 184 us (hy_mmv_2_8,
// 64 launches: 12.9 -> 15.8 us each) and the makers by 38-59 (hy_mmvs_2_16): the next matvec's
// blocks, resident once the matvec before them leaves the SMs, bring in their first stages while
// this kernel runs; without it that ramp is theirs. H200, session 30 call 2, `bench_decode
// --shapes 9b,27b --source mem --skip-matvec --tokens 32 --windows 2,8 --prompt 64`, device ms,
// two runs each, as it is against split: 9b step 1.9724 / 1.9747 against 1.9981 / 1.9955, 2-row
// window 2.1477 / 2.1457 against 2.1466 / 2.1453, 8-row 3.3173 / 3.3152 against 3.275 / 3.2786;
// 27b step 5.93 / 5.8828 against 5.9155 / 5.9231, 2-row window 6.1929 / 6.2023 against 6.3833 /
// 6.3609, 8-row 10.1142 / 10.1082 against 10.1118 / 10.1483 (call 1, the sums fmaf'd by one
// thread a tile after a barrier, the weights not prefetched: 9b step 2.0305 / 2.0295 against
// 1.9782 / 1.9814).
extern "C" __global__ void hy_rmsnorm2(const float* x, const float* w, float* xf, int hidden, float eps, int gemma,
                                       bf16* p0, bf16* p1, bf16* p2, int ps) {
    pdl_begin(pdl_early(gridDim.y));
    __shared__ float red[8];
    const int r = blockIdx.y, t = threadIdx.x, nq = hidden >> 2, q = blockIdx.x * 256 + t;
    const float4* xr = (const float4*)(x + (size_t)r * hidden);
    // the weights of the thread's columns in flight with the row
    float4 wv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), mine = wv;
    if (q < nq) wv = ((const float4*)w)[q];
    float ss = 0.0f;
    for (int q0 = t; q0 < nq; q0 += 8 * 256) {
        float4 v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e)
            if (q0 + e * 256 < nq) v[e] = xr[q0 + e * 256];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            if (q0 + e * 256 < nq) {
                ss = fmaf(v[e].x, v[e].x, ss);
                ss = fmaf(v[e].y, v[e].y, ss);
                ss = fmaf(v[e].z, v[e].z, ss);
                ss = fmaf(v[e].w, v[e].w, ss);
                if (q0 + e * 256 == q) mine = v[e];
            }
        }
    }
    ss = warp_sum(ss);
    if ((t & 31) == 0) red[t >> 5] = ss;
    __syncthreads();
    if (q >= nq) return;
    float tot = 0.0f;
    for (int k = 0; k < 8; ++k) tot += red[k];
    const float den = sqrtf(tot / (float)hidden + eps);
    if (gemma) wv = make_float4(1.0f + wv.x, 1.0f + wv.y, 1.0f + wv.z, 1.0f + wv.w);
    const float4 y = make_float4(mine.x / den * wv.x, mine.y / den * wv.y, mine.z / den * wv.z, mine.w / den * wv.w);
    if (xf) ((float4*)(xf + (size_t)r * hidden))[q] = y;
    // put3 of the four values: each plane's two column pairs in 4-byte stores at their places
    const float yv[4] = {y.x, y.y, y.z, y.w};
    u32 h[2], m[2], l[2];
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
        bf16 hb[2], mb[2], lb[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) hy_split3(yv[e + k], hb[k], mb[k], lb[k]);
        h[e >> 1] = pack2(hb[0], hb[1]);
        m[e >> 1] = pack2(mb[0], mb[1]);
        l[e >> 1] = pack2(lb[0], lb[1]);
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const size_t at = (size_t)r * ps + hy_pcol(4 * q + 2 * e);
        *(u32*)(p0 + at) = h[e];
        *(u32*)(p1 + at) = m[e];
        *(u32*)(p2 + at) = l[e];
    }
    hy_tl_end();
}
