/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * proto/evconn.c: a pipelined batch is read in one callback (not 4 KiB at
 * a time as a libevent 2.1 bufferevent does), every frame is answered and
 * the replies leave; a bad frame is answered and closes after the flush; a
 * peer that goes away closes the connection.
 */
#include "proto/evconn.h"

#include <criterion/criterion.h>

#include <event2/event.h>

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FRAMES 64 /* of about 1 KiB each: 64 KiB in one write */

static struct {
    int reads;
    int frames;
    int bad;
    int closes;
    kvf_status_t why;
    kvf_evconn_t *conn;
} g;

static kvf_status_t on_frame(kvf_evconn_t *conn, kvf_frame_t *frame)
{
    const Kvf__Status *st = (const Kvf__Status *)frame->msg;
    Kvf__Status rep;
    char text[] = "ok";

    cr_assert_eq(frame->type, KVF_MSG_STATUS);
    cr_assert_eq(st->request_id, (uint64_t)g.frames);
    g.frames++;
    kvf__status__init(&rep);
    rep.request_id = st->request_id;
    rep.message    = text;
    return kvf_evconn_send(conn, KVF_MSG_STATUS, &rep.base);
}

static kvf_status_t on_bad_frame(kvf_evconn_t *conn, kvf_status_t status)
{
    g.bad++;
    return KVF_ERR_PROTO;
}

static bool on_read(kvf_evconn_t *conn)
{
    g.reads++;
    return true;
}

static void on_close(kvf_evconn_t *conn, kvf_status_t why)
{
    g.closes++;
    g.why = why;
    kvf_evconn_destroy(conn);
    g.conn = NULL;
}

static const kvf_evconn_ops_t ops = {
    .on_frame     = on_frame,
    .on_bad_frame = on_bad_frame,
    .on_read      = on_read,
    .on_close     = on_close,
};

static struct event_base *g_base;
static kvf_evconn_group_t g_group;
static int g_peer = -1;

static void setup(void)
{
    int sv[2];

    memset(&g, 0, sizeof(g));
    g_base = event_base_new();
    cr_assert_not_null(g_base);
    memset(&g_group, 0, sizeof(g_group));
    g_group.base              = g_base;
    g_group.ops               = &ops;
    g_group.max_frame         = 1u << 20;
    g_group.max_frame_preauth = 1u << 20;
    g_group.max_output        = 64u << 20;
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    g_peer = sv[1];
    g.conn = kvf_evconn_create(&g_group, sv[0], NULL, NULL);
    cr_assert_not_null(g.conn);
}

static void teardown(void)
{
    kvf_evconn_destroy(g.conn);
    if (g_peer >= 0) {
        close(g_peer);
    }
    event_base_free(g_base);
}

TestSuite(evconn, .init = setup, .fini = teardown);

/* Writes @p n STATUS frames of about 1 KiB in one write(). */
static void send_batch(int n)
{
    static uint8_t buf[FRAMES * 1100];
    char text[1001];
    size_t used = 0;
    int i;

    memset(text, 'x', sizeof(text) - 1);
    text[sizeof(text) - 1] = '\0';
    for (i = 0; i < n; i++) {
        Kvf__Status st;
        size_t len = 0;

        kvf__status__init(&st);
        st.request_id = (uint64_t)i;
        st.message    = text;
        cr_assert_eq(kvf_frame_pack(buf + used, sizeof(buf) - used,
                                    KVF_MSG_STATUS, 0, &st.base, 1u << 20,
                                    &len),
                     KVF_OK);
        used += len;
    }
    cr_assert_eq(write(g_peer, buf, used), (ssize_t)used);
}

/* Reads replies until @p n STATUS frames came back or 5 s passed. */
static int count_replies(int n)
{
    static uint8_t buf[1 << 16];
    size_t have = 0, off = 0;
    int got = 0;

    while (got < n) {
        struct pollfd pfd = {.fd = g_peer, .events = POLLIN};
        ssize_t r;

        if (poll(&pfd, 1, 5000) != 1) {
            break;
        }
        r = read(g_peer, buf + have, sizeof(buf) - have);
        if (r <= 0) {
            break;
        }
        have += (size_t)r;
        for (;;) {
            kvf_frame_t frame;
            size_t used = 0;

            if (kvf_frame_decode_buf(buf + off, have - off, 1u << 20, NULL,
                                     &frame, &used) != KVF_OK) {
                break;
            }
            off += used;
            kvf_frame_release(&frame, NULL);
            got++;
        }
    }
    return got;
}

Test(evconn, pipelined_batch_is_read_in_one_callback_and_answered)
{
    send_batch(FRAMES);
    cr_assert_eq(event_base_loop(g_base, EVLOOP_ONCE), 0);
    /* 64 KiB waiting: one recv() takes it, not 16 reads of 4 KiB */
    cr_assert_eq(g.reads, 1, "reads: %d", g.reads);
    cr_assert_eq(g.frames, FRAMES);
    cr_assert_eq(count_replies(FRAMES), FRAMES);
    cr_assert_eq(g_group.buffered, 0, "nothing left held");
}

Test(evconn, bad_frame_is_answered_then_closed)
{
    static const uint8_t junk[16] = {0xff, 0xff, 0xff, 0x7f};

    cr_assert_eq(write(g_peer, junk, sizeof(junk)), (ssize_t)sizeof(junk));
    cr_assert_eq(event_base_loop(g_base, EVLOOP_ONCE), 0);
    cr_assert_eq(g.bad, 1);
    cr_assert_eq(g.closes, 1);
    cr_assert_eq(g.why, KVF_ERR_PROTO);
}

Test(evconn, peer_gone_closes)
{
    close(g_peer);
    g_peer = -1;
    cr_assert_eq(event_base_loop(g_base, EVLOOP_ONCE), 0);
    cr_assert_eq(g.closes, 1);
    cr_assert_eq(g.why, KVF_ERR_CLOSED);
}

Test(evconn, late_reply_leaves_on_the_next_turn)
{
    Kvf__Status rep;
    char text[] = "later";

    kvf__status__init(&rep);
    rep.message = text;
    cr_assert_eq(kvf_evconn_send(g.conn, KVF_MSG_STATUS, &rep.base), KVF_OK);
    cr_assert_eq(event_base_loop(g_base, EVLOOP_ONCE), 0);
    cr_assert_eq(count_replies(1), 1);
}
