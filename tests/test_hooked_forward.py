"""flexigpt/methods/hooked_forward.py: batched calibration forwards watched by hooks — every batch
runs, a StopForward skips the rest of its forward only, the mask rows follow the batch, and
the hooks are gone however the pass ends."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model

from flexigpt.methods.hooked_forward import StopForward, forward_batches, hook_output, registered
from flexigpt.storage.models.adapters import get_adapter

WINDOWS = torch.randint(3, 300, (5, 12), generator=torch.Generator().manual_seed(0))


def test_every_batch_runs_and_a_stop_skips_only_the_rest_of_that_forward():
    model = make_model(layers=4)
    blocks = get_adapter(model).layers(model)
    ran: list[int] = []
    seen: list[torch.Tensor] = []
    before = [dict(b._forward_hooks) for b in blocks]  # transformers may keep its own

    def count(idx: int):
        def hook(module, args, output):
            ran.append(idx)
            if idx == 1:
                seen.append(hook_output(output))
                raise StopForward
        return hook

    with torch.no_grad(), registered(b.register_forward_hook(count(i)) for i, b in enumerate(blocks)):
        rows = list(forward_batches(model, WINDOWS, 2))
    assert rows == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert ran == [0, 1] * 3  # blocks 2 and 3 never ran
    assert [dict(b._forward_hooks) for b in blocks] == before  # ours removed on exit
    with torch.no_grad():
        full = model(WINDOWS, output_hidden_states=True).hidden_states[2]  # block 1's output
    assert torch.equal(torch.cat(seen), full)


class Recorder(torch.nn.Module):
    """Records what each forward is given."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.calls: list[tuple] = []

    def forward(self, input_ids, attention_mask, use_cache):
        self.calls.append((input_ids, attention_mask, use_cache))


def test_mask_rows_follow_the_batch():
    mask = torch.ones_like(WINDOWS)
    mask[3, :4] = 0
    model = Recorder()
    list(forward_batches(model, WINDOWS, 2, mask))
    list(forward_batches(model, WINDOWS, 4))
    assert [(ids.tolist(), None if m is None else m.tolist(), cache)
            for ids, m, cache in model.calls] == [
        (WINDOWS[a:b].tolist(), None if masked is None else masked[a:b].tolist(), False)
        for masked, spans in ((mask, ((0, 2), (2, 4), (4, 5))), (None, ((0, 4), (4, 5))))
        for a, b in spans]


def test_hooks_are_removed_when_the_pass_fails():
    model = make_model(layers=2)
    block = get_adapter(model).layers(model)[0]
    before = dict(block._forward_hooks)

    def boom(module, args, output):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"), torch.no_grad(), \
            registered([block.register_forward_hook(boom)]):
        list(forward_batches(model, WINDOWS, 2))
    assert dict(block._forward_hooks) == before
