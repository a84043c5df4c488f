/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/pool.h"

#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <fcntl.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define KIB (1024ull)
#define MIB (1024ull * 1024)

static kvf_pool_t *g_pool;
static unsigned g_evicted;
static kvf_key_t g_evicted_keys[64];
static uint64_t g_evicted_offsets[64];
static unsigned g_keep; /* evictions the callback keeps (write-behind) */

static bool on_evict(const kvf_key_t *key, uint64_t offset, uint64_t length,
                     bool can_keep, void *arg)
{
    if (g_evicted < 64) {
        g_evicted_keys[g_evicted]    = *key;
        g_evicted_offsets[g_evicted] = offset;
    }
    g_evicted++;
    if ((g_keep > 0) && can_keep) {
        g_keep--;
        return true;
    }
    return false;
}

static kvf_key_t key_of(uint64_t n)
{
    kvf_key_t key = {.ns = 7, .hi = n * 31, .lo = n};

    return key;
}

/* 8 MiB: 8 slabs of 1 MiB, classes 64 KiB .. 1 MiB; evict only when full */
static kvf_pool_t *pool_new(kvf_pool_policy_t policy)
{
    kvf_pool_params_t params = {
        .field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MIN_CHUNK |
                      KVF_POOL_FIELD_MAX_CHUNK | KVF_POOL_FIELD_POLICY |
                      KVF_POOL_FIELD_WATERMARKS | KVF_POOL_FIELD_EVICT_CB |
                      KVF_POOL_FIELD_NO_HUGETLB | KVF_POOL_FIELD_NAME,
        .name      = "test-pool",
        .size      = 8 * MIB,
        .min_chunk = 64 * KIB,
        .max_chunk = 1 * MIB,
        .policy    = policy,
        .high_pct  = 100,
        .low_pct   = 100,
        .evict_cb  = on_evict,
    };
    kvf_pool_t *pool = NULL;

    g_evicted = 0;
    g_keep    = 0;
    cr_assert_eq(kvf_pool_create(&params, &pool), KVF_OK);
    return pool;
}

static void pool_setup(void)
{
    g_pool = pool_new(KVF_POOL_POLICY_LRU);
}

static void pool_teardown(void)
{
    kvf_pool_destroy(g_pool);
    g_pool = NULL;
    kvf_test_check_leaks();
}

TestSuite(pool, .init = pool_setup, .fini = pool_teardown, .timeout = 20);

/* allocates and commits entry n of @p len bytes */
static kvf_pool_entry_t *store(kvf_pool_t *pool, uint64_t n, uint64_t len)
{
    kvf_pool_entry_t *e = NULL;
    kvf_key_t key       = key_of(n);

    cr_assert_eq(kvf_pool_alloc(pool, len, UINT64_MAX, &e), KVF_OK, "alloc %lu",
                 (unsigned long)n);
    cr_assert_eq(kvf_pool_commit(pool, e, &key, n ^ 0xabcdu), KVF_OK);
    return e;
}

Test(pool, create_rejects_bad_params)
{
    kvf_pool_params_t p = {.field_mask =
                               KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MIN_CHUNK,
                           .size      = 8 * MIB,
                           .min_chunk = 100 * KIB};
    kvf_pool_t *pool    = NULL;

    cr_assert_eq(kvf_pool_create(&p, &pool), KVF_ERR_INVALID);
    p.field_mask = 0;
    cr_assert_eq(kvf_pool_create(&p, &pool), KVF_ERR_INVALID);
    p.field_mask = KVF_POOL_FIELD_SIZE;
    p.size       = 1 * MIB; /* below the 4 MiB default max chunk */
    cr_assert_eq(kvf_pool_create(&p, &pool), KVF_ERR_INVALID);
    p.field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_WATERMARKS;
    p.size       = 8 * MIB;
    p.high_pct   = 50;
    p.low_pct    = 60;
    cr_assert_eq(kvf_pool_create(&p, &pool), KVF_ERR_INVALID);
    cr_assert_null(pool);
    kvf_pool_destroy(NULL);
}

Test(pool, region_is_a_shared_memfd)
{
    kvf_pool_params_t p = {.field_mask = KVF_POOL_FIELD_SIZE, .size = 8 * MIB};
    kvf_pool_t *pool    = NULL;
    unsigned char *view;
    int flags;

    /* default params try huge pages first and fall back (logged) */
    kvf_test_log_capture_start();
    cr_assert_eq(kvf_pool_create(&p, &pool), KVF_OK);
    kvf_test_log_capture_stop();
    cr_assert(kvf_pool_is_hugetlb(pool) ||
                  kvf_test_log_contains("no huge pages for 8388608 bytes"),
              "%s", kvf_test_log_text());
    cr_assert_eq(kvf_pool_capacity(pool), 8 * MIB);
    flags = fcntl(kvf_pool_fd(pool), F_GETFD);
    cr_assert(flags & FD_CLOEXEC);

    /* a second mapping of the fd (what an engine does) sees the bytes */
    view = mmap(NULL, 8 * MIB, PROT_READ, MAP_SHARED, kvf_pool_fd(pool), 0);
    cr_assert_neq(view, MAP_FAILED);
    memset(kvf_pool_ptr(pool, 3 * MIB), 0x5a, 4096);
    cr_assert_eq(view[3 * MIB + 100], 0x5a);
    munmap(view, 8 * MIB);
    kvf_pool_destroy(pool);
}

Test(pool, engines_get_a_read_only_sealed_fd_without_the_reserve)
{
    kvf_pool_params_t p = {.field_mask = KVF_POOL_FIELD_SIZE |
                                         KVF_POOL_FIELD_NO_HUGETLB |
                                         KVF_POOL_FIELD_RESERVE,
                           .size    = 8 * MIB,
                           .reserve = 1 * MIB};
    kvf_pool_t *pool = NULL, *staging = NULL;
    uint64_t reserve_at = 0;
    unsigned char *view;
    char path[64];
    struct stat st;
    int fd, rw;

    cr_assert_eq(kvf_pool_create(&p, &pool), KVF_OK);
    cr_assert(kvf_pool_is_sealed(pool));
    /* the reserve (PD region) follows the chunk area in the mapping, not
     * in the memfd */
    cr_assert_eq(kvf_pool_reserve(pool, &reserve_at), 1 * MIB);
    cr_assert_eq(reserve_at, kvf_pool_fd_length(pool));
    cr_assert_eq(fstat(kvf_pool_fd(pool), &st), 0);
    cr_assert_eq((uint64_t)st.st_size, kvf_pool_fd_length(pool));
    memset(kvf_pool_ptr(pool, reserve_at), 0x77, 1 * MIB); /* writable */

    cr_assert_eq(kvf_pool_fd_readonly(pool, &fd), KVF_OK);
    cr_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    cr_assert_eq(mmap(NULL, 8 * MIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0),
                 MAP_FAILED);
    view = mmap(NULL, 8 * MIB, PROT_READ, MAP_SHARED, fd, 0);
    cr_assert_neq(view, MAP_FAILED);
    memset(kvf_pool_ptr(pool, 3 * MIB), 0x5a, 4096); /* the pool writes */
    cr_assert_eq(view[3 * MIB + 100], 0x5a);
    cr_assert_neq(mprotect(view, 4096, PROT_READ | PROT_WRITE), 0);
    munmap(view, 8 * MIB);
    /* reopened read-write, the seals still refuse every write */
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    rw = open(path, O_RDWR);
    if (rw >= 0) {
        cr_assert_eq(
            mmap(NULL, 8 * MIB, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0),
            MAP_FAILED);
        cr_assert_lt(write(rw, "x", 1), 0);
        cr_assert_neq(ftruncate(rw, 0), 0);
        close(rw);
    }
    close(fd);
    kvf_pool_destroy(pool);

    /* an unsealed pool (an engine's staging area) maps writable, but
     * cannot be truncated under its owner */
    p.field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_NO_HUGETLB |
                   KVF_POOL_FIELD_UNSEALED;
    cr_assert_eq(kvf_pool_create(&p, &staging), KVF_OK);
    cr_assert(!kvf_pool_is_sealed(staging));
    view = mmap(NULL, 8 * MIB, PROT_READ | PROT_WRITE, MAP_SHARED,
                kvf_pool_fd(staging), 0);
    cr_assert_neq(view, MAP_FAILED);
    view[5] = 9;
    cr_assert_eq(((unsigned char *)kvf_pool_base(staging))[5], 9);
    munmap(view, 8 * MIB);
    cr_assert_neq(ftruncate(kvf_pool_fd(staging), 0), 0);
    kvf_pool_destroy(staging);
}

Test(pool, size_classes_and_offsets_in_range)
{
    static const uint64_t lens[] = {1,         64 * KIB,  64 * KIB + 1,
                                    200 * KIB, 256 * KIB, 1 * MIB};
    static const uint64_t want[] = {64 * KIB,  64 * KIB,  128 * KIB,
                                    256 * KIB, 256 * KIB, 1 * MIB};
    kvf_pool_entry_t *e;
    unsigned i;

    for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        cr_assert_eq(kvf_pool_alloc(g_pool, lens[i], UINT64_MAX, &e), KVF_OK);
        cr_assert_eq(kvf_pool_entry_block_size(g_pool, e), want[i]);
        cr_assert_eq(kvf_pool_entry_length(e), lens[i]);
        cr_assert_eq(kvf_pool_entry_offset(e) % want[i], 0);
        cr_assert_leq(kvf_pool_entry_offset(e) + want[i], 8 * MIB);
        cr_assert_eq(kvf_pool_entry_find(g_pool, kvf_pool_entry_offset(e)), e);
        cr_assert_eq(kvf_pool_entry_state(e), KVF_POOL_ENTRY_ALLOCATED);
    }
    cr_assert_eq(kvf_pool_alloc(g_pool, 1 * MIB + 1, UINT64_MAX, &e),
                 KVF_ERR_TOO_BIG);
    cr_assert_eq(kvf_pool_alloc(g_pool, 0, UINT64_MAX, &e), KVF_ERR_INVALID);
    /* offsets that are not block starts are refused */
    cr_assert_null(kvf_pool_entry_find(g_pool, 8 * MIB));
    cr_assert_null(kvf_pool_entry_find(g_pool, 12345));
    cr_assert_null(kvf_pool_entry_find(g_pool, 7 * MIB));
}

Test(pool, blocks_never_overlap_until_full)
{
    static kvf_pool_entry_t *es[128];
    uint64_t seen[128];
    kvf_pool_stats_t st;
    kvf_pool_entry_t *e;
    unsigned n = 0;
    unsigned i;
    unsigned j;

    while (kvf_pool_alloc(g_pool, 64 * KIB, UINT64_MAX, &e) == KVF_OK) {
        cr_assert_lt(n, 128);
        es[n]   = e;
        seen[n] = kvf_pool_entry_offset(e);
        n++;
    }
    cr_assert_eq(n, 128); /* 8 MiB / 64 KiB */
    for (i = 0; i < n; i++) {
        for (j = i + 1; j < n; j++) {
            cr_assert_neq(seen[i], seen[j]);
        }
    }
    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.used, 8 * MIB);
    cr_assert_eq(st.free, 0);
    cr_assert_eq(st.allocated, 128);
    cr_assert_eq(st.alloc_fails, 1);
    for (i = 0; i < n; i++) {
        cr_assert_eq(kvf_pool_free(g_pool, es[i]), KVF_OK);
    }
    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.used, 0);
}

Test(pool, slabs_return_after_fragmentation)
{
    static kvf_pool_entry_t *small[128];
    kvf_pool_entry_t *big;
    unsigned i;

    for (i = 0; i < 128; i++) {
        cr_assert_eq(kvf_pool_alloc(g_pool, 64 * KIB, UINT64_MAX, &small[i]),
                     KVF_OK);
    }
    cr_assert_eq(kvf_pool_alloc(g_pool, 1 * MIB, UINT64_MAX, &big),
                 KVF_ERR_NO_MEMORY);
    /* free every other block: half the pool free, yet no whole slab */
    for (i = 0; i < 128; i += 2) {
        cr_assert_eq(kvf_pool_free(g_pool, small[i]), KVF_OK);
    }
    cr_assert_eq(kvf_pool_alloc(g_pool, 1 * MIB, UINT64_MAX, &big),
                 KVF_ERR_NO_MEMORY);
    /* free the rest of the first slab (16 blocks): it returns */
    for (i = 1; i < 16; i += 2) {
        cr_assert_eq(kvf_pool_free(g_pool, small[i]), KVF_OK);
    }
    cr_assert_eq(kvf_pool_alloc(g_pool, 1 * MIB, UINT64_MAX, &big), KVF_OK);
    cr_assert_eq(kvf_pool_entry_block_size(g_pool, big), 1 * MIB);
    /* and the freed 64 KiB blocks elsewhere are still usable */
    cr_assert_eq(kvf_pool_alloc(g_pool, 64 * KIB, UINT64_MAX, &small[0]),
                 KVF_OK);
}

Test(pool, double_free_and_bad_state_rejected)
{
    kvf_pool_entry_t *e;
    kvf_key_t key = key_of(1);

    cr_assert_eq(kvf_pool_alloc(g_pool, 100 * KIB, UINT64_MAX, &e), KVF_OK);
    cr_assert_eq(kvf_pool_free(g_pool, e), KVF_OK);
    cr_assert_eq(kvf_pool_free(g_pool, e), KVF_ERR_STATE);
    cr_assert_eq(kvf_pool_commit(g_pool, e, &key, 1), KVF_ERR_STATE);

    e = store(g_pool, 2, 100 * KIB);
    cr_assert_eq(kvf_pool_free(g_pool, e), KVF_ERR_STATE); /* committed */
    cr_assert_eq(kvf_pool_commit(g_pool, e, &key, 1), KVF_ERR_STATE);
    cr_assert_eq(kvf_pool_entry_put(g_pool, e), KVF_ERR_STATE); /* no ref */
}

Test(pool, commit_is_two_phase)
{
    kvf_pool_entry_t *e;
    kvf_pool_entry_t *dup;
    kvf_key_t key = key_of(42);
    kvf_pool_stats_t st;

    cr_assert_eq(kvf_pool_alloc(g_pool, 300 * KIB, UINT64_MAX, &e), KVF_OK);
    cr_assert_null(kvf_pool_lookup(g_pool, &key)); /* invisible */
    cr_assert_eq(kvf_pool_commit(g_pool, e, &key, 0x1234), KVF_OK);
    cr_assert_eq(kvf_pool_lookup(g_pool, &key), e);
    cr_assert_eq(kvf_pool_entry_checksum(e), 0x1234);
    cr_assert(memcmp(kvf_pool_entry_key(e), &key, sizeof(key)) == 0);
    cr_assert_eq(kvf_pool_entry_state(e), KVF_POOL_ENTRY_COMMITTED);

    /* a second copy of the same key is refused; the caller frees it */
    cr_assert_eq(kvf_pool_alloc(g_pool, 300 * KIB, UINT64_MAX, &dup), KVF_OK);
    cr_assert_eq(kvf_pool_commit(g_pool, dup, &key, 0x1234), KVF_ERR_EXISTS);
    cr_assert_eq(kvf_pool_free(g_pool, dup), KVF_OK);

    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.entries, 1);
    cr_assert_eq(st.allocated, 0);
    cr_assert_eq(kvf_pool_remove(g_pool, &key), KVF_OK);
    cr_assert_null(kvf_pool_lookup(g_pool, &key));
    cr_assert_eq(kvf_pool_remove(g_pool, &key), KVF_ERR_NOT_FOUND);
}

Test(pool, expired_allocations_are_reclaimed)
{
    kvf_pool_entry_t *a;
    kvf_pool_entry_t *b;
    kvf_pool_entry_t *c;
    kvf_pool_stats_t st;
    kvf_key_t key = key_of(9);

    cr_assert_eq(kvf_pool_alloc(g_pool, 64 * KIB, 1000, &a), KVF_OK);
    cr_assert_eq(kvf_pool_alloc(g_pool, 64 * KIB, 5000, &b), KVF_OK);
    cr_assert_eq(kvf_pool_alloc(g_pool, 64 * KIB, 1000, &c), KVF_OK);
    kvf_pool_entry_hold(g_pool, c); /* a fetch still writes into c */

    cr_assert_eq(kvf_pool_reclaim_expired(g_pool, 999), 0);
    cr_assert_eq(kvf_pool_reclaim_expired(g_pool, 1000), 1); /* a */
    cr_assert_eq(kvf_pool_entry_state(a), KVF_POOL_ENTRY_FREE);
    cr_assert_eq(kvf_pool_commit(g_pool, a, &key, 0), KVF_ERR_STATE);
    cr_assert_eq(kvf_pool_commit(g_pool, b, &key, 0), KVF_OK);
    cr_assert_eq(kvf_pool_reclaim_expired(g_pool, 10000), 0); /* committed */
    cr_assert_eq(kvf_pool_entry_put(g_pool, c), KVF_OK);
    cr_assert_eq(kvf_pool_reclaim_expired(g_pool, 10000), 1); /* c */
    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.reclaimed, 2);
    cr_assert_eq(st.used, 64 * KIB);
}

typedef struct policy_case {
    kvf_pool_policy_t policy;
    uint64_t first_victim; /* key evicted when entry 9 needs room */
} policy_case_t;

ParameterizedTestParameters(pool, eviction_order)
{
    /* 8 x 1 MiB entries stored as 1..8; 1 and 2 looked up afterwards,
     * 1 of them three more times */
    static policy_case_t cases[] = {
        {KVF_POOL_POLICY_LRU, 3},
        {KVF_POOL_POLICY_FIFO, 1},
        {KVF_POOL_POLICY_LFU, 3},
    };

    return cr_make_param_array(policy_case_t, cases,
                               sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(policy_case_t *pc, pool, eviction_order)
{
    kvf_pool_t *pool = pool_new(pc->policy);
    kvf_key_t k1     = key_of(1);
    kvf_key_t k2     = key_of(2);
    kvf_key_t k;
    uint64_t n;

    for (n = 1; n <= 8; n++) {
        store(pool, n, 1 * MIB);
    }
    cr_assert_not_null(kvf_pool_lookup(pool, &k2));
    for (n = 0; n < 4; n++) {
        cr_assert_not_null(kvf_pool_lookup(pool, &k1));
    }
    store(pool, 9, 1 * MIB);
    cr_assert_eq(g_evicted, 1);
    cr_assert_eq(g_evicted_keys[0].lo, pc->first_victim);
    k = key_of(pc->first_victim);
    cr_assert_null(kvf_pool_lookup(pool, &k));

    /* the next victims continue in policy order */
    store(pool, 10, 1 * MIB);
    if (pc->policy == KVF_POOL_POLICY_FIFO) {
        cr_assert_eq(g_evicted_keys[1].lo, 2);
    } else {
        cr_assert_eq(g_evicted_keys[1].lo, 4);
    }
    kvf_pool_destroy(pool);
}

Test(pool, lfu_keeps_the_frequent_entry)
{
    kvf_pool_t *pool = pool_new(KVF_POOL_POLICY_LFU);
    kvf_key_t k1     = key_of(1);
    uint64_t n;

    for (n = 1; n <= 8; n++) {
        store(pool, n, 1 * MIB);
    }
    for (n = 0; n < 10; n++) {
        cr_assert_not_null(kvf_pool_lookup(pool, &k1));
    }
    /* 7 newer entries, each looked up once: still less frequent than 1 */
    for (n = 2; n <= 8; n++) {
        kvf_key_t k = key_of(n);

        cr_assert_not_null(kvf_pool_lookup(pool, &k));
    }
    for (n = 9; n <= 15; n++) {
        store(pool, n, 1 * MIB);
    }
    cr_assert_eq(g_evicted, 7);
    cr_assert_not_null(kvf_pool_lookup(pool, &k1));
    kvf_pool_destroy(pool);
}

Test(pool, soft_pins_go_last_hard_pins_never)
{
    kvf_pool_entry_t *es[9];
    kvf_pool_stats_t st;
    kvf_pool_entry_t *e;
    kvf_key_t k;
    uint64_t n;

    for (n = 1; n <= 8; n++) {
        es[n] = store(g_pool, n, 1 * MIB);
    }
    kvf_pool_entry_pin(g_pool, es[1], KVF_POOL_PIN_SOFT);
    kvf_pool_entry_pin(g_pool, es[2], KVF_POOL_PIN_HARD);
    for (n = 3; n <= 8; n++) {
        kvf_pool_entry_pin(g_pool, es[n], KVF_POOL_PIN_SOFT);
    }
    kvf_pool_entry_pin(g_pool, es[8], KVF_POOL_PIN_NONE);
    e = store(g_pool, 9, 1 * MIB); /* evicts 8: the only unpinned one */
    cr_assert_eq(g_evicted_keys[0].lo, 8);
    kvf_pool_entry_pin(g_pool, e, KVF_POOL_PIN_SOFT);
    store(g_pool, 10, 1 * MIB); /* then the oldest soft pin: 1 */
    cr_assert_eq(g_evicted_keys[1].lo, 1);
    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.pinned, 7); /* 2 hard; 3..7 and 9 soft */

    /* new hard-pinned entries push out 10, then the soft pins in pin
     * order; the hard pin 2 never goes; then allocation fails at once */
    for (n = 11; n <= 30; n++) {
        if (kvf_pool_alloc(g_pool, 1 * MIB, UINT64_MAX, &e) != KVF_OK) {
            break;
        }
        k = key_of(n);
        cr_assert_eq(kvf_pool_commit(g_pool, e, &k, 0), KVF_OK);
        kvf_pool_entry_pin(g_pool, e, KVF_POOL_PIN_HARD);
    }
    cr_assert_eq(n, 18);
    cr_assert_eq(g_evicted, 9);
    cr_assert_eq(g_evicted_keys[2].lo, 10);
    cr_assert_eq(g_evicted_keys[3].lo, 3);
    cr_assert_eq(g_evicted_keys[8].lo, 9);
    k = key_of(2);
    cr_assert_not_null(kvf_pool_lookup(g_pool, &k));
    cr_assert_eq(kvf_pool_alloc(g_pool, 64 * KIB, UINT64_MAX, &e),
                 KVF_ERR_NO_MEMORY);
    (void)es;
}

Test(pool, refcount_pins_and_returns_to_zero)
{
    kvf_pool_entry_t *es[9];
    kvf_pool_stats_t st;
    kvf_pool_entry_t *e;
    kvf_key_t k;
    uint64_t n;

    for (n = 1; n <= 8; n++) {
        es[n] = store(g_pool, n, 1 * MIB);
    }
    kvf_pool_entry_hold(g_pool, es[1]);
    kvf_pool_entry_hold(g_pool, es[1]);
    cr_assert_eq(kvf_pool_entry_refcount(es[1]), 2);
    store(g_pool, 9, 1 * MIB); /* 1 is held: 2 goes */
    cr_assert_eq(g_evicted_keys[0].lo, 2);
    cr_assert_eq(kvf_pool_entry_put(g_pool, es[1]), KVF_OK);
    cr_assert_eq(kvf_pool_entry_put(g_pool, es[1]), KVF_OK);
    cr_assert_eq(kvf_pool_entry_refcount(es[1]), 0);
    cr_assert_eq(kvf_pool_entry_put(g_pool, es[1]), KVF_ERR_STATE);
    /* released last: most recently used, so 3 goes first */
    cr_assert_eq(kvf_pool_alloc(g_pool, 1 * MIB, UINT64_MAX, &e), KVF_OK);
    cr_assert_eq(g_evicted_keys[1].lo, 3);
    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.pinned, 0);

    /* pins count while they last, also across commit and removal */
    kvf_pool_entry_pin(g_pool, e, KVF_POOL_PIN_HARD); /* uncommitted */
    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.pinned, 0);
    k = key_of(77);
    cr_assert_eq(kvf_pool_commit(g_pool, e, &k, 0), KVF_OK);
    kvf_pool_entry_hold(g_pool, es[4]);
    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.pinned, 2);
    cr_assert_eq(kvf_pool_remove(g_pool, &k), KVF_OK);
    cr_assert_eq(kvf_pool_entry_put(g_pool, es[4]), KVF_OK);
    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.pinned, 0);
}

/* A referenced entry removed (found damaged) leaves the index at once, so
 * its key is a miss and can be committed again; its block stays until the
 * last reference goes, on no eviction list, and is freed then. */
Test(pool, a_referenced_entry_removed_goes_with_its_last_put)
{
    kvf_pool_entry_t *old, *fresh, *e;
    kvf_pool_stats_t st;
    kvf_key_t k = key_of(1);
    uint64_t n;

    old = store(g_pool, 1, 1 * MIB);
    kvf_pool_entry_pin(g_pool, old, KVF_POOL_PIN_HARD);
    kvf_pool_entry_hold(g_pool, old);
    kvf_pool_entry_hold(g_pool, old);
    cr_assert_eq(kvf_pool_remove(g_pool, &k), KVF_OK);
    cr_assert_eq(kvf_pool_entry_state(old), KVF_POOL_ENTRY_DETACHED);
    cr_assert_null(kvf_pool_lookup(g_pool, &k));
    cr_assert_eq(kvf_pool_remove(g_pool, &k), KVF_ERR_NOT_FOUND);
    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.entries, 0);
    cr_assert_eq(st.pinned, 0);
    cr_assert_eq(st.detached, 1);
    cr_assert_eq(st.used, 1 * MIB, "its block is still read");

    fresh = store(g_pool, 1, 1 * MIB);
    cr_assert_neq(kvf_pool_entry_offset(fresh), kvf_pool_entry_offset(old));
    cr_assert_eq(kvf_pool_lookup(g_pool, &k), fresh);

    /* the other seven blocks fill and evict around it, never it */
    for (n = 2; n <= 10; n++) {
        store(g_pool, n, 1 * MIB);
    }
    for (n = 0; n < g_evicted && n < 64; n++) {
        cr_assert_neq(g_evicted_offsets[n], kvf_pool_entry_offset(old));
    }
    cr_assert_eq(kvf_pool_entry_state(old), KVF_POOL_ENTRY_DETACHED);

    cr_assert_eq(kvf_pool_entry_put(g_pool, old), KVF_OK);
    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.detached, 1);
    cr_assert_eq(kvf_pool_entry_put(g_pool, old), KVF_OK);
    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.detached, 0);
    cr_assert_eq(st.used, 7 * MIB, "its block is free again");
    cr_assert_eq(kvf_pool_alloc(g_pool, 1 * MIB, UINT64_MAX, &e), KVF_OK);
    cr_assert_eq(kvf_pool_free(g_pool, e), KVF_OK);
}

/* An eviction the callback keeps (the disk tier writing it behind) leaves
 * the block as it was, out of the index, until kvf_pool_retired_free. Kept
 * blocks count as free for the watermarks (keeping one does not make the
 * pool evict further), and a block the allocation itself needs is never
 * kept. */
/* A pool of @p blocks 64 KiB blocks whose evictions go to on_evict. */
static kvf_pool_params_t kept_params(uint64_t blocks, unsigned high_pct,
                                     unsigned low_pct)
{
    kvf_pool_params_t params = {
        .field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MIN_CHUNK |
                      KVF_POOL_FIELD_MAX_CHUNK | KVF_POOL_FIELD_WATERMARKS |
                      KVF_POOL_FIELD_EVICT_CB | KVF_POOL_FIELD_NO_HUGETLB,
        .size      = blocks * 64 * KIB,
        .min_chunk = 64 * KIB,
        .max_chunk = 64 * KIB,
        .high_pct  = high_pct,
        .low_pct   = low_pct,
        .evict_cb  = on_evict,
    };

    return params;
}

Test(pool, kept_eviction_holds_its_block_until_given_back)
{
    kvf_pool_params_t params = kept_params(20, 95, 80);
    kvf_pool_t *pool         = NULL;
    kvf_pool_entry_t *e, *kept, *fresh, *urgent;
    kvf_pool_stats_t st;
    kvf_key_t k0 = key_of(0);
    uint8_t *p;
    uint64_t i;

    cr_assert_eq(kvf_pool_create(&params, &pool), KVF_OK);
    for (i = 0; i < 19; i++) { /* 95 %: the next allocation evicts */
        e = store(pool, i, 64 * KIB);
        memset(kvf_pool_ptr(pool, kvf_pool_entry_offset(e)), (int)i + 1,
               64 * KIB);
    }
    g_evicted = 0;
    g_keep    = 64;
    cr_assert_eq(kvf_pool_alloc(pool, 64 * KIB, UINT64_MAX, &fresh), KVF_OK);
    /* down to 80 % (16 blocks) with the new one: 15 committed remain, and
     * the four kept blocks did not count */
    cr_assert_eq(g_evicted, 4);
    kvf_pool_stats(pool, &st);
    cr_assert_eq(st.retired, 4);
    cr_assert_eq(st.retired_bytes, 4 * 64 * KIB);
    cr_assert_eq(st.entries, 15);
    cr_assert_eq(st.used, 20 * 64 * KIB, "kept blocks are not reused");
    cr_assert(kvf_key_equal(&g_evicted_keys[0], &k0));
    cr_assert_null(kvf_pool_lookup(pool, &k0));
    kept = kvf_pool_entry_find(pool, g_evicted_offsets[0]);
    cr_assert_not_null(kept);
    cr_assert_eq(kvf_pool_entry_state(kept), KVF_POOL_ENTRY_RETIRED);
    p = kvf_pool_ptr(pool, g_evicted_offsets[0]);
    cr_assert(p[0] == 1 && p[64 * KIB - 1] == 1, "its bytes are untouched");

    /* full: this allocation needs the victim's block, so it is not kept */
    cr_assert_eq(kvf_pool_alloc(pool, 64 * KIB, UINT64_MAX, &urgent), KVF_OK);
    cr_assert_eq(g_evicted, 5);
    cr_assert_eq(kvf_pool_entry_offset(urgent), g_evicted_offsets[4]);
    kvf_pool_stats(pool, &st);
    cr_assert_eq(st.retired, 4);

    /* not for anything else: no free, no second give-back */
    cr_assert_eq(kvf_pool_free(pool, kept), KVF_ERR_STATE);
    cr_assert_eq(kvf_pool_retired_free(pool, fresh), KVF_ERR_STATE);
    cr_assert_eq(kvf_pool_retired_free(pool, kept), KVF_OK);
    cr_assert_eq(kvf_pool_retired_free(pool, kept), KVF_ERR_STATE);
    for (i = 1; i < 4; i++) {
        e = kvf_pool_entry_find(pool, g_evicted_offsets[i]);
        cr_assert_eq(kvf_pool_retired_free(pool, e), KVF_OK);
    }
    kvf_pool_stats(pool, &st);
    cr_assert_eq(st.retired, 0);
    cr_assert_eq(st.retired_bytes, 0);
    cr_assert_eq(st.used, 16 * 64 * KIB);
    cr_assert_eq(kvf_pool_free(pool, fresh), KVF_OK);
    cr_assert_eq(kvf_pool_free(pool, urgent), KVF_OK);
    kvf_pool_destroy(pool);
}

/* At most a quarter of the pool is kept for writes: past that an evicted
 * block is released though the callback would keep it. */
Test(pool, kept_blocks_are_at_most_a_quarter_of_the_pool)
{
    kvf_pool_params_t params = kept_params(8, 50, 10);
    kvf_pool_t *pool         = NULL;
    kvf_pool_entry_t *e;
    kvf_pool_stats_t st;
    uint64_t i;

    cr_assert_eq(kvf_pool_create(&params, &pool), KVF_OK);
    for (i = 0; i < 4; i++) {
        store(pool, i, 64 * KIB);
    }
    g_evicted = 0;
    g_keep    = 64;
    cr_assert_eq(kvf_pool_alloc(pool, 64 * KIB, UINT64_MAX, &e), KVF_OK);
    cr_assert_eq(g_evicted, 4, "down to the low watermark");
    kvf_pool_stats(pool, &st);
    cr_assert_eq(st.retired, 2, "a quarter of 8 blocks");
    cr_assert_eq(st.retired_bytes, 2 * 64 * KIB);
    cr_assert_eq(kvf_pool_free(pool, e), KVF_OK);
    for (i = 0; i < 2; i++) {
        e = kvf_pool_entry_find(pool, g_evicted_offsets[i]);
        cr_assert_eq(kvf_pool_retired_free(pool, e), KVF_OK);
    }
    kvf_pool_destroy(pool);
}

Test(pool, full_and_all_pinned_fails_at_once)
{
    kvf_pool_entry_t *es[9];
    kvf_pool_entry_t *e;
    kvf_pool_stats_t st;
    uint64_t n;

    for (n = 1; n <= 7; n++) {
        es[n] = store(g_pool, n, 1 * MIB);
        kvf_pool_entry_hold(g_pool, es[n]);
    }
    cr_assert_eq(kvf_pool_alloc(g_pool, 1 * MIB, UINT64_MAX, &es[8]),
                 KVF_OK); /* uncommitted: not evictable either */
    cr_assert_eq(kvf_pool_alloc(g_pool, 64 * KIB, UINT64_MAX, &e),
                 KVF_ERR_NO_MEMORY);
    kvf_pool_stats(g_pool, &st);
    cr_assert_eq(st.evictions, 0);
    cr_assert_eq(st.pinned, 7);
    cr_assert_eq(st.used, 8 * MIB);
    for (n = 1; n <= 7; n++) {
        cr_assert_eq(kvf_pool_entry_put(g_pool, es[n]), KVF_OK);
    }
    cr_assert_eq(kvf_pool_alloc(g_pool, 64 * KIB, UINT64_MAX, &e), KVF_OK);
    cr_assert_eq(g_evicted, 1);
}

Test(pool, watermarks_evict_down_to_low)
{
    kvf_pool_params_t p = {
        .field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MIN_CHUNK |
                      KVF_POOL_FIELD_MAX_CHUNK | KVF_POOL_FIELD_WATERMARKS |
                      KVF_POOL_FIELD_EVICT_CB | KVF_POOL_FIELD_NO_HUGETLB,
        .size      = 10 * MIB,
        .min_chunk = 64 * KIB,
        .max_chunk = 1 * MIB,
        .high_pct  = 80,
        .low_pct   = 50,
        .evict_cb  = on_evict,
    };
    kvf_pool_t *pool = NULL;
    kvf_pool_stats_t st;
    uint64_t n;

    g_evicted = 0;
    cr_assert_eq(kvf_pool_create(&p, &pool), KVF_OK);
    for (n = 1; n <= 8; n++) {
        store(pool, n, 1 * MIB); /* 8 MiB = 80 %: no eviction yet */
    }
    cr_assert_eq(g_evicted, 0);
    store(pool, 9, 1 * MIB); /* above high: evict to 50 % incl. the new */
    kvf_pool_stats(pool, &st);
    cr_assert_eq(g_evicted, 4);
    cr_assert_eq(st.used, 5 * MIB);
    cr_assert_eq(st.entries, 5);
    kvf_pool_destroy(pool);
}

Test(pool, index_survives_many_keys_and_removals)
{
    kvf_pool_params_t p = {
        .field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MIN_CHUNK |
                      KVF_POOL_FIELD_MAX_CHUNK | KVF_POOL_FIELD_WATERMARKS |
                      KVF_POOL_FIELD_NO_HUGETLB,
        .size      = 16 * MIB,
        .min_chunk = 4 * KIB,
        .max_chunk = 64 * KIB,
        .high_pct  = 100,
        .low_pct   = 100,
    };
    kvf_pool_t *pool = NULL;
    kvf_pool_entry_t *e;
    kvf_key_t k;
    uint64_t n;

    cr_assert_eq(kvf_pool_create(&p, &pool), KVF_OK);
    for (n = 0; n < 4096; n++) {
        cr_assert_eq(kvf_pool_alloc(pool, 4 * KIB, UINT64_MAX, &e), KVF_OK);
        k = key_of(n);
        cr_assert_eq(kvf_pool_commit(pool, e, &k, n), KVF_OK);
    }
    for (n = 0; n < 4096; n += 3) {
        k = key_of(n);
        cr_assert_eq(kvf_pool_remove(pool, &k), KVF_OK);
    }
    for (n = 0; n < 4096; n++) {
        k = key_of(n);
        e = kvf_pool_lookup(pool, &k);
        if (n % 3 == 0) {
            cr_assert_null(e);
        } else {
            cr_assert_not_null(e, "key %lu lost", (unsigned long)n);
            cr_assert_eq(kvf_pool_entry_checksum(e), n);
        }
    }
    kvf_pool_destroy(pool);
}

Test(pool, bad_arguments_are_refused)
{
    kvf_pool_entry_t *e;
    kvf_key_t key = key_of(5);

    cr_assert_eq(kvf_pool_alloc(g_pool, 64 * KIB, UINT64_MAX, NULL),
                 KVF_ERR_INVALID);
    cr_assert_eq(kvf_pool_alloc(g_pool, 64 * KIB, UINT64_MAX, &e), KVF_OK);
    cr_assert_eq(kvf_pool_commit(g_pool, e, NULL, 0), KVF_ERR_INVALID);
    cr_assert_eq(kvf_pool_commit(g_pool, NULL, &key, 0), KVF_ERR_INVALID);
    cr_assert_eq(kvf_pool_free(g_pool, NULL), KVF_ERR_INVALID);

    /* a referenced allocation is being written: not freed under it */
    kvf_pool_entry_hold(g_pool, e);
    cr_assert_eq(kvf_pool_free(g_pool, e), KVF_ERR_BUSY);
    cr_assert_eq(kvf_pool_entry_put(g_pool, e), KVF_OK);
    cr_assert_eq(kvf_pool_free(g_pool, e), KVF_OK);
}
