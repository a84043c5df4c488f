/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Copies and checksums a batch of chunks on several cores: the calling
 * (event-loop) thread and a few workers take chunks from one list until
 * none is left, and the call returns when every chunk landed. The loop is
 * blocked for the batch as it was when it copied alone, only shorter: no
 * chunk, grant or mapping outlives the call, so nothing about them
 * changes. One chunk is never split (its checksum is one XXH3 pass).
 *
 * Used where an agent copies many chunks at once: an engine's COMMIT
 * (staging -> pool), same-host fetches (the holder's pool -> ours) and PD
 * claims (receive region -> the engine's staging).
 *
 * thread: one caller at a time (the owning loop); the workers are private.
 */
#ifndef KVF_AGENT_COPIER_H
#define KVF_AGENT_COPIER_H

#include <kvfabric/status.h>

#include <stddef.h>
#include <stdint.h>

typedef struct kvf_copier kvf_copier_t;

/* One chunk: @p len bytes from @p src to @p dst; @p sum is set to the
 * checksum of what landed (kvf_chunk_copy_checksum). With @p dst NULL the
 * chunk is only checksummed where it is (a verification). */
typedef struct kvf_copy_job {
    void *dst;
    const void *src;
    size_t len;
    uint64_t sum;
} kvf_copy_job_t;

/* Below this many bytes in a batch the caller copies alone: waking a
 * worker costs more than it saves. */
#define KVF_COPIER_MIN_BATCH (512u << 10)

/* @p workers threads besides the caller (0: the caller copies alone, no
 * thread). KVF_ERR_NO_MEMORY, KVF_ERR_IO (a thread could not start). */
kvf_status_t kvf_copier_create(unsigned workers, kvf_copier_t **copier_p);

/* Stops and joins the workers. NULL is a no-op. */
void kvf_copier_destroy(kvf_copier_t *copier);

/* Run by the calling thread after each chunk it copied (the disk tier's
 * poll: its queue goes on while the loop copies). */
typedef void (*kvf_copier_between_cb_t)(void *arg);

/* Copies and checksums @p jobs[0, n); returns when all are done. A NULL
 * @p copier copies on the calling thread. @p between (may be NULL) runs on
 * the calling thread between its chunks. */
void kvf_copier_run(kvf_copier_t *copier, kvf_copy_job_t *jobs, size_t n,
                    kvf_copier_between_cb_t between, void *arg);

/* Threads a copy uses at most (the caller included). */
unsigned kvf_copier_threads(const kvf_copier_t *copier);

#endif /* KVF_AGENT_COPIER_H */
