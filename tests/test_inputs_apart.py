"""No command writes into, or replaces, one of its inputs (issue 48): an output equal to,
inside or containing an input path — resolved through symlinks — is refused in one line
naming both, with exit 2, before any work; the DAG-build check refuses config inputs inside
the folders its rules write."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from flexigpt.cli import main as cli_main
from flexigpt.core.fileio import InputOverlapError, check_apart
from flexigpt.workflow.config_check import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def model_dir(tiny_checkpoint: Path) -> Path:
    return tiny_checkpoint


def _refused(capsys, argv: list[str], *names: str) -> str:
    capsys.readouterr()  # the fixtures' own output
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    line = next(ln for ln in err if "outputs are kept apart from inputs" in ln)
    assert len([ln for ln in err if ln.strip()]) == 1, err
    for name in names:
        assert name in line, line
    return line


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("where", ["sub", ".", "link"])
def test_compress_never_writes_into_its_model(capsys, model_dir, text_file, tmp_path, where):
    before = _snapshot(model_dir)
    if where == "link":  # the same directory through a symlink
        (tmp_path / "alias").symlink_to(model_dir)
        out = tmp_path / "alias" / "sub"
    else:
        out = model_dir / where
    line = _refused(capsys, ["compress", "--method", "shortgpt", "--model", str(model_dir),
                             "--out", str(out), "--ratio", "0.3", "--calibration",
                             str(text_file)], "--out", "--model")
    assert ("is the input" if where == "." else "lies inside") in line
    assert _snapshot(model_dir) == before


def test_an_output_containing_an_input_is_refused(capsys, model_dir, text_file):
    _refused(capsys, ["compress", "--method", "shortgpt", "--model", str(model_dir), "--out",
                      str(text_file.parent), "--ratio", "0.3", "--calibration",
                      str(text_file)], "contains the input --calibration")


def test_train_evaluate_generate_export_refuse_their_inputs(capsys, model_dir, text_file):
    _refused(capsys, ["train", "--model", str(model_dir), "--out", str(model_dir / "t"),
                      "--tokens", "64", "--text", str(text_file)], "--model")
    _refused(capsys, ["evaluate", "--model", str(model_dir), "--out",
                      str(model_dir / "result.json"), "--tasks", "", "--no-ppl"], "--model")
    _refused(capsys, ["generate", "--model", str(model_dir), "--prompts", "Hello",
                      "--json", str(model_dir / "texts.json")], "--json", "--model")
    _refused(capsys, ["export", str(model_dir), "--out", str(model_dir)], "MODEL_DIR")


# ---- what a command writes beside --out is an output too ----------------------------------
def _train(model: Path, out: Path, text: Path, *extra: str) -> list[str]:
    return ["train", "--model", str(model), "--out", str(out), "--tokens", "64", "--text",
            str(text), "--validation", "", "--seq-len", "16", "--micro-batch", "1",
            "--global-batch", "1", "--recipe", "lora", *extra]


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_train_never_uses_its_model_as_checkpoint_folder(capsys, model_dir, text_file,
                                                         tmp_path, force):
    """``--model M.ckpt --out M``: the trainer's checkpoint folder ``<out>.ckpt`` would be
    the model, deleted after the run."""
    model = tmp_path / "M.ckpt"
    shutil.copytree(model_dir, model)
    before = _snapshot(model)
    _refused(capsys, _train(model, tmp_path / "M", text_file, *force),
             "M.ckpt beside it, which is the input --model")
    assert _snapshot(model) == before


def test_train_never_writes_over_its_text(capsys, model_dir, text_file, tmp_path):
    """``--text K.ckpt/train.txt --out K``: the checkpoint folder holds the training text."""
    text = tmp_path / "K.ckpt" / "train.txt"
    text.parent.mkdir()
    shutil.copy(text_file, text)
    _refused(capsys, _train(model_dir, tmp_path / "K", text),
             "K.ckpt beside it, which contains the input --text")
    assert text.read_bytes() == text_file.read_bytes()


@pytest.mark.parametrize("name", ["N.ckpt", "N.ckpt.old"])
@pytest.mark.parametrize("force", [[], ["--force"]])
def test_train_keeps_a_foreign_folder_named_like_its_checkpoint(capsys, model_dir, text_file,
                                                                tmp_path, name, force):
    """A folder of the user's at ``<out>.ckpt`` (or its moved-aside ``.old``) is neither
    resumed from, replaced nor deleted, ``--force`` or not: one line, exit 2."""
    mine = tmp_path / name
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert cli_main(_train(model_dir, tmp_path / "N", text_file, *force)) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and name in err[0] and "refusing" in err[0], err
    assert (mine / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "N").exists()


def test_empty_values_mean_none_not_the_working_directory(capsys, model_dir, text_file,
                                                          tmp_path, monkeypatch):
    """``--validation ''`` and ``--tasks-dir ''`` say "none" (their help); they never stand
    for the working directory, so an ``--out`` under it is not refused as lying inside them."""
    monkeypatch.chdir(tmp_path)
    assert cli_main(_train(model_dir, Path("trained"), text_file)) == 0  # --validation ''
    assert (tmp_path / "trained" / "manifest.json").is_file()
    assert cli_main(["evaluate", "--model", str(model_dir), "--out", "eval/result.json",
                     "--tasks", "", "--tasks-dir", "", "--ppl-text", str(text_file),
                     "--ppl-seq-len", "16", "--ppl-windows", "2", "--batch-size", "2"]) == 0
    assert (tmp_path / "eval" / "result.json").is_file()
    check_apart(tmp_path / "out", {"--validation": "", "--tasks-dir": ""})


def test_beside_out_names_what_train_and_evaluate_write(tmp_path):
    """:data:`flexigpt.cli.BESIDE_OUT` (what the rule, and its property test, count as written
    beside ``--out``) names exactly what the trainer and the evaluation write there."""
    from flexigpt.cli import BESIDE_OUT, INPUT_PATHS, beside_out
    from flexigpt.runtime.evaluation.results import records_paths
    from flexigpt.runtime.training.checkpoint import checkpoint_dir, moved_aside

    for out in (tmp_path / "o", tmp_path / "run.v1"):
        ckpt = checkpoint_dir(out)
        assert set(beside_out("train", out)) == {ckpt.name, moved_aside(ckpt).name}
    for name in ("r.json", "r", "a.b.json"):
        written = {p.name for p in records_paths(tmp_path / name).values()}
        assert set(beside_out("evaluate", tmp_path / name)) == written
    assert set(BESIDE_OUT) <= set(INPUT_PATHS) and beside_out("compress", tmp_path) == ()


@pytest.mark.parametrize("record", ["windows.json", "samples.jsonl.gz"])
def test_evaluate_never_writes_its_records_over_an_input(capsys, model_dir, text_file, tmp_path,
                                                         record):
    """``--out r.json --ppl-text r.windows.json``: the per-window records would replace the
    text (and a stale one is removed); refused in one line, the text untouched."""
    text = tmp_path / f"r.{record}"
    shutil.copy(text_file, text)
    _refused(capsys, ["evaluate", "--model", str(model_dir), "--out", str(tmp_path / "r.json"),
                      "--tasks", "", "--ppl-text", str(text), "--ppl-seq-len", "16"],
             f"r.{record} beside it, which is the input --ppl-text")
    assert text.read_bytes() == text_file.read_bytes()


def test_check_apart_covers_staging_and_temporary_names(tmp_path):
    """Inputs at any name a save derives from ``--out`` (staging, moved-aside, temporary,
    the checkpoint folder's own) are refused; a name that only shares a prefix is not."""
    out = tmp_path / "out"
    for name in (".out.partial-1-abc", ".out.partial-1-abc.old-12345678", "..out.partial-9",
                 ".out.tmp-x", ".out.ckpt.partial-3-y", "out.ckpt.old"):
        source = tmp_path / name / "model"
        source.mkdir(parents=True)
        with pytest.raises(InputOverlapError, match="beside it, which contains the input"):
            check_apart(out, {"--model": source}, beside=("out.ckpt", "out.ckpt.old"))
    (tmp_path / "outer.ckpt").mkdir()
    check_apart(out, {"--model": tmp_path / "outer.ckpt"}, beside=("out.ckpt",))
    check_apart(out, {"--model": tmp_path / "out.ckpt.old"})  # no checkpoint folder written


def test_check_apart_skips_missing_inputs_and_unrelated_paths(tmp_path):
    check_apart(tmp_path / "out", {"--model": "org/hub-id", "--text": None})
    (tmp_path / "a").mkdir()
    check_apart(tmp_path / "ab", {"--model": tmp_path / "a"})  # a prefix, not a parent
    with pytest.raises(InputOverlapError, match="lies inside the input --model"):
        check_apart(tmp_path / "a" / "b", {"--model": tmp_path / "a"})


def test_dag_refuses_config_inputs_inside_its_output_folders(monkeypatch, tmp_path):
    from flexigpt.workflow.dag import RunGrid

    monkeypatch.chdir(ROOT)
    cfg = yaml.safe_load((ROOT / "config/smoke.yaml").read_text())
    results = ROOT / "results"
    assert results.is_dir()  # the committed reference runs live there
    bad = copy.deepcopy(cfg)
    bad["data"]["train_text"] = "results/README.md" if (results / "README.md").exists() \
        else str(next(p for p in results.rglob("*.md")).relative_to(ROOT))
    with pytest.raises(ConfigError, match=r"data.train_text: the DAG's output folder results "
                                          r".* contains the input data.train_text"):
        RunGrid.from_config(bad)
