/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/* Store internals: agent/ only. */
#ifndef KVF_AGENT_STORE_INT_H
#define KVF_AGENT_STORE_INT_H

#include "agent/store.h"

#include <stddef.h>

typedef enum {
    KVF_STORE_FREE = 0,
    KVF_STORE_GRANTED,   /* allocated to an owner, invisible */
    KVF_STORE_COMMITTED, /* indexed, servable */
} kvf_store_state_t;

typedef struct kvf_store_entry {
    kvf_store_state_t state;
    kvf_key_t key;
    uint64_t offset;
    uint64_t length;      /* bytes reserved */
    uint64_t data_length; /* bytes of chunk data */
    uint64_t checksum;
    uint64_t last_use; /* store clock, for LRU */
    uint32_t pins;     /* a pin stands for one owner's read of the chunk */
    const void *owner; /* GRANTED: who may commit or release it */
} kvf_store_entry_t;

typedef struct kvf_store_pin {
    kvf_store_entry_t *entry; /* NULL: slot unused */
    const void *owner;
} kvf_store_pin_t;

typedef struct kvf_store_extent {
    uint64_t off;
    uint64_t len;
} kvf_store_extent_t;

struct kvf_store {
    int fd;
    void *base;
    uint64_t size;
    uint64_t max_chunk;
    uint64_t used;
    uint64_t clock;
    kvf_store_entry_t *entries;
    size_t max_entries;
    size_t entries_used;
    kvf_store_pin_t *pins;
    size_t max_pins;
    kvf_store_extent_t *free_ext;
    size_t num_free;
    kvf_store_key_cb_t admit_cb;
    kvf_store_key_cb_t evict_cb;
    void *cb_arg;
    uint64_t commits, evictions, hits, misses, checksum_failures;
};

#endif /* KVF_AGENT_STORE_INT_H */
