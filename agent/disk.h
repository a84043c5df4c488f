/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The local-disk tier behind the pool (issue #20, DESIGN.md §10): chunks
 * the pool evicts are written behind into a preallocated file of fixed
 * slots with io_uring (O_DIRECT where the file system takes it, buffered
 * I/O otherwise, said once in the log), read back into pool blocks on
 * demand, and found again after a restart on the same file.
 *
 * File layout (docs/disk-tier.md): a 4 KiB header (magic, version, slot
 * size, slot count, checksum), then slots of 4 KiB record + slot_size
 * bytes of data. A record carries key, length, the chunk's commit checksum
 * and a sequence number, and its own checksum. A slot is written in one
 * write (record + data); every read verifies the data against the record's
 * checksum, so a torn or damaged slot is a miss (counted), never wrong
 * bytes.
 *
 * Write-behind reads the evicted bytes where they are when the pool can
 * keep the block until the write lands (kvf_disk_put_in_place, then
 * written_cb); when the allocation that evicts needs that very block, the
 * bytes are copied into one of 2 x queue_depth staging buffers first
 * (kvf_disk_put). Either way the slot's record goes in front, in one
 * vectored write; no malloc and no system call on the eviction path;
 * submissions go out once per loop turn. When no write of the kind is
 * free the chunk is dropped (counted), so the tier never slows the pool
 * down. A full tier evicts its least recently used slot that no read is
 * using.
 *
 * thread: owning loop only; nothing here locks.
 */
#ifndef KVF_AGENT_DISK_H
#define KVF_AGENT_DISK_H

#include <kvfabric/keys.h>
#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct evbuffer;
struct kvf_agent_config;
struct kvf_store;

typedef struct kvf_disk kvf_disk_t;

/* A chunk became readable on disk (write done, or found at restart) or
 * left the disk (evicted, damaged, removed). */
typedef void (*kvf_disk_key_cb_t)(void *arg, const kvf_key_t *key);

/* A put's bytes are no longer needed (its write landed, or failed):
 * @p data is the pointer the put was given. */
typedef void (*kvf_disk_written_cb_t)(void *arg, const void *data);

/* A read finished: KVF_OK (the bytes at dst match their checksum; length
 * is the chunk's), KVF_ERR_CHECKSUM (damaged or torn slot: dropped),
 * KVF_ERR_IO (the read failed: dropped), KVF_ERR_CANCELED (destroy). */
typedef void (*kvf_disk_read_cb_t)(void *arg, const kvf_key_t *key,
                                   kvf_status_t status, uint64_t length,
                                   uint64_t checksum);

/* Faults for the tests (the I/O layer's fault-injection hook). */
typedef enum {
    KVF_DISK_FAULT_NONE      = 0,
    KVF_DISK_FAULT_NO_DIRECT = 1u << 0, /* act as if O_DIRECT were refused */
    KVF_DISK_FAULT_WRITE_EIO = 1u << 1, /* the next write completes -EIO */
    KVF_DISK_FAULT_READ_EIO  = 1u << 2, /* the next read completes -EIO */
} kvf_disk_fault_t;

typedef struct kvf_disk_params {
    const char *path;            /* the slot file (created when missing) */
    uint64_t size;               /* bytes of the file (header + slots) */
    uint64_t slot_size;          /* largest chunk: the pool's max_chunk */
    unsigned queue_depth;        /* writes, reads in flight (default 16) */
    struct event_base *base;     /* NULL: the caller drives kvf_disk_progress */
    kvf_disk_key_cb_t stored_cb; /* may be NULL */
    kvf_disk_key_cb_t dropped_cb;     /* may be NULL */
    kvf_disk_written_cb_t written_cb; /* may be NULL */
    void *cb_arg;
    unsigned faults; /* kvf_disk_fault_t, tests only */
} kvf_disk_params_t;

typedef struct kvf_disk_stats {
    uint64_t capacity_bytes; /* slot_count * slot_size */
    uint64_t slots;          /* slot_count */
    uint64_t used_slots;     /* slots holding (or writing) a chunk */
    uint64_t used_bytes;     /* bytes of the chunks held */
    uint64_t writes;         /* chunks written behind */
    uint64_t write_bytes;
    uint64_t write_copies;   /* writes that copied their bytes first */
    uint64_t write_drops;    /* evicted chunks not written: queue full */
    uint64_t writes_pending; /* queued or in flight now */
    uint64_t write_errors;   /* writes that failed (slot freed) */
    uint64_t reads;          /* chunks read back and verified */
    uint64_t read_bytes;
    uint64_t read_misses;       /* reads asked for keys not on disk */
    uint64_t checksum_failures; /* damaged or torn slots found at read */
    uint64_t read_errors;       /* reads that failed */
    uint64_t evictions;         /* slots reused for a newer chunk */
    uint64_t evictions_spared;  /* slots passed over: asked for just now */
    uint64_t recovered;         /* chunks found at restart */
    uint64_t ignored;           /* slots at restart with no valid record */
    uint64_t write_busy_ns;     /* time with a write in flight */
    uint64_t read_busy_ns;      /* time with a read in flight */
    uint64_t write_inflight_ns; /* writes in flight x time */
    uint64_t read_inflight_ns;  /* reads in flight x time */
    bool is_direct;             /* O_DIRECT in use */
} kvf_disk_stats_t;

/* Opens or creates the slot file, preallocates it, and re-admits the
 * records of a previous run with the same slot size (stored_cb is not
 * called for them: see kvf_disk_foreach_key).
 * KVF_ERR_INVALID (no path, size below one slot), KVF_ERR_IO (open,
 * fallocate: disk full, io_uring; logged with the cause),
 * KVF_ERR_NO_MEMORY. */
kvf_status_t kvf_disk_create(const kvf_disk_params_t *params,
                             kvf_disk_t **disk_p);

/* Waits for the I/O in flight (reads complete KVF_ERR_CANCELED), closes
 * the file (it stays for the next run). NULL is a no-op. */
void kvf_disk_destroy(kvf_disk_t *disk);

/* Writes a copy of @p data behind. KVF_OK (queued; stored_cb when done),
 * KVF_ERR_EXISTS (already on disk: kept), KVF_ERR_TOO_BIG (over the slot
 * size), KVF_ERR_BUSY (every staging buffer or slot busy: dropped,
 * counted). The bytes are copied before it returns. */
kvf_status_t kvf_disk_put(kvf_disk_t *disk, const kvf_key_t *key,
                          const void *data, uint64_t length, uint64_t checksum);

/* As kvf_disk_put, without copying: the @p length bytes at @p data (4 KiB
 * aligned, readable through @p length rounded up to 4 KiB) must stay as
 * they are until written_cb(cb_arg, data) says the tier is done with them
 * (after stored_cb or dropped_cb). Also KVF_ERR_RANGE (@p data not
 * aligned). Only KVF_OK calls written_cb. */
kvf_status_t kvf_disk_put_in_place(kvf_disk_t *disk, const kvf_key_t *key,
                                   const void *data, uint64_t length,
                                   uint64_t checksum);

/* true when @p key is on disk (or being written there). */
bool kvf_disk_contains(const kvf_disk_t *disk, const kvf_key_t *key);

/* true when @p key is on disk and its write landed (readable after a
 * restart too). */
bool kvf_disk_is_stored(const kvf_disk_t *disk, const kvf_key_t *key);

/* Length of the chunk of @p key on disk, 0 when absent. */
uint64_t kvf_disk_length(const kvf_disk_t *disk, const kvf_key_t *key);

/* Commit checksum of the chunk of @p key on disk, 0 when absent. */
uint64_t kvf_disk_checksum(const kvf_disk_t *disk, const kvf_key_t *key);

/* Reads the chunk of @p key into @p dst (4 KiB aligned, @p dst_cap bytes,
 * at least its length rounded up to 4 KiB). KVF_INPROGRESS: @p cb runs
 * later from kvf_disk_progress (or the loop); KVF_OK: done at once (the
 * chunk's write has not landed: copied from the put's bytes), cb not
 * called;
 * KVF_ERR_NOT_FOUND (counted as a miss), KVF_ERR_RANGE (dst too small or
 * not aligned), KVF_ERR_BUSY (4 x queue_depth reads accepted already:
 * queue_depth in flight, the rest waiting in order). */
kvf_status_t kvf_disk_read(kvf_disk_t *disk, const kvf_key_t *key, void *dst,
                           uint64_t dst_cap, kvf_disk_read_cb_t cb, void *arg);

/* @p key (on disk) is asked for and about to be read back: disk eviction
 * passes over it for a second (a read protects it while in flight). A key
 * not on disk is ignored. */
void kvf_disk_want(kvf_disk_t *disk, const kvf_key_t *key);

/* Forgets @p key (its slot is free for reuse). KVF_ERR_NOT_FOUND,
 * KVF_ERR_BUSY (a read or write is using it). */
kvf_status_t kvf_disk_remove(kvf_disk_t *disk, const kvf_key_t *key);

/* Submits queued I/O and runs the callbacks of what completed; with
 * @p wait, first waits for at least one completion when any is in
 * flight. Returns how many completed. */
unsigned kvf_disk_progress(kvf_disk_t *disk, bool wait);

/* Takes finished I/O off the device and starts the I/O queued behind it,
 * without finishing anything (no callback runs; the loop, or
 * kvf_disk_progress, does that later). Cheap when nothing finished (one
 * load from the completion ring): long work on the loop calls it between
 * pieces, so the device's queue does not run dry meanwhile. NULL: no-op. */
void kvf_disk_poll(kvf_disk_t *disk);

/* Waits until nothing is in flight. */
void kvf_disk_drain(kvf_disk_t *disk);

void kvf_disk_get_stats(const kvf_disk_t *disk, kvf_disk_stats_t *stats_p);

/* Calls @p cb with every key readable on disk (an inventory). */
void kvf_disk_foreach_key(kvf_disk_t *disk, kvf_disk_key_cb_t cb, void *arg);

/* Creates the tier the agent's config asks for (disk_path, disk_size,
 * disk_queue_depth, slots of max_chunk) on @p base and puts it behind
 * @p store. KVF_ERR_CONFIG (disk_size too small), or kvf_disk_create's. */
kvf_status_t kvf_disk_start(struct kvf_store *store,
                            const struct kvf_agent_config *config,
                            struct event_base *base, kvf_disk_t **disk_p);

/* Appends chunks and bytes per medium (the pool's @p host_chunks and
 * @p host_bytes, the tier's) and the chunks served to peers from disk, to
 * @p body; nothing without a tier (NULL @p disk). */
void kvf_disk_print_tier_metrics(const kvf_disk_t *disk, uint64_t host_chunks,
                                 uint64_t host_bytes, uint64_t served_from_disk,
                                 struct evbuffer *body);

/* Appends the tier's Prometheus series to @p body (NULL disk: none). */
void kvf_disk_print_metrics(const kvf_disk_t *disk, struct evbuffer *body);

/* Arms the fault-injection hook (kvf_disk_fault_t bits; tests only). */
void kvf_disk_set_faults(kvf_disk_t *disk, unsigned faults);

#endif /* KVF_AGENT_DISK_H */
