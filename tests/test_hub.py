"""The hub code paths, run for real against a Hugging Face hub served on 127.0.0.1
(:mod:`hub_server`: why not olah is said there).

Each run is a subprocess started as a hub user starts it (``flexigpt compress --model
<org>/<name>``, ``flexigpt evaluate --source hub``, ``snakemake`` building a ``data.hub_text``
file), with ``HF_ENDPOINT`` pointing at the server (``huggingface_hub`` reads it at import),
a fresh ``HF_HOME`` and the offline switches of CI removed; only the pinned
``huggingface_hub`` / ``transformers`` / ``datasets`` / ``lm-eval`` talk to the server. The
served repositories: the tiny Llama of ``conftest.tiny_checkpoint`` (``testorg/tiny-llama``),
the same with its weights changed after the hub recorded them, one that needs remote code,
one with pickled weights only; a text dataset (parquet, like MiniPile's) and ARC-Easy in the
layout of ``allenai/ai2_arc``. The server stops at the end of the module.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, fake_docs, make_model, make_text, make_tokenizer
from hub_server import HubServer, git_blob_sha1

MODEL = "testorg/tiny-llama"
#: variables that would keep a run off the hub, or send it elsewhere (CI sets the first two)
KEEP_OUT = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN",
            "HUGGING_FACE_HUB_TOKEN", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE",
            "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_ENDPOINT")
#: seconds one hub user's run may take (a few on an idle machine)
RUN_TIMEOUT_S = 900
TEXT_DOCS = 60


class _Payload:
    """Unpickling it creates the directory ``target`` (what a pytorch_model.bin can do)."""

    def __init__(self, target: Path) -> None:
        self.target = str(target)

    def __reduce__(self):
        return os.makedirs, (self.target,)


def _model_repo(folder: Path) -> Path:
    """The tiny Llama + tokenizer of ``conftest.tiny_checkpoint``, and a model card."""
    make_model().save_pretrained(folder)
    make_tokenizer(make_text()).save_pretrained(folder)
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# tiny random Llama\n")
    return folder


def _parquet(rows: list[dict], path: Path) -> None:
    from datasets import Dataset

    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(rows).to_parquet(str(path))


def text_docs() -> list[str]:
    """The documents of the served text dataset: pseudo-English, some with line breaks and
    runs of spaces inside (the builder folds them)."""
    docs = make_text(n_docs=TEXT_DOCS, seed=3).strip().split("\n\n")
    return [d.replace(". ", ".\n  ", 1) if i % 3 == 0 else d for i, d in enumerate(docs)]


#: ARC-Easy docs per split of the served ``allenai/ai2_arc``
ARC_SPLITS = {"train": 3, "validation": 3, "test": 6}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    """The hub with every repository of this module, serving until the module ends;
    ``hub.pwned`` is where the pickled and the remote-code payloads would write."""
    root = tmp_path_factory.mktemp("hub")
    pwned = root / "pwned"
    with HubServer() as server:
        server.pwned = pwned  # type: ignore[attr-defined]
        server.add("model", MODEL, _model_repo(root / "tiny-llama"))

        tampered = _model_repo(root / "tampered")
        server.add("model", "testorg/tampered", tampered)
        weights = tampered / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-4:] = bytes(b ^ 0xFF for b in data[-4:])  # same size, one weight changed
        weights.write_bytes(bytes(data))

        remote = _model_repo(root / "remote-code")
        config = json.loads((remote / "config.json").read_text())
        config["auto_map"] = {"AutoConfig": "modeling_evil.EvilConfig",
                              "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
        (remote / "config.json").write_text(json.dumps(config))
        (remote / "modeling_evil.py").write_text(f"import os\nos.makedirs({str(pwned)!r})\n")
        server.add("model", "testorg/remote-code", remote)

        pickled = _model_repo(root / "pickled")
        (pickled / "model.safetensors").unlink()
        (pickled / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(pwned)))
        server.add("model", "testorg/pickled", pickled)

        texts = root / "texts"
        (texts / "README.md").parent.mkdir()
        (texts / "README.md").write_text("---\nlicense: cc-by-sa-4.0\n---\n# texts\n")
        docs = text_docs()
        _parquet([{"text": d} for d in docs[:-10]], texts / "data/train-00000-of-00001.parquet")
        _parquet([{"text": d} for d in docs[-10:]],
                 texts / "data/validation-00000-of-00001.parquet")
        server.add("dataset", "testorg/texts", texts)

        arc = root / "ai2_arc"
        arc.mkdir()
        files = "".join(f"  - split: {s}\n    path: ARC-Easy/{s}-*\n" for s in ARC_SPLITS)
        (arc / "README.md").write_text(f"---\nconfigs:\n- config_name: ARC-Easy\n  data_files:\n"
                                       f"{files}---\n# ai2_arc\n")
        for k, (split, n) in enumerate(ARC_SPLITS.items()):
            _parquet(fake_docs("arc_easy", n, seed=k),
                     arc / f"ARC-Easy/{split}-00000-of-00001.parquet")
        server.add("dataset", "allenai/ai2_arc", arc)
        yield server
    assert not pwned.exists(), "a payload the hub served was run"


def hub_env(hub: HubServer, home: Path) -> dict[str, str]:
    """The environment of a hub user's run: this one, with the hub at ``hub.endpoint``, the
    hub cache in ``home``, no offline switch, token or proxy, and the checkout importable."""
    env = {k: v for k, v in os.environ.items()
           if k not in KEEP_OUT and not k.lower().endswith("_proxy")}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(home), NO_PROXY="127.0.0.1,localhost",
               HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]))
    return env


def run(args: list[str], env: dict[str, str], cwd: Path,
        timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def error_line(out: subprocess.CompletedProcess) -> str:
    """The one error line of a refused command (exit 2, no traceback)."""
    lines = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, \
        out.stderr[-3000:]
    return lines[0]


def test_compress_by_repo_id_downloads_verifies_and_reuses_the_cache(hub, tmp_path):
    """``flexigpt compress --model <org>/<name>`` downloads the model from the hub and
    publishes exactly its weights; a second run with the hub disabled uses the cache."""
    from flexigpt.storage.artifacts import load_compressed
    from flexigpt.storage.models.loading import load_model

    env = hub_env(hub, tmp_path / "hf")
    served = load_model(hub.repos[("model", MODEL)].folder)[0].state_dict()
    for out, offline in (("online", False), ("offline", True)):
        before = len(hub.log)
        cmd = ["-m", "flexigpt", "compress", "--method", "dense", "--model", MODEL,
               "--out", str(tmp_path / out)]
        done = run(cmd, {**env, "HF_HUB_OFFLINE": "1"} if offline else env, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        loaded = load_compressed(tmp_path / out)
        assert loaded.manifest.base_model == MODEL
        published = loaded.model.state_dict()
        assert published.keys() == served.keys()
        assert all(published[k].equal(served[k]) for k in served)
        requests = hub.log[before:]
        weights = f"/{MODEL}/resolve/{hub.repos[('model', MODEL)].sha}/model.safetensors"
        assert (("GET", weights, 200) in requests) != offline, requests
    assert hub.unknown == []


@pytest.mark.parametrize("repo,words,never", [
    ("testorg/tampered", ["model.safetensors", "sha256", "differ from what the hub recorded"],
     None),
    ("testorg/remote-code", ["remote code", "modeling_evil.py"], "modeling_evil.py"),
    ("testorg/pickled", ["no safetensors weights", "pytorch_model.bin"], "pytorch_model.bin"),
    ("testorg/no-such-model", ["cannot resolve model", "did not provide it"], None)])
def test_hub_model_refusals(hub, tmp_path, repo, words, never):
    """What the harness refuses in a local directory it refuses from the hub, before any
    weight is used: a file that differs from the hash the hub recorded, remote code, pickled
    weights (never downloaded); an unknown id is one line too."""
    out = tmp_path / "out"
    done = run(["-m", "flexigpt", "compress", "--method", "dense", "--model", repo, "--out",
                str(out)], hub_env(hub, tmp_path / "hf"), tmp_path)
    line = error_line(done)
    for word in ["ModelLoadError", repo, *words]:
        assert word in line, (word, line)
    assert not out.exists()
    if never is not None:
        assert not [p for p in hub.fetched("GET") if p.endswith(never)]
    assert not hub.pwned.exists()


def test_config_with_hub_model_and_hub_data_runs(hub, tmp_path):
    """A config that takes everything from the hub (``model.path: <org>/<name>``,
    ``resource: null``, ``data.hub_text``, ``task_source: hub``) runs through Snakemake:
    ``fetch_hub_text`` streams each split into one document per paragraph (at most
    ``max_documents``), the ``compress`` job loads the model by repo id, and ``evaluate``
    scores lm-eval's ARC-Easy from the hub and the perplexity of the hub text's test split."""
    config = {
        "model": {"key": "tiny-hub", "name": "tiny Llama from the hub", "path": MODEL,
                  "resource": None},
        "data": {"train_text": "resources/text/hubtrain/train.txt",
                 "validation_text": "resources/text/hubval/validation.txt",
                 "tasks": None, "task_source": "hub",
                 "hub_text": {"hubtrain": {"dataset": "testorg/texts", "split": "train",
                                           "max_documents": 25},
                              "hubval": {"dataset": "testorg/texts", "split": "validation"}}},
        "calibration": {"n_windows": 4, "seq_len": 32}, "jobs": {"threads": 1, "gpu": 0},
        "ratios": [0.3], "methods": {"dense": {}},
        "training": {"tokens": 2048, "seq_len": 64, "micro_batch": 4, "global_batch": 8},
        "evaluation": {"tasks": ["arc_easy"], "limit": 4, "ppl_seq_len": 32,
                       "ppl_windows": 4, "batch_size": 8}}
    (tmp_path / "hub.yaml").write_text(json.dumps(config))
    run_dir = tmp_path / "results/tiny-hub/dense/default/full"
    texts = ["resources/text/hubtrain/train.txt", "resources/text/hubval/validation.txt"]
    done = run(["-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--cores", "1",
                texts[0], str(run_dir.relative_to(tmp_path) / "eval_final.json"),
                "--configfile", "hub.yaml"], hub_env(hub, tmp_path / "hf"), tmp_path,
               timeout=4 * RUN_TIMEOUT_S)  # five jobs, each its own process
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    docs = [" ".join(d.split()) for d in text_docs()]
    assert (tmp_path / texts[0]).read_text() == "\n\n".join(docs[:25]) + "\n"
    assert (tmp_path / texts[1]).read_text() == "\n\n".join(docs[-10:]) + "\n"
    manifest = json.loads((run_dir / "compressed/manifest.json").read_text())
    assert manifest["base_model"] == MODEL
    result = json.loads((run_dir / "eval_final.json").read_text())
    assert result["tasks"]["arc_easy"]["source"] == "hub"
    assert result["tasks"]["arc_easy"]["n_docs"] == 4
    assert result["perplexity"]["value"] > 1
    got = hub.fetched("GET")
    assert any(p.startswith("/datasets/testorg/texts/") and p.endswith(".parquet") for p in got)
    assert any(p.startswith("/datasets/allenai/ai2_arc/") for p in got)


def _records(result: Path) -> list[dict]:
    data = json.loads(result.read_text())
    lines = gzip.decompress((result.parent / data["records"]["tasks"]).read_bytes())
    return [json.loads(line) for line in lines.decode().splitlines()]


def test_hub_task_data_scores_as_the_local_files(hub, tmp_path, monkeypatch):
    """``flexigpt evaluate --source hub`` on a hub model: lm-eval's own ARC-Easy task loads
    ``allenai/ai2_arc`` from the hub, and each document scores exactly as the same documents
    from local files (``--source local``) on the same model from its folder."""
    from flexigpt.runtime.evaluation.results import evaluate_model

    done = run(["-m", "flexigpt", "evaluate", "--model", MODEL, "--source", "hub",
                "--tasks", "arc_easy", "--limit", "4", "--no-ppl", "--out", "hub.json"],
               hub_env(hub, tmp_path / "hf"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    hub_result = json.loads((tmp_path / "hub.json").read_text())
    assert hub_result["tasks"]["arc_easy"]["source"] == "hub"
    assert hub_result["tasks"]["arc_easy"]["n_docs"] == 4
    assert any(p.startswith("/datasets/allenai/ai2_arc/") and p.endswith("test-00000-of-00001"
                                                                          ".parquet")
               for p in hub.fetched("GET")), hub.log

    tasks = tmp_path / "tasks" / "arc_easy"
    tasks.mkdir(parents=True)
    for k, (split, n) in enumerate(ARC_SPLITS.items()):
        (tasks / f"{split}.jsonl").write_text(
            "".join(json.dumps(d) + "\n" for d in fake_docs("arc_easy", n, seed=k)))
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # evaluate_model sets them
        monkeypatch.setenv(key, "1")
    evaluate_model(hub.repos[("model", MODEL)].folder, tmp_path / "local.json",
                   tasks=["arc_easy"], limit=4, source="local", tasks_dir=tmp_path / "tasks",
                   ppl_text=None)
    ours, theirs = _records(tmp_path / "hub.json"), _records(tmp_path / "local.json")
    keys = ("doc_id", "doc_hash", "prompt_hash", "target", "gold", "is_greedy")
    assert [[r[k] for k in keys] for r in ours] == [[r[k] for k in keys] for r in theirs]
    for a, b in zip(ours, theirs):
        assert a["loglikelihoods"] == pytest.approx(b["loglikelihoods"], abs=1e-4)


def _cached(root: Path, name: str, data: bytes, etag: str) -> Path:
    """``snapshots/c/<name>`` → ``blobs/<etag>`` holding ``data``, as huggingface_hub caches."""
    (root / "blobs").mkdir(exist_ok=True)
    (root / "snapshots/c").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / etag).write_bytes(data)
    link = root / "snapshots/c" / name
    link.symlink_to(Path("../../blobs") / etag)
    return link


def test_snapshot_problems_name_each_file_not_as_recorded(tmp_path):
    """Large files are checked by sha256, small ones by git blob sha1 (the id ``git
    hash-object`` gives); a changed byte, an unknown ETag or a file that is no link into the
    blobs is one line each."""
    import hashlib

    from flexigpt.storage.models.hub_cache import git_blob_sha1 as file_sha1
    from flexigpt.storage.models.hub_cache import snapshot_problems

    weights, config = b"\x01" * 100, b'{"model_type": "llama"}'
    _cached(tmp_path, "model.safetensors", weights, hashlib.sha256(weights).hexdigest())
    small = _cached(tmp_path, "config.json", config, git_blob_sha1(config))
    git = subprocess.run(["git", "hash-object", str(small)], capture_output=True, text=True)
    assert git.stdout.strip() == file_sha1(small)
    folder = tmp_path / "snapshots/c"
    assert snapshot_problems(folder) == []

    blob = (folder / "model.safetensors").resolve()
    blob.write_bytes(b"\x02" + weights[1:])
    _cached(tmp_path, "tokenizer.json", b"{}", "not-a-hash")
    (folder / "sub").mkdir()
    (folder / "sub/extra.json").write_text("{}")
    problems = snapshot_problems(folder)
    assert len(problems) == 3, problems
    assert "model.safetensors: sha256" in problems[0] and "the hub recorded" in problems[0]
    assert "extra.json is no link" in problems[1]
    assert "tokenizer.json: the hub gave no hash" in problems[2]
