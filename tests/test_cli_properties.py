"""Issue 48, item 5: a property-based test of the CLI edge (hypothesis).

For every numeric option of every command that takes a model (read from the parser, so a new
option is covered by itself), random values — non-finite, negative, zero, huge — either end in
exit code 2 with exactly one ``error:`` line on stderr, or in exit code 2 because the model
does not exist (the value passed the edge); never a traceback and never exit 0. A non-finite
number, and a negative value (but for :data:`SIGNED` options), is always refused naming its own flag, before any file is read.
"""

from __future__ import annotations

import argparse
import importlib
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexigpt.cli import COMMANDS
from flexigpt.cli import main as cli_main

MISSING = "/nonexistent/flexigpt-model"
#: options whose negative values mean something (``--grad-clip <= 0`` disables clipping;
#: an output-norm γ may start below 0)
SIGNED = {"--grad-clip", "--gamma-init"}


def base_argv(command: str, tmp: Path, text: Path) -> list[str]:
    """Valid arguments of ``command`` on a model that does not exist."""
    return {
        "compress": ["compress", "--method", "shortgpt", "--model", MISSING, "--ratio", "0.3",
                     "--out", str(tmp / "o"), "--calibration", str(text)],
        "train": ["train", "--model", MISSING, "--out", str(tmp / "o"), "--tokens", "64",
                  "--text", str(text), "--validation", "", "--recipe", "lora"],
        "evaluate": ["evaluate", "--model", MISSING, "--out", str(tmp / "r.json"), "--no-ppl",
                     "--tasks", ""],
        "extend": ["extend", "--model", MISSING, "--layers", "6", "--out", str(tmp / "o")],
        "generate": ["generate", "--model", MISSING, "hello"],
        "export": ["export", MISSING, "--out", str(tmp / "o")],
    }[command]


def numeric_options() -> list[tuple[str, str, type]]:
    """``(command, flag, int | float)`` for every option typed int or float."""
    found = []
    for command in ("compress", "train", "evaluate", "extend", "generate", "export"):
        parser = argparse.ArgumentParser()
        importlib.import_module(COMMANDS[command]).add_arguments(parser)
        for action in parser._actions:
            if action.type in (int, float) and action.option_strings:
                found.append((command, action.option_strings[-1], action.type))
    return found


OPTIONS = numeric_options()


def values(kind: type) -> st.SearchStrategy[str]:
    ints = st.one_of(st.integers(-10, 10), st.integers(-2**40, 2**40))
    if kind is int:
        return ints.map(str)
    return st.one_of(st.floats(allow_nan=True, allow_infinity=True), ints).map(
        lambda v: repr(float(v)))


def with_option(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag`` set to ``value`` (replacing a base value)."""
    if flag in argv:
        i = argv.index(flag)
        return [*argv[:i], f"{flag}={value}", *argv[i + 2:]]
    return [*argv, f"{flag}={value}"]


def test_every_command_has_numeric_options_covered():
    commands = {c for c, _, _ in OPTIONS}
    assert commands == {"compress", "train", "evaluate", "extend", "generate", "export"}
    assert len(OPTIONS) >= 40


@pytest.mark.usefixtures("single_thread")
@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_numeric_values_end_in_one_line_and_exit_2(data, tmp_path, text_file, capsys):
    command, flag, kind = data.draw(st.sampled_from(OPTIONS), label="option")
    value = data.draw(values(kind), label="value")
    argv = with_option(base_argv(command, tmp_path, text_file), flag, value)
    rc = cli_main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert rc == 2, (argv, rc, err)
    errors = [ln for ln in err.splitlines() if ": error: " in ln]
    assert len(errors) == 1, err
    number = float(value)
    refused_here = not math.isfinite(number) or (number < 0 and flag not in SIGNED)
    if refused_here:  # refused at the edge, naming the flag as the user wrote it
        assert flag in errors[0], (argv, errors[0])
    assert not (tmp_path / "o").exists()
