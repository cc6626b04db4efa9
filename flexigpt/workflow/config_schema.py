"""A config checked against its JSON schema with one line per refusal.

Snakemake's ``validate`` prints the whole schema (over a thousand lines) around a config
error. :func:`check_schema` runs first (``flexigpt run`` before Snakemake starts, the
Snakefile before ``validate``) and names the file, the key path and the problem in one line:

    config file 'my.yaml': ratios: 0.3 is not a list (expected e.g. [0.3, 0.4])
    config file 'my.yaml': bogus_key: unknown key (known: model, data, ...)
    config file 'my.yaml': ratios[0]: '1e-05' is text, not a number: YAML 1.1 reads an
        exponent without a decimal point as a string; write 1.0e-05

The schema itself (``workflow/schemas/config.schema.yaml``) stays the one statement of what a
config may hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from flexigpt.storage.registry import METHODS, methods_in_section
from flexigpt.workflow.config_check import ConfigError
from flexigpt.workflow.dag.defaults import SCHEMA

#: a problem's instance is shown up to this many characters
SHOWN = 60
_TYPE_WORDS = {"array": "a list", "object": "a mapping", "number": "a number",
               "integer": "an integer", "string": "text", "boolean": "true or false",
               "null": "null"}
#: bound keywords → what the value must do
_BOUNDS = {"minItems": "needs at least {v} item(s)", "maxItems": "holds more than {v} item(s)",
           "minimum": "must be >= {v}", "maximum": "must be <= {v}",
           "exclusiveMinimum": "must be > {v}", "exclusiveMaximum": "must be < {v}",
           "pattern": "does not match the pattern {v!r}", "minLength": "is too short",
           "uniqueItems": "repeats an item", "minProperties": "needs at least {v} key(s)"}


#: ``x-registry`` lists the schema fills from the method registry (``{x-registry: methods}``
#: becomes ``{enum: [...]}``; JSON Schema ignores the unknown keyword, so Snakemake's own
#: ``validate`` of the same file accepts any name there and this check is the one that refuses)
REGISTRY_LISTS = {
    "methods": lambda: list(methods_in_section("methods")),
    # the paper protocol's k = int(ratio·L) applies where a ratio becomes a block count
    "block_count": lambda: [k for k in methods_in_section("methods")
                            if METHODS[k].block_count is not None],
}


def filled_schema(node: Any) -> Any:
    """The schema ``node`` with every ``{x-registry: <list>}`` replaced by its ``enum``
    (:data:`REGISTRY_LISTS`; ValueError for an unknown list)."""
    if isinstance(node, dict):
        out = {k: filled_schema(v) for k, v in node.items() if k != "x-registry"}
        if "x-registry" in node:
            name = node["x-registry"]
            if name not in REGISTRY_LISTS:
                raise ValueError(f"{SCHEMA}: unknown x-registry list {name!r} "
                                 f"(known: {', '.join(REGISTRY_LISTS)})")
            out["enum"] = REGISTRY_LISTS[name]()
        return out
    if isinstance(node, list):
        return [filled_schema(v) for v in node]
    return node


@lru_cache(maxsize=1)
def _validator() -> Draft202012Validator:
    return Draft202012Validator(filled_schema(yaml.safe_load(SCHEMA.read_text())))


def key_path(error: ValidationError) -> str:
    """``ratios[0]``, ``methods.flexigpt.options``; ``(top level)`` for the root."""
    text = ""
    for part in error.absolute_path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def _numeric_text(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def describe(error: ValidationError) -> str:
    """One line for a schema violation: the key path and what is wrong, in the config's own
    words (never the schema or the whole instance)."""
    where, value, kind = key_path(error), error.instance, error.validator
    if kind == "type":
        expected = error.validator_value
        names = [expected] if isinstance(expected, str) else list(expected)
        wanted = " or ".join(_TYPE_WORDS.get(n, n) for n in names)
        if _numeric_text(value) and any(n in ("number", "integer") for n in names):
            return (f"{where}: {value!r} is text, not a number: YAML 1.1 reads an exponent "
                    "without a decimal point as a string; write it with one (e.g. 1.0e-05) "
                    "or in full (0.00001)")
        hint = " (e.g. [0.3, 0.4])" if where.endswith("ratios") and "a list" in wanted else ""
        return f"{where}: {_shown(value)} is not {wanted}{hint}"
    if kind == "additionalProperties":
        known = sorted((error.schema.get("properties") or {}).keys())
        extra = sorted(set(value) - set(known)) if isinstance(value, dict) else []
        name = f"{where}.{extra[0]}" if extra and where != "(top level)" else (
            extra[0] if extra else where)
        return f"{name}: unknown key" + (f" (known: {', '.join(known)})" if known else "")
    if kind == "required":
        missing = [k for k in error.validator_value if k not in (value or {})]
        prefix = "" if where == "(top level)" else f"{where}: "
        return f"{prefix}missing required key {missing[0]!r}" if missing else error.message
    if kind == "enum":
        return f"{where}: {_shown(value)} is not one of {list(error.validator_value)}"
    if kind in _BOUNDS:
        return f"{where}: {_shown(value)} " + _BOUNDS[kind].format(v=error.validator_value)
    message = " ".join(error.message.split())
    return f"{where}: " + (message if len(message) <= 2 * SHOWN else f"{kind} check failed")


#: (section, old key) → the key's new name; a config still using the old one is refused
#: with it (before the schema's generic "unexpected key")
RENAMED_KEYS = {("data", "benchmarks"): "data.tasks (the folder of the task data, "
                                         "<task>/<split>.jsonl, e.g. resources/tasks)"}


def schema_problem(config: dict[str, Any]) -> str | None:
    """The most relevant schema violation of ``config`` as one line (:func:`describe`), or
    None when it is valid; a renamed key names its new name."""
    for (section, key), new in RENAMED_KEYS.items():
        if isinstance(config.get(section), dict) and key in config[section]:
            return f"{section}.{key} was renamed {new}"
    error = best_match(_validator().iter_errors(config))
    return None if error is None else describe(error)


def check_schema(config: dict[str, Any], sources: Iterable[str] = ()) -> None:
    """``ConfigError`` (one line naming the files and the key) when ``config`` breaks the
    schema."""
    problem = schema_problem(config)
    if problem is None:
        return
    files = ", ".join(repr(str(s)) for s in sources)
    raise ConfigError(f"config file {files}: {problem}" if files else f"config: {problem}")
