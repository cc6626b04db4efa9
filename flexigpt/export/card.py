"""``write_model_card(dir, result_json=None)``: a README.md model card from the manifest.

The card states what the directory holds (method, requested and achieved ratio, parameters,
what is shared or removed, recovery training, provenance) and how to load it; with a
schema-1 result JSON (``flexigpt.runtime.evaluation.results``) it adds perplexity and zero-shot
scores with 95 % intervals (±1.96 · stderr). Publishing
(:func:`flexigpt.export.publish.publish_compressed`) writes one into every published model
directory; call it again with the result JSON once the model is evaluated.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flexigpt.core.fileio import MANIFEST, atomic_write_text
from flexigpt.storage.artifacts import read_manifest
from flexigpt.storage.models.checkpoint_format import compression_spec

if TYPE_CHECKING:
    from flexigpt.storage.manifest import Manifest

CARD = "README.md"


def _num(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or value is None:
        return "–" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _method(name: str) -> Any:
    """The registry's method of a saved model, or None for a key it does not know."""
    from flexigpt.storage.registry import UnknownMethodError, get_method

    try:
        return get_method(name)
    except UnknownMethodError:
        return None


def _structure_lines(method: str, manifest: Manifest) -> list[str]:
    s, info = manifest.structure, manifest.info
    params = info.get("params") or {}
    spec = _method(method)
    if spec is not None and spec.card_lines is not None:
        lines = spec.card_lines(manifest)
    else:
        lines = [f"- structure: `{json.dumps(s)[:300]}`"] if s else ["- nothing changed"]
    if params.get("shared_linears") or params.get("adapters"):
        lines.append(f"- shared base-linear parameters (stored once): "
                     f"{_num(params.get('shared_linears'))}; LoRA adapters: "
                     f"{_num(params.get('adapters'))}; output-norm γ: "
                     f"{_num(params.get('output_norms'))}")
    return lines


def _recovery_lines(manifest: Manifest) -> list[str]:
    trained = [h for h in manifest.history if h.get("stage") == "train" or "tokens" in h]
    if not trained:
        recipe = (manifest.info.get("recovery") or {}).get("recipe")
        return [f"- none: one-shot compression (the method's recovery recipe: {recipe})"]
    out = []
    for h in trained:
        out.append(f"- recipe {h.get('recipe', h.get('trained'))}: {_num(h.get('tokens'))} tokens, "
                   f"{_num(h.get('steps'))} steps, loss {h.get('loss', 'lm')}, held-out PPL "
                   f"{_num(h.get('ppl_before'), 2)} → {_num(h.get('final_ppl'), 2)}"
                   + (", LoRA merged" if h.get("lora_merged") else ""))
    return out


def _score_lines(result: dict[str, Any]) -> list[str]:
    out = []
    ppl = result.get("perplexity")
    if ppl:
        out.append(f"Perplexity {_num(ppl.get('value'), 3)} on `{ppl.get('text')}` "
                   f"({ppl.get('n_windows')} × {ppl.get('seq_len')} tokens).\n")
    tasks = result.get("tasks") or {}
    if tasks:
        out += ["| task | metric | value | 95 % interval | docs |", "|---|---|---|---|---|"]
        for name, e in tasks.items():
            v, se = e.get("value"), e.get("stderr")
            ci = (f"[{v - 1.96 * se:.4f}, {v + 1.96 * se:.4f}]"
                  if isinstance(v, (int, float)) and isinstance(se, (int, float)) else "–")
            out.append(f"| {name} | {e.get('metric')} | {_num(v)} | {ci} | {e.get('n_docs')} |")
        lm = result.get("lm_eval") or {}
        out.append(f"\nlm-eval {lm.get('version')}, {lm.get('num_fewshot', 0)}-shot, backend "
                   f"{lm.get('backend', '–')}; result file written {result.get('created')}.")
    return out or ["(the result JSON holds no scores)"]


def _load_lines(remote: bool | None) -> list[str]:
    trust = ", trust_remote_code=True" if remote else ""
    lines = ["```python",
             "from transformers import AutoModelForCausalLM, AutoTokenizer",
             'model_dir = "path/to/this/directory"',
             f"model = AutoModelForCausalLM.from_pretrained(model_dir{trust})",
             f"tokenizer = AutoTokenizer.from_pretrained(model_dir{trust})",
             "```"]
    if remote:
        lines.insert(0, "Not a stock architecture: `config.json` has `model_type: "
                        "flexigpt_compressed` and `auto_map` pointing at "
                        "`modeling_flexigpt_compressed.py` (needs only torch + transformers); "
                        "without `trust_remote_code=True` transformers refuses to load it.")
    elif remote is False:
        lines = ["Not a stock architecture and no standalone loader: load it with "
                 "`flexigpt.load_compressed(dir)` from flexigpt-bench."]
    else:
        lines.insert(0, "A stock transformers checkpoint.")
    lines += ["", "Stock lm-eval (data: see flexigpt-bench's docs/checkpoints.md, \"Loading compressed models "
              "elsewhere\"):", "```",
              "lm_eval --model hf --model_args pretrained=path/to/this/directory"
              f"{',trust_remote_code=True' if remote else ''},add_bos_token=False,dtype=float32 "
              "--tasks arc_easy", "```",
              "Within flexigpt-bench: `flexigpt.load_compressed(dir)`; a stock-architecture "
              "copy where exact: `flexigpt export DIR --out OUT`."]
    return lines


def write_model_card(model_dir: str | os.PathLike,
                     result_json: str | os.PathLike | None = None) -> Path:
    """Write ``model_dir/README.md`` from ``manifest.json`` (and ``result_json``).

    Returns:
        The card's path.

    Raises:
        FileNotFoundError: ``model_dir`` has no manifest.json, or ``result_json`` is missing.
    """
    model_dir = Path(model_dir)
    if not (model_dir / MANIFEST).is_file():
        raise FileNotFoundError(f"{str(model_dir / MANIFEST)!r} does not exist")
    manifest = read_manifest(model_dir)
    result = None
    if result_json is not None:
        result = json.loads(Path(result_json).read_text(encoding="utf-8"))
    method = manifest.method
    spec = compression_spec(model_dir)
    remote = None if spec is None else bool(spec.get("remote_code"))
    params, cfg = manifest.parameters, manifest.config
    try:
        layers = json.loads((model_dir / "config.json").read_text()).get("num_hidden_layers")
    except (OSError, json.JSONDecodeError):
        layers = None
    base = manifest.base_model
    lines = ["---", "library_name: transformers", "tags:", "- flexigpt-bench",
             f"- {method}", "---", "",
             f"# {method} · {base or 'unknown base model'}", "",
             f"{getattr(_method(method), 'description', None) or method}. Written by "
             "flexigpt-bench.", "",
             "| | |", "|---|---|",
             f"| method | `{method}` |",
             f"| base model | `{base}` |",
             f"| requested ratio | {_num(cfg.get('ratio'))} (policy {cfg.get('policy', '–')}) |",
             f"| achieved ratio | {_num(params.achieved_ratio)} "
             "(1 − params/dense, shared storage once) |",
             f"| parameters | {_num(params.compressed)} of {_num(params.dense)} |",
             f"| layers | {_num(layers)} |",
             f"| stock architecture | {'yes' if spec is None else 'no'} |", "",
             "## What is shared or removed", "", *_structure_lines(method, manifest), "",
             "## Recovery training", "", *_recovery_lines(manifest), ""]
    if result is not None:
        lines += ["## Scores", "", *_score_lines(result), ""]
    calib, versions = manifest.calibration, manifest.versions
    sha = manifest.weights.sha256 if manifest.weights is not None else "–"
    lines += ["## Loading", "", *_load_lines(remote), "",
              "## Provenance", "",
              f"- created {manifest.created}, seed {manifest.seed}, dtype {manifest.dtype}",
              f"- code version {manifest.code_version}, git commit {manifest.git_commit}",
              f"- packages: {', '.join(f'{k} {v}' for k, v in versions.items()) or '–'}",
              f"- calibration: {calib.n_windows} × {calib.seq_len} tokens of `{calib.file}`"
              if calib is not None else "- calibration: none",
              f"- options: `{json.dumps(cfg, sort_keys=True)}`",
              f"- weights sha256 {sha}",
              "- full record: `manifest.json`", ""]
    path = model_dir / CARD
    atomic_write_text(path, "\n".join(lines))
    return path
