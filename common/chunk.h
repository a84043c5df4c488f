/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Chunk helpers private to the daemons (the public checksum is
 * kvf_chunk_checksum in <kvfabric/keys.h>).
 */
#ifndef KVF_COMMON_CHUNK_H
#define KVF_COMMON_CHUNK_H

#include <stddef.h>
#include <stdint.h>

/**
 * Copies @p len bytes from @p src to @p dst and returns the checksum of
 * what landed in @p dst (kvf_chunk_checksum of it), in one pass: each
 * 64 KiB block is hashed while it is still in cache. The checksum is of
 * the destination, so a source another process keeps writing cannot make
 * the bytes copied differ from the checksum returned.
 *
 * thread: thread-safe; no allocation, no system call.
 */
uint64_t kvf_chunk_copy_checksum(void *dst, const void *src, size_t len);

#endif /* KVF_COMMON_CHUNK_H */
