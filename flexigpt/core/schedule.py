"""Job priorities of the DAG: the job with the longest estimated path to the end goes first.

Snakemake starts, among the jobs that are ready, those of highest ``priority``. The DAG has
chains (Block Influence → compress → train → a KD / paper-protocol / LoRA-everywhere train
that reuses the first one's learning rates → evaluate → tables) next to many short
independent jobs; started in an arbitrary order, the longest chain can be left for last
with one of the two slots idle. Reference run at commit f7f970e: the FlexiGPT KD training
became ready at minute 45 and started at minute 85, and the DAG took 97 min for 10,000
job-seconds on two slots. Priority here = the estimated seconds from a job's start to the
end of the DAG along its longest chain of dependents (critical-path list scheduling).

The graph is read from the rules' own output patterns and input functions
(:class:`Priorities`), so it cannot drift from the DAG; costs per rule kind are estimates
(:data:`COST`, medians of the SmolLM2 reference run, seconds); only their ratios matter.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from types import SimpleNamespace
from typing import Any

#: estimated seconds per job kind (``evaluate`` by stage), SmolLM2 reference run medians
COST = {"block_influence": 80.0, "compress": 35.0, "train": 300.0, "evaluate_start": 35.0,
        "evaluate_final": 90.0, "inference_cost": 240.0, "tables": 30.0}

#: a rule's output pattern (``{wildcard}`` fields) and its input function (wildcards → a
#: path, a list of paths or a dict of either)
RuleSpec = tuple[str, Callable[[SimpleNamespace], Any]]


def _paths(value: Any) -> list[str]:
    """Every path in an input function's value (str, list / tuple, dict of them)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    return [p for item in value for p in _paths(item)]


def _regex(pattern: str) -> re.Pattern[str]:
    """``results/{model}/x`` → a regex with one named group per wildcard (no ``/`` inside)."""
    parts = re.split(r"\{(\w+)\}", pattern)
    body = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)"
                   for i, p in enumerate(parts))
    return re.compile(body + "$")


class Priorities:
    """Critical-path priorities over the jobs that ``targets`` need.

    Args:
        rules: rule name → (output pattern, input function); a path no pattern matches is
            a source (a resource, a config file): it costs nothing.
        targets: the paths the DAG builds (e.g. the tables directory).
        cost: estimated seconds per job kind (default :data:`COST`; unknown kinds: 0).
        scale: ``(rule, wildcards) → factor`` on a job's kind cost (e.g. a train job's
            tokens over the config's default: a budget ladder's 1M-token run is 32× the
            32K one, and the longest chain must start first); None: 1 for every job.
    """

    def __init__(self, rules: Mapping[str, RuleSpec], targets: Iterable[str],
                 cost: Mapping[str, float] | None = None,
                 scale: Callable[[str, dict[str, str]], float] | None = None) -> None:
        self.rules = {name: (pattern, _regex(pattern), fn)
                      for name, (pattern, fn) in rules.items()}
        self.targets = list(targets)
        self.cost = dict(COST if cost is None else cost)
        self.scale = scale

    def producer(self, path: str) -> tuple[str, dict[str, str]] | None:
        """``(rule, wildcards)`` of the job that writes ``path``, or None for a source."""
        for name, (_, regex, _) in self.rules.items():
            found = regex.match(path)
            if found:
                return name, found.groupdict()
        return None

    def _kind(self, rule: str, wildcards: dict[str, str]) -> str:
        return f"{rule}_{wildcards['stage']}" if "stage" in wildcards else rule

    @cached_property
    def graph(self) -> dict[str, list[str]]:
        """Output path of every needed job → output paths of the jobs it needs."""
        out: dict[str, list[str]] = {}
        todo = [p for p in self.targets if self.producer(p) is not None]
        while todo:
            path = todo.pop()
            if path in out:
                continue
            job = self.producer(path)
            assert job is not None  # todo holds only paths some rule writes
            rule, wildcards = job
            needed = [p for p in _paths(self.rules[rule][2](SimpleNamespace(**wildcards)))
                      if self.producer(p) is not None]
            out[path] = needed
            todo.extend(needed)
        return out

    @cached_property
    def remaining(self) -> dict[str, float]:
        """Output path → estimated seconds from the job's start to the end of the DAG."""
        dependents: dict[str, list[str]] = {path: [] for path in self.graph}
        for path, needed in self.graph.items():
            for p in needed:
                dependents[p].append(path)
        memo: dict[str, float] = {}

        def longest(path: str) -> float:
            if path not in memo:
                job = self.producer(path)
                assert job is not None  # the graph holds only paths some rule writes
                rule, wildcards = job
                own = self.cost.get(self._kind(rule, wildcards), 0.0)
                if self.scale is not None:
                    own *= self.scale(rule, wildcards)
                memo[path] = own + max((longest(d) for d in dependents[path]), default=0.0)
            return memo[path]

        for path in self.graph:
            longest(path)
        return memo

    def of(self, rule: str) -> Callable[[Any], int]:
        """The ``priority:`` function of ``rule``: its job's remaining path, in seconds."""
        pattern = self.rules[rule][0]

        def priority(wildcards: Any) -> int:
            path = pattern.format(**dict(wildcards.items()))
            return int(round(self.remaining.get(path, 0.0)))

        return priority
