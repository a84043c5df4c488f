/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The requester side of the same-host path (agent/local.c) against a
 * hostile holder on the local socket: one that passes a pool it could
 * still write, a PD receive region that is read-only, unsealed or smaller
 * than it says, or leases naming bytes outside its pool or with a wrong
 * checksum. Each is refused (UCX then, or a miss), never mapped writable,
 * never a crash, never wrong bytes committed.
 */
#include "agent/local.h"
#include "agent/local_wire.h"
#include "common/chunk.h"
#include "common/time.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>
#include <event2/event.h>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CHUNK       (64u << 10)
#define HOLDER_ID   2u
#define HOLDER_POOL (1u << 20)
#define REGION      (256u << 10)

/* What the fake holder passes and answers. */
typedef struct fake_holder {
    int listen_fd;
    int pool_fd;         /* passed with READY (-1: none) */
    int region_fd;       /* passed after it (-1: none) */
    uint64_t pool_bytes; /* READY's h.ticket */
    uint64_t region_bytes;
    kvf_local_lease_ent_t ent; /* every LEASE is answered with this */
    int releases;
    pthread_t thread;
} fake_holder_t;

static struct event_base *g_base;
static kvf_store_t *g_store;
static kvf_local_t *g_local;
static char g_holder_addr[64];
static fake_holder_t g_holder;
static uint8_t *g_holder_pool; /* the fake holder's own view, read-write */
static int g_holder_pool_fd;

static uint32_t self_id(void *arg)
{
    return 1;
}

static int memfd(const char *name, uint64_t size, bool seal)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);

    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)size), 0);
    if (seal) {
        cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    }
    return fd;
}

/* @p fd reopened with @p flags (as a holder hands out its pool). */
static int reopen(int fd, int flags)
{
    char path[64];
    int out;

    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    out = open(path, flags | O_CLOEXEC);
    cr_assert_geq(out, 0);
    return out;
}

static void hdr_init(kvf_local_hdr_t *h, uint16_t type)
{
    memset(h, 0, sizeof(*h));
    h->magic = KVF_LOCAL_MAGIC;
    h->type  = type;
}

static ssize_t recv_msg(int fd, void *buf, size_t len)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};

    if (poll(&pfd, 1, 10000) != 1) {
        return -1;
    }
    return recv(fd, buf, len, 0);
}

static void send_ready(const fake_holder_t *h, int fd)
{
    kvf_local_ready_t ready;
    int fds[2] = {h->pool_fd, h->region_fd};
    unsigned n = (h->pool_fd >= 0) + (h->region_fd >= 0);

    hdr_init(&ready.h, KVF_LOCAL_MSG_READY);
    ready.h.ticket     = h->pool_bytes;
    ready.region_bytes = h->region_bytes;
    (void)kvf_local_send_fds(fd, &ready, sizeof(ready),
                             (h->pool_fd >= 0) ? fds : fds + 1, n);
}

/* HELLO -> HELLO_REPLY (no cluster secret: same uid and boot only),
 * AUTH -> READY with the configured descriptors, then every LEASE
 * answered with the configured entry, until the requester hangs up. */
static void *holder_main(void *arg)
{
    fake_holder_t *h = arg;
    kvf_local_in_t in;
    struct pollfd pfd = {.fd = h->listen_fd, .events = POLLIN};
    int fd;
    ssize_t n;

    if (poll(&pfd, 1, 10000) != 1) {
        return NULL;
    }
    fd = accept4(h->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        return NULL;
    }
    while ((n = recv_msg(fd, &in, sizeof(in))) >= (ssize_t)sizeof(in.h)) {
        if (in.h.type == KVF_LOCAL_MSG_HELLO) {
            kvf_local_hello_t out = in.hello; /* its boot id is ours too */

            hdr_init(&out.h, KVF_LOCAL_MSG_HELLO_REPLY);
            out.node_id   = HOLDER_ID;
            out.nonce_len = 0;
            out.mac_len   = 0;
            snprintf(out.name, sizeof(out.name), "hostile");
            (void)send(fd, &out, sizeof(out), MSG_NOSIGNAL);
        } else if (in.h.type == KVF_LOCAL_MSG_AUTH) {
            send_ready(h, fd);
        } else if (in.h.type == KVF_LOCAL_MSG_LEASE) {
            struct {
                kvf_local_hdr_t h;
                kvf_local_lease_ent_t ent[KVF_LOCAL_LEASE_KEYS];
            } out;
            uint32_t i;

            hdr_init(&out.h, KVF_LOCAL_MSG_LEASE_REPLY);
            out.h.ticket = in.h.ticket;
            out.h.first  = in.h.first;
            out.h.count  = in.h.count;
            for (i = 0; i < in.h.count && i < KVF_LOCAL_LEASE_KEYS; i++) {
                out.ent[i] = h->ent;
            }
            (void)send(fd, &out, sizeof(out.h) + (size_t)i * sizeof(out.ent[0]),
                       MSG_NOSIGNAL);
        } else if (in.h.type == KVF_LOCAL_MSG_RELEASE) {
            h->releases++;
        }
    }
    close(fd);
    return NULL;
}

static void holder_start(fake_holder_t *h)
{
    struct sockaddr_un sa;
    size_t len;

    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    len           = (size_t)snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1,
                                     "kvf-local/%s", g_holder_addr);
    h->listen_fd  = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    cr_assert_geq(h->listen_fd, 0);
    cr_assert_eq(
        bind(h->listen_fd, (struct sockaddr *)&sa,
             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len)),
        0);
    cr_assert_eq(listen(h->listen_fd, 4), 0);
    cr_assert_eq(pthread_create(&h->thread, NULL, holder_main, h), 0);
}

static void local_setup(void)
{
    kvf_pool_params_t pp = {
        .field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MAX_CHUNK |
                      KVF_POOL_FIELD_MIN_CHUNK | KVF_POOL_FIELD_NO_HUGETLB,
        .size      = 16 * CHUNK,
        .min_chunk = CHUNK,
        .max_chunk = CHUNK,
    };
    kvf_store_params_t sp = {.pool = &pp};
    char self_addr[64];
    kvf_local_params_t lp = {0};

    g_base = event_base_new();
    cr_assert_not_null(g_base);
    cr_assert_eq(kvf_store_create(&sp, &g_store), KVF_OK);
    snprintf(self_addr, sizeof(self_addr), "unit-req-%d", (int)getpid());
    snprintf(g_holder_addr, sizeof(g_holder_addr), "unit-holder-%d",
             (int)getpid());
    lp.base         = g_base;
    lp.store        = g_store;
    lp.data_address = self_addr;
    lp.node_id      = self_id;
    lp.timeout_ns   = 2 * KVF_NSEC_PER_SEC;
    lp.wants_region = true;
    lp.name         = "unit-requester";
    cr_assert_eq(kvf_local_create(&lp, &g_local), KVF_OK);

    /* the holder's pool: a memfd it keeps read-write and hands out */
    g_holder_pool_fd = memfd("fake-pool", HOLDER_POOL, true);
    g_holder_pool = mmap(NULL, HOLDER_POOL, PROT_READ | PROT_WRITE, MAP_SHARED,
                         g_holder_pool_fd, 0);
    cr_assert_neq(g_holder_pool, MAP_FAILED);
    memset(&g_holder, 0, sizeof(g_holder));
    g_holder.listen_fd  = -1;
    g_holder.pool_fd    = reopen(g_holder_pool_fd, O_RDONLY);
    g_holder.pool_bytes = HOLDER_POOL;
    g_holder.region_fd  = -1;
}

static void local_teardown(void)
{
    kvf_local_destroy(g_local); /* hangs up: the holder thread ends */
    if (g_holder.listen_fd >= 0) {
        pthread_join(g_holder.thread, NULL);
        close(g_holder.listen_fd);
    }
    if (g_holder.pool_fd >= 0) {
        close(g_holder.pool_fd);
    }
    if (g_holder.region_fd >= 0) {
        close(g_holder.region_fd);
    }
    munmap(g_holder_pool, HOLDER_POOL);
    close(g_holder_pool_fd);
    kvf_store_destroy(g_store);
    event_base_free(g_base);
    kvf_test_check_leaks();
}

TestSuite(local, .init = local_setup, .fini = local_teardown, .timeout = 30);

/* Runs the loop until the handshake with the fake holder ended, either
 * way; true when the link came up. */
static bool link_settles(void)
{
    uint64_t deadline = kvf_time_now_ms() + 10000;
    kvf_local_stats_t st;

    holder_start(&g_holder);
    /* the first ask dials; the answer comes with a later one */
    (void)kvf_local_region(g_local, HOLDER_ID, g_holder_addr, &(uint8_t *){0},
                           &(uint64_t){0});
    do {
        event_base_loop(g_base, EVLOOP_NONBLOCK);
        kvf_local_get_stats(g_local, &st);
        if ((st.links_ok + st.links_refused) > 0) {
            return st.links_ok > 0;
        }
        usleep(1000);
    } while (kvf_time_now_ms() < deadline);
    cr_assert_fail("the handshake never ended");
    return false;
}

static kvf_status_t region_of_holder(uint8_t **base_p, uint64_t *len_p)
{
    return kvf_local_region(g_local, HOLDER_ID, g_holder_addr, base_p, len_p);
}

Test(local, a_sealed_read_write_region_is_mapped_writable)
{
    uint8_t *base = NULL, *view;
    uint64_t len  = 0;

    g_holder.region_fd    = memfd("fake-region", REGION, true);
    g_holder.region_bytes = REGION;
    cr_assert(link_settles());
    cr_assert_eq(region_of_holder(&base, &len), KVF_OK);
    cr_assert_eq(len, REGION);
    /* what the requester writes there is what the holder sees */
    memset(base + 4096, 0x5a, 100);
    view = mmap(NULL, REGION, PROT_READ, MAP_SHARED, g_holder.region_fd, 0);
    cr_assert_neq(view, MAP_FAILED);
    cr_assert_eq(view[4096 + 99], 0x5a);
    munmap(view, REGION);
}

Test(local, a_read_only_region_is_not_used)
{
    uint8_t *base = NULL;
    uint64_t len  = 0;
    int rw        = memfd("fake-region", REGION, true);

    g_holder.region_fd    = reopen(rw, O_RDONLY);
    g_holder.region_bytes = REGION;
    close(rw);
    cr_assert(link_settles(), "the pool itself is fine");
    cr_assert_eq(region_of_holder(&base, &len), KVF_ERR_UNSUPPORTED,
                 "pushes to it go over UCX");
}

Test(local, an_unsealed_region_is_not_used)
{
    uint8_t *base = NULL;
    uint64_t len  = 0;

    /* the holder could truncate it under a copy: SIGBUS in the requester */
    g_holder.region_fd    = memfd("fake-region", REGION, false);
    g_holder.region_bytes = REGION;
    cr_assert(link_settles());
    cr_assert_eq(region_of_holder(&base, &len), KVF_ERR_UNSUPPORTED);
}

Test(local, a_region_smaller_than_it_says_is_not_used)
{
    uint8_t *base = NULL;
    uint64_t len  = 0;

    g_holder.region_fd    = memfd("fake-region", REGION, true);
    g_holder.region_bytes = 4 * REGION;
    cr_assert(link_settles());
    cr_assert_eq(region_of_holder(&base, &len), KVF_ERR_UNSUPPORTED);
}

Test(local, a_pool_the_holder_passed_writable_is_refused)
{
    uint8_t *base = NULL;
    uint64_t len  = 0;

    close(g_holder.pool_fd);
    g_holder.pool_fd      = reopen(g_holder_pool_fd, O_RDWR);
    g_holder.region_fd    = memfd("fake-region", REGION, true);
    g_holder.region_bytes = REGION;
    cr_assert_not(link_settles(), "only a read-only pool is mapped");
    cr_assert_eq(region_of_holder(&base, &len), KVF_ERR_UNSUPPORTED);
}

/* A holder whose pool is not prefaulted keeps it sparse: the requester's
 * populate thread maps only the pages the holder has. */
Test(local, a_sparse_pool_stays_sparse)
{
    const uint64_t big = 512ull << 20;
    int fd             = memfd("sparse-pool", big, true);
    uint8_t *p =
        mmap(NULL, 1u << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    uint64_t deadline;
    struct stat st;

    cr_assert_neq(p, MAP_FAILED);
    memset(p, 0x11, 1u << 20); /* the holder has its first MiB */
    munmap(p, 1u << 20);
    close(g_holder.pool_fd);
    g_holder.pool_fd    = reopen(fd, O_RDONLY);
    g_holder.pool_bytes = big;
    cr_assert(link_settles());
    /* the populate thread had time to reach the end of the pool */
    deadline = kvf_time_now_ms() + 500;
    while (kvf_time_now_ms() < deadline) {
        event_base_loop(g_base, EVLOOP_NONBLOCK);
        usleep(10000);
    }
    cr_assert_eq(fstat(fd, &st), 0);
    cr_assert_lt((uint64_t)st.st_blocks * 512, 8ull << 20,
                 "the requester allocated %llu bytes of the holder's pool",
                 (unsigned long long)st.st_blocks * 512);
    close(fd);
}

Test(local, a_pool_smaller_than_it_says_is_refused)
{
    g_holder.pool_bytes = 64ull * HOLDER_POOL;
    cr_assert_not(link_settles(), "reading past its end would be SIGBUS");
}

Test(local, no_descriptor_with_ready_is_refused)
{
    close(g_holder.pool_fd);
    g_holder.pool_fd = -1;
    cr_assert_not(link_settles());
}

/* ---- leases from a hostile holder ---------------------------------- */

typedef struct fetch_done {
    bool called;
    kvf_status_t status;
    kvf_local_result_t res[2];
} fetch_done_t;

static void on_fetched(void *arg, kvf_status_t status,
                       const kvf_local_result_t *res, uint32_t num,
                       const char *holder_name)
{
    fetch_done_t *d = arg;

    d->called = true;
    d->status = status;
    memcpy(d->res, res, num * sizeof(*res));
}

/* Fetches one key from the fake holder (link up first); its result. */
static kvf_local_result_t fetch_one(const kvf_key_t *key)
{
    uint64_t deadline = kvf_time_now_ms() + 10000;
    kvf_store_owner_t *owner;
    fetch_done_t done = {0};

    cr_assert(link_settles());
    cr_assert_eq(kvf_store_owner_create(g_store, &owner), KVF_OK);
    cr_assert_eq(kvf_local_fetch(g_local, HOLDER_ID, g_holder_addr, key, 1,
                                 owner, on_fetched, &done),
                 KVF_OK);
    while (!done.called && (kvf_time_now_ms() < deadline)) {
        event_base_loop(g_base, EVLOOP_NONBLOCK);
        usleep(1000);
    }
    cr_assert(done.called, "the fetch never ended");
    cr_assert_eq(done.status, KVF_OK);
    kvf_store_owner_destroy(g_store, owner);
    return done.res[0];
}

static kvf_key_t test_key(void)
{
    kvf_key_t k = {.ns = 7, .hi = 0x1234, .lo = 0x5678};

    return k;
}

Test(local, a_lease_past_the_end_of_the_pool_is_a_miss)
{
    kvf_key_t key = test_key();
    kvf_local_result_t r;

    g_holder.ent.status = KVF_OK;
    g_holder.ent.offset = HOLDER_POOL - CHUNK / 2; /* runs past the end */
    g_holder.ent.length = CHUNK;
    r                   = fetch_one(&key);
    cr_assert_eq(r.bytes, 0);
    cr_assert_neq(r.status, KVF_OK);
    cr_assert_eq(kvf_store_local_prefix(g_store, &key, 1), 0,
                 "nothing committed");
}

Test(local, a_lease_of_a_huge_offset_is_a_miss)
{
    kvf_key_t key = test_key();
    kvf_local_result_t r;

    g_holder.ent.status = KVF_OK;
    g_holder.ent.offset = UINT64_MAX - 8; /* offset + length wraps */
    g_holder.ent.length = CHUNK;
    r                   = fetch_one(&key);
    cr_assert_eq(r.bytes, 0);
    cr_assert_eq(kvf_store_local_prefix(g_store, &key, 1), 0);
}

Test(local, a_lease_with_a_wrong_checksum_is_refused_and_not_committed)
{
    kvf_key_t key = test_key();
    kvf_local_result_t r;

    memset(g_holder_pool, 0x33, CHUNK);
    g_holder.ent.status   = KVF_OK;
    g_holder.ent.offset   = 0;
    g_holder.ent.length   = CHUNK;
    g_holder.ent.checksum = kvf_chunk_checksum(g_holder_pool, CHUNK) ^ 1;
    r                     = fetch_one(&key);
    cr_assert_eq(r.bytes, 0);
    cr_assert_eq(r.status, KVF_ERR_CHECKSUM);
    cr_assert_eq(kvf_store_local_prefix(g_store, &key, 1), 0);
}

Test(local, an_honest_lease_is_copied_byte_for_byte)
{
    kvf_key_t key = test_key();
    kvf_local_result_t r;
    kvf_slot_t slot;
    kvf_store_owner_t *owner;

    memset(g_holder_pool + CHUNK, 0x77, CHUNK);
    g_holder.ent.status   = KVF_OK;
    g_holder.ent.offset   = CHUNK;
    g_holder.ent.length   = CHUNK;
    g_holder.ent.checksum = kvf_chunk_checksum(g_holder_pool + CHUNK, CHUNK);
    r                     = fetch_one(&key);
    cr_assert_eq(r.status, KVF_OK);
    cr_assert_eq(r.bytes, CHUNK);
    cr_assert_eq(kvf_store_owner_create(g_store, &owner), KVF_OK);
    cr_assert_eq(kvf_store_pin(g_store, owner, &key, &slot), KVF_OK);
    cr_assert_eq(memcmp((uint8_t *)kvf_store_base(g_store) + slot.offset,
                        g_holder_pool + CHUNK, CHUNK),
                 0);
    kvf_store_owner_destroy(g_store, owner);
}
