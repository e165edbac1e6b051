/* kernels/dispatch.h — CPU feature detection and the kernel dispatch table.
 *
 * One table of kernel entry points is chosen once per process (trex_kernels_init, or lazily on the first
 * kernel call, through pthread_once) from what the CPU and the OS allow, capped by TREX_ISA:
 *   ref     plain C everywhere (any x86-64, or any other CPU);
 *   avx2    AVX2 + FMA: the bf16 GEMM micro-kernel as fp32 FMAs on bf16 pairs, packing, conversions,
 *           the fp32 micro-kernel and an FMA peak loop (kernels/x86/avx2/); a block's transpose is the
 *           reference's;
 *   avx512f AVX-512 F/BW/VL (+ FMA), with the OS saving ZMM state (XCR0 bits 5-7), without AVX512_BF16
 *           (Skylake-SP to Ice Lake): the avx512 level's leaves, those that use bf16 instructions
 *           compiled again without them, and a GEMM micro-kernel of fp32 FMAs on bf16 pairs
 *           (kernels/x86/avx512f/);
 *   avx512  avx512f plus AVX512_BF16: packing and the VDPBF16PS GEMM micro-kernel (kernels/x86/avx512/);
 *   amx     avx512 plus AMX-TILE/AMX-BF16, XCR0 bits 17/18 and Linux's permission to use tile data
 *           (arch_prctl ARCH_REQ_XCOMP_PERM, Linux >= 5.16): the TDPBF16PS micro-kernel (kernels/x86/amx/).
 * TREX_ISA caps the level (a cap above what the machine has is not an error: the best available is used);
 * TREX_VERBOSE=1 prints each choice once to stderr. The ISA folders are leaves that only this table
 * reaches; they are compiled with their own flags, so the default build runs on any x86-64.
 *
 * The tables themselves are static const; the only global mutable state is the pointer to the chosen one
 * and the detected features, written once under pthread_once and read-only after (STYLE rule 10). */
#ifndef TREX_KERNELS_DISPATCH_H
#define TREX_KERNELS_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "trex/status.h"

typedef enum trex_isa {
    TREX_ISA_REF = 0,
    TREX_ISA_AVX2,
    TREX_ISA_AVX512F,
    TREX_ISA_AVX512,
    TREX_ISA_AMX,
    TREX_ISA_COUNT
} trex_isa;

/* What CPUID reports (cpu_*), what the OS enables in XCR0 (os_*), and the AMX permission. */
typedef struct trex_cpu_features {
    bool x86;                      /* false on other architectures: everything below is false */
    bool cpu_avx, cpu_fma, cpu_avx2;
    bool cpu_avx512f, cpu_avx512bw, cpu_avx512vl, cpu_avx512dq, cpu_avx512bf16; /* dq: reported only */
    bool cpu_amx_tile, cpu_amx_bf16;
    bool os_xsave;                 /* CPUID.1:ECX.OSXSAVE: XGETBV is usable */
    uint64_t xcr0;                 /* 0 when XGETBV is not usable */
    bool os_avx;                   /* XCR0 bits 1, 2 (SSE, AVX state) */
    bool os_avx512;                /* and bits 5, 6, 7 (opmask, ZMM_Hi256, Hi16_ZMM) */
    bool os_amx;                   /* XCR0 bits 17, 18 (XTILECFG, XTILEDATA) */
    bool amx_perm;                 /* Linux granted XTILEDATA to this process */
    int amx_perm_errno;            /* errno of the arch_prctl request when it failed, else 0 */
    bool amx_emulated;             /* a test build (make AMX_EMU=1): the amx level runs its tile
                                    * instructions in C (kernels/x86/amx/emu.h) wherever avx512 runs */
    trex_isa best;                 /* the highest level every requirement above allows */
} trex_cpu_features;

/* The micro-kernel and packing contract (see kernels/gemm_panels.h for the panel formats).
 * A call computes one 32x32 block over kp k and writes it to out (ldo floats apart). flags:
 * TREX_UKR_ACCUMULATE starts the sums from the block at in (ldi apart; it may be out) instead of zero;
 * TREX_UKR_STREAM asks for non-temporal stores of out (a hint: taken when out is 64-byte aligned and
 * ldo a multiple of 16; the run's gemm_end then fences them). prefetch, when not NULL, names
 * prefetch_lines consecutive 64-byte lines that the framework reads next (the following slice of B):
 * a level may bring them towards L2 while it computes (a hint; levels without prefetching ignore it).
 * rows (1..32; 0: all 32) is how many rows of the block the caller uses: a level may skip the others,
 * neither reading them from in nor writing them to out (the A panel's padding rows at the bottom edge
 * of a problem, e.g. an expert's last rows). */
#define TREX_UKR_ACCUMULATE 1u
#define TREX_UKR_STREAM 2u
typedef struct trex_ukr_c {
    float *out;
    int64_t ldo;
    const float *in;
    int64_t ldi;
    const void *prefetch;
    int64_t prefetch_lines;
    int64_t rows;
} trex_ukr_c;
typedef void (*trex_gemm_ukr_fn)(int64_t kp, const uint16_t *ap, const uint16_t *bp, const trex_ukr_c *c,
                                 unsigned flags);
/* The transpose of the rows x cols corner (rows, cols <= 32) of a 32x32 block t (32 floats apart, all
 * 1024 floats readable) to dst, ldd floats apart: dst[j ldd + i] = t[i 32 + j]. A symmetric product's
 * mirror tiles (trex_gemm_syrk). */
typedef void (*trex_tile_t_fn)(float *dst, int64_t ldd, const float *t, int64_t rows, int64_t cols);
/* Packs a [rows <= 32] x [kc] source view X (X[r][k] = src[r*rs + k*ks], rs or ks is 1, src pointing
 * at X[0][0]) into one panel of kcp columns (kcp: kc rounded up to 32; kernels/gemm_panels.h),
 * zero-filling rows >= rows and k >= kc. f32 sources are rounded to bf16 (trex_f32_to_bf16). */
typedef void (*trex_pack_fn)(uint16_t *dst, const void *src, int64_t rs, int64_t ks, int64_t rows,
                             int64_t kc, int64_t kcp);
typedef void (*trex_cvt_f32_bf16_fn)(uint16_t *dst, const float *src, int64_t n);
typedef void (*trex_cvt_bf16_f32_fn)(float *dst, const uint16_t *src, int64_t n);
/* The fp32 reference GEMM's micro-kernel (kernels/ref/gemm.c): acc[TREX_F32_MR][TREX_F32_NR] = sum over
 * k = 0..K-1, in increasing order, of ap[k][i] * bp[k][j], each product rounded to fp32 and then added
 * (no fused multiply-add), starting from +0. ap is [K][MR], bp [K][NR] (packed by the framework). Every
 * level gives the same bits: only the width of the vectors differs. */
#define TREX_F32_MR 8
#define TREX_F32_NR 32
typedef void (*trex_gemm_f32_ukr_fn)(int64_t K, const float *ap, const float *bp, float *acc);
/* Register-only loops for `trex bench peak`: run iters iterations, return the FLOPs done. */
typedef double (*trex_peak_fn)(int64_t iters);

typedef struct trex_kernel_table {
    trex_isa isa;           /* the level this table was built for */
    const char *gemm_name;  /* names of the variants in use, for logs and benchmarks */
    const char *pack_name;
    const char *cvt_name;
    /* GEMM on 32x32 register blocks over packed panels; begin/end bracket a run of calls on one
     * thread (AMX: load the tile configuration / release the tiles; end also fences streamed
     * stores); NULL when not needed. */
    trex_gemm_ukr_fn gemm_ukr;
    /* The same contract with B in the fp32-pair format (kernels/gemm_panels.h): fp32 B values taken as
     * they are, against the first of each pair of A (trex_gemm_bf16_f32b); NULL at the other levels
     * (ref, and avx512 and amx, whose products are bf16 instructions: their callers split the fp32
     * operand into bf16 terms). */
    trex_gemm_ukr_fn gemm_ukr_f32b;
    trex_tile_t_fn gemm_tile_t;
    void (*gemm_begin)(void);
    void (*gemm_end)(void);
    /* pack_a: "A format" (steps of [32 rows][32 k]); pack_b: "VNNI format" ([kcp/2][32][2]). */
    trex_pack_fn pack_a_bf16, pack_a_f32, pack_b_bf16, pack_b_f32;
    trex_cvt_f32_bf16_fn cvt_f32_bf16;
    trex_cvt_bf16_f32_fn cvt_bf16_f32;
    /* fp32 trex_gemm (and so trex_linear_*): micro-kernel and its name */
    trex_gemm_f32_ukr_fn gemm_f32_ukr;
    const char *gemm_f32_name;
    /* Peak loops; NULL when the level has none. */
    trex_peak_fn peak_f32_fma;   /* fp32 FMA (AVX-512: 16 lanes x 2 FLOP; AVX2: 8 lanes x 2) */
    const char *peak_f32_fma_name; /* "avx512_fp32_fma", "avx2_fp32_fma": the key in reports */
    trex_peak_fn peak_bf16_dp;   /* VDPBF16PS (16 lanes x 4 FLOP) */
    trex_peak_fn peak_bf16_amx;  /* TDPBF16PS on 16x16x32 tiles (16384 FLOP each) */
} trex_kernel_table;

/* Detects the CPU, reads TREX_ISA and TREX_VERBOSE and picks the table, once per process; later calls
 * return the first call's result. TREX_EINVAL when TREX_ISA is not one of ref, avx2, avx512f, avx512, amx
 * (the message says so); the table is then the reference one. */
trex_code trex_kernels_init(trex_err *err);

/* The features found (runs trex_kernels_init when needed). */
const trex_cpu_features *trex_cpu_features_get(void);
/* The level in use: min(TREX_ISA cap, best available). */
trex_isa trex_kernels_isa(void);
/* The table in use. A bad TREX_ISA seen here, without an earlier trex_kernels_init, aborts with its
 * message (programs call trex_kernels_init first to report it as an error). */
const trex_kernel_table *trex_kernels_table(void);
/* The table a given cap would choose on this machine (tests and benchmarks run every variant with it);
 * a cap above the machine's best gives the best's table. Never NULL. */
const trex_kernel_table *trex_kernels_table_for(trex_isa cap);

/* Whether TREX_VERBOSE asks for each kernel choice to be logged: set, and neither empty nor "0" (read
 * once per process, with TREX_ISA). */
bool trex_kernels_verbose(void);

const char *trex_isa_name(trex_isa isa);            /* "ref", "avx2", "avx512f", "avx512", "amx" */
/* The name for a person to read: trex_isa_name, and for amx in an AMX_EMU test build
 * "amx (emulated in C: a test build)", so that no timing from such a build passes for the unit's. */
const char *trex_isa_label(trex_isa isa);
/* Parses an ISA name (case-sensitive); false when unknown. */
bool trex_isa_parse(const char *s, trex_isa *out);

#endif
