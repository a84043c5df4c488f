/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/disk.h"
#include "common/time.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <inttypes.h>
#include <event2/event.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#define SLOT  (64u << 10)
#define ALIGN 4096u

static char g_dir[64];
static char g_path[128];
static uint8_t *g_buf; /* SLOT bytes, aligned: read destination */
#define NSRC 64
/* NSRC x SLOT bytes, aligned: chunk i's bytes at src_of(i), where they
 * stay until the tier has written them (it does not copy) */
static uint8_t *g_src;
static uint8_t *g_want; /* SLOT bytes: what a chunk should read back as */
static int g_stored, g_dropped, g_reads, g_written;
static const void *g_written_last;
static kvf_status_t g_read_status;

static void on_stored(void *arg, const kvf_key_t *key)
{
    g_stored++;
}

static void on_dropped(void *arg, const kvf_key_t *key)
{
    g_dropped++;
}

static void on_written(void *arg, const void *data)
{
    g_written++;
    g_written_last = data;
}

static void on_read(void *arg, const kvf_key_t *key, kvf_status_t status,
                    uint64_t length, uint64_t checksum)
{
    g_reads++;
    g_read_status = status;
}

static kvf_key_t key_of(uint64_t i)
{
    kvf_key_t k = {.ns = 7, .hi = i * 3 + 1, .lo = i};

    return k;
}

static uint8_t *src_of(uint64_t i)
{
    return g_src + (i % NSRC) * SLOT;
}

/* Deterministic bytes per chunk, so a test can tell right from wrong. */
static void gen(uint64_t i, uint8_t *p, uint64_t len)
{
    uint64_t j;

    for (j = 0; j < len; j++) {
        p[j] = (uint8_t)(i * 31 + j * 7 + (j >> 12));
    }
}

/* Writes chunk i's bytes at src_of(i); its checksum. */
static uint64_t fill(uint64_t i, uint64_t len)
{
    gen(i, src_of(i), len);
    return kvf_chunk_checksum(src_of(i), len);
}

static bool matches(uint64_t i, const uint8_t *got, uint64_t len)
{
    gen(i, g_want, len);
    return memcmp(got, g_want, len) == 0;
}

static void disk_setup(void)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/kvf-disk-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_path, sizeof(g_path), "%s/tier", g_dir);
    cr_assert_eq(posix_memalign((void **)&g_buf, ALIGN, SLOT), 0);
    cr_assert_eq(posix_memalign((void **)&g_src, ALIGN, NSRC * SLOT), 0);
    g_want   = malloc(SLOT);
    g_stored = g_dropped = g_reads = g_written = 0;
    g_written_last                             = NULL;
    g_read_status                              = KVF_OK;
}

static void disk_teardown(void)
{
    unlink(g_path);
    rmdir(g_dir);
    free(g_buf);
    free(g_src);
    free(g_want);
    kvf_test_check_leaks();
}

TestSuite(disk, .init = disk_setup, .fini = disk_teardown, .timeout = 20);

static kvf_disk_params_t params_of(uint64_t slots)
{
    kvf_disk_params_t p = {
        .path        = g_path,
        .size        = ALIGN + slots * (ALIGN + SLOT),
        .slot_size   = SLOT,
        .queue_depth = 4,
        .stored_cb   = on_stored,
        .dropped_cb  = on_dropped,
        .written_cb  = on_written,
    };

    return p;
}

static kvf_disk_t *open_disk(uint64_t slots)
{
    kvf_disk_params_t p = params_of(slots);
    kvf_disk_t *disk;

    cr_assert_eq(kvf_disk_create(&p, &disk), KVF_OK);
    return disk;
}

static void put(kvf_disk_t *disk, uint64_t i, uint64_t len)
{
    kvf_key_t k   = key_of(i);
    uint64_t csum = fill(i, len);

    cr_assert_eq(kvf_disk_put(disk, &k, src_of(i), len, csum), KVF_OK);
    kvf_disk_drain(disk);
}

static kvf_status_t read_back(kvf_disk_t *disk, uint64_t i)
{
    kvf_key_t k = key_of(i);
    int before  = g_reads;
    kvf_status_t status;

    memset(g_buf, 0xee, SLOT);
    status = kvf_disk_read(disk, &k, g_buf, SLOT, on_read, NULL);
    if (status != KVF_INPROGRESS) {
        return status;
    }
    kvf_disk_drain(disk);
    cr_assert_eq(g_reads, before + 1);
    return g_read_status;
}

static void damage(uint64_t slot, uint64_t at, uint8_t byte)
{
    int fd = open(g_path, O_RDWR);

    cr_assert_geq(fd, 0);
    cr_assert_eq(
        pwrite(fd, &byte, 1, (off_t)(ALIGN + slot * (ALIGN + SLOT) + at)), 1);
    close(fd);
}

Test(disk, writes_behind_and_reads_back_verified)
{
    kvf_disk_t *disk = open_disk(8);
    kvf_disk_stats_t st;
    uint64_t i;

    for (i = 0; i < 4; i++) {
        put(disk, i, SLOT - i * 1000);
    }
    cr_assert_eq(g_stored, 4);
    for (i = 0; i < 4; i++) {
        cr_assert(kvf_disk_contains(disk, &(kvf_key_t){7, i * 3 + 1, i}));
        cr_assert_eq(read_back(disk, i), KVF_OK);
        cr_assert(matches(i, g_buf, SLOT - i * 1000));
    }
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.writes, 4);
    cr_assert_eq(st.reads, 4);
    cr_assert_eq(st.used_slots, 4);
    cr_assert(st.is_direct, "ext4 /tmp takes O_DIRECT");
    cr_assert_eq(read_back(disk, 99), KVF_ERR_NOT_FOUND);
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.read_misses, 1);
    kvf_disk_destroy(disk);
}

Test(disk, counts_writes_pending_until_they_land)
{
    kvf_disk_t *disk = open_disk(8);
    kvf_disk_stats_t st;
    uint64_t i;

    for (i = 0; i < 3; i++) {
        kvf_key_t k   = key_of(i);
        uint64_t csum = fill(i, SLOT);

        cr_assert_eq(kvf_disk_put_in_place(disk, &k, src_of(i), SLOT, csum),
                     KVF_OK);
    }
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.writes_pending, 3, "queued or on the device");
    cr_assert_eq(g_written, 0, "the bytes are still the tier's");
    kvf_disk_drain(disk);
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.writes_pending, 0);
    cr_assert_eq(st.writes, 3);
    cr_assert_eq(g_written, 3, "every put's bytes are given back");
    cr_assert_eq(st.write_copies, 0);
    cr_assert_gt(st.write_busy_ns, 0);
    cr_assert_geq(st.write_inflight_ns, st.write_busy_ns);
    cr_assert_leq(st.write_inflight_ns, 3 * st.write_busy_ns);
    kvf_disk_destroy(disk);
}

Test(disk, reads_a_chunk_still_in_its_staging_buffer)
{
    kvf_disk_t *disk = open_disk(8);
    kvf_key_t k      = key_of(1);
    uint64_t csum    = fill(1, 5000);

    cr_assert_eq(kvf_disk_put(disk, &k, src_of(1) + 8, 5000, 0), KVF_OK,
                 "a copy needs no alignment");
    cr_assert_eq(kvf_disk_remove(disk, &k), KVF_ERR_BUSY);
    kvf_disk_drain(disk);
    cr_assert_eq(kvf_disk_remove(disk, &k), KVF_OK);
    cr_assert_eq(kvf_disk_put(disk, &k, src_of(1), 5000, csum), KVF_OK);
    cr_assert_eq(kvf_disk_put(disk, &k, src_of(1), 5000, csum), KVF_ERR_EXISTS);
    memset(src_of(1), 0, SLOT); /* the tier copied the bytes */
    cr_assert_eq(kvf_disk_read(disk, &k, g_buf, SLOT, on_read, NULL), KVF_OK);
    cr_assert(matches(1, g_buf, 5000));
    kvf_disk_drain(disk);
    cr_assert_eq(g_written, 0, "a copy gives nothing back");
    cr_assert_eq(read_back(disk, 1), KVF_OK);
    cr_assert(matches(1, g_buf, 5000));
    kvf_disk_destroy(disk);
}

Test(disk, reads_a_chunk_whose_write_in_place_has_not_landed)
{
    kvf_disk_t *disk = open_disk(8);
    kvf_key_t k      = key_of(1);
    kvf_key_t k2     = key_of(2);
    uint64_t csum    = fill(1, 5000);

    cr_assert_eq(kvf_disk_put_in_place(disk, &k, src_of(1), 5000, csum),
                 KVF_OK);
    cr_assert_eq(kvf_disk_put_in_place(disk, &k, src_of(1), 5000, csum),
                 KVF_ERR_EXISTS);
    /* O_DIRECT takes the caller's bytes as they are: aligned only */
    cr_assert_eq(kvf_disk_put_in_place(disk, &k2, src_of(2) + 512, 5000, 0),
                 KVF_ERR_RANGE);
    cr_assert_not(kvf_disk_contains(disk, &k2));
    /* served from the put's own bytes until the write lands */
    cr_assert_eq(kvf_disk_read(disk, &k, g_buf, SLOT, on_read, NULL), KVF_OK);
    cr_assert(matches(1, g_buf, 5000));
    cr_assert_eq(kvf_disk_read(disk, &k, g_buf + 1, SLOT, on_read, NULL),
                 KVF_ERR_RANGE);
    kvf_disk_drain(disk);
    cr_assert_eq(g_written, 1);
    cr_assert_eq(g_written_last, src_of(1));
    cr_assert_eq(read_back(disk, 1), KVF_OK);
    cr_assert(matches(1, g_buf, 5000));
    kvf_disk_destroy(disk);
}

Test(disk, full_tier_evicts_least_recently_used)
{
    kvf_disk_t *disk = open_disk(3);
    kvf_disk_stats_t st;
    uint64_t i;

    for (i = 0; i < 3; i++) {
        put(disk, i, 4096);
    }
    cr_assert_eq(read_back(disk, 0), KVF_OK); /* 0 is now the newest */
    put(disk, 3, 4096);
    put(disk, 4, 4096);
    cr_assert(kvf_disk_contains(disk, &(kvf_key_t){7, 1, 0}));
    cr_assert_not(kvf_disk_contains(disk, &(kvf_key_t){7, 4, 1}));
    cr_assert_not(kvf_disk_contains(disk, &(kvf_key_t){7, 7, 2}));
    cr_assert_eq(g_dropped, 2);
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.evictions, 2);
    cr_assert_eq(st.used_slots, 3);
    kvf_disk_destroy(disk);
}

/* A chunk asked for (about to be read back) is passed over by eviction
 * even as the least recently used, up to three quarters of the tier: a
 * peer asking for every key cannot stop write-behind. */
Test(disk, eviction_passes_over_chunks_asked_for_up_to_most_of_the_tier)
{
    kvf_disk_t *disk = open_disk(8);
    kvf_disk_stats_t st;
    kvf_key_t k;
    uint64_t i;

    for (i = 0; i < 8; i++) {
        put(disk, i, 4096);
    }
    k = key_of(0); /* the oldest */
    kvf_disk_want(disk, &k);
    k = key_of(20);
    kvf_disk_want(disk, &k); /* not on disk: ignored */
    put(disk, 8, 4096);
    k = key_of(0);
    cr_assert(kvf_disk_contains(disk, &k));
    k = key_of(1);
    cr_assert_not(kvf_disk_contains(disk, &k), "the next oldest went instead");

    /* 7 of the 8 asked for: the 6 oldest of them are kept, the 7th goes */
    for (i = 2; i <= 7; i++) {
        k = key_of(i);
        kvf_disk_want(disk, &k);
    }
    put(disk, 9, 4096);
    for (i = 0; i <= 6; i++) {
        k = key_of(i);
        cr_assert_eq(kvf_disk_contains(disk, &k), i != 1, "chunk %" PRIu64, i);
    }
    k = key_of(7);
    cr_assert_not(kvf_disk_contains(disk, &k),
                  "asks protect three quarters of the tier");
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.evictions, 2);
    cr_assert_eq(st.evictions_spared, 7); /* 1, then 6 */
    cr_assert_eq(st.write_drops, 0);
    for (i = 0; i <= 9; i++) {
        if ((i != 1) && (i != 7)) {
            cr_assert_eq(read_back(disk, i), KVF_OK, "chunk %" PRIu64, i);
            cr_assert(matches(i, g_buf, 4096), "chunk %" PRIu64, i);
        }
    }
    kvf_disk_destroy(disk);
}

Test(disk, drops_and_counts_when_every_write_is_taken)
{
    kvf_disk_t *disk = open_disk(32);
    kvf_disk_stats_t st;
    kvf_key_t k;
    uint64_t i;

    /* queue_depth 4: 8 copies (4 in flight, 4 queued), then 8 in place,
     * nothing reaped */
    for (i = 0; i < 8; i++) {
        k = key_of(i);
        cr_assert_eq(kvf_disk_put(disk, &k, src_of(i), 4096, fill(i, 4096)),
                     KVF_OK);
    }
    k = key_of(16);
    cr_assert_eq(kvf_disk_put(disk, &k, src_of(16), 4096, 0), KVF_ERR_BUSY,
                 "every staging buffer is taken");
    for (i = 8; i < 16; i++) {
        k = key_of(i);
        cr_assert_eq(
            kvf_disk_put_in_place(disk, &k, src_of(i), 4096, fill(i, 4096)),
            KVF_OK);
    }
    k = key_of(16);
    cr_assert_eq(kvf_disk_put_in_place(disk, &k, src_of(16), 4096, 0),
                 KVF_ERR_BUSY);
    k = key_of(17);
    cr_assert_eq(kvf_disk_put(disk, &k, src_of(17), SLOT + 1, 0),
                 KVF_ERR_TOO_BIG);
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.write_drops, 2);
    cr_assert_eq(st.writes_pending, 16);
    kvf_disk_drain(disk);
    /* the queued ones went out as the first ones landed */
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.writes, 16);
    cr_assert_eq(st.write_copies, 8);
    cr_assert_eq(st.write_errors, 0);
    cr_assert_eq(g_written, 8, "the in-place ones");
    cr_assert_gt(st.write_busy_ns, 0, "device time is counted");
    for (i = 0; i < 16; i++) {
        cr_assert_eq(read_back(disk, i), KVF_OK);
        cr_assert(matches(i, g_buf, 4096), "chunk %" PRIu64, i);
    }
    cr_assert_eq(kvf_disk_put(disk, &k, src_of(17), 4096, 0), KVF_OK);
    kvf_disk_destroy(disk);
}

Test(disk, warm_restart_readmits_and_verifies)
{
    kvf_disk_t *disk = open_disk(8);
    kvf_disk_stats_t st;
    uint64_t i;

    for (i = 0; i < 5; i++) {
        put(disk, i, 20000 + i);
    }
    kvf_disk_destroy(disk);

    disk = open_disk(8);
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.recovered, 5);
    cr_assert_eq(st.used_slots, 5);
    for (i = 0; i < 5; i++) {
        cr_assert_eq(read_back(disk, i), KVF_OK);
        cr_assert(matches(i, g_buf, 20000 + i));
    }
    /* new writes after a restart do not overwrite what was kept */
    put(disk, 10, 4096);
    for (i = 0; i < 5; i++) {
        cr_assert(kvf_disk_contains(disk, &(kvf_key_t){7, i * 3 + 1, i}));
    }
    kvf_disk_destroy(disk);
}

Test(disk, torn_slot_is_a_counted_miss_never_wrong_bytes)
{
    kvf_disk_t *disk = open_disk(4);
    kvf_disk_stats_t st;

    put(disk, 1, 30000);
    kvf_disk_destroy(disk);
    /* a crash between data and record: the record is the new one, the
     * data partly old */
    damage(0, ALIGN + 12345, 0x5a);

    disk = open_disk(4);
    cr_assert_eq(read_back(disk, 1), KVF_ERR_CHECKSUM);
    cr_assert_not(kvf_disk_contains(disk, &(kvf_key_t){7, 4, 1}));
    cr_assert_eq(g_dropped, 1);
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.checksum_failures, 1);
    cr_assert_eq(st.reads, 0);
    cr_assert_eq(st.used_slots, 0);
    kvf_disk_destroy(disk);
}

Test(disk, half_written_record_is_ignored_at_restart)
{
    kvf_disk_t *disk = open_disk(4);
    kvf_disk_stats_t st;

    put(disk, 1, 4096);
    put(disk, 2, 4096);
    kvf_disk_destroy(disk);
    damage(1, 20, 0x33); /* inside the second slot's record */

    disk = open_disk(4);
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.recovered, 1);
    cr_assert_eq(st.ignored, 1);
    cr_assert_eq(read_back(disk, 1), KVF_OK);
    cr_assert_eq(read_back(disk, 2), KVF_ERR_NOT_FOUND);
    kvf_disk_destroy(disk);
}

Test(disk, restart_with_another_slot_size_ignores_old_slots_once)
{
    kvf_disk_params_t p = params_of(4);
    kvf_disk_t *disk    = open_disk(4);
    kvf_disk_stats_t st;

    put(disk, 1, 4096);
    kvf_disk_destroy(disk);

    p.slot_size = SLOT / 2; /* max_chunk changed */
    kvf_test_log_capture_start();
    cr_assert_eq(kvf_disk_create(&p, &disk), KVF_OK);
    kvf_test_log_capture_stop();
    cr_assert(kvf_test_log_contains("old slots are ignored"));
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.recovered, 0);
    cr_assert_eq(read_back(disk, 1), KVF_ERR_NOT_FOUND);
    kvf_disk_destroy(disk);

    /* and the old size again: the old records belong to an old epoch */
    disk = open_disk(4);
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.recovered, 0);
    kvf_disk_destroy(disk);
}

Test(disk, buffered_fallback_says_so_and_works)
{
    kvf_disk_params_t p = params_of(4);
    kvf_disk_t *disk;
    kvf_disk_stats_t st;

    p.faults = KVF_DISK_FAULT_NO_DIRECT;
    kvf_test_log_capture_start();
    cr_assert_eq(kvf_disk_create(&p, &disk), KVF_OK);
    kvf_test_log_capture_stop();
    cr_assert(kvf_test_log_contains("refuses O_DIRECT"));
    kvf_disk_get_stats(disk, &st);
    cr_assert_not(st.is_direct);
    put(disk, 3, 7777);
    cr_assert_eq(read_back(disk, 3), KVF_OK);
    cr_assert(matches(3, g_buf, 7777));
    kvf_disk_destroy(disk);
}

Test(disk, io_errors_drop_the_slot_and_are_counted)
{
    kvf_disk_t *disk = open_disk(4);
    kvf_disk_stats_t st;
    kvf_key_t k = key_of(1);

    kvf_disk_set_faults(disk, KVF_DISK_FAULT_WRITE_EIO);
    cr_assert_eq(
        kvf_disk_put_in_place(disk, &k, src_of(1), 4096, fill(1, 4096)),
        KVF_OK);
    kvf_disk_drain(disk);
    cr_assert_not(kvf_disk_contains(disk, &k));
    cr_assert_eq(g_stored, 0);
    cr_assert_eq(g_written, 1, "a failed write gives its bytes back too");

    put(disk, 2, 4096);
    kvf_disk_set_faults(disk, KVF_DISK_FAULT_READ_EIO);
    cr_assert_eq(read_back(disk, 2), KVF_ERR_IO);
    cr_assert_not(kvf_disk_contains(disk, &(kvf_key_t){7, 7, 2}));
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.write_errors, 1);
    cr_assert_eq(st.read_errors, 1);
    cr_assert_eq(st.used_slots, 0);
    kvf_disk_destroy(disk);
}

Test(disk, disk_full_is_a_clear_error_at_start)
{
    kvf_disk_params_t p;
    kvf_disk_t *disk;

    /* a 1 MiB tmpfs in a private mount namespace (this test's process) */
    if ((unshare(CLONE_NEWNS) != 0) ||
        (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) ||
        (mount("tmpfs", g_dir, "tmpfs", 0, "size=1m") != 0)) {
        cr_skip_test("needs CAP_SYS_ADMIN to mount a small tmpfs");
    }
    p = params_of(64); /* 4 MiB */
    kvf_test_log_capture_start();
    cr_assert_eq(kvf_disk_create(&p, &disk), KVF_ERR_IO);
    kvf_test_log_capture_stop();
    cr_assert(kvf_test_log_contains("cannot preallocate"));
    umount(g_dir);
}

Test(disk, kill_during_write_behind_leaves_only_whole_chunks)
{
    kvf_disk_stats_t st;
    kvf_disk_t *disk;
    pid_t pid;
    int wstatus, good = 0;
    uint64_t i;

    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        kvf_disk_params_t p = params_of(32);
        kvf_key_t k;

        if (kvf_disk_create(&p, &disk) != KVF_OK) {
            _exit(1);
        }
        for (i = 0; i < 40; i++) { /* wraps: overwrites older slots */
            k = key_of(i);
            while (kvf_disk_put(disk, &k, src_of(i), SLOT, fill(i, SLOT)) ==
                   KVF_ERR_BUSY) {
                kvf_disk_progress(disk, true);
            }
            kvf_disk_progress(disk, false);
        }
        kill(getpid(), SIGKILL); /* writes still in flight */
        _exit(2);
    }
    cr_assert_eq(waitpid(pid, &wstatus, 0), pid);
    cr_assert(WIFSIGNALED(wstatus) && (WTERMSIG(wstatus) == SIGKILL));

    disk = open_disk(32);
    for (i = 0; i < 40; i++) {
        kvf_status_t status = read_back(disk, i);

        cr_assert((status == KVF_OK) || (status == KVF_ERR_NOT_FOUND) ||
                  (status == KVF_ERR_CHECKSUM));
        if (status == KVF_OK) {
            cr_assert(matches(i, g_buf, SLOT), "chunk %lu wrong", (long)i);
            good++;
        }
    }
    kvf_disk_get_stats(disk, &st);
    cr_assert_gt(good, 0);
    cr_assert_leq(st.recovered, 32);
    kvf_disk_destroy(disk);
}

static void on_stored_break(void *arg, const kvf_key_t *key)
{
    g_stored++;
    event_base_loopbreak(arg);
}

Test(disk, event_loop_submits_and_reaps)
{
    struct event_base *base = event_base_new();
    kvf_disk_params_t p     = params_of(4);
    kvf_disk_t *disk;
    kvf_key_t k = key_of(9);

    p.base      = base;
    p.stored_cb = on_stored_break;
    p.cb_arg    = base;
    cr_assert_eq(kvf_disk_create(&p, &disk), KVF_OK);
    cr_assert_eq(kvf_disk_put(disk, &k, src_of(9), 4096, fill(9, 4096)),
                 KVF_OK);
    event_base_dispatch(base); /* the suite's timeout bounds it */
    cr_assert_eq(g_stored, 1);
    cr_assert_eq(read_back(disk, 9), KVF_OK);
    kvf_disk_destroy(disk);
    event_base_free(base);
}

/* ---- the tier behind the store: spill on eviction, promotion ---------- */

#include "agent/store.h"

static int g_promotions;
static uint32_t g_promoted, g_failed;

static void on_promoted(void *arg, uint32_t promoted, uint32_t failed)
{
    g_promotions++;
    g_promoted = promoted;
    g_failed   = failed;
}

/* The pool holds 16 chunks: above 15 an allocation evicts down to 13
 * (the default watermarks), and up to a quarter of it (4 blocks) may wait
 * for write-behind. */
#define POOL_SLOTS 16u

/* Commits chunks first..last-1, each written behind before the next. */
static void commit_chunks(kvf_store_t *store, kvf_store_owner_t *o,
                          kvf_disk_t *disk, uint64_t first, uint64_t last);

static int g_left;    /* chunks the store said left the node */
static int g_demoted; /* chunks the store said are on disk only now */

static void on_left(void *arg, const kvf_key_t *key)
{
    g_left++;
}

static void on_demoted(void *arg, const kvf_key_t *key)
{
    g_demoted++;
}

static kvf_store_t *store_with_disk_depth(kvf_disk_t **disk_p,
                                          unsigned queue_depth);

static kvf_store_t *store_with_disk(kvf_disk_t **disk_p)
{
    return store_with_disk_depth(disk_p, 4);
}

static kvf_store_t *store_with_disk_depth(kvf_disk_t **disk_p,
                                          unsigned queue_depth)
{
    kvf_pool_params_t pp = {
        .field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MAX_CHUNK |
                      KVF_POOL_FIELD_MIN_CHUNK | KVF_POOL_FIELD_NO_HUGETLB,
        .size      = POOL_SLOTS * SLOT,
        .min_chunk = SLOT,
        .max_chunk = SLOT,
    };
    kvf_store_params_t sp = {
        .pool = &pp, .evict_cb = on_left, .demote_cb = on_demoted};
    kvf_disk_params_t dp = params_of(48);
    kvf_store_t *store;

    dp.queue_depth = queue_depth;
    cr_assert_eq(kvf_store_create(&sp, &store), KVF_OK);
    /* wired as kvf_disk_start wires the agent's */
    dp.stored_cb  = kvf_store_on_disk_stored;
    dp.dropped_cb = kvf_store_on_disk_dropped;
    dp.written_cb = kvf_store_on_disk_written;
    dp.cb_arg     = store;
    cr_assert_eq(kvf_disk_create(&dp, disk_p), KVF_OK);
    kvf_store_set_disk(store, *disk_p);
    return store;
}

static void commit_chunk(kvf_store_t *store, kvf_store_owner_t *o, uint64_t i)
{
    kvf_key_t k = key_of(i);
    kvf_slot_t slot;
    uint64_t csum = fill(i, SLOT);

    cr_assert_eq(kvf_store_alloc(store, o, SLOT, &slot), KVF_OK);
    memcpy((uint8_t *)kvf_store_base(store) + slot.offset, src_of(i), SLOT);
    cr_assert_eq(kvf_store_commit(store, o, &k, slot.offset, csum), KVF_OK);
}

/* Ends a store test: the tier first, as the agent does (its last
 * completions land in the pool). */
static void store_done(kvf_store_t *store, kvf_store_owner_t *o,
                       kvf_disk_t *disk)
{
    kvf_store_owner_destroy(store, o);
    kvf_disk_destroy(disk);
    kvf_store_destroy(store);
}

static void commit_chunks(kvf_store_t *store, kvf_store_owner_t *o,
                          kvf_disk_t *disk, uint64_t first, uint64_t last)
{
    uint64_t i;

    for (i = first; i < last; i++) {
        commit_chunk(store, o, i);
        kvf_disk_drain(disk);
    }
}

Test(disk, store_spills_evictions_and_promotes_them_back)
{
    kvf_disk_t *disk;
    kvf_store_t *store = store_with_disk(&disk);
    kvf_store_owner_t *o;
    kvf_store_stats_t st;
    kvf_disk_stats_t dst;
    kvf_key_t keys[24];
    kvf_slot_t slot;
    uint64_t i;

    cr_assert_eq(kvf_store_owner_create(store, &o), KVF_OK);
    for (i = 0; i < 24; i++) {
        keys[i] = key_of(i);
    }
    commit_chunks(store, o, disk, 0, 24);
    kvf_store_get_stats(store, &st);
    cr_assert_geq(st.spilled, 8, "the pool holds 16: the rest went to disk");
    cr_assert_eq(st.pool.retired, 0, "every kept block was given back");
    cr_assert_eq(kvf_store_local_prefix(store, keys, 24), 0);
    cr_assert_eq(kvf_store_tier_prefix(store, keys, 24), 24);
    cr_assert_eq(g_written, 0, "the store's written_cb, not the test's");
    kvf_disk_get_stats(disk, &dst);
    cr_assert_gt(dst.writes, dst.write_copies,
                 "the pool kept blocks for writes in place");

    cr_assert_eq(kvf_store_promote(store, keys, 2, on_promoted, NULL),
                 KVF_INPROGRESS);
    cr_assert_eq(g_promotions, 0);
    kvf_disk_drain(disk);
    cr_assert_eq(g_promotions, 1);
    cr_assert_eq(g_promoted, 2);
    cr_assert_eq(g_failed, 0);
    for (i = 0; i < 2; i++) {
        cr_assert_eq(kvf_store_pin(store, o, &keys[i], &slot), KVF_OK);
        cr_assert(
            matches(i, (uint8_t *)kvf_store_base(store) + slot.offset, SLOT));
        cr_assert_eq(kvf_store_release(store, o, slot.offset), KVF_OK);
    }
    /* in the pool already: nothing to read */
    cr_assert_eq(kvf_store_promote(store, keys, 2, on_promoted, NULL), KVF_OK);
    kvf_store_get_stats(store, &st);
    cr_assert_eq(st.promoted, 2);
    store_done(store, o, disk);
}

Test(disk, damaged_slot_is_a_promotion_miss_never_wrong_bytes)
{
    kvf_disk_t *disk;
    kvf_store_t *store = store_with_disk(&disk);
    kvf_store_owner_t *o;
    kvf_store_stats_t st;
    kvf_key_t k = key_of(0);
    kvf_slot_t slot;

    cr_assert_eq(kvf_store_owner_create(store, &o), KVF_OK);
    commit_chunks(store, o, disk, 0, POOL_SLOTS); /* chunk 0 is in slot 0 */
    damage(0, ALIGN + 100, 0x01);
    cr_assert_eq(kvf_store_promote(store, &k, 1, on_promoted, NULL),
                 KVF_INPROGRESS);
    kvf_disk_drain(disk);
    cr_assert_eq(g_failed, 1);
    cr_assert_eq(g_promoted, 0);
    cr_assert_eq(kvf_store_pin(store, o, &k, &slot), KVF_ERR_NOT_FOUND);
    cr_assert_eq(kvf_store_tier_prefix(store, &k, 1), 0);
    kvf_store_get_stats(store, &st);
    cr_assert_eq(st.promote_failures, 1);
    cr_assert_eq(st.pool.allocated, 0, "the block went back");
    store_done(store, o, disk);
}

Test(disk, canceled_promotion_still_lands_and_never_calls_back)
{
    kvf_disk_t *disk;
    kvf_store_t *store = store_with_disk(&disk);
    kvf_store_owner_t *o;
    kvf_key_t k = key_of(0);
    int token;

    cr_assert_eq(kvf_store_owner_create(store, &o), KVF_OK);
    commit_chunks(store, o, disk, 0, POOL_SLOTS);
    cr_assert_eq(kvf_store_promote(store, &k, 1, on_promoted, &token),
                 KVF_INPROGRESS);
    kvf_store_promote_cancel(store, &token);
    kvf_disk_drain(disk);
    cr_assert_eq(g_promotions, 0);
    cr_assert_eq(kvf_store_local_prefix(store, &k, 1), 1);
    store_done(store, o, disk);
}

Test(disk, promotion_never_evicts_the_requests_own_pool_hits)
{
    kvf_disk_t *disk;
    kvf_store_t *store = store_with_disk(&disk);
    kvf_store_owner_t *o;
    kvf_key_t keys[5];
    uint64_t i;

    cr_assert_eq(kvf_store_owner_create(store, &o), KVF_OK);
    commit_chunks(store, o, disk, 0, 22); /* disk: 0..8, pool: 9..21 */
    keys[0] = key_of(9); /* the next victim, but the request's own hit */
    for (i = 1; i < 5; i++) {
        keys[i] = key_of(i - 1);
    }
    cr_assert_eq(kvf_store_tier_prefix(store, keys, 5), 5);
    cr_assert_eq(kvf_store_local_prefix(store, keys, 2), 1);
    cr_assert_eq(kvf_store_promote(store, keys, 5, on_promoted, NULL),
                 KVF_INPROGRESS);
    kvf_disk_drain(disk);
    cr_assert_eq(g_promotions, 1);
    cr_assert_eq(g_promoted, 4);
    cr_assert_eq(g_failed, 0);
    cr_assert_eq(kvf_store_local_prefix(store, keys, 5), 5,
                 "the request's hit stayed in the pool");
    store_done(store, o, disk);
}

/* A promotion of chunks that fill the tier: each read-back makes room in
 * the pool, whose evictions spill to the full disk; the slots they take
 * are never those of the request's keys still to be read. */
Test(disk, promotion_into_a_full_tier_keeps_its_later_keys)
{
    enum {
        N = 8
    };
    kvf_disk_t *disk;
    kvf_store_t *store = store_with_disk(&disk);
    kvf_store_owner_t *o;
    kvf_disk_stats_t dst;
    kvf_key_t keys[N];
    kvf_slot_t slot;
    uint64_t i, n = 0;

    cr_assert_eq(kvf_store_owner_create(store, &o), KVF_OK);
    commit_chunks(store, o, disk, 0, NSRC); /* 48 disk slots, all used */
    kvf_disk_get_stats(disk, &dst);
    cr_assert_eq(dst.used_slots, 48);
    for (i = 0; (i < NSRC) && (n < N); i++) {
        kvf_key_t k = key_of(i);

        if ((kvf_store_local_prefix(store, &k, 1) == 0) &&
            (kvf_store_tier_prefix(store, &k, 1) == 1)) {
            keys[n++] = k; /* the oldest on disk only */
        }
    }
    cr_assert_eq(n, N);
    cr_assert_eq(kvf_store_promote(store, keys, N, on_promoted, NULL),
                 KVF_INPROGRESS);
    kvf_disk_drain(disk);
    cr_assert_eq(g_promotions, 1);
    cr_assert_eq(g_promoted, N, "%d of %d failed", g_failed, N);
    for (i = 0; i < N; i++) {
        cr_assert_eq(kvf_store_pin(store, o, &keys[i], &slot), KVF_OK);
        cr_assert(matches(keys[i].lo,
                          (uint8_t *)kvf_store_base(store) + slot.offset, SLOT),
                  "chunk %" PRIu64, keys[i].lo);
        cr_assert_eq(kvf_store_release(store, o, slot.offset), KVF_OK);
    }
    store_done(store, o, disk);
}

/* A promotion of more chunks than the tier takes reads at once (4 x
 * queue_depth): the rest wait in the store for their turn and are read
 * as the first ones land, never failed as misses. A second promotion of
 * a waiting key waits for that same read. */
static uint32_t g_promoted_sum, g_failed_sum;

static void on_promoted_sum(void *arg, uint32_t promoted, uint32_t failed)
{
    g_promotions++;
    g_promoted_sum += promoted;
    g_failed_sum += failed;
}

Test(disk, promotion_past_the_tiers_reads_waits_its_turn)
{
    enum {
        N = 10
    }; /* queue_depth 2: 8 reads accepted */
    kvf_disk_t *disk;
    kvf_store_t *store = store_with_disk_depth(&disk, 2);
    kvf_store_owner_t *o;
    kvf_store_stats_t st;
    kvf_key_t keys[N];
    kvf_slot_t slot;
    uint64_t i;

    cr_assert_eq(kvf_store_owner_create(store, &o), KVF_OK);
    commit_chunks(store, o, disk, 0, 32); /* disk only: 0..15 at least */
    for (i = 0; i < N; i++) {
        keys[i] = key_of(i);
    }
    cr_assert_eq(kvf_store_local_prefix(store, keys, N), 0);
    cr_assert_eq(kvf_store_tier_prefix(store, keys, N), N);
    cr_assert_eq(kvf_store_promote(store, keys, N, on_promoted_sum, NULL),
                 KVF_INPROGRESS);
    cr_assert_eq(
        kvf_store_promote(store, &keys[N - 1], 1, on_promoted_sum, NULL),
        KVF_INPROGRESS, "the last key's read is still to come");
    kvf_disk_drain(disk);
    cr_assert_eq(g_promotions, 2);
    cr_assert_eq(g_promoted_sum, N + 1, "%u promoted, %u failed",
                 g_promoted_sum, g_failed_sum);
    cr_assert_eq(g_failed_sum, 0);
    for (i = 0; i < N; i++) {
        cr_assert_eq(kvf_store_pin(store, o, &keys[i], &slot), KVF_OK);
        cr_assert(
            matches(i, (uint8_t *)kvf_store_base(store) + slot.offset, SLOT),
            "chunk %" PRIu64, i);
        cr_assert_eq(kvf_store_release(store, o, slot.offset), KVF_OK);
    }
    kvf_store_get_stats(store, &st);
    cr_assert_eq(st.promoted, N, "each chunk read once");
    cr_assert_eq(st.promote_failures, 0);
    store_done(store, o, disk);
}

/* An in-place write that fails still gives its kept block back to the
 * pool, and the chunk, in neither tier now, leaves the registry. */
Test(disk, failed_write_in_place_frees_the_kept_block)
{
    kvf_disk_t *disk;
    kvf_store_t *store = store_with_disk(&disk);
    kvf_store_owner_t *o;
    kvf_store_stats_t st;
    kvf_disk_stats_t dst;
    kvf_slot_t slot;
    uint64_t i;

    cr_assert_eq(kvf_store_owner_create(store, &o), KVF_OK);
    commit_chunks(store, o, disk, 0, POOL_SLOTS - 1);
    g_left    = 0;
    g_demoted = 0;
    kvf_disk_set_faults(disk, KVF_DISK_FAULT_WRITE_EIO);
    /* the next commit evicts 3 (in place); the first of their writes
     * fails */
    commit_chunk(store, o, POOL_SLOTS - 1);
    kvf_store_get_stats(store, &st);
    cr_assert_gt(st.pool.retired, 0, "evicted blocks wait for their writes");
    kvf_disk_drain(disk);
    kvf_store_get_stats(store, &st);
    cr_assert_eq(st.pool.retired, 0, "every kept block came back");
    kvf_disk_get_stats(disk, &dst);
    cr_assert_eq(dst.write_errors, 1);
    cr_assert_eq(dst.write_copies, 0);
    cr_assert_eq(g_left, 1, "the chunk whose write failed left the node");
    cr_assert_eq(g_demoted, 2, "the others are on disk");
    /* the pool still has all its room: a full round of new chunks fits */
    for (i = 0; i < POOL_SLOTS; i++) {
        cr_assert_eq(kvf_store_alloc(store, o, SLOT, &slot), KVF_OK);
        cr_assert_eq(kvf_store_release(store, o, slot.offset), KVF_OK);
    }
    store_done(store, o, disk);
}

/* A retrieve right after a prefetching lookup does not read the same
 * chunks again: it waits for the prefetch's reads. */
Test(disk, second_promotion_of_a_key_waits_for_the_first_read)
{
    kvf_disk_t *disk;
    kvf_store_t *store = store_with_disk(&disk);
    kvf_store_owner_t *o;
    kvf_disk_stats_t dst;
    kvf_key_t keys[4];
    kvf_slot_t slot;
    uint64_t i, reads0;

    cr_assert_eq(kvf_store_owner_create(store, &o), KVF_OK);
    commit_chunks(store, o, disk, 0, 24); /* 0..7 are on disk only */
    for (i = 0; i < 4; i++) {
        keys[i] = key_of(i);
    }
    kvf_disk_get_stats(disk, &dst);
    reads0 = dst.reads;
    /* the prefetch: nobody waits */
    cr_assert_eq(kvf_store_promote(store, keys, 4, NULL, NULL), KVF_INPROGRESS);
    /* the retrieve: keys 0..3 again (one twice), and 4 */
    keys[3] = key_of(1);
    cr_assert_eq(kvf_store_promote(store, keys, 4, on_promoted, NULL),
                 KVF_INPROGRESS);
    cr_assert_eq(g_promotions, 0);
    kvf_disk_drain(disk);
    cr_assert_eq(g_promotions, 1);
    cr_assert_eq(g_promoted, 4, "each of its keys is in the pool");
    cr_assert_eq(g_failed, 0);
    kvf_disk_get_stats(disk, &dst);
    cr_assert_eq(dst.reads - reads0, 4, "no chunk was read twice");
    for (i = 0; i < 4; i++) {
        kvf_key_t k = key_of(i);

        cr_assert_eq(kvf_store_pin(store, o, &k, &slot), KVF_OK);
        cr_assert(
            matches(i, (uint8_t *)kvf_store_base(store) + slot.offset, SLOT));
        cr_assert_eq(kvf_store_release(store, o, slot.offset), KVF_OK);
    }
    store_done(store, o, disk);
}

/* A damaged chunk fails every promotion waiting for it, never hands out
 * bytes. */
Test(disk, waiting_promotion_of_a_damaged_chunk_fails_too)
{
    kvf_disk_t *disk;
    kvf_store_t *store = store_with_disk(&disk);
    kvf_store_owner_t *o;
    kvf_key_t k = key_of(0);
    kvf_slot_t slot;

    cr_assert_eq(kvf_store_owner_create(store, &o), KVF_OK);
    commit_chunks(store, o, disk, 0, POOL_SLOTS); /* chunk 0 is in slot 0 */
    damage(0, ALIGN + 100, 0x01);
    cr_assert_eq(kvf_store_promote(store, &k, 1, NULL, NULL), KVF_INPROGRESS);
    cr_assert_eq(kvf_store_promote(store, &k, 1, on_promoted, NULL),
                 KVF_INPROGRESS);
    kvf_disk_drain(disk);
    cr_assert_eq(g_promotions, 1);
    cr_assert_eq(g_failed, 1);
    cr_assert_eq(g_promoted, 0);
    cr_assert_eq(kvf_store_pin(store, o, &k, &slot), KVF_ERR_NOT_FOUND);
    store_done(store, o, disk);
}

/* More reads than queue_depth wait in order instead of failing: a peer
 * fetching many keys that are on disk gets them all. */
Test(disk, reads_past_the_queue_depth_wait_their_turn)
{
    kvf_disk_t *disk = open_disk(16);
    uint8_t *bufs;
    kvf_disk_stats_t st;
    kvf_key_t k;
    uint64_t i;

    for (i = 0; i < 16; i++) {
        put(disk, i, SLOT);
    }
    cr_assert_eq(posix_memalign((void **)&bufs, ALIGN, 16 * SLOT), 0);
    g_reads = 0;
    for (i = 0; i < 16; i++) { /* queue_depth 4: 4 in flight, 12 queued */
        k = key_of(i);
        cr_assert_eq(
            kvf_disk_read(disk, &k, bufs + i * SLOT, SLOT, on_read, NULL),
            KVF_INPROGRESS, "read %" PRIu64, i);
    }
    k = key_of(0);
    cr_assert_eq(kvf_disk_read(disk, &k, g_buf, SLOT, on_read, NULL),
                 KVF_ERR_BUSY, "bounded: 4 x queue_depth accepted");
    kvf_disk_drain(disk);
    cr_assert_eq(g_reads, 16);
    cr_assert_eq(g_read_status, KVF_OK);
    for (i = 0; i < 16; i++) {
        cr_assert(matches(i, bufs + i * SLOT, SLOT), "chunk %" PRIu64, i);
    }
    kvf_disk_get_stats(disk, &st);
    cr_assert_eq(st.reads, 16);
    cr_assert_eq(st.read_errors + st.checksum_failures, 0);
    cr_assert_gt(st.read_busy_ns, 0);
    /* the device's queue: at least one read whenever busy, at most 4 */
    cr_assert_geq(st.read_inflight_ns, st.read_busy_ns);
    cr_assert_leq(st.read_inflight_ns, 4 * st.read_busy_ns);
    cr_assert_gt(st.read_inflight_ns, st.read_busy_ns,
                 "16 reads at depth 4 overlap");
    free(bufs);
    kvf_disk_destroy(disk);
}

Test(disk, poll_starts_the_next_read_without_finishing_the_last)
{
    kvf_disk_params_t p = params_of(4);
    uint64_t deadline   = kvf_time_now_ns() + 5 * KVF_NSEC_PER_SEC;
    kvf_disk_t *disk;
    uint8_t *bufs;
    kvf_key_t k;
    uint64_t i;

    p.queue_depth = 1; /* the second read waits for the first */
    cr_assert_eq(kvf_disk_create(&p, &disk), KVF_OK);
    for (i = 0; i < 2; i++) {
        put(disk, i, SLOT);
    }
    cr_assert_eq(posix_memalign((void **)&bufs, ALIGN, 2 * SLOT), 0);
    memset(bufs, 0xee, 2 * SLOT);
    g_reads = 0;
    for (i = 0; i < 2; i++) {
        k = key_of(i);
        cr_assert_eq(
            kvf_disk_read(disk, &k, bufs + i * SLOT, SLOT, on_read, NULL),
            KVF_INPROGRESS);
    }
    kvf_disk_progress(disk, false); /* submits the first */
    /* the second read's bytes land only once poll took the first off the
     * device: meanwhile no read was finished (no callback) */
    while (!matches(1, bufs + SLOT, SLOT) && (kvf_time_now_ns() < deadline)) {
        kvf_disk_poll(disk);
        cr_assert_eq(g_reads, 0, "poll finishes nothing");
    }
    cr_assert(matches(1, bufs + SLOT, SLOT), "the second read went out");
    kvf_disk_drain(disk);
    cr_assert_eq(g_reads, 2);
    cr_assert_eq(g_read_status, KVF_OK);
    cr_assert(matches(0, bufs, SLOT));
    free(bufs);
    kvf_disk_destroy(disk);
}
