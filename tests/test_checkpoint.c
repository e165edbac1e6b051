/* tests/test_checkpoint.c — SHA-256 against published vectors; checkpoint round trip (weights,
 * optimizer state and trainer state bit-exact); corruption detected and named (flipped byte, truncated,
 * grown, missing files, missing manifest); config mismatch naming the field; crashes (SIGKILL of a
 * forked writer at every stage of a save, and at an arbitrary moment) lose nothing saved before and
 * leave a run that resumes and saves again; keep-last-K; leftover temporary directories ignored. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "trex/checkpoint.h"
#include "trex/io.h"
#include "trex/safetensors.h"

static char tmpdir[512];

/* ---- SHA-256 ------------------------------------------------------------------------------------ */

static void sha_hex(const void *data, size_t len, char hex[65])
{
    trex_sha256 s;
    uint8_t d[32];
    trex_sha256_init(&s);
    trex_sha256_update(&s, data, len);
    trex_sha256_final(&s, d);
    trex_sha256_hex(d, hex);
}

static void test_sha256(void)
{
    char hex[65];
    sha_hex("", 0, hex);
    CHECK(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"), "empty: %s", hex);
    sha_hex("abc", 3, hex);
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"), "abc: %s", hex);
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha_hex(two, strlen(two), hex);
    CHECK(!strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"), "448 bits: %s", hex);
    /* a million 'a', fed in uneven pieces */
    trex_sha256 s;
    uint8_t d[32];
    char a[1000];
    memset(a, 'a', sizeof a);
    trex_sha256_init(&s);
    for (size_t done = 0, k = 0; done < 1000000; k++) {
        size_t n = 1 + (k * 37) % 999;
        if (n > 1000000 - done)
            n = 1000000 - done;
        trex_sha256_update(&s, a, n);
        done += n;
    }
    trex_sha256_final(&s, d);
    trex_sha256_hex(d, hex);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "million a: %s", hex);
    /* padding boundaries (digests from Python's hashlib) */
    static const struct {
        size_t n;
        const char *hex;
    } v[] = {
        {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
        {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
        {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
        {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
        {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
        {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
        {1000, "1e9bc38cbf860b9ec31918b065f9b52476c549a782e0e7990bed8ce3868d2371"},
    };
    uint8_t buf[1000];
    for (int i = 0; i < 1000; i++)
        buf[i] = (uint8_t)((i * 7 + 3) % 256);
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        sha_hex(buf, v[k].n, hex);
        CHECK(!strcmp(hex, v[k].hex), "%zu bytes: %s", v[k].n, hex);
    }
    /* a file */
    char path[600];
    snprintf(path, sizeof path, "%s/sha.bin", tmpdir);
    trex_err err = {0};
    CHECK(trex_file_write_atomic(path, buf, 1000, &err) == TREX_OK, "%s", err.msg);
    uint64_t bytes = 0;
    CHECK(trex_sha256_file(path, hex, &bytes, &err) == TREX_OK && bytes == 1000 &&
              !strcmp(hex, "1e9bc38cbf860b9ec31918b065f9b52476c549a782e0e7990bed8ce3868d2371"),
          "file digest: %s", err.msg);
    unlink(path);
    CHECK(trex_sha256_file(path, hex, &bytes, &err) == TREX_ENOTFOUND && strstr(err.msg, path), "missing file: %s",
          err.msg);
}

/* ---- a small model -------------------------------------------------------------------------------- */

static bool micro_config(trex_config *cfg)
{
    cJSON *j = NULL;
    trex_err err = {0};
    if (trex_json_load("configs/dsv4-tiny.json", &j, &err) != TREX_OK) {
        CHECK(0, "%s", err.msg);
        return false;
    }
    static const struct {
        const char *k;
        double v;
    } set[] = {
        {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
        {"head_dim", 32}, {"qk_rope_head_dim", 16}, {"q_lora_rank", 16}, {"o_groups", 2}, {"o_lora_rank", 8},
        {"sliding_window", 8}, {"index_n_heads", 2}, {"index_head_dim", 32}, {"index_topk", 4},
        {"n_routed_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 16}, {"num_hash_layers", 1},
        {"hc_mult", 2},
    };
    for (size_t k = 0; k < sizeof set / sizeof set[0]; k++)
        cJSON_ReplaceItemInObject(j, set[k].k, cJSON_CreateNumber(set[k].v));
    cJSON *r = cJSON_CreateArray();
    const int ratios[3] = {0, 4, 0};
    for (int k = 0; k < 3; k++)
        cJSON_AddItemToArray(r, cJSON_CreateNumber(ratios[k]));
    cJSON_ReplaceItemInObject(j, "compress_ratios", r);
    trex_code rc = trex_config_from_json(cfg, j, "micro.json", &err);
    cJSON_Delete(j);
    CHECK(rc == TREX_OK, "micro config: %s", err.msg);
    return rc == TREX_OK;
}

typedef struct model {
    trex_config cfg;
    trex_weights w;
    trex_optimizer *opt;
    trex_ckpt_state st;
} model;

/* A model with a few optimizer steps taken; weights element 0 holds `tag` so checkpoints differ. */
static bool model_make(model *m, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    trex_err err = {0};
    if (!micro_config(&m->cfg))
        return false;
    if (trex_weights_init(&m->w, &m->cfg, seed, NULL, &err) != TREX_OK) {
        CHECK(0, "init: %s", err.msg);
        return false;
    }
    trex_optimizer_settings s;
    trex_optimizer_defaults(&s);
    s.lr = 1e-3;
    s.schedule = TREX_LR_COSINE;
    s.warmup_steps = 2;
    s.total_steps = 50;
    if (trex_optimizer_create(&m->opt, &m->w.layout, &m->cfg, &s, 1, NULL, &err) != TREX_OK) {
        CHECK(0, "optimizer: %s", err.msg);
        trex_weights_free(&m->w);
        return false;
    }
    float *g = calloc((size_t)m->w.layout.n_float, sizeof *g);
    trex_rng r = trex_rng_make(seed, 99);
    for (int t = 0; t < 2; t++) {
        for (int64_t k = 0; k < m->w.layout.n_float; k++)
            g[k] = (float)(0.01 * trex_rng_normal(&r));
        trex_step_report rep;
        trex_optimizer_update(m->opt, NULL, m->w.f, g, &rep);
    }
    free(g);
    m->st.step = 2;
    m->st.rng = trex_rng_make(seed, 7);
    m->st.rng.counter = UINT64_C(0xfedcba9876543210);
    m->st.data_epoch = 1;
    m->st.data_shard = 17;
    m->st.data_offset = INT64_C(123456789012);
    snprintf(m->st.data_source, sizeof m->st.data_source, "shards/or-sft-%u.tok", (unsigned)seed);
    m->st.settings = s;
    return true;
}

static void model_free(model *m)
{
    trex_optimizer_destroy(m->opt);
    trex_weights_free(&m->w);
}

static void set_step(model *m, int64_t step)
{
    m->st.step = step;
    m->w.f[0] = (float)step; /* marks which checkpoint the weights came from */
}

static bool save(const char *run, model *m, int keep)
{
    trex_err err = {0};
    trex_ckpt_save_opts o = {.keep_last = keep};
    trex_code rc = trex_ckpt_save(run, &m->w, m->opt, &m->st, &o, &err);
    CHECK(rc == TREX_OK, "save step %" PRId64 ": %s", m->st.step, err.msg);
    return rc == TREX_OK;
}

static bool same_optim(const trex_optimizer *a, const trex_optimizer *b, const trex_layout *lay)
{
    for (int64_t k = 0; k < lay->count; k++)
        for (int q = 0; q < 2; q++) {
            const float *x = trex_optimizer_state(a, k, q), *y = trex_optimizer_state(b, k, q);
            if (!x != !y || (x && memcmp(x, y, (size_t)lay->params[k].numel * sizeof *x)))
                return false;
        }
    return trex_optimizer_step_count(a) == trex_optimizer_step_count(b);
}

/* Loads dir into a fresh model; returns the weights' element 0 (the step tag), -1 on failure. */
static double load_tag(const char *dir, const model *ref, trex_err *err)
{
    trex_ckpt_state st;
    trex_weights w;
    trex_optimizer *o = NULL;
    if (trex_ckpt_read_state(dir, &ref->cfg, &st, err) != TREX_OK)
        return -1;
    if (trex_optimizer_create(&o, &ref->w.layout, &ref->cfg, &st.settings, 1, NULL, err) != TREX_OK)
        return -1;
    double tag = -1;
    if (trex_ckpt_load(dir, &ref->cfg, NULL, &w, o, &st, err) == TREX_OK) {
        tag = w.f[0];
        trex_weights_free(&w);
    }
    trex_optimizer_destroy(o);
    return tag;
}

static void rm_rf(const char *path)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", path);
}

/* Names in dir (sorted, space separated) into out. */
static void list_dir(const char *dir, char *out, size_t size)
{
    struct dirent **e = NULL;
    int n = scandir(dir, &e, NULL, alphasort);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (strcmp(e[i]->d_name, ".") && strcmp(e[i]->d_name, "..")) {
            size_t u = strlen(out);
            snprintf(out + u, size - u, "%s%s", u ? " " : "", e[i]->d_name);
        }
        free(e[i]);
    }
    free(e);
}

/* ---- round trip ------------------------------------------------------------------------------------ */

static void test_roundtrip(void)
{
    model m;
    if (!model_make(&m, 1))
        return;
    char run[600], dir[700], path[800], text[64] = {0};
    snprintf(run, sizeof run, "%s/run-rt", tmpdir);
    trex_err err = {0};
    CHECK(trex_ckpt_latest(run, dir, sizeof dir, NULL, &err) == TREX_ENOTFOUND, "no run yet: %s", err.msg);
    if (!save(run, &m, 0))
        goto out;
    int64_t step = -1;
    CHECK(trex_ckpt_latest(run, dir, sizeof dir, &step, &err) == TREX_OK && step == 2, "latest: %s", err.msg);
    snprintf(path, sizeof path, "%s/latest", run);
    FILE *f = fopen(path, "r");
    CHECK(f && fgets(text, sizeof text, f) && !strcmp(text, "step-2\n"), "RUN/latest names step-2: '%s'", text);
    if (f)
        fclose(f);
    char names[512];
    list_dir(dir, names, sizeof names);
    CHECK(!strcmp(names, "manifest.json model.safetensors optim.safetensors trainer.json"), "files: %s", names);
    CHECK(trex_ckpt_verify(dir, &err) == TREX_OK, "verify: %s", err.msg);

    trex_ckpt_state st;
    CHECK(trex_ckpt_read_state(dir, &m.cfg, &st, &err) == TREX_OK, "read state: %s", err.msg);
    trex_optimizer *o = NULL;
    CHECK(trex_optimizer_create(&o, &m.w.layout, &m.cfg, &st.settings, 1, NULL, &err) == TREX_OK, "%s", err.msg);
    trex_weights w;
    memset(&w, 0, sizeof w);
    CHECK(trex_ckpt_load(dir, &m.cfg, NULL, &w, o, &st, &err) == TREX_OK, "load: %s", err.msg);
    if (w.f) {
        CHECK(!memcmp(w.f, m.w.f, (size_t)m.w.layout.n_float * sizeof *w.f), "weights bit-exact");
        CHECK(!memcmp(w.i, m.w.i, (size_t)m.w.layout.n_int * sizeof *w.i), "tid2eid exact");
        CHECK(same_optim(o, m.opt, &m.w.layout), "optimizer state and step count bit-exact");
        trex_weights_free(&w);
    }
    CHECK(st.step == 2 && st.rng.key == m.st.rng.key && st.rng.counter == m.st.rng.counter &&
              st.data_epoch == 1 && st.data_shard == 17 && st.data_offset == INT64_C(123456789012) &&
              !strcmp(st.data_source, m.st.data_source) && !strcmp(st.config_name, "micro"),
          "trainer state: step, RNG, data position, config name");
    CHECK(!memcmp(&st.settings, &m.st.settings, sizeof st.settings), "settings exact");
    trex_optimizer_destroy(o);

    /* the model file carries the official names and F32 */
    trex_st_file *sf = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (trex_st_open(&sf, path, &err) == TREX_OK) {
        const trex_st_entry *e = trex_st_find(sf, "layers.1.attn.wo_a.weight");
        CHECK(e && e->dtype == TREX_F32 && trex_st_count(sf) == m.w.layout.count, "official names, F32");
        trex_st_close(sf);
    }

    /* an optimizer of another kind refuses the state, naming the file */
    trex_optimizer_settings sa = st.settings;
    sa.kind = TREX_OPTIM_ADAMW;
    o = NULL;
    CHECK(trex_optimizer_create(&o, &m.w.layout, &m.cfg, &sa, 1, NULL, &err) == TREX_OK, "%s", err.msg);
    CHECK(trex_ckpt_load(dir, &m.cfg, NULL, &w, o, &st, &err) == TREX_EINVAL && strstr(err.msg, "optim.safetensors"),
          "kind mismatch: %s", err.msg);
    trex_optimizer_destroy(o);

    /* config mismatch names the field and both values */
    trex_config c2 = m.cfg;
    c2.rope_theta = 20000;
    snprintf(c2.name, sizeof c2.name, "other");
    CHECK(trex_ckpt_read_state(dir, &c2, &st, &err) == TREX_EINVAL && strstr(err.msg, "rope_theta = 10000") &&
              strstr(err.msg, "rope_theta = 20000") && strstr(err.msg, "trainer.json"),
          "config mismatch: %s", err.msg);
    c2 = m.cfg;
    c2.compress_ratios[1] = 16;
    CHECK(trex_ckpt_read_state(dir, &c2, &st, &err) == TREX_EINVAL && strstr(err.msg, "compress_ratios = 0,4,0"),
          "config mismatch in a list: %s", err.msg);
    c2 = m.cfg;
    snprintf(c2.name, sizeof c2.name, "renamed");
    CHECK(trex_ckpt_read_state(dir, &c2, &st, &err) == TREX_OK, "same fields under another name: %s", err.msg);
out:
    rm_rf(run);
    model_free(&m);
}

/* ---- corruption ------------------------------------------------------------------------------------ */

static void flip_byte(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    if (!f) {
        CHECK(0, "open %s", path);
        return;
    }
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static long file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

static void test_corruption(void)
{
    model m;
    if (!model_make(&m, 2))
        return;
    char run[600], dir[700], path[800];
    snprintf(run, sizeof run, "%s/run-bad", tmpdir);
    snprintf(dir, sizeof dir, "%s/step-2", run);
    trex_err err = {0};

    /* a flipped byte in the middle of the weights */
    if (save(run, &m, 0)) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        flip_byte(path, file_size(path) / 2);
        CHECK(trex_ckpt_verify(dir, &err) == TREX_EFORMAT && strstr(err.msg, path) && strstr(err.msg, "checksum"),
              "flipped byte: %s", err.msg);
        CHECK(load_tag(dir, &m, &err) < 0 && strstr(err.msg, "model.safetensors") && strstr(err.msg, "checksum"),
              "load refuses it: %s", err.msg);
    }
    /* saving the same step again replaces the damaged checkpoint */
    if (save(run, &m, 0))
        CHECK(trex_ckpt_verify(dir, &err) == TREX_OK, "re-saved step verifies: %s", err.msg);
    /* truncated optimizer state */
    snprintf(path, sizeof path, "%s/optim.safetensors", dir);
    const long n = file_size(path);
    CHECK(truncate(path, n / 2) == 0, "truncate");
    CHECK(trex_ckpt_verify(dir, &err) == TREX_EFORMAT && strstr(err.msg, "optim.safetensors is truncated"),
          "truncated: %s", err.msg);
    /* a file that grew */
    if (save(run, &m, 0)) {
        snprintf(path, sizeof path, "%s/trainer.json", dir);
        FILE *f = fopen(path, "ab");
        if (f) {
            fputs(" ", f);
            fclose(f);
        }
        CHECK(trex_ckpt_verify(dir, &err) == TREX_EFORMAT && strstr(err.msg, "trainer.json") &&
                  strstr(err.msg, "changed"),
              "grown: %s", err.msg);
    }
    /* a missing file, a missing manifest */
    if (save(run, &m, 0)) {
        snprintf(path, sizeof path, "%s/optim.safetensors", dir);
        unlink(path);
        CHECK(trex_ckpt_verify(dir, &err) == TREX_ENOTFOUND && strstr(err.msg, "optim.safetensors is missing"),
              "missing file: %s", err.msg);
        snprintf(path, sizeof path, "%s/manifest.json", dir);
        unlink(path);
        CHECK(trex_ckpt_verify(dir, &err) == TREX_ENOTFOUND && strstr(err.msg, "manifest.json is missing"),
              "missing manifest: %s", err.msg);
        CHECK(trex_ckpt_latest(run, NULL, 0, NULL, &err) == TREX_ENOTFOUND, "without a manifest it is not complete");
    }
    /* a damaged manifest */
    if (save(run, &m, 0)) {
        snprintf(path, sizeof path, "%s/manifest.json", dir);
        CHECK(truncate(path, 20) == 0, "truncate manifest");
        CHECK(trex_ckpt_verify(dir, &err) == TREX_EFORMAT && strstr(err.msg, "manifest.json"), "bad manifest: %s",
              err.msg);
    }
    CHECK(trex_ckpt_verify("/nonexistent/step-1", &err) == TREX_ENOTFOUND && strstr(err.msg, "/nonexistent/step-1"),
          "no directory: %s", err.msg);
    rm_rf(run);
    model_free(&m);
}

/* ---- crashes ---------------------------------------------------------------------------------------- */

static void kill_at(void *ctx, trex_ckpt_stage stage, const char *path)
{
    (void)path;
    if ((int)stage == *(const int *)ctx)
        raise(SIGKILL);
}

/* Forks a writer that saves step 3 (keep 2) and is killed at `stage`; returns true if it died so. */
static bool crash_save(const char *run, model *m, int stage)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        CHECK(0, "fork: %s", strerror(errno));
        return false;
    }
    if (pid == 0) {
        set_step(m, 3);
        trex_ckpt_save_opts o = {.keep_last = 2, .on_stage = kill_at, .ctx = &stage};
        trex_code rc = trex_ckpt_save(run, &m->w, m->opt, &m->st, &o, NULL);
        _exit(rc == TREX_OK ? 0 : 1);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

static void test_crash_stages(void)
{
    model m;
    if (!model_make(&m, 3))
        return;
    trex_err err = {0};
    for (int s = TREX_CKPT_BEGIN; s < TREX_CKPT_STAGE_COUNT; s++) {
        char run[600], dir[700], names[1024];
        snprintf(run, sizeof run, "%s/run-crash-%d", tmpdir, s);
        set_step(&m, 1);
        bool ok = save(run, &m, 2);
        set_step(&m, 2);
        ok = ok && save(run, &m, 2);
        if (!ok)
            break;
        CHECK(crash_save(run, &m, s), "stage %d: the writer was killed", s);
        int64_t step = -1;
        CHECK(trex_ckpt_latest(run, dir, sizeof dir, &step, &err) == TREX_OK, "stage %d: latest: %s", s, err.msg);
        const int64_t want = s >= TREX_CKPT_RENAMED ? 3 : 2;
        CHECK(step == want, "stage %d: latest complete is step-%" PRId64 ", want step-%" PRId64, s, step, want);
        CHECK(load_tag(dir, &m, &err) == (double)want, "stage %d: step-%" PRId64 " loads with its own weights: %s", s,
              want, err.msg);
        for (int64_t k = s >= TREX_CKPT_PRUNED ? 2 : 1; k <= 2; k++) {
            snprintf(dir, sizeof dir, "%s/step-%" PRId64, run, k);
            CHECK(trex_ckpt_verify(dir, &err) == TREX_OK && load_tag(dir, &m, &err) == (double)k,
                  "stage %d: earlier step-%" PRId64 " intact: %s", s, k, err.msg);
        }
        /* the run goes on: the next save succeeds and cleans up what the crash left */
        set_step(&m, 4);
        if (save(run, &m, 2)) {
            list_dir(run, names, sizeof names);
            CHECK(!strcmp(names, "latest step-3 step-4") || (want == 2 && !strcmp(names, "latest step-2 step-4")),
                  "stage %d: after the next save the run holds: %s", s, names);
        }
        rm_rf(run);
    }
    model_free(&m);
}

/* Kills the writer at whatever moment it has reached once its temporary directory appears. */
static void test_crash_anytime(void)
{
    model m;
    if (!model_make(&m, 4))
        return;
    char run[600], tmp[700], dir[700];
    snprintf(run, sizeof run, "%s/run-kill", tmpdir);
    snprintf(tmp, sizeof tmp, "%s/.step-3.tmp", run);
    trex_err err = {0};
    set_step(&m, 2);
    if (!save(run, &m, 2)) {
        model_free(&m);
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        set_step(&m, 3);
        for (;;) { /* save repeatedly until killed */
            trex_ckpt_save_opts o = {.keep_last = 2};
            trex_ckpt_save(run, &m.w, m.opt, &m.st, &o, NULL);
        }
    }
    struct timespec nap = {0, 200000};
    for (int i = 0; i < 50000; i++) {
        struct stat sb;
        if (stat(tmp, &sb) == 0)
            break;
        nanosleep(&nap, NULL);
    }
    kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    CHECK(WIFSIGNALED(status), "writer killed");
    int64_t step = -1;
    CHECK(trex_ckpt_latest(run, dir, sizeof dir, &step, &err) == TREX_OK && (step == 2 || step == 3), "latest: %s",
          err.msg);
    CHECK(trex_ckpt_verify(dir, &err) == TREX_OK && load_tag(dir, &m, &err) == (double)step,
          "latest complete checkpoint step-%" PRId64 " loads: %s", step, err.msg);
    snprintf(dir, sizeof dir, "%s/step-2", run);
    CHECK(trex_ckpt_verify(dir, &err) == TREX_OK, "step-2 intact: %s", err.msg);
    rm_rf(run);
    model_free(&m);
}

/* ---- keep-last-K, leftovers ---------------------------------------------------------------------- */

static void test_keep_last(void)
{
    model m;
    if (!model_make(&m, 5))
        return;
    char run[600], names[1024], junk[700], dir[700];
    snprintf(run, sizeof run, "%s/run-keep", tmpdir);
    trex_err err = {0};
    for (int64_t s = 1; s <= 5; s++) {
        set_step(&m, s);
        save(run, &m, 2);
    }
    list_dir(run, names, sizeof names);
    CHECK(!strcmp(names, "latest step-4 step-5"), "keep 2 of 5: %s", names);
    /* a leftover temporary directory of a later step is ignored by resume */
    snprintf(junk, sizeof junk, "%s/.step-9.tmp", run);
    CHECK(mkdir(junk, 0755) == 0, "mkdir leftover");
    snprintf(junk, sizeof junk, "%s/.step-9.tmp/model.safetensors", run);
    CHECK(trex_file_write_atomic(junk, "junk", 4, &err) == TREX_OK, "%s", err.msg);
    int64_t step = -1;
    CHECK(trex_ckpt_latest(run, dir, sizeof dir, &step, &err) == TREX_OK && step == 5, "leftover ignored: %" PRId64,
          step);
    /* a directory named like a checkpoint but without a manifest is not one */
    snprintf(junk, sizeof junk, "%s/step-7", run);
    CHECK(mkdir(junk, 0755) == 0, "mkdir step-7");
    CHECK(trex_ckpt_latest(run, dir, sizeof dir, &step, &err) == TREX_OK && step == 5, "incomplete step-7 ignored");
    rmdir(junk);
    /* saving an earlier step (a run resumed from an older checkpoint) keeps the newest K and it */
    set_step(&m, 3);
    save(run, &m, 2);
    list_dir(run, names, sizeof names);
    CHECK(!strcmp(names, "latest step-3 step-4 step-5"), "current step always kept, leftovers removed: %s", names);
    /* keep_last 1 */
    set_step(&m, 6);
    save(run, &m, 1);
    list_dir(run, names, sizeof names);
    CHECK(!strcmp(names, "latest step-6"), "keep 1: %s", names);
    trex_ckpt_save_opts bad = {.keep_last = -1};
    CHECK(trex_ckpt_save(run, &m.w, m.opt, &m.st, &bad, &err) == TREX_EINVAL && strstr(err.msg, "keep_last"),
          "negative keep_last: %s", err.msg);
    rm_rf(run);
    model_free(&m);
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/trex-test-ckpt-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_sha256();
    test_roundtrip();
    test_corruption();
    test_crash_stages();
    test_crash_anytime();
    test_keep_last();
    rm_rf(tmpdir);
    return check_summary();
}
