# SPDX-License-Identifier: Apache-2.0
"""The exceptions of kvq.

A failed libkvq call raises a KvqError (an OSError) whose ``code`` is libkvq's
negative return value, ``errno`` its absolute value, ``name`` what
kvq_strerror() calls it and ``message`` libkvq's own one-line reason
(kvq_client_error(): often the daemon's message).  Which subclass a code
raises is decided in one place, ``error_class``.

Arguments are checked before libkvq is called: a wrong dtype is a TypeError,
a wrong shape, device or layout (non-contiguous) is a ValueError; both name
the argument and what was expected.
"""
import errno

from . import _lib


class KvqError(OSError):
    """A libkvq call failed.  str(): 'what: message [name]'."""

    def __init__(self, code, message, what=""):
        super().__init__(-code, message or _lib.strerror(code))
        self.code = code
        self.name = _lib.strerror(code)
        self.message = message or self.name
        self.what = what

    def __str__(self):
        return f"{self.what + ': ' if self.what else ''}{self.message} [{self.name}]"


class DaemonUnavailable(KvqError, ConnectionError):
    """kvq.connect() could not reach kvqd, or kvqd refused the connection
    (not running: -ENOENT or -ECONNREFUSED; -EACCES; -ETIMEDOUT; -EUSERS;
    -EPROTONOSUPPORT: another protocol version)."""


class PoolRefused(KvqError):
    """kvqd refused an attach: geometry, model or layout mismatch
    (KVQ_ELAYOUT), a bad policy (KVQ_EPOLICY), no such pool (-ENOENT), not
    allowed to create it (-EACCES), ..."""


class PoolFull(KvqError):
    """The pool cannot hold the blocks asked for (-ENOSPC), or the caller's
    quota (-EDQUOT).  From Batch.begin(), ``short`` is the slots the pool
    was short of (0 for a quota); None otherwise."""

    short = None


class NotSupported(KvqError):
    """-ENOTSUP: no CUDA kernel for a layer's (K, V) formats, a cuda pool with
    a libkvq built without CUDA, device memory on a host pool."""


class InheritedError(KvqError):
    """An object opened by another process, inherited across fork(): its
    connection and mapping are the parent's and are left alone."""


def error_class(code, call):
    """The KvqError subclass for libkvq's code from call ('connect',
    'attach' or another)."""
    if code == -errno.ENOTSUP:
        return NotSupported
    if code in (-errno.ENOSPC, -errno.EDQUOT):
        return PoolFull
    if call == "connect":
        return DaemonUnavailable
    if call == "attach":
        return PoolRefused
    return KvqError
