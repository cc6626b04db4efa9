"""Issue 19 probes as regression tests: outputs never destroy what they did not create,
integrity of the whole checkpoint, byte-identical reruns, rank too large to compress, and
one clear line (exit code 2) for every user error. Tiny random models; seconds each."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers
from conftest import make_model, manifest_for, refusing, without_keys

import flexigpt.storage.models.loading as loading
from flexigpt.api.compression import compress as api_compress
from flexigpt.cli import main as cli_main
from flexigpt.core.fileio import (
    MARKER,
    CheckpointError,
    OutputExistsError,
    atomic_directory,
    atomic_write_text,
    sha256_file,
)
from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.storage.artifacts import load_compressed
from flexigpt.storage.manifest import VOLATILE_KEYS, Manifest, manifest_hash
from flexigpt.storage.models.loading import ModelLoadError, load_model
from flexigpt.storage.registry import get_method

pytestmark = pytest.mark.usefixtures("single_thread")

CALIB = torch.randint(3, 300, (4, 24), generator=torch.Generator().manual_seed(0))
CALIB[:, 0] = 0
BI = [0.4, 0.1, 0.2, 0.3]  # precomputed Block Influence: no calibration forward needed
NO_WEIGHTS = refusing("model weights loaded before the check that refuses the command")


def _flexigpt(tiny_tokenizer, out: Path, **options) -> dict:
    spec = get_method("flexigpt")
    model = make_model()
    with torch.no_grad():
        res = spec.compress(model, tiny_tokenizer, None,
                            spec.make_config(**{"ratio": 0.5, "bi_scores": BI, **options}))
    return save_compressed(res.model, tiny_tokenizer,
                           manifest_for("flexigpt", res.structure, res.info), out)


def _foreign(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("mine")
    (path / "sub").mkdir()
    (path / "sub" / "data.bin").write_bytes(b"\x00\x01")
    return path


def _intact(path: Path) -> bool:
    return (path / "notes.txt").read_text() == "mine" and (path / "sub/data.bin").is_file()


def _one_error_line(err: str, *words: str) -> None:
    """Exactly one error line (progress bars aside), no traceback, naming ``words``."""
    lines = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], (word, lines[0])


# ---- 1. outputs never destroy what they did not create ----------------------------------
def test_existing_foreign_out_is_refused_and_kept(tiny_model, tiny_tokenizer, tmp_path):
    out = _foreign(tmp_path / "out")
    with pytest.raises(OutputExistsError, match=r"--force") as info:
        save_compressed(tiny_model, tiny_tokenizer, manifest_for(), out)
    assert str(out) in str(info.value) and isinstance(info.value, ValueError)
    assert _intact(out)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no partial left either
    # a plain atomic_directory caller too
    with pytest.raises(OutputExistsError), atomic_directory(out) as tmp:
        (tmp / "x").write_text("x")
    assert _intact(out)
    # force replaces, atomically
    save_compressed(tiny_model, tiny_tokenizer, manifest_for(), out,
                    force=True)
    assert not (out / "notes.txt").exists() and (out / "manifest.json").is_file()
    assert load_compressed(out).manifest.method == "dense"


def test_previous_output_is_replaced_but_not_user_additions(tiny_model, tiny_tokenizer,
                                                            tmp_path):
    out = tmp_path / "m"
    save_compressed(tiny_model, tiny_tokenizer, manifest_for(), out)
    save_compressed(tiny_model, tiny_tokenizer, manifest_for(), out)
    (out / "my_notes.txt").write_text("keep me")
    with pytest.raises(OutputExistsError, match="my_notes.txt"):
        save_compressed(tiny_model, tiny_tokenizer, manifest_for(), out)
    assert (out / "my_notes.txt").read_text() == "keep me"
    # an export must not replace a saved model (another kind of output)
    (out / "my_notes.txt").unlink()
    with pytest.raises(OutputExistsError, match="not a export"), \
            atomic_directory(out, kind="export"):
        pass


def test_cli_refuses_foreign_out_before_work_and_force_replaces(tiny_checkpoint, text_file,
                                                                tmp_path, capsys, monkeypatch):
    out = _foreign(tmp_path / "out")
    args = ["compress", "--method", "shortgpt", "--model", str(tiny_checkpoint), "--out",
            str(out), "--ratio", "0.25", "--calibration", str(text_file), "--n-calibration",
            "2", "--seq-len", "16"]
    with monkeypatch.context() as m:  # refused before any weights are loaded
        m.setattr(transformers.AutoModelForCausalLM, "from_pretrained", NO_WEIGHTS)
        assert cli_main(args) == 2
    _one_error_line(capsys.readouterr().err, "OutputExistsError", str(out), "--force")
    assert _intact(out)
    for command in (["extend", "--model", str(tiny_checkpoint), "--layers", "6"],
                    ["train", "--model", str(tiny_checkpoint), "--tokens", "64",
                     "--text", str(text_file)]):
        assert cli_main([*command, "--out", str(out)]) == 2
        _one_error_line(capsys.readouterr().err, "OutputExistsError")
        assert _intact(out)
    assert cli_main(["export", str(tiny_checkpoint), "--out", str(out)]) == 2
    assert _intact(out)
    capsys.readouterr()
    assert cli_main([*args, "--force"]) == 0
    assert not (out / "notes.txt").exists()
    assert cli_main(args) == 0  # its own previous output: replaced without --force


def test_partials_of_interrupted_saves_are_cleaned(tiny_model, tmp_path):
    out = tmp_path / "m"
    dead = tmp_path / ".m.partial-999999999-abcd"  # pid that cannot be alive
    legacy = tmp_path / ".m.partial-k3j4h5"  # written before pids were in the name
    alive = tmp_path / f".m.partial-{os.getppid()}-live"  # another live writer: kept
    for p in (dead, legacy, alive):
        p.mkdir()
        (p / "model.safetensors").write_bytes(b"0" * 100)
        (p / MARKER).write_text('{"staging": 1}')  # the stamp every staging folder gets
    other = tmp_path / ".n.partial-999999999-abcd"  # another output's partial: not ours
    other.mkdir()
    foreign = tmp_path / ".m.partial-999999999-mine.old-1234"  # the user's, by its name only
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    save_compressed(tiny_model, None, manifest_for(), out)
    assert not dead.exists() and not legacy.exists()
    assert alive.exists() and other.exists() and out.is_dir()
    assert (foreign / "notes.txt").read_text() == "mine"  # no marker: never deleted


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_outputs_follow_the_umask(tiny_model, tiny_tokenizer, tmp_path, mask):
    before = os.umask(mask)
    try:
        save_compressed(tiny_model, tiny_tokenizer, manifest_for(),
                        tmp_path / "m")
        atomic_write_text(tmp_path / "r.json", "{}")
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "m").stat().st_mode) == 0o777 & ~mask
    for f in (tmp_path / "m").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~mask, f.name
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o666 & ~mask


# ---- 2. integrity of the whole checkpoint -----------------------------------------------
def _strip(manifest):
    return without_keys(manifest, VOLATILE_KEYS)


def test_identical_compress_runs_are_byte_identical(tiny_checkpoint, text_file, tmp_path):
    manifests = []
    for run in ("a", "b"):
        manifests.append(api_compress(
            "flexigpt", tiny_checkpoint, tmp_path / run, options={"ratio": 0.5},
            calibration=str(text_file), n_calibration=2, calibration_seq_len=16))
    a, b = tmp_path / "a", tmp_path / "b"
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and MARKER in names
    for name in names:  # the manifest, the card and the marker hold the run's timestamp
        if name in ("manifest.json", MARKER, "README.md"):
            continue
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    card_a, card_b = ([line for line in (d / "README.md").read_text().splitlines()
                       if not line.startswith("- created ")] for d in (a, b))
    assert card_a == card_b
    marker_a, marker_b = (json.loads((d / MARKER).read_text()) for d in (a, b))
    for marker in (marker_a, marker_b):
        del marker["files"]["manifest.json"], marker["files"]["README.md"]
    assert marker_a == marker_b
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    assert _strip(ma) == _strip(mb)  # only timestamps / timings may differ
    assert ma["weights"]["sha256"] == mb["weights"]["sha256"]
    assert ma["weights"]["shared"] and "config.json" in ma["files"]
    ta, tb = Manifest.from_dict(ma), Manifest.from_dict(mb)
    assert manifest_hash(ta) == manifest_hash(tb) == manifest_hash(manifests[0])
    assert manifest_hash(replace(ta, created="x")) == manifest_hash(ta)
    assert manifest_hash(replace(ta, structure={**ta.structure, "prenorm": "share"})) != \
        manifest_hash(ta)


def test_edited_manifest_structure_is_refused(tiny_tokenizer, tmp_path):
    out = tmp_path / "m"
    _flexigpt(tiny_tokenizer, out)
    good = json.loads((out / "manifest.json").read_text())
    i, j = next(iter(good["structure"]["base_map"].items()))
    other = next(b for b in range(4) if b != j and b not in good["structure"]["pruned_blocks"])
    edited = json.loads(json.dumps(good))
    edited["structure"]["base_map"][i] = other
    (out / "manifest.json").write_text(json.dumps(edited))
    with pytest.raises(CheckpointError, match="base_map"):
        load_compressed(out)
    # edited consistently in manifest (structure and info) and config.json (and the
    # recorded sha updated): the weights' sharing still gives it away
    edited["info"]["base_map"] = edited["structure"]["base_map"]
    cfg = json.loads((out / "config.json").read_text())
    cfg["flexigpt_compression"]["structure"] = edited["structure"]
    (out / "config.json").write_text(json.dumps(cfg))
    edited["files"]["config.json"] = sha256_file(out / "config.json")
    (out / "manifest.json").write_text(json.dumps(edited))
    with pytest.raises(CheckpointError, match="sharing"):
        load_compressed(out)
    # config.json edited alone: its recorded sha256
    (out / "manifest.json").write_text(json.dumps(good))
    with pytest.raises(CheckpointError, match=r"config\.json.*changed"):
        load_compressed(out)


def test_flipped_byte_in_plain_checkpoint_is_refused(tiny_model, tiny_tokenizer, tmp_path):
    out = tmp_path / "plain"
    with atomic_directory(out) as tmp:  # how resources and exports are written
        tiny_model.save_pretrained(tmp)
        tiny_tokenizer.save_pretrained(tmp)
    assert load_compressed(out).manifest is None
    weights = out / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*changed"):
        load_compressed(out)
    with pytest.raises(CheckpointError):
        load_model(out)


# ---- 3. rank above what can compress ---------------------------------------------------
def test_rank_too_large_names_the_largest_useful_rank(tiny_checkpoint, text_file, tmp_path,
                                                      capsys):
    from flexigpt.methods.surgery import check_flexigpt_rank

    spec = get_method("flexigpt")
    model = make_model()
    with pytest.raises(ValueError, match=r"largest useful rank for this model is (\d+)") as e:
        check_flexigpt_rank(model, spec.make_config(rank=5000))
    best = int(re.search(r"is (\d+)", str(e.value)).group(1))
    check_flexigpt_rank(model, spec.make_config(rank=best))
    with pytest.raises(ValueError, match=f"rank {best + 1} is too large"):
        check_flexigpt_rank(model, spec.make_config(rank=best + 1))
    manifest = api_compress("flexigpt", tiny_checkpoint, tmp_path / "ok",
                            options={"ratio": 0.5, "rank": best, "bi_scores": BI},
                            calibration=str(text_file), n_calibration=2, calibration_seq_len=16,
                            accept_ratio_miss=True)
    assert manifest.parameters.achieved_ratio > 0
    out = tmp_path / "big"
    assert cli_main(["compress", "--method", "flexigpt", "--model", str(tiny_checkpoint),
                     "--out", str(out), "--rank", "5000", "--calibration", str(text_file)]) == 2
    _one_error_line(capsys.readouterr().err, "largest useful rank", str(best))
    assert not out.exists()


# ---- 4. every error one clear line, exit code 2 ----------------------------------------
@pytest.mark.parametrize("text,words", [
    ("{not json", ["not valid JSON"]), ("[1, 2]", ["not a manifest", "list"]),
    ('{"structure": {}}', ["'method'"]), ('{"method": "dense"}', ["'structure'"])])
def test_bad_manifest_is_one_line(tiny_model, tmp_path, capsys, text, words):
    out = tmp_path / "m"
    save_compressed(tiny_model, None, manifest_for(), out)
    (out / "manifest.json").write_text(text)
    with pytest.raises(CheckpointError):
        load_compressed(out)
    assert cli_main(["export", str(out), "--out", str(tmp_path / "e")]) == 2
    _one_error_line(capsys.readouterr().err, "CheckpointError", *words)


def test_divergence_is_one_line(tiny_checkpoint, text_file, tmp_path, capsys, monkeypatch):
    import flexigpt.runtime.training as training

    def diverge(*args, **kwargs):
        raise training.TrainingDivergedError("loss is nan at step 3 (lr 0.1); lower the LR")

    monkeypatch.setattr(training, "train_model", diverge)
    assert cli_main(["train", "--model", str(tiny_checkpoint), "--out", str(tmp_path / "t"),
                     "--tokens", "64", "--text", str(text_file), "--recipe", "full"]) == 2
    _one_error_line(capsys.readouterr().err, "TrainingDivergedError", "step 3")


def test_train_seq_len_beyond_positions_is_refused(tiny_checkpoint, text_file, tmp_path,
                                                   capsys, monkeypatch):
    out = tmp_path / "t"
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", NO_WEIGHTS)
    assert cli_main(["train", "--model", str(tiny_checkpoint), "--out", str(out), "--tokens",
                     "10000", "--seq-len", "4096", "--text", str(text_file)]) == 2
    _one_error_line(capsys.readouterr().err, "--seq-len 4096", "512 positions")
    assert not out.exists()


def test_calibration_seq_len_beyond_positions_is_refused(tiny_checkpoint, text_file, tmp_path):
    with pytest.raises(ValueError, match="512 positions"):
        api_compress("shortgpt", tiny_checkpoint, tmp_path / "c", options={"ratio": 0.25},
                     calibration=str(text_file), n_calibration=1, calibration_seq_len=1024)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("spec", ["resources/models/nope", "./nope", str(Path("/nope/x"))])
def test_local_looking_missing_path_is_not_a_hub_lookup(spec, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # any hub call would fail slowly
    for name in ("_hub_config", "hub_reachable"):
        monkeypatch.setattr(loading, name, refusing("a local-looking path looked up on the hub"))
    with pytest.raises(ModelLoadError, match="it does not exist.*not looked up on the hub"):
        load_model(spec)


@pytest.mark.parametrize("env,words", [
    ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE"),
    ({"HF_ENDPOINT": "http://127.0.0.1:9"}, "unreachable")])
def test_unreachable_hub_is_one_fast_message(env, words, monkeypatch, tmp_path, capsys):
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HTTPS_PROXY",
                "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    probes = []  # each one waits at most loading.HUB_TIMEOUT_S
    monkeypatch.setattr(loading, "hub_reachable",
                        lambda real=loading.hub_reachable: probes.append(real()) or probes[-1])
    assert cli_main(["compress", "--method", "dense", "--model", "no-such-org/no-such-model",
                     "--out", str(tmp_path / "o")]) == 2
    # offline: no probe; unreachable: one failed probe, and no download attempt after it
    assert probes == ([] if "HF_HUB_OFFLINE" in env else [False])
    err = capsys.readouterr().err
    _one_error_line(err, "ModelLoadError", "no-such-org/no-such-model", words)


def test_ratio_default_is_in_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["compress", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--ratio RATIO compression target in (0, 1) (default:" in text
    assert "0.3 (flexigpt" in text


def test_train_resaves_over_its_previous_output(tiny_checkpoint, text_file, tmp_path, capsys):
    out = tmp_path / "trained"
    args = ["train", "--model", str(tiny_checkpoint), "--out", str(out), "--tokens", "64",
            "--seq-len", "16", "--micro-batch", "2", "--global-batch", "4", "--recipe", "full",
            "--text", str(text_file), "--validation", "", "--checkpoint-every", "0",
            "--bf16", "off"]
    assert cli_main(args) == 0
    first = json.loads((out / "manifest.json").read_text())
    assert cli_main(args) == 0  # its own previous output (log and curve included): replaced
    again = json.loads((out / "manifest.json").read_text())
    assert again["weights"]["sha256"] == first["weights"]["sha256"]
    assert manifest_hash(Manifest.from_dict(again)) == manifest_hash(Manifest.from_dict(first))
    assert (out / "train_log.csv").is_file() and load_compressed(out).manifest is not None
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


# ---- 5. recovery without manual steps: a stale Snakemake lock ---------------------------
def _lock(work: Path, name: str = "0.input.lock") -> Path:
    from flexigpt.cli.commands.run import LOCK_DIR

    (work / LOCK_DIR).mkdir(parents=True, exist_ok=True)
    lock = work / LOCK_DIR / name
    lock.write_text("x")
    return lock


def _owner(work: Path, pid: int, start: str | None, locks: list[Path]) -> None:
    from flexigpt.cli.commands.run import LOCK_DIR, OWNER_FILE, lock_identity

    record = {"pid": pid, "start": start, "locks": {p.name: lock_identity(p) for p in locks}}
    (work / LOCK_DIR / OWNER_FILE).write_text(json.dumps(record))


@pytest.mark.parametrize("flags", [["-m"], ["-X", "dev", "-m"], ["-u", "-m"]])
def test_a_live_runs_lock_is_kept_however_it_was_started(tmp_path, flags):
    """A run started without ``flexigpt run`` (any interpreter flags) has no owner record:
    its lock is never removed, whatever its command line looks like."""
    from flexigpt.cli.commands.run import clear_stale_lock, snakemake_command

    live = subprocess.Popen([sys.executable, *flags[:-1], "-c", "import time; time.sleep(60)"],
                            cwd=tmp_path)
    try:
        lock = _lock(tmp_path)
        assert clear_stale_lock(tmp_path) == [] and lock.exists()
    finally:
        live.kill()
        live.wait()
    assert snakemake_command(["--cores", "2"])[-1] == "--rerun-incomplete"
    assert snakemake_command(["--rerun-incomplete"]).count("--rerun-incomplete") == 1


def test_stale_lock_is_cleared_only_when_its_recorded_owner_is_gone(tmp_path):
    from flexigpt.cli.commands.run import LOCK_DIR, OWNER_FILE, clear_stale_lock, process_start

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = _lock(tmp_path)
        _owner(tmp_path, live.pid, process_start(live.pid), [lock])
        assert clear_stale_lock(tmp_path) == [] and lock.exists()  # owner alive
        _owner(tmp_path, live.pid, "1", [lock])  # same pid, other start: a reused pid
        assert clear_stale_lock(tmp_path) == [lock] and not lock.exists()
        assert not (tmp_path / LOCK_DIR / OWNER_FILE).exists()
    finally:
        live.kill()
        live.wait()
    dead = live.pid
    old = _lock(tmp_path)
    _owner(tmp_path, dead, "1", [old])
    old.unlink()  # `snakemake --unlock`, then a new run (not ours) locks again
    newer = _lock(tmp_path)
    assert clear_stale_lock(tmp_path) == [] and newer.exists()


def test_owner_record_follows_the_run(tmp_path):
    """``flexigpt run``'s record: its child's pid and start time, then the identities of
    the lock files once they appear; a run killed with SIGKILL leaves a lock that the next
    ``flexigpt run`` clears; a run that ends by itself leaves no record."""
    from flexigpt.cli.commands.run import LOCK_DIR, OWNER_FILE, OwnerRecord, clear_stale_lock

    script = ("import pathlib, time; time.sleep(0.3); d = pathlib.Path('.snakemake/locks'); "
              "d.mkdir(parents=True, exist_ok=True); (d / '0.output.lock').write_text('x'); "
              "time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    owner = OwnerRecord(tmp_path, child, poll=0.05)
    record = tmp_path / LOCK_DIR / OWNER_FILE
    for _ in range(200):
        if record.exists() and "0.output.lock" in json.loads(record.read_text())["locks"]:
            break
        time.sleep(0.05)
    assert clear_stale_lock(tmp_path) == []  # live
    child.kill()
    child.wait()
    owner.close()
    assert record.exists()  # killed: the record stays for the next run
    assert [p.name for p in clear_stale_lock(tmp_path)] == ["0.output.lock"]
    quick = subprocess.Popen([sys.executable, "-c", "pass"], cwd=tmp_path)
    done = OwnerRecord(tmp_path, quick)
    quick.wait()
    done.close()
    assert not record.exists()


_LIVE_RUN = ("import pathlib, time; time.sleep(0.3); d = pathlib.Path('.snakemake/locks'); "
             "d.mkdir(parents=True, exist_ok=True); (d / '0.input.lock').write_text('x'); "
             "(d / '0.output.lock').write_text('x'); time.sleep(120)")


@pytest.mark.parametrize("flags", [[], ["-X", "dev"], ["-u", "-B"]])
def test_later_runs_never_take_or_remove_a_live_runs_lock(tmp_path, monkeypatch, capsys,
                                                          flags):
    """One live ``flexigpt run`` holds the lock; a second, third and fourth ``flexigpt run``
    in the same directory are refused by Snakemake (here: a stand-in that takes no lock and
    fails), and none of them rewrites the owner record or removes the live run's lock."""
    from flexigpt.cli import main as cli_main
    from flexigpt.cli.commands import run as run_command
    from flexigpt.cli.commands.run import LOCK_DIR, OWNER_FILE, OwnerRecord

    monkeypatch.chdir(tmp_path)
    live = subprocess.Popen([sys.executable, *flags, "-c", _LIVE_RUN], cwd=tmp_path)
    owner = OwnerRecord(tmp_path, live, poll=0.05)
    record = tmp_path / LOCK_DIR / OWNER_FILE
    try:
        for _ in range(200):
            if record.exists() and len(json.loads(record.read_text())["locks"]) == 2:
                break
            time.sleep(0.05)
        held = json.loads(record.read_text())
        assert held["pid"] == live.pid
        locks = sorted((tmp_path / LOCK_DIR).glob("*.lock"))
        identities = [p.stat().st_ino for p in locks]
        refused = [sys.executable, "-c", "import time; time.sleep(0.6); raise SystemExit(1)"]
        monkeypatch.setattr(run_command, "snakemake_command", lambda args: refused)
        for later in range(3):  # the second, third and fourth run
            assert cli_main(["run", "--cores", "1"]) == 1, later
            assert json.loads(record.read_text()) == held, later
            assert [p.stat().st_ino for p in locks] == identities, later
        assert "removed a stale Snakemake lock" not in capsys.readouterr().err
    finally:
        live.kill()
        live.wait()
        owner.close()
    assert json.loads(record.read_text()) == held  # killed: its record stays for the next run


def test_no_proc_leaves_the_lock(tmp_path):
    from flexigpt.cli.commands.run import LOCK_DIR, clear_stale_lock

    (tmp_path / LOCK_DIR).mkdir(parents=True)
    (tmp_path / LOCK_DIR / "0.output.lock").write_text("x")
    assert clear_stale_lock(tmp_path, tmp_path / "no-proc") == []
    assert (tmp_path / LOCK_DIR / "0.output.lock").exists()
