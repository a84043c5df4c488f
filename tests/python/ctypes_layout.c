/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Prints the C layout of every public struct the Python binding mirrors
 * (python/kvfabric/_lib.py), one line per struct and per field:
 *
 *     struct <type> <sizeof>
 *     field <type> <name> <offsetof> <sizeof>
 *
 * test_ctypes_layout.py compares them with the ctypes classes.
 */
#include <kvfabric/gpu.h>
#include <kvfabric/keys.h>
#include <kvfabric/kvfabric.h>

#include <stddef.h>
#include <stdio.h>

#define KVF_LAYOUT_STRUCT(_t) printf("struct %s %zu\n", #_t, sizeof(_t))
#define KVF_LAYOUT_FIELD(_t, _f) \
    printf("field %s %s %zu %zu\n", #_t, #_f, offsetof(_t, _f), \
           sizeof(((_t *)NULL)->_f))

int main(void)
{
    KVF_LAYOUT_STRUCT(kvf_key_t);
    KVF_LAYOUT_FIELD(kvf_key_t, ns);
    KVF_LAYOUT_FIELD(kvf_key_t, hi);
    KVF_LAYOUT_FIELD(kvf_key_t, lo);

    KVF_LAYOUT_STRUCT(kvf_namespace_params_t);
    KVF_LAYOUT_FIELD(kvf_namespace_params_t, field_mask);
    KVF_LAYOUT_FIELD(kvf_namespace_params_t, model_id);
    KVF_LAYOUT_FIELD(kvf_namespace_params_t, dtype);
    KVF_LAYOUT_FIELD(kvf_namespace_params_t, num_layers);
    KVF_LAYOUT_FIELD(kvf_namespace_params_t, num_kv_heads);
    KVF_LAYOUT_FIELD(kvf_namespace_params_t, head_dim);
    KVF_LAYOUT_FIELD(kvf_namespace_params_t, tp_rank);
    KVF_LAYOUT_FIELD(kvf_namespace_params_t, tp_world);
    KVF_LAYOUT_FIELD(kvf_namespace_params_t, chunk_size);
    KVF_LAYOUT_FIELD(kvf_namespace_params_t, layout_version);

    KVF_LAYOUT_STRUCT(kvf_client_params_t);
    KVF_LAYOUT_FIELD(kvf_client_params_t, field_mask);
    KVF_LAYOUT_FIELD(kvf_client_params_t, socket_path);
    KVF_LAYOUT_FIELD(kvf_client_params_t, timeout_ns);
    KVF_LAYOUT_FIELD(kvf_client_params_t, name);
    KVF_LAYOUT_FIELD(kvf_client_params_t, secret_file);

    KVF_LAYOUT_STRUCT(kvf_slot_t);
    KVF_LAYOUT_FIELD(kvf_slot_t, offset);
    KVF_LAYOUT_FIELD(kvf_slot_t, length);

    KVF_LAYOUT_STRUCT(kvf_lookup_result_t);
    KVF_LAYOUT_FIELD(kvf_lookup_result_t, hit_chunks);
    KVF_LAYOUT_FIELD(kvf_lookup_result_t, local_chunks);
    KVF_LAYOUT_FIELD(kvf_lookup_result_t, lease_id);

    KVF_LAYOUT_STRUCT(kvf_client_stats_t);
    KVF_LAYOUT_FIELD(kvf_client_stats_t, pool_capacity);
    KVF_LAYOUT_FIELD(kvf_client_stats_t, pool_used);
    KVF_LAYOUT_FIELD(kvf_client_stats_t, chunks);
    KVF_LAYOUT_FIELD(kvf_client_stats_t, local_hits);
    KVF_LAYOUT_FIELD(kvf_client_stats_t, misses);
    KVF_LAYOUT_FIELD(kvf_client_stats_t, fetched_chunks);
    KVF_LAYOUT_FIELD(kvf_client_stats_t, evictions);
    KVF_LAYOUT_FIELD(kvf_client_stats_t, node_id);
    KVF_LAYOUT_FIELD(kvf_client_stats_t, registered);

    KVF_LAYOUT_STRUCT(kvf_gpu_kv_layout_t);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_layout_t, field_mask);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_layout_t, layout);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_layout_t, dtype);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_layout_t, num_layers);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_layout_t, num_kv_heads);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_layout_t, head_dim);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_layout_t, block_size);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_layout_t, num_blocks);

    KVF_LAYOUT_STRUCT(kvf_gpu_kv_copy_params_t);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, field_mask);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, layout);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, k_layers);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, v_layers);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, slot_mapping);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, slot_mapping_len);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, token_begin);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, num_tokens);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, chunk);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, chunk_tokens);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, chunk_offset);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, layer_begin);
    KVF_LAYOUT_FIELD(kvf_gpu_kv_copy_params_t, layer_count);
    return 0;
}
