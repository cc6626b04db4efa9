"""flexigpt-bench: FlexiGPT pruning/extension and baselines, reproducibly.

Public entry points::

    flexigpt.load_model(spec)          dense model + tokenizer (local dir or hub id)
    flexigpt.compress(method, ...)     run one registered method and save it
    flexigpt.load_compressed(dir)      reload the output of any method (LoadedModel)
    flexigpt.save_compressed(m, ...)   save a model as a published directory (weights,
                                       manifest, model card, remote-code files):
                                       flexigpt.export.publish.publish_compressed
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flexigpt.core.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, imported on first use (PEP 562): no torch for light commands
    from flexigpt.api.compression import compress
    from flexigpt.core.fileio import CheckpointError
    from flexigpt.core.params import count_parameters
    from flexigpt.export.publish import publish_compressed
    from flexigpt.export.publish import publish_compressed as save_compressed
    from flexigpt.storage.artifacts import LoadedModel, load_compressed
    from flexigpt.storage.manifest import Manifest
    from flexigpt.storage.models import load_model

#: public name → (module, attribute), imported when first read.
_LAZY = {"compress": ("flexigpt.api.compression", "compress"),
         "LoadedModel": ("flexigpt.storage.artifacts", "LoadedModel"),
         "load_compressed": ("flexigpt.storage.artifacts", "load_compressed"),
         "publish_compressed": ("flexigpt.export.publish", "publish_compressed"),
         "save_compressed": ("flexigpt.export.publish", "publish_compressed"),
         "CheckpointError": ("flexigpt.core.fileio", "CheckpointError"),
         "Manifest": ("flexigpt.storage.manifest", "Manifest"),
         "load_model": ("flexigpt.storage.models", "load_model"),
         "count_parameters": ("flexigpt.core.params", "count_parameters")}

__version__ = "0.1.0"
__all__ = ["CheckpointError", "LoadedModel", "Manifest", "compress", "count_parameters",
           "load_compressed", "load_model", "publish_compressed", "save_compressed", "__version__"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
