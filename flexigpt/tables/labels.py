"""Display names shared by every table and figure: task headers, method / variant labels,
row labels with the trained / one-shot marks, and file-name slugs.

Method labels and their order come from :data:`flexigpt.storage.registry.METHODS`.
"""

from __future__ import annotations

from flexigpt.storage.registry import METHODS, ROLES

TASK_HEADERS = {"arc_easy": "ARC-e", "arc_challenge": "ARC-c", "piqa": "PIQA",
                "winogrande": "WinoG.", "hellaswag": "HellaS."}
METHOD_LABELS = {name: facts.label for name, facts in METHODS.items()}  # table order
METHOD_ORDER = list(METHOD_LABELS)
#: FlexiGPT variants that are Table 4 ablations (kept out of Table 1), in the paper's order.
ABLATIONS = {"no_lowrank": "Ablate high-rank prune (no low-rank truncation)",
             "no_outnorm": "Ablate output norm.", "no_svdinit": "Ablate LoRA SVD init.",
             "frobenius": "Frobenius-norm base (Fig. 2c)", "default": "Full method"}
#: Display names of named variants, from the registry (others: "<Method> [<variant>]").
VARIANT_LABELS = {(name, variant): text for name, facts in METHODS.items()
                  for variant, text in facts.variant_labels}
EXTENSION_LABELS = {(ROLES.reference, "default"): "Base", (ROLES.reference, "trained"):
                    "Base trained on the same tokens (control)",
                    (ROLES.reference, "trained_lora"):
                    "Base + LoRA with the extension's trainable count (control)",
                    (ROLES.extension, "block"): "FlexiGPT (Block)",
                    (ROLES.extension, "sequential"): "FlexiGPT (Sequential)"}


def method_label(method: str, variant: str) -> str:
    """Display name: the method's label plus the variant when not "default" (named variants
    from :data:`VARIANT_LABELS`; ``paper`` → "(paper protocol)", ``*kd`` → "(KD)")."""
    label = METHOD_LABELS.get(method, method)
    if (method, variant) in VARIANT_LABELS:
        return VARIANT_LABELS[(method, variant)]
    if variant == "default":
        return label
    if variant == "paper":
        return f"{label} (paper protocol)"
    if variant == "kd" or variant.endswith("_kd"):
        return f"{method_label(method, lm_variant(variant))} (KD)"
    return f"{label} [{variant}]"


def lm_variant(variant: str) -> str:
    """The LM-loss counterpart of a KD variant: ``kd`` → ``default``, ``rft_kd`` → ``rft``."""
    if variant == "kd":
        return "default"
    return variant[:-3] if variant.endswith("_kd") else variant


def row_label(method: str, variant: str, trained: bool, shown: str | None = None) -> str:
    """``shown`` (default :func:`method_label`) + "*" when trained, + " (one-shot)" when a
    compressed model was never trained; the dense model is never marked."""
    text = shown if shown is not None else method_label(method, variant)
    if method == ROLES.reference and not trained:
        return text
    return text + ("*" if trained else " (one-shot)")


def display_name(model: str, display: str | None) -> str:
    return display if display else model


def slug(name: str) -> str:
    """A file-name-safe form of a model id or path."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in str(name))
