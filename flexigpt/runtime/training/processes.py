"""The process group of a training run: which process is the main one, waiting for all,
and handing the main process's objects to the others.

In a single process (no ``accelerate launch``) every helper is trivial: the process is the
main one, :func:`barrier` returns at once and :func:`broadcast_from_main` returns its
argument. Under ``accelerate launch`` with N processes only the main one scores perplexity
and writes files; the others wait (:func:`barrier`) and take its results
(:func:`broadcast_from_main`).
"""

from __future__ import annotations

from typing import Any


def is_main_process() -> bool:
    """True in a single process, and in the main one of a launched group."""
    from accelerate import PartialState

    return PartialState().is_main_process


def barrier() -> None:
    """Wait for every process of a launched group (nothing in a single process)."""
    from accelerate import PartialState

    PartialState().wait_for_everyone()


def broadcast_from_main(record: Any) -> Any:
    """``record`` as the main process (rank 0) has it, on every process of a launched group
    (only the main process scores perplexity and saves); ``record`` itself in a single
    process. ``record`` must be picklable."""
    from accelerate import PartialState

    if PartialState().num_processes == 1:
        return record
    from accelerate.utils import broadcast_object_list

    box = [record]
    broadcast_object_list(box, from_process=0)
    return box[0]
