/* trex/io.h — whole-file reads, crash-safe writes, and JSON files through cJSON.
 *
 * Writes never leave a half-written file under the final name: data goes to "<path>.tmp.<pid>",
 * is fsynced, renamed over path, and the directory is fsynced. */
#ifndef TREX_IO_H
#define TREX_IO_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "trex/status.h"

/* Reads a whole file into a malloc'ed buffer (NUL-terminated; *len excludes the NUL). Refuses files
 * larger than max_bytes (TREX_ERANGE). The caller frees *out. */
trex_code trex_file_read(const char *path, size_t max_bytes, char **out, size_t *len, trex_err *err);

/* Writes len bytes atomically (temporary name, fsync, rename, fsync of the directory). */
trex_code trex_file_write_atomic(const char *path, const void *data, size_t len, trex_err *err);

/* Streaming form of the same, for files too large to hold twice (checkpoints, safetensors):
 * open creates "<path>.tmp.<pid>"; write appends; commit fsyncs, renames over path, fsyncs the
 * directory and frees f (also on failure, after removing the temporary file); abort removes the
 * temporary file and frees f (NULL is a no-op). One writer per path per process at a time. */
typedef struct trex_atomic_file trex_atomic_file;
trex_code trex_file_atomic_open(trex_atomic_file **out, const char *path, trex_err *err);
trex_code trex_file_atomic_write(trex_atomic_file *f, const void *data, size_t len, trex_err *err);
trex_code trex_file_atomic_commit(trex_atomic_file *f, trex_err *err);
void trex_file_atomic_abort(trex_atomic_file *f);

/* Parses a JSON file; errors name the file, the line:column and the byte offset of a syntax error
 * ("path:3:14: JSON syntax error near '...' (byte offset 40)"). Caller cJSON_Delete's. */
trex_code trex_json_load(const char *path, cJSON **out, trex_err *err);
/* Writes json (formatted) atomically. */
trex_code trex_json_save(const char *path, const cJSON *json, trex_err *err);

/* mkdir -p; existing directories are fine. */
trex_code trex_mkdirs(const char *path, trex_err *err);

#endif
