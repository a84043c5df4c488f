/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-bench disk: the local-disk tier of a real kvf-agent (issue #20)
 * beside fio on the same file system, block size, O_DIRECT and queue
 * depth, in the same run.
 *
 * Write-behind: an engine stores chunks into a pool of 4 x depth chunks
 * and at least 64 MiB, so every further chunk is evicted and written
 * behind; GB/s is the bytes
 * the tier wrote over the time from the first store into the full pool
 * until the last write landed (drops, when the disk cannot keep up, are
 * reported). Read-back:
 * the engine retrieves chunks that are only on disk, depth at a time (one
 * promotion reads them in parallel), each batch announced by a
 * prefetching lookup while the one before it is retrieved; GB/s over the
 * whole phase, p99 of one retrieve. fio runs rw=write and rw=read with
 * ioengine=io_uring, direct=1, bs=SIZE, iodepth=depth on a file in the same
 * directory.
 */
#include "tools/bench/bench.h"

#include "common/time.h"

#include <kvfabric/kvfabric.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define KVF_BENCH_DISK_MAX_SIZES 8
/* The agent's pool: at least 4 batches of depth chunks (one being
 * retrieved, the next being prefetched) and 64 MiB, so that, as in a
 * deployed pool, eviction leaves free blocks and write-behind can keep
 * the evicted ones until they are written (a quarter of the pool) instead
 * of copying them. */
#define KVF_BENCH_DISK_POOL_BATCHES 4ull
#define KVF_BENCH_DISK_POOL_MIN     (64ull << 20)

typedef struct kvf_bench_disk_opts {
    char dir[256];
    uint64_t sizes[KVF_BENCH_DISK_MAX_SIZES];
    unsigned num_sizes;
    uint64_t total; /* bytes stored per size */
    unsigned depth;
    unsigned ahead; /* batches a prefetching lookup announces ahead */
    bool use_fio;
} kvf_bench_disk_opts_t;

typedef struct kvf_bench_disk_result {
    double gbps;
    double busy_gbps; /* bytes over the time the tier had I/O in flight */
    double qd;        /* I/Os in flight on average over that time */
    double p99_us;
    uint64_t drops;
    uint64_t copies; /* writes that copied the chunk first */
} kvf_bench_disk_result_t;

/* fio's bandwidth (GB/s) and clat p99 (us) of one direction; with
 * @p is_batch, in batches of depth I/Os each completed before the next is
 * submitted (the pattern of one retrieve of depth chunks). */
static int kvf_bench_disk_fio(const kvf_bench_disk_opts_t *o, uint64_t size,
                              const char *rw, bool is_batch,
                              kvf_bench_disk_result_t *res)
{
    char batch[96] = "", path[300];

    char cmd[1024], *out = malloc(1 << 20);
    /* the job's section, not its options ("rw" : "write") */
    const char *dir =
        (strcmp(rw, "read") == 0) ? "\"read\" : {" : "\"write\" : {";
    const char *sec, *p;
    uint64_t file = o->total < (1ull << 30) ? o->total : (1ull << 30);
    size_t off    = 0, n;
    FILE *f;

    if (out == NULL) {
        return -1;
    }
    if (is_batch) {
        snprintf(batch, sizeof(batch),
                 " --iodepth_batch_submit=%u --iodepth_batch_complete_min=%u",
                 o->depth, o->depth);
    }
    /* "write" fills a fresh preallocated file, as the tier's first pass
     * fills its fresh preallocated slot file (the file system converts
     * each extent on its first write); "rewrite" writes over written
     * blocks, as the tier does once it reuses slots */
    snprintf(path, sizeof(path), "%s/kvf-bench-fio.dat", o->dir);
    if (strcmp(rw, "write") == 0) {
        unlink(path);
    } else if (strcmp(rw, "rewrite") == 0) {
        rw = "write";
    }
    snprintf(cmd, sizeof(cmd),
             "fio --name=kvf --filename=%s --size=%" PRIu64 " --bs=%" PRIu64
             " --direct=1 --ioengine=io_uring --iodepth=%u --fallocate=native"
             "%s --rw=%s --output-format=json 2>/dev/null",
             path, file, size, o->depth, batch, rw);
    f = popen(cmd, "r");
    if (f == NULL) {
        free(out);
        return -1;
    }
    while ((n = fread(out + off, 1, (1 << 20) - 1 - off, f)) > 0) {
        off += n;
    }
    out[off] = '\0';
    pclose(f);
    sec = strstr(out, dir);
    p   = (sec != NULL) ? strstr(sec, "\"bw_bytes\"") : NULL;
    if (p == NULL) {
        free(out);
        return -1;
    }
    res->gbps = (double)strtoull(strchr(p, ':') + 1, NULL, 10) / 1e9;
    p         = strstr(sec, "\"99.000000\"");
    res->p99_us =
        (p != NULL) ? (double)strtoull(strchr(p, ':') + 1, NULL, 10) / 1e3 : 0;
    free(out);
    return 0;
}

/* The agent's pool: whole batches of depth chunks, at least
 * KVF_BENCH_DISK_POOL_BATCHES of them and KVF_BENCH_DISK_POOL_MIN bytes. */
static uint64_t kvf_bench_disk_pool(const kvf_bench_disk_opts_t *o,
                                    uint64_t size)
{
    uint64_t full = KVF_BENCH_DISK_POOL_BATCHES * o->depth;

    while (full * size < KVF_BENCH_DISK_POOL_MIN) {
        full += o->depth;
    }
    return full * size;
}

/* The device's ceiling from memory like the pool's: io_uring, O_DIRECT,
 * @p size blocks, depth in flight, sequential over a fresh preallocated
 * file ("write"), then over it again ("rewrite") and back ("read"), each
 * I/O from (or into) the next block of a shared-memory region of @p mem
 * bytes, as the tier writes evicted pool blocks and reads into free ones.
 * fio reuses depth buffers of one I/O each, which a virtual disk's host
 * may serve from its CPU caches (on the build VM, 256 KiB writes ran
 * 1.5x faster from 2 MiB than from 64 MiB). GB/s per pass in @p res
 * (write, rewrite, read). */
static int kvf_bench_disk_uring(const kvf_bench_disk_opts_t *o, uint64_t size,
                                uint64_t mem, double res[3])
{
    uint64_t file = o->total < (1ull << 30) ? o->total : (1ull << 30);
    uint64_t nio = file / size, nblk = mem / size, sub, done, t0;
    struct io_uring ring;
    struct io_uring_cqe *cqe;
    struct io_uring_sqe *sqe;
    char path[300];
    uint8_t *buf;
    int fd, mfd, pass, rc = -1;

    if ((nio == 0) || (nblk == 0)) {
        return -1;
    }
    mfd = memfd_create("kvf-bench-disk", MFD_CLOEXEC);
    if ((mfd < 0) || (ftruncate(mfd, (off_t)(nblk * size)) != 0)) {
        if (mfd >= 0) {
            close(mfd);
        }
        return -1;
    }
    buf = mmap(NULL, nblk * size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    close(mfd);
    if (buf == MAP_FAILED) {
        return -1;
    }
    memset(buf, 0x5a, nblk * size);
    snprintf(path, sizeof(path), "%s/kvf-bench-uring.dat", o->dir);
    unlink(path);
    fd = open(path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
    if ((fd < 0) || (fallocate(fd, 0, 0, (off_t)file) != 0) ||
        (io_uring_queue_init(o->depth, &ring, 0) != 0)) {
        goto out;
    }
    for (pass = 0; pass < 3; pass++) {
        t0 = kvf_time_now_ns();
        for (sub = 0, done = 0; done < nio;) {
            while ((sub < nio) && (sub - done < o->depth)) {
                sqe = io_uring_get_sqe(&ring);
                if (pass < 2) {
                    io_uring_prep_write(sqe, fd, buf + (sub % nblk) * size,
                                        (unsigned)size, sub * size);
                } else {
                    io_uring_prep_read(sqe, fd, buf + (sub % nblk) * size,
                                       (unsigned)size, sub * size);
                }
                sub++;
            }
            if ((io_uring_submit(&ring) < 0) ||
                (io_uring_wait_cqe(&ring, &cqe) != 0)) {
                goto out_ring;
            }
            if ((uint64_t)cqe->res != size) {
                io_uring_cqe_seen(&ring, cqe);
                goto out_ring;
            }
            io_uring_cqe_seen(&ring, cqe);
            done++;
        }
        res[pass] = (double)(nio * size) / (double)(kvf_time_now_ns() - t0);
    }
    rc = 0;
out_ring:
    io_uring_queue_exit(&ring);
out:
    if (fd >= 0) {
        close(fd);
    }
    unlink(path);
    munmap(buf, nblk * size);
    return rc;
}

static void kvf_bench_disk_keys(kvf_key_t *keys, uint64_t n, uint64_t salt)
{
    uint64_t i;

    for (i = 0; i < n; i++) {
        keys[i].ns = 0xd15c;
        keys[i].hi = salt;
        keys[i].lo = i;
    }
}

/* The tier's counters of one direction at the start of a pass. */
typedef struct kvf_bench_disk_tally {
    const char *dir; /* "write" or "read" */
    double bytes, busy, ios;
} kvf_bench_disk_tally_t;

static void kvf_bench_disk_tally_start(uint16_t port, const char *dir,
                                       kvf_bench_disk_tally_t *t)
{
    char name[96];

    t->dir = dir;
    snprintf(name, sizeof(name), "kvf_agent_disk_%s_bytes_total", dir);
    t->bytes = kvf_bench_metric(port, name);
    snprintf(name, sizeof(name),
             "kvf_agent_disk_busy_seconds_total{dir=\"%s\"}", dir);
    t->busy = kvf_bench_metric(port, name);
    snprintf(name, sizeof(name),
             "kvf_agent_disk_inflight_seconds_total{dir=\"%s\"}", dir);
    t->ios = kvf_bench_metric(port, name);
}

/* The bytes the tier moved since @p t; busy GB/s and qd into @p res. */
static uint64_t kvf_bench_disk_tally_end(uint16_t port,
                                         const kvf_bench_disk_tally_t *t,
                                         kvf_bench_disk_result_t *res)
{
    kvf_bench_disk_tally_t now;
    double busy;

    kvf_bench_disk_tally_start(port, t->dir, &now);
    busy           = now.busy - t->busy;
    res->busy_gbps = (now.bytes - t->bytes) / (busy * 1e9 + 1);
    res->qd        = (now.ios - t->ios) / (busy + 1e-9);
    return (uint64_t)(now.bytes - t->bytes);
}

/* Stores @p n chunks of @p keys through @p c into the full pool, so that
 * every store evicts and the tier writes behind; GB/s of what the tier
 * wrote from the first store into the full pool until its last write
 * landed (nothing pending), busy GB/s and drops of this pass only. */
static int kvf_bench_disk_store(kvf_client_t *c, const kvf_bench_disk_opts_t *o,
                                uint64_t size, const kvf_key_t *keys,
                                uint64_t n, uint64_t full, uint16_t port,
                                kvf_bench_disk_result_t *w)
{
    kvf_slot_t *slots = calloc(o->depth, sizeof(*slots));
    uint64_t *sums    = calloc(o->depth, sizeof(*sums));
    uint8_t *base     = kvf_client_pool_base(c);
    uint64_t b, i, t0 = 0, t1, drops0, copies0;
    kvf_bench_disk_tally_t tally;
    int rc = -1;

    if ((slots == NULL) || (sums == NULL)) {
        goto out;
    }
    drops0 =
        (uint64_t)kvf_bench_metric(port, "kvf_agent_disk_write_drops_total");
    copies0 =
        (uint64_t)kvf_bench_metric(port, "kvf_agent_disk_write_copies_total");
    kvf_bench_disk_tally_start(port, "write", &tally);
    for (b = 0; b < n; b += o->depth) {
        if (b == full) {
            t0 = kvf_time_now_ns();
        }
        if (kvf_client_alloc(c, size, o->depth, slots) != KVF_OK) {
            fprintf(stderr, "alloc: %s\n", kvf_client_last_error(c));
            goto out;
        }
        for (i = 0; i < o->depth; i++) {
            uint8_t *p = base + slots[i].offset;

            memset(p, (int)(b + i), size);
            memcpy(p, &keys[b + i].lo, sizeof(uint64_t));
            sums[i] = kvf_chunk_checksum(p, size);
        }
        if (kvf_client_commit(c, keys + b, slots, sums, o->depth) != KVF_OK) {
            fprintf(stderr, "commit: %s\n", kvf_client_last_error(c));
            goto out;
        }
    }
    /* evictions hand their chunk to the tier at once (staged or dropped):
     * done when nothing is staged or on the device */
    while ((uint64_t)kvf_bench_metric(port, "kvf_agent_disk_writes_pending") >
           0) {
        usleep(200);
    }
    t1 = kvf_time_now_ns();
    w->copies =
        (uint64_t)kvf_bench_metric(port, "kvf_agent_disk_write_copies_total") -
        copies0;
    w->drops =
        (uint64_t)kvf_bench_metric(port, "kvf_agent_disk_write_drops_total") -
        drops0;
    w->gbps =
        (double)kvf_bench_disk_tally_end(port, &tally, w) / (double)(t1 - t0);
    w->p99_us = 0;
    rc        = 0;

out:
    free(slots);
    free(sums);
    return rc;
}

/* The tier's three passes for one chunk size: the first fill (@p w), the
 * read-back of chunks only on disk (@p r), and a rewrite with new keys
 * over slots written before (@p rw). */
static int kvf_bench_disk_one(const kvf_bench_disk_opts_t *o, uint64_t size,
                              kvf_bench_disk_result_t *w,
                              kvf_bench_disk_result_t *r,
                              kvf_bench_disk_result_t *rw)
{
    uint64_t n = o->total / size, i, b, k;
    uint64_t full, pool;
    uint64_t slot                = size + 4096, t0, t1, end, start, *lat;
    kvf_bench_disk_tally_t tally = {0};
    kvf_lookup_result_t res;
    char sock[300], tier[300], log[300], bin[4096], http[32], pool_s[32],
        chunk_s[32], disk_s[32], depth_s[16];
    kvf_slot_t *slots = calloc(o->depth, sizeof(*slots));
    bool *missing     = calloc(o->depth, sizeof(*missing));
    kvf_key_t *keys, *keys2;
    kvf_client_t *c;
    uint16_t port = kvf_bench_free_port();
    uint32_t nlat = 0;
    pid_t pid;
    int rc = -1;

    pool = kvf_bench_disk_pool(o, size);
    full = pool / size;
    if (n < 3 * full) {
        n = 3 * full; /* a pool's worth to fill, and two to read back */
    }
    n -= n % o->depth;
    keys  = calloc(n, sizeof(*keys));
    keys2 = calloc(n, sizeof(*keys2));
    lat   = calloc(n, sizeof(*lat));
    if ((slots == NULL) || (missing == NULL) || (keys == NULL) ||
        (keys2 == NULL) || (lat == NULL)) {
        goto out;
    }
    kvf_bench_disk_keys(keys, n, size);
    kvf_bench_disk_keys(keys2, n, size + 1);
    snprintf(sock, sizeof(sock), "%s/kvf-bench-disk.sock", o->dir);
    snprintf(tier, sizeof(tier), "%s/kvf-bench-disk.tier", o->dir);
    snprintf(log, sizeof(log), "%s/kvf-bench-disk.log", o->dir);
    snprintf(http, sizeof(http), "127.0.0.1:%u", port);
    snprintf(pool_s, sizeof(pool_s), "%" PRIu64, pool);
    snprintf(chunk_s, sizeof(chunk_s), "%" PRIu64, size);
    snprintf(disk_s, sizeof(disk_s), "%" PRIu64, 4096 + (n + 4) * slot);
    snprintf(depth_s, sizeof(depth_s), "%u", o->depth);
    kvf_bench_sibling_path("agent/kvf-agent", bin, sizeof(bin));
    fflush(stdout); /* the child must not print our buffer again */
    unlink(tier);
    {
        const char *argv[] = {bin,           "--controller",
                              "127.0.0.1:1", "--listen",
                              "127.0.0.1:0", "--name",
                              "bench-disk",  "--socket",
                              sock,          "--http",
                              http,          "--pool-size",
                              pool_s,        "--max-chunk",
                              chunk_s,       "--disk-path",
                              tier,          "--disk-size",
                              disk_s,        "--disk-queue-depth",
                              depth_s,       NULL};

        pid = kvf_bench_spawn(argv, log);
    }
    c = kvf_bench_connect(sock, 20 * KVF_NSEC_PER_SEC);
    if (c == NULL) {
        fprintf(stderr, "kvf-bench disk: agent did not start (log %s)\n", log);
        goto out_stop;
    }

    /* write-behind into the fresh (preallocated) slot file */
    if (kvf_bench_disk_store(c, o, size, keys, n, full, port, w) != 0) {
        goto out_disconnect;
    }

    /* read-back: the oldest chunks are only on disk. As an engine loads
     * them: a prefetching lookup of the next batch goes out before the
     * retrieve of this one (the lookup is a promise, its reads start at
     * once), so the tier has the next reads queued while this batch is
     * answered and released. The first pool's worth of reads evicts the
     * last chunks stored, which are not on disk yet: their write-behind
     * would compete with the reads, so the clock starts after them (from
     * then on an eviction drops a chunk the tier has). Only the chunks
     * the tier wrote are read back: an engine that stores faster than the
     * disk writes has some evictions dropped (w->drops), and a retrieve of
     * those would time misses, not reads. */
    t0 = 0;
    for (i = 0, end = 0; i < n - full; i++) {
        if (kvf_client_lookup(c, keys + i, 1, false, &res) != KVF_OK) {
            fprintf(stderr, "lookup: %s\n", kvf_client_last_error(c));
            goto out_disconnect;
        }
        if (res.local_chunks == 1) {
            keys[end++] = keys[i];
        }
    }
    end -= end % o->depth;
    start = (full < end / 2) ? full : (end / 2) - (end / 2) % o->depth;
    for (b = 0; (b < o->ahead * o->depth) && (b + o->depth <= end);
         b += o->depth) {
        if (kvf_client_lookup(c, keys + b, o->depth, true, &res) != KVF_OK) {
            fprintf(stderr, "lookup: %s\n", kvf_client_last_error(c));
            goto out_disconnect;
        }
    }
    for (b = 0; b + o->depth <= end; b += o->depth) {
        uint64_t s;

        if (b == start) {
            while ((uint64_t)kvf_bench_metric(
                       port, "kvf_agent_disk_writes_pending") > 0) {
                usleep(200);
            }
            t0 = kvf_time_now_ns();
            kvf_bench_disk_tally_start(port, "read", &tally);
            nlat = 0;
        }
        if ((b + (o->ahead + 1ull) * o->depth <= end) &&
            (kvf_client_lookup(c, keys + b + o->ahead * o->depth, o->depth,
                               true, &res) != KVF_OK)) {
            fprintf(stderr, "lookup: %s\n", kvf_client_last_error(c));
            goto out_disconnect;
        }
        s = kvf_time_now_ns();
        if (kvf_client_retrieve(c, keys + b, o->depth, slots, missing) !=
            KVF_OK) {
            fprintf(stderr, "retrieve: %s\n", kvf_client_last_error(c));
            goto out_disconnect;
        }
        lat[nlat++] = kvf_time_now_ns() - s;
        /* one release for the batch, as an engine does (one request per
         * chunk was the bench's own cost, not the tier's) */
        for (i = 0, k = 0; i < o->depth; i++) {
            if (!missing[i]) {
                slots[k++] = slots[i];
            }
        }
        if (k > 0) {
            kvf_client_release(c, slots, (uint32_t)k);
        }
    }
    t1 = kvf_time_now_ns();
    r->gbps =
        (double)kvf_bench_disk_tally_end(port, &tally, r) / (double)(t1 - t0);
    r->p99_us = (double)kvf_bench_percentile(lat, nlat, 99.0) / 1e3;
    r->drops  = 0;

    /* rewrite: new keys; the full tier reuses its least recently used
     * slots, written once already (the steady state of a long-running
     * agent) */
    if (kvf_bench_disk_store(c, o, size, keys2, n, full, port, rw) != 0) {
        goto out_disconnect;
    }
    rc = 0;

out_disconnect:
    kvf_client_disconnect(c);
out_stop:
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    unlink(tier);
out:
    free(slots);
    free(missing);
    free(keys);
    free(keys2);
    free(lat);
    return rc;
}

static double kvf_bench_disk_ratio(double a, double b)
{
    return b > 0 ? a / b : 0;
}

/* One line of the table: the tier's pass @p t beside fio's @p f and the
 * io_uring ceiling from pool-sized memory @p mem (GB/s). */
static void kvf_bench_disk_row(uint64_t size, const char *dir,
                               const kvf_bench_disk_result_t *t,
                               const kvf_bench_disk_result_t *f, double mem)
{
    bool is_read = (strncmp(dir, "read", 4) == 0);
    char p99[32] = "-", drops[32] = "-", copies[32] = "-";

    if (is_read) {
        snprintf(p99, sizeof(p99), "%.0f", t->p99_us);
    } else {
        snprintf(drops, sizeof(drops), "%" PRIu64, t->drops);
        snprintf(copies, sizeof(copies), "%" PRIu64, t->copies);
    }
    printf("%-8" PRIu64 " %-7s %9.2f %9.2f %5.1f %9.2f %9.2f %9.2f %9.2f %9.2f "
           "%10s %10.0f %6s %6s\n",
           size >> 10, dir, t->gbps, t->busy_gbps, t->qd, f->gbps,
           kvf_bench_disk_ratio(t->gbps, f->gbps),
           kvf_bench_disk_ratio(t->busy_gbps, f->gbps), mem,
           kvf_bench_disk_ratio(t->gbps, mem), p99, f->p99_us, drops, copies);
}

static uint64_t kvf_bench_disk_parse_size(const char *s)
{
    char *end;
    uint64_t v = strtoull(s, &end, 10);

    switch (*end) {
    case 'K':
    case 'k':
        return v << 10;
    case 'M':
    case 'm':
        return v << 20;
    case 'G':
    case 'g':
        return v << 30;
    default:
        return v;
    }
}

static void kvf_bench_disk_usage(FILE *out)
{
    fprintf(out, "usage: kvf-bench disk [--dir DIR] [--sizes 256K,1M,4M,32M] "
                 "[--total BYTES] [--depth N] [--no-fio]\n"
                 "  the agent's disk tier vs fio (io_uring, O_DIRECT, same bs "
                 "and queue depth) on DIR (default /var/tmp)\n");
}

int kvf_bench_disk_main(int argc, char **argv)
{
    kvf_bench_disk_opts_t o = {
        .total = 1ull << 30, .depth = 8, .ahead = 2, .use_fio = true};
    kvf_bench_disk_result_t w, r, rw, fw, fr, fb, frw;
    double mem[3];
    char *list, *tok, *save = NULL;
    unsigned s;
    int i;

    snprintf(o.dir, sizeof(o.dir), "/var/tmp");
    o.sizes[0]  = 256ull << 10;
    o.sizes[1]  = 1ull << 20;
    o.sizes[2]  = 4ull << 20;
    o.sizes[3]  = 32ull << 20;
    o.num_sizes = 4;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];

        if ((strcmp(a, "--help") == 0) || (strcmp(a, "-h") == 0)) {
            kvf_bench_disk_usage(stdout);
            return 0;
        } else if (strcmp(a, "--no-fio") == 0) {
            o.use_fio = false;
        } else if (i + 1 >= argc) {
            kvf_bench_disk_usage(stderr);
            return 2;
        } else if (strcmp(a, "--dir") == 0) {
            snprintf(o.dir, sizeof(o.dir), "%s", argv[++i]);
        } else if (strcmp(a, "--total") == 0) {
            o.total = kvf_bench_disk_parse_size(argv[++i]);
        } else if (strcmp(a, "--ahead") == 0) {
            o.ahead = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (strcmp(a, "--depth") == 0) {
            o.depth = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (strcmp(a, "--sizes") == 0) {
            list        = argv[++i];
            o.num_sizes = 0;
            for (tok = strtok_r(list, ",", &save);
                 (tok != NULL) && (o.num_sizes < KVF_BENCH_DISK_MAX_SIZES);
                 tok = strtok_r(NULL, ",", &save)) {
                o.sizes[o.num_sizes++] = kvf_bench_disk_parse_size(tok);
            }
        } else {
            kvf_bench_disk_usage(stderr);
            return 2;
        }
    }
    if ((o.depth == 0) || (o.num_sizes == 0)) {
        kvf_bench_disk_usage(stderr);
        return 2;
    }
    printf("# kvf-bench disk: dir %s, depth %u, %" PRIu64
           " MiB per size, fio %s\n",
           o.dir, o.depth, o.total >> 20, o.use_fio ? "on" : "off");
    /* tier GB/s: end to end (an engine storing, or retrieving batches of
     * depth chunks); busy GB/s: the same bytes over the time the tier had
     * I/O in flight, the figure to hold against fio's (which always has);
     * qd: the tier's I/Os in flight on average over that time; mem GB/s:
     * the device from pool-sized memory (kvf_bench_disk_uring) */
    printf("%-8s %-7s %9s %9s %5s %9s %9s %9s %9s %9s %10s %10s %6s %6s\n",
           "KiB", "dir", "tier GB/s", "busy GB/s", "qd", "fio GB/s", "ratio",
           "busy/fio", "mem GB/s", "tier/mem", "tier p99us", "fio p99us",
           "drops", "copies");
    for (s = 0; s < o.num_sizes; s++) {
        memset(&fw, 0, sizeof(fw));
        memset(&fr, 0, sizeof(fr));
        memset(&fb, 0, sizeof(fb));
        memset(&frw, 0, sizeof(frw));
        if (kvf_bench_disk_one(&o, o.sizes[s], &w, &r, &rw) != 0) {
            return 1;
        }
        if (o.use_fio &&
            ((kvf_bench_disk_fio(&o, o.sizes[s], "write", false, &fw) != 0) ||
             (kvf_bench_disk_fio(&o, o.sizes[s], "read", false, &fr) != 0) ||
             (kvf_bench_disk_fio(&o, o.sizes[s], "read", true, &fb) != 0) ||
             (kvf_bench_disk_fio(&o, o.sizes[s], "rewrite", false, &frw) !=
              0))) {
            fprintf(stderr, "kvf-bench disk: fio failed or is missing "
                            "(apt install fio); --no-fio skips it\n");
            o.use_fio = false;
        }
        if (kvf_bench_disk_uring(&o, o.sizes[s],
                                 kvf_bench_disk_pool(&o, o.sizes[s]),
                                 mem) != 0) {
            fprintf(stderr,
                    "kvf-bench disk: the io_uring ceiling failed "
                    "on %s\n",
                    o.dir);
            memset(mem, 0, sizeof(mem));
        }
        kvf_bench_disk_row(o.sizes[s], "write", &w, &fw, mem[0]);
        kvf_bench_disk_row(o.sizes[s], "rewrite", &rw, &frw, mem[1]);
        kvf_bench_disk_row(o.sizes[s], "read", &r, &fr, mem[2]);
        /* the same reads against fio in retrieve-sized batches */
        kvf_bench_disk_row(o.sizes[s], "read/b", &r, &fb, mem[2]);
        fflush(stdout);
    }
    if (o.use_fio) {
        char path[300];

        snprintf(path, sizeof(path), "%s/kvf-bench-fio.dat", o.dir);
        unlink(path);
    }
    return 0;
}
