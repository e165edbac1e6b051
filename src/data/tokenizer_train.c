/* data/tokenizer_train.c — training a byte-level BPE vocabulary and writing it as tokenizer.json.
 *
 * Texts are cut at the DeepSeek-V4 special-token strings, pre-tokenized with the DeepSeek-V3 Split
 * regexes (the same code the encoder runs), and counted as words (distinct byte strings). Each word
 * starts as one symbol per byte. A merge step takes the adjacent pair with the highest count (ties:
 * lower left id, then lower right id), gives the concatenation a token id (a new one, or the existing
 * id when another merge already made the same bytes), and rewrites every word that holds the pair,
 * updating the counts of the neighbouring pairs incrementally. A max-heap with lazy entries finds the
 * best pair: an entry whose count is out of date is re-pushed with the current count when popped, and
 * every count that grows in a step is pushed again at the end of the step. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "data/data_internal.h"
#include "trex/io.h"

typedef struct word_slot {
    uint64_t hash; /* 0 = empty */
    int64_t off;   /* bytes in pool */
    uint32_t len;
    int64_t count;
} word_slot;

struct trex_tok_trainer {
    td_pretok pre;
    word_slot *slots;
    uint64_t mask;
    int64_t nwords;
    char *pool;
    int64_t pool_len, pool_cap;
    int64_t texts;
    bool special_first[256]; /* bytes that start a special token */
};

/* --- counting ----------------------------------------------------------------------------------- */

static uint64_t bytes_hash(const void *p, size_t n)
{
    return td_mix64(td_fnv1a(p, n, TD_FNV_OFFSET)) | 1;
}

static void word_table_grow(trex_tok_trainer *tr)
{
    uint64_t cap = (tr->mask + 1) * 2;
    word_slot *s = trex_xcalloc(cap, sizeof *s);
    for (uint64_t i = 0; i <= tr->mask; i++) {
        if (!tr->slots[i].hash)
            continue;
        uint64_t j = tr->slots[i].hash & (cap - 1);
        while (s[j].hash)
            j = (j + 1) & (cap - 1);
        s[j] = tr->slots[i];
    }
    free(tr->slots);
    tr->slots = s;
    tr->mask = cap - 1;
}

static void add_word(trex_tok_trainer *tr, const char *w, size_t n)
{
    uint64_t h = bytes_hash(w, n), i = h & tr->mask;
    while (tr->slots[i].hash) {
        word_slot *s = &tr->slots[i];
        if (s->hash == h && s->len == n && !memcmp(tr->pool + s->off, w, n)) {
            s->count++;
            return;
        }
        i = (i + 1) & tr->mask;
    }
    td_grow((void **)&tr->pool, &tr->pool_cap, tr->pool_len + (int64_t)n, 1);
    memcpy(tr->pool + tr->pool_len, w, n);
    tr->slots[i] = (word_slot){h, tr->pool_len, (uint32_t)n, 1};
    tr->pool_len += (int64_t)n;
    if (++tr->nwords * 2 > (int64_t)tr->mask)
        word_table_grow(tr);
}

void trex_tok_trainer_create(trex_tok_trainer **out)
{
    trex_tok_trainer *tr = trex_xcalloc(1, sizeof *tr);
    td_pretok_init(&tr->pre);
    for (int i = 0; i < 3; i++) {
        trex_err e = {0};
        if (td_pretok_add(&tr->pre, td_deepseek_split_patterns[i], "built-in DeepSeek pre-tokenizer", &e) != TREX_OK)
            TREX_ABORT("%s", e.msg); /* a fixed pattern that does not compile is a bug */
    }
    tr->mask = 1023;
    tr->slots = trex_xcalloc(tr->mask + 1, sizeof *tr->slots);
    for (int i = 0; i < td_v4_nspecials; i++)
        tr->special_first[(unsigned char)td_v4_specials[i].content[0]] = true;
    *out = tr;
}

void trex_tok_trainer_free(trex_tok_trainer *tr)
{
    if (!tr)
        return;
    td_pretok_free(&tr->pre);
    free(tr->slots);
    free(tr->pool);
    free(tr);
}

static trex_code feed_span(trex_tok_trainer *tr, const char *text, size_t len, trex_err *err)
{
    if (len == 0)
        return TREX_OK;
    TREX_TRY(td_pretok_split(&tr->pre, text, len, err));
    for (int64_t k = 0; k < tr->pre.a.n; k++)
        add_word(tr, text + tr->pre.a.v[k].off, tr->pre.a.v[k].len);
    return TREX_OK;
}

trex_code trex_tok_trainer_feed(trex_tok_trainer *tr, const char *text, size_t len, trex_err *err)
{
    size_t bad = 0;
    if (!td_utf8_valid(text, len, &bad))
        return trex_err_set(err, TREX_EFORMAT, "text is not valid UTF-8 (byte offset %zu)", bad);
    tr->texts++;
    size_t last = 0, pos = 0;
    while (pos < len) {
        size_t hit = 0;
        if (!tr->special_first[(unsigned char)text[pos]]) {
            pos++;
            continue;
        }
        for (int i = 0; i < td_v4_nspecials; i++) {
            size_t n = strlen(td_v4_specials[i].content);
            if (n > hit && n <= len - pos && !memcmp(text + pos, td_v4_specials[i].content, n))
                hit = n;
        }
        if (!hit) {
            pos++;
            continue;
        }
        TREX_TRY(feed_span(tr, text + last, pos - last, err));
        last = pos = pos + hit;
    }
    return feed_span(tr, text + last, len - last, err);
}

static trex_code feed_json_string(trex_tok_trainer *tr, const cJSON *v, const char *path, int64_t lineno,
                                  const char *field, trex_err *err)
{
    if (!v || cJSON_IsNull(v))
        return TREX_OK;
    if (!cJSON_IsString(v))
        return trex_err_set(err, TREX_EFORMAT, "%s:%lld: %s must be a string", path, (long long)lineno, field);
    trex_code rc = trex_tok_trainer_feed(tr, v->valuestring, strlen(v->valuestring), err);
    if (rc != TREX_OK)
        trex_err_prefix(err, "%s:%lld: %s", path, (long long)lineno, field);
    return rc;
}

trex_code trex_tok_trainer_feed_jsonl(trex_tok_trainer *tr, const char *path, int64_t *lines, trex_err *err)
{
    td_jsonl r;
    TREX_TRY(td_jsonl_open(&r, path, err));
    trex_code rc = TREX_OK;
    int64_t n = 0;
    for (;;) {
        const char *line;
        size_t len;
        bool eof;
        if ((rc = td_jsonl_next(&r, &line, &len, &eof, err)) != TREX_OK || eof)
            break;
        n++;
        cJSON *j = cJSON_ParseWithLength(line, len);
        if (!j || !cJSON_IsObject(j)) {
            cJSON_Delete(j);
            rc = trex_err_set(err, TREX_EFORMAT, "%s:%lld: not a JSON object", path, (long long)r.lineno);
            break;
        }
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
        if (cJSON_IsString(text)) {
            rc = feed_json_string(tr, text, path, r.lineno, "text", err);
        } else if (cJSON_IsArray(msgs)) {
            int k = 0;
            for (const cJSON *m = msgs->child; m && rc == TREX_OK; m = m->next, k++) {
                char field[64];
                if (!cJSON_IsObject(m)) {
                    rc = trex_err_set(err, TREX_EFORMAT, "%s:%lld: messages[%d] must be an object", path,
                                      (long long)r.lineno, k);
                    break;
                }
                snprintf(field, sizeof field, "messages[%d].content", k);
                rc = feed_json_string(tr, cJSON_GetObjectItemCaseSensitive(m, "content"), path, r.lineno, field, err);
                if (rc != TREX_OK)
                    break;
                snprintf(field, sizeof field, "messages[%d].reasoning_content", k);
                rc = feed_json_string(tr, cJSON_GetObjectItemCaseSensitive(m, "reasoning_content"), path, r.lineno,
                                      field, err);
            }
        } else {
            rc = trex_err_set(err, TREX_EFORMAT,
                              "%s:%lld: expected {\"text\": \"...\"} (CPT) or {\"messages\": [...]} (SFT)", path,
                              (long long)r.lineno);
        }
        cJSON_Delete(j);
        if (rc != TREX_OK)
            break;
    }
    td_jsonl_close(&r);
    if (lines)
        *lines = n;
    return rc;
}

/* --- merging ------------------------------------------------------------------------------------ */

typedef struct pair_rec {
    int32_t a, b;
    int64_t count;
    int32_t *occ; /* words holding the pair (may repeat, may be stale) */
    int64_t nocc, cap;
    int64_t grown_at; /* step at which the count last grew (for re-pushing) */
    bool blocked;
} pair_rec;

typedef struct heap_ent {
    int64_t count;
    int32_t a, b;
} heap_ent;

typedef struct merger {
    /* words */
    int32_t *sym;     /* all words' symbols */
    int64_t *woff;    /* start of word w in sym */
    int32_t *wlen;
    int64_t *wfreq;
    int64_t *wstamp;
    int64_t nw;
    /* tokens: raw bytes of each id */
    char *tpool;
    int64_t tpool_len, tpool_cap;
    int64_t *toff;
    int32_t *tlen;
    int64_t ntok, tcap;
    /* bytes -> id (merged tokens and the specials' byte strings) */
    int32_t *tmap;
    uint64_t tmask;
    /* pairs */
    pair_rec *pairs;
    int64_t npairs, pcap;
    int64_t *pmap; /* index into pairs, -1 empty */
    uint64_t pmask;
    heap_ent *heap;
    int64_t nheap, hcap;
    int32_t *grown; /* pairs whose count grew in this step */
    int64_t ngrown, gcap;
    /* merges made, in rank order */
    int32_t (*merge)[2];
    int64_t nmerges, mcap;
} merger;

static bool heap_better(const heap_ent *x, const heap_ent *y)
{
    if (x->count != y->count)
        return x->count > y->count;
    if (x->a != y->a)
        return x->a < y->a;
    return x->b < y->b;
}

static void hpush(merger *m, heap_ent e)
{
    td_grow((void **)&m->heap, &m->hcap, m->nheap + 1, sizeof *m->heap);
    int64_t i = m->nheap++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!heap_better(&e, &m->heap[p]))
            break;
        m->heap[i] = m->heap[p];
        i = p;
    }
    m->heap[i] = e;
}

static heap_ent hpop(merger *m)
{
    heap_ent top = m->heap[0], last = m->heap[--m->nheap];
    int64_t i = 0, n = m->nheap;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_better(&m->heap[c + 1], &m->heap[c]))
            c++;
        if (!heap_better(&m->heap[c], &last))
            break;
        m->heap[i] = m->heap[c];
        i = c;
    }
    if (n > 0)
        m->heap[i] = last;
    return top;
}

static void pmap_grow(merger *m)
{
    uint64_t cap = m->pmask ? (m->pmask + 1) * 2 : 1024;
    int64_t *nm = trex_xmalloc(cap * sizeof *nm);
    for (uint64_t i = 0; i < cap; i++)
        nm[i] = -1;
    for (int64_t p = 0; p < m->npairs; p++) {
        uint64_t key = ((uint64_t)(uint32_t)m->pairs[p].a << 32) | (uint32_t)m->pairs[p].b;
        uint64_t i = td_mix64(key) & (cap - 1);
        while (nm[i] >= 0)
            i = (i + 1) & (cap - 1);
        nm[i] = p;
    }
    free(m->pmap);
    m->pmap = nm;
    m->pmask = cap - 1;
}

/* Index of pair (a, b), created with count 0 when missing. */
static int64_t pair_get(merger *m, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t i = td_mix64(key) & m->pmask;
    for (;;) {
        int64_t p = m->pmap[i];
        if (p < 0)
            break;
        if (m->pairs[p].a == a && m->pairs[p].b == b)
            return p;
        i = (i + 1) & m->pmask;
    }
    td_grow((void **)&m->pairs, &m->pcap, m->npairs + 1, sizeof *m->pairs);
    int64_t p = m->npairs++;
    m->pairs[p] = (pair_rec){.a = a, .b = b, .grown_at = -1};
    m->pmap[i] = p;
    if ((uint64_t)m->npairs * 2 > m->pmask)
        pmap_grow(m);
    return p;
}

static void pair_add(merger *m, int32_t a, int32_t b, int64_t delta, int32_t w, int64_t step)
{
    int64_t p = pair_get(m, a, b);
    pair_rec *r = &m->pairs[p];
    r->count += delta;
    TREX_ASSERT(r->count >= 0);
    if (delta > 0) {
        td_grow((void **)&r->occ, &r->cap, r->nocc + 1, sizeof *r->occ);
        r->occ[r->nocc++] = w;
        if (r->grown_at != step) {
            r->grown_at = step;
            td_grow((void **)&m->grown, &m->gcap, m->ngrown + 1, sizeof *m->grown);
            m->grown[m->ngrown++] = (int32_t)p;
        }
    }
}

static int32_t tmap_find(const merger *m, const char *s, size_t n, uint64_t *slot)
{
    uint64_t i = bytes_hash(s, n) & m->tmask;
    for (;;) {
        int32_t id = m->tmap[i];
        if (id < 0) {
            *slot = i;
            return -1;
        }
        if ((size_t)m->tlen[id] == n && !memcmp(m->tpool + m->toff[id], s, n))
            return id;
        i = (i + 1) & m->tmask;
    }
}

static void tmap_grow(merger *m)
{
    uint64_t cap = (m->tmask + 1) * 2;
    int32_t *nm = trex_xmalloc(cap * sizeof *nm);
    for (uint64_t i = 0; i < cap; i++)
        nm[i] = -1;
    for (uint64_t i = 0; i <= m->tmask; i++) {
        int32_t id = m->tmap[i];
        if (id < 0)
            continue;
        uint64_t j = bytes_hash(m->tpool + m->toff[id], (size_t)m->tlen[id]) & (cap - 1);
        while (nm[j] >= 0)
            j = (j + 1) & (cap - 1);
        nm[j] = id;
    }
    free(m->tmap);
    m->tmap = nm;
    m->tmask = cap - 1;
}

/* Adds a token with the given raw bytes; indexed in tmap when `index`. */
static int32_t tok_add(merger *m, const char *s, size_t n, bool index)
{
    if (m->ntok == m->tcap) {
        int64_t c = m->tcap;
        td_grow((void **)&m->toff, &c, m->ntok + 1, sizeof *m->toff);
        c = m->tcap;
        td_grow((void **)&m->tlen, &c, m->ntok + 1, sizeof *m->tlen);
        m->tcap = c;
    }
    td_grow((void **)&m->tpool, &m->tpool_cap, m->tpool_len + (int64_t)n, 1);
    memcpy(m->tpool + m->tpool_len, s, n);
    int32_t id = (int32_t)m->ntok++;
    m->toff[id] = m->tpool_len;
    m->tlen[id] = (int32_t)n;
    m->tpool_len += (int64_t)n;
    if (index) {
        uint64_t slot;
        TREX_ASSERT(tmap_find(m, s, n, &slot) < 0);
        m->tmap[slot] = id;
        if ((uint64_t)m->ntok * 2 > m->tmask)
            tmap_grow(m);
    }
    return id;
}

static void merger_free(merger *m)
{
    free(m->sym);
    free(m->woff);
    free(m->wlen);
    free(m->wfreq);
    free(m->wstamp);
    free(m->tpool);
    free(m->toff);
    free(m->tlen);
    free(m->tmap);
    for (int64_t p = 0; p < m->npairs; p++)
        free(m->pairs[p].occ);
    free(m->pairs);
    free(m->pmap);
    free(m->heap);
    free(m->grown);
    free(m->merge);
}

/* Replaces every (a, b) in word w by n, left to right, updating the neighbouring pair counts. */
static void merge_in_word(merger *m, int32_t w, int32_t a, int32_t b, int32_t n, int64_t step)
{
    int32_t *s = m->sym + m->woff[w];
    int32_t len = m->wlen[w];
    int64_t f = m->wfreq[w];
    int32_t i = 0;
    while (i + 1 < len) {
        if (s[i] != a || s[i + 1] != b) {
            i++;
            continue;
        }
        if (i > 0) {
            pair_add(m, s[i - 1], a, -f, w, step);
            pair_add(m, s[i - 1], n, f, w, step);
        }
        if (i + 2 < len) {
            pair_add(m, b, s[i + 2], -f, w, step);
            pair_add(m, n, s[i + 2], f, w, step);
        }
        pair_add(m, a, b, -f, w, step);
        s[i] = n;
        memmove(s + i + 1, s + i + 2, (size_t)(len - i - 2) * sizeof *s);
        len--;
        i++;
    }
    m->wlen[w] = len;
}

/* --- output ------------------------------------------------------------------------------------- */

static char *bl_string(const merger *m, int32_t id)
{
    char *s = NULL;
    int64_t len = 0, cap = 0;
    td_bytes_to_bl((const unsigned char *)m->tpool + m->toff[id], (size_t)m->tlen[id], &s, &len, &cap);
    return s;
}

static cJSON *make_json(const merger *m, int nspecial)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < nspecial; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", i);
        cJSON_AddStringToObject(a, "content", td_v4_specials[i].content);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", 0);
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddBoolToObject(a, "special", td_v4_specials[i].special);
        cJSON_AddItemToArray(added, a);
    }
    cJSON_AddNullToObject(root, "normalizer");
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *list = cJSON_AddArrayToObject(pre, "pretokenizers");
    for (int i = 0; i < 3; i++) {
        cJSON *sp = cJSON_CreateObject();
        cJSON_AddStringToObject(sp, "type", "Split");
        cJSON *pat = cJSON_AddObjectToObject(sp, "pattern");
        cJSON_AddStringToObject(pat, "Regex", td_deepseek_split_patterns[i]);
        cJSON_AddStringToObject(sp, "behavior", "Isolated");
        cJSON_AddBoolToObject(sp, "invert", 0);
        cJSON_AddItemToArray(list, sp);
    }
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddBoolToObject(bl, "add_prefix_space", 0);
    cJSON_AddBoolToObject(bl, "trim_offsets", 1);
    cJSON_AddBoolToObject(bl, "use_regex", 0);
    cJSON_AddItemToArray(list, bl);
    cJSON_AddNullToObject(root, "post_processor");
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON_AddBoolToObject(dec, "add_prefix_space", 1);
    cJSON_AddBoolToObject(dec, "trim_offsets", 1);
    cJSON_AddBoolToObject(dec, "use_regex", 1);
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON_AddBoolToObject(model, "ignore_merges", 0);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int32_t id = 0; id < (int32_t)m->ntok; id++) {
        if (id < nspecial) {
            cJSON_AddNumberToObject(vocab, td_v4_specials[id].content, id);
        } else {
            char *s = bl_string(m, id);
            cJSON_AddNumberToObject(vocab, s, id);
            free(s);
        }
    }
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    for (int64_t k = 0; k < m->nmerges; k++) {
        char *a = bl_string(m, m->merge[k][0]), *b = bl_string(m, m->merge[k][1]);
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(a));
        cJSON_AddItemToArray(pair, cJSON_CreateString(b));
        cJSON_AddItemToArray(merges, pair);
        free(a);
        free(b);
    }
    return root;
}

trex_code trex_tok_trainer_finish(trex_tok_trainer *tr, int32_t vocab_size, int64_t min_frequency,
                                  const char *path, trex_tok_train_stats *st, trex_err *err)
{
    const int nspecial = td_v4_nspecials;
    if (vocab_size < nspecial + 256)
        return trex_err_set(err, TREX_EINVAL,
                            "vocabulary size %d is too small: it holds %d special tokens and 256 byte tokens, so it "
                            "must be at least %d", vocab_size, nspecial, nspecial + 256);
    if (min_frequency < 1)
        min_frequency = 1;
    merger m = {0};
    m.tmask = 1023;
    m.tmap = trex_xmalloc((m.tmask + 1) * sizeof *m.tmap);
    for (uint64_t i = 0; i <= m.tmask; i++)
        m.tmap[i] = -1;
    pmap_grow(&m);
    for (int i = 0; i < nspecial; i++) /* indexed by bytes, so that no merge can produce "<think>" */
        tok_add(&m, td_v4_specials[i].content, strlen(td_v4_specials[i].content), true);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        tok_add(&m, &c, 1, true);
    }

    /* words in hash-table order; the counts, and so the merges, do not depend on that order */
    int64_t nw = tr->nwords, total = 0;
    word_slot *ws = trex_xmalloc((size_t)(nw ? nw : 1) * sizeof *ws);
    int64_t k = 0;
    for (uint64_t i = 0; i <= tr->mask; i++)
        if (tr->slots[i].hash)
            ws[k++] = tr->slots[i];
    TREX_ASSERT(k == nw);
    for (int64_t i = 0; i < nw; i++)
        total += ws[i].len;
    m.nw = nw;
    m.sym = trex_xmalloc((size_t)(total ? total : 1) * sizeof *m.sym);
    m.woff = trex_xmalloc((size_t)(nw ? nw : 1) * sizeof *m.woff);
    m.wlen = trex_xmalloc((size_t)(nw ? nw : 1) * sizeof *m.wlen);
    m.wfreq = trex_xmalloc((size_t)(nw ? nw : 1) * sizeof *m.wfreq);
    m.wstamp = trex_xmalloc((size_t)(nw ? nw : 1) * sizeof *m.wstamp);
    int64_t off = 0;
    for (int64_t w = 0; w < nw; w++) {
        m.woff[w] = off;
        m.wlen[w] = (int32_t)ws[w].len;
        m.wfreq[w] = ws[w].count;
        m.wstamp[w] = -1;
        for (uint32_t j = 0; j < ws[w].len; j++)
            m.sym[off + j] = nspecial + (unsigned char)tr->pool[ws[w].off + j];
        for (uint32_t j = 0; j + 1 < ws[w].len; j++)
            pair_add(&m, m.sym[off + j], m.sym[off + j + 1], m.wfreq[w], (int32_t)w, -2);
        off += ws[w].len;
    }
    free(ws);
    for (int64_t p = 0; p < m.npairs; p++)
        hpush(&m, (heap_ent){m.pairs[p].count, m.pairs[p].a, m.pairs[p].b});
    m.ngrown = 0;

    bool short_of_target = false;
    int64_t step = 0;
    char *cat = NULL;
    int64_t cat_cap = 0;
    while (m.ntok < vocab_size) {
        if (m.nheap == 0) {
            short_of_target = true;
            break;
        }
        heap_ent top = hpop(&m);
        int64_t p = pair_get(&m, top.a, top.b);
        if (m.pairs[p].blocked)
            continue;
        if (m.pairs[p].count != top.count) {
            if (m.pairs[p].count > 0)
                hpush(&m, (heap_ent){m.pairs[p].count, top.a, top.b});
            continue;
        }
        if (top.count < min_frequency) {
            short_of_target = true;
            break;
        }
        size_t la = (size_t)m.tlen[top.a], lb = (size_t)m.tlen[top.b];
        td_grow((void **)&cat, &cat_cap, (int64_t)(la + lb), 1);
        memcpy(cat, m.tpool + m.toff[top.a], la);
        memcpy(cat + la, m.tpool + m.toff[top.b], lb);
        uint64_t slot;
        int32_t n = tmap_find(&m, cat, la + lb, &slot);
        if (n >= 0 && n < nspecial) { /* the bytes of a special token: never a merge */
            m.pairs[p].blocked = true;
            continue;
        }
        if (n < 0)
            n = tok_add(&m, cat, la + lb, true);
        td_grow((void **)&m.merge, &m.mcap, m.nmerges + 1, sizeof *m.merge);
        m.merge[m.nmerges][0] = top.a;
        m.merge[m.nmerges][1] = top.b;
        m.nmerges++;
        m.ngrown = 0;
        for (int64_t j = 0; j < m.pairs[p].nocc; j++) {
            int32_t w = m.pairs[p].occ[j];
            if (m.wstamp[w] == step)
                continue;
            m.wstamp[w] = step;
            merge_in_word(&m, w, top.a, top.b, n, step);
        }
        TREX_ASSERT(m.pairs[p].count == 0);
        free(m.pairs[p].occ);
        m.pairs[p].occ = NULL;
        m.pairs[p].nocc = m.pairs[p].cap = 0;
        for (int64_t g = 0; g < m.ngrown; g++) {
            const pair_rec *r = &m.pairs[m.grown[g]];
            if (r->count > 0)
                hpush(&m, (heap_ent){r->count, r->a, r->b});
        }
        step++;
    }
    free(cat);

    cJSON *json = make_json(&m, nspecial);
    trex_code rc = trex_json_save(path, json, err);
    cJSON_Delete(json);
    if (st) {
        st->texts = tr->texts;
        st->words = tr->nwords;
        st->merges = m.nmerges;
        st->vocab_size = (int32_t)m.ntok;
        st->short_of_target = short_of_target;
    }
    merger_free(&m);
    return rc;
}
