"""The config's defaults, stated once: in the JSON schema ``workflow/schemas/config.schema.yaml``.

:func:`with_schema_defaults` fills them in as Snakemake's ``validate(config, schema,
set_default=True)`` (``workflow/rules/common.smk``) does, so the run grid reads the same
complete config whether Snakemake or a caller of :meth:`flexigpt.workflow.dag.RunGrid.from_config`
built it, and no grid builder repeats a default.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators

#: the workflow's config schema (every default of the config is stated there)
SCHEMA = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"


def _fill_then_validate(check_properties: Any) -> Any:
    """The ``properties`` keyword of a validator that first sets every absent property of an
    object instance to a copy of its schema ``default`` (then checks the properties, which
    descends into those defaults too): the python-jsonschema FAQ recipe Snakemake uses."""

    def properties(validator: Any, props: dict[str, Any], instance: Any,
                   schema: dict[str, Any]) -> Iterator[Any]:
        if isinstance(instance, dict):
            for name, subschema in props.items():
                if "default" in subschema:
                    instance.setdefault(name, copy.deepcopy(subschema["default"]))
        yield from check_properties(validator, props, instance, schema)

    return properties


@lru_cache(maxsize=1)
def _defaults_validator() -> Any:
    """A draft 2020-12 validator of the config schema that fills defaults as it walks."""
    schema = yaml.safe_load(SCHEMA.read_text())
    base = Draft202012Validator
    filling = validators.extend(
        base, {"properties": _fill_then_validate(base.VALIDATORS["properties"])})
    return filling(schema)


def with_schema_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``config`` with the schema's defaults filled in where a key is absent,
    at every level the config has (and inside the defaults it adds); ``config`` itself is
    left unchanged and a complete config comes back equal to it.

    Schema violations are not raised here: the Snakefile's ``validate`` reports them, and
    :meth:`~flexigpt.workflow.dag.RunGrid.from_config` raises its own errors for what it refuses.
    """
    filled = copy.deepcopy(config)
    for _ in _defaults_validator().iter_errors(filled):
        pass  # walking the whole config fills every default; errors are the Snakefile's
    return filled
