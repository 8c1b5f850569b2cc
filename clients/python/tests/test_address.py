"""A gate's address in every form the clients take (``oncegate.address``), against the real gate:
``host:port`` and ``http://host:port`` through the native core and through grpcio, ``unix:`` and
``unix://`` to its admin socket; ``https://`` opens TLS; any other form is refused with the forms
it wants, the sentence the CLI and the other clients print; ``oncegate call --server`` takes the
``host:port`` a ``LocalServer`` prints."""

from __future__ import annotations

import subprocess
import uuid

import grpc
import pytest

from oncegate import Gate, Resolver, address, aio
from oncegate.channel import Channel
from oncegate.models import ActionRef, ActionState, Scope
from oncegate.v1 import oncegate_pb2 as pb

from conftest import RealGate

FORMS = "give host:port, http://host:port, https://host:port (TLS) or unix:<path> (a gate's admin socket)"


def _absent() -> ActionRef:
    return ActionRef(Scope("address-agent", uuid.uuid4().hex), "k")


@pytest.mark.parametrize("form", ["{}", "http://{}", "HTTP://{}/"])
@pytest.mark.parametrize("options", [(), (("grpc.enable_retries", 0),)], ids=["native", "grpcio"])
def test_host_port_and_http_reach_the_gate(real_gate: RealGate, form: str, options: tuple) -> None:
    with Gate(form.format(real_gate.target), options=options) as gate:
        assert gate.get_action(_absent()).state == ActionState.ABSENT


def test_asyncio_takes_the_same_forms(real_gate: RealGate) -> None:
    async def state(target: str) -> ActionState:
        async with aio.Gate(target) as gate:
            return (await gate.get_action(_absent())).state

    import asyncio

    for target in (real_gate.target, f"http://{real_gate.target}"):
        assert asyncio.run(state(target)) == ActionState.ABSENT


@pytest.mark.parametrize("scheme", ["unix:", "unix://"])
def test_unix_reaches_the_admin_socket(real_gate: RealGate, scheme: str) -> None:
    with Channel(f"{scheme}{real_gate.data_dir / 'admin.sock'}") as channel:
        answer = channel._admin().ListUnresolved(pb.ListUnresolvedRequest(agent_id="address-agent"), timeout=10)
        assert list(answer.actions) == []


@pytest.mark.parametrize("given", ["grpc://127.0.0.1:1", "127.0.0.1", "http://127.0.0.1", "unix:", "h:99999"])
def test_other_forms_are_refused_with_the_forms_wanted(given: str) -> None:
    with pytest.raises(ValueError) as refused:
        Gate(given)
    assert str(refused.value) == f"{given!r} is not a gate address: {FORMS}"


def test_https_is_tls_and_http_refuses_credentials() -> None:
    assert address.parse("https://gate.example:443") == address.Address("tls", "gate.example:443")
    assert address.credentials(address.parse("https://gate.example:443"), None) is not None
    with pytest.raises(ValueError, match=r"^'http://h:1' is plaintext, yet TLS credentials are given: give https://h:1$"):
        Gate("http://h:1", credentials=grpc.ssl_channel_credentials())


def test_grpcio_resolver_targets_pass_through() -> None:
    assert address.parse("dns:///gate.internal:443") == address.Address("resolver", "dns:///gate.internal:443")


def test_oncegate_call_takes_the_target_a_local_server_prints(real_gate: RealGate, tmp_path) -> None:
    import oncegate

    with oncegate.local(tmp_path / "data") as gate:
        done = subprocess.run(
            [str(real_gate.binary), "call", "get", "--agent", "a", "--run", "r", "--key", "k",
             "--server", gate.server.target, "--json"],
            capture_output=True, text=True, timeout=60,
        )
    assert done.returncode == 0, done.stderr
    assert '"ACTION_STATE_ABSENT"' in done.stdout


def test_the_environment_names_the_worker_and_the_operator_address(
    real_gate: RealGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ONCEGATE_TARGET", "ONCEGATE_ADMIN_TARGET", "ONCEGATE_SERVER", "ONCEGATE_GATE"):
        monkeypatch.delenv(name, raising=False)
    assert address.from_environment() == address.from_environment(admin=True) == "127.0.0.1:50051"
    socket = f"unix:{real_gate.data_dir / 'admin.sock'}"
    monkeypatch.setenv("ONCEGATE_TARGET", real_gate.target)
    monkeypatch.setenv("ONCEGATE_ADMIN_TARGET", socket)
    with Gate() as gate:
        assert gate.target == real_gate.target
        assert gate.get_action(_absent()).state == ActionState.ABSENT
    with Resolver() as resolver:
        assert resolver.target == socket


def test_the_earlier_names_are_read_with_a_warning_naming_the_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ONCEGATE_TARGET", "ONCEGATE_ADMIN_TARGET", "ONCEGATE_SERVER", "ONCEGATE_GATE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ONCEGATE_SERVER", "s:1")
    with pytest.warns(FutureWarning, match=r"^ONCEGATE_SERVER is deprecated: set ONCEGATE_TARGET instead$"):
        assert address.from_environment() == "s:1"
    with pytest.warns(FutureWarning, match=r"^ONCEGATE_SERVER is deprecated: set ONCEGATE_ADMIN_TARGET instead$"):
        assert address.from_environment(admin=True) == "s:1"
    monkeypatch.delenv("ONCEGATE_SERVER")
    monkeypatch.setenv("ONCEGATE_GATE", "g:1")
    with pytest.warns(FutureWarning, match=r"^ONCEGATE_GATE is deprecated: set ONCEGATE_TARGET instead$"):
        assert address.from_environment() == "g:1"
    monkeypatch.setenv("ONCEGATE_TARGET", "t:1")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert address.from_environment() == "t:1"
