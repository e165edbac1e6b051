/* trex/status.h — status codes, error messages, and always-on assertions.
 *
 * Two kinds of failure (STYLE.md rule 4):
 *   - bad input or environment: a function returns a trex_code other than TREX_OK and, when the caller
 *     passed a trex_err, fills it with one line naming the file, field or tensor, and the fix;
 *   - a bug: TREX_ASSERT / TREX_ABORT print file:line and abort, in every build.
 * Only main() turns an error into an exit status (`trex: error: <msg>`). */
#ifndef TREX_STATUS_H
#define TREX_STATUS_H

#include <stddef.h>

typedef enum trex_code {
    TREX_OK = 0,
    TREX_EINVAL,       /* an argument, flag or config value is wrong */
    TREX_EIO,          /* a file could not be read or written */
    TREX_ENOMEM,       /* an allocation failed */
    TREX_EFORMAT,      /* a file is malformed: JSON, safetensors, shards, checkpoints */
    TREX_ENOTFOUND,    /* a named file, tensor or field is missing */
    TREX_ERANGE,       /* a value lies outside what is allowed (token id, size, overflow) */
    TREX_EUNSUPPORTED, /* valid, but not supported by this build or machine */
    TREX_ESOLVER,      /* an external solver failed or disagreed */
    TREX_ECODE_COUNT
} trex_code;

#define TREX_ERR_MSG 1024

/* A caller-owned error slot. Functions that take `trex_err *err` accept NULL (no message kept). */
typedef struct trex_err {
    trex_code code;
    char msg[TREX_ERR_MSG];
} trex_err;

/* Short lower-case name of a code, e.g. "invalid argument". */
const char *trex_code_str(trex_code code);

/* Records code and a printf-style message into err (when err is not NULL); returns code, so that
 * `return trex_err_set(err, TREX_EINVAL, "...");` reads naturally. */
trex_code trex_err_set(trex_err *err, trex_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Puts "prefix: " in front of the message already in err (for adding the file name one level up). */
void trex_err_prefix(trex_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Always compiled in. Never put side effects inside the condition. */
_Noreturn void trex_abort_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define TREX_ASSERT(cond)                                                          \
    do {                                                                           \
        if (!(cond))                                                               \
            trex_abort_at(__FILE__, __LINE__, "assertion failed: %s", #cond);       \
    } while (0)

#define TREX_ABORT(...) trex_abort_at(__FILE__, __LINE__, __VA_ARGS__)

/* Propagates a non-OK code from an expression that returns trex_code. */
#define TREX_TRY(expr)                                                             \
    do {                                                                           \
        trex_code trex_try_rc_ = (expr);                                           \
        if (trex_try_rc_ != TREX_OK)                                               \
            return trex_try_rc_;                                                   \
    } while (0)

#endif
