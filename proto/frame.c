/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "proto/frame.h"

#include "common/byteorder.h"

#include <stdio.h>
#include <string.h>

typedef struct kvf_msg_desc {
    const char *name;
    const ProtobufCMessageDescriptor *descriptor;
} kvf_msg_desc_t;

static const kvf_msg_desc_t kvf_msg_descs[KVF_MSG_TYPE_MAX] = {
    [KVF_MSG_HELLO]           = {"HELLO", &kvf__hello__descriptor},
    [KVF_MSG_HELLO_REPLY]     = {"HELLO_REPLY", &kvf__hello_reply__descriptor},
    [KVF_MSG_STATUS]          = {"STATUS", &kvf__status__descriptor},
    [KVF_MSG_AUTH]            = {"AUTH", &kvf__auth__descriptor},
    [KVF_MSG_REGISTER]        = {"REGISTER", &kvf__register__descriptor},
    [KVF_MSG_REGISTER_REPLY]  = {"REGISTER_REPLY",
                                 &kvf__register_reply__descriptor},
    [KVF_MSG_HEARTBEAT]       = {"HEARTBEAT", &kvf__heartbeat__descriptor},
    [KVF_MSG_HEARTBEAT_REPLY] = {"HEARTBEAT_REPLY",
                                 &kvf__heartbeat_reply__descriptor},
    [KVF_MSG_DEREGISTER]      = {"DEREGISTER", &kvf__deregister__descriptor},
    [KVF_MSG_ADMIT]           = {"ADMIT", &kvf__key_batch__descriptor},
    [KVF_MSG_EVICT]           = {"EVICT", &kvf__key_batch__descriptor},
    [KVF_MSG_INVENTORY]       = {"INVENTORY", &kvf__inventory__descriptor},
    [KVF_MSG_LOOKUP]          = {"LOOKUP", &kvf__lookup__descriptor},
    [KVF_MSG_LOOKUP_REPLY] = {"LOOKUP_REPLY", &kvf__lookup_reply__descriptor},
    [KVF_MSG_NODE_INFO]    = {"NODE_INFO", &kvf__node_info_request__descriptor},
    [KVF_MSG_NODE_INFO_REPLY] = {"NODE_INFO_REPLY",
                                 &kvf__node_info_reply__descriptor},
    [KVF_MSG_TP_LOOKUP]       = {"TP_LOOKUP", &kvf__tp_lookup__descriptor},
    [KVF_MSG_STATS]           = {"STATS", &kvf__stats_request__descriptor},
    [KVF_MSG_STATS_REPLY]     = {"STATS_REPLY", &kvf__stats_reply__descriptor},
    [KVF_MSG_ADMIN_COMMAND]   = {"ADMIN_COMMAND",
                                 &kvf__admin_command__descriptor},
    [KVF_MSG_POOL_INFO]       = {"POOL_INFO", &kvf__pool_info__descriptor},
    [KVF_MSG_ENGINE_ALLOC]  = {"ENGINE_ALLOC", &kvf__engine_alloc__descriptor},
    [KVF_MSG_ENGINE_SLOTS]  = {"ENGINE_SLOTS", &kvf__engine_slots__descriptor},
    [KVF_MSG_ENGINE_COMMIT] = {"ENGINE_COMMIT",
                               &kvf__engine_commit__descriptor},
    [KVF_MSG_ENGINE_COMMIT_REPLY] = {"ENGINE_COMMIT_REPLY",
                                     &kvf__engine_commit_reply__descriptor},
    [KVF_MSG_ENGINE_LOOKUP]       = {"ENGINE_LOOKUP",
                                     &kvf__engine_lookup__descriptor},
    [KVF_MSG_ENGINE_LOOKUP_REPLY] = {"ENGINE_LOOKUP_REPLY",
                                     &kvf__engine_lookup_reply__descriptor},
    [KVF_MSG_ENGINE_RETRIEVE]     = {"ENGINE_RETRIEVE",
                                     &kvf__engine_retrieve__descriptor},
    [KVF_MSG_ENGINE_RELEASE]      = {"ENGINE_RELEASE",
                                     &kvf__engine_release__descriptor},
    [KVF_MSG_ENGINE_STATS] = {"ENGINE_STATS", &kvf__engine_stats__descriptor},
    [KVF_MSG_ENGINE_STATS_REPLY] = {"ENGINE_STATS_REPLY",
                                    &kvf__engine_stats_reply__descriptor},
    [KVF_MSG_PEER_FETCH]         = {"PEER_FETCH", &kvf__peer_fetch__descriptor},
    [KVF_MSG_PEER_CHUNK]         = {"PEER_CHUNK", &kvf__peer_chunk__descriptor},
    [KVF_MSG_ENGINE_PD_PUSH]     = {"ENGINE_PD_PUSH",
                                    &kvf__engine_pd_push__descriptor},
    [KVF_MSG_ENGINE_PD_WAIT]     = {"ENGINE_PD_WAIT",
                                    &kvf__engine_pd_wait__descriptor},
    [KVF_MSG_ENGINE_PD_RELEASE]  = {"ENGINE_PD_RELEASE",
                                    &kvf__engine_pd_release__descriptor},
    [KVF_MSG_PD_ALLOC]           = {"PD_ALLOC", &kvf__pd_alloc__descriptor},
    [KVF_MSG_PD_ALLOC_REPLY]     = {"PD_ALLOC_REPLY",
                                    &kvf__pd_alloc_reply__descriptor},
    [KVF_MSG_PD_DATA]            = {"PD_DATA", &kvf__pd_data__descriptor},
    [KVF_MSG_PD_DONE]            = {"PD_DONE", &kvf__pd_done__descriptor},
    [KVF_MSG_PD_DONE_REPLY]      = {"PD_DONE_REPLY",
                                    &kvf__pd_done_reply__descriptor},
    [KVF_MSG_PD_ABORT]           = {"PD_ABORT", &kvf__pd_abort__descriptor},
    [KVF_MSG_PEER_CHUNKS] = {"PEER_CHUNKS", &kvf__peer_chunks__descriptor},
};

const ProtobufCMessageDescriptor *kvf_msg_descriptor(uint16_t type)
{
    return (type < KVF_MSG_TYPE_MAX) ? kvf_msg_descs[type].descriptor : NULL;
}

const char *kvf_msg_type_name(uint16_t type)
{
    if ((type >= KVF_MSG_TYPE_MAX) || (kvf_msg_descs[type].name == NULL)) {
        return "UNKNOWN";
    }
    return kvf_msg_descs[type].name;
}

const char *kvf_msg_role_name(int role)
{
    switch (role) {
    case KVF__ROLE__ROLE_BOTH:
        return "both";
    case KVF__ROLE__ROLE_PREFILL:
        return "prefill";
    case KVF__ROLE__ROLE_DECODE:
        return "decode";
    default:
        return "-";
    }
}

const char *kvf_msg_command_name(int type)
{
    static const char *const names[] = {
        [KVF__COMMAND_TYPE__COMMAND_NONE]      = "none",
        [KVF__COMMAND_TYPE__COMMAND_RESYNC]    = "resync",
        [KVF__COMMAND_TYPE__COMMAND_PIN]       = "pin",
        [KVF__COMMAND_TYPE__COMMAND_UNPIN]     = "unpin",
        [KVF__COMMAND_TYPE__COMMAND_CLEAR]     = "clear",
        [KVF__COMMAND_TYPE__COMMAND_DRAIN]     = "drain",
        [KVF__COMMAND_TYPE__COMMAND_REPLICATE] = "replicate",
        [KVF__COMMAND_TYPE__COMMAND_SOFT_PIN]  = "soft-pin",
        [KVF__COMMAND_TYPE__COMMAND_UNDRAIN]   = "undrain",
        [KVF__COMMAND_TYPE__COMMAND_FOLLOW]    = "follow",
    };

    if ((type < 0) || ((size_t)type >= sizeof(names) / sizeof(names[0]))) {
        return NULL;
    }
    return names[type];
}

size_t kvf_msg_scalars_json(const ProtobufCMessage *msg, char *out, size_t len)
{
    const ProtobufCMessageDescriptor *desc = msg->descriptor;
    const char *base                       = (const char *)msg;
    size_t used                            = 0, i;
    int n;

    if (len == 0) {
        return 0;
    }
    out[0] = '\0';
    for (i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        const void *p                     = base + f->offset;
        const char *sep                   = (used > 0) ? "," : "";

        if ((f->label == PROTOBUF_C_LABEL_REPEATED) ||
            (strcmp(f->name, "request_id") == 0) ||
            (strcmp(f->name, "status") == 0)) {
            continue;
        }
        switch (f->type) {
        case PROTOBUF_C_TYPE_BOOL:
            n = snprintf(out + used, len - used, "%s\"%s\":%s", sep, f->name,
                         *(const protobuf_c_boolean *)p ? "true" : "false");
            break;
        case PROTOBUF_C_TYPE_UINT32:
        case PROTOBUF_C_TYPE_FIXED32:
            n = snprintf(out + used, len - used, "%s\"%s\":%u", sep, f->name,
                         (unsigned)*(const uint32_t *)p);
            break;
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_FIXED64:
            n = snprintf(out + used, len - used, "%s\"%s\":%llu", sep, f->name,
                         (unsigned long long)*(const uint64_t *)p);
            break;
        case PROTOBUF_C_TYPE_INT32:
            n = snprintf(out + used, len - used, "%s\"%s\":%d", sep, f->name,
                         (int)*(const int32_t *)p);
            break;
        default:
            continue; /* strings, bytes, messages: not scalars */
        }
        if ((n < 0) || ((size_t)n >= len - used)) {
            out[used] = '\0';
            break;
        }
        used += (size_t)n;
    }
    return used;
}

static void kvf_frame_put_hdr(uint8_t *p, uint32_t length, uint16_t type,
                              uint16_t flags)
{
    kvf_le32_put(p, length);
    kvf_le16_put(p + 4, type);
    kvf_le16_put(p + 6, flags);
}

kvf_status_t kvf_frame_check_hdr(const void *data, uint32_t max_frame,
                                 kvf_frame_t *frame)
{
    const uint8_t *hdr = data;

    frame->length = kvf_le32_get(hdr);
    frame->type   = kvf_le16_get(hdr + 4);
    frame->flags  = kvf_le16_get(hdr + 6);
    frame->msg    = NULL;
    if (frame->length > max_frame) {
        return KVF_ERR_TOO_BIG;
    }
    if ((kvf_msg_descriptor(frame->type) == NULL) ||
        (frame->flags & ~KVF_FRAME_FLAGS_ALL)) {
        return KVF_ERR_PROTO;
    }
    return KVF_OK;
}

static kvf_status_t kvf_frame_unpack_payload(const uint8_t *payload,
                                             ProtobufCAllocator *alloc,
                                             kvf_frame_t *frame)
{
    frame->msg = protobuf_c_message_unpack(kvf_msg_descriptor(frame->type),
                                           alloc, frame->length, payload);
    return (frame->msg == NULL) ? KVF_ERR_PROTO : KVF_OK;
}

kvf_status_t kvf_frame_decode_buf(const void *data, size_t len,
                                  uint32_t max_frame, ProtobufCAllocator *alloc,
                                  kvf_frame_t *frame_p, size_t *consumed_p)
{
    const uint8_t *bytes = data;
    kvf_frame_t frame;
    kvf_status_t status;

    if (len < KVF_FRAME_HDR_SIZE) {
        return KVF_INPROGRESS;
    }
    status = kvf_frame_check_hdr(bytes, max_frame, &frame);
    if (status == KVF_ERR_PROTO) {
        *consumed_p = KVF_FRAME_HDR_SIZE; /* skip what we know is bad */
    }
    if (status != KVF_OK) {
        return status;
    }
    if (len - KVF_FRAME_HDR_SIZE < frame.length) {
        return KVF_INPROGRESS;
    }
    *consumed_p = KVF_FRAME_HDR_SIZE + (size_t)frame.length;
    status =
        kvf_frame_unpack_payload(bytes + KVF_FRAME_HDR_SIZE, alloc, &frame);
    if (status != KVF_OK) {
        return status;
    }
    *frame_p = frame;
    return KVF_OK;
}

void kvf_frame_release(kvf_frame_t *frame, ProtobufCAllocator *alloc)
{
    if (frame->msg != NULL) {
        protobuf_c_message_free_unpacked(frame->msg, alloc);
        frame->msg = NULL;
    }
}

size_t kvf_frame_size(const ProtobufCMessage *msg)
{
    return KVF_FRAME_HDR_SIZE + protobuf_c_message_get_packed_size(msg);
}

static kvf_status_t kvf_frame_check_msg(uint16_t type, uint16_t flags,
                                        const ProtobufCMessage *msg,
                                        size_t payload, uint32_t max_frame)
{
    if ((msg == NULL) || (kvf_msg_descriptor(type) != msg->descriptor) ||
        (flags & ~KVF_FRAME_FLAGS_ALL)) {
        return KVF_ERR_INVALID;
    }
    if (payload > max_frame) {
        return KVF_ERR_TOO_BIG;
    }
    return KVF_OK;
}

kvf_status_t kvf_frame_pack(void *buf, size_t buf_len, uint16_t type,
                            uint16_t flags, const ProtobufCMessage *msg,
                            uint32_t max_frame, size_t *len_p)
{
    uint8_t *bytes = buf;
    kvf_status_t status;
    size_t payload;

    if (msg == NULL) {
        return KVF_ERR_INVALID;
    }
    payload = protobuf_c_message_get_packed_size(msg);
    status  = kvf_frame_check_msg(type, flags, msg, payload, max_frame);
    if (status != KVF_OK) {
        return status;
    }
    if (buf_len < KVF_FRAME_HDR_SIZE + payload) {
        return KVF_ERR_TOO_BIG;
    }
    kvf_frame_put_hdr(bytes, (uint32_t)payload, type, flags);
    protobuf_c_message_pack(msg, bytes + KVF_FRAME_HDR_SIZE);
    *len_p = KVF_FRAME_HDR_SIZE + payload;
    return KVF_OK;
}
