"""flexigpt-bench: FlexiGPT pruning/extension and baselines, reproducibly.

Public entry points::

    flexigpt.load_model(spec)          dense model + tokenizer (local dir or hub id)
    flexigpt.compress(method, ...)     run one registered method and save it
    flexigpt.load_compressed(dir)      reload the output of any method (LoadedModel)
    flexigpt.save_compressed(m, ...)   save a model as a published directory (weights,
                                       manifest, model card, remote-code files):
                                       flexigpt.export.publish.publish_compressed
"""

from flexigpt.api import compress
from flexigpt.artifacts import LoadedModel, load_compressed
from flexigpt.export.publish import publish_compressed
from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.fileio import CheckpointError
from flexigpt.manifest import Manifest
from flexigpt.models import load_model
from flexigpt.params import count_parameters

__version__ = "0.1.0"
__all__ = ["CheckpointError", "LoadedModel", "Manifest", "compress", "count_parameters",
           "load_compressed", "load_model", "publish_compressed", "save_compressed", "__version__"]
