"""The README's snippets for ``oncegate.aio`` and the framework adapters run as written, against the
real gate, and print what their comments say (``print(...)  # expected output``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
RUNNABLE = [block for block in BLOCKS if "ONCEGATE_TARGET" in block]
NAMES = ["aio", "openai_agents", "langgraph", "pydantic_ai"]


def expected_output(block: str) -> str:
    lines = [line for line in block.splitlines() if line.lstrip().startswith("print(") and "  # " in line]
    assert len(lines) == 1, "one print line with its expected output in a comment"
    return lines[0].split("  # ", 1)[1].strip()


def test_every_adapter_has_a_snippet() -> None:
    assert len(RUNNABLE) == len(NAMES)
    for name, block in zip(NAMES, RUNNABLE, strict=True):
        assert name == "aio" or f"oncegate.integrations.{name}" in block


@pytest.mark.parametrize("block", RUNNABLE, ids=NAMES)
def test_snippet_runs_and_prints_what_it_says(block: str, gate_target: str, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(block, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "ONCEGATE_TARGET": gate_target},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == expected_output(block)
