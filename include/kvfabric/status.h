/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/**
 * @file status.h
 * Status codes returned by every kvfabric call that can fail.
 *
 * The numeric values travel on the wire (error replies carry them), so they
 * are stable: never renumber, only append.
 */
#ifndef KVFABRIC_STATUS_H
#define KVFABRIC_STATUS_H

#include <kvfabric/defs.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVF_OK              = 0,
    KVF_INPROGRESS      = 1,   /**< not an error: poll or wait again */
    KVF_ERR_NO_MEMORY   = -1,  /**< allocation failed, or a pool is full */
    KVF_ERR_INVALID     = -2,  /**< bad argument from our own caller */
    KVF_ERR_PROTO       = -3,  /**< bad frame from a peer: close it */
    KVF_ERR_IO          = -4,  /**< a system call failed */
    KVF_ERR_TRANSPORT   = -5,  /**< UCX failed */
    KVF_ERR_TIMEOUT     = -6,  /**< a wait ran past its deadline */
    KVF_ERR_NOT_FOUND   = -7,  /**< unknown key, node, request or id */
    KVF_ERR_EXISTS      = -8,  /**< the id or key is already in use */
    KVF_ERR_CHECKSUM    = -9,  /**< data failed its content checksum */
    KVF_ERR_VERSION     = -10, /**< protocol version mismatch */
    KVF_ERR_AUTH        = -11, /**< authentication failed */
    KVF_ERR_CLOSED      = -12, /**< the connection or peer went away */
    KVF_ERR_BUSY        = -13, /**< resource pinned or queue full: retry */
    KVF_ERR_UNSUPPORTED = -14, /**< not built in, or not on this machine */
    KVF_ERR_STALE       = -15, /**< message from an old incarnation */
    KVF_ERR_CANCELED    = -16, /**< the operation was canceled */
    KVF_ERR_CONFIG      = -17, /**< bad configuration value or key */
    KVF_ERR_TOO_BIG     = -18, /**< a size exceeds its hard limit */
    KVF_ERR_RANGE       = -19, /**< offset or length outside its grant */
    KVF_ERR_STATE       = -20, /**< call not valid in the current state */
} kvf_status_t;

/**
 * Returns a short lowercase description of a status code.
 *
 * @param [in] status  any value, also one not listed above
 * @return a static string (never NULL); unknown values give "unknown status"
 *
 * thread: thread-safe. ownership: the string is static, never free it.
 */
KVF_API const char *kvf_strerror(kvf_status_t status);

/**
 * Returns the enum name of a status code ("KVF_ERR_TIMEOUT"), for JSON and
 * metrics labels.
 *
 * @param [in] status  any value
 * @return a static string (never NULL); unknown values give "KVF_ERR_UNKNOWN"
 *
 * thread: thread-safe. ownership: static string.
 */
KVF_API const char *kvf_status_name(kvf_status_t status);

#ifdef __cplusplus
}
#endif

#endif /* KVFABRIC_STATUS_H */
