/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * JSON text into a libevent buffer, for the daemons' HTTP answers. Part of
 * the kvf_listen library (the daemons' libevent helpers): libkvfabric does
 * not link libevent.
 */
#ifndef KVF_COMMON_EVJSON_H
#define KVF_COMMON_EVJSON_H

struct evbuffer;

/**
 * Appends @p s to @p b as a quoted JSON string: '"' and '\' escaped,
 * control characters as \u00XX, other bytes as they are.
 * @param [in,out] b the buffer
 * @param [in] s     a NUL-terminated string (borrowed)
 * thread: the buffer's owner.
 */
void kvf_evjson_add_str(struct evbuffer *b, const char *s);

#endif
