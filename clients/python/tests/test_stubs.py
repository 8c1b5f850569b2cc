"""The committed gRPC stubs are exactly what ``generate.py`` makes from ``proto/`` today."""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import version
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
PINNED_TOOLS = "1.85.1"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("oncegate_generate", HERE.parent / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_stubs_match_the_proto(tmp_path: Path) -> None:
    installed = version("grpcio-tools")
    if installed != PINNED_TOOLS:
        pytest.fail(
            f"grpcio-tools {installed} is installed; the stubs are generated with {PINNED_TOOLS}: "
            "pip install ./clients/python[test]"
        )
    generate = _generator()
    stale = [
        str(fresh.relative_to(tmp_path))
        for fresh in generate.generate(tmp_path)
        if fresh.read_bytes() != (generate.PACKAGE_ROOT / fresh.relative_to(tmp_path)).read_bytes()
    ]
    assert not stale, f"stale stubs {stale}: run python clients/python/generate.py"
