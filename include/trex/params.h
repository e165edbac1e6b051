/* trex/params.h — the parameter layout of a DeepSeek-V4 model and its weights in memory.
 *
 * The layout lists every tensor of MODEL_SPEC §7.1 (official names, no `.scale` tensors: trex holds
 * dequantised weights) with its shape, role and place in one flat fp32 buffer (integer tables such as
 * `tid2eid` live in a separate int32 buffer). It is computed from the config alone — `trex model info`
 * counts parameters of V4-Pro without allocating them — and the same layout sizes the runtime's
 * parameter, gradient and optimizer regions. Order: embed, layers 0..L-1, mtp.0, hc_head_*, norm, head;
 * inside a block: hc_attn_*, attn_norm, attn.*, hc_ffn_*, ffn_norm, ffn.* (gate, experts 0..E-1 with
 * w1 w3 w2, shared_experts w1 w3 w2), then for mtp.0 its e_proj, h_proj, enorm, hnorm, norm, hc_head_*. */
#ifndef TREX_PARAMS_H
#define TREX_PARAMS_H

#include <stdbool.h>
#include <stdint.h>

#include "trex/alloc.h"
#include "trex/config.h"
#include "trex/pool.h"
#include "trex/status.h"

typedef enum trex_param_kind {
    TREX_P_EMBED,
    TREX_P_HEAD,
    TREX_P_NORM,          /* every RMSNorm weight */
    TREX_P_HC_FN,         /* hc_*_fn matrices */
    TREX_P_HC_BASE,
    TREX_P_HC_SCALE,
    TREX_P_ATTN,          /* wq_a wq_b wkv wo_a wo_b */
    TREX_P_ATTN_SINK,
    TREX_P_COMPRESSOR,    /* compressor wkv/wgate (attention's and the indexer's) */
    TREX_P_APE,           /* compressor ape */
    TREX_P_INDEXER,       /* indexer wq_b, weights_proj */
    TREX_P_GATE,          /* ffn.gate.weight */
    TREX_P_GATE_BIAS,     /* ffn.gate.bias: rule-updated, not trainable */
    TREX_P_TID2EID,       /* ffn.gate.tid2eid: fixed int table, not trainable */
    TREX_P_EXPERT,        /* routed expert w1/w2/w3 */
    TREX_P_SHARED_EXPERT,
    TREX_P_MTP_PROJ,      /* mtp.0.e_proj / h_proj */
    TREX_P_KIND_COUNT
} trex_param_kind;

#define TREX_PARAM_NAME 96

typedef struct trex_param {
    char name[TREX_PARAM_NAME]; /* official checkpoint name, e.g. "layers.3.attn.wq_a.weight" */
    int ndim;
    int64_t shape[2];
    int64_t numel;
    int64_t layer;         /* -1 for global tensors, 0..L-1, L = the MTP block */
    int64_t expert;        /* routed expert index, else -1 */
    trex_param_kind kind;
    bool trainable;
    bool is_int;           /* lives in the int32 buffer */
    int64_t offset;        /* element offset in its buffer; a multiple of TREX_PARAM_ALIGN */
} trex_param;

/* Every tensor starts at a multiple of 16 elements (64 bytes) of its buffer; the gaps are zero. */
#define TREX_PARAM_ALIGN 16

typedef struct trex_layout {
    int64_t count;
    trex_param *params;
    int64_t n_float;       /* elements of the fp32 buffer */
    int64_t n_int;         /* elements of the int32 buffer */
    int64_t n_trainable;   /* trainable fp32 elements */
    void *index;           /* name lookup (private) */
} trex_layout;

trex_code trex_layout_build(trex_layout *lay, const trex_config *cfg, trex_err *err);
void trex_layout_free(trex_layout *lay);
/* NULL when absent. O(1) average. */
const trex_param *trex_layout_find(const trex_layout *lay, const char *name);

/* Parameter counts of a layout under MODEL_SPEC §7.1's rule (every tensor except `.scale`, which
 * trex does not hold, and `tid2eid`), split as MODEL_SPEC §1.3 reports them. */
typedef struct trex_attn_count {
    int ratio;             /* compress ratio: 0 SWA, 4 CSA, other HCA */
    int64_t layers;        /* main layers with this ratio */
    int64_t per_layer;     /* attention parameters of one such layer (everything under `attn.`) */
} trex_attn_count;

typedef struct trex_param_counts {
    /* main model: global tensors and layers 0..L-1, no MTP */
    int64_t embed, head;
    int64_t attn;          /* everything under `layers.{i}.attn.` (q_norm, kv_norm, compressor, indexer) */
    int64_t routed;        /* all routed experts */
    int64_t shared;        /* shared experts */
    int64_t gate;          /* router gate.weight and gate.bias */
    int64_t hc;            /* mHC: hc_attn_*, hc_ffn_*, hc_head_* */
    int64_t norm;          /* attn_norm, ffn_norm and the final norm */
    int64_t total;         /* sum of the above */
    int64_t routed_active; /* num_experts_per_tok of n_routed_experts experts in every layer */
    int64_t active;        /* per token: total - embed - routed + routed_active (head counted) */
    int64_t mtp;           /* the MTP block mtp.0.* (embedding and head are shared, not counted) */
    int64_t mtp_attn;      /* its attention part */
    int64_t mtp_active;    /* its per-token part (K of E experts) */
    int64_t total_with_mtp;
    int64_t not_counted;   /* elements of tid2eid tables */
    int n_attn;            /* distinct ratios among main layers, in ascending order */
    trex_attn_count attn_by_ratio[TREX_MAX_LAYERS];
} trex_param_counts;

void trex_layout_count(const trex_layout *lay, const trex_config *cfg, trex_param_counts *out);

/* The weights of one model replica in memory: fp32 values in `f`, integer tables in `i`. */
typedef struct trex_weights {
    const trex_config *cfg;
    trex_layout layout;
    float *f;
    int32_t *i;
    trex_mem *mem;
} trex_weights;

/* Allocates the buffers and initialises them (docs/model-conventions.md "Initialisation") from seed. */
trex_code trex_weights_init(trex_weights *w, const trex_config *cfg, uint64_t seed, trex_mem *mem,
                            trex_err *err);
/* The same on the pool's threads (NULL: the calling thread): the same values for any thread count. */
trex_code trex_weights_init_pool(trex_pool *pool, trex_weights *w, const trex_config *cfg, uint64_t seed,
                                 trex_mem *mem, trex_err *err);
/* Allocates and loads from a safetensors file: every tensor of the layout must be present with its
 * shape (F32, BF16 or F16; tid2eid I64 or I32, in range, distinct experts per row); extra tensors
 * are an error too. Messages name the file and the tensor. */
trex_code trex_weights_load(trex_weights *w, const trex_config *cfg, const char *path, trex_mem *mem,
                            trex_err *err);
/* Writes every tensor in layout order (F32; tid2eid I64), atomically. */
trex_code trex_weights_save(const trex_weights *w, const char *path, trex_err *err);
void trex_weights_free(trex_weights *w);

static inline float *trex_weights_get(const trex_weights *w, const char *name)
{
    const trex_param *p = trex_layout_find(&w->layout, name);
    return p && !p->is_int ? w->f + p->offset : (float *)0;
}

#endif
