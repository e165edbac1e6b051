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

/* ---- bf16 compute copies (docs/params.md "bf16 compute copies") ---------------------------------------
 * bf16 copies of fp32 tensors that bf16 products read many times per optimizer step (the experts'
 * w1, w3, w2; as PANELS also the attention's projections), rounded to nearest even as
 * trex_f32_to_bf16 — the bytes the GEMM's packers make of the fp32 values, so a product that reads a
 * copy gives the bits of one that rounds the fp32 tensor while packing. Two layouts:
 *   TREX_WCOPY_ROWS    each tensor [rows, cols] becomes a bf16 matrix with rows `cols + TREX_WCOPY_PAD`
 *                      apart (not a power-of-two stride: the packers read 16-32 rows at once); the copies
 *                      lie in the order of the list with nothing between them (an expert's w1 and w3,
 *                      listed one after the other, form one [2 inter, d] matrix). About 2 bytes a weight.
 *   TREX_WCOPY_PANELS  each matrix M [mrows, cols] (a tensor, or tensors stacked with `join`: an
 *                      expert's [w1; w3]) is kept as the GEMM's packed B panels (kernels/kernels.h) of
 *                      both products that read it: `fwd` with op(B) = M^T (x M^T: N = mrows, K = cols)
 *                      and `bwd` with op(B) = M (dy M: N = cols, K = mrows); trex_wcopy_find_packed
 *                      gives them as trex_gemm_packed views. No per-call packing; about 4 bytes a weight.
 * A copy set follows a version counter of its source (`*source`, e.g. trex_weights.version): whoever
 * changes the source bumps the counter and rewrites the copies (trex_wcopy_refresh, or trex_wcopy_put
 * of every element); trex_wcopy_find(_packed) aborts on a copy older than its source (a stale copy is
 * a bug). */
#define TREX_WCOPY_PAD 32

typedef enum trex_wcopy_layout { TREX_WCOPY_ROWS, TREX_WCOPY_PANELS } trex_wcopy_layout;

struct trex_gemm_packed; /* kernels/kernels.h */

typedef struct trex_wcopy_tensor {
    const float *src;  /* fp32 [rows, cols], row-major, rows cols apart */
    int64_t rows, cols;
    uint16_t *dst;     /* ROWS: its copy, rows cols + TREX_WCOPY_PAD apart (filled by trex_wcopy_create) */
    bool join;         /* PANELS: stacked under the previous tensor of the list (same cols) in one matrix */
    /* PANELS, filled by trex_wcopy_create: the matrix's panels, its rows, this tensor's first row in it,
     * and (first tensor of a matrix only, else NULL) views of the panels */
    uint16_t *fwd, *bwd;
    int64_t mrows, row0;
    struct trex_gemm_packed *pf, *pb;
} trex_wcopy_tensor;

typedef struct trex_wcopy {
    int64_t n;              /* tensors, sorted by src */
    trex_wcopy_tensor *t;
    trex_wcopy_layout layout;
    uint16_t *b;            /* every copy, one block of `bytes` (region params of mem) */
    size_t bytes;
    trex_mem *mem;
    const uint64_t *source; /* the source's version counter */
    uint64_t version;       /* the source version the copies hold; UINT64_MAX before the first refresh */
} trex_wcopy;

/* Copies of the n tensors of list (distinct, non-overlapping sources) in the given layout, allocated but
 * not written (stale until trex_wcopy_refresh). TREX_ENOMEM with a message when out of memory;
 * TREX_EINVAL when a join does not match (PANELS: same cols as the previous tensor). */
trex_code trex_wcopy_create(trex_wcopy **out, const trex_wcopy_tensor *list, int64_t n,
                            trex_wcopy_layout layout, const uint64_t *source, trex_mem *mem,
                            trex_err *err);
void trex_wcopy_destroy(trex_wcopy *c); /* NULL is a no-op */
/* Bytes of copies of the tensors of list in a layout (what trex_wcopy_create allocates). */
size_t trex_wcopy_bytes(const trex_wcopy_tensor *list, int64_t n, trex_wcopy_layout layout);
/* Rewrites every copy from its source on the pool's threads (NULL: the calling thread) and records
 * the source's version. */
void trex_wcopy_refresh(trex_pool *pool, trex_wcopy *c);
/* Whether the copies hold the source's current version. */
bool trex_wcopy_fresh(const trex_wcopy *c);
/* ROWS: the copy of the tensor whose fp32 values start at src (its row stride in *ld), or NULL when src
 * is not a listed tensor, c is NULL or the layout is PANELS. Aborts when the copies are stale. */
const uint16_t *trex_wcopy_find(const trex_wcopy *c, const float *src, int64_t *ld);
/* PANELS: the packed B (a view over the copies) of the matrix whose first tensor starts at src: with
 * bwd false op(B) = M^T ([cols, mrows]), with bwd true op(B) = M ([mrows, cols]); NULL when src does not
 * start a matrix, c is NULL or the layout is ROWS. Aborts when the copies are stale. */
const struct trex_gemm_packed *trex_wcopy_find_packed(const trex_wcopy *c, const float *src, bool bwd);
/* For a writer that keeps the copies fresh itself (the optimizer, which writes each tensor's copy in the
 * pass that updates it): the index of the tensor whose values start at src (-1: none), and
 * trex_wcopy_put, which writes elements [rel, rel + len) of tensor k (row-major, from w = their new
 * values) into its copy in either layout, on the calling thread, without a staleness check. Writes of
 * disjoint elements write disjoint bytes of the copies (threads may write at once). */
int64_t trex_wcopy_index(const trex_wcopy *c, const float *src);
void trex_wcopy_put(const trex_wcopy *c, int64_t k, const float *w, int64_t rel, int64_t len);

/* The weights of one model replica in memory: fp32 values in `f`, integer tables in `i`. */
typedef struct trex_weights {
    const trex_config *cfg;
    trex_layout layout;
    float *f;
    int32_t *i;
    trex_mem *mem;
    /* Bumped by whoever changes f after init or load (trex_weights_changed); the bf16 copies record
     * the version they were written from. The struct must not move while bf16 is set. */
    uint64_t version;
    trex_wcopy *bf16; /* bf16 copies of weights (trex_weights_bf16_enable), or NULL */
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
void trex_weights_free(trex_weights *w); /* the bf16 copies too */

/* bf16 compute copies of every routed and shared expert's w1, w3, w2 (each expert's w1 and w3 form one
 * [2 inter, d] matrix) in the given layout, written now from f: about 2 bytes per expert weight with
 * TREX_WCOPY_ROWS (dsv4-bench: 0.99 GiB), 4 with TREX_WCOPY_PANELS (1.9 GiB), which also holds the
 * attention's and the indexer's projections except wo_a (+0.18 GiB), charged to region params.
 * For bf16 training: enable before creating the model (trex_model_create binds the copies), then call
 * trex_weights_changed after every change of f. A no-op when already enabled. TREX_ENOMEM with a
 * message when out of memory. */
trex_code trex_weights_bf16_enable(trex_pool *pool, trex_weights *w, trex_wcopy_layout layout,
                                   trex_err *err);
/* f has changed (an optimizer step, a load into f): bumps the version; then the bf16 copies, if any, are
 * rewritten on the pool's threads, unless copies_written says the writer already wrote every copy from
 * the new values (the optimizer's pass with trex_optimizer_set_copies). */
void trex_weights_changed(trex_pool *pool, trex_weights *w, bool copies_written);

static inline float *trex_weights_get(const trex_weights *w, const char *name)
{
    const trex_param *p = trex_layout_find(&w->layout, name);
    return p && !p->is_int ? w->f + p->offset : (float *)0;
}

#endif
