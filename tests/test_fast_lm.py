"""FastHFLM (prefix-shared exact scoring) against stock lm-eval HFLM."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
import torch
from conftest import WORDS, make_model, make_tokenizer

from flexigpt.runtime.evaluation.fast.packing import (
    WorkCounts,
    batch_rows,
    bucket_rows,
    collate,
    collate_flat,
    pack_requests,
    plan_work,
)

pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from flexigpt.runtime.evaluation.fast.lm import FastHFLM  # noqa: E402
from flexigpt.storage.registry import METHODS, tiny_options  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")


class Recorder:
    """Stands in for lm-eval's CacheHook."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object, object]] = []

    def add_partial(self, kind: str, key: object, value: object) -> None:
        self.calls.append((kind, key, value))


def greedy_words(model, tok, context: str, n: int) -> str:
    """The model's greedy continuation of ``context`` (n tokens), decoded."""
    ids = tok(context, add_special_tokens=False)["input_ids"]
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([ids + out])).logits[0, -1].argmax())
            out.append(nxt)
    return tok.decode(out)


def make_requests(model, tok, n_docs: int = 12, seed: int = 0) -> list[Instance]:
    """Multiple-choice-like requests: shared contexts, trailing spaces, an empty context,
    shared-prefix contexts with one continuation (WinoGrande style), greedy answers."""
    rng = random.Random(seed)
    reqs: list[Instance] = []

    def add(ctx: str, cont: str) -> None:
        reqs.append(Instance("loglikelihood", {}, (ctx, cont), len(reqs)))

    for d in range(n_docs):
        ctx = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
        ctx += " " if d % 3 == 0 else ""
        sep = "" if d % 3 == 0 else " "
        for _ in range(3):
            add(ctx, sep + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5))))
        add(ctx, greedy_words(model, tok, ctx, 3))  # is_greedy True unless tokenisation differs
    stem = "the king of the north"
    for option in ("river", "music film"):
        add(f"{stem} {option}", " was famous in history")
    add("", "the city of the king")
    return reqs


def both(model, tok, **kw):
    common = {"tokenizer": tok, "batch_size": 4, "add_bos_token": False, "max_length": 48}
    return HFLM(pretrained=model, **common), FastHFLM(pretrained=model, **common, **kw)


def assert_same(ref, ours, tol: float = 1e-4) -> None:
    assert len(ref) == len(ours)
    diff = max(abs(a[0] - b[0]) for a, b in zip(ref, ours))
    assert diff <= tol, f"max |Δ logprob| {diff}"
    assert [a[1] for a in ref] == [b[1] for b in ours]


# ---- packing --------------------------------------------------------------------------------
def test_pack_shares_prefixes_and_masks_ancestors():
    seqs = [([1, 2, 3, 4], 2, [4, 5]), ([1, 2, 3, 7], 1, [8]), ([9, 9], 1, [1]),
            ([1, 2, 6], 2, [6, 1])]
    rows = pack_requests(seqs, row_tokens=100)
    assert len(rows) == 1
    row = rows[0]
    assert len(row) == 8  # 1-2-3-4, +7, +6 (1-2 shared), 9-9
    mask = row.mask()
    for path in row.paths:  # every node attends exactly its own path prefix
        for j, node in enumerate(path):
            assert set(np.flatnonzero(mask[node])) == set(path[: j + 1])
            assert row.positions[node] == j
    assert sorted(s.request for s in row.scored) == [0, 1, 2, 3]
    budget = pack_requests(seqs, row_tokens=4)
    assert sorted(s.request for r in budget for s in r.scored) == [0, 1, 2, 3]
    assert all(len(r) <= 4 for r in budget)
    batches = batch_rows(budget, batch_tokens=8)
    assert sum(len(b) for b in batches) == len(budget)
    ids, pos, add_mask = collate(batches[0], pad_id=0, dtype=torch.float32)
    assert add_mask.shape == (len(batches[0]), 1, ids.shape[1], ids.shape[1])
    assert torch.isfinite(add_mask.max(dim=-1).values).all()  # no fully masked row


def test_per_document_rows_buckets_and_flat_layout():
    doc_a = [([7, 1, 2, 3, 4], 1, [5]), ([7, 1, 2, 3, 9], 1, [6])]  # choices of one question
    doc_b = [([7, 8, 8, 8], 2, [8, 1])]  # shares only its first token with doc_a
    doc_c = [([5, 5, 5, 5, 5, 5, 5], 1, [2]), ([5, 5, 5, 5, 5, 5, 6], 1, [2])]
    seqs = doc_a + doc_b + doc_c
    assert len(pack_requests(seqs, row_tokens=64)) == 1  # filled rows share "7"
    rows = pack_requests(seqs, row_tokens=64, per_document=True)
    assert sorted(sorted(s.request for s in r.scored) for r in rows) == [[0, 1], [2], [3, 4]]
    assert sorted(map(len, rows)) == [4, 6, 8]
    passes = bucket_rows(rows, batch_tokens=16, slack=0.25)  # 8 and 6 share a width-8 bucket
    assert [[[len(r) for r in b] for b in p] for p in passes] == [[[8, 6]], [[4]]]
    assert [[[len(r) for r in b] for b in p] for p in bucket_rows(rows, 100, slack=0.0)] \
        == [[[8], [6], [4]]]
    ids, pos, layout, starts = collate_flat(bucket_rows(rows, 100, slack=0.4)[0], pad_id=0)
    assert ids.shape == pos.shape == (1, 8 + 8 + 4) and layout.length == 20
    assert [(b.start, b.rows, b.width) for b in layout.buckets] == [(0, 2, 8), (16, 1, 4)]
    assert starts == [0, 8, 16]
    by_start = dict(zip(starts, [r for b in bucket_rows(rows, 100, slack=0.4)[0] for r in b]))
    for start, row in by_start.items():  # tokens, depths and tree masks land where stated
        assert ids[0, start:start + len(row)].tolist() == row.tokens
        assert pos[0, start:start + len(row)].tolist() == row.positions
    second = layout.buckets[0].mask[1, 0]  # the 6-node row padded to 8
    assert torch.equal(second[:6, :6], torch.from_numpy(by_start[8].mask()))
    assert torch.equal(second[6:], torch.eye(8, dtype=torch.bool)[6:])  # padding: itself only
    with pytest.raises(ValueError, match="slack"):
        bucket_rows(rows, 100, slack=1.0)


def test_plan_work_counts_stock_and_tree_tokens():
    seqs = [([1, 2, 3, 4], 2, [4, 5]), ([1, 2, 3, 7], 1, [8]), ([9, 9], 1, [1]),
            ([1, 2, 6], 2, [6, 1]), ([1, 2, 3, 4], 2, [4, 5])]  # the last repeats the first
    passes = bucket_rows(pack_requests(seqs, row_tokens=100), batch_tokens=100)
    work = plan_work(seqs, passes)
    # stock runs the 4 distinct inputs (4 + 4 + 2 + 3 tokens); the tree has 8 nodes and
    # scores 6 distinct positions (3, 4 | 7 | second 9 | 2, 6)
    assert work == WorkCounts(requests=5, stock_tokens=13, tree_tokens=8, forward_tokens=8,
                              head_positions=6)
    assert plan_work(seqs, passes, stock_batch=2).stock_tokens == 4 * 2 + 3 * 2  # padded
    assert work.flop_ratio(body_flops=10, head_flops=1) == pytest.approx(13 * 11 / (8 * 10 + 6))
    assert (work + work).tree_tokens == 16
    two = bucket_rows(pack_requests(seqs, row_tokens=100, per_document=True), 100, slack=0.5)
    assert plan_work(seqs, two).forward_tokens == sum(len(b[0]) * len(b) for p in two for b in p)
    with pytest.raises(ValueError, match="stock_batch"):
        plan_work(seqs, passes, stock_batch=0)


def test_tree_attention_switch_restores_the_model(tiny_model):
    from flexigpt.runtime.evaluation.fast.tree_attention import ATTENTION_NAME, tree_attention

    before = tiny_model.config._attn_implementation
    with pytest.raises(RuntimeError, match="inside"), tree_attention(tiny_model):
        assert tiny_model.model.layers[0].self_attn.config._attn_implementation \
            == ATTENTION_NAME
        raise RuntimeError("inside")
    assert tiny_model.config._attn_implementation == before
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():  # without a layout the tree attention is plain sdpa
        plain = tiny_model(input_ids=ids).logits
        with tree_attention(tiny_model):
            assert torch.equal(tiny_model(input_ids=ids).logits, plain)


def test_pack_rejects_bad_input():
    with pytest.raises(ValueError, match="row_tokens"):
        pack_requests([([1], 1, [2])], row_tokens=0)
    with pytest.raises(ValueError, match="cannot score"):
        pack_requests([([1, 2], 3, [2, 3, 4])], row_tokens=8)


# ---- equality with stock HFLM ---------------------------------------------------------------
@pytest.mark.parametrize("attention", ["tree", "mask"])
@pytest.mark.parametrize("row_tokens,batch_tokens,head_rows", [(512, 2048, 512), (24, 48, 3)])
def test_fast_matches_stock(tiny_model, tiny_tokenizer, row_tokens, batch_tokens, head_rows,
                            attention):
    reqs = make_requests(tiny_model, tiny_tokenizer)
    stock, fast = both(tiny_model, tiny_tokenizer, row_tokens=row_tokens,
                       batch_tokens=batch_tokens, head_rows=head_rows, verify=0,
                       attention=attention)
    fast.cache_hook = Recorder()
    ref = stock.loglikelihood(reqs, disable_tqdm=True)
    ours = fast.loglikelihood(reqs, disable_tqdm=True)
    assert_same(ref, ours)
    assert any(a[1] for a in ref), "no greedy continuation exercised"
    work = fast.last_work  # counted from the plan just run
    assert work.requests == len(reqs)
    assert work.tree_tokens < work.stock_tokens and work.tree_tokens <= work.forward_tokens
    assert 0 < work.head_positions < work.tree_tokens
    lengths = [sum(map(len, stock._encode_pair(*r.args))) for r in reqs if r.args[0]]
    assert max(lengths) > stock.max_length + 1, "no left truncation exercised"
    # results reach the cache in request terms
    cached = {key: value for kind, key, value in fast.cache_hook.calls if kind == "loglikelihood"}
    assert cached == {r.args: v for r, v in zip(reqs, ours)}


def test_fast_with_bos_and_bf16(tiny_model, tiny_tokenizer, text_file):
    from tokenizers import processors

    bos_tok = make_tokenizer(text_file.read_text())
    bos_tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos_tok.bos_token_id)])
    reqs = make_requests(tiny_model, bos_tok, n_docs=4, seed=1)
    stock, fast = both(tiny_model, bos_tok)
    stock.add_bos_token = fast.add_bos_token = True
    assert stock.tok_encode("the king")[0] == bos_tok.bos_token_id
    assert_same(stock.loglikelihood(reqs, disable_tqdm=True),
                fast.loglikelihood(reqs, disable_tqdm=True))
    assert fast.fast_config()["fallback_reason"] is None
    low = FastHFLM(pretrained=tiny_model, tokenizer=bos_tok, max_length=48,
                   add_bos_token=True, autocast_dtype="bfloat16")
    ref = stock.loglikelihood(reqs, disable_tqdm=True)
    out = low.loglikelihood(reqs, disable_tqdm=True)
    assert all(np.isfinite(o[0]) for o in out)
    assert max(abs(a[0] - b[0]) for a, b in zip(ref, out)) < 0.5
    with pytest.raises(ValueError, match="autocast_dtype"):
        FastHFLM(pretrained=tiny_model, tokenizer=tiny_tokenizer, autocast_dtype="int8")
    with pytest.raises(ValueError, match="attention"):
        FastHFLM(pretrained=tiny_model, tokenizer=tiny_tokenizer, attention="flash")


#: every registered method but the dense reference, with its declared tiny-model options
#: (MethodFacts.tiny_options: a non-trivial structure on a 6-block model)
METHOD_OPTIONS = {name: tiny_options(name, 6) for name, facts in METHODS.items()
                  if facts.tiny_options}


@pytest.mark.parametrize("family", ["llama", "opt", "gemma3_text"])
@pytest.mark.parametrize("method", sorted(METHOD_OPTIONS))
def test_fast_matches_stock_on_every_method(tiny_tokenizer, method, family):
    """Gemma 3's tiny model has an 8-token sliding window, so the 48-token requests need
    the tree attention's sliding mask."""
    from flexigpt.storage.models.adapters import ADAPTERS
    from flexigpt.storage.registry import get_method

    if ADAPTERS[family].family not in METHODS[method].families:
        pytest.skip(f"{method} refuses the {family} family (test_family_contract)")
    spec = get_method(method)
    calib = torch.randint(3, 300, (4, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model = spec.compress(make_model(family, layers=6), None, calib,
                              spec.make_config(**METHOD_OPTIONS[method])).model.eval()
    if METHODS[method].speculative:  # weight-shared blocks (FlexiGPT's)
        from flexigpt.methods.sharing import SharedLoRALinear

        assert any(isinstance(m, SharedLoRALinear) for m in model.modules())
    reqs = make_requests(model, tiny_tokenizer, n_docs=6, seed=2)
    stock, fast = both(model, tiny_tokenizer)
    assert_same(stock.loglikelihood(reqs, disable_tqdm=True),
                fast.loglikelihood(reqs, disable_tqdm=True))
    cfg = fast.fast_config()
    assert fast.fallback_reason is None and cfg["chunked_head"] and cfg["head_only_at_scored"]
    assert cfg["attention"] == "tree" and not cfg["self_check_notes"]


def test_self_check_falls_back_for_mask_blind_models(tiny_tokenizer):
    model = make_model()
    decoder_forward = model.model.forward

    def blind(input_ids=None, attention_mask=None, position_ids=None, tree_layout=None, **kw):
        return decoder_forward(input_ids=input_ids, **kw)

    model.model.forward = blind  # ignores custom masks, position ids and the tree layout
    reqs = make_requests(model, tiny_tokenizer, n_docs=4, seed=3)
    stock, fast = both(model, tiny_tokenizer, verify=16)
    ours = fast.loglikelihood(reqs, disable_tqdm=True)
    assert fast.fallback_reason is not None and "self-check" in fast.fallback_reason
    notes = fast.fast_config()["self_check_notes"]
    assert [n.split(":")[0] for n in notes] == ["attention=tree", "attention=mask"]
    assert_same(stock.loglikelihood(reqs, disable_tqdm=True), ours)


def soft_capped(cls):
    """A subclass of ``cls`` whose logits are soft-capped (not ``lm_head(decoder(x))``)."""

    class SoftCapped(cls):
        def forward(self, *args, logits_to_keep=0, **kw):
            out = super().forward(*args, logits_to_keep=logits_to_keep, **kw)
            out.logits = 3.0 * torch.tanh(out.logits / 3.0)
            return out

    return SoftCapped


def test_model_without_plain_head_keeps_its_own_forward(tiny_tokenizer):
    from transformers import LlamaForCausalLM

    dense = make_model()
    model = soft_capped(LlamaForCausalLM)(dense.config)
    model.load_state_dict(dense.state_dict())
    model.eval()
    reqs = make_requests(model, tiny_tokenizer, n_docs=4, seed=5)
    stock, fast = both(model, tiny_tokenizer, head_rows=5)
    assert_same(stock.loglikelihood(reqs, disable_tqdm=True),
                fast.loglikelihood(reqs, disable_tqdm=True))
    cfg = fast.fast_config()
    assert not cfg["chunked_head"] and cfg["head_only_at_scored"]
    assert cfg["fallback_reason"] is None
    assert both(dense, tiny_tokenizer)[1].fast_config()["chunked_head"]


def test_head_falls_back_when_logits_to_keep_is_not_boolean(tiny_tokenizer):
    from transformers import LlamaForCausalLM

    class IntKeepOnly(LlamaForCausalLM):
        def forward(self, *args, logits_to_keep=0, **kw):
            if isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.dtype == torch.bool:
                raise TypeError("logits_to_keep must be an int")
            return super().forward(*args, logits_to_keep=logits_to_keep, **kw)

    dense = make_model()
    model = soft_capped(IntKeepOnly)(dense.config)  # no plain head: the model's own forward
    model.load_state_dict(dense.state_dict())
    model.eval()
    reqs = make_requests(model, tiny_tokenizer, n_docs=4, seed=4)
    stock, fast = both(model, tiny_tokenizer)
    assert_same(stock.loglikelihood(reqs, disable_tqdm=True),
                fast.loglikelihood(reqs, disable_tqdm=True))
    assert fast.fallback_reason is None and not fast.fast_config()["head_only_at_scored"]


def test_rolling_is_stock_and_model_is_registered(tiny_model, tiny_tokenizer):
    from lm_eval.api.registry import get_model

    assert get_model("flexigpt-fast") is FastHFLM
    reqs = [Instance("loglikelihood_rolling", {}, (" ".join(WORDS[:30]),), 0)]
    stock, fast = both(tiny_model, tiny_tokenizer)
    a = stock.loglikelihood_rolling(reqs, disable_tqdm=True)
    b = fast.loglikelihood_rolling(reqs, disable_tqdm=True)
    assert a == b


# ---- chunked scoring and the allocator setting ------------------------------------------------
@pytest.mark.parametrize("chunk_rows,tile_rows", [(1, None), (4, None), (64, None), (4, 3),
                                                   (64, 2)])
def test_score_rows_equals_log_softmax_and_argmax(chunk_rows, tile_rows):
    from flexigpt.runtime.evaluation.fast.scoring import score_rows

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(10, 37, generator=gen) * 4
    logits[3, 5] = logits[3, 9] = logits[3].max() + 1  # a tie: argmax takes the first
    rows = torch.tensor([0, 3, 3, 3, 9, 2, 0, 7])  # repeated and unsorted rows
    targets = torch.tensor([1, 5, 9, 0, 36, 2, 1, 8])
    targets[0] = int(logits[0].argmax())
    calls = []

    def logits_of(a, b):
        calls.append((a, b))
        return logits[a:b].clone()

    scratch = torch.empty(2, 37)  # too small for 3+ rows: replaced, never written past
    lp, greedy = score_rows(10, logits_of, rows, targets, chunk_rows, scratch=scratch,
                            tile_rows=tile_rows)
    ref = torch.log_softmax(logits, -1)[rows, targets]
    assert torch.allclose(lp, ref, atol=1e-6)
    assert greedy.tolist() == (logits.argmax(-1)[rows] == targets).tolist()
    assert greedy[0] and greedy[1] and not greedy[2]
    assert calls == [(a, min(a + chunk_rows, 10)) for a in range(0, 10, chunk_rows)]
    low, _ = score_rows(10, lambda a, b: logits[a:b].bfloat16(), rows, targets, chunk_rows)
    assert low.dtype == torch.float32
    with pytest.raises(ValueError, match="equal-length"):
        score_rows(10, logits_of, rows, targets[:3])
    with pytest.raises(ValueError, match="tile_rows"):
        score_rows(10, logits_of, rows, targets, tile_rows=0)


def test_keep_heap_for_reuse_is_idempotent():
    from flexigpt.core import memory

    first = memory.keep_heap_for_reuse()
    assert memory.keep_heap_for_reuse() is first
    if sys.platform.startswith("linux"):
        assert first  # glibc: every mallopt call accepted
