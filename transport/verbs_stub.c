/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/* Built instead of verbs.c when meson did not find libibverbs. */
#include "transport/verbs.h"

#include <stddef.h>

kvf_status_t kvf_verbs_list_devices(kvf_verbs_device_t **devs_p,
                                    unsigned *count_p)
{
    if ((devs_p == NULL) || (count_p == NULL)) {
        return KVF_ERR_INVALID;
    }
    *devs_p  = NULL;
    *count_p = 0;
    return KVF_ERR_UNSUPPORTED;
}

void kvf_verbs_devices_free(kvf_verbs_device_t *devs)
{
    (void)devs;
}

void kvf_verbs_devices_print(FILE *out, const kvf_verbs_device_t *devs,
                             unsigned count)
{
    fprintf(out, "RDMA device listing not built (no libibverbs at build "
                 "time)\n");
}
