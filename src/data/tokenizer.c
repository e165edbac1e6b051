/* data/tokenizer.c — byte-level BPE from a Hugging Face tokenizer.json: loading, encoding, decoding.
 *
 * Encoding follows the Hugging Face library step by step (docs/tokenizer.md):
 *   1. added tokens are cut out of the text first (leftmost-longest; the non-normalized ones, then the
 *      normalized ones in what is left), with their lstrip/rstrip rules;
 *   2. each remaining span goes through the pre-tokenizer: the Split regexes in order (each keeps
 *      matches and gaps), then ByteLevel (each piece's bytes become the printable byte alphabet);
 *   3. each piece is one BPE word: its bytes start as single-byte symbols, and the adjacent pair with
 *      the lowest merge rank is merged (leftmost first among equal ranks) until no pair has a merge.
 *      A binary heap of candidate pairs over a linked list of symbols does this in O(n log n) per
 *      word, and a bounded word cache skips repeated words.
 * Decoding maps every token back through the byte alphabet (added tokens whose characters are not all
 * in the alphabet decode to their own UTF-8 bytes, as the library's ByteLevel decoder does). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "data/data_internal.h"
#include "trex/io.h"

#define TOK_MAX_FILE ((size_t)1 << 31)
#define TOK_MAX_ID ((int64_t)INT32_MAX - 1)
#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_ENTRIES (CACHE_SLOTS / 2)
#define CACHE_MAX_WORD 128 /* bytes; longer words are not cached */
#define CACHE_POOL_MAX ((int64_t)1 << 24)

typedef struct added_tok {
    char *content;
    uint32_t len;
    int32_t id;
    bool special, normalized, lstrip, rstrip;
} added_tok;

typedef struct trie_node {
    int32_t child;   /* first child, -1 for none */
    int32_t sibling; /* next sibling, -1 for none */
    int32_t tok;     /* index into added[] of the token ending here, -1 for none */
    unsigned char byte;
} trie_node;

typedef struct heap_item {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
} heap_item;

typedef struct seglist {
    td_span *v;
    int32_t *id; /* added-token id, or -1 for text */
    int64_t n, cap;
} seglist;

typedef struct cache_slot {
    uint64_t hash;   /* 0 = empty */
    int64_t key_off; /* into key_pool */
    int64_t ids_off; /* into ids_pool */
    uint32_t key_len, nids;
} cache_slot;

struct trex_tokenizer {
    char *name;
    uint64_t hash;
    int32_t nids;      /* max id + 1 */
    char **vocab_str;  /* [nids] model vocabulary strings (byte-level form), NULL for none */
    int32_t *added_of; /* [nids] index into added[], -1 for none */
    int64_t *dec_off;  /* [nids] decoded bytes of each id, in dec_pool */
    uint32_t *dec_len;
    char *dec_pool;

    /* model vocabulary: string -> id, open addressing over ids (value -1 = empty) */
    int32_t *vmap;
    uint64_t vmap_mask;

    added_tok *added;
    int nadded;
    /* a byte trie of the added tokens per pass (0: normalized=false, 1: normalized=true); node 0 is
     * the root */
    trie_node *trie[2];
    int64_t ntrie[2], trie_cap[2];

    /* BPE */
    uint64_t *mkey; /* (left << 32) | right, UINT64_MAX = empty */
    uint32_t *mrank;
    int32_t *mnew;
    uint64_t mmask;
    int64_t nmerges;
    int32_t byte_id[256];
    int32_t unk_id;
    bool fuse_unk, ignore_merges;

    td_pretok pre;

    /* work space (mutable: one encode at a time) */
    int32_t *sym_id, *sym_prev, *sym_next;
    int64_t sym_cap;
    heap_item *heap;
    int64_t heap_cap;
    char *wbuf; /* a word's byte-level form (ignore_merges) */
    int64_t wbuf_len, wbuf_cap;
    seglist segs0, segs; /* after the first and the second added-token pass */
    cache_slot *cache;
    int64_t cache_n;
    char *key_pool;
    int64_t key_len, key_cap;
    int32_t *ids_pool;
    int64_t ids_len, ids_cap;
};

/* --- small maps --------------------------------------------------------------------------------- */

static uint64_t str_hash(const char *s, size_t n)
{
    uint64_t h = td_fnv1a(s, n, TD_FNV_OFFSET);
    return td_mix64(h);
}

static int32_t vmap_find(const trex_tokenizer *t, const char *s, size_t n)
{
    if (!t->vmap)
        return -1;
    uint64_t i = str_hash(s, n) & t->vmap_mask;
    for (;;) {
        int32_t id = t->vmap[i];
        if (id < 0)
            return -1;
        const char *v = t->vocab_str[id];
        if (strlen(v) == n && !memcmp(v, s, n))
            return id;
        i = (i + 1) & t->vmap_mask;
    }
}

static void vmap_build(trex_tokenizer *t, int64_t count)
{
    uint64_t cap = 16;
    while (cap < (uint64_t)count * 2 + 16)
        cap <<= 1;
    t->vmap = trex_xmalloc(cap * sizeof *t->vmap);
    for (uint64_t i = 0; i < cap; i++)
        t->vmap[i] = -1;
    t->vmap_mask = cap - 1;
    for (int32_t id = 0; id < t->nids; id++) {
        const char *v = t->vocab_str[id];
        if (!v)
            continue;
        uint64_t i = str_hash(v, strlen(v)) & t->vmap_mask;
        while (t->vmap[i] >= 0)
            i = (i + 1) & t->vmap_mask;
        t->vmap[i] = id;
    }
}

static int64_t merge_slot(const trex_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t i = td_mix64(key) & t->mmask;
    for (;;) {
        if (t->mkey[i] == key)
            return (int64_t)i;
        if (t->mkey[i] == UINT64_MAX)
            return -1 - (int64_t)i;
        i = (i + 1) & t->mmask;
    }
}

/* --- loading ------------------------------------------------------------------------------------ */

static bool json_bool(const cJSON *obj, const char *key, bool dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v);
    return dflt;
}

static bool json_is_null_or_missing(const cJSON *v)
{
    return !v || cJSON_IsNull(v);
}

static trex_code json_id(const cJSON *v, const char *name, const char *where, int64_t *id, trex_err *err)
{
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > (double)TOK_MAX_ID)
        return trex_err_set(err, TREX_EFORMAT, "%s: %s: id must be an integer in [0, %lld]", name, where,
                            (long long)TOK_MAX_ID);
    *id = (int64_t)v->valuedouble;
    return TREX_OK;
}

/* Escapes a literal string (Split with a "String" pattern) into a regex. */
static char *regex_escape(const char *s)
{
    size_t n = strlen(s);
    char *o = trex_xmalloc(2 * n + 1), *q = o;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == ' '))
            *q++ = '\\';
        *q++ = (char)c;
    }
    *q = 0;
    return o;
}

static trex_code load_bytelevel(trex_tokenizer *t, const cJSON *bl, const char *where, trex_err *err)
{
    if (json_bool(bl, "add_prefix_space", true))
        t->pre.prefix_at = t->pre.nsplit; /* on the pieces made so far, before ByteLevel's own regex */
    if (json_bool(bl, "use_regex", true)) {
        char w[160];
        snprintf(w, sizeof w, "%s: %s (ByteLevel use_regex)", t->name, where);
        TREX_TRY(td_pretok_add(&t->pre, td_gpt2_pattern, w, err));
    }
    return TREX_OK;
}

static trex_code load_split(trex_tokenizer *t, const cJSON *sp, const char *where, trex_err *err)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(sp, "pattern");
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(sp, "behavior");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
    if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0)
        return trex_err_set(err, TREX_EUNSUPPORTED, "%s: %s: Split behavior \"%s\" is not supported (only Isolated)",
                            t->name, where, cJSON_IsString(beh) ? beh->valuestring : "?");
    if (json_bool(sp, "invert", false))
        return trex_err_set(err, TREX_EUNSUPPORTED, "%s: %s: inverted Split is not supported", t->name, where);
    char w[160];
    snprintf(w, sizeof w, "%s: %s", t->name, where);
    if (cJSON_IsString(regex))
        return td_pretok_add(&t->pre, regex->valuestring, w, err);
    if (cJSON_IsString(str)) {
        char *e = regex_escape(str->valuestring);
        trex_code rc = td_pretok_add(&t->pre, e, w, err);
        free(e);
        return rc;
    }
    return trex_err_set(err, TREX_EFORMAT, "%s: %s: Split needs a pattern {\"Regex\": ...} or {\"String\": ...}",
                        t->name, where);
}

static trex_code load_pretokenizer(trex_tokenizer *t, const cJSON *pre, trex_err *err)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
    if (json_is_null_or_missing(pre) || !cJSON_IsString(type))
        return trex_err_set(err, TREX_EUNSUPPORTED,
                            "%s: pre_tokenizer: trex needs a byte-level pre-tokenizer (ByteLevel, or a Sequence of "
                            "Split ending with ByteLevel)", t->name);
    if (!strcmp(type->valuestring, "ByteLevel"))
        return load_bytelevel(t, pre, "pre_tokenizer", err);
    if (strcmp(type->valuestring, "Sequence") != 0)
        return trex_err_set(err, TREX_EUNSUPPORTED, "%s: pre_tokenizer: type \"%s\" is not supported", t->name,
                            type->valuestring);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    int n = cJSON_GetArraySize(list), k = 0;
    bool have_bl = false;
    for (const cJSON *it = cJSON_IsArray(list) ? list->child : NULL; it; it = it->next, k++) {
        char where[64];
        snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%d]", k);
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
        const char *ts = cJSON_IsString(ty) ? ty->valuestring : "?";
        if (!strcmp(ts, "Split")) {
            TREX_TRY(load_split(t, it, where, err));
        } else if (!strcmp(ts, "ByteLevel")) {
            if (k != n - 1)
                return trex_err_set(err, TREX_EUNSUPPORTED, "%s: %s: ByteLevel must be the last pre-tokenizer",
                                    t->name, where);
            TREX_TRY(load_bytelevel(t, it, where, err));
            have_bl = true;
        } else {
            return trex_err_set(err, TREX_EUNSUPPORTED, "%s: %s: pre-tokenizer type \"%s\" is not supported", t->name,
                                where, ts);
        }
    }
    if (!have_bl)
        return trex_err_set(err, TREX_EUNSUPPORTED,
                            "%s: pre_tokenizer: the Sequence must end with ByteLevel (trex reads byte-level BPE only)",
                            t->name);
    return TREX_OK;
}

static trex_code load_model(trex_tokenizer *t, const cJSON *model, const cJSON *added, trex_err *err)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsObject(model))
        return trex_err_set(err, TREX_EFORMAT, "%s: no \"model\" object", t->name);
    if (cJSON_IsString(type) && strcmp(type->valuestring, "BPE") != 0)
        return trex_err_set(err, TREX_EUNSUPPORTED, "%s: model.type \"%s\" is not supported (only BPE)", t->name,
                            type->valuestring);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (!json_is_null_or_missing(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        return trex_err_set(err, TREX_EUNSUPPORTED, "%s: model.dropout must be null (BPE dropout is not supported)",
                            t->name);
    static const char *const no_str[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, no_str[i]);
        if (!json_is_null_or_missing(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return trex_err_set(err, TREX_EUNSUPPORTED, "%s: model.%s must be null", t->name, no_str[i]);
    }
    if (json_bool(model, "byte_fallback", false))
        return trex_err_set(err, TREX_EUNSUPPORTED, "%s: model.byte_fallback is not supported", t->name);
    t->fuse_unk = json_bool(model, "fuse_unk", false);
    t->ignore_merges = json_bool(model, "ignore_merges", false);

    /* ids: the largest of the vocabulary and the added tokens */
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return trex_err_set(err, TREX_EFORMAT, "%s: model.vocab must be an object {\"token\": id, ...}", t->name);
    int64_t maxid = -1, nv = 0;
    for (const cJSON *it = vocab->child; it; it = it->next, nv++) {
        int64_t id = 0;
        TREX_TRY(json_id(it, t->name, "model.vocab", &id, err));
        if (id > maxid)
            maxid = id;
    }
    int k = 0;
    for (const cJSON *it = added ? added->child : NULL; it; it = it->next, k++) {
        int64_t id = 0;
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%d].id", k);
        TREX_TRY(json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), t->name, where, &id, err));
        if (id > maxid)
            maxid = id;
    }
    if (maxid < 0)
        return trex_err_set(err, TREX_EFORMAT, "%s: the vocabulary is empty", t->name);
    t->nids = (int32_t)(maxid + 1);
    t->vocab_str = trex_xcalloc((size_t)t->nids, sizeof *t->vocab_str);
    t->added_of = trex_xmalloc((size_t)t->nids * sizeof *t->added_of);
    for (int32_t i = 0; i < t->nids; i++)
        t->added_of[i] = -1;
    for (const cJSON *it = vocab->child; it; it = it->next) {
        int32_t id = (int32_t)it->valuedouble;
        if (t->vocab_str[id])
            return trex_err_set(err, TREX_EFORMAT, "%s: model.vocab: id %d is given to both \"%s\" and \"%s\"",
                                t->name, id, t->vocab_str[id], it->string);
        t->vocab_str[id] = td_xstrndup(it->string, strlen(it->string));
    }
    vmap_build(t, nv);
    for (int32_t id = 0; id < t->nids; id++)
        if (t->vocab_str[id] && vmap_find(t, t->vocab_str[id], strlen(t->vocab_str[id])) != id)
            return trex_err_set(err, TREX_EFORMAT, "%s: model.vocab: the token \"%s\" appears twice", t->name,
                                t->vocab_str[id]);

    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    t->unk_id = -1;
    if (cJSON_IsString(unk)) {
        t->unk_id = vmap_find(t, unk->valuestring, strlen(unk->valuestring));
        if (t->unk_id < 0)
            return trex_err_set(err, TREX_EFORMAT, "%s: model.unk_token \"%s\" is not in model.vocab", t->name,
                                unk->valuestring);
    }
    for (unsigned b = 0; b < 256; b++) {
        char s[4];
        int n = td_utf8_encode(td_byte_to_cp(b), s);
        t->byte_id[b] = vmap_find(t, s, (size_t)n);
    }

    /* merges */
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!json_is_null_or_missing(merges) && !cJSON_IsArray(merges))
        return trex_err_set(err, TREX_EFORMAT, "%s: model.merges must be an array", t->name);
    int64_t nm = cJSON_GetArraySize(merges);
    uint64_t cap = 16;
    while (cap < (uint64_t)nm * 2 + 16)
        cap <<= 1;
    t->mkey = trex_xmalloc(cap * sizeof *t->mkey);
    t->mrank = trex_xmalloc(cap * sizeof *t->mrank);
    t->mnew = trex_xmalloc(cap * sizeof *t->mnew);
    memset(t->mkey, 0xFF, cap * sizeof *t->mkey);
    t->mmask = cap - 1;
    char *cat = NULL;
    int64_t cat_len = 0, cat_cap = 0;
    trex_code rc = TREX_OK;
    int64_t rank = 0;
    for (const cJSON *it = merges ? merges->child : NULL; it; it = it->next, rank++) {
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        if (cJSON_IsString(it)) {
            const char *s = it->valuestring, *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = trex_err_set(err, TREX_EFORMAT,
                                  "%s: model.merges[%lld] = \"%s\": a merge string must be two tokens separated by one "
                                  "space", t->name, (long long)rank, s);
                goto out;
            }
            a = s, alen = (size_t)(sp - s), b = sp + 1, blen = strlen(sp + 1);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                   cJSON_IsString(it->child->next)) {
            a = it->child->valuestring, alen = strlen(a);
            b = it->child->next->valuestring, blen = strlen(b);
        } else {
            rc = trex_err_set(err, TREX_EFORMAT, "%s: model.merges[%lld] must be \"a b\" or [\"a\", \"b\"]", t->name,
                              (long long)rank);
            goto out;
        }
        int32_t ia = vmap_find(t, a, alen), ib = vmap_find(t, b, blen);
        cat_len = 0;
        td_grow((void **)&cat, &cat_cap, (int64_t)(alen + blen + 1), 1);
        memcpy(cat, a, alen);
        memcpy(cat + alen, b, blen);
        cat_len = (int64_t)(alen + blen);
        cat[cat_len] = 0;
        int32_t in = vmap_find(t, cat, (size_t)cat_len);
        if (ia < 0 || ib < 0 || in < 0) {
            rc = trex_err_set(err, TREX_EFORMAT, "%s: model.merges[%lld]: \"%.*s\" + \"%.*s\": token \"%s\" is not in "
                                                 "model.vocab", t->name, (long long)rank, (int)alen, a, (int)blen, b,
                              ia < 0 ? "(left)" : ib < 0 ? "(right)" : cat);
            goto out;
        }
        if (rank > UINT32_MAX - 1) {
            rc = trex_err_set(err, TREX_ERANGE, "%s: more than 2^32 merges", t->name);
            goto out;
        }
        int64_t slot = merge_slot(t, ia, ib);
        if (slot < 0) /* a repeated pair keeps the later rank, as the reference library does */
            slot = -1 - slot;
        t->mkey[slot] = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        t->mrank[slot] = (uint32_t)rank;
        t->mnew[slot] = in;
    }
    t->nmerges = rank;
out:
    free(cat);
    return rc;
}

static int32_t trie_new(trex_tokenizer *t, int p, unsigned char byte)
{
    td_grow((void **)&t->trie[p], &t->trie_cap[p], t->ntrie[p] + 1, sizeof *t->trie[p]);
    t->trie[p][t->ntrie[p]] = (trie_node){-1, -1, -1, byte};
    return (int32_t)t->ntrie[p]++;
}

static void trie_insert(trex_tokenizer *t, int p, const added_tok *a, int32_t idx)
{
    if (t->ntrie[p] == 0)
        trie_new(t, p, 0);
    int32_t node = 0;
    for (uint32_t i = 0; i < a->len; i++) {
        unsigned char c = (unsigned char)a->content[i];
        int32_t ch = t->trie[p][node].child;
        while (ch >= 0 && t->trie[p][ch].byte != c)
            ch = t->trie[p][ch].sibling;
        if (ch < 0) {
            ch = trie_new(t, p, c); /* may move the array: index again below */
            t->trie[p][ch].sibling = t->trie[p][node].child;
            t->trie[p][node].child = ch;
        }
        node = ch;
    }
    t->trie[p][node].tok = idx;
}

/* The longest added token of pass p that starts at text[pos] and ends by e: its index, or -1. */
static int32_t trie_longest(const trex_tokenizer *t, int p, const char *text, size_t pos, size_t e)
{
    if (t->ntrie[p] == 0)
        return -1;
    const trie_node *tr = t->trie[p];
    int32_t node = 0, best = -1;
    for (size_t i = pos; i < e; i++) {
        unsigned char c = (unsigned char)text[i];
        int32_t ch = tr[node].child;
        while (ch >= 0 && tr[ch].byte != c)
            ch = tr[ch].sibling;
        if (ch < 0)
            break;
        node = ch;
        if (tr[node].tok >= 0)
            best = tr[node].tok;
    }
    return best;
}

static trex_code load_added(trex_tokenizer *t, const cJSON *added, trex_err *err)
{
    if (json_is_null_or_missing(added))
        return TREX_OK;
    if (!cJSON_IsArray(added))
        return trex_err_set(err, TREX_EFORMAT, "%s: added_tokens must be an array", t->name);
    int n = cJSON_GetArraySize(added), k = 0;
    t->added = trex_xcalloc((size_t)(n ? n : 1), sizeof *t->added);
    for (const cJSON *it = added->child; it; it = it->next, k++) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsString(content) || !content->valuestring[0])
            return trex_err_set(err, TREX_EFORMAT, "%s: added_tokens[%d].content must be a non-empty string", t->name, k);
        size_t bad;
        if (!td_utf8_valid(content->valuestring, strlen(content->valuestring), &bad))
            return trex_err_set(err, TREX_EFORMAT, "%s: added_tokens[%d].content is not valid UTF-8", t->name, k);
        if (json_bool(it, "single_word", false))
            return trex_err_set(err, TREX_EUNSUPPORTED, "%s: added_tokens[%d] (\"%s\"): single_word is not supported",
                                t->name, k, content->valuestring);
        added_tok *a = &t->added[t->nadded];
        a->id = (int32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble; /* checked in load_model */
        if (t->added_of[a->id] >= 0)
            return trex_err_set(err, TREX_EFORMAT, "%s: added_tokens[%d]: id %d is used twice", t->name, k, a->id);
        for (int j = 0; j < t->nadded; j++)
            if (!strcmp(t->added[j].content, content->valuestring))
                return trex_err_set(err, TREX_EFORMAT, "%s: added_tokens[%d]: \"%s\" appears twice", t->name, k,
                                    content->valuestring);
        a->content = td_xstrndup(content->valuestring, strlen(content->valuestring));
        a->len = (uint32_t)strlen(a->content);
        a->special = json_bool(it, "special", false);
        a->normalized = json_bool(it, "normalized", !a->special);
        a->lstrip = json_bool(it, "lstrip", false);
        a->rstrip = json_bool(it, "rstrip", false);
        t->added_of[a->id] = t->nadded;
        t->nadded++;
    }
    for (int i = 0; i < t->nadded; i++)
        trie_insert(t, t->added[i].normalized ? 1 : 0, &t->added[i], i);
    return TREX_OK;
}

static void build_decode_table(trex_tokenizer *t)
{
    int64_t len = 0, cap = 0;
    t->dec_off = trex_xmalloc((size_t)t->nids * sizeof *t->dec_off);
    t->dec_len = trex_xmalloc((size_t)t->nids * sizeof *t->dec_len);
    for (int32_t id = 0; id < t->nids; id++) {
        const char *s = trex_tok_str(t, id);
        t->dec_off[id] = len;
        if (s)
            td_bl_to_bytes(s, strlen(s), &t->dec_pool, &len, &cap);
        t->dec_len[id] = (uint32_t)(len - t->dec_off[id]);
    }
    if (!t->dec_pool)
        t->dec_pool = trex_xcalloc(1, 1);
}

static void json_error_position(const char *json, size_t len, char *out, size_t outlen)
{
    const char *e = cJSON_GetErrorPtr();
    if (!e || e < json || e > json + len) {
        snprintf(out, outlen, "unknown position");
        return;
    }
    int line = 1, col = 1;
    for (const char *p = json; p < e; p++) {
        if (*p == '\n')
            line++, col = 1;
        else
            col++;
    }
    snprintf(out, outlen, "line %d, column %d", line, col);
}

trex_code trex_tok_load_mem(trex_tokenizer **out, const char *json, size_t len, const char *name, trex_err *err)
{
    TREX_ASSERT(out && json && name);
    *out = NULL;
    trex_tokenizer *t = trex_xcalloc(1, sizeof *t);
    t->name = td_xstrndup(name, strlen(name));
    t->hash = td_fnv1a(json, len, TD_FNV_OFFSET);
    t->unk_id = -1;
    td_pretok_init(&t->pre);
    trex_code rc = TREX_OK;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        char pos[64];
        json_error_position(json, len, pos, sizeof pos);
        rc = trex_err_set(err, TREX_EFORMAT, "%s: not valid JSON (syntax error at %s)", name, pos);
        goto fail;
    }
    if (!cJSON_IsObject(root)) {
        rc = trex_err_set(err, TREX_EFORMAT, "%s: the top level must be a JSON object", name);
        goto fail;
    }
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (!json_is_null_or_missing(norm)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(norm, "type");
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(norm, "normalizers");
        if (!(cJSON_IsString(ty) && !strcmp(ty->valuestring, "Sequence") && cJSON_GetArraySize(list) == 0)) {
            rc = trex_err_set(err, TREX_EUNSUPPORTED, "%s: normalizer must be null or an empty Sequence (type \"%s\")",
                              name, cJSON_IsString(ty) ? ty->valuestring : "?");
            goto fail;
        }
    }
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *dty = cJSON_GetObjectItemCaseSensitive(dec, "type");
    if (!cJSON_IsString(dty) || strcmp(dty->valuestring, "ByteLevel") != 0) {
        rc = trex_err_set(err, TREX_EUNSUPPORTED, "%s: decoder must be ByteLevel (found %s)", name,
                          cJSON_IsString(dty) ? dty->valuestring : "none");
        goto fail;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if ((rc = load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"), added, err)) != TREX_OK)
        goto fail;
    if ((rc = load_added(t, added, err)) != TREX_OK)
        goto fail;
    if ((rc = load_pretokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err)) != TREX_OK)
        goto fail;
    build_decode_table(t);
    t->cache = trex_xcalloc(CACHE_SLOTS, sizeof *t->cache);
    cJSON_Delete(root);
    *out = t;
    return TREX_OK;
fail:
    cJSON_Delete(root);
    trex_tok_free(t);
    return rc;
}

trex_code trex_tok_load(trex_tokenizer **out, const char *path, trex_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    TREX_TRY(trex_file_read(path, TOK_MAX_FILE, &buf, &len, err));
    trex_code rc = trex_tok_load_mem(out, buf, len, path, err);
    free(buf);
    return rc;
}

void trex_tok_free(trex_tokenizer *t)
{
    if (!t)
        return;
    if (t->vocab_str)
        for (int32_t i = 0; i < t->nids; i++)
            free(t->vocab_str[i]);
    free(t->vocab_str);
    free(t->added_of);
    free(t->dec_off);
    free(t->dec_len);
    free(t->dec_pool);
    free(t->vmap);
    for (int i = 0; i < t->nadded; i++)
        free(t->added[i].content);
    free(t->added);
    free(t->trie[0]);
    free(t->trie[1]);
    free(t->mkey);
    free(t->mrank);
    free(t->mnew);
    td_pretok_free(&t->pre);
    free(t->sym_id);
    free(t->sym_prev);
    free(t->sym_next);
    free(t->heap);
    free(t->wbuf);
    free(t->segs0.v);
    free(t->segs0.id);
    free(t->segs.v);
    free(t->segs.id);
    free(t->cache);
    free(t->key_pool);
    free(t->ids_pool);
    free(t->name);
    free(t);
}

/* --- lookups ------------------------------------------------------------------------------------ */

int32_t trex_tok_vocab_size(const trex_tokenizer *t)
{
    return t->nids;
}

uint64_t trex_tok_hash(const trex_tokenizer *t)
{
    return t->hash;
}

int32_t trex_tok_id(const trex_tokenizer *t, const char *token)
{
    for (int i = 0; i < t->nadded; i++)
        if (!strcmp(t->added[i].content, token))
            return t->added[i].id;
    return vmap_find(t, token, strlen(token));
}

const char *trex_tok_str(const trex_tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->nids)
        return NULL;
    if (t->added_of[id] >= 0)
        return t->added[t->added_of[id]].content;
    return t->vocab_str[id];
}

bool trex_tok_is_added(const trex_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->nids && t->added_of[id] >= 0;
}

/* --- BPE on one word ---------------------------------------------------------------------------- */

static bool heap_less(const heap_item *a, const heap_item *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(trex_tokenizer *t, int64_t *n, heap_item it)
{
    td_grow((void **)&t->heap, &t->heap_cap, *n + 1, sizeof *t->heap);
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!heap_less(&it, &t->heap[p]))
            break;
        t->heap[i] = t->heap[p];
        i = p;
    }
    t->heap[i] = it;
}

static heap_item heap_pop(trex_tokenizer *t, int64_t *n)
{
    heap_item top = t->heap[0], last = t->heap[--(*n)];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(&t->heap[c + 1], &t->heap[c]))
            c++;
        if (!heap_less(&t->heap[c], &last))
            break;
        t->heap[i] = t->heap[c];
        i = c;
    }
    if (*n > 0)
        t->heap[i] = last;
    return top;
}

static void push_pair(trex_tokenizer *t, int64_t *hn, int32_t pos)
{
    int32_t r = t->sym_next[pos];
    if (r < 0)
        return;
    int64_t slot = merge_slot(t, t->sym_id[pos], t->sym_id[r]);
    if (slot < 0)
        return;
    heap_item it = {t->mrank[slot], pos, t->mnew[slot]};
    heap_push(t, hn, it);
}

/* Appends the ids of one word (raw bytes) to out. */
static void bpe_word(trex_tokenizer *t, const unsigned char *w, size_t n, uint8_t mask, trex_tokbuf *out)
{
    if (t->ignore_merges) {
        t->wbuf_len = 0;
        td_bytes_to_bl(w, n, &t->wbuf, &t->wbuf_len, &t->wbuf_cap);
        int32_t id = vmap_find(t, t->wbuf, (size_t)t->wbuf_len);
        if (id >= 0) {
            td_tokbuf_push(out, id, mask);
            return;
        }
    }
    if ((int64_t)n > t->sym_cap) {
        int64_t c = t->sym_cap;
        td_grow((void **)&t->sym_id, &c, (int64_t)n, sizeof *t->sym_id);
        c = t->sym_cap;
        td_grow((void **)&t->sym_prev, &c, (int64_t)n, sizeof *t->sym_prev);
        c = t->sym_cap;
        td_grow((void **)&t->sym_next, &c, (int64_t)n, sizeof *t->sym_next);
        t->sym_cap = c;
    }
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id < 0) {
            if (t->unk_id < 0)
                continue; /* no unk token: the byte is dropped, as in the reference library */
            if (t->fuse_unk && ns > 0 && t->sym_id[ns - 1] == t->unk_id)
                continue;
            id = t->unk_id;
        }
        t->sym_id[ns] = id;
        t->sym_prev[ns] = ns - 1;
        t->sym_next[ns] = ns + 1;
        ns++;
    }
    if (ns == 0)
        return;
    t->sym_next[ns - 1] = -1;
    int64_t hn = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        push_pair(t, &hn, i);
    while (hn > 0) {
        heap_item top = heap_pop(t, &hn);
        int32_t pos = top.pos;
        if (t->sym_id[pos] < 0)
            continue; /* merged away */
        int32_t r = t->sym_next[pos];
        if (r < 0)
            continue;
        int64_t slot = merge_slot(t, t->sym_id[pos], t->sym_id[r]);
        if (slot < 0 || t->mnew[slot] != top.new_id)
            continue; /* stale: a neighbour changed */
        t->sym_id[pos] = top.new_id;
        t->sym_id[r] = -1;
        t->sym_next[pos] = t->sym_next[r];
        if (t->sym_next[r] >= 0)
            t->sym_prev[t->sym_next[r]] = pos;
        if (t->sym_prev[pos] >= 0)
            push_pair(t, &hn, t->sym_prev[pos]);
        push_pair(t, &hn, pos);
    }
    td_tokbuf_reserve(out, ns);
    for (int32_t i = 0; i >= 0; i = t->sym_next[i])
        td_tokbuf_push(out, t->sym_id[i], mask);
}

static void cache_clear(trex_tokenizer *t)
{
    memset(t->cache, 0, CACHE_SLOTS * sizeof *t->cache);
    t->cache_n = 0;
    t->key_len = 0;
    t->ids_len = 0;
}

/* One word through the cache. */
static void encode_word(trex_tokenizer *t, const unsigned char *w, size_t n, uint8_t mask, trex_tokbuf *out)
{
    if (n > CACHE_MAX_WORD) {
        bpe_word(t, w, n, mask, out);
        return;
    }
    uint64_t h = str_hash((const char *)w, n) | 1;
    uint64_t i = h & (CACHE_SLOTS - 1);
    for (;;) {
        cache_slot *s = &t->cache[i];
        if (s->hash == 0)
            break;
        if (s->hash == h && s->key_len == n && !memcmp(t->key_pool + s->key_off, w, n)) {
            td_tokbuf_reserve(out, s->nids);
            for (uint32_t k = 0; k < s->nids; k++)
                td_tokbuf_push(out, t->ids_pool[s->ids_off + k], mask);
            return;
        }
        i = (i + 1) & (CACHE_SLOTS - 1);
    }
    int64_t before = out->n;
    bpe_word(t, w, n, mask, out);
    int64_t nids = out->n - before;
    if (t->cache_n >= CACHE_MAX_ENTRIES || t->key_len + (int64_t)n > CACHE_POOL_MAX ||
        t->ids_len + nids > CACHE_POOL_MAX) {
        cache_clear(t);
        i = h & (CACHE_SLOTS - 1);
    }
    while (t->cache[i].hash != 0)
        i = (i + 1) & (CACHE_SLOTS - 1);
    td_grow((void **)&t->key_pool, &t->key_cap, t->key_len + (int64_t)n, 1);
    td_grow((void **)&t->ids_pool, &t->ids_cap, t->ids_len + nids, sizeof *t->ids_pool);
    memcpy(t->key_pool + t->key_len, w, n);
    memcpy(t->ids_pool + t->ids_len, out->ids + before, (size_t)nids * sizeof *t->ids_pool);
    t->cache[i] = (cache_slot){h, t->key_len, t->ids_len, (uint32_t)n, (uint32_t)nids};
    t->key_len += (int64_t)n;
    t->ids_len += nids;
    t->cache_n++;
}

/* --- added tokens ------------------------------------------------------------------------------- */

static void seg_push(seglist *s, size_t off, size_t len, int32_t id)
{
    if (s->n == s->cap) {
        int64_t c = s->cap;
        td_grow((void **)&s->v, &c, s->n + 1, sizeof *s->v);
        c = s->cap;
        td_grow((void **)&s->id, &c, s->n + 1, sizeof *s->id);
        s->cap = c;
    }
    s->v[s->n] = (td_span){(uint32_t)off, (uint32_t)len};
    s->id[s->n] = id;
    s->n++;
}

/* Offset of the start of the whitespace run that ends at `end` (not before `floor`). */
static size_t ws_left(const char *text, size_t floor, size_t end)
{
    size_t p = end;
    while (p > floor) {
        size_t q = p - 1;
        while (q > floor && ((unsigned char)text[q] & 0xC0) == 0x80)
            q--;
        uint32_t cp;
        td_utf8_decode((const unsigned char *)text + q, p - q, &cp);
        if (!td_is_unicode_space(cp))
            break;
        p = q;
    }
    return p;
}

static size_t ws_right(const char *text, size_t start, size_t end)
{
    size_t p = start;
    while (p < end) {
        uint32_t cp;
        int k = td_utf8_decode((const unsigned char *)text + p, end - p, &cp);
        if (!td_is_unicode_space(cp))
            break;
        p += (size_t)k;
    }
    return p;
}

/* Splits text[s, e) on the added tokens of pass p; pushes text pieces (id -1) and tokens into dst. */
static void split_added(const trex_tokenizer *t, int p, const char *text, size_t s, size_t e, seglist *dst)
{
    size_t last = s, pos = s;
    while (pos < e) {
        int32_t hit = trie_longest(t, p, text, pos, e);
        if (hit < 0) {
            pos++;
            continue;
        }
        const added_tok *a = &t->added[hit];
        size_t start = pos, stop = pos + a->len;
        if (a->lstrip)
            start = ws_left(text, last, start);
        if (a->rstrip)
            stop = ws_right(text, stop, e);
        if (start > last)
            seg_push(dst, last, start - last, -1);
        seg_push(dst, start, stop - start, a->id);
        last = pos = stop;
    }
    if (e > last)
        seg_push(dst, last, e - last, -1);
}

/* --- encode / decode ---------------------------------------------------------------------------- */

static trex_code encode_span(trex_tokenizer *t, const char *text, size_t len, uint8_t mask, trex_tokbuf *out,
                             trex_err *err)
{
    TREX_TRY(td_pretok_split(&t->pre, text, len, err));
    for (int64_t k = 0; k < t->pre.a.n; k++)
        encode_word(t, (const unsigned char *)t->pre.base + t->pre.a.v[k].off, t->pre.a.v[k].len, mask, out);
    return TREX_OK;
}

trex_code trex_tok_encode(trex_tokenizer *t, const char *text, size_t len, uint8_t mask, trex_tokbuf *out,
                          trex_err *err)
{
    TREX_ASSERT(t && out && (text || len == 0));
    size_t bad = 0;
    if (!td_utf8_valid(text, len, &bad))
        return trex_err_set(err, TREX_EFORMAT, "text is not valid UTF-8 (byte offset %zu)", bad);
    if (len > UINT32_MAX)
        return trex_err_set(err, TREX_ERANGE, "text of %zu bytes is longer than 4 GiB", len);
    if (len == 0)
        return TREX_OK;
    /* the non-normalized added tokens on the whole text, then the normalized ones inside each text piece */
    t->segs0.n = 0;
    split_added(t, 0, text, 0, len, &t->segs0);
    t->segs.n = 0;
    for (int64_t i = 0; i < t->segs0.n; i++) {
        td_span sp = t->segs0.v[i];
        if (t->segs0.id[i] >= 0)
            seg_push(&t->segs, sp.off, sp.len, t->segs0.id[i]);
        else
            split_added(t, 1, text, sp.off, (size_t)sp.off + sp.len, &t->segs);
    }
    for (int64_t i = 0; i < t->segs.n; i++) {
        if (t->segs.id[i] >= 0)
            td_tokbuf_push(out, t->segs.id[i], mask);
        else
            TREX_TRY(encode_span(t, text + t->segs.v[i].off, t->segs.v[i].len, mask, out, err));
    }
    return TREX_OK;
}

trex_code trex_tok_decode(const trex_tokenizer *t, const int32_t *ids, int64_t n, char **out, size_t *len,
                          trex_err *err)
{
    TREX_ASSERT(t && out && len && (ids || n == 0));
    *out = NULL;
    *len = 0;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->nids || !trex_tok_str(t, ids[i]))
            return trex_err_set(err, TREX_ERANGE, "token id %d (position %lld) is not in the vocabulary of %s (%d ids)",
                                ids[i], (long long)i, t->name, t->nids);
        total += t->dec_len[ids[i]];
    }
    char *s = trex_xmalloc(total + 1);
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        memcpy(s + k, t->dec_pool + t->dec_off[ids[i]], t->dec_len[ids[i]]);
        k += t->dec_len[ids[i]];
    }
    s[k] = 0;
    *out = s;
    *len = k;
    return TREX_OK;
}
