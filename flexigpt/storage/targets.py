"""``"module:attribute"`` declarations, resolved on first use: how a method's facts name
its implementation, official-code check and config (:mod:`flexigpt.storage.registry`) and
how a training recipe names its trainable set (:mod:`flexigpt.storage.recipe_facts`)."""

from __future__ import annotations

import importlib
from typing import Any


def load_target(target: str) -> Any:
    """The attribute a ``"module:attribute"`` declaration names, its module imported now.

    Raises:
        ValueError: ``target`` is not of the form ``"module:attribute"``.
        ImportError / AttributeError: the module or the attribute does not exist.
    """
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr or ":" in attr:
        raise ValueError(f"{target!r} is not a 'module:attribute' declaration")
    return getattr(importlib.import_module(module), attr)
