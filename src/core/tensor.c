/* core/tensor.c — element types, tensor views and scalar conversions between float formats.
 *
 * Conversions work on bit patterns with integer arithmetic only, so they give the same bits on every
 * machine and under every compiler flag: f32 -> bf16/f16/f8 rounds to nearest, ties to even; NaN stays
 * NaN (quieted, sign kept); subnormals of the narrow formats are produced and decoded exactly. Loads
 * from a source buffer go through memcpy, because tensors mapped from a file need not be aligned. */
#include "trex/tensor.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_info[TREX_DTYPE_COUNT] = {
    [TREX_F32] = {"F32", 4},      [TREX_F64] = {"F64", 8},         [TREX_BF16] = {"BF16", 2},
    [TREX_F16] = {"F16", 2},      [TREX_I64] = {"I64", 8},         [TREX_I32] = {"I32", 4},
    [TREX_U8] = {"U8", 1},        [TREX_I8] = {"I8", 1},           [TREX_F8_E4M3] = {"F8_E4M3", 1},
    [TREX_F8_E8M0] = {"F8_E8M0", 1},
};

size_t trex_dtype_size(trex_dtype dt)
{
    TREX_ASSERT((int)dt >= 0 && dt < TREX_DTYPE_COUNT);
    return dtype_info[dt].size;
}

const char *trex_dtype_name(trex_dtype dt)
{
    if ((int)dt < 0 || dt >= TREX_DTYPE_COUNT)
        return "?";
    return dtype_info[dt].name;
}

trex_code trex_dtype_parse(const char *name, trex_dtype *out)
{
    TREX_ASSERT(name && out);
    for (int i = 0; i < TREX_DTYPE_COUNT; i++) {
        if (!strcmp(name, dtype_info[i].name)) {
            *out = (trex_dtype)i;
            return TREX_OK;
        }
    }
    return TREX_EFORMAT;
}

bool trex_dtype_is_float(trex_dtype dt)
{
    return dt == TREX_F32 || dt == TREX_F64 || dt == TREX_BF16 || dt == TREX_F16 ||
           dt == TREX_F8_E4M3 || dt == TREX_F8_E8M0;
}

bool trex_shape_numel(int ndim, const int64_t *shape, int64_t *numel)
{
    if (ndim < 0 || ndim > TREX_MAX_DIMS)
        return false;
    bool zero = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return false;
        if (shape[i] == 0)
            zero = true;
    }
    int64_t n = 1;
    if (!zero) {
        for (int i = 0; i < ndim; i++) {
            if (n > INT64_MAX / shape[i])
                return false;
            n *= shape[i];
        }
    } else {
        n = 0;
    }
    if (numel)
        *numel = n;
    return true;
}

trex_tensor trex_tensor_make(void *data, trex_dtype dt, int ndim, const int64_t *shape)
{
    TREX_ASSERT((int)dt >= 0 && dt < TREX_DTYPE_COUNT);
    TREX_ASSERT(ndim >= 0 && ndim <= TREX_MAX_DIMS);
    TREX_ASSERT(ndim == 0 || shape);
    trex_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.ndim = ndim;
    int64_t numel = 0;
    TREX_ASSERT(trex_shape_numel(ndim, shape, &numel));
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = stride;
        if (shape[i] > 0)
            stride *= shape[i]; /* cannot overflow: bounded by numel, or numel == 0 */
    }
    return t;
}

int64_t trex_tensor_numel(const trex_tensor *t)
{
    int64_t n = 0;
    TREX_ASSERT(t);
    TREX_ASSERT(trex_shape_numel(t->ndim, t->shape, &n));
    return n;
}

bool trex_tensor_is_contiguous(const trex_tensor *t)
{
    TREX_ASSERT(t && t->ndim >= 0 && t->ndim <= TREX_MAX_DIMS);
    if (trex_tensor_numel(t) == 0)
        return true;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != expect)
            return false;
        expect *= t->shape[i];
    }
    return true;
}

/* --- scalar conversions ------------------------------------------------------------------------ */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Shifts x right by s (1 <= s <= 31) rounding to nearest, ties to even. */
static uint32_t shift_rne(uint32_t x, unsigned s)
{
    uint32_t q = x >> s;
    uint32_t rem = x & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return q;
}

float trex_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t trex_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)               /* NaN: keep sign and top payload, quiet it */
        return (uint16_t)((u >> 16) | 0x0040u);
    uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u); /* ties to even; may carry into inf */
    return (uint16_t)(rounded >> 16);
}

float trex_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp != 0)
        return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0)
        return bits_f32(sign);
    int e = -14; /* subnormal: mant * 2^-24; normalise into f32 */
    while (!(mant & 0x400u)) {
        mant <<= 1;
        e--;
    }
    mant &= 0x3ffu;
    return bits_f32(sign | ((uint32_t)(e + 127) << 23) | (mant << 13));
}

uint16_t trex_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t mant = u & 0x7fffffu;
    if (exp == 0xff) {
        if (mant == 0)
            return sign | 0x7c00u;
        return (uint16_t)(sign | 0x7e00u | (mant >> 13));
    }
    int e = (int)exp - 127;
    if (e > 15)
        return sign | 0x7c00u;
    if (e >= -14) {
        uint32_t v = ((uint32_t)(e + 15) << 23 | mant); /* exponent and mantissa, rounded together */
        return (uint16_t)(sign | shift_rne(v, 13));     /* a carry moves into the exponent; 31 = inf */
    }
    /* Subnormal result: value = full * 2^(e-23), in units of 2^-24 that is full >> (-e-1). */
    unsigned s = (unsigned)(-e - 1);
    if (exp == 0 || s > 24)
        return sign; /* below half the smallest subnormal (f32 subnormals included) */
    uint32_t full = 0x800000u | mant;
    if (s == 24)     /* [2^-25, 2^-24): 0 or the smallest subnormal */
        return (uint16_t)(sign | (full > 0x800000u ? 1u : 0u));
    return (uint16_t)(sign | shift_rne(full, s));
}

float trex_f8e4m3_to_f32(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t exp = (v >> 3) & 0xfu;
    uint32_t mant = v & 0x7u;
    if (exp == 0xf && mant == 0x7)
        return bits_f32(sign | 0x7fc00000u);
    if (exp == 0) {
        float m = (float)mant * 0x1p-9f; /* exact */
        return sign ? -m : m;
    }
    return bits_f32(sign | ((exp + 120u) << 23) | (mant << 20));
}

uint8_t trex_f32_to_f8e4m3(float f)
{
    uint32_t u = f32_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t mant = u & 0x7fffffu;
    if (exp == 0xff)
        return sign | 0x7fu; /* NaN and inf: e4m3fn has no inf */
    int e = (int)exp - 127;
    uint32_t r;
    if (e > 8) {
        r = 0x7fu;
    } else if (e >= -6) {
        r = shift_rne(((uint32_t)(e + 7) << 23) | mant, 20);
        if (r > 0x7eu) /* rounded above 448 */
            r = 0x7fu;
    } else {
        /* subnormal: value = full * 2^(e-23), in units of 2^-9 that is full >> (14-e) */
        unsigned s = (unsigned)(14 - e);
        uint32_t full = 0x800000u | mant;
        if (exp == 0 || s > 24)
            r = 0;
        else if (s == 24)
            r = full > 0x800000u ? 1u : 0u;
        else
            r = shift_rne(full, s);
    }
    return (uint8_t)(sign | r);
}

float trex_f8e8m0_to_f32(uint8_t v)
{
    if (v == 0xff)
        return bits_f32(0x7fc00000u);
    if (v == 0)
        return bits_f32(0x00400000u); /* 2^-127, an f32 subnormal */
    return bits_f32((uint32_t)v << 23);
}

void trex_convert_to_f32(float *dst, const void *src, trex_dtype dt, int64_t n)
{
    TREX_ASSERT(n >= 0);
    TREX_ASSERT(n == 0 || (dst && src));
    const unsigned char *s = src;
    switch (dt) {
    case TREX_F32:
        memmove(dst, src, (size_t)n * sizeof(float));
        break;
    case TREX_F64:
        for (int64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, s + i * 8, sizeof d);
            dst[i] = (float)d;
        }
        break;
    case TREX_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + i * 2, sizeof h);
            dst[i] = trex_bf16_to_f32(h);
        }
        break;
    case TREX_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + i * 2, sizeof h);
            dst[i] = trex_f16_to_f32(h);
        }
        break;
    case TREX_I64:
        for (int64_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, s + i * 8, sizeof v);
            dst[i] = (float)v;
        }
        break;
    case TREX_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, s + i * 4, sizeof v);
            dst[i] = (float)v;
        }
        break;
    case TREX_U8:
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)s[i];
        break;
    case TREX_I8:
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)(int8_t)s[i];
        break;
    case TREX_F8_E4M3:
        for (int64_t i = 0; i < n; i++)
            dst[i] = trex_f8e4m3_to_f32(s[i]);
        break;
    case TREX_F8_E8M0:
        for (int64_t i = 0; i < n; i++)
            dst[i] = trex_f8e8m0_to_f32(s[i]);
        break;
    default:
        TREX_ABORT("trex_convert_to_f32: bad dtype %d", (int)dt);
    }
}
