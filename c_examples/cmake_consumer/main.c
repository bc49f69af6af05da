/* Smallest use of an installed kvevict: version check and a tiny selection. */
#include <stdio.h>

#include "kvevict.h"

int main(void) {
    if (kve_version() != KVE_VERSION_NUMBER) {
        printf("header %d but library %u\n", KVE_VERSION_NUMBER, kve_version());
        return 1;
    }
    /* one layer, one head, 8 tokens, window 2: keep the 3 best of the 6 prefix tokens */
    float scores[6] = {0.1f, 0.9f, 0.2f, 0.8f, 0.3f, 0.7f};
    kve_select_params sel;
    int32_t st = kve_select_params_init(&sel, (uint32_t)sizeof sel, KVE_ALLOCATOR_UNIFORM,
                                        KVE_GRANULARITY_HEAD, 3);
    uint64_t offsets[2];
    uint32_t indices[8];
    unsigned char ws[4096];
    kve_model_scores ms = {scores, 6, 1, 1, 8, 2};
    if (st == KVE_OK) st = kve_select_model(&sel, &ms, offsets, 2, indices, 8, ws, sizeof ws);
    if (st != KVE_OK) {
        printf("error: %s\n", kve_status_name(st));
        return 1;
    }
    printf("kvevict %s via find_package: kept", kve_version_string());
    for (uint64_t i = offsets[0]; i < offsets[1]; i++) printf(" %u", indices[i]);
    printf("\n");
    return 0;
}
