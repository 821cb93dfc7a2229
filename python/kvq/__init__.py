# SPDX-License-Identifier: Apache-2.0
"""kvq: Python binding of libkvq, the client library of kvqd (a pool of
quantized, paged KV-cache blocks shared by inference workers).

    import kvq, numpy as np
    with kvq.attach("demo", "my-model@rev", layers=2, kv_heads=2, head_dim=64, policy="int8") as pool:
        with pool.sequence() as seq:
            hit = seq.begin_prompt(prompt_ids)          # prefix lookup, then the rest
            ...  # per layer: seq.write(l, k, v); out = seq.attention(l, q)
            seq.commit()                                # seal and publish

kvq.Batch(client) runs one step over several sequences (libkvq's kvq_batch):
each phase (begin, each layer's write and attention, commit) one call for
all of them, over packed rows (Batch.indptr).

Importing checks libkvq (found as kvq._lib says: $KVQ_LIBRARY, pkg-config,
the loader): its version and protocol, raising ImportError on a mismatch.
kvq.hf has a Hugging Face transformers cache whose K/V live in kvqd.
"""
from ._lib import VERSION, libkvq_version, path as libkvq_path, PROTOCOL as protocol
from .client import Client, Sequence, attach, connect
from .batch import Batch
from .errors import DaemonUnavailable, InheritedError, KvqError, NotSupported, PoolFull, PoolRefused

__version__ = VERSION

__all__ = ["Client", "Sequence", "Batch", "attach", "connect", "KvqError", "DaemonUnavailable", "PoolRefused",
           "PoolFull", "NotSupported", "InheritedError", "libkvq_version", "libkvq_path", "protocol"]
