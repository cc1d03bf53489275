// Helpers shared by every kernel file. No CUDA headers: 16-bit floats travel as unsigned short
// and convert through inline PTX cvt (round to nearest even), so NVRTC needs no include path.
// Included once per translation unit by kernels/__init__.py source(); the guard covers nvcc use.
#ifndef CORTIQ_COMMON_CUH
#define CORTIQ_COMMON_CUH

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
// IEEE half and bfloat16 bit patterns.
typedef unsigned short f16;
typedef unsigned short bf16;

// f16 bits -> f32 (exact).
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// f32 -> f16 bits, round to nearest even; overflow gives +-inf.
__device__ __forceinline__ unsigned short f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// bf16 bits -> f32 (exact: bf16 is the top half of an f32).
__device__ __forceinline__ float bf16_to_f32(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}

// Two 16-bit values as one word, the first in the low half.
__device__ __forceinline__ u32 pack2(u16 lo, u16 hi) { return (u32)lo | ((u32)hi << 16); }

// f32 -> bf16 bits, round to nearest even (PTX cvt.rn.bf16.f32 needs sm_80, the floor here).
__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
    unsigned short b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
    return b;
}

// Sum over the 32 lanes of a full warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Max over the 32 lanes of a full warp; every lane gets the result.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a segment of the block's warps (blockDim.x a multiple of 32, at most 1024) in a fixed
// order: a butterfly in each warp, then every thread adds the warp sums of its segment, warps
// w0 .. w0 + nw - 1, in warp order. red: __shared__ float[one a warp] (32: any block). Every
// thread of the block must call it; every thread gets its segment's sum.
__device__ __forceinline__ float seg_sum(float v, float* red, int w0, int nw) {
    v = warp_sum(v);
    __syncthreads();  // red may still be read by a previous call
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = w0; w < w0 + nw; ++w) s += red[w];
    return s;
}

// Sum over the block: one segment of all its warps.
__device__ __forceinline__ float block_sum(float v, float* red) { return seg_sum(v, red, 0, (int)(blockDim.x >> 5)); }

// Max over the block, as block_sum.
__device__ __forceinline__ float block_max(float v, float* red) {
    v = warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, red[w]);
    return m;
}

// 16 bytes global -> shared without registers (cp.async.cg, L1 bypassed), to a shared-window
// address or to a generic pointer into shared memory; cp_async16_if copies only when p (a
// predicate inside the asm, no branch), under the L2 cache policy `pol` (l2_evict_first). Then the
// fences of the cp.async groups (sm_80 and up).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    cp_async16((u32)__cvta_generic_to_shared(dst), src);
}
__device__ __forceinline__ void cp_async16_if(bool p, u32 dst, const void* src, u64 pol) {
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %2, 0; @q cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %3; }"
                 ::"r"(dst), "l"(src), "r"((int)p), "l"(pol)
                 : "memory");
}
// The L2 cache policy whose lines go first when L2 needs room (createpolicy, sm_80 and up): for
// data read once per step, so that what the step reads again stays. Not volatile: it has no side
// effect (every module's CUBIN is the same byte for byte either way, NVRTC 13.0, sm_90).
__device__ __forceinline__ u64 l2_evict_first() {
    u64 pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// mbarriers and bulk copies (sm_90): a barrier at a shared-window address made for `count`
// arrivals a phase, then mbar_init_fence (the inits visible to the other threads and to the bulk
// copies); an arrival expecting `bytes` of bulk copies; one bulk copy global -> shared of `bytes`
// (a multiple of 16, both addresses 16-byte aligned) counted on `bar`; a wait for the phase of
// parity `par` to complete.
__device__ __forceinline__ void mbar_init(u32 bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(u32 bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_g2s(u32 dst, const void* src, int bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 par) {
    for (u32 done = 0; !done;)
        asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                     : "=r"(done)
                     : "r"(bar), "r"(par)
                     : "memory");
}

// ldmatrix.x4: four 8 x 8 matrices of 16-bit values from shared memory (lane 8 i + r gives the
// address of row r of matrix i); register i gets matrix i's row lane >> 2, elements 2 (lane & 3)
// and the next.
__device__ __forceinline__ void ldsm4(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((u32)__cvta_generic_to_shared(p))
                 : "memory");
}

// Four words from shared memory at a shared-window address (16-byte aligned).
__device__ __forceinline__ void lds128(u32* r, u32 addr) {
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// ldsm4 transposed: register i gets matrix i's column lane >> 2, rows 2 (lane & 3) and the next.
__device__ __forceinline__ void ldsm4t(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((u32)__cvta_generic_to_shared(p))
                 : "memory");
}

// Programmatic dependent launch (PDL). A kernel launched with the programmatic-serialization
// attribute (Func.pdl on the host) may start while the kernel before it on the stream still runs;
// pdl_begin() waits until that kernel has completed and its writes are visible (a no-op for a
// kernel launched without the attribute), then lets the next kernel on the stream launch, so its
// launch and whatever it does before its own pdl_begin() (reads of data no kernel writes: weights)
// overlap this kernel. Nothing before pdl_begin() may write, nor read what the kernel just before
// writes, but a kernel may load there what one two or more launches back wrote: the kernel just
// before lets this one launch only from its own pdl_begin(), which waited for that one (save the
// few-row calls of the kernels before a matvec, HY_EARLY_ROWS below, which no such reader follows;
// the GDN front's gate dots of xn, the scans' states and gate inputs z;
// tests/unit/test_pdl.EARLY_READERS, and test_hyb_graphkeys checks the launch orders). So do pf_l2
// below and the attention call record that hy_scores, hy_values and hy_finish read (att_record; no
// kernel that may still run writes it), whose n0 and rb also steer the first two's prefetches and
// the exit of their blocks past the keys (att_rows_pf). Every kernel the host marks pdl calls it on
// every path that touches memory. Letting the next kernel launch before the wait in every kernel
// instead (a chain of them then starts during one kernel's tail) loses the one-row step and gains
// the windows a little (H200, session 23 call 3, `bench_decode --shapes 9b,27b --source mem
// --skip-matvec --tokens 16 --windows 8,16`, device ms, two runs each, this order against that: 9b
// step 2.0397 / 2.0345 against 2.0648 / 2.0575, 27b 6.015 / 6.0159 against 6.1478 / 6.1223; 9b
// 8-row window 3.4776 / 3.4565 against 3.4252 / 3.4281, 16 rows 6.2095 / 6.2143 against 6.1391 /
// 6.1335).
// Timeline records (tools/bench_decode.py --timeline), compiled in only with HY_TIMELINE = the
// records hy_tl holds: 4 words each, appended at hy_tl_n (the host zeroes it, and reads both by
// name). pdl_begin's thread 0 of each block: (%gridid, %globaltimer ns on entering it, when its wait
// returned, SM << 32 | block); hy_tl_end's, called where a kernel's block is done (hy_mmp_run once
// its last item is, hy_rmsnorm2 after its stores): (%gridid | 1 << 63, that time, 0, block).
#ifdef HY_TIMELINE
__device__ unsigned long long hy_tl[4 * HY_TIMELINE];
__device__ unsigned int hy_tl_n;
__device__ __forceinline__ unsigned long long hy_tl_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void hy_tl_put(bool end, unsigned long long t0, unsigned long long t1) {
    unsigned long long grid;
    unsigned int sm;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned int k = atomicAdd(&hy_tl_n, 1u);
    if (k < HY_TIMELINE) {
        hy_tl[4 * k] = end ? grid | (1ull << 63) : grid;
        hy_tl[4 * k + 1] = t0;
        hy_tl[4 * k + 2] = t1;
        hy_tl[4 * k + 3] = (unsigned long long)sm << 32 | blockIdx.x;
    }
}
#endif

// A call of at most HY_EARLY_ROWS rows of the kernels that come just before a matvec (hy_rmsnorm2,
// hy_gdn_scan4_out32, hy_finish) lets the next kernel launch before its wait (pdl_begin(true)).
// The matvec after it loads only weights and ladders before its own wait (test_pdl), so it may
// start during the tail of the kernel before this one: its blocks become resident as that one's
// leave the SMs and bring in their first weight stages there, where otherwise they would launch
// only once that kernel had completed and this one's wait returned. H200, session 31 call 5,
// `bench_decode --shapes 9b,27b --source mem --skip-matvec --tokens 32 --windows 2,8 --prompt 64`,
// device ms, two runs each, at every row count against none (the norm alone / all three):
// 9b step 1.9359 / 1.934 and 1.9334 / 1.9374 against 1.9699 / 1.9771, 27b step 5.8446 / 5.7899
// and 5.8178 / 5.7563 against 5.9316 / 5.8716; 2-row windows 9b 2.1431 / 2.1418 and 2.1375 /
// 2.1376 against 2.1462 / 2.1408, 27b 6.2842 / 6.2781 and 6.1627 / 6.1731 against 6.2108 /
// 6.1979; 8-row windows lose: 9b 3.3359 / 3.3289 and 3.3304 / 3.3295 against 3.3168 / 3.317, 27b
// 10.423 / 10.4325 and 10.4247 / 10.4251 against 10.1611 / 10.155. As kept, the three at one and
// two rows (call 6, --windows 2,3,8, against the tree before): 9b step 1.9516 / 1.9504 against
// 1.9754 / 1.9769 (device ratio 0.483 / 0.482 against 0.478 / 0.476), 27b 5.7713 / 5.7754 against
// 5.8727 / 5.8613; 9b windows of 2 / 3 / 8 rows 2.1429 / 2.6909 / 3.3229 and 2.1423 / 2.6866 /
// 3.3209 against 2.1425 / 2.6801 / 3.3237 and 2.1432 / 2.6793 / 3.3221, 27b 8-row 10.1844 /
// 10.1895 against 10.1833 / 10.1823. Letting go early in the attention kernels before hy_finish
// too (hy_qk, hy_scores and hy_values at one and two rows; their successors read nothing a
// kernel writes before their own wait) loses (session 32 call 1, --windows 2,8, against this
// tree): 9b step 1.9695 / 1.971 against 1.9578 / 1.9561, 27b 5.8351 / 5.8513 against 5.8001 /
// 5.7989, 9b 2-row window 2.1591 / 2.1589 against 2.1472 / 2.1452.
#ifndef HY_EARLY_ROWS
#define HY_EARLY_ROWS 2
#endif
// Whether a call of n rows of a kernel just before a matvec lets the matvec launch before its
// wait (pdl_begin(true)).
__device__ __forceinline__ bool pdl_early(int n) { return n <= HY_EARLY_ROWS; }

__device__ __forceinline__ void pdl_begin(bool early = false) {
#ifdef HY_TIMELINE
    const unsigned long long t0 = hy_tl_now();
#endif
#if __CUDA_ARCH__ >= 900
    if (early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (!early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#ifdef HY_TIMELINE
    if (threadIdx.x == 0 && threadIdx.y == 0) hy_tl_put(false, t0, hy_tl_now());
#endif
}

__device__ __forceinline__ void hy_tl_end() {
#ifdef HY_TIMELINE
    if (threadIdx.x == 0 && threadIdx.y == 0) hy_tl_put(true, hy_tl_now(), 0);
#endif
}

// The line holding p into L2, nothing into registers or L1: free to run before pdl_begin() on
// any address inside an allocation (every kernel's writes meet in L2, so a line the kernel still
// running writes is only fetched early, never read stale), for the state and weights a kernel
// reads after it. Fetching the next matvec's weights from the kernels before it instead, while the
// memory would idle there, loses heavily: one cp.async.bulk.prefetch.L2 of 16 KiB a thread, the
// norms fetching the first 4 / 8 / 16 MiB of the set after them and the GDN front and hy_qk the
// whole out projection (H200, session 24 call 3, `bench_decode --shapes 9b --source mem
// --skip-matvec --tokens 16 --windows '' --prompt 64`, device ms): none 2.0076 / 2.011 / 2.0084,
// out projections alone 2.1556, with the norms' 4 / 8 / 16 MiB 3.4962 / 3.0237 / 2.8107 (27b
// 6.081 against 6.8321 at 8 MiB); the few blocks of a norm hold their SMs until the bytes land.
__device__ __forceinline__ void pf_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// 1 / (1 + e^-x) with full-precision expf (the reference's sigmoid).
__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// x * sigmoid(x).
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }

// log(1 + e^x), returning x itself above 20 where e^x would dominate (and overflow later).
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

#endif
