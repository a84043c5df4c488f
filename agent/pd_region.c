/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/pd_region.h"

#include <stdbool.h>
#include <stdlib.h>

struct kvf_pd_region {
    uint64_t *bits; /* one bit per page, 1 = reserved */
    uint64_t pages;
    uint64_t used_pages;
};

static bool kvf_pd_region_test(const kvf_pd_region_t *region, uint64_t page)
{
    return (region->bits[page / 64] >> (page % 64)) & 1u;
}

static void kvf_pd_region_mark(kvf_pd_region_t *region, uint64_t first,
                               uint64_t n, bool set)
{
    uint64_t p;

    for (p = first; p < first + n; p++) {
        if (set) {
            region->bits[p / 64] |= 1ull << (p % 64);
        } else {
            region->bits[p / 64] &= ~(1ull << (p % 64));
        }
    }
}

/* First run of @p n free pages; UINT64_MAX when none. */
static uint64_t kvf_pd_region_find(const kvf_pd_region_t *region, uint64_t n)
{
    uint64_t p = 0, run = 0;

    while (p < region->pages) {
        if ((run == 0) && (p % 64 == 0) && (region->bits[p / 64] == ~0ull)) {
            p += 64; /* a full word: skip it */
            continue;
        }
        if (kvf_pd_region_test(region, p)) {
            run = 0;
        } else if (++run == n) {
            return p + 1 - n;
        }
        p++;
    }
    return UINT64_MAX;
}

kvf_status_t kvf_pd_region_create(uint64_t size, kvf_pd_region_t **region_p)
{
    kvf_pd_region_t *region;

    if (size < KVF_PD_REGION_PAGE) {
        return KVF_ERR_INVALID;
    }
    region = calloc(1, sizeof(*region));
    if (region == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    region->pages = size / KVF_PD_REGION_PAGE;
    region->bits  = calloc((region->pages + 63) / 64, sizeof(uint64_t));
    if (region->bits == NULL) {
        free(region);
        return KVF_ERR_NO_MEMORY;
    }
    /* pages past the end of the last word never count as free */
    if (region->pages % 64 != 0) {
        region->bits[region->pages / 64] = ~0ull << (region->pages % 64);
    }
    *region_p = region;
    return KVF_OK;
}

void kvf_pd_region_destroy(kvf_pd_region_t *region)
{
    if (region == NULL) {
        return;
    }
    free(region->bits);
    free(region);
}

uint64_t kvf_pd_region_footprint(uint64_t length)
{
    return (length + KVF_PD_REGION_PAGE - 1) / KVF_PD_REGION_PAGE *
           KVF_PD_REGION_PAGE;
}

kvf_status_t kvf_pd_region_alloc(kvf_pd_region_t *region,
                                 const uint64_t *lengths, uint32_t num,
                                 uint64_t *offsets)
{
    uint64_t total = 0, n, first;
    uint32_t i, got;

    if (num == 0) {
        return KVF_ERR_INVALID;
    }
    for (i = 0; i < num; i++) {
        if (lengths[i] == 0) {
            return KVF_ERR_INVALID;
        }
        if (lengths[i] > region->pages * KVF_PD_REGION_PAGE) {
            return KVF_ERR_TOO_BIG;
        }
        total += kvf_pd_region_footprint(lengths[i]) / KVF_PD_REGION_PAGE;
    }
    if (total > region->pages) {
        return KVF_ERR_TOO_BIG;
    }
    if (total > region->pages - region->used_pages) {
        return KVF_ERR_NO_MEMORY;
    }
    for (got = 0; got < num; got++) {
        n     = kvf_pd_region_footprint(lengths[got]) / KVF_PD_REGION_PAGE;
        first = kvf_pd_region_find(region, n);
        if (first == UINT64_MAX) {
            break;
        }
        kvf_pd_region_mark(region, first, n, true);
        region->used_pages += n;
        offsets[got] = first * KVF_PD_REGION_PAGE;
    }
    if (got == num) {
        return KVF_OK;
    }
    /* fragmented: give back what this batch took */
    for (i = 0; i < got; i++) {
        kvf_pd_region_free(region, offsets[i], lengths[i]);
    }
    return KVF_ERR_NO_MEMORY;
}

kvf_status_t kvf_pd_region_free(kvf_pd_region_t *region, uint64_t offset,
                                uint64_t length)
{
    uint64_t first = offset / KVF_PD_REGION_PAGE, n, p;

    n = kvf_pd_region_footprint(length) / KVF_PD_REGION_PAGE;
    if ((offset % KVF_PD_REGION_PAGE != 0) || (n == 0) ||
        (first >= region->pages) || (n > region->pages - first)) {
        return KVF_ERR_RANGE;
    }
    for (p = first; p < first + n; p++) {
        if (!kvf_pd_region_test(region, p)) {
            return KVF_ERR_RANGE;
        }
    }
    kvf_pd_region_mark(region, first, n, false);
    region->used_pages -= n;
    return KVF_OK;
}

uint64_t kvf_pd_region_size(const kvf_pd_region_t *region)
{
    return region->pages * KVF_PD_REGION_PAGE;
}

uint64_t kvf_pd_region_used(const kvf_pd_region_t *region)
{
    return region->used_pages * KVF_PD_REGION_PAGE;
}
