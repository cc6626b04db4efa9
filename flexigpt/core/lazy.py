"""Package attributes imported on first use (PEP 562): a package names its public
attributes and the modules that define them, and importing the package loads none of them
(a light command or job does not pay for torch, the trainer or the decoder it never uses).

Usage, in a package's ``__init__``::

    __getattr__, __dir__ = lazy_exports(__name__, {"train_model": "pkg.runner"}, globals())
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

#: public name → its module (the attribute of the same name), or (module, attribute)
Exports = Mapping[str, "str | tuple[str, str]"]


def lazy_exports(package: str, exports: Exports, namespace: dict[str, Any],
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: reading a name of ``exports`` imports its
    module once and caches the value in ``namespace`` (the package's ``globals()``); any
    other name raises ``AttributeError`` as a module without it would."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        target = exports[name]
        module, attribute = (target, name) if isinstance(target, str) else target
        value = getattr(importlib.import_module(module), attribute)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
