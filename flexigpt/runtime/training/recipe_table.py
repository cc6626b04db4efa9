"""Every recovery recipe the trainer knows, by name: those the methods bring
(``MethodFacts.recipes``: FlexiGPT's replacement adapters), then the trainer's own
(:data:`TRAINER_RECIPES`): ``lora`` (mergeable LoRA on every block), ``full`` (every
parameter), ``none`` (nothing), ``last_blocks`` (the last ``last_blocks`` decoder blocks, the
final norm and the LM head: the layer-pruning literature's recovery baseline). Each is a
:class:`~flexigpt.storage.recipe_facts.RecipeFacts`; the plan checks
(:mod:`flexigpt.runtime.training.config`), :func:`~flexigpt.runtime.training.recipes.apply_recipe`,
the tuning and evaluation records and the DAG's grid keys read them here.
"""

from __future__ import annotations

from flexigpt.storage.recipe_facts import RecipeFacts
from flexigpt.storage.registry import method_recipes

#: The trainer's own recipes (:mod:`flexigpt.runtime.training.recipes` implements them).
#: Default learning rates (when neither the config nor the manifest gives one): lora 4e-3,
#: the paper's adapter-only LR (docs/method-flexigpt.md §2, as FlexiGPT's own recipe); full
#: 1e-4, a conventional full fine-tuning LR for a pretrained LM (4e-3 would be destructive for
#: all weights; the extension control uses it); last_blocks 1.6e-3, the tuning-split choice
#: of the default config's sweep (4e-4, 1.6e-3, 6.4e-3; 32K tokens, SmolLM2 at 0.3: the few
#: whole blocks and the head it trains take a larger step than a full fine-tuning, and 6.4e-3
#: diverged).
_IMPL = "flexigpt.runtime.training.recipes"
TRAINER_RECIPES = (
    RecipeFacts("lora", 4e-3, f"{_IMPL}:LORA", lora=True),
    RecipeFacts("full", 1e-4, f"{_IMPL}:FULL"),
    RecipeFacts("none", 0.0, f"{_IMPL}:NONE", grid_keys=(), trains=False),
    RecipeFacts("last_blocks", 1.6e-3, f"{_IMPL}:LAST_BLOCKS", last_blocks=True),
)
#: recipe name → facts: the methods' recipes first, then the trainer's
RECIPE_FACTS: dict[str, RecipeFacts] = {r.name: r for r in (*method_recipes(),
                                                              *TRAINER_RECIPES)}
#: every recipe name (config ``recipe``, ``flexigpt train --recipe``, the schema's enum)
RECIPES = tuple(RECIPE_FACTS)
#: Learning rate per recipe when neither the config nor the manifest gives one.
DEFAULT_LR = {name: r.default_lr for name, r in RECIPE_FACTS.items()}


def recipe_names(recipes: list[str]) -> str:
    """``'a'``, ``'a' and 'b'``: recipe names for a message."""
    quoted = [repr(name) for name in recipes]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def uses_own_lr(recipe: str | None, field_name: str) -> bool:
    """Whether ``recipe`` (a name, possibly from an older record; None: unknown) trains with
    the learning-rate field ``field_name`` beside ``lr`` (``RecipeFacts.own_lrs``)."""
    facts = RECIPE_FACTS.get(recipe) if recipe is not None else None
    return facts is not None and field_name in facts.own_lrs


def recipes_with(fact: str) -> list[str]:
    """Names of the recipes whose boolean fact ``fact`` is true."""
    return [name for name, r in RECIPE_FACTS.items() if getattr(r, fact)]
