#!/usr/bin/env python3
"""Regenerates the committed gRPC stubs of the oncegate Python client from ``proto/``.

Run it from anywhere after changing ``proto/oncegate/v1/oncegate.proto``::

    python clients/python/generate.py

It writes ``oncegate_pb2.py``, ``oncegate_pb2.pyi`` and ``oncegate_pb2_grpc.py`` under
``clients/python/src/oncegate/v1/``. The proto package ``oncegate.v1`` maps onto the Python package
``oncegate.v1``, so the generated imports (``from oncegate.v1 import oncegate_pb2``) resolve inside
the installed package. The output depends on the grpcio-tools version, so use the one pinned in
``pyproject.toml`` (the ``test`` extra); ``tests/test_stubs.py`` checks that the committed stubs are
exactly what this script produces.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTO_FILES = ("oncegate/v1/oncegate.proto",)
PACKAGE_ROOT = HERE / "src"
GENERATED = (
    "oncegate/v1/oncegate_pb2.py",
    "oncegate/v1/oncegate_pb2.pyi",
    "oncegate/v1/oncegate_pb2_grpc.py",
)


def generate(out_dir: Path) -> list[Path]:
    """Compiles the proto files into ``out_dir`` and returns the generated files."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTO_FILES,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return [out_dir / name for name in GENERATED]


def main() -> int:
    """Regenerates the stubs in place."""
    for path in generate(PACKAGE_ROOT):
        print(f"wrote {path.relative_to(HERE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
