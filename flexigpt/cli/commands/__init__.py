"""Subcommands of the ``flexigpt`` CLI (see flexigpt/cli.py)."""

from __future__ import annotations

import argparse
import json


def add_device_argument(p: argparse.ArgumentParser) -> None:
    """``--device`` (every command that runs a model): a :mod:`flexigpt.core.devices` setting."""
    from flexigpt.core.devices import DEVICE_SPEC, check_device

    p.add_argument("--device", default="auto", type=check_device,
                   help=f"{DEVICE_SPEC} (default auto: CUDA where available, else CPU)")


def parse_key_values(pairs: list[str], flag: str) -> dict[str, object]:
    """``["k=v", ...]`` → ``{k: json(v) or the raw string}``; errors name ``flag``."""
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out
