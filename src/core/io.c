/* core/io.c — bounded whole-file reads, crash-safe (atomic) writes, JSON files, mkdir -p.
 *
 * An atomic write streams into "<path>.tmp.<pid>", fsyncs it, renames it over path and fsyncs the
 * directory, so a crash leaves either the old file or the new one, never a mix. The streaming form
 * (trex_file_atomic_*) lets large files (checkpoints) be written piece by piece without a second copy
 * in memory; trex_file_write_atomic is the one-buffer case. */
#include "trex/io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define IO_CHUNK ((size_t)1 << 30) /* largest single read/write request */
#define JSON_MAX_BYTES ((size_t)1 << 31)

struct trex_atomic_file {
    char *path;
    char *tmp;
    int fd;
};

/* --- reads -------------------------------------------------------------------------------------- */

trex_code trex_file_read(const char *path, size_t max_bytes, char **out, size_t *len, trex_err *err)
{
    TREX_ASSERT(path && out && len);
    *out = NULL;
    *len = 0;
    trex_code rc = TREX_OK;
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return trex_err_set(err, errno == ENOENT ? TREX_ENOTFOUND : TREX_EIO, "%s: cannot open: %s",
                            path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = trex_err_set(err, TREX_EIO, "%s: cannot stat: %s", path, strerror(errno));
        goto out_close;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = trex_err_set(err, TREX_EIO, "%s: is a directory, expected a file", path);
        goto out_close;
    }
    if (st.st_size > 0 && (uint64_t)st.st_size > max_bytes) {
        rc = trex_err_set(err, TREX_ERANGE, "%s: file is %lld bytes, more than the %zu allowed", path,
                          (long long)st.st_size, max_bytes);
        goto out_close;
    }
    /* st_size is a hint (0 for /proc files, and the file may change): read until EOF. */
    size_t cap = st.st_size > 0 ? (size_t)st.st_size + 1 : 4096;
    size_t used = 0;
    buf = malloc(cap);
    if (!buf) {
        rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory reading %zu bytes", path, cap);
        goto out_close;
    }
    for (;;) {
        if (used == cap - 1) {
            /* Full: probe for EOF before growing, so that a file of exactly st_size costs no copy. */
            char probe;
            ssize_t got = read(fd, &probe, 1);
            if (got < 0 && errno == EINTR)
                continue;
            if (got < 0) {
                rc = trex_err_set(err, TREX_EIO, "%s: read failed: %s", path, strerror(errno));
                goto out_free;
            }
            if (got == 0)
                break;
            if (used + 1 > max_bytes) {
                rc = trex_err_set(err, TREX_ERANGE, "%s: file is more than the %zu bytes allowed", path,
                                  max_bytes);
                goto out_free;
            }
            size_t ncap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
            char *nbuf = realloc(buf, ncap);
            if (!nbuf) {
                rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory reading %zu bytes", path, ncap);
                goto out_free;
            }
            buf = nbuf;
            cap = ncap;
            buf[used++] = probe;
            continue;
        }
        size_t want = cap - 1 - used;
        if (want > IO_CHUNK)
            want = IO_CHUNK;
        ssize_t got = read(fd, buf + used, want);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            rc = trex_err_set(err, TREX_EIO, "%s: read failed: %s", path, strerror(errno));
            goto out_free;
        }
        if (got == 0)
            break;
        used += (size_t)got;
    }
    if (used > max_bytes) {
        rc = trex_err_set(err, TREX_ERANGE, "%s: file is %zu bytes, more than the %zu allowed", path, used,
                          max_bytes);
        goto out_free;
    }
    buf[used] = '\0';
    *out = buf;
    *len = used;
    buf = NULL;
out_free:
    free(buf);
out_close:
    close(fd);
    return rc;
}

/* --- atomic writes ------------------------------------------------------------------------------ */

static trex_code write_all(int fd, const void *data, size_t len, const char *what, trex_err *err)
{
    const unsigned char *p = data;
    while (len > 0) {
        size_t want = len > IO_CHUNK ? IO_CHUNK : len;
        ssize_t n = write(fd, p, want);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return trex_err_set(err, TREX_EIO, "%s: write failed: %s", what, strerror(errno));
        }
        if (n == 0)
            return trex_err_set(err, TREX_EIO, "%s: write made no progress", what);
        p += n;
        len -= (size_t)n;
    }
    return TREX_OK;
}

/* fsync of the directory holding path, so that the rename is durable. */
static trex_code fsync_parent(const char *path, trex_err *err)
{
    trex_code rc = TREX_OK;
    size_t n = strlen(path);
    char *dir = malloc(n + 2);
    if (!dir)
        return trex_err_set(err, TREX_ENOMEM, "%s: out of memory", path);
    memcpy(dir, path, n + 1);
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        rc = trex_err_set(err, TREX_EIO, "%s: cannot open directory %s to sync it: %s", path, dir,
                          strerror(errno));
        goto out_free;
    }
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
        rc = trex_err_set(err, TREX_EIO, "%s: fsync of directory %s failed: %s", path, dir,
                          strerror(errno));
    close(fd);
out_free:
    free(dir);
    return rc;
}

trex_code trex_file_atomic_open(trex_atomic_file **out, const char *path, trex_err *err)
{
    TREX_ASSERT(out && path);
    *out = NULL;
    trex_atomic_file *f = calloc(1, sizeof *f);
    if (!f)
        return trex_err_set(err, TREX_ENOMEM, "%s: out of memory", path);
    f->fd = -1;
    size_t n = strlen(path);
    f->path = malloc(n + 1);
    f->tmp = malloc(n + 32);
    if (!f->path || !f->tmp) {
        trex_file_atomic_abort(f);
        return trex_err_set(err, TREX_ENOMEM, "%s: out of memory", path);
    }
    memcpy(f->path, path, n + 1);
    snprintf(f->tmp, n + 32, "%s.tmp.%ld", path, (long)getpid());
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        trex_code rc = trex_err_set(err, errno == ENOENT ? TREX_ENOTFOUND : TREX_EIO,
                                    "%s: cannot create %s: %s (does the directory exist and is it "
                                    "writable?)",
                                    path, f->tmp, strerror(errno));
        free(f->path);
        free(f->tmp);
        free(f);
        return rc;
    }
    *out = f;
    return TREX_OK;
}

trex_code trex_file_atomic_write(trex_atomic_file *f, const void *data, size_t len, trex_err *err)
{
    TREX_ASSERT(f && f->fd >= 0);
    TREX_ASSERT(len == 0 || data);
    return write_all(f->fd, data, len, f->tmp, err);
}

void trex_file_atomic_abort(trex_atomic_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0) {
        close(f->fd);
        unlink(f->tmp);
    }
    free(f->path);
    free(f->tmp);
    free(f);
}

trex_code trex_file_atomic_commit(trex_atomic_file *f, trex_err *err)
{
    TREX_ASSERT(f && f->fd >= 0);
    trex_code rc = TREX_OK;
    if (fsync(f->fd) != 0) {
        rc = trex_err_set(err, TREX_EIO, "%s: fsync failed: %s", f->tmp, strerror(errno));
        goto out_abort;
    }
    int fd = f->fd;
    f->fd = -1;
    if (close(fd) != 0) {
        rc = trex_err_set(err, TREX_EIO, "%s: close failed: %s", f->tmp, strerror(errno));
        unlink(f->tmp);
        goto out_abort;
    }
    if (rename(f->tmp, f->path) != 0) {
        rc = trex_err_set(err, TREX_EIO, "%s: cannot rename %s into place: %s", f->path, f->tmp,
                          strerror(errno));
        unlink(f->tmp);
        goto out_abort;
    }
    rc = fsync_parent(f->path, err);
out_abort:
    trex_file_atomic_abort(f);
    return rc;
}

trex_code trex_file_write_atomic(const char *path, const void *data, size_t len, trex_err *err)
{
    trex_atomic_file *f = NULL;
    trex_code rc = trex_file_atomic_open(&f, path, err);
    if (rc != TREX_OK)
        return rc;
    rc = trex_file_atomic_write(f, data, len, err);
    if (rc != TREX_OK) {
        trex_file_atomic_abort(f);
        return rc;
    }
    return trex_file_atomic_commit(f, err);
}

/* --- JSON --------------------------------------------------------------------------------------- */

/* 1-based line and column (in bytes) of offset within text. */
static void line_col(const char *text, size_t offset, size_t *line, size_t *col)
{
    size_t l = 1, c = 1;
    for (size_t i = 0; i < offset; i++) {
        if (text[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

trex_code trex_json_load(const char *path, cJSON **out, trex_err *err)
{
    TREX_ASSERT(path && out);
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    trex_code rc = trex_file_read(path, JSON_MAX_BYTES, &text, &len, err);
    if (rc != TREX_OK)
        return rc;
    if (strlen(text) != len) {
        size_t at = strlen(text), line, col;
        line_col(text, at, &line, &col);
        rc = trex_err_set(err, TREX_EFORMAT,
                          "%s:%zu:%zu: NUL byte in JSON text (byte offset %zu); is this a JSON file?",
                          path, line, col, at);
        goto out_free;
    }
    const char *end = NULL;
    cJSON *json = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
    if (!json) {
        size_t at = (end && end >= text && end <= text + len) ? (size_t)(end - text) : len;
        size_t line, col;
        line_col(text, at, &line, &col);
        if (at >= len) {
            rc = trex_err_set(err, TREX_EFORMAT,
                              "%s:%zu:%zu: JSON syntax error: unexpected end of file (byte offset %zu); "
                              "the document is empty or incomplete",
                              path, line, col, at);
        } else {
            char near[24];
            size_t k = 0;
            for (size_t i = at; i < len && k < sizeof near - 1 && text[i] != '\n'; i++)
                near[k++] = (text[i] >= 0x20 && text[i] < 0x7f) ? text[i] : '?';
            near[k] = '\0';
            rc = trex_err_set(err, TREX_EFORMAT,
                              "%s:%zu:%zu: JSON syntax error near '%s' (byte offset %zu); fix the "
                              "JSON there",
                              path, line, col, near, at);
        }
        goto out_free;
    }
    *out = json;
out_free:
    free(text);
    return rc;
}

trex_code trex_json_save(const char *path, const cJSON *json, trex_err *err)
{
    TREX_ASSERT(path && json);
    char *text = cJSON_Print(json);
    if (!text)
        return trex_err_set(err, TREX_ENOMEM, "%s: out of memory formatting JSON", path);
    size_t n = strlen(text);
    trex_atomic_file *f = NULL;
    trex_code rc = trex_file_atomic_open(&f, path, err);
    if (rc != TREX_OK)
        goto out_free;
    rc = trex_file_atomic_write(f, text, n, err);
    if (rc == TREX_OK)
        rc = trex_file_atomic_write(f, "\n", 1, err);
    if (rc != TREX_OK) {
        trex_file_atomic_abort(f);
        goto out_free;
    }
    rc = trex_file_atomic_commit(f, err);
out_free:
    cJSON_free(text);
    return rc;
}

/* --- directories -------------------------------------------------------------------------------- */

static trex_code mkdir_one(const char *full, const char *dir, trex_err *err)
{
    if (mkdir(dir, 0755) == 0)
        return TREX_OK;
    int e = errno;
    struct stat st;
    if (e == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
        return TREX_OK;
    if (e == EEXIST)
        return trex_err_set(err, TREX_EIO, "%s: cannot create directory: %s exists and is not a directory",
                            full, dir);
    return trex_err_set(err, TREX_EIO, "%s: cannot create directory %s: %s", full, dir, strerror(e));
}

trex_code trex_mkdirs(const char *path, trex_err *err)
{
    TREX_ASSERT(path);
    if (!*path)
        return trex_err_set(err, TREX_EINVAL, "mkdirs: empty path");
    size_t n = strlen(path);
    char *buf = malloc(n + 1);
    if (!buf)
        return trex_err_set(err, TREX_ENOMEM, "%s: out of memory", path);
    memcpy(buf, path, n + 1);
    trex_code rc = TREX_OK;
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        if (buf[i - 1] == '/')
            continue; /* repeated slashes */
        char saved = buf[i];
        buf[i] = '\0';
        rc = mkdir_one(path, buf, err);
        buf[i] = saved;
        if (rc != TREX_OK)
            break;
    }
    free(buf);
    return rc;
}
