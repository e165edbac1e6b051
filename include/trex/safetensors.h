/* trex/safetensors.h — safetensors read and write.
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON header
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}},
 * then the data area; offsets are relative to the data area.
 *
 * The reader treats a file as untrusted: the header is bounded (TREX_ST_MAX_HEADER), every offset and
 * length is checked against the file, dtype and shape must agree with the byte length, ranges may not
 * overlap, names are unique, and no size computation can overflow. Any violation is TREX_EFORMAT with a
 * message naming the file and the tensor. Known dtypes: F32 F64 BF16 F16 I64 I32 U8 I8 F8_E4M3 F8_E8M0. */
#ifndef TREX_SAFETENSORS_H
#define TREX_SAFETENSORS_H

#include <stdint.h>

#include "trex/status.h"
#include "trex/tensor.h"

#define TREX_ST_MAX_HEADER (100u << 20) /* 100 MiB, as the reference implementation allows */

typedef struct trex_st_entry {
    const char *name;
    trex_dtype dtype;
    int ndim;
    int64_t shape[TREX_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end; /* byte range within the data area */
} trex_st_entry;

typedef struct trex_st_file trex_st_file;

/* Opens and validates a file (the data is mapped read-only; entries are in header order; tensor data
 * may be unaligned, read it through trex_convert_to_f32 or memcpy). */
trex_code trex_st_open(trex_st_file **out, const char *path, trex_err *err);
/* Validates an in-memory image; buf must outlive the handle. label names it in messages. */
trex_code trex_st_open_mem(trex_st_file **out, const void *buf, size_t len, const char *label,
                           trex_err *err);
void trex_st_close(trex_st_file *f);

const char *trex_st_label(const trex_st_file *f);    /* the path or label */
int64_t trex_st_count(const trex_st_file *f);
const trex_st_entry *trex_st_entry_at(const trex_st_file *f, int64_t i);  /* in file order */
const trex_st_entry *trex_st_find(const trex_st_file *f, const char *name); /* NULL if absent */
const void *trex_st_data(const trex_st_file *f, const trex_st_entry *e);
const char *trex_st_metadata(const trex_st_file *f, const char *key);      /* NULL if absent */
int64_t trex_st_metadata_count(const trex_st_file *f);
/* The i-th metadata pair, in key order; strings live as long as f. */
void trex_st_metadata_at(const trex_st_file *f, int64_t i, const char **key, const char **value);

/* Reads tensor `name` into dst as float, converting from F32/F64/BF16/F16/F8_E4M3/F8_E8M0. The tensor must
 * exist (TREX_ENOTFOUND) and have exactly the given shape (TREX_EFORMAT otherwise); messages name the
 * file, the tensor, the expected and the actual shape or dtype. */
trex_code trex_st_read_f32(const trex_st_file *f, const char *name, float *dst, int ndim,
                           const int64_t *shape, trex_err *err);
/* Same for integer tensors (I64, I32, U8, I8) into int32; values outside int32 are TREX_ERANGE. */
trex_code trex_st_read_i32(const trex_st_file *f, const char *name, int32_t *dst, int ndim,
                           const int64_t *shape, trex_err *err);

/* Writer: tensors are referenced (not copied) until trex_st_writer_write, in the order added. */
typedef struct trex_st_writer trex_st_writer;

trex_st_writer *trex_st_writer_create(void);
void trex_st_writer_destroy(trex_st_writer *w);
trex_code trex_st_writer_add(trex_st_writer *w, const char *name, trex_dtype dt, int ndim,
                             const int64_t *shape, const void *data, trex_err *err);
/* Adds a "__metadata__" string pair; setting a key again replaces its value. */
trex_code trex_st_writer_metadata(trex_st_writer *w, const char *key, const char *value, trex_err *err);
/* Writes the file atomically (temporary name, fsync, rename), streaming each tensor from its buffer.
 * Names must be unique (TREX_EINVAL names the duplicate). */
trex_code trex_st_writer_write(trex_st_writer *w, const char *path, trex_err *err);

#endif
