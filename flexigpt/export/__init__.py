"""Checkpoints the ecosystem can load: self-contained dirs, plain exports, model cards.

    flexigpt.export.publish      ``publish_compressed(model, tok, manifest, out)``: save a model
                                 with its remote-code files and model card
    flexigpt.export.checkpoint   config.json + standalone modeling file (when publishing)
    flexigpt.export.plain        ``export_plain(dir, out)``: a stock ``*ForCausalLM`` where exact
    flexigpt.export.card         ``write_model_card(dir, result_json=None)``: README.md
    flexigpt.export.standalone   the remote-code file written into saved dirs, assembled from
                                 flexigpt/storage/standalone.py and each method's replay.py
"""

from __future__ import annotations

from flexigpt.core.lazy import lazy_exports

__all__ = ["export_plain", "publish_compressed", "write_model_card"]


#: public name → its module, imported when first read: importing the package must not
#: import transformers
_LAZY = {"write_model_card": "flexigpt.export.card",
         "publish_compressed": "flexigpt.export.publish",
         "export_plain": "flexigpt.export.plain"}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
