"""End to end: the smoke config (tiny budgets) through the whole DAG, on the tiny Llama and
on the tiny OPT (the paper's Table 3 family: every method, the extension and the tables).

Runs in a temporary working directory whose ``resources/`` links to the session's tiny
resources (``tiny_resources`` in conftest.py: fake wiki text and task data, the tiny models
built by the project's own builder), never to the checkout's.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import link_resources

from flexigpt.tables.from_archive import rebuild
from flexigpt.workflow.dag import RunGrid
from flexigpt.workflow.dag.table_inputs import archive_run

ROOT = Path(__file__).resolve().parent.parent


#: model key → ``--config model=...`` override of the smoke config (None: as shipped)
MODELS = {"tiny-llama": None,
          "tiny-opt": "{key: tiny-opt, name: tiny random OPT (8 layers), "
                      "path: resources/models/tiny-opt, resource: tiny-opt, dtype: float32}",
          "tiny-gemma3": "{key: tiny-gemma3, name: tiny random Gemma 3 (8 layers), "
                         "path: resources/models/tiny-gemma3, resource: tiny-gemma3, "
                         "dtype: float32}"}
#: model key → methods its family refuses (docs/families.md): dropped from the smoke grid
REFUSED = {"tiny-gemma3": ("slicegpt", "replaceme")}


def smoke_config(key: str, tmp_path: Path) -> tuple[dict, Path]:
    """The smoke config for ``key`` and the file Snakemake reads it from: as shipped, or
    with the model swapped and the methods its family refuses dropped; Gemma 3 (63 %
    embeddings on the real model) names its ratios on the non-embedding basis."""
    path = ROOT / "config/smoke.yaml"
    config = yaml.safe_load(path.read_text())
    if MODELS[key] is None:
        return config, path
    config["model"] = yaml.safe_load(MODELS[key])
    for method in REFUSED.get(key, ()):
        config["methods"].pop(method)
    if key == "tiny-gemma3":
        config["compression_basis"] = "non_embedding"
    path = tmp_path / f"smoke-{key}.yaml"
    path.write_text(yaml.safe_dump(config))
    return config, path


@pytest.mark.parametrize("key", ["tiny-llama",  # in the default test run (CI)
                                 pytest.param("tiny-opt", marks=pytest.mark.slow),
                                 pytest.param("tiny-gemma3", marks=pytest.mark.slow)])
def test_smoke_dag_end_to_end(tmp_path, key, tiny_resources):
    link_resources(tmp_path, tiny_resources)
    config, path = smoke_config(key, tmp_path)
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
           "--configfile", str(path), "--cores", "2"]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:  # show the failing jobs' logs (progress bars may hold stray bytes)
        logs = sorted((tmp_path / "logs").rglob("*.log"))
        texts = {p: p.read_text(errors="replace") for p in logs}
        failed = "\n".join(f"== {p}\n{t[-2000:]}" for p, t in texts.items() if "Error" in t)
        pytest.fail(out.stderr[-4000:] + failed)

    grid = RunGrid.from_config(config)
    for target in grid.eval_targets():
        result = json.loads((tmp_path / target).read_text())
        assert math.isfinite(result["perplexity"]["value"]), target
        if result["labels"]["stage"] == "final":
            assert set(result["tasks"]) == set(grid.evaluation["tasks"]), target
            assert all(0 <= t["value"] <= 1 for t in result["tasks"].values()), target
        if result["labels"]["ratio"] is not None:
            assert result["parameters"]["achieved_ratio"] > 0.05, target

    refused = REFUSED.get(key, ())
    table1 = (tmp_path / f"results/{key}/tables/table1_{key}.csv").read_text()
    for method in ("shortgpt", "shortgpt_lora", "slicegpt", "llm_pruner", "flexigpt",
                   "replaceme", "streamline"):
        if method not in refused:  # one-shot + recovered, or both ratios
            assert table1.count(method) >= 2, method
    strategies = (tmp_path / f"results/{key}/tables/table_replacement_{key}.csv").read_text()
    for method in ("shortgpt_lora", "replaceme", "streamline", "flexigpt"):
        assert (method in strategies) == (method not in refused), method
    if config.get("compression_basis", "total") != "total":  # recorded in every manifest
        manifests = list((tmp_path / f"results/{key}").rglob("compressed/manifest.json"))
        assert manifests and all(json.loads(m.read_text())["compression_basis"]["basis"]
                                 == config["compression_basis"] for m in manifests
                                 if json.loads(m.read_text())["method"] != "dense")
    assert "nan" not in table1.lower().replace("n/a", "")
    md = (tmp_path / f"results/{key}/tables/table1_{key}.md").read_text()
    # * marks exactly the recovery-trained rows (smoke config: ShortGPT + LoRA and FlexiGPT)
    assert "| FlexiGPT* |" in md and "| ShortGPT + LoRA* |" in md
    assert "| SliceGPT* |" not in md and "| LLM-Pruner* |" not in md

    # the run's archive (table inputs + per-document records, no weights) rebuilds its tables
    # exactly, without the models (flexigpt archive; flexigpt tables --archive)
    archive = tmp_path / "archive"
    archive_run(config, archive, workdir=tmp_path)
    assert not [p for p in archive.rglob("*") if p.suffix in (".safetensors", ".bin", ".pt")]
    assert list(archive.rglob("*.samples.jsonl.gz")) and list(archive.rglob("*.windows.json"))
    rebuilt = [p for p in rebuild(archive, tmp_path / "rebuilt", formats=("md", "csv"),
                                  make_plots=False) if p.suffix in (".md", ".csv")]
    assert any(p.name == f"table1_{key}.csv" for p in rebuilt)
    tables = tmp_path / f"results/{key}/tables"
    for path in rebuilt:
        assert path.read_text() == (tables / path.name).read_text(), path.name
