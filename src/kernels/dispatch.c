/* kernels/dispatch.c — CPU feature detection and the one kernel dispatch table.
 *
 * Detection reads CPUID (leaf 1; leaf 7 subleaves 0 and 1), XCR0 through XGETBV (only when the OS set
 * OSXSAVE) and, on Linux, asks for the AMX tile-data permission with arch_prctl(ARCH_REQ_XCOMP_PERM,
 * XFEATURE_XTILEDATA): without it the first tile instruction would kill the process with SIGILL. A level
 * is available only when the CPU has every feature its leaves are compiled for *and* the OS saves the
 * matching register state. The tables are static const; init points `active` at one of them, once.
 * A test build with TREX_AMX_EMU (make AMX_EMU=1) makes amx available wherever avx512 is, its tile
 * instructions emulated in C (kernels/x86/amx/emu.h), so the AMX leaves are tested without the unit. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* syscall() */
#endif
#include "kernels/dispatch.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm_panels.h"

#if defined(__x86_64__) || defined(__i386__)
#define TREX_X86 1
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(TREX_X86)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define ARCH_GET_XCOMP_PERM_ 0x1022
#define ARCH_REQ_XCOMP_PERM_ 0x1023
#define XFEATURE_XTILEDATA_ 18

static const char *const isa_names[TREX_ISA_COUNT] = {"ref", "avx2", "avx512f", "avx512", "amx"};

const char *trex_isa_name(trex_isa isa)
{
    return isa >= 0 && isa < TREX_ISA_COUNT ? isa_names[isa] : "?";
}

const char *trex_isa_label(trex_isa isa)
{
    if (isa == TREX_ISA_AMX && trex_cpu_features_get()->amx_emulated)
        return "amx (emulated in C: a test build)";
    return trex_isa_name(isa);
}

bool trex_isa_parse(const char *s, trex_isa *out)
{
    for (int i = 0; i < TREX_ISA_COUNT; i++)
        if (s && !strcmp(s, isa_names[i])) {
            *out = (trex_isa)i;
            return true;
        }
    return false;
}

/* ---- the tables -------------------------------------------------------------------------------------- */

/* A level's packers and conversions, and its fp32 micro-kernel, from their names (TREX_GEMM_LEAVES). */
#define PACK_LEAVES(sfx)                                  \
    .pack_name = #sfx,                                    \
    .cvt_name = #sfx,                                     \
    .pack_a_bf16 = trex_pack_a_bf16_##sfx,                \
    .pack_a_f32 = trex_pack_a_f32_##sfx,                  \
    .pack_b_bf16 = trex_pack_b_bf16_##sfx,                \
    .pack_b_f32 = trex_pack_b_f32_##sfx,                  \
    .cvt_f32_bf16 = trex_cvt_f32_bf16_##sfx,              \
    .cvt_bf16_f32 = trex_cvt_bf16_f32_##sfx
#define LEVEL_LEAVES(sfx) PACK_LEAVES(sfx), .gemm_f32_ukr = trex_gemm_f32_ukr_##sfx

static const trex_kernel_table table_ref = {
    .isa = TREX_ISA_REF,
    .gemm_name = "ref",
    .gemm_ukr = trex_gemm_ukr_ref,
    .gemm_tile_t = trex_gemm_tile_t_ref,
    .gemm_f32_name = "ref",
    LEVEL_LEAVES(ref),
};

#ifdef TREX_X86
/* AVX2 + FMA: the bf16 products as fp32 FMAs on bf16 pairs (and on fp32 B values as they are), the
 * packers, conversions and the fp32 GEMM's micro-kernel on 256-bit vectors, and the FMA peak (its bf16
 * products' unit); a block's transpose is the reference's. */
static const trex_kernel_table table_avx2 = {
    .isa = TREX_ISA_AVX2,
    .gemm_name = "avx2-fma",
    .gemm_ukr = trex_gemm_ukr_avx2,
    .gemm_ukr_f32b = trex_gemm_ukr_f32b_avx2,
    .gemm_tile_t = trex_gemm_tile_t_ref,
    .gemm_f32_name = "avx2-mul-add",
    .peak_f32_fma = trex_peak_f32_fma_avx2,
    .peak_f32_fma_name = "avx2_fp32_fma",
    LEVEL_LEAVES(avx2),
};

/* The AVX-512 F/BW/VL leaves that every AVX-512 level runs (kernels/x86/avx512/gemm_f32.c). */
#define AVX512F_ENTRIES                           \
    .gemm_tile_t = trex_gemm_tile_t_avx512,       \
    .gemm_f32_ukr = trex_gemm_f32_ukr_avx512,     \
    .gemm_f32_name = "avx512-mul-add",            \
    .peak_f32_fma = trex_peak_f32_fma_avx512,     \
    .peak_f32_fma_name = "avx512_fp32_fma"

/* AVX-512 without its bf16 instructions: the bf16 products as fp32 FMAs on bf16 pairs and on fp32 B
 * values (as avx2, on 512-bit vectors), the avx512 packers compiled without them; the FMA peak is its
 * bf16 products'. */
static const trex_kernel_table table_avx512f = {
    .isa = TREX_ISA_AVX512F,
    .gemm_name = "avx512f-fma",
    .gemm_ukr = trex_gemm_ukr_avx512f,
    .gemm_ukr_f32b = trex_gemm_ukr_f32b_avx512f,
    .gemm_end = trex_gemm_end_avx512,
    PACK_LEAVES(avx512f),
    AVX512F_ENTRIES,
};

/* The AVX-512 leaves that the amx level shares (it has its own bf16 micro-kernel and peak). */
#define AVX512_ENTRIES                            \
    PACK_LEAVES(avx512),                          \
    AVX512F_ENTRIES,                              \
    .peak_bf16_dp = trex_peak_bf16_dp_avx512

static const trex_kernel_table table_avx512 = {
    .isa = TREX_ISA_AVX512,
    .gemm_name = "avx512-vdpbf16ps",
    .gemm_ukr = trex_gemm_ukr_avx512,
    .gemm_end = trex_gemm_end_avx512,
    AVX512_ENTRIES,
};

static const trex_kernel_table table_amx = {
    .isa = TREX_ISA_AMX,
#ifdef TREX_AMX_EMU
    .gemm_name = "amx-tdpbf16ps (emulated)",
#else
    .gemm_name = "amx-tdpbf16ps",
#endif
    .gemm_ukr = trex_gemm_ukr_amx,
    .gemm_begin = trex_gemm_begin_amx,
    .gemm_end = trex_gemm_end_amx,
    .peak_bf16_amx = trex_peak_bf16_amx,
    AVX512_ENTRIES,
};
#endif

/* Each level's table, by level: only ref elsewhere than x86, where no level above it is detected */
static const trex_kernel_table *const tables[TREX_ISA_COUNT] = {
    [TREX_ISA_REF] = &table_ref,
#ifdef TREX_X86
    [TREX_ISA_AVX2] = &table_avx2,
    [TREX_ISA_AVX512F] = &table_avx512f,
    [TREX_ISA_AVX512] = &table_avx512,
    [TREX_ISA_AMX] = &table_amx,
#endif
};

/* ---- detection --------------------------------------------------------------------------------------- */

#ifdef TREX_X86
static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

static void detect(trex_cpu_features *f)
{
    memset(f, 0, sizeof *f);
    f->best = TREX_ISA_REF;
#ifdef TREX_X86
    f->x86 = true;
    unsigned a, b, c, d;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 1)
        return;
    __cpuid(1, a, b, c, d);
    f->cpu_fma = c & (1u << 12);
    f->os_xsave = c & (1u << 27);
    f->cpu_avx = c & (1u << 28);
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        unsigned sub_max = a;
        f->cpu_avx2 = b & (1u << 5);
        f->cpu_avx512f = b & (1u << 16);
        f->cpu_avx512dq = b & (1u << 17);
        f->cpu_avx512bw = b & (1u << 30);
        f->cpu_avx512vl = b & (1u << 31);
        f->cpu_amx_bf16 = d & (1u << 22);
        f->cpu_amx_tile = d & (1u << 24);
        if (sub_max >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            f->cpu_avx512bf16 = a & (1u << 5);
        }
    }
    if (f->os_xsave) {
        f->xcr0 = read_xcr0();
        f->os_avx = (f->xcr0 & 0x6) == 0x6;
        f->os_avx512 = f->os_avx && (f->xcr0 & 0xe0) == 0xe0;
        f->os_amx = (f->xcr0 & 0x60000) == 0x60000;
    }
    if (f->cpu_amx_tile && f->os_amx) {
#ifdef __linux__
        if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA_) == 0) {
            unsigned long bits = 0;
            f->amx_perm = syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM_, &bits) == 0 &&
                          (bits & (1ul << XFEATURE_XTILEDATA_));
        } else {
            f->amx_perm_errno = errno;
        }
#else
        f->amx_perm = false; /* no known way to ask: stay off AMX */
#endif
    }
    bool avx2 = f->cpu_avx && f->cpu_avx2 && f->cpu_fma && f->os_avx;
    bool avx512f = avx2 && f->cpu_avx512f && f->cpu_avx512bw && f->cpu_avx512vl && f->os_avx512;
    bool avx512 = avx512f && f->cpu_avx512bf16;
#ifdef TREX_AMX_EMU
    f->amx_emulated = true;
#endif
    bool amx = avx512 && (f->amx_emulated || (f->cpu_amx_tile && f->cpu_amx_bf16 && f->os_amx && f->amx_perm));
    f->best = amx       ? TREX_ISA_AMX
              : avx512  ? TREX_ISA_AVX512
              : avx512f ? TREX_ISA_AVX512F
              : avx2    ? TREX_ISA_AVX2
                        : TREX_ISA_REF;
#endif
}

/* ---- the once-filled state --------------------------------------------------------------------------- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static struct {
    trex_cpu_features features;
    const trex_kernel_table *active;
    trex_code code;
    char msg[TREX_ERR_MSG];
    bool verbose; /* TREX_VERBOSE set, and neither empty nor "0" */
} state;

static void log_choice(const trex_kernel_table *t, const char *cap)
{
    const trex_cpu_features *f = &state.features;
    fprintf(stderr,
            "trex: kernels: cpu avx2=%d avx512f/bw/vl/dq=%d%d%d%d avx512_bf16=%d amx_tile=%d "
            "amx_bf16=%d; os xcr0=0x%llx (avx=%d avx512=%d amx=%d); amx permission=%s\n",
            f->cpu_avx2, f->cpu_avx512f, f->cpu_avx512bw, f->cpu_avx512vl, f->cpu_avx512dq,
            f->cpu_avx512bf16, f->cpu_amx_tile, f->cpu_amx_bf16, (unsigned long long)f->xcr0,
            f->os_avx, f->os_avx512, f->os_amx,
            f->amx_perm ? "granted" : f->amx_perm_errno ? strerror(f->amx_perm_errno) : "not asked");
    if (f->amx_emulated)
        fprintf(stderr, "trex: kernels: AMX emulated in C (a test build, make AMX_EMU=1): right results, "
                        "no speed\n");
    fprintf(stderr, "trex: kernels: level %s (best available %s, TREX_ISA=%s)\n",
            trex_isa_name(t->isa), trex_isa_name(f->best), cap ? cap : "unset");
    fprintf(stderr, "trex: kernels: gemm_bf16 micro-kernel: %s\n", t->gemm_name);
    fprintf(stderr, "trex: kernels: bf16 x fp32 products: %s\n",
            t->gemm_ukr_f32b ? "fp32 values as they are (FMA)" : "fp32 split into bf16 terms by the caller");
    fprintf(stderr, "trex: kernels: gemm_bf16 packing: %s\n", t->pack_name);
    fprintf(stderr, "trex: kernels: f32<->bf16 conversion: %s\n", t->cvt_name);
    fprintf(stderr, "trex: kernels: fp32 trex_gemm/linear micro-kernel: %s\n", t->gemm_f32_name);
}

static void init_state(void)
{
    detect(&state.features);
    trex_isa level = state.features.best;
    state.code = TREX_OK;
    const char *cap = getenv("TREX_ISA");
    if (cap && *cap) {
        trex_isa want;
        if (trex_isa_parse(cap, &want)) {
            if (want < level)
                level = want;
        } else {
            state.code = TREX_EINVAL;
            snprintf(state.msg, sizeof state.msg,
                     "TREX_ISA='%s' is not a kernel level: set it to ref, avx2, avx512f, avx512 or amx "
                     "(a cap: the best level this machine has at or below it is used), or unset it",
                     cap);
            level = TREX_ISA_REF;
        }
    }
    state.active = tables[level];
    const char *v = getenv("TREX_VERBOSE");
    state.verbose = v && *v && strcmp(v, "0") != 0;
    if (state.verbose)
        log_choice(state.active, cap && *cap ? cap : NULL);
}

trex_code trex_kernels_init(trex_err *err)
{
    pthread_once(&init_once, init_state);
    if (state.code != TREX_OK)
        return trex_err_set(err, state.code, "%s", state.msg);
    return TREX_OK;
}

const trex_cpu_features *trex_cpu_features_get(void)
{
    pthread_once(&init_once, init_state);
    return &state.features;
}

const trex_kernel_table *trex_kernels_table(void)
{
    pthread_once(&init_once, init_state);
    if (state.code != TREX_OK)
        TREX_ABORT("%s", state.msg);
    return state.active;
}

bool trex_kernels_verbose(void)
{
    pthread_once(&init_once, init_state);
    return state.verbose;
}

trex_isa trex_kernels_isa(void)
{
    return trex_kernels_table()->isa;
}

const trex_kernel_table *trex_kernels_table_for(trex_isa cap)
{
    pthread_once(&init_once, init_state);
    const trex_isa best = state.features.best;
    return tables[cap < TREX_ISA_REF ? TREX_ISA_REF : cap < best ? cap : best];
}
