/* train/checkpoint.c — RUN/step-N checkpoints: save (temporary directory, fsync, rename, latest, keep
 * the last K), find the latest, verify against the manifest, read the trainer state, load.
 *
 * Crash safety rests on three facts: each file is written under a temporary name, fsynced and renamed
 * (trex_file_atomic_* and the safetensors writer do this); the checkpoint directory only gets its final
 * name after every file and the directory itself are durable; deletion of an old checkpoint starts
 * with a rename away from the step-N pattern. So at any instant every RUN/step-N directory with a
 * manifest.json is complete, and the newest complete one is the one with the highest N. */
#include "trex/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trex/io.h"

#define CKPT_PATH 4096
#define MANIFEST "manifest.json"
#define MODEL_FILE "model.safetensors"
#define OPTIM_FILE "optim.safetensors"
#define TRAINER_FILE "trainer.json"
#define MAX_JSON_BYTES (64u << 20)

static const char *const ckpt_files[3] = {MODEL_FILE, OPTIM_FILE, TRAINER_FILE};

/* ---- config canonical text and hash ---------------------------------------------------------- */

typedef struct cfield {
    const char *name;
    char type; /* i int64, d double, b bool, r compress_ratios */
    size_t off;
} cfield;

#define CI(f) {#f, 'i', offsetof(trex_config, f)}
#define CD(f) {#f, 'd', offsetof(trex_config, f)}
#define CB(f) {#f, 'b', offsetof(trex_config, f)}
static const cfield cfields[] = {
    CI(vocab_size), CI(hidden_size), CI(num_hidden_layers), CI(num_attention_heads), CI(num_key_value_heads),
    CI(head_dim), CI(qk_rope_head_dim), CI(q_lora_rank), CI(o_groups), CI(o_lora_rank), CI(sliding_window),
    {"compress_ratios", 'r', offsetof(trex_config, compress_ratios)}, CD(rope_theta), CD(compress_rope_theta),
    CB(yarn), CD(rope_factor), CI(rope_original_max_pos), CD(rope_beta_fast), CD(rope_beta_slow),
    CI(max_position_embeddings), CI(index_n_heads), CI(index_head_dim), CI(index_topk), CI(n_routed_experts),
    CI(n_shared_experts), CI(num_experts_per_tok), CI(moe_intermediate_size), CD(routed_scaling_factor),
    CI(num_hash_layers), CD(swiglu_limit), CI(hc_mult), CI(hc_sinkhorn_iters), CD(hc_eps), CD(rms_norm_eps),
    CI(num_nextn_predict_layers), CB(tie_word_embeddings), CI(bos_token_id), CI(eos_token_id),
    CD(initializer_range),
};
#undef CI
#undef CD
#undef CB
#define NCFIELDS (sizeof cfields / sizeof cfields[0])
#define CFIELD_TEXT (TREX_MAX_LAYERS * 12 + 16)

static void cfield_text(const trex_config *c, const cfield *f, char *buf, size_t size)
{
    const void *p = (const char *)c + f->off;
    switch (f->type) {
    case 'i':
        snprintf(buf, size, "%" PRId64, *(const int64_t *)p);
        return;
    case 'd':
        snprintf(buf, size, "%.17g", *(const double *)p);
        return;
    case 'b':
        snprintf(buf, size, "%s", *(const bool *)p ? "true" : "false");
        return;
    case 'r': {
        size_t used = 0;
        buf[0] = '\0';
        for (int64_t k = 0; k < c->n_compress_ratios && k < TREX_MAX_LAYERS && used < size; k++)
            used += (size_t)snprintf(buf + used, size - used, "%s%d", k ? "," : "", (int)c->compress_ratios[k]);
        return;
    }
    }
    TREX_ABORT("bad config field type '%c'", f->type);
}

void trex_ckpt_config_hash(const trex_config *cfg, char hex[65])
{
    TREX_ASSERT(cfg && hex);
    trex_sha256 s;
    trex_sha256_init(&s);
    for (size_t k = 0; k < NCFIELDS; k++) {
        char v[CFIELD_TEXT];
        cfield_text(cfg, &cfields[k], v, sizeof v);
        trex_sha256_update(&s, cfields[k].name, strlen(cfields[k].name));
        trex_sha256_update(&s, "=", 1);
        trex_sha256_update(&s, v, strlen(v));
        trex_sha256_update(&s, "\n", 1);
    }
    uint8_t d[32];
    trex_sha256_final(&s, d);
    trex_sha256_hex(d, hex);
}

/* ---- small file-system helpers ---------------------------------------------------------------- */

/* out = dir "/" name; false (out empty) when it does not fit size bytes. */
static bool join(char *out, size_t size, const char *dir, const char *name)
{
    const size_t a = strlen(dir), b = strlen(name);
    if (a + 1 + b >= size) {
        if (size)
            out[0] = '\0';
        return false;
    }
    memmove(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, name, b + 1);
    return true;
}

static bool is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static trex_code fsync_dir(const char *path, trex_err *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return trex_err_set(err, TREX_EIO, "%s: cannot open the directory to sync it: %s", path, strerror(errno));
    trex_code rc = TREX_OK;
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
        rc = trex_err_set(err, TREX_EIO, "%s: fsync of the directory failed: %s", path, strerror(errno));
    close(fd);
    return rc;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* rm -r path (a checkpoint directory: files, possibly a leftover temporary file). */
static trex_code remove_tree(const char *path, trex_err *err)
{
    if (nftw(path, remove_entry, 8, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        return trex_err_set(err, TREX_EIO, "%s: cannot remove: %s (remove it by hand)", path, strerror(errno));
    return TREX_OK;
}

/* "step-<digits>" -> N (decimal, no sign, no leading zeros, fits int64). */
static bool parse_step_name(const char *name, int64_t *step)
{
    if (strncmp(name, "step-", 5))
        return false;
    const char *d = name + 5;
    if (!*d || (d[0] == '0' && d[1]) || strlen(d) > 18)
        return false;
    int64_t v = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9')
            return false;
        v = v * 10 + (*d - '0');
    }
    *step = v;
    return true;
}

/* Leftovers a crashed save or prune can leave in RUN: .step-N.tmp / .del / .old, latest.tmp.<pid>. */
static bool is_leftover(const char *name)
{
    size_t n = strlen(name);
    if (!strncmp(name, "latest.tmp.", 11))
        return true;
    return !strncmp(name, ".step-", 6) && n > 10 &&
           (!strcmp(name + n - 4, ".tmp") || !strcmp(name + n - 4, ".del") || !strcmp(name + n - 4, ".old"));
}

typedef struct step_list {
    int64_t *v;
    size_t n, cap;
} step_list;

static bool step_list_push(step_list *l, int64_t s)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        int64_t *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = s;
    return true;
}

static int cmp_desc(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Complete checkpoints of run (step-N directories holding a manifest), newest first. */
static trex_code list_steps(const char *run, step_list *out, trex_err *err)
{
    memset(out, 0, sizeof *out);
    DIR *d = opendir(run);
    if (!d)
        return trex_err_set(err, errno == ENOENT ? TREX_ENOTFOUND : TREX_EIO, "%s: cannot open the run directory: %s",
                            run, strerror(errno));
    trex_code rc = TREX_OK;
    for (struct dirent *e; (e = readdir(d));) {
        int64_t s;
        char p[CKPT_PATH], m[CKPT_PATH];
        if (!parse_step_name(e->d_name, &s) || !join(p, sizeof p, run, e->d_name) || !join(m, sizeof m, p, MANIFEST))
            continue;
        if (!is_file(m))
            continue;
        if (!step_list_push(out, s)) {
            rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory listing checkpoints", run);
            break;
        }
    }
    closedir(d);
    if (rc != TREX_OK) {
        free(out->v);
        memset(out, 0, sizeof *out);
        return rc;
    }
    if (out->n > 0) /* qsort's array argument may not be NULL, even for zero elements */
        qsort(out->v, out->n, sizeof *out->v, cmp_desc);
    return TREX_OK;
}

/* ---- trainer.json ---------------------------------------------------------------------------- */

static cJSON *trainer_json(const trex_weights *w, const trex_optimizer *opt, const trex_ckpt_state *st)
{
    char hex[65], buf[32];
    cJSON *j = cJSON_CreateObject(), *rng = NULL, *data = NULL, *conf = NULL, *fields = NULL, *set = NULL;
    if (!j)
        return NULL;
    bool ok = cJSON_AddStringToObject(j, "format", "trex-trainer-state") && cJSON_AddNumberToObject(j, "version", 1) &&
              cJSON_AddNumberToObject(j, "step", (double)st->step);
    ok = ok && (rng = cJSON_AddObjectToObject(j, "rng"));
    snprintf(buf, sizeof buf, "%" PRIu64, st->rng.key);
    ok = ok && cJSON_AddStringToObject(rng, "key", buf);
    snprintf(buf, sizeof buf, "%" PRIu64, st->rng.counter);
    ok = ok && cJSON_AddStringToObject(rng, "counter", buf);
    ok = ok && (data = cJSON_AddObjectToObject(j, "data"));
    ok = ok && cJSON_AddNumberToObject(data, "epoch", (double)st->data_epoch) &&
         cJSON_AddNumberToObject(data, "shard", (double)st->data_shard) &&
         cJSON_AddNumberToObject(data, "offset", (double)st->data_offset) &&
         cJSON_AddStringToObject(data, "source", st->data_source);
    ok = ok && (conf = cJSON_AddObjectToObject(j, "config"));
    trex_ckpt_config_hash(w->cfg, hex);
    ok = ok && cJSON_AddStringToObject(conf, "name", w->cfg->name) && cJSON_AddStringToObject(conf, "sha256", hex);
    ok = ok && (fields = cJSON_AddObjectToObject(conf, "fields"));
    for (size_t k = 0; ok && k < NCFIELDS; k++) {
        char v[CFIELD_TEXT];
        cfield_text(w->cfg, &cfields[k], v, sizeof v);
        ok = cJSON_AddStringToObject(fields, cfields[k].name, v) != NULL;
    }
    ok = ok && cJSON_AddStringToObject(j, "precision", st->compute == TREX_BF16 ? "bf16" : "fp32");
    ok = ok && (set = trex_optimizer_settings_to_json(trex_optimizer_settings_get(opt)));
    if (ok && !cJSON_AddItemToObject(j, "optimizer", set)) {
        cJSON_Delete(set);
        ok = false;
    }
    if (!ok) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static trex_code need(const cJSON *parent, const char *key, const char *path, bool (*is)(const cJSON *),
                      const char *what, const cJSON **out, trex_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(parent, key);
    if (!v)
        return trex_err_set(err, TREX_EFORMAT, "%s: field '%s' is missing", path, key);
    if (!is(v))
        return trex_err_set(err, TREX_EFORMAT, "%s: field '%s' must be %s", path, key, what);
    *out = v;
    return TREX_OK;
}

static bool is_number(const cJSON *v)
{
    return cJSON_IsNumber(v);
}
static bool is_string(const cJSON *v)
{
    return cJSON_IsString(v) && v->valuestring;
}
static bool is_object(const cJSON *v)
{
    return cJSON_IsObject(v);
}

static trex_code need_i64(const cJSON *parent, const char *key, const char *path, int64_t *out, trex_err *err)
{
    const cJSON *v = NULL;
    TREX_TRY(need(parent, key, path, is_number, "a number", &v, err));
    const double d = v->valuedouble;
    if (d != floor(d) || d < 0 || d > 9007199254740992.0)
        return trex_err_set(err, TREX_EFORMAT, "%s: field '%s' = %g must be a whole number >= 0", path, key, d);
    *out = (int64_t)d;
    return TREX_OK;
}

static trex_code need_u64_text(const cJSON *parent, const char *key, const char *path, uint64_t *out,
                               trex_err *err)
{
    const cJSON *v = NULL;
    TREX_TRY(need(parent, key, path, is_string, "a decimal string", &v, err));
    char *end = NULL;
    errno = 0;
    const unsigned long long x = strtoull(v->valuestring, &end, 10);
    if (!v->valuestring[0] || *end || errno || v->valuestring[0] == '-')
        return trex_err_set(err, TREX_EFORMAT, "%s: field '%s' = \"%s\" is not a 64-bit unsigned decimal", path, key,
                            v->valuestring);
    *out = (uint64_t)x;
    return TREX_OK;
}

static trex_code check_config(const cJSON *conf, const char *path, const trex_config *cfg, trex_err *err)
{
    const cJSON *hash = NULL, *name = NULL, *fields = NULL;
    TREX_TRY(need(conf, "sha256", path, is_string, "a string", &hash, err));
    TREX_TRY(need(conf, "name", path, is_string, "a string", &name, err));
    TREX_TRY(need(conf, "fields", path, is_object, "an object", &fields, err));
    char hex[65];
    trex_ckpt_config_hash(cfg, hex);
    if (!strcmp(hex, hash->valuestring))
        return TREX_OK;
    for (size_t k = 0; k < NCFIELDS; k++) {
        char v[CFIELD_TEXT];
        cfield_text(cfg, &cfields[k], v, sizeof v);
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(fields, cfields[k].name);
        if (!is_string(f))
            return trex_err_set(err, TREX_EINVAL,
                                "%s: the checkpoint's config '%s' does not record field '%s' (config '%s' has %s = %s); "
                                "it was written by another trex version or for another config",
                                path, name->valuestring, cfields[k].name, cfg->name, cfields[k].name, v);
        if (strcmp(f->valuestring, v))
            return trex_err_set(err, TREX_EINVAL,
                                "%s: config mismatch: the checkpoint was written with config '%s' where %s = %s, but "
                                "config '%s' has %s = %s; resume with the config the run was started with",
                                path, name->valuestring, cfields[k].name, f->valuestring, cfg->name, cfields[k].name, v);
    }
    return trex_err_set(err, TREX_EINVAL,
                        "%s: config hash %s differs from config '%s' (%s) although every recorded field matches; "
                        "trainer.json was edited or written by another trex version",
                        path, hash->valuestring, cfg->name, hex);
}

trex_code trex_ckpt_read_state(const char *dir, const trex_config *cfg, trex_ckpt_state *st, trex_err *err)
{
    TREX_ASSERT(dir && st);
    char path[CKPT_PATH];
    if (!join(path, sizeof path, dir, TRAINER_FILE))
        return trex_err_set(err, TREX_EINVAL, "%s: path too long", dir);
    if (!is_file(path))
        return trex_err_set(err, TREX_ENOTFOUND, "%s is missing: not a complete trex checkpoint", path);
    cJSON *j = NULL;
    TREX_TRY(trex_json_load(path, &j, err));
    memset(st, 0, sizeof *st);
    const cJSON *fmt = NULL, *rng = NULL, *data = NULL, *src = NULL, *conf = NULL, *cname = NULL, *set = NULL;
    trex_code rc = need(j, "format", path, is_string, "a string", &fmt, err);
    if (rc == TREX_OK && strcmp(fmt->valuestring, "trex-trainer-state"))
        rc = trex_err_set(err, TREX_EFORMAT, "%s: field 'format' = \"%s\", not \"trex-trainer-state\"", path,
                          fmt->valuestring);
    if (rc == TREX_OK)
        rc = need_i64(j, "step", path, &st->step, err);
    if (rc == TREX_OK)
        rc = need(j, "rng", path, is_object, "an object", &rng, err);
    if (rc == TREX_OK)
        rc = need_u64_text(rng, "key", path, &st->rng.key, err);
    if (rc == TREX_OK)
        rc = need_u64_text(rng, "counter", path, &st->rng.counter, err);
    if (rc == TREX_OK)
        rc = need(j, "data", path, is_object, "an object", &data, err);
    if (rc == TREX_OK)
        rc = need_i64(data, "epoch", path, &st->data_epoch, err);
    if (rc == TREX_OK)
        rc = need_i64(data, "shard", path, &st->data_shard, err);
    if (rc == TREX_OK)
        rc = need_i64(data, "offset", path, &st->data_offset, err);
    if (rc == TREX_OK)
        rc = need(data, "source", path, is_string, "a string", &src, err);
    if (rc == TREX_OK)
        snprintf(st->data_source, sizeof st->data_source, "%s", src->valuestring);
    if (rc == TREX_OK)
        rc = need(j, "config", path, is_object, "an object", &conf, err);
    if (rc == TREX_OK)
        rc = need(conf, "name", path, is_string, "a string", &cname, err);
    if (rc == TREX_OK)
        snprintf(st->config_name, sizeof st->config_name, "%s", cname->valuestring);
    if (rc == TREX_OK && cfg)
        rc = check_config(conf, path, cfg, err);
    if (rc == TREX_OK) { /* absent before bf16 training existed: fp32 */
        const cJSON *prec = cJSON_GetObjectItemCaseSensitive(j, "precision");
        st->compute = TREX_F32;
        if (prec && (!cJSON_IsString(prec) || (strcmp(prec->valuestring, "fp32") && strcmp(prec->valuestring, "bf16"))))
            rc = trex_err_set(err, TREX_EFORMAT, "%s: field 'precision' must be \"fp32\" or \"bf16\"", path);
        else if (prec && !strcmp(prec->valuestring, "bf16"))
            st->compute = TREX_BF16;
    }
    if (rc == TREX_OK)
        rc = need(j, "optimizer", path, is_object, "an object", &set, err);
    if (rc == TREX_OK)
        rc = trex_optimizer_settings_from_json(&st->settings, set, path, err);
    cJSON_Delete(j);
    return rc;
}

/* ---- manifest and verification ---------------------------------------------------------------- */

static trex_code write_manifest(const char *dir, int64_t step, trex_err *err)
{
    char path[CKPT_PATH];
    cJSON *j = cJSON_CreateObject(), *files = NULL;
    trex_code rc = TREX_OK;
    if (!j || !cJSON_AddStringToObject(j, "format", "trex-checkpoint") || !cJSON_AddNumberToObject(j, "version", 1) ||
        !cJSON_AddNumberToObject(j, "step", (double)step) || !cJSON_AddStringToObject(j, "checksum", "sha256") ||
        !(files = cJSON_AddArrayToObject(j, "files"))) {
        rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory building the manifest", dir);
        goto out;
    }
    for (size_t k = 0; k < 3; k++) {
        char hex[65];
        uint64_t bytes = 0;
        if (!join(path, sizeof path, dir, ckpt_files[k])) {
            rc = trex_err_set(err, TREX_EINVAL, "%s: path too long", dir);
            goto out;
        }
        if ((rc = trex_sha256_file(path, hex, &bytes, err)) != TREX_OK)
            goto out;
        cJSON *f = cJSON_CreateObject();
        if (!f || !cJSON_AddItemToArray(files, f) || !cJSON_AddStringToObject(f, "name", ckpt_files[k]) ||
            !cJSON_AddNumberToObject(f, "bytes", (double)bytes) || !cJSON_AddStringToObject(f, "sha256", hex)) {
            rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory building the manifest", dir);
            goto out;
        }
    }
    if (!join(path, sizeof path, dir, MANIFEST)) {
        rc = trex_err_set(err, TREX_EINVAL, "%s: path too long", dir);
        goto out;
    }
    rc = trex_json_save(path, j, err);
out:
    cJSON_Delete(j);
    return rc;
}

static trex_code verify_file(const char *dir, const cJSON *f, int index, trex_err *err)
{
    char mpath[CKPT_PATH], path[CKPT_PATH], label[64];
    join(mpath, sizeof mpath, dir, MANIFEST);
    snprintf(label, sizeof label, "files[%d]", index);
    const cJSON *name = NULL, *bytes = NULL, *sha = NULL;
    TREX_TRY(need(f, "name", mpath, is_string, "a string", &name, err));
    TREX_TRY(need(f, "bytes", mpath, is_number, "a number", &bytes, err));
    TREX_TRY(need(f, "sha256", mpath, is_string, "a string", &sha, err));
    const char *n = name->valuestring;
    if (!*n || strchr(n, '/') || !strcmp(n, ".") || !strcmp(n, ".."))
        return trex_err_set(err, TREX_EFORMAT, "%s: %s names '%s', not a file of the checkpoint directory", mpath,
                            label, n);
    if (!join(path, sizeof path, dir, n))
        return trex_err_set(err, TREX_EINVAL, "%s: path too long", dir);
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return trex_err_set(err, TREX_ENOTFOUND,
                            "%s is missing (listed in %s): the checkpoint is damaged; resume from an earlier one",
                            path, MANIFEST);
    const double want = bytes->valuedouble;
    if ((double)sb.st_size < want)
        return trex_err_set(err, TREX_EFORMAT,
                            "%s is truncated: %lld bytes, %s says %.0f; the checkpoint is damaged, resume from an "
                            "earlier one",
                            path, (long long)sb.st_size, MANIFEST, want);
    if ((double)sb.st_size > want)
        return trex_err_set(err, TREX_EFORMAT,
                            "%s has %lld bytes but %s says %.0f: the file was changed after the checkpoint was written",
                            path, (long long)sb.st_size, MANIFEST, want);
    char hex[65];
    TREX_TRY(trex_sha256_file(path, hex, NULL, err));
    if (strcmp(hex, sha->valuestring))
        return trex_err_set(err, TREX_EFORMAT,
                            "%s: checksum mismatch: SHA-256 %s, %s says %s; the file is corrupted, resume from an "
                            "earlier checkpoint",
                            path, hex, MANIFEST, sha->valuestring);
    return TREX_OK;
}

trex_code trex_ckpt_verify(const char *dir, trex_err *err)
{
    TREX_ASSERT(dir);
    char path[CKPT_PATH];
    if (!is_dir(dir))
        return trex_err_set(err, TREX_ENOTFOUND, "%s: no such checkpoint directory", dir);
    if (!join(path, sizeof path, dir, MANIFEST))
        return trex_err_set(err, TREX_EINVAL, "%s: path too long", dir);
    if (!is_file(path))
        return trex_err_set(err, TREX_ENOTFOUND,
                            "%s is missing: %s is incomplete (an interrupted save?) or not a trex checkpoint", path,
                            dir);
    cJSON *j = NULL;
    TREX_TRY(trex_json_load(path, &j, err));
    const cJSON *fmt = NULL, *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    trex_code rc = need(j, "format", path, is_string, "a string", &fmt, err);
    if (rc == TREX_OK && strcmp(fmt->valuestring, "trex-checkpoint"))
        rc = trex_err_set(err, TREX_EFORMAT, "%s: field 'format' = \"%s\", not \"trex-checkpoint\"", path,
                          fmt->valuestring);
    if (rc == TREX_OK && !cJSON_IsArray(files))
        rc = trex_err_set(err, TREX_EFORMAT, "%s: field 'files' is missing or not an array", path);
    for (size_t k = 0; rc == TREX_OK && k < 3; k++) { /* the three files must be listed */
        bool listed = false;
        const cJSON *f;
        cJSON_ArrayForEach(f, files)
        {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
            listed |= is_string(n) && !strcmp(n->valuestring, ckpt_files[k]);
        }
        if (!listed)
            rc = trex_err_set(err, TREX_EFORMAT, "%s does not list %s: not a complete trex checkpoint", path,
                              ckpt_files[k]);
    }
    int i = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, files)
    {
        if (rc != TREX_OK)
            break;
        rc = verify_file(dir, f, i++, err);
    }
    cJSON_Delete(j);
    return rc;
}

/* ---- save -------------------------------------------------------------------------------------- */

static void stage(const trex_ckpt_save_opts *o, trex_ckpt_stage s, const char *path)
{
    if (o && o->on_stage)
        o->on_stage(o->ctx, s, path);
}

/* Deletes complete checkpoints beyond the newest `keep` (never `current`) and leftovers of crashes. */
static trex_code prune(const char *run, int keep, int64_t current, trex_err *err)
{
    step_list l;
    TREX_TRY(list_steps(run, &l, err));
    trex_code rc = TREX_OK;
    char name[64], p[CKPT_PATH], del[CKPT_PATH];
    for (size_t i = keep > 0 ? (size_t)keep : l.n; i < l.n && rc == TREX_OK; i++) {
        if (l.v[i] == current)
            continue;
        snprintf(name, sizeof name, "step-%" PRId64, l.v[i]);
        join(p, sizeof p, run, name);
        snprintf(name, sizeof name, ".step-%" PRId64 ".del", l.v[i]);
        join(del, sizeof del, run, name);
        if ((rc = remove_tree(del, err)) != TREX_OK)
            break;
        if (rename(p, del) != 0) {
            rc = trex_err_set(err, TREX_EIO, "%s: cannot rename to %s for deletion: %s", p, del, strerror(errno));
            break;
        }
        rc = remove_tree(del, err);
    }
    free(l.v);
    if (rc != TREX_OK)
        return rc;
    DIR *d = opendir(run);
    if (!d)
        return trex_err_set(err, TREX_EIO, "%s: cannot open the run directory: %s", run, strerror(errno));
    for (struct dirent *e; rc == TREX_OK && (e = readdir(d));)
        if (is_leftover(e->d_name) && join(p, sizeof p, run, e->d_name))
            rc = remove_tree(p, err);
    closedir(d);
    return rc;
}

trex_code trex_ckpt_save(const char *run_dir, const trex_weights *w, const trex_optimizer *opt,
                         const trex_ckpt_state *st, const trex_ckpt_save_opts *opts, trex_err *err)
{
    TREX_ASSERT(run_dir && w && w->cfg && opt && st);
    if (st->step < 0)
        return trex_err_set(err, TREX_EINVAL, "%s: checkpoint step %" PRId64 " must be >= 0", run_dir, st->step);
    const int keep = opts ? opts->keep_last : 0;
    if (keep < 0)
        return trex_err_set(err, TREX_EINVAL, "%s: keep_last = %d must be >= 0 (0 keeps every checkpoint)", run_dir,
                            keep);
    char name[64], fin[CKPT_PATH], tmp[CKPT_PATH], old[CKPT_PATH], path[CKPT_PATH];
    snprintf(name, sizeof name, "step-%" PRId64, st->step);
    bool ok = join(fin, sizeof fin, run_dir, name);
    snprintf(name, sizeof name, ".step-%" PRId64 ".tmp", st->step);
    ok = ok && join(tmp, sizeof tmp, run_dir, name);
    snprintf(name, sizeof name, ".step-%" PRId64 ".old", st->step);
    ok = ok && join(old, sizeof old, run_dir, name);
    ok = ok && join(path, sizeof path, tmp, MANIFEST); /* the longest path below */
    if (!ok)
        return trex_err_set(err, TREX_EINVAL, "%s: run directory path too long", run_dir);

    TREX_TRY(trex_mkdirs(run_dir, err));
    TREX_TRY(remove_tree(tmp, err));
    if (mkdir(tmp, 0755) != 0)
        return trex_err_set(err, TREX_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    stage(opts, TREX_CKPT_BEGIN, tmp);

    trex_code rc = TREX_OK;
    cJSON *tj = NULL;
    join(path, sizeof path, tmp, MODEL_FILE);
    if ((rc = trex_weights_save(w, path, err)) != TREX_OK)
        goto out_remove_tmp;
    stage(opts, TREX_CKPT_MODEL_WRITTEN, path);
    join(path, sizeof path, tmp, OPTIM_FILE);
    if ((rc = trex_optimizer_save(opt, path, err)) != TREX_OK)
        goto out_remove_tmp;
    stage(opts, TREX_CKPT_OPTIM_WRITTEN, path);
    join(path, sizeof path, tmp, TRAINER_FILE);
    if (!(tj = trainer_json(w, opt, st))) {
        rc = trex_err_set(err, TREX_ENOMEM, "%s: out of memory building the trainer state", path);
        goto out_remove_tmp;
    }
    if ((rc = trex_json_save(path, tj, err)) != TREX_OK)
        goto out_remove_tmp;
    stage(opts, TREX_CKPT_TRAINER_WRITTEN, path);
    if ((rc = write_manifest(tmp, st->step, err)) != TREX_OK || (rc = fsync_dir(tmp, err)) != TREX_OK)
        goto out_remove_tmp;
    join(path, sizeof path, tmp, MANIFEST);
    stage(opts, TREX_CKPT_MANIFEST_WRITTEN, path);

    /* an existing step-N (a re-run of the same step) is moved aside, replaced, then deleted */
    bool had_old = is_dir(fin);
    if (had_old) {
        if ((rc = remove_tree(old, err)) != TREX_OK)
            goto out_remove_tmp;
        if (rename(fin, old) != 0) {
            rc = trex_err_set(err, TREX_EIO, "%s: cannot move the existing checkpoint aside to %s: %s", fin, old,
                              strerror(errno));
            goto out_remove_tmp;
        }
    }
    if (rename(tmp, fin) != 0) {
        rc = trex_err_set(err, TREX_EIO, "%s: cannot rename %s into place: %s", fin, tmp, strerror(errno));
        if (had_old && rename(old, fin) != 0)
            trex_err_prefix(err, "the previous %s is left at %s", fin, old);
        goto out_remove_tmp;
    }
    if ((rc = fsync_dir(run_dir, err)) != TREX_OK)
        goto out;
    stage(opts, TREX_CKPT_RENAMED, fin);
    if (had_old && (rc = remove_tree(old, err)) != TREX_OK)
        goto out;

    char line[80];
    snprintf(line, sizeof line, "step-%" PRId64 "\n", st->step);
    join(path, sizeof path, run_dir, "latest");
    if ((rc = trex_file_write_atomic(path, line, strlen(line), err)) != TREX_OK)
        goto out;
    stage(opts, TREX_CKPT_LATEST_UPDATED, path);
    if ((rc = prune(run_dir, keep, st->step, err)) != TREX_OK)
        goto out;
    stage(opts, TREX_CKPT_PRUNED, run_dir);
    goto out;

out_remove_tmp:
    remove_tree(tmp, NULL);
out:
    cJSON_Delete(tj);
    return rc;
}

/* ---- find and load ------------------------------------------------------------------------------ */

trex_code trex_ckpt_latest(const char *run_dir, char *dir, size_t size, int64_t *step, trex_err *err)
{
    TREX_ASSERT(run_dir);
    step_list l;
    TREX_TRY(list_steps(run_dir, &l, err));
    trex_code rc = TREX_OK;
    if (l.n == 0) {
        rc = trex_err_set(err, TREX_ENOTFOUND,
                          "%s: no complete checkpoint (no step-N directory with a %s); start the run from scratch "
                          "or give another run directory",
                          run_dir, MANIFEST);
        goto out;
    }
    if (step)
        *step = l.v[0];
    if (dir) {
        int n = snprintf(dir, size, "%s/step-%" PRId64, run_dir, l.v[0]);
        if (n < 0 || (size_t)n >= size)
            rc = trex_err_set(err, TREX_EINVAL, "%s: checkpoint path does not fit %zu bytes", run_dir, size);
    }
out:
    free(l.v);
    return rc;
}

trex_code trex_ckpt_load(const char *dir, const trex_config *cfg, trex_mem *mem, trex_weights *w,
                         trex_optimizer *opt, trex_ckpt_state *st, trex_err *err)
{
    TREX_ASSERT(dir && cfg && w && st);
    char path[CKPT_PATH];
    TREX_TRY(trex_ckpt_verify(dir, err));
    TREX_TRY(trex_ckpt_read_state(dir, cfg, st, err));
    if (!join(path, sizeof path, dir, MODEL_FILE))
        return trex_err_set(err, TREX_EINVAL, "%s: path too long", dir);
    TREX_TRY(trex_weights_load(w, cfg, path, mem, err));
    if (!opt)
        return TREX_OK;
    join(path, sizeof path, dir, OPTIM_FILE);
    trex_code rc = trex_optimizer_load(opt, path, err);
    if (rc != TREX_OK)
        trex_weights_free(w);
    return rc;
}
