/* trex/tensor.h — element types and tensor views.
 *
 * A trex_tensor is a view: it never owns its buffer. Shapes and strides are int64_t, strides in
 * elements (not bytes), row-major when made by trex_tensor_make. The dtype names are the safetensors
 * names ("F32", "BF16", ...). */
#ifndef TREX_TENSOR_H
#define TREX_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trex/status.h"

typedef enum trex_dtype {
    TREX_F32 = 0,
    TREX_F64,
    TREX_BF16,
    TREX_F16,
    TREX_I64,
    TREX_I32,
    TREX_U8,
    TREX_I8,
    TREX_F8_E4M3,
    TREX_F8_E8M0,
    TREX_DTYPE_COUNT
} trex_dtype;

#define TREX_MAX_DIMS 8

typedef struct trex_tensor {
    void *data;
    trex_dtype dtype;
    int ndim;
    int64_t shape[TREX_MAX_DIMS];
    int64_t stride[TREX_MAX_DIMS]; /* in elements */
} trex_tensor;

size_t trex_dtype_size(trex_dtype dt);          /* bytes per element */
const char *trex_dtype_name(trex_dtype dt);     /* safetensors name, e.g. "BF16" */
/* Parses a safetensors dtype name; TREX_EFORMAT for an unknown one. */
trex_code trex_dtype_parse(const char *name, trex_dtype *out);
/* True for F32 F64 BF16 F16 F8_E4M3 F8_E8M0. */
bool trex_dtype_is_float(trex_dtype dt);

/* A contiguous row-major view of `data` (ndim <= TREX_MAX_DIMS, every shape[i] >= 0). */
trex_tensor trex_tensor_make(void *data, trex_dtype dt, int ndim, const int64_t *shape);
int64_t trex_tensor_numel(const trex_tensor *t);
bool trex_tensor_is_contiguous(const trex_tensor *t);

/* Product of shape[0..ndim); false on int64 overflow or a negative dim. */
bool trex_shape_numel(int ndim, const int64_t *shape, int64_t *numel);

/* Scalar conversions. bf16/f16 from f32 round to nearest even; NaN stays NaN. */
float trex_bf16_to_f32(uint16_t h);
uint16_t trex_f32_to_bf16(float f);
float trex_f16_to_f32(uint16_t h);
uint16_t trex_f32_to_f16(float f);
float trex_f8e4m3_to_f32(uint8_t v);  /* OCP e4m3fn: bias 7, max 448, no inf, 0x7f/0xff NaN */
/* Nearest even e4m3fn; like PyTorch's float8_e4m3fn cast, NaN, inf and magnitudes rounding above 448
 * become NaN (0x7f with the sign), and values below half the smallest subnormal become signed zero. */
uint8_t trex_f32_to_f8e4m3(float f);
float trex_f8e8m0_to_f32(uint8_t v);  /* 2^(v-127); 255 is NaN */

/* Converts n elements of dtype `dt` at src to float (any float dtype, or integer dtypes by value). */
void trex_convert_to_f32(float *dst, const void *src, trex_dtype dt, int64_t n);

#endif
