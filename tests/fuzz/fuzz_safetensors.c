/* tests/fuzz/fuzz_safetensors.c — libFuzzer target for the safetensors reader.
 *
 * Each input is a whole file image: trex_st_open_mem validates it, and an accepted image has every
 * entry touched and read through trex_st_read_f32 / trex_st_read_i32 (st_exercise.h, the same path the
 * corpus test runs). A crash, a sanitizer report, or a broken promise of an accepted file (counted by
 * st_exercise) stops the fuzzer. Build: `make BUILD=build fuzz`; run: see docs/safetensors.md. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "st_exercise.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int violations = 0;
    st_exercise(data, size, "fuzz.safetensors", &violations);
    if (violations) {
        fprintf(stderr, "fuzz_safetensors: %d broken promises in a %zu-byte input\n", violations, size);
        abort();
    }
    return 0;
}
