/* tests/fuzz/st_exercise.h — the one code path that the safetensors fuzz target and the corpus test
 * drive: open an image with trex_st_open_mem, then touch every entry and read it through the reader
 * helpers, re-checking on the way every promise the reader makes about an accepted file.
 *
 * st_exercise returns the open status, and counts in *violations every broken promise of an accepted
 * file (an entry outside the buffer, a byte length that disagrees with shape and dtype, overlapping or
 * non-tiling ranges, a name that trex_st_find does not give back, a read helper that fails). A rejected
 * file must carry TREX_EFORMAT and a message that starts with the label. Header-only, for tests. */
#ifndef TREX_TESTS_ST_EXERCISE_H
#define TREX_TESTS_ST_EXERCISE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trex/safetensors.h"

typedef struct st_range {
    uint64_t begin, end;
} st_range;

static int st_range_cmp(const void *a, const void *b)
{
    const st_range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

static trex_code st_exercise(const uint8_t *buf, size_t len, const char *label, int *violations)
{
    trex_err err;
    memset(&err, 0, sizeof err);
    trex_st_file *f = NULL;
    trex_code rc = trex_st_open_mem(&f, buf, len, label, &err);
    if (rc != TREX_OK) {
        size_t ll = strlen(label);
        if (f || rc != TREX_EFORMAT || strncmp(err.msg, label, ll) != 0 || err.msg[ll] != ':')
            (*violations)++;
        return rc;
    }
    /* Accepted: the header length and the data area must lie within the buffer. */
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    if (len < 8 || hlen > len - 8 || hlen > TREX_ST_MAX_HEADER) {
        (*violations)++;
        trex_st_close(f);
        return rc;
    }
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    int64_t n = trex_st_count(f);
    st_range *ranges = malloc((n > 0 ? (size_t)n : 1) * sizeof *ranges);
    if (!ranges) {
        trex_st_close(f);
        return TREX_ENOMEM;
    }
    for (int64_t i = 0; i < n; i++) {
        const trex_st_entry *e = trex_st_entry_at(f, i);
        int64_t numel = 0;
        const uint8_t *p = trex_st_data(f, e);
        ranges[i].begin = e->begin;
        ranges[i].end = e->end;
        if (e->ndim < 0 || e->ndim > TREX_MAX_DIMS || !trex_shape_numel(e->ndim, e->shape, &numel) ||
            numel != e->numel || e->begin > e->end || e->end > data_len ||
            (uint64_t)numel > UINT64_MAX / trex_dtype_size(e->dtype) ||
            e->end - e->begin != (uint64_t)numel * trex_dtype_size(e->dtype) || p != data + e->begin ||
            trex_st_find(f, e->name) != e) {
            (*violations)++;
            continue;
        }
        /* Touch every byte (ASan catches a read outside the buffer) and read through the helpers. */
        unsigned sum = 0;
        for (uint64_t k = 0; k < e->end - e->begin; k++)
            sum += p[k];
        (void)sum;
        if (numel > (1 << 22))
            continue; /* large but valid: checked above, not worth converting */
        if (trex_dtype_is_float(e->dtype)) {
            float *dst = malloc((size_t)(numel ? numel : 1) * sizeof *dst);
            if (dst && trex_st_read_f32(f, e->name, dst, e->ndim, e->shape, &err) != TREX_OK)
                (*violations)++;
            if (dst && numel > 0) {
                float probe;
                trex_convert_to_f32(&probe, p, e->dtype, 1);
                if (memcmp(&probe, dst, sizeof probe) != 0 && probe == probe)
                    (*violations)++;
            }
            free(dst);
        } else {
            int32_t *dst = malloc((size_t)(numel ? numel : 1) * sizeof *dst);
            trex_code r2 = dst ? trex_st_read_i32(f, e->name, dst, e->ndim, e->shape, &err) : TREX_OK;
            if (r2 != TREX_OK && !(r2 == TREX_ERANGE && e->dtype == TREX_I64))
                (*violations)++;
            free(dst);
        }
    }
    /* The ranges tile the data area. */
    qsort(ranges, (size_t)n, sizeof *ranges, st_range_cmp);
    uint64_t pos = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ranges[i].begin != pos)
            (*violations)++;
        pos = ranges[i].end;
    }
    if (pos != data_len)
        (*violations)++;
    for (int64_t i = 0; i < trex_st_metadata_count(f); i++) {
        const char *k = NULL, *v = NULL;
        trex_st_metadata_at(f, i, &k, &v);
        if (!k || !v || trex_st_metadata(f, k) != v)
            (*violations)++;
    }
    free(ranges);
    trex_st_close(f);
    return rc;
}

#endif
