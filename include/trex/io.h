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

/* Parses a JSON file; errors name the file and the byte offset of a syntax error. Caller cJSON_Delete's. */
trex_code trex_json_load(const char *path, cJSON **out, trex_err *err);
/* Writes json (formatted) atomically. */
trex_code trex_json_save(const char *path, const cJSON *json, trex_err *err);

/* mkdir -p; existing directories are fine. */
trex_code trex_mkdirs(const char *path, trex_err *err);

#endif
