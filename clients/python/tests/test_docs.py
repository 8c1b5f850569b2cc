"""The grpcurl commands of docs/getting-started.md run against the real gate, with grpcurl's part
done here: grpcurl is not packaged where the tests run. The shell expands each command exactly as
written (quotes, the ``$(printf ... | base64)`` substitution) into the argv grpcurl would get; the
``-d`` document is read with protobuf's JSON mapping, as grpcurl reads it, into the named method's
request message and sent to that method. The request must be granted, and the completion must
record the receipt the command encodes. ``<grant.token>`` stands for the token of the grant."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import grpc
from google.protobuf import json_format

from oncegate.v1 import oncegate_pb2

PAGE = Path(__file__).resolve().parents[3] / "docs" / "getting-started.md"
DOC_ADDRESS = "127.0.0.1:50051"
# A shell function named grpcurl that prints the argv it is called with, as JSON.
ARGV = f"grpcurl() {{ {sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"; }}"


def grpcurl_commands() -> list[str]:
    """The page's grpcurl commands, each with its continuation lines."""
    blocks = re.findall(r"```sh\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    block = next(b for b in blocks if b.startswith("grpcurl "))
    commands: list[str] = []
    for line in block.splitlines():
        if line.startswith("grpcurl "):
            commands.append(line)
        else:
            commands[-1] += "\n" + line
    return commands


def call(command: str, target: str):
    """Runs one grpcurl command as grpcurl would: returns the reply message."""
    done = subprocess.run(["sh", "-c", f"{ARGV}\n{command}"], capture_output=True, text=True, check=True)
    argv = json.loads(done.stdout)
    assert argv[0] == "-plaintext" and argv[1] == "-d", argv
    data, address, method = argv[2], argv[3], argv[4]
    assert address == DOC_ADDRESS, "the page talks to the gate of `make run`"
    service_name, method_name = method.rsplit("/", 1)
    service = oncegate_pb2.DESCRIPTOR.services_by_name[service_name.removeprefix("oncegate.v1.")]
    rpc = service.methods_by_name[method_name]
    request = json_format.Parse(data, getattr(oncegate_pb2, rpc.input_type.name)())
    reply_type = getattr(oncegate_pb2, rpc.output_type.name)
    with grpc.insecure_channel(target) as channel:
        stub = channel.unary_unary(
            f"/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=reply_type.FromString,
        )
        return stub(request, timeout=10)


def test_the_grpcurl_commands_grant_and_complete(gate_target: str) -> None:
    request, complete = grpcurl_commands()
    granted = call(request, gate_target)
    assert granted.decision == oncegate_pb2.DECISION_GRANTED, granted
    assert granted.grant.token
    completed = call(complete.replace("<grant.token>", granted.grant.token), gate_target)
    assert completed.completion.receipt == b"tx_123"
    assert completed.completion.fencing == granted.grant.fencing
