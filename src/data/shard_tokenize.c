/* data/shard_tokenize.c — the `trex data tokenize` job: JSONL (CPT or SFT) in, packed token shards
 * out. A malformed line is reported with its number and skipped, or stops the run; an SFT sample
 * longer than the sequence length is reported and skipped (CPT documents are split instead). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"

trex_code trex_data_tokenize(const trex_tokenize_opts *o, trex_tokenize_stats *st, trex_err *err)
{
    TREX_ASSERT(o && o->tokenizer_path && o->in_path && o->out_dir);
    trex_tokenize_stats s = {0};
    if (o->seq_len < 2)
        return trex_err_set(err, TREX_EINVAL, "--seq %d: the sequence length must be at least 2", o->seq_len);
    trex_tokenizer *tok = NULL;
    trex_shard_writer *w = NULL;
    trex_tokbuf buf = {0};
    td_jsonl in = {0};
    trex_code rc = trex_tok_load(&tok, o->tokenizer_path, err);
    if (rc != TREX_OK)
        goto out;
    int32_t eos = trex_tok_id(tok, "<｜end▁of▁sentence｜>");
    if (eos < 0) {
        rc = trex_err_set(err, TREX_EINVAL, "%s has no <｜end▁of▁sentence｜> token (needed to end and pad documents)",
                          o->tokenizer_path);
        goto out;
    }
    if ((rc = td_jsonl_open(&in, o->in_path, err)) != TREX_OK)
        goto out;
    trex_shard_meta meta = {o->format, o->seq_len, trex_tok_vocab_size(tok), eos, trex_tok_hash(tok)};
    if ((rc = trex_shard_writer_open(&w, o->out_dir, &meta, o->seqs_per_shard, err)) != TREX_OK)
        goto out;
    for (;;) {
        const char *line;
        size_t len;
        bool eof;
        if ((rc = td_jsonl_next(&in, &line, &len, &eof, err)) != TREX_OK)
            goto out;
        if (eof)
            break;
        s.lines++;
        trex_err lerr = {0};
        trex_code lrc = trex_data_encode_line(tok, o->format, line, len, &buf, &lerr);
        if (lrc != TREX_OK) {
            s.malformed++;
            if (o->stop_on_error) {
                rc = trex_err_set(err, lrc, "%s:%lld: %s (--on-error stop)", o->in_path, (long long)in.lineno,
                                  lerr.msg);
                goto out;
            }
            if (!o->quiet)
                fprintf(stderr, "trex data tokenize: warning: %s:%lld: %s; line skipped\n", o->in_path,
                        (long long)in.lineno, lerr.msg);
            continue;
        }
        if (o->format == TREX_DATA_SFT && buf.n > o->seq_len) {
            s.too_long++;
            if (!o->quiet)
                fprintf(stderr, "trex data tokenize: warning: %s:%lld: sample of %lld tokens is longer than --seq %d; "
                                "skipped\n", o->in_path, (long long)in.lineno, (long long)buf.n, o->seq_len);
            continue;
        }
        if ((rc = trex_shard_writer_add(w, buf.ids, buf.mask, buf.n, o->format == TREX_DATA_CPT, err)) != TREX_OK) {
            trex_err_prefix(err, "%s:%lld", o->in_path, (long long)in.lineno);
            goto out;
        }
    }
    if (s.lines - s.malformed - s.too_long == 0) {
        rc = trex_err_set(err, TREX_EINVAL, "%s: no usable %s lines (%lld lines, %lld malformed, %lld too long)",
                          o->in_path, o->format == TREX_DATA_SFT ? "SFT" : "CPT", (long long)s.lines,
                          (long long)s.malformed, (long long)s.too_long);
        goto out;
    }
    rc = trex_shard_writer_close(w, &s.shard, err);
    w = NULL;
out:
    trex_shard_writer_abort(w);
    td_jsonl_close(&in);
    trex_tokbuf_free(&buf);
    trex_tok_free(tok);
    if (st)
        *st = s;
    return rc;
}
