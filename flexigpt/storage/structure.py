"""Checks that a saved manifest describes the model it rebuilds (issue 48, item 3).

A manifest's ``structure`` is what a method's ``rebuild`` reads; its ``info`` is provenance
that repeats some of it (``removed_blocks``, ``span``, ``pruned_blocks`` ...). On load
(:func:`flexigpt.storage.artifacts.load_compressed`):

* :func:`check_described`: every key that ``info`` and ``structure`` both hold agrees, so an
  edit to either is refused, not reported as provenance;
* the method's ``Method.check_structure(structure, config)`` checks the fields' types and
  ranges and that they fit the saved ``config.json`` (its block count), using the helpers
  here (:func:`dense_block_count`, :func:`block_indices`, :func:`block_span`,
  :func:`check_block_count`);

Every refusal is a ``ValueError`` naming the field (``CheckpointError`` names the directory).
"""

from __future__ import annotations

from typing import Any


def check_described(structure: dict[str, Any], info: dict[str, Any]) -> None:
    """``ValueError`` naming the first key that ``info`` and ``structure`` both hold with
    different values."""
    for key in sorted(set(structure) & set(info)):
        if info[key] != structure[key]:
            raise ValueError(f"info.{key} = {info[key]!r} disagrees with structure.{key} = "
                             f"{structure[key]!r}: was manifest.json edited?")


def is_int(value: Any) -> bool:
    """An integer that is not a bool (JSON ``true`` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def dense_block_count(structure: dict[str, Any], key: str = "dense_blocks") -> int:
    """``structure[key]``: the dense model's block count, an integer >= 2."""
    value = structure.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise ValueError(f"structure.{key} must be an integer >= 2, got {value!r}")
    return value


def block_indices(structure: dict[str, Any], key: str, n_blocks: int) -> list[int]:
    """``structure[key]``: distinct block positions in [0, ``n_blocks``), at least one and
    not all of them."""
    value = structure.get(key)
    if (not isinstance(value, list) or not value or not all(is_int(v) for v in value)
            or len(set(value)) != len(value) or min(value) < 0 or max(value) >= n_blocks
            or len(value) >= n_blocks):
        raise ValueError(f"structure.{key} must list distinct block positions in "
                         f"[0, {n_blocks}), at least one and not all, got {value!r}")
    return list(value)


def block_span(structure: dict[str, Any], key: str, n_blocks: int) -> tuple[int, int]:
    """``structure[key]`` = ``[start, end]``: a span of blocks, 0 <= start < end <= ``n_blocks``."""
    value = structure.get(key)
    if (not isinstance(value, list) or len(value) != 2 or not all(is_int(v) for v in value)
            or not 0 <= value[0] < value[1] <= n_blocks):
        raise ValueError(f"structure.{key} must be [start, end] with 0 <= start < end <= "
                         f"{n_blocks}, got {value!r}")
    return int(value[0]), int(value[1])


def check_block_count(config: Any, expected: int, why: str) -> None:
    """``ValueError`` when the saved config's block count is not ``expected`` (``why``:
    how the structure implies it)."""
    found = getattr(config, "num_hidden_layers", None)
    if found != expected:
        raise ValueError(f"config.json has {found} blocks, the structure implies {expected} "
                         f"({why})")


def check_removed_blocks(structure: dict[str, Any], config: Any) -> None:
    """``Method.check_structure`` of a method that deletes ``removed_blocks`` of
    ``dense_blocks`` (the saved config holds the rest)."""
    n = dense_block_count(structure)
    removed = block_indices(structure, "removed_blocks", n)
    check_block_count(config, n - len(removed), f"{n} dense blocks - {len(removed)} removed")
