/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * CUDA backend: the paged KV <-> chunk kernel and thin cudart wrappers.
 *
 * One launch covers a whole chunk: grid (token groups, layers, K/V), one
 * warp per token row. Each warp picks the widest unit (16, 8, 4, 2 or 1
 * bytes) that divides both row addresses and the row size, so aligned
 * caches move as 16-byte vectors and odd ones still copy correctly. The
 * byte result equals the CPU reference (kv_copy.c) by construction: same
 * plan, same addresses, rows copied whole.
 */
#include "gpu/kv_copy.h"
#include "gpu/kv_copy_row.h"

#include <cuda_runtime.h>

#include <dlfcn.h>
#include <string.h>

namespace {

/* our own code for "no driver at all", outside cudaError_t's range */
constexpr int kvf_gpu_err_no_driver = -1;

constexpr unsigned kvf_gpu_warps_per_block = 4;
constexpr unsigned kvf_gpu_warp_size       = 32;

/* One warp per token row; the row work is shared with the host-side
 * emulation in the unit tests (kv_copy_row.h). __grid_constant__: the
 * 4 KiB plan is read in place from parameter space, never copied to local
 * memory although its address is taken. */
__global__ void
kvf_gpu_kv_copy_kernel(const __grid_constant__ kvf_gpu_kv_plan_t plan,
                       kvf_gpu_dir_t dir)
{
    uint64_t t = (uint64_t)blockIdx.x * kvf_gpu_warps_per_block +
                 threadIdx.x / kvf_gpu_warp_size;

    if (t >= plan.num_tokens) {
        return;
    }
    kvf_gpu_kv_copy_token(&plan, dir, t, plan.layer_begin + blockIdx.y,
                          blockIdx.z, threadIdx.x % kvf_gpu_warp_size,
                          kvf_gpu_warp_size);
}

} // namespace

extern "C" {

int kvf_gpu_cuda_probe(int *err_p)
{
    int count = 0;
    void *libcuda;
    cudaError_t e;

    e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        *err_p = (int)e;
        (void)cudaGetLastError(); /* not sticky: clear it for later calls */
        if (e == cudaErrorInsufficientDriver) {
            /* cudart says "insufficient" also when no driver is installed:
             * tell the two apart for the log */
            libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
            if (libcuda == NULL) {
                *err_p = kvf_gpu_err_no_driver;
            } else {
                dlclose(libcuda);
            }
        }
        return -1;
    }
    return count;
}

const char *kvf_gpu_cuda_error_string(int err)
{
    if (err == kvf_gpu_err_no_driver) {
        return "CUDA driver not installed (libcuda.so.1 not found)";
    }
    return cudaGetErrorString((cudaError_t)err);
}

int kvf_gpu_cuda_error_is_oom(int err)
{
    return err == (int)cudaErrorMemoryAllocation;
}

int kvf_gpu_cuda_kv_copy(const kvf_gpu_kv_plan_t *plan, kvf_gpu_dir_t dir,
                         void *stream)
{
    dim3 grid((unsigned)((plan->num_tokens + kvf_gpu_warps_per_block - 1) /
                         kvf_gpu_warps_per_block),
              plan->layer_count, plan->num_kv);
    dim3 block(kvf_gpu_warps_per_block * kvf_gpu_warp_size);

    if ((plan->num_tokens + kvf_gpu_warps_per_block - 1) /
            kvf_gpu_warps_per_block >
        0x7fffffffu) {
        return (int)cudaErrorInvalidConfiguration;
    }
    kvf_gpu_kv_copy_kernel<<<grid, block, 0, (cudaStream_t)stream>>>(*plan,
                                                                     dir);
    return (int)cudaGetLastError();
}

int kvf_gpu_cuda_synchronize(void)
{
    return (int)cudaDeviceSynchronize();
}

int kvf_gpu_cuda_host_register(void *addr, size_t len)
{
    return (int)cudaHostRegister(
        addr, len, cudaHostRegisterPortable | cudaHostRegisterMapped);
}

int kvf_gpu_cuda_host_unregister(void *addr)
{
    return (int)cudaHostUnregister(addr);
}

int kvf_gpu_cuda_host_device_ptr(void *addr, void **dev_ptr_p)
{
    return (int)cudaHostGetDevicePointer(dev_ptr_p, addr, 0);
}

int kvf_gpu_cuda_ipc_export(void *dev_ptr, kvf_gpu_ipc_handle_t *handle_p)
{
    cudaIpcMemHandle_t h;
    cudaError_t e;

    static_assert(sizeof(h) == sizeof(handle_p->bytes),
                  "cudaIpcMemHandle_t size changed");
    e = cudaIpcGetMemHandle(&h, dev_ptr);
    if (e == cudaSuccess) {
        memcpy(handle_p->bytes, &h, sizeof(h));
    }
    return (int)e;
}

int kvf_gpu_cuda_ipc_open(const kvf_gpu_ipc_handle_t *handle, void **dev_ptr_p)
{
    cudaIpcMemHandle_t h;

    memcpy(&h, handle->bytes, sizeof(h));
    return (int)cudaIpcOpenMemHandle(dev_ptr_p, h,
                                     cudaIpcMemLazyEnablePeerAccess);
}

int kvf_gpu_cuda_ipc_close(void *dev_ptr)
{
    return (int)cudaIpcCloseMemHandle(dev_ptr);
}

int kvf_gpu_cuda_mem_alloc(size_t len, void **dev_ptr_p)
{
    return (int)cudaMalloc(dev_ptr_p, len);
}

int kvf_gpu_cuda_mem_free(void *dev_ptr)
{
    return (int)cudaFree(dev_ptr);
}

int kvf_gpu_cuda_memcpy(void *dst, const void *src, size_t len)
{
    return (int)cudaMemcpy(dst, src, len, cudaMemcpyDefault);
}

} // extern "C"
