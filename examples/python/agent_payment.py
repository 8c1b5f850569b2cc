#!/usr/bin/env python3
"""A billing agent pays invoices through a fake bank, guarded by oncegate.

It walks the failure stories that make agents pay twice or lie about what they did:

1. A timeout and a retry: the tool ran, the orchestrator lost its result, the model calls it again.
   The gate replays the receipt; the bank is not called twice.
2. A memo rewritten by the model on a retry. The gate's policy says the memo is not a key field,
   so the retry replays the original transfer.
3. An amount changed under the same idempotency key. The gate stops it with
   IDEMPOTENCY_KEY_REUSED, naming ``/amount``; the agent escalates instead of minting a new key.
4. An ambiguous failure: the bank charged, but its reply was lost. The guard does not release the
   token (the outcome is unknown), the gate refuses to run the transfer again, and a reconciler
   asks the bank by provider key and completes the action with the bank's answer.
5. The bank checks every grant itself: each transfer comes with the gate's signed grant statement,
   which the bank verifies offline with the gate's public keys (JWKS); a transfer whose params
   differ from the granted ones, or whose fencing number is below one the bank has seen, is refused.
6. A worker dies mid-transfer and nobody is around: a resolver, watching the gate, asks the bank
   by provider key within seconds of the lease's end and settles the action with the bank's
   answer; the agent's retry replays it. No person involved.

Run it against a gate started with ``examples/python/policy.toml``::

    oncegate serve --config examples/python/policy.toml &
    python examples/python/agent_payment.py --target 127.0.0.1:50051

or let it start (and stop) the gate itself::

    python examples/python/agent_payment.py --spawn target/debug/oncegate
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import urllib.request

import oncegate
from oncegate import (
    ActionRef,
    Completed,
    Failed,
    Gate,
    Grant,
    InProgressError,
    KeyReusedError,
    OutcomeUnknownError,
    PublicKeys,
    Resolver,
    Scope,
    StatementError,
    TransportError,
    Unresolved,
    verify_grant,
)

HERE = Path(__file__).resolve().parent
TRANSFER_KEY_FIELDS = ["/amount", "/currency", "/to"]
"""The key fields ``policy.toml`` gives ``payments.transfer``; used here only to show fingerprints."""
IBAN = "DE89370400440532013000"


@dataclass(frozen=True)
class Transfer:
    """A transfer the bank executed."""

    transfer_id: str
    amount: int
    currency: str
    to: str
    memo: str


class BankRefused(Exception):
    """The bank refused a transfer whose grant does not hold."""


class FakeBank:
    """A payment provider that honours idempotency keys (a repeated key returns the first transfer)
    and, given the gate's public keys, moves money only on a grant statement that verifies for these
    params, with a fencing number no lower than the highest it has seen for that action."""

    def __init__(self, keys: PublicKeys | None = None) -> None:
        self.ledger: list[Transfer] = []
        self._by_key: dict[str, Transfer] = {}
        self._fencing: dict[str, int] = {}
        self.keys = keys
        self.lose_next_reply = False
        """Execute the next transfer, then fail as if its reply had been lost on the network."""

    def check_grant(self, statement: str, params: dict[str, Any]) -> int:
        """Verifies the grant statement for ``params``; returns its fencing number."""
        if self.keys is None:
            return 0
        try:
            grant = verify_grant(self.keys, statement, params, audience="fake-bank", key_fields=TRANSFER_KEY_FIELDS)
        except StatementError as err:
            raise BankRefused(f"grant refused ({err.kind})") from None
        if grant.fencing < self._fencing.get(grant.provider_key, 0):
            raise BankRefused(f"stale fencing {grant.fencing}")
        self._fencing[grant.provider_key] = grant.fencing
        return grant.fencing

    def transfer(
        self, *, amount: int, currency: str, to: str, memo: str, idempotency_key: str, statement: str = ""
    ) -> Transfer:
        """Moves money once per idempotency key, on a grant that verifies."""
        self.check_grant(statement, {"amount": amount, "currency": currency, "to": to, "memo": memo})
        if idempotency_key in self._by_key:
            return self._by_key[idempotency_key]
        executed = Transfer(f"tr-{len(self.ledger) + 1:04d}", amount, currency, to, memo)
        self.ledger.append(executed)
        self._by_key[idempotency_key] = executed
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise TimeoutError("the bank did not answer within 30 s")
        return executed

    def lookup(self, idempotency_key: str) -> Transfer | None:
        """The transfer made under ``idempotency_key``, if any: what a reconciler asks."""
        return self._by_key.get(idempotency_key)


def say(who: str, text: str) -> None:
    """Prints one line of the story."""
    print(f"   {who:<6} {text}")


def money(cents: int, currency: str) -> str:
    return f"{cents / 100:.2f} {currency}"


def make_transfer_tool(gate: Gate, bank: FakeBank) -> Callable[..., dict[str, Any]]:
    """The agent's side-effecting tool, wrapped by the gate's decorator."""

    @gate.action("payments.transfer", key_fields_hint=TRANSFER_KEY_FIELDS, max_wait=1.0)
    def transfer(amount: int, currency: str, to: str, memo: str, *, grant: Grant) -> dict[str, Any]:
        say("gate", f"granted a token (fencing {grant.fencing}); the tool calls the bank")
        done = bank.transfer(
            amount=amount, currency=currency, to=to, memo=memo, idempotency_key=grant.provider_key,
            statement=grant.statement,
        )
        say("bank", f"paid {money(amount, currency)} to {to[:8]}… as {done.transfer_id}")
        return asdict(done)

    return transfer


class Agent:
    """A scripted stand-in for the model: it emits tool calls, as an LLM would, and reads results."""

    def __init__(self, gate: Gate, bank: FakeBank) -> None:
        self.gate = gate
        self.bank = bank
        self.transfer = make_transfer_tool(gate, bank)

    def call(self, **arguments: Any) -> dict[str, Any]:
        """One tool call from the model, as the orchestrator runs it."""
        shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items() if k not in {"to"})
        say("model", f"transfer({shown})")
        paid_before = len(self.bank.ledger)
        receipt = self.transfer(**arguments)
        if len(self.bank.ledger) == paid_before:
            say(
                "gate",
                f"ALREADY_COMPLETED: replayed receipt {receipt['transfer_id']}; the bank was not called",
            )
        return receipt

    def timeout_and_retry(self) -> None:
        print("\n1. A timeout and a retry that replays instead of paying twice")
        invoice = {"amount": 4200, "currency": "EUR", "to": IBAN, "memo": "Invoice 41"}
        self.call(**invoice, idempotency_key="invoice-41")
        say("agent", "the orchestrator's 30 s tool timeout fired: the model never saw the result")
        self.call(**invoice, idempotency_key="invoice-41")
        say("bank", f"{self.count(41)} transfer for invoice 41")

    def memo_rewritten(self) -> None:
        print("\n2. A memo rewritten by the model replays through the policy's key fields")
        first = {"amount": 5000, "currency": "EUR", "to": IBAN, "memo": "Invoice 42"}
        retry = {**first, "memo": "Invoice #42 - office chairs (corrected)"}
        self.call(**first, idempotency_key="invoice-42")
        say("agent", "the model retries and rewrites the memo on the way")
        self.call(**retry, idempotency_key="invoice-42")
        same = oncegate.fingerprint(
            "payments.transfer", first, key_fields=TRANSFER_KEY_FIELDS
        ) == oncegate.fingerprint("payments.transfer", retry, key_fields=TRANSFER_KEY_FIELDS)
        say("gate", f"memo is not a key field of payments.transfer: same fingerprint = {same}")
        say("bank", f"{self.count(42)} transfer for invoice 42")

    def amount_changed(self) -> None:
        print("\n3. An amount changed under the same idempotency key stops loudly")
        say("agent", "the model re-reads the PDF and now believes invoice 42 is 51.00 EUR")
        try:
            self.call(amount=5100, currency="EUR", to=IBAN, memo="Invoice 42", idempotency_key="invoice-42")
        except KeyReusedError as err:
            say("gate", f"{err.reason}: differing key fields {', '.join(err.differing_fields)}")
            say("agent", "stops and asks a human; it never mints a new key to force the payment through")
        say("bank", f"{self.count(42)} transfer for invoice 42, still 50.00 EUR")

    def ambiguous_failure(self) -> None:
        print("\n4. An ambiguous failure is left for reconciliation, not retried blindly")
        invoice = {"amount": 990, "currency": "EUR", "to": IBAN, "memo": "Invoice 43"}
        self.bank.lose_next_reply = True
        try:
            self.call(**invoice, idempotency_key="invoice-43")
        except OutcomeUnknownError as unknown:
            say("tool", f"{type(unknown.__cause__).__name__}: {unknown.__cause__}")
            state = self.state(unknown.action)
            say("gate", f"OutcomeUnknownError: token kept, not released; action is {state}")
            try:
                self.call(**invoice, idempotency_key="invoice-43")
            except InProgressError:
                say("gate", "IDEMPOTENCY_IN_PROGRESS: it will not run again while the outcome is unknown")
            self.reconcile(unknown)
        else:
            raise RuntimeError("the lost bank reply should have surfaced as OutcomeUnknownError")
        self.call(**invoice, idempotency_key="invoice-43")
        say("bank", f"{self.count(43)} transfer for invoice 43")

    def forged_grant(self) -> None:
        print("\n5. The bank checks every grant itself, offline")
        if self.bank.keys is None:
            say("bank", "no gate keys given (--jwks-url): not checking grants")
            return
        granted: list[Grant] = []

        @self.gate.action("payments.transfer", key_fields_hint=TRANSFER_KEY_FIELDS)
        def capture(amount: int, currency: str, to: str, memo: str, *, grant: Grant) -> dict[str, Any]:
            granted.append(grant)
            raise oncegate.DefiniteFailureError("only capturing the grant")

        try:
            capture(amount=1000, currency="EUR", to=IBAN, memo="Invoice 44", idempotency_key="invoice-44")
        except oncegate.DefiniteFailureError:
            pass
        say("agent", "a compromised tool reuses the grant for invoice 44 (10.00 EUR) to send 900.00 EUR")
        try:
            self.bank.transfer(amount=90000, currency="EUR", to=IBAN, memo="Invoice 44", idempotency_key=granted[0].provider_key,
                               statement=granted[0].statement)
        except BankRefused as err:
            say("bank", f"{err}: the params are not the granted ones; nothing paid")
        else:
            raise RuntimeError("the bank should have refused a grant for other params")
        invoice = {"amount": 1000, "currency": "EUR", "to": IBAN, "memo": "Invoice 44"}
        try:
            capture(**invoice, idempotency_key="invoice-44")
        except oncegate.DefiniteFailureError:
            pass
        newer, older = granted[1], granted[0]
        say("agent", f"a retry of invoice 44 was granted again (fencing {newer.fencing}); the bank sees it")
        self.bank.check_grant(newer.statement, invoice)
        say("agent", f"the first attempt's worker wakes up late and sends its grant (fencing {older.fencing})")
        try:
            self.bank.transfer(**invoice, idempotency_key=older.provider_key, statement=older.statement)
        except BankRefused as err:
            say("bank", f"{err}: a newer grant for this action exists; nothing paid")
        else:
            raise RuntimeError("the bank should have refused a stale fencing number")

    def resolved_at_source(self, resolver_target: str | None) -> None:
        print("\n6. A resolver settles an unknown outcome at the source, without a person")
        if resolver_target is None:
            say("recon", "no resolver given (--resolver-target): not shown")
            return
        resolver = Resolver(resolver_target, agent_id="billing-agent", lookup_timeout=5.0)

        @resolver.lookup("payments.transfer")
        def ask_the_bank(unresolved: Unresolved) -> Completed | Failed:
            found = self.bank.lookup(unresolved.provider_key)
            say("recon", f"asked the bank about {unresolved.provider_key[:12]}…: {found and found.transfer_id}")
            return Completed(asdict(found)) if found else Failed()

        watching = threading.Thread(target=resolver.run, daemon=True)
        watching.start()
        invoice = {"amount": 1250, "currency": "EUR", "to": IBAN, "memo": "Invoice 45"}
        scope = oncegate.current_scope()
        assert scope is not None
        # A short lease, so the resolver's turn comes soon. Not shorter: the statement's `exp` is
        # the lease end in whole seconds rounded down, so a 2-s lease leaves the bank at least 1 s
        # to check it (a 1-s lease granted at x.95 s expired at x+1, before the bank saw it).
        granted = self.gate.request_token(
            "payments.transfer", invoice, idempotency_key="invoice-45", lease_ttl=2.0,
            agent_id=scope.agent_id, run_id=scope.run_id,
        )
        assert granted.grant is not None
        self.bank.lose_next_reply = True
        try:
            self.bank.transfer(**invoice, idempotency_key=granted.grant.provider_key, statement=granted.grant.statement)
        except TimeoutError:
            say("tool", "the worker's process was killed while the bank answered: no Complete, no Release")
        deadline = time.monotonic() + 30
        while self.state(granted.action) != "COMPLETED":
            if time.monotonic() > deadline:
                raise RuntimeError("the resolver did not settle invoice 45")
            time.sleep(0.2)
        say("gate", "the lease ended; the resolver settled it with the bank's answer: COMPLETED")
        resolver.stop()
        watching.join(10)
        resolver.close()
        self.call(**invoice, idempotency_key="invoice-45")
        say("bank", f"{self.count(45)} transfer for invoice 45")

    def reconcile(self, unknown: OutcomeUnknownError) -> None:
        """What a reconciler does with an unknown outcome: ask the provider, then settle the gate."""
        found = self.bank.lookup(unknown.provider_key)
        if found is None:
            self.gate.release(unknown.action, unknown.token)
            say("recon", "the bank has no such transfer: released the token, a retry may run it")
            return
        self.gate.complete(unknown.action, unknown.token, json.dumps(asdict(found)).encode())
        say(
            "recon",
            f"the bank knows provider key {unknown.provider_key[:12]}… as {found.transfer_id}: completed",
        )
        say("gate", f"action is {self.state(unknown.action)}")

    def state(self, action: ActionRef) -> str:
        return self.gate.get_action(action).state.name

    def count(self, invoice: int) -> int:
        """How many transfers the bank made for an invoice."""
        return sum(1 for t in self.bank.ledger if re.search(rf"\b{invoice}\b", t.memo))


def wait_until_serving(gate: Gate, timeout: float) -> None:
    """Waits until the gate answers a call (any answer but a transport failure)."""
    probe = ActionRef(Scope("probe", "probe"), "probe")
    deadline = time.monotonic() + timeout
    while True:
        try:
            gate.get_action(probe)
            return
        except TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        except oncegate.OncegateError:
            return


def free_addresses(count: int) -> list[str]:
    """``count`` distinct free loopback addresses (each socket is held until all are picked, so
    the kernel cannot hand the same port out twice)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{sock.getsockname()[1]}" for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@contextmanager
def spawned_gate(binary: Path, policy: Path) -> Iterator[tuple[str, str, str]]:
    """Starts ``binary serve`` on a free loopback port with ``policy`` (signing with a key it
    generates); yields its target, the URL of its public keys, and its admin socket (where the
    resolver connects as the gate's local operator)."""
    target, metrics = free_addresses(2)
    with tempfile.TemporaryDirectory(prefix="oncegate-example-") as data_dir:
        process = subprocess.Popen(
            [str(binary), "serve", "--listen", target, "--data-dir", data_dir, "--config", str(policy),
             "--metrics-listen", metrics],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            yield target, f"http://{metrics}/.well-known/jwks.json", f"unix:{data_dir}/admin.sock"
        finally:
            process.terminate()
            process.wait(timeout=10)


def run_story(target: str, jwks_url: str | None, resolver_target: str | None = None) -> int:
    """Runs the scenes against the gate at ``target``; the bank checks grants with the keys at
    ``jwks_url``; the resolver of scene 6 connects to ``resolver_target`` (a resolver principal's
    target, or the gate's admin socket)."""
    with Gate(target) as gate:
        wait_until_serving(gate, timeout=30)
        keys = None
        if jwks_url:
            keys = PublicKeys.from_jwks(urllib.request.urlopen(jwks_url, timeout=10).read().decode())
        bank = FakeBank(keys)
        agent = Agent(gate, bank)
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        print("A billing agent pays invoices through a fake bank, guarded by oncegate")
        print(f"(gate {target}, agent billing-agent, workflow run {run_id})")
        with gate.scope(agent_id="billing-agent", run_id=run_id):
            agent.timeout_and_retry()
            agent.memo_rewritten()
            agent.amount_changed()
            agent.ambiguous_failure()
            agent.forged_grant()
            agent.resolved_at_source(resolver_target)
    total = sum(t.amount for t in bank.ledger)
    count = len(bank.ledger)
    print(f"\nThe bank's ledger: {count} transfers, {money(total, 'EUR')} in all; nothing paid twice.")
    for t in bank.ledger:
        print(f"   {t.transfer_id}  {money(t.amount, t.currency):>10}  {t.memo}")
    return 0 if len(bank.ledger) == (4 if resolver_target else 3) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--target",
        default=os.environ.get("ONCEGATE_TARGET", "127.0.0.1:50051"),
        help="the address of a running gate (default: ONCEGATE_TARGET, else 127.0.0.1:50051)",
    )
    where.add_argument("--spawn", type=Path, metavar="BIN", help="start this oncegate binary for the run")
    parser.add_argument("--policy", type=Path, default=HERE / "policy.toml", help="policy file for --spawn")
    parser.add_argument("--jwks-url", help="the gate's public keys (its --metrics-listen /.well-known/jwks.json)")
    parser.add_argument(
        "--resolver-target",
        default=os.environ.get("ONCEGATE_ADMIN_TARGET"),
        help="where scene 6's resolver connects: unix:<data-dir>/admin.sock on the gate's machine "
        "(default: ONCEGATE_ADMIN_TARGET; --spawn uses its own); without it, scene 6 is skipped",
    )
    args = parser.parse_args(argv)
    if args.spawn is not None:
        with spawned_gate(args.spawn, args.policy) as (target, jwks_url, admin):
            return run_story(target, jwks_url, admin)
    return run_story(args.target, args.jwks_url, args.resolver_target)


if __name__ == "__main__":
    sys.exit(main())
