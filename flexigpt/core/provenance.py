"""Versions, code hashes and run setup recorded with every artefact."""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import random
import subprocess
from pathlib import Path

import torch

PACKAGES = ("torch", "transformers", "peft", "lm_eval", "datasets", "accelerate",
            "safetensors", "pandas", "snakemake")
_ROOT = Path(__file__).resolve().parents[2]


def package_versions() -> dict[str, str]:
    """Installed versions of the stack (``"missing"`` where absent)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


def code_version(packages: tuple[str, ...] = ("flexigpt", "baselines")) -> str:
    """sha256 (16 hex) over the source files of the harness packages.

    Changes whenever any ``.py`` file under them changes; used by the DAG as a param so
    code edits rerun affected jobs.
    """
    digest = hashlib.sha256()
    for pkg in packages:
        for path in sorted((_ROOT / pkg).rglob("*.py")):
            digest.update(str(path.relative_to(_ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def git_commit() -> str | None:
    """The checkout's HEAD commit, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_ROOT, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def cpu_name() -> str:
    """The CPU's model name and whether it has AMX / AVX512-BF16 (the figures depend on it)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                 if line.startswith("model name")), "unknown")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines()
                      if line.startswith("flags")), []))
    return f"{name} ({', '.join(f for f in ('amx_bf16', 'avx512_bf16', 'avx2') if f in flags)})"


def provenance() -> dict[str, object]:
    """Everything that identifies the code that produced an artefact."""
    return {"versions": package_versions(), "code_version": code_version(),
            "git_commit": git_commit()}


def setup_run(seed: int, deterministic: bool = True) -> None:
    """Seed every RNG and set determinism flags. Called by entry points, never at import."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:
        pass
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
