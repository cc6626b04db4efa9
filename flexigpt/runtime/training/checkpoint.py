"""Training checkpoints in ``<out>.ckpt/``, written atomically, resumed exactly.

A checkpoint holds what the trajectory depends on after step k:

- ``trainable.pt``: every trainable tensor by parameter name (LoRA, γ, or all weights for
  ``full``); frozen weights come from the input model again on resume;
- ``optimizer.pt``: AdamW and LR-scheduler state;
- ``state.json``: step, data position (sequences consumed), train seconds so far, the log
  rows so far, and a fingerprint of every setting that shapes the trajectory.

RNG state needs no file: the loop reseeds torch from ``(seed, step, rank)`` at the start of
every step (dropout is the only consumer) and the data order is a pure function of the
position (:mod:`flexigpt.runtime.training.data`), so step k+1 of a resumed run is computed exactly
as in an uninterrupted one.

The folder is the harness's own: each save writes an output marker (``kind``
:data:`KIND`, the files it holds) into it, and a ``<out>.ckpt`` or ``<out>.ckpt.old`` that
is not one (no marker, or files the marker does not list; checkpoints written before
markers are recognised by their three files) is never resumed from, replaced or deleted:
:func:`check_owned` refuses it in one line, ``--force`` or not.

Writes go to a temporary sibling (``.<name>.partial-<pid>-*``, removed by the next save
when its writer is dead); the previous checkpoint is moved aside and deleted only after the
new one is in place, so an interruption never leaves no checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from flexigpt.core import faults
from flexigpt.core.fileio import (
    MARKER,
    CheckpointError,
    OutputExistsError,
    clean_partials,
    foreign_reason,
    make_staging,
    read_json_or_none,
    tree_entries,
)

STATE = "state.json"
FORMAT = 1
#: the output kind in a checkpoint folder's marker
KIND = "training-checkpoint"
#: the files a checkpoint save writes (besides its marker)
FILES = ("trainable.pt", "optimizer.pt", STATE)


@dataclass
class TrainState:
    """Progress of a run; ``log`` rows are dicts with step, tokens, loss, lr, ppl."""

    step: int = 0
    position: int = 0
    train_seconds: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)


def checkpoint_dir(out_dir: str | os.PathLike) -> Path:
    """``<out>.ckpt`` next to the output directory."""
    out = Path(out_dir)
    return out.with_name(out.name + ".ckpt")


def moved_aside(ckpt: Path) -> Path:
    """``<ckpt>.old``: where a save moves the previous checkpoint until the new one is in
    place."""
    return ckpt.with_name(ckpt.name + ".old")


def _legacy(path: Path) -> bool:
    """Whether ``path`` is a checkpoint written before checkpoint markers: the three
    :data:`FILES` alone, its ``state.json`` a record with a fingerprint."""
    files, dirs = tree_entries(path)
    state = read_json_or_none(path / STATE)
    return (not dirs and sorted(files) == sorted(FILES) and isinstance(state, dict)
            and "fingerprint" in state)


def check_owned(ckpt: Path) -> None:
    """Refuse to train when ``ckpt`` or its moved-aside ``<ckpt>.old`` holds anything but a
    checkpoint of this harness: the trainer resumes from, replaces and deletes them, and a
    folder of the user's that happens to bear the name is never touched.

    Raises:
        OutputExistsError: naming the folder and what is wrong with it (no ``--force``
            lifts it: the user never named this folder).
    """
    for path in (ckpt, moved_aside(ckpt)):
        reason = foreign_reason(path, KIND)
        if reason is not None and path.is_dir() and not path.is_symlink() and _legacy(path):
            reason = None
        if path.is_symlink():
            reason = "it is a symbolic link"
        if reason is not None:
            raise OutputExistsError(
                f"the training checkpoint folder {str(path)!r} (written beside --out) exists "
                f"and {reason}; refusing to use, replace or delete it: move it away or "
                "choose another --out")


def fingerprint(settings: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the settings that shape the trajectory."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(ckpt: Path, model: nn.Module, optimizer: Any, scheduler: Any,
                    state: TrainState, digest: str) -> None:
    """Write a checkpoint atomically (``model`` unwrapped; call on the main process only)."""
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    clean_partials(ckpt)  # a save that was killed mid-write
    tmp = make_staging(ckpt)
    old = moved_aside(ckpt)
    try:
        torch.save(trainable_state(model), tmp / "trainable.pt")
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
                   tmp / "optimizer.pt")
        (tmp / STATE).write_text(json.dumps(
            {"format": FORMAT, "fingerprint": digest, "step": state.step,
             "position": state.position, "train_seconds": state.train_seconds,
             "log": state.log}, indent=1))
        (tmp / MARKER).write_text(json.dumps({"kind": KIND, "files": dict.fromkeys(FILES)},
                                             indent=1, sort_keys=True) + "\n")
        faults.point("ckpt:staged")
        if ckpt.exists():
            if old.exists():
                shutil.rmtree(old)
            os.replace(ckpt, old)
            faults.point("ckpt:swap")
        os.replace(tmp, ckpt)
        if old.exists():
            shutil.rmtree(old)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def find_checkpoint(ckpt: Path) -> Path | None:
    """The checkpoint directory to resume from (the moved-aside one if a swap was cut)."""
    for path in (ckpt, moved_aside(ckpt)):
        if (path / STATE).is_file():
            return path
    return None


def read_state(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / STATE).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"training checkpoint {str(path)!r} is unreadable: {err}") from None


def _load_part(file: Path) -> dict[str, Any]:
    """One file of a checkpoint (a dict of tensors and plain state), loaded with
    ``weights_only=True``.

    Raises:
        CheckpointError: naming the file when it is missing, unreadable, corrupt, holds
            objects a checkpoint of this harness never holds (refused, never unpickled), or
            is not a dict. Starting over means deleting the checkpoint directory.
    """
    import pickle

    fix = f"delete {str(file.parent)!r} to start the training over"
    try:
        loaded = torch.load(file, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"training checkpoint file {str(file)!r} is not one this harness wrote (corrupt, "
            f"or it holds objects other than tensors and plain state); refusing to load it: "
            f"{fix}") from None
    except (OSError, RuntimeError, EOFError, ValueError) as err:
        reason = " ".join(str(err).split()) or type(err).__name__
        raise CheckpointError(f"training checkpoint file {str(file)!r} is unreadable or "
                              f"corrupt ({reason}): {fix}") from None
    if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
        raise CheckpointError(f"training checkpoint file {str(file)!r} holds a "
                              f"{type(loaded).__name__}, not a dict by name: {fix}")
    return loaded


def load_checkpoint(ckpt: Path, model: nn.Module, optimizer: Any, scheduler: Any,
                    digest: str) -> TrainState | None:
    """Restore trainable tensors, optimizer and scheduler; None when there is no checkpoint.

    Raises:
        CheckpointError: the checkpoint was made with other settings (fingerprint), a file
            of it is corrupt or crafted (:func:`_load_part`), or its tensors or optimizer
            state do not match the model's trainable set; the message names the file.
    """
    path = find_checkpoint(ckpt)
    if path is None:
        return None
    meta = read_state(path)
    if meta.get("format") != FORMAT or meta.get("fingerprint") != digest:
        raise CheckpointError(
            f"training checkpoint {str(path)!r} was written by a run with different settings "
            "(model, text, config or recipe); rerun with the same settings to resume, or "
            "delete it to start over")
    tensors = _load_part(path / "trainable.pt")
    opt = _load_part(path / "optimizer.pt")
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if (not all(isinstance(t, torch.Tensor) for t in tensors.values())
            or set(params) != set(tensors)
            or any(params[n].shape != t.shape for n, t in tensors.items())):
        raise CheckpointError(f"training checkpoint file {str(path / 'trainable.pt')!r} does "
                              "not match the model's trainable parameters")
    if not isinstance(opt.get("optimizer"), dict) or not isinstance(opt.get("scheduler"), dict):
        raise CheckpointError(f"training checkpoint file {str(path / 'optimizer.pt')!r} lacks "
                              "the optimizer or scheduler state")
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor)
    try:
        optimizer.load_state_dict(opt["optimizer"])
        scheduler.load_state_dict(opt["scheduler"])
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as err:
        raise CheckpointError(f"training checkpoint file {str(path / 'optimizer.pt')!r} does "
                              f"not fit this run's optimizer ({type(err).__name__}: {err})"
                              ) from None
    return TrainState(step=int(meta["step"]), position=int(meta["position"]),
                      train_seconds=float(meta["train_seconds"]), log=list(meta["log"]))


def remove_checkpoint(ckpt: Path) -> None:
    """The checkpoint, its moved-aside predecessor and any partial save of it."""
    for path in (ckpt, moved_aside(ckpt)):
        if path.exists():
            shutil.rmtree(path)
    clean_partials(ckpt)
