/* tests/test_tokenizer.c — the byte-level BPE tokenizer: byte alphabet and UTF-8 helpers, the
 * DeepSeek pre-tokenizer splits, BPE merge order on tiny hand-made vocabularies, added tokens,
 * encode/decode round trips, the word cache, the trainer (determinism, special-token ids, learned
 * merges), and the errors for bad or unsupported tokenizer.json files.
 * The exact split and merge results below were checked against the Hugging Face library
 * (tests/test_tokenizer_parity.sh compares whole corpora). Run from the repository root. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "data/data_internal.h"
#include "trex/data.h"

#define FIXTURE "tests/tokenizer/fixture_dsv3.json"

/* --- helpers ------------------------------------------------------------------------------------ */

static char *bl(const char *raw)
{
    char *s = NULL;
    int64_t len = 0, cap = 0;
    td_bytes_to_bl((const unsigned char *)raw, strlen(raw), &s, &len, &cap);
    return s;
}

/* A tokenizer.json: the 256 bytes at ids 0..255, then one token per merge (raw strings "a", "b"),
 * extra vocabulary entries, added tokens (content, id, normalized, lstrip, rstrip), model options. */
typedef struct tiny_added {
    const char *content;
    int id;
    bool normalized, lstrip, rstrip;
} tiny_added;

static char *tiny_json(const char *const (*merges)[2], int nm, const char *const *extra, int nextra,
                       const tiny_added *added, int nadded, const char *model_opts_json, const char *skip_bytes)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *ad = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < nadded; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", added[i].id);
        cJSON_AddStringToObject(a, "content", added[i].content);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", added[i].lstrip);
        cJSON_AddBoolToObject(a, "rstrip", added[i].rstrip);
        cJSON_AddBoolToObject(a, "normalized", added[i].normalized);
        cJSON_AddBoolToObject(a, "special", 1);
        cJSON_AddItemToArray(ad, a);
    }
    cJSON_AddNullToObject(root, "normalizer");
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *list = cJSON_AddArrayToObject(pre, "pretokenizers");
    for (int i = 0; i < 3; i++) {
        cJSON *sp = cJSON_CreateObject();
        cJSON_AddStringToObject(sp, "type", "Split");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(sp, "pattern"), "Regex", td_deepseek_split_patterns[i]);
        cJSON_AddStringToObject(sp, "behavior", "Isolated");
        cJSON_AddBoolToObject(sp, "invert", 0);
        cJSON_AddItemToArray(list, sp);
    }
    cJSON *blv = cJSON_CreateObject();
    cJSON_AddStringToObject(blv, "type", "ByteLevel");
    cJSON_AddBoolToObject(blv, "add_prefix_space", 0);
    cJSON_AddBoolToObject(blv, "trim_offsets", 1);
    cJSON_AddBoolToObject(blv, "use_regex", 0);
    cJSON_AddItemToArray(list, blv);
    cJSON_AddNullToObject(root, "post_processor");
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON_AddBoolToObject(dec, "add_prefix_space", 1);
    cJSON_AddBoolToObject(dec, "trim_offsets", 1);
    cJSON_AddBoolToObject(dec, "use_regex", 1);
    cJSON *model = model_opts_json ? cJSON_Parse(model_opts_json) : cJSON_CreateObject();
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddStringToObject(model, "type", "BPE");
    static const char *const nulls[] = {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 4; i++)
        if (!cJSON_GetObjectItemCaseSensitive(model, nulls[i]))
            cJSON_AddNullToObject(model, nulls[i]);
    static const char *const falses[] = {"fuse_unk", "byte_fallback", "ignore_merges"};
    for (int i = 0; i < 3; i++)
        if (!cJSON_GetObjectItemCaseSensitive(model, falses[i]))
            cJSON_AddBoolToObject(model, falses[i], 0);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    int id = 0;
    for (int b = 0; b < 256; b++, id++) {
        char raw[2] = {(char)b, 0};
        if (b == 0 || (skip_bytes && strchr(skip_bytes, b)))
            continue; /* byte 0 is left out so that raw[] stays a C string; tests never use it */
        char *s = bl(raw);
        cJSON_AddNumberToObject(vocab, s, id);
        free(s);
    }
    cJSON *mj = cJSON_AddArrayToObject(model, "merges");
    for (int k = 0; k < nm; k++) {
        char *a = bl(merges[k][0]), *b = bl(merges[k][1]);
        size_t n = strlen(merges[k][0]) + strlen(merges[k][1]);
        char *cat = malloc(n + 1);
        snprintf(cat, n + 1, "%s%s", merges[k][0], merges[k][1]);
        char *c = bl(cat);
        if (!cJSON_GetObjectItemCaseSensitive(vocab, c))
            cJSON_AddNumberToObject(vocab, c, id++);
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(a));
        cJSON_AddItemToArray(pair, cJSON_CreateString(b));
        cJSON_AddItemToArray(mj, pair);
        free(a), free(b), free(cat), free(c);
    }
    for (int k = 0; k < nextra; k++) {
        char *c = bl(extra[k]);
        cJSON_AddNumberToObject(vocab, c, id++);
        free(c);
    }
    for (int i = 0; i < nadded; i++)
        cJSON_AddNumberToObject(vocab, added[i].content, added[i].id);
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}

static trex_tokenizer *load_json(const char *json)
{
    trex_tokenizer *t = NULL;
    trex_err err = {0};
    trex_code rc = trex_tok_load_mem(&t, json, strlen(json), "tiny.json", &err);
    CHECK(rc == TREX_OK, "load: %s", err.msg);
    return t;
}

/* The tokens of text, as one string "t1|t2|..." in raw bytes. */
static char *pieces(trex_tokenizer *t, const char *text)
{
    trex_tokbuf b = {0};
    trex_err err = {0};
    static char out[4096];
    out[0] = 0;
    if (trex_tok_encode(t, text, strlen(text), 0, &b, &err) != TREX_OK) {
        snprintf(out, sizeof out, "ERROR: %s", err.msg);
        return out;
    }
    for (int64_t i = 0; i < b.n; i++) {
        char *s = NULL;
        size_t n = 0;
        trex_tok_decode(t, &b.ids[i], 1, &s, &n, &err);
        if (i)
            strncat(out, "|", sizeof out - strlen(out) - 1);
        strncat(out, s, sizeof out - strlen(out) - 1);
        free(s);
    }
    trex_tokbuf_free(&b);
    return out;
}

#define CHECK_PIECES(t, text, want)                                                                  \
    do {                                                                                             \
        const char *got_ = pieces((t), (text));                                                      \
        CHECK(!strcmp(got_, (want)), "encode \"%s\": got \"%s\", want \"%s\"", (text), got_, (want)); \
    } while (0)

/* --- byte alphabet and UTF-8 -------------------------------------------------------------------- */

static void test_byte_alphabet(void)
{
    int seen[400] = {0};
    bool ok = true;
    for (unsigned b = 0; b < 256; b++) {
        uint32_t cp = td_byte_to_cp(b);
        ok &= cp < 400 && !seen[cp] && td_cp_to_byte(cp) == (int)b;
        if (cp < 400)
            seen[cp] = 1;
    }
    CHECK(ok, "byte <-> code point is a bijection");
    CHECK(td_byte_to_cp(' ') == 0x120 && td_byte_to_cp('\n') == 0x10A && td_byte_to_cp('A') == 'A' &&
              td_byte_to_cp(0xAD) == 0x143 && td_byte_to_cp(0x7F) == 0x121,
          "GPT-2 mapping: space -> U+0120 (Ġ), newline -> U+010A (Ċ), 0x7F -> U+0121, 0xAD -> U+0143");
    CHECK(td_cp_to_byte(0x144) == -1 && td_cp_to_byte(0x20) == -1, "code points outside the alphabet");
    char *s = NULL;
    int64_t len = 0, cap = 0;
    CHECK(td_bl_to_bytes("Ġhello", strlen("Ġhello"), &s, &len, &cap) && !strcmp(s, " hello"), "Ġhello -> ' hello'");
    len = 0;
    CHECK(!td_bl_to_bytes("<｜User｜>", strlen("<｜User｜>"), &s, &len, &cap) && !strcmp(s, "<｜User｜>"),
          "a token outside the alphabet decodes to its own bytes");
    free(s);
}

static void test_utf8(void)
{
    size_t bad = 99;
    CHECK(td_utf8_valid("a\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80", 10, &bad), "valid mixed UTF-8");
    CHECK(!td_utf8_valid("ab\xc3", 3, &bad) && bad == 2, "truncated sequence at 2 (got %zu)", bad);
    CHECK(!td_utf8_valid("\xc0\xaf", 2, &bad) && bad == 0, "overlong");
    CHECK(!td_utf8_valid("x\xed\xa0\x80", 4, &bad) && bad == 1, "surrogate");
    CHECK(!td_utf8_valid("\xf4\x90\x80\x80", 4, &bad), "above U+10FFFF");
    CHECK(!td_utf8_valid("\x80", 1, &bad), "lone continuation byte");
}

/* --- the DeepSeek pre-tokenizer ----------------------------------------------------------------- */

static void check_split(td_pretok *p, const char *text, const char *want)
{
    trex_err err = {0};
    char got[1024] = "";
    if (td_pretok_split(p, text, strlen(text), &err) != TREX_OK) {
        CHECK(0, "split: %s", err.msg);
        return;
    }
    for (int64_t i = 0; i < p->a.n; i++) {
        if (i)
            strncat(got, "|", sizeof got - strlen(got) - 1);
        strncat(got, text + p->a.v[i].off, p->a.v[i].len < sizeof got - strlen(got) - 1 ? p->a.v[i].len : 0);
    }
    CHECK(!strcmp(got, want), "split \"%s\": got \"%s\", want \"%s\"", text, got, want);
}

static void test_pretokenizer(void)
{
    td_pretok p;
    trex_err err = {0};
    td_pretok_init(&p);
    for (int i = 0; i < 3; i++)
        CHECK(td_pretok_add(&p, td_deepseek_split_patterns[i], "test", &err) == TREX_OK, "%s", err.msg);
    check_split(&p, "hello world  it's", "hello| world| | it|'s");
    check_split(&p, "1234567 x", "123|456|7| x");
    check_split(&p, "\xd9\xa3\xd9\xa4\xd9\xa5\xd9\xa6 ab", "\xd9\xa3\xd9\xa4\xd9\xa5|\xd9\xa6| ab"); /* ٣٤٥٦ */
    check_split(&p, "中文abc日本", "中文|abc|日本");
    check_split(&p, "a\n\nb", "a|\n\n|b");
    check_split(&p, "x.Hello (y)", "x|.Hello| (|y|)");
    /* Oniguruma's \s: U+3000 and U+0085 are spaces, U+180E and U+200B are not (PCRE2 alone says U+180E is) */
    check_split(&p, "a\xe3\x80\x80\xe3\x80\x80" "b", "a|\xe3\x80\x80|\xe3\x80\x80" "b");
    check_split(&p, "a\xe1\xa0\x8e\n", "a|\xe1\xa0\x8e|\n");
    check_split(&p, "a\xc2\x85\n", "a|\xc2\x85\n");
    check_split(&p, "a\xe2\x80\x8b\n", "a|\xe2\x80\x8b|\n");
    td_pretok_free(&p);
    CHECK(td_pretok_add(&p, "[\\S]+", "test", &err) == TREX_EUNSUPPORTED && strstr(err.msg, "\\S inside"),
          "negated shorthand inside a class is refused: %s", err.msg);
    CHECK(td_pretok_add(&p, "(unclosed", "field x", &err) == TREX_EFORMAT && strstr(err.msg, "field x"),
          "a bad regex names its field: %s", err.msg);
    td_pretok_free(&p);
}

/* --- BPE ---------------------------------------------------------------------------------------- */

static void test_bpe_order(void)
{
    static const char *const m1[][2] = {{"a", "a"}};
    char *j = tiny_json(m1, 1, NULL, 0, NULL, 0, NULL, NULL);
    trex_tokenizer *t = load_json(j);
    CHECK_PIECES(t, "aaa", "aa|a");  /* equal ranks: leftmost first */
    CHECK_PIECES(t, "aaaa", "aa|aa");
    trex_tok_free(t);
    free(j);

    static const char *const m2[][2] = {{"b", "c"}, {"a", "b"}};
    j = tiny_json(m2, 2, NULL, 0, NULL, 0, NULL, NULL);
    t = load_json(j);
    CHECK_PIECES(t, "abc", "a|bc"); /* lower rank wins, wherever it is */
    CHECK_PIECES(t, "ab", "ab");
    trex_tok_free(t);
    free(j);

    static const char *const m3[][2] = {{"a", "b"}, {"b", "c"}, {"ab", "c"}, {"c", "d"}, {"abc", "d"}};
    j = tiny_json(m3, 5, NULL, 0, NULL, 0, NULL, NULL);
    t = load_json(j);
    CHECK_PIECES(t, "abcd", "abcd");
    CHECK_PIECES(t, "bcd", "bc|d");
    CHECK_PIECES(t, "abcabc", "abc|abc");
    CHECK_PIECES(t, " abc", " |abc");
    trex_tok_free(t);
    free(j);

    /* ignore_merges: a word that is in the vocabulary is one token even without a merge path */
    static const char *const extra[] = {"xyz"};
    j = tiny_json(NULL, 0, extra, 1, NULL, 0, "{\"ignore_merges\": true}", NULL);
    t = load_json(j);
    CHECK_PIECES(t, "xyz", "xyz");
    CHECK_PIECES(t, "xyzw", "x|y|z|w");
    trex_tok_free(t);
    free(j);
    j = tiny_json(NULL, 0, extra, 1, NULL, 0, NULL, NULL);
    t = load_json(j);
    CHECK_PIECES(t, "xyz", "x|y|z");
    trex_tok_free(t);
    free(j);

    /* a byte missing from the vocabulary is dropped; with unk_token it becomes unk (fused with fuse_unk) */
    j = tiny_json(NULL, 0, NULL, 0, NULL, 0, NULL, "z");
    t = load_json(j);
    CHECK_PIECES(t, "azza", "a|a");
    trex_tok_free(t);
    free(j);
    static const char *const unk[] = {"<unk>"};
    j = tiny_json(NULL, 0, unk, 1, NULL, 0, "{\"unk_token\": \"<unk>\", \"fuse_unk\": true}", "z");
    t = load_json(j);
    trex_tokbuf b = {0};
    trex_err err = {0};
    CHECK(trex_tok_encode(t, "azza", 4, 0, &b, &err) == TREX_OK && b.n == 3 && b.ids[1] == trex_tok_id(t, "<unk>"),
          "fuse_unk: a, unk, a (n=%lld)", (long long)b.n);
    trex_tokbuf_free(&b);
    trex_tok_free(t);
    free(j);
}

static void test_added_tokens(void)
{
    static const tiny_added added[] = {
        {"<a>", 300, false, false, false}, {"<a><b>", 301, false, false, false}, {"yz", 302, false, false, false},
        {"xy", 303, true, false, false},   {"[S]", 304, false, true, true},
    };
    char *j = tiny_json(NULL, 0, NULL, 0, added, 5, NULL, NULL);
    trex_tokenizer *t = load_json(j);
    CHECK_PIECES(t, "q<a><b>r<a>", "q|<a><b>|r|<a>"); /* longest at the leftmost position */
    CHECK_PIECES(t, "xyz", "x|yz");                   /* the non-normalized pass runs first */
    CHECK_PIECES(t, "xyq", "xy|q");
    CHECK_PIECES(t, "a  [S]  b", "a|[S]|b");          /* lstrip and rstrip swallow the spaces */
    CHECK_PIECES(t, "a\xe3\x80\x80[S]\nb", "a|[S]|b"); /* Unicode spaces too */
    CHECK(trex_tok_is_added(t, 301) && !trex_tok_is_added(t, 'a') && trex_tok_id(t, "<a><b>") == 301,
          "added-token lookups");
    trex_tok_free(t);
    free(j);
}

static void test_fixture_roundtrip(void)
{
    trex_tokenizer *t = NULL;
    trex_err err = {0};
    if (trex_tok_load(&t, FIXTURE, &err) != TREX_OK) {
        CHECK(0, "%s", err.msg);
        return;
    }
    CHECK(trex_tok_vocab_size(t) == 1021, "fixture ids 0..1020 (got %d)", trex_tok_vocab_size(t));
    CHECK(trex_tok_id(t, "<｜User｜>") == 1003 && trex_tok_id(t, "<think>") == 1005 &&
              trex_tok_id(t, "<｜begin▁of▁sentence｜>") == 0 && trex_tok_str(t, 500) == NULL,
          "fixture ids; a hole in the id range has no string");
    CHECK_PIECES(t, "Hello world, the thing", "Hello| world|,| the| th|ing");
    CHECK_PIECES(t, "12345 4567", "123|4|5| |456|7");
    CHECK_PIECES(t, "你好", "你好");
    CHECK_PIECES(t, "<｜User｜>hi<think>x</think>", "<｜User｜>|h|i|<think>|x|</think>");
    static const char *const texts[] = {
        "",
        "plain ascii text with  double  spaces\tand\ttabs\n\nand newlines\r\n",
        "中文，日本語のテキスト、한국어, кириллица, العربية",
        "emoji 😀👍🏽👨‍👩‍👧 🇫🇷 and combining e\xcc\x81",
        "99999999999999999999999999 0.000001 -42",
        "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>a<｜end▁of▁sentence｜>",
        "\xc2\x85\xe1\xa0\x8e\xe2\x80\xa8\xe3\x80\x80 odd spaces",
    };
    trex_tokbuf b = {0};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        trex_tokbuf_clear(&b);
        char *back = NULL;
        size_t n = 0;
        CHECK(trex_tok_encode(t, texts[i], strlen(texts[i]), 1, &b, &err) == TREX_OK, "encode: %s", err.msg);
        bool masks = true;
        for (int64_t k = 0; k < b.n; k++)
            masks &= b.mask[k] == 1;
        CHECK(masks, "the mask byte given to encode is stored");
        CHECK(trex_tok_decode(t, b.ids, b.n, &back, &n, &err) == TREX_OK && n == strlen(texts[i]) &&
                  !memcmp(back, texts[i], n),
              "decode(encode(x)) == x for text %zu", i);
        free(back);
    }
    /* bad input */
    CHECK(trex_tok_encode(t, "ok\xff", 3, 0, &b, &err) == TREX_EFORMAT && strstr(err.msg, "offset 2"),
          "invalid UTF-8 names the offset: %s", err.msg);
    int32_t badid[] = {5, 500};
    char *s = NULL;
    size_t n = 0;
    CHECK(trex_tok_decode(t, badid, 2, &s, &n, &err) == TREX_ERANGE && strstr(err.msg, "500"),
          "decode of an id outside the vocabulary: %s", err.msg);
    trex_tokbuf_free(&b);
    trex_tok_free(t);
}

/* The word cache must not change results, also after it fills up and is cleared. */
static void test_cache(void)
{
    trex_tokenizer *t1 = NULL, *t2 = NULL;
    trex_err err = {0};
    if (trex_tok_load(&t1, FIXTURE, &err) != TREX_OK || trex_tok_load(&t2, FIXTURE, &err) != TREX_OK) {
        CHECK(0, "%s", err.msg);
        return;
    }
    size_t cap = 1 << 20, len = 0;
    char *text = malloc(cap);
    for (int i = 0; i < 50000 && len + 32 < cap; i++)
        len += (size_t)snprintf(text + len, cap - len, " w%dq%c", i * 7919 % 100003, 'a' + i % 26);
    trex_tokbuf a = {0}, b = {0}, c = {0};
    CHECK(trex_tok_encode(t1, text, len, 0, &a, &err) == TREX_OK, "%s", err.msg);
    CHECK(trex_tok_encode(t1, text, len, 0, &b, &err) == TREX_OK, "%s", err.msg); /* warm cache */
    bool same = a.n == b.n && !memcmp(a.ids, b.ids, (size_t)a.n * sizeof *a.ids);
    CHECK(same, "same ids with a cold and a warm cache");
    /* word by word in a fresh tokenizer gives the same ids */
    bool same2 = true;
    for (size_t i = 0, j; i < len && same2; i = j) {
        j = i + 1;
        while (j < len && text[j] != ' ')
            j++;
        same2 = trex_tok_encode(t2, text + i, j - i, 0, &c, &err) == TREX_OK;
    }
    same2 = same2 && c.n == a.n && !memcmp(c.ids, a.ids, (size_t)a.n * sizeof *a.ids);
    CHECK(same2, "encoding the words one by one gives the same ids (%lld vs %lld)", (long long)c.n, (long long)a.n);
    trex_tokbuf_free(&a);
    trex_tokbuf_free(&b);
    trex_tokbuf_free(&c);
    free(text);
    trex_tok_free(t1);
    trex_tok_free(t2);
}

/* --- training ----------------------------------------------------------------------------------- */

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = 0;
    fclose(f);
    return s;
}

static void test_train(void)
{
    char dir[] = "/tmp/trex-test-tok-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    char p1[256], p2[256];
    snprintf(p1, sizeof p1, "%s/a.json", dir);
    snprintf(p2, sizeof p2, "%s/b.json", dir);
    static const char *const texts[] = {
        "the cat sat on the mat with the hat",
        "the theory of the thing: the optimum is 42",
        "线性规划 线性规划 线性规划 目标函数",
        "hello hello hello hello <think>secret</think> hello",
    };
    trex_err err = {0};
    trex_tok_train_stats st[2] = {{0}};
    for (int run = 0; run < 2; run++) {
        trex_tok_trainer *tr = NULL;
        trex_tok_trainer_create(&tr);
        for (int k = 0; k < 3; k++)
            for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
                CHECK(trex_tok_trainer_feed(tr, texts[i], strlen(texts[i]), &err) == TREX_OK, "%s", err.msg);
        CHECK(trex_tok_trainer_finish(tr, 320, 2, run ? p2 : p1, &st[run], &err) == TREX_OK, "%s", err.msg);
        trex_tok_trainer_free(tr);
    }
    char *a = read_all(p1), *b = read_all(p2);
    CHECK(a && b && !strcmp(a, b), "two trainings on the same texts write the same bytes");
    CHECK(st[0].vocab_size <= 320 && st[0].merges > 20 && st[0].texts == 12, "stats: vocab %d merges %lld texts %lld",
          st[0].vocab_size, (long long)st[0].merges, (long long)st[0].texts);
    trex_tokenizer *t = NULL;
    if (trex_tok_load(&t, p1, &err) == TREX_OK) {
        CHECK(trex_tok_id(t, "<｜begin▁of▁sentence｜>") == 0 && trex_tok_id(t, "<｜end▁of▁sentence｜>") == 1 &&
                  trex_tok_id(t, "<｜User｜>") == 2 && trex_tok_id(t, "<｜Assistant｜>") == 3 &&
                  trex_tok_id(t, "<think>") == 4 && trex_tok_id(t, "</think>") == 5,
              "DeepSeek-V4 special tokens first");
        CHECK(trex_tok_vocab_size(t) == st[0].vocab_size, "vocab size %d", trex_tok_vocab_size(t));
        CHECK_PIECES(t, " hello", " hello");
        CHECK_PIECES(t, "the", "the");
        CHECK_PIECES(t, "线性规划", "线性规划");
        trex_tok_free(t);
    } else {
        CHECK(0, "load trained: %s", err.msg);
    }
    /* too small a vocabulary, and a corpus too small to reach the target */
    trex_tok_trainer *tr = NULL;
    trex_tok_trainer_create(&tr);
    CHECK(trex_tok_trainer_finish(tr, 100, 2, p1, NULL, &err) == TREX_EINVAL && strstr(err.msg, "at least"),
          "vocab below specials + 256: %s", err.msg);
    CHECK(trex_tok_trainer_feed(tr, "ab ab", 5, &err) == TREX_OK, "feed");
    trex_tok_train_stats s2 = {0};
    CHECK(trex_tok_trainer_finish(tr, 1000, 2, p1, &s2, &err) == TREX_OK && s2.short_of_target && s2.merges == 1,
          "stops early with a note when no pair is frequent enough (merges %lld)", (long long)s2.merges);
    CHECK(trex_tok_trainer_feed(tr, "\xff", 1, &err) == TREX_EFORMAT, "invalid UTF-8 fed to the trainer");
    trex_tok_trainer_free(tr);
    free(a);
    free(b);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}

/* --- bad tokenizer files ------------------------------------------------------------------------ */

static void expect_load_error(const char *json, trex_code code, const char *needle)
{
    trex_tokenizer *t = NULL;
    trex_err err = {0};
    trex_code rc = trex_tok_load_mem(&t, json, strlen(json), "bad.json", &err);
    CHECK(rc == code && strstr(err.msg, needle) && strstr(err.msg, "bad.json"),
          "want %s containing \"%s\", got %s: %s", trex_code_str(code), needle, trex_code_str(rc), err.msg);
    trex_tok_free(t);
}

static void test_bad_files(void)
{
    char *good = tiny_json(NULL, 0, NULL, 0, NULL, 0, NULL, NULL);
    trex_tokenizer *t = load_json(good);
    trex_tok_free(t);
    expect_load_error("{\"model\": {\n  \"vocab\": {\"a\": 0,}\n}}", TREX_EFORMAT, "line 2");
    expect_load_error("[1, 2]", TREX_EFORMAT, "object");
    char buf[1 << 16];
    /* swap pieces of the good file for bad ones */
    const struct {
        const char *from, *to;
        trex_code code;
        const char *needle;
    } cases[] = {
        {"\"normalizer\":null", "\"normalizer\":{\"type\":\"NFC\"}", TREX_EUNSUPPORTED, "normalizer"},
        {"\"behavior\":\"Isolated\"", "\"behavior\":\"Removed\"", TREX_EUNSUPPORTED, "pretokenizers[0]"},
        {"\"decoder\":{\"type\":\"ByteLevel\"", "\"decoder\":{\"type\":\"Fuse\"", TREX_EUNSUPPORTED, "decoder"},
        {"\"type\":\"BPE\"", "\"type\":\"WordPiece\"", TREX_EUNSUPPORTED, "model.type"},
        {"\"merges\":[]", "\"merges\":[\"a b\"]", TREX_EFORMAT, "merges[0]"},
        {"\"merges\":[]", "\"merges\":[\"a\"]", TREX_EFORMAT, "merges[0]"},
        {"\"merges\":[]", "\"merges\":[[\"a\",\"b\",\"c\"]]", TREX_EFORMAT, "merges[0]"},
        {"\"vocab\":{", "\"vocab\":{\"dup\":65,", TREX_EFORMAT, "id 65"},
        {"\"vocab\":{", "\"vocab\":{\"neg\":-1,", TREX_EFORMAT, "model.vocab"},
        {"\"added_tokens\":[]",
         "\"added_tokens\":[{\"id\":400,\"content\":\"<x>\",\"single_word\":true}]", TREX_EUNSUPPORTED, "single_word"},
        {"\"added_tokens\":[]", "\"added_tokens\":[{\"id\":400,\"content\":\"\"}]", TREX_EFORMAT, "added_tokens[0]"},
        {"\"byte_fallback\":false", "\"byte_fallback\":true", TREX_EUNSUPPORTED, "byte_fallback"},
        {"\"dropout\":null", "\"dropout\":0.1", TREX_EUNSUPPORTED, "dropout"},
        {"\"type\":\"ByteLevel\",\"add_prefix_space\":false", "\"type\":\"Whitespace\",\"add_prefix_space\":false",
         TREX_EUNSUPPORTED, "pretokenizers[3]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *at = strstr(good, cases[i].from);
        if (!at) {
            CHECK(0, "case %zu: '%s' not in the good file", i, cases[i].from);
            continue;
        }
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - good), good, cases[i].to, at + strlen(cases[i].from));
        expect_load_error(buf, cases[i].code, cases[i].needle);
    }
    free(good);
    trex_err err = {0};
    CHECK(trex_tok_load(&t, "/nonexistent/tokenizer.json", &err) == TREX_ENOTFOUND &&
              strstr(err.msg, "/nonexistent/tokenizer.json"),
          "a missing file: %s", err.msg);
}

int main(void)
{
    test_byte_alphabet();
    test_utf8();
    test_pretokenizer();
    test_bpe_order();
    test_added_tokens();
    test_fixture_roundtrip();
    test_cache();
    test_train();
    test_bad_files();
    return check_summary();
}
