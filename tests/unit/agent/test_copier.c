/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The copier (agent/copier.h): every chunk of a batch lands byte for byte
 * with the checksum of what landed (or, not copied, is checksummed where
 * it is), whatever the number of workers, the batch size or how batches
 * follow each other.
 */
#include "agent/copier.h"
#include "tests/helpers/test_helpers.h"

#include <kvfabric/keys.h>

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#define JOBS   64u
#define MAXLEN (256u << 10)

static uint8_t *g_src, *g_dst;
static size_t g_between; /* chunks the caller copied */

static void count_between(void *arg)
{
    (*(size_t *)arg)++;
}

static void copier_setup(void)
{
    size_t i;

    g_src = malloc((size_t)JOBS * MAXLEN);
    g_dst = malloc((size_t)JOBS * MAXLEN);
    cr_assert_not_null(g_src);
    cr_assert_not_null(g_dst);
    for (i = 0; i < (size_t)JOBS * MAXLEN; i++) {
        g_src[i] = (uint8_t)(i * 131u + (i >> 12));
    }
}

static void copier_teardown(void)
{
    free(g_src);
    free(g_dst);
    kvf_test_check_leaks();
}

TestSuite(copier, .init = copier_setup, .fini = copier_teardown, .timeout = 60);

/* Copies @p n jobs of lengths varying with @p round and checks each. */
static void batch_check(kvf_copier_t *copier, uint32_t n, uint32_t round)
{
    kvf_copy_job_t jobs[JOBS];
    size_t before;
    uint32_t i;

    memset(g_dst, 0, (size_t)n * MAXLEN);
    for (i = 0; i < n; i++) {
        jobs[i].src = g_src + (size_t)i * MAXLEN + (round % 7);
        /* every third job only checksums its source where it is */
        jobs[i].dst =
            ((i + round) % 3 == 0) ? NULL : g_dst + (size_t)i * MAXLEN;
        jobs[i].len =
            1 + ((size_t)(i * 7919u + round * 104729u) % (MAXLEN - 8));
        jobs[i].sum = 0;
    }
    before = g_between;
    kvf_copier_run(copier, jobs, n, count_between, &g_between);
    /* the caller's callback ran after each chunk it copied itself: all of
     * them when it copies alone */
    if (kvf_copier_threads(copier) == 1) {
        cr_assert_eq(g_between - before, n);
    } else {
        cr_assert_leq(g_between - before, n);
    }
    for (i = 0; i < n; i++) {
        if (jobs[i].dst == NULL) {
            cr_assert_eq(
                jobs[i].sum, kvf_chunk_checksum(jobs[i].src, jobs[i].len),
                "job %u of %u (round %u): wrong checksum", i, n, round);
            continue;
        }
        cr_assert(memcmp(jobs[i].dst, jobs[i].src, jobs[i].len) == 0,
                  "job %u of %u (round %u) differs", i, n, round);
        cr_assert_eq(jobs[i].sum, kvf_chunk_checksum(jobs[i].dst, jobs[i].len),
                     "job %u of %u (round %u): wrong checksum", i, n, round);
    }
}

static void rounds(unsigned workers)
{
    kvf_copier_t *copier = NULL;
    uint32_t round;

    cr_assert_eq(kvf_copier_create(workers, &copier), KVF_OK);
    cr_assert_eq(kvf_copier_threads(copier), workers + 1);
    for (round = 0; round < 200; round++) {
        batch_check(copier, (round % JOBS) + 1, round);
    }
    batch_check(copier, 0, 0); /* nothing to do: returns */
    kvf_copier_destroy(copier);
}

Test(copier, no_worker_copies_on_the_caller)
{
    rounds(0);
}

Test(copier, one_worker)
{
    rounds(1);
}

Test(copier, more_workers_than_cores)
{
    rounds(5);
}

Test(copier, no_copier_at_all_copies_on_the_caller)
{
    batch_check(NULL, JOBS, 3);
    cr_assert_eq(kvf_copier_threads(NULL), 1);
}

Test(copier, destroyed_idle_and_null)
{
    kvf_copier_t *copier = NULL;

    cr_assert_eq(kvf_copier_create(3, &copier), KVF_OK);
    kvf_copier_destroy(copier); /* never ran: workers still asleep */
    kvf_copier_destroy(NULL);
}
