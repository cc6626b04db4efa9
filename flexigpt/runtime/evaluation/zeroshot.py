"""Zero-shot multiple-choice evaluation of an in-memory model through ``lm_eval.simple_evaluate``.

Pinned protocol (recorded in every result): ``num_fewshot=0``, an explicit ``add_bos_token``
(default False: no BOS, as lm-eval ≤ 0.4.1 used by SliceGPT/FlexiGPT), a fixed batch size,
fixed lm-eval seeds, ``limit`` = first N docs or the full split. Each task runs in its own
``simple_evaluate`` call so its wall time is measured separately.

Per-document records (``run_task(..., records=[...])``) come from lm-eval's own
``log_samples=True`` output, one dict per doc (:func:`doc_record`; lm-eval's samples keys
minus ``doc``, ``arguments`` and ``resps``, plus ``task``, ``data_sha256``, ``metric``,
``gold``, ``loglikelihoods`` and ``is_greedy``). They depend only on the requests' answers, so
the fast scorer and stock ``HFLM`` write the same records.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from flexigpt.runtime.evaluation.tasks import TaskSpec, build_task, task_manager

log = logging.getLogger(__name__)

BACKENDS = ("fast", "hf")
SEEDS = {"random_seed": 0, "numpy_random_seed": 1234, "torch_random_seed": 1234,
         "fewshot_random_seed": 1234}


def make_lm(model: nn.Module, tokenizer: Any, backend: str = "fast", batch_size: int = 16,
            add_bos_token: bool = False, max_length: int | None = None,
            autocast_dtype: str | torch.dtype | None = None, **fast_kwargs: Any) -> Any:
    """An lm-eval LM around an in-memory causal LM.

    Args:
        backend: ``"fast"`` (:class:`FastHFLM`, exact prefix-shared scoring) or ``"hf"``
            (stock ``HFLM``).
        batch_size: stock ``HFLM`` batch size (also used by the fast backend's fallbacks).
        add_bos_token: passed explicitly to lm-eval (never the tokenizer default).
        autocast_dtype: fast backend only: ``None`` (fp32), ``"bfloat16"`` or a torch dtype.
    """
    from lm_eval.models.huggingface import HFLM

    from flexigpt.runtime.evaluation.fast.lm import FastHFLM

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if backend == "hf" and (autocast_dtype or fast_kwargs):
        raise ValueError("autocast_dtype / fast-scorer options need backend='fast'")
    common = {"pretrained": model, "tokenizer": tokenizer, "backend": "causal",
              "batch_size": batch_size, "add_bos_token": add_bos_token,
              "max_length": max_length, "logits_cache": True}
    if backend == "hf":
        return HFLM(**common)
    return FastHFLM(**common, autocast_dtype=autocast_dtype, **fast_kwargs)


def lm_config(lm: Any) -> dict[str, Any]:
    """Settings of an lm-eval LM that change numbers (for the result JSON)."""
    tok = lm.tokenizer
    probe = lm.tok_encode("a")
    cfg = {"class": type(lm).__name__, "add_bos_token": lm.add_bos_token,
           "bos_prepended": tok.bos_token_id is not None and bool(probe)
           and probe[0] == tok.bos_token_id,
           "max_length": int(lm.max_length), "batch_size": lm.batch_size,
           "dtype": str(next(lm.model.parameters()).dtype).replace("torch.", ""),
           "device": str(lm.device), "seeds": dict(SEEDS)}
    if hasattr(lm, "fast_config"):
        cfg["fast"] = lm.fast_config()
    return cfg


def _metrics(raw: dict[str, Any]) -> dict[str, float | None]:
    """lm-eval's ``{"acc,none": x, "alias": ...}`` → ``{"acc": x}`` (other filters keep a
    ``,<filter>`` suffix); "N/A" stderr becomes None."""
    out: dict[str, float | None] = {}
    for key, value in raw.items():
        if key == "alias" or "," not in key:
            continue
        metric, _, filt = key.partition(",")
        name = metric if filt == "none" else key
        out[name] = float(value) if isinstance(value, (int, float)) else None
    return out


def _gold(task: Any, doc: dict[str, Any]) -> Any:
    """The gold choice index exactly as lm-eval's multiple-choice ``process_results``
    derives it (a list for multiple targets; -100 when the label is not a choice)."""
    gold = task.doc_to_text(doc) if getattr(task, "multiple_input", 0) else task.doc_to_target(doc)
    if isinstance(gold, str):
        choices = task.doc_to_choice(doc)
        return choices.index(gold) if gold in choices else -100
    if isinstance(gold, (list, tuple)):
        return [int(g) for g in gold]
    return int(gold) if gold is not None else None


def doc_record(task: Any, spec: TaskSpec, sha: str | None, sample: dict[str, Any],
               ) -> dict[str, Any]:
    """One per-document record from one of lm-eval's logged samples (JSON-ready)."""
    resps = [tuple(r) if isinstance(r, (list, tuple)) else (r,) for r in sample["filtered_resps"]]
    rec: dict[str, Any] = {
        "task": spec.name, "data_sha256": sha, "split": spec.split, "metric": spec.metric,
        "doc_id": int(sample["doc_id"]), "target": sample["target"],
        "gold": _gold(task, sample["doc"]),
        "loglikelihoods": [float(r[0]) for r in resps],
        "is_greedy": [bool(r[1]) for r in resps if len(r) > 1],
        "filtered_resps": [[float(r[0]), bool(r[1])] if len(r) > 1 else [float(r[0])]
                           for r in resps],
        "filter": sample.get("filter"), "metrics": list(sample.get("metrics", [])),
        "doc_hash": sample.get("doc_hash"), "prompt_hash": sample.get("prompt_hash"),
        "target_hash": sample.get("target_hash")}
    for name in rec["metrics"]:
        value = sample.get(name)
        rec[name] = float(value) if isinstance(value, (int, float)) else value
    if not isinstance(rec["target"], (str, int, float, list, type(None))):
        rec["target"] = str(rec["target"])
    return rec


#: what ``simple_evaluate`` puts in its output instead of the environment report
NOT_COLLECTED = "not collected by flexigpt (the result JSON records its own versions)"


@contextlib.contextmanager
def without_environment_report() -> Iterator[None]:
    """Inside the block, ``lm_eval.simple_evaluate`` skips its environment report.

    At the end of every call lm-eval adds ``torch.utils.collect_env``'s report (about 55
    subprocesses: ``pip list``, compiler and driver probes) and ``git`` lookups to its
    output. Nothing here reads them: a result JSON records its own versions and code hash
    (:mod:`flexigpt.runtime.evaluation.results`). The report's fields are set to
    :data:`NOT_COLLECTED`; every score and record is unchanged. Measured on an AMD EPYC
    (Zen 3, AVX2, fp32 scoring), one thread: the report alone takes 0.50-0.58 s per call;
    a whole five-task final evaluation of SmolLM2 took 106.5 s before and 93.3 s after
    (three ABBA pairs, ``benchmarks/ab_jobs.py``,
    ``results/reference/smollm2-135m/zen3_ab_69f4d0e/``), more than the calls' own time:
    the process's own CPU time fell by 10.7 s too (forking a process that holds the model
    and the scorer's heap is the likely cause).
    """
    import lm_eval.evaluator as evaluator

    saved = evaluator.add_env_info, evaluator.get_git_commit_hash
    evaluator.add_env_info = _note_not_collected
    evaluator.get_git_commit_hash = lambda: NOT_COLLECTED
    try:
        yield
    finally:
        evaluator.add_env_info, evaluator.get_git_commit_hash = saved


def _note_not_collected(storage: dict[str, Any]) -> None:
    """Stand-in for lm-eval's ``add_env_info``: the same keys, marked not collected."""
    storage.update(dict.fromkeys(("pretty_env_info", "transformers_version", "lm_eval_version",
                                  "upper_git_hash"), NOT_COLLECTED))


def run_task(lm: Any, spec: TaskSpec, limit: int | None,
             records: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Evaluate one task; returns the result JSON's ``tasks.<name>`` entry.

    Args:
        records: if given, one :func:`doc_record` per evaluated document is appended
            (lm-eval runs with ``log_samples=True``; the metrics are unchanged).

    Raises:
        FloatingPointError: the headline metric is missing or not finite.
    """
    import lm_eval

    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                              or limit < 1):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")
    start = time.perf_counter()
    task = build_task(spec)
    with without_environment_report():
        out = lm_eval.simple_evaluate(model=lm, tasks=[task], num_fewshot=0, limit=limit,
                                      log_samples=records is not None,
                                      batch_size=lm.batch_size, task_manager=task_manager(),
                                      **SEEDS)
    seconds = time.perf_counter() - start
    raw = out["results"][spec.name]
    metrics = _metrics(raw)
    value, stderr = metrics.get(spec.metric), metrics.get(f"{spec.metric}_stderr")
    if value is None or not math.isfinite(value):
        raise FloatingPointError(f"{spec.name}: metric {spec.metric!r} is missing or not "
                                 f"finite in lm-eval's output {raw}")
    n_docs = int(out["n-samples"][spec.name]["effective"])
    sha = spec.data_sha256()
    if records is not None:
        samples = sorted(out["samples"][spec.name], key=lambda x: x["doc_id"])
        if len(samples) != n_docs:
            raise RuntimeError(f"{spec.name}: lm-eval logged {len(samples)} samples for "
                               f"{n_docs} docs")
        records.extend(doc_record(task, spec, sha, sample) for sample in samples)
    log.info("%s: %s = %.4f ± %.4f (%d docs, %.1f s)", spec.name, spec.metric, value,
             stderr or float("nan"), n_docs, seconds)
    return {"metric": spec.metric, "value": value, "stderr": stderr, "metrics": metrics,
            "n_docs": n_docs, "n_docs_split": int(out["n-samples"][spec.name]["original"]),
            "limit": limit, "version": out["versions"].get(spec.name), "source": spec.source,
            "split": spec.split, "data_sha256": sha,
            "seconds": round(seconds, 3)}


def run_tasks(lm: Any, specs: list[TaskSpec], limit: int | None,
              records: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """:func:`run_task` for each spec, in order (``records``: see there)."""
    from flexigpt.core import faults

    results = {}
    for spec in specs:
        results[spec.name] = run_task(lm, spec, limit, records)
        faults.point("eval:task")
    return results
