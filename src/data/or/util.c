/* data/or/util.c — string buffer, number formatting, RNG and small helpers for the OR module. */
#include <glpk.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "or_internal.h"

char *or_xstrdup(const char *s)
{
    size_t n = strlen(s);
    char *p = trex_xmalloc(n + 1);
    memcpy(p, s, n + 1);
    return p;
}

static void sb_grow(or_sb *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    b->s = trex_xrealloc(b->s, cap);
    b->cap = cap;
}

void or_sb_putn(or_sb *b, const char *s, size_t n)
{
    sb_grow(b, n);
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void or_sb_put(or_sb *b, const char *s) { or_sb_putn(b, s, strlen(s)); }

void or_sb_putc(or_sb *b, char c) { or_sb_putn(b, &c, 1); }

void or_sb_vprintf(or_sb *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    TREX_ASSERT(n >= 0);
    sb_grow(b, (size_t)n);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
}

void or_sb_printf(or_sb *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    or_sb_vprintf(b, fmt, ap);
    va_end(ap);
}

void or_sb_free(or_sb *b)
{
    free(b->s);
    b->s = NULL;
    b->len = b->cap = 0;
}

char *or_sb_take(or_sb *b)
{
    char *s = b->s ? b->s : or_xstrdup("");
    b->s = NULL;
    b->len = b->cap = 0;
    return s;
}

void or_sb_json_str(or_sb *b, const char *s)
{
    or_sb_putc(b, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': or_sb_put(b, "\\\""); break;
        case '\\': or_sb_put(b, "\\\\"); break;
        case '\n': or_sb_put(b, "\\n"); break;
        case '\t': or_sb_put(b, "\\t"); break;
        case '\r': or_sb_put(b, "\\r"); break;
        default:
            if (*p < 0x20)
                or_sb_printf(b, "\\u%04x", *p);
            else
                or_sb_putc(b, (char)*p);
        }
    }
    or_sb_putc(b, '"');
}

void or_fmt_num(char *buf, size_t n, double v)
{
    if (v == 0)
        v = 0; /* no "-0" */
    if (isinf(v)) {
        snprintf(buf, n, "%s", v > 0 ? "inf" : "-inf");
        return;
    }
    snprintf(buf, n, "%.15g", v);
}

void or_sb_num(or_sb *b, double v)
{
    char t[40];
    or_fmt_num(t, sizeof t, v);
    or_sb_put(b, t);
}

/* ---- RNG: splitmix64 finaliser over (key, counter) ---- */
uint64_t or_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t or_hash2(uint64_t a, uint64_t b) { return or_mix64(a ^ or_mix64(b + 0x632be59bd9b4e019ULL)); }

uint64_t or_hash_bytes(const void *p, size_t n, uint64_t seed)
{
    /* FNV-1a over bytes, then a final mix (fast, stable, good enough for dedup keys). */
    const unsigned char *c = p;
    uint64_t h = 0xcbf29ce484222325ULL ^ seed;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 0x100000001b3ULL;
    }
    return or_mix64(h);
}

or_rng or_rng_make(uint64_t seed, uint64_t stream)
{
    or_rng r = {or_hash2(seed, stream), 0};
    return r;
}

uint64_t or_rng_u64(or_rng *r) { return or_hash2(r->key, r->ctr++); }

double or_rng_unif(or_rng *r) { return (double)(or_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

int or_rng_int(or_rng *r, int lo, int hi)
{
    TREX_ASSERT(hi >= lo);
    uint64_t span = (uint64_t)((int64_t)hi - lo + 1);
    /* rejection sampling: no modulo bias */
    uint64_t lim = UINT64_MAX - UINT64_MAX % span;
    uint64_t v;
    do
        v = or_rng_u64(r);
    while (v >= lim);
    return lo + (int)(v % span);
}

void or_rng_shuffle(or_rng *r, int *a, int n)
{
    for (int i = n - 1; i > 0; i--) {
        int j = or_rng_int(r, 0, i);
        int t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* ---- GLPK environment ---- */
int or_glpk_quiet(void) { return glp_term_out(GLP_OFF); }

void or_glpk_restore(int prev) { glp_term_out(prev); }

int or_memfile(const char *text, size_t len, char *path, size_t path_len)
{
    int fd = memfd_create("trex-or-lp", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)w;
    }
    snprintf(path, path_len, "/proc/self/fd/%d", fd);
    return fd;
}

char *or_fence_extract(const char *text, const char *info, int *count)
{
    char open[32];
    snprintf(open, sizeof open, "```%s\n", info);
    size_t olen = strlen(open);
    char *body = NULL;
    int n = 0;
    const char *p = text;
    while ((p = strstr(p, open)) != NULL) {
        if (p != text && p[-1] != '\n') {
            p += olen;
            continue;
        }
        const char *start = p + olen;
        const char *end = strstr(start, "\n```");
        if (!end)
            break;
        n++;
        if (!body) {
            size_t len = (size_t)(end - start) + 1;
            body = trex_xmalloc(len + 1);
            memcpy(body, start, len);
            body[len] = '\0';
        }
        p = end + 4;
    }
    if (count)
        *count = n;
    return body;
}
