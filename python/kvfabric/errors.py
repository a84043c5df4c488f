# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Every kvf_status_t other than KVF_OK becomes a KvfError."""
from . import _lib

OK = 0
INPROGRESS = 1
ERR_NO_MEMORY = -1
ERR_INVALID = -2
ERR_PROTO = -3
ERR_IO = -4
ERR_TRANSPORT = -5
ERR_TIMEOUT = -6
ERR_NOT_FOUND = -7
ERR_EXISTS = -8
ERR_CHECKSUM = -9
ERR_VERSION = -10
ERR_AUTH = -11
ERR_CLOSED = -12
ERR_BUSY = -13
ERR_UNSUPPORTED = -14
ERR_STALE = -15
ERR_CANCELED = -16
ERR_CONFIG = -17
ERR_TOO_BIG = -18
ERR_RANGE = -19
ERR_STATE = -20


def strerror(status: int) -> str:
    """kvf_strerror(): short lowercase description."""
    return _lib.lib.kvf_strerror(status).decode()


def status_name(status: int) -> str:
    """kvf_status_name(): "KVF_ERR_TIMEOUT"."""
    return _lib.lib.kvf_status_name(status).decode()


class KvfError(Exception):
    """A kvfabric call failed.

    Attributes: ``status`` (the kvf_status_t value), ``name``
    ("KVF_ERR_..."), ``call`` (the C function), ``detail`` (the client's
    kvf_client_last_error(), empty for calls without a connection).
    """

    def __init__(self, status: int, call: str, detail: str = ""):
        self.status = status
        self.name = status_name(status)
        self.call = call
        self.detail = detail
        msg = f"{call}: {strerror(status)} ({self.name})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


def check(status: int, call: str, detail_fn=None) -> None:
    """Raises KvfError unless @p status is KVF_OK."""
    if status != OK:
        detail = detail_fn() if detail_fn is not None else ""
        raise KvfError(status, call, detail)
