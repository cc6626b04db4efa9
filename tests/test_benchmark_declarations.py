"""The benchmark scripts select methods through the methods' declarations, never by key:
``check_official`` by ``MethodFacts.official_check``, ``bench_scaling`` by
``calibration_flop``, ``bench_train`` / ``budget_bound`` by the protocol's roles,
``bench_baselines`` by the paper's baselines with a ``policy`` option."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from conftest import load_benchmark

from flexigpt.storage.registry import METHODS, ROLES, get_method, is_paper_baseline, load_target


def test_every_official_check_is_a_function_in_its_methods_folder():
    declared = {k: f for k, f in METHODS.items() if f.official_check}
    assert declared, "no method declares a check against its authors' code"
    for key, facts in declared.items():
        assert facts.official_code and facts.official_code.count("/") == 1, key
        function = load_target(facts.official_check)
        assert callable(function), key
        folder = facts.target.split(":")[0].rsplit(".", 1)[0]
        assert facts.official_check.startswith(folder + "."), (key, facts.official_check)
        assert list(inspect.signature(function).parameters) == [
            "checkout", "model", "windows", "span", "batch_size"], key


def test_check_official_has_a_flag_per_declared_method_and_runs_each_check(monkeypatch,
                                                                          capsys, tmp_path):
    check_official = load_benchmark("check_official")
    assert set(check_official.CHECKED) == {k for k, f in METHODS.items() if f.official_check}
    with pytest.raises(SystemExit):  # no checkout given: the error lists every flag
        check_official.main(["--families", "llama"])
    err = capsys.readouterr().err
    assert all(f"--{key}" in err for key in check_official.CHECKED)

    calls = []

    def fake(checkout, model, windows, span, batch_size):
        calls.append((checkout, windows.shape, span, batch_size))
        return {"same_span": checkout.name == "agrees"}

    key = check_official.CHECKED[0]
    monkeypatch.setattr(check_official, "load_target", lambda target: fake)
    args = ["--families", "llama", "--layers", "6", "--windows", "2", "--seq-len", "8"]
    assert check_official.main([f"--{key}", str(tmp_path / "agrees"), *args]) == 0
    assert check_official.main([f"--{key}", str(tmp_path / "differs"), *args]) == 1
    assert calls[0] == (tmp_path / "agrees", torch.Size([2, 8]), 3, 4)


def test_bench_scaling_stages_are_the_methods_declaring_calibration_flop():
    bench_scaling = load_benchmark("bench_scaling")
    declared = {k: f.calibration_flop for k, f in METHODS.items() if f.calibration_flop}
    assert declared and declared == bench_scaling.BASELINE_STAGES
    assert ("block_influence", *declared) == bench_scaling.STAGES_CALIB
    assert {k: bench_scaling.FLOP_PER_TOKEN_PARAM[k] for k in declared} == declared


def test_bench_train_measures_the_subject_and_the_skip_method_with_the_comparators_recipe():
    bench_train = load_benchmark("bench_train")
    expected = {ROLES.subject: get_method(ROLES.subject).recovery,
                ROLES.skip: get_method(ROLES.comparator).recovery}
    assert expected == bench_train.RECIPE
    assert bench_train.RECIPE[ROLES.skip] != "none"  # the skip method trains as the comparator
    budget_bound = load_benchmark("budget_bound")
    assert set(budget_bound.BENCH_METHOD.values()) <= set(bench_train.RECIPE)


def test_bench_baselines_defaults_to_the_paper_baselines_with_a_policy():
    bench_baselines = load_benchmark("bench_baselines")
    chosen = bench_baselines.policy_baselines()
    assert chosen, "no paper baseline has a policy option"
    for key in METHODS:
        has_policy = "policy" in {f.name for f in dataclasses.fields(get_method(key).config_cls)}
        assert (key in chosen) == (is_paper_baseline(key, "default") and has_policy), key
    assert ROLES.skip in chosen and ROLES.comparator in chosen


def test_one_resolver_for_every_module_attribute_declaration():
    """Methods and training recipes name their code as ``"module:attribute"``; one function
    resolves both, and a malformed declaration is refused by name."""
    from flexigpt.runtime.training.recipe_table import RECIPE_FACTS
    from flexigpt.storage import recipe_facts, registry, targets

    assert registry.load_target is targets.load_target is recipe_facts.load_target
    assert load_target("flexigpt.storage.targets:load_target") is targets.load_target
    for facts in RECIPE_FACTS.values():
        assert facts.trainable_set() is load_target(facts.implementation)
    for bad in ("flexigpt.storage.targets", "a:b:c", ":x", "m:"):
        with pytest.raises(ValueError, match="module:attribute"):
            load_target(bad)
