"""The device setting reaches every heavy step.

The DAG's config ``device`` is put in every job's params (grid test), and every workflow
script, run here as Snakemake runs it (``snakemake`` object in its globals), hands it to the
place where its step resolves a device (``flexigpt.core.devices.resolve_device``). A spy
replaces that function: it records each request and places the sentinel ``cuda:7`` on the
CPU, so a step that ignored the setting would never ask for ``cuda:7`` and the test fails;
every output then records the device its step really ran on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import run_script

from flexigpt.core import devices

ROOT = Path(__file__).resolve().parent.parent
SENTINEL = "cuda:7"

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def requested(monkeypatch):
    """Device requests seen by ``resolve_device`` (the sentinel resolves to the CPU)."""
    seen: list[str] = []
    real = devices.resolve_device

    def spy(spec="auto"):
        seen.append(str(spec))
        return real("cpu" if str(spec) == SENTINEL else spec)

    monkeypatch.setattr(devices, "resolve_device", spy)
    return seen


def test_check_and_resolve():
    for spec in ("auto", "cpu", "cuda", "cuda:0", "cuda:12"):
        assert devices.check_device(spec) == spec
    for bad in ("gpu", "cuda:", "CPU", "cuda:x", "", None, 0):
        with pytest.raises(ValueError, match="device must be auto | cpu"):
            devices.check_device(bad)
    import torch

    assert devices.resolve_device("cpu") == "cpu"
    if not torch.cuda.is_available():
        assert devices.resolve_device("auto") == devices.resolve_device(None) == "cpu"
        with pytest.raises(ValueError, match="CUDA is not available"):
            devices.resolve_device("cuda")


def test_bad_device_fails_at_the_config_edge(tiny_checkpoint):
    from flexigpt.runtime.training import TrainConfig
    from flexigpt.storage.models.loading import load_model

    with pytest.raises(ValueError, match="device must be"):
        TrainConfig(device="gpu")
    with pytest.raises(ValueError, match="device must be"):
        load_model(tiny_checkpoint, device="tpu")


def test_grid_puts_the_device_in_every_job():
    from flexigpt.workflow.dag import RunGrid

    cfg = yaml.safe_load((ROOT / "config/smoke.yaml").read_text())
    cfg["device"] = SENTINEL
    grid = RunGrid.from_config(cfg)
    assert grid.calibration["device"] == SENTINEL  # block influence
    assert grid.inference["device"] == SENTINEL  # inference cost
    recovered = 0
    for run in grid.runs.values():
        assert run.compress_params()["device"] == SENTINEL, run.name
        for stage in run.stages():
            assert grid.eval_params(run, stage)["device"] == SENTINEL, run.name
        if run.recovery:
            recovered += 1
            for trial in grid.trial_ids(run):
                assert grid.train_params(run, trial)["device"] == SENTINEL, run.name
    assert recovered > 5
    cfg.pop("device")
    assert {r.device for r in RunGrid.from_config(cfg).runs.values()} == {"auto"}


def test_every_workflow_step_runs_on_the_configured_device(
        tiny_checkpoint, text_file, tmp_path, monkeypatch, requested):
    from flexigpt.workflow.support import PROMPT_TEXT

    cal = {"n_calibration": 4, "seq_len": 32, "seed": 0, "dtype": "float32",
           "device": SENTINEL}

    def step(name: str, **kw) -> None:
        requested.clear()
        run_script(name, tmp_path, monkeypatch, **kw)
        assert SENTINEL in requested, f"{name}: the device setting never reached the step"

    bi = tmp_path / "bi.json"
    step("block_influence", params={"model": str(tiny_checkpoint), "calibration": cal},
         inputs={"text": text_file}, outputs={"out": bi})
    assert json.loads(bi.read_text())["device"] == "cpu"

    compressed = {}
    for method, options in [("flexigpt", {"ratio": 0.5, "policy": "paper", "rank": 4}),
                            ("slicegpt", {"ratio": 0.3, "round_to": 2, "tolerance": 0.05}), ("llm_pruner", {"ratio": 0.3}),
                            ("shortgpt", {"ratio": 0.3})]:
        out = compressed[method] = tmp_path / method / "compressed"
        inputs = {"text": text_file} | ({"bi": bi} if method != "slicegpt" else {})
        step("compress", params={"model": str(tiny_checkpoint), "run": {
            "method": method, "options": options, **cal}}, inputs=inputs,
            outputs={"model": out})
        assert json.loads((out / "manifest.json").read_text())["device"] == "cpu", method

    trained = tmp_path / "flexigpt" / "trained"
    config = {"tokens": 2 * 4 * 32, "seq_len": 32, "micro_batch": 4, "global_batch": 4,
              "eval_windows": 2, "checkpoint_every": 0, "warmup_min_steps": 0,
              "device": SENTINEL}
    step("train", params={"trials": [{"config": config, "point": {"lr": 4e-3}}],
                          "meta": {"run": "test"}, "rung": 0.5, "teacher": None},
         inputs={"model": compressed["flexigpt"], "text": text_file, "tune": text_file},
         outputs={"model": trained})
    history = json.loads((trained / "manifest.json").read_text())["history"]
    assert history[-1]["stage"] == "train" and history[-1]["device"] == "cpu"

    result = tmp_path / "eval_start.json"
    step("evaluate", params={"evaluation": {
        "tasks": [], "ppl_seq_len": 32, "ppl_windows": 2, "device": SENTINEL}},
        inputs={"model": trained, "ppl_text": text_file}, outputs={"out": result})
    assert json.loads(result.read_text())["device"] == "cpu"

    timing = tmp_path / "inference.json"
    step("inference", params={"inference": {
        "batch": 1, "seq_len": 16, "repeats": 1, "device": SENTINEL,
        "decode": {"prompts": 1, "new_tokens": 2, "batch": 1, "repeats": 1}}},
        inputs={"dense/default/full": tiny_checkpoint, "flexigpt/default/r0.5": trained,
                PROMPT_TEXT: text_file}, outputs={"out": timing})
    assert json.loads(timing.read_text())["device"] == "cpu"


def test_generate_and_cli_take_the_device(tiny_checkpoint, requested):
    import argparse
    import importlib

    from flexigpt.cli import COMMANDS
    from flexigpt.runtime.generation import generate

    out = generate(tiny_checkpoint, ["the"], max_new_tokens=2, device=SENTINEL)
    assert SENTINEL in requested and len(out.texts) == 1
    for command in ("compress --method flexigpt --model m --out o", "extend --model m "
                    "--layers 6 --out o", "train --model m --out o --tokens 64",
                    "evaluate --model m --out o.json", "generate --model m hi"):
        name, *argv = command.split()
        parser = argparse.ArgumentParser()
        importlib.import_module(COMMANDS[name]).add_arguments(parser)
        assert parser.parse_args([*argv, "--device", "cuda:1"]).device == "cuda:1", command
        assert parser.parse_args(argv).device == "auto", command
        with pytest.raises(SystemExit):
            parser.parse_args([*argv, "--device", "gpu"])
