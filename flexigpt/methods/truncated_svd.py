"""The top ``r`` singular triplets of (stacks of) matrices: exact, or randomized.

FlexiGPT uses only the top r = hidden/16 singular triplets of each matrix it decomposes: the
rank-r truncations of base selection (Eq. 2–5) and the SVD initialisation of
``W_pruned − W_base`` (Eq. 7–8). A full ``torch.linalg.svd`` costs O(m·n·min(m, n)); at
Llama-2-7B size (4096 × 11008 matrices, r = 256) that is ~16× the work of the r factors used.

Solvers (:data:`SOLVERS`; FlexiGPT's ``svd`` option):

* ``exact``: the thin SVD (``torch.linalg.svd``), every factor computed, the top r kept:
  bit-identical to what FlexiGPT did before this option existed.
* ``randomized``: randomized subspace iteration (Halko, Martinsson & Tropp, SIAM Review 2011,
  Alg. 4.4): a Gaussian sketch of ``l = r + p`` columns (:data:`OVERSAMPLE` ``p = r``),
  :data:`POWER_ITERS` ``q`` power iterations re-orthonormalised by QR at every half step, then
  the exact SVD of the small ``l × n`` projection. Cost O((2q + 2)·m·n·l). Error bound (HMT
  Cor. 10.10 with the tail bounded by its largest term): the expected spectral error of the
  rank-``l`` projection is at most ``C^{1/(2q+1)} · σ_{r+1}`` with ``C = 1 + √(r/(p−1)) +
  (e√(r+p)/p)·√(min(m, n) − r)`` (for r = p = 256, min(m, n) = 4096, q = 4: ≤ 1.37 σ_{r+1});
  weight spectra decay, so the Frobenius error of the returned truncation is far closer to
  the optimal one than this bound (``benchmarks/bench_truncated_svd.py`` measures both). The
  Gaussian sketch comes from a fixed seed, so a decomposition repeats exactly on one platform.
* ``auto``: ``randomized`` where the smaller side of the matrix is at least
  :data:`AUTO_MIN_SIDE` (below it an exact SVD takes milliseconds; SmolLM2-135M, hidden 576,
  stays exact and bit-identical), else ``exact``. Base selection adds a probe to ``auto``
  (:mod:`flexigpt.methods.flexigpt.base_selection`): where nearly every candidate base is a close
  call, as on i.i.d. random weights, its truncations are all exact.

FlexiGPT's default is ``exact`` until ``benchmarks/bench_truncated_svd.py`` and
``bench_scaling.py --svd auto`` have shown on the scaling models that the choices hold.

Either way :func:`top_svd` reports the energy left out, ``tail = Σ_{k>r} σ_k²`` of the
returned truncation (exact: from the full spectrum; randomized: ``||A||_F² − Σ_{k≤r} s̃_k²``,
which is exactly the squared residual of the returned factors, since ``U_r Σ_r V_rᵀ`` is an
orthogonal projection of ``A``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

SOLVERS = ("auto", "exact", "randomized")
#: ``auto`` decomposes a matrix whose smaller side is at least this many randomized.
AUTO_MIN_SIDE = 1024
#: Power iterations ``q`` of the randomized solver.
POWER_ITERS = 4
#: Sketch seed of the randomized solver (fixed: repeated runs decompose identically).
SEED = 0


class TopSVD(NamedTuple):
    """Top-``r`` factors of a ``[..., m, n]`` stack: ``u [..., m, r]``, ``s [..., r]``
    (descending), ``vh [..., r, n]``; ``tail`` and ``energy`` are float64 ``[...]``: the
    squared Frobenius norm left out of (``Σ_{k>r} σ_k²``) and of the whole matrix."""

    u: torch.Tensor
    s: torch.Tensor
    vh: torch.Tensor
    tail: torch.Tensor
    energy: torch.Tensor


def thin_svd(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD ``U [m,q], S [q], Vh [q,n]``; wide matrices are decomposed transposed (faster)."""
    if matrix.shape[-2] < matrix.shape[-1]:
        u, s, vh = torch.linalg.svd(matrix.mT, full_matrices=False)
        return vh.mT, s, u.mT
    return torch.linalg.svd(matrix, full_matrices=False)


def check_solver(solver: str) -> str:
    if solver not in SOLVERS:
        raise ValueError(f"svd must be one of {list(SOLVERS)}, got {solver!r}")
    return solver


def resolve(solver: str, shape: tuple[int, ...] | torch.Size, rank: int) -> str:
    """``exact`` or ``randomized`` for a matrix of ``shape`` (``auto`` by its smaller side);
    a sketch as wide as half the smaller side saves nothing, so that is always ``exact``."""
    side = min(shape[-2], shape[-1])
    if check_solver(solver) == "exact" or 2 * (2 * rank) >= side:
        return "exact"
    if solver == "auto" and side < AUTO_MIN_SIDE:
        return "exact"
    return "randomized"


def top_svd(matrix: torch.Tensor, rank: int, solver: str = "exact") -> TopSVD:
    """The top ``rank`` singular triplets of ``matrix`` ``[..., m, n]`` (see the module
    docstring); ``rank`` is clamped to min(m, n)."""
    rank = min(rank, *matrix.shape[-2:])
    if resolve(solver, matrix.shape, rank) == "exact":
        u, s, vh = thin_svd(matrix)
        squares = s.double().pow(2)
        return TopSVD(u[..., :rank], s[..., :rank], vh[..., :rank, :],
                      squares[..., rank:].sum(-1), squares.sum(-1))
    if matrix.shape[-2] < matrix.shape[-1]:
        u, s, vh, tail, energy = _randomized(matrix.mT, rank)
        return TopSVD(vh.mT, s, u.mT, tail, energy)
    return TopSVD(*_randomized(matrix, rank))


def _randomized(a: torch.Tensor, rank: int) -> TopSVD:
    """Randomized subspace iteration on a tall stack ``a`` ``[..., m, n]`` (m ≥ n)."""
    width = min(2 * rank, a.shape[-1])
    gen = torch.Generator(device="cpu").manual_seed(SEED)
    sketch = torch.randn(*a.shape[:-2], a.shape[-1], width, generator=gen, dtype=a.dtype)
    q = torch.linalg.qr(a @ sketch.to(a.device)).Q  # [..., m, l]
    for _ in range(POWER_ITERS):
        z = torch.linalg.qr(a.mT @ q).Q  # [..., n, l]
        q = torch.linalg.qr(a @ z).Q
    u_small, s, vh = torch.linalg.svd(q.mT @ a, full_matrices=False)  # [l,l], [l], [l,n]
    s, vh = s[..., :rank], vh[..., :rank, :]
    energy = a.double().pow(2).sum((-2, -1))
    tail = (energy - s.double().pow(2).sum(-1)).clamp_min(0.0)
    return TopSVD(q @ u_small[..., :rank], s, vh, tail, energy)
