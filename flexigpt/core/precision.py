"""Which reduced-precision autocast a device runs natively (one rule for training and eval).

``auto`` means bf16 autocast where the hardware has native bf16 matmuls (CUDA with bf16
support; CPUs with AMX or AVX512-BF16), else full fp32: emulated bf16 on an older CPU is
slower than fp32, and numerics must not depend on a guess. What was resolved is recorded
in every output that depends on it (train manifests, result JSONs).
"""

from __future__ import annotations

import torch

#: accepted spellings of an autocast dtype → the torch dtype.
AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                   "float16": torch.float16, "fp16": torch.float16}


def native_bf16(device: torch.device | str) -> bool:
    """True where ``device`` runs bf16 matmuls natively (see module doc)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        try:
            return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
        except AttributeError:
            return False
    return False


def resolve_autocast(mode: str | torch.dtype | None, device: torch.device | str) -> torch.dtype | None:
    """``None``/``"none"``/``"float32"`` → None (fp32); ``"auto"`` → bf16 if
    :func:`native_bf16` else None; ``"bfloat16"``/``"float16"`` (or a dtype) → that dtype.

    Raises:
        ValueError: an unknown spelling.
    """
    if mode is None or mode in ("none", "float32", "fp32"):
        return None
    if isinstance(mode, torch.dtype):
        return mode
    if mode == "auto":
        return torch.bfloat16 if native_bf16(device) else None
    try:
        return AUTOCAST_DTYPES[mode]
    except KeyError:
        raise ValueError(f"autocast must be auto, none, bfloat16 or float16, got {mode!r}") from None


def dtype_name(dtype: torch.dtype | None) -> str | None:
    """``torch.bfloat16`` → ``"bfloat16"``; None stays None (for JSON records)."""
    return str(dtype).replace("torch.", "") if dtype is not None else None
