/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/events.h"

#include "common/log.h"

#include <kvfabric/keys.h>

#include <event2/event.h>

#include <msgpack.h>
#include <zmq.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct kvf_events_kept {
    uint64_t seq;
    size_t len;
    size_t cap;
    uint8_t *data; /* owned; grows, never shrinks */
} kvf_events_kept_t;

struct kvf_events {
    void *ctx;
    void *pub;
    void *router;            /* NULL: no replay */
    struct event *ev_router; /* readable: ZMQ_FD of the ROUTER socket */
    msgpack_sbuffer sbuf;    /* the batch being built, reused */
    kvf_events_kept_t *ring; /* [cap], the last batches */
    uint32_t cap;
    uint64_t next_seq;
    uint64_t dropped; /* batches the PUB socket refused */
    char endpoint[256];
    char replay_endpoint[256];
};

static const char *const kvf_events_names[] = {
    [KVF_EVENTS_STORED]  = "BlockStored",
    [KVF_EVENTS_REMOVED] = "BlockRemoved",
    [KVF_EVENTS_CLEARED] = "AllBlocksCleared",
};

static void kvf_events_put_be64(uint8_t *p, uint64_t v)
{
    int i;

    for (i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

static void kvf_events_str(msgpack_packer *pk, const char *s)
{
    size_t len = strlen(s);

    msgpack_pack_str(pk, len);
    msgpack_pack_str_body(pk, s, len);
}

/* Answers the replay requests waiting on the ROUTER socket. ZMQ_FD is
 * edge-triggered: read until ZMQ_EVENTS says nothing is left. */
static void kvf_events_serve_replay(kvf_events_t *events)
{
    static const uint8_t end_seq[8] = {0xff, 0xff, 0xff, 0xff,
                                       0xff, 0xff, 0xff, 0xff};
    uint8_t id[256], delim[8], start[16], seq[8];
    uint64_t begin, i;
    int more, n_id, n_delim, n_start;
    size_t more_len;

    for (;;) {
        int ev        = 0;
        size_t ev_len = sizeof(ev);

        if ((zmq_getsockopt(events->router, ZMQ_EVENTS, &ev, &ev_len) != 0) ||
            !(ev & ZMQ_POLLIN)) {
            return;
        }
        n_id = zmq_recv(events->router, id, sizeof(id), ZMQ_DONTWAIT);
        if (n_id < 0) {
            return;
        }
        n_delim = n_start = -1;
        more              = 0;
        more_len          = sizeof(more);
        zmq_getsockopt(events->router, ZMQ_RCVMORE, &more, &more_len);
        if (more) {
            n_delim = zmq_recv(events->router, delim, sizeof(delim), 0);
            zmq_getsockopt(events->router, ZMQ_RCVMORE, &more, &more_len);
        }
        if (more) {
            n_start = zmq_recv(events->router, start, sizeof(start), 0);
            zmq_getsockopt(events->router, ZMQ_RCVMORE, &more, &more_len);
        }
        while (more) { /* a longer request: drop the rest */
            zmq_recv(events->router, start, sizeof(start), 0);
            zmq_getsockopt(events->router, ZMQ_RCVMORE, &more, &more_len);
        }
        if ((n_id > (int)sizeof(id)) || (n_delim != 0) || (n_start != 8)) {
            kvf_debug("events: malformed replay request dropped");
            continue;
        }
        begin = 0;
        for (i = 0; i < 8; i++) {
            begin = (begin << 8) | start[i];
        }
        i = (events->next_seq > events->cap) ? events->next_seq - events->cap
                                             : 0;
        if (begin > i) {
            i = begin;
        }
        for (; i < events->next_seq; i++) {
            const kvf_events_kept_t *k = &events->ring[i % events->cap];

            kvf_events_put_be64(seq, k->seq);
            if ((zmq_send(events->router, id, (size_t)n_id, ZMQ_SNDMORE) < 0) ||
                (zmq_send(events->router, "", 0, ZMQ_SNDMORE) < 0) ||
                (zmq_send(events->router, seq, 8, ZMQ_SNDMORE) < 0) ||
                (zmq_send(events->router, k->data, k->len, 0) < 0)) {
                break; /* the client went away */
            }
        }
        zmq_send(events->router, id, (size_t)n_id, ZMQ_SNDMORE);
        zmq_send(events->router, "", 0, ZMQ_SNDMORE);
        zmq_send(events->router, end_seq, 8, ZMQ_SNDMORE);
        zmq_send(events->router, "", 0, 0);
    }
}

static void kvf_events_on_router(evutil_socket_t fd, short what, void *arg)
{
    kvf_events_serve_replay(arg);
}

/* Binds @p sock to @p endpoint; the endpoint bound (port 0 resolved) into
 * @p out. */
static kvf_status_t kvf_events_bind(void *sock, const char *endpoint, char *out,
                                    size_t len)
{
    size_t n = len;

    if (zmq_bind(sock, endpoint) != 0) {
        kvf_error("events: cannot bind %s: %s", endpoint,
                  zmq_strerror(zmq_errno()));
        return KVF_ERR_CONFIG;
    }
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, out, &n) != 0) {
        snprintf(out, len, "%s", endpoint);
    }
    return KVF_OK;
}

kvf_status_t kvf_events_create(struct event_base *base, const char *endpoint,
                               const char *replay, uint32_t buffer,
                               kvf_events_t **events_p)
{
    kvf_events_t *events;
    kvf_status_t status = KVF_ERR_NO_MEMORY;
    int linger = 0, hwm = 100000;
    int fd;
    size_t fd_len = sizeof(fd);

    events = calloc(1, sizeof(*events));
    if (events == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    msgpack_sbuffer_init(&events->sbuf);
    events->cap  = (buffer > 0) ? buffer : 1;
    events->ring = calloc(events->cap, sizeof(*events->ring));
    events->ctx  = zmq_ctx_new();
    if ((events->ring == NULL) || (events->ctx == NULL)) {
        goto err;
    }
    events->pub = zmq_socket(events->ctx, ZMQ_PUB);
    if (events->pub == NULL) {
        goto err;
    }
    zmq_setsockopt(events->pub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(events->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    status = kvf_events_bind(events->pub, endpoint, events->endpoint,
                             sizeof(events->endpoint));
    if (status != KVF_OK) {
        goto err;
    }
    if ((replay != NULL) && (replay[0] != '\0')) {
        status         = KVF_ERR_NO_MEMORY;
        events->router = zmq_socket(events->ctx, ZMQ_ROUTER);
        if (events->router == NULL) {
            goto err;
        }
        zmq_setsockopt(events->router, ZMQ_LINGER, &linger, sizeof(linger));
        status =
            kvf_events_bind(events->router, replay, events->replay_endpoint,
                            sizeof(events->replay_endpoint));
        if (status != KVF_OK) {
            goto err;
        }
        status = KVF_ERR_IO;
        if (zmq_getsockopt(events->router, ZMQ_FD, &fd, &fd_len) != 0) {
            goto err;
        }
        status            = KVF_ERR_NO_MEMORY;
        events->ev_router = event_new(base, fd, EV_READ | EV_PERSIST,
                                      kvf_events_on_router, events);
        if ((events->ev_router == NULL) ||
            (event_add(events->ev_router, NULL) != 0)) {
            goto err;
        }
    }
    kvf_info("kv events published on %s%s%s", events->endpoint,
             (events->router != NULL) ? ", replay on " : "",
             events->replay_endpoint);
    *events_p = events;
    return KVF_OK;

err:
    kvf_events_destroy(events);
    return status;
}

void kvf_events_destroy(kvf_events_t *events)
{
    uint32_t i;

    if (events == NULL) {
        return;
    }
    if (events->ev_router != NULL) {
        event_free(events->ev_router);
    }
    if (events->router != NULL) {
        zmq_close(events->router);
    }
    if (events->pub != NULL) {
        zmq_close(events->pub);
    }
    if (events->ctx != NULL) {
        zmq_ctx_term(events->ctx);
    }
    for (i = 0; (events->ring != NULL) && (i < events->cap); i++) {
        free(events->ring[i].data);
    }
    free(events->ring);
    msgpack_sbuffer_destroy(&events->sbuf);
    free(events);
}

/* Packs the batch into events->sbuf, as msgspec encodes vLLM's
 * KVEventBatch (fields in declaration order, defaults omitted). */
static void kvf_events_pack(kvf_events_t *events, kvf_events_kind_t kind,
                            uint32_t node_id, const uint8_t *keys, size_t n,
                            uint32_t block_size)
{
    msgpack_packer pk;
    struct timespec ts;
    size_t i;

    clock_gettime(CLOCK_REALTIME, &ts);
    msgpack_sbuffer_clear(&events->sbuf);
    msgpack_packer_init(&pk, &events->sbuf, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    kvf_events_str(&pk, "ts");
    msgpack_pack_double(&pk, (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
    kvf_events_str(&pk, "events");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, (kind == KVF_EVENTS_STORED)    ? 8
                          : (kind == KVF_EVENTS_REMOVED) ? 3
                                                         : 1);
    kvf_events_str(&pk, "type");
    kvf_events_str(&pk, kvf_events_names[kind]);
    if (kind != KVF_EVENTS_CLEARED) {
        kvf_events_str(&pk, "block_hashes");
        msgpack_pack_array(&pk, n);
        for (i = 0; i < n; i++) {
            kvf_key_t key;
            uint8_t digest[16];

            kvf_key_unpack(keys + i * KVF_KEY_WIRE_SIZE, &key);
            kvf_events_put_be64(digest, key.hi);
            kvf_events_put_be64(digest + 8, key.lo);
            msgpack_pack_bin(&pk, sizeof(digest));
            msgpack_pack_bin_body(&pk, digest, sizeof(digest));
        }
    }
    if (kind == KVF_EVENTS_STORED) {
        kvf_events_str(&pk, "parent_block_hash");
        msgpack_pack_nil(&pk);
        kvf_events_str(&pk, "token_ids");
        msgpack_pack_array(&pk, 0);
        kvf_events_str(&pk, "block_size");
        msgpack_pack_uint32(&pk, block_size);
        kvf_events_str(&pk, "lora_id");
        msgpack_pack_nil(&pk);
    }
    if (kind != KVF_EVENTS_CLEARED) {
        kvf_events_str(&pk, "medium");
        kvf_events_str(&pk, "CPU");
    }
    if (kind == KVF_EVENTS_STORED) {
        kvf_events_str(&pk, "lora_name");
        msgpack_pack_nil(&pk);
    }
    kvf_events_str(&pk, "data_parallel_rank");
    msgpack_pack_uint32(&pk, node_id);
}

void kvf_events_publish(kvf_events_t *events, kvf_events_kind_t kind,
                        uint32_t node_id, const char *node_name,
                        const uint8_t *keys, size_t n, uint32_t block_size)
{
    kvf_events_kept_t *k;
    uint8_t seq[8];

    if (events == NULL) {
        return;
    }
    kvf_events_pack(events, kind, node_id, keys, n, block_size);
    k = &events->ring[events->next_seq % events->cap];
    if (k->cap < events->sbuf.size) {
        uint8_t *data = realloc(k->data, events->sbuf.size);

        if (data == NULL) {
            kvf_warn("events: no memory to keep batch %" PRIu64,
                     events->next_seq);
            k->len = 0;
        } else {
            k->data = data;
            k->cap  = events->sbuf.size;
        }
    }
    if (k->cap >= events->sbuf.size) {
        memcpy(k->data, events->sbuf.data, events->sbuf.size);
        k->len = events->sbuf.size;
    }
    k->seq = events->next_seq++;
    kvf_events_put_be64(seq, k->seq);
    if ((zmq_send(events->pub, node_name, strlen(node_name),
                  ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) ||
        (zmq_send(events->pub, seq, sizeof(seq), ZMQ_SNDMORE | ZMQ_DONTWAIT) <
         0) ||
        (zmq_send(events->pub, events->sbuf.data, events->sbuf.size,
                  ZMQ_DONTWAIT) < 0)) {
        events->dropped++;
    }
}

void kvf_events_poll(kvf_events_t *events)
{
    if ((events != NULL) && (events->router != NULL)) {
        kvf_events_serve_replay(events);
    }
}

uint64_t kvf_events_count(const kvf_events_t *events)
{
    return (events != NULL) ? events->next_seq : 0;
}

uint64_t kvf_events_dropped(const kvf_events_t *events)
{
    return (events != NULL) ? events->dropped : 0;
}

const char *kvf_events_endpoint(const kvf_events_t *events)
{
    return events->endpoint;
}

const char *kvf_events_replay_endpoint(const kvf_events_t *events)
{
    return events->replay_endpoint;
}
