"""The training losses: next-token cross-entropy (chunked, fp32) and knowledge distillation.

Both take logits ``[B, T, V]`` of any float dtype and score the predicted positions
(every one but the last) in fp32.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

#: Rows of the logits processed at once by :class:`NextTokenCrossEntropy` (bounds the fp32
#: temporaries to CHUNK_ROWS × V instead of B·T × V).
CHUNK_ROWS = 256


class NextTokenCrossEntropy(torch.autograd.Function):
    """Mean next-token cross-entropy of ``logits [B, T, V]`` (any float dtype) against
    ``ids [B, T]``, computed in fp32 a few rows at a time.

    Equal to ``F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())``
    (and its gradient), without the fp32 copy of the logits, the saved fp32 log-softmax and
    the zero-padded slice gradient: the forward keeps nothing but the inputs, the backward
    recomputes each chunk's softmax and writes ``(softmax − onehot)/N`` straight into a
    gradient of the logits' dtype. Chunks are contiguous row ranges of one sequence.
    """

    @staticmethod
    def _chunks(b: int, t: int):
        for i in range(b):
            for start in range(0, t - 1, CHUNK_ROWS):
                yield i, start, min(start + CHUNK_ROWS, t - 1)

    @staticmethod
    def forward(ctx, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:  # noqa: D102
        b, t, _ = logits.shape
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for i, start, end in NextTokenCrossEntropy._chunks(b, t):
            logp = torch.log_softmax(logits[i, start:end].float(), dim=-1)
            total -= logp.gather(1, ids[i, start + 1:end + 1, None]).sum()
        ctx.save_for_backward(logits, ids)
        return total / (b * (t - 1))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: D102
        logits, ids = ctx.saved_tensors
        b, t, _ = logits.shape
        out = torch.empty_like(logits)
        out[:, -1].zero_()
        scale = grad.float() / (b * (t - 1))
        for i, start, end in NextTokenCrossEntropy._chunks(b, t):
            probs = torch.softmax(logits[i, start:end].float(), dim=-1)
            rows = torch.arange(end - start, device=logits.device)
            probs[rows, ids[i, start + 1:end + 1]] -= 1.0
            out[i, start:end] = probs.mul_(scale)
        return out, None


def causal_lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (fp32) of ``logits [B, T, V]`` against ``ids [B, T]``
    (:class:`NextTokenCrossEntropy`)."""
    return NextTokenCrossEntropy.apply(logits, ids)


def kd_loss(logits: torch.Tensor, teacher_logits: torch.Tensor,
            temperature: float) -> torch.Tensor:
    """T² · mean over predicted positions of KL(teacher ‖ student) at temperature T.

    ``logits``/``teacher_logits``: ``[B, T, V]``; the positions are those of
    :func:`causal_lm_loss` (every one but the last), computed in fp32. Zero iff the two
    next-token distributions agree.
    """
    student = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits[:, :-1].float() / temperature, dim=-1)
    kl = F.kl_div(student.reshape(-1, student.shape[-1]), teacher.reshape(-1, teacher.shape[-1]),
                  log_target=True, reduction="batchmean")
    return kl * temperature**2

