"""``resource.json`` stamps: what a built resource directory was made from.

Every builder writes its output through ``atomic_directory`` with the stamp inside, so a
directory with a stamp is complete. A rerun whose *key* (source wheel, builder version,
parameters) matches the existing stamp is a no-op.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from flexigpt.core.fileio import MARKER

log = logging.getLogger(__name__)

STAMP = "resource.json"
#: Bump when a builder's output changes for the same inputs (invalidates old stamps).
BUILDER_VERSION = 1


def make_key(resource: str, source: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The identity of a build: resource name, source (package/version/sha256), parameters."""
    return {"resource": resource, "builder_version": BUILDER_VERSION,
            "source": source, "params": params}


def read_stamp(out_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The stamp of ``out_dir``, or None when missing or unreadable."""
    try:
        return json.loads((Path(out_dir) / STAMP).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def is_current(out_dir: str | os.PathLike, key: dict[str, Any]) -> bool:
    """True when ``out_dir`` holds a complete build with exactly this key."""
    stamp = read_stamp(out_dir)
    if stamp is None:
        return False
    current = all(stamp.get(k) == v for k, v in key.items())
    files_ok = all((Path(out_dir) / f).is_file() for f in stamp.get("files", []))
    if current and files_ok:
        log.info("%s is up to date (%s); nothing to do", out_dir, STAMP)
    return current and files_ok


def write_stamp(tmp_dir: Path, key: dict[str, Any], counts: dict[str, Any],
                started: float, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``resource.json`` into the (temporary) output dir; returns the stamp.

    ``files`` lists every file of the build (relative paths) so a later check can see
    that nothing was removed by hand.
    """
    files = sorted(str(p.relative_to(tmp_dir)) for p in tmp_dir.rglob("*")
                   if p.is_file() and p.name not in (STAMP, MARKER))  # not the output marker
    stamp = {**key, "counts": counts, "files": files, **(extra or {}),
             "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "build_seconds": round(time.time() - started, 1)}
    (tmp_dir / STAMP).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    return stamp
