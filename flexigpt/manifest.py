"""The manifest every saved model carries (``manifest.json``): one builder, one key list.

A manifest says what was done to a model and how to rebuild it. Built here
(:func:`new_manifest`: by ``flexigpt.api.compress`` and, for a plain checkpoint that gets
trained, by the trainer), extended by the trainer (one ``history`` entry per training run)
and completed by :func:`flexigpt.artifacts.save_compressed` (``format_version``, ``weights``
sha256/size/sharing map, ``files``).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

#: keys of every manifest :func:`new_manifest` builds, besides the provenance keys
#: (package versions, code version, git commit) and method extras such as compress_seconds
KEYS = ("method", "config", "base_model", "structure", "info", "parameters", "calibration",
        "seed", "dtype", "created", "history")


def new_manifest(method: str, *, config: dict[str, Any], base_model: str | None,
                 structure: dict[str, Any], info: dict[str, Any], dense_params: int,
                 compressed_params: int, calibration: dict[str, Any] | None, seed: int,
                 dtype: str, **extra: Any) -> dict[str, Any]:
    """A fresh manifest (empty ``history``, provenance of this process).

    Args:
        method: registry key; config: the method's options (JSON); base_model: the dense
            model it came from; structure: what ``Method.rebuild`` needs; info: the
            method's record (``info["recovery"]``: a ``RecoveryRecipe``);
            dense_params / compressed_params: ``count_parameters`` before / after;
            calibration: ``{file, n_windows, seq_len, sample_seed}`` or None; extra: further
            top-level keys (e.g. ``compress_seconds``).
    """
    from flexigpt.params import compression_ratio
    from flexigpt.provenance import provenance

    clash = sorted(set(extra) & set(KEYS))
    if clash:
        raise ValueError(f"manifest extras {clash} would replace required keys")
    return {"method": method, "config": config, "base_model": base_model,
            "structure": structure, "info": info,
            "parameters": {"dense": dense_params, "compressed": compressed_params,
                           "achieved_ratio": compression_ratio(compressed_params,
                                                               dense_params)},
            "calibration": calibration, "seed": seed, "dtype": dtype,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "history": [], **extra, **provenance()}
