"""The Python side of `make bench`: the `python` scenario and the Python table of `all`.

Starts the gates on the bench's Redis that the Python rows go through (at the gate's defaults, as
a user runs it: unsigned; signing; and one with `--serving-threads 2`, to say what the flag adds),
runs python_cycles.py in the bench's virtualenv once per round, and prints the table. Owns those
gates and the table; the cycles themselves are python_cycles.py's.
"""

import json
import shlex
import statistics

from harness import ROOT, run, signing_key, verdict

CLIENT_US, POWERTOOLS_CLIENT_US = 120, 280
"""The client CPU target per cycle, and Powertools' client CPU per cycle on the machine the target
was set on. Machines here differ by more than 3× in both, so the bench also prints the client's CPU
as a share of Powertools' client's, against the target's share."""
CLIENT_SHARE = CLIENT_US / POWERTOOLS_CLIENT_US

THREADS = ["--serving-threads", "2"]
"""The one flag the `serving-threads` row's gate adds to the defaults."""

ROWS = {
    "powertools": "AWS Lambda Powertools `@idempotent_function`, Redis persistence",
    "seed-authorizer": "the seeds' redis-py authorizer (check-then-set race included)",
    "oncegate-decorator": "oncegate Python decorator (native core), through the gate on Redis "
                          "at its defaults",
    "oncegate-decorator-serving-threads": "the same, the gate with `--serving-threads 2`",
    "oncegate-decorator-signed": "the same, through the gate on Redis signing (`--signing-key`)",
    "oncegate-decorator-grpcio": "the same on grpcio alone (`ONCEGATE_PURE_PYTHON=1`)",
    "oncegate-decorator-in-process": "the same decorator, its gate in process (`oncegate.local` on "
                                     "the same Redis, `--unsigned`; the gate's CPU is the client's)",
    "oncegate-native-stubs": "the native core's stubs alone (RequestToken + Complete)",
    "oncegate-raw-stubs": "the generated grpcio stubs alone (RequestToken + Complete)",
}


def python_gates(start, binary, redis, tmp, opts) -> dict:
    """The gates the Python rows go through, by their python_cycles.py option: `--gate-args`
    added to each (none by default)."""
    extra = shlex.split(opts.gate_args)
    key = signing_key(binary, tmp)
    return {"gate": start(redis_url=redis.url(), extra=extra),
            "signed-gate": start(redis_url=redis.url(), extra=["--signing-key", key, *extra]),
            "threads-gate": start(redis_url=redis.url(), extra=[*THREADS, *extra])}


def python_round(redis, gates, opts) -> dict:
    """python_cycles.py in the bench's virtualenv, once, every row: per row its cycles/s, the
    client's, gates' and Redis's CPU per cycle, and the machine's idle share."""
    redis.cli("FLUSHALL")
    servers = [arg for name, gate in gates.items()
               for arg in (f"--{name}", gate.addr, f"--{name}-pid", str(gate.proc.pid))]
    out = run([opts.python, str(ROOT / "bench" / "python_cycles.py"), "--redis-url", redis.url(),
               *servers, "--redis-pid", str(redis.proc.pid), "--workers", str(opts.python_workers),
               "--seconds", str(opts.python_seconds)],
              timeout=opts.python_seconds * 16 + 300)
    result = json.loads(out.strip().splitlines()[-1])
    print("  Python: " + ", ".join(f"{c} {r['cycles_per_s']:.0f}/s" for c, r in result.items()),
          flush=True)
    return result


def python_table(python, opts) -> list:
    if not python:
        return ["", f"Python comparison: skipped ({opts.python} not found; `make bench` creates it)."]
    med = lambda c, f: statistics.median(run[c][f] for run in python)
    flags = f"`{opts.gate_args}` added to each" if opts.gate_args else "at their defaults"
    lines = ["", f"Python, {opts.python_workers} worker processes, a full cycle around a no-op tool, "
             f"every cycle a new action, same Redis, medians of {len(python)} runs of "
             f"{opts.python_seconds:g} s; the gate servers {flags}:", "",
             "| contender | cycles/s | CPU µs per cycle: client / gate / Redis = all | machine idle |",
             "| --- | ---: | ---: | ---: |"]
    for contender, label in ROWS.items():
        if all(contender in run for run in python):
            parts = [med(contender, f"{name}_cpu_us_per_cycle") if all(
                f"{name}_cpu_us_per_cycle" in run[contender] for run in python) else 0.0
                for name in ("client", "gate", "redis")]
            gate = f"{parts[1]:,.0f}" if contender.startswith("oncegate-") else "—"
            if contender == "oncegate-decorator-in-process":
                gate = "(in client)"
            lines.append(f"| {label} | {med(contender, 'cycles_per_s'):,.0f} | "
                         f"{parts[0]:,.0f} / {gate} / {parts[2]:,.0f} = {sum(parts):,.0f} | "
                         f"{med(contender, 'machine_idle'):.0%} |")
    same_run = lambda f: statistics.median(f(run) for run in python)
    cycles = lambda row: lambda run: run[row]["cycles_per_s"] / run["powertools"]["cycles_per_s"]
    ratio = same_run(cycles("oncegate-decorator"))
    cpu = med("oncegate-decorator", "client_cpu_us_per_cycle")
    share = same_run(lambda run: run["oncegate-decorator"]["client_cpu_us_per_cycle"]
                     / run["powertools"]["client_cpu_us_per_cycle"])
    overhead = same_run(lambda run: run["oncegate-decorator"]["client_cpu_us_per_cycle"]
                        / run["oncegate-native-stubs"]["client_cpu_us_per_cycle"] - 1)
    lines += ["",
              f"- the decorator's cycles/s ÷ Powertools', same run, the gate at its defaults: "
              f"{ratio:.3f} (target ≥ 1.0: {verdict(ratio >= 1.0)}); its client CPU per cycle: "
              f"{cpu:.1f} µs (target ≤ {CLIENT_US}: {verdict(cpu <= CLIENT_US)})",
              f"- its client CPU per cycle ÷ Powertools' client CPU per cycle, same run: "
              f"{share:.3f} (the target's {CLIENT_US} µs was {CLIENT_SHARE:.3f} of Powertools' "
              f"{POWERTOOLS_CLIENT_US} on its machine; by that share: "
              f"{verdict(share <= CLIENT_SHARE)})",
              f"- what the guard adds to the native core's bare stubs, client CPU per cycle: "
              f"{overhead:+.0%} (in {opts.python_workers} processes)"]
    if all("oncegate-decorator-serving-threads" in run for run in python):
        threads = same_run(lambda run: run["oncegate-decorator-serving-threads"]["cycles_per_s"]
                           / run["oncegate-decorator"]["cycles_per_s"])
        lines.append(f"- what `--serving-threads 2` adds (not the default): the decorator's "
                     f"cycles/s ÷ Powertools' {same_run(cycles('oncegate-decorator-serving-threads')):.3f} "
                     f"against {ratio:.3f} at the default; cycles/s with it ÷ without, same run: "
                     f"{threads:.3f}")
    if all("oncegate-decorator-in-process" in run for run in python):
        local = same_run(cycles("oncegate-decorator-in-process"))
        local_cpu = med("oncegate-decorator-in-process", "client_cpu_us_per_cycle")
        lines.append(f"- the decorator with its gate in process, cycles/s ÷ Powertools', same run: "
                     f"{local:.3f} (target ≥ 1.0: {verdict(local >= 1.0)}); its process's CPU per "
                     f"cycle, the gate's included: {local_cpu:.1f} µs")
    return lines
