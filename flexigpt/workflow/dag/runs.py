"""One run of the DAG (:class:`Run`), its key and the names the grid's rules share.

A *run* is one model produced by the DAG, addressed by the wildcards
``{model}/{method}/{variant}/{setting}`` (see :mod:`flexigpt.workflow.dag`); its files live under
:func:`prefix_of` its key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from flexigpt.runtime.training.config import TrainConfig
from flexigpt.runtime.training.recipe_table import RECIPE_FACTS
from flexigpt.storage.registry import METHODS, get_method, methods_with

#: methods whose configs accept precomputed Block Influence scores (computed once per model).
BI_METHODS = methods_with("block_influence")
#: tables a run can belong to (``labels.table`` of its result JSONs).
TABLES = ("dense", "main", "paper_protocol", "kd", "ablation", "extension", "budget")
#: how a budget ladder chooses learning rates (``budget.lr``): a sweep on the tuning split at
#: every point, or the smallest point's choice reused above it.
BUDGET_LR = ("sweep", "smallest")
#: which budget points are scored on the tasks (``budget.tasks``; perplexity at every point).
BUDGET_TASKS = ("all", "top")
#: learning-rate keys a tuning grid may sweep, per trainer recipe (``RecipeFacts.grid_keys``).
GRID_KEYS = {name: r.grid_keys for name, r in RECIPE_FACTS.items() if r.grid_keys}

#: ``(model, method, variant, setting)``: the wildcards of one run
Key = tuple[str, str, str, str]
@dataclass(frozen=True)
class Run:
    """One model the DAG produces (see module doc for the wildcards).

    ``match``, ``budget``, ``lr_from`` and ``compressed_from`` name other runs of the grid:
    the run whose achieved ratio this run's block count is matched to, whose trainable
    count its LoRA is sized to, whose chosen learning rates it reuses (no sweep of its
    own), and whose compressed model it trains (instead of compressing again).
    """

    model: str
    method: str  # registry key of the compression step
    variant: str
    setting: str
    options: dict[str, Any] = field(default_factory=dict)
    recovery: bool = False
    recipe: str | None = None  # trainer recipe override (None: the method's own)
    tokens: int | None = None  # recovery token budget override
    training: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides
    match: Key | None = None
    budget: Key | None = None
    lr_from: Key | None = None
    lr_next: bool = False  # train at lr_from's next-best learning rates (the sensitivity row)
    compressed_from: Key | None = None
    table: str = "main"
    protocol: str | None = None
    calibration: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    dtype: str = "float32"
    device: str = "auto"  # where every job of the run computes (flexigpt.core.devices)
    label_variant: str | None = None  # a seed replicate's base variant (labels, tables)
    budget_tokens: int | None = None  # a budget-ladder point: its token budget
    budget_variant: str | None = None  # ... and the Table 1 variant it recovers again
    scored_tasks: bool = True  # stage final scores the tasks (else perplexity only)
    basis: str = "total"  # what the ratio is a fraction of (flexigpt.methods.compression_basis)

    @property
    def key(self) -> Key:
        return (self.model, self.method, self.variant, self.setting)

    @property
    def ratio(self) -> float | None:
        return float(self.setting[1:]) if self.setting.startswith("r") else None

    @property
    def needs_calibration(self) -> bool:
        return METHODS[self.method].calibration

    @property
    def uses_block_influence(self) -> bool:
        return self.method in BI_METHODS

    @property
    def loss(self) -> str:
        return str(self.training.get("loss", "lm"))

    @property
    def prefix(self) -> str:
        return prefix_of(self.key)

    @property
    def name(self) -> str:
        """``model/method/variant/setting``."""
        return "{}/{}/{}/{}".format(*self.key)

    @property
    def compressed_dir(self) -> str:
        return f"{prefix_of(self.compressed_from or self.key)}/compressed"

    @property
    def trained_dir(self) -> str:
        return f"{self.prefix}/trained"

    def final_dir(self) -> str:
        return self.trained_dir if self.recovery else self.compressed_dir

    def recovery_recipe(self) -> str:
        """The trainer recipe: the override, else the method's registered one."""
        return self.recipe or get_method(self.method).recovery

    def eval_json(self, stage: str) -> str:
        return f"{self.prefix}/eval_{stage}.json"

    def stages(self) -> list[str]:
        """``start`` (perplexity right after compression) only where it is news: a method
        whose facts say so (``MethodFacts.start_stage``: FlexiGPT's replacement blocks
        change the function, Table 4's Start PPL). A LoRA-recovered run starts as its
        one-shot model (LoRA B = 0), the extension as the base (γ = 0), a dense control as
        the dense model, and a run that trains another run's compressed model at that run's
        start: none is evaluated twice."""
        if (self.recovery and self.compressed_from is None
                and METHODS[self.method].start_stage):
            return ["start", "final"]
        return ["final"]

    def wildcards_ns(self) -> SimpleNamespace:
        return SimpleNamespace(model=self.model, method=self.method, variant=self.variant,
                               setting=self.setting)

    def compress_params(self) -> dict[str, Any]:
        options = dict(self.options)
        if self.ratio is not None:
            options["ratio"] = self.ratio
        basis = {} if self.basis == "total" else {"basis": self.basis}  # total: params as before
        return {"method": self.method, "options": options, "seed": self.seed,
                "dtype": self.dtype, "device": self.device, **self.calibration, **basis}

    def labels(self, stage: str) -> dict[str, Any]:
        """The result JSON's ``labels``; a budget-ladder point adds ``budget_tokens`` and
        ``budget_variant`` (the Table 1 variant it recovers again)."""
        out = {"model": self.model, "method": self.method,
               "variant": self.label_variant or self.variant,
               "setting": self.setting, "ratio": self.ratio, "stage": stage, "seed": self.seed,
               "table": self.table, "protocol": self.protocol, "loss": self.loss}
        if self.budget_tokens is not None:
            out.update(budget_tokens=self.budget_tokens, budget_variant=self.budget_variant)
        return out


def prefix_of(key: Key) -> str:
    """``results/<model>/<method>/<variant>/<setting>``: the folder of one run's files."""
    return "results/{}/{}/{}/{}".format(*key)


def train_default(name: str) -> Any:
    """The default of :class:`~flexigpt.runtime.training.TrainConfig` field ``name``."""
    return TrainConfig.__dataclass_fields__[name].default


def step_tokens(training: dict[str, Any]) -> int:
    """Tokens of one optimizer step (``global_batch · seq_len``, TrainConfig's defaults)."""
    return (int(training.get("global_batch", train_default("global_batch")))
            * int(training.get("seq_len", train_default("seq_len"))))
