"""Uncentred second moments and their eigenbases (paper Eq. 8, official ``pca_calc``)."""

from __future__ import annotations

import torch

DTYPES = {"float64": torch.float64, "float32": torch.float32}


class SecondMoment:
    """Streaming accumulator of ``H = Σ xᵀx`` over token vectors ``x [D]``.

    Only ``H [D, D]`` is kept (in ``dtype``), so signals can be fed batch by batch.
    """

    def __init__(self, dim: int, dtype: str = "float64",
                 device: str | torch.device = "cpu") -> None:
        if dtype not in DTYPES:
            raise ValueError(f"pca dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.dtype = DTYPES[dtype]
        self.h = torch.zeros(dim, dim, dtype=self.dtype, device=device)
        self.tokens = 0

    def add(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add the tokens of ``x [.., D]``; ``mask [..]`` (1 = real token) excludes padding."""
        flat = x.detach().reshape(-1, x.shape[-1]).to(device=self.h.device, dtype=self.dtype)
        if mask is not None:
            flat = flat[mask.reshape(-1).to(flat.device).bool()]
        self.h += flat.T @ flat
        self.tokens += flat.shape[0]

    def basis(self, damping: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
        """Eigenvectors ``Q [D, D]`` (columns, float64) by decreasing eigenvalue, and eigenvalues.

        ``damping · mean(diag H)`` is added to the diagonal first (official: 1 %).

        Raises:
            ValueError: nothing was accumulated, or H is not finite.
        """
        if self.tokens == 0:
            raise ValueError("no tokens were accumulated (all positions masked?)")
        h = self.h.clone()
        if not torch.isfinite(h).all():
            raise ValueError("the second moment is not finite (the model overflowed on the "
                             "calibration windows)")
        h.diagonal().add_(damping * h.diagonal().mean())
        vals, vecs = torch.linalg.eigh(h)
        order = torch.argsort(vals, descending=True)
        return vecs[:, order].double(), vals[order].double()


def kept_energy(eigenvalues: torch.Tensor, width: int) -> float:
    """Fraction of the (damped) second moment's trace kept by the first ``width`` directions."""
    return float(eigenvalues[:width].sum() / eigenvalues.sum())


def random_orientation(q: torch.Tensor, width: int, generator: torch.Generator) -> torch.Tensor:
    """``Q · blockdiag(R, I)`` with ``R`` a random orthogonal ``width × width`` matrix.

    Same kept subspace as ``Q``; the official script's ``--final-orientation random``.
    """
    r, upper = torch.linalg.qr(torch.rand(width, width, generator=generator, dtype=torch.float64))
    r = (r * torch.sign(torch.diagonal(upper))).to(q.device)  # unique QR: a Haar rotation
    out = q.clone()
    out[:, :width] = q[:, :width] @ r
    return out
