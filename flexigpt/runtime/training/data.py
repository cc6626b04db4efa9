"""Deterministic order of training windows, addressable by position (for exact resume).

The training text is cut into all its non-overlapping windows ``[N, T]`` once
(:func:`flexigpt.methods.calibration.token_windows`). The stream of training sequences is
epoch 0's permutation of the N windows, then epoch 1's, ... where epoch ``e`` uses
``randperm(N)`` seeded with ``seed · 1_000_003 + e``. Sequence ``p`` of the stream is a pure
function of ``(windows, seed, p)``, so a resumed run needs only the position.
"""

from __future__ import annotations

import torch


class WindowStream:
    """Sequences of a seeded, epoch-wise shuffled window set.

    Args:
        windows: LongTensor ``[N, T]`` (all windows of the training text).
        seed: data-order seed.
    """

    def __init__(self, windows: torch.Tensor, seed: int) -> None:
        if windows.ndim != 2 or windows.shape[0] == 0:
            raise ValueError(f"windows must be a non-empty [N, T] tensor, got "
                             f"{tuple(windows.shape)}")
        self.windows = windows
        self.seed = seed
        self._epoch = -1
        self._perm = torch.empty(0, dtype=torch.long)

    def __len__(self) -> int:
        return self.windows.shape[0]

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(len(self), generator=gen)
            self._epoch = epoch
        return self._perm

    def sequences(self, start: int, count: int) -> torch.Tensor:
        """Sequences ``start .. start+count-1`` of the stream as ``[count, T]``."""
        rows = []
        for p in range(start, start + count):
            epoch, offset = divmod(p, len(self))
            rows.append(int(self._permutation(epoch)[offset]))
        return self.windows[rows]

    def epochs(self, n_sequences: int) -> float:
        """How many passes over the text ``n_sequences`` sequences make."""
        return n_sequences / len(self)
