"""``import flexigpt`` and the CLI's entry load no torch (PEP 562 lazy names), so light
commands (``tables``, ``fetch``, ``archive``, ``--help``) start in milliseconds; the public
names still resolve on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _loads_torch(code: str) -> bool:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\n"
                          "print('torch' in sys.modules)"], capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1] == "True"


def test_package_and_cli_import_without_torch():
    assert not _loads_torch("import flexigpt, flexigpt.cli")
    for command in ("tables", "fetch", "archive"):
        assert not _loads_torch(
            "import argparse, importlib\nfrom flexigpt.cli import COMMANDS\n"
            f"importlib.import_module(COMMANDS[{command!r}]).add_arguments("
            "argparse.ArgumentParser())"), command


def test_public_names_resolve_on_first_use():
    import flexigpt

    assert set(flexigpt.__all__) <= set(dir(flexigpt))
    for name in flexigpt.__all__:
        assert getattr(flexigpt, name) is not None
    assert flexigpt.save_compressed is flexigpt.publish_compressed
    try:
        flexigpt.no_such_name  # noqa: B018
    except AttributeError as err:
        assert "no_such_name" in str(err)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_lazy_exports_import_on_first_read_and_cache():
    """core.lazy: a name is imported when first read and kept in the package's namespace;
    an unknown name is an AttributeError naming the package; ``dir`` lists both."""
    from flexigpt.core.lazy import lazy_exports

    namespace: dict = {"__name__": "pkg"}
    getattr_, dir_ = lazy_exports("pkg", {"dumps": "json", "sep": ("os", "sep")}, namespace)
    import json
    import os

    assert getattr_("dumps") is json.dumps and namespace["dumps"] is json.dumps
    assert getattr_("sep") == os.sep
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'nope'"):
        getattr_("nope")
    assert {"dumps", "sep", "__name__"} <= set(dir_())
