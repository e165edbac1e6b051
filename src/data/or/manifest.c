/* data/or/manifest.c — the or-gen manifest (OR_PIPELINE 5.13): counts by task, family, representation
 * and difficulty, the stage funnel with per-code rejections, model-size quantiles per family, the
 * integrality-gap histogram, uniqueness rate, text lengths, skins, opening-phrase frequencies, versions
 * and the configuration. Timings go to run.json so that manifest.json is a pure function of the seed. */
#include <glpk.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <Cbc_C_Interface.h>
#include <cjson/cJSON.h>

#include "gen.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static cJSON *quantiles(double *v, int64_t n)
{
    cJSON *o = cJSON_CreateObject();
    if (n == 0)
        return o;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    static const double qs[] = {0.1, 0.5, 0.9, 0.99};
    static const char *const names[] = {"p10", "p50", "p90", "p99"};
    for (int k = 0; k < 4; k++)
        cJSON_AddNumberToObject(o, names[k], v[(int64_t)floor(qs[k] * (double)(n - 1))]);
    cJSON_AddNumberToObject(o, "max", v[n - 1]);
    return o;
}

static void bump(cJSON *obj, const char *key)
{
    cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (it)
        cJSON_SetNumberValue(it, it->valuedouble + 1);
    else
        cJSON_AddNumberToObject(obj, key, 1);
}

static cJSON *child(cJSON *obj, const char *key)
{
    cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it) {
        it = cJSON_CreateObject();
        cJSON_AddItemToObject(obj, key, it);
    }
    return it;
}

const char *or_reject_name(int code)
{
    return code == OR_REJ_OVER_MAX_CHARS ? "OVER_MAX_CHARS" : trex_or_reject_str((trex_or_reject)code);
}

static const char *gap_bin(double g)
{
    if (isnan(g))
        return "LP";
    if (g < 1e-9)
        return "0";
    if (g <= 0.01)
        return "(0,1%]";
    if (g <= 0.05)
        return "(1%,5%]";
    if (g <= 0.2)
        return "(5%,20%]";
    return ">20%";
}

char *or_manifest_json(const or_gen_summary *s, const or_stat *st, int64_t n, bool timing)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "gen_version", OR_GEN_VERSION);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)s->seed);
    cJSON_AddStringToObject(root, "seed", seed);
    cJSON *tools = cJSON_AddObjectToObject(root, "tools");
    cJSON_AddStringToObject(tools, "glpk", glp_version());
    cJSON_AddStringToObject(tools, "cbc", Cbc_getVersion());
    if (timing) {
        cJSON_AddNumberToObject(root, "wall_seconds", round(s->wall_s * 10) / 10);
        cJSON_AddNumberToObject(root, "workers", s->workers);
        double *g = malloc((size_t)(n + 1) * sizeof *g), *c = malloc((size_t)(n + 1) * sizeof *c);
        TREX_ASSERT(g && c);
        for (int64_t k = 0; k < n; k++) {
            g[k] = round(st[k].glpk_ms * 1000) / 1000;
            c[k] = round(st[k].cbc_ms * 1000) / 1000;
        }
        cJSON *ms = cJSON_AddObjectToObject(root, "solve_ms_primary");
        cJSON_AddItemToObject(ms, "glpk", quantiles(g, n));
        cJSON_AddItemToObject(ms, "cbc", quantiles(c, n));
        free(g);
        free(c);
        char *out = cJSON_Print(root);
        cJSON_Delete(root);
        return out;
    }
    /* configuration */
    cJSON *cfg = cJSON_AddObjectToObject(root, "config");
    cJSON *ts = cJSON_AddObjectToObject(cfg, "task_share"), *ds = cJSON_AddObjectToObject(cfg, "doc_share");
    /* the effective plan: without --tasks / --families these are the built-in shares and every family */
    for (int t = 0; t < OR_NTASK; t++)
        cJSON_AddNumberToObject(ts, or_task_names[t], s->task_share[t]);
    for (int t = 0; t < OR_NDOC; t++)
        cJSON_AddNumberToObject(ds, or_doc_names[t], s->doc_share[t]);
    cJSON *fams = cJSON_AddArrayToObject(cfg, "families");
    for (int f = 0; f < trex_or_family_count(); f++)
        if (s->fam_used[f])
            cJSON_AddItemToArray(fams, cJSON_CreateString(trex_or_family_name(f)));
    cJSON_AddStringToObject(cfg, "family_balance", "equal shares per stream (+-1); infeasibility_case documents "
                                                   "use the families that admit a verified infeasible variant");
    if (s->restricted)
        cJSON_AddStringToObject(cfg, "restricted", "--tasks / --families: the shares and families above are "
                                                   "the effective ones");
    if (s->max_chars > 0)
        cJSON_AddNumberToObject(cfg, "max_sft_chars", (double)s->max_chars);
    char *cfgtxt = cJSON_PrintUnformatted(cfg);
    char ch[24];
    snprintf(ch, sizeof ch, "%016llx", (unsigned long long)or_hash_bytes(cfgtxt, strlen(cfgtxt), 1));
    free(cfgtxt);
    cJSON_AddStringToObject(root, "config_hash", ch);
    cJSON *cnt = cJSON_AddObjectToObject(root, "counts");
    cJSON_AddNumberToObject(cnt, "sft", (double)s->n_sft);
    cJSON_AddNumberToObject(cnt, "cpt", (double)s->n_cpt);
    /* per stream breakdowns */
    for (int kind = 0; kind < 2; kind++) {
        cJSON *k = cJSON_AddObjectToObject(root, kind ? "cpt" : "sft");
        cJSON *bt = cJSON_AddObjectToObject(k, kind ? "by_doc_type" : "by_task");
        cJSON *bf = cJSON_AddObjectToObject(k, "by_family");
        cJSON *br = cJSON_AddObjectToObject(k, "by_representation");
        cJSON *bd = cJSON_AddObjectToObject(k, "by_difficulty");
        cJSON *tf = cJSON_AddObjectToObject(k, kind ? "doc_type_x_family" : "task_x_family");
        cJSON *ak = kind ? NULL : cJSON_AddObjectToObject(k, "analysis_kinds");
        for (int64_t q = 0; q < n; q++) {
            const or_stat *x = &st[q];
            if (x->kind != kind)
                continue;
            const char *tn = kind ? or_doc_names[x->task] : or_task_names[x->task];
            bump(bt, tn);
            bump(bf, trex_or_family_name(x->family));
            bump(br, or_rep_names[x->rep]);
            bump(bd, x->tier == 0 ? "small" : x->tier == 1 ? "medium" : "large");
            bump(child(tf, tn), trex_or_family_name(x->family));
            if (ak && x->analysis[0])
                bump(ak, x->analysis);
        }
        /* funnel */
        cJSON *fu = cJSON_AddObjectToObject(k, "funnel");
        cJSON_AddNumberToObject(fu, "attempted", (double)s->attempts[kind]);
        cJSON *rj = cJSON_AddObjectToObject(fu, "rejected");
        int64_t tot = 0;
        for (int c = 1; c < OR_NREJ; c++)
            if (s->rejects[kind][c]) {
                cJSON_AddNumberToObject(rj, or_reject_name(c), s->rejects[kind][c]);
                tot += s->rejects[kind][c];
            }
        cJSON_AddNumberToObject(fu, "rejected_total", (double)tot);
        cJSON_AddNumberToObject(fu, "written", (double)(kind ? s->n_cpt : s->n_sft));
    }
    /* models per family */
    cJSON *fm = cJSON_AddObjectToObject(root, "families");
    int nf = trex_or_family_count();
    double *v1 = malloc((size_t)(n + 1) * sizeof *v1), *v2 = malloc((size_t)(n + 1) * sizeof *v2),
           *v3 = malloc((size_t)(n + 1) * sizeof *v3);
    TREX_ASSERT(v1 && v2 && v3);
    for (int f = 0; f < nf; f++) {
        int64_t m = 0, mip = 0, mx = 0;
        cJSON *o = cJSON_AddObjectToObject(fm, trex_or_family_name(f));
        cJSON *tiers = cJSON_CreateObject();
        cJSON *skins = cJSON_CreateObject();
        for (int64_t q = 0; q < n; q++) {
            if (st[q].family != f)
                continue;
            v1[m] = st[q].n_vars;
            v2[m] = st[q].n_rows;
            v3[m] = (double)st[q].nnz;
            mip += st[q].mip;
            mx += st[q].maxsense;
            bump(tiers, st[q].tier == 0 ? "small" : st[q].tier == 1 ? "medium" : "large");
            bump(skins, st[q].skin);
            m++;
        }
        cJSON_AddNumberToObject(o, "instances", (double)m);
        cJSON_AddNumberToObject(o, "milp_share", m ? round(1000.0 * mip / m) / 1000 : 0);
        cJSON_AddNumberToObject(o, "max_sense_share", m ? round(1000.0 * mx / m) / 1000 : 0);
        cJSON_AddItemToObject(o, "vars", quantiles(v1, m));
        cJSON_AddItemToObject(o, "rows", quantiles(v2, m));
        cJSON_AddItemToObject(o, "nnz", quantiles(v3, m));
        cJSON_AddItemToObject(o, "difficulty", tiers);
        cJSON_AddItemToObject(o, "skins", skins);
    }
    /* integrality gap, uniqueness */
    cJSON *gh = cJSON_AddObjectToObject(root, "integrality_gap_histogram");
    int64_t uniq = 0, feas = 0;
    for (int64_t q = 0; q < n; q++) {
        if (st[q].infeasible)
            continue;
        bump(gh, gap_bin(st[q].int_gap));
        uniq += st[q].unique;
        feas++;
    }
    cJSON_AddNumberToObject(root, "unique_optimum_rate", feas ? round(1000.0 * uniq / feas) / 1000 : 0);
    /* lengths */
    cJSON *ln = cJSON_AddObjectToObject(root, "lengths_chars");
    int64_t m1 = 0, m2 = 0, m3 = 0;
    for (int64_t q = 0; q < n; q++) {
        if (st[q].kind == 0) {
            v1[m1++] = (double)st[q].user_len;
            v2[m2++] = (double)st[q].asst_len;
        } else
            v3[m3++] = (double)st[q].asst_len;
    }
    cJSON_AddItemToObject(ln, "sft_user", quantiles(v1, m1));
    cJSON_AddItemToObject(ln, "sft_assistant", quantiles(v2, m2));
    cJSON_AddItemToObject(ln, "cpt_text", quantiles(v3, m3));
    cJSON_AddStringToObject(ln, "note", "characters; token counts need the tokenizer (not built yet); at about 4 "
                                        "characters per token every sample is far below 8192 tokens");
    free(v1);
    free(v2);
    free(v3);
    /* dedup and decontamination */
    cJSON *dd = cJSON_AddObjectToObject(root, "dedup");
    cJSON_AddNumberToObject(dd, "exact_text", (double)s->dedup_exact);
    cJSON_AddNumberToObject(dd, "near_duplicate_minhash", (double)s->dedup_near);
    cJSON_AddNumberToObject(dd, "duplicate_instance", (double)s->dedup_instance);
    cJSON_AddStringToObject(dd, "near_dup_rule", "MinHash over word 5-grams, 128 hashes, LSH 32x4, drop at "
                                                 "estimated Jaccard >= 0.85 within the same family and task");
    cJSON *dc = cJSON_AddObjectToObject(root, "decontamination");
    cJSON_AddStringToObject(dc, "eval_dir", s->eval_dir);
    cJSON_AddBoolToObject(dc, "loaded", s->contam_loaded);
    cJSON_AddNumberToObject(dc, "eval_questions", s->contam_questions);
    cJSON_AddNumberToObject(dc, "hits", (double)s->contam_hits);
    cJSON_AddStringToObject(dc, "rule", "reject on any shared 13-gram of words or an identical multiset of numbers");
    /* openings: top 5 per stream */
    cJSON *op = cJSON_AddObjectToObject(root, "top_openings");
    for (int kind = 0; kind < 2; kind++) {
        cJSON *counts = cJSON_CreateObject();
        for (int64_t q = 0; q < n; q++)
            if (st[q].kind == kind)
                bump(counts, st[q].opening);
        cJSON *arr = cJSON_AddArrayToObject(op, kind ? "cpt" : "sft");
        for (int t = 0; t < 5; t++) {
            cJSON *best = NULL;
            for (cJSON *it = counts->child; it; it = it->next)
                if (it->valuedouble > 0 && (!best || it->valuedouble > best->valuedouble))
                    best = it;
            if (!best)
                break;
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateString(best->string));
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(best->valuedouble));
            cJSON_AddItemToArray(arr, pair);
            cJSON_SetNumberValue(best, -1);
        }
        cJSON_Delete(counts);
    }
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    return out;
}
