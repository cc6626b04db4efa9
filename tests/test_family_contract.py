"""Every registered method × every model family the adapters know: the method either
compresses a tiny model of that family into a working model, or — exactly where its
registered facts (``MethodFacts.families``) leave the family out — refuses it with an error
naming the method and the family. A new family or method is covered without editing here."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model

from flexigpt.storage.models import UnsupportedArchitectureError, get_adapter
from flexigpt.storage.models.adapters import ADAPTERS
from flexigpt.storage.registry import METHODS, get_method, tiny_options

pytestmark = pytest.mark.usefixtures("single_thread")

CALIB = torch.randint(3, 300, (4, 32), generator=torch.Generator().manual_seed(0))
#: each method's declared options for a tiny model (MethodFacts.tiny_options), at 6 blocks
OPTIONS = {name: tiny_options(name, 6) for name in METHODS}


def tiny(model_type: str):
    """A 6-block random model of ``model_type``."""
    model = make_model(model_type, layers=6)
    assert model.config.model_type == model_type
    return model


def test_every_method_changes_a_tiny_model_by_its_declared_options():
    """A method declares options for the tiny models (dense alone needs none)."""
    assert [name for name in METHODS if not METHODS[name].tiny_options] == ["dense"]


@pytest.mark.parametrize("model_type", sorted(ADAPTERS))
@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_supports_or_refuses_each_family(name, model_type):
    method = get_method(name)
    model = tiny(model_type)
    family = get_adapter(model).family
    cfg = method.make_config(**OPTIONS[name])
    if family not in METHODS[name].families:
        reason = dict(METHODS[name].family_refusals)[family]
        with pytest.raises(UnsupportedArchitectureError,
                           match=rf"{name}.*'{family}' family") as err:
            method.compress(model, None, CALIB, cfg)
        assert reason in str(err.value) and "\n" not in str(err.value)
        return
    with torch.no_grad():
        result = method.compress(model, None, CALIB, cfg)
        logits = result.model(CALIB[:1]).logits
    assert logits.shape == (1, CALIB.shape[1], 300) and torch.isfinite(logits).all()
    assert get_adapter(result.model).family == family
