/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Whole-region registration (one per pool or PD region, never per
 * transfer) and rkeys.
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
    void *rkey_buf;
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

    ucs = ucp_rkey_pack(ctx->ucp, mem->memh, &rkey_buf, &mem->rkey_len);
    if (ucs != UCS_OK) {
        kvf_error("rkey pack of %p+%zu failed: %s", addr, len,
                  ucs_status_string(ucs));
        status = KVF_ERR_TRANSPORT;
        goto err_unmap;
    }
    mem->rkey_buf = malloc(mem->rkey_len);
    if (mem->rkey_buf == NULL) {
        ucp_rkey_buffer_release(rkey_buf);
        status = KVF_ERR_NO_MEMORY;
        goto err_unmap;
    }
    memcpy(mem->rkey_buf, rkey_buf, mem->rkey_len);
    ucp_rkey_buffer_release(rkey_buf);

    *mem_p = mem;
    return KVF_OK;

err_unmap:
    ucp_mem_unmap(ctx->ucp, mem->memh);
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
    free(mem->rkey_buf);
    free(mem);
}

const void *kvf_ucx_mem_rkey(const kvf_ucx_mem_t *mem, size_t *len_p)
{
    *len_p = mem->rkey_len;
    return mem->rkey_buf;
}

void *kvf_ucx_mem_base(const kvf_ucx_mem_t *mem)
{
    return mem->base;
}

size_t kvf_ucx_mem_length(const kvf_ucx_mem_t *mem)
{
    return mem->len;
}

kvf_status_t kvf_ucx_rkey_unpack(kvf_ucx_ep_t *ep, const void *packed,
                                 size_t packed_len, uint64_t remote_base,
                                 uint64_t remote_len, kvf_ucx_rkey_t **rkey_p)
{
    unsigned char copy[KVF_UCX_RKEY_MAX + 64];
    kvf_ucx_rkey_t *rkey;
    ucs_status_t ucs;

    if ((ep == NULL) || (packed == NULL) || (packed_len == 0) ||
        (remote_len == 0) || (rkey_p == NULL) ||
        (remote_base > UINT64_MAX - remote_len)) {
        return KVF_ERR_INVALID;
    }
    if (ep->is_failed || (ep->ucp_ep == NULL)) {
        return KVF_ERR_CLOSED;
    }
    if (packed_len > KVF_UCX_RKEY_MAX) {
        kvf_debug("ep %s: rkey of %zu bytes refused", ep->peer, packed_len);
        return KVF_ERR_TOO_BIG;
    }
    rkey = calloc(1, sizeof(*rkey));
    if (rkey == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    /* ucp_ep_rkey_unpack takes no length and trusts the blob: a short or
     * forged one would be read past its end. Unpack from a zero-padded
     * copy so any over-read stays inside our buffer. */
    memset(copy, 0, sizeof(copy));
    memcpy(copy, packed, packed_len);
    ucs = ucp_ep_rkey_unpack(ep->ucp_ep, copy, &rkey->ucp);
    if (ucs != UCS_OK) {
        kvf_debug("ep %s: rkey unpack failed: %s", ep->peer,
                  ucs_status_string(ucs));
        free(rkey);
        return KVF_ERR_PROTO;
    }
    rkey->ep   = ep;
    rkey->base = remote_base;
    rkey->len  = remote_len;
    *rkey_p    = rkey;
    return KVF_OK;
}

void kvf_ucx_rkey_destroy(kvf_ucx_rkey_t *rkey)
{
    if (rkey == NULL) {
        return;
    }
    ucp_rkey_destroy(rkey->ucp);
    free(rkey);
}
