#!/bin/bash
# What authorization costs on the hot path: the gate with nothing configured, with
# three Cedar policies, with two budgets that apply, and with both, on both stores, interleaved
# rounds of `oncegate bench --scenario grant-complete`. Its own redis-server on a free port.
set -u
# Usage: scripts/bench_authorization.sh  (after `cargo build --release`); prints one line per run:
# round, store, configuration, RequestToken/s, p50 ms, p99 ms, checks ok, outcomes.
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/target/release/oncegate
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
cp "$ROOT/scripts/bench_authorization.cedar" rules.cedar
: > plain.toml
printf '[authorization]\npolicies = ["rules.cedar"]\n' > rules.toml
cat > budgets.toml <<'TOML'
[[budgets]]
name = "eur"
actions = ["bench.*"]
window_seconds = 3600
limit = 1000000000000
sum = "/amount"
group_by = "/currency"
decimals = 0

[[budgets]]
name = "velocity"
actions = ["bench.*"]
per = "agent_action"
window_seconds = 3600
limit = 1000000000000
TOML
cat rules.toml budgets.toml > authz.toml
RPORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
redis-server --port $RPORT --bind 127.0.0.1 --save '' --appendonly no --maxmemory-policy noeviction --daemonize yes --pidfile "$WORK/redis.pid" >/dev/null
sleep 0.5
for round in 1 2 3; do
 for store in embedded redis; do
  for cfg in plain rules budgets authz; do
   rm -rf data; redis-cli -p $RPORT flushall >/dev/null
   if [ $store = redis ]; then S="--redis-url redis://127.0.0.1:$RPORT"; else S="--data-dir data"; fi
   RUST_LOG=warn $BIN serve --listen 127.0.0.1:0 $S --config $cfg.toml > gate.out 2>/dev/null &
   GPID=$!
   for i in $(seq 100); do grep -q listening gate.out && break; sleep 0.1; done
   ADDR=$(sed -n 's/listening on //p' gate.out)
   OUT=$($BIN bench --target $ADDR --scenario grant-complete --duration 4 --warmup 1 --concurrency 32 --json 2>/dev/null)
   echo "$OUT" > out-$round-$store-$cfg.json; echo "$round $store $cfg $(python3 -c 'import json,sys; d=json.load(sys.stdin); l=d["latency_ms"]["request_token"]; print(round(d["throughput"]["request_token_per_s"]), l.get("p50"), l.get("p99"), d["ok"], d["outcomes"].get("request_token"))' < out-$round-$store-$cfg.json 2>/dev/null || echo 'no result (the gate or the bench failed)')"
   kill $GPID; wait $GPID 2>/dev/null
  done
 done
done
kill "$(cat "$WORK/redis.pid")"
