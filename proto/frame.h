/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The frame codec of DESIGN.md §5:
 *
 *     u32 length | u16 type | u16 flags | payload (protobuf-c)
 *
 * all little-endian; length counts the payload only. Decoding is incremental
 * (a partial frame leaves the buffer untouched), enforces a maximum frame
 * size before anything is buffered or allocated for the payload, and never
 * reads past the bytes it was given.
 *
 * thread: stateless; callers own the buffers.
 */
#ifndef KVF_PROTO_FRAME_H
#define KVF_PROTO_FRAME_H

#include "proto/msg.h"

#include <kvfabric/status.h>

#include <stddef.h>
#include <stdint.h>

struct evbuffer;

#define KVF_PROTOCOL_VERSION  1
#define KVF_FRAME_HDR_SIZE    8u
#define KVF_FRAME_MAX_DEFAULT (16u << 20) /* 16 MiB */
#define KVF_FRAME_MAX_LIMIT   (256u << 20)

/* Frame flags; bits not listed here are rejected. */
enum {
    KVF_FRAME_FLAG_REPLY = 1u << 0, /* the frame answers a request */
    KVF_FRAME_FLAGS_ALL  = KVF_FRAME_FLAG_REPLY,
};

/* Frame type numbers: stable on the wire, never renumber. */
typedef enum {
    KVF_MSG_HELLO           = 1,
    KVF_MSG_HELLO_REPLY     = 2,
    KVF_MSG_STATUS          = 3,
    KVF_MSG_AUTH            = 4, /* reply STATUS */
    KVF_MSG_REGISTER        = 10,
    KVF_MSG_REGISTER_REPLY  = 11,
    KVF_MSG_HEARTBEAT       = 12,
    KVF_MSG_HEARTBEAT_REPLY = 13,
    KVF_MSG_DEREGISTER      = 14,
    KVF_MSG_ADMIT           = 20,
    KVF_MSG_EVICT           = 21,
    KVF_MSG_INVENTORY       = 22,
    KVF_MSG_LOOKUP          = 23,
    KVF_MSG_LOOKUP_REPLY    = 24,
    KVF_MSG_NODE_INFO       = 25,
    KVF_MSG_NODE_INFO_REPLY = 26,
    KVF_MSG_TP_LOOKUP       = 27, /* reply LOOKUP_REPLY */
    KVF_MSG_STATS           = 30,
    KVF_MSG_STATS_REPLY     = 31,
    KVF_MSG_ADMIN_COMMAND   = 32, /* reply STATUS */
    /* engine <-> agent: 40-59 */
    KVF_MSG_POOL_INFO           = 40,
    KVF_MSG_ENGINE_ALLOC        = 41,
    KVF_MSG_ENGINE_SLOTS        = 42,
    KVF_MSG_ENGINE_COMMIT       = 43,
    KVF_MSG_ENGINE_COMMIT_REPLY = 44,
    KVF_MSG_ENGINE_LOOKUP       = 45,
    KVF_MSG_ENGINE_LOOKUP_REPLY = 46,
    KVF_MSG_ENGINE_RETRIEVE     = 47,
    KVF_MSG_ENGINE_RELEASE      = 48,
    KVF_MSG_ENGINE_STATS        = 49,
    KVF_MSG_ENGINE_STATS_REPLY  = 50,
    KVF_MSG_ENGINE_PD_PUSH      = 51, /* reply STATUS */
    KVF_MSG_ENGINE_PD_WAIT      = 52, /* reply ENGINE_SLOTS */
    KVF_MSG_ENGINE_PD_RELEASE   = 53, /* reply STATUS */
    /* agent <-> agent (UCX active-message headers): 60-79 */
    KVF_MSG_PEER_FETCH     = 60,
    KVF_MSG_PEER_CHUNK     = 61,
    KVF_MSG_PD_ALLOC       = 62,
    KVF_MSG_PD_ALLOC_REPLY = 63,
    KVF_MSG_PD_DATA        = 64,
    KVF_MSG_PD_DONE        = 65,
    KVF_MSG_PD_DONE_REPLY  = 66,
    KVF_MSG_PD_ABORT       = 67,
    KVF_MSG_PEER_CHUNKS    = 78,
    KVF_MSG_TYPE_MAX       = 256, /* type numbers are below this */
} kvf_msg_type_t;

/* One decoded frame. */
typedef struct kvf_frame {
    uint16_t type;
    uint16_t flags;
    uint32_t length;       /* payload bytes */
    ProtobufCMessage *msg; /* owned: kvf_frame_release() frees it */
} kvf_frame_t;

/* Returns the protobuf descriptor of a frame type, NULL if unknown. */
const ProtobufCMessageDescriptor *kvf_msg_descriptor(uint16_t type);

/* "HELLO", "LOOKUP_REPLY"; "UNKNOWN" for an unknown type. */
const char *kvf_msg_type_name(uint16_t type);

/* "both", "prefill", "decode" for a wire Role; "-" for any other value. */
const char *kvf_msg_role_name(int role);

/* Name of a wire CommandType ("drain", "undrain", "pin"), for logs and
 * kvfctl; "command N" style text is left to the caller for unknown ones
 * (NULL). */
const char *kvf_msg_command_name(int type);

/*
 * Writes the scalar fields (bool, integers) of @p msg as JSON object
 * members ("\"name\":value,...", no braces) to @p out, skipping
 * request_id, status and message: one schema for every place that shows
 * a reply (the controller's /v1/stats and kvfctl stats both print
 * StatsReply so). Returns the length written (truncated to @p len - 1).
 */
size_t kvf_msg_scalars_json(const ProtobufCMessage *msg, char *out, size_t len);

/*
 * Decodes one frame from the first @p len bytes at @p data.
 *
 * Returns
 *   KVF_OK          a frame; *consumed_p bytes used; free with release
 *   KVF_INPROGRESS  not a whole frame yet; nothing used
 *   KVF_ERR_TOO_BIG declared length over @p max_frame (nothing allocated)
 *   KVF_ERR_PROTO   unknown type, unknown flags, or a payload that does not
 *                   decode as the type's message (*consumed_p says how far
 *                   to skip; the connection should be closed)
 * @p alloc may be NULL for malloc. Nothing is logged: the caller counts and
 * logs peer errors at debug level.
 */
kvf_status_t kvf_frame_decode_buf(const void *data, size_t len,
                                  uint32_t max_frame, ProtobufCAllocator *alloc,
                                  kvf_frame_t *frame_p, size_t *consumed_p);

/*
 * Reads the KVF_FRAME_HDR_SIZE bytes of a header at @p hdr into @p frame
 * (msg NULL): KVF_OK when a payload of frame->length bytes may follow,
 * KVF_ERR_TOO_BIG, KVF_ERR_PROTO (unknown type or flags).
 */
kvf_status_t kvf_frame_check_hdr(const void *hdr, uint32_t max_frame,
                                 kvf_frame_t *frame);

/* As kvf_frame_decode_buf(), reading from and draining @p in
 * (proto/frame_ev.c: libevent, not in libkvfabric). */
kvf_status_t kvf_frame_decode(struct evbuffer *in, uint32_t max_frame,
                              ProtobufCAllocator *alloc, kvf_frame_t *frame_p);

/* Frees the message of a decoded frame; safe on a zeroed frame. */
void kvf_frame_release(kvf_frame_t *frame, ProtobufCAllocator *alloc);

/*
 * Appends @p msg as a frame of @p type to @p out (proto/frame_ev.c). @p msg
 * must be of the type's message. KVF_ERR_TOO_BIG when the payload is over @p
 * max_frame, KVF_ERR_INVALID for a type/message mismatch, KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_frame_encode(struct evbuffer *out, uint16_t type,
                              uint16_t flags, const ProtobufCMessage *msg,
                              uint32_t max_frame);

/*
 * Packs a frame into @p buf (for UCX active messages). Needs
 * KVF_FRAME_HDR_SIZE + packed size bytes; writes the total to *len_p.
 * KVF_ERR_TOO_BIG when @p buf_len is too small or over @p max_frame.
 */
kvf_status_t kvf_frame_pack(void *buf, size_t buf_len, uint16_t type,
                            uint16_t flags, const ProtobufCMessage *msg,
                            uint32_t max_frame, size_t *len_p);

/* Bytes kvf_frame_pack() needs for @p msg. */
size_t kvf_frame_size(const ProtobufCMessage *msg);

#endif /* KVF_PROTO_FRAME_H */
