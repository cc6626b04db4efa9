"""CPU vs CUDA on the tiny models: every heavy step gives the CPU's numbers on the GPU.

Run on a CUDA machine with ``python -m pytest -m gpu`` (what ``benchmarks/gpu_check.sh``
runs); the default test command deselects these tests (``-m "not slow and not gpu"``) and
they skip where no CUDA device is visible. Each test runs one step of the harness (its API
or CLI, as a job would) once with ``device="cpu"`` and once with ``device="cuda"`` on the
session's tiny resources (``tiny_resources``: tiny-llama and its wiki text and task data)
and compares what the two wrote.

Tolerances. Both devices compute in fp32: training with ``--bf16 off``, evaluation without
``--bf16``, and fp32 matmuls at torch's default ``highest`` precision (no TF32; checked by
the ``fp32_matmuls`` fixture). cuBLAS / cuSOLVER reduce in another order than the CPU's
BLAS / LAPACK, so the floats agree to rounding, not bit for bit; the bounds are those of
the CPU tests that compare two reduction orders of the same fp32 computation
(``tests/test_multiprocess_train.py``: loss rel 1e-4 / abs 1e-5, weights 1e-4;
``tests/test_flexigpt_prune.py``, ``tests/test_slicegpt.py``: outputs atol 1e-4). Discrete
outcomes (pruned blocks, chosen bases, slice widths: a manifest's ``structure``; greedy
tokens) must be identical.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from flexigpt.api.compression import compress
from flexigpt.cli import main as cli_main
from flexigpt.runtime.evaluation.results import load_records, load_result
from flexigpt.storage.artifacts import load_compressed
from flexigpt.storage.registry import METHODS, tiny_options

DEVICES = ("cpu", "cuda")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

#: weights, logits and per-document log-likelihoods: |cpu - cuda| bound (fp32, see above)
ATOL = 1e-4
#: losses and perplexities: relative / absolute bound (tests/test_multiprocess_train.py)
REL, ABS = 1e-4, 1e-5
#: options of each registered method on tiny-llama (8 blocks, hidden 128): its declaration
OPTIONS = {name: tiny_options(name, 8) for name in METHODS}


@pytest.fixture(autouse=True)
def fp32_matmuls():
    """fp32 matmuls stay fp32 on CUDA (no TF32): the tolerances above assume it."""
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.fixture(scope="module")
def paths(tiny_resources: Path) -> dict[str, Path]:
    return {"model": tiny_resources / "models" / "tiny-llama",
            "train": tiny_resources / "text" / "wiki" / "train.txt",
            "validation": tiny_resources / "text" / "wiki" / "validation.txt",
            "tasks": tiny_resources / "tasks"}


@pytest.fixture(scope="module")
def compressed(paths, tmp_path_factory) -> dict[str, dict[str, Path]]:
    """method → device → the saved output of compressing tiny-llama there (every method
    of the registry, the same 8 calibration windows of 64 tokens)."""
    root = tmp_path_factory.mktemp("gpu-compress")
    out: dict[str, dict[str, Path]] = {}
    for name in METHODS:
        for device in DEVICES:
            target = root / f"{name}-{device}"
            compress(name, str(paths["model"]), target, options=OPTIONS[name],
                     calibration=str(paths["train"]), n_calibration=8,
                     calibration_seq_len=64, seed=0, device=device)
            out.setdefault(name, {})[device] = target
    return out


def close_up_to_sign(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a ≈ b`` within :data:`ATOL`, or equal up to the signs of entries: singular / eigen
    vectors (FlexiGPT's SVD-initialised LoRA factors, SliceGPT's PCA rotation) are defined
    up to sign and the two devices' solvers may pick either; the products (the model's
    function) are the same, which the logits comparison checks."""
    a, b = a.float(), b.float()
    return bool(torch.allclose(a, b, atol=ATOL)
                or torch.allclose(a.abs(), b.abs(), atol=ATOL))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_compress_on_cuda_matches_cpu(name, compressed, paths):
    """Same selection (the manifest's structure), near-equal weights and logits."""
    runs = {d: load_compressed(compressed[name][d]) for d in DEVICES}
    manifests = {d: json.loads((compressed[name][d] / "manifest.json").read_text())
                 for d in DEVICES}
    assert manifests["cuda"]["device"].startswith("cuda")
    assert manifests["cuda"]["structure"] == manifests["cpu"]["structure"]
    assert manifests["cuda"]["parameters"] == manifests["cpu"]["parameters"]
    cpu, cuda = (runs[d].model.state_dict() for d in DEVICES)
    assert cpu.keys() == cuda.keys()
    far = [k for k in cpu if not close_up_to_sign(cpu[k], cuda[k])]
    assert not far, far
    ids = torch.randint(3, 300, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = [runs[d].model(ids).logits for d in DEVICES]
    assert torch.allclose(logits[0], logits[1], atol=ATOL)


def _train_log(model: Path, out: Path, paths: dict[str, Path], device: str) -> list[dict]:
    """A short recovery (6 steps, the model's own recipe) with ``flexigpt train``."""
    argv = ["train", "--model", str(model), "--out", str(out), "--tokens", str(32 * 4 * 6),
            "--text", str(paths["train"]), "--validation", str(paths["validation"]),
            "--seq-len", "32", "--micro-batch", "2", "--global-batch", "4", "--eval-windows",
            "4", "--bf16", "off", "--warmup", "1", "--checkpoint-every", "0", "--lr", "5e-3",
            "--device", device]
    assert cli_main(argv) == 0
    with open(out / "train_log.csv") as fh:
        return list(csv.DictReader(fh))


def test_recovery_on_cuda_matches_cpu(compressed, paths, tmp_path):
    """FlexiGPT recovery (LoRA + γ) of the CPU-compressed model on each device: the same
    loss curve and trained weights within the multi-process test's bounds."""
    model = compressed["flexigpt"]["cpu"]
    logs = {d: _train_log(model, tmp_path / d, paths, d) for d in DEVICES}
    assert [r["step"] for r in logs["cpu"]] == [r["step"] for r in logs["cuda"]]
    for a, b in zip(logs["cpu"][1:], logs["cuda"][1:]):
        assert float(b["loss"]) == pytest.approx(float(a["loss"]), rel=REL, abs=ABS)
        assert a["tokens"] == b["tokens"]
    trained = {d: load_compressed(tmp_path / d) for d in DEVICES}
    assert trained["cuda"].manifest.history[-1]["device"].startswith("cuda")
    sa, sb = (trained[d].model.state_dict() for d in DEVICES)
    worst = max(float((sa[k].float() - sb[k].float()).abs().max()) for k in sa)
    assert worst < ATOL, worst


def _evaluate(model: Path, out: Path, paths: dict[str, Path], device: str) -> Path:
    argv = ["evaluate", "--model", str(model), "--out", str(out), "--tasks",
            "arc_easy,piqa,hellaswag", "--limit", "4", "--tasks-dir",
            str(paths["tasks"]), "--ppl-text", str(paths["validation"]),
            "--ppl-seq-len", "64", "--ppl-windows", "4", "--batch-size", "4",
            "--device", device]
    assert cli_main(argv) == 0
    return out


@pytest.mark.parametrize("name", ["dense", "flexigpt"])
def test_evaluation_on_cuda_matches_cpu(name, compressed, paths, tmp_path):
    """Perplexity (per window and overall) and every document's log-likelihoods within
    the bounds; a document's accuracy is the same unless its two best choices are closer
    than the bound allows the devices to disagree on (a tie at fp32 rounding)."""
    model = compressed[name]["cpu"]
    results = {d: _evaluate(model, tmp_path / f"{d}.json", paths, d) for d in DEVICES}
    cpu, cuda = (load_result(results[d]) for d in DEVICES)
    assert cuda["device"].startswith("cuda")
    assert cuda["perplexity"]["value"] == pytest.approx(cpu["perplexity"]["value"], rel=REL)
    rec = {d: load_records(results[d]) for d in DEVICES}
    nll = [rec[d]["perplexity"]["nll"] for d in DEVICES]
    assert nll[1] == pytest.approx(nll[0], rel=REL, abs=ABS)
    assert rec["cpu"]["tasks"].keys() == rec["cuda"]["tasks"].keys()
    for task, docs in rec["cpu"]["tasks"].items():
        for a, b in zip(docs, rec["cuda"]["tasks"][task], strict=True):
            assert a["doc_id"] == b["doc_id"]
            assert b["loglikelihoods"] == pytest.approx(a["loglikelihoods"], abs=ATOL)
            best = sorted(a["loglikelihoods"], reverse=True)
            if best[0] - best[1] > 2 * ATOL:
                assert a[a["metric"]] == b[b["metric"]], (task, a["doc_id"])


def _generate(model: Path, out: Path, device: str, *flags: str) -> list[list[int]]:
    argv = ["generate", "--model", str(model), "--max-new-tokens", "12", "--ignore-eos",
            "--seed", "0", "--json", str(out), "--device", device, *flags,
            "The river of the north", "A famous king was"]
    assert cli_main(argv) == 0
    return json.loads(out.read_text())["token_ids"]


@pytest.mark.parametrize("name,flags", [("dense", ()), ("flexigpt", ()),
                                        ("flexigpt", ("--speculative",))])
def test_greedy_decoding_on_cuda_matches_cpu(name, flags, compressed, tmp_path):
    """Greedy decoding picks the same tokens: a flip needs two logits within the devices'
    fp32 drift (about 1e-5 here), which these prompts do not have. Self-speculative
    decoding is lossless: it gives the plain greedy tokens on either device."""
    model = compressed[name]["cpu"]
    tokens = {d: _generate(model, tmp_path / f"{d}.json", d, *flags) for d in DEVICES}
    assert tokens["cuda"] == tokens["cpu"]
    if flags:
        plain = _generate(model, tmp_path / "plain.json", "cuda")
        assert tokens["cuda"] == plain
