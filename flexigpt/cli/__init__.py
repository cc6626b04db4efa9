"""The ``flexigpt`` command: one subcommand per module under ``flexigpt/cli/commands``.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``, and may define ``check_flags(args)`` (values alone, no file: run
before any path is checked, so a bad value is named even when an input is missing); it
is imported only when its subcommand runs.

Every user error ends the command with one line on stderr and exit code 2, Ctrl-C with one
line and 130 (``-v`` shows the traceback); an I/O failure while writing ``--out`` (a full disk, also as safetensors'
``SafetensorError``) is one line naming ``--out`` (:func:`flexigpt.core.preflight.write_failure`;
the atomic save leaves a previous output intact). Before any heavy work, commands that write
an output directory refuse an existing ``--out`` that is not a previous output of theirs,
unless ``--force`` (:func:`flexigpt.core.fileio.check_output`), every ``--out`` must be
writable (:func:`flexigpt.core.preflight.check_writable`), and input text paths must be files.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

#: subcommand → module. Add a command by adding a module and a line here.
COMMANDS: dict[str, str] = {
    "fetch": "flexigpt.cli.commands.fetch",
    "compress": "flexigpt.cli.commands.compress",
    "train": "flexigpt.cli.commands.train",
    "extend": "flexigpt.cli.commands.extend",
    "evaluate": "flexigpt.cli.commands.evaluate",
    "tables": "flexigpt.cli.commands.tables",
    "archive": "flexigpt.cli.commands.archive",
    "export": "flexigpt.cli.commands.export",
    "generate": "flexigpt.cli.commands.generate",
    "run": "flexigpt.cli.commands.run",
}


#: commands writing a model directory to ``--out`` → the kind of output they write
OUTPUT_KIND: dict[str, str] = {"compress": "model", "extend": "model", "train": "model",
                               "export": "export"}
#: errors that are the user's (bad input, files, environment): one line, exit code 2;
#: safetensors raises ``SafetensorError`` (no ``OSError``) for a failed write or a bad file
USER_ERRORS = (ValueError, RuntimeError, KeyError, OSError, ArithmeticError, SafetensorError)
#: command → its flags naming input text files, checked to be files before any work
INPUT_TEXTS: dict[str, tuple[str, ...]] = {"compress": ("calibration",),
                                           "extend": ("calibration",), "train": ("text",),
                                           "evaluate": ("ppl_text",),
                                           "generate": ("prompts_file",)}


#: command → its flags whose empty value (``''``) means "none", as their help says: the
#: value becomes None before any check, never the working directory
EMPTY_IS_NONE: dict[str, tuple[str, ...]] = {"train": ("validation",),
                                            "evaluate": ("tasks_dir", "ppl_text")}


#: command → its flags naming input paths (models, texts, task data); an output may be none
#: of them, lie inside none and contain none (``generate`` writes ``--json``)
INPUT_PATHS: dict[str, tuple[str, ...]] = {
    "compress": ("model", "calibration"), "extend": ("model",),
    "train": ("model", "teacher", "text", "validation"),
    "evaluate": ("model", "tasks_dir", "ppl_text"), "export": ("model_dir",),
    "generate": ("model", "prompts_file"), "fetch": ("text",)}


#: command → what it writes beside ``--out`` besides the staging names every save derives
#: (:func:`flexigpt.core.fileio.beside_prefixes`), as names in ``--out``'s folder
#: (``{name}``: ``--out``'s name; ``{stem}``: that name without ``.json``): the trainer's
#: checkpoint folder and its moved-aside copy, an evaluation's per-document and per-window
#: records (:func:`flexigpt.runtime.evaluation.results.records_paths`). Outputs too: no
#: input may be or lie in them
BESIDE_OUT: dict[str, tuple[str, ...]] = {
    "train": ("{name}.ckpt", "{name}.ckpt.old"),
    "evaluate": ("{stem}.samples.jsonl.gz", "{stem}.windows.json")}


def beside_out(command: str, out: str | Path) -> tuple[str, ...]:
    """The names :data:`BESIDE_OUT` gives what ``command`` writes beside its output ``out``
    (in the same folder; ``out`` as the user wrote it, made absolute first)."""
    name = Path(out).expanduser().absolute().name
    stem = name[:-len(".json")] if name.endswith(".json") else name
    return tuple(template.format(name=name, stem=stem)
                 for template in BESIDE_OUT.get(command, ()))


def _flag_name(dest: str) -> str:
    """How the user wrote an option: ``--prompts-file``; a positional as its metavar."""
    return dest.upper() if dest == "model_dir" else f"--{dest.replace('_', '-')}"


def _one_line(err: BaseException) -> str:
    text = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 else str(err)
    text = " ".join(str(text).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _output_flag(args: argparse.Namespace) -> str | None:
    """The path this command writes (``--out``), or None (it writes none, or ``export
    --card`` rewrites a model's card in place)."""
    out = getattr(args, "out", None)
    if not out or args.command == "run" or getattr(args, "card", False):
        return None
    return str(out)


def check_finite(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every number-valued flag of the command (``type=float``) is finite: ``nan`` and
    ``inf`` parse as floats but mean nothing as a learning rate, a clip norm or a
    temperature (``ValueError`` naming the flag as the user wrote it). A new float flag
    inherits the check."""
    import math

    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if action.type is float and isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{action.option_strings[-1]} must be a finite number, "
                             f"got {value!r}")


def _weights_bytes(model: str | None) -> int:
    """Bytes of the safetensors weights in a local model directory (0: none, or a hub id):
    the size a model output written from it is estimated at."""
    if not model or not Path(model).is_dir():
        return 0
    return sum(p.stat().st_size for p in Path(model).glob("*.safetensors") if p.is_file())


def _preflight(args: argparse.Namespace) -> None:
    """Checks that need no heavy work: the output directory and what is written beside it
    (apart from every input, not foreign, writable; a previous output a cut swap left
    aside is restored first, in one line), the input text files, the training window
    length."""
    from flexigpt.core.fileio import check_apart, check_output, restore_swapped
    from flexigpt.core.preflight import check_free_space, check_writable
    from flexigpt.storage.input_files import check_text

    out = _output_flag(args)
    written = [(out, "--out")] if out else []
    if args.command == "generate" and getattr(args, "json", None):
        written.append((args.json, "--json"))
    for path, flag in written:
        check_apart(path, {_flag_name(name): getattr(args, name, None)
                           for name in INPUT_PATHS.get(args.command, ())}, flag,
                    beside=beside_out(args.command, path) if flag == "--out" else ())
    if args.command in OUTPUT_KIND and out:
        restored = restore_swapped(out)
        if restored is not None:
            print(f"flexigpt {args.command}: restored the previous --out {out} from "
                  f"{restored.name} (a save was cut between the two renames of its swap)",
                  file=sys.stderr)
        check_output(out, OUTPUT_KIND[args.command], args.force)
    if args.command == "train" and out:
        from flexigpt.runtime.training.checkpoint import check_owned, checkpoint_dir

        check_owned(checkpoint_dir(out))
    if out:
        check_writable(out, "--out", directory=args.command != "evaluate")
    if args.command in OUTPUT_KIND and out:
        weights = _weights_bytes(getattr(args, "model", None) or getattr(args, "model_dir", None))
        if weights:
            check_free_space(out, weights, "the input model's weights")
    if args.command == "generate" and getattr(args, "json", None):
        check_writable(args.json, "--json", directory=False)
    for name in INPUT_TEXTS.get(args.command, ()):
        if getattr(args, name, None) and not getattr(args, "no_ppl", False):
            check_text(getattr(args, name), f"--{name.replace('_', '-')} text file")
    if args.command == "train":
        model_dir = Path(args.model).expanduser()
        if (model_dir / "config.json").is_file():
            from flexigpt.api.values import check_positions
            from flexigpt.storage.models.loading import family_config

            check_positions(family_config(model_dir), args.seq_len, "--seq-len")


def _build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, Any]:
    """The parser with the chosen command's flags (its module imported), and its
    subparsers."""
    parser = argparse.ArgumentParser(prog="flexigpt", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, module_name in COMMANDS.items():
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))
        else:
            sub.add_parser(name, help=f"(see flexigpt {name} --help)")
    if chosen == "train":  # its flags live in commands/train.py; --force is common to outputs
        train_parser = sub.choices["train"]
        if not any("--force" in a.option_strings for a in train_parser._actions):
            train_parser.add_argument("--force", action="store_true",
                                      help="replace --out even if it is not a saved model")
    return parser, sub


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    if next((a for a in argv if a in COMMANDS), None) == "run":
        cut = argv.index("run") + 1  # everything after `run` belongs to snakemake, unparsed
        args = parser.parse_args(argv[:cut])
        args.snakemake_args = argv[cut:]
        return args
    return parser.parse_args(argv)


def interrupted(err: BaseException) -> bool:
    """Whether ``err`` is Ctrl-C, or an error raised while Ctrl-C was being handled (a
    library's clean-up failing on the way out): either ends the command in one line."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def interrupted_line(command: str | None, args: argparse.Namespace | None) -> str:
    """The one line a Ctrl-C ends ``command`` with: what was kept."""
    out = _output_flag(args) if args is not None else None
    if out is None:
        kept = "outputs are written atomically, so nothing was half-written"
    elif Path(out).exists():
        kept = f"--out {out} was not replaced (the previous output there is intact)"
    else:
        kept = f"nothing was written to --out {out}"
    if command == "train" and out is not None and Path(f"{out}.ckpt").is_dir():
        kept += f"; the training checkpoint {out}.ckpt is kept: rerun to resume from it"
    return f"flexigpt {command or ''}: interrupted; {kept}".replace("flexigpt :", "flexigpt:")


def say_interrupted(command: str | None, args: argparse.Namespace | None) -> int:
    """Print :func:`interrupted_line` on a line of its own and return Ctrl-C's exit status:
    the progress bars the interruption left open are closed first (their frames outlive the
    exception, so they would end their line only at exit, after the message)."""
    std = sys.modules.get("tqdm.std")  # loaded by whatever drew a bar; none: nothing open
    for bar in list(getattr(getattr(std, "tqdm", None), "_instances", ())):
        bar.close()
    print(interrupted_line(command, args), file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    """Run one command; every user error and every Ctrl-C (while importing, parsing or
    working) ends it with one line on stderr (``-v``: the traceback)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except BaseException as err:  # Ctrl-C while importing or parsing, before any work
        if not interrupted(err) or "-v" in argv or "--verbose" in argv:
            raise
        return say_interrupted(next((a for a in argv if a in COMMANDS), None), None)


def _main(argv: list[str]) -> int:
    """:func:`main` once it is safe from Ctrl-C: parse, check, run the command."""
    parser, sub = _build_parser(argv)
    args = _parse(parser, argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    module = importlib.import_module(COMMANDS[args.command])
    from flexigpt.core.fileio import force_outputs

    for name in EMPTY_IS_NONE.get(args.command, ()):
        if getattr(args, name, None) == "":
            setattr(args, name, None)
    try:
        with force_outputs(bool(getattr(args, "force", False))):
            check_finite(sub.choices[args.command], args)
            if hasattr(module, "check_flags"):  # values first: they need no file
                module.check_flags(args)
            _preflight(args)
            return int(module.run(args) or 0)
    except USER_ERRORS as err:
        if args.verbose:
            raise
        if interrupted(err):
            return say_interrupted(args.command, args)
        print(f"flexigpt {args.command}: error: {_message(err, args)}", file=sys.stderr)
        return 2
    except BaseException as err:
        if args.verbose or not interrupted(err):
            raise
        return say_interrupted(args.command, args)


def _message(err: BaseException, args: argparse.Namespace) -> str:
    """The one line of a user error: a failed write of ``--out`` names ``--out``."""
    from flexigpt.core.preflight import write_failure

    failed = write_failure(err, _output_flag(args))
    return f"{type(err).__name__}: {failed}" if failed else _one_line(err)

