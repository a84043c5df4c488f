/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The generated protobuf-c messages. The rest of the tree includes this file,
 * never the generated *.pb-c.h (STYLE.md B1), so the generated code stays
 * an implementation detail of proto/. Initialize messages with
 * kvf__<name>__init(&msg), never the KVF__<NAME>__INIT macro (it casts away
 * const, STYLE.md B8).
 */
#ifndef KVF_PROTO_MSG_H
#define KVF_PROTO_MSG_H

#include "kvfabric.pb-c.h"

#endif /* KVF_PROTO_MSG_H */
