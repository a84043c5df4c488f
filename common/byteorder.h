/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Little-endian loads and stores for wire and packed-key bytes (glibc's
 * <endian.h>; unaligned access through memcpy, which compilers turn into
 * one move), and KVF_ARRAY_SIZE. Named byteorder.h, not endian.h, so it
 * never shadows <endian.h> (the common/time.h pitfall).
 *
 * thread: stateless.
 */
#ifndef KVF_COMMON_BYTEORDER_H
#define KVF_COMMON_BYTEORDER_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

/* Elements of an array (not a pointer). */
#define KVF_ARRAY_SIZE(_a) (sizeof(_a) / sizeof((_a)[0]))

static inline uint16_t kvf_le16_get(const void *p)
{
    uint16_t v;

    memcpy(&v, p, sizeof(v));
    return le16toh(v);
}

static inline uint32_t kvf_le32_get(const void *p)
{
    uint32_t v;

    memcpy(&v, p, sizeof(v));
    return le32toh(v);
}

static inline uint64_t kvf_le64_get(const void *p)
{
    uint64_t v;

    memcpy(&v, p, sizeof(v));
    return le64toh(v);
}

static inline void kvf_le16_put(void *p, uint16_t v)
{
    v = htole16(v);
    memcpy(p, &v, sizeof(v));
}

static inline void kvf_le32_put(void *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, sizeof(v));
}

static inline void kvf_le64_put(void *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, sizeof(v));
}

#endif /* KVF_COMMON_BYTEORDER_H */
