/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/pd_region.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define PAGE KVF_PD_REGION_PAGE

static kvf_pd_region_t *g_region;

static void region_setup(void)
{
    cr_assert_eq(kvf_pd_region_create(64 * PAGE, &g_region), KVF_OK);
}

static void region_teardown(void)
{
    kvf_pd_region_destroy(g_region);
    kvf_test_check_leaks();
}

TestSuite(pd_region, .init = region_setup, .fini = region_teardown,
          .timeout = 10);

Test(pd_region, create_refuses_less_than_a_page)
{
    kvf_pd_region_t *r = NULL;

    cr_assert_eq(kvf_pd_region_create(PAGE - 1, &r), KVF_ERR_INVALID);
    cr_assert_null(r);
    kvf_pd_region_destroy(NULL);
}

Test(pd_region, batch_is_all_or_nothing)
{
    uint64_t lengths[3] = {16 * PAGE, 16 * PAGE, 40 * PAGE};
    uint64_t offsets[3];

    cr_assert_eq(kvf_pd_region_alloc(g_region, lengths, 2, offsets), KVF_OK);
    cr_assert_eq(offsets[0], 0);
    cr_assert_eq(offsets[1], 16 * PAGE);
    cr_assert_eq(kvf_pd_region_used(g_region), 32 * PAGE);
    /* 40 pages do not fit in the 32 left: nothing is taken */
    cr_assert_eq(kvf_pd_region_alloc(g_region, &lengths[2], 1, offsets),
                 KVF_ERR_NO_MEMORY);
    cr_assert_eq(kvf_pd_region_used(g_region), 32 * PAGE);
    cr_assert_eq(kvf_pd_region_free(g_region, 0, 16 * PAGE), KVF_OK);
    cr_assert_eq(kvf_pd_region_free(g_region, 16 * PAGE, 16 * PAGE), KVF_OK);
    cr_assert_eq(kvf_pd_region_alloc(g_region, &lengths[2], 1, offsets),
                 KVF_OK);
}

Test(pd_region, fragmentation_gives_back_partial_batches)
{
    uint64_t one = 8 * PAGE, offs[8], big[2] = {20 * PAGE, 20 * PAGE};
    uint32_t i;

    for (i = 0; i < 8; i++) {
        cr_assert_eq(kvf_pd_region_alloc(g_region, &one, 1, &offs[i]), KVF_OK);
    }
    /* free every other slot: 32 pages free, no run longer than 8 */
    for (i = 0; i < 8; i += 2) {
        cr_assert_eq(kvf_pd_region_free(g_region, offs[i], one), KVF_OK);
    }
    cr_assert_eq(kvf_pd_region_alloc(g_region, big, 1, offs),
                 KVF_ERR_NO_MEMORY);
    cr_assert_eq(kvf_pd_region_used(g_region), 32 * PAGE);
}

Test(pd_region, too_big_fails_fast_and_sizes_round_to_pages)
{
    uint64_t lengths[2] = {33 * PAGE, 33 * PAGE}, offsets[2];
    uint64_t odd        = 1;

    cr_assert_eq(kvf_pd_region_alloc(g_region, lengths, 2, offsets),
                 KVF_ERR_TOO_BIG);
    cr_assert_eq(kvf_pd_region_alloc(g_region, &odd, 1, offsets), KVF_OK);
    cr_assert_eq(kvf_pd_region_used(g_region), PAGE);
    cr_assert_eq(kvf_pd_region_footprint(PAGE + 1), 2 * PAGE);
}

Test(pd_region, bad_frees_are_refused)
{
    uint64_t len = 2 * PAGE, off, zero = 0;

    cr_assert_eq(kvf_pd_region_alloc(g_region, &zero, 1, &off),
                 KVF_ERR_INVALID);
    cr_assert_eq(kvf_pd_region_alloc(g_region, &len, 0, &off), KVF_ERR_INVALID);
    cr_assert_eq(kvf_pd_region_alloc(g_region, &len, 1, &off), KVF_OK);
    cr_assert_eq(kvf_pd_region_free(g_region, off + 1, len), KVF_ERR_RANGE);
    cr_assert_eq(kvf_pd_region_free(g_region, 10 * PAGE, len), KVF_ERR_RANGE);
    cr_assert_eq(kvf_pd_region_free(g_region, 63 * PAGE, len), KVF_ERR_RANGE);
    cr_assert_eq(kvf_pd_region_free(g_region, off, len), KVF_OK);
    cr_assert_eq(kvf_pd_region_free(g_region, off, len), KVF_ERR_RANGE);
    cr_assert_eq(kvf_pd_region_used(g_region), 0);
}

Test(pd_region, partial_last_word_is_never_handed_out)
{
    kvf_pd_region_t *r;
    uint64_t len = PAGE, off;
    uint32_t i;

    cr_assert_eq(kvf_pd_region_create(70 * PAGE, &r), KVF_OK);
    for (i = 0; i < 70; i++) {
        cr_assert_eq(kvf_pd_region_alloc(r, &len, 1, &off), KVF_OK);
        cr_assert_lt(off, 70 * PAGE);
    }
    cr_assert_eq(kvf_pd_region_alloc(r, &len, 1, &off), KVF_ERR_NO_MEMORY);
    kvf_pd_region_destroy(r);
}

/* Random reservations (1-@p maxrun pages) and frees in a region of
 * @p pages (not a whole number of bitmap words), each checked against a
 * page-by-page first fit: the same offsets, the same refusals, the same
 * use; a free reaching into a free page is refused. */
static void check_against_model(uint64_t pages, uint64_t maxrun, uint32_t steps)
{
    enum {
        SLOTS = 64
    };
    bool *model = calloc(pages, sizeof(bool));
    uint64_t off[SLOTS], len[SLOTS], used = 0, seed = 0x5eed, want, p, run;
    kvf_pd_region_t *r;
    uint32_t step, k;

    cr_assert_not_null(model);
    memset(len, 0, sizeof(len));
    cr_assert_eq(kvf_pd_region_create(pages * PAGE + 123, &r), KVF_OK);
    for (step = 0; step < steps; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        k    = (uint32_t)(seed >> 33) % SLOTS;
        if (len[k] != 0) {
            p = (off[k] + len[k]) / PAGE;   /* the page after the slot */
            if ((p < pages) && !model[p]) { /* a free reaching into it */
                cr_assert_eq(kvf_pd_region_free(r, off[k], len[k] + PAGE),
                             KVF_ERR_RANGE, "step %u", step);
            }
            cr_assert_eq(kvf_pd_region_free(r, off[k], len[k]), KVF_OK);
            for (p = off[k] / PAGE; p < (off[k] + len[k]) / PAGE; p++) {
                model[p] = false;
            }
            used -= len[k] / PAGE;
            len[k] = 0;
            continue;
        }
        len[k] = (1 + (seed >> 40) % maxrun) * PAGE;
        for (want = UINT64_MAX, p = 0, run = 0; p < pages; p++) {
            run = model[p] ? 0 : run + 1;
            if (run == len[k] / PAGE) {
                want = p + 1 - run;
                break;
            }
        }
        if (want == UINT64_MAX) {
            cr_assert_eq(kvf_pd_region_alloc(r, &len[k], 1, &off[k]),
                         KVF_ERR_NO_MEMORY, "step %u", step);
            len[k] = 0;
            continue;
        }
        cr_assert_eq(kvf_pd_region_alloc(r, &len[k], 1, &off[k]), KVF_OK,
                     "step %u", step);
        cr_assert_eq(off[k], want * PAGE, "step %u: %lu, first fit %lu", step,
                     (unsigned long)(off[k] / PAGE), (unsigned long)want);
        for (p = want; p < want + len[k] / PAGE; p++) {
            model[p] = true;
        }
        used += len[k] / PAGE;
        cr_assert_eq(kvf_pd_region_used(r), used * PAGE);
    }
    kvf_pd_region_destroy(r);
    free(model);
}

/* First fit, with the bitmap scanned a word at a time and full words
 * skipped through a second level: small runs in a region of 16 words,
 * and runs of up to 600 pages in one of 141 words (three words of the
 * second level). */
Test(pd_region, word_scans_agree_with_a_page_by_page_first_fit)
{
    check_against_model(1000, 150, 20000);
    check_against_model(9000, 600, 20000);
}
