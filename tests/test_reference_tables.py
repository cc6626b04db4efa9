"""Every committed reference run whose inputs are committed (``results/reference/<run>/
inputs/``, written by ``flexigpt archive``) rebuilds its committed tables from those files
alone: no model, no rerun (``flexigpt tables --archive``). Its intervals come from the
committed per-document records, so anyone can recheck them."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexigpt.tables.from_archive import INDEX, read_index, rebuild

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "results" / "reference"
ARCHIVES = sorted(p.parent for p in REFERENCE.glob(f"*/inputs/{INDEX}"))


#: reference runs committed before per-document records were kept (their tables only)
LEGACY: set[str] = set()


def test_every_reference_run_commits_its_inputs():
    """A committed reference run is a directory with a ``RUN.md``; every one but the legacy
    runs carries its archive (``inputs/``), whose index lists every per-document record."""
    runs = {p.parent.name for p in REFERENCE.glob("*/RUN.md")}
    assert runs >= LEGACY
    missing = sorted(runs - LEGACY - {a.parent.name for a in ARCHIVES})
    assert not missing, f"reference runs without committed inputs (flexigpt archive): {missing}"
    for archive in ARCHIVES:
        index = read_index(archive)
        records = [s for s in index["support"] if s.endswith((".jsonl.gz", ".windows.json"))]
        assert len(records) >= len(index["inputs"]["results"]), archive


def test_committed_tables_rebuild_from_committed_inputs(tmp_path: Path):
    for archive in ARCHIVES:
        out = tmp_path / archive.parent.name
        written = rebuild(archive, out, formats=("md", "csv"), make_plots=False)
        rebuilt = [p for p in written if p.suffix in (".md", ".csv")]
        assert any(p.name.startswith("verdicts") for p in rebuilt), archive
        for path in rebuilt:
            committed = archive.parent / path.name
            assert committed.is_file(), f"{path.name} is rebuilt but not committed in {archive}"
            assert path.read_text() == committed.read_text(), f"{path.name} differs ({archive})"


def test_archive_errors_name_the_problem(tmp_path, capsys):
    from flexigpt.cli import main as cli_main

    assert cli_main(["tables", "--archive", str(tmp_path), "--out", str(tmp_path / "t")]) == 2
    assert "not a run archive: inputs.json not found" in capsys.readouterr().err
    archive = tmp_path / "a"
    archive.mkdir()
    (archive / INDEX).write_text('{"schema": 1, "inputs": {"results": ["../x.json"], '
                                 '"timings": [], "train_logs": [], "manifests": [], '
                                 '"selections": []}}')
    with pytest.raises(ValueError, match="leaves the archive"):
        read_index(archive)
    (archive / INDEX).write_text('{"schema": 1, "results_dir": "/etc", "inputs": {"results": '
                                 '[], "timings": [], "train_logs": [], "manifests": [], '
                                 '"selections": []}}')
    with pytest.raises(ValueError, match="results_dir"):
        read_index(archive)
    assert cli_main(["tables", "--archive", str(archive), "--results", "r",
                     "--out", str(tmp_path / "t")]) == 2
    assert "drop --results" in capsys.readouterr().err
    config = tmp_path / "c.yaml"
    config.write_text((ROOT / "config" / "smoke.yaml").read_text())
    assert cli_main(["archive", "--configfile", str(config), "--workdir", str(tmp_path),
                     "--out", str(tmp_path / "arch")]) == 2
    assert "the run is not finished" in capsys.readouterr().err
    # a sitting's overlay is laid over its config as `flexigpt run` does: its key is checked
    overlay = tmp_path / "sitting.yaml"
    overlay.write_text("budget:\n  until: 3\n")
    assert cli_main(["archive", "--configfile", str(config), str(overlay), "--workdir",
                     str(tmp_path), "--out", str(tmp_path / "arch")]) == 2
    assert "budget" in capsys.readouterr().err
