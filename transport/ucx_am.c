/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Active message receive: handlers by id, eager payloads handed over in
 * place, rendezvous payloads received straight into a caller buffer
 * (ucp_am_recv_data_nbx), e.g. a pool slot: no intermediate copy.
 */
#include "transport/ucx.h"
#include "transport/ucx_int.h"

#include "common/log.h"

#include <stdint.h>
#include <string.h>

static ucs_status_t kvf_ucx_am_on_recv(void *arg, const void *header,
                                       size_t header_length, void *data,
                                       size_t length,
                                       const ucp_am_recv_param_t *param)
{
    kvf_ucx_am_slot_t *slot  = arg;
    kvf_ucx_worker_t *worker = slot->worker;
    kvf_ucx_am_msg_t msg;
    kvf_status_t status;

    memset(&msg, 0, sizeof(msg));
    msg.worker = worker;
    msg.length = length;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
        msg.reply_ep = kvf_ucx_ep_find_ucp(worker, param->reply_ep);
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        msg.is_rndv = true;
        msg.desc    = data;
    } else {
        msg.data = data;
    }

    if (slot->cb == NULL) {
        /* an id nobody serves: unknown, or from a newer version */
        worker->am_dropped++;
        kvf_debug("worker %s: active message for id %s%u without a handler "
                  "(%zu bytes); dropped",
                  worker->name, (slot->id >= KVF_UCX_AM_ID_MAX) ? ">=" : "",
                  slot->id, length);
        return UCS_OK; /* declined */
    }
    if (worker->is_destroying) {
        return UCS_OK; /* declined */
    }
    worker->am_desc_current  = msg.desc;
    worker->am_desc_released = false;
    status                   = slot->cb(slot->arg, header, header_length, &msg);
    worker->am_desc_current  = NULL;
    if (worker->am_desc_released) {
        return UCS_OK; /* declined inside the handler: UCX drops it */
    }
    if ((status == KVF_INPROGRESS) && msg.is_rndv) {
        return UCS_INPROGRESS; /* kept for kvf_ucx_am_recv_data/release */
    }
    return UCS_OK;
}

static kvf_status_t kvf_ucx_am_register(kvf_ucx_worker_t *worker, unsigned id,
                                        kvf_ucx_am_slot_t *slot)
{
    ucp_am_handler_param_t param;
    ucs_status_t ucs;

    memset(&param, 0, sizeof(param));
    param.field_mask =
        UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
        UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    param.id  = id;
    param.cb  = kvf_ucx_am_on_recv;
    param.arg = slot;
    /* eager data stays valid when a handler keeps the message */
    param.flags = UCP_AM_FLAG_WHOLE_MSG;
    ucs         = ucp_worker_set_am_recv_handler(worker->ucp, &param);
    if (ucs != UCS_OK) {
        kvf_error("worker %s: am handler %u: %s", worker->name, id,
                  ucs_status_string(ucs));
        return KVF_ERR_TRANSPORT;
    }
    return KVF_OK;
}

kvf_status_t kvf_ucx_am_init_all(kvf_ucx_worker_t *worker)
{
    kvf_status_t status;
    unsigned id;

    /* the highest id first: UCX sizes its table once, to the whole wire
     * range, and every slot of it is then ours (ascending order would
     * regrow it and, in 1.13, leave holes uninitialised) */
    status = kvf_ucx_am_register(worker, KVF_UCX_AM_ID_WIRE_MAX - 1,
                                 &worker->am_unknown);
    for (id = 0; (id < KVF_UCX_AM_ID_WIRE_MAX - 1) && (status == KVF_OK);
         id++) {
        status = kvf_ucx_am_register(
            worker, id,
            (id < KVF_UCX_AM_ID_MAX) ? &worker->am[id] : &worker->am_unknown);
    }
    return status;
}

kvf_status_t kvf_ucx_am_set_handler(kvf_ucx_worker_t *worker, unsigned id,
                                    kvf_ucx_am_cb_t cb, void *arg)
{
    if (worker == NULL) {
        return KVF_ERR_INVALID;
    }
    if (id >= KVF_UCX_AM_ID_MAX) {
        return KVF_ERR_RANGE;
    }
    /* our dispatcher stays registered for every id (kvf_ucx_am_init_all):
     * removing a handler only makes its messages dropped and counted */
    worker->am[id].cb  = cb;
    worker->am[id].arg = arg;
    return KVF_OK;
}

void kvf_ucx_am_deliver(kvf_ucx_worker_t *worker, unsigned id,
                        const void *header, size_t header_len, const void *data,
                        size_t len, kvf_ucx_ep_t *reply_ep)
{
    kvf_ucx_am_slot_t *slot =
        (id < KVF_UCX_AM_ID_MAX) ? &worker->am[id] : &worker->am_unknown;
    kvf_ucx_am_msg_t msg;

    memset(&msg, 0, sizeof(msg));
    msg.worker   = worker;
    msg.length   = len;
    msg.reply_ep = reply_ep;
    msg.data     = data;
    if (slot->cb == NULL) {
        worker->am_dropped++;
        return;
    }
    slot->cb(slot->arg, header, header_len, &msg);
}

/* Receives @p msg's payload into @p iov (checked by the caller to add up
 * to it): copied at once when it came eager, else one UCX receive (one
 * buffer, with @p mem when given, or scattered). The message is released
 * on failure. */
static kvf_status_t
kvf_ucx_am_recv_start(const kvf_ucx_am_msg_t *msg, const kvf_ucx_iov_t *iov,
                      size_t iovcnt, const kvf_ucx_mem_t *mem,
                      uint64_t timeout_ns, kvf_ucx_op_cb_t cb, void *arg)
{
    kvf_ucx_worker_t *worker = msg->worker;
    ucp_request_param_t param;
    kvf_ucx_op_t *op;
    kvf_status_t status;
    size_t i, at = 0;

    /* the sender's ep, when known, is what a timeout fails if UCX cannot
     * cancel the receive */
    status = kvf_ucx_op_alloc(worker, msg->reply_ep, KVF_UCX_OP_AM_RECV,
                              timeout_ns, cb, arg, &op);
    if (status != KVF_OK) {
        kvf_ucx_am_msg_release(msg);
        return status;
    }
    if (!msg->is_rndv) {
        for (i = 0; i < iovcnt; i++) {
            if (iov[i].len > 0) {
                memcpy(iov[i].buf, (const uint8_t *)msg->data + at, iov[i].len);
            }
            at += iov[i].len;
        }
        kvf_ucx_op_complete_now(op, KVF_OK);
        return KVF_OK;
    }
    kvf_ucx_op_param_init(op, &param);
    param.cb.recv_am = kvf_ucx_op_on_recv_am;
    if (iovcnt == 1) {
        if (mem != NULL) {
            param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            param.memh = mem->memh;
        }
        return kvf_ucx_op_start(op,
                                ucp_am_recv_data_nbx(worker->ucp, msg->desc,
                                                     iov[0].buf, iov[0].len,
                                                     &param),
                                "am recv data");
    }
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
    return kvf_ucx_op_start(op,
                            ucp_am_recv_data_nbx(worker->ucp, msg->desc,
                                                 (void *)(uintptr_t)iov, iovcnt,
                                                 &param),
                            "am recv data iov");
}

kvf_status_t kvf_ucx_am_recv_data(const kvf_ucx_am_msg_t *msg, void *dest,
                                  size_t dest_len, const kvf_ucx_mem_t *mem,
                                  uint64_t timeout_ns, kvf_ucx_op_cb_t cb,
                                  void *arg)
{
    kvf_ucx_iov_t one;

    if ((msg == NULL) || (cb == NULL) || ((dest == NULL) && (msg->length))) {
        return KVF_ERR_INVALID;
    }
    if (msg->length > dest_len) {
        kvf_debug("worker %s: am of %zu bytes for a %zu byte buffer",
                  msg->worker->name, msg->length, dest_len);
        kvf_ucx_am_msg_release(msg);
        return KVF_ERR_TOO_BIG;
    }
    one.buf = dest;
    one.len = msg->length;
    return kvf_ucx_am_recv_start(msg, &one, 1, mem, timeout_ns, cb, arg);
}

kvf_status_t kvf_ucx_am_recv_data_iov(const kvf_ucx_am_msg_t *msg,
                                      const kvf_ucx_iov_t *iov, size_t iovcnt,
                                      uint64_t timeout_ns, kvf_ucx_op_cb_t cb,
                                      void *arg)
{
    size_t i, total = 0;

    if ((msg == NULL) || (cb == NULL) || (iov == NULL) || (iovcnt == 0) ||
        (iovcnt > KVF_UCX_IOV_MAX)) {
        return KVF_ERR_INVALID;
    }
    for (i = 0; i < iovcnt; i++) {
        if ((iov[i].buf == NULL) || (iov[i].len > msg->length - total)) {
            total = SIZE_MAX;
            break;
        }
        total += iov[i].len;
    }
    if (total != msg->length) {
        kvf_debug("worker %s: am of %zu bytes for %zu pieces that do not "
                  "add up to it",
                  msg->worker->name, msg->length, iovcnt);
        kvf_ucx_am_msg_release(msg);
        return KVF_ERR_INVALID;
    }
    return kvf_ucx_am_recv_start(msg, iov, iovcnt, NULL, timeout_ns, cb, arg);
}

void kvf_ucx_am_msg_release(const kvf_ucx_am_msg_t *msg)
{
    if ((msg == NULL) || !msg->is_rndv || (msg->desc == NULL)) {
        return;
    }
    if (msg->desc == msg->worker->am_desc_current) {
        /* still inside the handler: returning UCS_OK declines it */
        msg->worker->am_desc_released = true;
        return;
    }
    ucp_am_data_release(msg->worker->ucp, msg->desc);
}
