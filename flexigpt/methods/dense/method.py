"""The unpruned reference model as a registry method (identity compression)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from flexigpt.storage.artifacts import empty_model
from flexigpt.storage.registry import CompressionResult, Method


@dataclass(frozen=True)
class DenseConfig:
    """No options: the dense model is saved as it is."""


def compress(model: nn.Module, tokenizer: Any, calibration: Any,
             cfg: DenseConfig) -> CompressionResult:
    return CompressionResult(model=model, structure={})


def rebuild(config: Any, structure: dict[str, Any]) -> nn.Module:
    return empty_model(config)


METHOD = Method(name="dense", config_cls=DenseConfig, compress=compress, rebuild=rebuild,
                recovery="none",
                description="the unpruned reference model")
