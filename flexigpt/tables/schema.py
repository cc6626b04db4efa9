"""Reading and validating the JSON inputs of the tables: :class:`ResultFileError` and the
typed key checks every reader shares.

Each check raises :class:`ResultFileError` (a ``ValueError``) naming the file and the key;
a listed file that does not exist raises ``FileNotFoundError`` naming it. Booleans are never
numbers and numbers must be finite.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Literal, overload


class ResultFileError(ValueError):
    """An input file is unreadable or does not follow its schema; the message names it."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)


def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file; missing → FileNotFoundError, bad JSON → ResultFileError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"result file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultFileError(path, f"not valid JSON ({err})") from None


def read_schema1(path: Path) -> dict[str, Any]:
    """A JSON object with ``"schema": 1`` (ResultFileError naming the file otherwise)."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ResultFileError(path, "top level must be a JSON object")
    if need(path, data, "schema", int) != 1:
        raise ResultFileError(path, f"unsupported schema {data['schema']!r} (expected 1)")
    return data


#: The JSON number types (a bool is never one: :func:`need` rejects it).
NUMBER = (int, float)


def need(path: Path, obj: Any, key: str, types: type | tuple[type, ...], where: str = "",
         nullable: bool = False) -> Any:
    """``obj[key]`` checked against ``types`` (bool is never a number)."""
    name = f"{where}{key}"
    if not isinstance(obj, dict) or key not in obj:
        raise ResultFileError(path, f"missing required key {name!r}")
    value = obj[key]
    if value is None and nullable:
        return None
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ResultFileError(path, f"{name!r} must be {types}, got {value!r}")
    if not isinstance(value, types):
        raise ResultFileError(path, f"{name!r} must be {types}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ResultFileError(path, f"{name!r} is not finite: {value!r}")
    return value


def need_number(path: Path, obj: Any, key: str, where: str = "") -> float:
    """``obj[key]`` as a float: required, a finite number (not a bool)."""
    return float(need(path, obj, key, NUMBER, where))


def need_choice(path: Path, obj: dict, key: str, allowed: tuple[str, ...],
                where: str) -> str | None:
    """Optional ``obj[key]``: absent/null → None, else one of ``allowed``."""
    if obj.get(key) is None:
        return None
    value = need(path, obj, key, str, where)
    if value not in allowed:
        raise ResultFileError(path, f"{where}{key} must be one of {allowed}, got {value!r}")
    return value


@overload
def need_count(path: Path, obj: dict, key: str, where: str,
               nullable: Literal[False] = False) -> int: ...


@overload
def need_count(path: Path, obj: dict, key: str, where: str,
               nullable: bool = False) -> int | None: ...


def need_count(path: Path, obj: dict, key: str, where: str,
               nullable: bool = False) -> int | None:
    """``obj[key]``: an int >= 0 (None when null and ``nullable``)."""
    value = need(path, obj, key, int, where, nullable=nullable)
    if value is not None and value < 0:
        raise ResultFileError(path, f"{where + key!r} must be >= 0, got {value!r}")
    return value


def need_optional(path: Path, obj: dict, key: str, types: type | tuple[type, ...],
                  where: str) -> Any:
    """Optional ``obj[key]``: absent or null → None, else checked like :func:`need`."""
    return None if obj.get(key) is None else need(path, obj, key, types, where)


def need_lr(path: Path, obj: dict, key: str, where: str,
            nullable: bool = False) -> float | None:
    """``obj[key]``: a learning rate, a number > 0 (None when null and ``nullable``)."""
    value = need(path, obj, key, NUMBER, where, nullable=nullable)
    if value is not None and value <= 0:
        raise ResultFileError(path, f"{where + key!r} must be > 0, got {value!r}")
    return None if value is None else float(value)
