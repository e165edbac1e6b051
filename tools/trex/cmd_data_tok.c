/* tools/trex/cmd_data_tok.c — `trex data train-tokenizer | tokenize | encode | decode | shard-info`:
 * thin clients of trex/data.h (tokenizer, chat template, token shards). */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cmd_data_tok.h"
#include "commands.h"
#include "opts.h"
#include "trex/data.h"

static int parse(const trex_opt *opts, int argc, char **argv, trex_cmd_info *info)
{
    int rc = trex_opts_parse(opts, argc, argv, info);
    return rc == TREX_OPTS_OK ? -1 : rc == TREX_OPTS_HELP ? 0 : 2;
}

/* --- train-tokenizer ---------------------------------------------------------------------------- */

int trex_cmd_data_train_tokenizer(int argc, char **argv)
{
    int64_t vocab = 0, min_freq = 2;
    const char *in = NULL, *out = NULL;
    bool quiet = false;
    const trex_opt opts[] = {
        {"vocab", TREX_OPT_I64, &vocab, "N", "vocabulary size: special tokens + 256 bytes + merges", true},
        {"in", TREX_OPT_STR, &in, "FILE", "training texts: JSONL of {\"text\"} (CPT) or {\"messages\"} (SFT)", true},
        {"out", TREX_OPT_STR, &out, "FILE", "tokenizer.json to write", true},
        {"min-frequency", TREX_OPT_I64, &min_freq, "F", "a pair must occur F times to be merged [2]", false},
        {"quiet", TREX_OPT_FLAG, &quiet, NULL, "print nothing on success", false},
        {0}};
    trex_cmd_info info = {.usage = "trex data train-tokenizer --vocab N --in corpus.jsonl --out tokenizer.json",
                          .summary = "Trains a byte-level BPE vocabulary with the DeepSeek-V3/V4 pre-tokenizer and the "
                                     "DeepSeek-V4 special tokens (BOS id 0, EOS id 1, <｜User｜>, <｜Assistant｜>, "
                                     "<think>, </think>, ...), and writes a tokenizer.json that the Hugging Face "
                                     "tokenizers library loads. The output depends only on the input bytes."};
    int rc = parse(opts, argc, argv, &info);
    if (rc >= 0)
        return rc;
    if (vocab < 1 || vocab > INT32_MAX || min_freq < 1)
        return trex_cli_error("train-tokenizer: --vocab must be in [1, 2^31) and --min-frequency >= 1");
    if (!quiet)
        fprintf(stderr, "trex data train-tokenizer: vocab=%lld min-frequency=%lld in=%s out=%s\n", (long long)vocab,
                (long long)min_freq, in, out);
    trex_err err = {0};
    trex_tok_trainer *tr = NULL;
    trex_tok_trainer_create(&tr);
    int64_t lines = 0;
    trex_tok_train_stats st = {0};
    trex_code c = trex_tok_trainer_feed_jsonl(tr, in, &lines, &err);
    if (c == TREX_OK)
        c = trex_tok_trainer_finish(tr, (int32_t)vocab, min_freq, out, &st, &err);
    trex_tok_trainer_free(tr);
    if (c != TREX_OK)
        return trex_cli_error("train-tokenizer: %s", err.msg);
    if (!quiet) {
        printf("trex data train-tokenizer: %lld lines, %lld texts, %lld distinct words, %lld merges, vocabulary %d\n",
               (long long)lines, (long long)st.texts, (long long)st.words, (long long)st.merges, st.vocab_size);
        if (st.short_of_target)
            printf("trex data train-tokenizer: note: stopped at %d < %lld tokens: no pair occurs %lld times any more\n",
                   st.vocab_size, (long long)vocab, (long long)min_freq);
        printf("trex data train-tokenizer: wrote %s\n", out);
    }
    return 0;
}

/* --- tokenize ----------------------------------------------------------------------------------- */

int trex_cmd_data_tokenize(int argc, char **argv)
{
    const char *tokenizer = NULL, *format = NULL, *in = NULL, *out = NULL, *on_error = "skip";
    int64_t seq = 0, shard_seqs = 0;
    bool quiet = false;
    const trex_opt opts[] = {
        {"tokenizer", TREX_OPT_STR, &tokenizer, "FILE", "tokenizer.json", true},
        {"format", TREX_OPT_STR, &format, "cpt|sft", "input lines: {\"text\"} or {\"messages\"}", true},
        {"seq", TREX_OPT_I64, &seq, "N", "sequence length (tokens per packed sequence)", true},
        {"in", TREX_OPT_STR, &in, "FILE", "input JSONL", true},
        {"out", TREX_OPT_STR, &out, "DIR", "output folder (manifest.json, shard-NNNNN.bin)", true},
        {"on-error", TREX_OPT_STR, &on_error, "skip|stop", "a malformed line is skipped or stops the run [skip]",
         false},
        {"shard-seqs", TREX_OPT_I64, &shard_seqs, "K", "sequences per shard file [about 2^24 tokens]", false},
        {"quiet", TREX_OPT_FLAG, &quiet, NULL, "no per-line warnings (the summary still counts them)", false},
        {0}};
    trex_cmd_info info = {.usage = "trex data tokenize --tokenizer T --format cpt|sft --seq N --in X.jsonl --out DIR "
                                   "[--on-error skip|stop]",
                          .summary = "Tokenizes CPT documents or SFT samples (DeepSeek-V4 chat template, loss on "
                                     "assistant tokens) and packs them greedily, in input order, into sequences of N "
                                     "tokens written as shard files (docs/formats.md). An SFT sample is never split "
                                     "(longer than N: skipped with a warning); a CPT document longer than N is split."};
    int rc = parse(opts, argc, argv, &info);
    if (rc >= 0)
        return rc;
    trex_tokenize_opts o = {.tokenizer_path = tokenizer, .in_path = in, .out_dir = out, .quiet = quiet};
    if (!strcmp(format, "cpt"))
        o.format = TREX_DATA_CPT;
    else if (!strcmp(format, "sft"))
        o.format = TREX_DATA_SFT;
    else
        return trex_cli_error("tokenize: --format must be cpt or sft, not '%s'", format);
    if (!strcmp(on_error, "stop"))
        o.stop_on_error = true;
    else if (strcmp(on_error, "skip") != 0)
        return trex_cli_error("tokenize: --on-error must be skip or stop, not '%s'", on_error);
    if (seq < 2 || seq > (int64_t)1 << 30)
        return trex_cli_error("tokenize: --seq must be in [2, 2^30]");
    if (shard_seqs < 0)
        return trex_cli_error("tokenize: --shard-seqs must be >= 0 (0 = default)");
    o.seq_len = (int32_t)seq;
    o.seqs_per_shard = shard_seqs;
    fprintf(stderr, "trex data tokenize: format=%s seq=%lld tokenizer=%s in=%s out=%s on-error=%s\n", format,
            (long long)seq, tokenizer, in, out, on_error);
    trex_err err = {0};
    trex_tokenize_stats st = {0};
    trex_code c = trex_data_tokenize(&o, &st, &err);
    printf("trex data tokenize: %lld lines, %lld documents, %lld rejected (%lld malformed, %lld too long)\n",
           (long long)st.lines, (long long)st.shard.documents, (long long)(st.malformed + st.too_long),
           (long long)st.malformed, (long long)st.too_long);
    if (c != TREX_OK)
        return trex_cli_error("tokenize: %s", err.msg);
    const trex_shard_stats *s = &st.shard;
    double slots = (double)s->sequences * (double)seq;
    printf("trex data tokenize: %lld sequences of %lld, %lld tokens (%lld targets), %lld padding, fill %.2f%%\n",
           (long long)s->sequences, (long long)seq, (long long)s->tokens, (long long)s->targets,
           (long long)s->padding, slots > 0 ? 100.0 * (double)s->tokens / slots : 0.0);
    printf("trex data tokenize: %lld documents split across sequences, %lld shard files in %s\n",
           (long long)s->split_docs, (long long)s->shards, out);
    return 0;
}

/* --- encode / decode ---------------------------------------------------------------------------- */

static bool print_ids(const trex_tokbuf *b, bool tokens, const trex_tokenizer *t)
{
    for (int64_t i = 0; i < b->n; i++) {
        if (i)
            putchar(' ');
        if (tokens) {
            cJSON *s = cJSON_CreateString(trex_tok_str(t, b->ids[i]));
            char *p = cJSON_PrintUnformatted(s);
            fputs(p, stdout);
            cJSON_free(p);
            cJSON_Delete(s);
        } else {
            printf("%d", b->ids[i]);
        }
    }
    putchar('\n');
    return true;
}

/* Encodes one text; with roundtrip, checks decode(encode(text)) == text. Returns 0, or 1 on failure. */
static int encode_one(trex_tokenizer *t, const char *text, size_t len, bool tokens, bool roundtrip,
                      const char *where, trex_tokbuf *b, int64_t *mismatches)
{
    trex_err err = {0};
    trex_tokbuf_clear(b);
    if (trex_tok_encode(t, text, len, 0, b, &err) != TREX_OK)
        return trex_cli_error("encode: %s: %s", where, err.msg);
    print_ids(b, tokens, t);
    if (roundtrip) {
        char *back = NULL;
        size_t blen = 0;
        if (trex_tok_decode(t, b->ids, b->n, &back, &blen, &err) != TREX_OK)
            return trex_cli_error("encode: %s: %s", where, err.msg);
        if (blen != len || memcmp(back, text, len) != 0) {
            if (*mismatches < 10)
                fprintf(stderr, "trex: encode: %s: decode(encode(text)) differs from the text\n", where);
            (*mismatches)++;
        }
        free(back);
    }
    return 0;
}

/* One JSONL line in --format cpt|sft: its ids (trex_data_encode_line) or, with render, its text. */
static int encode_line_fmt(trex_tokenizer *t, trex_data_format fmt, bool render, const char *line, size_t len,
                           const char *in, long long lineno, trex_tokbuf *b)
{
    trex_err err = {0};
    if (render) {
        char *text = NULL;
        size_t tlen = 0;
        if (trex_data_render_line(fmt, line, len, &text, &tlen, &err) != TREX_OK)
            return trex_cli_error("encode: %s:%lld: %s", in, lineno, err.msg);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "text", text);
        char *p = cJSON_PrintUnformatted(o);
        puts(p);
        cJSON_free(p);
        cJSON_Delete(o);
        free(text);
        return 0;
    }
    if (trex_data_encode_line(t, fmt, line, len, b, &err) != TREX_OK)
        return trex_cli_error("encode: %s:%lld: %s", in, lineno, err.msg);
    print_ids(b, false, t);
    return 0;
}

int trex_cmd_data_encode(int argc, char **argv)
{
    const char *tokenizer = NULL, *in = NULL, *text = NULL, *format = "text";
    bool tokens = false, roundtrip = false, render = false;
    const trex_opt opts[] = {
        {"tokenizer", TREX_OPT_STR, &tokenizer, "FILE", "tokenizer.json", true},
        {"in", TREX_OPT_STR, &in, "FILE", "JSONL input: one output line per input line", false},
        {"text", TREX_OPT_STR, &text, "STR", "encode this text instead", false},
        {"format", TREX_OPT_STR, &format, "text|cpt|sft",
         "text: the ids of {\"text\"}; cpt: plus the closing EOS; sft: the chat template [text]", false},
        {"tokens", TREX_OPT_FLAG, &tokens, NULL, "print the tokens (JSON strings) instead of the ids", false},
        {"roundtrip", TREX_OPT_FLAG, &roundtrip, NULL, "check decode(encode(text)) == text; exit 1 if not", false},
        {"render", TREX_OPT_FLAG, &render, NULL, "cpt|sft: print the rendered text ({\"text\": ...}), not ids", false},
        {0}};
    trex_cmd_info info = {.usage = "trex data encode --tokenizer T (--in lines.jsonl | --text STR) [--format text|cpt|sft]",
                          .summary = "Prints the token ids of each text, space-separated, one line per input line. With "
                                     "--format text no BOS or EOS is added (special-token strings in the text become "
                                     "those tokens); cpt and sft encode lines as `trex data tokenize` does."};
    int rc = parse(opts, argc, argv, &info);
    if (rc >= 0)
        return rc;
    if (!in == !text)
        return trex_cli_error("encode: give exactly one of --in FILE and --text STR");
    bool plain = !strcmp(format, "text");
    trex_data_format fmt = !strcmp(format, "sft") ? TREX_DATA_SFT : TREX_DATA_CPT;
    if (!plain && strcmp(format, "cpt") && strcmp(format, "sft"))
        return trex_cli_error("encode: --format must be text, cpt or sft, not '%s'", format);
    if (!plain && (text || tokens || roundtrip))
        return trex_cli_error("encode: --format %s reads --in lines and prints ids (no --text, --tokens, --roundtrip)",
                              format);
    if (plain && render)
        return trex_cli_error("encode: --render needs --format cpt or sft");
    trex_err err = {0};
    trex_tokenizer *t = NULL;
    if (trex_tok_load(&t, tokenizer, &err) != TREX_OK)
        return trex_cli_error("encode: %s", err.msg);
    trex_tokbuf b = {0};
    int64_t mism = 0;
    int status = 0;
    if (text) {
        status = encode_one(t, text, strlen(text), tokens, roundtrip, "--text", &b, &mism);
    } else {
        FILE *f = fopen(in, "rb");
        if (!f) {
            status = trex_cli_error("encode: cannot open %s", in);
        } else {
            char *line = NULL;
            size_t cap = 0;
            ssize_t n;
            long long lineno = 0;
            while (status == 0 && (n = getline(&line, &cap, f)) >= 0) {
                lineno++;
                while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
                    line[--n] = 0;
                if (!plain) {
                    status = encode_line_fmt(t, fmt, render, line, (size_t)n, in, lineno, &b);
                    continue;
                }
                char where[64];
                snprintf(where, sizeof where, "line %lld", lineno);
                cJSON *j = cJSON_ParseWithLength(line, (size_t)n);
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(j, "text");
                if (!cJSON_IsString(tx))
                    status = trex_cli_error("encode: %s:%lld: expected {\"text\": \"...\"}", in, lineno);
                else
                    status = encode_one(t, tx->valuestring, strlen(tx->valuestring), tokens, roundtrip, where, &b,
                                        &mism);
                cJSON_Delete(j);
            }
            free(line);
            fclose(f);
        }
    }
    trex_tokbuf_free(&b);
    trex_tok_free(t);
    if (status == 0 && mism > 0)
        status = trex_cli_error("encode: %lld texts do not survive decode(encode(text))", (long long)mism);
    return status;
}

int trex_cmd_data_decode(int argc, char **argv)
{
    const char *tokenizer = NULL, *in = NULL;
    const trex_opt opts[] = {{"tokenizer", TREX_OPT_STR, &tokenizer, "FILE", "tokenizer.json", true},
                             {"in", TREX_OPT_STR, &in, "FILE", "lines of space-separated ids", true},
                             {0}};
    trex_cmd_info info = {.usage = "trex data decode --tokenizer T --in ids.txt",
                          .summary = "Prints each line of ids decoded, as a JSON string, one line per input line."};
    int rc = parse(opts, argc, argv, &info);
    if (rc >= 0)
        return rc;
    trex_err err = {0};
    trex_tokenizer *t = NULL;
    if (trex_tok_load(&t, tokenizer, &err) != TREX_OK)
        return trex_cli_error("decode: %s", err.msg);
    FILE *f = fopen(in, "rb");
    if (!f) {
        trex_tok_free(t);
        return trex_cli_error("decode: cannot open %s", in);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long long lineno = 0;
    int status = 0;
    int32_t *ids = NULL;
    size_t idcap = 0;
    while (status == 0 && (n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t nid = 0;
        char *p = line;
        for (;;) {
            while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
                p++;
            if (!*p)
                break;
            char *end;
            long long v = strtoll(p, &end, 10);
            if (end == p || v < 0 || v > INT32_MAX) {
                status = trex_cli_error("decode: %s:%lld: expected space-separated token ids", in, lineno);
                break;
            }
            if (nid == idcap) {
                idcap = idcap ? 2 * idcap : 64;
                int32_t *q = realloc(ids, idcap * sizeof *ids);
                if (!q) {
                    status = trex_cli_error("decode: out of memory");
                    break;
                }
                ids = q;
            }
            ids[nid++] = (int32_t)v;
            p = end;
        }
        if (status)
            break;
        char *s = NULL;
        size_t len = 0;
        if (trex_tok_decode(t, ids, (int64_t)nid, &s, &len, &err) != TREX_OK) {
            status = trex_cli_error("decode: %s:%lld: %s", in, lineno, err.msg);
            break;
        }
        cJSON *js = cJSON_CreateString(s);
        char *out = cJSON_PrintUnformatted(js);
        puts(out);
        cJSON_free(out);
        cJSON_Delete(js);
        free(s);
    }
    free(ids);
    free(line);
    fclose(f);
    trex_tok_free(t);
    return status;
}

/* --- shard-info --------------------------------------------------------------------------------- */

int trex_cmd_data_shard_info(int argc, char **argv)
{
    const char *tokenizer = NULL;
    int64_t dump = 0;
    const trex_opt opts[] = {
        {"tokenizer", TREX_OPT_STR, &tokenizer, "FILE", "check that the shards were made with this tokenizer", false},
        {"dump", TREX_OPT_I64, &dump, "N", "print the first N sequences (tokens, mask, document ids)", false},
        {0}};
    trex_cmd_info info = {.usage = "trex data shard-info DIR [--tokenizer T] [--dump N]",
                          .summary = "Opens a shard folder written by `trex data tokenize`, checks every file, and "
                                     "prints its header; --dump prints sequences as the trainer reads them.",
                          .max_positional = 1};
    int rc = parse(opts, argc, argv, &info);
    if (rc >= 0)
        return rc;
    if (info.npositional != 1)
        return trex_cli_error("shard-info: give the shard folder");
    if (dump < 0)
        return trex_cli_error("shard-info: --dump must be >= 0");
    const char *dir = info.positional[0];
    trex_err err = {0};
    trex_tokenizer *t = NULL;
    if (tokenizer && trex_tok_load(&t, tokenizer, &err) != TREX_OK)
        return trex_cli_error("shard-info: %s", err.msg);
    trex_shard_reader *r = NULL;
    if (trex_shard_open(&r, dir, t, &err) != TREX_OK) {
        trex_tok_free(t);
        return trex_cli_error("shard-info: %s", err.msg);
    }
    const trex_shard_info *si = trex_shard_reader_info(r);
    printf("%s: %s, %lld sequences of %d, %lld documents, %lld tokens, %d shard files\n", dir,
           si->meta.format == TREX_DATA_SFT ? "sft" : "cpt", (long long)si->n_seqs, si->meta.seq_len,
           (long long)si->n_docs, (long long)si->n_tokens, si->nshards);
    printf("%s: vocabulary %d, pad id %d, tokenizer fnv1a64:%016" PRIx64 "%s\n", dir, si->meta.vocab_size,
           si->meta.pad_id, si->meta.tokenizer_hash, t ? " (matches --tokenizer)" : "");
    int32_t L = si->meta.seq_len;
    int32_t *tok = malloc((size_t)L * sizeof *tok), *doc = malloc((size_t)L * sizeof *doc);
    uint8_t *mask = malloc((size_t)L);
    int status = 0;
    for (int64_t i = 0; i < dump && i < si->n_seqs && tok && doc && mask; i++) {
        if (trex_shard_read(r, i, tok, mask, doc, &err) != TREX_OK) {
            status = trex_cli_error("shard-info: %s", err.msg);
            break;
        }
        printf("seq %lld tokens:", (long long)i);
        for (int32_t k = 0; k < L; k++)
            printf(" %d", tok[k]);
        printf("\nseq %lld mask:  ", (long long)i);
        for (int32_t k = 0; k < L; k++)
            printf(" %d", mask[k]);
        printf("\nseq %lld docs:  ", (long long)i);
        for (int32_t k = 0; k < L; k++)
            printf(" %d", doc[k]);
        printf("\n");
    }
    if (dump > 0 && (!tok || !doc || !mask))
        status = trex_cli_error("shard-info: out of memory");
    free(tok);
    free(doc);
    free(mask);
    trex_shard_close(r);
    trex_tok_free(t);
    return status;
}
