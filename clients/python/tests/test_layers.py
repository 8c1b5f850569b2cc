"""The package's layers: every import inside ``oncegate`` points down, never up or sideways.

Read from the source with :mod:`ast`, so imports under ``if TYPE_CHECKING:`` and inside functions
count as much as the others: a cycle drawn only for the type checker is still a cycle for a reader.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "src" / "oncegate"

NATIVE = {"oncegate._native"}
"""The extension modules (Rust, clients/python/native): no Python source to read, nothing of the
package imported."""

LAYERS: list[set[str]] = [
    NATIVE,
    {"oncegate.v1", "oncegate.v1.oncegate_pb2", "oncegate.v1.oncegate_pb2_grpc"},
    {"oncegate._json", "oncegate.address"},
    {"oncegate.fingerprints", "oncegate.models"},
    {"oncegate.statements"},
    {"oncegate.errors.gate"},
    {"oncegate.errors.outcome", "oncegate.errors.status"},
    {"oncegate.errors.deprecated"},
    {"oncegate.errors"},
    {"oncegate.wire"},
    {"oncegate.native"},
    {"oncegate.channel"},
    {"oncegate.rpc"},
    {"oncegate.guard.options", "oncegate.guard.context", "oncegate.guard.backoff"},
    {"oncegate.guard.heartbeat", "oncegate.guard.hint", "oncegate.guard.protocol", "oncegate.guard.binding"},
    {"oncegate.guard.attempt"},
    {"oncegate.guard.runner"},
    {"oncegate.guard.decorator"},
    {"oncegate.guard"},
    {"oncegate.client"},
    {"oncegate.resolver"},
    {"oncegate.local_gate"},
    {"oncegate.aio.channel"},
    {"oncegate.aio.rpc"},
    {"oncegate.aio.heartbeat"},
    {"oncegate.aio.attempt"},
    {"oncegate.aio.runner"},
    {"oncegate.aio.decorator"},
    {"oncegate.aio.client"},
    {"oncegate.aio.resolver"},
    {"oncegate.aio.local_gate"},
    {"oncegate.aio"},
    {"oncegate.integrations.messages"},
    {"oncegate.integrations.temporal.failures", "oncegate.integrations.temporal.payloads"},
    {
        "oncegate.integrations.openai_agents",
        "oncegate.integrations.langgraph",
        "oncegate.integrations.pydantic_ai",
        "oncegate.integrations.temporal",
        "oncegate.integrations.temporal.testing",
        "oncegate.integrations.celery",
    },
    {"oncegate.integrations"},
    {"oncegate"},
]
"""Bottom first. A module may import modules of the layers below its own, and nothing else of the
package; only the generated stubs import each other."""

RANK = {module: rank for rank, layer in enumerate(LAYERS) for module in layer}
GENERATED = LAYERS[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(module: str, source: str, is_package: bool = False) -> set[str]:
    """The ``oncegate`` modules that ``source`` (the text of ``module``) imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from oncegate import guard` imports the module oncegate.guard, not only the package.
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in RANK else base for a in node.names)
    return {name for name in found if name == "oncegate" or name.startswith("oncegate.")}


def upward_imports(module: str, imported: set[str]) -> list[str]:
    """The imports of ``module`` that do not point to a lower layer."""
    if module in GENERATED:
        return sorted(name for name in imported if name not in GENERATED)
    return sorted(name for name in imported if RANK.get(name, len(LAYERS)) >= RANK[module])


SOURCES = {
    module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py")) if "__pycache__" not in path.parts
}


def test_every_module_has_a_layer() -> None:
    assert set(SOURCES) | NATIVE == set(RANK)


def test_the_client_imports_no_framework_or_orchestrator() -> None:
    """The adapters' dependencies are optional extras: importing the clients loads none of them."""
    script = (
        "import sys, oncegate, oncegate.aio, oncegate.integrations; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'temporalio', 'celery', 'redis', 'agents', 'langgraph', 'langchain_core', 'pydantic_ai'}))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_only_the_native_module_loads_the_extension() -> None:
    loaders = {
        module
        for module, path in SOURCES.items()
        if NATIVE & package_imports(module, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    }
    assert loaders == {"oncegate.native"}


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_imports_point_down(module: str) -> None:
    path = SOURCES[module]
    imported = package_imports(module, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    assert upward_imports(module, imported) == []


def test_the_layers_are_used() -> None:
    def imports_of(module: str) -> set[str]:
        path = SOURCES[module]
        return package_imports(module, path.read_text(encoding="utf-8"), path.name == "__init__.py")

    assert {"oncegate.rpc", "oncegate.guard.attempt"} <= imports_of("oncegate.client")
    assert "oncegate.rpc" in imports_of("oncegate.guard.attempt")
    assert not any(name.startswith("oncegate.guard") for name in imports_of("oncegate.rpc"))
    assert {"oncegate.aio.rpc", "oncegate.aio.attempt"} <= imports_of("oncegate.aio.client")
    assert "oncegate.native" in imports_of("oncegate.channel") & imports_of("oncegate.aio.channel")
    assert "oncegate.guard.protocol" in imports_of("oncegate.aio.attempt") & imports_of(
        "oncegate.guard.attempt"
    )


@pytest.mark.parametrize(
    ("module", "source", "upward"),
    [
        ("oncegate.rpc", "from oncegate.client import Gate", ["oncegate.client"]),
        ("oncegate.rpc", "from oncegate import guard", ["oncegate.guard"]),
        ("oncegate.guard.attempt", "if TYPE_CHECKING:\n    from oncegate import Gate", ["oncegate"]),
        ("oncegate.guard.attempt", "from . import decorator", ["oncegate.guard.decorator"]),
        ("oncegate.guard.attempt", "from .backoff import Backoff", []),
        ("oncegate.errors.gate", "import oncegate.errors", ["oncegate.errors"]),
        ("oncegate.models", "from oncegate.fingerprints import fingerprint", ["oncegate.fingerprints"]),
        ("oncegate.rpc", "import grpc\nfrom oncegate.errors import from_rpc_error", []),
        ("oncegate.native", "from oncegate import _native", []),
        ("oncegate.native", "from oncegate import channel", ["oncegate.channel"]),
    ],
)
def test_the_check_sees_upward_imports(module: str, source: str, upward: list[str]) -> None:
    assert upward_imports(module, package_imports(module, source)) == upward
