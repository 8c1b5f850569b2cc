"""The install routes the guides give a newcomer, taken as written and without a Rust toolchain
(no cargo or rustc on the PATH): a framework adapter's extra added to the prebuilt wheel (pip
builds nothing), and the TypeScript client packed from the checkout with npm alone, installed
into a fresh ESM project, running the TypeScript guide's snippet as a `.ts` file the way the guide
says, against a real gate."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from test_artifacts import ROOT, gate, run, the_one  # noqa: F401  (gate: the fixture)

NO_RUST = "/usr/bin:/bin"


def without_rust(extra: Path | None = None) -> dict[str, str]:
    path = f"{extra}:{NO_RUST}" if extra else NO_RUST
    env = {**os.environ, "PATH": path}
    assert shutil.which("cargo", path=path) is None and shutil.which("rustc", path=path) is None
    return env


def test_an_adapter_extra_goes_onto_the_prebuilt_wheel(tmp_path: Path) -> None:
    wheel = the_one("oncegate-*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    env = without_rust(venv / "bin")
    # As clients/python/README.md says: the extra named on the wheel's file.
    readme = (ROOT / "clients/python/README.md").read_text()
    assert 'pip install "$(ls dist/oncegate-*.whl)[langgraph]"' in readme
    done = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", f"{wheel}[langgraph]"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Building wheel for oncegate" not in done.stdout + done.stderr
    checked = subprocess.run(
        [
            str(venv / "bin/python"),
            "-c",
            "import langgraph, oncegate.integrations.langgraph, oncegate._native; print('ok')",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    assert checked.stdout.strip() == "ok", checked.stderr


def snippet(guide: Path) -> tuple[str, str]:
    """The guide's first ```ts block, and what its last `console.log` line says it prints."""
    text = guide.read_text()
    code = re.search(r"```ts\n(.*?)```", text, re.S)
    assert code, f"no ts snippet in {guide}"
    expected = re.search(r"console\.log\(.*\); // (.*)$", code.group(1), re.M)
    assert expected, "the snippet's console.log line has no comment saying what it prints"
    return code.group(1), expected.group(1)


def test_the_typescript_client_installs_without_rust_and_runs_the_guide(tmp_path: Path, gate: str) -> None:  # noqa: F811
    guide = ROOT / "docs/agents/typescript.md"
    said = guide.read_text()
    # The route the guide gives, word for word, and what it says an ESM project needs.
    assert "cd clients/typescript && npm ci && npm pack" in said
    assert '"type": "module"' in said and "npx tsx pay.ts" in said
    env = without_rust()
    packed = tmp_path / "packed"
    packed.mkdir()
    done = subprocess.run(
        ["npm", "pack", "--silent", "--pack-destination", str(packed)],
        cwd=ROOT / "clients/typescript", capture_output=True, text=True, timeout=600, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr
    (tarball,) = packed.glob("oncegate-*.tgz")
    project = tmp_path / "project"
    project.mkdir()
    (project / "package.json").write_text(json.dumps({"name": "pays", "private": True, "type": "module"}))
    for args in (["npm", "install", "--no-audit", "--no-fund", str(tarball)], ["npm", "install", "--no-audit", "--no-fund", "-D", "tsx@4.23.15"]):
        installed = subprocess.run(args, cwd=project, capture_output=True, text=True, timeout=600, env=env, check=False)
        assert installed.returncode == 0, installed.stderr
    code, expected = snippet(guide)
    (project / "pay.ts").write_text(code)
    ran = subprocess.run(
        ["npx", "tsx", "pay.ts"],
        cwd=project, capture_output=True, text=True, timeout=120,
        env={**env, "ONCEGATE_TARGET": gate}, check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().splitlines()[-1] == expected, ran.stdout
