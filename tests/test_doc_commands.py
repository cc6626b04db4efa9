"""Every command, flag, config key and fetch target that README.md, docs/*.md and the config
headers print is one the project accepts (``tests/doc_commands.py`` says what is collected
and how each is checked), and the check fails on a planted error of each kind."""

from __future__ import annotations

from pathlib import Path

import doc_commands as dc
import pytest


def test_every_printed_command_flag_key_and_target_is_accepted():
    mentions = dc.collect()
    commands = [m for m in mentions if dc._is_command(m.text)]
    # the collector sees the documents' commands (a broken collector would pass vacuously)
    texts = {m.text for m in commands}
    assert len(commands) > 80, len(commands)
    assert "flexigpt fetch all --out resources" in texts
    assert any(t.startswith("snakemake --cores all --configfile config/smoke.yaml") for t in texts)
    assert dc.problems(mentions) == []


PLANTED = {
    "flexigpt compress --method flexigpt --model m --ratio 0.3 --calibration t.txt --out o "
    "--no-such-flag": "has no flag --no-such-flag",
    "flexigpt fetch hub-text": "'hub-text' is not one of",
    "flexigpt fetch-all --out resources": "has no command 'fetch-all'",
    "flexigpt train --model m --out o --loss nope": "'nope' is not one of",
    "snakemake --cores all --no-such-snakemake-flag": "has no flag --no-such-snakemake-flag",
    "snakemake --cores all --configfile config/missing.yaml": "no such file",
    "flexigpt run --cores all --config jobs.gpus=1": "no 'gpus' under jobs",
    "make no-such-target": "make has no target no-such-target",
    "huggingface-cli login": "no installed package ships this command",
    "python -m benchmarks.no_such_bench": "no such module",
}


@pytest.mark.parametrize("line", sorted(PLANTED))
def test_a_planted_bad_command_in_a_code_block_is_reported(tmp_path: Path, line: str):
    (tmp_path / "docs").mkdir()
    (tmp_path / "config").mkdir()
    (tmp_path / "README.md").write_text(f"# t\n\n```bash\nflexigpt fetch all\n{line}  # c\n```\n")
    found = dc.problems(dc.collect(tmp_path))
    assert len(found) == 1 and PLANTED[line] in found[0], found
    assert found[0].startswith(f"{tmp_path / 'README.md'}:5: ")


def test_planted_errors_in_prose_and_config_comments_are_reported(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "config").mkdir()
    (tmp_path / "README.md").write_text("Set `jobs.gpu` and `device:`; not `jobs.gpux`, not "
                                        "`devices:`; run `flexigpt tables --acros DIR`.\n")
    (tmp_path / "config" / "x.yaml").write_text(
        "# run with\n#   snakemake --cores all \\\n#     --bad-flag\nseed: 0  # `flexigpt fetch nope`\n")
    found = dc.problems(dc.collect(tmp_path))
    assert len(found) == 5, found
    assert any("no 'gpux' under jobs" in f for f in found)
    assert any("config key devices" in f for f in found)
    assert any("flexigpt tables has no flag --acros" in f for f in found)
    assert any("x.yaml:2:" in f and "--bad-flag" in f for f in found)
    assert any("x.yaml:4:" in f and "'nope'" in f for f in found)
