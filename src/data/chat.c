/* data/chat.c — the DeepSeek-V4 chat template with loss masks, CPT documents, and the JSONL line
 * parser shared by `trex data tokenize`.
 *
 * A sample is rendered as a list of text segments, each marked target or context (trex/data.h gives
 * the layout; it follows DeepSeek's encoding_dsv4.py for system, user and assistant messages). Runs of
 * segments with the same mark are joined and encoded; every boundary between a context run and a
 * target run sits next to an added token (<｜Assistant｜>, <think>, </think>, <｜end▁of▁sentence｜>,
 * <｜User｜>), where the tokenizer cuts the text anyway, so the ids equal those of encoding the whole
 * rendered string at once, as DeepSeek's own code does. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "data/data_internal.h"

#define T_BOS "<｜begin▁of▁sentence｜>"
#define T_EOS "<｜end▁of▁sentence｜>"
#define T_USER "<｜User｜>"
#define T_ASSISTANT "<｜Assistant｜>"
#define T_THINK "<think>"
#define T_ENDTHINK "</think>"

typedef struct seg {
    const char *s;
    bool target;
} seg;

typedef struct seglist {
    seg *v;
    int64_t n, cap;
} seglist;

static void emit(seglist *l, const char *s, bool target)
{
    if (!s || !s[0])
        return;
    td_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v);
    l->v[l->n++] = (seg){s, target};
}

/* prompt: a generation prompt (msgs end with a user message, `gen` decides its ending, nothing is a
 * target); otherwise an SFT sample. */
static trex_code render(const trex_chat_msg *m, int n, bool prompt, trex_chat_gen gen, seglist *out, trex_err *err)
{
    if (n <= 0)
        return trex_err_set(err, TREX_EINVAL, "empty sample: no messages");
    int last_user = -1, nassistant = 0;
    for (int i = 0; i < n; i++) {
        if (m[i].role == TREX_CHAT_USER)
            last_user = i;
        else if (m[i].role == TREX_CHAT_ASSISTANT)
            nassistant++;
        else
            TREX_ASSERT(m[i].role == TREX_CHAT_SYSTEM);
    }
    if (prompt && m[n - 1].role != TREX_CHAT_USER)
        return trex_err_set(err, TREX_EINVAL, "a generation prompt must end with a user message (message %d is %s)",
                            n - 1, m[n - 1].role == TREX_CHAT_SYSTEM ? "system" : "assistant");
    if (!prompt && nassistant == 0)
        return trex_err_set(err, TREX_EINVAL, "no assistant message: the sample has nothing to train on");
    emit(out, T_BOS, false);
    for (int i = 0; i < n; i++) {
        const trex_chat_msg *g = &m[i];
        if (g->role == TREX_CHAT_SYSTEM) {
            emit(out, g->content, false);
        } else if (g->role == TREX_CHAT_USER) {
            emit(out, T_USER, false);
            emit(out, g->content, false);
            if (prompt && i == n - 1) {
                emit(out, T_ASSISTANT, false);
                if (gen == TREX_CHAT_GEN_CHAT)
                    emit(out, T_ENDTHINK, false);
                else if (gen == TREX_CHAT_GEN_THINK)
                    emit(out, T_THINK, false);
            } else if (i == n - 1 || m[i + 1].role == TREX_CHAT_ASSISTANT) {
                bool think = i + 1 < n && m[i + 1].role == TREX_CHAT_ASSISTANT && i + 1 > last_user &&
                             m[i + 1].reasoning;
                emit(out, T_ASSISTANT, false);
                emit(out, think ? T_THINK : T_ENDTHINK, false);
            }
        } else {
            bool target = !prompt;
            if (i > last_user && g->reasoning) {
                emit(out, g->reasoning, target);
                emit(out, T_ENDTHINK, target);
            }
            emit(out, g->content, target);
            emit(out, T_EOS, target);
        }
    }
    return TREX_OK;
}

trex_code trex_chat_render(const trex_chat_msg *msgs, int n, char **text, size_t *len, trex_err *err)
{
    seglist l = {0};
    *text = NULL;
    *len = 0;
    trex_code rc = render(msgs, n, false, TREX_CHAT_GEN_OPEN, &l, err);
    if (rc == TREX_OK) {
        char *s = NULL;
        int64_t sl = 0, cap = 0;
        td_grow((void **)&s, &cap, 1, 1);
        s[0] = 0;
        for (int64_t i = 0; i < l.n; i++) {
            size_t k = strlen(l.v[i].s);
            td_grow((void **)&s, &cap, sl + (int64_t)k + 1, 1);
            memcpy(s + sl, l.v[i].s, k + 1);
            sl += (int64_t)k;
        }
        *text = s;
        *len = (size_t)sl;
    }
    free(l.v);
    return rc;
}

static trex_code check_template_tokens(const trex_tokenizer *t, trex_err *err)
{
    static const char *const need[] = {T_BOS, T_EOS, T_USER, T_ASSISTANT, T_THINK, T_ENDTHINK};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        int32_t id = trex_tok_id(t, need[i]);
        if (id < 0 || !trex_tok_is_added(t, id))
            return trex_err_set(err, TREX_EINVAL,
                                "the tokenizer has no added token %s, which the DeepSeek-V4 chat template needs (use "
                                "a DeepSeek-V4 tokenizer.json or one made by `trex data train-tokenizer`)", need[i]);
    }
    return TREX_OK;
}

/* Encodes the segments: each run of equal marks as one text. */
static trex_code encode_segments(trex_tokenizer *t, const seglist *l, trex_tokbuf *out, trex_err *err)
{
    char *buf = NULL;
    int64_t cap = 0;
    trex_code rc = TREX_OK;
    for (int64_t i = 0; i < l->n && rc == TREX_OK;) {
        int64_t j = i, len = 0;
        bool target = l->v[i].target;
        for (; j < l->n && l->v[j].target == target; j++) {
            size_t k = strlen(l->v[j].s);
            td_grow((void **)&buf, &cap, len + (int64_t)k + 1, 1);
            memcpy(buf + len, l->v[j].s, k);
            len += (int64_t)k;
        }
        rc = trex_tok_encode(t, buf, (size_t)len, target ? 1 : 0, out, err);
        i = j;
    }
    free(buf);
    return rc;
}

trex_code trex_chat_encode(trex_tokenizer *t, const trex_chat_msg *msgs, int n, trex_tokbuf *out, trex_err *err)
{
    TREX_TRY(check_template_tokens(t, err));
    seglist l = {0};
    trex_code rc = render(msgs, n, false, TREX_CHAT_GEN_OPEN, &l, err);
    if (rc == TREX_OK)
        rc = encode_segments(t, &l, out, err);
    free(l.v);
    return rc;
}

trex_code trex_chat_encode_prompt(trex_tokenizer *t, const trex_chat_msg *msgs, int n, trex_chat_gen gen,
                                  trex_tokbuf *out, trex_err *err)
{
    TREX_TRY(check_template_tokens(t, err));
    seglist l = {0};
    trex_code rc = render(msgs, n, true, gen, &l, err);
    if (rc == TREX_OK)
        rc = encode_segments(t, &l, out, err);
    free(l.v);
    return rc;
}

/* --- JSONL lines -------------------------------------------------------------------------------- */

static trex_code parse_messages(const cJSON *root, trex_chat_msg **out, int *n, trex_err *err)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs)
        return trex_err_set(err, TREX_EFORMAT, "no \"messages\" field (an SFT line is {\"messages\": [...]})");
    if (!cJSON_IsArray(msgs))
        return trex_err_set(err, TREX_EFORMAT, "\"messages\" must be an array of {\"role\", \"content\"} objects");
    int cnt = cJSON_GetArraySize(msgs);
    if (cnt == 0)
        return trex_err_set(err, TREX_EINVAL, "empty sample: \"messages\" is []");
    trex_chat_msg *m = trex_xcalloc((size_t)cnt, sizeof *m);
    int k = 0;
    for (const cJSON *it = msgs->child; it; it = it->next, k++) {
        if (!cJSON_IsObject(it)) {
            free(m);
            return trex_err_set(err, TREX_EFORMAT, "messages[%d] must be an object", k);
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(it, "reasoning_content");
        if (!cJSON_IsString(role)) {
            free(m);
            return trex_err_set(err, TREX_EFORMAT, "messages[%d]: \"role\" is missing or not a string", k);
        }
        if (!strcmp(role->valuestring, "system"))
            m[k].role = TREX_CHAT_SYSTEM;
        else if (!strcmp(role->valuestring, "user"))
            m[k].role = TREX_CHAT_USER;
        else if (!strcmp(role->valuestring, "assistant"))
            m[k].role = TREX_CHAT_ASSISTANT;
        else {
            trex_err_set(err, TREX_EINVAL, "messages[%d]: unknown role \"%.64s\" (use system, user or assistant)", k,
                         role->valuestring);
            free(m);
            return TREX_EINVAL;
        }
        if (content && !cJSON_IsNull(content) && !cJSON_IsString(content)) {
            free(m);
            return trex_err_set(err, TREX_EFORMAT, "messages[%d]: \"content\" must be a string or null", k);
        }
        if (reasoning && !cJSON_IsNull(reasoning) && !cJSON_IsString(reasoning)) {
            free(m);
            return trex_err_set(err, TREX_EFORMAT, "messages[%d]: \"reasoning_content\" must be a string or null", k);
        }
        m[k].content = cJSON_IsString(content) ? content->valuestring : NULL;
        m[k].reasoning = m[k].role == TREX_CHAT_ASSISTANT && cJSON_IsString(reasoning) ? reasoning->valuestring : NULL;
    }
    bool any = false;
    for (int i = 0; i < cnt; i++)
        any |= (m[i].content && m[i].content[0]) || (m[i].reasoning && m[i].reasoning[0]);
    if (!any) {
        free(m);
        return trex_err_set(err, TREX_EINVAL, "empty sample: every message is empty");
    }
    *out = m;
    *n = cnt;
    return TREX_OK;
}

static trex_code parse_line(const char *line, size_t len, cJSON **root, trex_err *err)
{
    *root = cJSON_ParseWithLength(line, len);
    if (!*root) {
        const char *e = cJSON_GetErrorPtr();
        long col = e && e >= line && e <= line + len ? (long)(e - line) + 1 : 0;
        return trex_err_set(err, TREX_EFORMAT, "not valid JSON (syntax error near column %ld)", col);
    }
    if (!cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        return trex_err_set(err, TREX_EFORMAT, "a line must be a JSON object");
    }
    return TREX_OK;
}

static trex_code cpt_text(const cJSON *root, const char **text, trex_err *err)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "text");
    if (!cJSON_IsString(t))
        return trex_err_set(err, TREX_EFORMAT, "%s (a CPT line is {\"text\": \"...\"})",
                            t ? "\"text\" must be a string" : "no \"text\" field");
    if (!t->valuestring[0])
        return trex_err_set(err, TREX_EINVAL, "empty document: \"text\" is \"\"");
    *text = t->valuestring;
    return TREX_OK;
}

trex_code trex_data_encode_line(trex_tokenizer *t, trex_data_format fmt, const char *line, size_t len,
                                trex_tokbuf *out, trex_err *err)
{
    trex_tokbuf_clear(out);
    cJSON *root = NULL;
    TREX_TRY(parse_line(line, len, &root, err));
    trex_code rc = TREX_OK;
    if (fmt == TREX_DATA_CPT) {
        const char *text = NULL;
        int32_t eos = trex_tok_id(t, T_EOS);
        if ((rc = cpt_text(root, &text, err)) != TREX_OK)
            goto out;
        if (eos < 0 || !trex_tok_is_added(t, eos)) {
            rc = trex_err_set(err, TREX_EINVAL, "the tokenizer has no added token %s to end documents with", T_EOS);
            goto out;
        }
        if ((rc = trex_tok_encode(t, text, strlen(text), 1, out, err)) != TREX_OK)
            goto out;
        td_tokbuf_push(out, eos, 1);
    } else {
        trex_chat_msg *m = NULL;
        int n = 0;
        if ((rc = parse_messages(root, &m, &n, err)) != TREX_OK)
            goto out;
        rc = trex_chat_encode(t, m, n, out, err);
        free(m);
    }
out:
    cJSON_Delete(root);
    return rc;
}

trex_code trex_data_render_line(trex_data_format fmt, const char *line, size_t len, char **text, size_t *tlen,
                                trex_err *err)
{
    *text = NULL;
    *tlen = 0;
    cJSON *root = NULL;
    TREX_TRY(parse_line(line, len, &root, err));
    trex_code rc = TREX_OK;
    if (fmt == TREX_DATA_CPT) {
        const char *t = NULL;
        if ((rc = cpt_text(root, &t, err)) == TREX_OK) {
            size_t n = strlen(t), e = strlen(T_EOS);
            *text = trex_xmalloc(n + e + 1);
            memcpy(*text, t, n);
            memcpy(*text + n, T_EOS, e + 1);
            *tlen = n + e;
        }
    } else {
        trex_chat_msg *m = NULL;
        int n = 0;
        if ((rc = parse_messages(root, &m, &n, err)) == TREX_OK)
            rc = trex_chat_render(m, n, text, tlen, err);
        free(m);
    }
    cJSON_Delete(root);
    return rc;
}
