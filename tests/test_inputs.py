"""Inputs that cannot conflict or mislead (issue 37): an empty config file, ratios that merge
or that no block count reaches, a flag given twice, non-positive counts and a tampered
resource are refused before any work, each with one line naming the file, key or flag."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flexigpt.cli import main as cli_main
from flexigpt.methods.block_count import RatioOutOfReach, method_plan, plan
from flexigpt.workflow.config_check import ConfigError, check_config_files, check_ratios
from flexigpt.workflow.dag import RunGrid
from flexigpt.workflow.model_skeletons import resource_skeleton
from flexigpt.workflow.resource_check import check_resources

ROOT = Path(__file__).resolve().parent.parent
SMOKE = yaml.safe_load((ROOT / "config/smoke.yaml").read_text())


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # config paths are relative to the workflow root


def smoke_with_ratio(ratio: float) -> dict:
    """The smoke config with every ratio (main, paper protocol, KD, ablations) at ``ratio``."""
    cfg = copy.deepcopy(SMOKE)
    cfg["ratios"] = [ratio]
    cfg["paper_protocol"]["ratios"] = [ratio]
    cfg["kd"]["ratios"] = [ratio]
    cfg["ablations"]["ratio"] = ratio
    return cfg


def grid_error(cfg: dict) -> str:
    with pytest.raises(ConfigError) as err:
        RunGrid.from_config(cfg)
    return str(err.value)


def dry_run(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--snakefile",
                           str(ROOT / "Snakefile"), "-n", "--cores", "1", "--configfile",
                           str(config)], cwd=cwd, capture_output=True, text=True, timeout=300)


# ---- config files ---------------------------------------------------------------------------
@pytest.mark.parametrize("text,problem", [("{}\n", "holds no settings"), ("", "is empty"),
                                          ("[1, 2]\n", "holds a list")])
def test_empty_or_non_mapping_config_file_is_refused_naming_it(tmp_path, text, problem):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        check_config_files([path])
    message = str(err.value)
    assert str(path) in message and problem in message and "\n" not in message


def test_dry_run_of_an_empty_config_file_names_it_and_runs_nothing(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("{}\n")
    out = dry_run(path, tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert f"config file '{path}' holds no settings" in text
    assert "rule compress" not in text and "config/config.yaml" in text


def test_flexigpt_run_refuses_a_list_config_naming_the_file_before_snakemake(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- model\n- data\n")
    out = subprocess.run([sys.executable, "-m", "flexigpt", "run", "--cores", "1", "-n",
                          "--configfile", str(path)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 1
    assert f"config file '{path}' holds a list, not a mapping" in out.stderr
    assert "snakemake" not in out.stderr.lower().replace("flexigpt.cli.commands.run", "")


def test_configfiles_reads_every_form_of_the_flag():
    from flexigpt.cli.commands.run import configfiles
    assert configfiles(["--cores", "1", "--configfile", "a.yaml", "b.yaml", "-n",
                        "--configfiles=c.yaml", "d.yaml", "--configfile=e.yaml", "x"]) == [
        "a.yaml", "b.yaml", "c.yaml", "d.yaml", "e.yaml"]


# ---- ratios at DAG build --------------------------------------------------------------------
def test_ratios_naming_one_run_directory_are_refused():
    cfg = copy.deepcopy(SMOKE)
    cfg["ratios"] = [0.3, 0.3000001]
    assert check_ratios(cfg) == [(
        "ratios", "ratios 0.3, 0.3000001 all name run directory 'r0.3' (6 significant "
                  "digits) and would merge into one run; keep one")]
    message = grid_error(cfg)
    assert "ratios: ratios 0.3, 0.3000001 all name run directory 'r0.3'" in message


def test_ratio_the_dag_cannot_name_is_refused_naming_ratios():
    message = grid_error(smoke_with_ratio(1.0e-05))
    assert "ratios: ratio 1e-05 would be run directory 'r1e-05'" in message


def test_ratio_rounded_by_its_directory_name_is_refused():
    cfg = copy.deepcopy(SMOKE)
    cfg["ratios"] = [0.3, 0.12345678]
    assert check_ratios(cfg) == [("ratios", "ratio 0.12345678 names run directory "
                                            "'r0.123457', whose runs use 0.123457 (6 "
                                            "significant digits); write 0.123457")]


def test_unreachable_ratio_is_refused_at_dag_build_naming_ratios_target_and_reach():
    """0.97 on the 8-block tiny Llama: 7 blocks achieve 0.674 (FlexiGPT) — refused for every
    block-count run, with the key its ratio comes from (the model's builder's shape when the
    resource is not built yet)."""
    message = grid_error(smoke_with_ratio(0.97))
    lines = message.splitlines()
    flexigpt = next(ln for ln in lines if "run tiny-llama/flexigpt/default/r0.97:" in ln)
    assert ": ratios: ratio 0.97 is out of reach: removing 1..7 of 8 blocks achieves " \
           "0.0963..0.6740" in flexigpt  # one reach rule for both policies, at DAG build
    assert "policy 'matched' would remove 7 blocks, achieving 0.6740" in flexigpt
    paper = next(ln for ln in lines if "run tiny-llama/flexigpt/paper/r0.97:" in ln)
    assert ": paper_protocol.ratios: ratio 0.97 is out of reach: removing 1..7 of 8 blocks " \
           "achieves 0.0963..0.6740" in paper
    assert "policy 'paper' would remove 7 blocks, achieving 0.6740" in paper
    assert any("ablations.ratio: ratio 0.97 is out of reach" in ln for ln in lines)


def test_reachable_ratios_pass():
    RunGrid.from_config(smoke_with_ratio(0.5))


def test_paper_policy_refusal_is_reported_at_dag_build():
    """int(0.1 · 8) = 0 blocks under the paper protocol: its compress job would fail."""
    message = grid_error(smoke_with_ratio(0.1))
    assert "run tiny-llama/flexigpt/paper/r0.1: paper_protocol.ratios: ratio 0.1 under " \
           "policy 'paper' removes int(0.1·8) = 0 of 8 blocks" in message


def test_resource_skeleton_has_the_builders_shape():
    from flexigpt.storage.models.adapters import get_adapter

    tiny = resource_skeleton("tiny-llama")
    assert len(get_adapter(tiny).layers(tiny)) == 8 and tiny.config.hidden_size == 128
    smol = resource_skeleton("smollm2")
    assert sum(p.numel() for p in smol.parameters()) == 134_515_008  # SmolLM2-135M
    assert resource_skeleton("no-such-resource") is None


# ---- the reach rule -------------------------------------------------------------------------
def linear(k: int) -> float:
    return 0.1 * k  # 10 blocks, 0.1 each


def test_plan_refuses_a_target_beyond_every_block_count_under_either_policy():
    with pytest.raises(RatioOutOfReach, match=r"--ratio 0.99 is out of reach: removing "
                                              r"1..9 of 10 blocks achieves 0.1000..0.9000"):
        plan("paper", 0.99, 10, linear, what="--ratio")
    with pytest.raises(RatioOutOfReach, match="policy 'matched' would remove 9 blocks, "
                                              "achieving 0.9000"):
        plan("matched", 0.99, 10, linear)
    assert plan("matched", 0.99, 10, linear, accept_miss=True).k == 9  # the one rule's flag
    kept = plan("paper", 0.99, 10, linear, accept_miss=True)
    assert (kept.k, kept.in_reach) == (9, False)
    assert kept.summary() == "target 0.99, achieved 0.9000 (9 of 10 blocks, policy 'paper')"


def test_plan_refuses_a_target_below_half_a_block():
    with pytest.raises(RatioOutOfReach, match="below that"):
        plan("matched", 0.04, 10, linear)
    assert plan("matched", 0.05, 10, linear).k == 1  # exactly half a step: in reach


def test_plan_keeps_the_paper_protocol_inside_the_reach():
    """paper's int(ratio·L) is its definition: inside the reach it is not a miss."""
    found = plan("paper", 0.38, 10, linear)
    assert (found.k, found.in_reach) == (3, True)


def test_method_plan_counts_like_the_methods(tiny_model):
    from flexigpt.core.params import count_parameters
    from flexigpt.methods.flexigpt.prune import FlexiGPTConfig, blocks_to_prune, saving_per_block
    from flexigpt.methods.surgery import matrix_ranks
    from flexigpt.storage.models.adapters import get_adapter
    from flexigpt.storage.registry import get_method

    cfg = FlexiGPTConfig(ratio=0.5, policy="matched")
    found = method_plan("flexigpt", tiny_model, cfg)
    adapter = get_adapter(tiny_model)
    blocks = adapter.layers(tiny_model)
    net = saving_per_block(tiny_model, matrix_ranks(adapter, blocks[0], 4), True, "copy")["net"]
    dense = count_parameters(tiny_model)
    assert found.k == blocks_to_prune(0.5, "matched", len(blocks), dense, net)
    assert found.achieved == pytest.approx(found.k * net / dense)
    short = get_method("shortgpt").make_config(ratio=0.5)
    per_block = count_parameters(blocks[0]) / dense
    assert method_plan("shortgpt", tiny_model, short).achieved == pytest.approx(
        method_plan("shortgpt", tiny_model, short).k * per_block)
    assert method_plan("slicegpt", tiny_model,
                       get_method("slicegpt").make_config(ratio=0.5)) is None


# ---- CLI ------------------------------------------------------------------------------------
def cli(capsys, *argv: str) -> tuple[int, str]:
    rc = cli_main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


@pytest.mark.parametrize("argv,expected", [
    (["--ratio", "0.3", "--option", "ratio=0.5"],
     "--ratio 0.3 and --option ratio=0.5 both set option 'ratio'; give it once"),
    (["--policy", "paper", "--option", 'policy="matched"'],
     "--policy paper and --option policy=\"matched\" both set option 'policy'"),
    (["--option", "rank=4", "--option", "rank=8"],
     "--option rank=4 and --option rank=8 both set option 'rank'"),
    (["--n-calibration", "-1"], "--n-calibration must be an integer >= 1, got -1"),
    (["--n-calibration", "0"], "--n-calibration must be an integer >= 1, got 0"),
    (["--seq-len", "0"], "--seq-len must be an integer >= 1, got 0"),
    (["--rank", "0"], "--rank must be an integer >= 1, got 0"),
])
def test_compress_refuses_conflicting_options_and_bad_counts(tmp_path, capsys, argv, expected):
    rc, text = cli(capsys, "compress", "--method", "flexigpt", "--model", str(tmp_path / "m"),
                   "--out", str(tmp_path / "out"), *argv)
    assert rc == 2 and expected in text, text
    assert len(text.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command,argv,flag", [
    ("extend", ["--layers", "0"], "--layers"),
    ("extend", ["--layers", "12", "--rank", "-2"], "--rank"),
    ("train", ["--tokens", "0"], "--tokens"),
    ("train", ["--tokens", "64", "--micro-batch", "0"], "--micro-batch"),
    ("train", ["--tokens", "64", "--eval-windows", "0"], "--eval-windows"),
    ("train", ["--tokens", "64", "--checkpoint-every", "-1"], "--checkpoint-every"),
    ("train", ["--tokens", "64", "--lora-budget", "0"], "--lora-budget"),
    ("evaluate", ["--limit", "0"], "--limit"),
    ("evaluate", ["--ppl-windows", "-1"], "--ppl-windows"),
    ("evaluate", ["--batch-size", "0"], "--batch-size"),
])
def test_count_flags_must_be_positive(tmp_path, capsys, text_file, command, argv, flag):
    out = tmp_path / ("out.json" if command == "evaluate" else "out")
    texts = ["--text", str(text_file), "--validation", ""] if command == "train" else []
    rc, text = cli(capsys, command, "--model", str(tmp_path / "m"), "--out", str(out),
                   *texts, *argv)
    assert rc == 2 and f"{flag} must be an integer >=" in text, text
    assert len(text.strip().splitlines()) == 1 and not out.exists()


def test_old_names_of_the_task_data_are_refused_with_the_new_one(tmp_path, capsys):
    """The task data is "tasks" (issue 50): ``evaluate --benchmarks`` and ``fetch
    benchmarks`` name their new spelling in one line, before anything is read or built."""
    out = tmp_path / "out.json"
    rc, text = cli(capsys, "evaluate", "--model", str(tmp_path / "m"), "--out", str(out),
                   "--benchmarks", str(tmp_path / "b"))
    assert rc == 2 and "--benchmarks was renamed --tasks-dir" in text, text
    assert len(text.strip().splitlines()) == 1 and not out.exists()
    with pytest.raises(SystemExit) as exit_:
        cli_main(["fetch", "benchmarks", "--out", str(tmp_path / "t")])
    assert exit_.value.code == 2
    assert "'benchmarks' was renamed 'tasks' (`flexigpt fetch tasks`)" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


@pytest.mark.usefixtures("single_thread")
def test_compress_refuses_an_unreachable_ratio_unless_accepted(tmp_path, capsys,
                                                               tiny_checkpoint, text_file):
    """--ratio 0.99 under FlexiGPT's default paper policy on 4 blocks: int(3.96) = 3 blocks
    fall far short; refused naming target and achieved, or compressed with the flag."""
    common = ["compress", "--method", "flexigpt", "--model", str(tiny_checkpoint),
              "--calibration", str(text_file), "--n-calibration", "2", "--seq-len", "16",
              "--ratio", "0.99"]
    rc, text = cli(capsys, *common, "--out", str(tmp_path / "refused"))
    assert rc == 2, text
    line = text.strip().splitlines()[-1]
    assert "ratio 0.99 is out of reach: removing 1..3 of 4 blocks achieves" in line
    assert "policy 'paper' would remove 3 blocks, achieving" in line
    assert "--accept-ratio-miss" in line and not (tmp_path / "refused").exists()
    rc, text = cli(capsys, *common, "--accept-ratio-miss", "--out", str(tmp_path / "kept"))
    assert rc == 0, text
    manifest = json.loads((tmp_path / "kept/manifest.json").read_text())
    achieved = manifest["parameters"]["achieved_ratio"]
    assert f"target ratio 0.99, achieved ratio {achieved:.4f}" in text


# ---- resources ------------------------------------------------------------------------------
@pytest.fixture
def built_model(tmp_path, tiny_tokenizer) -> Path:
    """A harness-written model directory (with its ``.flexigpt-output.json``)."""
    from conftest import make_model

    from flexigpt.core.fileio import atomic_directory

    out = tmp_path / "models/tiny"
    with atomic_directory(out) as tmp:
        make_model().save_pretrained(tmp)
        tiny_tokenizer.save_pretrained(tmp)
    return out


def config_for(model_dir: Path) -> dict:
    cfg = copy.deepcopy(SMOKE)
    cfg["model"] = {"key": "mine", "name": "mine", "path": str(model_dir), "resource": None}
    del cfg["methods"]["flexigpt"]["variants"]  # rank 4 is hidden/16 here: nothing to save
    cfg["extension"]["layers"] = 6
    return cfg


def test_tampered_resource_is_refused_naming_the_file(built_model, tmp_path):
    cfg = config_for(built_model)
    grid = RunGrid.from_config(cfg)
    record = tmp_path / "verified.json"
    check_resources(cfg, grid, record)
    assert str(built_model.resolve()) in json.loads(record.read_text())
    with open(built_model / "config.json", "a") as fh:
        fh.write(" ")
    with pytest.raises(ConfigError) as err:
        check_resources(cfg, grid, record)
    assert f"model.path: changed after its build: '{built_model}': ['config.json'] changed " \
           "since the save" in str(err.value)


def test_unchanged_resources_are_not_hashed_again(built_model, tmp_path, monkeypatch):
    import flexigpt.workflow.resource_check as config_check

    cfg = config_for(built_model)
    grid = RunGrid.from_config(cfg)
    record = tmp_path / "verified.json"
    check_resources(cfg, grid, record)
    monkeypatch.setattr(config_check, "verify_resource",
                        lambda *a: pytest.fail("hashed an unchanged directory"))
    check_resources(cfg, grid, record)
    (built_model / "extra.txt").write_text("added later")
    monkeypatch.undo()
    with pytest.raises(ConfigError, match=r"holds \['extra.txt'\]"):
        check_resources(cfg, grid, record)


def test_dry_run_with_a_tampered_model_stops_before_any_job(built_model, tmp_path):
    weights = built_model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(config_for(built_model)))
    out = dry_run(path, tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "model.path:" in text and "['model.safetensors'] changed since the save" in text
    assert "rule compress" not in text


# ---- config errors: one line naming the file and the key (issue 48, item 4) -----------------
@pytest.mark.parametrize("edit, line", [
    (lambda c: c.update(ratios=["1e-05"]),
     "ratios[0]: '1e-05' is text, not a number: YAML 1.1 reads an exponent"),
    (lambda c: c.update(ratios=[]), "ratios: [] needs at least 1 item(s)"),
    (lambda c: c.update(ratios=0.3), "ratios: 0.3 is not a list (e.g. [0.3, 0.4])"),
    (lambda c: c.update(ratios=[1.5]), "ratios[0]: 1.5 must be < 1"),
    (lambda c: c.update(bogus_key=1), "bogus_key: unknown key (known: ablations,"),
    (lambda c: c.pop("calibration"), "missing required key 'calibration'"),
    (lambda c: c["methods"]["flexigpt"].update(optins={}),
     "methods.flexigpt.optins: unknown key (known: budget, match, options,"),
    (lambda c: c["training"].update(tokens="many"), "training.tokens: 'many' is not an integer"),
    (lambda c: c["data"].update(benchmarks=c["data"].pop("tasks")),
     "data.benchmarks was renamed data.tasks (the folder of the task data"),
])
def test_schema_errors_are_one_line_naming_file_and_key(tmp_path, edit, line):
    from flexigpt.workflow.config_schema import check_schema

    cfg = copy.deepcopy(SMOKE)
    edit(cfg)
    with pytest.raises(ConfigError) as err:
        check_schema(cfg, [str(tmp_path / "my.yaml")])
    message = str(err.value)
    assert message.startswith(f"config file '{tmp_path / 'my.yaml'}': ") and line in message
    assert "\n" not in message and len(message) < 400


def test_flexigpt_run_names_a_bad_key_in_one_line_before_snakemake(tmp_path):
    cfg = copy.deepcopy(SMOKE)
    cfg["ratios"] = [1.5]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-m", "flexigpt", "run", "--cores", "1", "-n",
                          "--configfile", str(path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"config file '{path}': ratios[0]: 1.5 must be < 1" in lines[0]
