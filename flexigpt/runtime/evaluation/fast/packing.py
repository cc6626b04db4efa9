"""Prefix-tree packing of loglikelihood requests (the fast scorer's data layout).

Every request is a token sequence ``inp`` (what a causal LM reads) plus the positions whose
next-token prediction is scored. Requests that share a prefix (the choices of one
multiple-choice question share their context; WinoGrande's two sentences share everything up
to the blank) are inserted into one token trie, so every shared token is run through the model
once. A trie is flattened into a *row*: node ``i`` sits at position id ``depth(i)`` and attends
to exactly its ancestors and itself, which reproduces, token for token, the causal attention
each request would see in its own unpadded sequence (up to float rounding: the attention
reductions run over a longer, partly masked key range).

Two layouts feed the model: ``batch_rows`` + ``collate`` pad rows (filled with several
documents up to ``row_tokens``) into ``[B, T]`` with a 4D additive mask; ``bucket_rows`` +
``collate_flat`` put one document per row (``pack_requests(per_document=True)``), group rows of
similar length into width buckets and lay the buckets end to end as one ``[1, N]`` sequence
described by a :class:`TreeLayout`, for ``tree_attention``. ``plan_work`` counts what a plan
feeds the model against what stock ``HFLM`` would (:class:`WorkCounts`).

Shapes: a row holds ``n`` nodes; its mask is ``[n, n]`` (numpy bool, True = may attend).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch


@dataclass
class Scored:
    """One request inside a packed row.

    Attributes:
        request: index of the request in the caller's list.
        nodes: row positions whose logits predict ``targets`` (same length).
        targets: the continuation tokens.
    """

    request: int
    nodes: list[int]
    targets: list[int]


@dataclass
class PackedRow:
    """A token trie flattened into one sequence (parents always precede children)."""

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    paths: list[list[int]] = field(default_factory=list)
    scored: list[Scored] = field(default_factory=list)
    _children: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.tokens)

    def new_nodes(self, inp: list[int]) -> int:
        """How many nodes inserting ``inp`` would add."""
        parent = -1
        for depth, tok in enumerate(inp):
            node = self._children.get((parent, tok))
            if node is None:
                return len(inp) - depth
            parent = node
        return 0

    def insert(self, request: int, inp: list[int], n_scored: int, targets: list[int]) -> None:
        """Insert ``inp`` and score the logits at its last ``n_scored`` positions."""
        if not 0 < n_scored <= len(inp) or len(targets) != n_scored:
            raise ValueError(f"request {request}: cannot score {n_scored} of {len(inp)} "
                             f"positions with {len(targets)} targets")
        parent, path = -1, []
        for depth, tok in enumerate(inp):
            node = self._children.get((parent, tok))
            if node is None:
                node = len(self.tokens)
                self._children[(parent, tok)] = node
                self.tokens.append(tok)
                self.positions.append(depth)
            path.append(node)
            parent = node
        self.paths.append(path)
        self.scored.append(Scored(request, path[len(inp) - n_scored:], list(targets)))

    def mask(self) -> np.ndarray:
        """``[n, n]`` bool: node i may attend node j iff j is i or an ancestor of i."""
        n = len(self.tokens)
        allowed = np.zeros((n, n), dtype=bool)
        longest = max((len(p) for p in self.paths), default=0)
        tril = np.tri(longest, dtype=bool)
        for path in self.paths:
            idx = np.asarray(path)
            allowed[np.ix_(idx, idx)] |= tril[: len(path), : len(path)]
        return allowed


def pack_requests(seqs: list[tuple[list[int], int, list[int]]],
                  row_tokens: int, per_document: bool = False) -> list[PackedRow]:
    """Pack requests into prefix-tree rows of at most ``row_tokens`` nodes.

    Args:
        seqs: per request ``(inp, n_scored, targets)``: the model input, how many of its
            last positions are scored, and the tokens they must predict.
        row_tokens: node budget per row; a request longer than it gets a row of its own.
        per_document: also start a new row when fewer than half of a request's tokens are
            already in the current row, so that a row holds one document (the choices of
            one question) rather than several that share a few tokens such as
            ``"Question:"``: for attention restricted to rows (``tree_attention``), a
            longer row costs more than those shared tokens save.

    Returns:
        Rows covering every request exactly once. Requests are visited in lexicographic
        token order so that requests sharing a prefix land in the same row.
    """
    if row_tokens < 1:
        raise ValueError(f"row_tokens must be positive, got {row_tokens}")
    order = sorted(range(len(seqs)), key=lambda i: seqs[i][0])
    rows: list[PackedRow] = []
    row = PackedRow()
    for i in order:
        inp, n_scored, targets = seqs[i]
        new = row.new_nodes(inp)
        if len(row) and (len(row) + new > row_tokens
                         or per_document and 2 * new > len(inp)):
            rows.append(row)
            row = PackedRow()
        row.insert(i, inp, n_scored, targets)
    if len(row):
        rows.append(row)
    return rows


def batch_rows(rows: list[PackedRow], batch_tokens: int) -> list[list[PackedRow]]:
    """Group rows (longest first) so that ``n_rows × longest row ≤ batch_tokens``.

    A row longer than ``batch_tokens`` forms a batch of its own.
    """
    rows = sorted(rows, key=len, reverse=True)
    batches: list[list[PackedRow]] = []
    for row in rows:
        if batches and len(batches[-1][0]) * (len(batches[-1]) + 1) <= batch_tokens:
            batches[-1].append(row)
        else:
            batches.append([row])
    return batches


def _fill(rows: list[PackedRow], width: int, pad_id: int,
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-pad ``rows`` to ``width``: ids and position ids ``[B, width]`` and the bool mask
    ``[B, width, width]``; padding positions attend only to themselves (no empty softmax)."""
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    pos = np.zeros((len(rows), width), dtype=np.int64)
    allowed = np.broadcast_to(np.eye(width, dtype=bool), (len(rows), width, width)).copy()
    for b, row in enumerate(rows):
        n = len(row)
        ids[b, :n] = row.tokens
        pos[b, :n] = row.positions
        allowed[b, :n, :n] = row.mask()
    return ids, pos, allowed


def collate(rows: list[PackedRow], pad_id: int, dtype: torch.dtype,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad rows into model inputs.

    Returns:
        ``input_ids [B, T]``, ``position_ids [B, T]`` and an additive attention mask
        ``[B, 1, T, T]`` of ``dtype`` (0 where allowed, the dtype's minimum elsewhere).
        Padding positions attend only to themselves (no fully masked softmax rows).
    """
    ids, pos, allowed = _fill(rows, max(len(r) for r in rows), pad_id)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(torch.from_numpy(~allowed), torch.finfo(dtype).min)
    return torch.from_numpy(ids), torch.from_numpy(pos), mask[:, None]


# ---- the flat layout: width buckets laid end to end (``tree_attention``) ---------------------
@dataclass(frozen=True)
class Bucket:
    """``rows`` rows of width ``width`` at sequence offset ``start`` (``rows × width`` tokens).

    ``mask [rows, 1, width, width]`` bool: True where a query may attend a key;
    ``positions [rows, width]`` the tokens' position ids (what a sliding-window layer
    measures its window in); None where unknown.
    """

    start: int
    rows: int
    width: int
    mask: torch.Tensor
    positions: torch.Tensor | None = None

    def window_mask(self, window: int) -> torch.Tensor:
        """``mask`` limited to keys less than ``window`` positions behind their query (a
        sliding-window layer's rule: ``q − k < window``), ``[rows, 1, width, width]``."""
        if self.positions is None:
            raise ValueError("this bucket records no positions: no sliding-window mask")
        pos = self.positions
        near = (pos[:, :, None] - pos[:, None, :]) < window
        return self.mask & near[:, None]

    @property
    def end(self) -> int:
        return self.start + self.rows * self.width


@dataclass(frozen=True)
class TreeLayout:
    """The buckets of one ``[1, N]`` forward pass, in sequence order, covering ``0..N``."""

    buckets: tuple[Bucket, ...]

    @property
    def length(self) -> int:
        return self.buckets[-1].end if self.buckets else 0

    def to(self, device: torch.device | str) -> TreeLayout:
        return TreeLayout(tuple(
            Bucket(b.start, b.rows, b.width, b.mask.to(device),
                   None if b.positions is None else b.positions.to(device))
            for b in self.buckets))


def bucket_rows(rows: list[PackedRow], batch_tokens: int, slack: float = 0.0625,
                ) -> list[list[list[PackedRow]]]:
    """Group rows into forward passes of width buckets (passes → buckets → rows).

    Rows are taken longest first. A bucket's width is its first row's length; the next row
    joins it while at least ``(1 - slack) × width`` long (padding stays below ``slack`` of
    the bucket), otherwise it opens a new bucket. A pass closes when its padded tokens would
    exceed ``batch_tokens``; a row longer than that is a pass of its own.
    """
    if not 0 <= slack < 1:
        raise ValueError(f"slack must be in [0, 1), got {slack}")
    passes: list[list[list[PackedRow]]] = []
    tokens = 0
    for row in sorted(rows, key=len, reverse=True):
        if passes:
            bucket = passes[-1][-1]
            joins = len(row) >= (1 - slack) * len(bucket[0])
            cost = len(bucket[0]) if joins else len(row)
            if tokens + cost <= batch_tokens:
                if joins:
                    bucket.append(row)
                else:
                    passes[-1].append([row])
                tokens += cost
                continue
        passes.append([[row]])
        tokens = len(row)
    return passes


def collate_flat(buckets: list[list[PackedRow]], pad_id: int,
                 ) -> tuple[torch.Tensor, torch.Tensor, TreeLayout, list[int]]:
    """Lay buckets end to end as one sequence.

    Returns:
        ``input_ids [1, N]``, ``position_ids [1, N]``, the :class:`TreeLayout` (per bucket a
        bool mask ``[rows, 1, W, W]``) and the sequence offset of each row, in bucket order.
    """
    ids, pos, layout = [], [], []
    starts: list[int] = []
    offset = 0
    for rows in buckets:
        width = len(rows[0])
        b_ids, b_pos, allowed = _fill(rows, width, pad_id)
        ids.append(b_ids.ravel())
        pos.append(b_pos.ravel())
        layout.append(Bucket(offset, len(rows), width, torch.from_numpy(allowed)[:, None],
                             torch.from_numpy(b_pos)))
        starts.extend(range(offset, offset + len(rows) * width, width))
        offset += len(rows) * width
    flat_ids = torch.from_numpy(np.concatenate(ids))[None]
    flat_pos = torch.from_numpy(np.concatenate(pos))[None]
    return flat_ids, flat_pos, TreeLayout(tuple(layout)), starts


# ---- what a plan costs ----------------------------------------------------------------------
@dataclass(frozen=True)
class WorkCounts:
    """Tokens a scoring plan feeds the model, counted without running it.

    Attributes:
        requests: token-level requests.
        stock_tokens: tokens stock ``HFLM`` feeds for the same requests: each distinct
            model input (``(context + continuation)[:-1]`` after truncation; lm-eval's
            collator runs identical ones once) padded to the longest of its batch when
            ``plan_work`` is given stock's batch size (longest first, as the collator sorts);
            stock also runs the LM head and log-softmax at every one of them.
        tree_tokens: prefix-tree nodes (shared prefixes once).
        forward_tokens: tokens in the plan's forward passes (nodes plus padding).
        head_positions: distinct positions whose logits are scored (the LM head runs there).
    """

    requests: int = 0
    stock_tokens: int = 0
    tree_tokens: int = 0
    forward_tokens: int = 0
    head_positions: int = 0

    def __add__(self, other: WorkCounts) -> WorkCounts:
        return WorkCounts(*(getattr(self, f.name) + getattr(other, f.name)
                            for f in fields(self)))

    def flop_ratio(self, body_flops: float, head_flops: float) -> float:
        """Stock's matmul FLOPs over the plan's, given per-token FLOPs of the decoder's
        linear layers and of the LM head (attention scores not counted): the speed-up the
        plan gives at equal FLOP rates and no other costs."""
        ours = self.forward_tokens * body_flops + self.head_positions * head_flops
        return self.stock_tokens * (body_flops + head_flops) / ours


def plan_work(seqs: list[tuple[list[int], int, list[int]]],
              passes: list[list[list[PackedRow]]], stock_batch: int = 1) -> WorkCounts:
    """:class:`WorkCounts` of ``passes`` (passes → buckets → rows, each bucket padded to its
    first row, as ``bucket_rows`` makes them and ``collate``/``collate_flat`` pad them) for the
    requests ``seqs`` (``pack_requests``' input), against stock at batch size
    ``stock_batch``."""
    if stock_batch < 1:
        raise ValueError(f"stock_batch must be positive, got {stock_batch}")
    buckets = [bucket for one_pass in passes for bucket in one_pass]
    rows = [row for bucket in buckets for row in bucket]
    lengths = sorted(map(len, {tuple(inp) for inp, _, _ in seqs}), reverse=True)
    return WorkCounts(
        requests=len(seqs),
        stock_tokens=sum(lengths[i] * len(lengths[i:i + stock_batch])
                         for i in range(0, len(lengths), stock_batch)),
        tree_tokens=sum(map(len, rows)),
        forward_tokens=sum(len(bucket[0]) * len(bucket) for bucket in buckets),
        head_positions=sum(len({n for s in row.scored for n in s.nodes}) for row in rows))
