/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * proto/evconn.c: a pipelined batch is read in one callback (not 4 KiB at
 * a time as a libevent 2.1 bufferevent does), every frame is answered and
 * the replies leave; a bad frame is answered and closes after the flush; a
 * peer that goes away closes the connection. Client connections
 * (kvf_evconn_connect): a connect to a listener on loopback, one refused,
 * the TLS client handshake against the server side of evconn, and a
 * handler that drops its connection mid-batch.
 */
#include "proto/evconn.h"

#include "common/tls.h"

#include <criterion/criterion.h>

#include <event2/event.h>

#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
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

static struct {
    struct event_base *base;
    kvf_evconn_group_t server, client;
    int lfd;
    struct event *lev;
    struct sockaddr_in addr;
    SSL_CTX *server_tls; /* NULL: plain */
    kvf_evconn_t *accepted, *conn;
    int connected, frames, server_frames, closes, served;
    kvf_status_t why;
    char problem[256];
    bool drop_in_handler;
    char dir[64];
} c;

static kvf_status_t srv_on_frame(kvf_evconn_t *conn, kvf_frame_t *frame)
{
    Kvf__Status rep;
    int i;

    c.server_frames++;
    kvf__status__init(&rep);
    for (i = 0; i < 3; i++) { /* three replies in one write */
        rep.request_id = (uint64_t)i;
        cr_assert_eq(kvf_evconn_send(conn, KVF_MSG_STATUS, &rep.base), KVF_OK);
    }
    return KVF_OK;
}

static void srv_on_close(kvf_evconn_t *conn, kvf_status_t why)
{
    kvf_evconn_destroy(conn);
    c.accepted = NULL;
}

static const kvf_evconn_ops_t srv_ops = {
    .on_frame = srv_on_frame,
    .on_close = srv_on_close,
};

static void cli_on_connected(kvf_evconn_t *conn)
{
    Kvf__Status req;

    c.connected++;
    kvf__status__init(&req);
    cr_assert_eq(kvf_evconn_request(conn, KVF_MSG_STATUS, &req.base), KVF_OK);
}

static kvf_status_t cli_on_frame(kvf_evconn_t *conn, kvf_frame_t *frame)
{
    c.frames++;
    if (c.drop_in_handler) {
        kvf_evconn_destroy(conn); /* mid-batch: two more frames buffered */
        c.conn = NULL;
        return KVF_OK;
    }
    return KVF_OK;
}

static void cli_on_close(kvf_evconn_t *conn, kvf_status_t why)
{
    c.closes++;
    c.why = why;
    snprintf(c.problem, sizeof(c.problem), "%s", kvf_evconn_problem(conn));
    kvf_evconn_destroy(conn);
    c.conn = NULL;
}

static void cli_on_served(kvf_evconn_t *conn, uint64_t ns)
{
    c.served++;
}

static const kvf_evconn_ops_t cli_ops = {
    .on_frame     = cli_on_frame,
    .on_close     = cli_on_close,
    .on_served    = cli_on_served,
    .on_connected = cli_on_connected,
};

static void on_accept(evutil_socket_t lfd, short what, void *arg)
{
    int fd   = accept(lfd, NULL, NULL);
    SSL *ssl = NULL;

    cr_assert_geq(fd, 0);
    if (c.server_tls != NULL) {
        ssl = SSL_new(c.server_tls);
        cr_assert_not_null(ssl);
        cr_assert_eq(SSL_set_fd(ssl, fd), 1);
        SSL_set_accept_state(ssl);
    }
    c.accepted = kvf_evconn_create(&c.server, fd, ssl, NULL);
    cr_assert_not_null(c.accepted);
}

static void group_init(kvf_evconn_group_t *group, const kvf_evconn_ops_t *o)
{
    memset(group, 0, sizeof(*group));
    group->base              = c.base;
    group->ops               = o;
    group->max_frame         = 1u << 20;
    group->max_frame_preauth = 1u << 20;
    group->max_output        = 64u << 20;
}

static void client_setup(void)
{
    socklen_t len = sizeof(c.addr);

    memset(&c, 0, sizeof(c));
    c.base = event_base_new();
    cr_assert_not_null(c.base);
    group_init(&c.server, &srv_ops);
    group_init(&c.client, &cli_ops);
    c.lfd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(c.lfd, 0);
    c.addr.sin_family      = AF_INET;
    c.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(c.lfd, (struct sockaddr *)&c.addr, sizeof(c.addr)), 0);
    cr_assert_eq(listen(c.lfd, 8), 0);
    cr_assert_eq(getsockname(c.lfd, (struct sockaddr *)&c.addr, &len), 0);
    c.lev = event_new(c.base, c.lfd, EV_READ | EV_PERSIST, on_accept, NULL);
    cr_assert_not_null(c.lev);
    cr_assert_eq(event_add(c.lev, NULL), 0);
}

static void client_teardown(void)
{
    kvf_evconn_destroy(c.conn);
    kvf_evconn_destroy(c.accepted);
    SSL_CTX_free(c.server_tls);
    event_free(c.lev);
    close(c.lfd);
    event_base_free(c.base);
    if (c.dir[0] != '\0') {
        char cmd[160];

        snprintf(cmd, sizeof(cmd), "rm -rf %s", c.dir);
        cr_assert_eq(system(cmd), 0);
    }
}

TestSuite(evconn_client, .init = client_setup, .fini = client_teardown);

/* Runs the loop until @p done is true or 10 s passed. */
#define LOOP_UNTIL(done) \
    do { \
        struct timeval tv_ = {.tv_sec = 0, .tv_usec = 10000}; \
        int i_; \
        for (i_ = 0; (i_ < 1000) && !(done); i_++) { \
            event_base_loopexit(c.base, &tv_); \
            event_base_loop(c.base, EVLOOP_ONCE); \
        } \
    } while (0)

static void connect_to(struct sockaddr_in *addr, SSL *ssl)
{
    c.conn = kvf_evconn_connect(&c.client, (struct sockaddr *)addr,
                                sizeof(*addr), ssl, NULL);
    cr_assert_not_null(c.conn, "connect: %s", strerror(errno));
    cr_assert_not(kvf_evconn_is_connected(c.conn));
}

Test(evconn_client, connects_sends_and_reads_replies)
{
    connect_to(&c.addr, NULL);
    LOOP_UNTIL(c.frames == 3);
    cr_assert_eq(c.connected, 1);
    cr_assert(kvf_evconn_is_connected(c.conn));
    cr_assert_eq(c.server_frames, 1, "the request sent in on_connected");
    cr_assert_eq(c.frames, 3);
    cr_assert_eq(c.closes, 0);
    cr_assert_str_empty(kvf_evconn_problem(c.conn));
}

Test(evconn_client, refused_connect_is_reported)
{
    struct sockaddr_in addr = c.addr;

    close(c.lfd); /* nobody listens on that port now */
    c.lfd = socket(AF_INET, SOCK_STREAM, 0);
    event_del(c.lev);
    c.conn = kvf_evconn_connect(&c.client, (struct sockaddr *)&addr,
                                sizeof(addr), NULL, NULL);
    if (c.conn == NULL) { /* refused at once: errno says why */
        cr_assert_eq(errno, ECONNREFUSED);
        return;
    }
    LOOP_UNTIL(c.closes == 1);
    cr_assert_eq(c.closes, 1);
    cr_assert_eq(c.connected, 0);
    cr_assert_eq(c.why, KVF_ERR_IO);
    cr_assert_str_eq(c.problem, strerror(ECONNREFUSED));
}

/* A self-signed certificate for 127.0.0.1 and another one, in c.dir. */
static void make_certs(void)
{
    char cmd[1024], err[512];
    char cert[128], key[128];

    snprintf(c.dir, sizeof(c.dir), "/tmp/kvf-evconn-XXXXXX");
    cr_assert_not_null(mkdtemp(c.dir));
    snprintf(cmd, sizeof(cmd),
             "cd %s && openssl req -x509 -newkey rsa:2048 -nodes -keyout "
             "key.pem -out cert.pem -days 2 -subj /CN=kvf-test -addext "
             "subjectAltName=IP:127.0.0.1 >/dev/null 2>&1 && openssl req "
             "-x509 -newkey rsa:2048 -nodes -keyout other-key.pem -out "
             "other.pem -days 2 -subj /CN=other >/dev/null 2>&1",
             c.dir);
    cr_assert_eq(system(cmd), 0, "openssl req failed");
    snprintf(cert, sizeof(cert), "%s/cert.pem", c.dir);
    snprintf(key, sizeof(key), "%s/key.pem", c.dir);
    cr_assert_eq(
        kvf_tls_server_ctx_create(cert, key, &c.server_tls, err, sizeof(err)),
        KVF_OK, "%s", err);
}

static SSL *client_ssl(const char *ca_name, SSL_CTX **ctx_p)
{
    char ca[128], err[512];
    SSL *ssl;

    snprintf(ca, sizeof(ca), "%s/%s", c.dir, ca_name);
    cr_assert_eq(kvf_tls_client_ctx_create(ca, ctx_p, err, sizeof(err)), KVF_OK,
                 "%s", err);
    ssl = kvf_tls_client_new(*ctx_p, "127.0.0.1");
    cr_assert_not_null(ssl);
    return ssl;
}

Test(evconn_client, tls_client_handshake_against_the_server_side)
{
    SSL_CTX *ctx = NULL;

    make_certs();
    connect_to(&c.addr, client_ssl("cert.pem", &ctx));
    LOOP_UNTIL(c.frames == 3);
    cr_assert_eq(c.connected, 1);
    cr_assert_eq(c.server_frames, 1);
    cr_assert_eq(c.frames, 3);
    cr_assert_eq(c.client.tls_failures, 0);
    SSL_CTX_free(ctx);
}

Test(evconn_client, untrusted_certificate_fails_the_handshake)
{
    SSL_CTX *ctx = NULL;

    make_certs();
    connect_to(&c.addr, client_ssl("other.pem", &ctx));
    LOOP_UNTIL(c.closes == 1);
    cr_assert_eq(c.closes, 1);
    cr_assert_eq(c.connected, 0);
    cr_assert_eq(c.why, KVF_ERR_IO);
    cr_assert_eq(c.client.tls_failures, 1);
    cr_assert_not_null(strstr(c.problem, "certificate not trusted"), "%s",
                       c.problem);
    SSL_CTX_free(ctx);
}

Test(evconn_client, handler_drops_the_connection_mid_batch)
{
    c.drop_in_handler = true;
    connect_to(&c.addr, NULL);
    LOOP_UNTIL((c.frames > 0) && (c.accepted == NULL));
    /* three replies came in one read: the first handler dropped the
     * connection, the other two were never handed out, nothing after */
    cr_assert_eq(c.frames, 1);
    cr_assert_eq(c.served, 0, "no callback after the drop");
    cr_assert_eq(c.closes, 0, "a dropped connection is not closed again");
    cr_assert_null(c.conn);
    cr_assert_eq(c.client.buffered, 0, "nothing left held");
}
