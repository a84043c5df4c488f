/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf_key_t as the key of a UCX khash table:
 *   KHASH_INIT(name, kvf_key_t, V, 1, kvf_key_khash, kvf_key_kheq)
 */
#ifndef KVF_AGENT_KEYHASH_H
#define KVF_AGENT_KEYHASH_H

#include <kvfabric/keys.h>

#include <stdbool.h>
#include <ucs/datastruct/khash.h>

/* A key's digest is a hash already: its low word, folded, and its
 * namespace. */
static inline khint_t kvf_key_khash(kvf_key_t key)
{
    return (khint_t)(key.lo ^ (key.lo >> 32) ^ key.ns);
}

static inline bool kvf_key_kheq(kvf_key_t a, kvf_key_t b)
{
    return (a.lo == b.lo) && (a.hi == b.hi) && (a.ns == b.ns);
}

#endif /* KVF_AGENT_KEYHASH_H */
