"""Model layer: loading and architecture adapters."""

from flexigpt.storage.models.adapters import (
    ADAPTERS,
    ArchAdapter,
    UnsupportedArchitectureError,
    get_adapter,
    require_family,
)
from flexigpt.storage.models.loading import ModelLoadError, load_model, parse_dtype

__all__ = ["ADAPTERS", "ArchAdapter", "ModelLoadError", "UnsupportedArchitectureError",
           "get_adapter", "load_model", "parse_dtype", "require_family"]
