/* data/or/gen.c — `trex data or-gen`: plans the slots (task/doc type and family per slot), runs the
 * builders in forked worker processes, merges their results in slot order, applies the run-level
 * filters (instance dedup across SFT and CPT, exact and MinHash near-duplicate text, decontamination
 * against the eval sets), re-runs rejected slots with their next attempt, and writes sft.jsonl,
 * cpt.jsonl, manifest.json (deterministic) and run.json (timings) under temporary names, then renames.
 *
 * Determinism: a slot's result is a pure function of (seed, slot, attempt); workers only decide who
 * computes it, and the parent consumes results in slot order, so the bytes do not depend on the worker
 * count. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <Cbc_C_Interface.h>
#include <cjson/cJSON.h>
#include <glpk.h>

#include "gen.h"
#include "trex/prof.h"

#define MAX_ATTEMPTS 40
#define NHASH 128
#define NBANDS 32

/* ---------- a small open-addressing set of 64-bit keys ---------- */
typedef struct u64set {
    uint64_t *k;
    size_t cap, n;
} u64set;

static bool set_has(const u64set *s, uint64_t key)
{
    if (!s->cap)
        return false;
    key |= 1;
    for (size_t i = or_mix64(key) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (s->k[i] == key)
            return true;
        if (s->k[i] == 0)
            return false;
    }
}

static void set_add(u64set *s, uint64_t key)
{
    if ((s->n + 1) * 2 > s->cap) {
        u64set t = {trex_xcalloc(s->cap ? s->cap * 2 : 1024, sizeof(uint64_t)), s->cap ? s->cap * 2 : 1024, 0};
        for (size_t i = 0; i < s->cap; i++)
            if (s->k[i])
                set_add(&t, s->k[i]);
        free(s->k);
        *s = t;
    }
    key |= 1;
    size_t i;
    for (i = or_mix64(key) & (s->cap - 1); s->k[i] && s->k[i] != key; i = (i + 1) & (s->cap - 1)) {
    }
    if (!s->k[i]) {
        s->k[i] = key;
        s->n++;
    }
}

/* LSH buckets: band key -> chain of slots holding that band (open addressing over chain heads). */
typedef struct bucket_map {
    uint64_t *key;
    int64_t *head;
    size_t cap, n;
    int64_t *next_slot, *slot_of; /* chain entries */
    int64_t nent, capent;
} bucket_map;

static int64_t *bm_head(bucket_map *b, uint64_t key, bool create)
{
    if (create && (b->n + 1) * 2 > b->cap) {
        bucket_map t = {trex_xcalloc(b->cap ? b->cap * 2 : 4096, sizeof(uint64_t)),
                        trex_xmalloc((b->cap ? b->cap * 2 : 4096) * sizeof(int64_t)), b->cap ? b->cap * 2 : 4096, 0,
                        b->next_slot, b->slot_of, b->nent, b->capent};
        for (size_t i = 0; i < b->cap; i++)
            if (b->key[i]) {
                int64_t *h = bm_head(&t, b->key[i], true);
                *h = b->head[i];
            }
        free(b->key);
        free(b->head);
        *b = t;
    }
    if (!b->cap)
        return NULL;
    key |= 1;
    size_t i;
    for (i = or_mix64(key) & (b->cap - 1); b->key[i] && b->key[i] != key; i = (i + 1) & (b->cap - 1)) {
    }
    if (!b->key[i]) {
        if (!create)
            return NULL;
        b->key[i] = key;
        b->head[i] = -1;
        b->n++;
    }
    return &b->head[i];
}

static void bm_add(bucket_map *b, uint64_t key, int64_t slot_idx)
{
    int64_t *h = bm_head(b, key, true);
    if (b->nent == b->capent) {
        b->capent = b->capent ? b->capent * 2 : 4096;
        b->next_slot = trex_xrealloc(b->next_slot, (size_t)b->capent * sizeof(int64_t));
        b->slot_of = trex_xrealloc(b->slot_of, (size_t)b->capent * sizeof(int64_t));
    }
    b->slot_of[b->nent] = slot_idx;
    b->next_slot[b->nent] = *h;
    *h = b->nent++;
}

static void bm_free(bucket_map *b)
{
    free(b->key);
    free(b->head);
    free(b->next_slot);
    free(b->slot_of);
}

/* ---------- text fingerprints ---------- */
typedef struct words {
    uint64_t *h;
    int n;
} words;

static words split_words(const char *t)
{
    words w = {0};
    int cap = 0;
    const char *p = t;
    while (*p) {
        while (*p == ' ' || *p == '\n' || *p == '\t')
            p++;
        if (!*p)
            break;
        const char *s = p;
        while (*p && *p != ' ' && *p != '\n' && *p != '\t')
            p++;
        char buf[64];
        size_t n = (size_t)(p - s) < sizeof buf - 1 ? (size_t)(p - s) : sizeof buf - 1, k2 = 0;
        for (size_t k = 0; k < n; k++) {
            char c = s[k];
            if (c >= 'A' && c <= 'Z')
                c = (char)(c + 32);
            if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.')
                buf[k2++] = c;
        }
        while (k2 && buf[k2 - 1] == '.')
            k2--;
        if (!k2)
            continue;
        if (w.n == cap) {
            cap = cap ? cap * 2 : 256;
            w.h = trex_xrealloc(w.h, (size_t)cap * sizeof *w.h);
        }
        w.h[w.n++] = or_hash_bytes(buf, k2, 11);
    }
    return w;
}

static uint64_t ngram(const words *w, int at, int n)
{
    uint64_t h = (uint64_t)n;
    for (int k = 0; k < n; k++)
        h = or_hash2(h, w->h[at + k]);
    return h;
}

static void minhash(const words *w, uint32_t sig[NHASH])
{
    for (int k = 0; k < NHASH; k++)
        sig[k] = UINT32_MAX;
    int ns = w->n >= 5 ? w->n - 4 : 1;
    for (int s = 0; s < ns; s++) {
        uint64_t g = w->n >= 5 ? ngram(w, s, 5) : ngram(w, 0, w->n);
        for (int k = 0; k < NHASH; k++) {
            uint32_t v = (uint32_t)(or_hash2(g, (uint64_t)k) >> 32);
            if (v < sig[k])
                sig[k] = v;
        }
    }
}

static uint64_t exact_key(const char *t)
{
    /* lower-case, whitespace collapsed, digits kept */
    or_sb b = {0};
    bool sp = false;
    for (const char *p = t; *p; p++) {
        char c = *p;
        if (c == ' ' || c == '\n' || c == '\t') {
            sp = true;
            continue;
        }
        if (sp && b.len)
            or_sb_putc(&b, ' ');
        sp = false;
        or_sb_putc(&b, (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c);
    }
    uint64_t h = or_hash_bytes(b.s ? b.s : "", b.len, 3);
    or_sb_free(&b);
    return h;
}

static uint64_t number_fingerprint(const char *t)
{
    double v[512];
    int n = 0;
    for (const char *p = t; *p && n < 512;) {
        if ((*p >= '0' && *p <= '9') && (p == t || !((p[-1] >= 'a' && p[-1] <= 'z') || p[-1] == '_'))) {
            char *e;
            v[n++] = strtod(p, &e);
            p = e;
        } else
            p++;
    }
    for (int a = 1; a < n; a++) /* insertion sort: small n */
        for (int b = a; b > 0 && v[b - 1] > v[b]; b--) {
            double x = v[b];
            v[b] = v[b - 1];
            v[b - 1] = x;
        }
    return n < 3 ? 0 : or_hash_bytes(v, (size_t)n * sizeof *v, 5);
}

/* ---------- decontamination index ---------- */
typedef struct contam {
    u64set grams, numbers;
    int n_questions;
    bool loaded;
    char dir[512];
} contam;

static void contam_load(contam *c, const char *dir)
{
    memset(c, 0, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char *names[64];
    int nn = 0;
    while ((e = readdir(d)) != NULL && nn < 64) {
        size_t l = strlen(e->d_name);
        if (l > 6 && !strcmp(e->d_name + l - 6, ".jsonl"))
            names[nn++] = or_xstrdup(e->d_name);
    }
    closedir(d);
    for (int a = 1; a < nn; a++) /* sorted: the index does not depend on directory order */
        for (int b = a; b > 0 && strcmp(names[b - 1], names[b]) > 0; b--) {
            char *t = names[b];
            names[b] = names[b - 1];
            names[b - 1] = t;
        }
    for (int k = 0; k < nn; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        free(names[k]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        char *line = NULL;
        size_t cap = 0;
        while (getline(&line, &cap, f) > 0) {
            cJSON *j = cJSON_Parse(line);
            const cJSON *q = j ? cJSON_GetObjectItemCaseSensitive(j, "question") : NULL;
            if (cJSON_IsString(q)) {
                words w = split_words(q->valuestring);
                for (int s = 0; s + 13 <= w.n; s++)
                    set_add(&c->grams, ngram(&w, s, 13));
                uint64_t fp = number_fingerprint(q->valuestring);
                if (fp)
                    set_add(&c->numbers, fp);
                free(w.h);
                c->n_questions++;
            }
            cJSON_Delete(j);
        }
        free(line);
        fclose(f);
    }
    c->loaded = c->n_questions > 0;
}

static bool contam_hit(const contam *c, const char *text, char *why, size_t wl)
{
    if (!c->loaded)
        return false;
    words w = split_words(text);
    bool hit = false;
    for (int s = 0; s + 13 <= w.n && !hit; s++)
        if (set_has(&c->grams, ngram(&w, s, 13))) {
            snprintf(why, wl, "13-gram shared with an eval question");
            hit = true;
        }
    free(w.h);
    uint64_t fp = number_fingerprint(text);
    if (!hit && fp && set_has(&c->numbers, fp)) {
        snprintf(why, wl, "same number multiset as an eval question");
        hit = true;
    }
    return hit;
}

/* ---------- slot plan ---------- */
typedef struct slot {
    int kind; /* 0 SFT, 1 CPT */
    int task, family;
    int attempt; /* next attempt to try */
    bool done;
    char *line; /* accepted result */
    or_stat st;
} slot;

static void quota_fill(int *out, int64_t n, const double *share, int k, or_rng *r)
{
    int64_t cnt[8], tot = 0;
    double rem[8];
    for (int t = 0; t < k; t++) {
        double x = (double)n * share[t];
        cnt[t] = (int64_t)floor(x);
        rem[t] = share[t] > 0 ? x - (double)cnt[t] : -2; /* a left-out task never gets a remainder slot */
        tot += cnt[t];
    }
    while (tot < n) {
        int best = 0;
        for (int t = 1; t < k; t++)
            if (rem[t] > rem[best])
                best = t;
        cnt[best]++;
        rem[best] = -1;
        tot++;
    }
    int64_t at = 0;
    for (int t = 0; t < k; t++)
        for (int64_t q = 0; q < cnt[t]; q++)
            out[at++] = t;
    or_rng_shuffle(r, out, (int)n);
}

/* Families able to produce a verified infeasible variant (scaling a capacity or a requirement). */
static bool infeasible_capable(int f)
{
    const char *n = trex_or_family_name(f);
    static const char *const ok[] = {"blending",      "transportation",         "facility_location",
                                     "lot_sizing",    "assignment",             "set_cover",
                                     "bin_packing",   "transshipment",          "generalized_assignment",
                                     "portfolio",     "fixed_charge_transport", "tsp",
                                     "parallel_machines"};
    for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++)
        if (!strcmp(n, ok[k]))
            return true;
    return false;
}

/* The effective plan of a run: shares per task and document type, and the families in use (all of them,
 * with the built-in shares, unless --tasks / --families restrict them). */
typedef struct gen_plan {
    double task_share[OR_NTASK], doc_share[OR_NDOC];
    int fams[64], nfams;       /* families in use, in family order */
    int capable[64], ncapable; /* those of them that admit an infeasible variant */
} gen_plan;

/* Parses --tasks and --families into p. An unknown or repeated name, or an empty list, is bad input. */
static trex_code plan_make(gen_plan *p, const trex_or_gen_opts *o, trex_err *err)
{
    int nf = trex_or_family_count();
    TREX_ASSERT(nf <= 64);
    memcpy(p->task_share, or_task_share, sizeof p->task_share);
    memcpy(p->doc_share, or_doc_share, sizeof p->doc_share);
    bool use_task[OR_NTASK], use_fam[64];
    for (int t = 0; t < OR_NTASK; t++)
        use_task[t] = !o->tasks;
    for (int f = 0; f < nf; f++)
        use_fam[f] = !o->families;
    for (int list = 0; list < 2; list++) {
        const char *txt = list ? o->families : o->tasks, *flag = list ? "--families" : "--tasks";
        if (!txt)
            continue;
        for (const char *c = txt;; c++) {
            const char *e = strchr(c, ',');
            size_t len = e ? (size_t)(e - c) : strlen(c);
            int hit = -1, nk = list ? nf : OR_NTASK;
            for (int k = 0; k < nk && hit < 0; k++) {
                const char *name = list ? trex_or_family_name(k) : or_task_names[k];
                if (len && strlen(name) == len && !strncmp(name, c, len))
                    hit = k;
            }
            if (hit < 0 || (list ? use_fam[hit] : use_task[hit])) {
                char valid[1024] = "";
                for (int k = 0; k < nk; k++)
                    snprintf(valid + strlen(valid), sizeof valid - strlen(valid), "%s%s", k ? "," : "",
                             list ? trex_or_family_name(k) : or_task_names[k]);
                return trex_err_set(err, TREX_EINVAL, "%s %s: %s \"%.*s\"; give a comma-separated list of names "
                                    "from: %s", flag, txt, hit < 0 ? "unknown name" : "repeated name", (int)len, c,
                                    valid);
            }
            if (list)
                use_fam[hit] = true;
            else
                use_task[hit] = true;
            if (!e)
                break;
            c = e;
        }
    }
    p->nfams = p->ncapable = 0;
    for (int f = 0; f < nf; f++)
        if (use_fam[f]) {
            p->fams[p->nfams++] = f;
            if (infeasible_capable(f))
                p->capable[p->ncapable++] = f;
        }
    /* renormalise only when something is left out, so that an unrestricted plan keeps the exact shares */
    double sum = 0;
    for (int t = 0; t < OR_NTASK; t++)
        sum += use_task[t] ? p->task_share[t] : 0;
    if (o->tasks)
        for (int t = 0; t < OR_NTASK; t++)
            p->task_share[t] = use_task[t] ? p->task_share[t] / sum : 0;
    if (p->ncapable == 0) {
        p->doc_share[OR_DOC_INFEASIBLE] = 0;
        sum = 0;
        for (int t = 0; t < OR_NDOC; t++)
            sum += p->doc_share[t];
        for (int t = 0; t < OR_NDOC; t++)
            p->doc_share[t] /= sum;
    }
    return TREX_OK;
}

static void plan_slots(slot *s, int64_t n, int kind, uint64_t seed, const gen_plan *p)
{
    if (n == 0)
        return;
    int nf = p->nfams, ncap = p->ncapable;
    const int *capable = p->capable;
    int *tasks = trex_xmalloc((size_t)n * sizeof *tasks);
    or_rng r = or_rng_make(seed, kind ? 0xc0 : 0x50);
    quota_fill(tasks, n, kind ? p->doc_share : p->task_share, kind ? OR_NDOC : OR_NTASK, &r);
    /* families come in shuffled rounds per stream, so every family gets n/nf slots (+-1) */
    int64_t pos[2] = {0, 0};
    for (int64_t k = 0; k < n; k++) {
        bool inf = kind == 1 && tasks[k] == OR_DOC_INFEASIBLE;
        TREX_ASSERT(!inf || ncap > 0);
        int64_t q = pos[inf]++;
        int m = inf ? ncap : nf, pp[64];
        or_rng rr = or_rng_make(seed, (uint64_t)(kind * 2 + inf) * 1000003u + (uint64_t)(q / m));
        for (int f = 0; f < m; f++)
            pp[f] = f;
        or_rng_shuffle(&rr, pp, m);
        s[k].kind = kind;
        s[k].task = tasks[k];
        s[k].family = inf ? capable[pp[q % m]] : p->fams[pp[q % m]];
        s[k].attempt = 0;
    }
    free(tasks);
}

/* ---------- workers ---------- */
typedef struct rec_hdr {
    int64_t slot;    /* global index: SFT slots first, then CPT */
    int32_t attempt; /* the accepted attempt, or -1 when every attempt failed */
    int32_t rejects[OR_NREJ];
    or_stat st;
    uint64_t line_len, text_len;
} rec_hdr;

/* Characters (UTF-8 bytes) of an SFT record's message contents: what --max-chars bounds. */
static int64_t sft_chars(const char *line)
{
    cJSON *j = cJSON_Parse(line);
    TREX_ASSERT(j); /* our own record */
    int64_t n = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, cJSON_GetObjectItemCaseSensitive(j, "messages"))
    {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
        TREX_ASSERT(cJSON_IsString(c));
        n += (int64_t)strlen(c->valuestring);
    }
    cJSON_Delete(j);
    return n;
}

static void run_slot(const trex_or_gen_opts *o, const slot *s, int64_t gidx, int64_t local, FILE *out)
{
    rec_hdr h;
    memset(&h, 0, sizeof h);
    h.slot = gidx;
    h.attempt = -1;
    or_result res = {0};
    for (int a = s->attempt; a < s->attempt + MAX_ATTEMPTS; a++) {
        if (s->kind == 0)
            or_make_sft(o->seed, local, a, s->task, s->family, o->no_system, &res);
        else
            or_make_cpt(o->seed, local, a, s->task, s->family, &res);
        int r = res.reject;
        if (r == TREX_OR_ACCEPT && s->kind == 0 && o->max_chars > 0 && sft_chars(res.line) > o->max_chars)
            r = OR_REJ_OVER_MAX_CHARS;
        if (r == TREX_OR_ACCEPT) {
            h.attempt = a;
            break;
        }
        h.rejects[r]++;
        or_result_free(&res);
    }
    if (h.attempt >= 0) {
        or_stat *st = &h.st;
        st->family = res.family;
        st->task = res.task;
        st->rep = res.rep;
        st->tier = res.tier;
        st->mip = res.mip;
        st->maxsense = res.maxsense;
        st->unique = res.unique;
        st->infeasible = res.infeasible;
        st->int_gap = res.int_gap;
        st->n_vars = res.n_vars;
        st->n_rows = res.n_rows;
        st->nnz = res.nnz;
        st->glpk_ms = res.glpk_ms;
        st->cbc_ms = res.cbc_ms;
        st->user_len = res.user_len;
        st->asst_len = res.asst_len;
        st->canon = res.canon;
        snprintf(st->skin, sizeof st->skin, "%s", res.skin ? res.skin : "");
        snprintf(st->analysis, sizeof st->analysis, "%s", res.analysis_kind);
        st->kind = s->kind;
        /* opening words of the question (template-collapse detector) */
        size_t ol = 0;
        const char *t = res.dedup_text;
        if (!strncmp(t, "# ", 2)) { /* CPT: skip the title line */
            const char *nl = strstr(t, "\n\n");
            t = nl ? nl + 2 : t;
        }
        while (t[ol] && t[ol] != '.' && t[ol] != '\n' && ol < sizeof st->opening - 1)
            ol++;
        memcpy(st->opening, t, ol);
        st->opening[ol] = '\0';
        int wc = 0;
        for (size_t c = 0; c < ol; c++)
            if (st->opening[c] == ' ' && ++wc == 5) {
                st->opening[c] = '\0';
                break;
            }
        h.line_len = strlen(res.line);
        h.text_len = strlen(res.dedup_text);
    }
    fwrite(&h, sizeof h, 1, out);
    if (h.attempt >= 0) {
        fwrite(res.line, 1, h.line_len, out);
        fwrite(res.dedup_text, 1, h.text_len, out);
    }
    or_result_free(&res);
}

static trex_code run_round(const trex_or_gen_opts *o, slot *slots, int64_t n_sft, const int64_t *pend, int64_t np,
                           const char *tmpdir, char ***texts, int32_t (*rej)[OR_NREJ], int64_t *attempts,
                           trex_err *err)
{
    int W = o->workers > 0 ? o->workers : 2;
    if (W > np)
        W = (int)(np > 0 ? np : 1);
    pid_t pids[64];
    for (int w = 0; w < W; w++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/part-%d", tmpdir, w);
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0)
            return trex_err_set(err, TREX_EIO, "fork failed: %s", strerror(errno));
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* a killed or-gen takes its workers with it */
            if (getppid() == 1)
                _exit(5);
            FILE *f = fopen(path, "wb");
            if (!f)
                _exit(3);
            for (int64_t i = w; i < np; i += W) {
                int64_t g = pend[i];
                run_slot(o, &slots[g], g, g < n_sft ? g : g - n_sft, f);
            }
            _exit(fclose(f) == 0 ? 0 : 4);
        }
        pids[w] = pid;
    }
    trex_code rc = TREX_OK;
    for (int w = 0; w < W; w++) {
        int status = 0;
        waitpid(pids[w], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            rc = trex_err_set(err, TREX_EIO, "worker %d failed (status %d); no output was written", w, status);
    }
    if (rc != TREX_OK)
        return rc;
    for (int w = 0; w < W; w++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/part-%d", tmpdir, w);
        FILE *f = fopen(path, "rb");
        if (!f)
            return trex_err_set(err, TREX_EIO, "cannot read worker output %s", path);
        rec_hdr h;
        while (fread(&h, sizeof h, 1, f) == 1) {
            slot *s = &slots[h.slot];
            for (int c = 0; c < OR_NREJ; c++) {
                rej[s->kind][c] += h.rejects[c];
                attempts[s->kind] += h.rejects[c];
            }
            if (h.attempt < 0) {
                s->attempt += MAX_ATTEMPTS;
                continue;
            }
            attempts[s->kind]++;
            s->line = trex_xmalloc(h.line_len + 1);
            (*texts)[h.slot] = trex_xmalloc(h.text_len + 1);
            if (fread(s->line, 1, h.line_len, f) != h.line_len ||
                fread((*texts)[h.slot], 1, h.text_len, f) != h.text_len) {
                fclose(f);
                return trex_err_set(err, TREX_EIO, "worker output %s is truncated", path);
            }
            s->line[h.line_len] = '\0';
            (*texts)[h.slot][h.text_len] = '\0';
            s->st = h.st;
            s->attempt = h.attempt;
        }
        fclose(f);
        unlink(path);
    }
    return TREX_OK;
}

/* Rebuilds one slot in this process (after a run-level rejection), starting at its current attempt. */
static trex_code rebuild_slot(const trex_or_gen_opts *o, slot *s, int64_t k, int64_t n_sft, char **text,
                              int32_t (*rej)[OR_NREJ], int64_t *attempts, trex_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return trex_err_set(err, TREX_ENOMEM, "open_memstream failed");
    run_slot(o, s, k, k < n_sft ? k : k - n_sft, f);
    fclose(f);
    rec_hdr h;
    TREX_ASSERT(len >= sizeof h);
    memcpy(&h, buf, sizeof h);
    for (int c = 0; c < OR_NREJ; c++) {
        rej[s->kind][c] += h.rejects[c];
        attempts[s->kind] += h.rejects[c];
    }
    if (h.attempt < 0)
        s->attempt += MAX_ATTEMPTS;
    else {
        attempts[s->kind]++;
        s->line = trex_xmalloc(h.line_len + 1);
        memcpy(s->line, buf + sizeof h, h.line_len);
        s->line[h.line_len] = '\0';
        *text = trex_xmalloc(h.text_len + 1);
        memcpy(*text, buf + sizeof h + h.line_len, h.text_len);
        (*text)[h.text_len] = '\0';
        s->st = h.st;
        s->attempt = h.attempt;
    }
    free(buf);
    return TREX_OK;
}

/* ---------- output ---------- */
static trex_code write_atomic(const char *path, const char *data, size_t len, trex_err *err)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return trex_err_set(err, TREX_EIO, "%s: cannot create (%s)", tmp, strerror(errno));
    bool ok = fwrite(data, 1, len, f) == len && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return trex_err_set(err, TREX_EIO, "%s: write failed (%s)", path, strerror(errno));
    }
    return TREX_OK;
}

trex_code trex_or_gen(const trex_or_gen_opts *o, trex_err *err)
{
    trex_code rc = TREX_OK;
    double t0 = trex_wall_s();
    int64_t n = o->n_sft + o->n_cpt;
    gen_plan plan;
    if (o->max_chars < 0)
        return trex_err_set(err, TREX_EINVAL, "--max-chars %lld: give a bound >= 0 (0: none)", (long long)o->max_chars);
    if ((rc = plan_make(&plan, o, err)) != TREX_OK)
        return rc;
    if (mkdir(o->out_dir, 0777) != 0 && errno != EEXIST)
        return trex_err_set(err, TREX_EIO, "--out %s: cannot create the folder (%s)", o->out_dir, strerror(errno));
    char tmpdir[1100];
    snprintf(tmpdir, sizeof tmpdir, "%s/.or-gen-tmp.%d", o->out_dir, (int)getpid());
    if (mkdir(tmpdir, 0777) != 0)
        return trex_err_set(err, TREX_EIO, "%s: cannot create a work folder (%s)", tmpdir, strerror(errno));
    slot *slots = trex_xcalloc((size_t)n + 1, sizeof *slots);
    char **texts = trex_xcalloc((size_t)n + 1, sizeof *texts);
    plan_slots(slots, o->n_sft, 0, o->seed, &plan);
    plan_slots(slots + o->n_sft, o->n_cpt, 1, o->seed, &plan);
    contam ct;
    const char *edir = o->eval_dir ? o->eval_dir : "../shared/or/eval";
    contam_load(&ct, edir);
    if (!ct.loaded && o->eval_dir) {
        rmdir(tmpdir);
        free(slots);
        free(texts);
        return trex_err_set(err, TREX_ENOTFOUND, "--eval-dir %s: no eval rows (*.jsonl with \"question\") found; "
                                                 "point it at the shared eval folder", o->eval_dir);
    }
    if (!ct.loaded && !o->quiet)
        fprintf(stderr, "or-gen: warning: no eval rows under %s; decontamination is off (the manifest says so)\n",
                edir);
    int32_t rej[2][OR_NREJ] = {{0}};
    int64_t attempts[2] = {0, 0}, *pend = trex_xmalloc((size_t)n * sizeof *pend), np = 0;
    for (int64_t k = 0; k < n; k++)
        pend[np++] = k;
    u64set seen_inst = {0}, seen_text = {0};
    bucket_map bands = {0};
    uint32_t (*sigs)[NHASH] = trex_xcalloc((size_t)n + 1, sizeof *sigs);
    int64_t dedup_exact = 0, dedup_near = 0, dedup_inst = 0, contam_hits = 0, redo = 0;
    if (!o->quiet)
        fprintf(stderr, "or-gen: building %lld slots with %d worker(s)\n", (long long)np, o->workers);
    rc = run_round(o, slots, o->n_sft, pend, np, tmpdir, &texts, rej, attempts, err);
    if (rc != TREX_OK)
        goto out;
    /* Run-level filters in slot order. A slot that fails one is rebuilt here, in this process, with its
     * next attempt: every decision depends only on earlier slots, so the result is worker-independent. */
    for (int64_t k = 0; k < n; k++) {
        slot *s = &slots[k];
        for (int tries = 0;; tries++) {
            if (!s->line) {
                if (tries > 8 || s->attempt > 4 * MAX_ATTEMPTS) {
                    rc = trex_err_set(err, TREX_ESOLVER,
                                      "slot %lld (%s, family %s) could not be filled: every attempt was "
                                      "rejected (no output written; try another --seed%s)",
                                      (long long)k, s->kind ? or_doc_names[s->task] : or_task_names[s->task],
                                      trex_or_family_name(s->family),
                                      o->max_chars > 0 && !s->kind ? ", a larger --max-chars or other --families"
                                                                   : "");
                    goto out;
                }
                rc = rebuild_slot(o, s, k, o->n_sft, &texts[k], rej, attempts, err);
                if (rc != TREX_OK)
                    goto out;
                redo++;
                continue;
            }
            char why[128];
            trex_or_reject r = TREX_OR_ACCEPT;
            uint64_t ek = or_hash2(exact_key(texts[k]), (uint64_t)s->kind);
            uint64_t fam_key = (uint64_t)(s->kind * 1000 + s->task * 100 + s->st.family);
            if (set_has(&seen_inst, s->st.canon))
                r = TREX_OR_REJ_DUP_INSTANCE;
            else if (set_has(&seen_text, ek))
                r = TREX_OR_REJ_DUP_TEXT;
            else if (contam_hit(&ct, texts[k], why, sizeof why))
                r = TREX_OR_REJ_CONTAM;
            else {
                words w = split_words(texts[k]);
                minhash(&w, sigs[k]);
                free(w.h);
                /* candidates share a band within the same stream, task and family; the full signatures
                 * decide (a pair is compared once even when it shares several bands) */
                for (int b = 0; b < NBANDS && r == TREX_OR_ACCEPT; b++) {
                    uint64_t bk = or_hash2(or_hash_bytes(&sigs[k][b * 4], 16, (uint64_t)b), fam_key);
                    int64_t *h = bm_head(&bands, bk, false);
                    for (int64_t e = h ? *h : -1; e >= 0 && r == TREX_OR_ACCEPT; e = bands.next_slot[e]) {
                        int64_t q = bands.slot_of[e];
                        bool earlier_band = false;
                        for (int b2 = 0; b2 < b && !earlier_band; b2++)
                            earlier_band = !memcmp(&sigs[q][b2 * 4], &sigs[k][b2 * 4], 16);
                        if (earlier_band)
                            continue;
                        int eq = 0;
                        for (int hh = 0; hh < NHASH; hh++)
                            eq += sigs[q][hh] == sigs[k][hh];
                        if (eq >= (int)(0.85 * NHASH))
                            r = TREX_OR_REJ_NEAR_DUP_TEXT;
                    }
                }
            }
            if (r == TREX_OR_ACCEPT) {
                set_add(&seen_inst, s->st.canon);
                set_add(&seen_text, ek);
                for (int b = 0; b < NBANDS; b++)
                    bm_add(&bands, or_hash2(or_hash_bytes(&sigs[k][b * 4], 16, (uint64_t)b), fam_key), k);
                free(texts[k]);
                texts[k] = NULL;
                break;
            }
            rej[s->kind][r]++;
            dedup_exact += r == TREX_OR_REJ_DUP_TEXT;
            dedup_near += r == TREX_OR_REJ_NEAR_DUP_TEXT;
            dedup_inst += r == TREX_OR_REJ_DUP_INSTANCE;
            contam_hits += r == TREX_OR_REJ_CONTAM;
            free(s->line);
            s->line = NULL;
            free(texts[k]);
            texts[k] = NULL;
            s->attempt++;
        }
    }
    /* write outputs */
    {
        or_sb sft = {0}, cpt = {0};
        for (int64_t k = 0; k < n; k++) {
            or_sb *b = slots[k].kind ? &cpt : &sft;
            or_sb_put(b, slots[k].line);
            or_sb_putc(b, '\n');
        }
        char path[1200];
        snprintf(path, sizeof path, "%s/sft.jsonl", o->out_dir);
        rc = write_atomic(path, sft.s ? sft.s : "", sft.len, err);
        snprintf(path, sizeof path, "%s/cpt.jsonl", o->out_dir);
        if (rc == TREX_OK)
            rc = write_atomic(path, cpt.s ? cpt.s : "", cpt.len, err);
        or_sb_free(&sft);
        or_sb_free(&cpt);
        if (rc != TREX_OK)
            goto out;
        or_gen_summary sum = {.seed = o->seed, .n_sft = o->n_sft, .n_cpt = o->n_cpt, .dedup_exact = dedup_exact,
                              .dedup_near = dedup_near, .dedup_instance = dedup_inst, .contam_hits = contam_hits,
                              .contam_loaded = ct.loaded, .contam_questions = ct.n_questions, .rebuilt = redo};
        snprintf(sum.eval_dir, sizeof sum.eval_dir, "%s", edir);
        memcpy(sum.task_share, plan.task_share, sizeof sum.task_share);
        memcpy(sum.doc_share, plan.doc_share, sizeof sum.doc_share);
        for (int f = 0; f < plan.nfams; f++)
            sum.fam_used[plan.fams[f]] = true;
        sum.restricted = o->tasks || o->families;
        sum.max_chars = o->max_chars;
        memcpy(sum.rejects, rej, sizeof rej);
        memcpy(sum.attempts, attempts, sizeof attempts);
        or_stat *st = trex_xmalloc((size_t)n * sizeof *st);
        for (int64_t k = 0; k < n; k++)
            st[k] = slots[k].st;
        char *man = or_manifest_json(&sum, st, n, false);
        snprintf(path, sizeof path, "%s/manifest.json", o->out_dir);
        rc = write_atomic(path, man, strlen(man), err);
        free(man);
        sum.wall_s = trex_wall_s() - t0;
        sum.workers = o->workers;
        char *run = or_manifest_json(&sum, st, n, true);
        snprintf(path, sizeof path, "%s/run.json", o->out_dir);
        if (rc == TREX_OK)
            rc = write_atomic(path, run, strlen(run), err);
        free(run);
        free(st);
        if (!o->quiet && rc == TREX_OK)
            fprintf(stderr, "or-gen: wrote %lld SFT samples and %lld CPT documents to %s in %.1f s\n",
                    (long long)o->n_sft, (long long)o->n_cpt, o->out_dir, trex_wall_s() - t0);
    }
out:
    for (int64_t k = 0; k < n; k++) {
        free(slots[k].line);
        free(texts[k]);
    }
    free(slots);
    free(texts);
    free(pend);
    free(sigs);
    free(seen_inst.k);
    free(seen_text.k);
    bm_free(&bands);
    free(ct.grams.k);
    free(ct.numbers.k);
    rmdir(tmpdir);
    return rc;
}
