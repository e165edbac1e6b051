/* tests/fused_levels.h — the fused tables a kernel test compares: the reference first, then the table
 * of each higher ISA cap this machine grants, each table once. Include after check.h. */
#ifndef TREX_TESTS_FUSED_LEVELS_H
#define TREX_TESTS_FUSED_LEVELS_H

#include <stdio.h>

#include "kernels/fused.h"

/* Fills seen[0 .. TREX_ISA_COUNT) (seen[0] = ref) and returns how many distinct tables there are; says
 * so when only the reference is available. */
static inline int fused_levels(const trex_fused_table *ref, const trex_fused_table *seen[TREX_ISA_COUNT])
{
    const trex_isa caps[] = {TREX_ISA_AVX2, TREX_ISA_AVX512F, TREX_ISA_AVX512, TREX_ISA_AMX};
    int nseen = 1;
    seen[0] = ref;
    for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
        const trex_fused_table *t = trex_fused_for(caps[k]);
        int dup = 0;
        for (int i = 0; i < nseen; i++)
            dup |= seen[i] == t;
        if (!dup)
            seen[nseen++] = t;
    }
    if (nseen == 1)
        printf("note: only the reference level is available on this machine; comparing it with itself\n");
    return nseen;
}

#endif
