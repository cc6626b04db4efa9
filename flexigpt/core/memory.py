"""Where host memory comes from: given back to the system, or kept for reuse.

Two opposite needs, both about glibc's allocator and neither changing any value:

* **Give it back** (:func:`release_freed_memory`, compressors). glibc keeps freed blocks
  below its (adaptive) mmap threshold in the process heap: once a few MiB-sized tensors
  have been freed, later tensors of that size come from the heap and, when freed, stay
  resident. A compressor that replaces every weight by a smaller one therefore never sees
  its resident set fall. ``malloc_trim(0)`` returns every free page of the heap to the
  system (``madvise(MADV_DONTNEED)``).
* **Keep it** (:func:`reuse_freed_memory`, the training loop). A loop allocates and
  frees the same large tensors at every step (the logits ``[B, T, V]``, their fp32 chunks,
  gradients). glibc serves every block over its mmap threshold (at most 32 MiB) with a
  fresh ``mmap`` and unmaps it on free, so every step faults in, and the kernel zeroes, each
  4 KiB page of those tensors again. Measured (``python -m benchmarks.bench_train --reuse-memory
  both``, SmolLM2-135M FlexiGPT recovery, bf16, 8 × 256 tokens per step, Intel Xeon with
  AMX, 2 threads): a 255 × 49,152 fp32 copy took 58 ms, ~5× its memory-bandwidth time, and
  the step ran 1.4-1.6× faster with the heap kept.

* **Keep it for good** (:func:`keep_heap_for_reuse`, the fast lm-eval scorer on CPU): the
  scorer reuses its own buffers and chunks the LM head, so raising glibc's mmap threshold to
  its maximum (32 MiB) and never trimming the heap, once per process, is enough (measured on
  SmolLM2-135M scoring, 1 thread: 1.1 M minor faults and 2.5-3.4 s of system time in ~15 s
  before, 0.06 M and 0.2 s after).

None exists outside glibc (macOS, musl, Windows): each is then a no-op that says so.

What a structure costs before it is built many times over (:func:`traced_bytes`): the
Python heap one instance holds, measured with :mod:`tracemalloc`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

#: ``mallopt`` parameters (glibc ``malloc.h``)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -2, -3, -4
#: glibc's defaults, restored when the outermost :func:`reuse_freed_memory` exits
_DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX = 128 * 1024, 65536
#: the largest ``int`` ``mallopt`` takes: no heap top is trimmed automatically below it
_NEVER_TRIM = 2**31 - 1
#: :func:`keep_heap_for_reuse`: glibc's largest mmap threshold on 64-bit, and the heap's
#: top padding
MMAP_THRESHOLD, TOP_PAD = 32 * 1024 * 1024, 256 * 1024 * 1024
#: :func:`reuse_freed_memory` does nothing while False (``bench_train.py`` measures both)
REUSE = True
_depth = 0
_kept: bool | None = None  # keep_heap_for_reuse's outcome, once called


@functools.cache
def _libc() -> Any:
    """glibc, or None (macOS, musl, Windows: no ``malloc_trim`` / ``mallopt``)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.malloc_trim, libc.mallopt  # noqa: B018 (glibc has both)
    except (OSError, AttributeError, TypeError):
        return None
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return libc


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the system; returns whether the C library could."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


@contextlib.contextmanager
def reuse_freed_memory() -> Iterator[bool]:
    """Inside the block, memory freed by one step serves the next step's allocations.

    Large blocks come from the heap instead of fresh ``mmap`` calls (``M_MMAP_MAX`` 0) and
    the heap is not trimmed automatically (``M_TRIM_THRESHOLD`` 2 GiB), so a loop's
    per-step tensors reuse pages that are already resident instead of faulting them in
    again (module docstring). The resident set therefore stays near the loop's peak between
    steps rather than falling. Nested blocks are one block; on leaving the outermost one,
    glibc's defaults are restored and the free pages returned (where
    :func:`keep_heap_for_reuse` has kept the heap for good, it stays kept).
    Changes where memory comes from, never a value. Yields whether it took effect (False
    outside glibc, or while :data:`REUSE` is False).
    """
    global _depth
    libc = _libc() if REUSE else None
    if libc is None:
        yield False
        return
    if _depth == 0:
        libc.mallopt(_M_MMAP_MAX, 0)
        libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)
    _depth += 1
    try:
        yield True
    finally:
        _depth -= 1
        if _depth == 0:  # back to glibc's defaults, or to keep_heap_for_reuse's for good
            libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
            if not _kept:
                libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
                libc.malloc_trim(0)


def keep_heap_for_reuse() -> bool:
    """Raise glibc's mmap threshold to its maximum and never trim the heap, once per process
    (module docstring); returns whether glibc accepted every setting (False outside glibc).
    Changes where memory comes from, never a value."""
    global _kept
    if _kept is None:
        libc = _libc()
        _kept = libc is not None and all(libc.mallopt(param, value) == 1 for param, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, _NEVER_TRIM),
            (_M_TOP_PAD, TOP_PAD)))
    return _kept


def traced_bytes(build: Callable[[], T]) -> tuple[T, int]:
    """``(build(), bytes)``: the bytes of Python heap the result of ``build`` still holds
    once built (what was allocated during the call and not freed after a garbage
    collection). Counts every Python object and buffer allocated through Python's
    allocators (an ``nn.Module`` and its dicts, a tensor's Python object); memory a C
    extension takes with ``malloc`` itself (a tensor's storage, its C++ bookkeeping) is not
    seen. Call ``build`` once before to leave out first-use caches."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        result = build()
        gc.collect()
        return result, max(tracemalloc.get_traced_memory()[0] - before, 0)
    finally:
        if started:
            tracemalloc.stop()
