// The Qwen3.5 hybrid arm's kernels (the reference's hyb.cu), compiled per attention geometry:
// -DHPK=<query heads per KV head> -DHD=<head width> (defaults below for compile checks).
#ifndef HPK
#define HPK 4
#endif
#ifndef HD
#define HD 256
#endif
#include "common.cuh"
#include "hyb_mma.cuh"
#include "hyb_mmp_core.cuh"
#include "hyb_mmp.cuh"
#include "hyb_gdn.cuh"
#include "hyb_attn.cuh"
#include "hyb_big.cuh"
#include "hyb_gdn_chunk.cuh"
#include "hyb_flash.cuh"
