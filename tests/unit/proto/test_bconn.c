/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The blocking framed connection over a socketpair: frames both ways, a
 * descriptor passed with SCM_RIGHTS, deadlines, a refusal carried by
 * STATUS, and a peer that goes away, each failure naming the peer.
 */
#include "proto/bconn.h"
#include "tests/helpers/test_helpers.h"

#include "common/time.h"

#include <criterion/criterion.h>

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static kvf_bconn_t *g_a, *g_b;

static void bconn_setup(void)
{
    kvf_bconn_params_t pa = {.peer = "peer b"}, pb = {.peer = "peer a"};
    int sv[2];

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    cr_assert_eq(kvf_bconn_create(sv[0], &pa, &g_a), KVF_OK);
    cr_assert_eq(kvf_bconn_create(sv[1], &pb, &g_b), KVF_OK);
}

static void bconn_teardown(void)
{
    kvf_bconn_destroy(g_a);
    kvf_bconn_destroy(g_b);
    kvf_test_check_leaks();
}

TestSuite(bconn, .init = bconn_setup, .fini = bconn_teardown, .timeout = 10);

static uint64_t soon(void)
{
    return kvf_time_deadline_ns(2 * KVF_NSEC_PER_SEC);
}

static void send_status(kvf_bconn_t *conn, int status, const char *text)
{
    char copy[128];
    Kvf__Status st;

    snprintf(copy, sizeof(copy), "%s", text);
    kvf__status__init(&st);
    st.status  = status;
    st.message = copy;
    cr_assert_eq(kvf_bconn_send(conn, KVF_MSG_STATUS, &st.base, soon()),
                 KVF_OK);
}

Test(bconn, frames_go_both_ways_and_pipeline)
{
    kvf_frame_t frame;
    Kvf__Status st;
    int i;

    kvf__status__init(&st);
    for (i = 0; i < 100; i++) {
        st.request_id = (uint64_t)i;
        cr_assert_eq(kvf_bconn_queue(g_a, KVF_MSG_STATUS, &st.base), KVF_OK);
    }
    cr_assert_eq(kvf_bconn_flush(g_a, soon()), KVF_OK);
    for (i = 0; i < 100; i++) {
        cr_assert_eq(kvf_bconn_recv(g_b, soon(), NULL, &frame), KVF_OK);
        cr_assert_eq(frame.type, KVF_MSG_STATUS);
        cr_assert_eq(((Kvf__Status *)frame.msg)->request_id, (uint64_t)i);
        kvf_frame_release(&frame, NULL);
    }
    cr_assert_eq(kvf_bconn_recv_buffered(g_b, &frame), KVF_INPROGRESS);
}

Test(bconn, a_passed_descriptor_reaches_the_caller)
{
    char control[CMSG_SPACE(sizeof(int))], byte = 0;
    struct iovec iov = {.iov_base = &byte, .iov_len = 0};
    struct msghdr mh;
    struct cmsghdr *cmsg;
    uint8_t raw[64];
    kvf_frame_t frame;
    Kvf__Status st;
    size_t len = 0;
    int pipefd[2], got = -1;

    cr_assert_eq(pipe(pipefd), 0);
    kvf__status__init(&st);
    cr_assert_eq(kvf_frame_pack(raw, sizeof(raw), KVF_MSG_STATUS, 0, &st.base,
                                KVF_FRAME_MAX_DEFAULT, &len),
                 KVF_OK);
    iov.iov_base = raw;
    iov.iov_len  = len;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov        = &iov;
    mh.msg_iovlen     = 1;
    mh.msg_control    = control;
    mh.msg_controllen = sizeof(control);
    cmsg              = CMSG_FIRSTHDR(&mh);
    cmsg->cmsg_level  = SOL_SOCKET;
    cmsg->cmsg_type   = SCM_RIGHTS;
    cmsg->cmsg_len    = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &pipefd[0], sizeof(int));
    cr_assert_eq(sendmsg(kvf_bconn_fd(g_a), &mh, 0), (ssize_t)len);
    (void)byte;

    cr_assert_eq(kvf_bconn_recv(g_b, soon(), &got, &frame), KVF_OK);
    kvf_frame_release(&frame, NULL);
    cr_assert_geq(got, 0, "the descriptor came with the frame");
    cr_assert_eq(write(pipefd[1], "x", 1), 1);
    cr_assert_eq(read(got, &byte, 1), 1, "it is the pipe we sent");
    close(got);
    close(pipefd[0]);
    close(pipefd[1]);
}

Test(bconn, a_silent_peer_times_out_by_the_deadline)
{
    uint64_t start = kvf_time_now_ns();
    kvf_frame_t frame;

    cr_assert_eq(kvf_bconn_recv(g_a,
                                kvf_time_deadline_ns(50 * KVF_NSEC_PER_MSEC),
                                NULL, &frame),
                 KVF_ERR_TIMEOUT);
    cr_assert_geq(kvf_time_now_ns() - start, 40 * KVF_NSEC_PER_MSEC);
    cr_assert_not_null(strstr(kvf_bconn_last_error(g_a), "peer b"), "%s",
                       kvf_bconn_last_error(g_a));
}

Test(bconn, a_status_refusal_becomes_the_status_and_its_reason)
{
    kvf_frame_t frame;

    send_status(g_b, KVF_ERR_AUTH, "wrong secret, says b");
    cr_assert_eq(
        kvf_bconn_expect(g_a, KVF_MSG_HELLO_REPLY, soon(), NULL, &frame),
        KVF_ERR_AUTH);
    cr_assert_str_eq(kvf_bconn_last_error(g_a), "peer b: wrong secret, says b");

    send_status(g_b, KVF_OK, "");
    cr_assert_eq(
        kvf_bconn_expect(g_a, KVF_MSG_HELLO_REPLY, soon(), NULL, &frame),
        KVF_ERR_PROTO);
    cr_assert_not_null(
        strstr(kvf_bconn_last_error(g_a), "expected HELLO_REPLY"), "%s",
        kvf_bconn_last_error(g_a));
}

Test(bconn, a_closed_peer_is_closed_not_an_error_code)
{
    kvf_frame_t frame;
    Kvf__Status st;

    kvf_bconn_destroy(g_b);
    g_b = NULL;
    cr_assert_eq(kvf_bconn_recv(g_a, soon(), NULL, &frame), KVF_ERR_CLOSED);
    cr_assert_str_eq(kvf_bconn_last_error(g_a), "peer b closed the connection");
    kvf__status__init(&st);
    cr_assert_eq(kvf_bconn_send(g_a, KVF_MSG_STATUS, &st.base, soon()),
                 KVF_ERR_CLOSED);
    cr_assert_not_null(
        strstr(kvf_bconn_last_error(g_a), "peer b connection lost"), "%s",
        kvf_bconn_last_error(g_a));
}

Test(bconn, garbage_is_a_bad_frame)
{
    const uint8_t junk[16] = {4, 0, 0, 0, 0xff, 0xff, 0, 0};
    kvf_frame_t frame;

    cr_assert_eq(kvf_bconn_queue_raw(g_b, junk, sizeof(junk)), KVF_OK);
    cr_assert_eq(kvf_bconn_flush(g_b, soon()), KVF_OK);
    cr_assert_eq(kvf_bconn_recv(g_a, soon(), NULL, &frame), KVF_ERR_PROTO);
    cr_assert_not_null(
        strstr(kvf_bconn_last_error(g_a), "bad frame from peer b"), "%s",
        kvf_bconn_last_error(g_a));
}

Test(bconn, dialing_nobody_names_the_path)
{
    char err[256];
    int fd = -1;

    cr_assert_eq(kvf_bconn_dial_unix("/nonexistent/kvf.sock", soon(), &fd, err,
                                     sizeof(err)),
                 KVF_ERR_IO);
    cr_assert_eq(fd, -1);
    cr_assert_not_null(strstr(err, "/nonexistent/kvf.sock"), "%s", err);
}
