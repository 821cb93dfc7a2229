# SPDX-License-Identifier: Apache-2.0
"""A padded transformers batch as kvq sequences' rows (kvq.hf's
bookkeeping; NumPy only, no torch).

transformers gives a step as columns: input_ids [batch, q] and a 2-D
attention_mask [batch, cols + q] whose zeros are padding (generate
left-pads prompts of different lengths), with position_ids [batch, q]
counted over each row's real tokens.  A kvq sequence holds only its row's
real tokens, so each step is mapped to packed rows (kvq.Batch's): row i's
real new columns in order, less the first ones its prefix lookup had
cached already (skip; KvqCache's docstring says why there are any), and
every row is checked against what its sequence holds: the mask's real
tokens before the step, the positions rotary embeddings get, and the
prompt's ids while the prompt is being fed.
"""
import numpy as np


def prompts(prompt_ids, attention_mask=None):
    """(ids [batch, width], mask [batch, width] bool) of prompt_ids, one
    prompt (1-D) or a batch as generate takes it (2-D, padded), and its
    attention mask (None: no padding).  Raises ValueError for a row with
    no real token or a mask of another shape."""
    ids = np.asarray(prompt_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"prompt_ids: one prompt (1-D) or a batch [batch, width] of token ids, not {ids.dtype} "
                         f"of shape {ids.shape}")
    if attention_mask is None:
        mask = np.ones(ids.shape, bool)
    else:
        mask = np.asarray(attention_mask).reshape(ids.shape[0], -1) != 0
        if mask.shape != ids.shape:
            raise ValueError(f"attention_mask: shape {mask.shape}, prompt_ids {ids.shape}")
    if not mask.any(1).all():
        raise ValueError(f"prompt_ids: row {int(np.argmin(mask.any(1)))} has no real token (its mask is all zeros)")
    return ids, mask


def cached_columns(mask, hits):
    """(cols, seen): the prompt's leading columns every row has cached,
    cols, and each row's real tokens among them.  Row i has its first
    hits[i] real tokens (fewer than all: a lookup finds less than the whole
    prompt); cols is the column of the first real token that some row
    lacks, the most that one cache length for all rows can say."""
    cols = min(int(np.flatnonzero(m)[h]) for m, h in zip(mask, hits))
    return cols, mask[:, :cols].sum(1).astype(np.int64)


class Step:
    """One forward's rows.  tokens[i]: row i's new tokens for its sequence
    (may be empty); rows: (batch index, column) of every packed row in
    order, or None when every column of every row is one (no padding, none
    skipped); real[i]: row i's real columns this step; skipped[i]: those
    of them that were cached already."""

    __slots__ = ("tokens", "rows", "real", "skipped")

    def __init__(self, tokens, rows, real, skipped):
        self.tokens, self.rows, self.real, self.skipped = tokens, rows, real, skipped


def plan(ids, mask, position_ids, cols, seen, skip, prompt=None):
    """The Step of a forward given ids [batch, q], its 2-D attention mask
    (None: every column real), position_ids ([1 or batch, q]; None: the
    model's default, cols + j) after cols columns, for rows that hold seen
    real tokens and have skip more of the prompt cached.  prompt: each
    row's real prompt ids, checked while the step still feeds them.
    Raises ValueError where a row's columns are not its sequence's next
    tokens at their own positions."""
    nb, q = ids.shape
    if mask is None:
        real, before = np.ones((nb, q), bool), np.full(nb, cols)
    else:
        if mask.ndim != 2 or mask.shape != (nb, cols + q):
            raise ValueError(f"attention_mask: shape {tuple(mask.shape)}; a 2-D mask [batch, {cols} cached + {q} "
                             f"new columns] (generate's) is needed to tell padding from tokens")
        m = mask != 0
        real, before = m[:, cols:], m[:, :cols].sum(1)
    if (before != seen).any():
        i = int(np.flatnonzero(before != seen)[0])
        raise ValueError(f"attention_mask: row {i} has {int(before[i])} real tokens before this step; its sequence "
                         f"holds {int(seen[i])}")
    rank = np.cumsum(real, 1) - 1
    if position_ids is None:
        pos = np.broadcast_to(np.arange(cols, cols + q), (nb, q))
    else:
        pos = np.asarray(position_ids)
        if pos.ndim != 2 or pos.shape[1] != q or pos.shape[0] not in (1, nb):
            raise ValueError(f"position_ids: shape {pos.shape}; [1 or {nb}, {q}] (one position per column)")
        pos = np.broadcast_to(pos, (nb, q))
    bad = real & (pos != seen[:, None] + rank)
    if bad.any():
        i, j = (int(x[0]) for x in np.nonzero(bad))
        raise ValueError(f"position_ids: row {i} column {j} is at position {int(pos[i, j])}, its sequence's token "
                         f"{int(seen[i] + rank[i, j])}; with padding, give positions counted over each row's real "
                         f"tokens (attention_mask.cumsum(-1) - 1, as generate does)")
    n = real.sum(1)
    if prompt is not None:
        for i in range(nb):
            s, p = int(seen[i]), prompt[i]
            if s < len(p):
                fed = ids[i][real[i]][:len(p) - s]
                if not np.array_equal(fed, p[s:s + len(fed)]):
                    raise ValueError(f"row {i}: this step's tokens are not its prompt's after the {s} it holds "
                                     f"(give prompt_ids[cached columns:], as generate does)")
    skipped = np.minimum(skip, n)
    keep = real & (rank >= skipped[:, None])
    tokens = [ids[i][keep[i]] for i in range(nb)]
    return Step(tokens, None if keep.all() else np.nonzero(keep), n, skipped)
