/* tests/test_safetensors_corpus.c — replays the kept fuzz corpus (tests/fuzz/corpus/safetensors/,
 * relative to the repository root, where tests run) through the code path of the fuzz target
 * (tests/fuzz/st_exercise.h), without libFuzzer. Each file is one check: it must not crash or leak
 * (the ASan build runs this too), a rejected file must carry TREX_EFORMAT and a message naming it, and
 * an accepted file must keep every promise of the reader (entries inside the buffer, byte lengths
 * matching shapes, ranges tiling the data area, helpers that read). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fuzz/st_exercise.h"
#include "trex/io.h"

#define CORPUS_DIR "tests/fuzz/corpus/safetensors"

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void)
{
    DIR *d = opendir(CORPUS_DIR);
    CHECK(d != NULL, "cannot open %s (run from the repository root): %s", CORPUS_DIR, strerror(errno));
    if (!d)
        return check_summary();
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn)
                break;
            names = nn;
        }
        names[n] = strdup(de->d_name);
        if (!names[n])
            break;
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str); /* a stable order, for readable failures */

    int accepted = 0, rejected = 0;
    for (size_t i = 0; i < n; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", CORPUS_DIR, names[i]);
        char *buf = NULL;
        size_t len = 0;
        trex_err err = {0};
        if (trex_file_read(path, (size_t)64 << 20, &buf, &len, &err) != TREX_OK) {
            CHECK(0, "%s", err.msg);
            free(names[i]);
            continue;
        }
        int violations = 0;
        trex_code rc = st_exercise((const uint8_t *)buf, len, path, &violations);
        CHECK(violations == 0, "%s: %d broken promises (%s)", path, violations,
              rc == TREX_OK ? "accepted" : "rejected");
        if (rc == TREX_OK)
            accepted++;
        else
            rejected++;
        free(buf);
        free(names[i]);
    }
    free(names);
    printf("corpus: %zu files, %d accepted, %d rejected\n", n, accepted, rejected);
    CHECK(n >= 20, "the corpus holds %zu files; expected the kept corpus", n);
    CHECK(accepted > 0 && rejected > 0, "the corpus holds both valid and invalid files");
    return check_summary();
}
