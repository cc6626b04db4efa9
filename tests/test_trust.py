"""Checkpoint trust (issue 37): loading never runs a directory's code or unpickles its files,
reads no file a save did not record and no path outside the directory. Every refusal is one
line (exit code 2 on the CLI), and every payload planted here would create a file that must
never appear. Tiny random models; seconds each."""

from __future__ import annotations

import ast
import builtins
import json
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, make_model, make_text, manifest_for

from flexigpt.cli import main as cli_main
from flexigpt.core.fileio import (
    MANIFEST,
    MARKER,
    CheckpointError,
    atomic_directory,
    sha256_file,
    verify_marker,
)
from flexigpt.core.fileio import outputs as fileio_outputs
from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.storage.artifacts import load_compressed, read_manifest
from flexigpt.storage.manifest import manifest_hash
from flexigpt.storage.models.checkpoint_format import MODELING_FILE
from flexigpt.storage.models.loading import ModelLoadError, family_config, load_model
from flexigpt.storage.registry import get_method

pytestmark = pytest.mark.usefixtures("single_thread")

BI = [0.4, 0.1, 0.2, 0.3]  # precomputed Block Influence: no calibration forward needed


# ---- fixtures and helpers ----------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_root(tmp_path_factory, tiny_tokenizer) -> Path:
    """A FlexiGPT-compressed tiny Llama (self-contained: auto_map + modeling file) and a
    plain one (dense), each saved once; tests tamper with copies."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("trust")
    try:
        spec = get_method("flexigpt")
        with torch.no_grad():
            res = spec.compress(make_model(), tiny_tokenizer, None,
                                spec.make_config(ratio=0.5, bi_scores=BI))
        save_compressed(res.model, tiny_tokenizer,
                        manifest_for("flexigpt", res.structure, res.info), root / "flexigpt")
        dense = make_model()
        save_compressed(dense, tiny_tokenizer, manifest_for("dense", model=dense), root / "dense")
    finally:
        torch.set_num_threads(before)
    return root


@pytest.fixture
def saved(saved_root, tmp_path) -> Path:
    """A private copy of the saved FlexiGPT model (free to tamper with)."""
    return Path(shutil.copytree(saved_root / "flexigpt", tmp_path / "model"))


@pytest.fixture
def prompt(monkeypatch) -> list[str]:
    """transformers' remote-code prompt, answered "y" on a terminal: stdin is a tty and
    ``input`` (what ``resolve_trust_remote_code`` calls) says yes. Returns the questions
    asked (must stay empty)."""
    asked: list[str] = []

    def answer_yes(question: str = "") -> str:
        asked.append(question)
        return "y"

    monkeypatch.setattr(builtins, "input", answer_yes)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    return asked


def _payload(tmp_path: Path, name: str = "pwned") -> tuple[Path, str]:
    """A file that a planted payload creates, and the Python statement that creates it."""
    target = tmp_path / name
    return target, f"\nopen({str(target)!r}, 'w').close()\n"


def _rewrite_manifest(model_dir: Path, edit) -> None:
    data = json.loads((model_dir / MANIFEST).read_text())
    edit(data)
    (model_dir / MANIFEST).write_text(json.dumps(data, indent=2, sort_keys=True))


def _evaluate(model_dir: Path, tmp_path: Path) -> int:
    """``flexigpt evaluate --model DIR`` (perplexity on one short window, no tasks)."""
    text = tmp_path / "heldout.txt"
    text.write_text(make_text(n_docs=4))
    return cli_main(["evaluate", "--model", str(model_dir), "--out", str(tmp_path / "r.json"),
                     "--tasks", "", "--ppl-text", str(text), "--ppl-seq-len", "16",
                     "--ppl-windows", "1"])


def _one_error_line(err: str, *words: str) -> str:
    """Exactly one error line, no traceback, naming ``words``; returns it."""
    lines = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def test_intact_model_evaluates(saved, tmp_path, capsys):
    """The control: the untouched copy loads and evaluates (so refusals below are the
    tampering's, not the setup's)."""
    assert _evaluate(saved, tmp_path) == 0
    assert json.loads((tmp_path / "r.json").read_text())["manifest_hash"] == manifest_hash(
        read_manifest(saved))


# ---- 1. remote code never runs, transformers never asks --------------------------------------
def _plant_remote_code(model_dir: Path, tmp_path: Path) -> Path:
    """The probe: a payload appended to the modeling file, manifest and marker deleted."""
    target, code = _payload(tmp_path)
    with open(model_dir / MODELING_FILE, "a") as fh:
        fh.write(code)
    (model_dir / MANIFEST).unlink()
    (model_dir / MARKER).unlink()
    return target


def test_the_planted_payload_is_live(saved, tmp_path, prompt):
    """Without the harness, transformers asks and the payload runs on "y": the probe is real."""
    from transformers import AutoConfig

    target = _plant_remote_code(saved, tmp_path)
    AutoConfig.from_pretrained(saved)
    assert prompt and "custom code" in prompt[0] and target.exists()


def test_evaluate_refuses_remote_code_without_asking(saved, tmp_path, prompt, capsys):
    target = _plant_remote_code(saved, tmp_path)
    assert _evaluate(saved, tmp_path) == 2
    _one_error_line(capsys.readouterr().err, "ModelLoadError", str(saved), "needs remote code",
                    MODELING_FILE, "never runs")
    assert prompt == [] and not target.exists() and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("loader", [load_model, load_compressed])
def test_loaders_refuse_remote_code(saved, tmp_path, prompt, loader):
    target = _plant_remote_code(saved, tmp_path)
    with pytest.raises(ModelLoadError, match="needs remote code"):
        loader(saved)
    assert prompt == [] and not target.exists()


def test_family_config_refuses_remote_code(saved, tmp_path, prompt):
    """``flexigpt train``'s preflight reads the config: a config that is not the harness's
    own format (no ``flexigpt_compression``) and asks for remote code is refused; the
    harness's own is rebuilt from the family class without running the file."""
    target = _plant_remote_code(saved, tmp_path)
    assert family_config(saved).model_type == "llama" and not target.exists()
    cfg = json.loads((saved / "config.json").read_text())
    del cfg["flexigpt_compression"]
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="needs remote code"):
        family_config(saved)
    assert prompt == [] and not target.exists()


def test_tokenizer_remote_code_is_refused(saved_root, tmp_path, prompt, capsys):
    """A tokenizer_config.json auto_map (plain checkpoint, and a saved model whose list
    records it) is refused too, before transformers could ask."""
    target, code = _payload(tmp_path)
    plain = tmp_path / "plain"
    make_model().save_pretrained(plain)
    shutil.copy(saved_root / "dense" / "tokenizer.json", plain)
    cfg = json.loads((saved_root / "dense" / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": [None, "tok_code.EvilTokenizer"]}
    (plain / "tokenizer_config.json").write_text(json.dumps(cfg))
    (plain / "tok_code.py").write_text(code)
    assert _evaluate(plain, tmp_path) == 2
    _one_error_line(capsys.readouterr().err, "needs remote code", "tokenizer_config.json",
                    "tok_code.py")
    saved = Path(shutil.copytree(saved_root / "dense", tmp_path / "saved"))
    (saved / "tokenizer_config.json").write_text(json.dumps(cfg))
    (saved / "tok_code.py").write_text(code)
    _rewrite_manifest(saved, lambda d: d["files"].update({
        "tokenizer_config.json": sha256_file(saved / "tokenizer_config.json"),
        "tok_code.py": sha256_file(saved / "tok_code.py")}))
    with pytest.raises(ModelLoadError, match="tokenizer_config.json auto_map"):
        load_compressed(saved)
    assert prompt == [] and not target.exists()


def test_flexigpt_model_without_manifest_says_so(saved, tmp_path):
    """The same directory without auto_map (remote_code false) names what is missing."""
    cfg = json.loads((saved / "config.json").read_text())
    del cfg["auto_map"]
    (saved / "config.json").write_text(json.dumps(cfg))
    (saved / MANIFEST).unlink()
    (saved / MARKER).unlink()
    with pytest.raises(ModelLoadError, match="without its manifest.json"):
        load_model(saved)


def test_every_harness_from_pretrained_refuses_remote_code():
    """Every ``from_pretrained(`` call of the harness passes ``trust_remote_code=False``
    (``benchmarks/check_loadable.py`` checks the remote code itself, on purpose)."""
    deliberate = {ROOT / "benchmarks" / "check_loadable.py"}
    missing = []
    for folder in ("flexigpt", "baselines", "workflow/scripts", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in deliberate:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "from_pretrained"):
                    kw = {k.arg: k.value for k in node.keywords}
                    value = kw.get("trust_remote_code")
                    if not (isinstance(value, ast.Constant) and value.value is False):
                        missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert missing == []


# ---- 2. files added after the save are refused ------------------------------------------------
def _plant_tokenizer_files(model_dir: Path) -> list[str]:
    """BOS/EOS swapped, an added token, a chat template: files transformers reads."""
    (model_dir / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "</s>", "eos_token": "<s>", "pad_token": "<pad>"}))
    (model_dir / "added_tokens.json").write_text(json.dumps({"<evil>": 300}))
    (model_dir / "chat_template.jinja").write_text("{{ messages }}")
    return ["added_tokens.json", "chat_template.jinja", "special_tokens_map.json"]


def test_load_compressed_refuses_files_added_after_the_save(saved):
    names = _plant_tokenizer_files(saved)
    with pytest.raises(CheckpointError) as err:
        load_compressed(saved)
    assert str(saved) in str(err.value) and "manifest.json does not list" in str(err.value)
    for name in names:
        assert name in str(err.value)


def test_evaluate_refuses_files_added_after_the_save(saved, tmp_path, capsys):
    names = _plant_tokenizer_files(saved)
    assert _evaluate(saved, tmp_path) == 2
    _one_error_line(capsys.readouterr().err, "CheckpointError", str(saved), *names)
    assert not (tmp_path / "r.json").exists()


def test_a_nested_added_file_is_refused(saved):
    (saved / "additional_chat_templates").mkdir()
    (saved / "additional_chat_templates" / "x.jinja").write_text("{{ evil }}")
    with pytest.raises(CheckpointError, match="additional_chat_templates/x.jinja"):
        load_compressed(saved)


def test_records_beside_the_model_are_allowed(saved, tiny_tokenizer):
    """What the harness writes after the manifest (card rewrite, training records) loads."""
    (saved / "README.md").write_text("# rewritten card\n")
    for name in ("train_log.csv", "loss_curve.png", "selection.json"):
        (saved / name).write_text("record\n")
    loaded = load_compressed(saved)
    assert loaded.tokenizer.bos_token == tiny_tokenizer.bos_token


def test_harness_output_without_manifest_refuses_unlisted_files(saved_root, tmp_path):
    """A marker-written directory (resources, exports) loads through load_model: its marker
    is its list."""
    out = tmp_path / "resource"
    with atomic_directory(out, kind="resource") as tmp:
        make_model().save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(saved_root / "dense" / name, tmp)
    load_model(out)
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": "</s>"}))
    with pytest.raises(CheckpointError) as err:
        load_model(out)
    assert "special_tokens_map.json" in str(err.value) and MARKER in str(err.value)
    (out / "special_tokens_map.json").unlink()
    marker = json.loads((out / MARKER).read_text())
    marker["files"]["../outside.txt"] = "0" * 64
    (out / MARKER).write_text(json.dumps(marker))
    with pytest.raises(CheckpointError, match="outside the directory"):
        verify_marker(out)


def test_manifest_without_file_list_needs_verify_false(saved, tmp_path):
    """An older manifest (saved before ``files``) cannot tell its own files from added ones:
    refused with what to do; ``verify=False`` loads it and a new save records the list."""
    _rewrite_manifest(saved, lambda d: d.pop("files"))
    with pytest.raises(CheckpointError, match=r"no file list.*verify=False"):
        load_compressed(saved)
    loaded = load_compressed(saved, verify=False)
    again = save_compressed(loaded.model, loaded.tokenizer, loaded.manifest, tmp_path / "again")
    assert "config.json" in again.files
    load_compressed(tmp_path / "again")


# ---- 3. manifest paths stay inside the directory ---------------------------------------------
@pytest.fixture
def hashed(monkeypatch) -> list[Path]:
    """Every path the loader hashes (must never be outside the model directory)."""
    seen: list[Path] = []
    real = fileio_outputs.cached_sha256

    def spy(path):
        seen.append(Path(path).resolve())
        return real(path)

    monkeypatch.setattr(fileio_outputs, "cached_sha256", spy)
    return seen


def test_weights_outside_the_directory_are_refused(saved_root, tmp_path, hashed, capsys):
    """The probe: ``weights.file: ../../other/model.safetensors`` with its sha256 and size."""
    other = tmp_path / "x" / "other"
    shutil.copytree(saved_root / "flexigpt", other)
    model = Path(shutil.copytree(saved_root / "flexigpt", tmp_path / "a" / "b" / "model"))
    foreign = other / "model.safetensors"
    _rewrite_manifest(model, lambda d: d["weights"].update(
        file="../../../x/other/model.safetensors", sha256=sha256_file(foreign),
        bytes=foreign.stat().st_size))
    hashed.clear()
    with pytest.raises(CheckpointError, match=r"weights.file '\.\./\.\./\.\./x/other"):
        load_compressed(model)
    assert _evaluate(model, tmp_path) == 2
    _one_error_line(capsys.readouterr().err, "CheckpointError", "not a path inside")
    assert all(p.is_relative_to(model.resolve()) for p in hashed), hashed


@pytest.mark.parametrize("name", ["../secret.txt", "../absent.txt", "/etc/hostname",
                                  "sub/../../secret.txt"])
def test_files_outside_the_directory_are_neither_hashed_nor_probed(saved, tmp_path, hashed,
                                                                   name):
    """An outside ``files`` entry is refused before hashing, with the same message whether
    or not the path exists."""
    (tmp_path / "secret.txt").write_text("secret")
    _rewrite_manifest(saved, lambda d: d["files"].update({name: "0" * 64}))
    hashed.clear()
    with pytest.raises(CheckpointError) as err:
        load_compressed(saved)
    assert "not a path inside the model directory" in str(err.value)
    assert "missing" not in str(err.value) and "changed" not in str(err.value)
    assert all(p.is_relative_to(saved.resolve()) for p in hashed), hashed


def test_symlink_out_of_the_directory_is_refused(saved, tmp_path, hashed):
    """A listed file replaced by a symlink to an outside file (sha256 updated) is refused."""
    outside = tmp_path / "tokenizer.json"
    shutil.copy(saved / "tokenizer.json", outside)
    (saved / "tokenizer.json").unlink()
    (saved / "tokenizer.json").symlink_to(outside)
    _rewrite_manifest(saved, lambda d: d["files"].update({"tokenizer.json": sha256_file(outside)}))
    hashed.clear()
    with pytest.raises(CheckpointError, match=r"\['tokenizer.json'\] outside the directory"):
        load_compressed(saved)
    assert all(p.is_relative_to(saved.resolve()) for p in hashed), hashed


# ---- 4. pickled weights are refused before torch sees them -----------------------------------
class _Payload:
    """Unpickling it creates ``target`` (what a malicious pytorch_model.bin could do)."""

    def __init__(self, target: Path):
        self.target = str(target)

    def __reduce__(self):
        return open, (self.target, "w")


@pytest.fixture
def no_torch_load(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = torch.load

    def spy(f, *args, **kwargs):
        calls.append(str(f))
        return real(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    return calls


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.pth",
                                  "model.ckpt", "model.pkl"])
def test_pickled_weights_are_refused(saved_root, tmp_path, name, no_torch_load, capsys):
    target = tmp_path / "pwned"
    plain = tmp_path / "plain"
    make_model().save_pretrained(plain)
    for tok in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(saved_root / "dense" / tok, plain)
    (plain / "model.safetensors").unlink()
    (plain / name).write_bytes(pickle.dumps(_Payload(target)))
    with pytest.raises(ModelLoadError, match="safetensors only") as err:
        load_model(plain)
    assert name in str(err.value) and str(plain) in str(err.value)
    assert _evaluate(plain, tmp_path) == 2
    _one_error_line(capsys.readouterr().err, "ModelLoadError", name, "safetensors only")
    assert no_torch_load == [] and not target.exists()


def test_manifest_naming_pickled_weights_is_refused(saved, tmp_path, no_torch_load):
    target = tmp_path / "pwned"
    (saved / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(target)))
    _rewrite_manifest(saved, lambda d: d["weights"].update(
        file="pytorch_model.bin", sha256=sha256_file(saved / "pytorch_model.bin"),
        bytes=(saved / "pytorch_model.bin").stat().st_size))
    with pytest.raises(CheckpointError, match="not safetensors"):
        load_compressed(saved)
    assert no_torch_load == [] and not target.exists()


def test_hub_loads_ask_for_safetensors_only(monkeypatch, tmp_path, saved_root):
    """The model loader passes ``use_safetensors=True`` and ``trust_remote_code=False``."""
    from transformers import AutoModelForCausalLM

    seen = {}
    real = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    plain = tmp_path / "plain"
    make_model().save_pretrained(plain)
    for tok in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(saved_root / "dense" / tok, plain)
    load_model(plain)
    assert seen["use_safetensors"] is True and seen["trust_remote_code"] is False


def test_errors_are_the_cli_user_errors():
    from flexigpt.cli import USER_ERRORS

    assert issubclass(ModelLoadError, USER_ERRORS) and issubclass(CheckpointError, USER_ERRORS)
