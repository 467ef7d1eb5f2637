// One compiled grouped-GEMM config (see gemm_configs.def); its own TU so that configs build in parallel.
#include "moe/gemm/cutlass_grouped_gemm.cuh"

EPKIT_GEMM_DEFINE(swapab_pingpong_128x32x128_c1x1)
