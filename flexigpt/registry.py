"""The one registry of compression methods.

Keys are exactly the ``{method}`` wildcard values of the Snakemake DAG and the values of
``flexigpt compress --method``. Entries are loaded lazily (``"module:attr"``) so heavy
baseline imports happen only when used.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn


@dataclass
class CompressionResult:
    """What a method's ``compress`` returns.

    Attributes:
        model: the compressed model (in memory, ready for forward).
        structure: JSON-serialisable description that ``Method.rebuild`` needs to rebuild an
            empty skeleton whose ``state_dict`` matches ``model``'s (pruned blocks, sharing
            map, per-layer widths, ...).
        info: JSON-serialisable record for the manifest only (scores, distances, timings).
    """

    model: nn.Module
    structure: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Method:
    """A compression method behind the uniform interface.

    Attributes:
        name: registry key.
        config_cls: dataclass of the method's options; ``__post_init__`` validates.
        compress: ``(model, tokenizer, calibration, cfg) -> CompressionResult``;
            ``calibration`` is a LongTensor ``[N, T]`` of token windows, or None when
            ``needs_calibration`` is False. Must not mutate anything it does not return.
        rebuild: ``(hf_config, structure) -> nn.Module`` an initialised skeleton with the
            compressed architecture; weights are loaded into it afterwards.
        needs_calibration: whether ``compress`` reads calibration windows.
        recovery: default trainable-set recipe name for ``flexigpt train`` (see train.py).
    """

    name: str
    config_cls: type
    compress: Callable[..., CompressionResult]
    rebuild: Callable[..., nn.Module]
    needs_calibration: bool = True
    recovery: str = "none"
    description: str = ""

    def accepts(self, option: str) -> bool:
        """Whether the method's config has a field named ``option``."""
        return option in {f.name for f in dataclasses.fields(self.config_cls)}

    def make_config(self, **options: Any) -> Any:
        """Build (and so validate) the method's config; unknown options are an error."""
        known = {f.name for f in dataclasses.fields(self.config_cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"method {self.name!r} has no option(s) {unknown}; "
                             f"known options: {sorted(known)}")
        return self.config_cls(**options)


#: name → "module:attribute" of a :class:`Method`.
METHODS: dict[str, str] = {
    "dense": "flexigpt.methods.dense:METHOD",
    "flexigpt": "flexigpt.methods.prune:METHOD",
    "flexigpt_extend": "flexigpt.methods.extend:METHOD",
    "shortgpt": "baselines.shortgpt.method:METHOD",
    "shortgpt_lora": "baselines.shortgpt.method:METHOD_LORA",
    "slicegpt": "baselines.slicegpt.method:METHOD",
    "llm_pruner": "baselines.llm_pruner.method:METHOD",
}


class UnknownMethodError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


def get_method(name: str) -> Method:
    """Resolve a registry key to its :class:`Method`.

    Raises:
        UnknownMethodError: with a "did you mean" suggestion.
    """
    try:
        target = METHODS[name]
    except KeyError:
        close = difflib.get_close_matches(name, METHODS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownMethodError(
            f"unknown method {name!r}{hint} Known methods: {sorted(METHODS)}") from None
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def validate_ratio(ratio: float, what: str = "ratio") -> float:
    """Check ``0 < ratio < 1`` with an error that names the value."""
    if not isinstance(ratio, (int, float)) or not 0.0 < float(ratio) < 1.0:
        raise ValueError(f"{what} must be strictly between 0 and 1, got {ratio!r}")
    return float(ratio)
