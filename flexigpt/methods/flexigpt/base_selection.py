"""Choosing the weight-sharing base of each pruned block (FlexiGPT Eq. 2–5).

For pruned block i, candidate j and each linear matrix W (q, k, v, o, gate, up, down):

* ``lowrank`` (the paper): Ŵ = rank-r truncation of W; the distance is
  ``||Ŵ_i − (Ŵ_j + Δ)||_F`` with Δ the rank-r truncation of ``Ŵ_i − Ŵ_j``, which by
  Eckart–Young equals ``sqrt(Σ_{k=r+1}^{2r} σ_k(Ŵ_i − Ŵ_j)²)``. ``Ŵ_i − Ŵ_j = P Qᵀ`` with
  ``P = [U_iΣ_i, −U_jΣ_j]`` ``[out, 2r]`` and ``Q = [V_i, V_j]`` ``[in, 2r]``, so its
  singular values are those of the small ``R_P R_Qᵀ`` (QR factors): no large SVD per pair.
* ``full`` (Table 4 row 1, no high-rank removal): ``sqrt(Σ_{k>r} σ_k(W_i − W_j)²)``.
* ``frobenius`` (Fig. 2c): ``||W_i − W_j||_F``.

The block distance is the **sum** of the per-matrix distances (not stated in the paper).
Candidates are the unpruned blocks only; ties go to the lower block index.

With a randomized truncation (``solver``; :mod:`flexigpt.methods.truncated_svd`) the
distances are approximate (≤ 0.8 % relative difference on SmolLM2-135M,
``results/reference/scaling/bench_truncated_svd_smollm2-135m.json``), enough to flip a close
call. So every candidate within :data:`RECHECK_MARGIN` of a row's best approximate distance is
**rechecked exactly**: the blocks involved are truncated again by the exact SVD and the row's
base is the argmin of the exact distances among those close candidates. The choice then equals
the exact solver's whenever the approximation errs by less than half the margin on every distance
(the exact best is always among the rechecked, and they are compared exactly); the rechecked
entries of the distance matrix hold exact values.

Where nearly every candidate is a close call the recheck repeats the exact solver's whole work
after the randomized one, so ``auto`` first *probes* one matrix kind (the first it would
truncate randomized): if more than :data:`FLAT_FRACTION` of the candidates lie within the
margin of their row's best, base selection decomposes every matrix exactly (same choices and
distances as ``exact``, bit for bit); otherwise the probe's distances are kept and the other
kinds follow. The probe only decides the cost, never the choice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from flexigpt.methods.truncated_svd import resolve, top_svd
from flexigpt.storage.models.adapters import ArchAdapter

log = logging.getLogger(__name__)

DISTANCES = ("lowrank", "full", "frobenius")
#: Relative margin of the exact recheck after randomized truncations: candidates whose
#: approximate block distance is ≤ (1 + margin) × the row's best are compared exactly
#: (2.5× the largest relative distance error measured on SmolLM2-135M, 0.8 %).
RECHECK_MARGIN = 0.02
#: ``auto`` decomposes exactly when, on the first matrix kind it would truncate randomized,
#: more than this fraction of each pruned block's candidates (averaged over the blocks) lie
#: within :data:`RECHECK_MARGIN` of the block's best: the recheck would then redo nearly every
#: exact decomposition anyway (i.i.d. random weights: all candidates within 0.2 %).
FLAT_FRACTION = 0.5


@dataclass
class BaseSelection:
    """Result of :func:`select_bases`.

    Attributes:
        distances: ``[L, L]`` float64 block distances; row i = pruned block, column j =
            candidate. NaN where invalid (unpruned rows, pruned columns, the diagonal).
        base_map: ``{pruned block: chosen base block}``.
        timings: seconds per stage (``truncation``, ``distances``, ``recheck`` when
            randomized truncations were rechecked, ``probe`` when ``auto`` probed, with its
            ``probe_truncation`` and ``probe_distances`` parts).
        rechecked: ``{pruned block: candidates compared exactly}`` (close calls of a
            randomized truncation; empty for the exact solver).
        flat_fallback: ``auto`` found the candidates flat (:data:`FLAT_FRACTION`) and
            decomposed every matrix exactly.
    """

    distances: torch.Tensor
    base_map: dict[int, int]
    timings: dict[str, float] = field(default_factory=dict)
    rechecked: dict[int, list[int]] = field(default_factory=dict)
    flat_fallback: bool = False

    def matrix_json(self) -> list[list[float | None]]:
        """The distance matrix as nested lists with ``None`` for invalid entries."""
        return [[None if torch.isnan(v) else float(v) for v in row] for row in self.distances]


@torch.no_grad()
def truncations(weights: torch.Tensor, rank: int, svd_dtype: torch.dtype,
                chunk: int = 8, solver: str = "exact") -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-``rank`` factors of a stack of matrices (top-r factors by ``solver``:
    :mod:`flexigpt.methods.truncated_svd`).

    Args:
        weights: ``[L, out, in]``.
    Returns:
        ``US [L, out, r]`` (left vectors scaled by singular values) and ``V [L, in, r]`` so
        that ``Ŵ_l = US_l V_lᵀ``.
    """
    us_parts, v_parts = [], []
    for start in range(0, weights.shape[0], chunk):
        top = top_svd(weights[start:start + chunk].to(svd_dtype), rank, solver)
        us_parts.append(top.u * top.s[..., None, :])
        v_parts.append(top.vh.mT)
    return torch.cat(us_parts), torch.cat(v_parts)


def lowrank_distance(us_i: torch.Tensor, v_i: torch.Tensor, us_j: torch.Tensor,
                     v_j: torch.Tensor, rank: int) -> torch.Tensor:
    """Eq. 2 for one pruned matrix against ``J`` candidates.

    Args:
        us_i: ``[out, r]``, v_i: ``[in, r]`` factors of Ŵ_i; us_j: ``[J, out, r]``,
            v_j: ``[J, in, r]`` factors of the candidates.
    Returns:
        ``[J]`` distances ``sqrt(Σ_{k=r+1}^{2r} σ_k(Ŵ_i − Ŵ_j)²)``.
    """
    n = us_j.shape[0]
    p = torch.cat([us_i.expand(n, -1, -1), -us_j], dim=-1)  # [J, out, 2r]
    q = torch.cat([v_i.expand(n, -1, -1), v_j], dim=-1)  # [J, in, 2r]
    r_p = torch.linalg.qr(p, mode="r").R
    r_q = torch.linalg.qr(q, mode="r").R
    s = torch.linalg.svdvals(r_p @ r_q.mT)  # singular values of Ŵ_i − Ŵ_j, descending
    return s[:, rank:].pow(2).sum(-1).sqrt()


def _full_distance(w_i: torch.Tensor, w_j: torch.Tensor, rank: int, chunk: int = 8) -> torch.Tensor:
    out = []
    for start in range(0, w_j.shape[0], chunk):
        diff = w_i - w_j[start:start + chunk]
        if diff.shape[-2] < diff.shape[-1]:
            diff = diff.mT
        out.append(torch.linalg.svdvals(diff)[:, rank:].pow(2).sum(-1).sqrt())
    return torch.cat(out)


@torch.no_grad()
def select_bases(blocks: list[nn.Module] | nn.ModuleList, adapter: ArchAdapter,
                 pruned: list[int], ranks: dict[str, int], metric: str = "lowrank",
                 svd_dtype: torch.dtype = torch.float32, progress: bool = True,
                 solver: str = "exact") -> BaseSelection:
    """Distances of every pruned block to every unpruned block, and the argmin base (Eq. 5).

    Args:
        blocks: the model's decoder blocks (all dense ``nn.Linear``s).
        adapter: architecture adapter (names of the linears).
        pruned: indices of the pruned blocks.
        ranks: ``{dotted linear name: r}`` truncation rank per matrix (``lowrank``/``full``).
        metric: one of :data:`DISTANCES`.
        svd_dtype: dtype of every decomposition and distance.
        solver: how ``lowrank``'s rank-r truncations are computed
            (:data:`flexigpt.methods.truncated_svd.SOLVERS`).

    Raises:
        ValueError: unknown metric, or no unpruned candidate block.
    """
    if metric not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {metric!r}")
    n = len(blocks)
    pruned = sorted(set(pruned))
    candidates = [j for j in range(n) if j not in pruned]
    if not pruned or not candidates:
        raise ValueError(f"base selection needs pruned blocks and unpruned candidates; got "
                         f"pruned={pruned} of {n} blocks")
    dist = torch.full((n, n), float("nan"), dtype=torch.float64)
    timings = {"truncation": 0.0, "distances": 0.0}
    total = torch.zeros(len(pruned), len(candidates), dtype=torch.float64)
    names = list(adapter.linear_names())
    probe = _probe_name(blocks, adapter, ranks, solver) if metric == "lowrank" else None
    approximate = flat = False
    if probe is not None:  # auto: is the choice a close call everywhere? (module docstring)
        t0 = time.perf_counter()
        probe_times = {"truncation": 0.0, "distances": 0.0}
        candidate_distances(blocks, adapter, pruned, candidates, ranks, metric, svd_dtype,
                            False, solver, probe_times, [probe], total)
        timings["probe"] = time.perf_counter() - t0
        timings.update({f"probe_{k}": v for k, v in probe_times.items()})
        close = _close_fraction(total)
        flat = close > FLAT_FRACTION
        if flat:
            log.info("auto: on %s %.0f %% of the candidates lie within %.0f %% of their best; "
                     "decomposing every matrix exactly", probe, 100 * close, 100 * RECHECK_MARGIN)
            total.zero_()
            solver = "exact"
        else:
            names = [name for name in names if name != probe]
            approximate = True
    _, randomized = candidate_distances(blocks, adapter, pruned, candidates, ranks, metric,
                                        svd_dtype, progress, solver, timings, names, total)
    approximate |= randomized
    cand = torch.tensor(candidates)
    for row, i in enumerate(pruned):
        dist[i, cand] = total[row]
    base_map = {i: candidates[int(torch.argmin(total[row]))] for row, i in enumerate(pruned)}
    rechecked: dict[int, list[int]] = {}
    if approximate:
        t0 = time.perf_counter()
        rechecked = _recheck_close_calls(blocks, adapter, pruned, candidates, total, ranks,
                                         svd_dtype, dist, base_map)
        timings["recheck"] = time.perf_counter() - t0
    log.info("base map (pruned -> base): %s", base_map)
    return BaseSelection(distances=dist, base_map=base_map,
                         timings={k: round(v, 4) for k, v in timings.items()},
                         rechecked=rechecked, flat_fallback=flat)


def _probe_name(blocks: list[nn.Module] | nn.ModuleList, adapter: ArchAdapter,
                ranks: dict[str, int], solver: str) -> str | None:
    """The matrix kind ``auto`` probes: the first it would truncate randomized (None: no
    probe, for the other solvers or when ``auto`` decomposes everything exactly)."""
    if solver != "auto":
        return None
    for name, lin in adapter.block_linears(blocks[0]).items():
        if resolve(solver, lin.weight.shape, ranks[name]) == "randomized":
            return name
    return None


def _close_fraction(total: torch.Tensor) -> float:
    """Mean over rows of ``total`` ``[P, C]`` of the fraction of candidates within
    :data:`RECHECK_MARGIN` of the row's best."""
    best = total.min(dim=1, keepdim=True).values
    return float((total <= best * (1 + RECHECK_MARGIN)).double().mean())


@torch.no_grad()
def candidate_distances(blocks: list[nn.Module] | nn.ModuleList, adapter: ArchAdapter,
                        pruned: list[int], candidates: list[int], ranks: dict[str, int],
                        metric: str = "lowrank", svd_dtype: torch.dtype = torch.float32,
                        progress: bool = True, solver: str = "exact",
                        timings: dict[str, float] | None = None, names: list[str] | None = None,
                        total: torch.Tensor | None = None) -> tuple[torch.Tensor, bool]:
    """Block distances (the per-matrix distances of ``metric`` summed over the linears
    ``names``, default all in the adapter's order) of every pruned block to every candidate,
    before any recheck.

    Returns:
        ``[len(pruned), len(candidates)]`` float64 distances (rows and columns in the given
        orders; added, name by name, to ``total`` when given), and whether a truncation was
        randomized (the ``lowrank`` distances are then approximate; :func:`select_bases`
        rechecks the close calls exactly). Seconds are added to ``timings["truncation"]`` /
        ``timings["distances"]`` when ``timings`` is given.
    """
    timings = {"truncation": 0.0, "distances": 0.0} if timings is None else timings
    if total is None:
        total = torch.zeros(len(pruned), len(candidates), dtype=torch.float64)
    cand = torch.tensor(candidates)
    approximate = False
    for name in tqdm(adapter.linear_names() if names is None else names,
                     desc=f"base selection ({metric})", disable=not progress):
        weights = _stack(blocks, adapter, name)
        rank = ranks[name]
        if metric == "lowrank":
            approximate |= resolve(solver, weights.shape, rank) == "randomized"
            t0 = time.perf_counter()
            us, v = truncations(weights, rank, svd_dtype, solver=solver)
            timings["truncation"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            for row, i in enumerate(pruned):
                total[row] += lowrank_distance(us[i], v[i], us[cand], v[cand], rank).double()
        else:
            t0 = time.perf_counter()
            w = weights.to(svd_dtype)
            for row, i in enumerate(pruned):
                if metric == "full":
                    d = _full_distance(w[i], w[cand], rank)
                else:
                    d = torch.linalg.matrix_norm(w[i] - w[cand])
                total[row] += d.double()
        timings["distances"] += time.perf_counter() - t0
    return total, approximate


def _stack(blocks: list[nn.Module] | nn.ModuleList, adapter: ArchAdapter, name: str,
           which: list[int] | None = None) -> torch.Tensor:
    """``[len(which), out, in]``: linear ``name``'s weight of blocks ``which`` (all: None)."""
    which = list(range(len(blocks))) if which is None else which
    return torch.stack([adapter.block_linears(blocks[b])[name].weight.detach() for b in which])


def _recheck_close_calls(blocks: list[nn.Module] | nn.ModuleList, adapter: ArchAdapter,
                         pruned: list[int], candidates: list[int], total: torch.Tensor,
                         ranks: dict[str, int], svd_dtype: torch.dtype, dist: torch.Tensor,
                         base_map: dict[int, int]) -> dict[int, list[int]]:
    """Exact ``lowrank`` distances for every row's close candidates (approximate total
    ≤ (1 + :data:`RECHECK_MARGIN`) × the row's best; ``total`` ``[P, C]``); updates
    ``dist`` and ``base_map`` in place (argmin of the exact distances among the close ones,
    ties to the lower block index) and returns ``{pruned block: close candidates}`` for the
    rows with more than one."""
    close: dict[int, list[int]] = {}
    for row in range(len(pruned)):
        best = float(total[row].min())
        cols = [c for c in range(len(candidates))
                if float(total[row, c]) <= best * (1 + RECHECK_MARGIN)]
        if len(cols) > 1:
            close[row] = cols
    if not close:
        return {}
    needed = sorted({pruned[row] for row in close}
                    | {candidates[c] for cols in close.values() for c in cols})
    at = {b: k for k, b in enumerate(needed)}
    exact = {row: torch.zeros(len(cols), dtype=torch.float64) for row, cols in close.items()}
    for name in adapter.linear_names():
        rank = ranks[name]
        us, v = truncations(_stack(blocks, adapter, name, needed), rank, svd_dtype,
                            solver="exact")
        for row, cols in close.items():
            j = torch.tensor([at[candidates[c]] for c in cols])
            i = at[pruned[row]]
            exact[row] += lowrank_distance(us[i], v[i], us[j], v[j], rank).double()
    out = {}
    for row, cols in close.items():
        i = pruned[row]
        names = [candidates[c] for c in cols]
        dist[i, torch.tensor(names)] = exact[row]
        chosen = names[int(torch.argmin(exact[row]))]
        if chosen != base_map[i]:
            log.info("block %d: exact recheck of %s chose base %d over the approximate %d",
                     i, names, chosen, base_map[i])
        base_map[i] = chosen
        out[i] = names
    log.info("exact recheck of %d close call(s) on %d block(s): %s", len(out), len(needed), out)
    return out
