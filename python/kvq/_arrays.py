# SPDX-License-Identifier: Apache-2.0
"""What an array argument is, checked, as libkvq takes it: its address,
whether it lives on a GPU (and which), and the CUDA stream its producer
uses.  Nothing here copies: an array in the wrong dtype, shape, device or
layout is refused with an error that names it.

Accepted: NumPy arrays (host memory; their buffer, through
__array_interface__), torch tensors (data_ptr(); torch is used only when the
caller passes its tensors, never imported here) and other objects with
__cuda_array_interface__ (CuPy, Numba: device memory).  dtypes are named
'f16', 'bf16' and 'f32'.
"""
import sys

import numpy as np

_NUMPY = {np.dtype(np.float16): "f16", np.dtype(np.float32): "f32"}
_CAI = {"<f2": "f16", "<f4": "f32"}
_TORCH = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}

# __cuda_array_interface__'s stream field (v3): 1 the legacy default stream
# (NULL for CUDA), 2 the per-thread default one (cudaStreamPerThread)
_CAI_LEGACY, _CAI_PER_THREAD = 1, 2


class Array:
    """One checked argument: ptr (int), dtype ('f16', 'bf16', 'f32'),
    device (-1 for host memory, else the CUDA ordinal), stream (a
    cudaStream_t as int, 0 the legacy default; None for host memory) and
    obj, the caller's object, kept alive for the call."""

    __slots__ = ("ptr", "dtype", "device", "stream", "obj", "shape")

    def __init__(self, ptr, dtype, device, stream, obj, shape):
        self.ptr, self.dtype, self.device, self.stream, self.obj, self.shape = ptr, dtype, device, stream, obj, shape

    def dtype_name(self):
        """The caller's name of its dtype (float32, torch.bfloat16, <f4)."""
        d = getattr(self.obj, "dtype", None)
        return str(d) if d is not None else self.dtype


def _torch_of(x):
    t = sys.modules.get("torch")
    return t if t is not None and isinstance(x, t.Tensor) else None


def _c_contiguous(shape, strides, itemsize):
    want = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != want:
            return False
        want *= n
    return True


def inspect(x, what, writable=False):
    """The Array of x, whatever shape and dtype: contiguity and (for
    outputs) writability are checked here, shape and dtype by check()."""
    torch = _torch_of(x)
    if torch is not None:
        dt = _TORCH.get(str(x.dtype).replace("torch.", ""))
        if not x.is_contiguous():
            raise ValueError(f"{what}: the tensor is not contiguous (strides {tuple(x.stride())}); pass "
                             f"x.contiguous(), a copy")
        if x.device.type == "cuda":
            dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
            stream = torch.cuda.current_stream(dev).cuda_stream
        elif x.device.type == "cpu":
            dev, stream = -1, None
        else:
            raise ValueError(f"{what}: a tensor on {x.device}; kvq takes CPU or CUDA tensors")
        return Array(x.data_ptr(), dt or str(x.dtype), dev, stream, x, tuple(x.shape))
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(cai["shape"])
        dt = _CAI.get(cai["typestr"], cai["typestr"])
        itemsize = int(cai["typestr"][2:]) if cai["typestr"][2:].isdigit() else 0
        if cai.get("strides") is not None and not _c_contiguous(shape, cai["strides"], itemsize):
            raise ValueError(f"{what}: the array is not C-contiguous (strides {cai['strides']})")
        ptr, readonly = cai["data"]
        if writable and readonly:
            raise ValueError(f"{what}: the array is read-only")
        s = cai.get("stream")
        stream = 0 if s in (None, _CAI_LEGACY) else s
        # the device of a pointer is not in the interface: the pool's is checked by libkvq's kernels
        return Array(ptr, dt, None, stream, x, shape)
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise ValueError(f"{what}: the array is not C-contiguous (strides {x.strides}); pass "
                             f"np.ascontiguousarray(x), a copy")
        if writable and not x.flags.writeable:
            raise ValueError(f"{what}: the array is read-only")
        if x.dtype.byteorder == ">":
            raise TypeError(f"{what}: dtype {x.dtype} is big-endian")
        dt = _NUMPY.get(x.dtype.newbyteorder("="), "bf16" if x.dtype.name == "bfloat16" else str(x.dtype))
        return Array(x.__array_interface__["data"][0], dt, -1, None, x, x.shape)
    raise TypeError(f"{what}: a {type(x).__module__}.{type(x).__name__}; kvq takes NumPy arrays, torch tensors "
                    f"or objects with __cuda_array_interface__")


def check(a, what, shape, dtypes, layout):
    """Refuses a of another shape (layout names the axes) or dtype."""
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{what}: shape {tuple(a.shape)}, expected {tuple(shape)} ({layout})")
    if a.dtype not in dtypes:
        raise TypeError(f"{what}: dtype {a.dtype_name()}, expected {' or '.join(dtypes)} (no conversion is made: "
                        f"convert it first, a copy)")


# The checks of a pool's calls, shared by Sequence and Batch: the same
# arguments reach libkvq the same way whichever object makes the call.

def kv(x, what, shape, act, dev, layout):
    """K or V of a write: shape, the pool's act dtype, and host memory or
    the pool's device (dev: the pool's CUDA ordinal, -1 a host pool)."""
    a = inspect(x, what)
    check(a, what, shape, (act,), layout)
    if a.device is not None and a.device >= 0 and a.device != dev:
        raise ValueError(f"{what}: on cuda:{a.device}, " + (f"the pool is on cuda:{dev}" if dev >= 0 else
                         "the pool is a host pool (host memory only)"))
    if a.device is None and dev < 0:
        raise ValueError(f"{what}: device memory, and the pool is a host pool (host memory only)")
    return a


def attention(q, out, head_dim, act, dev, rows=None):
    """q and out of an attention call, out allocated when None: (q's Array,
    out's Array, out, whether they are in device memory).  rows: the query
    rows the call needs (None: q's own count)."""
    qa = inspect(q, "q")
    if len(qa.shape) != 3:
        raise ValueError(f"q: shape {tuple(qa.shape)}, expected 3 axes [n_q, q_heads, head_dim]")
    shape = (qa.shape[0] if rows is None else rows, qa.shape[1], head_dim)
    on_dev = qa.device != -1
    if out is None:
        out = _alloc_out(q, shape, on_dev)
    oa = inspect(out, "out", writable=True)
    if on_dev != (oa.device != -1):
        raise ValueError("q and out: one in host memory and one on a GPU; both host (float32) or both device")
    if on_dev:
        if dev < 0:
            raise ValueError("q: device memory, and the pool is a host pool (host memory only)")
        for a, w in ((qa, "q"), (oa, "out")):
            if a.device is not None and a.device != dev:
                raise ValueError(f"{w}: on cuda:{a.device}, the pool is on cuda:{dev}")
        check(qa, "q", shape, (act,), "[n_q, q_heads, head_dim], the pool's act dtype")
        check(oa, "out", shape, ("f32", act), "[n_q, q_heads, head_dim]")
    else:
        check(qa, "q", shape, ("f32",), "[n_q, q_heads, head_dim] in host memory")
        check(oa, "out", shape, ("f32",), "[n_q, q_heads, head_dim] in host memory")
    return qa, oa, out, on_dev


def _alloc_out(q, shape, on_dev):
    torch = _torch_of(q)
    if torch is not None:
        return torch.empty(shape, dtype=q.dtype if on_dev else torch.float32, device=q.device)
    if on_dev:
        raise ValueError("out: pass an output array for device memory that is not a torch tensor")
    return np.empty(shape, np.float32)
