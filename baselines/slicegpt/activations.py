"""Where the rotate-and-slice loop keeps its calibration activations ``[N, T, D]``.

The loop reads and rewrites the current block's inputs batch by batch (``rotate.py``). At
N = 1024 windows of 128 tokens SmolLM2's buffer is 288 MiB in fp32, at Llama-2-7B's
2048-token windows 32 GiB: more than the model. Two stores with one interface:

* :class:`MemoryStore` — one host tensor (fastest; the whole buffer is resident).
* :class:`DiskStore` — an unlinked temporary file (gone when the process ends, even on
  ``kill -9``); only the batch being worked on is in memory, the rest lives in the page cache
  or on disk, outside the process's resident set.

Both hand out a batch as a ``[b, T, D]`` tensor with the same strides and take full-width
batches back, so the loop computes bit-identical results with either (a test pins it).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from typing import Protocol

import torch

log = logging.getLogger(__name__)

#: ``SliceGPTConfig.activations`` values
STORES = ("disk", "memory")


class ActivationStore(Protocol):
    """Rows ``[N, T, D]`` of calibration activations, addressed by a slice of windows."""

    shape: tuple[int, int, int]
    dtype: torch.dtype

    def read(self, rows: slice) -> torch.Tensor:
        """Windows ``rows`` as a ``[b, T, D]`` host tensor (the caller may modify it)."""
        ...

    def write(self, rows: slice, values: torch.Tensor) -> None:
        """Store ``values [b, T, D]`` (any device; cast to the store's dtype) at ``rows``."""
        ...

    def close(self) -> None:
        """Release the storage."""
        ...


class MemoryStore:
    """The whole buffer as one host tensor."""

    def __init__(self, shape: tuple[int, int, int], dtype: torch.dtype) -> None:
        self.shape, self.dtype = shape, dtype
        self.buffer = torch.empty(shape, dtype=dtype)

    def read(self, rows: slice) -> torch.Tensor:
        return self.buffer[rows]

    def write(self, rows: slice, values: torch.Tensor) -> None:
        target = self.buffer[rows]
        if values.data_ptr() == target.data_ptr() and values.stride() == target.stride():
            return  # a batch from read(), modified in place
        target.copy_(values)

    def close(self) -> None:
        self.buffer = torch.empty(0, dtype=self.dtype)


class DiskStore:
    """The buffer in an unlinked temporary file, read and written a batch at a time.

    Window ``i`` occupies bytes ``[i·T·D·s, (i+1)·T·D·s)`` (``s`` = element size), so a
    slice of windows is one contiguous range. Plain positioned reads and writes (no memory
    map: mapped pages would count in the resident set again).
    """

    def __init__(self, shape: tuple[int, int, int], dtype: torch.dtype,
                 directory: str | None = None) -> None:
        self.shape, self.dtype = shape, dtype
        n, t, d = shape
        self.row_bytes = t * d * torch.empty(0, dtype=dtype).element_size()
        where = directory or tempfile.gettempdir()
        need = n * self.row_bytes
        free = shutil.disk_usage(where).free
        if free < need:
            raise ValueError(f"slicegpt: the calibration activations need {need / 2**20:.0f} MiB "
                             f"on disk but {where!r} has {free / 2**20:.0f} MiB free; set "
                             "TMPDIR to a larger disk or use activations='memory'")
        # held open for the store's life, closed by close(): not a with-block
        self.file = tempfile.TemporaryFile(dir=directory, buffering=0)  # noqa: SIM115
        self.file.truncate(need)

    def _range(self, rows: slice) -> tuple[int, int]:
        start, stop, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("DiskStore reads contiguous windows only")
        return start, stop

    def read(self, rows: slice) -> torch.Tensor:
        start, stop = self._range(rows)
        self.file.seek(start * self.row_bytes)
        out = torch.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        view = out.view(torch.uint8).numpy().data.cast("B")
        done = 0
        while done < len(view):
            got = self.file.readinto(view[done:])
            if not got:
                raise OSError(f"short read from the activation file at byte {done}")
            done += got
        return out

    def write(self, rows: slice, values: torch.Tensor) -> None:
        start, stop = self._range(rows)
        if values.shape != (stop - start, *self.shape[1:]):
            raise ValueError(f"expected {(stop - start, *self.shape[1:])}, got {tuple(values.shape)}")
        self.file.seek(start * self.row_bytes)
        host = values.detach().to(device="cpu", dtype=self.dtype).contiguous()
        view = host.view(torch.uint8).numpy().data.cast("B")
        done = 0
        while done < len(view):
            done += self.file.write(view[done:]) or 0

    def close(self) -> None:
        self.file.close()


def open_store(kind: str, shape: tuple[int, int, int], dtype: torch.dtype,
               directory: str | None = None) -> ActivationStore:
    """A :class:`DiskStore` (``"disk"``, in ``directory``, default: Python's temporary
    directory, i.e. ``$TMPDIR`` or ``/tmp``) or a
    :class:`MemoryStore` (``"memory"``) for ``shape``."""
    mib = shape[0] * shape[1] * shape[2] * torch.empty(0, dtype=dtype).element_size() / 2**20
    log.info("calibration activations %s %s (%.1f MiB) in %s", shape, dtype, mib, kind)
    if kind == "memory":
        return MemoryStore(shape, dtype)
    if kind == "disk":
        return DiskStore(shape, dtype, directory)
    raise ValueError(f"activations must be one of {list(STORES)}, got {kind!r}")


class StagedRows:
    """A ``[V, D]`` matrix copied into a :class:`DiskStore` so that its tensor can be freed;
    reads back row slices ``[a:b]`` (on the matrix's device) with the same values."""

    def __init__(self, matrix: torch.Tensor, directory: str | None = None) -> None:
        self.shape, self.dtype, self.device = matrix.shape, matrix.dtype, matrix.device
        self.store = DiskStore((matrix.shape[0], 1, matrix.shape[1]), matrix.dtype, directory)
        self.store.write(slice(0, matrix.shape[0]), matrix.detach().unsqueeze(1))

    def __getitem__(self, rows: slice) -> torch.Tensor:
        return self.store.read(rows).squeeze(1).to(self.device)

    def close(self) -> None:
        self.store.close()


def stage_rows(kind: str, matrix: torch.Tensor) -> torch.Tensor | StagedRows:
    """``matrix`` itself (``"memory"``) or a :class:`StagedRows` copy of it (``"disk"``)."""
    return StagedRows(matrix) if kind == "disk" else matrix
