"""The one recovery trainer (implementation in :mod:`flexigpt.training`).

Kept as the stable import path named in docs/ARCHITECTURE.md::

    from flexigpt.train import TrainConfig, train_model
"""

from __future__ import annotations

from flexigpt.training import (
    RECIPES,
    TrainConfig,
    TrainingDivergedError,
    TrainPlan,
    resolve_plan,
    train_loaded,
    train_model,
)

__all__ = ["RECIPES", "TrainConfig", "TrainPlan", "TrainingDivergedError", "resolve_plan",
           "train_loaded", "train_model"]
