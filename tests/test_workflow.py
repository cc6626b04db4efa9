"""The Snakemake DAG: lint, dry runs of every shipped config, schema errors, grid logic."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flexigpt.storage.registry import METHODS
from flexigpt.workflow.dag import RunGrid

ROOT = Path(__file__).resolve().parent.parent
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
CONFIGS = ["config/config.yaml", "config/smoke.yaml", "config/paper.yaml",
           "config/paper-llama3.yaml", "config/paper-opt.yaml"]


def snakemake(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def load(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text())


def test_lint_clean():
    out = snakemake("--lint")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "good condition" in out.stdout + out.stderr


@pytest.mark.parametrize("config", CONFIGS)
def test_dry_run(config, tmp_path):
    # Run in an empty directory so nothing on disk (built resources, results) is assumed.
    out = snakemake("-n", "--cores", "2", "--configfile", str(ROOT / config), cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "rule tables" in out.stdout


def test_job_conda_env_pins_match_environment_yml():
    """The per-job env (--use-conda) has environment.yml's pins and no path entry (Snakemake
    runs conda from .snakemake/conda/, where `-e .` would name the wrong folder); every rule
    uses it, and the Snakefile puts the checkout on the jobs' PYTHONPATH instead."""
    user = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    jobs = yaml.safe_load((ROOT / "workflow/envs/flexigpt.yaml").read_text())["dependencies"]
    pip_user, pip_jobs = (next(d["pip"] for d in deps if isinstance(d, dict))
                          for deps in (user, jobs))
    assert "-e ." in pip_user and pip_jobs == [p for p in pip_user if p != "-e ."]
    assert [d for d in user if not isinstance(d, dict)] == \
        [d for d in jobs if not isinstance(d, dict)]
    for rules in (ROOT / "workflow/rules").glob("*.smk"):
        text = rules.read_text()
        assert "environment.yml" not in text, rules.name
        assert text.count("conda:") == text.count('"../envs/flexigpt.yaml"'), rules.name
    assert "checkout_on_pythonpath(workflow.basedir)" in (
        ROOT / "workflow/rules/common.smk").read_text()


def test_checkout_on_pythonpath(monkeypatch, tmp_path):
    import os

    from flexigpt.workflow.support import checkout_on_pythonpath

    monkeypatch.setenv("PYTHONPATH", f"/other{os.pathsep}{tmp_path}")
    checkout_on_pythonpath(tmp_path)
    checkout_on_pythonpath(tmp_path)  # idempotent: one entry, first
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(tmp_path.resolve()), "/other"]


def test_schema_methods_come_from_the_registry():
    """The schema holds no hand-kept method list: config_schema fills it from the registry
    (section "methods"; the extension is configured under `extension:`)."""
    from flexigpt.workflow.config_schema import _validator

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["properties"]["methods"]["propertyNames"] == {"x-registry": "methods"}
    filled = _validator().schema["properties"]["methods"]["propertyNames"]["enum"]
    assert filled == [m for m, f in METHODS.items() if f.section == "methods"]
    assert set(filled) == set(METHODS) - {"flexigpt_extend"}
    protocol = schema["properties"]["paper_protocol"]["properties"]["methods"]["items"]
    assert protocol == {"type": "string", "x-registry": "block_count"}
    filled = _validator().schema["properties"]["paper_protocol"]["properties"]["methods"]
    assert filled["items"]["enum"] == [m for m in filled_methods() if METHODS[m].block_count]
    assert {"flexigpt", "shortgpt", "shortgpt_lora"} <= set(filled["items"]["enum"])


def filled_methods() -> list[str]:
    """The registry's methods of section "methods", in table order."""
    return [m for m, f in METHODS.items() if f.section == "methods"]


@pytest.mark.parametrize("mutate,message", [
    (lambda c: c.update(bogus_key=1), "bogus_key"),
    (lambda c: c["methods"].update(magic_pruner={}), "magic_pruner"),
    (lambda c: c.update(ratios=[1.5]), "1.5"),
    (lambda c: c["evaluation"].update(tasks=["mmlu"]), "mmlu"),
    (lambda c: c["jobs"].update(gpu=2), "gpu"),
    # a user's config is validated as written: never completed from the default's keys
    (lambda c: c.pop("model"), "missing required key 'model'"),
    (lambda c: c.pop("training"), "missing required key 'training'"),
])
def test_bad_config_rejected_before_any_job(mutate, message, tmp_path):
    cfg = load("config/smoke.yaml")
    mutate(cfg)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = snakemake("-n", "--cores", "1", "--configfile", str(path), cwd=tmp_path)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("flexigpt: config file")]
    assert len(errors) == 1 and message in errors[0], text  # the file, the key, one line
    assert "Traceback" not in text and 'File "' not in text  # no engine stack frames
    assert "rule compress" not in text


def test_grid_of_default_config():
    config = load("config/config.yaml")
    assert config["kd"]["runs"] == ["flexigpt", "shortgpt_lora"]  # the like-for-like pair
    config["kd"]["runs"] += ["slicegpt/rft", "llm_pruner/lora"]  # every method can distil
    grid = RunGrid.from_config(config)
    methods = {(r.method, r.variant, r.setting) for r in grid.runs.values()}
    for m in ("shortgpt", "shortgpt_lora", "slicegpt", "llm_pruner", "flexigpt"):
        assert {(m, "default", "r0.3"), (m, "default", "r0.4")} <= methods
    assert ("flexigpt", "no_outnorm", "r0.3") in methods
    figures = grid.figure_inputs()  # only this grid's files feed the figures
    assert "results/smollm2-135m/flexigpt/default/r0.4/compressed/manifest.json" in figures[
        "manifests"]
    assert "results/smollm2-135m/shortgpt_lora/default/r0.3/trained/train_log.csv" in figures[
        "train_logs"]
    assert not any("/shortgpt/default/" in p or "slicegpt/default" in p
                   for p in sum(figures.values(), []))
    assert "results/smollm2-135m/shortgpt/last3/r0.3/trained/train_log.csv" in figures[
        "train_logs"]  # ShortGPT + fine-tuning of the last 3 blocks is a recovered run
    assert "results/smollm2-135m/slicegpt/rft/r0.3/trained/selection.json" in figures[
        "selections"]
    assert {("flexigpt_extend", "block", "L45"), ("flexigpt_extend", "sequential", "L45"),
            ("dense", "trained", "full"), ("dense", "default", "full")} <= methods
    flexi = grid.run("smollm2-135m", "flexigpt", "default", "r0.3")
    assert flexi.compress_params()["options"] == {"policy": "matched", "ratio": 0.3}
    assert flexi.stages() == ["start", "final"]
    # like-for-like links of Table 1 and the paper protocol
    lora = grid.run("smollm2-135m", "shortgpt_lora", "default", "r0.3")
    assert lora.match == lora.budget == flexi.key and lora.table == "main"
    paper = grid.run("smollm2-135m", "shortgpt_lora", "paper", "r0.3")
    assert paper.budget == ("smollm2-135m", "flexigpt", "paper", "r0.3") and paper.match is None
    assert paper.compress_params()["options"]["policy"] == "paper"
    assert paper.lr_from == lora.key
    assert ("smollm2-135m", "flexigpt", "paper", "r0.4") not in grid.runs  # ratios: [0.3]
    lora_all = grid.run("smollm2-135m", "flexigpt", "lora_all", "r0.4")
    assert lora_all.lr_from == lora_all.budget == flexi.key[:3] + ("r0.4",)
    every = {(r.method, r.variant) for r in grid.runs.values() if r.recovery}
    assert {("slicegpt", "rft"), ("llm_pruner", "lora"), ("flexigpt", "lora_all")} <= every
    kd = grid.run("smollm2-135m", "flexigpt", "kd", "r0.3")
    assert kd.compressed_from == kd.lr_from == flexi.key and kd.stages() == ["final"]
    assert grid.train_params(kd)["loss"] == "kd" and kd.labels("final")["table"] == "kd"
    # the sweep: γ gets its own learning rates, searched from one start like the LoRA LR;
    # a reused choice is one trial
    assert grid.trials(flexi) == [{"lr": 4e-3, "gamma_lr": 5e-2}]
    assert grid.train_params(flexi, "t0")["gamma_lr"] == 5e-2
    assert grid.search(flexi)["factor"] == 2.0 and grid.search(kd) is None
    # a variant that changes only the recovery trains the default's compressed model, and
    # its KD twin trains that same model
    rft = grid.run("smollm2-135m", "slicegpt", "rft", "r0.3")
    one_shot = grid.run("smollm2-135m", "slicegpt", "default", "r0.3")
    assert rft.compressed_from == one_shot.key and rft.stages() == ["final"]
    rft_kd = grid.run("smollm2-135m", "slicegpt", "rft_kd", "r0.3")
    assert rft_kd.compressed_dir == one_shot.compressed_dir and rft_kd.lr_from == rft.key
    assert lora_all.compressed_from is None  # rank 18: its own compression
    assert grid.eval_params(flexi, "final")["autocast_dtype"] == "auto"
    assert grid.trials(kd) == [{"lr_from": flexi.prefix}]
    assert grid.tune_text.endswith("validation.tune.txt")
    assert grid.test_text.endswith("validation.test.txt")
    assert grid.eval_params(flexi, "start")["tasks"] == []
    assert grid.run("smollm2-135m", "shortgpt", "default", "r0.4").stages() == ["final"]
    ablation = grid.run("smollm2-135m", "flexigpt", "no_lowrank", "r0.3")
    assert ablation.compress_params()["options"]["distance"] == "full"
    assert grid.train_params(grid.run("smollm2-135m", "dense", "trained", "full"))["recipe"] == "full"
    lora_control = grid.run("smollm2-135m", "dense", "trained_lora", "full")
    assert lora_control.budget == ("smollm2-135m", "flexigpt_extend", "block", "L45")
    timed = grid.inference_runs("smollm2-135m")
    assert next(iter(timed)) == "dense/default/full"
    assert {"shortgpt/default/r0.3", "flexigpt/default/r0.3"} <= set(timed)


def test_seed_replicates():
    """``replicates``: named Table 1 runs again per seed, labelled as their base variant,
    reusing its learning rates, like-for-like links pointing at the same seed's twin."""
    cfg = load("config/config.yaml")
    cfg["replicates"] = {"seeds": [1, 2], "runs": ["flexigpt", "shortgpt_lora"]}
    with pytest.raises(ValueError, match="set tuning.reuse.replicate"):
        RunGrid.from_config(cfg)  # under the search a reused learning rate states why
    cfg["tuning"]["reuse"]["replicate"] = "a seed replicate trains at its seed-0 twin's rates"
    grid = RunGrid.from_config(cfg)
    twins = [r for r in grid.runs.values() if r.label_variant is not None]
    assert len(twins) == 2 * 2 * 2  # seeds × runs × ratios
    flexi = grid.run("smollm2-135m", "flexigpt", "default", "r0.3")
    f1 = grid.run("smollm2-135m", "flexigpt", "default_s1", "r0.3")
    l1 = grid.run("smollm2-135m", "shortgpt_lora", "default_s1", "r0.3")
    assert f1.seed == 1 and f1.labels("final")["variant"] == "default"
    assert f1.labels("final")["seed"] == 1 and f1.compress_params()["seed"] == 1
    assert grid.train_params(f1)["seed"] == 1 and grid.trials(f1) == [{"lr_from": flexi.prefix}]
    assert l1.match == l1.budget == f1.key
    assert f1.stages() == ["start", "final"] and f1.table == "main"
    for bad, message in (({"seeds": [1], "runs": ["nope"]}, "not a Table 1"),
                         ({"seeds": [0], "runs": ["flexigpt"]}, "base seed")):
        cfg["replicates"] = bad
        with pytest.raises(ValueError, match=message):
            RunGrid.from_config(cfg)


def test_grid_partial_and_errors():
    cfg = load("config/smoke.yaml")
    partial = copy.deepcopy(cfg)
    partial["methods"] = {"dense": {}, "shortgpt": {}}
    with pytest.raises(ValueError, match="paper_protocol names 'flexigpt'"):
        RunGrid.from_config(partial)
    for section in ("ablations", "extension", "paper_protocol", "kd"):
        partial.pop(section)
    with pytest.raises(ValueError, match="tuning.sensitivity names 'flexigpt'"):
        RunGrid.from_config(partial)
    partial["tuning"].pop("sensitivity")
    partial["ratios"] = [0.3]
    grid = RunGrid.from_config(partial)
    assert len(grid.runs) == 2 and len(grid.eval_targets()) == 2
    bad = copy.deepcopy(cfg)
    bad["model"]["path"] = "elsewhere"
    with pytest.raises(ValueError, match="model.path must be"):
        RunGrid.from_config(bad)
    with pytest.raises(ValueError, match="no run"):
        grid.run("tiny-llama", "flexigpt", "default", "r0.3")
    dangling = copy.deepcopy(cfg)
    dangling["methods"].pop("flexigpt")
    dangling.pop("ablations")
    dangling["kd"]["runs"] = []
    dangling["paper_protocol"]["methods"] = ["shortgpt"]
    dangling["tuning"]["sensitivity"] = ["shortgpt_lora"]
    with pytest.raises(ValueError, match="not in the grid"):  # shortgpt matches flexigpt
        RunGrid.from_config(dangling)


def test_dag_times_summarises_benchmark_files(tmp_path):
    """benchmarks/dag_times.py groups Snakemake benchmark files by rule."""
    from benchmarks.dag_times import rule_times, summary

    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    for job, rule, seconds in (("a/r0.3", "train", 30.0), ("b/r0.4", "train", 10.0),
                               ("a/r0.3", "compress", 5.0)):
        (tmp_path / job).mkdir(parents=True, exist_ok=True)
        (tmp_path / job / f"{rule}.tsv").write_text(
            header + f"{seconds}\t0:00:{int(seconds):02d}\t100.5\t1\t1\t1\t0\t0\t90\t{seconds}\n")
    table = summary(rule_times(tmp_path))
    assert list(table.index) == ["train", "compress"]
    assert table.loc["train", "jobs"] == 2 and table.loc["train", "total_s"] == 40
    assert table.loc["train", "slowest"] == "a/r0.3" and table.loc["train", "share"] == "89%"
    with pytest.raises(FileNotFoundError, match="no benchmark"):
        rule_times(tmp_path / "empty")


def test_dag_times_compares_rules_with_another_runs_table(tmp_path, capsys):
    """``--against``: per rule, another run's jobs and total and the ratio of the totals,
    only where both ran the same jobs; ``--exclude`` leaves matching jobs out first."""
    from benchmarks.dag_times import main, read_table

    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    for job, rule, seconds in (("a/r0.3", "train", 30.0), ("b/r0.4", "train", 10.0),
                               ("a/r0.3", "compress", 5.0), ("new/r0.3", "compress", 7.0)):
        (tmp_path / "t" / job).mkdir(parents=True, exist_ok=True)
        (tmp_path / "t" / job / f"{rule}.tsv").write_text(
            header + f"{seconds}\t0:00:{int(seconds):02d}\t100.5\t1\t1\t1\t0\t0\t90\t{seconds}\n")
    other = tmp_path / "other.md"
    other.write_text("| rule | jobs | total_s | mean_s |\n|:--|--:|--:|--:|\n"
                     "| train | 2 | 20 | 10 |\n| compress | 2 | 10 | 5 |\n| tables | 1 | 3 | 3 |\n")
    assert read_table(other).loc["train", "total_s"] == 20
    out = tmp_path / "cmp.md"
    assert main(["--timings", str(tmp_path / "t"), "--against", str(other),
                 "--markdown", str(out)]) == 0
    table = out.read_text()
    rows = {ln.split("|")[1].strip(): ln.split("|")[-2].strip() for ln in table.splitlines()
            if ln.startswith("| ") and "ratio" not in ln}
    assert rows == {"train": "2", "compress": "1.2"}  # 40 / 20; 12 / 10
    assert main(["--timings", str(tmp_path / "t"), "--exclude", "^new/", "--against",
                 str(other), "--markdown", str(out)]) == 0
    rows = {ln.split("|")[1].strip(): ln.split("|")[-2].strip()
            for ln in out.read_text().splitlines() if ln.startswith("| ") and "ratio" not in ln}
    assert rows == {"train": "2", "compress": "nan"}  # 1 job here, 2 there: no ratio
    assert "over the rules with equal job counts 40 / 20 = 2.00×" in out.read_text()
    (tmp_path / "bad.md").write_text("no table\n")
    with pytest.raises(ValueError, match="no dag_times table"):
        read_table(tmp_path / "bad.md")


def test_slurm_profile_reads_account_and_partitions_from_the_environment():
    """The SLURM profile names no site: account and partitions are ``$FLEXIGPT_SLURM_*``
    variables (expanded by Snakemake), each documented in the README and set by the SLURM
    smoke test (tests/slurm/run_smoke.sh, which runs this profile on a real cluster)."""
    import re

    text = (ROOT / "workflow/profiles/slurm/config.yaml").read_text()
    profile = yaml.safe_load(text)
    assert profile["executor"] == "slurm"
    assert profile["default-resources"]["slurm_account"] == "$FLEXIGPT_SLURM_ACCOUNT"
    partitions = {profile["default-resources"]["slurm_partition"]} | {
        r["slurm_partition"] for r in profile["set-resources"].values() if "slurm_partition" in r}
    assert partitions == {"$FLEXIGPT_SLURM_PARTITION", "$FLEXIGPT_SLURM_GPU_PARTITION"}
    names = set(re.findall(r"\$(\w+)", "\n".join(line.split("#")[0] for line in text.splitlines())))
    readme = (ROOT / "README.md").read_text()
    smoke = (ROOT / "tests/slurm/run_smoke.sh").read_text()
    for name in names:
        assert name in readme and f"{name}=" in smoke, name


def test_slurm_profile_allocates_the_cpus_each_heavy_rule_runs_threads_on():
    """The executor plugin asks SLURM for ``cpus_per_task`` CPUs whatever a rule's threads,
    and ``default-resources``' value applies to every rule that sets none: each rule with
    threads of its own (``set-threads``, or inference_cost's cap of 16) asks for that many."""
    profile = load("workflow/profiles/slurm/config.yaml")
    threads = {**profile["set-threads"], "inference_cost": 16}
    for rule, n in threads.items():
        assert profile["set-resources"][rule].get("cpus_per_task") == n, rule


def test_schema_lists_every_resource_model_builder():
    from flexigpt.runtime.resources import LAYOUT
    from flexigpt.workflow.config_paths import RESOURCE_MODELS

    schema = load("workflow/schemas/config.schema.yaml")
    enum = schema["properties"]["model"]["properties"]["resource"]["enum"]
    assert set(enum) == set(RESOURCE_MODELS) | {None}
    assert all(LAYOUT[name] == path.removeprefix("resources/")
               for name, path in RESOURCE_MODELS.items())


def test_bench_scaling_counts_fits_and_extrapolates():
    """benchmarks/bench_scaling.py: the parameter counts of its shapes (tied weights once),
    exact power-law / linear fits, and a FLOP-based accelerator estimate at paper.yaml's
    token counts."""
    import argparse
    import math

    from benchmarks.bench_scaling import (
        PAPER,
        dense_params,
        extrapolate,
        fit_linear,
        fit_power,
        markdown,
    )

    assert dense_params("llama-2-7b") == 6_738_415_616  # the published count
    assert dense_params("tinyllama-1.1b") == 1_100_048_384
    assert dense_params("smollm2-135m") == 134_515_008  # embedding and head tied
    a, b = fit_power([(1e8, 2.0), (4e8, 8.0), (1.6e9, 32.0)])
    assert b == pytest.approx(1.0) and a == pytest.approx(2e-8)
    c, k = fit_linear([(1.0, 3.0), (2.0, 5.0), (4.0, 9.0)])
    assert (c, k) == (pytest.approx(1.0), pytest.approx(2.0))

    def row(params: int, seconds: float) -> dict:
        stage = {"wall_s": seconds, "peak_rise_mib": params / 2**20, "tokens": 512}
        return {"shape": "x", "params": params, "stages": {"train_step": stage}}

    args = argparse.Namespace(n_calibration=4, seq_len=256, gpu_peak=312e12, mfu=0.4)
    ext = extrapolate([row(10**8, 1.0), row(10**9, 10.0)], args)
    target = dense_params("llama-2-7b")
    step = ext["train_step"]
    assert step["time_fit"]["b"] == pytest.approx(1.0)
    assert step["cpu_s_paper"] == pytest.approx(1e-8 * target * PAPER["train_tokens"] / 512,
                                                rel=1e-3)
    assert step["gpu_s_paper"] == pytest.approx(
        4 * target * PAPER["train_tokens"] / (312e12 * 0.4), rel=1e-6)
    assert step["memory_fit"]["bytes_per_param"] == pytest.approx(1.0)
    scale = PAPER["train_micro_batch"] * PAPER["train_seq_len"] / 512
    assert step["peak_rise_gib"] == pytest.approx(target / 2**30 * scale, rel=1e-2)
    assert math.isfinite(step["job_peak_gib_bf16_weights"])
    text = markdown({"sizes": [row(10**8, 1.0), row(10**9, 10.0)], "threads": 2,
                     "load_average_start": [0, 0, 0], "load_average_end": [0, 0, 0],
                     "cpu_peak_fp32": 1e11, "gpu_peak": 312e12, "extrapolation": ext})
    assert "| train_step | 1.00 |" in text


def test_bench_scaling_from_json_rebuilds_every_committed_reference(tmp_path):
    """``bench_scaling.py --from-json`` redoes the fits and tables of each committed run
    (results/reference/scaling/bench_scaling*.json) byte for byte, a single-size run
    included (no extrapolation from one size, as when it was measured)."""
    import shutil

    from benchmarks.bench_scaling import main

    committed = sorted((ROOT / "results/reference/scaling").glob("bench_scaling*.json"))
    assert len(committed) >= 2
    for path in committed:
        out = tmp_path / path.name
        shutil.copy(path, out)
        assert main(["--from-json", "--out", str(out)]) == 0
        assert out.read_bytes() == path.read_bytes(), path.name
        assert out.with_suffix(".md").read_bytes() == path.with_suffix(".md").read_bytes()
