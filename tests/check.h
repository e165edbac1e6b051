/* tests/check.h — the tiny harness every C test uses.
 * CHECK(cond, fmt, ...) counts a check and prints the message with file:line when it fails;
 * CHECK_NEAR(a, b, tol, what) compares two doubles; check_summary() prints `N passed, N failed`
 * and returns the exit status for main. Header-only: each test is one program. */
#ifndef TREX_TESTS_CHECK_H
#define TREX_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>

static int check_passed_;
static int check_failed_;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            check_passed_++;                                               \
        } else {                                                           \
            check_failed_++;                                               \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

#define CHECK_NEAR(a, b, tol, what)                                                 \
    do {                                                                            \
        double check_a_ = (double)(a), check_b_ = (double)(b);                      \
        CHECK(fabs(check_a_ - check_b_) <= (tol), "%s: %.9g vs %.9g (tol %.3g)",    \
              (what), check_a_, check_b_, (double)(tol));                           \
    } while (0)

static inline int check_summary(void)
{
    printf("%d passed, %d failed\n", check_passed_, check_failed_);
    return check_failed_ ? 1 : 0;
}

#endif
