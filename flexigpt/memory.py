"""Give freed host memory back to the operating system.

glibc keeps freed blocks below its (adaptive) mmap threshold in the process heap: once a
few MiB-sized tensors have been freed, later tensors of that size come from the heap and,
when freed, stay resident. A compressor that replaces every weight by a smaller one
therefore never sees its resident set fall. ``malloc_trim(0)`` returns every free page of
the heap to the system (``madvise(MADV_DONTNEED)``); it changes no value.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (macOS, musl, Windows)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the system; returns whether the C library could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
