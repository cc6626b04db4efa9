"""The commands, flags, config keys and fetch targets that README.md, docs/*.md and the config
headers print, collected and checked against what the project accepts.

Collected (:func:`collect`): every line of a fenced code block, every inline code span and
every comment line of a ``config/**/*.yaml`` whose text starts with a checked tool
(:data:`TOOLS`), continuation lines (``\\``) joined; and every inline code span that names a
config key (``jobs.gpu``, ``device:``, ``tuning.grid.last_blocks``). Checked
(:func:`problems`):

- ``flexigpt CMD ...``: CMD is a command, every flag is one of CMD's flags, every value of a
  flag with choices (``fetch`` targets included) is a choice; a code-block line parses in
  full (placeholders ``<...>``, optional groups ``[...]`` and alternatives ``a|b`` are read
  as the user would fill them in); ``flexigpt run ...`` is checked as ``snakemake ...``;
- ``snakemake ...``: every flag is Snakemake's (its own parser), a ``--configfile`` and a
  ``--workflow-profile`` exist in the tree, every ``--config key=value`` key is in the
  config schema (a config file a walkthrough writes itself, ``cat > F <<'EOF'``, exists);
- ``make T``: T is a Makefile target; ``python -m M``: M is importable; any other tool
  (``hf``, ``huggingface-cli``, ``pip``, ``conda``) must be a console script an installed
  distribution ships, and ``hf``'s subcommands answer ``--help``
  (:data:`EXTERNAL` tools, ``conda``, are the user's own and are not checked);
- a config key: its dotted path resolves in ``workflow/schemas/config.schema.yaml``; a
  ``key:`` span names a property the schema has somewhere.

A problem is one line naming the file, the line and what is wrong; the test fails on any.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import importlib.util
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
#: the first words of a command this module checks
TOOLS = ("flexigpt", "snakemake", "make", "python", "hf", "huggingface-cli", "pip", "conda",
         "accelerate")
#: console scripts whose subcommands are checked by running ``tool SUB --help``
HELP_CHECKED = ("hf",)
#: tools the project does not install (a user's own): named, not checked
EXTERNAL = ("conda",)


@dataclass(frozen=True)
class Mention:
    """One command or config key as printed: the file, its line, the text."""

    path: Path
    line: int
    text: str
    kind: str  # "block": a line of a code block; "inline": a code span or a comment line

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path}:{self.line}"


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md, docs/*.md and every config YAML (whose comments are read)."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")),
            *sorted((root / "config").rglob("*.yaml"))]


def _strip_comment(line: str) -> str:
    """A shell line without its trailing ``# comment`` (outside quotes)."""
    out, quote = [], ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            break
        out.append(ch)
    return "".join(out).rstrip()


def _joined(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Shell lines with ``\\`` continuations joined, each with its first line number."""
    start, parts = 0, list[str]()
    for number, text in lines:
        if not parts:
            start = number
        cont = text.rstrip().endswith("\\")
        parts.append(text.rstrip().removesuffix("\\").strip())
        if not cont:
            yield start, " ".join(p for p in parts if p)
            parts = []
    if parts:
        yield start, " ".join(p for p in parts if p)


def _is_command(text: str) -> bool:
    words = text.split()
    return bool(words) and words[0] in TOOLS


def _markdown(path: Path) -> Iterator[Mention]:
    lines = path.read_text(encoding="utf-8").splitlines()
    block: list[tuple[int, str]] = []
    fence = ""
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if fence:
                lang = fence.removeprefix("```").strip()
                if lang in ("", "bash", "sh", "shell", "console"):
                    for start, text in _joined([(n, _strip_comment(t)) for n, t in block]):
                        text = text.removeprefix("$ ")
                        if _is_command(text):
                            yield Mention(path, start, text, "block")
                fence, block = "", []
            else:
                fence = stripped
            continue
        if fence:
            block.append((number, line))
            continue
    # inline code spans: over the whole text (a span may break across lines), outside fences
    text = re.sub(r"(?ms)^\s*```.*?^\s*```", lambda m: "\n" * m.group(0).count("\n"),
                  "\n".join(lines))
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        span = " ".join(match.group(1).split())
        number = text.count("\n", 0, match.start()) + 1
        yield Mention(path, number, span, "inline")


def _yaml_comments(path: Path) -> Iterator[Mention]:
    comments: list[tuple[int, str]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if "#" in line and not line.lstrip().startswith("#"):
            comment = line.split("#", 1)[1]
        elif line.lstrip().startswith("#"):
            comment = line.lstrip()[1:]
        else:
            continue
        comments.append((number, comment.strip()))
    for number, comment in comments:
        for match in re.finditer(r"`([^`]+)`", comment):
            yield Mention(path, number, " ".join(match.group(1).split()), "inline")
    commands = [(n, c) for n, c in comments if c]
    held: list[tuple[int, str]] = []
    for number, comment in commands:
        if held or _is_command(comment):
            held.append((number, comment))
            if not comment.endswith("\\"):
                for start, text in _joined(held):
                    yield Mention(path, start, text, "block")
                held = []


def collect(root: Path = ROOT) -> list[Mention]:
    """Every command line, code span and config comment of the documents (see module doc)."""
    found: list[Mention] = []
    for path in doc_files(root):
        found += _yaml_comments(path) if path.suffix == ".yaml" else _markdown(path)
    return found


# ---------------------------------------------------------------- the words as typed


def _words(text: str) -> list[str]:
    """Shell words of a printed command, placeholders filled in: ``<x>`` → ``X``, an
    optional group ``[...]`` kept (its brackets dropped), ``a|b`` → ``a``, ``...`` dropped;
    ``VAR=value`` prefixes and ``&& ...`` tails cut."""
    text = re.sub(r"<[^<>]*>", "X", text)
    text = text.replace("[", " ").replace("]", " ")
    text = re.split(r"\s(?:&&|\|\||;|\|)\s", text)[0]
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    words = [w.split("|")[0] if "|" in w and not w.startswith(("'", '"')) else w
             for w in words if w not in ("...", "…")]
    return [w for w in words if w]


# ---------------------------------------------------------------- parsers


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise _Refused(message)


def flexigpt_parser(command: str) -> argparse.ArgumentParser:
    """The parser ``flexigpt COMMAND`` uses (as :func:`flexigpt.cli.main` builds it)."""
    from flexigpt.cli import COMMANDS

    module = importlib.import_module(COMMANDS[command])
    parser = _Parser(prog=f"flexigpt {command}", add_help=True)
    parser.add_argument("-v", "--verbose", action="store_true")
    module.add_arguments(parser)
    if command == "train" and not any("--force" in a.option_strings for a in parser._actions):
        parser.add_argument("--force", action="store_true")
    return parser


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def _check_flags(words: list[str], options: dict[str, argparse.Action], tool: str) -> list[str]:
    """Every ``--flag`` (or ``--flag=value``) among ``words`` is one of ``options`` and a
    value of a flag with choices is one of them."""
    bad = []
    for i, word in enumerate(words):
        if not word.startswith("-") or word == "-" or re.fullmatch(r"-\d.*", word):
            continue
        flag, _, inline = word.partition("=")
        if flag not in options:
            bad.append(f"{tool} has no flag {flag}")
            continue
        action = options[flag]
        value = inline or (words[i + 1] if i + 1 < len(words) and action.nargs != 0 else "")
        if action.choices and value and not value.startswith("-") \
                and value not in action.choices and value != "X":
            bad.append(f"{tool} {flag}: {value!r} is not one of {sorted(action.choices)}")
    return bad


@functools.cache
def _snakemake_options() -> dict[str, argparse.Action]:
    from snakemake.cli import get_argument_parser

    return _options(get_argument_parser())


@functools.cache
def _schema() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].split("/")[-1]]
    return node


def schema_path(key: str, schema: dict[str, Any] | None = None) -> str | None:
    """None when the dotted ``key`` (``jobs.gpu``, ``methods.flexigpt.options``) names a
    place in the config schema, else what is wrong. A mapping with ``additionalProperties``
    (``methods``, a method's ``variants``) takes any name; an ``options`` object is the
    method's own (its fields are not in the schema) and ends the check."""
    schema = schema or _schema()
    node: dict[str, Any] = schema
    for depth, part in enumerate(key.split(".")):
        node = _resolve(schema, node)
        props = node.get("properties", {})
        if part in props:
            node = props[part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        elif node.get("type") == "object" and "additionalProperties" not in node \
                and not props:
            return None  # a free mapping (a method's options)
        else:
            where = ".".join(key.split(".")[:depth]) or "the top level"
            return f"config key {key}: no {part!r} under {where}"
    return None


def _all_properties(schema: Any) -> set[str]:
    names: set[str] = set()
    if isinstance(schema, dict):
        names |= set(schema.get("properties", {}))
        for value in schema.values():
            names |= _all_properties(value)
    elif isinstance(schema, list):
        for value in schema:
            names |= _all_properties(value)
    return names


_PROPERTIES: dict[int, set[str]] = {}


def _all_properties_of(key: int, schema: dict[str, Any]) -> set[str]:
    """:func:`_all_properties` of ``schema``, computed once per schema object."""
    if key not in _PROPERTIES:
        _PROPERTIES[key] = _all_properties(schema)
    return _PROPERTIES[key]


@functools.cache
def _console_scripts() -> set[str]:
    return {ep.name for ep in importlib.metadata.entry_points(group="console_scripts")}


@functools.cache
def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):", text, re.M)}


# ---------------------------------------------------------------- checks


def check_command(text: str, block: bool) -> list[str]:
    """What is wrong with one printed command (empty: nothing). ``block``: a line of a
    code block (the ``flexigpt`` command must parse in full), else a mention in prose
    (its flags and choices are checked, not completeness)."""
    words = _words(text)
    if not words:
        return []
    tool, rest = words[0], words[1:]
    if tool == "flexigpt":
        return _check_flexigpt(rest, block)
    if tool == "snakemake":
        return _check_snakemake(rest)
    if tool == "make":
        targets = [w for w in rest if not w.startswith("-") and "=" not in w]
        return [f"make has no target {t}" for t in targets if t not in _make_targets()]
    if tool == "python":
        if "-m" in rest and rest.index("-m") + 1 < len(rest):
            module = rest[rest.index("-m") + 1]
            if any(_placeholder(part) for part in module.split(".")):
                return []
            if module.startswith("benchmarks.") or module.startswith("flexigpt"):
                found = importlib.util.find_spec(module.split(".")[0]) is not None and \
                    (ROOT / (module.replace(".", "/") + ".py")).exists() or \
                    (ROOT / module.replace(".", "/") / "__main__.py").exists()
            else:
                found = importlib.util.find_spec(module) is not None
            return [] if found else [f"python -m {module}: no such module"]
        return []
    if tool in EXTERNAL:
        return []
    if tool not in _console_scripts():
        return [f"{tool}: no installed package ships this command"]
    if tool in HELP_CHECKED:
        return _check_help(tool, rest)
    return []


def _check_help(tool: str, rest: list[str]) -> list[str]:
    """``tool SUB... --help`` exits 0: the subcommands a line names exist (``hf auth
    login``); the tool is the console script next to this interpreter."""
    import subprocess
    import sys

    subs = [w for w in rest[:3] if re.fullmatch(r"[a-z][a-z-]*", w)]
    exe = Path(sys.executable).parent / tool
    run = subprocess.run([str(exe) if exe.exists() else tool, *subs, "--help"],
                         capture_output=True, text=True, timeout=120)
    return [] if run.returncode == 0 else [f"{tool} {' '.join(subs)}: not a command "
                                           f"({run.stderr.strip().splitlines()[-1:]})"]


def _check_flexigpt(rest: list[str], block: bool) -> list[str]:
    from flexigpt.cli import COMMANDS

    if rest and rest[0] in ("-v", "--verbose"):
        rest = rest[1:]
    if not rest or rest[0].startswith("-"):
        return []
    command, args = rest[0], rest[1:]
    if _placeholder(command):
        return []
    if command not in COMMANDS:
        return [f"flexigpt has no command {command!r} (it has {', '.join(COMMANDS)})"]
    if command == "run":
        return _check_snakemake(args)
    parser = flexigpt_parser(command)
    bad = _check_flags(args, _options(parser), f"flexigpt {command}")
    positionals = [a for a in parser._actions if not a.option_strings and a.choices]
    if positionals and args and not args[0].startswith("-") and not _placeholder(args[0]):
        choices = list(positionals[0].choices)  # type: ignore[arg-type]
        if args[0] not in choices:
            bad.append(f"flexigpt {command}: {args[0]!r} is not one of {sorted(choices)}")
    if not bad and block:
        try:
            parser.parse_args(_typed_placeholders(args, _options(parser)))
        except _Refused as err:
            bad.append(f"flexigpt {command} {' '.join(args)}: {err}")
    return bad


def _placeholder(word: str) -> bool:
    """``X`` (a ``<...>``), ``N``, ``DIR``, ``C``: a value the reader fills in."""
    return bool(re.fullmatch(r"[A-Z][A-Z_]*", word))


def _typed_placeholders(args: list[str], options: dict[str, argparse.Action]) -> list[str]:
    """``args`` with a placeholder value of a number-valued flag replaced by ``1``."""
    out = list(args)
    for i, word in enumerate(out[:-1]):
        action = options.get(word)
        if action is not None and action.type in (int, float) and _placeholder(out[i + 1]):
            out[i + 1] = "1"
    return out


def _check_snakemake(args: list[str]) -> list[str]:
    bad = _check_flags(args, _snakemake_options(), "snakemake")
    for i, word in enumerate(args[:-1]):
        values = [v for v in _values(args[i + 1:]) if not _placeholder(v)]
        if word == "--configfile":
            bad += [f"snakemake --configfile {v}: no such file" for v in values
                    if not (ROOT / v).is_file() and v not in _written()]
        if word == "--workflow-profile":
            bad += [f"snakemake --workflow-profile {v}: no such profile" for v in values[:1]
                    if not (ROOT / v).is_dir()]
        if word == "--config":
            for item in values:
                key, _, value = item.partition("=")
                keys = [key]
                parsed = yaml.safe_load(value) if value else None
                if isinstance(parsed, dict):  # model='{key: ..., path: ...}'
                    keys += [f"{key}.{sub}" for sub in parsed]
                bad += [f"snakemake --config {item}: {problem}" for problem in
                        filter(None, (schema_path(k) for k in keys))]
    return bad


@functools.cache
def _written() -> frozenset[str]:
    """Files a document's own block writes (``cat > my-model.yaml <<'EOF'``, ``printf '…' >
    gpu.yaml``, a block marked ``<!-- walkthrough: file deepest.yaml -->``, see
    ``walkthrough.py``): a walkthrough may name them."""
    return frozenset(m.group(1) or m.group(2) for path in doc_files(ROOT) if path.suffix == ".md"
                     for m in re.finditer(r"(?:cat|printf '[^'\n]*') > (\S+)|"
                                          r"<!-- walkthrough: file (\S+) -->",
                                          path.read_text(encoding="utf-8")))


def _values(words: list[str]) -> list[str]:
    """The values of a flag: the words up to the next flag."""
    out = []
    for word in words:
        if word.startswith("-"):
            break
        out.append(word)
    return out


_DOTTED = re.compile(r"^[a-z_]+(\.[a-z_0-9]+)+$")
#: suffixes of file names (``budget.yaml``, ``model.safetensors``): not keys
_FILE_SUFFIXES = (".yaml", ".yml", ".json", ".csv", ".md", ".txt", ".py", ".safetensors",
                  ".html", ".png", ".log", ".smk")
#: attributes of a loaded model in prose (``model.config``, ``model.norm.weight``): the
#: schema's ``model`` block has none of these names, so they are read as code, not keys
_MODEL_ATTRIBUTES = ("config", "norm", "name_or_path", "layers", "embed_tokens")


@functools.cache
def _is_code(parts: tuple[str, ...]) -> bool:
    """``a.b...`` names the harness's code: a module ``a/b.py`` or a package ``a/b/`` under
    ``flexigpt/``, or a function, class or constant ``b`` of a module ``a.py``
    (``training.launch.run_spec``, ``calibration.token_windows``)."""
    package = ROOT / "flexigpt"
    for folder in package.rglob(parts[0]):
        if folder.is_dir() and ((folder / f"{parts[1]}.py").is_file()
                                or (folder / parts[1]).is_dir()):
            return True
    for module in package.rglob(f"{parts[0]}.py"):
        pattern = rf"^(def|class) {re.escape(parts[1])}\b|^{re.escape(parts[1])}\s*[:=]"
        if re.search(pattern, module.read_text(encoding="utf-8"), re.M):
            return True
    return parts[0] == "model" and parts[1] in _MODEL_ATTRIBUTES
_KEY = re.compile(r"^([a-z_]+):$")


def check_key(span: str, schema: dict[str, Any]) -> list[str]:
    """What is wrong with a code span that names a config key: ``a.b.c`` whose first part is
    a top-level key of the schema must resolve (unless it is a file name or names the
    harness's code); ``key:`` must name a property the schema has somewhere (``key: value``
    spans are left alone: they are as often a method's options, a manifest's or a task
    file's fields)."""
    if _DOTTED.match(span) and span.split(".")[0] in schema.get("properties", {}) \
            and not span.endswith(_FILE_SUFFIXES) and not _is_code(tuple(span.split("."))):
        problem = schema_path(span, schema)
        return [problem] if problem else []
    match = _KEY.match(span)
    if match and match.group(1) not in _all_properties_of(id(schema), schema):
        return [f"config key {match.group(1)}: the schema has no such key"]
    return []


def problems(mentions: list[Mention]) -> list[str]:
    """One line per wrong command, flag, key or fetch target among ``mentions``."""
    schema = _schema()
    out = []
    for mention in mentions:
        if _is_command(mention.text):
            found = check_command(mention.text, mention.kind == "block")
        elif mention.kind == "inline":
            found = check_key(mention.text, schema)
        else:
            found = []
        out += [f"{mention.where()}: `{mention.text}`: {p}" for p in found]
    return out
