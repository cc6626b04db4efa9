"""The run grid of the Snakemake DAG, as typed objects (config → runs → paths/params).

``workflow/rules/common.smk`` builds one :class:`RunGrid` from the validated config; rules
only look things up in it. A *run* is one model produced by the DAG, addressed by the
wildcards ``{model}/{method}/{variant}/{setting}``:

- ``setting`` is ``r<ratio>`` for compression, ``full`` for the dense model and ``L<layers>``
  for the extension; ``variant`` is ``default`` or an ablation / extension pattern name.
- Each run is evaluated at stage ``final`` (perplexity + tasks) and, when it has recovery
  training, at stage ``start`` (perplexity right after compression: Table 4's "Start PPL").
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: methods whose configs accept precomputed Block Influence scores (computed once per model).
BI_METHODS = ("flexigpt", "shortgpt", "shortgpt_lora")
#: offline resource builders → the checkpoint folder they produce.
RESOURCE_MODELS = {"smollm2": "resources/models/smollm2-135m",
                   "tiny-llama": "resources/models/tiny-llama"}


@dataclass(frozen=True)
class Run:
    """One model the DAG produces (see module doc for the wildcards)."""

    model: str
    method: str  # registry key of the compression step
    variant: str
    setting: str
    options: dict[str, Any] = field(default_factory=dict)
    recovery: bool = False
    recipe: str | None = None  # trainer recipe override (None: the method's own)
    tokens: int | None = None  # recovery token budget override
    calibration: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    dtype: str = "float32"

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.model, self.method, self.variant, self.setting)

    @property
    def ratio(self) -> float | None:
        return float(self.setting[1:]) if self.setting.startswith("r") else None

    @property
    def needs_calibration(self) -> bool:
        return self.method not in ("dense", "flexigpt_extend")

    @property
    def uses_block_influence(self) -> bool:
        return self.method in BI_METHODS

    @property
    def prefix(self) -> str:
        return f"results/{self.model}/{self.method}/{self.variant}/{self.setting}"

    def eval_json(self, stage: str) -> str:
        return f"{self.prefix}/eval_{stage}.json"

    def stages(self) -> list[str]:
        # the start of a trained dense control is the dense model itself: not evaluated twice
        return ["start", "final"] if self.recovery and self.method != "dense" else ["final"]

    def wildcards_ns(self) -> SimpleNamespace:
        return SimpleNamespace(model=self.model, method=self.method, variant=self.variant,
                               setting=self.setting)

    def compress_params(self) -> dict[str, Any]:
        options = dict(self.options)
        if self.ratio is not None:
            options["ratio"] = self.ratio
        return {"method": self.method, "options": options, "seed": self.seed,
                "dtype": self.dtype, **self.calibration}

    def labels(self, stage: str) -> dict[str, Any]:
        return {"model": self.model, "method": self.method, "variant": self.variant,
                "setting": self.setting, "ratio": self.ratio, "stage": stage, "seed": self.seed}


@dataclass
class RunGrid:
    """All runs of one config, with the shared settings rules need."""

    runs: dict[tuple[str, str, str, str], Run]
    model_paths: dict[str, str]
    model_resources: dict[str, str | None]
    calibration_text: str
    train_text: str
    validation_text: str
    benchmarks: str | None
    task_source: str
    training: dict[str, Any]
    evaluation: dict[str, Any]
    inference: dict[str, Any]
    calibration: dict[str, Any]
    seed: int
    hub_text: dict[str, Any] = field(default_factory=dict)

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "RunGrid":
        """Build the grid from a schema-validated config dict.

        Raises:
            ValueError: inconsistent settings the schema cannot express (e.g. a resource
                model whose path is not where its builder writes).
        """
        model = config["model"]
        data = config["data"]
        seed = int(config.get("seed", 0))
        dtype = model.get("dtype", "float32")
        calib = {"n_calibration": config["calibration"].get("n_windows", 128),
                 "seq_len": config["calibration"].get("seq_len", 512)}
        paths = {model["key"]: model["path"]}
        resources = {model["key"]: model.get("resource")}
        if resources[model["key"]] is not None:
            expected = RESOURCE_MODELS[resources[model["key"]]]
            if Path(model["path"]) != Path(expected):
                raise ValueError(f"model.path must be {expected!r} for resource "
                                 f"{resources[model['key']]!r}, got {model['path']!r}")
        if data.get("task_source", "local") == "local" and not data.get("benchmarks"):
            raise ValueError("data.benchmarks is required when data.task_source is 'local'")
        runs: dict[tuple[str, str, str, str], Run] = {}

        def add(run: Run) -> None:
            runs[run.key] = run

        common = {"calibration": calib, "seed": seed, "dtype": dtype}
        methods = config["methods"]
        for name, block in methods.items():
            block = block or {}
            if name == "dense":
                add(Run(model["key"], "dense", "default", "full", **common))
                continue
            for ratio in config["ratios"]:
                add(Run(model["key"], name, "default", f"r{ratio:g}",
                        options=dict(block.get("options", {})),
                        recovery=bool(block.get("recovery", False)), **common))
        ablations = config.get("ablations") or {}
        if ablations.get("variants"):
            if "flexigpt" not in methods:
                raise ValueError("ablations need methods.flexigpt")
            base = methods["flexigpt"] or {}
            for variant, overrides in ablations["variants"].items():
                add(Run(model["key"], "flexigpt", variant, f"r{ablations['ratio']:g}",
                        options={**base.get("options", {}), **overrides},
                        recovery=bool(base.get("recovery", False)), **common))
        ext = config.get("extension") or {}
        if ext.get("patterns"):
            key = ext.get("model_key", model["key"])
            paths.setdefault(key, ext.get("model_path", model["path"]))
            resources.setdefault(key, None)
            tokens = ext.get("tokens")
            for pattern in ext["patterns"]:
                options = {"layers": ext["layers"], "pattern": pattern}
                if ext.get("span"):
                    options["span"] = list(ext["span"])
                add(Run(key, "flexigpt_extend", pattern, f"L{ext['layers']}", options=options,
                        recovery=True, tokens=tokens, **common))
            add(Run(key, "dense", "default", "full", **common))
            if ext.get("control", True):
                add(Run(key, "dense", "trained", "full", recovery=True, recipe="full",
                        tokens=tokens, **common))
        return cls(runs=runs, model_paths=paths, model_resources=resources,
                   calibration_text=data.get("calibration_text", data["train_text"]),
                   train_text=data["train_text"], validation_text=data["validation_text"],
                   benchmarks=data.get("benchmarks"), task_source=data.get("task_source", "local"),
                   training=dict(config["training"]), evaluation=dict(config["evaluation"]),
                   inference=dict(config.get("inference") or {}),
                   calibration={**calib, "seed": seed, "dtype": dtype}, seed=seed,
                   hub_text=dict(data.get("hub_text") or {}))

    # ---- lookups -------------------------------------------------------------------------
    @property
    def model_keys(self) -> list[str]:
        return sorted(self.model_paths)

    def model_path(self, key: str) -> str:
        return self.model_paths[key]

    def local_model_inputs(self, key: str) -> dict[str, str]:
        """``{"model": path}`` when the base model is a local checkpoint (built by a resource
        rule or already on disk), else ``{}``: hub ids are not files."""
        path = self.model_paths[key]
        if self.model_resources.get(key) is not None or Path(path).exists():
            return {"model": path}
        return {}

    def hub_text_source(self, name: str, split: str) -> dict[str, Any]:
        """The ``data.hub_text`` entry that builds ``resources/text/<name>/<split>.txt``."""
        try:
            source = dict(self.hub_text[name])
        except KeyError:
            raise ValueError(f"resources/text/{name}/{split}.txt has no data.hub_text entry "
                             f"{name!r} to build it from") from None
        return source

    def run(self, model: str, method: str, variant: str, setting: str) -> Run:
        try:
            return self.runs[(model, method, variant, setting)]
        except KeyError:
            raise ValueError(f"no run {model}/{method}/{variant}/{setting} in the config") from None

    def eval_targets(self) -> list[str]:
        return [run.eval_json(stage) for run in self.runs.values() for stage in run.stages()]

    def figure_inputs(self) -> dict[str, list[str]]:
        """This grid's FlexiGPT manifests and training logs (files inside directory outputs,
        so passed as params): figures never pick up other runs under ``results/``."""
        return {"manifests": [f"{run.prefix}/compressed/manifest.json"
                              for run in self.runs.values() if run.method == "flexigpt"],
                "train_logs": [f"{run.prefix}/trained/train_log.csv"
                               for run in self.runs.values() if run.recovery]}

    def inference_runs(self, model: str) -> dict[str, Run]:
        """Models timed together for Tables 6/7: dense, ShortGPT and FlexiGPT at the first
        ratio, and the extensions (each only if present in the grid)."""
        out: dict[str, Run] = {}
        for run in self.runs.values():
            if run.model != model or run.variant not in ("default", "block", "sequential"):
                continue
            if run.method == "dense" or run.method == "flexigpt_extend" or (
                    run.method in ("shortgpt", "flexigpt") and run.ratio == min(
                        r.ratio for r in self.runs.values() if r.method == run.method
                        and r.ratio is not None and r.variant == "default")):
                out[f"{run.method}/{run.variant}/{run.setting}"] = run
        return dict(sorted(out.items(), key=lambda kv: kv[0] != "dense/default/full"))

    def inference_targets(self) -> list[str]:
        return [f"results/{m}/inference.json" for m in self.model_keys
                if len(self.inference_runs(m)) > 1]

    def train_params(self, run: Run) -> dict[str, Any]:
        cfg = dict(self.training)
        if run.tokens is not None:
            cfg["tokens"] = run.tokens
        cfg["seed"] = run.seed
        if run.recipe is not None:
            cfg["recipe"] = run.recipe
        return cfg

    def eval_params(self, run: Run, stage: str) -> dict[str, Any]:
        ev = self.evaluation
        return {"tasks": list(ev.get("tasks", [])) if stage == "final" else [],
                "limit": ev.get("limit"), "source": self.task_source,
                "ppl_seq_len": ev.get("ppl_seq_len", 512), "ppl_windows": ev.get("ppl_windows"),
                "backend": ev.get("backend", "fast"), "batch_size": ev.get("batch_size", 16),
                "dtype": run.dtype, "labels": run.labels(stage)}


def script_logging(log_path: str | Path, threads: int | None = None) -> logging.Logger:
    """Route logging and stderr of a Snakemake script to its log file; set torch threads."""
    handler = logging.FileHandler(log_path, mode="w")
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.stderr = open(log_path, "a", buffering=1)  # noqa: SIM115 (tqdm and warnings)
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    return logging.getLogger("flexigpt.workflow")
