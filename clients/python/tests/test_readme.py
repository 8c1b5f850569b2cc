"""The README's snippets run as written, against the real gate, and print what their comments say
(``print(...)  # expected output``): this client's README (the decorator, reconciling an unknown
outcome, ``oncegate.aio`` and each framework adapter), and every Python snippet of the repository's
README and of its guides under docs/ (docs/agents/python.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RealGate

README = Path(__file__).resolve().parents[1] / "README.md"
ROOT = Path(__file__).resolve().parents[3]
ROOT_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(readme: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", readme.read_text(encoding="utf-8"), flags=re.DOTALL)


RUNNABLE = [
    block for block in python_blocks(README) if "ONCEGATE_TARGET" in block or "oncegate.local(" in block
]
NAMES = ["decorator", "reconcile", "aio", "local", "openai_agents", "langgraph", "pydantic_ai"]
ROOT_BLOCKS = [block for page in ROOT_PAGES for block in python_blocks(page)]


def expected_output(block: str) -> str:
    lines = [line for line in block.splitlines() if line.lstrip().startswith("print(") and "  # " in line]
    assert len(lines) == 1, "one print line with its expected output in a comment"
    return lines[0].split("  # ", 1)[1].strip()


def test_every_adapter_has_a_snippet() -> None:
    assert len(RUNNABLE) == len(NAMES)
    for name, block in zip(NAMES, RUNNABLE, strict=True):
        assert name in ("decorator", "reconcile", "aio", "local") or f"oncegate.integrations.{name}" in block


def test_every_python_snippet_runs() -> None:
    # A snippet that cannot run against the gate (no ONCEGATE_TARGET, no gate of its own) is one
    # that was not tested.
    untested = [b for b in python_blocks(README) if b not in RUNNABLE and "fingerprint(" not in b]
    assert not untested, untested
    assert len(ROOT_BLOCKS) >= 2 and all("ONCEGATE_TARGET" in b for b in ROOT_BLOCKS)


@pytest.mark.parametrize(
    "block", RUNNABLE + ROOT_BLOCKS, ids=NAMES + [f"root_{n}" for n in range(len(ROOT_BLOCKS))]
)
def test_snippet_runs_and_prints_what_it_says(
    block: str, gate_target: str, real_gate: RealGate, tmp_path: Path
) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(block, encoding="utf-8")
    admin = f"unix:{real_gate.data_dir / 'admin.sock'}"  # the resolvers' page: the local operator
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "ONCEGATE_TARGET": gate_target, "ONCEGATE_ADMIN_TARGET": admin},
        cwd=tmp_path,  # where a snippet's own data directory (oncegate.local's) goes
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == expected_output(block)
