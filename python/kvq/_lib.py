# SPDX-License-Identifier: Apache-2.0
"""libkvq through ctypes: finding and loading it, the checks made at import,
the C structures of kvq.h and every function's prototype (one table).

Where libkvq is looked for, in order (the first that loads is used):
  1. $KVQ_LIBRARY, a path to libkvq.so.3 (a build tree's: build/.libs/libkvq.so.3);
  2. the libdir that ``pkg-config --variable=libdir kvq`` names (an installed
     kvqd, before or without ldconfig);
  3. ``libkvq.so.3`` through the dynamic loader (LD_LIBRARY_PATH, ld.so.cache).
No rpath: the package is pure Python and holds no binary.

ctypes.CDLL releases the GIL around every foreign call, so the calls that wait
(on kvqd's socket, or on the GPU in commit and close) never hold it.
"""
import ctypes
import os
import shutil
import subprocess

# What this package was written against: libkvq's version (major.minor must
# be equal), the protocol libkvq speaks to kvqd, the soname, and the
# library's interface (Makefile.am's -version-info): every function of
# PROTOTYPES is needed at import, so an older libkvq.so.3 is refused there.
VERSION = "0.1.0"
PROTOCOL = 10
SONAME = "libkvq.so.3"
INTERFACE = 9

# kvq_wire.h's project codes (beyond errno)
KVQ_ELAYOUT, KVQ_EPOLICY, KVQ_EPROTOCOL = -1001, -1002, -1003
KVQ_ACT_F16, KVQ_ACT_BF16 = 0, 1
KVQ_TRACE_WRITE, KVQ_TRACE_ATTENTION = 0, 1
KVQ_BATCH_LOOKUP = 1
KVQ_BATCH_BEGIN, KVQ_BATCH_COMMIT = 0, 1

c_u32, c_u64, c_int, c_p, c_char_p = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
P_u32 = ctypes.POINTER(c_u32)
P_i32 = ctypes.POINTER(ctypes.c_int32)


class AttachParams(ctypes.Structure):
    """struct kvq_attach_params"""
    _fields_ = [("pool", c_char_p), ("model_id", c_char_p), ("layers", c_u32), ("kv_heads", c_u32),
                ("head_dim", c_u32), ("block_tokens", c_u32), ("policy", c_char_p), ("window", c_u32),
                ("act", c_int), ("create", c_int), ("n_sealed", c_u32), ("n_open", c_u32),
                ("backend", c_char_p), ("device", c_int), ("codebooks", c_char_p),
                ("host_capacity", ctypes.c_uint64)]   # interface 9


class Stats(ctypes.Structure):
    """struct kvq_stats"""
    _fields_ = [("name", ctypes.c_char * 65), ("model_id", ctypes.c_char * 257), ("backend", ctypes.c_char * 8),
                ("device", c_int), ("layers", c_u32), ("kv_heads", c_u32), ("head_dim", c_u32),
                ("block_tokens", c_u32), ("window", c_u32), ("total_bytes", c_u64), ("n_sealed", c_u32),
                ("n_open", c_u32), ("sealed_free", c_u32), ("sealed_reserved", c_u32), ("sealed_held", c_u32),
                ("cached", c_u32), ("referenced", c_u32), ("open_used", c_u32), ("lookup_tokens", c_u64),
                ("hit_tokens", c_u64), ("evictions", c_u64), ("alloc_failures", c_u64), ("clients", c_u32)]


class SinkStats(ctypes.Structure):
    """struct kvq_sink_stats"""
    _fields_ = [("sink_blocks", c_u32), ("n_sink", c_u32), ("sink_free", c_u32), ("sink_held", c_u32),
                ("sink_cached", c_u32), ("sink_referenced", c_u32), ("sequences", c_u32), ("sink_tokens", c_u64)]


class Trace(ctypes.Structure):
    """struct kvq_trace"""
    _fields_ = [("op", c_int), ("layer", c_u32), ("device", c_int), ("k", c_p), ("v", c_p), ("q", c_p),
                ("out", c_p)]


TRACE_FN = ctypes.CFUNCTYPE(None, c_p, ctypes.POINTER(Trace))

# name: (restype, argtypes) -- every libkvq function the package calls
PROTOTYPES = {
    "kvq_version": (c_char_p, []),
    "kvq_protocol_version": (ctypes.c_uint, []),
    "kvq_strerror": (c_char_p, [c_int]),
    "kvq_client_connect": (c_int, [c_char_p, c_char_p, ctypes.POINTER(c_p)]),
    "kvq_client_free": (None, [c_p]),
    "kvq_client_error": (c_char_p, [c_p]),
    "kvq_client_id": (c_u64, [c_p]),
    "kvq_client_attach_sized": (c_int, [c_p, ctypes.POINTER(AttachParams), ctypes.c_size_t]),
    "kvq_client_set_group": (c_int, [c_p, c_char_p, c_u32, c_u32]),
    "kvq_client_set_sinks": (c_int, [c_p, c_u32, c_u32]),
    "kvq_client_backend": (c_char_p, [c_p]),
    "kvq_client_device": (c_int, [c_p]),
    "kvq_client_set_stream": (c_int, [c_p, c_p]),
    "kvq_client_set_trace": (c_int, [c_p, TRACE_FN, c_p]),
    "kvq_client_stats": (c_int, [c_p, c_char_p, ctypes.POINTER(Stats)]),
    "kvq_client_sink_stats": (c_int, [c_p, c_char_p, ctypes.POINTER(SinkStats)]),
    "kvq_client_pool_figures": (c_int, [c_p, c_char_p, ctypes.POINTER(c_p)]),
    "kvq_pool_figures_count": (ctypes.c_size_t, [c_p]),
    "kvq_pool_figures_at": (c_int, [c_p, ctypes.c_size_t, ctypes.POINTER(c_char_p), ctypes.POINTER(c_u64)]),
    "kvq_pool_figures_free": (None, [c_p]),
    "kvq_seq_new": (c_int, [c_p, c_p, ctypes.c_size_t, ctypes.POINTER(c_p)]),
    "kvq_seq_free": (None, [c_p]),
    "kvq_seq_tokens": (c_u32, [c_p]),
    "kvq_seq_from_prompt": (c_int, [c_p, P_u32, c_u32, P_u32]),
    "kvq_seq_set_request": (c_int, [c_p, c_char_p, ctypes.c_size_t]),
    "kvq_seq_begin": (c_int, [c_p, P_u32, c_u32]),
    "kvq_seq_write": (c_int, [c_p, c_u32, c_p, c_p]),
    "kvq_seq_commit": (c_int, [c_p]),
    "kvq_seq_attention": (c_int, [c_p, c_u32, c_u32, c_u32, ctypes.c_float, c_p, c_p]),
    "kvq_seq_attention_device": (c_int, [c_p, c_u32, c_u32, c_u32, ctypes.c_float, c_p, c_p, c_int]),
    "kvq_seq_fork": (c_int, [c_p, ctypes.POINTER(c_p)]),
    "kvq_seq_blocks": (c_int, [c_p, ctypes.POINTER(P_i32), P_u32, ctypes.POINTER(P_i32), P_u32]),
    # interface 8
    "kvq_batch_new": (c_int, [c_p, ctypes.POINTER(c_p)]),
    "kvq_batch_free": (None, [c_p]),
    "kvq_batch_add": (c_int, [c_p, c_p, P_u32, c_u32, ctypes.c_uint]),
    "kvq_batch_clear": (c_int, [c_p]),
    "kvq_batch_size": (c_u32, [c_p]),
    "kvq_batch_begin": (c_int, [c_p, P_u32]),
    "kvq_batch_indptr": (P_u32, [c_p, P_u32]),
    "kvq_batch_hit": (c_u32, [c_p, c_u32]),
    "kvq_batch_write": (c_int, [c_p, c_u32, c_p, c_p]),
    "kvq_batch_attention": (c_int, [c_p, c_u32, c_u32, ctypes.c_float, c_p, c_p]),
    "kvq_batch_attention_device": (c_int, [c_p, c_u32, c_u32, ctypes.c_float, c_p, c_p, c_int]),
    "kvq_batch_commit": (c_int, [c_p]),
    "kvq_batch_abort": (None, [c_p]),
    "kvq_batch_requests": (c_int, [c_p, c_int, P_u32, P_u32]),
}


def _candidates():
    env = os.environ.get("KVQ_LIBRARY")
    if env:
        return [env]
    found = []
    if shutil.which("pkg-config"):
        try:
            libdir = subprocess.run(["pkg-config", "--variable=libdir", "kvq"], capture_output=True, text=True,
                                    timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            libdir = ""
        if libdir:
            found.append(os.path.join(libdir, SONAME))
    found.append(SONAME)
    return found


def _load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError("kvq: libkvq not found (" + "; ".join(tried) + "); install kvqd (make install), or set "
                      "KVQ_LIBRARY to its libkvq.so.3 (in a build tree: build/.libs/libkvq.so.3)")


def _check(lib, path):
    """Prototypes, then libkvq's version and protocol against this package's."""
    for name, (res, args) in PROTOTYPES.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise ImportError(f"kvq: {path} has no {name}: a libkvq older than this package "
                              f"(kvq {VERSION} needs libkvq interface {INTERFACE}: libkvq {VERSION} or a later "
                              f"{VERSION.rsplit('.', 1)[0]}.x)")
        f.restype, f.argtypes = res, args
    version = lib.kvq_version().decode()
    if version.split(".")[:2] != VERSION.split(".")[:2]:
        raise ImportError(f"kvq: {path} is libkvq {version}; this package (kvq {VERSION}) needs libkvq "
                          f"{VERSION.rsplit('.', 1)[0]}.x")
    proto = lib.kvq_protocol_version()
    if proto != PROTOCOL:
        raise ImportError(f"kvq: {path} (libkvq {version}) speaks kvqd protocol {proto}; this package was "
                          f"written for protocol {PROTOCOL}")
    return version


lib, path = _load()
libkvq_version = _check(lib, path)


def strerror(code):
    """kvq_strerror: the static name of a libkvq code."""
    return lib.kvq_strerror(code).decode(errors="replace")
