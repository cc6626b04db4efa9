"""Hadamard matrices of the orders the supported hidden sizes need, built here.

``H`` of order n has entries ±1 and ``H·Hᵀ = n·I``; :func:`hadamard` returns ``H / √n``
(orthonormal). Orders: a power of two (Sylvester), ``q + 1`` for a prime ``q ≡ 3 (mod 4)``
(Paley I), ``2(q + 1)`` for a prime ``q ≡ 1 (mod 4)`` (Paley II), and a Kronecker product of
one of those with a power of two: 576 = 36·16 (SmolLM2, Paley II with q = 17), 640 = 20·32
(Gemma 3 270M, Paley I with q = 19), 4096 (Llama-2-7B). The official code uses the same
construction pattern (a hard-coded base matrix times Sylvester doublings) with base matrices
from a library; any Hadamard matrix of the order is a valid rotation for the method, so the
patch it gives can differ from the official one in its rotation basis.
"""

from __future__ import annotations

import torch


def _is_prime(q: int) -> bool:
    return q >= 2 and all(q % p for p in range(2, int(q ** 0.5) + 1))


def _jacobsthal(q: int) -> torch.Tensor:
    """``Q[i, j] = χ(j − i)``, χ the quadratic character mod the prime ``q``."""
    squares = {(x * x) % q for x in range(1, q)}
    chi = torch.tensor([0] + [1 if a in squares else -1 for a in range(1, q)], dtype=torch.float64)
    idx = (torch.arange(q)[None, :] - torch.arange(q)[:, None]) % q
    return chi[idx]


def _paley1(q: int) -> torch.Tensor:
    """Order ``q + 1`` (``q ≡ 3 mod 4``): ``I + S``, ``S`` the skew conference matrix."""
    s = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1.0, -1.0, _jacobsthal(q)
    return torch.eye(q + 1, dtype=torch.float64) + s


def _paley2(q: int) -> torch.Tensor:
    """Order ``2(q + 1)`` (``q ≡ 1 mod 4``): the symmetric conference matrix ``C`` expanded,
    ``C ⊗ [[1, 1], [1, −1]] + I ⊗ [[1, −1], [−1, −1]]``."""
    c = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    c[0, 1:], c[1:, 0], c[1:, 1:] = 1.0, 1.0, _jacobsthal(q)
    a = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    b = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
    return torch.kron(c, a) + torch.kron(torch.eye(q + 1, dtype=torch.float64), b)


def _base(m: int) -> torch.Tensor | None:
    """A Hadamard matrix of order ``m`` from Paley's constructions (None: neither applies)."""
    if m == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    if m == 2:
        return torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    if _is_prime(m - 1) and (m - 1) % 4 == 3:
        return _paley1(m - 1)
    if m % 2 == 0 and _is_prime(m // 2 - 1) and (m // 2 - 1) % 4 == 1:
        return _paley2(m // 2 - 1)
    return None


def hadamard(n: int) -> torch.Tensor:
    """The orthonormal Hadamard matrix ``H / √n`` ``[n, n]`` (float64) of order ``n``: a Paley
    base of the largest order ``m`` with ``n / m`` a power of two, Kronecker a Sylvester
    matrix.

    Raises:
        ValueError: no construction here reaches order ``n`` (use ``rotate: false``).
    """
    if n < 1:
        raise ValueError(f"a Hadamard matrix needs a positive order, got {n}")
    doublings = 0
    candidates = []
    while n % (2 ** doublings) == 0 and 2 ** doublings <= n:
        candidates.append((n // 2 ** doublings, doublings))
        doublings += 1
    for m, k in candidates:  # largest base first: the fewest doublings
        base = _base(m)
        if base is None:
            continue
        h = base
        step = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
        for _ in range(k):
            h = torch.kron(h, step)
        return h / n ** 0.5
    raise ValueError(f"no Hadamard matrix of order {n} is built here (orders 2^a·m with m a "
                     "Paley order); LinearPatch's rotate: false needs none")
