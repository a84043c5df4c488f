/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The frame codec over libevent buffers, for the daemons' event loops. Kept
 * apart from frame.c so that libkvfabric (which links frame.c) does not
 * link libevent.
 */
#include "proto/frame.h"

#include <event2/buffer.h>

kvf_status_t kvf_frame_decode(struct evbuffer *in, uint32_t max_frame,
                              ProtobufCAllocator *alloc, kvf_frame_t *frame_p)
{
    uint8_t hdr[KVF_FRAME_HDR_SIZE];
    const uint8_t *bytes;
    kvf_frame_t frame;
    kvf_status_t status;
    size_t avail = evbuffer_get_length(in);
    size_t total, used = 0;

    if (avail < KVF_FRAME_HDR_SIZE) {
        return KVF_INPROGRESS;
    }
    /* peek the header only: nothing is copied or made contiguous until the
     * declared length has been checked */
    if (evbuffer_copyout(in, hdr, sizeof(hdr)) != (ev_ssize_t)sizeof(hdr)) {
        return KVF_ERR_IO;
    }
    status = kvf_frame_check_hdr(hdr, max_frame, &frame);
    if (status != KVF_OK) {
        return status;
    }
    total = KVF_FRAME_HDR_SIZE + (size_t)frame.length;
    if (avail < total) {
        return KVF_INPROGRESS;
    }
    bytes = evbuffer_pullup(in, (ev_ssize_t)total);
    if (bytes == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status =
        kvf_frame_decode_buf(bytes, total, max_frame, alloc, frame_p, &used);
    evbuffer_drain(in, total);
    return status;
}

kvf_status_t kvf_frame_encode(struct evbuffer *out, uint16_t type,
                              uint16_t flags, const ProtobufCMessage *msg,
                              uint32_t max_frame)
{
    struct evbuffer_iovec vec;
    kvf_status_t status;
    size_t total;

    if ((msg == NULL) || (kvf_msg_descriptor(type) != msg->descriptor)) {
        return KVF_ERR_INVALID;
    }
    total = kvf_frame_size(msg);
    if (total - KVF_FRAME_HDR_SIZE > max_frame) {
        return KVF_ERR_TOO_BIG; /* before reserving that much */
    }
    /* pack straight into the output buffer's free space: no bounce copy */
    if (evbuffer_reserve_space(out, (ev_ssize_t)total, &vec, 1) != 1) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_frame_pack(vec.iov_base, total, type, flags, msg, max_frame,
                            &total);
    if (status != KVF_OK) {
        return status; /* nothing committed: the reservation is dropped */
    }
    vec.iov_len = total;
    if (evbuffer_commit_space(out, &vec, 1) != 0) {
        return KVF_ERR_NO_MEMORY;
    }
    return KVF_OK;
}
