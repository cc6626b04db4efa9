"""The layer-by-layer rotate-and-slice loop (official ``rotate_and_slice_sequential``).

Memory: one activation store ``[N, T, D]`` in the model dtype holds the current block's
inputs (first ``d_in`` features, already rotated and sliced); each block's outputs overwrite
its inputs batch by batch. By default the store is a temporary file (``activations.py``), so
only one batch is resident. PCA only keeps ``D × D`` second moments. The official code keeps
inputs and outputs (and more) of every calibration sequence in memory at once.

Row-vector convention ``y = x Wᵀ`` (HF ``nn.Linear``), ``Q [D, D]`` columns = eigenvectors,
``Q_d = Q[:, :d]``: readers ``W ← W Q_d``, writers ``W ← Q_dᵀ W``, embeddings ``E ← E Q_d``
(token and learned position tables),
shortcut from basis (P, d_p) to (Q, d_q): ``x ↦ x P_{d_p}ᵀ Q_{d_q}``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from baselines.slicegpt.accounting import Plan
from baselines.slicegpt.activations import ActivationStore, StagedRows, open_store, stage_rows
from baselines.slicegpt.config import SliceGPTConfig
from baselines.slicegpt.fusion import FusionInfo, mark_untied, set_module, stream_writers
from baselines.slicegpt.modules import (
    ProjectedRMSN,
    SlicedBlock,
    matmul_rows,
    set_linear,
    set_shortcut,
)
from baselines.slicegpt.pca import SecondMoment, kept_energy, random_orientation
from flexigpt.core.memory import release_freed_memory
from flexigpt.methods.hooked_forward import StopForward, forward_batches, hook_input, registered
from flexigpt.storage.models.adapters import ArchAdapter

log = logging.getLogger(__name__)


def capture_inputs(model: nn.Module, adapter: ArchAdapter, windows: torch.Tensor,
                   batch_size: int, mask: torch.Tensor | None,
                   store: ActivationStore) -> list[dict[str, Any]]:
    """Write the block-0 inputs ``[N, T, D]`` into ``store``; return each batch's layer kwargs.

    Without a padding mask, the kwargs (causal mask, rotary tables) depend only on the batch
    shape and are shared between batches of equal size.
    """
    seen: dict[Any, dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    slot: dict[str, Any] = {}

    def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        slot["x"] = hook_input(args, kwargs)
        slot["kwargs"] = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        raise StopForward  # the block inputs are captured: no block needs to run

    with registered([adapter.layers(model)[0].register_forward_pre_hook(hook, with_kwargs=True)]):
        for rows in forward_batches(model, windows, batch_size, mask):
            store.write(rows, slot["x"])
            if mask is not None:  # per-batch masks: keep every batch's own kwargs
                out.append(slot["kwargs"])
                continue
            out.append(seen.setdefault(tuple(slot["x"].shape[:2]), slot["kwargs"]))
    return out


def _readers(parent: nn.Module, names: tuple[str, ...], q: torch.Tensor) -> None:
    """``W ← W Q`` for linears reading the residual stream (input columns)."""
    for name in names:
        lin = getattr(parent, name)
        set_linear(lin, lin.weight.detach().double() @ q.to(lin.weight.device))


def _writers(parent: nn.Module, names: tuple[str, ...], q: torch.Tensor) -> None:
    """``W ← Qᵀ W``, ``b ← Qᵀ b`` for linears writing the residual stream (output rows)."""
    for name in names:
        lin = getattr(parent, name)
        qt = q.T.to(lin.weight.device)
        bias = None if lin.bias is None else qt @ lin.bias.detach().double()
        set_linear(lin, qt @ lin.weight.detach().double(), bias)


class _Slicer:
    """State of one rotate-and-slice run (activation store, batches, PCA settings, device)."""

    def __init__(self, cfg: SliceGPTConfig, store: ActivationStore,
                 batch_kwargs: list[dict[str, Any]], mask: torch.Tensor | None,
                 device: torch.device, staged: list[StagedRows]) -> None:
        self.cfg, self.store, self.kwargs, self.mask = cfg, store, batch_kwargs, mask
        self.device = device
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.energy: list[float] = []
        self.staged = staged  # dense tables staged on disk; the caller closes them

    def batches(self):
        """``(slice, layer kwargs, mask)`` per calibration batch."""
        bs = self.cfg.batch_size
        for i, start in enumerate(range(0, self.store.shape[0], bs)):
            sl = slice(start, start + bs)
            yield sl, self.kwargs[i], None if self.mask is None else self.mask[sl]

    def read(self, sl: slice, width: int) -> torch.Tensor:
        """The first ``width`` features of a batch ``[b, T, width]``, on the model's device."""
        return self.store.read(sl)[:, :, :width].to(self.device)

    def write(self, sl: slice, values: torch.Tensor) -> None:
        """Replace a batch by full-width ``values [b, T, D]`` (a block's outputs)."""
        self.store.write(sl, values)

    def moment(self) -> SecondMoment:
        return SecondMoment(self.store.shape[-1], self.cfg.pca_dtype, self.device)

    def basis(self, acc: SecondMoment, width: int) -> torch.Tensor:
        q, vals = acc.basis(self.cfg.damping)
        self.energy.append(round(kept_energy(vals, width), 6))
        return random_orientation(q, width, self.gen) if self.cfg.orientation == "random" else q

    def rotate_buffer(self, q: torch.Tensor, width: int) -> None:
        """``acts[..., :width] ← acts @ Q_width`` batch by batch (full-D inputs); the features
        past ``width`` are left as they were and never read again."""
        qd = q[:, :width].to(device=self.device, dtype=self.store.dtype)
        for sl, _, _ in self.batches():
            acts = self.store.read(sl)
            acts[:, :, :width] = (acts.to(self.device) @ qd).to(acts.device)
            self.store.write(sl, acts)


@torch.no_grad()
def _rotate_embeddings(model: nn.Module, adapter: ArchAdapter, state: _Slicer, plan: Plan,
                       hidden: int, head_pending: bool) -> tuple[torch.Tensor, Any]:
    """PCA of the embedding output; rotate and slice the token (and learned position)
    tables and the buffer to ``plan.embed``.

    Each dense table is first staged where the activations live (``cfg.activations``: on
    disk its tensor is freed before the sliced one is built). Returns the embedding basis
    ``q_embed`` and, for a head still tied to the original token table (``head_pending``),
    that table (or its staged rows) for ``_finish_head``; the head meanwhile points at the
    sliced table (a placeholder it never computes with).
    """
    acc = state.moment()
    for sl, _, m in state.batches():
        acc.add(state.read(sl, hidden), m)
    q_embed = state.basis(acc, plan.embed)
    tables, head = stream_writers(model, adapter), adapter.lm_head(model)
    head_source = None
    for embed in tables:
        source = stage_rows(state.cfg.activations, embed.weight)
        if isinstance(source, StagedRows):
            state.staged.append(source)
        if head_pending and embed is tables[0]:
            head_source = source
            del head.weight  # the head no longer holds the dense table ...
        del embed.weight  # ... nor the table itself: a staged one is freed before ...
        embed.weight = nn.Parameter(matmul_rows(source, q_embed[:, :plan.embed]))  # ... this
        embed.embedding_dim = plan.embed
    if head_pending:
        head.weight = tables[0].weight
    state.rotate_buffer(q_embed, plan.embed)
    return q_embed, head_source


def rotate_and_slice(model: nn.Module, adapter: ArchAdapter, fusion: FusionInfo, plan: Plan,
                     windows: torch.Tensor, cfg: SliceGPTConfig,
                     mask: torch.Tensor | None = None) -> dict[str, Any]:
    """Rotate and slice a fused model (:func:`fusion.fuse_model`) in place to ``plan``'s widths.

    Args:
        windows: calibration token ids ``[N, T]``.
        mask: optional ``[N, T]`` (1 = real token); padded positions are left out of every PCA.

    Returns:
        Diagnostics: kept energy fraction of every PCA (embedding, then mid/out per block).
    """
    config: Any = model.config  # an HF config: its fields vary by family
    hidden = config.hidden_size
    first = next(model.parameters())
    dtype, device = first.dtype, first.device
    del first  # no reference kept: the embedding tables get freed
    n, t = windows.shape
    # host memory or a temporary file, whatever the device
    store = open_store(cfg.activations, (n, t, hidden), dtype)
    staged: list[StagedRows] = []
    try:
        kwargs = capture_inputs(model, adapter, windows, cfg.batch_size, mask, store)
        state = _Slicer(cfg, store, kwargs, mask, device, staged)
        return _slice_blocks(model, adapter, fusion, plan, state, hidden)
    finally:
        store.close()
        for table in staged:
            table.close()


def _slice_blocks(model: nn.Module, adapter: ArchAdapter, fusion: FusionInfo, plan: Plan,
                  state: _Slicer, hidden: int) -> dict[str, Any]:
    q_embed, head_source = _rotate_embeddings(model, adapter, state, plan, hidden,
                                              fusion.head_pending)
    release_freed_memory()  # the replaced weights (and the previous block's) leave the heap
    q_prev, d_prev = q_embed, plan.embed
    layers = adapter.layers(model)
    for i, block in enumerate(tqdm(layers, desc="slicegpt", leave=False)):
        if not isinstance(block, SlicedBlock):
            raise TypeError(f"block {i} is {type(block).__name__}; call fuse_model first")
        attn, mlp = adapter.attn(block), adapter.mlp_owner(block)
        p_in = q_prev[:, :d_prev]
        _readers(attn, adapter.attn_in_linears, p_in)
        set_shortcut(block, "attn", p_in.T)  # back to the original basis for the PCA
        acc = state.moment()
        for sl, kw, m in state.batches():
            acc.add(block.attn_residual(state.read(sl, d_prev), **kw), m)
        d_mid = plan.mid[i]
        q_mid = state.basis(acc, d_mid)[:, :d_mid]
        set_shortcut(block, "attn", p_in.T @ q_mid)
        _writers(attn, adapter.attn_out_linears, q_mid)
        _readers(mlp, adapter.mlp_in_linears, q_mid)
        set_shortcut(block, "mlp", q_mid.T)
        acc = state.moment()
        for sl, kw, m in state.batches():
            y = block(state.read(sl, d_prev), **kw)  # [b, T, D] in the original basis
            acc.add(y, m)
            state.write(sl, y)
        d_out = plan.out[i]
        q_next = state.basis(acc, d_out)
        set_shortcut(block, "mlp", q_mid.T @ q_next[:, :d_out])
        _writers(mlp, adapter.mlp_out_linears, q_next[:, :d_out])
        state.rotate_buffer(q_next, d_out)
        q_prev, d_prev = q_next, d_out
        release_freed_memory()

    _finish_head(model, adapter, fusion, plan, q_prev[:, :d_prev], q_embed[:, :plan.embed],
                 head_source)
    return {"kept_energy": state.energy}


def _finish_head(model: nn.Module, adapter: ArchAdapter, fusion: FusionInfo, plan: Plan,
                 q_last: torch.Tensor, q_embed: torch.Tensor, head_source: Any = None) -> None:
    """Rotate (and slice) the head input, or re-tie the head to the sliced embedding.

    Rotating/slicing the (untied) head input is the official SliceGPT treatment (a head still
    tied to the original embedding, ``fusion.head_pending``, is untied here: its new weight is
    computed from the embedding and the final norm scale chunk by chunk); re-tying
    (``plan.head == "tied"``) is this harness's variant, not the paper's.
    Re-tying: logits = RMSN(h) diag(α) Eᵀ. With ``h ≈ ĥ Q_Lᵀ`` and ``E ≈ Ê Q₀ᵀ`` (Ê = E Q₀
    sliced) this is ``RMSN(ĥ) M Êᵀ`` with ``M = Q_Lᵀ diag(α) Q₀`` (d_L × d₀) — exact at full
    width. ``diag(α)`` is not orthogonal, so it cannot be absorbed into the last block's
    writers (RMSN would see a rescaled signal); ``M`` is stored as ``ProjectedRMSN.proj``.
    """
    head, embed = adapter.lm_head(model), adapter.embed(model)
    if plan.head != "tied" and fusion.head_pending:  # from the original token table, unscaled
        set_linear(head, matmul_rows(head_source, q_last, scale=fusion.final_alpha))
        mark_untied(model)
        return
    if plan.head != "tied":
        set_linear(head, matmul_rows(head.weight, q_last))
        return
    if fusion.final_alpha is None:
        raise ValueError("re-tying needs the final norm scale (fusion.final_alpha)")
    alpha = fusion.final_alpha.to(device=q_embed.device, dtype=torch.float64)
    m = q_last.T @ (alpha[:, None] * q_embed)  # [d_L, d0]
    config: Any = model.config  # an HF config: its fields vary by family
    final = ProjectedRMSN(config.hidden_size, fusion.eps, m.shape[0], m.shape[1])
    final.proj.weight = nn.Parameter(m.T.to(device=embed.weight.device, dtype=embed.weight.dtype)
                                     .contiguous())
    set_module(model, adapter.final_norm_path, final)
    head.weight = embed.weight
    head.in_features = embed.weight.shape[1]
    config.tie_word_embeddings = True
    expand_tied = getattr(model, "get_expanded_tied_weights_keys", None)  # an HF model's
    if expand_tied is not None:
        model.all_tied_weights_keys = expand_tied(all_submodels=False)
