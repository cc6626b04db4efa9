"""Loading dense models from a local checkpoint or the Hugging Face hub, and the family
config of a saved model directory (:func:`family_config`), never running remote code."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from flexigpt.core import devices
from flexigpt.core.fileio import PICKLE_SUFFIXES, check_safetensors, verify_marker
from flexigpt.storage.models.adapters import get_adapter
from flexigpt.storage.models.checkpoint_format import KEY, base_config_dict


class ModelLoadError(RuntimeError):
    """A model spec could not be resolved to a checkpoint (bad path, unknown id, no hub), or
    names one the harness does not load (remote code, pickled weights)."""


#: the JSON files of a checkpoint whose ``auto_map`` makes transformers import code that
#: the checkpoint brings along
REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json")


def _auto_map_modules(auto_map: object) -> list[str]:
    """The code files an ``auto_map`` entry points at (``module.Class`` → ``module.py``;
    ``repo--module.Class`` → ``repo--module.py``)."""
    refs = list(auto_map.values()) if isinstance(auto_map, dict) else auto_map
    refs = refs if isinstance(refs, (list, tuple)) else [refs]
    out = []
    for ref in refs:
        for item in ref if isinstance(ref, (list, tuple)) else [ref]:
            if isinstance(item, str) and "." in item:
                out.append(item.rsplit(".", 1)[0] + ".py")
    return sorted(set(out))


def remote_code(config_dicts: dict[str, dict]) -> str | None:
    """What remote code the named config dicts (``{file name: JSON}``) ask for, as
    ``"config.json auto_map → modeling_x.py"``; None when none does."""
    found = [f"{name} auto_map → {', '.join(_auto_map_modules(d['auto_map'])) or '?'}"
             for name, d in config_dicts.items() if isinstance(d, dict) and d.get("auto_map")]
    return "; ".join(found) or None


def refuse_remote_code(directory: str | os.PathLike,
                       files: tuple[str, ...] = REMOTE_CODE_FILES) -> None:
    """Raise :class:`ModelLoadError` when ``directory``'s ``files`` (JSON; absent or
    unreadable ones are left to the loaders) carry an ``auto_map``: loading it needs code
    the directory brings along, which flexigpt-bench never runs (every harness load passes
    ``trust_remote_code=False``, so transformers never asks either)."""
    dicts = {}
    for name in files:
        try:
            dicts[name] = json.loads((Path(directory) / name).read_text())
        except (OSError, ValueError):
            continue
    what = remote_code(dicts)
    if what is not None:
        raise _remote_code_error(str(directory), what)


def family_config(model_dir: str | os.PathLike) -> Any:
    """The family config (``LlamaConfig`` …) of a saved dir, self-contained or plain.

    Never runs the directory's code: a self-contained dir's config is rebuilt from the
    family's own class (its ``auto_map`` is not used); a plain one that asks for remote
    code is refused (:func:`refuse_remote_code`: ``ModelLoadError``) and every other is
    read with ``trust_remote_code=False``.
    """
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path = Path(model_dir) / "config.json"
    try:
        config_dict = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):  # its own error message
        return AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    if not isinstance(config_dict, dict) or KEY not in config_dict:
        refuse_remote_code(model_dir, files=("config.json",))
        return AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    base = base_config_dict(config_dict)
    config = CONFIG_MAPPING[base["model_type"]].from_dict(base)
    config._name_or_path = str(model_dir)
    return config


def _remote_code_error(where: str, what: str) -> ModelLoadError:
    return ModelLoadError(
        f"model {where!r} needs remote code ({what}), which flexigpt-bench never runs; if "
        "you trust it, load it with transformers yourself (trust_remote_code=True)")


def refuse_pickled_weights(directory: str | os.PathLike) -> None:
    """Raise :class:`ModelLoadError` when ``directory`` holds pickled weights
    (:data:`flexigpt.core.fileio.PICKLE_SUFFIXES`) and no safetensors: the harness loads
    safetensors only (unpickling can run code), and transformers is told so too."""
    directory = Path(directory)
    names = sorted(p.name for p in directory.iterdir() if p.is_file())
    pickled = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
    for index in (n for n in names if n.endswith(".safetensors.index.json")):
        missing = sorted(set(_index_shards(directory / index)) - set(names))
        if missing:
            raise ModelLoadError(
                f"model directory {str(directory)!r}: {index} names safetensors shards that are "
                f"not there ({missing[:3]})" + (f"; its pickled weights {pickled} are not "
                                                "loaded (unpickling can run code)"
                                                if pickled else ""))
    if any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names):
        return
    if pickled:
        raise ModelLoadError(
            f"model directory {str(directory)!r} holds pickled weights {pickled} and no "
            "safetensors; flexigpt-bench loads safetensors only (unpickling can run code) — "
            "convert the weights to safetensors first")


def _index_shards(index: Path) -> list[str]:
    """The shard files a sharded-safetensors index names (``weight_map`` values); a
    :class:`ModelLoadError` naming the index when it is not such a JSON object."""
    import json

    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        shards = list(dict(data["weight_map"]).values())
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelLoadError(f"{str(index)!r} is not a safetensors index "
                             f"({type(err).__name__}: {err})") from None
    return [str(s) for s in dict.fromkeys(shards)]


def _refuse_flexigpt_without_manifest(directory: Path) -> None:
    """A compressed model written by this harness (``config.json`` with
    ``flexigpt_compression``) rebuilds only from its manifest; say so instead of letting
    transformers fail on the unknown model type."""
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return
    if isinstance(config, dict) and KEY in config:
        raise ModelLoadError(
            f"model directory {str(directory)!r} is a flexigpt-bench compressed model "
            f"(config.json {KEY}) without its manifest.json, which load_compressed needs to "
            "rebuild it")


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

    def config(**kw):
        from transformers import PreTrainedConfig

        config_dict, _ = PreTrainedConfig.get_config_dict(spec, **kw)
        what = remote_code({"config.json": config_dict})
        if what is not None:
            raise _remote_code_error(spec, what)
        return AutoConfig.from_pretrained(spec, trust_remote_code=False, **kw)

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        try:
            return config(local_files_only=True)
        except (OSError, ValueError):
            pass
        if hub_offline():
            raise fail("the Hugging Face hub is disabled (HF_HUB_OFFLINE=1)")
        if not hub_reachable():
            raise fail(f"the Hugging Face hub ({hub_endpoint()}) is unreachable (no connection "
                       f"within {HUB_TIMEOUT_S:g} s)")
        try:
            return config()
        except (OSError, ValueError) as err:
            raise fail("the Hugging Face hub did not provide it", err) from None
    finally:
        hf_logging.set_verbosity(verbosity)


#: the files of a hub repository a load reads: configs, safetensors weights and their index,
#: tokenizer files; top level only (``ignore_patterns``), and never pickled weights
HUB_LOAD_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


def _hub_snapshot(spec: str) -> Path:
    """The files of hub id ``spec`` a load reads (:data:`HUB_LOAD_FILES`), as a folder of
    the local hub cache: downloaded at the repository's current commit (or those cached,
    when the hub is disabled or unreachable), each checked against the hash the hub recorded
    for it (:func:`~flexigpt.storage.models.hub_cache.snapshot_problems`).

    Raises:
        ModelLoadError: the download failed, a file is not what the hub recorded, or the
            repository has no safetensors weights.
    """
    from huggingface_hub import snapshot_download

    from flexigpt.storage.models.hub_cache import snapshot_problems

    try:
        folder = Path(snapshot_download(spec, allow_patterns=HUB_LOAD_FILES,
                                        ignore_patterns=["*/*"]))
    except Exception as err:  # noqa: BLE001  (huggingface_hub raises many types for one failure)
        text = str(err).strip().splitlines()
        raise ModelLoadError(f"cannot download model {spec!r} from the Hugging Face hub "
                             f"({hub_endpoint()}): {type(err).__name__}: "
                             f"{text[0] if text else ''}") from None
    problems = snapshot_problems(folder)
    if problems:
        raise ModelLoadError(
            f"hub model {spec!r}: {len(problems)} downloaded file(s) differ from what the hub "
            f"recorded ({'; '.join(problems[:3])}); nothing was loaded — delete "
            f"{str(folder.parent.parent)!r} to download it again")
    if not any(folder.glob("*.safetensors")):
        raise ModelLoadError(
            f"hub model {spec!r} has no safetensors weights (its weights: "
            f"{_hub_pickled(spec) or 'none'}); flexigpt-bench loads safetensors only "
            "(unpickling can run code), so pickled weights are not even downloaded")
    return folder


def _hub_pickled(spec: str) -> list[str]:
    """The pickled weight files of hub id ``spec`` (for a message; [] when the hub does not
    answer)."""
    from huggingface_hub import HfApi

    try:
        files = HfApi().list_repo_files(spec)
    except Exception:  # noqa: BLE001  (a message detail only)
        return []
    return sorted(f for f in files if f.endswith(PICKLE_SUFFIXES))


def load_model(spec: str | os.PathLike, dtype: str | torch.dtype = "float32",
               device: str = "cpu", verify: bool = True,
               mapped: bool = True) -> tuple[nn.Module, object]:
    """Load a dense causal LM and its tokenizer.

    Args:
        spec: a local checkpoint directory (``config.json`` inside) or a hub id such as
            ``meta-llama/Llama-2-7b-hf``.
        dtype: weight dtype.
        device: where the weights go, a :mod:`flexigpt.core.devices` setting (``auto`` = CUDA
            where available).
        verify: a local directory written by this harness (``.flexigpt-output.json``
            marker: resources, exports) may hold only the files its marker lists, each
            unchanged (sha256).
        mapped: leave the weights memory-mapped from the checkpoint (transformers' default:
            pages load as they are touched). ``False`` reads them into process memory
            (:func:`own_weights`; CPU weights, a hub id's from its cache folder), for
            callers that replace weights: a replaced weight of a mapping stays resident
            until every weight of its file is gone, so compressing a mapped model holds up
            to two copies of it.

    Never runs code the checkpoint brings along (``trust_remote_code=False``; a checkpoint
    that needs it is refused) and loads safetensors weights only. A hub id's files are
    downloaded into the hub cache first (:func:`_hub_snapshot`: each checked against the
    hash the hub recorded for it) and that folder passes the checks of a local directory.

    Returns:
        ``(model, tokenizer)`` with the model in eval mode.

    Raises:
        ModelLoadError: the path does not exist / holds no checkpoint, or the hub id cannot
            be resolved (unknown id, no network, gated model without a token) or a file
            it downloaded differs from what the hub recorded; the checkpoint needs remote
            code or holds pickled weights and no safetensors.
        CheckpointError: a harness-written directory holds a file its marker does not
            list, names a path outside itself, or a file changed since it was written.
        UnsupportedArchitectureError: the model family has no adapter.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

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
        _check_local(local, verify)
        get_adapter(AutoConfig.from_pretrained(spec, trust_remote_code=False))
        source = spec
    else:
        get_adapter(_hub_config(spec))  # an unsupported family fails before the download
        source = str(_hub_snapshot(spec))
        _check_local(Path(source), verify=False)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=parse_dtype(dtype),
                                                 trust_remote_code=False, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    model.config.name_or_path = tokenizer.name_or_path = spec  # the hub id, not the cache
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = model.to(device)  # type: ignore[arg-type]  # @wraps on HF .to: self unbound
    if not mapped:
        own_weights(model, Path(source))
    return model.eval(), tokenizer


#: safetensors dtype names (``get_slice(key).get_dtype()``) of the dtypes models store
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                       "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                       "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                       "BOOL": torch.bool}


def own_weights(model: nn.Module, directory: Path) -> int:
    """Replace every CPU parameter and buffer that ``directory``'s safetensors files hold (same
    name, shape and dtype) by a copy read with positioned reads, not through a memory map.

    The values are the same bytes, so every result is unchanged; what changes is memory:
    the mapped pages are released once no tensor refers to them (the mapping closes with its
    last tensor), and a weight replaced later is freed at once. Tied parameters are one
    object and are read once. Returns the number of tensors replaced.
    """
    from safetensors import safe_open

    named: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=True))
    named.update(dict(model.named_buffers(remove_duplicate=True)))
    done = 0
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu", backend="pread") as handle:
            for key in handle.keys():  # noqa: SIM118  (a safe_open handle is not iterable)
                target = named.pop(key, None)
                if target is None or target.device.type != "cpu":
                    continue
                stored = handle.get_slice(key)
                if (list(target.shape) != list(stored.get_shape())
                        or _SAFETENSORS_DTYPES.get(stored.get_dtype()) != target.dtype):
                    continue  # converted on loading: not mapped, nothing to read
                target.data = handle.get_tensor(key)
                done += 1
    return done


def _check_local(directory: Path, verify: bool) -> None:
    """Refuse a local checkpoint directory before transformers reads it: one that needs
    remote code, a harness-compressed model without its manifest, pickled weights without
    safetensors; with ``verify``, a harness-written one that differs from its marker; a
    family without an adapter; a damaged safetensors file (named, with what is wrong)."""
    refuse_remote_code(directory)
    _refuse_flexigpt_without_manifest(directory)
    refuse_pickled_weights(directory)
    if verify:
        verify_marker(directory)
    _refuse_unknown_family(directory)
    for weights in sorted(directory.glob("*.safetensors")):
        check_safetensors(weights)


def _refuse_unknown_family(directory: Path) -> None:
    """``config.json``'s ``model_type`` must be one the harness has an adapter for: refused
    before transformers reads it (whose own message for a type it does not know advises
    installing it from source), naming the supported families."""
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if isinstance(model_type, str):
        get_adapter(SimpleNamespace(model_type=model_type))
