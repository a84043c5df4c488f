/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "common/evjson.h"

#include <event2/buffer.h>

void kvf_evjson_add_str(struct evbuffer *b, const char *s)
{
    evbuffer_add(b, "\"", 1);
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;

        if ((c == '"') || (c == '\\')) {
            evbuffer_add_printf(b, "\\%c", c);
        } else if (c < 0x20) {
            evbuffer_add_printf(b, "\\u%04x", c);
        } else {
            evbuffer_add(b, s, 1);
        }
    }
    evbuffer_add(b, "\"", 1);
}
