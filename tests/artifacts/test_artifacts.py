"""The installable artifacts `make dist` builds: the Python wheel and the npm tarball,
each installed into a clean virtualenv / a clean npm project outside the checkout (no in-tree
`build/`, no link to the checkout's `node_modules`) and used to run a guarded action twice against
a real gate: it runs once, and the retry gets its receipt back. And the Python client on grpcio
alone (`clients/python/pure`), installed from the checkout on a PATH without cargo or rustc."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("ONCEGATE_BIN", str(ROOT / "target/debug/oncegate"))
DIST = Path(os.environ.get("ONCEGATE_DIST", str(ROOT / "dist")))


def the_one(pattern: str) -> Path:
    found = sorted(DIST.glob(pattern))
    assert len(found) == 1, f"{DIST}/{pattern}: {found} (run `make dist`)"
    return found[0]


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[str]:
    """A real gate on its embedded store: its address."""
    process = subprocess.Popen(
        [BIN, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "gate"), "--no-admin-socket"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "RUST_LOG": "warn"},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"listening on (\S+)", line)
    assert found, f"the gate did not start: {line!r}"
    yield found.group(1)
    process.terminate()
    process.wait(10)


def run(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


def test_the_wheel_installs_into_a_clean_virtualenv_and_guards_an_action(tmp_path: Path, gate: str) -> None:
    wheel = the_one("oncegate-*.whl")
    # One wheel for every CPython from 3.10 on: the native core is built against the stable ABI.
    assert "-cp310-abi3-" in wheel.name, wheel.name
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", str(wheel)], tmp_path)
    app = tmp_path / "app"
    app.mkdir()
    (app / "agent.py").write_text(textwrap.dedent(f"""
        import sys

        import oncegate
        from oncegate import Gate, Grant, native

        gate = Gate({gate!r})
        paid = []

        @gate.action("payments.transfer")
        def transfer(amount: int, to: str, *, grant: Grant) -> dict:
            paid.append(grant.provider_key)
            return {{"transfer_id": f"tr-{{len(paid)}}"}}

        with gate.scope(agent_id="billing-agent", run_id=sys.argv[1]):
            first = transfer(5000, "DE89", idempotency_key="invoice-42")
            again = transfer(5000, "DE89", idempotency_key="invoice-42")
        print(oncegate.__file__)
        print(type(gate._open()).__module__, native.enabled())
        print(first == again, len(paid), first["transfer_id"])
    """))
    out = run([python, "agent.py", "wheel-run"], app, timeout=60).stdout.splitlines()
    installed, transport, result = out[-3:]
    # The installed package, not the checkout's source, on its native core.
    assert installed.startswith(str(venv)) and str(ROOT) not in installed, installed
    assert transport == "oncegate.native True", out
    assert result == "True 1 tr-1", out
    # The same wheel on grpcio alone.
    pure = subprocess.run(
        [python, "agent.py", "pure-run"],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ONCEGATE_PURE_PYTHON": "1"},
        check=False,
    )
    assert pure.returncode == 0, pure.stderr
    assert pure.stdout.splitlines()[-2:] == ["oncegate.v1.oncegate_pb2_grpc False", "True 1 tr-1"], pure.stdout


def test_the_wheel_runs_the_gate_in_process_without_a_server_or_a_toolchain(tmp_path: Path) -> None:
    # oncegate.local from the installed wheel alone: no gate process, no gate binary, and no cargo
    # or rustc on the PATH (a second process on the same directory then replays the receipt).
    wheel = the_one("oncegate-*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", str(wheel)], tmp_path)
    app = tmp_path / "app"
    app.mkdir()
    (app / "agent.py").write_text(textwrap.dedent("""
        import shutil
        import sys

        import oncegate

        paid = []
        with oncegate.local("data") as gate:
            @gate.action("payments.transfer")
            def transfer(amount: int, to: str, *, grant: oncegate.Grant) -> dict:
                paid.append(grant.provider_key)
                return {"transfer_id": f"tr-{sys.argv[1]}"}

            with gate.scope(agent_id="billing-agent", run_id="run-1"):
                receipt = transfer(5000, "DE89", idempotency_key="invoice-42")
        print(shutil.which("cargo"), shutil.which("rustc"), shutil.which("oncegate"))
        print(len(paid), receipt["transfer_id"])
    """))
    env = {**os.environ, "PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    env.pop("ONCEGATE_BIN", None)
    first = subprocess.run(
        [python, "agent.py", "first"], cwd=app, capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-2:] == ["None None None", "1 tr-first"], first.stdout
    again = subprocess.run(
        [python, "agent.py", "again"], cwd=app, capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == "0 tr-first", again.stdout


def without_a_toolchain(venv: Path) -> dict[str, str]:
    """The environment of a machine without Rust: a PATH of the virtualenv and the system's
    directories, with no cargo or rustc on it, and none of cargo's or rustup's variables."""
    path = f"{venv / 'bin'}:/usr/bin:/bin"
    for tool in ("cargo", "rustc", "maturin"):
        assert shutil.which(tool, path=path) is None, f"{tool} on {path}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARGO", "RUSTUP", "RUSTC"))}
    env.pop("ONCEGATE_PURE_PYTHON", None)
    return {**env, "PATH": path}


def test_the_pure_client_installs_without_a_toolchain_and_guards_an_action(tmp_path: Path, gate: str) -> None:
    # clients/python/pure: the same package on grpcio alone, installed from the checkout on a
    # machine without Rust. (The native project would not fail there: maturin fetches a toolchain.)
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = str(venv / "bin" / "python")
    env = without_a_toolchain(venv)
    installed = subprocess.run(
        [python, "-m", "pip", "install", str(ROOT / "clients" / "python" / "pure")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env, check=False,
    )
    said = installed.stdout + installed.stderr
    assert installed.returncode == 0, said
    for builder in ("maturin", "puccinialin", "cargo", "rustc"):
        assert builder not in said.lower(), said
    # A pure-Python wheel, built by hatchling: nothing was compiled.
    (wheel_file,) = venv.glob("lib/python*/site-packages/oncegate-*.dist-info/WHEEL")
    wheel = wheel_file.read_text()
    assert "Tag: py3-none-any" in wheel and "Generator: hatchling" in wheel, wheel
    app = tmp_path / "app"
    app.mkdir()
    (app / "agent.py").write_text(textwrap.dedent(f"""
        import importlib.util

        import oncegate
        from oncegate import Gate, Grant, native

        gate = Gate({gate!r})
        paid = []

        @gate.action("payments.transfer")
        def transfer(amount: int, to: str, *, grant: Grant) -> dict:
            paid.append(grant.provider_key)
            return {{"transfer_id": f"tr-{{len(paid)}}"}}

        with gate.scope(agent_id="billing-agent", run_id="pure-run"):
            first = transfer(5000, "DE89", idempotency_key="invoice-42")
            again = transfer(5000, "DE89", idempotency_key="invoice-42")
        try:
            oncegate.local("data")
            local = "started"
        except ImportError as err:
            local = "ImportError" if "native extension" in str(err) else repr(err)
        print(oncegate.__file__)
        print(importlib.util.find_spec("oncegate._native"), type(gate._open()).__module__, native.enabled())
        print(local, first == again, len(paid), first["transfer_id"])
    """))
    done = subprocess.run(
        [python, "agent.py"], cwd=app, capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    where, transport, result = done.stdout.splitlines()[-3:]
    # The installed copy, not the checkout's source; no native core in it: grpcio carries the calls.
    assert where.startswith(str(venv)) and str(ROOT) not in where, where
    assert transport == "None oncegate.v1.oncegate_pb2_grpc False", done.stdout
    assert result == "ImportError True 1 tr-1", done.stdout


def test_the_npm_tarball_installs_into_a_clean_project_and_guards_an_action(tmp_path: Path, gate: str) -> None:
    tarball = the_one("oncegate-*.tgz")
    project = tmp_path / "project"
    project.mkdir()
    (project / "package.json").write_text(json.dumps({"name": "uses-oncegate", "private": True, "type": "module"}))
    installed = run(["npm", "install", "--no-audit", "--no-fund", str(tarball)], project)
    said = installed.stdout + installed.stderr
    assert "warn" not in said.lower(), said
    package = project / "node_modules" / "oncegate"
    # A copy from the tarball, with its built dist/, not a link to the checkout.
    assert package.is_dir() and not package.is_symlink()
    assert (package / "dist" / "src" / "index.js").is_file()
    (project / "agent.mjs").write_text(textwrap.dedent(f"""
        import {{ GateClient }} from "oncegate";

        const gate = new GateClient({gate!r});
        const paid = [];
        const spec = {{
          agentId: "billing-agent",
          runId: "npm-run",
          action: "payments.transfer",
          params: {{ amount: 5000, to: "DE89" }},
          idempotencyKey: "invoice-42",
        }};
        const pay = async (grant) => {{
          paid.push(grant.providerKey);
          return {{ transferId: `tr-${{paid.length}}` }};
        }};
        const first = await gate.runOnce(spec, pay);
        const again = await gate.runOnce(spec, pay);
        console.log(first.kind, again.kind, JSON.stringify(again.result), paid.length);
        gate.close?.();
    """))
    started = time.monotonic()
    out = run(["node", "agent.mjs"], project, timeout=60).stdout.strip().splitlines()
    assert out[-1] == 'Executed Replayed {"transferId":"tr-1"} 1', (out, time.monotonic() - started)
