/* tests/test_chat.c — the DeepSeek-V4 chat template and loss masks (golden token strings for a
 * multi-turn sample with and without reasoning; the mask covers exactly the assistant spans),
 * generation prompts, CPT documents, and the errors for bad JSONL lines. Uses the hand-made
 * tokenizer tests/tokenizer/fixture_dsv3.json. Run from the repository root. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "trex/data.h"

#define FIXTURE "tests/tokenizer/fixture_dsv3.json"
#define BOS "<｜begin▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"
#define USER "<｜User｜>"
#define ASSISTANT "<｜Assistant｜>"

/* The tokens of b as "t1|t2|...", and the mask as a string of 0/1. */
static void show(const trex_tokenizer *t, const trex_tokbuf *b, char *toks, size_t tn, char *mask, size_t mn)
{
    toks[0] = 0;
    for (int64_t i = 0; i < b->n; i++) {
        char *s = NULL;
        size_t n = 0;
        trex_err err = {0};
        trex_tok_decode(t, &b->ids[i], 1, &s, &n, &err);
        if (i)
            strncat(toks, "|", tn - strlen(toks) - 1);
        strncat(toks, s ? s : "?", tn - strlen(toks) - 1);
        free(s);
        if ((size_t)i + 1 < mn) {
            mask[i] = b->mask[i] ? '1' : '0';
            mask[i + 1] = 0;
        }
    }
    if (b->n == 0)
        mask[0] = 0;
}

static void golden(trex_tokenizer *t, const trex_chat_msg *m, int n, const char *want_text, const char *want_toks,
                   const char *want_mask, const char *what)
{
    trex_err err = {0};
    char *text = NULL;
    size_t len = 0;
    CHECK(trex_chat_render(m, n, &text, &len, &err) == TREX_OK, "%s: render: %s", what, err.msg);
    CHECK(text && !strcmp(text, want_text), "%s: rendered\n  got  %s\n  want %s", what, text, want_text);
    trex_tokbuf b = {0}, whole = {0};
    CHECK(trex_chat_encode(t, m, n, &b, &err) == TREX_OK, "%s: encode: %s", what, err.msg);
    char toks[4096], mask[1024];
    show(t, &b, toks, sizeof toks, mask, sizeof mask);
    CHECK(!strcmp(toks, want_toks), "%s: tokens\n  got  %s\n  want %s", what, toks, want_toks);
    CHECK(!strcmp(mask, want_mask), "%s: mask\n  got  %s\n  want %s", what, mask, want_mask);
    /* the same ids as encoding the rendered string in one piece */
    CHECK(text && trex_tok_encode(t, text, len, 0, &whole, &err) == TREX_OK && whole.n == b.n &&
              !memcmp(whole.ids, b.ids, (size_t)b.n * sizeof *b.ids),
          "%s: segment-wise ids equal the ids of the whole rendered text", what);
    trex_tokbuf_free(&b);
    trex_tokbuf_free(&whole);
    free(text);
}

static void test_golden(trex_tokenizer *t)
{
    /* chat mode: no reasoning anywhere */
    const trex_chat_msg a[] = {
        {TREX_CHAT_SYSTEM, "Hello world", NULL},
        {TREX_CHAT_USER, "the 123", NULL},
        {TREX_CHAT_ASSISTANT, "你好", NULL},
        {TREX_CHAT_USER, "it's", NULL},
        {TREX_CHAT_ASSISTANT, "World", NULL},
    };
    golden(t, a, 5,
           BOS "Hello world" USER "the 123" ASSISTANT "</think>你好" EOS USER "it's" ASSISTANT "</think>World" EOS,
           BOS "|Hello| world|" USER "|the| |123|" ASSISTANT "|</think>|你好|" EOS "|" USER "|it|'s|" ASSISTANT
               "|</think>|World|" EOS,
           "000000000110000011", "chat mode");

    /* thinking mode: the reasoning of the last turn is kept, the earlier one dropped */
    const trex_chat_msg r[] = {
        {TREX_CHAT_USER, "the", NULL},
        {TREX_CHAT_ASSISTANT, "Hello", "123"},
        {TREX_CHAT_USER, " world", NULL},
        {TREX_CHAT_ASSISTANT, "World", "你好"},
    };
    golden(t, r, 4,
           BOS USER "the" ASSISTANT "</think>Hello" EOS USER " world" ASSISTANT "<think>你好</think>World" EOS,
           BOS "|" USER "|the|" ASSISTANT "|</think>|Hello|" EOS "|" USER "| world|" ASSISTANT
               "|<think>|你好|</think>|World|" EOS,
           "000001100001111", "thinking mode");

    /* empty reasoning still selects thinking mode; a system message in the middle stays context */
    const trex_chat_msg e[] = {
        {TREX_CHAT_USER, "the", NULL},
        {TREX_CHAT_SYSTEM, "Hello", NULL},
        {TREX_CHAT_USER, "the", NULL},
        {TREX_CHAT_ASSISTANT, NULL, ""},
    };
    golden(t, e, 4, BOS USER "the" "Hello" USER "the" ASSISTANT "<think></think>" EOS,
           BOS "|" USER "|the|Hello|" USER "|the|" ASSISTANT "|<think>|</think>|" EOS, "0000000011",
           "empty reasoning and content");
}

/* Over varied samples: the mask-1 tokens decode to exactly the assistant spans, in order. */
static void test_mask_spans(trex_tokenizer *t)
{
    const trex_chat_msg s1[] = {
        {TREX_CHAT_SYSTEM, "sys <think> text", NULL},
        {TREX_CHAT_USER, "q1 <｜Assistant｜> inside", NULL},
        {TREX_CHAT_ASSISTANT, "a1 with </think> inside", "dropped reasoning"},
        {TREX_CHAT_USER, "q2", NULL},
        {TREX_CHAT_ASSISTANT, "a2  ", "r2\n\n"},
        {TREX_CHAT_ASSISTANT, "a3", "r3"},
    };
    const char *want = "a1 with </think> inside" EOS "r2\n\n</think>a2  " EOS "r3</think>a3" EOS;
    trex_tokbuf b = {0};
    trex_err err = {0};
    CHECK(trex_chat_encode(t, s1, 6, &b, &err) == TREX_OK, "%s", err.msg);
    char got[1024] = "";
    for (int64_t i = 0; i < b.n; i++) {
        if (!b.mask[i])
            continue;
        char *s = NULL;
        size_t n = 0;
        trex_tok_decode(t, &b.ids[i], 1, &s, &n, &err);
        strncat(got, s, sizeof got - strlen(got) - 1);
        free(s);
    }
    CHECK(!strcmp(got, want), "target tokens\n  got  %s\n  want %s", got, want);
    int32_t assistant = trex_tok_id(t, ASSISTANT), user = trex_tok_id(t, USER);
    bool ok = true;
    for (int64_t i = 0; i < b.n; i++)
        if ((b.ids[i] == assistant || b.ids[i] == user) && b.mask[i])
            ok = false;
    CHECK(ok, "the template's <｜Assistant｜> and <｜User｜> tokens are never targets");
    trex_tokbuf_free(&b);
}

static void test_prompt(trex_tokenizer *t)
{
    const trex_chat_msg m[] = {
        {TREX_CHAT_USER, "the", NULL},
        {TREX_CHAT_ASSISTANT, "Hello", "123"},
        {TREX_CHAT_USER, "World", NULL},
    };
    const char *want[3] = {
        BOS "|" USER "|the|" ASSISTANT "|</think>|Hello|" EOS "|" USER "|World|" ASSISTANT,
        BOS "|" USER "|the|" ASSISTANT "|</think>|Hello|" EOS "|" USER "|World|" ASSISTANT "|</think>",
        BOS "|" USER "|the|" ASSISTANT "|</think>|Hello|" EOS "|" USER "|World|" ASSISTANT "|<think>",
    };
    for (int g = 0; g < 3; g++) {
        trex_tokbuf b = {0};
        trex_err err = {0};
        CHECK(trex_chat_encode_prompt(t, m, 3, (trex_chat_gen)g, &b, &err) == TREX_OK, "%s", err.msg);
        char toks[2048], mask[512];
        show(t, &b, toks, sizeof toks, mask, sizeof mask);
        CHECK(!strcmp(toks, want[g]), "prompt %d\n  got  %s\n  want %s", g, toks, want[g]);
        CHECK(!strchr(mask, '1'), "a prompt has no targets: %s", mask);
        trex_tokbuf_free(&b);
    }
    trex_tokbuf b = {0};
    trex_err err = {0};
    CHECK(trex_chat_encode_prompt(t, m, 2, TREX_CHAT_GEN_OPEN, &b, &err) == TREX_EINVAL &&
              strstr(err.msg, "end with a user message"),
          "a prompt must end with a user message: %s", err.msg);
    CHECK(trex_chat_encode(t, m, 0, &b, &err) == TREX_EINVAL && strstr(err.msg, "empty sample"), "%s", err.msg);
    CHECK(trex_chat_encode(t, m, 1, &b, &err) == TREX_EINVAL && strstr(err.msg, "no assistant message"), "%s",
          err.msg);
    trex_tokbuf_free(&b);
}

static void expect_line(trex_tokenizer *t, trex_data_format fmt, const char *line, trex_code code, const char *needle)
{
    trex_tokbuf b = {0};
    trex_err err = {0};
    trex_code rc = trex_data_encode_line(t, fmt, line, strlen(line), &b, &err);
    CHECK(rc == code && (!needle || strstr(err.msg, needle)), "%s: want %s \"%s\", got %s: %s", line,
          trex_code_str(code), needle ? needle : "", trex_code_str(rc), err.msg);
    trex_tokbuf_free(&b);
}

static void test_lines(trex_tokenizer *t)
{
    /* CPT: text then EOS, all targets */
    trex_tokbuf b = {0}, ref = {0};
    trex_err err = {0};
    const char *line = "{\"text\": \"Hello world 你好\"}";
    CHECK(trex_data_encode_line(t, TREX_DATA_CPT, line, strlen(line), &b, &err) == TREX_OK, "%s", err.msg);
    trex_tok_encode(t, "Hello world 你好", strlen("Hello world 你好"), 1, &ref, &err);
    bool ok = b.n == ref.n + 1 && !memcmp(b.ids, ref.ids, (size_t)ref.n * sizeof *ref.ids) && b.ids[b.n - 1] == 1;
    for (int64_t i = 0; i < b.n; i++)
        ok &= b.mask[i] == 1;
    CHECK(ok, "CPT: the text's ids, then EOS (id 1); every mask byte 1");
    char *text = NULL;
    size_t len = 0;
    CHECK(trex_data_render_line(TREX_DATA_CPT, line, strlen(line), &text, &len, &err) == TREX_OK &&
              !strcmp(text, "Hello world 你好" EOS),
          "CPT render");
    free(text);
    /* SFT line equals the API on the same messages */
    line = "{\"messages\": [{\"role\": \"user\", \"content\": \"the\"}, {\"role\": \"assistant\", \"content\": \"World\","
           " \"reasoning_content\": null}], \"extra\": 1}";
    CHECK(trex_data_encode_line(t, TREX_DATA_SFT, line, strlen(line), &b, &err) == TREX_OK && b.n == 7 &&
              b.mask[4] == 0 && b.mask[5] == 1 && b.mask[6] == 1,
          "SFT line: BOS User the Assistant </think> World EOS (n=%lld) %s", (long long)b.n, err.msg);
    trex_tokbuf_free(&b);
    trex_tokbuf_free(&ref);

    expect_line(t, TREX_DATA_SFT, "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", TREX_EINVAL,
                "messages[0]: unknown role \"tool\"");
    expect_line(t, TREX_DATA_SFT,
                "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"Assistant\", \"content\": \"y\"}]}",
                TREX_EINVAL, "messages[1]: unknown role \"Assistant\"");
    expect_line(t, TREX_DATA_SFT, "{\"messages\": []}", TREX_EINVAL, "empty sample");
    expect_line(t, TREX_DATA_SFT,
                "{\"messages\": [{\"role\": \"user\", \"content\": \"\"}, {\"role\": \"assistant\", \"content\": null}]}",
                TREX_EINVAL, "empty sample");
    expect_line(t, TREX_DATA_SFT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", TREX_EINVAL,
                "no assistant message");
    expect_line(t, TREX_DATA_SFT,
                "{\"messages\": [{\"role\": \"user\", \"content\": 5}, {\"role\": \"assistant\", \"content\": \"y\"}]}",
                TREX_EFORMAT, "messages[0]: \"content\" must be a string");
    expect_line(t, TREX_DATA_SFT,
                "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"y\","
                " \"reasoning_content\": [1]}]}",
                TREX_EFORMAT, "reasoning_content");
    expect_line(t, TREX_DATA_SFT, "{\"messages\": [{\"content\": \"x\"}]}", TREX_EFORMAT, "\"role\" is missing");
    expect_line(t, TREX_DATA_SFT, "{\"messages\": \"x\"}", TREX_EFORMAT, "must be an array");
    expect_line(t, TREX_DATA_SFT, "{\"text\": \"x\"}", TREX_EFORMAT, "no \"messages\" field");
    expect_line(t, TREX_DATA_SFT, "{\"messages\": [", TREX_EFORMAT, "not valid JSON");
    expect_line(t, TREX_DATA_SFT, "[1, 2]", TREX_EFORMAT, "JSON object");
    expect_line(t, TREX_DATA_SFT,
                "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}, {\"role\": \"assistant\", \"content\": \"y\"}]}",
                TREX_EFORMAT, "UTF-8");
    expect_line(t, TREX_DATA_CPT, "{\"text\": \"\"}", TREX_EINVAL, "empty document");
    expect_line(t, TREX_DATA_CPT, "{\"text\": 5}", TREX_EFORMAT, "must be a string");
    expect_line(t, TREX_DATA_CPT, "{\"messages\": []}", TREX_EFORMAT, "no \"text\" field");
    expect_line(t, TREX_DATA_CPT, "{\"text\": \"x\"", TREX_EFORMAT, "column");
}

/* A tokenizer without the chat tokens cannot render SFT samples. */
static void test_missing_tokens(void)
{
    FILE *f = fopen(FIXTURE, "rb");
    if (!f) {
        CHECK(0, "open %s", FIXTURE);
        return;
    }
    static char buf[1 << 16], out[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* rename <｜Assistant｜> everywhere */
    size_t k = 0;
    for (const char *p = buf; *p && k < sizeof out - 16;) {
        if (!strncmp(p, ASSISTANT, strlen(ASSISTANT))) {
            k += (size_t)snprintf(out + k, sizeof out - k, "<｜Helper｜>");
            p += strlen(ASSISTANT);
        } else {
            out[k++] = *p++;
        }
    }
    out[k] = 0;
    trex_tokenizer *t = NULL;
    trex_err err = {0};
    CHECK(trex_tok_load_mem(&t, out, k, "renamed.json", &err) == TREX_OK, "%s", err.msg);
    if (!t)
        return;
    const trex_chat_msg m[] = {{TREX_CHAT_USER, "q", NULL}, {TREX_CHAT_ASSISTANT, "a", NULL}};
    trex_tokbuf b = {0};
    CHECK(trex_chat_encode(t, m, 2, &b, &err) == TREX_EINVAL && strstr(err.msg, ASSISTANT),
          "the missing token is named: %s", err.msg);
    trex_tokbuf_free(&b);
    trex_tok_free(t);
}

int main(void)
{
    trex_tokenizer *t = NULL;
    trex_err err = {0};
    if (trex_tok_load(&t, FIXTURE, &err) != TREX_OK) {
        CHECK(0, "%s (run from the repository root)", err.msg);
        return check_summary();
    }
    test_golden(t);
    test_mask_spans(t);
    test_prompt(t);
    test_lines(t);
    test_missing_tokens();
    trex_tok_free(t);
    return check_summary();
}
