/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Whole-region registration (one per pool or PD region, never per
 * transfer).
 */
#include "transport/ucx.h"
#include "transport/ucx_int.h"

#include "common/log.h"

#include <stdlib.h>
#include <string.h>

kvf_status_t kvf_ucx_mem_register(kvf_ucx_ctx_t *ctx, void *addr, size_t len,
                                  unsigned access, kvf_ucx_mem_t **mem_p)
{
    ucp_mem_map_params_t params;
    kvf_ucx_mem_t *mem;
    ucs_status_t ucs;
    kvf_status_t status;

    if ((ctx == NULL) || (addr == NULL) || (len == 0) || (mem_p == NULL) ||
        ((access & ~(unsigned)(KVF_UCX_MEM_REMOTE_READ |
                               KVF_UCX_MEM_REMOTE_WRITE)) != 0)) {
        return KVF_ERR_INVALID;
    }
    mem = calloc(1, sizeof(*mem));
    if (mem == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    mem->ctx  = ctx;
    mem->base = addr;
    mem->len  = len;

    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                        UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_PROT;
    params.address = addr;
    params.length  = len;
    params.prot    = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE;
    if (access & KVF_UCX_MEM_REMOTE_READ) {
        params.prot |= UCP_MEM_MAP_PROT_REMOTE_READ;
    }
    if (access & KVF_UCX_MEM_REMOTE_WRITE) {
        params.prot |= UCP_MEM_MAP_PROT_REMOTE_WRITE;
    }
    ucs = ucp_mem_map(ctx->ucp, &params, &mem->memh);
    if (ucs != UCS_OK) {
        kvf_error("register %p+%zu failed: %s", addr, len,
                  ucs_status_string(ucs));
        status = KVF_ERR_TRANSPORT;
        goto err_free;
    }

    *mem_p = mem;
    return KVF_OK;

err_free:
    free(mem);
    return status;
}

void kvf_ucx_mem_deregister(kvf_ucx_mem_t *mem)
{
    ucs_status_t ucs;

    if (mem == NULL) {
        return;
    }
    ucs = ucp_mem_unmap(mem->ctx->ucp, mem->memh);
    if (ucs != UCS_OK) {
        kvf_warn("deregister %p+%zu: %s", mem->base, mem->len,
                 ucs_status_string(ucs));
    }
    free(mem);
}

void *kvf_ucx_mem_base(const kvf_ucx_mem_t *mem)
{
    return mem->base;
}

size_t kvf_ucx_mem_length(const kvf_ucx_mem_t *mem)
{
    return mem->len;
}
