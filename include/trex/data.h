/* trex/data.h — text data for training: a byte-level BPE tokenizer that reads Hugging Face
 * tokenizer.json files (and trains new ones), the DeepSeek-V4 chat template with loss masks, and
 * token shards (packing, writing, reading).
 *
 * Ownership: `*_load` / `*_open` / `*_create` return objects freed by the matching `*_free` /
 * `*_close`; strings returned through `char **out` are malloc'ed and freed by the caller. Errors: bad
 * input (a tokenizer file, a JSONL line, a shard) returns a trex_code and one line in err naming the
 * file (and line or field) and what to do. Allocation failures abort with a message.
 *
 * Threads: a trex_tokenizer keeps a word cache and regex work space, so encode calls on one object
 * must not run concurrently (load one per thread). Decoding and the lookups are read-only. */
#ifndef TREX_DATA_H
#define TREX_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trex/status.h"

/* --- token buffers ------------------------------------------------------------------------------ */

/* A growable run of token ids with one loss-mask byte per token (1 = target: the model is trained to
 * predict it; 0 = context). Zero-initialise before first use. */
typedef struct trex_tokbuf {
    int32_t *ids;
    uint8_t *mask;
    int64_t n, cap;
} trex_tokbuf;

void trex_tokbuf_clear(trex_tokbuf *b); /* n = 0; keeps the memory */
void trex_tokbuf_free(trex_tokbuf *b);  /* frees and zeroes */

/* --- tokenizer ---------------------------------------------------------------------------------- */

/* The subset of tokenizer.json that trex reads (anything else is refused with TREX_EUNSUPPORTED,
 * naming the field):
 *   model: BPE with vocab and merges (either "a b" strings or ["a", "b"] pairs), optional unk_token,
 *          fuse_unk, ignore_merges; no dropout, subword prefix/suffix or byte_fallback;
 *   normalizer: null or an empty Sequence;
 *   pre_tokenizer: ByteLevel, or a Sequence of Split (Regex or String pattern, behavior Isolated,
 *          not inverted) ending with ByteLevel (add_prefix_space and use_regex honoured);
 *   added_tokens: matched before pre-tokenization, leftmost-longest, the non-normalized ones first;
 *          lstrip / rstrip honoured, single_word refused;
 *   decoder: ByteLevel; post_processor: ignored (encode never adds BOS/EOS by itself).
 * Encoding gives the ids of the Hugging Face library's `encode(text, add_special_tokens=False)`. */
typedef struct trex_tokenizer trex_tokenizer;

trex_code trex_tok_load(trex_tokenizer **out, const char *path, trex_err *err);
/* Same from memory; `name` is used in messages. The hash is over json[0..len). */
trex_code trex_tok_load_mem(trex_tokenizer **out, const char *json, size_t len, const char *name,
                            trex_err *err);
void trex_tok_free(trex_tokenizer *t);

/* One more than the largest id in the vocabulary or the added tokens (ids may have holes). */
int32_t trex_tok_vocab_size(const trex_tokenizer *t);
/* FNV-1a 64 of the bytes of the tokenizer.json the tokenizer was loaded from (shards record it). */
uint64_t trex_tok_hash(const trex_tokenizer *t);
/* Id of a token given in tokenizer.json form (an added token's content, or a vocabulary string in
 * byte-level form); -1 when there is none. Added tokens win over vocabulary entries. */
int32_t trex_tok_id(const trex_tokenizer *t, const char *token);
/* The tokenizer.json form of id (NUL-terminated), or NULL for an id outside the vocabulary. */
const char *trex_tok_str(const trex_tokenizer *t, int32_t id);
/* True when id is an added token (special or not). */
bool trex_tok_is_added(const trex_tokenizer *t, int32_t id);

/* Appends the ids of text[0..len) to out, each with loss-mask byte `mask`. The text must be valid
 * UTF-8 (TREX_EFORMAT with the byte offset otherwise). Added tokens (e.g. <｜User｜>) found in the
 * text are encoded as themselves, as the Hugging Face library does. */
trex_code trex_tok_encode(trex_tokenizer *t, const char *text, size_t len, uint8_t mask, trex_tokbuf *out,
                          trex_err *err);
/* The bytes of ids[0..n) (byte-level decoding; added tokens decode to their content). *out is
 * NUL-terminated, *len excludes the NUL. The bytes are returned as they are: a cut in the middle of
 * a multi-byte character is not replaced by U+FFFD. An id outside the vocabulary is TREX_ERANGE. */
trex_code trex_tok_decode(const trex_tokenizer *t, const int32_t *ids, int64_t n, char **out, size_t *len,
                          trex_err *err);

/* --- tokenizer training ------------------------------------------------------------------------- */

/* Trains a byte-level BPE vocabulary with the DeepSeek-V3/V4 pre-tokenizer and writes a
 * tokenizer.json that the Hugging Face library loads. Ids: the DeepSeek-V4 special tokens first
 * (<｜begin▁of▁sentence｜> 0, <｜end▁of▁sentence｜> 1, <｜User｜>, <｜Assistant｜>, <think>, </think>,
 * ... in the order of docs/tokenizer.md), then the 256 bytes in byte order, then one token per merge.
 * Each step merges the most frequent adjacent pair (ties: lower left id, then lower right id), so the
 * output is a function of the input bytes only. */
typedef struct trex_tok_trainer trex_tok_trainer;

typedef struct trex_tok_train_stats {
    int64_t texts;     /* texts fed */
    int64_t words;     /* distinct pre-token words */
    int64_t merges;    /* merges learned */
    int32_t vocab_size;
    bool short_of_target; /* stopped before vocab_size: no pair reached min_frequency */
} trex_tok_train_stats;

void trex_tok_trainer_create(trex_tok_trainer **out);
void trex_tok_trainer_free(trex_tok_trainer *tr);
/* Adds one text (valid UTF-8; special-token strings inside it are cut out, not learned). */
trex_code trex_tok_trainer_feed(trex_tok_trainer *tr, const char *text, size_t len, trex_err *err);
/* Adds every text of a JSONL file: {"text": ...} lines (CPT) and {"messages": [...]} lines (SFT: the
 * content and reasoning_content of each message). A malformed line is an error naming file:line. */
trex_code trex_tok_trainer_feed_jsonl(trex_tok_trainer *tr, const char *path, int64_t *lines, trex_err *err);
/* Learns merges until the vocabulary holds vocab_size tokens (specials + 256 bytes + merges) or no
 * pair occurs min_frequency times, and writes the tokenizer.json to path (atomically). */
trex_code trex_tok_trainer_finish(trex_tok_trainer *tr, int32_t vocab_size, int64_t min_frequency,
                                  const char *path, trex_tok_train_stats *st, trex_err *err);

/* --- chat template and samples (DeepSeek-V4) ---------------------------------------------------- */

typedef enum trex_chat_role { TREX_CHAT_SYSTEM = 0, TREX_CHAT_USER, TREX_CHAT_ASSISTANT } trex_chat_role;

typedef struct trex_chat_msg {
    trex_chat_role role;
    const char *content;   /* NULL reads as "" */
    const char *reasoning; /* reasoning_content; NULL when absent (assistant messages only) */
} trex_chat_msg;

/* How a generation prompt ends after the last user message: with <｜Assistant｜> alone (the model
 * chooses the mode), with <｜Assistant｜></think> (chat mode) or with <｜Assistant｜><think>
 * (thinking mode), the last two as DeepSeek's encoding_dsv4.py writes them. */
typedef enum trex_chat_gen { TREX_CHAT_GEN_OPEN = 0, TREX_CHAT_GEN_CHAT, TREX_CHAT_GEN_THINK } trex_chat_gen;

/* The DeepSeek-V4 rendering of an SFT sample (see docs/formats.md for the exact layout):
 *   BOS, then each message in order:
 *     system:    {content}
 *     user:      <｜User｜>{content}, then, when the next message is an assistant one or this is the
 *                last message, <｜Assistant｜> and the mode token: <think> when the next message is an
 *                assistant message after the last user message that has reasoning_content, else </think>;
 *     assistant: {reasoning}</think>{content}<｜end▁of▁sentence｜> when it follows the last user message
 *                and has reasoning_content, else {content}<｜end▁of▁sentence｜> (the reasoning of turns
 *                before the last user message is dropped).
 * The loss mask is 1 exactly on the assistant messages' tokens (reasoning, the closing </think>,
 * content, EOS); <｜Assistant｜> and the mode token after it belong to the prompt.
 * Errors: no messages, or no assistant message (nothing to train on): TREX_EINVAL. */
trex_code trex_chat_render(const trex_chat_msg *msgs, int n, char **text, size_t *len, trex_err *err);
trex_code trex_chat_encode(trex_tokenizer *t, const trex_chat_msg *msgs, int n, trex_tokbuf *out,
                           trex_err *err);
/* A generation prompt: msgs (which must end with a user message) rendered as above, then
 * <｜Assistant｜> and, per gen, the mode token. Every mask byte is 0. */
trex_code trex_chat_encode_prompt(trex_tokenizer *t, const trex_chat_msg *msgs, int n, trex_chat_gen gen,
                                  trex_tokbuf *out, trex_err *err);

typedef enum trex_data_format { TREX_DATA_CPT = 0, TREX_DATA_SFT = 1 } trex_data_format;

/* Encodes one JSONL line into out (cleared first):
 *   CPT {"text": "..."}: the text's tokens, then <｜end▁of▁sentence｜>; mask 1 everywhere (the EOS is a
 *       target of its document);
 *   SFT {"messages": [{"role": "system"|"user"|"assistant", "content": ..., "reasoning_content": ...}]}:
 *       trex_chat_encode.
 * Errors (TREX_EFORMAT / TREX_EINVAL) describe the problem without a file or line (the caller adds
 * them): bad JSON, a missing or mistyped field, an unknown role, an empty sample, invalid UTF-8. */
trex_code trex_data_encode_line(trex_tokenizer *t, trex_data_format fmt, const char *line, size_t len,
                                trex_tokbuf *out, trex_err *err);

/* The text trex_data_encode_line encodes, as one string: the CPT text followed by
 * <｜end▁of▁sentence｜>, or the rendered SFT sample (trex_chat_render). For inspection and tests. */
trex_code trex_data_render_line(trex_data_format fmt, const char *line, size_t len, char **text, size_t *tlen,
                                trex_err *err);

/* --- token shards ------------------------------------------------------------------------------- */

/* A shard folder (docs/formats.md): manifest.json plus shard-00000.bin, shard-00001.bin, ... Each
 * .bin holds fixed-length sequences: u32 tokens, loss-mask bits and document-start bits. */
typedef struct trex_shard_meta {
    trex_data_format format;
    int32_t seq_len;
    int32_t vocab_size;
    int32_t pad_id;          /* the EOS id: padding tokens (mask 0, a document of their own) */
    uint64_t tokenizer_hash; /* trex_tok_hash of the tokenizer that made the tokens */
} trex_shard_meta;

typedef struct trex_shard_stats {
    int64_t documents;   /* documents added */
    int64_t split_docs;  /* CPT documents longer than seq_len, cut into pieces */
    int64_t pieces;      /* document pieces written (documents + extra pieces of split ones) */
    int64_t sequences;
    int64_t tokens;      /* non-padding tokens */
    int64_t targets;     /* tokens with mask 1 */
    int64_t padding;
    int64_t shards;
} trex_shard_stats;

/* Greedy packing in input order into sequences of seq_len tokens:
 *   - a document that fits in a sequence is never split: when it does not fit in what is left of the
 *     current sequence, that sequence is padded and the document starts the next one;
 *   - a document longer than seq_len is refused (TREX_ERANGE, nothing written) unless `splittable`
 *     (CPT), in which case it fills the rest of the current sequence, then whole sequences, and its
 *     tail stays open for the next documents;
 *   - padding is pad_id with mask 0, as one extra document at the end of the sequence.
 * Shard files are written under temporary names and renamed; manifest.json is written last, so a
 * killed run leaves complete shard files and no manifest. */
typedef struct trex_shard_writer trex_shard_writer;

/* dir is created when missing; it must not already hold shards. seqs_per_shard 0 picks about
 * 2^24 tokens per file. */
trex_code trex_shard_writer_open(trex_shard_writer **out, const char *dir, const trex_shard_meta *meta,
                                 int64_t seqs_per_shard, trex_err *err);
trex_code trex_shard_writer_add(trex_shard_writer *w, const int32_t *ids, const uint8_t *mask, int64_t n,
                                bool splittable, trex_err *err);
/* Pads and writes what is pending, writes manifest.json, frees w (also on failure). st may be NULL. */
trex_code trex_shard_writer_close(trex_shard_writer *w, trex_shard_stats *st, trex_err *err);
/* Drops what is pending (no manifest is written) and frees w; NULL is a no-op. */
void trex_shard_writer_abort(trex_shard_writer *w);

/* The whole `trex data tokenize` job: JSONL in, shards out. */
typedef struct trex_tokenize_opts {
    const char *tokenizer_path;
    const char *in_path;
    const char *out_dir;
    trex_data_format format;
    int32_t seq_len;
    bool stop_on_error;     /* a malformed line stops the run (else it is reported and skipped) */
    int64_t seqs_per_shard; /* 0: default */
    bool quiet;             /* no per-line warnings on stderr */
} trex_tokenize_opts;

typedef struct trex_tokenize_stats {
    int64_t lines;          /* non-blank input lines */
    int64_t malformed;      /* rejected: bad JSON, bad fields, unknown role, empty sample */
    int64_t too_long;       /* rejected: SFT samples longer than seq_len */
    trex_shard_stats shard;
} trex_tokenize_stats;

trex_code trex_data_tokenize(const trex_tokenize_opts *o, trex_tokenize_stats *st, trex_err *err);

/* Reading shards for training. Sequences are numbered 0..n_seqs-1 across the files in order; the
 * position is the number of the next sequence trex_shard_next returns (save it to resume). A reader
 * holds a read buffer: one reader per thread. */
typedef struct trex_shard_reader trex_shard_reader;

typedef struct trex_shard_info {
    trex_shard_meta meta;
    int64_t n_seqs;   /* sequences */
    int64_t n_docs;   /* document pieces (a split CPT document counts once per piece; padding not counted) */
    int64_t n_tokens; /* non-padding tokens */
    int nshards;
} trex_shard_info;

/* Opens the shard folder dir. When tok is not NULL, the shards must have been made by that tokenizer
 * (same tokenizer.json bytes): otherwise TREX_EINVAL naming both hashes. */
trex_code trex_shard_open(trex_shard_reader **out, const char *dir, const trex_tokenizer *tok, trex_err *err);
void trex_shard_close(trex_shard_reader *r);
const trex_shard_info *trex_shard_reader_info(const trex_shard_reader *r);
/* Sequence `index` into caller arrays of seq_len elements each, ready for the model: tokens (I32),
 * loss mask (U8, 1 = target) and document ids (I32, numbered 0, 1, ... within the sequence; the
 * padding is the last document). Any output pointer may be NULL. */
trex_code trex_shard_read(trex_shard_reader *r, int64_t index, int32_t *tokens, uint8_t *mask,
                          int32_t *doc_ids, trex_err *err);
/* The sequence at the position, then position + 1; *eof (nothing read) after the last one. */
trex_code trex_shard_next(trex_shard_reader *r, int32_t *tokens, uint8_t *mask, int32_t *doc_ids, bool *eof,
                          trex_err *err);
int64_t trex_shard_tell(const trex_shard_reader *r);
trex_code trex_shard_seek(trex_shard_reader *r, int64_t position, trex_err *err);

#endif
