"""What a saved model directory's ``config.json`` says about its compression.

Facts of the saved checkpoint format, read by the loaders and written by
:func:`flexigpt.export.checkpoint.make_self_contained`: a non-plain model's ``config.json``
has ``model_type`` :data:`MODEL_TYPE` and a :data:`KEY` entry
``{"format", "method", "structure", "base_model_type", "base_architectures", "not_plain",
"remote_code", ...}``, and (when the standalone loader replays it) an ``auto_map`` pointing
at :data:`MODELING_FILE`. A plain model's ``config.json`` is the family's own.

The constants equal those of the standalone file
(``flexigpt/storage/standalone.py``, the base of the assembled remote-code file, which
imports nothing from the harness); :mod:`flexigpt.export.checkpoint` checks that they agree.

Pure file I/O: imports nothing from the harness.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: the remote-code file copied into a self-contained directory
MODELING_FILE = "modeling_flexigpt_compressed.py"
#: ``config.json["model_type"]`` of a non-plain model (unknown to stock transformers)
MODEL_TYPE = "flexigpt_compressed"
#: the ``config.json`` key holding the compression record of a non-plain model
KEY = "flexigpt_compression"
#: ``config.json[KEY]["format"]`` written today
FORMAT = 1
#: config.json keys written for a non-plain model (removed again by :func:`base_config_dict`)
ADDED_KEYS = ("auto_map", KEY)


def base_config_dict(config_dict: dict[str, Any]) -> dict[str, Any]:
    """The family's own config dict (undoes
    :func:`flexigpt.export.checkpoint.make_self_contained`'s changes); a plain one is
    returned as a copy."""
    spec = config_dict.get(KEY)
    if not isinstance(spec, dict):
        return dict(config_dict)
    out = {k: v for k, v in config_dict.items() if k not in ADDED_KEYS}
    out["model_type"] = spec["base_model_type"]
    if spec.get("base_architectures") is not None:
        out["architectures"] = spec["base_architectures"]
    else:
        out.pop("architectures", None)
    return out


def compression_spec(model_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``config.json[flexigpt_compression]`` of a saved dir (None for a plain checkpoint)."""
    try:
        spec = json.loads((Path(model_dir) / "config.json").read_text()).get(KEY)
    except (OSError, json.JSONDecodeError):
        return None
    return spec if isinstance(spec, dict) else None
