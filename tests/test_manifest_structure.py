"""Issue 48, item 3: the manifest describes what was loaded. Structural fields (removed
blocks, spans, replaced blocks and their bases, ranks) are checked against the saved model on
every load, and provenance that repeats them must agree: an edit is refused in one line
naming the directory and the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import make_model

from flexigpt.core.fileio import CheckpointError
from flexigpt.storage.artifacts import load_compressed


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_tokenizer, text_file) -> dict[str, Path]:
    """ShortGPT, LLM-Streamline and FlexiGPT compressions of a 4-block tiny Llama."""
    from flexigpt.api.compression import compress

    root = tmp_path_factory.mktemp("structure")
    make_model().save_pretrained(root / "dense")
    tiny_tokenizer.save_pretrained(root / "dense")
    runs = {"shortgpt": {"ratio": 0.4}, "streamline": {"ratio": 0.2},
            "flexigpt": {"ratio": 0.5, "rank": 4}}
    for method, options in runs.items():
        compress(method, str(root / "dense"), root / method, options=options,
                 calibration=str(text_file), n_calibration=2, calibration_seq_len=16)
    return {m: root / m for m in runs}


def _edited(saved: dict[str, Path], method: str, tmp_path: Path, edit) -> Path:
    copy = tmp_path / method
    shutil.copytree(saved[method], copy)
    data = json.loads((copy / "manifest.json").read_text())
    edit(data)
    (copy / "manifest.json").write_text(json.dumps(data))
    return copy


def test_untouched_manifests_load(saved):
    for directory in saved.values():
        assert load_compressed(directory).manifest is not None


@pytest.mark.parametrize("method, edit, words", [
    ("shortgpt", lambda d: d["info"].update(removed_blocks=[0]),
     "info.removed_blocks = [0] disagrees with structure.removed_blocks"),
    ("shortgpt", lambda d: (d["info"].update(removed_blocks=[0, 1, 2]),
                            d["structure"].update(removed_blocks=[0, 1, 2])),
     "config.json has 2 blocks, the structure implies 1 (4 dense blocks - 3 removed)"),
    ("shortgpt", lambda d: (d["info"].update(removed_blocks=[9]),
                            d["structure"].update(removed_blocks=[9])),
     "structure.removed_blocks must list distinct block positions in [0, 4)"),
    ("shortgpt", lambda d: (d["info"].update(dense_blocks="4"),
                            d["structure"].update(dense_blocks="4")),
     "structure.dense_blocks must be an integer >= 2"),
    ("streamline", lambda d: (d["info"].update(span="1,3"), d["structure"].update(span="1,3")),
     "structure.span must be [start, end]"),
    ("streamline", lambda d: d["info"].update(span=[v + 1 for v in d["structure"]["span"]]),
     "disagrees with structure.span"),
    ("streamline", lambda d: d["structure"].update(module="block"), None),  # as saved
    ("streamline", lambda d: (d["info"].update(module="conv"),
                              d["structure"].update(module="conv")),
     "structure.module must be 'block' or 'ffn'"),
    ("flexigpt", lambda d: (d["info"].update(pruned_blocks=[1, 2, 3]),
                            d["structure"].update(pruned_blocks=[1, 2, 3])),
     "structure.base_map must map exactly the pruned blocks [1, 2, 3]"),
    ("flexigpt", lambda d: d["structure"].update(ranks={"self_attn.q_proj": 0}),
     "structure.ranks must map linears to positive integers"),
])
def test_an_edited_structure_is_refused_naming_the_field(saved, tmp_path, method, edit, words):
    directory = _edited(saved, method, tmp_path, edit)
    if words is None:  # an edit that changes nothing loads
        assert load_compressed(directory).manifest is not None
        return
    with pytest.raises(CheckpointError) as err:
        load_compressed(directory)
    message = str(err.value)
    assert str(directory) in message and words in message and "\n" not in message
