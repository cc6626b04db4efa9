"""One error path (issue 37): every expected failure is one line naming the user's path,
exit code 2, nothing half-written, a previous output intact; and the DAG's shell rules find
the harness through the interpreter that runs Snakemake, not ``PATH``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flexigpt.cli import main as cli_main
from flexigpt.core.fileio import MARKER, atomic_directory

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("single_thread")

ARC_ROW = {"id": "q1", "question": "Which is a fruit?",
           "choices": {"text": ["apple", "stone"], "label": ["A", "B"]}, "answerKey": "A"}


def error_line(err: str, *words: str) -> str:
    """The one ``flexigpt <cmd>: error: ...`` line of ``err`` (no traceback), naming ``words``."""
    lines = [line for line in err.splitlines() if line.startswith("flexigpt ")
             and ": error: " in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def snapshot(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` (relative path → digest)."""
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def partials(out: Path) -> list[Path]:
    """Staging leftovers of saves to ``out``."""
    return sorted(out.parent.glob(f".{out.name}.partial-*"))


def no_heavy_work(monkeypatch) -> None:
    """Fail the test if the command gets as far as loading a model."""
    import flexigpt.api.compression

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the check")

    monkeypatch.setattr(flexigpt.api.compression, "load_model", refuse)


def compress_args(model: Path, out: Path, *extra: str) -> list[str]:
    return ["compress", "--method", "dense", "--model", str(model), "--out", str(out), *extra]


# ---- disk full during a save -------------------------------------------------------------
def _disk_full_safetensors(tensors, filename, metadata=None):
    """safetensors' own error for a full disk (0.8: a real ENOSPC reads exactly so), after
    half a file."""
    from safetensors import SafetensorError

    Path(filename).write_bytes(b"\0" * 64)
    raise SafetensorError("Error while serializing: I/O error: No space left on device "
                          "(os error 28)")


def _disk_full_os(tensors, filename, metadata=None):
    """A plain ``OSError`` ENOSPC on the staging file (what any other write raises)."""
    raise OSError(28, "No space left on device", str(filename))


@pytest.mark.parametrize("fail", [_disk_full_safetensors, _disk_full_os],
                         ids=["SafetensorError", "OSError"])
def test_disk_full_during_save(fail, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import safetensors.torch

    out = tmp_path / "out"
    assert cli_main(compress_args(tiny_checkpoint, out)) == 0
    before = snapshot(out)
    capsys.readouterr()
    monkeypatch.setattr(safetensors.torch, "save_file", fail)
    assert cli_main(compress_args(tiny_checkpoint, out)) == 2
    line = error_line(capsys.readouterr().err, f"--out {str(out)!r}", "No space left on device")
    assert ".partial-" not in line
    assert snapshot(out) == before and not partials(out)


# ---- unwritable or read-only output, checked before any heavy work ------------------------
def _immutable(path: Path) -> bool:
    """``chattr +i``: not even root may create files in ``path`` (False: unsupported here)."""
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
    return done.returncode == 0


@pytest.fixture
def frozen(tmp_path):
    """Make directories immutable for the test and thaw them after (root ignores mode bits,
    so ``chmod`` proves nothing when tests run as root; ``chattr +i`` holds for root too)."""
    made: list[Path] = []

    def freeze(path: Path) -> Path:
        if not _immutable(path):
            pytest.skip("chattr +i is not supported on this file system / in this container")
        made.append(path)
        return path

    yield freeze
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def test_output_under_a_file_is_refused_before_work(tiny_checkpoint, tmp_path, capsys,
                                                   monkeypatch):
    # a path under a regular file cannot be created, by root or anyone
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory\n")
    out = blocker / "sub" / "out"
    no_heavy_work(monkeypatch)
    assert cli_main(compress_args(tiny_checkpoint, out)) == 2
    error_line(capsys.readouterr().err, f"--out {str(out)!r}", "not a directory")
    assert blocker.read_text() == "not a directory\n"


def test_read_only_parent_is_refused_before_work(tiny_checkpoint, tmp_path, capsys,
                                                 monkeypatch, frozen):
    parent = tmp_path / "ro"
    parent.mkdir()
    frozen(parent)
    out = parent / "out"
    no_heavy_work(monkeypatch)
    assert cli_main(compress_args(tiny_checkpoint, out)) == 2
    line = error_line(capsys.readouterr().err, f"--out {str(out)!r}", "not writable")
    assert ".partial-" not in line and list(parent.iterdir()) == []


def test_read_only_existing_output_is_refused_before_work(tiny_checkpoint, tmp_path, capsys,
                                                          monkeypatch, frozen):
    out = tmp_path / "out"
    assert cli_main(compress_args(tiny_checkpoint, out)) == 0
    before = snapshot(out)
    capsys.readouterr()
    frozen(out)
    no_heavy_work(monkeypatch)
    assert cli_main(compress_args(tiny_checkpoint, out)) == 2
    error_line(capsys.readouterr().err, f"--out {str(out)!r}", "not writable")
    assert snapshot(out) == before and not partials(out)


def test_evaluate_output_in_read_only_directory(tiny_checkpoint, text_file, tmp_path, capsys,
                                                frozen):
    parent = tmp_path / "ro"
    parent.mkdir()
    frozen(parent)
    out = parent / "result.json"
    assert cli_main(["evaluate", "--model", str(tiny_checkpoint), "--out", str(out),
                     "--tasks", "", "--ppl-text", str(text_file)]) == 2
    error_line(capsys.readouterr().err, f"--out {str(out)!r}", "not writable")


# ---- a crafted training checkpoint --------------------------------------------------------
class _Payload:
    """What a crafted pickle would run on load (here: create a directory)."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (str(self.target),))


def test_crafted_trainable_pt_is_refused(tiny_checkpoint, text_file, tmp_path, capsys):
    out = tmp_path / "t"
    args = ["train", "--model", str(tiny_checkpoint), "--out", str(out), "--text",
            str(text_file), "--validation", "", "--tokens", str(32 * 4 * 2), "--seq-len",
            "32", "--micro-batch", "2", "--global-batch", "4", "--warmup", "1", "--bf16",
            "off", "--recipe", "lora", "--lora-rank", "2", "--checkpoint-every", "1",
            "--keep-checkpoint"]
    assert cli_main(args) == 0
    before = snapshot(out)
    trainable = tmp_path / "t.ckpt" / "trainable.pt"
    assert trainable.is_file()
    ran = tmp_path / "payload-ran"
    torch.save({"x": _Payload(ran)}, trainable)
    capsys.readouterr()
    assert cli_main(args) == 2
    line = error_line(capsys.readouterr().err, repr(str(trainable)), "refusing to load it")
    assert "weights_only=False" not in line and "weights_only" not in line
    assert not ran.exists()
    assert snapshot(out) == before and not partials(out)


def test_checkpoint_file_of_another_type_is_refused(tmp_path):
    from flexigpt.core.fileio import CheckpointError
    from flexigpt.runtime.training.checkpoint import _load_part

    path = tmp_path / "trainable.pt"
    torch.save([torch.zeros(2)], path)
    with pytest.raises(CheckpointError, match=r"trainable\.pt.*holds a list"):
        _load_part(path)
    path.write_bytes(b"garbage, not a checkpoint")
    with pytest.raises(CheckpointError, match=r"trainable\.pt.*refusing to load it"):
        _load_part(path)


# ---- text files: encoding, directories, recorded hashes -----------------------------------
def _non_utf8(path: Path) -> Path:
    path.write_bytes(b"A first document here.\xff and more words follow in it.\n\n" * 40)
    return path


@pytest.mark.parametrize("command", ["compress", "train", "evaluate"])
def test_non_utf8_text_names_file_and_position(command, tiny_checkpoint, tmp_path, capsys):
    bad = _non_utf8(tmp_path / "bad.txt")
    out = tmp_path / "out"
    args = {
        "compress": ["compress", "--method", "shortgpt", "--ratio", "0.25", "--model",
                     str(tiny_checkpoint), "--out", str(out), "--calibration", str(bad),
                     "--n-calibration", "1", "--seq-len", "32"],
        "train": ["train", "--model", str(tiny_checkpoint), "--out", str(out), "--text",
                  str(bad), "--validation", "", "--tokens", "128", "--seq-len", "32"],
        "evaluate": ["evaluate", "--model", str(tiny_checkpoint), "--out",
                     str(tmp_path / "r.json"), "--tasks", "", "--ppl-text", str(bad),
                     "--ppl-seq-len", "32"],
    }[command]
    assert cli_main(args) == 2
    error_line(capsys.readouterr().err, repr(str(bad)), "not UTF-8", "position 22", "0xff")
    assert not out.exists() and not partials(out)


def test_directory_as_calibration(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    folder = tmp_path / "texts"
    folder.mkdir()
    out = tmp_path / "out"
    no_heavy_work(monkeypatch)
    assert cli_main(["compress", "--method", "shortgpt", "--ratio", "0.25", "--model",
                     str(tiny_checkpoint), "--out", str(out), "--calibration",
                     str(folder)]) == 2
    error_line(capsys.readouterr().err, repr(str(folder)), "is a directory, not a text file")
    assert not out.exists()


def test_read_documents_of_a_directory():
    from flexigpt.methods.calibration import CalibrationDataError, read_documents

    with pytest.raises(CalibrationDataError, match="is a directory, not a text file"):
        read_documents(ROOT / "tests")


def _built(directory: Path, files: dict[str, str]) -> Path:
    """A resource-like directory written by ``atomic_directory`` (marker with sha256s)."""
    with atomic_directory(directory, kind="resource") as tmp:
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text, encoding="utf-8")
    assert (directory / MARKER).is_file()
    return directory


def test_edited_calibration_text_is_refused(tiny_checkpoint, tmp_path, capsys):
    from conftest import make_text

    texts = _built(tmp_path / "wiki", {"train.txt": make_text()})
    calib = texts / "train.txt"
    out = tmp_path / "out"
    args = ["compress", "--method", "shortgpt", "--ratio", "0.25", "--model",
            str(tiny_checkpoint), "--out", str(out), "--calibration", str(calib),
            "--n-calibration", "1", "--seq-len", "32"]
    assert cli_main(args) == 0  # as built: accepted
    before = snapshot(out)
    calib.write_text(make_text(seed=1), encoding="utf-8")
    capsys.readouterr()
    assert cli_main(args) == 2
    error_line(capsys.readouterr().err, repr(str(calib)), "changed since it was built",
               MARKER)
    assert snapshot(out) == before


def test_recorded_hash_is_checked_once_per_file_version(tmp_path, monkeypatch):
    import flexigpt.storage.input_files as inputs

    path = _built(tmp_path / "wiki", {"train.txt": "one document\n"}) / "train.txt"
    calls = []
    real = inputs.verify_files
    monkeypatch.setattr(inputs, "verify_files", lambda *a: calls.append(a) or real(*a))
    for _ in range(3):
        assert inputs.read_text(path) == "one document\n"
    assert len(calls) == 1
    path.write_text("one documenT\n")
    os.utime(path, ns=(1, 1))  # a new version, even within the same mtime tick
    with pytest.raises(inputs.InputFileError, match="changed since it was built"):
        inputs.read_text(path)
    unrecorded = tmp_path / "mine.txt"  # a user's own text: nothing recorded, read as is
    unrecorded.write_text("mine\n")
    assert inputs.read_text(unrecorded) == "mine\n"


# ---- benchmark JSONL: validated and verified before lm-eval reads it ----------------------
def _benchmarks(tmp_path: Path, rows_text: str) -> Path:
    return _built(tmp_path / "benchmarks", {"arc_easy/test.jsonl": rows_text})


def _evaluate_arc(model: Path, benchmarks: Path, out: Path) -> list[str]:
    return ["evaluate", "--model", str(model), "--out", str(out), "--tasks", "arc_easy",
            "--no-ppl", "--tasks-dir", str(benchmarks), "--limit", "1"]


@pytest.mark.parametrize("damage,words", [
    (lambda text: text[:-25], ["line 3", "not valid JSON", "truncated"]),
    (lambda text: text.replace('"q2"', '"q2", "extra": 1'), ["line 2", "keys"]),
    (lambda text: text + "[1, 2]\n", ["line 4", "not an object"]),
])
def test_malformed_benchmark_jsonl_names_file_and_line(damage, words, tiny_checkpoint,
                                                        tmp_path, capsys, monkeypatch):
    rows = [dict(ARC_ROW, id=f"q{i}") for i in range(1, 4)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    data = tmp_path / "loose" / "arc_easy" / "test.jsonl"  # no marker: only the format counts
    data.parent.mkdir(parents=True)
    data.write_text(damage(text), encoding="utf-8")
    import flexigpt.storage.artifacts

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(flexigpt.storage.artifacts, "load_compressed", refuse)
    out = tmp_path / "r.json"
    assert cli_main(_evaluate_arc(tiny_checkpoint, data.parent.parent, out)) == 2
    error_line(capsys.readouterr().err, repr(str(data)), *words)
    assert not out.exists()


def test_edited_benchmark_file_is_refused(tiny_checkpoint, tmp_path, capsys):
    from flexigpt.runtime.evaluation.tasks import TaskDataError, local_config

    text = "".join(json.dumps(dict(ARC_ROW, id=f"q{i}")) + "\n" for i in range(1, 4))
    benchmarks = _benchmarks(tmp_path, text)
    data = benchmarks / "arc_easy" / "test.jsonl"
    assert local_config("arc_easy", benchmarks).data_file == data.resolve()  # as built
    data.write_text(text.replace('"answerKey": "A"', '"answerKey": "B"', 1), encoding="utf-8")
    with pytest.raises(TaskDataError, match="changed since it was built"):
        local_config("arc_easy", benchmarks)
    out = tmp_path / "r.json"
    assert cli_main(_evaluate_arc(tiny_checkpoint, benchmarks, out)) == 2
    error_line(capsys.readouterr().err, repr(str(data)), "changed since it was built")
    assert not out.exists()


def test_valid_benchmark_with_blank_lines_is_accepted(tmp_path):
    from flexigpt.storage.input_files import check_jsonl

    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(ARC_ROW) + "\n\n" + json.dumps(dict(ARC_ROW, id="q2")) + "\n")
    assert check_jsonl(path) == path


# ---- the DAG's shell rules run the harness through Snakemake's interpreter ---------------
def _without_venv_path() -> dict[str, str]:
    """The environment with the venv's ``bin`` (and any ``flexigpt`` script) off ``PATH``."""
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and p != venv_bin and not (Path(p) / "flexigpt").exists())
    env.pop("VIRTUAL_ENV", None)
    env.pop("FLEXIGPT_PYTHON", None)
    return env


def test_shell_rules_run_the_harness_through_the_snakemake_interpreter(tmp_path):
    """Every shell command of the smoke DAG starts with ``"$FLEXIGPT_PYTHON" -m flexigpt``
    (a dry run with the venv off PATH), and no rule names a bare ``flexigpt``."""
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "-n", "-p",
         "--cores", "1", "--configfile", str(ROOT / "config" / "smoke.yaml")],
        cwd=tmp_path, env=_without_venv_path(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    commands = [line.split("Shell command: ", 1)[1] for line in done.stdout.splitlines()
                if line.startswith("Shell command: ") and line != "Shell command: None"]
    assert len(commands) >= 3  # wiki, task data, tiny model
    for command in commands:
        assert command.startswith('"$FLEXIGPT_PYTHON" -m flexigpt fetch '), command
    for rules in (ROOT / "workflow" / "rules").glob("*.smk"):
        for line in rules.read_text().splitlines():
            assert not line.strip().strip("'\"").startswith("flexigpt "), (rules, line)


def test_harness_python_is_the_snakemake_interpreter(monkeypatch):
    from flexigpt.cli.commands.run import PYTHON_VAR, export_harness_python

    monkeypatch.delenv(PYTHON_VAR, raising=False)
    assert export_harness_python(uses_conda=False) == sys.executable == os.environ[PYTHON_VAR]
    assert export_harness_python(uses_conda=True) == "python" == os.environ[PYTHON_VAR]


def test_python_m_flexigpt_needs_no_path(tmp_path):
    env = _without_venv_path()
    env["FLEXIGPT_PYTHON"] = sys.executable
    done = subprocess.run(["bash", "-c", '"$FLEXIGPT_PYTHON" -m flexigpt fetch --help'],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "command not found" not in done.stderr, done.stderr
    assert "tiny-llama" in done.stdout


@pytest.mark.slow
def test_resource_rule_runs_without_venv_on_path(tmp_path):
    """A real shell rule (the tiny Llama build) under ``python -m snakemake`` with the venv
    off ``PATH`` (~30 s)."""
    from conftest import make_text

    text = tmp_path / "resources" / "text" / "wiki" / "train.txt"
    text.parent.mkdir(parents=True)
    text.write_text(make_text())
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", "resources/models/tiny-llama", "--snakefile",
         str(ROOT / "Snakefile"), "--cores", "1", "--configfile",
         str(ROOT / "config" / "smoke.yaml")],
        cwd=tmp_path, env=_without_venv_path(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "resources" / "models" / "tiny-llama" / "config.json").is_file()


# ---- one line for what would leave a user guessing ----------------------------------------
def _interrupt_in(monkeypatch, module: str, attribute: str, then: BaseException | None):
    """Make ``module.attribute`` raise Ctrl-C (and, with ``then``, fail with ``then`` while
    Ctrl-C is handled, as a library's clean-up may)."""
    import importlib

    def interrupt(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        finally:
            if then is not None:
                raise then

    monkeypatch.setattr(importlib.import_module(module), attribute, interrupt)


@pytest.mark.parametrize("command,attribute,then", [
    ("evaluate", "run", TypeError("'NoneType' object is not callable")),
    ("evaluate", "add_arguments", None),  # while the command's flags are being built
    ("train", "run", AttributeError("clean-up failed")),
    ("compress", "run", None),
])
def test_ctrl_c_is_one_line(monkeypatch, capsys, tmp_path, command, attribute, then):
    """Ctrl-C ends any command with one line saying what was kept, exit 130: also while
    the command's modules load and its flags are built, and when a clean-up fails on the
    way out (no traceback)."""
    _interrupt_in(monkeypatch, f"flexigpt.cli.commands.{command}", attribute, then)
    out = tmp_path / "out"
    argv = {"evaluate": ["evaluate", "--model", "m", "--out", str(out / "r.json")],
            "train": ["train", "--model", "m", "--out", str(out), "--tokens", "8"],
            "compress": ["compress", "--method", "dense", "--model", "m", "--out", str(out)]}
    monkeypatch.setattr("flexigpt.cli._preflight", lambda args: None)
    assert cli_main(argv[command]) == 130
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(f"flexigpt {command}: interrupted; "), err
    if attribute == "run":
        assert str(out) in err[0] and "nothing was written" in err[0], err


def test_damaged_weights_file_is_named(tiny_checkpoint, text_file, capsys, tmp_path):
    """A truncated or header-only ``model.safetensors`` is one line naming the file and
    what is wrong, not the library's raw deserialisation error."""
    weights = tiny_checkpoint / "model.safetensors"
    data = weights.read_bytes()
    length = int.from_bytes(data[:8], "little")
    argv = ["evaluate", "--model", str(tiny_checkpoint), "--out", str(tmp_path / "r.json"),
            "--tasks", "", "--ppl-text", str(text_file), "--ppl-seq-len", "16",
            "--ppl-windows", "1", "--batch-size", "1"]
    for cut, words in ((8 + length, "truncated"), (len(data) // 2, "truncated"),
                       (8 + length // 2, "header claims")):
        weights.write_bytes(data[:cut])
        capsys.readouterr()
        assert cli_main(argv) == 2
        error_line(capsys.readouterr().err, repr(str(weights)), "damaged", words)


def test_unknown_architecture_names_the_supported_families(tiny_checkpoint, text_file, capsys,
                                                             tmp_path):
    """A model type transformers does not know is refused naming the families the harness
    supports, not with transformers' advice to install it from source."""
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    config["model_type"] = "made_up_family"
    (tiny_checkpoint / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert cli_main(["evaluate", "--model", str(tiny_checkpoint), "--out",
                     str(tmp_path / "r.json"), "--tasks", "", "--ppl-text",
                     str(text_file)]) == 2
    line = error_line(capsys.readouterr().err, "made_up_family", "llama", "opt")
    assert "source" not in line


@pytest.mark.parametrize("command", ["compress", "train", "evaluate"])
def test_a_text_of_control_characters_is_refused(tiny_checkpoint, capsys, tmp_path, command):
    """NUL bytes are valid UTF-8 but no text: refused as training, calibration and
    perplexity text, before any work."""
    text = tmp_path / "nul.txt"
    text.write_bytes(b"\0" * 4000 + b"a few words\n")
    out = tmp_path / "out"
    argv = {"compress": compress_args(tiny_checkpoint, out, "--calibration", str(text)),
            "train": ["train", "--model", str(tiny_checkpoint), "--out", str(out), "--tokens",
                      "64", "--text", str(text), "--validation", "", "--recipe", "lora"],
            "evaluate": ["evaluate", "--model", str(tiny_checkpoint), "--out",
                         str(out / "r.json"), "--tasks", "", "--ppl-text", str(text)]}[command]
    capsys.readouterr()
    assert cli_main(argv) == 2
    error_line(capsys.readouterr().err, repr(str(text)), "control characters")
    assert not out.exists()
