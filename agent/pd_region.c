/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/pd_region.h"

#include <stdbool.h>
#include <stdlib.h>

struct kvf_pd_region {
    uint64_t *bits;    /* one bit per page, 1 = reserved; the pages past the
                          end of the last word count as reserved */
    uint64_t *nonfull; /* one bit per word of bits: it has a free page */
    uint64_t words;
    uint64_t pages;
    uint64_t used_pages;
    uint64_t hint; /* every page below it is reserved: first fit starts
                      here */
};

/* The first free page at or after @p p; region->pages when none. Full
 * words are skipped 64 at a time through nonfull. */
static uint64_t kvf_pd_region_next_free(const kvf_pd_region_t *region,
                                        uint64_t p)
{
    uint64_t w = p / 64, sw, word;

    if (p >= region->pages) {
        return region->pages;
    }
    word = ~region->bits[w] & (~0ull << (p % 64));
    if (word == 0) {
        if (++w == region->words) {
            return region->pages;
        }
        sw   = w / 64;
        word = region->nonfull[sw] & (~0ull << (w % 64));
        while (word == 0) {
            if (++sw == (region->words + 63) / 64) {
                return region->pages;
            }
            word = region->nonfull[sw];
        }
        w    = sw * 64 + (uint64_t)__builtin_ctzll(word);
        word = ~region->bits[w];
    }
    p = w * 64 + (uint64_t)__builtin_ctzll(word);
    return (p < region->pages) ? p : region->pages;
}

/* The first reserved page in [@p p, @p limit); @p limit when none. */
static uint64_t kvf_pd_region_next_used(const kvf_pd_region_t *region,
                                        uint64_t p, uint64_t limit)
{
    uint64_t w = p / 64, word = region->bits[w] & (~0ull << (p % 64));

    while (word == 0) {
        if ((++w) * 64 >= limit) {
            return limit;
        }
        word = region->bits[w];
    }
    p = w * 64 + (uint64_t)__builtin_ctzll(word);
    return (p < limit) ? p : limit;
}

/* Sets (@p set) or clears pages [first, first + n), a word at a time. */
static void kvf_pd_region_mark(kvf_pd_region_t *region, uint64_t first,
                               uint64_t n, bool set)
{
    uint64_t end = first + n, w, lo, hi, mask;

    while (first < end) {
        w    = first / 64;
        lo   = first % 64;
        hi   = ((end - w * 64) < 64) ? (end - w * 64) : 64; /* exclusive */
        mask = ((hi == 64) ? ~0ull : ((1ull << hi) - 1)) & (~0ull << lo);
        if (set) {
            region->bits[w] |= mask;
        } else {
            region->bits[w] &= ~mask;
        }
        if (region->bits[w] == ~0ull) {
            region->nonfull[w / 64] &= ~(1ull << (w % 64));
        } else {
            region->nonfull[w / 64] |= 1ull << (w % 64);
        }
        first = w * 64 + hi;
    }
}

/* First run of @p n free pages; UINT64_MAX when none. @p first_free_p:
 * the first free page at all (region->pages when none). */
static uint64_t kvf_pd_region_find(const kvf_pd_region_t *region, uint64_t n,
                                   uint64_t *first_free_p)
{
    uint64_t start, end, limit, p = region->hint;

    *first_free_p = region->pages;
    for (;;) {
        start = kvf_pd_region_next_free(region, p);
        if (start >= region->pages) {
            return UINT64_MAX;
        }
        if (*first_free_p == region->pages) {
            *first_free_p = start;
        }
        /* only as far as the run needs */
        limit = (n < region->pages - start) ? start + n : region->pages;
        end   = kvf_pd_region_next_used(region, start, limit);
        if (end - start >= n) {
            return start;
        }
        p = end;
    }
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
    region->pages   = size / KVF_PD_REGION_PAGE;
    region->words   = (region->pages + 63) / 64;
    region->bits    = calloc(region->words, sizeof(uint64_t));
    region->nonfull = calloc((region->words + 63) / 64, sizeof(uint64_t));
    if ((region->bits == NULL) || (region->nonfull == NULL)) {
        free(region->bits);
        free(region->nonfull);
        free(region);
        return KVF_ERR_NO_MEMORY;
    }
    kvf_pd_region_mark(region, 0, region->pages, false); /* every word */
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
    free(region->nonfull);
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
    uint64_t total = 0, n, first, first_free;
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
        first = kvf_pd_region_find(region, n, &first_free);
        if (first == UINT64_MAX) {
            break;
        }
        kvf_pd_region_mark(region, first, n, true);
        region->used_pages += n;
        /* the pages below stay reserved: the next search starts after
         * them (the first free page, or past this slot if it was that) */
        region->hint = (first == first_free) ? first + n : first_free;
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
    uint64_t first = offset / KVF_PD_REGION_PAGE, n;

    n = kvf_pd_region_footprint(length) / KVF_PD_REGION_PAGE;
    if ((offset % KVF_PD_REGION_PAGE != 0) || (n == 0) ||
        (first >= region->pages) || (n > region->pages - first)) {
        return KVF_ERR_RANGE;
    }
    if (kvf_pd_region_next_free(region, first) < first + n) {
        return KVF_ERR_RANGE; /* a page of it is not reserved */
    }
    kvf_pd_region_mark(region, first, n, false);
    region->used_pages -= n;
    region->hint = (first < region->hint) ? first : region->hint;
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
