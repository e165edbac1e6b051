/* data/or/gen.h — the or-gen pipeline's per-sample statistics and the manifest writer (not exported). */
#ifndef TREX_DATA_OR_GEN_H
#define TREX_DATA_OR_GEN_H

#include "tasks.h"

/* The rejection taxonomy of or-gen: the verification codes of trex_or_reject plus the generator's own
 * length bound (--max-chars), which has no meaning outside a run with that option. */
#define OR_REJ_OVER_MAX_CHARS ((int)TREX_OR_REJ_COUNT)
#define OR_NREJ (OR_REJ_OVER_MAX_CHARS + 1)
const char *or_reject_name(int code);

typedef struct or_stat {
    int kind; /* 0 SFT, 1 CPT */
    int family, task, rep, tier;
    bool mip, unique, infeasible, maxsense;
    double int_gap;
    int n_vars, n_rows;
    int64_t nnz;
    double glpk_ms, cbc_ms;
    int64_t user_len, asst_len;
    uint64_t canon;
    char skin[24];
    char analysis[24];
    char opening[64];
} or_stat;

typedef struct or_gen_summary {
    uint64_t seed;
    int64_t n_sft, n_cpt;
    int32_t rejects[2][OR_NREJ];
    int64_t attempts[2];
    int64_t dedup_exact, dedup_near, dedup_instance, contam_hits, rebuilt;
    bool contam_loaded;
    int contam_questions;
    char eval_dir[512];
    int workers;
    double wall_s;
    /* the effective plan: task and document-type shares, the families used (fam_used[f]), the bound */
    double task_share[OR_NTASK], doc_share[OR_NDOC];
    bool fam_used[64];
    bool restricted; /* --tasks or --families given (the configuration records the plan) */
    int64_t max_chars;
} or_gen_summary;

/* manifest.json (timing = false: deterministic content only) or run.json (timing = true). */
char *or_manifest_json(const or_gen_summary *s, const or_stat *st, int64_t n, bool timing);

#endif
