/* tests/test_core.c — the core library: dtypes and conversions, tensor views, allocation and arenas,
 * the thread pool, the RNG, and file/JSON I/O. */
#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "trex/alloc.h"
#include "trex/io.h"
#include "trex/pool.h"
#include "trex/rng.h"
#include "trex/tensor.h"

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* --- dtypes and views --------------------------------------------------------------------------- */

static void test_dtypes(void)
{
    static const size_t sizes[TREX_DTYPE_COUNT] = {4, 8, 2, 2, 8, 4, 1, 1, 1, 1};
    for (int i = 0; i < TREX_DTYPE_COUNT; i++) {
        trex_dtype dt = (trex_dtype)i, back = TREX_DTYPE_COUNT;
        CHECK(trex_dtype_size(dt) == sizes[i], "size of %s", trex_dtype_name(dt));
        CHECK(trex_dtype_parse(trex_dtype_name(dt), &back) == TREX_OK && back == dt, "parse %s",
              trex_dtype_name(dt));
    }
    trex_dtype dt;
    CHECK(trex_dtype_parse("F4", &dt) == TREX_EFORMAT, "unknown dtype");
    CHECK(trex_dtype_parse("f32", &dt) == TREX_EFORMAT, "names are case-sensitive");
    CHECK(!strcmp(trex_dtype_name(TREX_F8_E4M3), "F8_E4M3"), "e4m3 name");
    CHECK(trex_dtype_is_float(TREX_BF16) && !trex_dtype_is_float(TREX_I32), "is_float");
}

static void test_numel(void)
{
    int64_t n = -1;
    CHECK(trex_shape_numel(0, NULL, &n) && n == 1, "scalar numel is 1");
    int64_t s1[] = {3, 4, 5};
    CHECK(trex_shape_numel(3, s1, &n) && n == 60, "3x4x5");
    int64_t s2[] = {INT64_MAX, 2};
    CHECK(!trex_shape_numel(2, s2, &n), "overflow detected");
    int64_t s3[] = {(int64_t)1 << 32, (int64_t)1 << 31};
    CHECK(!trex_shape_numel(2, s3, &n), "2^63 does not fit int64");
    int64_t s4[] = {(int64_t)1 << 32, (int64_t)1 << 30};
    CHECK(trex_shape_numel(2, s4, &n) && n == (int64_t)1 << 62, "2^62 fits");
    int64_t s5[] = {INT64_MAX, INT64_MAX, 0};
    CHECK(trex_shape_numel(3, s5, &n) && n == 0, "zero dim makes numel 0 without overflow");
    int64_t s6[] = {4, -1};
    CHECK(!trex_shape_numel(2, s6, &n), "negative dim rejected");
    int64_t s7[TREX_MAX_DIMS + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(!trex_shape_numel(TREX_MAX_DIMS + 1, s7, &n), "too many dims rejected");
    int64_t s8[] = {3037000500, 3037000500}; /* just over sqrt(2^63) */
    CHECK(!trex_shape_numel(2, s8, &n), "square overflow detected");
}

static void test_views(void)
{
    float buf[24];
    int64_t shape[] = {2, 3, 4};
    trex_tensor t = trex_tensor_make(buf, TREX_F32, 3, shape);
    CHECK(t.stride[0] == 12 && t.stride[1] == 4 && t.stride[2] == 1, "row-major strides");
    CHECK(trex_tensor_numel(&t) == 24, "numel");
    CHECK(trex_tensor_is_contiguous(&t), "made views are contiguous");
    trex_tensor tr = t; /* swap the last two dims: a transposed view */
    tr.shape[1] = 4;
    tr.shape[2] = 3;
    tr.stride[1] = 1;
    tr.stride[2] = 4;
    CHECK(!trex_tensor_is_contiguous(&tr), "transposed view is not contiguous");
    int64_t s1[] = {1, 5};
    trex_tensor u = trex_tensor_make(buf, TREX_F32, 2, s1);
    u.stride[0] = 999; /* a size-1 dim's stride does not matter */
    CHECK(trex_tensor_is_contiguous(&u), "size-1 dim stride ignored");
    trex_tensor sc = trex_tensor_make(buf, TREX_F32, 0, NULL);
    CHECK(trex_tensor_numel(&sc) == 1 && trex_tensor_is_contiguous(&sc), "scalar view");
}

/* --- conversions -------------------------------------------------------------------------------- */

/* Reference rounding for a format whose positive finite codes 0..maxcode decode in increasing order;
 * code maxcode + 1 stands for `over` (inf for IEEE formats, NaN for e4m3fn), worth over_value. Returns
 * the nearest code to x >= 0, ties to the even code, computed in double. */
typedef float (*decode_fn)(uint32_t code);
static uint32_t ref_round(double x, decode_fn dec, uint32_t maxcode, double over_value)
{
    uint32_t lo = 0, hi = maxcode; /* largest code with value <= x */
    if (x >= over_value)
        return maxcode + 1;
    if (x >= (double)dec(maxcode)) {
        lo = maxcode;
    } else {
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo + 1) / 2;
            if ((double)dec(mid) <= x)
                lo = mid;
            else
                hi = mid - 1;
        }
    }
    double a = (double)dec(lo);
    double b = lo == maxcode ? over_value : (double)dec(lo + 1);
    double da = x - a, db = b - x;
    if (da < db)
        return lo;
    if (db < da)
        return lo + 1;
    return (lo & 1u) ? lo + 1 : lo;
}

static float dec_bf16(uint32_t c) { return trex_bf16_to_f32((uint16_t)c); }
static float dec_f16(uint32_t c) { return trex_f16_to_f32((uint16_t)c); }
static float dec_e4m3(uint32_t c) { return trex_f8e4m3_to_f32((uint8_t)c); }

/* Checks the encoder against ref_round for x and -x. */
static int check_round(float x, int which)
{
    double ax = fabs((double)x);
    uint32_t want, got, sign;
    if (which == 0) {
        want = ref_round(ax, dec_bf16, 0x7f7f, 0x1p128);
        got = trex_f32_to_bf16(x);
        sign = 0x8000;
    } else if (which == 1) {
        want = ref_round(ax, dec_f16, 0x7bff, 65536.0);
        got = trex_f32_to_f16(x);
        sign = 0x8000;
    } else {
        want = ref_round(ax, dec_e4m3, 0x7e, 480.0);
        if (want == 0x7f)
            want = 0x7f; /* NaN */
        got = trex_f32_to_f8e4m3(x);
        sign = 0x80;
    }
    if (signbit(x))
        want |= sign;
    if (got != want) {
        fprintf(stderr, "format %d: %a (0x%08x) -> 0x%x, want 0x%x\n", which, (double)x, fbits(x), got,
                want);
        return 0;
    }
    return 1;
}

static void test_conversions(void)
{
    /* bf16 and f16: every code decodes and re-encodes to itself (NaN stays NaN). */
    int bad_bf = 0, bad_h = 0;
    for (uint32_t c = 0; c < 0x10000; c++) {
        float f = trex_bf16_to_f32((uint16_t)c);
        uint16_t back = trex_f32_to_bf16(f);
        if (isnan(f) ? !isnan(trex_bf16_to_f32(back)) || (back & 0x8000) != (c & 0x8000) : back != c)
            bad_bf++;
        float g = trex_f16_to_f32((uint16_t)c);
        uint16_t hb = trex_f32_to_f16(g);
        if (isnan(g) ? !isnan(trex_f16_to_f32(hb)) || (hb & 0x8000) != (c & 0x8000) : hb != c)
            bad_h++;
    }
    CHECK(bad_bf == 0, "bf16 round trip: %d codes differ", bad_bf);
    CHECK(bad_h == 0, "f16 round trip: %d codes differ", bad_h);
    int bad_8 = 0, nan_8 = 0;
    for (uint32_t c = 0; c < 0x100; c++) {
        float f = trex_f8e4m3_to_f32((uint8_t)c);
        if (isnan(f)) {
            nan_8++;
            continue;
        }
        if (trex_f32_to_f8e4m3(f) != c)
            bad_8++;
    }
    CHECK(bad_8 == 0, "e4m3 round trip: %d codes differ", bad_8);
    CHECK(nan_8 == 2, "e4m3 has exactly two NaN codes, got %d", nan_8);

    /* Known values. */
    CHECK(trex_bf16_to_f32(0x3f80) == 1.0f && trex_f32_to_bf16(1.0f) == 0x3f80, "bf16 1.0");
    CHECK(trex_f32_to_bf16(bitsf(0x3f808000u)) == 0x3f80, "bf16 tie to even (down)");
    CHECK(trex_f32_to_bf16(bitsf(0x3f818000u)) == 0x3f82, "bf16 tie to even (up)");
    CHECK(trex_f32_to_bf16(bitsf(0x3f808001u)) == 0x3f81, "bf16 above tie rounds up");
    CHECK(trex_f32_to_bf16(bitsf(0x7f7fffffu)) == 0x7f80, "bf16 overflow to inf");
    CHECK(isnan(trex_bf16_to_f32(trex_f32_to_bf16(bitsf(0x7f800001u)))), "bf16 signalling NaN stays NaN");
    CHECK(trex_f32_to_bf16(bitsf(0xffc00000u)) == 0xffc0, "bf16 negative NaN keeps sign");
    CHECK(trex_f16_to_f32(0x3c00) == 1.0f && trex_f16_to_f32(0x7bff) == 65504.0f, "f16 1 and max");
    CHECK(trex_f16_to_f32(0x0001) == 0x1p-24f, "f16 smallest subnormal");
    CHECK(trex_f32_to_f16(65520.0f) == 0x7c00 && trex_f32_to_f16(65519.0f) == 0x7bff, "f16 overflow edge");
    CHECK(trex_f32_to_f16(0x1p-25f) == 0x0000, "f16 half of smallest subnormal ties to 0");
    CHECK(trex_f32_to_f16(0x1.000002p-25f) == 0x0001, "f16 just above the half rounds up");
    CHECK(trex_f32_to_f16(0x3p-25f) == 0x0002, "f16 1.5 subnormal ulps ties to 2");
    CHECK(trex_f32_to_f16(-0.0f) == 0x8000 && trex_f32_to_f16(bitsf(1)) == 0, "f16 zeros");
    CHECK(trex_f32_to_f16(0x1.ffcp-15f) == 0x0400, "f16 subnormal carries into the smallest normal");
    CHECK(trex_f32_to_f16(INFINITY) == 0x7c00 && trex_f32_to_f16(-INFINITY) == 0xfc00, "f16 inf");
    CHECK(isnan(trex_f16_to_f32(trex_f32_to_f16(NAN))), "f16 NaN");
    CHECK(trex_f8e4m3_to_f32(0x7e) == 448.0f && trex_f8e4m3_to_f32(0x01) == 0x1p-9f, "e4m3 max, min");
    CHECK(trex_f8e4m3_to_f32(0x08) == 0x1p-6f && trex_f8e4m3_to_f32(0x38) == 1.0f, "e4m3 2^-6 and 1");
    CHECK(signbit(trex_f8e4m3_to_f32(0x80)) && trex_f8e4m3_to_f32(0x80) == 0.0f, "e4m3 -0");
    CHECK(isnan(trex_f8e4m3_to_f32(0x7f)) && isnan(trex_f8e4m3_to_f32(0xff)), "e4m3 NaN codes");
    CHECK(trex_f32_to_f8e4m3(464.0f) == 0x7e && trex_f32_to_f8e4m3(465.0f) == 0x7f, "e4m3 overflow edge");
    CHECK(trex_f32_to_f8e4m3(-1000.0f) == 0xff && trex_f32_to_f8e4m3(INFINITY) == 0x7f, "e4m3 overflow NaN");
    CHECK(trex_f8e8m0_to_f32(127) == 1.0f && trex_f8e8m0_to_f32(0) == 0x1p-127f, "e8m0 1 and 2^-127");
    CHECK(trex_f8e8m0_to_f32(254) == 0x1p127f && isnan(trex_f8e8m0_to_f32(255)), "e8m0 2^127 and NaN");

    /* Rounding against a reference: every midpoint between neighbouring codes, one f32 ulp either side,
     * and a sweep of random bit patterns. */
    int bad = 0;
    for (int which = 0; which < 3; which++) {
        uint32_t maxcode = which == 0 ? 0x7f7f : which == 1 ? 0x7bff : 0x7e;
        for (uint32_t c = 0; c <= maxcode; c++) {
            float a = which == 0 ? dec_bf16(c) : which == 1 ? dec_f16(c) : dec_e4m3(c);
            double b = c == maxcode ? (which == 0 ? 0x1p128 : which == 1 ? 65536.0 : 480.0)
                                    : (double)(which == 0 ? dec_bf16(c + 1)
                                                          : which == 1 ? dec_f16(c + 1) : dec_e4m3(c + 1));
            float mid = (float)(((double)a + b) / 2); /* exact: one more mantissa bit than the format */
            if (isinf(mid))
                continue;
            bad += !check_round(mid, which);
            bad += !check_round(nextafterf(mid, 0.0f), which);
            bad += !check_round(nextafterf(mid, INFINITY), which);
            bad += !check_round(a, which);
        }
        trex_rng r = trex_rng_make(7, (uint64_t)which);
        for (int i = 0; i < 300000; i++) {
            float x = bitsf(trex_rng_u32(&r));
            if (isnan(x) || isinf(x))
                continue;
            bad += !check_round(x, which);
        }
        if (bad > 20)
            break;
    }
    CHECK(bad == 0, "%d conversions disagree with the reference rounding", bad);

    /* convert_to_f32 over every dtype, from an unaligned source. */
    unsigned char raw[8 * 4 + 1];
    float out[4];
    {
        double d[4] = {1.5, -2.25, 1e300, 0.1};
        memcpy(raw + 1, d, sizeof d);
        trex_convert_to_f32(out, raw + 1, TREX_F64, 4);
        CHECK(out[0] == 1.5f && out[1] == -2.25f && isinf(out[2]) && out[3] == 0.1f, "F64");
    }
    {
        float s[4] = {1, 2, 3, -4};
        memcpy(raw + 1, s, sizeof s);
        trex_convert_to_f32(out, raw + 1, TREX_F32, 4);
        CHECK(!memcmp(out, s, sizeof s), "F32");
    }
    {
        uint16_t s[4] = {0x3f80, 0xc000, 0x7f80, 0x0000};
        memcpy(raw + 1, s, sizeof s);
        trex_convert_to_f32(out, raw + 1, TREX_BF16, 4);
        CHECK(out[0] == 1 && out[1] == -2 && isinf(out[2]) && out[3] == 0, "BF16");
        uint16_t h[4] = {0x3c00, 0xc000, 0x7c00, 0x0001};
        memcpy(raw + 1, h, sizeof h);
        trex_convert_to_f32(out, raw + 1, TREX_F16, 4);
        CHECK(out[0] == 1 && out[1] == -2 && isinf(out[2]) && out[3] == 0x1p-24f, "F16");
    }
    {
        int64_t s[4] = {-3, 0, (int64_t)1 << 40, 7};
        memcpy(raw + 1, s, sizeof s);
        trex_convert_to_f32(out, raw + 1, TREX_I64, 4);
        CHECK(out[0] == -3 && out[1] == 0 && out[2] == 0x1p40f && out[3] == 7, "I64");
        int32_t t[4] = {-3, 0, 1 << 30, 7};
        memcpy(raw + 1, t, sizeof t);
        trex_convert_to_f32(out, raw + 1, TREX_I32, 4);
        CHECK(out[0] == -3 && out[2] == 0x1p30f, "I32");
    }
    {
        unsigned char b[4] = {0, 255, 0x80, 0x38};
        memcpy(raw + 1, b, sizeof b);
        trex_convert_to_f32(out, raw + 1, TREX_U8, 4);
        CHECK(out[1] == 255 && out[2] == 128, "U8");
        trex_convert_to_f32(out, raw + 1, TREX_I8, 4);
        CHECK(out[1] == -1 && out[2] == -128 && out[3] == 0x38, "I8");
        trex_convert_to_f32(out, raw + 1, TREX_F8_E4M3, 4);
        CHECK(out[0] == 0 && isnan(out[1]) && out[3] == 1.0f, "F8_E4M3");
        trex_convert_to_f32(out, raw + 1, TREX_F8_E8M0, 4);
        CHECK(out[0] == 0x1p-127f && isnan(out[1]) && out[2] == 2.0f, "F8_E8M0");
    }
}

/* --- allocation --------------------------------------------------------------------------------- */

static void test_alloc(void)
{
    trex_mem mem;
    memset(&mem, 0, sizeof mem);
    unsigned char *a = trex_mem_alloc(&mem, TREX_REGION_PARAMS, 1000);
    unsigned char *b = trex_mem_alloc(&mem, TREX_REGION_GRADS, 3);
    unsigned char *z = trex_mem_alloc(&mem, TREX_REGION_ACTS, 0);
    CHECK(a && b && z, "allocations succeed");
    if (!a || !b || !z)
        return;
    CHECK(((uintptr_t)a % TREX_ALIGN) == 0 && ((uintptr_t)b % TREX_ALIGN) == 0 &&
              ((uintptr_t)z % TREX_ALIGN) == 0,
          "64-byte aligned");
    int nonzero = 0;
    for (int i = 0; i < 1000; i++)
        nonzero += a[i] != 0;
    CHECK(nonzero == 0, "zero-filled");
    memset(a, 0xab, 1000); /* the whole block is writable (ASan checks the bounds) */
    CHECK(mem.live[TREX_REGION_PARAMS] == 1000 && mem.live[TREX_REGION_GRADS] == 3, "live per region");
    CHECK(mem.live_total == 1003 && mem.peak_total == 1003, "totals");
    trex_mem_free(&mem, TREX_REGION_PARAMS, a);
    CHECK(mem.live[TREX_REGION_PARAMS] == 0 && mem.peak[TREX_REGION_PARAMS] == 1000, "free keeps peak");
    CHECK(mem.live_total == 3 && mem.peak_total == 1003, "totals after free");
    trex_mem_free(&mem, TREX_REGION_GRADS, b);
    trex_mem_free(&mem, TREX_REGION_ACTS, z);
    trex_mem_free(&mem, TREX_REGION_ACTS, NULL);
    CHECK(mem.live_total == 0, "all freed");
    CHECK(trex_mem_alloc(&mem, TREX_REGION_OTHER, SIZE_MAX) == NULL, "SIZE_MAX refused");
    CHECK(trex_mem_alloc(&mem, TREX_REGION_OTHER, SIZE_MAX - 10) == NULL, "near-SIZE_MAX refused");
    CHECK(mem.live_total == 0, "failed allocation not charged");
    void *n = trex_mem_alloc(NULL, TREX_REGION_OTHER, 10);
    CHECK(n != NULL, "NULL mem is allowed");
    trex_mem_free(NULL, TREX_REGION_OTHER, n);
    CHECK(!strcmp(trex_region_name(TREX_REGION_OPTIM), "optim"), "region name");
    CHECK(trex_peak_rss_bytes() > 0, "peak RSS is known on Linux");
}

/* The THP setting of the system: 1 always or madvise (a block of trex_mem_alloc should then be in a
 * huge-page-eligible mapping), 0 never, -1 unknown (no THP in this kernel). */
static int thp_mode(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return -1;
    char line[128] = {0};
    const bool got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!got)
        return -1;
    return strstr(line, "[always]") || strstr(line, "[madvise]") ? 1 : strstr(line, "[never]") ? 0 : -1;
}

/* THPeligible of the mapping of /proc/self/smaps that holds p: 1 or 0, -1 if not found. */
static int thp_eligible(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    bool inside = false;
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (inside && !strncmp(line, "THPeligible:", 12))
            found = atoi(line + 12) != 0;
    }
    fclose(f);
    return found;
}

/* Blocks of 16 MiB or more ask for transparent huge pages (core/alloc.c): where the kernel's THP mode
 * is madvise or always, the middle of such a block lies in a mapping that may get them. */
static void test_huge_pages(void)
{
    const int mode = thp_mode();
    if (mode != 1) {
        printf("test_huge_pages: THP is %s here, skipped\n", mode == 0 ? "never" : "not available");
        return;
    }
    const size_t bytes = (size_t)32 << 20;
    unsigned char *big = trex_mem_alloc(NULL, TREX_REGION_OTHER, bytes);
    CHECK(big != NULL, "32 MiB block");
    if (!big)
        return;
    big[bytes / 2] = 1; /* a page in the middle, inside the advised range */
    const int e = thp_eligible(big + bytes / 2);
    if (e < 0)
        printf("test_huge_pages: no THPeligible line for the block in /proc/self/smaps, skipped\n");
    else
        CHECK(e == 1, "a 32 MiB block lies in a huge-page-eligible mapping");
    trex_mem_free(NULL, TREX_REGION_OTHER, big);
}

static void arena_pass(trex_arena *ar, void **ptrs, int *dirty)
{
    static const size_t sizes[] = {100, 5000, 1, 0, 70000, 64, 300000, 7, 2000000, 129};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = trex_arena_alloc(ar, sizes[i]);
        ptrs[i] = p;
        if (!p)
            continue;
        if ((uintptr_t)p % TREX_ALIGN != 0)
            (*dirty)++;
        for (size_t k = 0; k < sizes[i]; k++)
            if (p[k] != 0) {
                (*dirty)++;
                break;
            }
        memset(p, 0x5a, sizes[i]); /* the next pass must see zeros again */
    }
}

static void test_arena(void)
{
    trex_mem mem;
    memset(&mem, 0, sizeof mem);
    trex_arena *ar = trex_arena_create(&mem, TREX_REGION_ACTS, 4096);
    CHECK(ar != NULL, "arena created");
    if (!ar)
        return;
    void *p1[10], *p2[10], *p3[10];
    int dirty = 0;
    arena_pass(ar, p1, &dirty);
    size_t used1 = trex_arena_used(ar);
    CHECK(used1 >= 100 + 5000 + 70000 + 300000 + 2000000, "used counts the pass (%zu)", used1);
    CHECK(trex_arena_reserved(ar) >= used1, "reserved >= used");
    CHECK(mem.live[TREX_REGION_ACTS] == trex_arena_reserved(ar), "chunks charged to the region");
    trex_arena_reset(ar);
    CHECK(trex_arena_used(ar) == 0, "reset clears used");
    size_t reserved = trex_arena_reserved(ar);
    arena_pass(ar, p2, &dirty);
    size_t peak = mem.peak_total;
    CHECK(trex_arena_reserved(ar) == reserved, "second pass fits the same chunks (%zu vs %zu)",
          trex_arena_reserved(ar), reserved);
    CHECK(!memcmp(p1, p2, sizeof p1), "second pass lands where the first did (no page is new)");
    CHECK(trex_arena_used(ar) == used1, "same pass, same used");
    for (int pass = 0; pass < 3; pass++) {
        trex_arena_reset(ar);
        arena_pass(ar, p3, &dirty);
        CHECK(!memcmp(p2, p3, sizeof p2), "pass %d reuses the same addresses", pass + 3);
        CHECK(trex_arena_reserved(ar) == reserved && mem.peak_total == peak,
              "pass %d takes nothing from the system", pass + 3);
    }
    CHECK(dirty == 0, "every block zeroed and aligned (%d bad)", dirty);

    /* Chunks grow geometrically: every new chunk is at least as large as all before it, so passes
     * that rewind and ask for large blocks do not strand one small tail after another. */
    {
        trex_mem gm;
        memset(&gm, 0, sizeof gm);
        trex_arena *g = trex_arena_create(&gm, TREX_REGION_ACTS, 4096);
        size_t before = 0;
        int grew = 0, doubled = 0;
        for (int i = 0; g && i < 6; i++) {
            CHECK(trex_arena_xalloc(g, 3000) != NULL, "grow %d", i);
            size_t now = trex_arena_reserved(g);
            if (now != before) {
                grew++;
                doubled += now >= 2 * before;
            }
            before = now;
        }
        CHECK(grew >= 3 && doubled == grew, "each new chunk doubles the reservation (%d of %d)", doubled, grew);
        trex_arena_destroy(g);
    }

    /* mark/rewind: scratch carved after a mark is reused, blocks before it survive. */
    trex_arena_reset(ar);
    unsigned char *keep = trex_arena_xalloc(ar, 1000);
    memset(keep, 0x11, 1000);
    trex_arena_mark m = trex_arena_mark_get(ar);
    size_t used_at_mark = trex_arena_used(ar);
    void *s1 = trex_arena_xalloc(ar, 300000);
    void *s2 = trex_arena_xalloc(ar, 2000000); /* may spill into the next chunk */
    memset(s1, 0x22, 300000);
    memset(s2, 0x33, 2000000);
    trex_arena_rewind(ar, m);
    CHECK(trex_arena_used(ar) == used_at_mark, "rewind restores used");
    const size_t high = trex_arena_peak(ar);
    CHECK(high >= used_at_mark + 2300000 && high > trex_arena_used(ar),
          "peak keeps the high-water mark over a rewind (%zu)", high);
    unsigned char *t1 = trex_arena_xalloc(ar, 300000);
    unsigned char *t2 = trex_arena_xalloc(ar, 2000000);
    CHECK((void *)t1 == s1 && (void *)t2 == s2, "rewound space is carved again at the same places");
    CHECK(t1[0] == 0 && t1[299999] == 0 && t2[0] == 0 && t2[1999999] == 0, "reused blocks are zeroed");
    int kept = 1;
    for (int k = 0; k < 1000; k++)
        kept &= keep[k] == 0x11;
    CHECK(kept, "blocks carved before the mark survive a rewind");
    CHECK(trex_arena_reserved(ar) == reserved, "mark/rewind takes nothing from the system");
    CHECK(trex_arena_peak(ar) == high, "the same blocks carved again leave the peak where it was");
    trex_arena_reset(ar);
    CHECK(trex_arena_peak(ar) == 0, "reset clears the peak");
    (void)trex_arena_xalloc(ar, 1000);
    CHECK(trex_arena_peak(ar) == trex_arena_used(ar) && trex_arena_used(ar) > 0, "peak follows a new pass");

    /* an uninitialised block is carved like any other, and zeroed blocks carved over it later are zero */
    m = trex_arena_mark_get(ar);
    unsigned char *u = trex_arena_alloc_uninit(ar, 5000);
    CHECK(u != NULL && (uintptr_t)u % TREX_ALIGN == 0, "uninit block carved and aligned");
    memset(u, 0x44, 5000);
    trex_arena_rewind(ar, m);
    unsigned char *z = trex_arena_xalloc(ar, 5000);
    CHECK(z == u && z[0] == 0 && z[4999] == 0, "a zeroed block over an uninit one is zero");

    void *big = trex_arena_xalloc(ar, 10u << 20);
    CHECK(big != NULL && trex_arena_reserved(ar) > reserved, "a larger request grows the arena");
    CHECK(trex_arena_alloc(ar, SIZE_MAX) == NULL, "SIZE_MAX refused");
    trex_arena_destroy(ar);
    CHECK(mem.live_total == 0, "destroy returns every chunk");
    trex_arena_destroy(NULL);
}

/* --- thread pool -------------------------------------------------------------------------------- */

typedef struct cover_arg {
    int *hits;
    int64_t *chunk_begin; /* per tid */
    int64_t *chunk_end;
    int *tid_calls;
    int size;
    int bad;
} cover_arg;

static void cover_fn(void *p, int64_t begin, int64_t end, int tid)
{
    cover_arg *a = p;
    if (tid < 0 || tid >= a->size) {
        __atomic_add_fetch(&a->bad, 1, __ATOMIC_RELAXED);
        return;
    }
    a->tid_calls[tid]++;
    a->chunk_begin[tid] = begin;
    a->chunk_end[tid] = end;
    for (int64_t i = begin; i < end; i++)
        a->hits[i]++;
}

static void test_pool_cover(void)
{
    static const int threads[] = {1, 2, 3, 4, 7};
    static const int64_t ns[] = {0, 1, 2, 3, 5, 7, 8, 16, 31, 64, 100, 257, 1000, 4099};
    static const int64_t grains[] = {1, 2, 3, 8, 64, 1000};
    int failures = 0, checked = 0;
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        trex_pool *pool = trex_pool_create(threads[t]);
        CHECK(pool != NULL && trex_pool_size(pool) == threads[t], "pool of %d", threads[t]);
        if (!pool)
            continue;
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
            for (size_t ig = 0; ig < sizeof grains / sizeof grains[0]; ig++) {
                int64_t n = ns[in], grain = grains[ig];
                int size = threads[t];
                int hits[4099] = {0}, calls[8] = {0};
                int64_t cb[8], ce[8];
                cover_arg a = {hits, cb, ce, calls, size, 0};
                trex_pool_for(pool, n, grain, cover_fn, &a);
                int k = trex_pool_chunks(pool, n, grain);
                int ok = a.bad == 0;
                for (int64_t i = 0; i < n; i++)
                    ok &= hits[i] == 1;
                if (n > 0) {
                    /* exactly chunks 0..k-1 ran, once each, on the documented boundaries */
                    for (int i = 0; i < size; i++)
                        ok &= calls[i] == (i < k ? 1 : 0);
                    int64_t base = n / k, rem = n % k;
                    for (int i = 0; i < k; i++) {
                        int64_t b = i * base + (i < rem ? i : rem);
                        ok &= cb[i] == b && ce[i] == b + base + (i < rem ? 1 : 0);
                    }
                    ok &= k == (n <= grain ? 1 : (n / grain < size ? (int)(n / grain) : size));
                }
                if (!ok && failures++ < 5)
                    fprintf(stderr, "pool cover failed: n=%lld grain=%lld threads=%d\n", (long long)n,
                            (long long)grain, size);
                checked++;
            }
        }
        trex_pool_destroy(pool);
    }
    CHECK(failures == 0, "%d of %d (n, grain, threads) cases miscovered", failures, checked);

    int hits[10] = {0}, calls[1] = {0};
    int64_t cb[1], ce[1];
    cover_arg a = {hits, cb, ce, calls, 1, 0};
    trex_pool_for(NULL, 10, 1, cover_fn, &a);
    CHECK(calls[0] == 1 && cb[0] == 0 && ce[0] == 10 && trex_pool_size(NULL) == 1, "NULL pool is serial");
}

typedef struct sum_arg {
    const float *x;
    double partial[8];
} sum_arg;

static void sum_fn(void *p, int64_t begin, int64_t end, int tid)
{
    sum_arg *a = p;
    float s = 0;
    for (int64_t i = begin; i < end; i++)
        s += a->x[i] * a->x[i];
    a->partial[tid] = s;
}

typedef struct nest_arg {
    trex_pool *pool;
    int inner_tid_ok;
    int64_t inner_total;
} nest_arg;

static void inner_fn(void *p, int64_t begin, int64_t end, int tid)
{
    (void)tid;
    __atomic_add_fetch((int64_t *)p, end - begin, __ATOMIC_RELAXED);
}

static void outer_fn(void *p, int64_t begin, int64_t end, int tid)
{
    nest_arg *a = p;
    for (int64_t i = begin; i < end; i++) {
        int64_t count = 0;
        trex_pool_for(a->pool, 1000, 1, inner_fn, &count); /* must run inline, not deadlock */
        __atomic_add_fetch(&a->inner_total, count, __ATOMIC_RELAXED);
    }
    if (tid >= 0 && tid < trex_pool_size(a->pool))
        __atomic_add_fetch(&a->inner_tid_ok, 1, __ATOMIC_RELAXED);
}

/* An environment variable's value, copied (NULL when unset), and putting it back afterwards. */
static char *env_save(const char *name)
{
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}

static void env_restore(const char *name, char *saved)
{
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
}

/* Waiting: a worker polls for the next job, then sleeps; the caller polls until every worker is done
 * with the job, then sleeps (core/pool.c). Calls spaced by pauses longer than the polling window make
 * the threads sleep between them, and a 1 us window races every registration against a posting; each
 * call must still run every index once, whatever the caller and the workers happen to be doing, with
 * fewer chunks than workers too, more threads than cores, and two unrelated threads calling one pool.
 * (A lost wake-up hangs: main's alarm ends the test. Races the plain build cannot show are
 * tests/test_pool_tsan.sh's.) */
typedef struct wait_arg {
    trex_pool *pool;
    int64_t total;
    int calls;
} wait_arg;

/* Plain writes, each index by the chunk that owns it: checked right after the call returns. */
static void hit_fn(void *p, int64_t begin, int64_t end, int tid)
{
    (void)tid;
    int *hits = p;
    for (int64_t i = begin; i < end; i++)
        hits[i]++;
}

static void *wait_caller(void *p)
{
    wait_arg *a = p;
    for (int i = 0; i < a->calls; i++)
        trex_pool_for(a->pool, 5 + i % 7, 1, inner_fn, &a->total);
    return NULL;
}

static void test_pool_waits(void)
{
    char *keep = env_save("TREX_SPIN_US");
    static const char *spins[] = {"0", "1", "50", NULL};
    static const int sizes[] = {2, 3, 5}; /* 5: more threads than this machine's cores */
    static const useconds_t pauses[] = {20, 300, 1}; /* after every tenth call, in turn */
    for (size_t si = 0; si < sizeof spins / sizeof spins[0]; si++) {
        const char *label = spins[si] ? spins[si] : "(unset)";
        if (spins[si])
            setenv("TREX_SPIN_US", spins[si], 1);
        else
            unsetenv("TREX_SPIN_US");
        for (size_t zi = 0; zi < sizeof sizes / sizeof sizes[0]; zi++) {
            trex_pool *pool = trex_pool_create(sizes[zi]);
            CHECK(pool != NULL, "pool of %d with TREX_SPIN_US=%s", sizes[zi], label);
            if (!pool)
                continue;
            int bad = 0;
            for (int i = 0; i < 1200; i++) {
                int hits[6] = {0};
                const int64_t n = 1 + i % 6; /* 1 .. 6 chunks of 1: fewer than the workers at times */
                trex_pool_for(pool, n, 1, hit_fn, hits);
                for (int64_t j = 0; j < 6; j++)
                    bad += hits[j] != (j < n);
                if (i % 10 == 9)
                    usleep(pauses[(i / 10) % 3]);
            }
            CHECK(bad == 0, "TREX_SPIN_US=%s, %d threads: %d indices not run exactly once at the call's return",
                  label, sizes[zi], bad);
            wait_arg a[2] = {{pool, 0, 600}, {pool, 0, 600}};
            pthread_t th;
            const bool started = pthread_create(&th, NULL, wait_caller, &a[1]) == 0;
            wait_caller(&a[0]);
            if (started)
                pthread_join(th, NULL);
            int64_t w = 0;
            for (int i = 0; i < 600; i++)
                w += 5 + i % 7;
            CHECK(started && a[0].total == w && a[1].total == w,
                  "two callers of one pool: %lld and %lld of %lld", (long long)a[0].total,
                  (long long)a[1].total, (long long)w);
            trex_pool_destroy(pool);
        }
    }
    static const char *bad[] = {"abc", "-1", "1000001", "5us"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("TREX_SPIN_US", bad[i], 1);
        trex_err err = {0};
        trex_pool *p = NULL;
        const trex_code rc = trex_pool_create_checked(&p, 2, &err);
        CHECK(rc == TREX_EINVAL && !p && strstr(err.msg, "TREX_SPIN_US"), "TREX_SPIN_US='%s': %s", bad[i],
              err.msg);
        trex_pool_destroy(p);
    }
    env_restore("TREX_SPIN_US", keep);
}

static void test_pool_misc(void)
{
    float x[10007];
    trex_rng r = trex_rng_make(1, 2);
    for (int i = 0; i < 10007; i++)
        x[i] = (float)trex_rng_normal(&r);
    trex_pool *pool = trex_pool_create(4);
    CHECK(pool != NULL, "pool of 4");
    if (!pool)
        return;
    /* Same pool size, same chunking, same bits, however the threads are scheduled. */
    double first = 0;
    int same = 1;
    for (int rep = 0; rep < 50; rep++) {
        sum_arg a;
        memset(&a, 0, sizeof a);
        a.x = x;
        trex_pool_for(pool, 10007, 100, sum_fn, &a);
        double s = 0;
        for (int t = 0; t < 4; t++)
            s += a.partial[t];
        if (rep == 0)
            first = s;
        else
            same &= memcmp(&s, &first, sizeof s) == 0;
    }
    CHECK(same, "repeated reductions are bitwise identical");

    nest_arg na = {pool, 0, 0};
    trex_pool_for(pool, 8, 1, outer_fn, &na);
    CHECK(na.inner_total == 8 * 1000 && na.inner_tid_ok == 4, "nested calls run inline (%lld, %d)",
          (long long)na.inner_total, na.inner_tid_ok);

    /* Many small calls: the persistent workers must keep up (a smoke test, not a timing). */
    int64_t total = 0;
    for (int i = 0; i < 20000; i++)
        trex_pool_for(pool, 64, 8, inner_fn, &total);
    CHECK(total == 20000 * 64, "20000 small calls cover everything");
    trex_pool_destroy(pool);
    trex_pool_destroy(NULL);

    /* TREX_THREADS. */
    char *keep = env_save("TREX_THREADS");
    setenv("TREX_THREADS", "3", 1);
    pool = trex_pool_create(0);
    CHECK(pool && trex_pool_size(pool) == 3, "TREX_THREADS=3 honoured");
    trex_pool_destroy(pool);
    pool = trex_pool_create(2);
    CHECK(pool && trex_pool_size(pool) == 2, "explicit count wins over TREX_THREADS");
    trex_pool_destroy(pool);
    static const char *bad[] = {"abc", "0", "-2", "3x", "", "99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("TREX_THREADS", bad[i], 1);
        trex_err err = {0};
        trex_pool *p = NULL;
        trex_code rc = trex_pool_create_checked(&p, 0, &err);
        if (!*bad[i]) { /* empty means unset */
            CHECK(rc == TREX_OK && p, "empty TREX_THREADS means unset");
        } else {
            CHECK(rc == TREX_EINVAL && !p && strstr(err.msg, "TREX_THREADS"), "TREX_THREADS='%s': %s",
                  bad[i], err.msg);
            CHECK(trex_pool_create(0) == NULL, "trex_pool_create refuses TREX_THREADS='%s'", bad[i]);
        }
        trex_pool_destroy(p);
    }
    env_restore("TREX_THREADS", keep);
}

/* --- RNG ---------------------------------------------------------------------------------------- */

static void test_rng(void)
{
    /* Known answers of Philox-4x32-10 from the Random123 distribution (kat_vectors). */
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4];
        trex_rng_philox(kat[i].ctr, kat[i].key, out);
        CHECK(!memcmp(out, kat[i].out, sizeof out), "Philox KAT %zu: %08x %08x %08x %08x", i, out[0],
              out[1], out[2], out[3]);
    }
    uint32_t blk[4];
    trex_rng_block(0, 0, blk);
    CHECK(blk[0] == 0x6627e8d5 && blk[3] == 0x9b00dbd8, "block(0, 0) is the zero KAT");

    /* Reproducible, counter-addressed. */
    trex_rng a = trex_rng_make(42, 0), b = trex_rng_make(42, 0);
    int same = 1;
    for (int i = 0; i < 100; i++)
        same &= trex_rng_u64(&a) == trex_rng_u64(&b);
    CHECK(same, "same seed and stream, same sequence");
    trex_rng c = trex_rng_make(42, 0);
    c.counter = 57;
    trex_rng_block(c.key, 57, blk);
    CHECK(trex_rng_u32(&c) == blk[0] && c.counter == 58, "u32 is word 0 of the block at the counter");

    /* Distinct streams and seeds: distinct keys, no shared values in a long prefix. */
    int dup_keys = 0;
    for (uint64_t s = 0; s < 1000; s++) {
        trex_rng x = trex_rng_make(5, s), y = trex_rng_make(5, s + 1), z = trex_rng_make(s + 6, s);
        dup_keys += x.key == y.key || x.key == trex_rng_make(6, s).key || z.key == x.key;
    }
    CHECK(dup_keys == 0, "distinct (seed, stream) give distinct keys");
    trex_rng s0 = trex_rng_make(9, 0), s1 = trex_rng_make(9, 1);
    int equal = 0;
    for (int i = 0; i < 10000; i++)
        equal += trex_rng_u64(&s0) == trex_rng_u64(&s1);
    CHECK(equal == 0, "streams 0 and 1 differ everywhere (%d equal)", equal);

    /* Uniform: mean 1/2, variance 1/12, range [0, 1). Fixed seed, so the bounds are deterministic. */
    trex_rng u = trex_rng_make(2024, 3);
    const int n = 1000000;
    double sum = 0, sum2 = 0, lo = 1, hi = 0;
    for (int i = 0; i < n; i++) {
        double v = trex_rng_uniform(&u);
        sum += v;
        sum2 += v * v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    double mean = sum / n, var = sum2 / n - mean * mean;
    CHECK(lo >= 0 && hi < 1, "uniform in [0, 1)");
    CHECK_NEAR(mean, 0.5, 5 * sqrt(1.0 / 12 / n), "uniform mean");
    CHECK_NEAR(var, 1.0 / 12, 0.002, "uniform variance");

    /* below(n): range and balance over a small n; a large non-power-of-two n stays below. */
    trex_rng bl = trex_rng_make(77, 1);
    int counts[7] = {0}, out_of_range = 0;
    for (int i = 0; i < 70000; i++) {
        uint64_t v = trex_rng_below(&bl, 7);
        if (v >= 7)
            out_of_range++;
        else
            counts[v]++;
    }
    CHECK(out_of_range == 0, "below(7) < 7");
    for (int k = 0; k < 7; k++)
        CHECK(abs(counts[k] - 10000) < 500, "below(7) bucket %d: %d", k, counts[k]);
    CHECK(trex_rng_below(&bl, 1) == 0, "below(1) is 0");
    uint64_t big = (UINT64_MAX / 3) * 2 + 1; /* rejection path is taken with probability ~1/3 */
    int ok = 1;
    for (int i = 0; i < 1000; i++)
        ok &= trex_rng_below(&bl, big) < big;
    CHECK(ok, "below(large n) < n");

    /* Normal: mean 0, variance 1, and normal2 pairs. */
    trex_rng nr = trex_rng_make(11, 0);
    sum = sum2 = 0;
    double s4 = 0;
    for (int i = 0; i < n / 2; i++) {
        double z[2];
        trex_rng_normal2(&nr, z);
        sum += z[0] + z[1];
        sum2 += z[0] * z[0] + z[1] * z[1];
        s4 += z[0] * z[0] * z[0] * z[0] + z[1] * z[1] * z[1] * z[1];
    }
    CHECK_NEAR(sum / n, 0.0, 5 / sqrt((double)n), "normal mean");
    CHECK_NEAR(sum2 / n, 1.0, 0.01, "normal variance");
    CHECK_NEAR(s4 / n, 3.0, 0.05, "normal fourth moment");
    trex_rng n1 = trex_rng_make(11, 0), n2 = trex_rng_make(11, 0);
    double z[2];
    trex_rng_normal2(&n2, z);
    CHECK(trex_rng_normal(&n1) == z[0] && n1.counter == n2.counter, "normal is normal2[0] of one block");
}

/* --- I/O ---------------------------------------------------------------------------------------- */

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return 0;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

static void test_io(void)
{
    char dir[] = "/tmp/trex-test-core-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp: %s", strerror(errno));
        return;
    }
    char path[256], p2[512];
    trex_err err = {0};

    /* atomic write + bounded read */
    snprintf(path, sizeof path, "%s/a.bin", dir);
    const char payload[] = "hello\0world";
    CHECK(trex_file_write_atomic(path, payload, sizeof payload, &err) == TREX_OK, "%s", err.msg);
    char *buf = NULL;
    size_t len = 0;
    CHECK(trex_file_read(path, 1000, &buf, &len, &err) == TREX_OK && len == sizeof payload &&
              !memcmp(buf, payload, len) && buf[len] == '\0',
          "read back");
    free(buf);
    buf = NULL;
    CHECK(trex_file_read(path, 5, &buf, &len, &err) == TREX_ERANGE && !buf && strstr(err.msg, path),
          "size bound: %s", err.msg);
    CHECK(trex_file_write_atomic(path, "xy", 2, &err) == TREX_OK, "overwrite");
    CHECK(trex_file_read(path, 1000, &buf, &len, &err) == TREX_OK && len == 2 && !memcmp(buf, "xy", 2),
          "overwritten atomically");
    free(buf);
    buf = NULL;
    snprintf(p2, sizeof p2, "%s.tmp.%ld", path, (long)getpid());
    CHECK(access(p2, F_OK) != 0, "no temporary file left behind");
    snprintf(p2, sizeof p2, "%s/missing", dir);
    CHECK(trex_file_read(p2, 10, &buf, &len, &err) == TREX_ENOTFOUND && strstr(err.msg, p2),
          "missing file: %s", err.msg);
    snprintf(p2, sizeof p2, "%s/no/such/dir/x", dir);
    CHECK(trex_file_write_atomic(p2, "x", 1, &err) != TREX_OK && strstr(err.msg, p2),
          "write into a missing directory: %s", err.msg);
    CHECK(trex_file_read("/proc/self/status", 1 << 20, &buf, &len, &err) == TREX_OK && len > 0 &&
              strstr(buf, "VmHWM"),
          "read a file whose size is unknown (/proc)");
    free(buf);
    buf = NULL;

    /* streaming atomic write; abort leaves nothing */
    trex_atomic_file *af = NULL;
    snprintf(p2, sizeof p2, "%s/stream.bin", dir);
    CHECK(trex_file_atomic_open(&af, p2, &err) == TREX_OK, "%s", err.msg);
    if (af) {
        trex_file_atomic_write(af, "abc", 3, &err);
        CHECK(access(p2, F_OK) != 0, "nothing under the final name before commit");
        trex_file_atomic_abort(af);
        CHECK(access(p2, F_OK) != 0, "abort leaves nothing");
    }
    af = NULL;
    CHECK(trex_file_atomic_open(&af, p2, &err) == TREX_OK, "%s", err.msg);
    if (af) {
        trex_file_atomic_write(af, "abc", 3, &err);
        trex_file_atomic_write(af, "def", 3, &err);
        CHECK(trex_file_atomic_commit(af, &err) == TREX_OK, "%s", err.msg);
        CHECK(trex_file_read(p2, 100, &buf, &len, &err) == TREX_OK && len == 6 && !memcmp(buf, "abcdef", 6),
              "streamed content");
        free(buf);
        buf = NULL;
    }
    unlink(p2);

    /* JSON */
    snprintf(p2, sizeof p2, "%s/bad.json", dir);
    CHECK(write_text(p2, "{\n  \"a\": 1,\n  \"b\": [1, 2,, 3]\n}\n"), "write bad json");
    cJSON *json = NULL;
    CHECK(trex_json_load(p2, &json, &err) == TREX_EFORMAT && !json, "syntax error rejected");
    char want[600];
    snprintf(want, sizeof want, "%s:3:", p2);
    CHECK(strstr(err.msg, want) != NULL, "error names file and line 3: %s", err.msg);
    CHECK(write_text(p2, "{\"a\": 1} trailing"), "write trailing");
    CHECK(trex_json_load(p2, &json, &err) == TREX_EFORMAT && strstr(err.msg, ":1:10:"),
          "trailing garbage at 1:10: %s", err.msg);
    CHECK(write_text(p2, ""), "write empty");
    CHECK(trex_json_load(p2, &json, &err) == TREX_EFORMAT && strstr(err.msg, p2), "empty file: %s",
          err.msg);
    CHECK(write_text(p2, "{\"a\": [1,\n 2"), "write truncated");
    CHECK(trex_json_load(p2, &json, &err) == TREX_EFORMAT && strstr(err.msg, ":2:"),
          "truncated at line 2: %s", err.msg);

    snprintf(path, sizeof path, "%s/good.json", dir);
    cJSON *obj = cJSON_CreateObject();
    cJSON_AddNumberToObject(obj, "hidden_size", 4096);
    cJSON_AddStringToObject(obj, "name", "v4");
    CHECK(trex_json_save(path, obj, &err) == TREX_OK, "%s", err.msg);
    cJSON_Delete(obj);
    CHECK(trex_json_load(path, &json, &err) == TREX_OK && json, "%s", err.msg);
    if (json) {
        cJSON *h = cJSON_GetObjectItemCaseSensitive(json, "hidden_size");
        CHECK(cJSON_IsNumber(h) && h->valuedouble == 4096, "saved value reads back");
        cJSON_Delete(json);
    }
    unlink(path);
    unlink(p2);
    snprintf(path, sizeof path, "%s/a.bin", dir);
    unlink(path);

    /* mkdirs */
    snprintf(path, sizeof path, "%s/x/y//z/", dir);
    CHECK(trex_mkdirs(path, &err) == TREX_OK, "%s", err.msg);
    CHECK(trex_mkdirs(path, &err) == TREX_OK, "existing directories are fine");
    struct stat st;
    snprintf(p2, sizeof p2, "%s/x/y/z", dir);
    CHECK(stat(p2, &st) == 0 && S_ISDIR(st.st_mode), "nested directory exists");
    snprintf(p2, sizeof p2, "%s/x/file", dir);
    CHECK(write_text(p2, "x"), "write file");
    snprintf(path, sizeof path, "%s/x/file/sub", dir);
    CHECK(trex_mkdirs(path, &err) == TREX_EIO && strstr(err.msg, "not a directory"),
          "a file in the way: %s", err.msg);
    unlink(p2);
    snprintf(p2, sizeof p2, "%s/x/y/z", dir);
    rmdir(p2);
    snprintf(p2, sizeof p2, "%s/x/y", dir);
    rmdir(p2);
    snprintf(p2, sizeof p2, "%s/x", dir);
    rmdir(p2);
    CHECK(rmdir(dir) == 0, "scratch directory left clean: %s", strerror(errno));
}

int main(void)
{
    /* A lost wake-up in the thread pool hangs a call forever: end the test by SIGALRM instead of
     * hanging the suite (the whole of it takes about a second) */
    alarm(300);
    test_dtypes();
    test_numel();
    test_views();
    test_conversions();
    test_alloc();
    test_huge_pages();
    test_arena();
    test_pool_cover();
    test_pool_misc();
    test_pool_waits();
    test_rng();
    test_io();
    return check_summary();
}
