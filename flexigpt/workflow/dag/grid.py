"""The run grid of one config (:class:`RunGrid`): every run, the settings its rules share and
the lookups the rules make (paths, targets, trials and job parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flexigpt.runtime.training.config import curve_every_steps
from flexigpt.storage.registry import METHODS, methods_with
from flexigpt.workflow.config_check import check_grid
from flexigpt.workflow.dag.defaults import with_schema_defaults
from flexigpt.workflow.dag.runs import GRID_KEYS, Key, Run, prefix_of, step_tokens, train_default
from flexigpt.workflow.dag.sections import (
    add_ablations,
    add_budget,
    add_extension,
    add_kd,
    add_paper_protocol,
    add_replicates,
    add_sensitivity,
    add_table1,
    start_build,
)

#: tables whose runs reuse another run's learning rates by protocol (``tuning.reuse`` keys,
#: with ``replicate`` and ``variant``)
REUSE_TABLES = ("paper_protocol", "kd", "ablation", "budget", "sensitivity")


@dataclass
class RunGrid:
    """All runs of one config, with the shared settings rules need."""

    runs: dict[Key, Run]
    model_paths: dict[str, str]
    model_resources: dict[str, str | None]
    calibration_text: str
    train_text: str
    validation_text: str
    tasks_dir: str | None
    task_source: str
    training: dict[str, Any]
    evaluation: dict[str, Any]
    inference: dict[str, Any]
    calibration: dict[str, Any]
    seed: int
    hub_text: dict[str, Any] = field(default_factory=dict)
    tuning: dict[str, Any] = field(default_factory=dict)

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: dict[str, Any]) -> RunGrid:
        """Build the grid from a config dict (schema defaults filled in:
        :func:`~flexigpt.workflow.dag.defaults.with_schema_defaults`; ``config`` is not changed),
        one section at a time (:mod:`flexigpt.workflow.dag.sections`), then check it.

        Raises:
            ValueError: inconsistent settings the schema cannot express (e.g. a resource
                model whose path is not where its builder writes, a ``match``/``budget``
                naming a run that is not in the grid).
            flexigpt.workflow.config_check.ConfigError (a ValueError): an option, training setting,
                size or model path its jobs would reject (:func:`~flexigpt.workflow.config_check.check_grid`).
        """
        config = with_schema_defaults(config)
        data, ratios = config["data"], config["ratios"]
        build = start_build(config)
        add_table1(build, config["methods"], ratios)
        add_replicates(build, config.get("replicates") or {})
        add_budget(build, config.get("budget") or {}, ratios, config["training"])
        add_paper_protocol(build, config.get("paper_protocol") or {}, ratios)
        add_kd(build, config.get("kd") or {}, ratios)
        add_ablations(build, config.get("ablations") or {}, ratios)
        add_extension(build, config.get("extension") or {}, config["model"]["path"])
        add_sensitivity(build, list((config.get("tuning") or {}).get("sensitivity") or []))
        common = build.common
        grid = cls(runs=build.runs, model_paths=build.paths, model_resources=build.resources,
                   calibration_text=data.get("calibration_text", data["train_text"]),
                   train_text=data["train_text"], validation_text=data["validation_text"],
                   tasks_dir=data.get("tasks"), task_source=data["task_source"],
                   training=dict(config["training"]), evaluation=dict(config["evaluation"]),
                   inference={**(config.get("inference") or {}), "device": common["device"]},
                   calibration={**common["calibration"], "seed": common["seed"],
                                "dtype": common["dtype"], "device": common["device"]},
                   seed=common["seed"], hub_text=dict(data.get("hub_text") or {}),
                   tuning=dict(config["tuning"]))
        grid.check_references()
        grid.check_reuse_reasons()
        grid.check_rung_check()
        check_grid(config, grid)  # options, TrainConfigs, sizes, model paths: as jobs would
        return grid

    def check_references(self) -> None:
        """Every ``match``/``budget``/``lr_from``/``compressed_from`` names another run that
        exists and can serve (a budget source must be recovered with adapters)."""
        for run in self.runs.values():
            for what in ("match", "budget", "lr_from", "compressed_from"):
                ref = getattr(run, what)
                if ref is None:
                    continue
                where = "{}/{}/{}/{}".format(*run.key)
                if ref == run.key:
                    raise ValueError(f"run {where}: {what} names the run itself")
                if ref not in self.runs:
                    raise ValueError(f"run {where}: {what} names {'/'.join(ref)}, which is "
                                     "not in the grid")
                if what == "lr_from" and not self.runs[ref].recovery:
                    raise ValueError(f"run {where}: lr_from names {'/'.join(ref)}, which is "
                                     "not trained")
            if run.budget is not None and not run.recovery:
                raise ValueError(f"run {'/'.join(run.key)}: a budget needs recovery: true")

    # ---- lookups -------------------------------------------------------------------------
    @property
    def model_keys(self) -> list[str]:
        return sorted(self.model_paths)

    @property
    def tune_text(self) -> str:
        """Documents of the held-out text used for every recovery choice (never scored)."""
        return str(Path(self.validation_text).with_suffix(".tune.txt"))

    @property
    def test_text(self) -> str:
        """Documents of the held-out text whose perplexity the tables report."""
        return str(Path(self.validation_text).with_suffix(".test.txt"))

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
        """The ``data.hub_text`` entry that builds ``resources/text/<name>/<split>.txt``: the
        file's name is the entry's split, so another split's file is refused rather than
        filled with the entry's text."""
        try:
            source = dict(self.hub_text[name])
        except KeyError:
            raise ValueError(f"resources/text/{name}/{split}.txt has no data.hub_text entry "
                             f"{name!r} to build it from") from None
        if str(source.get("split")) != split:
            raise ValueError(f"resources/text/{name}/{split}.txt: data.hub_text.{name} streams "
                             f"split {source.get('split')!r}, whose file is "
                             f"resources/text/{name}/{source.get('split')}.txt")
        return source

    def run(self, model: str, method: str, variant: str, setting: str) -> Run:
        try:
            return self.runs[(model, method, variant, setting)]
        except KeyError:
            raise ValueError(f"no run {model}/{method}/{variant}/{setting} in the config") from None

    def eval_targets(self) -> list[str]:
        return [run.eval_json(stage) for run in self.runs.values() for stage in run.stages()]

    def figure_inputs(self) -> dict[str, list[str]]:
        """This grid's FlexiGPT manifests, training logs and LR-sweep records (files inside
        directory outputs, so passed as params): figures never pick up other runs."""
        trained = [run for run in self.runs.values() if run.recovery]
        return {"manifests": [f"{run.prefix}/compressed/manifest.json"
                              for run in self.runs.values()
                              if METHODS[run.method].manifest_figures
                              and run.compressed_from is None],
                "train_logs": [f"{run.trained_dir}/train_log.csv" for run in trained],
                "selections": [f"{run.trained_dir}/selection.json" for run in trained]}

    def inference_runs(self, model: str) -> dict[str, Run]:
        """Models timed together for Tables 6/7: every ``timed`` method of the registry
        (dense, ShortGPT, FlexiGPT, the extensions) present in the grid, those with ratios at
        their lowest ratio."""
        out: dict[str, Run] = {}
        timed = methods_with("timed")
        for run in self.runs.values():
            if (run.model != model or run.method not in timed
                    or run.variant not in ("default", "block", "sequential")):
                continue
            if run.ratio is None or run.ratio == min(
                    r.ratio for r in self.runs.values() if r.method == run.method
                    and r.ratio is not None and r.variant == "default"):
                out[f"{run.method}/{run.variant}/{run.setting}"] = run
        return dict(sorted(out.items(), key=lambda kv: kv[0] != "dense/default/full"))

    def inference_targets(self) -> list[str]:
        return [f"results/{m}/inference.json" for m in self.model_keys
                if len(self.inference_runs(m)) > 1]

    # ---- recovery: tuning trials and training --------------------------------------------
    def trials(self, run: Run) -> list[dict[str, Any]]:
        """The learning-rate trials of a recovered run: the tuning grid of its recipe (the
        product of its ``lr`` and ``gamma_lr`` lists), or one trial when it reuses another
        run's choice (``lr_from``) or the grid has nothing for its recipe."""
        if run.lr_from is not None:
            return [{"lr_from": prefix_of(run.lr_from), **({"lr_rank": "next"} if run.lr_next
                                                           else {})}]
        grid = (self.tuning.get("grid") or {}).get(run.recovery_recipe()) or {}
        trials: list[dict[str, Any]] = [{}]
        for name in GRID_KEYS.get(run.recovery_recipe(), ()):
            if grid.get(name):
                trials = [{**t, name: float(v)} for t in trials for v in grid[name]]
        return trials

    def search(self, run: Run) -> dict[str, Any] | None:
        """The bracketing rule (``tuning.bracket``) the run's sweep extends its grid by: None
        for a run that reuses another's choice (``lr_from``), has no learning rate to tune,
        or when the config sets no rule (the grid is then trained as it is)."""
        rule = self.tuning.get("bracket")
        if not rule or not run.recovery or run.lr_from is not None:
            return None
        if not any(name in trial for trial in self.trials(run) for name in ("lr", "gamma_lr")):
            return None
        return dict(rule)

    def rung_check(self, run: Run) -> bool:
        """Whether the run's sweep continues every scored trial to the end beside the chosen
        one (``tuning.rung_check`` names its method or method/variant; Table 1 runs only):
        the rung's ranking is then compared with the final one, the choice unchanged."""
        if run.table != "main" or (not self.search(run) and len(self.trials(run)) < 2):
            return False
        names = set(self.tuning.get("rung_check") or ())
        return ((run.method in names and run.variant == "default")
                or f"{run.method}/{run.variant}" in names)

    def reuse_kind(self, run: Run) -> str | None:
        """Why a run reuses another's learning rates, as a ``tuning.reuse`` key: its table
        (``paper_protocol``, ``kd``, ``ablation``, ``budget``, ``sensitivity``), ``replicate`` (a seed
        replicate) or ``variant`` (a variant's own ``lr_from``); None when it sweeps."""
        if run.lr_from is None:
            return None
        if run.table in REUSE_TABLES:
            return run.table
        return "replicate" if run.seed != self.seed else "variant"

    def reuse_reason(self, run: Run) -> str | None:
        """The config's stated reason (``tuning.reuse.<kind>``) why ``run`` trains at another
        run's chosen learning rates instead of searching its own; None when it searches."""
        kind = self.reuse_kind(run)
        return None if kind is None else (self.tuning.get("reuse") or {}).get(kind)

    def check_rung_check(self) -> None:
        """Every ``tuning.rung_check`` entry names a swept Table 1 run, and there is a rung
        to check (``tuning.rung`` < 1) (ValueError)."""
        names = self.tuning.get("rung_check") or ()
        if names and self.tuning_rung >= 1:
            raise ValueError("tuning.rung_check needs a rung (tuning.rung < 1): with rung 1 "
                             "every trial already trains to the end")
        for name in names:
            method, _, variant = name.partition("/")
            if not any(self.rung_check(run) for run in self.runs.values()
                       if run.method == method and run.variant == (variant or "default")):
                raise ValueError(f"tuning.rung_check names {name!r}, which is no swept Table 1 "
                                 "run of the grid")

    def check_reuse_reasons(self) -> None:
        """Under a bracketing rule every run that reuses another's learning rates says why
        (``tuning.reuse.<kind>``): a fixed learning rate is that row's protocol, not an
        omission (ValueError naming the first run without one)."""
        if not self.tuning.get("bracket"):
            return
        for run in self.runs.values():
            kind = self.reuse_kind(run)
            if kind is not None and not self.reuse_reason(run):
                raise ValueError(
                    f"run {run.name} reuses the learning rates of {'/'.join(run.lr_from or ())} "
                    f"without a stated reason: set tuning.reuse.{kind} (why a fixed learning "
                    "rate is this row's protocol), or let the run search its own")

    def train_cost_factor(self, run: Run) -> float:
        """A train job's estimated cost relative to one trial at ``training.tokens``: its
        tokens over the default, the losing trials of a sweep counted to the rung (the job
        priorities of :mod:`flexigpt.core.schedule`); a searched sweep is counted as a
        point and its two neighbours on every axis."""
        tokens = float(run.tokens or self.training["tokens"])
        trials = len(self.trials(run))
        if self.search(run):
            axes = {name for trial in self.trials(run) for name in trial}
            trials = max(trials, 1 + 2 * len(axes))
        return tokens / float(self.training["tokens"]) * (1 + (trials - 1) * self.tuning_rung)

    def trial_ids(self, run: Run) -> list[str]:
        return [f"t{i}" for i in range(len(self.trials(run)))]

    @property
    def tuning_rung(self) -> float:
        """Fraction of the schedule at which a sweep's trials are compared (``tuning.rung``;
        1 = every trial trained fully)."""
        return float(self.tuning["rung"])

    def train_params(self, run: Run, trial: str | None = None) -> dict[str, Any]:
        """TrainConfig fields of one trial (``trial`` None: the first); ``eval_every``
        (steps) from ``training.eval_every_tokens`` (:func:`curve_every_steps`)."""
        cfg = dict(self.training)
        every = cfg.pop("eval_every_tokens", None)
        if run.tokens is not None:
            cfg["tokens"] = run.tokens
        cfg["seed"] = run.seed
        cfg["device"] = run.device
        if run.recipe is not None:
            cfg["recipe"] = run.recipe
        cfg.update(run.training)
        if self.tuning.get("windows"):
            cfg["eval_windows"] = int(self.tuning["windows"])
        trials = self.trials(run)
        chosen = trials[int(trial[1:]) if trial else 0]
        cfg.update({k: v for k, v in chosen.items() if k in ("lr", "gamma_lr")})
        cfg["eval_every"] = curve_every_steps(
            every, step_tokens=step_tokens(cfg),
            eval_tokens=int(cfg.get("eval_windows") or train_default("eval_windows"))
            * int(cfg.get("seq_len", train_default("seq_len"))))
        return cfg

    def eval_params(self, run: Run, stage: str) -> dict[str, Any]:
        """The evaluate job's parameters of ``run`` at ``stage`` (tasks only at a scored
        ``final``)."""
        ev = self.evaluation
        scored = stage == "final" and run.scored_tasks
        return {"tasks": list(ev["tasks"]) if scored else [],
                "limit": ev["limit"], "source": self.task_source,
                "ppl_seq_len": ev["ppl_seq_len"], "ppl_windows": ev["ppl_windows"],
                "backend": ev["backend"], "batch_size": ev["batch_size"],
                "dtype": run.dtype, "device": run.device, "autocast_dtype": ev["autocast"],
                "labels": run.labels(stage),
                # only where set: the params of runs that never set it stay as they were
                **({"add_bos_token": True} if ev.get("add_bos_token") else {})}

