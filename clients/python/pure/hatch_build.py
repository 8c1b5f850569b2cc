"""How hatchling builds oncegate on grpcio alone (pyproject.toml beside this file): the metadata of
the package's own project, ``../pyproject.toml``, and its files under ``../src/oncegate`` but the
native core's (``_native``: the extension module and its type stub), so that the wheel is pure
Python, one for every platform. Decides nothing about the package; it only copies it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.metadata.plugin.interface import MetadataHookInterface

if sys.version_info >= (3, 11):
    import tomllib
else:  # hatchling itself depends on tomli there
    import tomli as tomllib

# The fields taken from the native project as they are (the name is this file's own).
FIELDS = ("version", "description", "requires-python", "license", "dependencies")
# The extras that are the package's own to offer; `test` is the repository's test tooling.
NOT_EXTRAS = ("test",)


def native_project(root: str) -> Path:
    """The native project's directory, the parent of this one."""
    project = Path(root).resolve().parent
    if not (project / "pyproject.toml").is_file() or not (project / "src" / "oncegate").is_dir():
        raise FileNotFoundError(
            f"{project}: not the oncegate client's project; build from the repository checkout "
            "(pip install ./clients/python/pure)"
        )
    return project


class SameMetadata(MetadataHookInterface):
    """The native project's metadata: the same distribution, minus its native core."""

    def update(self, metadata: dict[str, Any]) -> None:
        project = native_project(self.root)
        native = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        for field in FIELDS:
            metadata[field] = native[field]
        metadata["optional-dependencies"] = {
            name: requirements
            for name, requirements in native.get("optional-dependencies", {}).items()
            if name not in NOT_EXTRAS
        }
        metadata["readme"] = {
            "content-type": "text/markdown",
            "text": (project / native["readme"]).read_text(encoding="utf-8"),
        }


class WithoutNativeCore(BuildHookInterface):
    """The package's files, but the native core's and Python's caches."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        package = native_project(self.root) / "src" / "oncegate"
        for path in sorted(package.rglob("*")):
            relative = path.relative_to(package)
            if (
                path.is_file()
                and not relative.name.startswith("_native")
                and "__pycache__" not in relative.parts
                and path.suffix not in (".pyc", ".so", ".pyd")
            ):
                build_data["force_include"][str(path)] = str(Path("oncegate") / relative)
