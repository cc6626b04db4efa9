"""Few-row linears for the decode loops: ``(W @ xᵀ)ᵀ`` where the CPU's BLAS streams the
weight once, routed explicitly on one model's own modules (never process-wide).

The speed-up bound of speculative decoding assumes what holds for memory-bound decoding: a
forward of ``k + 1`` tokens costs about one of a single token, since every weight is read
once either way. Which product honours that depends on the CPU's BLAS: on the AMD EPYC
measured first, ``F.linear`` with 2-8 input rows cost 1.5-2.8× the one-row call (SmolLM2's
LM head 44.6 ms for 2 rows against 15.9 ms for one) while ``(W @ xᵀ)ᵀ`` streamed the weight
once (12.4 ms for 2 rows); on an Intel Xeon it is the reverse (LM head: ``F.linear`` 4.2 ms
for 2 rows, 4.1 for one; ``(W @ xᵀ)ᵀ`` 9.4 ms).

* :func:`few_row_route` decides per device: on the CPU, whether :func:`mm_form_is_faster`
  (timed once per process and thread count); on any other device never.
* :func:`few_row_linear` is ``F.linear`` with 2-``max_rows``-row inputs computed as
  ``(W @ xᵀ)ᵀ`` (one-row calls, and prompts of more rows, keep ``F.linear``).
* :func:`routed_linears` makes the linears of given models call :func:`few_row_linear` for
  the duration of a ``with`` block (see there for the contract); the decode loops of
  :mod:`flexigpt.runtime.generation.speculative` use it with the decision they record
  (``DecodeResult.few_row_route``).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from flexigpt.methods.sharing import SharedLoRALinear

#: linears with more than one and at most this many input rows take the ``(W @ xᵀ)ᵀ`` form
#: under :func:`routed_linears` (where :func:`few_row_route` says that form is faster)
FEW_ROWS = 8

_MM_FASTER: dict[int, bool] = {}  # torch thread count -> the timing's verdict


def mm_form_is_faster() -> bool:
    """Whether ``(W @ xᵀ)ᵀ`` beats ``F.linear`` by ≥ 10 % for a 2-row product with a weight
    streamed from memory (two 8192 × 1024 fp32 weights, 32 MB each, used in turn), on the
    CPU at the current torch thread count. Timed once per thread count and process (best of
    5 interleaved pairs, ~0.1 s)."""
    threads = torch.get_num_threads()
    if threads not in _MM_FASTER:
        gen = torch.Generator().manual_seed(0)
        weights = [torch.randn(8192, 1024, generator=gen) for _ in range(2)]
        x = torch.randn(2, 1024, generator=gen)
        best = {"linear": float("inf"), "mm": float("inf")}
        with torch.inference_mode():
            for i in range(6):
                for form in ("linear", "mm"):
                    w = weights[i % 2]
                    tic = time.perf_counter()
                    F.linear(x, w) if form == "linear" else torch.mm(w, x.t()).t().contiguous()
                    if i:  # the first pair warms up
                        best[form] = min(best[form], time.perf_counter() - tic)
        _MM_FASTER[threads] = best["mm"] < 0.9 * best["linear"]
    return _MM_FASTER[threads]


def few_row_route(device: torch.device | str) -> bool:
    """Whether decode loops on ``device`` route few-row linears to ``(W @ xᵀ)ᵀ``: on the CPU
    the verdict of :func:`mm_form_is_faster` (the one-time timing runs on the first call),
    on CUDA and every other device False (the timing says nothing about them)."""
    return torch.device(device).type == "cpu" and mm_form_is_faster()


def few_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   max_rows: int = FEW_ROWS) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``x [..., in]``, ``weight [out, in]``, ``bias
    [out]``; returns ``[..., out]`` (contiguous). With ``1 < rows ≤ max_rows`` (rows = all
    but the last dim) it computes ``(W @ xᵀ)ᵀ + b`` instead (mathematically ``F.linear``;
    equal up to float summation order), otherwise it calls ``F.linear``."""
    rows = x.numel() // x.shape[-1] if x.dim() > 1 else 1
    if not 1 < rows <= max_rows:
        return F.linear(x, weight, bias)
    y = torch.mm(weight, x.reshape(rows, x.shape[-1]).t()).t()
    if bias is not None:
        y = y + bias
    return y.contiguous().view(*x.shape[:-1], weight.shape[0])


def _linear_forward(module: nn.Linear, max_rows: int, x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward`` of ``module`` through :func:`few_row_linear`."""
    return few_row_linear(x, module.weight, module.bias, max_rows)


@contextlib.contextmanager
def routed_linears(models: Iterable[nn.Module], route: bool,
                   max_rows: int = FEW_ROWS) -> Iterator[None]:
    """Within the block, the linears of ``models`` compute through :func:`few_row_linear`
    when ``route`` is true (``route`` False: nothing changes).

    Contract: every ``nn.Linear`` submodule whose forward is ``nn.Linear.forward`` (and not
    already overridden on the instance, e.g. by accelerate's hooks) gets an instance
    ``forward`` (its own weight and bias through :func:`few_row_linear`), and every
    :class:`~flexigpt.methods.sharing.SharedLoRALinear` gets :func:`few_row_linear` as its
    ``linear_fn`` (its base product and its adapters); both are restored on exit, also after
    an error. Only these models' modules change — ``torch.nn.functional.linear``, other
    models and other modules' own ``F.linear`` calls are untouched — but the modules are
    changed for every caller while the block runs (not thread-safe for a model shared by
    threads). Modules shared by several of ``models`` are routed once.
    """
    if not route:
        yield
        return
    linear_fn = functools.partial(few_row_linear, max_rows=max_rows)
    linears: dict[int, nn.Linear] = {}
    shared: dict[int, SharedLoRALinear] = {}
    for model in models:
        for module in model.modules():
            if isinstance(module, SharedLoRALinear):
                shared[id(module)] = module
            elif (isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward
                  and "forward" not in module.__dict__):
                linears[id(module)] = module
    saved = {key: module.linear_fn for key, module in shared.items()}
    try:
        for module in linears.values():
            module.forward = functools.partial(_linear_forward, module, max_rows)  # type: ignore[method-assign]  # deliberate per-instance override
        for module in shared.values():
            module.linear_fn = linear_fn
        yield
    finally:
        for module in linears.values():
            module.__dict__.pop("forward", None)
        for key, module in shared.items():
            module.linear_fn = saved[key]
