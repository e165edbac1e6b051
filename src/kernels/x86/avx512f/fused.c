/* kernels/x86/avx512f/fused.c — kernels/x86/avx512/fused.c (the fp32 element-wise, mHC and attention
 * leaves, the streamed bf16 conversion) compiled without AVX512_BF16, for the avx512f level: there its
 * leaves are named trex_..._avx512f and its bf16 rounding is the integer one (kernels/x86/avx512/bf16.h),
 * with the same bits. Compiled with AVX-512 F/BW/VL flags; reached only through the dispatch tables. */
#include "kernels/x86/avx512/fused.c"
