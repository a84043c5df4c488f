/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/disk.h"

#include "agent/config.h"
#include "agent/store.h"
#include "common/log.h"
#include "common/prom.h"
#include "common/time.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <liburing.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define KVF_DISK_ALIGN        4096u
#define KVF_DISK_HEADER_MAGIC 0x3152494b53444b56ull /* "VKDSKIR1" */
#define KVF_DISK_RECORD_MAGIC 0x3143455244464b56ull /* "VKFDREC1" */
#define KVF_DISK_VERSION      1u
#define KVF_DISK_NONE         UINT32_MAX
/* Writes accepted per write in flight, of each kind: evictions come in
 * bursts (an engine's allocation evicts a batch at once), and a burst that
 * arrives while the previous one is on the device waits queued and goes
 * out as writes land: the device queue stays at queue_depth
 * (docs/performance.md, "Local-disk tier"). A copying write owns a staging
 * buffer (record + slot); an in-place write only a 4 KiB record buffer,
 * its bytes stay where the caller has them (the evicted pool block). */
#define KVF_DISK_WRITES_PER_SLOT 2u
/* Reads accepted per read in flight: past queue_depth in flight they wait
 * in order (a peer's fetch of 32 keys on disk, an engine's retrieve and a
 * prefetch at once) instead of failing as misses. */
#define KVF_DISK_READS_PER_SLOT 4u
/* A chunk asked for (kvf_disk_want) is passed over by disk eviction this
 * long: a requester told busy asks again within 16 ms, an engine's
 * promotion starts its reads at once. */
#define KVF_DISK_WANTED_MS 1000u

/* On-disk structures, host byte order (the file never leaves its host). */
typedef struct kvf_disk_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size;
    uint64_t slot_size;
    uint64_t slot_count;
    uint64_t epoch; /* records of another epoch are ignored */
    uint64_t sum;   /* kvf_chunk_checksum of the fields above */
} kvf_disk_header_t;

typedef struct kvf_disk_record {
    uint64_t magic;
    uint64_t epoch;
    uint64_t seq; /* newer wins when a key is found twice */
    uint64_t ns, hi, lo;
    uint64_t length;
    uint64_t checksum; /* the chunk's commit checksum */
    uint64_t sum;      /* kvf_chunk_checksum of the fields above */
} kvf_disk_record_t;

typedef enum {
    KVF_DISK_SLOT_FREE    = 0,
    KVF_DISK_SLOT_WRITING = 1, /* write queued or in flight: bytes at its
                                  op's src */
    KVF_DISK_SLOT_VALID = 2,
} kvf_disk_slot_state_t;

typedef struct kvf_disk_slot {
    kvf_key_t key;
    uint64_t length;
    uint64_t checksum;
    uint64_t seq;
    uint32_t prev, next; /* LRU list (VALID), free list (FREE, next) */
    uint32_t op;         /* WRITING: its write op */
    uint32_t wanted_ms;  /* kvf_disk_want's clock (ms, 0: never) */
    uint16_t readers;    /* reads in flight: not evictable */
    uint8_t state;
} kvf_disk_slot_t;

typedef struct kvf_disk_op {
    bool is_write;
    uint32_t slot;
    uint32_t next_free;
    bool has_staging;    /* write: buf is record + a slot of data */
    bool in_place;       /* write: src is the caller's (written_cb) */
    uint8_t *buf;        /* write: record (and staging) buffer */
    const void *src;     /* write: the bytes (staging, or the caller's) */
    struct iovec iov[2]; /* write: record, then the bytes */
    void *dst;           /* read: destination */
    kvf_disk_read_cb_t cb;
    void *arg;
    int res; /* reaped: the completion's result */
} kvf_disk_op_t;

/* Ops in order, linked through next_free (an op is in one list at a
 * time: free, waiting, or reaped). */
typedef struct kvf_disk_fifo {
    uint32_t head, tail; /* KVF_DISK_NONE: empty */
} kvf_disk_fifo_t;

struct kvf_disk {
    char *path;
    int fd;
    bool is_direct;
    uint64_t slot_size;  /* data bytes per slot, multiple of 4 KiB */
    uint64_t stride;     /* record + data */
    uint32_t slot_count; /* slots; index slot_count is the LRU sentinel */
    uint64_t epoch;
    uint64_t seq;
    kvf_disk_slot_t *slots;
    uint32_t free_head;
    uint32_t *table; /* key -> slot, open addressing */
    uint32_t table_mask;
    unsigned depth;     /* writes, and reads, in flight at most */
    unsigned nstaging;  /* copying write ops (staging buffers) */
    unsigned nwrites;   /* write ops: nstaging, then in-place only */
    unsigned nreads;    /* read ops */
    kvf_disk_op_t *ops; /* nwrites writes then nreads reads */
    uint8_t *staging;   /* nstaging x (record + slot) */
    uint8_t *records;   /* a 4 KiB record buffer per in-place-only op */
    uint32_t free_copies, free_writes, free_reads;
    kvf_disk_fifo_t staged; /* writes waiting for the device */
    kvf_disk_fifo_t queued; /* reads waiting for the device */
    kvf_disk_fifo_t reaped; /* off the device, not finished */
    unsigned writes_inflight;
    unsigned writes_pending; /* staged or in flight */
    unsigned reads_inflight;
    uint64_t write_busy_since, read_busy_since; /* ns, while in flight */
    uint64_t depth_since; /* ns, the last change of what is in flight */
    unsigned inflight;
    unsigned unsubmitted;
    unsigned faults;
    struct io_uring ring;
    bool has_ring;
    int efd;
    struct event *efd_ev, *submit_ev;
    kvf_disk_key_cb_t stored_cb, dropped_cb;
    kvf_disk_written_cb_t written_cb;
    void *cb_arg;
    kvf_disk_stats_t st;
};

static uint64_t kvf_disk_round(uint64_t n)
{
    return (n + KVF_DISK_ALIGN - 1) & ~(uint64_t)(KVF_DISK_ALIGN - 1);
}

static void kvf_disk_fifo_push(kvf_disk_t *disk, kvf_disk_fifo_t *q,
                               kvf_disk_op_t *op)
{
    uint32_t i = (uint32_t)(op - disk->ops);

    op->next_free = KVF_DISK_NONE;
    if (q->tail == KVF_DISK_NONE) {
        q->head = i;
    } else {
        disk->ops[q->tail].next_free = i;
    }
    q->tail = i;
}

/* The first op of @p q, taken off it; NULL when empty. */
static kvf_disk_op_t *kvf_disk_fifo_pop(kvf_disk_t *disk, kvf_disk_fifo_t *q)
{
    kvf_disk_op_t *op;

    if (q->head == KVF_DISK_NONE) {
        return NULL;
    }
    op      = &disk->ops[q->head];
    q->head = op->next_free;
    if (q->head == KVF_DISK_NONE) {
        q->tail = KVF_DISK_NONE;
    }
    return op;
}

static uint64_t kvf_disk_slot_offset(const kvf_disk_t *disk, uint32_t slot)
{
    return KVF_DISK_ALIGN + (uint64_t)slot * disk->stride;
}

/* ---- key index --------------------------------------------------------- */

static uint32_t kvf_disk_hash(const kvf_key_t *key)
{
    uint64_t h = key->lo ^ (key->hi * 0x9e3779b97f4a7c15ull) ^
                 (key->ns * 0xff51afd7ed558ccdull);

    h ^= h >> 33;
    return (uint32_t)h;
}

static bool kvf_disk_key_eq(const kvf_key_t *a, const kvf_key_t *b)
{
    return (a->ns == b->ns) && (a->hi == b->hi) && (a->lo == b->lo);
}

static uint32_t *kvf_disk_index_find(const kvf_disk_t *disk,
                                     const kvf_key_t *key)
{
    uint32_t i = kvf_disk_hash(key) & disk->table_mask;

    while (disk->table[i] != KVF_DISK_NONE) {
        if (kvf_disk_key_eq(&disk->slots[disk->table[i]].key, key)) {
            return &disk->table[i];
        }
        i = (i + 1) & disk->table_mask;
    }
    return NULL;
}

static void kvf_disk_index_insert(kvf_disk_t *disk, uint32_t slot)
{
    uint32_t i = kvf_disk_hash(&disk->slots[slot].key) & disk->table_mask;

    /* the table has twice as many cells as there are slots: never full */
    while (disk->table[i] != KVF_DISK_NONE) {
        i = (i + 1) & disk->table_mask;
    }
    disk->table[i] = slot;
}

static void kvf_disk_index_delete(kvf_disk_t *disk, uint32_t *cell)
{
    uint32_t i = (uint32_t)(cell - disk->table), j = i, home;

    disk->table[i] = KVF_DISK_NONE;
    for (;;) {
        j = (j + 1) & disk->table_mask;
        if (disk->table[j] == KVF_DISK_NONE) {
            return;
        }
        home =
            kvf_disk_hash(&disk->slots[disk->table[j]].key) & disk->table_mask;
        if (((j > i) && ((home <= i) || (home > j))) ||
            ((j < i) && ((home <= i) && (home > j)))) {
            disk->table[i] = disk->table[j];
            disk->table[j] = KVF_DISK_NONE;
            i              = j;
        }
    }
}

/* ---- LRU and free list ------------------------------------------------- */

static void kvf_disk_lru_unlink(kvf_disk_t *disk, uint32_t slot)
{
    kvf_disk_slot_t *s = &disk->slots[slot];

    disk->slots[s->prev].next = s->next;
    disk->slots[s->next].prev = s->prev;
}

static void kvf_disk_lru_push(kvf_disk_t *disk, uint32_t slot)
{
    uint32_t head             = disk->slot_count;
    kvf_disk_slot_t *s        = &disk->slots[slot];
    s->prev                   = head;
    s->next                   = disk->slots[head].next;
    disk->slots[s->next].prev = slot;
    disk->slots[head].next    = slot;
}

static void kvf_disk_slot_free(kvf_disk_t *disk, uint32_t slot)
{
    kvf_disk_slot_t *s = &disk->slots[slot];

    if (s->state == KVF_DISK_SLOT_VALID) {
        kvf_disk_lru_unlink(disk, slot);
    }
    disk->st.used_slots--;
    disk->st.used_bytes -= s->length;
    s->state        = KVF_DISK_SLOT_FREE;
    s->next         = disk->free_head;
    disk->free_head = slot;
}

/* Drops a readable slot from the index and tells the owner. */
static void kvf_disk_slot_drop(kvf_disk_t *disk, uint32_t slot)
{
    kvf_disk_slot_t *s = &disk->slots[slot];
    kvf_key_t key      = s->key;
    uint32_t *cell     = kvf_disk_index_find(disk, &key);

    if (cell != NULL) {
        kvf_disk_index_delete(disk, cell);
    }
    kvf_disk_slot_free(disk, slot);
    if (disk->dropped_cb != NULL) {
        disk->dropped_cb(disk->cb_arg, &key);
    }
}

static bool kvf_disk_is_wanted(const kvf_disk_slot_t *s, uint32_t now_ms)
{
    return (s->wanted_ms != 0) &&
           ((uint32_t)(now_ms - s->wanted_ms) < KVF_DISK_WANTED_MS);
}

static uint32_t kvf_disk_slot_take(kvf_disk_t *disk)
{
    uint32_t slot = disk->free_head;
    uint32_t now_ms, spared = 0;

    if (slot != KVF_DISK_NONE) {
        disk->free_head = disk->slots[slot].next;
        return slot;
    }
    /* full: the least recently used slot no read is using and nobody
     * asked for just now (a read-back that makes room in the pool spills
     * chunks here: they must not push out the chunks being read back).
     * Asks protect three quarters of the tier at most: a peer asking for
     * every key cannot stop write-behind */
    now_ms = (uint32_t)kvf_time_now_ms();
    for (slot = disk->slots[disk->slot_count].prev; slot != disk->slot_count;
         slot = disk->slots[slot].prev) {
        if ((spared < disk->slot_count / 4 * 3) &&
            kvf_disk_is_wanted(&disk->slots[slot], now_ms)) {
            spared++;
            disk->st.evictions_spared++;
            continue;
        }
        if (disk->slots[slot].readers == 0) {
            disk->st.evictions++;
            kvf_disk_slot_drop(disk, slot);
            disk->free_head = disk->slots[slot].next;
            return slot;
        }
    }
    return KVF_DISK_NONE;
}

/* ---- submission and completion ----------------------------------------- */

/* Adds what was in flight since the last change, times its duration, to
 * the tier's I/O time: over its busy time, the device's average queue. */
static void kvf_disk_account(kvf_disk_t *disk, uint64_t now)
{
    uint64_t dt = now - disk->depth_since;

    disk->st.write_inflight_ns += dt * disk->writes_inflight;
    disk->st.read_inflight_ns += dt * disk->reads_inflight;
    disk->depth_since = now;
}

static void kvf_disk_schedule(kvf_disk_t *disk)
{
    disk->unsubmitted++;
    disk->inflight++;
    if ((disk->submit_ev != NULL) && (disk->unsubmitted == 1)) {
        event_active(disk->submit_ev, 0, 0);
    }
}

/* Hands staged writes to the ring while fewer than depth are in flight. */
static void kvf_disk_issue_writes(kvf_disk_t *disk)
{
    struct io_uring_sqe *sqe;
    kvf_disk_op_t *op;
    uint64_t now;

    while ((disk->writes_inflight < disk->depth) &&
           (disk->staged.head != KVF_DISK_NONE)) {
        op = kvf_disk_fifo_pop(disk, &disk->staged);
        /* the ring has room for depth writes + depth reads; record and
         * bytes go out in one write, straight from where they are */
        sqe                 = io_uring_get_sqe(&disk->ring);
        op->iov[0].iov_base = op->buf;
        op->iov[0].iov_len  = KVF_DISK_ALIGN;
        op->iov[1].iov_base = (void *)(uintptr_t)op->src;
        op->iov[1].iov_len  = kvf_disk_round(disk->slots[op->slot].length);
        io_uring_prep_writev(sqe, disk->fd, op->iov, 2,
                             kvf_disk_slot_offset(disk, op->slot));
        io_uring_sqe_set_data(sqe, op);
        now = kvf_time_now_ns();
        kvf_disk_account(disk, now);
        if (disk->writes_inflight++ == 0) {
            disk->write_busy_since = now;
        }
        kvf_disk_schedule(disk);
    }
}

/* Hands queued reads to the ring while fewer than depth are in flight. */
static void kvf_disk_issue_reads(kvf_disk_t *disk)
{
    struct io_uring_sqe *sqe;
    kvf_disk_slot_t *s;
    kvf_disk_op_t *op;
    uint64_t now;

    while ((disk->reads_inflight < disk->depth) &&
           (disk->queued.head != KVF_DISK_NONE)) {
        op  = kvf_disk_fifo_pop(disk, &disk->queued);
        s   = &disk->slots[op->slot];
        sqe = io_uring_get_sqe(&disk->ring);
        io_uring_prep_read(
            sqe, disk->fd, op->dst, (unsigned)kvf_disk_round(s->length),
            kvf_disk_slot_offset(disk, op->slot) + KVF_DISK_ALIGN);
        io_uring_sqe_set_data(sqe, op);
        now = kvf_time_now_ns();
        kvf_disk_account(disk, now);
        if (disk->reads_inflight++ == 0) {
            disk->read_busy_since = now;
        }
        kvf_disk_schedule(disk);
    }
}

static void kvf_disk_submit(kvf_disk_t *disk)
{
    int ret;

    if (disk->unsubmitted == 0) {
        return;
    }
    ret = io_uring_submit(&disk->ring);
    if (ret < 0) {
        /* the entries stay queued; the next turn tries again */
        kvf_warn("disk tier %s: io_uring_submit failed: %s", disk->path,
                 strerror(-ret));
        return;
    }
    disk->unsubmitted = 0;
}

/* A write op back to the free list of its kind. */
static void kvf_disk_write_op_put(kvf_disk_t *disk, kvf_disk_op_t *op)
{
    uint32_t *list = op->has_staging ? &disk->free_copies : &disk->free_writes;

    op->src       = NULL;
    op->next_free = *list;
    *list         = (uint32_t)(op - disk->ops);
}

static void kvf_disk_complete_write(kvf_disk_t *disk, kvf_disk_op_t *op,
                                    int res)
{
    kvf_disk_slot_t *s = &disk->slots[op->slot];
    uint64_t want      = KVF_DISK_ALIGN + kvf_disk_round(s->length);
    const void *src    = op->src;

    if (disk->faults & KVF_DISK_FAULT_WRITE_EIO) {
        disk->faults &= ~(unsigned)KVF_DISK_FAULT_WRITE_EIO;
        res = -EIO;
    }
    s->op = KVF_DISK_NONE;
    if ((res < 0) || ((uint64_t)res != want)) {
        disk->st.write_errors++;
        kvf_warn("disk tier %s: write of chunk %016" PRIx64 "%016" PRIx64
                 " to slot %u failed: %s",
                 disk->path, s->key.hi, s->key.lo, op->slot,
                 res < 0 ? strerror(-res) : "short write");
        kvf_disk_slot_drop(disk, op->slot);
    } else {
        disk->st.writes++;
        disk->st.write_bytes += s->length;
        s->state = KVF_DISK_SLOT_VALID;
        kvf_disk_lru_push(disk, op->slot);
        if (disk->stored_cb != NULL) {
            disk->stored_cb(disk->cb_arg, &s->key);
        }
    }
    kvf_disk_write_op_put(disk, op);
    disk->writes_pending--;
    if (op->in_place && (disk->written_cb != NULL)) {
        disk->written_cb(disk->cb_arg, src); /* the bytes are the caller's */
    }
    kvf_disk_issue_writes(disk);
}

static void kvf_disk_complete_read(kvf_disk_t *disk, kvf_disk_op_t *op, int res)
{
    kvf_disk_slot_t *s = &disk->slots[op->slot];
    kvf_key_t key      = s->key;
    uint64_t length = s->length, checksum = s->checksum;
    kvf_disk_read_cb_t cb = op->cb;
    void *arg             = op->arg;
    kvf_status_t status   = KVF_OK;

    if (disk->faults & KVF_DISK_FAULT_READ_EIO) {
        disk->faults &= ~(unsigned)KVF_DISK_FAULT_READ_EIO;
        res = -EIO;
    }
    s->readers--;
    if ((res < 0) || ((uint64_t)res < length)) {
        disk->st.read_errors++;
        kvf_warn("disk tier %s: read of chunk %016" PRIx64 "%016" PRIx64
                 " from slot %u failed: %s",
                 disk->path, key.hi, key.lo, op->slot,
                 res < 0 ? strerror(-res) : "short read");
        status = KVF_ERR_IO;
    } else if (kvf_chunk_checksum(op->dst, length) != checksum) {
        /* damaged, or torn by a crash between data and record */
        disk->st.checksum_failures++;
        kvf_debug("disk tier %s: chunk %016" PRIx64 "%016" PRIx64
                  " in slot %u failed its checksum: dropped",
                  disk->path, key.hi, key.lo, op->slot);
        status = KVF_ERR_CHECKSUM;
    } else {
        disk->st.reads++;
        disk->st.read_bytes += length;
        kvf_disk_lru_unlink(disk, op->slot);
        kvf_disk_lru_push(disk, op->slot);
    }
    if ((status != KVF_OK) && (s->readers == 0)) {
        kvf_disk_slot_drop(disk, op->slot);
    }
    op->next_free    = disk->free_reads;
    disk->free_reads = (uint32_t)(op - disk->ops);
    kvf_disk_issue_reads(disk);
    cb(arg, &key, status, length, checksum);
}

/* Takes @p op off the device: the next queued I/O of its kind may go. */
static void kvf_disk_reap(kvf_disk_t *disk, kvf_disk_op_t *op, uint64_t now)
{
    kvf_disk_account(disk, now);
    disk->inflight--;
    if (op->is_write) {
        if (--disk->writes_inflight == 0) {
            disk->st.write_busy_ns += now - disk->write_busy_since;
        }
    } else if (--disk->reads_inflight == 0) {
        disk->st.read_busy_ns += now - disk->read_busy_since;
    }
}

/* Takes every finished I/O off the device, onto the reaped list (not
 * finished yet: no callback runs). */
static unsigned kvf_disk_reap_all(kvf_disk_t *disk)
{
    struct io_uring_cqe *cqe;
    kvf_disk_op_t *op;
    unsigned n = 0;
    uint64_t now;

    if ((disk->inflight == 0) || (io_uring_cq_ready(&disk->ring) == 0)) {
        return 0;
    }
    now = kvf_time_now_ns();
    while ((disk->inflight > 0) &&
           (io_uring_peek_cqe(&disk->ring, &cqe) == 0)) {
        op      = io_uring_cqe_get_data(cqe);
        op->res = cqe->res;
        io_uring_cqe_seen(&disk->ring, cqe);
        kvf_disk_reap(disk, op, now);
        kvf_disk_fifo_push(disk, &disk->reaped, op);
        n++;
    }
    return n;
}

void kvf_disk_poll(kvf_disk_t *disk)
{
    if ((disk != NULL) && (kvf_disk_reap_all(disk) > 0)) {
        kvf_disk_issue_writes(disk);
        kvf_disk_issue_reads(disk);
        kvf_disk_submit(disk);
    }
}

/* Reaps every completion there is, hands the device the I/O queued
 * behind them and submits it, and only then finishes the reaped ones,
 * polling again between them (verifying a read's bytes takes longer than
 * the device needs to start the next one: verified first, the queue ran
 * dry while a batch was verified). */
unsigned kvf_disk_progress(kvf_disk_t *disk, bool wait)
{
    struct io_uring_cqe *cqe;
    kvf_disk_op_t *op;
    unsigned done = 0;

    kvf_disk_submit(disk);
    if (wait && (disk->inflight > 0) && (disk->reaped.head == KVF_DISK_NONE)) {
        if (io_uring_wait_cqe(&disk->ring, &cqe) < 0) {
            return 0;
        }
    }
    kvf_disk_poll(disk);
    while ((op = kvf_disk_fifo_pop(disk, &disk->reaped)) != NULL) {
        if (op->is_write) {
            kvf_disk_complete_write(disk, op, op->res);
        } else {
            kvf_disk_complete_read(disk, op, op->res);
        }
        done++;
        kvf_disk_poll(disk);
    }
    kvf_disk_submit(disk);
    return done;
}

void kvf_disk_drain(kvf_disk_t *disk)
{
    while ((disk->inflight > 0) || (disk->reaped.head != KVF_DISK_NONE)) {
        kvf_disk_progress(disk, true);
    }
}

static void kvf_disk_on_efd(evutil_socket_t fd, short what, void *arg)
{
    kvf_disk_t *disk = arg;
    uint64_t n;

    if (read(fd, &n, sizeof(n)) < 0) {
        /* EAGAIN: a completion we already reaped */
    }
    kvf_disk_progress(disk, false);
}

static void kvf_disk_on_submit(evutil_socket_t fd, short what, void *arg)
{
    kvf_disk_submit(arg);
}

/* ---- the public calls -------------------------------------------------- */

/* Takes a free write op: one with a staging buffer when @p copy, else
 * preferably one without. */
static kvf_disk_op_t *kvf_disk_write_op(kvf_disk_t *disk, bool copy)
{
    uint32_t *list = (!copy && (disk->free_writes != KVF_DISK_NONE))
                         ? &disk->free_writes
                         : &disk->free_copies;
    kvf_disk_op_t *op;

    if (*list == KVF_DISK_NONE) {
        return NULL;
    }
    op    = &disk->ops[*list];
    *list = op->next_free;
    return op;
}

/* The common part of both puts: a slot, its record, the queue. */
static kvf_status_t kvf_disk_put_op(kvf_disk_t *disk, const kvf_key_t *key,
                                    const void *data, uint64_t length,
                                    uint64_t checksum, bool copy)
{
    kvf_disk_record_t rec;
    kvf_disk_slot_t *s;
    kvf_disk_op_t *op;
    uint32_t *cell, slot;

    cell = kvf_disk_index_find(disk, key);
    if (cell != NULL) {
        if (disk->slots[*cell].state == KVF_DISK_SLOT_VALID) {
            kvf_disk_lru_unlink(disk, *cell);
            kvf_disk_lru_push(disk, *cell);
        }
        return KVF_ERR_EXISTS;
    }
    if ((length == 0) || (length > disk->slot_size)) {
        return KVF_ERR_TOO_BIG;
    }
    if (!copy && (((uintptr_t)data % KVF_DISK_ALIGN) != 0)) {
        return KVF_ERR_RANGE; /* O_DIRECT reads it as it is */
    }
    op = kvf_disk_write_op(disk, copy);
    if (op == NULL) {
        disk->st.write_drops++;
        return KVF_ERR_BUSY;
    }
    slot = kvf_disk_slot_take(disk);
    if (slot == KVF_DISK_NONE) {
        kvf_disk_write_op_put(disk, op); /* every slot is being read */
        disk->st.write_drops++;
        return KVF_ERR_BUSY;
    }
    op->slot = slot;

    s            = &disk->slots[slot];
    s->key       = *key;
    s->length    = length;
    s->checksum  = checksum;
    s->seq       = ++disk->seq;
    s->readers   = 0;
    s->wanted_ms = 0;
    s->op        = (uint32_t)(op - disk->ops);
    s->state     = KVF_DISK_SLOT_WRITING;
    disk->st.used_slots++;
    disk->st.used_bytes += length;
    kvf_disk_index_insert(disk, slot);

    memset(&rec, 0, sizeof(rec));
    rec.magic    = KVF_DISK_RECORD_MAGIC;
    rec.epoch    = disk->epoch;
    rec.seq      = s->seq;
    rec.ns       = key->ns;
    rec.hi       = key->hi;
    rec.lo       = key->lo;
    rec.length   = length;
    rec.checksum = checksum;
    rec.sum      = kvf_chunk_checksum(&rec, offsetof(kvf_disk_record_t, sum));
    memcpy(op->buf, &rec, sizeof(rec)); /* the rest of it stays zero */
    op->in_place = !copy;
    if (copy) {
        disk->st.write_copies++;
        op->src = op->buf + KVF_DISK_ALIGN;
        memcpy(op->buf + KVF_DISK_ALIGN, data, length);
        memset(op->buf + KVF_DISK_ALIGN + length, 0,
               kvf_disk_round(length) - length);
    } else {
        op->src = data;
    }

    /* queued in order; out to the device as soon as a write slot is free */
    kvf_disk_fifo_push(disk, &disk->staged, op);
    disk->writes_pending++;
    kvf_disk_issue_writes(disk);
    return KVF_OK;
}

kvf_status_t kvf_disk_put(kvf_disk_t *disk, const kvf_key_t *key,
                          const void *data, uint64_t length, uint64_t checksum)
{
    return kvf_disk_put_op(disk, key, data, length, checksum, true);
}

kvf_status_t kvf_disk_put_in_place(kvf_disk_t *disk, const kvf_key_t *key,
                                   const void *data, uint64_t length,
                                   uint64_t checksum)
{
    return kvf_disk_put_op(disk, key, data, length, checksum, false);
}

bool kvf_disk_contains(const kvf_disk_t *disk, const kvf_key_t *key)
{
    return kvf_disk_index_find(disk, key) != NULL;
}

bool kvf_disk_is_stored(const kvf_disk_t *disk, const kvf_key_t *key)
{
    uint32_t *cell = kvf_disk_index_find(disk, key);

    return (cell != NULL) && (disk->slots[*cell].state == KVF_DISK_SLOT_VALID);
}

uint64_t kvf_disk_length(const kvf_disk_t *disk, const kvf_key_t *key)
{
    uint32_t *cell = kvf_disk_index_find(disk, key);

    return cell == NULL ? 0 : disk->slots[*cell].length;
}

uint64_t kvf_disk_checksum(const kvf_disk_t *disk, const kvf_key_t *key)
{
    uint32_t *cell = kvf_disk_index_find(disk, key);

    return cell == NULL ? 0 : disk->slots[*cell].checksum;
}

kvf_status_t kvf_disk_read(kvf_disk_t *disk, const kvf_key_t *key, void *dst,
                           uint64_t dst_cap, kvf_disk_read_cb_t cb, void *arg)
{
    kvf_disk_slot_t *s;
    kvf_disk_op_t *op;
    uint32_t *cell = kvf_disk_index_find(disk, key);
    uint32_t slot;

    if (cell == NULL) {
        disk->st.read_misses++;
        return KVF_ERR_NOT_FOUND;
    }
    slot = *cell;
    s    = &disk->slots[slot];
    if ((((uintptr_t)dst % KVF_DISK_ALIGN) != 0) ||
        (dst_cap < kvf_disk_round(s->length))) {
        return KVF_ERR_RANGE;
    }
    if (s->state == KVF_DISK_SLOT_WRITING) {
        /* its write has not landed: the bytes are still where the put
         * found them (verified when they were committed) */
        memcpy(dst, disk->ops[s->op].src, s->length);
        disk->st.reads++;
        disk->st.read_bytes += s->length;
        return KVF_OK;
    }
    if (disk->free_reads == KVF_DISK_NONE) {
        return KVF_ERR_BUSY;
    }
    op               = &disk->ops[disk->free_reads];
    disk->free_reads = op->next_free;
    op->slot         = slot;
    op->dst          = dst;
    op->cb           = cb;
    op->arg          = arg;
    s->readers++; /* not evicted while queued or in flight */

    kvf_disk_fifo_push(disk, &disk->queued, op);
    kvf_disk_issue_reads(disk);
    return KVF_INPROGRESS;
}

void kvf_disk_want(kvf_disk_t *disk, const kvf_key_t *key)
{
    uint32_t *cell = kvf_disk_index_find(disk, key);
    uint32_t now_ms;

    if (cell != NULL) {
        now_ms                       = (uint32_t)kvf_time_now_ms();
        disk->slots[*cell].wanted_ms = (now_ms != 0) ? now_ms : 1;
    }
}

kvf_status_t kvf_disk_remove(kvf_disk_t *disk, const kvf_key_t *key)
{
    uint32_t *cell = kvf_disk_index_find(disk, key);
    uint32_t slot;

    if (cell == NULL) {
        return KVF_ERR_NOT_FOUND;
    }
    slot = *cell;
    if ((disk->slots[slot].state != KVF_DISK_SLOT_VALID) ||
        (disk->slots[slot].readers != 0)) {
        return KVF_ERR_BUSY;
    }
    kvf_disk_index_delete(disk, cell);
    kvf_disk_slot_free(disk, slot);
    return KVF_OK;
}

void kvf_disk_get_stats(const kvf_disk_t *disk, kvf_disk_stats_t *stats_p)
{
    uint64_t now = kvf_time_now_ns();

    *stats_p                = disk->st;
    stats_p->is_direct      = disk->is_direct;
    stats_p->writes_pending = disk->writes_pending;
    /* and the busy time so far of a stretch still going on: a counter
     * read mid-stretch must not jump later */
    if (disk->writes_inflight > 0) {
        stats_p->write_busy_ns += now - disk->write_busy_since;
    }
    if (disk->reads_inflight > 0) {
        stats_p->read_busy_ns += now - disk->read_busy_since;
    }
    stats_p->write_inflight_ns +=
        (now - disk->depth_since) * disk->writes_inflight;
    stats_p->read_inflight_ns +=
        (now - disk->depth_since) * disk->reads_inflight;
}

void kvf_disk_foreach_key(kvf_disk_t *disk, kvf_disk_key_cb_t cb, void *arg)
{
    uint32_t slot;

    for (slot = disk->slots[disk->slot_count].next; slot != disk->slot_count;
         slot = disk->slots[slot].next) {
        cb(arg, &disk->slots[slot].key);
    }
}

void kvf_disk_set_faults(kvf_disk_t *disk, unsigned faults)
{
    disk->faults = faults;
}

/* ---- create, restart, destroy ------------------------------------------ */

static kvf_status_t kvf_disk_open(kvf_disk_t *disk, unsigned faults)
{
    int flags = O_RDWR | O_CREAT | O_CLOEXEC;

    errno    = EINVAL;
    disk->fd = (faults & KVF_DISK_FAULT_NO_DIRECT)
                   ? -1
                   : open(disk->path, flags | O_DIRECT, 0600);
    if (disk->fd >= 0) {
        disk->is_direct = true;
        return KVF_OK;
    }
    if (errno != EINVAL) {
        kvf_error("disk tier %s: open failed: %m", disk->path);
        return KVF_ERR_IO;
    }
    kvf_warn("disk tier %s: the file system refuses O_DIRECT: using "
             "buffered I/O (the page cache keeps a second copy of what the "
             "tier writes)",
             disk->path);
    disk->fd = open(disk->path, flags, 0600);
    if (disk->fd < 0) {
        kvf_error("disk tier %s: open failed: %m", disk->path);
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

static kvf_status_t kvf_disk_preallocate(kvf_disk_t *disk, uint64_t bytes)
{
    if (fallocate(disk->fd, 0, 0, (off_t)bytes) == 0) {
        return KVF_OK;
    }
    if ((errno == EOPNOTSUPP) || (errno == ENOSYS)) {
        kvf_warn("disk tier %s: the file system cannot preallocate: the "
                 "file is sparse and may run out of room later",
                 disk->path);
        if (ftruncate(disk->fd, (off_t)bytes) == 0) {
            return KVF_OK;
        }
    }
    kvf_error("disk tier %s: cannot preallocate %" PRIu64 " bytes: %m",
              disk->path, bytes);
    return KVF_ERR_IO;
}

static uint64_t kvf_disk_header_sum(const kvf_disk_header_t *h)
{
    return kvf_chunk_checksum(h, offsetof(kvf_disk_header_t, sum));
}

static kvf_status_t kvf_disk_write_header(kvf_disk_t *disk, uint8_t *buf)
{
    kvf_disk_header_t h;

    memset(&h, 0, sizeof(h));
    h.magic       = KVF_DISK_HEADER_MAGIC;
    h.version     = KVF_DISK_VERSION;
    h.header_size = KVF_DISK_ALIGN;
    h.slot_size   = disk->slot_size;
    h.slot_count  = disk->slot_count;
    h.epoch       = disk->epoch;
    h.sum         = kvf_disk_header_sum(&h);
    memset(buf, 0, KVF_DISK_ALIGN);
    memcpy(buf, &h, sizeof(h));
    if ((pwrite(disk->fd, buf, KVF_DISK_ALIGN, 0) != KVF_DISK_ALIGN) ||
        (fdatasync(disk->fd) != 0)) {
        kvf_error("disk tier %s: writing the header failed: %m", disk->path);
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

static int kvf_disk_seq_cmp(const void *a, const void *b, void *arg)
{
    const kvf_disk_slot_t *slots = arg;
    uint64_t sa                  = slots[*(const uint32_t *)a].seq;
    uint64_t sb                  = slots[*(const uint32_t *)b].seq;

    return (sa > sb) - (sa < sb);
}

/* Re-admits the records of the previous run (same epoch); the data is
 * verified lazily, by the checksum check of the first read. */
static kvf_status_t kvf_disk_recover(kvf_disk_t *disk, uint8_t *buf)
{
    kvf_disk_record_t rec;
    kvf_disk_slot_t *s;
    uint32_t *order, n = 0, slot, *cell;

    order = malloc(sizeof(*order) * (disk->slot_count + 1u));
    if (order == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (slot = 0; slot < disk->slot_count; slot++) {
        if (pread(disk->fd, buf, KVF_DISK_ALIGN,
                  (off_t)kvf_disk_slot_offset(disk, slot)) != KVF_DISK_ALIGN) {
            kvf_error("disk tier %s: reading slot %u failed: %m", disk->path,
                      slot);
            free(order);
            return KVF_ERR_IO;
        }
        memcpy(&rec, buf, sizeof(rec));
        if (rec.magic != KVF_DISK_RECORD_MAGIC) {
            continue; /* never written */
        }
        if ((rec.epoch != disk->epoch) ||
            (rec.sum !=
             kvf_chunk_checksum(&rec, offsetof(kvf_disk_record_t, sum))) ||
            (rec.length == 0) || (rec.length > disk->slot_size)) {
            disk->st.ignored++; /* half-written record, or another epoch */
            continue;
        }
        s           = &disk->slots[slot];
        s->key.ns   = rec.ns;
        s->key.hi   = rec.hi;
        s->key.lo   = rec.lo;
        s->length   = rec.length;
        s->checksum = rec.checksum;
        s->seq      = rec.seq;
        if (rec.seq > disk->seq) {
            disk->seq = rec.seq;
        }
        cell = kvf_disk_index_find(disk, &s->key);
        if (cell != NULL) {
            /* written twice (removed, then spilled again): newer wins */
            disk->st.ignored++;
            if (disk->slots[*cell].seq > s->seq) {
                continue;
            }
            disk->slots[*cell].state = KVF_DISK_SLOT_FREE;
            kvf_disk_index_delete(disk, cell);
        }
        s->state = KVF_DISK_SLOT_VALID;
        kvf_disk_index_insert(disk, slot);
        order[n++] = slot;
    }
    /* oldest first into the LRU, so the oldest leaves first; slots that
     * lost a duplicate contest are free */
    qsort_r(order, n, sizeof(*order), kvf_disk_seq_cmp, disk->slots);
    for (slot = 0; slot < n; slot++) {
        s = &disk->slots[order[slot]];
        if (s->state != KVF_DISK_SLOT_VALID) {
            continue;
        }
        kvf_disk_lru_push(disk, order[slot]);
        disk->st.used_slots++;
        disk->st.used_bytes += s->length;
        disk->st.recovered++;
    }
    for (slot = disk->slot_count; slot-- > 0;) {
        if (disk->slots[slot].state == KVF_DISK_SLOT_FREE) {
            disk->slots[slot].next = disk->free_head;
            disk->free_head        = slot;
        }
    }
    free(order);
    return KVF_OK;
}

static kvf_status_t kvf_disk_load(kvf_disk_t *disk, uint8_t *buf)
{
    kvf_disk_header_t h;
    struct stat sb;
    uint32_t slot;

    if (fstat(disk->fd, &sb) != 0) {
        kvf_error("disk tier %s: fstat failed: %m", disk->path);
        return KVF_ERR_IO;
    }
    memset(&h, 0, sizeof(h));
    if ((sb.st_size >= (off_t)KVF_DISK_ALIGN) &&
        (pread(disk->fd, buf, KVF_DISK_ALIGN, 0) == KVF_DISK_ALIGN)) {
        memcpy(&h, buf, sizeof(h));
    }
    if ((h.magic == KVF_DISK_HEADER_MAGIC) &&
        (h.sum == kvf_disk_header_sum(&h)) && (h.version == KVF_DISK_VERSION) &&
        (h.slot_size == disk->slot_size) &&
        (h.slot_count == disk->slot_count)) {
        disk->epoch = h.epoch;
        return kvf_disk_recover(disk, buf);
    }
    if (h.magic == KVF_DISK_HEADER_MAGIC) {
        kvf_warn("disk tier %s: written with %" PRIu64 " slots of %" PRIu64
                 " bytes, now %u of %" PRIu64
                 " (max_chunk or disk_size changed): its old slots are "
                 "ignored",
                 disk->path, h.slot_count, h.slot_size, disk->slot_count,
                 disk->slot_size);
    }
    /* a new epoch: whatever records the file still holds are ignored */
    disk->epoch = kvf_time_now_ns() ^ ((uint64_t)getpid() << 32) ^
                  (h.epoch * 0x9e3779b97f4a7c15ull);
    for (slot = disk->slot_count; slot-- > 0;) {
        disk->slots[slot].next = disk->free_head;
        disk->free_head        = slot;
    }
    return kvf_disk_write_header(disk, buf);
}

static kvf_status_t kvf_disk_alloc_tables(kvf_disk_t *disk)
{
    uint32_t cells = 16, i;

    while (cells < 2u * disk->slot_count) {
        cells *= 2;
    }
    disk->slots = calloc(disk->slot_count + 1u, sizeof(*disk->slots));
    disk->table = malloc(sizeof(*disk->table) * cells);
    disk->ops =
        calloc((size_t)disk->nwrites + disk->nreads, sizeof(*disk->ops));
    if ((disk->slots == NULL) || (disk->table == NULL) || (disk->ops == NULL) ||
        (posix_memalign((void **)&disk->staging, KVF_DISK_ALIGN,
                        disk->nstaging * disk->stride) != 0) ||
        (posix_memalign((void **)&disk->records, KVF_DISK_ALIGN,
                        (size_t)(disk->nwrites - disk->nstaging) *
                            KVF_DISK_ALIGN) != 0)) {
        return KVF_ERR_NO_MEMORY;
    }
    /* touched now: their first page faults would otherwise land on the
     * eviction path */
    memset(disk->staging, 0, disk->nstaging * disk->stride);
    memset(disk->records, 0,
           (size_t)(disk->nwrites - disk->nstaging) * KVF_DISK_ALIGN);
    for (i = 0; i < cells; i++) {
        disk->table[i] = KVF_DISK_NONE;
    }
    disk->table_mask = cells - 1;
    /* the LRU sentinel */
    disk->slots[disk->slot_count].next = disk->slot_count;
    disk->slots[disk->slot_count].prev = disk->slot_count;
    disk->free_head                    = KVF_DISK_NONE;
    for (i = 0; i < disk->nwrites + disk->nreads; i++) {
        kvf_disk_op_t *op = &disk->ops[i];

        op->is_write    = i < disk->nwrites;
        op->has_staging = i < disk->nstaging;
        if (op->has_staging) {
            op->buf = disk->staging + (size_t)i * disk->stride;
        } else if (op->is_write) {
            op->buf =
                disk->records + (size_t)(i - disk->nstaging) * KVF_DISK_ALIGN;
        }
        op->next_free =
            ((i + 1 == disk->nstaging) || (i + 1 == disk->nwrites) ||
             (i + 1 == disk->nwrites + disk->nreads))
                ? KVF_DISK_NONE
                : i + 1;
    }
    disk->free_copies = 0;
    disk->free_writes = disk->nstaging;
    disk->free_reads  = disk->nwrites;
    disk->staged.head = disk->staged.tail = KVF_DISK_NONE;
    disk->queued.head = disk->queued.tail = KVF_DISK_NONE;
    disk->reaped.head = disk->reaped.tail = KVF_DISK_NONE;
    return KVF_OK;
}

static kvf_status_t kvf_disk_ring_init(kvf_disk_t *disk,
                                       struct event_base *base)
{
    int ret = io_uring_queue_init(2u * disk->depth, &disk->ring, 0);

    if (ret < 0) {
        kvf_error("disk tier %s: io_uring_queue_init failed: %s (the kernel "
                  "or a seccomp profile refuses io_uring)",
                  disk->path, strerror(-ret));
        return KVF_ERR_IO;
    }
    disk->has_ring = true;
    if (base == NULL) {
        return KVF_OK;
    }
    disk->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if ((disk->efd < 0) ||
        (io_uring_register_eventfd(&disk->ring, disk->efd) < 0)) {
        kvf_error("disk tier %s: eventfd for io_uring failed: %m", disk->path);
        return KVF_ERR_IO;
    }
    disk->efd_ev =
        event_new(base, disk->efd, EV_READ | EV_PERSIST, kvf_disk_on_efd, disk);
    disk->submit_ev = event_new(base, -1, 0, kvf_disk_on_submit, disk);
    if ((disk->efd_ev == NULL) || (disk->submit_ev == NULL) ||
        (event_add(disk->efd_ev, NULL) != 0)) {
        return KVF_ERR_NO_MEMORY;
    }
    return KVF_OK;
}

kvf_status_t kvf_disk_create(const kvf_disk_params_t *params,
                             kvf_disk_t **disk_p)
{
    kvf_disk_t *disk;
    kvf_status_t status;
    uint64_t slots;

    if ((params == NULL) || (params->path == NULL) ||
        (params->path[0] == '\0') || (params->slot_size == 0)) {
        return KVF_ERR_INVALID;
    }
    disk = calloc(1, sizeof(*disk));
    if (disk == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    disk->fd         = -1;
    disk->efd        = -1;
    disk->path       = strdup(params->path);
    disk->slot_size  = kvf_disk_round(params->slot_size);
    disk->stride     = KVF_DISK_ALIGN + disk->slot_size;
    disk->depth      = params->queue_depth ? params->queue_depth : 16;
    disk->nstaging   = KVF_DISK_WRITES_PER_SLOT * disk->depth;
    disk->nwrites    = 2 * disk->nstaging;
    disk->nreads     = KVF_DISK_READS_PER_SLOT * disk->depth;
    disk->stored_cb  = params->stored_cb;
    disk->dropped_cb = params->dropped_cb;
    disk->written_cb = params->written_cb;
    disk->cb_arg     = params->cb_arg;
    disk->faults     = params->faults;
    slots            = params->size > KVF_DISK_ALIGN
                           ? (params->size - KVF_DISK_ALIGN) / disk->stride
                           : 0;
    if ((slots == 0) || (slots >= UINT32_MAX)) {
        kvf_error("disk tier %s: disk_size %" PRIu64
                  " does not hold between 1 and 2^32 slots of %" PRIu64
                  " bytes",
                  params->path, params->size, disk->stride);
        status = KVF_ERR_INVALID;
        goto err_destroy;
    }
    disk->slot_count        = (uint32_t)slots;
    disk->st.slots          = slots;
    disk->st.capacity_bytes = slots * disk->slot_size;
    if (disk->path == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto err_destroy;
    }
    status = kvf_disk_alloc_tables(disk);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    status = kvf_disk_open(disk, params->faults);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    status = kvf_disk_preallocate(
        disk, KVF_DISK_ALIGN + (uint64_t)disk->slot_count * disk->stride);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    /* the first staging buffer doubles as the aligned buffer of the setup
     * I/O (no write is queued yet; its record is zeroed again below) */
    status = kvf_disk_load(disk, disk->staging);
    memset(disk->staging, 0, KVF_DISK_ALIGN);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    status = kvf_disk_ring_init(disk, params->base);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    kvf_info("disk tier %s: %u slots of %" PRIu64 " bytes, %s I/O, %" PRIu64
             " chunks kept from the last run, %" PRIu64 " slots ignored",
             disk->path, disk->slot_count, disk->slot_size,
             disk->is_direct ? "direct" : "buffered", disk->st.recovered,
             disk->st.ignored);
    *disk_p = disk;
    return KVF_OK;

err_destroy:
    kvf_disk_destroy(disk);
    return status;
}

void kvf_disk_destroy(kvf_disk_t *disk)
{
    if (disk == NULL) {
        return;
    }
    if (disk->has_ring) {
        kvf_disk_drain(disk);
    }
    if (disk->efd_ev != NULL) {
        event_free(disk->efd_ev);
    }
    if (disk->submit_ev != NULL) {
        event_free(disk->submit_ev);
    }
    if (disk->has_ring) {
        io_uring_queue_exit(&disk->ring);
    }
    if (disk->efd >= 0) {
        close(disk->efd);
    }
    if (disk->fd >= 0) {
        close(disk->fd);
    }
    free(disk->staging);
    free(disk->records);
    free(disk->ops);
    free(disk->table);
    free(disk->slots);
    free(disk->path);
    free(disk);
}

kvf_status_t kvf_disk_start(struct kvf_store *store,
                            const struct kvf_agent_config *config,
                            struct event_base *base, kvf_disk_t **disk_p)
{
    kvf_disk_params_t params;
    kvf_status_t status;

    if (config->disk_size < 2 * (KVF_DISK_ALIGN + config->max_chunk)) {
        kvf_error("disk_size %" PRIu64 " holds less than one slot of "
                  "max_chunk %" PRIu64 " (docs/disk-tier.md)",
                  config->disk_size, config->max_chunk);
        return KVF_ERR_CONFIG;
    }
    memset(&params, 0, sizeof(params));
    params.path        = config->disk_path;
    params.size        = config->disk_size;
    params.slot_size   = config->max_chunk;
    params.queue_depth = (unsigned)config->disk_queue_depth;
    params.base        = base;
    params.stored_cb   = kvf_store_on_disk_stored;
    params.dropped_cb  = kvf_store_on_disk_dropped;
    params.written_cb  = kvf_store_on_disk_written;
    params.cb_arg      = store;
    status             = kvf_disk_create(&params, disk_p);
    if (status == KVF_OK) {
        kvf_store_set_disk(store, *disk_p);
    }
    return status;
}

void kvf_disk_print_tier_metrics(const kvf_disk_t *disk, uint64_t host_chunks,
                                 uint64_t host_bytes, uint64_t served_from_disk,
                                 struct evbuffer *body)
{
    uint64_t disk_chunks, disk_bytes;

    if (disk == NULL) {
        return; /* one tier: the pool's own series say it all */
    }
    disk_chunks = disk->st.used_slots;
    disk_bytes  = disk->st.used_bytes;

    evbuffer_add_printf(
        body,
        "# HELP kvf_agent_tier_chunks chunks held, by medium (a chunk in "
        "the pool and on disk counts in both)\n"
        "# TYPE kvf_agent_tier_chunks gauge\n"
        "kvf_agent_tier_chunks{medium=\"host\"} %" PRIu64 "\n"
        "kvf_agent_tier_chunks{medium=\"disk\"} %" PRIu64 "\n"
        "# HELP kvf_agent_tier_bytes bytes of chunks held, by medium\n"
        "# TYPE kvf_agent_tier_bytes gauge\n"
        "kvf_agent_tier_bytes{medium=\"host\"} %" PRIu64 "\n"
        "kvf_agent_tier_bytes{medium=\"disk\"} %" PRIu64 "\n"
        "# HELP kvf_agent_served_from_disk_total chunks sent to peers that "
        "were read from the disk tier first\n"
        "# TYPE kvf_agent_served_from_disk_total counter\n"
        "kvf_agent_served_from_disk_total %" PRIu64 "\n",
        host_chunks, disk_chunks, host_bytes, disk_bytes, served_from_disk);
}

/* A counter of seconds by direction, from nanoseconds. */
static void kvf_disk_print_seconds(struct evbuffer *body, const char *name,
                                   const char *help, uint64_t write_ns,
                                   uint64_t read_ns)
{
    kvf_prom_family(body, name, KVF_PROM_COUNTER, help);
    evbuffer_add_printf(body, "%s{dir=\"write\"} %.6f\n%s{dir=\"read\"} %.6f\n",
                        name, (double)write_ns / 1e9, name,
                        (double)read_ns / 1e9);
}

void kvf_disk_print_metrics(const kvf_disk_t *disk, struct evbuffer *body)
{
    kvf_disk_stats_t stats;
    const kvf_disk_stats_t *st = &stats;

    if (disk == NULL) {
        return;
    }
    kvf_disk_get_stats(disk, &stats);
    kvf_prom_metric(body, "kvf_agent_disk_capacity_bytes", KVF_PROM_GAUGE,
                    "bytes of the disk tier", st->capacity_bytes);
    kvf_prom_metric(body, "kvf_agent_disk_used_bytes", KVF_PROM_GAUGE,
                    "bytes of chunks on the disk tier", st->used_bytes);
    kvf_prom_metric(body, "kvf_agent_disk_chunks", KVF_PROM_GAUGE,
                    "chunks on the disk tier", st->used_slots);
    kvf_prom_metric(body, "kvf_agent_disk_direct", KVF_PROM_GAUGE,
                    "1 when the tier uses O_DIRECT", disk->is_direct ? 1 : 0);
    kvf_prom_metric(body, "kvf_agent_disk_writes_total", KVF_PROM_COUNTER,
                    "chunks written behind", st->writes);
    kvf_prom_metric(body, "kvf_agent_disk_write_bytes_total", KVF_PROM_COUNTER,
                    "bytes written behind", st->write_bytes);
    kvf_prom_metric(body, "kvf_agent_disk_write_copies_total", KVF_PROM_COUNTER,
                    "chunks copied before their write (the allocation that "
                    "evicted them needed the block at once)",
                    st->write_copies);
    kvf_prom_metric(body, "kvf_agent_disk_writes_pending", KVF_PROM_GAUGE,
                    "evicted chunks queued or being written behind",
                    st->writes_pending);
    kvf_prom_metric(body, "kvf_agent_disk_write_drops_total", KVF_PROM_COUNTER,
                    "evicted chunks not written (write-behind queue full)",
                    st->write_drops);
    kvf_prom_metric(body, "kvf_agent_disk_reads_total", KVF_PROM_COUNTER,
                    "chunks read back and verified", st->reads);
    kvf_prom_metric(body, "kvf_agent_disk_read_bytes_total", KVF_PROM_COUNTER,
                    "bytes read back", st->read_bytes);
    kvf_prom_metric_by(body, "kvf_agent_disk_errors_total", KVF_PROM_COUNTER,
                       "disk tier failures, by kind", "kind", 3,
                       (const char *const[]){"write", "read", "checksum"},
                       (const uint64_t[]){st->write_errors, st->read_errors,
                                          st->checksum_failures});
    kvf_prom_metric(body, "kvf_agent_disk_evictions_total", KVF_PROM_COUNTER,
                    "disk slots reused for a newer chunk", st->evictions);
    kvf_prom_metric(body, "kvf_agent_disk_evictions_spared_total",
                    KVF_PROM_COUNTER,
                    "times disk eviction passed over a chunk asked for in "
                    "the last second (about to be read back)",
                    st->evictions_spared);
    /* bytes over it: the tier's device throughput, apart from how fast
     * chunks arrive (kvf-bench disk's busy GB/s) */
    kvf_disk_print_seconds(body, "kvf_agent_disk_busy_seconds_total",
                           "time with at least one write, or one read, in "
                           "flight on the tier",
                           st->write_busy_ns, st->read_busy_ns);
    /* over busy seconds: the queue depth the device saw */
    kvf_disk_print_seconds(body, "kvf_agent_disk_inflight_seconds_total",
                           "writes, or reads, in flight on the tier times how "
                           "long (over busy seconds: the average queue depth)",
                           st->write_inflight_ns, st->read_inflight_ns);
    kvf_prom_metric(body, "kvf_agent_disk_recovered_chunks", KVF_PROM_GAUGE,
                    "chunks found on disk at start", st->recovered);
}
