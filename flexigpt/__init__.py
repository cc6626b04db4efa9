"""flexigpt-bench: FlexiGPT pruning/extension and baselines, reproducibly.

Public entry points::

    flexigpt.load_model(spec)          dense model + tokenizer (local dir or hub id)
    flexigpt.compress(method, ...)     run one registered method and save it
    flexigpt.load_compressed(dir)      reload the output of any method (LoadedModel)
"""

from flexigpt.api import compress
from flexigpt.artifacts import CheckpointError, LoadedModel, load_compressed, save_compressed
from flexigpt.manifest import Manifest
from flexigpt.models import load_model
from flexigpt.params import count_parameters

__version__ = "0.1.0"
__all__ = ["CheckpointError", "LoadedModel", "Manifest", "compress", "count_parameters",
           "load_compressed", "load_model", "save_compressed", "__version__"]
