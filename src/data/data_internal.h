/* data/data_internal.h — pieces shared by the tokenizer, the BPE trainer, the chat template and the
 * shard writer (src/data/tokenizer*.c, chat.c, shard*.c). Not part of the public API (trex/data.h).
 *
 *   - abort-on-OOM allocation helpers (an allocation failure in the data path is not recoverable
 *     input: it aborts with a message, like the OR module);
 *   - UTF-8 validation and decoding;
 *   - the GPT-2 byte-to-unicode table of byte-level BPE;
 *   - the pre-tokenizer pipeline (a sequence of PCRE2 regex splits, then the byte-level mapping);
 *   - a JSONL line reader with line numbers;
 *   - FNV-1a 64 hashing. */
#ifndef TREX_DATA_INTERNAL_H
#define TREX_DATA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "trex/data.h"
#include "trex/alloc.h"
#include "trex/status.h"

/* --- allocation --------------------------------------------------------------------------------- */

char *td_xstrndup(const char *s, size_t n);
/* Grows *p (elements of `size` bytes) so that it holds at least `need` elements; *cap is updated. */
void td_grow(void **p, int64_t *cap, int64_t need, size_t size);

/* --- hashing ------------------------------------------------------------------------------------ */

#define TD_FNV_OFFSET 0xcbf29ce484222325ull
#define TD_FNV_PRIME 0x100000001b3ull
uint64_t td_fnv1a(const void *data, size_t len, uint64_t h);
/* A 64-bit mix for integer keys (pairs of token ids). */
static inline uint64_t td_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* --- UTF-8 -------------------------------------------------------------------------------------- */

/* Returns true when s[0..len) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF); otherwise
 * *bad_at receives the offset of the first bad byte. */
bool td_utf8_valid(const char *s, size_t len, size_t *bad_at);
/* Decodes one code point of valid UTF-8 at s (len > 0); returns its byte length. */
int td_utf8_decode(const unsigned char *s, size_t len, uint32_t *cp);
/* Encodes cp; returns the byte length (1..4). */
int td_utf8_encode(uint32_t cp, char out[4]);
/* Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s accept). */
bool td_is_unicode_space(uint32_t cp);

/* --- byte-level alphabet ------------------------------------------------------------------------ */

/* The GPT-2 byte-level alphabet: every byte b has a printable code point cp(b) (b itself for the
 * printable Latin-1 bytes, 256 + k for the others in byte order). Tokens are written in this form. */
uint32_t td_byte_to_cp(unsigned b);
/* The byte of a byte-level code point, or -1 when cp is not in the alphabet. */
int td_cp_to_byte(uint32_t cp);
/* Appends the byte-level form of bytes[0..n) to the growable string (*s, *len, *cap). */
void td_bytes_to_bl(const unsigned char *bytes, size_t n, char **s, int64_t *len, int64_t *cap);
/* Decodes a token written in byte-level form into raw bytes (appended to *s). If some character is
 * outside the alphabet, the token's own UTF-8 bytes are appended instead (what the Hugging Face
 * ByteLevel decoder does). Returns true when the byte-level mapping applied. */
bool td_bl_to_bytes(const char *tok, size_t n, char **s, int64_t *len, int64_t *cap);

/* --- pre-tokenizer ------------------------------------------------------------------------------ */

#define TD_MAX_SPLITS 8

/* The three Split regexes of the DeepSeek-V3 tokenizer.json (kept by V4), applied in order, each with
 * behavior "Isolated", followed by ByteLevel(add_prefix_space=false, use_regex=false). */
extern const char *const td_deepseek_split_patterns[3];
/* The regex of ByteLevel(use_regex=true) (GPT-2). */
extern const char *const td_gpt2_pattern;

typedef struct td_span {
    uint32_t off, len;
} td_span;

typedef struct td_spans {
    td_span *v;
    int64_t n, cap;
} td_spans;

typedef struct td_pretok {
    int nsplit;
    pcre2_code *re[TD_MAX_SPLITS];
    char *pattern[TD_MAX_SPLITS]; /* as written in tokenizer.json (for messages) */
    /* ByteLevel add_prefix_space: before split stage prefix_at (== nsplit: after the last one), every
     * piece that does not start with ' ' gets one prepended; -1: never */
    int prefix_at;
    pcre2_match_data *md;
    td_spans a, b;     /* work lists */
    const char *base;  /* the pieces in a are offsets into base: the text, or buf after a prefix */
    char *buf;
    int64_t buf_cap;
} td_pretok;

/* Compiles one Split regex (Oniguruma syntax as the Hugging Face library uses it) with PCRE2 in UTF +
 * UCP mode. \s \S \d \D \w \W are first rewritten into explicit classes with Oniguruma's Unicode
 * meaning (PCRE2's \s also accepts U+180E; its \w all of \p{N}), so that PCRE2 splits as the
 * reference library does. `where` names the field for messages. */
trex_code td_pretok_add(td_pretok *p, const char *pattern, const char *where, trex_err *err);
/* Sets prefix_at = -1 (no prefix space); call before the first td_pretok_add. */
void td_pretok_init(td_pretok *p);
void td_pretok_free(td_pretok *p);
/* Splits text[0..len) (valid UTF-8) into pre-token pieces: each split stage keeps the matches and the
 * gaps between them (behavior "Isolated") of every piece of the previous stage, and the ByteLevel
 * prefix space is added where prefix_at says. The pieces are p->a (offsets into p->base) until the
 * next call. Start from td_pretok_init. */
trex_code td_pretok_split(td_pretok *p, const char *text, size_t len, trex_err *err);

/* --- JSONL -------------------------------------------------------------------------------------- */

typedef struct td_jsonl {
    FILE *f;
    const char *path;
    char *line;
    size_t cap;
    int64_t lineno; /* 1-based number of the line last returned */
} td_jsonl;

trex_code td_jsonl_open(td_jsonl *r, const char *path, trex_err *err);
/* Next non-blank line: *line (NUL-terminated, trailing newline removed) and *len; *eof at the end. */
trex_code td_jsonl_next(td_jsonl *r, const char **line, size_t *len, bool *eof, trex_err *err);
void td_jsonl_close(td_jsonl *r);

/* --- token buffers ------------------------------------------------------------------------------ */

void td_tokbuf_push(trex_tokbuf *b, int32_t id, uint8_t mask);
void td_tokbuf_reserve(trex_tokbuf *b, int64_t extra);

/* --- the DeepSeek-V4 special tokens (MODEL_SPEC §8), in the order `train-tokenizer` numbers them --- */

typedef struct td_special {
    const char *content;
    bool special; /* the "special" flag of tokenizer.json; <think> and </think> are not special */
} td_special;
extern const td_special td_v4_specials[];
extern const int td_v4_nspecials;

#endif
