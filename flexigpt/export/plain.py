"""``export_plain``: a compressed model as a stock ``*ForCausalLM`` checkpoint, where exact.

What can be written as the family's own architecture (e.g. ``LlamaForCausalLM``), so any
server that knows the family (vLLM, TGI, llama.cpp converters) takes it:

* ``dense``, ``shortgpt`` (fewer layers), ``shortgpt_lora`` (recovery LoRA merged before
  saving): already plain, copied exactly.
* ``llm_pruner`` when every layer kept the same query/KV head counts and FFN width (e.g. a
  layer range covering all layers): a stock config with those counts (``head_dim`` explicit).
* ``flexigpt`` / ``flexigpt_extend`` *without* output norm, only with ``unshare=True``: each
  shared linear becomes its own ``nn.Linear`` with ``W_base + B·A`` merged (shared norms
  copied). Exact up to the rounding of that sum, but it stores every block again, so the
  export has the *dense* model's parameter count: the compression is gone.

Each of these is the method's own ``plain`` hook (:class:`flexigpt.storage.registry.Method`); what
cannot be exported (:class:`NotExportable`, the CLI exits 2):

* FlexiGPT with output norm (the default): a mean-centring LayerNorm × γ on the attention
  and MLP outputs of the replacement blocks has no counterpart in a stock decoder layer.
* SliceGPT: shortcut matrices on the residual path and weight-free RMS norms over the
  original width; a stock decoder layer has an identity residual and a weighted norm.
* LLM-Pruner with per-layer head counts or FFN widths: a stock config has one of each.

Every export is checked: the written directory is reloaded with plain
``AutoModelForCausalLM.from_pretrained`` and its logits compared with
``flexigpt.load_compressed`` on random token ids; a difference above ``atol`` aborts it.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from flexigpt.storage.registry import ROLES, NotExportable

if TYPE_CHECKING:  # transformers itself is imported on first use
    from transformers import PreTrainedModel

EXPORT_RECORD = "export.json"


def plain_model(loaded: Any, unshare: bool = False) -> tuple[PreTrainedModel, str]:
    """A stock-architecture model computing what ``loaded.model`` computes, and how it was made.

    Raises:
        NotExportable: there is none (or ``unshare`` is needed and not given).
    """
    from flexigpt.export.checkpoint import plain_mismatch
    from flexigpt.storage.registry import get_method

    model, manifest = loaded.model, loaded.manifest
    reason = plain_mismatch(model)
    if reason is None:
        return model, "already a stock checkpoint: copied"
    method = manifest.method if manifest else ROLES.reference
    spec = get_method(method) if manifest else None
    if spec is None or spec.plain is None:
        raise NotExportable(f"{method}: not a stock architecture ({reason})")
    return spec.plain(loaded, unshare)


def _probe_ids(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(seed))


def export_plain(model_dir: str | os.PathLike, out_dir: str | os.PathLike,
                 unshare: bool = False, dtype: str = "float32",
                 atol: float = 1e-5, force: bool | None = None) -> dict[str, Any]:
    """Write ``out_dir``: a stock checkpoint (config, safetensors, tokenizer, README, export.json).

    Returns:
        The export record (also ``out_dir/export.json``).

    Raises:
        NotExportable: no exact plain form; nothing is written.
        RuntimeError: the reloaded export's logits differ by more than ``atol``.
        OutputExistsError: ``out_dir`` exists and is not a previous export (unless ``force``).
    """
    from transformers import AutoModelForCausalLM

    from flexigpt.core.fileio import atomic_directory, check_output
    from flexigpt.core.params import count_parameters
    from flexigpt.export.checkpoint import plain_mismatch
    from flexigpt.storage.artifacts import load_compressed
    from flexigpt.storage.manifest import manifest_hash
    from flexigpt.storage.models.loading import parse_dtype

    model_dir = Path(model_dir)
    check_output(out_dir, "export", force)  # before loading anything
    loaded = load_compressed(model_dir, dtype=dtype)
    model, how = plain_model(loaded, unshare=unshare)
    left = plain_mismatch(model)
    if left is not None:
        raise NotExportable(f"the plain form is still not stock: {left}")
    ids = _probe_ids(model.config.vocab_size)
    with torch.no_grad():
        ref = loaded.model(input_ids=ids).logits.float()
    with atomic_directory(out_dir, force=force, kind="export") as tmp:
        model.save_pretrained(tmp)
        if loaded.tokenizer is not None:
            loaded.tokenizer.save_pretrained(tmp)
        back = AutoModelForCausalLM.from_pretrained(tmp, dtype=parse_dtype(dtype), trust_remote_code=False, use_safetensors=True).eval()
        with torch.no_grad():
            diff = float((back(input_ids=ids).logits.float() - ref).abs().max())
        if not diff <= atol:
            raise RuntimeError(f"the exported model's logits differ from load_compressed's by "
                               f"{diff:.3g} > {atol:g}; nothing written")
        manifest = loaded.manifest
        record = {"source": str(model_dir.resolve()),
                  "source_manifest_hash": manifest_hash(manifest) if manifest else None,
                  "method": manifest.method if manifest else ROLES.reference, "how": how,
                  "architecture": type(back).__name__, "dtype": dtype,
                  "parameters": count_parameters(back),
                  "source_parameters": count_parameters(loaded.model),
                  "max_abs_logit_diff": diff, "probe": list(ids.shape),
                  "created": datetime.now(UTC).isoformat(timespec="seconds")}
        (tmp / EXPORT_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        _write_readme(tmp, record)
    return record


def _write_readme(directory: Path, record: dict[str, Any]) -> None:
    """``directory/README.md``: a short card for the plain export described by ``record``
    (the export record written beside it)."""
    (directory / "README.md").write_text(
        f"---\nlibrary_name: transformers\ntags:\n- flexigpt-bench\n- {record['method']}\n"
        f"---\n\n# Plain export of a {record['method']} model\n\n"
        f"A stock `{record['architecture']}` checkpoint (no remote code) written by "
        f"`flexigpt export` from `{record['source']}`: {record['how']}. Parameters "
        f"{record['parameters']:,} (source {record['source_parameters']:,}); max |Δ logit| "
        f"vs `flexigpt.load_compressed` on the source: {record['max_abs_logit_diff']:.3g}. "
        f"Full record: `{EXPORT_RECORD}`; the source directory's README.md and manifest.json "
        "describe the compression.\n")
