"""Value checks every entry point shares (the CLI's flags, :func:`flexigpt.api.compression.compress`):
pure functions of their arguments, importing no torch, so a light command checks its values
before anything heavy loads."""

from __future__ import annotations

from typing import Any


def check_count(value: Any, what: str, minimum: int = 1) -> None:
    """``ValueError`` naming ``what`` unless ``value`` is an integer >= ``minimum`` (a bool
    is not a count). Used for every count-like argument and CLI flag (``what`` = the flag)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")


def check_positions(config: Any, seq_len: int, what: str = "sequence length") -> None:
    """``ValueError`` when ``seq_len`` exceeds the model's ``max_position_embeddings``."""
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and seq_len > limit:
        raise ValueError(f"{what} {seq_len} is longer than the model's {limit} positions "
                         f"(max_position_embeddings); use at most {limit}")
