"""The threaded client is generated from the asyncio one: the committed threaded modules are exactly
what ``generate_sync.py`` (unasync) writes from their asyncio sources today."""

from __future__ import annotations

import importlib.util
import sys
import tokenize
from importlib.metadata import version
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
PINNED_UNASYNC = "0.6.0"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("oncegate_generate_sync", HERE.parent / "generate_sync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GENERATE = _generator()


def _unasync_pinned() -> None:
    installed = version("unasync")
    if installed != PINNED_UNASYNC:
        pytest.fail(
            f"unasync {installed} is installed; the threaded client is generated with {PINNED_UNASYNC}: "
            "pip install ./clients/python[test]"
        )


def test_the_threaded_client_is_what_its_asyncio_source_generates(tmp_path: Path) -> None:
    _unasync_pinned()
    stale = [
        str(fresh.relative_to(tmp_path))
        for fresh in GENERATE.generate(tmp_path)
        if fresh.read_bytes() != (GENERATE.PACKAGE / fresh.relative_to(tmp_path)).read_bytes()
    ]
    assert not stale, f"stale generated modules {stale}: run python clients/python/generate_sync.py"


def test_an_edited_source_makes_the_committed_file_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The comparison above would pass on any two identical trees; this one shows it reads the source.
    _unasync_pinned()
    package = tmp_path / "src" / "oncegate"
    for source in GENERATE.FILES:
        (package / source).parent.mkdir(parents=True, exist_ok=True)
        (package / source).write_bytes((GENERATE.PACKAGE / source).read_bytes())
    edited = package / "aio" / "attempt.py"
    edited.write_text(
        edited.read_text(encoding="utf-8").replace(
            "await self._release(ReleaseReason.NOT_ATTEMPTED)",
            "await self._release(ReleaseReason.DEFINITE_FAILURE)",
        ),
        encoding="utf-8",
    )
    monkeypatch.setattr(GENERATE, "PACKAGE", package)
    out = tmp_path / "out"
    fresh = {
        path.relative_to(out).as_posix(): path.read_text(encoding="utf-8") for path in GENERATE.generate(out)
    }
    committed = (HERE.parent / "src" / "oncegate" / "guard" / "attempt.py").read_text(encoding="utf-8")
    assert fresh["guard/attempt.py"] != committed
    assert "self._release(ReleaseReason.DEFINITE_FAILURE)\n" in fresh["guard/attempt.py"].split("def skip")[1]
    assert fresh["client.py"] == (HERE.parent / "src" / "oncegate" / "client.py").read_text(encoding="utf-8")


def test_the_threaded_modules_have_no_asyncio_left() -> None:
    # In the code, that is: the docstrings may name oncegate.aio and asyncio.CancelledError.
    for target in GENERATE.FILES.values():
        path = GENERATE.PACKAGE / target
        with path.open("rb") as source:
            tokens = list(tokenize.tokenize(source.readline))
        names = {token.string for token in tokens if token.type == tokenize.NAME}
        comments = [token.string for token in tokens if token.type == tokenize.COMMENT]
        assert not names & {"async", "await", "asyncio", "aio", "Awaitable", "__aenter__", "__aexit__"}, (
            target
        )
        assert not [comment for comment in comments if "async only" in comment], target


def test_a_rule_the_sources_outgrew_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(GENERATE, "TEXT", [*GENERATE.TEXT, ("oncegate.aio.nothing", "oncegate.nothing")])
    with pytest.raises(RuntimeError, match=r"oncegate\.aio\.nothing"):
        GENERATE.generate(tmp_path)


def test_ruff_leaves_the_generated_layout_alone() -> None:
    # They keep their source's import order and line breaks; pyproject.toml must name each of them.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((HERE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    generated = {f"src/oncegate/{target}" for target in GENERATE.FILES.values()}
    assert set(pyproject["tool"]["ruff"]["format"]["exclude"]) == generated
