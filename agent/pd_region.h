/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The PD receive region's slot allocator (DESIGN.md §6): a decoder reserves
 * one contiguous slot per pushed chunk inside [0, size) of its receive
 * region. Pages of KVF_PD_REGION_PAGE bytes, first fit in a bitmap
 * scanned a word at a time from the lowest page that may be free, full
 * words skipped 64 at a time through a second level: a reservation or a
 * free costs well under a microsecond in a 90 %-full 8 GiB region
 * (it was 16-18 µs scanning page by page). A batch
 * is reserved all or nothing, so a push never holds half its slots while
 * it waits for room (the queue that waits lives in agent/pd.c).
 *
 * Memory-free: it hands out offsets; the bytes live elsewhere (host memory
 * after the pool in the engine's mapping, or a GPU buffer).
 *
 * thread: owning loop only. No allocation after create.
 */
#ifndef KVF_AGENT_PD_REGION_H
#define KVF_AGENT_PD_REGION_H

#include <kvfabric/status.h>

#include <stdint.h>

#define KVF_PD_REGION_PAGE 4096u

typedef struct kvf_pd_region kvf_pd_region_t;

/* Creates an allocator for @p size bytes (rounded down to whole pages).
 * KVF_ERR_INVALID for less than one page; KVF_ERR_NO_MEMORY. */
kvf_status_t kvf_pd_region_create(uint64_t size, kvf_pd_region_t **region_p);

/* NULL is a no-op. */
void kvf_pd_region_destroy(kvf_pd_region_t *region);

/* Bytes a chunk of @p length occupies (whole pages). */
uint64_t kvf_pd_region_footprint(uint64_t length);

/*
 * Reserves one slot per length, all or nothing; writes their offsets.
 * KVF_ERR_INVALID (a 0 length or @p num 0); KVF_ERR_TOO_BIG (the batch
 * could never fit, even in an empty region); KVF_ERR_NO_MEMORY (not now:
 * nothing was reserved).
 */
kvf_status_t kvf_pd_region_alloc(kvf_pd_region_t *region,
                                 const uint64_t *lengths, uint32_t num,
                                 uint64_t *offsets);

/* Frees the slot at @p offset of @p length bytes (as reserved).
 * KVF_ERR_RANGE when that is not a reserved slot's range. */
kvf_status_t kvf_pd_region_free(kvf_pd_region_t *region, uint64_t offset,
                                uint64_t length);

uint64_t kvf_pd_region_size(const kvf_pd_region_t *region);
uint64_t kvf_pd_region_used(const kvf_pd_region_t *region);

#endif /* KVF_AGENT_PD_REGION_H */
