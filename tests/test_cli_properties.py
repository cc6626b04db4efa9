"""Issue 48, item 5: a property-based test of the CLI edge (hypothesis).

For every numeric option of every command that takes a model (read from the parser, so a new
option is covered by itself), random values — non-finite, negative, zero, huge — either end in
exit code 2 with exactly one ``error:`` line on stderr, or in exit code 2 because the model
does not exist (the value passed the edge); never a traceback and never exit 0. A non-finite
number, and a negative value (but for :data:`SIGNED` options), is always refused naming its
own flag, before any file is read.

Outputs are kept apart from inputs at every name a command derives from its output: layouts
put inputs of the user's at the output, at what is written beside it (``cli.BESIDE_OUT``)
and at every staging, moved-aside and temporary name (``fileio.beside_prefixes``), with
folders of the user's at other such names; every command refuses in one line, exit 2, and
nothing of the user's changes.
"""

from __future__ import annotations

import argparse
import importlib
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexigpt.cli import COMMANDS, INPUT_PATHS, _flag_name, beside_out
from flexigpt.cli import main as cli_main
from flexigpt.core.fileio import beside_prefixes

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


# ---- outputs are kept apart from inputs, at every name a command derives from its output ----
#: the kind of path each input flag of :data:`flexigpt.cli.INPUT_PATHS` names
INPUT_KIND = {"model": "dir", "teacher": "dir", "model_dir": "dir", "tasks_dir": "dir",
              "calibration": "file", "text": "file", "validation": "file", "ppl_text": "file",
              "prompts_file": "file"}
#: command → (its output flag, the name its output gets, whether it takes --force)
OUTPUTS = {"compress": ("--out", "o", True), "extend": ("--out", "model.v2", True),
           "train": ("--out", "o", True), "evaluate": ("--out", "r.json", False),
           "export": ("--out", "plain", True), "generate": ("--json", "texts.json", False),
           "fetch": ("--out", "tok", True)}


def test_the_layouts_know_every_input_and_output():
    assert set(OUTPUTS) == set(INPUT_PATHS)
    assert {dest for dests in INPUT_PATHS.values() for dest in dests} <= set(INPUT_KIND)


def apart_argv(command: str, out: Path, inputs: dict[str, Path], force: bool) -> list[str]:
    """``command`` writing ``out``, reading every input of :data:`INPUT_PATHS` from
    ``inputs`` (flag dest → path); valid flags otherwise, so only the rule can refuse it."""
    flag = OUTPUTS[command][0]
    paths = {dest: str(path) for dest, path in inputs.items()}
    argv = {
        "compress": ["compress", "--method", "shortgpt", "--ratio", "0.3"],
        "extend": ["extend", "--layers", "6"],
        "train": ["train", "--tokens", "64", "--recipe", "lora"],
        "evaluate": ["evaluate", "--tasks", "arc_easy"],
        "export": ["export", paths.pop("model_dir")] if "model_dir" in paths else ["export"],
        "generate": ["generate", "hello"],
        "fetch": ["fetch", "tiny-llama"],
    }[command]
    for dest, path in paths.items():
        argv += [f"--{dest.replace('_', '-')}", path]
    return [*argv, flag, str(out), *(["--force"] if force else [])]


def fixed_names(command: str, out_name: str) -> list[str]:
    """The output's own name and its siblings' (:func:`flexigpt.cli.beside_out`)."""
    return [out_name, *(beside_out(command, out_name) if OUTPUTS[command][0] == "--out"
                        else ())]


def derived_names(command: str, out_name: str) -> st.SearchStrategy[str]:
    """A name a save of ``command`` to ``out_name`` writes or removes: the output itself, a
    sibling of :func:`flexigpt.cli.beside_out`, or a staging, moved-aside or temporary
    name of any of them (:func:`flexigpt.core.fileio.beside_prefixes` + a tail)."""
    names = fixed_names(command, out_name)
    prefixes = [p for name in names for p in beside_prefixes(name)]
    tails = st.one_of(
        st.just("x"),
        st.builds("{}-{}".format, st.integers(1, 99999), st.text("abcdef0123", min_size=1,
                                                                  max_size=8)),
        st.builds("{}-{}.old-{}".format, st.integers(1, 99999), st.text("xyz", min_size=1,
                                                                         max_size=4),
                  st.text("0123456789abcdef", min_size=8, max_size=8)))
    return st.one_of(st.sampled_from(names),
                     st.builds(str.__add__, st.sampled_from(prefixes), tails))


def _own(path: Path, kind: str, label: str) -> None:
    """Make ``path`` a thing of the user's with known bytes (a folder holds one file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "dir":
        path.mkdir()
        (path / "config.json").write_text(f'{{"mine": "{label}"}}\n')
    else:
        path.write_text(f"text of {label}\n")


def _bytes_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_input_at_any_name_derived_from_the_output_is_refused(data, tmp_path, capsys):
    """Layouts that put inputs of the user's (known bytes) at names a command derives from
    its output — the output, ``<out>.ckpt``, ``<out>.ckpt.old``, an evaluation's records,
    any ``.partial-*``, ``.old-*`` or ``.tmp-*`` sibling — with folders of the user's (no
    harness marker) at others, ``--force`` or not: one line naming the input flag, exit 2,
    and every byte and folder of the user's is still there."""
    command = data.draw(st.sampled_from(sorted(INPUT_PATHS)), label="command")
    flag, out_name, has_force = OUTPUTS[command]
    dests = INPUT_PATHS[command]
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    names = data.draw(st.lists(derived_names(command, out_name), min_size=1, max_size=3,
                               unique=True), label="names")
    placed = data.draw(st.lists(st.sampled_from(dests), min_size=1,
                                max_size=min(len(names), len(dests)), unique=True),
                       label="inputs placed")
    inputs = {dest: root / "elsewhere" / dest for dest in dests}
    links = {}
    for dest, name in zip(placed, names, strict=False):
        # a link at a fixed name resolves to the input (a staging name is never followed)
        how = data.draw(st.sampled_from(["is", "inside", "link"] if name in fixed_names(
            command, out_name) else ["is", "inside"]), label=f"{dest} at {name}")
        if how == "link":
            links[root / name] = inputs[dest]
        else:
            inputs[dest] = root / name / "sub" / dest if how == "inside" else root / name
    for dest, path in inputs.items():
        _own(path, INPUT_KIND[dest], dest)
    for link, target in links.items():
        link.symlink_to(target)
    for name in names[len(placed):]:  # the remaining names: folders of the user's
        _own(root / name, "dir", f"foreign {name}")
    force = has_force and data.draw(st.booleans(), label="--force")
    before = _bytes_under(root)
    folders = sorted(p for p in root.rglob("*") if p.is_dir())
    capsys.readouterr()
    argv = apart_argv(command, root / out_name, inputs, force)
    rc = cli_main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert _bytes_under(root) == before, argv
    assert all(p.is_dir() for p in folders) and all(p.is_symlink() for p in links), argv
    assert rc == 2 and len(err) == 1, (argv, rc, err)
    assert "outputs are kept apart from inputs" in err[0], (argv, err)
    assert any(f"input {_flag_name(dest)} " in err[0] for dest in placed), (argv, err)
