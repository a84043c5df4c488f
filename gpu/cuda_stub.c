/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The CUDA backend of a build without nvcc: the probe says so and nothing
 * else is ever reached (runtime.c and kv_copy.c ask the probe first).
 */
#include "gpu/kv_copy.h"

/* any nonzero code; only kvf_gpu_cuda_error_string() interprets it */
enum {
    KVF_GPU_STUB_ERR = 1
};

int kvf_gpu_cuda_probe(int *err_p)
{
    *err_p = KVF_GPU_STUB_ERR;
    return -1;
}

const char *kvf_gpu_cuda_error_string(int err)
{
    return "CUDA support not built into this binary";
}

int kvf_gpu_cuda_error_is_oom(int err)
{
    return 0;
}

int kvf_gpu_cuda_kv_copy(const kvf_gpu_kv_plan_t *plan, kvf_gpu_dir_t dir,
                         void *stream)
{
    return KVF_GPU_STUB_ERR;
}

int kvf_gpu_cuda_synchronize(void)
{
    return KVF_GPU_STUB_ERR;
}

int kvf_gpu_cuda_host_register(void *addr, size_t len)
{
    return KVF_GPU_STUB_ERR;
}

int kvf_gpu_cuda_host_unregister(void *addr)
{
    return KVF_GPU_STUB_ERR;
}

int kvf_gpu_cuda_host_device_ptr(void *addr, void **dev_ptr_p)
{
    return KVF_GPU_STUB_ERR;
}

int kvf_gpu_cuda_ipc_export(void *dev_ptr, kvf_gpu_ipc_handle_t *handle_p)
{
    return KVF_GPU_STUB_ERR;
}

int kvf_gpu_cuda_ipc_open(const kvf_gpu_ipc_handle_t *handle, void **dev_ptr_p)
{
    return KVF_GPU_STUB_ERR;
}

int kvf_gpu_cuda_ipc_close(void *dev_ptr)
{
    return KVF_GPU_STUB_ERR;
}

int kvf_gpu_cuda_mem_alloc(size_t len, void **dev_ptr_p)
{
    return KVF_GPU_STUB_ERR;
}

int kvf_gpu_cuda_mem_free(void *dev_ptr)
{
    return KVF_GPU_STUB_ERR;
}

int kvf_gpu_cuda_memcpy(void *dst, const void *src, size_t len)
{
    return KVF_GPU_STUB_ERR;
}
