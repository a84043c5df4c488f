/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Engines are confined (issue #16.4, docs/security.md "Engines"): an engine
 * maps the pool read-only and writes only into its own staging area; a
 * decoder's PD receive region is not in anything an engine can map, and a
 * claimed request's chunks are copied into the claiming engine's staging.
 * A hostile engine B, holding the very descriptors the agent passed it,
 * tries every way to change engine A's committed bytes or read A's PD
 * request; each fails, and A and later readers get the original bytes.
 */
#include "common/time.h"
#include "proto/bconn.h"
#include "proto/frame.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"
#include "tests/security/rogue.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHUNK (64u << 10)

static kvf_th_ctl_t g_ctl;
static kvf_sec_agent_t g_agent, g_prefill;

static void teardown(void)
{
    kvf_test_proc_stop(&g_prefill.proc, 10000);
    kvf_test_proc_stop(&g_agent.proc, 10000);
    kvf_th_ctl_stop(&g_ctl);
    kvf_test_check_leaks();
}

TestSuite(confine, .fini = teardown, .timeout = 60);

static kvf_client_t *engine(const kvf_sec_agent_t *a, const char *name)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT |
                                           KVF_CLIENT_PARAM_NAME,
                             .socket_path = a->sock,
                             .timeout_ns  = 10000000000ull,
                             .name        = name};
    kvf_client_t *c       = NULL;

    cr_assert_eq(kvf_client_connect(&p, &c), KVF_OK, "%s",
                 kvf_client_last_error(NULL));
    return c;
}

static void fill(uint8_t *p, size_t len, unsigned seed)
{
    size_t i;

    for (i = 0; i < len; i++) {
        p[i] = (uint8_t)((i * 131u + seed * 7919u) >> 3);
    }
}

/* What a hostile engine gets: the agent's descriptors themselves, from a
 * handshake of its own (the library closes them after mapping). */
typedef struct {
    kvf_bconn_t *conn;
    int pool_fd, staging_fd;
    uint64_t pool_size, staging_size;
} raw_engine_t;

static void raw_engine_open(raw_engine_t *e, const kvf_sec_agent_t *a)
{
    const kvf_bconn_params_t cp       = {.peer = "agent", .max_frame = 1 << 20};
    const kvf_bconn_hello_params_t hp = {
        .version = KVF_PROTOCOL_VERSION,
        .kind    = KVF__PEER_KIND__PEER_ENGINE,
        .name    = "hostile",
    };
    uint64_t deadline = kvf_time_deadline_ns(10000000000ull);
    const Kvf__PoolInfo *info;
    kvf_frame_t frame;
    int fd;

    memset(e, 0, sizeof(*e));
    e->pool_fd    = -1;
    e->staging_fd = -1;
    cr_assert_eq(kvf_bconn_dial_unix(a->sock, deadline, &fd, NULL, 0), KVF_OK);
    cr_assert_eq(kvf_bconn_create(fd, &cp, &e->conn), KVF_OK);
    cr_assert_eq(kvf_bconn_hello(e->conn, &hp, deadline, &e->pool_fd), KVF_OK,
                 "%s", kvf_bconn_last_error(e->conn));
    cr_assert_eq(kvf_bconn_expect(e->conn, KVF_MSG_POOL_INFO, deadline,
                                  &e->staging_fd, &frame),
                 KVF_OK);
    info            = (const Kvf__PoolInfo *)frame.msg;
    e->pool_size    = info->pool_size;
    e->staging_size = info->staging_size;
    kvf_frame_release(&frame, NULL);
    cr_assert_geq(e->pool_fd, 0);
    cr_assert_geq(e->staging_fd, 0);
    cr_assert_gt(e->staging_size, 0);
}

static void raw_engine_close(raw_engine_t *e)
{
    close(e->pool_fd);
    close(e->staging_fd);
    kvf_bconn_destroy(e->conn);
}

/* Runs @p fn in a child process; true when it could not complete (it
 * faulted: killed by a signal, or our SIGSEGV/SIGBUS handler's 42). */
static void on_fault(int sig)
{
    (void)sig;
    _exit(42);
}

static bool faults_in_child(void (*fn)(void *), void *arg)
{
    struct sigaction sa;
    int status = 0;
    pid_t pid;

    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_fault;
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        fn(arg);
        _exit(0); /* the write went through */
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return WIFSIGNALED(status) ||
           (WIFEXITED(status) && (WEXITSTATUS(status) == 42));
}

static void write_byte(void *p)
{
    *(volatile uint8_t *)p ^= 0xff;
}

/* Every way a holder of the pool's fd (or of its mapping) could write into
 * it, each refused; @p victim is a committed chunk's address in @p base. */
static void assert_pool_unwritable(raw_engine_t *e, uint8_t *base,
                                   uint64_t victim)
{
    char path[64];
    uint8_t byte = 0;
    struct stat st;
    void *rw;
    int fd;

    /* the fd holds the pool and nothing else (no PD region) */
    cr_assert_eq(fstat(e->pool_fd, &st), 0);
    cr_assert_eq((uint64_t)st.st_size, e->pool_size);
    /* a writable shared mapping of the fd */
    rw = mmap(NULL, e->pool_size, PROT_READ | PROT_WRITE, MAP_SHARED,
              e->pool_fd, 0);
    cr_assert_eq(rw, MAP_FAILED, "the pool fd maps writable");
    cr_assert(errno == EACCES || errno == EPERM, "%s", strerror(errno));
    cr_assert_lt(pwrite(e->pool_fd, &byte, 1, (off_t)victim), 0);
    cr_assert_neq(ftruncate(e->pool_fd, 0), 0);
    /* the fd reopened read-write through /proc (a memfd allows it): the
     * seals refuse every write anyway */
    snprintf(path, sizeof(path), "/proc/self/fd/%d", e->pool_fd);
    fd = open(path, O_RDWR);
    if (fd >= 0) {
        rw =
            mmap(NULL, e->pool_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        cr_assert_eq(rw, MAP_FAILED, "the reopened pool fd maps writable");
        cr_assert_lt(pwrite(fd, &byte, 1, (off_t)victim), 0);
        cr_assert_neq(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                (off_t)(victim & ~4095ull), 4096),
                      0, "a hole punched into a committed chunk");
        cr_assert_neq(ftruncate(fd, 0), 0);
        close(fd);
    }
    /* the read-only mapping: no mprotect to writable, a store faults, and
     * /proc/self/mem (FOLL_FORCE) cannot write through it either */
    cr_assert_neq(mprotect((void *)((uintptr_t)(base + victim) & ~4095ull),
                           4096, PROT_READ | PROT_WRITE),
                  0, "the pool mapping became writable");
    cr_assert(faults_in_child(write_byte, base + victim),
              "a store into the pool went through");
    fd = open("/proc/self/mem", O_RDWR);
    if (fd >= 0) {
        cr_assert_lt(pwrite(fd, &byte, 1, (off_t)(uintptr_t)(base + victim)), 0,
                     "/proc/self/mem wrote into the pool");
        close(fd);
    }
}

Test(confine, an_engine_cannot_change_another_engines_committed_chunk)
{
    kvf_key_t key = {.ns = 1, .hi = 0xc0f, .lo = 0x1};
    kvf_client_t *a, *b, *c;
    uint8_t *want = malloc(CHUNK), *base;
    kvf_slot_t slot, got;
    raw_engine_t hostile;
    bool missing = true;
    uint64_t sum, got_sum = 0;

    kvf_th_ctl_start(&g_ctl, NULL);
    kvf_sec_agent_start(&g_agent, g_ctl.addr, "confine-a", NULL);
    a = engine(&g_agent, "engine-a");
    cr_assert_eq(kvf_client_alloc(a, CHUNK, 1, &slot), KVF_OK);
    fill((uint8_t *)kvf_client_pool_base(a) + slot.offset, CHUNK, 1);
    fill(want, CHUNK, 1);
    sum = kvf_chunk_checksum(want, CHUNK);
    cr_assert_eq(kvf_client_commit(a, &key, &slot, &sum, 1), KVF_OK, "%s",
                 kvf_client_last_error(a));
    /* A keeps writing its staging block after the commit: that is its own
     * memory now, not the committed chunk */
    memset((uint8_t *)kvf_client_pool_base(a) + slot.offset, 0xee, CHUNK);

    /* B finds the chunk (a retrieve gives its place in the pool) */
    b = engine(&g_agent, "engine-b");
    cr_assert_eq(kvf_client_retrieve(b, &key, 1, &got, &missing), KVF_OK);
    cr_assert(!missing);
    base = kvf_client_pool_base(b);
    raw_engine_open(&hostile, &g_agent);
    assert_pool_unwritable(&hostile, base, got.offset + CHUNK / 2);
    /* B's writable memory is its own staging area, not A's */
    memset(base + hostile.pool_size, 0x5a,
           kvf_client_pool_size(b) - hostile.pool_size);
    raw_engine_close(&hostile);
    cr_assert_eq(kvf_client_release(b, &got, 1), KVF_OK);

    /* the next retrieve gets the original bytes, verified, and the
     * checksum they were committed with (#16.5) to check them itself */
    c = engine(&g_agent, "engine-c");
    cr_assert_eq(
        kvf_client_retrieve_checksums(c, &key, 1, &got, &missing, &got_sum),
        KVF_OK);
    cr_assert(!missing);
    cr_assert_eq(got_sum, sum);
    cr_assert(kvf_client_verify(c, &got, got_sum));
    cr_assert(!kvf_client_verify(c, &got, got_sum ^ 1));
    cr_assert_eq(
        memcmp((uint8_t *)kvf_client_pool_base(c) + got.offset, want, CHUNK), 0,
        "the committed chunk changed");
    cr_assert_eq(kvf_sec_metric(&g_agent, "kvf_agent_checksum_failures_total"),
                 0);
    kvf_client_release(c, &got, 1);
    kvf_client_disconnect(c);
    kvf_client_disconnect(b);
    kvf_client_disconnect(a);
    free(want);
}

/* Does @p needle (64 bytes) occur anywhere in [p, p + len)? */
static bool contains(const uint8_t *p, uint64_t len, const uint8_t *needle)
{
    uint64_t i;

    for (i = 0; i + 64 <= len; i += 64) {
        if (memcmp(p + i, needle, 64) == 0) {
            return true;
        }
    }
    return false;
}

Test(confine, a_pd_request_is_readable_only_by_the_engine_that_claimed_it)
{
    const char *const decode[]  = {"--role", "decode", "--pd-buffer-size", "4M",
                                   NULL};
    const char *const prefill[] = {"--role", "prefill", NULL};
    kvf_client_t *pe, *a, *b;
    kvf_slot_t slots[4], got[4], other[4];
    uint8_t *want = malloc(CHUNK), *base;
    raw_engine_t hostile;
    uint64_t sums[4];
    uint32_t i, num = 0;

    kvf_th_ctl_start(&g_ctl, NULL);
    kvf_sec_agent_start(&g_agent, g_ctl.addr, "confine-d", decode);
    kvf_sec_agent_start(&g_prefill, g_ctl.addr, "confine-p", prefill);

    /* the prefill engine pushes request 7 from its staging area */
    pe = engine(&g_prefill, "prefill-engine");
    cr_assert_eq(kvf_client_alloc(pe, CHUNK, 4, slots), KVF_OK);
    for (i = 0; i < 4; i++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(pe) + slots[i].offset;

        fill(p, CHUNK, 100 + i);
        sums[i] = kvf_chunk_checksum(p, CHUNK);
    }
    cr_assert_eq(kvf_pd_push(pe, 7, "confine-d", slots, sums, 4, true), KVF_OK,
                 "%s", kvf_client_last_error(pe));
    cr_assert_eq(kvf_client_release(pe, slots, 4), KVF_OK);

    /* A claims it */
    a = engine(&g_agent, "engine-a");
    cr_assert_eq(kvf_pd_wait(a, 7, 5000000000ull, got, 4, &num), KVF_OK, "%s",
                 kvf_client_last_error(a));
    cr_assert_eq(num, 4);

    /* B cannot claim it, and finds its bytes nowhere it can read */
    b = engine(&g_agent, "engine-b");
    cr_assert_eq(kvf_pd_wait(b, 7, 100000000ull, other, 4, &num), KVF_ERR_BUSY);
    base = kvf_client_pool_base(b);
    for (i = 0; i < 4; i++) {
        fill(want, CHUNK, 100 + i);
        cr_assert(!contains(base, kvf_client_pool_size(b), want),
                  "engine B can read chunk %u of A's PD request", i);
    }
    /* nor write anything A reads */
    raw_engine_open(&hostile, &g_agent);
    assert_pool_unwritable(&hostile, base, 0);
    memset(base + hostile.pool_size, 0x5a,
           kvf_client_pool_size(b) - hostile.pool_size);
    raw_engine_close(&hostile);

    for (i = 0; i < 4; i++) {
        fill(want, CHUNK, 100 + i);
        cr_assert_eq(got[i].length, CHUNK);
        cr_assert_eq(memcmp((uint8_t *)kvf_client_pool_base(a) + got[i].offset,
                            want, CHUNK),
                     0, "chunk %u of the claimed request changed", i);
    }
    cr_assert_eq(kvf_pd_release(a, 7), KVF_OK);
    kvf_client_disconnect(b);
    kvf_client_disconnect(a);
    kvf_client_disconnect(pe);
    free(want);
}

Test(confine, a_full_staging_area_refuses_allocations_and_is_counted)
{
    const char *const args[] = {"--engine-staging-size", "2M", NULL};
    kvf_slot_t slots[3];
    kvf_client_t *a;

    kvf_th_ctl_start(&g_ctl, NULL);
    kvf_sec_agent_start(&g_agent, g_ctl.addr, "confine-s", args);
    a = engine(&g_agent, "engine-a");
    /* 2 MiB of staging: two 1 MiB chunks, not three; all or nothing */
    cr_assert_eq(kvf_client_alloc(a, 1u << 20, 3, slots), KVF_ERR_NO_MEMORY,
                 "%s", kvf_client_last_error(a));
    /* the error names the setting to raise */
    cr_assert(strstr(kvf_client_last_error(a), "staging area is full") != NULL,
              "%s", kvf_client_last_error(a));
    cr_assert(strstr(kvf_client_last_error(a), "engine_staging_size") != NULL,
              "%s", kvf_client_last_error(a));
    cr_assert_eq(
        kvf_sec_metric(&g_agent, "kvf_agent_engine_staging_full_total"), 1);
    cr_assert_eq(kvf_client_alloc(a, 1u << 20, 2, slots), KVF_OK, "%s",
                 kvf_client_last_error(a));
    cr_assert_eq(kvf_client_release(a, slots, 2), KVF_OK);
    cr_assert_eq(kvf_client_alloc(a, 1u << 20, 2, slots), KVF_OK, "%s",
                 kvf_client_last_error(a));
    kvf_client_disconnect(a);
}

/* An engine that sends PD waits (or pushes) without reading their answers
 * holds at most 4096 of them at its agent: the next is refused at once,
 * and they all go with the engine's connection. */
Test(confine, an_engine_holds_a_bounded_number_of_pushes_and_waits)
{
    const char *const decode[] = {"--role", "decode", "--pd-buffer-size", "4M",
                                  NULL};
    uint64_t deadline          = kvf_time_deadline_ns(30000000000ull);
    const Kvf__Status *st;
    Kvf__EnginePdWait w;
    kvf_frame_t frame;
    raw_engine_t e;
    uint32_t i;
    int k;

    kvf_th_ctl_start(&g_ctl, NULL);
    kvf_sec_agent_start(&g_agent, g_ctl.addr, "confine-w", decode);
    raw_engine_open(&e, &g_agent);
    for (i = 0; i <= 4096; i++) {
        kvf__engine_pd_wait__init(&w);
        w.request_id = 1000 + i;
        w.pd_request = 50000 + i;
        w.timeout_ms = 50000; /* nobody pushes: none answers before */
        cr_assert_eq(kvf_bconn_queue(e.conn, KVF_MSG_ENGINE_PD_WAIT, &w.base),
                     KVF_OK);
    }
    cr_assert_eq(kvf_bconn_flush(e.conn, deadline), KVF_OK);
    cr_assert_eq(kvf_bconn_recv(e.conn, deadline, NULL, &frame), KVF_OK, "%s",
                 kvf_bconn_last_error(e.conn));
    cr_assert_eq(frame.type, KVF_MSG_STATUS);
    st = (const Kvf__Status *)frame.msg;
    cr_assert_eq(st->request_id, 1000 + 4096, "the answer is to wait %llu",
                 (unsigned long long)st->request_id);
    cr_assert_eq(st->status, KVF_ERR_BUSY, "%s", st->message);
    kvf_frame_release(&frame, NULL);
    cr_assert_eq(kvf_sec_metric(&g_agent, "kvf_agent_pd_requests"), 4096);
    raw_engine_close(&e);
    for (k = 0;
         (k < 500) && (kvf_sec_metric(&g_agent, "kvf_agent_pd_requests") != 0);
         k++) {
        poll(NULL, 0, 10);
    }
    cr_assert_eq(kvf_sec_metric(&g_agent, "kvf_agent_pd_requests"), 0);
}
