"""The manifest every saved model carries (``manifest.json``), as one typed, versioned record.

A :class:`Manifest` says what was done to a model and how to rebuild it. It is built here
(:meth:`Manifest.new`: by ``flexigpt.api.compression.compress`` and, for a plain checkpoint that gets
trained, by the trainer), extended by the trainer (:meth:`Manifest.with_history`: one
``history`` entry per training run), completed by :func:`flexigpt.storage.artifacts.save_compressed`
(``format_version``, ``weights`` sha256/size/sharing map, ``files``) and read back by
:meth:`Manifest.from_dict` (``flexigpt.storage.artifacts.read_manifest``).

Contract: ``to_dict()`` is exactly the JSON written to disk, and
``Manifest.from_dict(d).to_dict() == d`` for every manifest the current code writes.
``from_dict`` accepts :data:`FORMAT_VERSION` and earlier ones (applying :data:`MIGRATIONS`),
and raises :class:`flexigpt.core.fileio.CheckpointError` naming the source and the key for a
newer or unknown version, a missing required key or a value of the wrong type.

Version history: version 1 (the only one) was written from the first release on; keys that
later code added without a version bump are filled in by :data:`MIGRATIONS`.

Paths: ``weights.file`` and every key of ``files`` are paths relative to the model
directory; ``from_dict`` refuses an absolute one or one with a ``..`` part (so no manifest
names a file outside its directory; ``load_compressed`` also refuses symlinks out).
``files`` (``{path: sha256}``) lists every file the save wrote besides ``manifest.json``,
the weights and the output marker; ``load_compressed`` refuses a directory holding any
other file (bar the records no loader reads, ``flexigpt.storage.artifacts.RECORD_FILES``). A
manifest saved before ``files`` existed is migrated to ``files == {}``: *no list* (a save
always records ``config.json``), so nothing tells its own files from ones added later;
``load_compressed`` loads such a directory only with ``verify=False`` (then save it again
to record its files).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from flexigpt.core.fileio import CheckpointError, escapes

JSON = dict[str, Any]

#: the ``format_version`` :func:`flexigpt.storage.artifacts.save_compressed` writes
FORMAT_VERSION = 1
#: manifest keys (at any depth outside ``structure``) that differ between identical runs;
#: :func:`manifest_hash` leaves them out
VOLATILE_KEYS = frozenset({"created", "compress_seconds", "timings", "train_seconds",
                           "wall_seconds", "tokens_per_second", "build_seconds", "built_at"})

#: top-level keys of every manifest :meth:`Manifest.new` builds, besides the provenance keys
#: (:data:`PROVENANCE_KEYS`) and the method extras (e.g. ``compress_seconds``)
KEYS = ("method", "config", "base_model", "structure", "info", "parameters", "calibration",
        "seed", "dtype", "created", "history")
#: the keys :func:`flexigpt.core.provenance.provenance` adds
PROVENANCE_KEYS = ("versions", "code_version", "git_commit")
#: the keys :func:`flexigpt.storage.artifacts.save_compressed` adds
SAVED_KEYS = ("format_version", "weights", "files")


def _fail(source: str, message: str) -> CheckpointError:
    return CheckpointError(f"{source}: {message}")


def _typed(source: str, key: str, value: Any, kinds: tuple[type, ...], what: str) -> Any:
    """``value`` when it is one of ``kinds`` (bool never counts as a number), else raise."""
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise _fail(source, f"{key!r} must be {what}, got {type(value).__name__} {value!r:.80}")
    return value


def _record(cls: type, source: str, key: str, data: Any, types: dict[str, tuple]) -> Any:
    """A typed record ``cls`` from the JSON object ``data`` at ``key`` (exact key set)."""
    _typed(source, key, data, (dict,), "an object")
    for name in data:
        if name not in types:
            raise _fail(source, f"'{key}.{name}' is not a known field of {key!r}")
    optional = {f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    for name, (kinds, what) in types.items():
        if name in data:
            _typed(source, f"{key}.{name}", data[name], kinds, what)
        elif name not in optional:
            raise _fail(source, f"{key!r} lacks the required key {name!r}")
    return cls(**data)


_INT, _STR, _OBJ = ((int,), "an integer"), ((str,), "a string"), ((dict,), "an object")
_NUM, _OPT_STR = ((int, float), "a number"), ((str, type(None)), "a string or null")


@dataclass(frozen=True)
class Parameters:
    """Parameter counts (``flexigpt.core.params.count_parameters``) and ``1 − compressed/dense``."""

    dense: int
    compressed: int
    achieved_ratio: float

    TYPES = {"dense": _INT, "compressed": _INT, "achieved_ratio": _NUM}


@dataclass(frozen=True)
class Calibration:
    """The calibration sample a method saw: ``n_windows`` windows of ``seq_len`` tokens of
    ``file``, drawn with ``sample_seed``."""

    file: str
    n_windows: int
    seq_len: int
    sample_seed: int

    TYPES = {"file": _STR, "n_windows": _INT, "seq_len": _INT, "sample_seed": _INT}


@dataclass(frozen=True)
class Weights:
    """The saved weights file, its sha256 and size, and its ``{dropped: kept}`` sharing map
    (None: not recorded, a manifest saved before sharing maps were)."""

    file: str
    sha256: str
    bytes: int
    shared: dict[str, str] | None = None

    TYPES = {"file": _STR, "sha256": _STR, "bytes": _INT,
             "shared": ((dict, type(None)), "an object")}

    def to_dict(self) -> JSON:
        out = dataclasses.asdict(self)
        if self.shared is None:
            del out["shared"]
        return out


def _structure_defaults(method: str, structure: JSON) -> JSON:
    """Keys a method's structure gained later, with the value older models mean
    (``MethodFacts.structure_defaults``: e.g. SliceGPT's ``head_bias``, added with OPT)."""
    from flexigpt.storage.registry import METHODS

    facts = METHODS.get(method)
    missing = {k: v for k, v in (facts.structure_defaults if facts else ()) if k not in structure}
    return {**structure, **missing} if missing else structure


def _check_paths(source: str, data: JSON) -> None:
    """``weights.file`` and the keys of ``files`` are relative paths inside the directory,
    and every ``files`` value is a string (the sha256); else raise naming the key."""
    files = data.get("files") or {}
    for name, digest in files.items():
        _typed(source, f"files[{name!r}]", digest, (str,), "a string (sha256)")
    weights = data.get("weights")
    named = [("weights.file", weights["file"])] if isinstance(weights, dict) and isinstance(
        weights.get("file"), str) else []
    for key, path in [*named, *(("files", name) for name in files)]:
        if escapes(path):
            raise _fail(source, f"{key} {path!r} is not a path inside the model directory "
                                "(absolute or with '..'); refusing to read it")


def _migrate_files(data: JSON) -> JSON:
    """Saved manifests written before file hashes were recorded lack ``files``: ``{}``, no
    list (see the module docstring: such a directory loads only with ``verify=False``)."""
    if data.get("format_version") is not None and "files" not in data:
        return {**data, "files": {}}
    return data


#: structure keys later code added (applied by :func:`migrate_structure`)
STRUCTURE_MIGRATIONS: tuple[Callable[[str, JSON], JSON], ...] = (_structure_defaults,)


def migrate_structure(method: str, structure: JSON) -> JSON:
    """``structure`` of a ``method`` model with the keys later code added filled in (also
    for the copy in a saved ``config.json``)."""
    for step in STRUCTURE_MIGRATIONS:
        structure = step(method, structure)
    return structure


def _migrate_structure(data: JSON) -> JSON:
    if isinstance(data.get("method"), str) and isinstance(data.get("structure"), dict):
        return {**data, "structure": migrate_structure(data["method"], data["structure"])}
    return data


#: what :meth:`Manifest.from_dict` fills into an older (or older-code) manifest, in order;
#: each step leaves a current manifest unchanged. A missing ``weights.shared`` stays None.
MIGRATIONS: tuple[Callable[[JSON], JSON], ...] = (_migrate_files, _migrate_structure)


@dataclass(frozen=True)
class Manifest:
    """A saved model's manifest (see the module docstring for the contract).

    ``history`` holds one JSON object per training run (the trainer's entry: ``stage``
    ``"train"``, ``recipe``, ``plan``, ``config``, ``trainable``, ``tokens``, ``steps``,
    ``ppl_before``, ``final_ppl``, timings, ...). ``extras`` holds the method's further
    top-level keys (``compress_seconds``, ``device``). ``format_version``, ``weights`` and
    ``files`` are None until the manifest is saved.
    """

    method: str
    config: JSON
    base_model: str | None
    structure: JSON
    info: JSON
    parameters: Parameters
    calibration: Calibration | None
    seed: int
    dtype: str
    created: str
    history: list[JSON]
    versions: dict[str, str]
    code_version: str
    git_commit: str | None
    extras: JSON = field(default_factory=dict)
    format_version: int | None = None
    weights: Weights | None = None
    files: dict[str, str] | None = None

    @classmethod
    def new(cls, method: str, *, config: JSON, base_model: str | None, structure: JSON,
            info: JSON, dense_params: int, compressed_params: int,
            calibration: JSON | None, seed: int, dtype: str, **extra: Any) -> Manifest:
        """A fresh manifest (empty ``history``, provenance of this process).

        Args:
            method: registry key; config: the method's options (JSON); base_model: the dense
                model it came from; structure: what ``Method.rebuild`` needs; info: the
                method's record (``info["recovery"]``: a ``RecoveryRecipe``);
                dense_params / compressed_params: ``count_parameters`` before / after;
                calibration: ``{file, n_windows, seq_len, sample_seed}`` or None; extra:
                further top-level keys (e.g. ``compress_seconds``).

        Raises:
            ValueError: an extra would replace a field of the manifest.
        """
        from flexigpt.core.params import compression_ratio
        from flexigpt.core.provenance import provenance

        clash = sorted(set(extra) & _FIELD_KEYS)
        if clash:
            raise ValueError(f"manifest extras {clash} would replace required keys")
        ratio = compression_ratio(compressed_params, dense_params)
        prov: Any = provenance()  # versions, code_version, git_commit (typed as dict of object)
        return cls(method=method, config=config, base_model=base_model, structure=structure,
                   info=info, parameters=Parameters(dense_params, compressed_params, ratio),
                   calibration=None if calibration is None else Calibration(**calibration),
                   seed=seed, dtype=dtype,
                   created=datetime.now(UTC).isoformat(timespec="seconds"),
                   history=[], extras=dict(extra), **prov)

    def with_history(self, entry: JSON) -> Manifest:
        """This manifest with one more ``history`` entry (a training run)."""
        return dataclasses.replace(self, history=[*self.history, entry])

    def trainings(self) -> list[JSON]:
        """The ``history`` entries of training runs (``stage == "train"``), oldest first."""
        return [h for h in self.history if h.get("stage") == "train"]

    def to_dict(self) -> JSON:
        """The JSON form (what ``manifest.json`` holds; unsaved: no ``format_version``,
        ``weights``, ``files``). A deep copy: changing it leaves the manifest as it was."""
        out: JSON = {"method": self.method, "config": self.config,
                     "base_model": self.base_model, "structure": self.structure,
                     "info": self.info, "parameters": dataclasses.asdict(self.parameters),
                     "calibration": (None if self.calibration is None
                                     else dataclasses.asdict(self.calibration)),
                     "seed": self.seed, "dtype": self.dtype, "created": self.created,
                     "history": self.history, **self.extras,
                     "versions": self.versions, "code_version": self.code_version,
                     "git_commit": self.git_commit}
        if self.format_version is not None:
            out["format_version"] = self.format_version
        if self.weights is not None:
            out["weights"] = self.weights.to_dict()
        if self.files is not None:
            out["files"] = self.files
        return copy.deepcopy(out)

    @classmethod
    def from_dict(cls, data: Any, source: str = "manifest") -> Manifest:
        """The manifest in ``data`` (JSON), migrated to the current version.

        ``source`` names where it came from in errors (e.g. the file's path).

        Raises:
            CheckpointError: not an object, a newer or unknown ``format_version``, a missing
                required key, a value of the wrong type, or a path (``weights.file``, a
                ``files`` key) outside the directory (naming ``source`` and the key).
        """
        if not isinstance(data, dict):
            raise _fail(source, f"not a manifest: a JSON {type(data).__name__}, not an object")
        version = data.get("format_version")
        if version is not None:
            _typed(source, "format_version", version, (int,), "an integer")
            if version > FORMAT_VERSION:
                raise _fail(source, f"format_version {version} is newer than this code reads "
                                    f"({FORMAT_VERSION}); update flexigpt-bench")
            if version < 1:
                raise _fail(source, f"unknown format_version {version}")
        for key in ("method", "structure", *KEYS, *PROVENANCE_KEYS):
            if key not in data:
                raise _fail(source, f"lacks the required key {key!r}")
        if version is not None and "weights" not in data:
            raise _fail(source, "lacks the required key 'weights'")
        for step in MIGRATIONS:
            data = step(data)
        data = copy.deepcopy(data)
        for key, (kinds, what) in _TOP_TYPES.items():
            if key in data:
                _typed(source, key, data[key], kinds, what)
        if not all(isinstance(h, dict) for h in data["history"]):
            raise _fail(source, "'history' must be a list of objects")
        _check_paths(source, data)
        calibration = data["calibration"]
        weights = data.get("weights")
        return cls(
            **{k: data[k] for k in _PLAIN_KEYS if k in data},
            parameters=_record(Parameters, source, "parameters", data["parameters"],
                               Parameters.TYPES),
            calibration=None if calibration is None else _record(
                Calibration, source, "calibration", calibration, Calibration.TYPES),
            weights=None if weights is None else _record(
                Weights, source, "weights", weights, Weights.TYPES),
            extras={k: v for k, v in data.items() if k not in _FIELD_KEYS})


#: top-level JSON keys that are fields of :class:`Manifest` (every other key is an extra)
_FIELD_KEYS = frozenset({*KEYS, *PROVENANCE_KEYS, *SAVED_KEYS})
#: fields read from the JSON as they are (the records are built by :func:`_record`)
_PLAIN_KEYS = tuple(k for k in (*KEYS, *PROVENANCE_KEYS, *SAVED_KEYS)
                    if k not in ("parameters", "calibration", "weights"))
_TOP_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "method": _STR, "structure": _OBJ, "config": _OBJ, "base_model": _OPT_STR, "info": _OBJ,
    "seed": _INT, "dtype": _STR, "created": _STR, "history": ((list,), "a list"),
    "versions": _OBJ, "code_version": _STR, "git_commit": _OPT_STR, "files": _OBJ}


def _stable(value: Any, inside_structure: bool = False) -> Any:
    """``value`` without the :data:`VOLATILE_KEYS` entries (kept inside ``structure``)."""
    if isinstance(value, dict):
        return {k: _stable(v, inside_structure or k == "structure") for k, v in value.items()
                if inside_structure or k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_stable(v, inside_structure) for v in value]
    return value


def manifest_hash(manifest: Manifest) -> str:
    """sha256 of the canonical JSON (``to_dict()``) of a manifest (identifies an evaluated model).

    The manifest holds the structure (base map, ranks, ...), the weights' sha256 (which
    covers their sharing metadata) and the sha256 of every other file the rebuild reads, so
    the hash covers the whole checkpoint. Fields in :data:`VOLATILE_KEYS` (``created``
    timestamps, timings) are left out: identical runs give identical hashes.
    """
    stable = _stable(manifest.to_dict())
    return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()
