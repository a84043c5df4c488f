/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Run-time CUDA detection, pinning, IPC export and device memory helpers.
 * Every entry point asks kvf_gpu_is_available() first, so a binary built
 * with CUDA runs (and answers KVF_ERR_UNSUPPORTED) on a machine without a
 * driver or device.
 */
#include "gpu/kv_copy.h"

#include "common/log.h"

#include <pthread.h>
#include <stdio.h>

static pthread_once_t kvf_gpu_probe_once = PTHREAD_ONCE_INIT;
static bool kvf_gpu_probe_ok;
static char kvf_gpu_probe_reason[160];

static void kvf_gpu_probe_run(void)
{
    int err = 0;
    int count;

    count = kvf_gpu_cuda_probe(&err);
    if (count > 0) {
        kvf_gpu_probe_ok = true;
        snprintf(kvf_gpu_probe_reason, sizeof(kvf_gpu_probe_reason), "ok");
    } else if (count == 0) {
        snprintf(kvf_gpu_probe_reason, sizeof(kvf_gpu_probe_reason),
                 "no CUDA device: none found");
    } else {
        snprintf(kvf_gpu_probe_reason, sizeof(kvf_gpu_probe_reason),
                 "no CUDA device: %s", kvf_gpu_cuda_error_string(err));
    }
    kvf_debug("cuda probe: %s", kvf_gpu_probe_reason);
}

bool kvf_gpu_is_available(const char **reason_p)
{
    pthread_once(&kvf_gpu_probe_once, kvf_gpu_probe_run);
    if (reason_p != NULL) {
        *reason_p = kvf_gpu_probe_reason;
    }
    return kvf_gpu_probe_ok;
}

/* Logs why CUDA cannot serve @p what; false when it can. */
static bool kvf_gpu_unsupported(const char *what)
{
    const char *reason;

    if (kvf_gpu_is_available(&reason)) {
        return false;
    }
    kvf_error("%s: %s", what, reason);
    return true;
}

kvf_status_t kvf_gpu_synchronize(void)
{
    int err;

    if (kvf_gpu_unsupported("cuda synchronize")) {
        return KVF_ERR_UNSUPPORTED;
    }
    err = kvf_gpu_cuda_synchronize();
    if (err != 0) {
        kvf_error("cuda synchronize: %s", kvf_gpu_cuda_error_string(err));
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

kvf_status_t kvf_gpu_host_register(void *addr, size_t len)
{
    int err;

    if ((addr == NULL) || (len == 0)) {
        kvf_error("host register %p len %zu: bad argument", addr, len);
        return KVF_ERR_INVALID;
    }
    if (kvf_gpu_unsupported("host register")) {
        return KVF_ERR_UNSUPPORTED;
    }
    err = kvf_gpu_cuda_host_register(addr, len);
    if (err != 0) {
        kvf_error("host register %p len %zu: %s", addr, len,
                  kvf_gpu_cuda_error_string(err));
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

kvf_status_t kvf_gpu_host_unregister(void *addr)
{
    int err;

    if (addr == NULL) {
        kvf_error("host unregister: NULL address");
        return KVF_ERR_INVALID;
    }
    if (kvf_gpu_unsupported("host unregister")) {
        return KVF_ERR_UNSUPPORTED;
    }
    err = kvf_gpu_cuda_host_unregister(addr);
    if (err != 0) {
        kvf_error("host unregister %p: %s", addr,
                  kvf_gpu_cuda_error_string(err));
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

kvf_status_t kvf_gpu_host_device_ptr(void *addr, void **dev_ptr_p)
{
    void *dev_ptr = NULL;
    int err;

    if ((addr == NULL) || (dev_ptr_p == NULL)) {
        kvf_error("host device pointer: NULL %s",
                  (addr == NULL) ? "address" : "out-param");
        return KVF_ERR_INVALID;
    }
    if (kvf_gpu_unsupported("host device pointer")) {
        return KVF_ERR_UNSUPPORTED;
    }
    err = kvf_gpu_cuda_host_device_ptr(addr, &dev_ptr);
    if (err != 0) {
        kvf_error("host device pointer %p: %s", addr,
                  kvf_gpu_cuda_error_string(err));
        return KVF_ERR_IO;
    }
    *dev_ptr_p = dev_ptr;
    return KVF_OK;
}

kvf_status_t kvf_gpu_ipc_export(void *dev_ptr, kvf_gpu_ipc_handle_t *handle_p)
{
    kvf_gpu_ipc_handle_t handle;
    int err;

    if ((dev_ptr == NULL) || (handle_p == NULL)) {
        kvf_error("ipc export: NULL %s",
                  (dev_ptr == NULL) ? "pointer" : "out-param");
        return KVF_ERR_INVALID;
    }
    if (kvf_gpu_unsupported("ipc export")) {
        return KVF_ERR_UNSUPPORTED;
    }
    err = kvf_gpu_cuda_ipc_export(dev_ptr, &handle);
    if (err != 0) {
        kvf_error("ipc export %p: %s", dev_ptr, kvf_gpu_cuda_error_string(err));
        return KVF_ERR_IO;
    }
    *handle_p = handle;
    return KVF_OK;
}

kvf_status_t kvf_gpu_ipc_open(const kvf_gpu_ipc_handle_t *handle,
                              void **dev_ptr_p)
{
    void *dev_ptr = NULL;
    int err;

    if ((handle == NULL) || (dev_ptr_p == NULL)) {
        kvf_error("ipc open: NULL %s",
                  (handle == NULL) ? "handle" : "out-param");
        return KVF_ERR_INVALID;
    }
    if (kvf_gpu_unsupported("ipc open")) {
        return KVF_ERR_UNSUPPORTED;
    }
    err = kvf_gpu_cuda_ipc_open(handle, &dev_ptr);
    if (err != 0) {
        kvf_error("ipc open: %s", kvf_gpu_cuda_error_string(err));
        return KVF_ERR_IO;
    }
    *dev_ptr_p = dev_ptr;
    return KVF_OK;
}

kvf_status_t kvf_gpu_ipc_close(void *dev_ptr)
{
    int err;

    if (dev_ptr == NULL) {
        return KVF_OK;
    }
    if (kvf_gpu_unsupported("ipc close")) {
        return KVF_ERR_UNSUPPORTED;
    }
    err = kvf_gpu_cuda_ipc_close(dev_ptr);
    if (err != 0) {
        kvf_error("ipc close %p: %s", dev_ptr, kvf_gpu_cuda_error_string(err));
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

kvf_status_t kvf_gpu_mem_alloc(size_t len, void **dev_ptr_p)
{
    void *dev_ptr = NULL;
    int err;

    if ((len == 0) || (dev_ptr_p == NULL)) {
        kvf_error("device alloc len %zu: bad argument", len);
        return KVF_ERR_INVALID;
    }
    if (kvf_gpu_unsupported("device alloc")) {
        return KVF_ERR_UNSUPPORTED;
    }
    err = kvf_gpu_cuda_mem_alloc(len, &dev_ptr);
    if (err != 0) {
        kvf_error("device alloc len %zu: %s", len,
                  kvf_gpu_cuda_error_string(err));
        return kvf_gpu_cuda_error_is_oom(err) ? KVF_ERR_NO_MEMORY : KVF_ERR_IO;
    }
    *dev_ptr_p = dev_ptr;
    return KVF_OK;
}

void kvf_gpu_mem_free(void *dev_ptr)
{
    int err;

    if ((dev_ptr == NULL) || !kvf_gpu_is_available(NULL)) {
        return;
    }
    err = kvf_gpu_cuda_mem_free(dev_ptr);
    if (err != 0) {
        kvf_warn("device free %p: %s", dev_ptr, kvf_gpu_cuda_error_string(err));
    }
}

kvf_status_t kvf_gpu_memcpy(void *dst, const void *src, size_t len)
{
    int err;

    if ((dst == NULL) || (src == NULL)) {
        kvf_error("gpu memcpy len %zu: NULL %s", len,
                  (dst == NULL) ? "destination" : "source");
        return KVF_ERR_INVALID;
    }
    if (kvf_gpu_unsupported("gpu memcpy")) {
        return KVF_ERR_UNSUPPORTED;
    }
    if (len == 0) {
        return KVF_OK;
    }
    err = kvf_gpu_cuda_memcpy(dst, src, len);
    if (err != 0) {
        kvf_error("gpu memcpy len %zu: %s", len,
                  kvf_gpu_cuda_error_string(err));
        return KVF_ERR_IO;
    }
    return KVF_OK;
}
