/* kernels/x86/avx2/attn_ref.c — the avx2 level's bf16 attention entries: the reference
 * (kernels/ref/attn_bf16.c) compiled again with this folder's AVX2 and FMA flags and -O3 (Makefile),
 * under the names trex_fused_<name>_avx2, but for the key product (kernels/x86/avx2/attn.c).
 *
 * GCC's vectorizer then runs the reference's 16-lane dot products and its row loops on 256-bit
 * registers; the build is ISO C, so no multiply and add is contracted and no sum reordered: the same
 * bits as the reference (tests/test_attn_bf16.c compares the levels). Measured on the AMD VM
 * (`TREX_ISA=avx2 test_attn_bf16 --bench 3`, H 16, c 512, n 256): the forward 7.8 -> 24.6 GFLOP/s, the
 * query side 10.5 -> 27.9; -O2 (GCC 12's cheap vectorizer cost model) left both as they were, and -O3
 * without AVX2 gave 12.2 and 15.9 (docs/kernels.md). A hand-written tile form, as the AVX-512 and AMX
 * leaves have, would be faster still. */
#define ATTN_LEAF(name) trex_fused_##name##_avx2
#define ATTN_LEAF_KEY_PRODUCT_ELSEWHERE
#include "kernels/ref/attn_bf16.c"
