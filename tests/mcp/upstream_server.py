"""A small MCP server with visible side effects, the upstream of the gateway tests.

Every execution of a side-effecting tool appends one JSON line to $EFFECTS_FILE, so a test can
count executions. Started by the gateway as `--upstream-command python upstream_server.py`
(stdio), or with `--http PORT` for Streamable HTTP, or with `--handshake-only` as a stdio server
of the revisions before 2026-07-28. Writes its pid to $PID_FILE (one line per
start) so a test can kill it mid-call.
"""

from __future__ import annotations

import json
import os
import sys
import time
from itertools import count

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, ToolAnnotations

EFFECTS = os.environ["EFFECTS_FILE"]
server = MCPServer("tickets", instructions="A help desk: create tickets, charge cards.")
_reads = count(1)


def _effect(kind: str, **fields: object) -> int:
    """Appends one execution record; returns the execution's number (1-based) in the file."""
    with open(EFFECTS, "a", encoding="utf-8") as f:
        f.write(json.dumps({"kind": kind, **fields}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    with open(EFFECTS, encoding="utf-8") as f:
        return sum(1 for _ in f)


@server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False))
def create_ticket(title: str, priority: int = 1, delay: float = 0.0) -> dict:
    """Opens a help-desk ticket (a side effect: one line in the effects file)."""
    number = _effect("ticket", title=title, priority=priority)
    if delay:
        time.sleep(delay)
    return {"ticket": f"T-{number}", "title": title, "priority": priority}


@server.tool()
def charge_card(amount: int) -> str:
    """Charges a card; the bank declines every amount above 100 (after recording the attempt)."""
    _effect("charge", amount=amount)
    if amount > 100:
        raise ToolError(f"card declined for {amount}")
    return f"charged {amount}"


@server.tool()
def transfer(to: str, amount: int, memo: str = "") -> str:
    """Sends money; the memo is free text that does not change the transfer."""
    number = _effect("transfer", to=to, amount=amount, memo=memo)
    return f"transfer {number}: {amount} to {to}"


@server.tool()
def schedule_payment(amount: int, seconds: float) -> str:
    """Schedules a payment of `amount` in `seconds` (recorded with the values it received)."""
    number = _effect("payment", amount=amount, seconds=seconds)
    return f"payment {number}: {amount} in {seconds} s"


@server.tool()
def reserve_seat(seat: str) -> str:
    """Reserves a seat; an unknown seat is refused as invalid params before anything happens."""
    if not seat.startswith("A"):
        with open(EFFECTS + ".refused", "a", encoding="utf-8") as f:
            f.write(seat + "\n")
        raise MCPError(INVALID_PARAMS, f"no such seat: {seat}")
    _effect("seat", seat=seat)
    return f"reserved {seat}"


@server.tool()
def search_tickets(query: str) -> str:
    """Searches tickets; unannotated, so gated unless the config says `gate = false` (each search
    is recorded, so a test can tell a pass-through from a replay)."""
    number = _effect("search", query=query)
    return f"search {number}: no ticket matches {query!r}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def count_tickets() -> str:
    """Reads the number of executions so far; its own reads are numbered, so each answer differs."""
    try:
        with open(EFFECTS, encoding="utf-8") as f:
            executions = sum(1 for _ in f)
    except FileNotFoundError:
        executions = 0
    return f"read {next(_reads)}: {executions} executions"


@server.resource("tickets://summary", mime_type="text/plain")
def summary() -> str:
    """A fixed summary resource."""
    return "the help desk is open"


@server.prompt()
def triage(ticket: str) -> str:
    """A prompt to triage one ticket."""
    return f"Triage ticket {ticket}: decide its priority."


async def serve_handshake_only() -> None:
    """Stdio, the way a server that predates 2026-07-28 speaks: the `initialize` handshake only
    (`server/discover` and per-request versions are not understood)."""
    low = server._lowlevel_server
    async with stdio_server() as (read, write), low.lifespan(low) as state:
        await serve_loop(low, read, write, lifespan_state=state,
                         init_options=low.create_initialization_options())


if __name__ == "__main__":
    with open(os.environ.get("PID_FILE", os.devnull), "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif sys.argv[1:] == ["--handshake-only"]:
        anyio.run(serve_handshake_only)
    else:
        server.run()
