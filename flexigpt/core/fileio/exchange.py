"""Two directories swapped in one step: Linux ``renameat2(RENAME_EXCHANGE)`` through ctypes,
where the platform, the C library and the file system have it. :func:`~flexigpt.core.fileio
.outputs.atomic_directory` replaces an existing output with it, and falls back to two
renames (and a restore on the next save) where it returns False.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from typing import Any

#: set to ``1``, ``atomic_directory`` swaps with two renames even where the file system
#: can exchange two directories in one step (the kill -9 suite tests that path too)
NO_EXCHANGE_ENV = "FLEXIGPT_NO_EXCHANGE"


def _renameat2() -> Any:
    """libc's ``renameat2`` (Linux, glibc 2.28+), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                         ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


#: ``renameat2`` arguments: the current directory, and the flag that swaps two paths
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def exchange(first: str | os.PathLike, second: str | os.PathLike) -> bool:
    """Swap two existing paths in one step (``renameat2(RENAME_EXCHANGE)``): afterwards
    each name holds what the other held, and no moment exists where either is missing.

    Returns False, having changed nothing, where the platform, the C library or the file
    system has no such exchange (or :data:`NO_EXCHANGE_ENV` is ``1``).

    Raises:
        OSError: the exchange was possible but failed (a permission, a missing path).
    """
    if os.environ.get(NO_EXCHANGE_ENV) == "1":
        return False
    function = _renameat2()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second),
                _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), os.fspath(second))
