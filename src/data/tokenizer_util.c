/* data/tokenizer_util.c — helpers shared by the tokenizer, trainer, chat template and shard code:
 * allocation, FNV-1a, UTF-8, the byte-level alphabet, the regex pre-tokenizer, JSONL reading, token
 * buffers, and the DeepSeek-V4 special-token list. See data_internal.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"


char *td_xstrndup(const char *s, size_t n)
{
    char *p = trex_xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void td_grow(void **p, int64_t *cap, int64_t need, size_t size)
{
    if (need <= *cap)
        return;
    int64_t c = *cap ? *cap : 16;
    while (c < need) {
        TREX_ASSERT(c < INT64_MAX / 2);
        c *= 2;
    }
    TREX_ASSERT((uint64_t)c <= SIZE_MAX / size);
    *p = trex_xrealloc(*p, (size_t)c * size);
    *cap = c;
}

/* --- hashing ------------------------------------------------------------------------------------ */

uint64_t td_fnv1a(const void *data, size_t len, uint64_t h)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= TD_FNV_PRIME;
    }
    return h;
}

/* --- UTF-8 -------------------------------------------------------------------------------------- */

bool td_utf8_valid(const char *s, size_t len, size_t *bad_at)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = u[i];
        size_t n;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            n = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            n = 4, cp = c & 0x07, min = 0x10000;
        } else {
            goto bad;
        }
        if (len - i < n)
            goto bad;
        for (size_t k = 1; k < n; k++) {
            if ((u[i + k] & 0xC0) != 0x80)
                goto bad;
            cp = (cp << 6) | (u[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            goto bad;
        i += n;
    }
    return true;
bad:
    if (bad_at)
        *bad_at = i;
    return false;
}

int td_utf8_decode(const unsigned char *s, size_t len, uint32_t *cp)
{
    TREX_ASSERT(len > 0);
    unsigned c = s[0];
    int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    TREX_ASSERT((size_t)n <= len);
    uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; k++)
        v = (v << 6) | (s[k] & 0x3F);
    *cp = v;
    return n;
}

int td_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool td_is_unicode_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* --- byte-level alphabet ------------------------------------------------------------------------ */

/* Printable Latin-1 bytes keep their own code point: '!'..'~', U+00A1..U+00AC, U+00AE..U+00FF. */
static bool bl_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

/* The 68 other bytes, in byte order: 0x00..0x20 (k = 0..32), 0x7F..0xA0 (k = 33..66), 0xAD (k = 67). */
uint32_t td_byte_to_cp(unsigned b)
{
    TREX_ASSERT(b < 256);
    if (bl_printable(b))
        return b;
    if (b <= 0x20)
        return 256 + b;
    if (b >= 0x7F && b <= 0xA0)
        return 256 + 33 + (b - 0x7F);
    return 256 + 67; /* 0xAD */
}

int td_cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return bl_printable(cp) ? (int)cp : -1;
    if (cp <= 256 + 32)
        return (int)(cp - 256);
    if (cp <= 256 + 66)
        return (int)(cp - 256 - 33 + 0x7F);
    if (cp == 256 + 67)
        return 0xAD;
    return -1;
}

void td_bytes_to_bl(const unsigned char *bytes, size_t n, char **s, int64_t *len, int64_t *cap)
{
    td_grow((void **)s, cap, *len + (int64_t)(2 * n) + 1, 1);
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = td_byte_to_cp(bytes[i]);
        *len += td_utf8_encode(cp, *s + *len);
    }
    (*s)[*len] = 0;
}

bool td_bl_to_bytes(const char *tok, size_t n, char **s, int64_t *len, int64_t *cap)
{
    td_grow((void **)s, cap, *len + (int64_t)n + 1, 1);
    int64_t start = *len;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        i += (size_t)td_utf8_decode((const unsigned char *)tok + i, n - i, &cp);
        int b = td_cp_to_byte(cp);
        if (b < 0) {
            memcpy(*s + start, tok, n);
            *len = start + (int64_t)n;
            (*s)[*len] = 0;
            return false;
        }
        (*s)[(*len)++] = (char)b;
    }
    (*s)[*len] = 0;
    return true;
}

/* --- pre-tokenizer ------------------------------------------------------------------------------ */

const char *const td_deepseek_split_patterns[3] = {
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
     " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
};

const char *const td_gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Oniguruma's Unicode meaning of the shorthand classes, as PCRE2 class contents. */
#define ONIG_SPACE "\\x{09}-\\x{0D}\\x{85}\\p{Z}"
#define ONIG_WORD "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"

static void sb_add(char **s, int64_t *len, int64_t *cap, const char *add, size_t n)
{
    td_grow((void **)s, cap, *len + (int64_t)n + 1, 1);
    memcpy(*s + *len, add, n);
    *len += (int64_t)n;
    (*s)[*len] = 0;
}

/* Rewrites \s \S \d \D \w \W; everything else is copied. Returns false (with *what) for a negated
 * shorthand inside a bracket class, which has no class-content form. */
static bool translate_pattern(const char *p, char **out, const char **what)
{
    char *s = NULL;
    int64_t len = 0, cap = 0;
    int depth = 0; /* bracket-class nesting (PCRE2 does not nest, but [[:alpha:]] has inner brackets) */
    sb_add(&s, &len, &cap, "", 0);
    for (size_t i = 0; p[i];) {
        char c = p[i];
        if (c == '\\' && p[i + 1]) {
            char e = p[i + 1];
            const char *rep = NULL;
            if (depth == 0) {
                switch (e) {
                case 's': rep = "[" ONIG_SPACE "]"; break;
                case 'S': rep = "[^" ONIG_SPACE "]"; break;
                case 'd': rep = "\\p{Nd}"; break;
                case 'D': rep = "\\P{Nd}"; break;
                case 'w': rep = "[" ONIG_WORD "]"; break;
                case 'W': rep = "[^" ONIG_WORD "]"; break;
                default: break;
                }
            } else {
                switch (e) {
                case 's': rep = ONIG_SPACE; break;
                case 'd': rep = "\\p{Nd}"; break;
                case 'D': rep = "\\P{Nd}"; break;
                case 'w': rep = ONIG_WORD; break;
                case 'S':
                case 'W':
                    *what = e == 'S' ? "\\S inside [...]" : "\\W inside [...]";
                    free(s);
                    return false;
                default: break;
                }
            }
            if (rep)
                sb_add(&s, &len, &cap, rep, strlen(rep));
            else
                sb_add(&s, &len, &cap, p + i, 2);
            i += 2;
            continue;
        }
        if (c == '[') {
            if (depth > 0 && p[i + 1] == ':') { /* POSIX class [:name:] inside a class */
                const char *end = strstr(p + i + 2, ":]");
                if (end) {
                    sb_add(&s, &len, &cap, p + i, (size_t)(end + 2 - (p + i)));
                    i = (size_t)(end + 2 - p);
                    continue;
                }
            }
            if (depth == 0) {
                depth = 1;
                sb_add(&s, &len, &cap, p + i, 1);
                i++;
                /* a leading ^ and a leading ] are literal parts of the class */
                if (p[i] == '^') {
                    sb_add(&s, &len, &cap, p + i, 1);
                    i++;
                }
                if (p[i] == ']') {
                    sb_add(&s, &len, &cap, p + i, 1);
                    i++;
                }
                continue;
            }
        } else if (c == ']' && depth > 0) {
            depth = 0;
        }
        sb_add(&s, &len, &cap, p + i, 1);
        i++;
    }
    *out = s;
    return true;
}

trex_code td_pretok_add(td_pretok *p, const char *pattern, const char *where, trex_err *err)
{
    if (p->nsplit >= TD_MAX_SPLITS)
        return trex_err_set(err, TREX_EUNSUPPORTED, "%s: more than %d Split pre-tokenizers", where,
                            TD_MAX_SPLITS);
    char *pat = NULL;
    const char *what = NULL;
    if (!translate_pattern(pattern, &pat, &what))
        return trex_err_set(err, TREX_EUNSUPPORTED, "%s: the regex uses %s, which trex cannot translate", where,
                            what);
    int ecode = 0;
    PCRE2_SIZE eoff = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ecode, &eoff,
                                   NULL);
    free(pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        return trex_err_set(err, TREX_EFORMAT, "%s: regex does not compile (%s); the regex is \"%s\"", where,
                            (const char *)msg, pattern);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* best effort: the interpreter gives the same result */
    p->re[p->nsplit] = re;
    p->pattern[p->nsplit] = td_xstrndup(pattern, strlen(pattern));
    p->nsplit++;
    if (!p->md)
        p->md = pcre2_match_data_create(4, NULL);
    if (!p->md)
        TREX_ABORT("out of memory (pcre2 match data)");
    return TREX_OK;
}

void td_pretok_init(td_pretok *p)
{
    memset(p, 0, sizeof *p);
    p->prefix_at = -1;
}

void td_pretok_free(td_pretok *p)
{
    if (!p)
        return;
    free(p->buf);
    for (int i = 0; i < p->nsplit; i++) {
        pcre2_code_free(p->re[i]);
        free(p->pattern[i]);
    }
    pcre2_match_data_free(p->md);
    free(p->a.v);
    free(p->b.v);
    td_pretok_init(p);
}

static void spans_push(td_spans *s, size_t off, size_t len)
{
    td_grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v);
    s->v[s->n].off = (uint32_t)off;
    s->v[s->n].len = (uint32_t)len;
    s->n++;
}

/* Prepends ' ' to every piece in p->a that does not start with one; the pieces move into p->buf.
 * Runs once per split call, so text is never p->buf itself. */
static void add_prefix_spaces(td_pretok *p, const char *text)
{
    TREX_ASSERT(text != p->buf);
    int64_t need = 0;
    for (int64_t j = 0; j < p->a.n; j++)
        need += (int64_t)p->a.v[j].len + 1;
    td_grow((void **)&p->buf, &p->buf_cap, need + 1, 1);
    int64_t at = 0;
    for (int64_t j = 0; j < p->a.n; j++) {
        const char *s = text + p->a.v[j].off;
        uint32_t n = p->a.v[j].len;
        p->a.v[j].off = (uint32_t)at;
        if (s[0] != ' ') {
            p->buf[at++] = ' ';
            p->a.v[j].len = n + 1;
        }
        memcpy(p->buf + at, s, n);
        at += n;
    }
    p->base = p->buf;
}

trex_code td_pretok_split(td_pretok *p, const char *text, size_t len, trex_err *err)
{
    if (len >= UINT32_MAX / 2)
        return trex_err_set(err, TREX_ERANGE, "text of %zu bytes is longer than the 2 GiB trex can pre-tokenize",
                            len);
    p->a.n = 0;
    p->base = text;
    if (len == 0)
        return TREX_OK;
    spans_push(&p->a, 0, len);
    for (int k = 0; k <= p->nsplit; k++) {
        if (k == p->prefix_at)
            add_prefix_spaces(p, p->base);
        if (k == p->nsplit)
            break;
        const char *src = p->base;
        p->b.n = 0;
        for (int64_t j = 0; j < p->a.n; j++) {
            const char *subj = src + p->a.v[j].off;
            size_t slen = p->a.v[j].len, base = p->a.v[j].off, last = 0, start = 0;
            while (start < slen) {
                int rc = pcre2_match(p->re[k], (PCRE2_SPTR)subj, slen, start, PCRE2_NO_UTF_CHECK, p->md, NULL);
                if (rc == PCRE2_ERROR_NOMATCH)
                    break;
                if (rc < 0) {
                    PCRE2_UCHAR msg[256];
                    pcre2_get_error_message(rc, msg, sizeof msg);
                    return trex_err_set(err, TREX_EFORMAT, "pre-tokenizer regex %d failed: %s", k,
                                        (const char *)msg);
                }
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(p->md);
                size_t ms = ov[0], me = ov[1];
                if (me <= ms) { /* empty match: produces no piece; step over one character */
                    uint32_t cp;
                    start = ms + (size_t)td_utf8_decode((const unsigned char *)subj + ms, slen - ms, &cp);
                    continue;
                }
                if (ms > last)
                    spans_push(&p->b, base + last, ms - last);
                spans_push(&p->b, base + ms, me - ms);
                last = start = me;
            }
            if (last < slen)
                spans_push(&p->b, base + last, slen - last);
        }
        td_spans t = p->a;
        p->a = p->b;
        p->b = t;
    }
    return TREX_OK;
}

/* --- JSONL -------------------------------------------------------------------------------------- */

trex_code td_jsonl_open(td_jsonl *r, const char *path, trex_err *err)
{
    memset(r, 0, sizeof *r);
    r->path = path;
    r->f = fopen(path, "rb");
    if (!r->f)
        return trex_err_set(err, errno == ENOENT ? TREX_ENOTFOUND : TREX_EIO, "%s: cannot open: %s", path,
                            strerror(errno));
    return TREX_OK;
}

trex_code td_jsonl_next(td_jsonl *r, const char **line, size_t *len, bool *eof, trex_err *err)
{
    *eof = false;
    for (;;) {
        errno = 0;
        ssize_t n = getline(&r->line, &r->cap, r->f);
        if (n < 0) {
            if (ferror(r->f))
                return trex_err_set(err, TREX_EIO, "%s:%lld: read error: %s", r->path, (long long)r->lineno + 1,
                                    strerror(errno));
            *eof = true;
            return TREX_OK;
        }
        r->lineno++;
        while (n > 0 && (r->line[n - 1] == '\n' || r->line[n - 1] == '\r'))
            r->line[--n] = 0;
        ssize_t k = 0;
        while (k < n && (r->line[k] == ' ' || r->line[k] == '\t'))
            k++;
        if (k == n)
            continue; /* blank line */
        *line = r->line;
        *len = (size_t)n;
        return TREX_OK;
    }
}

void td_jsonl_close(td_jsonl *r)
{
    if (r->f)
        fclose(r->f);
    free(r->line);
    memset(r, 0, sizeof *r);
}

/* --- token buffers ------------------------------------------------------------------------------ */

void td_tokbuf_reserve(trex_tokbuf *b, int64_t extra)
{
    int64_t need = b->n + extra;
    if (need <= b->cap)
        return;
    int64_t c = b->cap ? b->cap : 64;
    while (c < need)
        c *= 2;
    b->ids = trex_xrealloc(b->ids, (size_t)c * sizeof *b->ids);
    b->mask = trex_xrealloc(b->mask, (size_t)c);
    b->cap = c;
}

void td_tokbuf_push(trex_tokbuf *b, int32_t id, uint8_t mask)
{
    td_tokbuf_reserve(b, 1);
    b->ids[b->n] = id;
    b->mask[b->n] = mask;
    b->n++;
}

void trex_tokbuf_clear(trex_tokbuf *b)
{
    b->n = 0;
}

void trex_tokbuf_free(trex_tokbuf *b)
{
    if (!b)
        return;
    free(b->ids);
    free(b->mask);
    memset(b, 0, sizeof *b);
}

/* --- special tokens ----------------------------------------------------------------------------- */

const td_special td_v4_specials[] = {
    {"<｜begin▁of▁sentence｜>", true}, /* 0: BOS */
    {"<｜end▁of▁sentence｜>", true},   /* 1: EOS and padding */
    {"<｜User｜>", true},
    {"<｜Assistant｜>", true},
    {"<think>", false},
    {"</think>", false},
    {"<｜latest_reminder｜>", true},
    {"｜DSML｜", true},
    {"<｜action｜>", true},
    {"<｜query｜>", true},
    {"<｜authority｜>", true},
    {"<｜domain｜>", true},
    {"<｜title｜>", true},
    {"<｜extracted_url｜>", true},
    {"<｜read_url｜>", true},
    {"<｜fim▁hole｜>", true},
    {"<｜fim▁begin｜>", true},
    {"<｜fim▁end｜>", true},
};
const int td_v4_nspecials = (int)(sizeof td_v4_specials / sizeof td_v4_specials[0]);
