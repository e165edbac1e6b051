/* core/status.c — status codes, error messages and the abort path. */
#include "trex/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *trex_code_str(trex_code code)
{
    static const char *const names[TREX_ECODE_COUNT] = {
        [TREX_OK] = "ok",
        [TREX_EINVAL] = "invalid argument",
        [TREX_EIO] = "i/o error",
        [TREX_ENOMEM] = "out of memory",
        [TREX_EFORMAT] = "malformed file",
        [TREX_ENOTFOUND] = "not found",
        [TREX_ERANGE] = "out of range",
        [TREX_EUNSUPPORTED] = "unsupported",
        [TREX_ESOLVER] = "solver failure",
    };
    if ((int)code < 0 || code >= TREX_ECODE_COUNT)
        return "unknown error";
    return names[code];
}

trex_code trex_err_set(trex_err *err, trex_code code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void trex_err_prefix(trex_err *err, const char *fmt, ...)
{
    if (!err)
        return;
    char old[TREX_ERR_MSG];
    memcpy(old, err->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof err->msg - 2)
        return;
    size_t used = (size_t)n;
    memcpy(err->msg + used, ": ", 2);
    used += 2;
    size_t room = sizeof err->msg - used - 1;
    size_t len = strnlen(old, room);
    memcpy(err->msg + used, old, len);
    err->msg[used + len] = '\0';
}

_Noreturn void trex_abort_at(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "trex: internal error at %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}
