#!/usr/bin/env python3
"""The gate's own instructions per grant-complete pair, signed and unsigned, on a redis-server of
its own (BENCHMARKS.md, "What was tried"): the gate runs under
`valgrind --tool=callgrind` (every thread counted, the signing thread included), is warmed up by
`oncegate bench --actions WARMUP`, its counters are zeroed, `--actions N` pairs are run at 32
callers and the counters dumped. Instructions repeat where seconds do not; valgrind hides the
CPU's SHA extensions and aws-lc's ADX/BMI2 code paths, so SHA-256 and the signature weigh more
here than natively. Prints the total per pair and the functions whose own instructions (callees
not included) differ most between the modes, per pair, and leaves the callgrind files for
`callgrind_annotate --inclusive=yes`.

    scripts/bench_gate_instructions.py target/release/oncegate --actions 2000 --out /tmp/gate-cg"""
import argparse, os, re, subprocess, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as B

# Frames callgrind_annotate charges a whole thread to (thread and program entry points): left out
# of the listing, which is about the functions that do the work.
ROOTS = re.compile(r"start_thread|clone\.S|thread_start|call_once\{\{vtable\.shim\}\}|"
                   r"__rust_begin_short_backtrace|libc_start|below main|lang_start|block_on|"
                   r"enter_runtime|^\?\?\?:main$|oncegate::main|^\?\?\?:0x")


def functions(path, inclusive):
    """function → instructions, from callgrind_annotate."""
    out = subprocess.run(["callgrind_annotate", f"--inclusive={inclusive}", "--threshold=100",
                          path], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)$", line)
        if m:
            name = re.sub(r"\s*\[.*\]$", "", m.group(2))
            found[name] = found.get(name, 0) + int(m.group(1).replace(",", ""))
    return found


def dumped(path, seconds=30):
    """`path` once callgrind has finished writing it (its `totals:` line is the last it writes)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if os.path.exists(path) and re.search(r"^totals: ", Path(path).read_text(), re.M):
            return path
        time.sleep(0.1)
    raise RuntimeError(f"callgrind wrote no complete dump to {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("binary")
    p.add_argument("--actions", type=int, default=2000, help="pairs counted per mode")
    p.add_argument("--warmup", type=int, default=300, help="pairs run before the count")
    p.add_argument("--out", default=None, help="where the callgrind files go (a temporary "
                                               "directory when not given)")
    p.add_argument("--top", type=int, default=25, help="functions listed")
    o = p.parse_args()
    out_dir = Path(o.out or tempfile.mkdtemp(prefix="gate-cg-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = str(Path(o.binary).resolve())
    with tempfile.TemporaryDirectory(prefix="gate-cg-") as tmp:
        redis = B.Redis(tmp)
        key = os.path.join(tmp, "key.pem")
        B.run([binary, "keys", "generate", "--out", key])
        files = {}
        try:
            for mode in ["unsigned", "signed"]:
                # A wrapper, so that bench.Gate starts the gate under callgrind (exec: same pid).
                wrapper = Path(tmp) / f"{mode}.sh"
                out = out_dir / f"{mode}.callgrind"
                for stale in out_dir.glob(f"{mode}.callgrind*"):  # an earlier run's dumps
                    stale.unlink()
                wrapper.write_text(f"#!/bin/sh\nexec valgrind --tool=callgrind "
                                   f"--callgrind-out-file={out} {binary} \"$@\"\n")
                wrapper.chmod(0o755)
                B.BIN = wrapper
                extra = ["--unsigned"] if mode == "unsigned" else ["--signing-key", key]
                gate = B.Gate(redis_url=redis.url(), extra=["--no-admin-socket", *extra])
                try:
                    def load(n):
                        B.run([binary, "bench", "--target", gate.addr, "--scenario",
                               "grant-complete", "--json", "--concurrency", "32", "--duration",
                               "600", "--warmup", "0", "--actions", str(n)], timeout=700)
                    load(o.warmup)
                    B.run(["callgrind_control", "-z", str(gate.proc.pid)])
                    load(o.actions)
                    B.run(["callgrind_control", "-d", str(gate.proc.pid)])
                    # callgrind_control -d writes <out>.1; the final dump at exit, <out>.
                    files[mode] = dumped(f"{out}.1")
                finally:
                    gate.stop()
        finally:
            redis.stop()
    totals = {m: functions(f, "no")["PROGRAM TOTALS"] / o.actions for m, f in files.items()}
    print(f"instructions per pair: unsigned {totals['unsigned']:,.0f}, signed "
          f"{totals['signed']:,.0f} ({totals['signed'] / totals['unsigned']:.2f}x)")
    unsigned, signed = functions(files["unsigned"], "no"), functions(files["signed"], "no")
    print("a function's own instructions per pair: signed - unsigned, unsigned, signed, function:")
    names = sorted((n for n in set(unsigned) | set(signed) if not ROOTS.search(n)),
                   key=lambda n: -(signed.get(n, 0) - unsigned.get(n, 0)))
    for name in names[:o.top]:
        u, s = unsigned.get(name, 0) / o.actions, signed.get(name, 0) / o.actions
        print(f"{s - u:>10,.0f} {u:>10,.0f} {s:>10,.0f}  {name[:140]}")
    print(f"callgrind files: {out_dir}")


main()
