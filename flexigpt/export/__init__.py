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

__all__ = ["export_plain", "publish_compressed", "write_model_card"]


def __getattr__(name: str):  # lazy: importing the package must not import transformers
    if name == "write_model_card":
        from flexigpt.export.card import write_model_card
        return write_model_card
    if name == "publish_compressed":
        from flexigpt.export.publish import publish_compressed
        return publish_compressed
    if name == "export_plain":
        from flexigpt.export.plain import export_plain
        return export_plain
    raise AttributeError(name)
