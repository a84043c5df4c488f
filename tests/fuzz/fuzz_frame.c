/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * libFuzzer target for the frame decoder: feeds arbitrary bytes through
 * kvf_frame_decode_buf() and the evbuffer path, frame after frame, with a
 * small maximum frame size so the size check is reached too.
 */
#include "proto/frame.h"

#include <event2/buffer.h>

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct evbuffer *buf;
    kvf_frame_t frame;
    size_t off = 0, used;
    kvf_status_t status;

    /* flat-buffer path (UCX active messages) */
    while (off < size) {
        used   = 0;
        status = kvf_frame_decode_buf(data + off, size - off, 4096, NULL,
                                      &frame, &used);
        if (status == KVF_OK) {
            kvf_frame_release(&frame, NULL);
        } else if ((status != KVF_ERR_PROTO) || (used == 0)) {
            break;
        }
        off += used;
    }

    /* evbuffer path (TCP and Unix sockets) */
    buf = evbuffer_new();
    if (buf == NULL) {
        return 0;
    }
    evbuffer_add(buf, data, size);
    for (;;) {
        status = kvf_frame_decode(buf, 4096, NULL, &frame);
        if (status != KVF_OK) {
            break;
        }
        kvf_frame_release(&frame, NULL);
    }
    evbuffer_free(buf);
    return 0;
}
