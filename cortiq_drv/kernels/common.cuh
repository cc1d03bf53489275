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

// 1 / (1 + e^-x) with full-precision expf (the reference's sigmoid).
__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// x * sigmoid(x).
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }

// log(1 + e^x), returning x itself above 20 where e^x would dominate (and overflow later).
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

#endif
