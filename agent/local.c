/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The same-host path (agent/local.h). Wire, on a SOCK_SEQPACKET Unix
 * socket (one message per datagram, same host and ABI, so fixed structs
 * in host order; every size and field is still checked):
 *
 *   requester -> holder  HELLO        node id, boot id, nonce_c
 *   holder -> requester  HELLO_REPLY  node id, boot id, nonce_s, mac_s
 *   requester -> holder  AUTH         mac_c (auth off: still sent, empty),
 *                                     flags (wants the PD region)
 *   holder -> requester  READY        pool bytes, region bytes; SCM_RIGHTS:
 *                                     the pool read-only, and (asked for
 *                                     and present) the PD receive region's
 *                                     own memfd read-write
 *   requester -> holder  LEASE        ticket, first index, <= 64 keys
 *   holder -> requester  LEASE_REPLY  ticket, first, per key offset,
 *                                     length, checksum, status (held)
 *   requester -> holder  RELEASE      ticket, first (the holds go)
 *   requester -> holder  BAD          one key whose copy failed its
 *                                     checksum: the holder re-verifies
 *
 * A holder closes a connection that breaks the sequence; a requester that
 * sees a close fails what was pending there as misses.
 */
#include "agent/local.h"
#include "agent/local_wire.h"

#include "common/log.h"
#include "common/thread.h"
#include "common/time.h"

#include <event2/event.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* ------------------------------------------------------------- objects */

typedef struct kvf_local_lease {
    uint64_t ticket;
    uint32_t first;
    uint32_t num; /* 0: slot free */
    kvf_pool_entry_t *entries[KVF_LOCAL_LEASE_KEYS];
} kvf_local_lease_t;

/* Holder side: one requester. */
typedef struct kvf_local_conn {
    struct kvf_local_conn *next;
    kvf_local_t *local;
    int fd;
    struct event *ev;
    struct event *timer; /* handshake deadline */
    kvf_auth_session_t session;
    uint32_t peer_id;
    char peer_name[KVF_LOCAL_NAME_MAX];
    bool ready;
    bool region_granted; /* READY passed our PD receive region */
    kvf_local_lease_t leases[KVF_LOCAL_LEASES];
} kvf_local_conn_t;

typedef enum {
    KVF_LOCAL_LINK_CONNECTING = 0, /* HELLO sent */
    KVF_LOCAL_LINK_AUTH,           /* AUTH sent, READY due */
    KVF_LOCAL_LINK_READY,          /* pool mapped */
    KVF_LOCAL_LINK_NOT_LOCAL,      /* use UCX until retry_ns */
} kvf_local_link_state_t;

typedef struct kvf_local_req kvf_local_req_t;

/* Someone waiting for a link being proved (kvf_local_region_when). */
typedef struct kvf_local_waiter {
    struct kvf_local_waiter *next;
    kvf_local_link_cb_t cb;
    void *arg;
} kvf_local_waiter_t;

/* Requester side: one holder. */
typedef struct kvf_local_link {
    struct kvf_local_link *next;
    kvf_local_t *local;
    uint32_t holder_id;
    char holder_name[KVF_LOCAL_NAME_MAX];
    char address[128];
    kvf_local_link_state_t state;
    int fd;
    struct event *ev;
    kvf_auth_session_t session;
    uint8_t *map; /* PROT_READ */
    uint64_t map_len;
    uint8_t *region; /* the holder's PD receive region, writable; or NULL */
    uint64_t region_len;
    pthread_t populate; /* maps both page by page, off the event loop */
    bool has_populate;
    atomic_bool populate_stop;
    uint64_t retry_ns;
    kvf_local_req_t *reqs;
    kvf_local_waiter_t *waiters;
    struct event *hs_timer; /* KVF_LOCAL_HANDSHAKE_NS after the dial */
    bool is_slow;           /* a waiter gave up on it: later ones do not wait */
} kvf_local_link_t;

struct kvf_local_req {
    kvf_local_req_t *next;
    kvf_local_link_t *link;
    uint64_t ticket;
    kvf_store_owner_t *owner;
    kvf_local_cb_t cb;
    void *arg;
    struct event *timer;
    uint32_t num;
    uint32_t leased;   /* keys asked so far */
    uint32_t answered; /* keys settled */
    kvf_key_t *keys;
    kvf_local_result_t *res;
};

struct kvf_local {
    struct event_base *base;
    kvf_store_t *store;
    const kvf_auth_secret_t *secret;
    uint32_t (*node_id)(void *arg);
    void *node_id_arg;
    kvf_local_served_cb_t served;
    void *served_arg;
    uint64_t timeout_ns;
    uint64_t next_ticket;
    bool wants_region;
    char name[128];
    char boot_id[KVF_LOCAL_BOOT_ID_LEN];
    int listen_fd;
    struct event *listen_ev;
    kvf_local_conn_t *conns;
    kvf_local_link_t *links;
    kvf_local_stats_t stats;
};

/* ------------------------------------------------------------- helpers */

static kvf_status_t kvf_local_boot_id(char *buf)
{
    ssize_t n;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);

    memset(buf, 0, KVF_LOCAL_BOOT_ID_LEN);
    if (fd < 0) {
        return KVF_ERR_IO;
    }
    n = read(fd, buf, KVF_LOCAL_BOOT_ID_LEN - 1);
    close(fd);
    if (n < 32) {
        return KVF_ERR_IO;
    }
    buf[n]                  = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    return KVF_OK;
}

/* The abstract socket name of the agent at @p address; its length. */
static socklen_t kvf_local_sockaddr(const char *address, struct sockaddr_un *sa)
{
    size_t len;

    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    /* sun_path[0] stays 0: the abstract namespace, no file to clean up */
    len = (size_t)snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1,
                           "kvf-local/%s", address);
    if (len >= sizeof(sa->sun_path) - 1) {
        len = sizeof(sa->sun_path) - 2;
    }
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

/* Is the process at the other end of @p fd running as our user? */
static bool kvf_local_same_uid(int fd)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);

    return (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) &&
           (cred.uid == geteuid());
}

kvf_status_t kvf_local_send_fds(int fd, const void *buf, size_t len,
                                const int *fds, unsigned nfds)
{
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = (void *)(uintptr_t)buf, .iov_len = len};
    struct msghdr mh;
    struct cmsghdr *cmsg;

    memset(&mh, 0, sizeof(mh));
    mh.msg_iov    = &iov;
    mh.msg_iovlen = 1;
    if (nfds > 0) {
        memset(&ctl, 0, sizeof(ctl));
        mh.msg_control    = ctl.buf;
        mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        cmsg              = CMSG_FIRSTHDR(&mh);
        cmsg->cmsg_level  = SOL_SOCKET;
        cmsg->cmsg_type   = SCM_RIGHTS;
        cmsg->cmsg_len    = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(cmsg), fds, nfds * sizeof(int));
    }
    if (sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)len) {
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

static kvf_status_t kvf_local_send(int fd, const void *buf, size_t len,
                                   int pass_fd)
{
    return kvf_local_send_fds(fd, buf, len, &pass_fd, (pass_fd >= 0) ? 1 : 0);
}

/* Receives one message; passed descriptors go to @p fds (up to two, -1:
 * none; NULL: closed). 0 at EOF, -1 when nothing is there or on error. */
static ssize_t kvf_local_recv(int fd, void *buf, size_t len, int *fds)
{
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr mh;
    struct cmsghdr *cmsg;
    ssize_t n;
    int got[2] = {-1, -1};
    unsigned k, m = 0;

    memset(&mh, 0, sizeof(mh));
    mh.msg_iov        = &iov;
    mh.msg_iovlen     = 1;
    mh.msg_control    = ctl.buf;
    mh.msg_controllen = sizeof(ctl.buf);
    n                 = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
        return -1;
    }
    for (cmsg = CMSG_FIRSTHDR(&mh); cmsg != NULL;
         cmsg = CMSG_NXTHDR(&mh, cmsg)) {
        if ((cmsg->cmsg_level != SOL_SOCKET) ||
            (cmsg->cmsg_type != SCM_RIGHTS)) {
            continue;
        }
        for (k = 0; CMSG_LEN((k + 1) * sizeof(int)) <= cmsg->cmsg_len; k++) {
            int one;

            memcpy(&one, CMSG_DATA(cmsg) + k * sizeof(int), sizeof(int));
            if (m < 2) {
                got[m++] = one;
            } else {
                close(one); /* more than any message carries */
            }
        }
    }
    if (((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) || (fds == NULL)) {
        for (k = 0; k < m; k++) {
            close(got[k]);
            got[k] = -1;
        }
    }
    if (fds != NULL) {
        fds[0] = got[0];
        fds[1] = got[1];
    }
    if ((mh.msg_flags & MSG_TRUNC) != 0) {
        errno = EMSGSIZE;
        return -1;
    }
    return n;
}

/* Closes the descriptors a message passed that nobody took. */
static void kvf_local_close_fds(int *fds)
{
    unsigned k;

    for (k = 0; k < 2; k++) {
        if (fds[k] >= 0) {
            close(fds[k]);
            fds[k] = -1;
        }
    }
}

static void kvf_local_hdr_init(kvf_local_hdr_t *h, kvf_local_msg_t type)
{
    memset(h, 0, sizeof(*h));
    h->magic = KVF_LOCAL_MAGIC;
    h->type  = (uint16_t)type;
}

/* A name from a peer, NUL-terminated and reduced to [A-Za-z0-9._-]. */
static void kvf_local_name_copy(char *dst, const char *src)
{
    size_t i;

    for (i = 0; (i < KVF_LOCAL_NAME_MAX - 1) && (src[i] != '\0'); i++) {
        char c = src[i];

        dst[i] = (((c >= 'a') && (c <= 'z')) || ((c >= 'A') && (c <= 'Z')) ||
                  ((c >= '0') && (c <= '9')) || (c == '.') || (c == '_') ||
                  (c == '-'))
                     ? c
                     : '_';
    }
    dst[i] = '\0';
}

/* The names the MACs bind: node id and kernel boot. */
static void kvf_local_ident(const kvf_local_t *local, uint32_t node_id,
                            char *buf, size_t len)
{
    snprintf(buf, len, "kvf-local %" PRIu32 " %s", node_id, local->boot_id);
}

/* ---------------------------------------------------------- holder side */

static void kvf_local_conn_close(kvf_local_conn_t *conn)
{
    kvf_local_t *local = conn->local;
    kvf_local_conn_t **pp;
    uint32_t i, j;

    for (pp = &local->conns; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == conn) {
            *pp = conn->next;
            break;
        }
    }
    for (i = 0; i < KVF_LOCAL_LEASES; i++) {
        for (j = 0; j < conn->leases[i].num; j++) {
            if (conn->leases[i].entries[j] != NULL) {
                kvf_store_put_chunk(local->store, conn->leases[i].entries[j]);
            }
        }
    }
    event_free(conn->ev);
    event_free(conn->timer);
    close(conn->fd);
    kvf_auth_session_cleanup(&conn->session);
    free(conn);
}

static void kvf_local_conn_refuse(kvf_local_conn_t *conn, const char *why)
{
    conn->local->stats.links_refused++;
    kvf_warn("%s: same-host peer refused: %s", conn->local->name, why);
    kvf_local_conn_close(conn);
}

static void kvf_local_on_hello(kvf_local_conn_t *conn,
                               const kvf_local_hello_t *in)
{
    kvf_local_t *local = conn->local;
    kvf_local_hello_t out;
    char client[160], server[160], err[256];
    uint32_t self = local->node_id(local->node_id_arg);

    if ((strncmp(in->boot_id, local->boot_id, KVF_LOCAL_BOOT_ID_LEN) != 0) ||
        (in->nonce_len > KVF_AUTH_NONCE_SIZE) || (self == 0)) {
        kvf_local_conn_refuse(conn, (self == 0) ? "not registered yet"
                                                : "another kernel boot");
        return;
    }
    conn->peer_id = in->node_id;
    kvf_local_name_copy(conn->peer_name, in->name);
    kvf_local_ident(local, in->node_id, client, sizeof(client));
    kvf_local_ident(local, self, server, sizeof(server));
    memset(&out, 0, sizeof(out));
    kvf_local_hdr_init(&out.h, KVF_LOCAL_MSG_HELLO_REPLY);
    if (kvf_auth_server_hello(&conn->session, client, in->nonce, in->nonce_len,
                              server, out.mac, err, sizeof(err)) != KVF_OK) {
        kvf_local_conn_refuse(conn, err);
        return;
    }
    if (conn->session.state == KVF_AUTH_STATE_CHALLENGED) {
        memcpy(out.nonce, conn->session.own_nonce, KVF_AUTH_NONCE_SIZE);
        out.nonce_len = KVF_AUTH_NONCE_SIZE;
        out.mac_len   = KVF_AUTH_MAC_SIZE;
    }
    out.node_id = self;
    memcpy(out.boot_id, local->boot_id, KVF_LOCAL_BOOT_ID_LEN);
    kvf_local_name_copy(out.name, local->name);
    if (kvf_local_send(conn->fd, &out, sizeof(out), -1) != KVF_OK) {
        kvf_local_conn_close(conn);
    }
}

static void kvf_local_on_auth(kvf_local_conn_t *conn,
                              const kvf_local_hello_t *in)
{
    kvf_local_t *local = conn->local;
    kvf_local_ready_t out;
    uint64_t offset;
    char err[256];
    int fds[2];

    if (conn->session.state == KVF_AUTH_STATE_CHALLENGED) {
        if (kvf_auth_server_finish(
                &conn->session, in->mac,
                (in->mac_len <= KVF_AUTH_MAC_SIZE) ? in->mac_len : 0, err,
                sizeof(err)) != KVF_OK) {
            kvf_local_conn_refuse(conn, err);
            return;
        }
    } else if (conn->session.state != KVF_AUTH_STATE_DONE) {
        kvf_local_conn_refuse(conn, "AUTH before HELLO");
        return;
    }
    if (kvf_store_fd_readonly(local->store, &fds[0]) != KVF_OK) {
        kvf_warn("%s: cannot reopen the pool read-only: %m", local->name);
        kvf_local_conn_close(conn);
        return;
    }
    memset(&out, 0, sizeof(out));
    kvf_local_hdr_init(&out.h, KVF_LOCAL_MSG_READY);
    out.h.ticket = kvf_store_size(local->store);
    fds[1]       = kvf_store_reserve_fd(local->store);
    if (((in->flags & KVF_LOCAL_WANT_REGION) != 0) && (fds[1] >= 0)) {
        /* a PD sender writes its pushes straight into our receive region
         * (its own memfd: nothing else of ours), verified at PD_DONE */
        out.region_bytes = kvf_store_reserve(local->store, &offset);
    }
    if (kvf_local_send_fds(conn->fd, &out, sizeof(out), fds,
                           (out.region_bytes > 0) ? 2 : 1) != KVF_OK) {
        close(fds[0]);
        kvf_local_conn_close(conn);
        return;
    }
    close(fds[0]);
    conn->ready          = true;
    conn->region_granted = (out.region_bytes > 0);
    evtimer_del(conn->timer);
    kvf_info("%s: same-host peer node %" PRIu32 " maps the pool read-only%s",
             local->name, conn->peer_id,
             conn->region_granted ? " and the PD receive region" : "");
}

static void kvf_local_on_lease(kvf_local_conn_t *conn,
                               const kvf_local_hdr_t *in, size_t len)
{
    struct {
        kvf_local_hdr_t h;
        kvf_local_lease_ent_t ent[KVF_LOCAL_LEASE_KEYS];
    } out;
    kvf_local_t *local       = conn->local;
    const uint8_t *keys      = (const uint8_t *)(in + 1);
    kvf_local_lease_t *lease = NULL;
    uint32_t i, n = in->count;
    kvf_key_t key;

    if ((n == 0) || (n > KVF_LOCAL_LEASE_KEYS) ||
        (len != sizeof(*in) + (size_t)n * KVF_KEY_WIRE_SIZE)) {
        kvf_local_conn_refuse(conn, "malformed LEASE");
        return;
    }
    for (i = 0; i < KVF_LOCAL_LEASES; i++) {
        if (conn->leases[i].num == 0) {
            lease = &conn->leases[i];
            break;
        }
    }
    memset(&out, 0, sizeof(out));
    kvf_local_hdr_init(&out.h, KVF_LOCAL_MSG_LEASE_REPLY);
    out.h.ticket = in->ticket;
    out.h.first  = in->first;
    out.h.count  = (uint16_t)n;
    for (i = 0; i < n; i++) {
        kvf_pool_entry_t *entry = NULL;

        out.ent[i].status = KVF_ERR_BUSY; /* every lease slot in use */
        if (lease == NULL) {
            continue;
        }
        kvf_key_unpack(keys + (size_t)i * KVF_KEY_WIRE_SIZE, &key);
        if (kvf_store_hold_chunk(local->store, &key, &entry) != KVF_OK) {
            out.ent[i].status = KVF_ERR_NOT_FOUND;
            lease->entries[i] = NULL;
            continue;
        }
        lease->entries[i]   = entry;
        out.ent[i].status   = KVF_OK;
        out.ent[i].offset   = kvf_pool_entry_offset(entry);
        out.ent[i].length   = kvf_pool_entry_length(entry);
        out.ent[i].checksum = kvf_pool_entry_checksum(entry);
        local->stats.chunks_served++;
        local->stats.bytes_served += out.ent[i].length;
    }
    if (lease != NULL) {
        uint64_t chunks = 0, bytes = 0;

        lease->ticket = in->ticket;
        lease->first  = in->first;
        lease->num    = n;
        for (i = 0; i < n; i++) {
            if (out.ent[i].status == KVF_OK) {
                chunks++;
                bytes += out.ent[i].length;
            }
        }
        if ((chunks > 0) && (local->served != NULL)) {
            local->served(local->served_arg, conn->peer_id, conn->peer_name,
                          chunks, bytes);
        }
    }
    if (kvf_local_send(conn->fd, &out,
                       sizeof(out.h) + (size_t)n * sizeof(out.ent[0]),
                       -1) != KVF_OK) {
        kvf_local_conn_close(conn); /* its leases go with it */
    }
}

static void kvf_local_on_release(kvf_local_conn_t *conn,
                                 const kvf_local_hdr_t *in)
{
    uint32_t i, j;

    for (i = 0; i < KVF_LOCAL_LEASES; i++) {
        kvf_local_lease_t *lease = &conn->leases[i];

        if ((lease->num > 0) && (lease->ticket == in->ticket) &&
            (lease->first == in->first)) {
            for (j = 0; j < lease->num; j++) {
                if (lease->entries[j] != NULL) {
                    kvf_store_put_chunk(conn->local->store, lease->entries[j]);
                }
            }
            lease->num = 0;
            return;
        }
    }
}

static void kvf_local_on_conn(evutil_socket_t fd, short what, void *arg)
{
    kvf_local_conn_t *conn = arg;
    kvf_local_in_t in;
    ssize_t n;

    if ((what & EV_TIMEOUT) != 0) {
        kvf_local_conn_refuse(conn, "handshake timed out");
        return;
    }
    for (;;) {
        n = kvf_local_recv(fd, &in, sizeof(in), NULL);
        if ((n < 0) && ((errno == EAGAIN) || (errno == EWOULDBLOCK))) {
            return;
        }
        if (n <= 0) {
            kvf_local_conn_close(conn); /* EOF: its leases go */
            return;
        }
        if (((size_t)n < sizeof(in.h)) || (in.h.magic != KVF_LOCAL_MAGIC)) {
            kvf_local_conn_refuse(conn, "not a kvf-local message");
            return;
        }
        if (!conn->ready) {
            bool hello = (in.h.type == KVF_LOCAL_MSG_HELLO) &&
                         (conn->session.state == KVF_AUTH_STATE_START);

            if ((size_t)n != sizeof(in.hello) ||
                (!hello && (in.h.type != KVF_LOCAL_MSG_AUTH))) {
                kvf_local_conn_refuse(conn, "unexpected handshake message");
                return;
            }
            if (hello) {
                kvf_local_on_hello(conn, &in.hello);
            } else {
                kvf_local_on_auth(conn, &in.hello);
            }
            return; /* conn may be gone; the next message wakes us */
        }
        if (in.h.type == KVF_LOCAL_MSG_LEASE) {
            kvf_local_on_lease(conn, &in.h, (size_t)n);
            return; /* as above */
        }
        if ((in.h.type == KVF_LOCAL_MSG_RELEASE) &&
            ((size_t)n == sizeof(in.h))) {
            kvf_local_on_release(conn, &in.h);
            continue;
        }
        if ((in.h.type == KVF_LOCAL_MSG_BAD) &&
            ((size_t)n == sizeof(in.h) + KVF_KEY_WIRE_SIZE)) {
            kvf_key_t key;

            /* the requester's word alone evicts nothing: check here */
            kvf_key_unpack(in.buf + sizeof(in.h), &key);
            if (kvf_store_verify(conn->local->store, &key) ==
                KVF_ERR_CHECKSUM) {
                kvf_warn("%s: a same-host peer found a chunk we lent it "
                         "damaged; dropped",
                         conn->local->name);
            }
            continue;
        }
        kvf_local_conn_refuse(conn, "unexpected message");
        return;
    }
}

static void kvf_local_on_accept(evutil_socket_t fd, short what, void *arg)
{
    kvf_local_t *local = arg;
    kvf_local_conn_t *conn;
    struct timeval tv;
    int cfd;

    while ((cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        if (!kvf_local_same_uid(cfd)) {
            local->stats.links_refused++;
            kvf_warn("%s: same-host peer refused: another user", local->name);
            close(cfd);
            continue;
        }
        conn = calloc(1, sizeof(*conn));
        if (conn == NULL) {
            close(cfd);
            continue;
        }
        conn->local = local;
        conn->fd    = cfd;
        kvf_auth_session_init(&conn->session, local->secret);
        conn->ev    = event_new(local->base, cfd, EV_READ | EV_PERSIST,
                                kvf_local_on_conn, conn);
        conn->timer = evtimer_new(local->base, kvf_local_on_conn, conn);
        if ((conn->ev == NULL) || (conn->timer == NULL)) {
            if (conn->ev != NULL) {
                event_free(conn->ev);
            }
            if (conn->timer != NULL) {
                event_free(conn->timer);
            }
            close(cfd);
            free(conn);
            continue;
        }
        tv = kvf_time_to_timeval(local->timeout_ns);
        event_add(conn->ev, NULL);
        evtimer_add(conn->timer, &tv);
        conn->next   = local->conns;
        local->conns = conn;
    }
}

/* ------------------------------------------------------- requester side */

static void kvf_local_req_finish(kvf_local_req_t *req, kvf_status_t status)
{
    kvf_local_link_t *link = req->link;
    kvf_local_req_t **pp;
    uint32_t i;

    for (pp = &link->reqs; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == req) {
            *pp = req->next;
            break;
        }
    }
    if (status == KVF_OK) {
        for (i = 0; i < req->num; i++) {
            if (req->res[i].bytes == 0) {
                link->local->stats.chunks_missed++;
            }
        }
    }
    if (req->cb != NULL) {
        req->cb(req->arg, status, req->res, req->num, link->holder_name);
    }
    event_free(req->timer);
    free(req->keys);
    free(req);
}

/* Fills the page tables of [p, p + len) slice by slice, until told to
 * stop, for the pages its owner already has (mincore): a peer whose pool
 * is not prefaulted (pool_prefault false) keeps it sparse, its pages
 * fault in here as they are copied. On a kernel without MADV_POPULATE_*
 * (before 5.14) every page faults in on first touch. */
static void kvf_local_populate_range(kvf_local_link_t *link, uint8_t *p,
                                     uint64_t len, int advice,
                                     unsigned char *vec)
{
    const uint64_t page = 4096;
    uint64_t off, n, i, run;

    for (off = 0; off < len; off += n) {
        if (atomic_load_explicit(&link->populate_stop, memory_order_relaxed)) {
            return;
        }
        n = (len - off < KVF_LOCAL_POPULATE_SLICE) ? len - off
                                                   : KVF_LOCAL_POPULATE_SLICE;
        if (mincore(p + off, n, vec) != 0) {
            return;
        }
        for (i = 0; i * page < n; i += run) {
            for (run = 0; ((i + run) * page < n) && (vec[i + run] & 1); run++) {
            }
            if (run == 0) {
                run = 1; /* not there: left to fault in when copied */
                continue;
            }
            if ((madvise(p + off + i * page,
                         (run * page < n - i * page) ? run * page
                                                     : n - i * page,
                         advice) != 0) &&
                (errno == EINVAL)) {
                return;
            }
        }
    }
}

/* The populate thread: a first touch of each 4 KiB page inside the copies
 * costs about as much as the copy, and mapping a whole pool (hundreds of
 * GiB on a large host) at once would stall the event loop for seconds;
 * copies start at once and fault in what this has not reached yet. */
static void *kvf_local_populate_main(void *arg)
{
    kvf_local_link_t *link = arg;
    unsigned char *vec     = malloc(KVF_LOCAL_POPULATE_SLICE / 4096);

    if (vec == NULL) {
        return NULL;
    }
    if (link->region != NULL) {
        kvf_local_populate_range(link, link->region, link->region_len,
                                 MADV_POPULATE_WRITE, vec);
    }
    kvf_local_populate_range(link, link->map, link->map_len, MADV_POPULATE_READ,
                             vec);
    free(vec);
    return NULL;
}

static void kvf_local_populate_start(kvf_local_link_t *link)
{
    atomic_store(&link->populate_stop, false);
    link->has_populate = kvf_thread_start(&link->populate, "kvf-populate",
                                          kvf_local_populate_main, link) == 0;
    if (!link->has_populate) {
        kvf_debug("%s: no populate thread; pages fault in as copied",
                  link->local->name);
    }
}

static void kvf_local_populate_stop(kvf_local_link_t *link)
{
    if (link->has_populate) {
        atomic_store(&link->populate_stop, true);
        pthread_join(link->populate, NULL); /* at most one slice */
        link->has_populate = false;
    }
}

/* Tells everyone waiting for @p link whether it is up (its PD region
 * mapped, @p ready). */
static void kvf_local_link_notify(kvf_local_link_t *link, bool ready)
{
    kvf_local_waiter_t *w;

    while ((w = link->waiters) != NULL) {
        link->waiters = w->next;
        w->cb(w->arg, ready);
        free(w);
    }
}

/* The link is unusable: its fetches fail (@p status: KVF_ERR_UNSUPPORTED
 * before the pool was mapped, so they go over UCX; a miss after). */
static void kvf_local_link_down(kvf_local_link_t *link, kvf_status_t status)
{
    if (link->ev != NULL) {
        event_free(link->ev);
        link->ev = NULL;
    }
    if (link->fd >= 0) {
        close(link->fd);
        link->fd = -1;
    }
    kvf_local_populate_stop(link);
    if (link->map != NULL) {
        munmap(link->map, link->map_len);
        link->map = NULL;
    }
    if (link->region != NULL) {
        munmap(link->region, link->region_len);
        link->region     = NULL;
        link->region_len = 0;
    }
    kvf_auth_session_cleanup(&link->session);
    if (link->hs_timer != NULL) {
        evtimer_del(link->hs_timer);
    }
    link->is_slow  = false;
    link->state    = KVF_LOCAL_LINK_NOT_LOCAL;
    link->retry_ns = kvf_time_now_ns() + KVF_LOCAL_RETRY_NS;
    while (link->reqs != NULL) {
        kvf_local_req_finish(link->reqs, status);
    }
    kvf_local_link_notify(link, false);
}

static void kvf_local_req_lease_next(kvf_local_req_t *req)
{
    struct {
        kvf_local_hdr_t h;
        uint8_t keys[KVF_LOCAL_LEASE_KEYS * KVF_KEY_WIRE_SIZE];
    } out;
    uint32_t n, i;

    n = req->num - req->leased;
    if (n == 0) {
        return;
    }
    if (n > KVF_LOCAL_LEASE_KEYS) {
        n = KVF_LOCAL_LEASE_KEYS;
    }
    kvf_local_hdr_init(&out.h, KVF_LOCAL_MSG_LEASE);
    out.h.ticket = req->ticket;
    out.h.first  = req->leased;
    out.h.count  = (uint16_t)n;
    for (i = 0; i < n; i++) {
        kvf_key_pack(&req->keys[req->leased + i],
                     out.keys + (size_t)i * KVF_KEY_WIRE_SIZE);
    }
    req->leased += n;
    if (kvf_local_send(req->link->fd, &out,
                       sizeof(out.h) + (size_t)n * KVF_KEY_WIRE_SIZE,
                       -1) != KVF_OK) {
        req->answered += n; /* those are misses */
    }
}

static void kvf_local_req_start(kvf_local_req_t *req)
{
    uint32_t w;

    for (w = 0; w < KVF_LOCAL_WINDOW; w++) {
        kvf_local_req_lease_next(req);
    }
    if (req->answered >= req->num) {
        kvf_local_req_finish(req, KVF_OK);
    }
}

/* Checks one leased chunk and takes a grant of ours for it; its copy is
 * queued in @p job. false: a miss, said in @p res. */
static bool kvf_local_copy_plan(kvf_local_link_t *link,
                                kvf_store_owner_t *owner,
                                const kvf_local_lease_ent_t *ent,
                                kvf_slot_t *slot, kvf_copy_job_t *job,
                                kvf_local_result_t *res)
{
    kvf_local_t *local = link->local;

    res->bytes  = 0;
    res->status = (ent->status != KVF_OK) ? KVF_ERR_NOT_FOUND : KVF_ERR_RANGE;
    if ((ent->status != KVF_OK) || (ent->length == 0) ||
        (ent->offset > link->map_len) ||
        (ent->length > link->map_len - ent->offset)) {
        return false;
    }
    res->status = kvf_store_alloc(local->store, owner, ent->length, slot);
    if (res->status != KVF_OK) {
        return false;
    }
    job->dst = (uint8_t *)kvf_store_base(local->store) + slot->offset;
    job->src = link->map + ent->offset;
    job->len = ent->length;
    job->sum = 0;
    return true;
}

/* Commits one copied chunk: its checksum is over the bytes that landed
 * (agent/copier.h), so a chunk changed under the copy is refused (and its
 * grant freed). */
static void kvf_local_copy_commit(kvf_local_link_t *link,
                                  kvf_store_owner_t *owner,
                                  const kvf_key_t *key,
                                  const kvf_local_lease_ent_t *ent,
                                  const kvf_slot_t *slot, uint64_t sum,
                                  kvf_local_result_t *res)
{
    kvf_local_t *local = link->local;
    kvf_status_t status;

    status = kvf_store_commit_hashed(local->store, owner, key, slot->offset,
                                     ent->checksum, sum, true);
    if ((status == KVF_OK) || (status == KVF_ERR_EXISTS)) {
        local->stats.chunks_copied++;
        local->stats.bytes_copied += ent->length;
        res->bytes  = ent->length;
        res->status = KVF_OK;
        return;
    }
    res->status = status;
    if (status == KVF_ERR_CHECKSUM) {
        /* told to the holder after the RELEASE (a held chunk is not
         * dropped there) */
        local->stats.checksum_failures++;
        kvf_warn("%s: chunk copied from same-host node %" PRIu32
                 " failed its checksum; refused",
                 local->name, link->holder_id);
    } else {
        kvf_store_release(local->store, owner, slot->offset);
    }
}

/* Copies the leased chunks into grants of ours (on the copier's threads
 * too) and commits them. */
static void kvf_local_copy_lease(kvf_local_link_t *link, kvf_local_req_t *req,
                                 const kvf_local_lease_ent_t *ent,
                                 uint32_t first, uint32_t count)
{
    kvf_copy_job_t jobs[KVF_LOCAL_LEASE_KEYS];
    kvf_slot_t slots[KVF_LOCAL_LEASE_KEYS];
    bool queued[KVF_LOCAL_LEASE_KEYS];
    uint32_t i, n = 0;

    for (i = 0; i < count; i++) {
        queued[i] = kvf_local_copy_plan(link, req->owner, &ent[i], &slots[n],
                                        &jobs[n], &req->res[first + i]);
        n += queued[i];
    }
    kvf_store_copy(link->local->store, jobs, n);
    for (i = 0, n = 0; i < count; i++) {
        if (queued[i]) {
            kvf_local_copy_commit(link, req->owner, &req->keys[first + i],
                                  &ent[i], &slots[n], jobs[n].sum,
                                  &req->res[first + i]);
            n++;
        }
    }
}

static void kvf_local_on_lease_reply(kvf_local_link_t *link,
                                     const kvf_local_hdr_t *in, size_t len)
{
    const kvf_local_lease_ent_t *ent = (const kvf_local_lease_ent_t *)(in + 1);
    kvf_local_hdr_t rel;
    kvf_local_req_t *req;
    uint32_t i;

    for (req = link->reqs; req != NULL; req = req->next) {
        if (req->ticket == in->ticket) {
            break;
        }
    }
    kvf_local_hdr_init(&rel, KVF_LOCAL_MSG_RELEASE);
    rel.ticket = in->ticket;
    rel.first  = in->first;
    if ((len != sizeof(*in) + (size_t)in->count * sizeof(*ent)) ||
        (in->count == 0) || (in->count > KVF_LOCAL_LEASE_KEYS)) {
        kvf_local_link_down(link, KVF_OK);
        return;
    }
    if ((req != NULL) &&
        ((in->first >= req->num) || (in->count > req->num - in->first))) {
        kvf_local_link_down(link, KVF_OK);
        return;
    }
    if (req != NULL) {
        kvf_local_copy_lease(link, req, ent, in->first, in->count);
        req->answered += in->count;
    }
    /* copied (or late): the holder may let them go */
    (void)kvf_local_send(link->fd, &rel, sizeof(rel), -1);
    for (i = 0; (req != NULL) && (i < in->count); i++) {
        if (req->res[in->first + i].status == KVF_ERR_CHECKSUM) {
            struct {
                kvf_local_hdr_t h;
                uint8_t key[KVF_KEY_WIRE_SIZE];
            } bad;

            /* the holder re-verifies: nobody else copies the same bad
             * bytes */
            kvf_local_hdr_init(&bad.h, KVF_LOCAL_MSG_BAD);
            kvf_key_pack(&req->keys[in->first + i], bad.key);
            (void)kvf_local_send(link->fd, &bad, sizeof(bad), -1);
        }
    }
    if (req != NULL) {
        kvf_local_req_lease_next(req);
        if (req->answered >= req->num) {
            kvf_local_req_finish(req, KVF_OK);
        }
    }
}

static void kvf_local_on_hello_reply(kvf_local_link_t *link,
                                     const kvf_local_hello_t *in)
{
    kvf_local_t *local = link->local;
    kvf_local_hello_t out;
    char client[160], server[160], err[256];

    if ((strncmp(in->boot_id, local->boot_id, KVF_LOCAL_BOOT_ID_LEN) != 0) ||
        (in->node_id != link->holder_id) ||
        (in->nonce_len > KVF_AUTH_NONCE_SIZE) ||
        (in->mac_len > KVF_AUTH_MAC_SIZE)) {
        local->stats.links_refused++;
        kvf_warn("%s: same-host socket of node %" PRIu32 " answered as node "
                 "%" PRIu32 " or from another boot; using UCX",
                 local->name, link->holder_id, in->node_id);
        kvf_local_link_down(link, KVF_ERR_UNSUPPORTED);
        return;
    }
    kvf_local_name_copy(link->holder_name, in->name);
    kvf_local_ident(local, link->holder_id, server, sizeof(server));
    kvf_local_ident(local, local->node_id(local->node_id_arg), client,
                    sizeof(client));
    memset(&out, 0, sizeof(out));
    kvf_local_hdr_init(&out.h, KVF_LOCAL_MSG_AUTH);
    if (kvf_auth_client_reply(&link->session, in->nonce, in->nonce_len, in->mac,
                              in->mac_len, server, client, out.mac, err,
                              sizeof(err)) != KVF_OK) {
        local->stats.links_refused++;
        kvf_warn("%s: same-host node %" PRIu32 " refused: %s; using UCX",
                 local->name, link->holder_id, err);
        kvf_local_link_down(link, KVF_ERR_UNSUPPORTED);
        return;
    }
    if (link->session.state == KVF_AUTH_STATE_CHALLENGED) {
        out.mac_len = KVF_AUTH_MAC_SIZE;
    }
    out.flags = local->wants_region ? KVF_LOCAL_WANT_REGION : 0;
    if (kvf_local_send(link->fd, &out, sizeof(out), -1) != KVF_OK) {
        kvf_local_link_down(link, KVF_ERR_UNSUPPORTED);
        return;
    }
    link->state = KVF_LOCAL_LINK_AUTH;
}

/* Maps the holder's PD receive region writable (@p fd, read-write, sealed
 * against shrinking so it can never fault under a copy); NULL when it is
 * not that. Closes @p fd. */
static uint8_t *kvf_local_map_region(kvf_local_link_t *link, int fd,
                                     uint64_t len)
{
    struct stat st;
    void *map = MAP_FAILED;
    int acc = fcntl(fd, F_GETFL), seals = fcntl(fd, F_GET_SEALS);

    if ((acc >= 0) && ((acc & O_ACCMODE) == O_RDWR) && (seals >= 0) &&
        ((seals & F_SEAL_SHRINK) != 0) && (fstat(fd, &st) == 0) &&
        ((uint64_t)st.st_size >= len)) {
        map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (map == MAP_FAILED) {
        kvf_warn("%s: same-host node %" PRIu32 " passed no usable PD "
                 "receive region; pushes to it use UCX",
                 link->local->name, link->holder_id);
        return NULL;
    }
    return map;
}

static void kvf_local_on_ready(kvf_local_link_t *link,
                               const kvf_local_ready_t *in, const int *fds)
{
    kvf_local_t *local = link->local;
    struct stat st;
    void *map;
    int acc, fd = fds[0];

    acc = (fd >= 0) ? fcntl(fd, F_GETFL) : -1;
    if ((fd < 0) || (acc < 0) || ((acc & O_ACCMODE) != O_RDONLY) ||
        (fstat(fd, &st) != 0) || (in->h.ticket == 0) ||
        ((uint64_t)st.st_size < in->h.ticket)) {
        if (fd >= 0) {
            close(fd);
        }
        if (fds[1] >= 0) {
            close(fds[1]);
        }
        local->stats.links_refused++;
        kvf_warn("%s: same-host node %" PRIu32 " passed no usable read-only "
                 "pool; using UCX",
                 local->name, link->holder_id);
        kvf_local_link_down(link, KVF_ERR_UNSUPPORTED);
        return;
    }
    /* populated by a thread of its own (kvf_local_populate_main) */
    map = mmap(NULL, in->h.ticket, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        if (fds[1] >= 0) {
            close(fds[1]);
        }
        kvf_warn("%s: cannot map the pool of same-host node %" PRIu32
                 ": %m; using UCX",
                 local->name, link->holder_id);
        kvf_local_link_down(link, KVF_ERR_UNSUPPORTED);
        return;
    }
    link->map     = map;
    link->map_len = in->h.ticket;
    if (fds[1] >= 0) {
        if (local->wants_region && (in->region_bytes > 0)) {
            link->region = kvf_local_map_region(link, fds[1], in->region_bytes);
            link->region_len = (link->region != NULL) ? in->region_bytes : 0;
        } else {
            close(fds[1]);
        }
    }
    kvf_local_populate_start(link);
    link->state = KVF_LOCAL_LINK_READY;
    evtimer_del(link->hs_timer);
    link->is_slow = false;
    local->stats.links_ok++;
    kvf_info("%s: same-host path to node %" PRIu32 " (%s): its pool mapped "
             "read-only, %" PRIu64 " bytes%s",
             local->name, link->holder_id, link->address, link->map_len,
             (link->region != NULL) ? "; its PD receive region writable" : "");
    for (kvf_local_req_t *req = link->reqs, *next; req != NULL; req = next) {
        next = req->next;
        kvf_local_req_start(req);
    }
    kvf_local_link_notify(link, link->region != NULL);
}

static void kvf_local_on_link(evutil_socket_t fd, short what, void *arg)
{
    kvf_local_link_t *link = arg;
    kvf_local_in_t in;
    ssize_t n;
    int pfd[2] = {-1, -1};

    for (;;) {
        n = kvf_local_recv(fd, &in, sizeof(in), pfd);
        if ((n < 0) && ((errno == EAGAIN) || (errno == EWOULDBLOCK))) {
            return;
        }
        if ((n <= 0) || ((size_t)n < sizeof(in.h)) ||
            (in.h.magic != KVF_LOCAL_MAGIC)) {
            kvf_local_close_fds(pfd);
            if (link->state != KVF_LOCAL_LINK_READY) {
                kvf_debug("%s: same-host handshake with node %" PRIu32
                          " closed; using UCX",
                          link->local->name, link->holder_id);
            } else {
                kvf_info("%s: same-host node %" PRIu32 " went away",
                         link->local->name, link->holder_id);
            }
            kvf_local_link_down(link, (link->state == KVF_LOCAL_LINK_READY)
                                          ? KVF_OK
                                          : KVF_ERR_UNSUPPORTED);
            return;
        }
        if ((link->state == KVF_LOCAL_LINK_CONNECTING) &&
            (in.h.type == KVF_LOCAL_MSG_HELLO_REPLY) &&
            ((size_t)n == sizeof(in.hello))) {
            kvf_local_on_hello_reply(link, &in.hello);
        } else if ((link->state == KVF_LOCAL_LINK_AUTH) &&
                   (in.h.type == KVF_LOCAL_MSG_READY) &&
                   ((size_t)n == sizeof(in.ready))) {
            kvf_local_on_ready(link, &in.ready, pfd);
            pfd[0] = pfd[1] = -1;
        } else if ((link->state == KVF_LOCAL_LINK_READY) &&
                   (in.h.type == KVF_LOCAL_MSG_LEASE_REPLY)) {
            kvf_local_on_lease_reply(link, &in.h, (size_t)n);
        } else {
            kvf_local_link_down(link, (link->state == KVF_LOCAL_LINK_READY)
                                          ? KVF_OK
                                          : KVF_ERR_UNSUPPORTED);
        }
        kvf_local_close_fds(pfd);
        if (link->fd < 0) {
            return; /* went down */
        }
    }
}

/* The link was not proved in KVF_LOCAL_HANDSHAKE_NS: whatever answers on
 * that socket is stalled or not an agent; UCX until the retry. */
static void kvf_local_on_handshake_timeout(evutil_socket_t fd, short what,
                                           void *arg)
{
    kvf_local_link_t *link = arg;

    if (link->state == KVF_LOCAL_LINK_READY) {
        return;
    }
    link->local->stats.links_refused++;
    kvf_warn("%s: same-host socket of node %" PRIu32 " (%s) did not finish "
             "its handshake in %llu ms; using UCX",
             link->local->name, link->holder_id, link->address,
             (unsigned long long)(KVF_LOCAL_HANDSHAKE_NS / KVF_NSEC_PER_MSEC));
    kvf_local_link_down(link, KVF_ERR_UNSUPPORTED);
}

/* Dials the holder's local socket and says HELLO. false: nobody local. */
static bool kvf_local_link_dial(kvf_local_link_t *link)
{
    kvf_local_t *local = link->local;
    struct sockaddr_un sa;
    kvf_local_hello_t out;
    socklen_t salen = kvf_local_sockaddr(link->address, &sa);
    struct timeval tv;
    size_t nonce_len;
    int fd;

    if (link->hs_timer == NULL) {
        link->hs_timer =
            evtimer_new(local->base, kvf_local_on_handshake_timeout, link);
        if (link->hs_timer == NULL) {
            return false;
        }
    }
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return false;
    }
    if ((connect(fd, (struct sockaddr *)&sa, salen) != 0) ||
        !kvf_local_same_uid(fd)) {
        close(fd);
        return false;
    }
    kvf_auth_session_init(&link->session, local->secret);
    memset(&out, 0, sizeof(out));
    kvf_local_hdr_init(&out.h, KVF_LOCAL_MSG_HELLO);
    if (kvf_auth_client_hello(&link->session, &nonce_len) != KVF_OK) {
        close(fd);
        return false;
    }
    memcpy(out.nonce, link->session.own_nonce, KVF_AUTH_NONCE_SIZE);
    out.nonce_len = (uint32_t)nonce_len;
    out.node_id   = local->node_id(local->node_id_arg);
    memcpy(out.boot_id, local->boot_id, KVF_LOCAL_BOOT_ID_LEN);
    kvf_local_name_copy(out.name, local->name);
    link->ev = event_new(local->base, fd, EV_READ | EV_PERSIST,
                         kvf_local_on_link, link);
    if ((link->ev == NULL) ||
        (kvf_local_send(fd, &out, sizeof(out), -1) != KVF_OK)) {
        if (link->ev != NULL) {
            event_free(link->ev);
            link->ev = NULL;
        }
        close(fd);
        return false;
    }
    event_add(link->ev, NULL);
    link->fd    = fd;
    link->state = KVF_LOCAL_LINK_CONNECTING;
    tv          = kvf_time_to_timeval(KVF_LOCAL_HANDSHAKE_NS);
    evtimer_add(link->hs_timer, &tv);
    return true;
}

static void kvf_local_on_req_timeout(evutil_socket_t fd, short what, void *arg)
{
    kvf_local_req_t *req   = arg;
    kvf_local_link_t *link = req->link;

    kvf_debug("%s: same-host fetch from node %" PRIu32 " timed out",
              link->local->name, link->holder_id);
    if (link->state != KVF_LOCAL_LINK_READY) {
        /* the handshake stalls: nothing from this holder goes locally */
        kvf_local_link_down(link, KVF_ERR_UNSUPPORTED);
        return;
    }
    /* what did not arrive is a miss; a late reply finds no ticket and is
     * released at once */
    kvf_local_req_finish(req, KVF_OK);
}

/* The link to @p holder_id at @p data_address, dialled when it is not up
 * (and not refused within the last KVF_LOCAL_RETRY_NS); NULL: that holder
 * is not reachable on this host now. */
static kvf_local_link_t *kvf_local_link_get(kvf_local_t *local,
                                            uint32_t holder_id,
                                            const char *data_address)
{
    kvf_local_link_t *link;

    if ((holder_id == 0) || (data_address == NULL) ||
        (local->node_id(local->node_id_arg) == 0)) {
        return NULL;
    }
    for (link = local->links; link != NULL; link = link->next) {
        if (link->holder_id == holder_id) {
            break;
        }
    }
    if ((link != NULL) && (strcmp(link->address, data_address) != 0)) {
        /* the node restarted elsewhere: start over */
        kvf_local_link_down(link, KVF_ERR_UNSUPPORTED);
        link->retry_ns = 0;
        snprintf(link->address, sizeof(link->address), "%s", data_address);
    }
    if (link == NULL) {
        link = calloc(1, sizeof(*link));
        if (link == NULL) {
            return NULL;
        }
        link->local     = local;
        link->holder_id = holder_id;
        link->fd        = -1;
        link->state     = KVF_LOCAL_LINK_NOT_LOCAL;
        snprintf(link->address, sizeof(link->address), "%s", data_address);
        link->next   = local->links;
        local->links = link;
    }
    if (link->state == KVF_LOCAL_LINK_NOT_LOCAL) {
        if ((kvf_time_now_ns() < link->retry_ns) ||
            !kvf_local_link_dial(link)) {
            link->retry_ns = kvf_time_now_ns() + KVF_LOCAL_RETRY_NS;
            local->stats.not_local++;
            return NULL;
        }
    }
    return link;
}

kvf_status_t kvf_local_fetch(kvf_local_t *local, uint32_t holder_id,
                             const char *data_address, const kvf_key_t *keys,
                             uint32_t num, kvf_store_owner_t *owner,
                             kvf_local_cb_t cb, void *arg)
{
    kvf_local_link_t *link;
    kvf_local_req_t *req;
    struct timeval tv;

    if ((num == 0) || (num > KVF_LOCAL_MAX_KEYS)) {
        return KVF_ERR_UNSUPPORTED;
    }
    link = kvf_local_link_get(local, holder_id, data_address);
    if (link == NULL) {
        return KVF_ERR_UNSUPPORTED;
    }
    req = calloc(1, sizeof(*req));
    if (req == NULL) {
        return KVF_ERR_UNSUPPORTED;
    }
    req->keys  = malloc((size_t)num * (sizeof(*keys) + sizeof(*req->res)));
    req->timer = evtimer_new(local->base, kvf_local_on_req_timeout, req);
    if ((req->keys == NULL) || (req->timer == NULL)) {
        if (req->timer != NULL) {
            event_free(req->timer);
        }
        free(req->keys);
        free(req);
        return KVF_ERR_UNSUPPORTED;
    }
    memcpy(req->keys, keys, (size_t)num * sizeof(*keys));
    req->res = (kvf_local_result_t *)(req->keys + num);
    memset(req->res, 0, (size_t)num * sizeof(*req->res));
    req->link   = link;
    req->ticket = ++local->next_ticket;
    req->owner  = owner;
    req->cb     = cb;
    req->arg    = arg;
    req->num    = num;
    req->next   = link->reqs;
    link->reqs  = req;
    tv          = kvf_time_to_timeval(local->timeout_ns);
    evtimer_add(req->timer, &tv);
    if (link->state == KVF_LOCAL_LINK_READY) {
        /* LEASEs now; the copies when their replies arrive (never inside
         * this call: a reply needs a turn of the loop) */
        uint32_t w;

        for (w = 0; w < KVF_LOCAL_WINDOW; w++) {
            kvf_local_req_lease_next(req);
        }
    }
    return KVF_OK;
}

kvf_status_t kvf_local_region(kvf_local_t *local, uint32_t node_id,
                              const char *data_address, uint8_t **base_p,
                              uint64_t *len_p)
{
    kvf_local_link_t *link;

    if (!local->wants_region) {
        return KVF_ERR_UNSUPPORTED;
    }
    link = kvf_local_link_get(local, node_id, data_address);
    if ((link == NULL) || (link->state != KVF_LOCAL_LINK_READY) ||
        (link->region == NULL)) {
        return KVF_ERR_UNSUPPORTED;
    }
    *base_p = link->region;
    *len_p  = link->region_len;
    return KVF_OK;
}

kvf_status_t kvf_local_region_when(kvf_local_t *local, uint32_t node_id,
                                   const char *data_address,
                                   kvf_local_link_cb_t cb, void *arg)
{
    kvf_local_link_t *link;
    kvf_local_waiter_t *w;

    if (!local->wants_region) {
        return KVF_ERR_UNSUPPORTED;
    }
    link = kvf_local_link_get(local, node_id, data_address);
    if (link == NULL) {
        return KVF_ERR_UNSUPPORTED;
    }
    if (link->state == KVF_LOCAL_LINK_READY) {
        return (link->region != NULL) ? KVF_OK : KVF_ERR_UNSUPPORTED;
    }
    if (link->is_slow) {
        return KVF_ERR_UNSUPPORTED; /* someone waited for it in vain */
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return KVF_ERR_UNSUPPORTED; /* UCX it is */
    }
    w->cb         = cb;
    w->arg        = arg;
    w->next       = link->waiters;
    link->waiters = w;
    return KVF_INPROGRESS;
}

bool kvf_local_region_granted(const kvf_local_t *local, uint32_t node_id)
{
    const kvf_local_conn_t *conn;

    for (conn = local->conns; conn != NULL; conn = conn->next) {
        if (conn->ready && conn->region_granted &&
            ((node_id == 0) || (conn->peer_id == node_id))) {
            return true;
        }
    }
    return false;
}

/* Forgets the waits begun with @p arg; the links they were on are slow
 * when @p gave_up. */
static void kvf_local_forget_waits(kvf_local_t *local, const void *arg,
                                   bool gave_up)
{
    kvf_local_waiter_t **wp, *w;
    kvf_local_link_t *link;

    for (link = local->links; link != NULL; link = link->next) {
        for (wp = &link->waiters; (w = *wp) != NULL;) {
            if (w->arg == arg) {
                *wp           = w->next;
                link->is_slow = link->is_slow || gave_up;
                free(w);
                continue;
            }
            wp = &w->next;
        }
    }
}

void kvf_local_region_give_up(kvf_local_t *local, const void *arg)
{
    kvf_local_forget_waits(local, arg, true);
}

void kvf_local_cancel(kvf_local_t *local, const void *arg)
{
    kvf_local_link_t *link;
    kvf_local_req_t *req;

    for (link = local->links; link != NULL; link = link->next) {
        for (req = link->reqs; req != NULL; req = req->next) {
            if (req->arg == arg) {
                req->cb = NULL;
            }
        }
    }
    kvf_local_forget_waits(local, arg, false);
}

void kvf_local_get_stats(const kvf_local_t *local, kvf_local_stats_t *stats_p)
{
    *stats_p = local->stats;
}

/* ----------------------------------------------------------- lifecycle */

kvf_status_t kvf_local_create(const kvf_local_params_t *params,
                              kvf_local_t **local_p)
{
    kvf_local_t *local;
    struct sockaddr_un sa;
    socklen_t salen;

    local = calloc(1, sizeof(*local));
    if (local == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    local->listen_fd    = -1;
    local->base         = params->base;
    local->store        = params->store;
    local->secret       = params->secret;
    local->node_id      = params->node_id;
    local->node_id_arg  = params->node_id_arg;
    local->served       = params->served;
    local->served_arg   = params->served_arg;
    local->wants_region = params->wants_region;
    local->timeout_ns =
        (params->timeout_ns > 0) ? params->timeout_ns : 5 * KVF_NSEC_PER_SEC;
    snprintf(local->name, sizeof(local->name), "%s",
             (params->name != NULL) ? params->name : "agent");
    if (kvf_local_boot_id(local->boot_id) != KVF_OK) {
        kvf_warn("%s: no /proc/sys/kernel/random/boot_id: no same-host path",
                 local->name);
        free(local);
        return KVF_ERR_UNSUPPORTED;
    }
    salen = kvf_local_sockaddr(params->data_address, &sa);
    local->listen_fd =
        socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if ((local->listen_fd < 0) ||
        (bind(local->listen_fd, (struct sockaddr *)&sa, salen) != 0) ||
        (listen(local->listen_fd, 64) != 0)) {
        kvf_warn("%s: same-host socket @%s: %m; no same-host path", local->name,
                 sa.sun_path + 1);
        goto err;
    }
    local->listen_ev =
        event_new(local->base, local->listen_fd, EV_READ | EV_PERSIST,
                  kvf_local_on_accept, local);
    if ((local->listen_ev == NULL) ||
        (event_add(local->listen_ev, NULL) != 0)) {
        goto err;
    }
    kvf_info("%s: same-host path on @%s", local->name, sa.sun_path + 1);
    *local_p = local;
    return KVF_OK;

err:
    kvf_local_destroy(local);
    return KVF_ERR_IO;
}

void kvf_local_destroy(kvf_local_t *local)
{
    kvf_local_link_t *link;

    if (local == NULL) {
        return;
    }
    while (local->conns != NULL) {
        kvf_local_conn_close(local->conns);
    }
    while ((link = local->links) != NULL) {
        for (kvf_local_req_t *req = link->reqs; req != NULL; req = req->next) {
            req->cb = NULL;
        }
        while (link->waiters != NULL) { /* told nothing: going too */
            kvf_local_waiter_t *w = link->waiters;

            link->waiters = w->next;
            free(w);
        }
        kvf_local_link_down(link, KVF_ERR_CANCELED);
        local->links = link->next;
        if (link->hs_timer != NULL) {
            event_free(link->hs_timer);
        }
        free(link);
    }
    if (local->listen_ev != NULL) {
        event_free(local->listen_ev);
    }
    if (local->listen_fd >= 0) {
        close(local->listen_fd);
    }
    free(local);
}
