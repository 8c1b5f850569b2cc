#!/bin/bash
# The gate's socket writes per grant-complete pair, counted with strace (BENCHMARKS.md, "What was tried"). Starts its own gate on a new embedded store (or on a Redis of its own),
# loopback only, and stops it.
#
#   scripts/bench_writes.sh BINARY [signed|unsigned] [PAIRS] [CONCURRENCY] [CONNECTIONS] [embedded|redis]
#
# Writes counted: write, writev, sendto and sendmsg on sockets (the gate's replies and, on Redis,
# its commands), not on files or the log.
set -euo pipefail
BIN=$1; MODE=${2:-signed}; N=${3:-2000}; C=${4:-8}; K=${5:-8}; STORE=${6:-embedded}
command -v strace >/dev/null || { echo "needs strace" >&2; exit 2; }
D=$(mktemp -d)
GATE=""; REDIS_PORT=""
cleanup() {
  [ -n "$GATE" ] && kill "$GATE" 2>/dev/null && wait "$GATE" 2>/dev/null
  [ -n "$REDIS_PORT" ] && redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1
  rm -rf "$D"
}
trap cleanup EXIT
FLAGS=(--unsigned)
if [ "$MODE" = signed ]; then
  "$BIN" keys generate --out "$D/key.pem" >/dev/null
  FLAGS=(--signing-key "$D/key.pem")
fi
if [ "$STORE" = redis ]; then
  REDIS_PORT=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no --daemonize yes \
    --dir "$D" --logfile "$D/redis.log" >/dev/null
  until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.05; done
  FLAGS+=(--redis-url "redis://127.0.0.1:$REDIS_PORT")
else
  FLAGS+=(--data-dir "$D/data")
fi
"$BIN" serve --listen 127.0.0.1:0 --no-admin-socket "${FLAGS[@]}" >"$D/out" 2>"$D/log" &
GATE=$!
for _ in $(seq 200); do grep -q "listening on" "$D/out" "$D/log" 2>/dev/null && break; sleep 0.05; done
ADDR=$(grep -oh "listening on [0-9.:]*" "$D/out" "$D/log" | head -1 | awk '{print $3}')
LOAD=(bench --target "$ADDR" --scenario grant-complete --concurrency "$C" --connections "$K" --warmup 0)
"$BIN" "${LOAD[@]}" --duration 60 --actions 200 >/dev/null 2>&1
strace -f -qq -y -e trace=write,writev,sendto,sendmsg -e signal=none -o "$D/trace" -p "$GATE" &
TRACER=$!
sleep 1
"$BIN" "${LOAD[@]}" --duration 300 --actions "$N" >"$D/bench" 2>&1
sleep 0.5
kill "$TRACER"; wait "$TRACER" 2>/dev/null || true
WRITES=$(grep -cE "^[0-9]+ +(write|writev|sendto|sendmsg)\([0-9]+<socket:" "$D/trace" || true)
echo "$(basename "$BIN") $MODE $STORE, $C callers on $K connections: $WRITES socket writes for $N pairs, $(python3 -c "print(round($WRITES / $N, 2))") per pair"
