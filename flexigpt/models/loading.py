"""Loading dense models from a local checkpoint or the Hugging Face hub."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from flexigpt.models.adapters import get_adapter


class ModelLoadError(RuntimeError):
    """A model spec could not be resolved to a checkpoint (bad path, unknown id, no hub)."""


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` (or a torch dtype) → torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    try:
        return table[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(table)}") from None


#: seconds :func:`hub_reachable` waits for a TCP connection to the hub
HUB_TIMEOUT_S = 3.0


def looks_local(spec: str) -> bool:
    """True for a spec that names a path, never a hub id (``org/name``): an existing path,
    or one starting with ``.``, ``/``, ``~`` or ``resources/``, with more than one ``/``, or
    with the platform's own separator where that is not ``/``."""
    return (Path(spec).expanduser().exists() or spec.startswith((".", "/", "~", "resources/"))
            or spec.count("/") > 1 or (os.sep != "/" and os.sep in spec)
            or spec.endswith("/"))


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set to a true value."""
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub endpoint opens within ``timeout`` seconds
    (name resolution included; a proxy in the environment counts as reachable)."""
    import socket
    import threading
    from urllib.parse import urlparse

    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(hub_endpoint())
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    ok: list[bool] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            ok.append(False)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(ok and ok[0])


def _hub_config(spec: str):
    """The config of hub id ``spec``: from the local cache when it is there; otherwise one
    clear :class:`ModelLoadError` within seconds when the hub is disabled or unreachable."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    def fail(why: str, err: Exception | None = None) -> ModelLoadError:
        detail = f" ({type(err).__name__}: {str(err).splitlines()[0]})" if err else ""
        return ModelLoadError(f"cannot resolve model {spec!r}: not a local checkpoint and not in "
                              f"the local hub cache, and {why} — check the id, your network "
                              f"and token, or give a local checkpoint directory{detail}")

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        try:
            return AutoConfig.from_pretrained(spec, local_files_only=True)
        except (OSError, ValueError):
            pass
        if hub_offline():
            raise fail("the Hugging Face hub is disabled (HF_HUB_OFFLINE=1)")
        if not hub_reachable():
            raise fail(f"the Hugging Face hub ({hub_endpoint()}) is unreachable (no connection "
                       f"within {HUB_TIMEOUT_S:g} s)")
        try:
            return AutoConfig.from_pretrained(spec)
        except (OSError, ValueError) as err:
            raise fail("the Hugging Face hub did not provide it", err) from None
    finally:
        hf_logging.set_verbosity(verbosity)


def load_model(spec: str | os.PathLike, dtype: str | torch.dtype = "float32",
               device: str = "cpu", verify: bool = True) -> tuple[nn.Module, object]:
    """Load a dense causal LM and its tokenizer.

    Args:
        spec: a local checkpoint directory (``config.json`` inside) or a hub id such as
            ``meta-llama/Llama-2-7b-hf``.
        dtype: weight dtype.
        device: where the weights go, a :mod:`flexigpt.devices` setting (``auto`` = CUDA
            where available).
        verify: a local directory written by this harness (``.flexigpt-output.json``
            marker: resources, exports) has its files checked against the recorded sha256.

    Returns:
        ``(model, tokenizer)`` with the model in eval mode.

    Raises:
        ModelLoadError: the path does not exist / holds no checkpoint, or the hub id cannot
            be resolved (unknown id, no network, gated model without a token).
        CheckpointError: a file of a harness-written directory changed since it was written.
        UnsupportedArchitectureError: the model family has no adapter.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from flexigpt import devices

    device = devices.resolve_device(device)  # a bad setting fails before any loading
    spec = str(spec)
    local = Path(spec).expanduser()
    if looks_local(spec) and not (local / "config.json").is_file():
        what = "does not exist" if not local.exists() else "has no config.json"
        raise ModelLoadError(f"model path {spec!r} is not a checkpoint directory (it {what}); "
                             "it looks like a local path, so it is not looked up on the hub — "
                             "build it first (e.g. flexigpt fetch) or give a hub id")
    if (local / "config.json").is_file():
        spec = str(local)
        if verify:
            from flexigpt.artifacts import verify_marker

            verify_marker(local)
        config = AutoConfig.from_pretrained(spec)
    else:
        config = _hub_config(spec)
    get_adapter(config)  # fail early on unsupported families
    model = AutoModelForCausalLM.from_pretrained(spec, dtype=parse_dtype(dtype))
    tokenizer = AutoTokenizer.from_pretrained(spec)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer
