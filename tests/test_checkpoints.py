"""Checkpoints the ecosystem can load (issue 21): self-contained dirs for every method,
refusal without remote code, stock lm-eval, plain export where exact, model cards."""

from __future__ import annotations

import ast
import builtins
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import WORDS, make_model, manifest_for

from flexigpt.cli import main as cli_main
from flexigpt.core.params import count_parameters
from flexigpt.export.card import write_model_card
from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.methods.sharing import SharedLoRALinear
from flexigpt.storage.artifacts import load_compressed
from flexigpt.storage.models.checkpoint_format import KEY, MODEL_TYPE, MODELING_FILE
from flexigpt.storage.registry import METHODS, get_method, tiny_options

pytestmark = pytest.mark.usefixtures("single_thread")

IDS = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(1))
CALIB = torch.randint(3, 300, (4, 24), generator=torch.Generator().manual_seed(0))
CALIB[:, 0] = 0

#: name → (method, options, make_model kwargs)
CASES = {
    "dense": ("dense", {}, {}),
    "flexigpt": ("flexigpt", {"ratio": 0.5, "gamma_init": 0.1}, {}),
    "flexigpt_plain_norms": ("flexigpt", {"ratio": 0.5, "output_norm": False,
                                          "prenorm": "share"}, {}),
    "flexigpt_qwen2": ("flexigpt", {"ratio": 0.25, "gamma_init": 0.1},
                       {"family": "qwen2", "tied": False}),
    "flexigpt_extend": ("flexigpt_extend", {"layers": 6, "gamma_init": 0.1}, {}),
    "shortgpt": ("shortgpt", {"ratio": 0.3}, {}),
    "shortgpt_lora": ("shortgpt_lora", {"ratio": 0.3}, {}),
    "replaceme": ("replaceme", {"ratio": 0.3}, {}),
    "streamline": ("streamline", {"ratio": 0.5, "epochs": 1}, {}),
    "streamline_ffn": ("streamline", {"ratio": 0.5, "epochs": 1, "module": "ffn"}, {}),
    "slicegpt": ("slicegpt", {"ratio": 0.3, "round_to": 2, "tolerance": 0.03}, {}),
    "slicegpt_unsliced": ("slicegpt", {"ratio": 0.3, "head": "unsliced", "round_to": 2,
                                       "tolerance": 0.03}, {"family": "mistral"}),
    "llm_pruner": ("llm_pruner", {"ratio": 0.3}, {"heads": 8, "kv_heads": 4}),
    "llm_pruner_uniform": ("llm_pruner", {"ratio": 0.5, "policy": "paper", "layer_start": 0,
                                          "layer_end": 4}, {"heads": 8, "kv_heads": 4}),
}
#: every other registered method at its declared tiny options (``MethodFacts.tiny_options``):
#: a method added as one folder is held to this file's checkpoint contract unasked
ADDED = tuple(m for m in METHODS if m not in {method for method, _, _ in CASES.values()})
CASES.update({m: (m, tiny_options(m, 4), {}) for m in ADDED})
TRAINED = ("flexigpt_trained", "shortgpt_lora_trained")
#: the cases saved as stock transformers checkpoints, and every added method without a replay
#: fragment (``MethodFacts.replay``): outside the harness only its fragment loads a checkpoint
#: that is not stock, so a method saving one brings a fragment
PLAIN = ("dense", "shortgpt", "shortgpt_lora", "shortgpt_lora_trained", "replaceme",
         "streamline", *(m for m in ADDED if METHODS[m].replay is None))
NOT_PLAIN = tuple(n for n in (*CASES, *TRAINED) if n not in PLAIN)


def _perturb_adapters(model: torch.nn.Module) -> None:
    """Non-zero LoRA B (standard init has B = 0), so the adapters change the logits."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, SharedLoRALinear):
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=gen) * 0.05)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_tokenizer, text_file) -> dict[str, Path]:
    """Every case compressed and saved once (two also trained and saved again)."""
    from flexigpt.runtime.training import TrainConfig, train_loaded

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("saved")
    out: dict[str, Path] = {}
    try:
        for name, (method, options, kw) in CASES.items():
            kw = dict(kw)
            model = make_model(kw.pop("family", "llama"), layers=4, **kw)
            spec = get_method(method)
            with torch.no_grad():
                res = spec.compress(model, tiny_tokenizer, CALIB, spec.make_config(**options))
            _perturb_adapters(res.model)
            manifest = manifest_for(method, res.structure, res.info, res.model, config=options)
            save_compressed(res.model, tiny_tokenizer, manifest, root / name)
            out[name] = root / name
        small = dict(tokens=32 * 4 * 2, seq_len=32, micro_batch=2, global_batch=4,
                     eval_windows=2, checkpoint_every=0, bf16="off", warmup=1)
        for name in TRAINED:
            source = name.removesuffix("_trained")
            train_loaded(load_compressed(out[source]), root / name, TrainConfig(**small),
                         text_file, text_file)
            out[name] = root / name
    finally:
        torch.set_num_threads(before)
    return out


def _logits(model: torch.nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def _auto(path: Path, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).eval()


# ---- config.json and the modeling file -----------------------------------------------------
@pytest.mark.parametrize("name", [*CASES, *TRAINED])
def test_config_marks_what_is_not_plain(saved, name):
    d = saved[name]
    cfg = json.loads((d / "config.json").read_text())
    manifest = json.loads((d / "manifest.json").read_text())
    if name in PLAIN:
        assert cfg["model_type"] in ("llama", "qwen2", "mistral") and KEY not in cfg
        assert "auto_map" not in cfg and not (d / MODELING_FILE).exists()
        return
    spec = cfg[KEY]
    assert cfg["model_type"] == MODEL_TYPE and spec["remote_code"] is True
    assert spec["method"] == manifest["method"] and spec["structure"] == manifest["structure"]
    assert spec["base_model_type"] == CASES.get(name, ("", {}, {}))[2].get("family", "llama")
    # the checkpoint's classes name the method that made it (SliceGPTMistralForCausalLM)
    prefix = METHODS[manifest["method"]].class_prefix
    family = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}[spec["base_model_type"]]
    assert cfg["architectures"] == [f"{prefix}{family}ForCausalLM"]
    assert cfg["auto_map"] == {
        "AutoConfig": f"modeling_flexigpt_compressed.{prefix}{family}Config",
        "AutoModelForCausalLM": f"modeling_flexigpt_compressed.{prefix}{family}ForCausalLM"}
    assert (d / MODELING_FILE).is_file()


def test_each_replay_fragment_registers_its_method_class_prefix():
    """Every method with a replay fragment registers the class-name prefix its facts derive
    from its label, and the standalone file defines its classes for every family."""
    from flexigpt.export.standalone import standalone_module

    module = standalone_module()
    replayed = {key for key, facts in METHODS.items() if facts.replay}
    assert set(module.CLASS_PREFIX) == replayed
    for key in replayed:
        assert module.CLASS_PREFIX[key] == METHODS[key].class_prefix
        for base_type in module.BASES:
            config_name, model_name = module.class_names(key, base_type)
            model_cls = getattr(module, model_name)
            assert model_cls.config_class is getattr(module, config_name)
            assert model_cls.__module__ == module.__name__
    assert METHODS["llm_pruner"].class_prefix == "LLMPruner"
    assert METHODS["flexigpt_extend"].class_prefix == "FlexiGPTExtension"


def test_modeling_file_needs_only_torch_and_transformers(saved):
    tree = ast.parse((saved["flexigpt"] / MODELING_FILE).read_text())
    roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.level == 0}
    assert roots <= {"__future__", "collections", "re", "typing", "torch", "transformers"}, roots


# ---- no silent wrong model ------------------------------------------------------------------
@pytest.mark.parametrize("name", NOT_PLAIN)
def test_plain_load_refuses_with_instructions(saved, name, monkeypatch):
    def no_tty(*args, **kwargs):  # what a non-interactive session answers to HF's prompt
        raise EOFError

    monkeypatch.setattr(builtins, "input", no_tty)
    for trust in (None, False):
        kw = {} if trust is None else {"trust_remote_code": False}
        with pytest.raises(ValueError, match=r"(?s)contains custom code.*trust_remote_code=True"):
            _auto(saved[name], **kw)


@pytest.mark.parametrize("name", PLAIN)
def test_plain_outputs_stay_stock_checkpoints(saved, name):
    model = _auto(saved[name])
    assert type(model).__module__.startswith("transformers.models.")
    assert torch.equal(_logits(model), _logits(load_compressed(saved[name]).model))


# ---- remote code: same model as load_compressed ---------------------------------------------
@pytest.mark.parametrize("name", NOT_PLAIN)
def test_remote_code_equals_load_compressed(saved, name, tmp_path):
    from safetensors import safe_open

    ref = load_compressed(saved[name]).model
    model = _auto(saved[name], trust_remote_code=True)
    prefix = METHODS[json.loads((saved[name] / "manifest.json").read_text())["method"]].class_prefix
    assert type(model).__name__.startswith(prefix) and model.config.model_type == MODEL_TYPE
    torch.testing.assert_close(_logits(model), _logits(ref), atol=1e-5, rtol=0)
    assert count_parameters(model) == count_parameters(ref)
    with safe_open(saved[name] / "model.safetensors", "pt") as fh:  # shared weights stored once
        stored = sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys())  # noqa: SIM118 - safe_open has no __iter__
    assert stored == count_parameters(ref)
    model.save_pretrained(tmp_path / "again")  # HF's own save of the remote-code model
    again = _auto(tmp_path / "again", trust_remote_code=True)
    assert torch.equal(_logits(again), _logits(model))


@pytest.mark.parametrize("name", ["flexigpt", "flexigpt_extend", "slicegpt", "llm_pruner",
                                  "flexigpt_qwen2"])
def test_generate_with_kv_cache(saved, name):
    model = _auto(saved[name], trust_remote_code=True)
    prompt = IDS[:1, :5]
    cached = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True)
    plain = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=False)
    ref = load_compressed(saved[name]).model.generate(prompt, max_new_tokens=6, do_sample=False)
    assert cached.shape == (1, 11) and torch.equal(cached, plain) and torch.equal(cached, ref)


def test_loads_in_a_process_without_flexigpt(saved, tmp_path):
    """The copied modeling file alone (flexigpt and baselines unimportable) gives the logits."""
    names = ["flexigpt", "flexigpt_extend", "slicegpt", "llm_pruner"]
    script = (
        "import sys, json, torch\n"
        "sys.modules['flexigpt'] = None; sys.modules['baselines'] = None\n"
        "from transformers import AutoModelForCausalLM\n"
        f"ids = torch.tensor({IDS.tolist()})\n"
        "out = {}\n"
        "for name, path in json.loads(sys.argv[1]).items():\n"
        "    m = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()\n"
        "    with torch.no_grad():\n"
        "        out[name] = m(input_ids=ids).logits\n"
        "torch.save(out, sys.argv[2])\n")
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
    paths = {n: str(saved[n]) for n in names}
    subprocess.run([sys.executable, "-c", script, json.dumps(paths), str(tmp_path / "l.pt")],
                   check=True, cwd=tmp_path, env=env, capture_output=True)
    logits = torch.load(tmp_path / "l.pt")
    for name in names:
        torch.testing.assert_close(logits[name], _logits(load_compressed(saved[name]).model),
                                   atol=1e-5, rtol=0)


def test_method_the_loader_cannot_replay_gets_no_auto_map(tiny_tokenizer, tmp_path):
    """A non-plain model whose structure the standalone file cannot rebuild still refuses a
    plain load, without pointing at code that would build a different model."""
    spec = get_method("flexigpt")
    model = make_model()
    with torch.no_grad():
        res = spec.compress(model, None, CALIB, spec.make_config(ratio=0.5))
    wrong = {**res.structure, "base_map": {"0": 2, "3": 1}}  # not what the weights are
    save_compressed(res.model, tiny_tokenizer, manifest_for("flexigpt", wrong), tmp_path / "m")
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert cfg["model_type"] == MODEL_TYPE and "auto_map" not in cfg
    assert cfg[KEY]["remote_code"] is False and "shared differently" in cfg[KEY][
        "remote_code_reason"]
    assert not (tmp_path / "m" / MODELING_FILE).exists()
    assert cfg["architectures"] == ["FlexiGPTCompressedForCausalLM"]  # no code defines it
    with pytest.raises(ValueError, match="flexigpt_compressed"):
        _auto(tmp_path / "m", trust_remote_code=True)


# ---- stock lm-eval ----------------------------------------------------------------------------
def _requests():
    from lm_eval.api.instance import Instance

    pairs = [("The king of the city", " was famous"), ("The king of the city", " river"),
             ("Music and film of the modern world", " are large"), ("", "the water system")]
    return [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]


@pytest.mark.parametrize("name", ["flexigpt", "slicegpt", "llm_pruner"])
def test_lm_eval_hflm_with_remote_code_matches_harness(saved, name):
    pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM

    from flexigpt.runtime.evaluation.zeroshot import make_lm

    stock = HFLM(pretrained=str(saved[name]), trust_remote_code=True, device="cpu",
                 dtype="float32", batch_size=4, add_bos_token=False)
    assert type(stock.model).__name__ == f"{METHODS[CASES[name][0]].class_prefix}LlamaForCausalLM"
    ours = stock.loglikelihood(_requests(), disable_tqdm=True)
    loaded = load_compressed(saved[name])
    for backend in ("fast", "hf"):
        lm = make_lm(loaded.model, loaded.tokenizer, backend=backend, batch_size=4)
        ref = lm.loglikelihood(_requests(), disable_tqdm=True)
        assert max(abs(a[0] - b[0]) for a, b in zip(ours, ref)) <= 1e-4, backend
        assert [a[1] for a in ours] == [b[1] for b in ref]


def _fake_arc(root: Path) -> Path:
    import random

    rng = random.Random(0)
    (root / "arc_easy").mkdir(parents=True)
    for split in ("validation", "test"):
        docs = []
        for i in range(4):
            labels = ["A", "B", "C", "D"]
            docs.append({"id": f"q{i}", "answerKey": labels[i],
                         "question": " ".join(rng.choice(WORDS) for _ in range(8)) + "?",
                         "choices": {"label": labels, "text": [
                             " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
                             for _ in labels]}})
        (root / "arc_easy" / f"{split}.jsonl").write_text(
            "\n".join(json.dumps(d) for d in docs) + "\n")
    return root


@pytest.mark.slow
def test_stock_lm_eval_cli_on_local_tasks_matches_harness(saved, tmp_path, monkeypatch):
    """``lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True`` (a real
    subprocess) on the harness's local task data: per-document log-likelihoods equal."""
    pytest.importorskip("lm_eval")
    import lm_eval

    from flexigpt.runtime.evaluation.lm_eval_tasks import write_task_yamls
    from flexigpt.runtime.evaluation.tasks import build_task, local_config, task_manager
    from flexigpt.runtime.evaluation.zeroshot import SEEDS, make_lm

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    bench = _fake_arc(tmp_path / "bench")
    write_task_yamls(bench, tmp_path / "yamls", ["arc_easy"])
    d = saved["flexigpt"]
    cmd = [str(Path(sys.executable).with_name("lm_eval")), "--model", "hf", "--model_args",
           f"pretrained={d},trust_remote_code=True,add_bos_token=False,dtype=float32",
           "--include_path", str(tmp_path / "yamls"), "--tasks", "arc_easy", "--device", "cpu",
           "--batch_size", "4", "--log_samples", "--output_path", str(tmp_path / "out")]
    subprocess.run(cmd, check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    [samples] = (tmp_path / "out").rglob("samples_arc_easy_*.jsonl")
    stock = {s["doc_id"]: [float(r[0][0]) for r in s["resps"]]  # the file holds strings
             for s in map(json.loads, samples.read_text().splitlines())}

    loaded = load_compressed(d)
    lm = make_lm(loaded.model, loaded.tokenizer, backend="fast", batch_size=4)
    out = lm_eval.simple_evaluate(model=lm, tasks=[build_task(local_config("arc_easy", bench))],
                                  num_fewshot=0, log_samples=True, batch_size=4,
                                  task_manager=task_manager(), **SEEDS)
    ours = {s["doc_id"]: [float(r[0][0]) for r in s["resps"]] for s in out["samples"]["arc_easy"]}
    assert ours.keys() == stock.keys() and len(ours) == 4
    for doc, values in ours.items():
        assert max(abs(a - b) for a, b in zip(values, stock[doc])) <= 1e-4


# ---- export to a plain architecture --------------------------------------------------------
@pytest.mark.parametrize("name,flags,how", [
    ("dense", [], "copied"), ("shortgpt", [], "copied"),
    ("shortgpt_lora_trained", [], "copied"),
    ("flexigpt_plain_norms", ["--unshare"], "un-shared"),
    ("llm_pruner_uniform", [], "uniform widths")])
def test_export_round_trips_exactly(saved, tmp_path, name, flags, how, capsys):
    out = tmp_path / "plain"
    assert cli_main(["export", str(saved[name]), "--out", str(out), *flags]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] in ("llama", "mistral", "qwen2") and "auto_map" not in cfg
    record = json.loads((out / "export.json").read_text())
    assert how in record["how"] and not (out / "manifest.json").exists()
    model = _auto(out)
    assert type(model).__name__ == "LlamaForCausalLM"
    ref = load_compressed(saved[name]).model
    torch.testing.assert_close(_logits(model), _logits(ref), atol=1e-5, rtol=0)
    if how == "copied":
        assert torch.equal(_logits(model), _logits(ref))
        assert count_parameters(model) == count_parameters(ref)
    if how == "un-shared":  # exact, but the sharing (the compression) is gone
        assert count_parameters(model) > count_parameters(ref)
    assert "LlamaForCausalLM" in capsys.readouterr().out


@pytest.mark.parametrize("name,flags,why", [
    ("flexigpt", [], "output norm"), ("flexigpt", ["--unshare"], "output norm"),
    ("flexigpt_extend", [], "output norm"), ("flexigpt_plain_norms", [], "--unshare"),
    ("slicegpt", [], "shortcut matrices"), ("llm_pruner", [], "per-layer widths")])
def test_export_refuses_where_not_exact(saved, tmp_path, name, flags, why, capsys):
    out = tmp_path / "plain"
    assert cli_main(["export", str(saved[name]), "--out", str(out), *flags]) == 2
    assert why in capsys.readouterr().err
    assert not out.exists()


# ---- model cards ------------------------------------------------------------------------------
def test_model_cards(saved, tmp_path, capsys):
    for name, d in saved.items():
        card = (d / "README.md").read_text()
        method = json.loads((d / "manifest.json").read_text())["method"]
        assert f"`{method}`" in card and "## Provenance" in card
        assert ("trust_remote_code=True" in card) == (name in NOT_PLAIN)
    assert "←" in (saved["flexigpt"] / "README.md").read_text()  # what is shared
    trained = (saved["flexigpt_trained"] / "README.md").read_text()
    assert "tokens" in trained and "none: one-shot" not in trained
    result = {"schema": 1, "perplexity": {"value": 31.5, "text": "wiki.txt", "n_windows": 4,
                                          "seq_len": 64},
              "tasks": {"arc_easy": {"metric": "acc_norm", "value": 0.5, "stderr": 0.1,
                                     "n_docs": 4}},
              "lm_eval": {"version": "0.4.13", "num_fewshot": 0, "backend": "fast"},
              "created": "2025-01-01T00:00:00+00:00",
              # what `flexigpt tables` needs too (export --card checks the file as it does)
              "method": "dense", "num_layers": 4,
              "labels": {"model": "tiny", "method": "dense", "variant": "default",
                         "ratio": None, "stage": "final", "seed": 0},
              "parameters": {"dense": 100, "compressed": 100, "achieved_ratio": 0.0}}
    (tmp_path / "r.json").write_text(json.dumps(result))
    path = write_model_card(saved["shortgpt"], tmp_path / "r.json")
    text = path.read_text()
    assert "## Scores" in text and "[0.3040, 0.6960]" in text and "31.500" in text
    assert cli_main(["export", str(saved["dense"]), "--card", "--result",
                     str(tmp_path / "r.json")]) == 0
    assert "## Scores" in (saved["dense"] / "README.md").read_text()
