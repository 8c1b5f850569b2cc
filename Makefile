# oncegate: `make run` starts the gate on its embedded store; `make test` runs every test.
# The targets are exactly what CI runs (.ci/run calls `make test`).

CARGO ?= cargo
PYTHON ?= python3
VENV := .venv
BUF := npx --yes @bufbuild/buf@1.75.0

.PHONY: run test deps lint fmt-check clippy lint-proto test-rust test-python bench clean

## Start the gate on 127.0.0.1:50051 with the embedded store in ./oncegate-data.
run:
	$(CARGO) run --release --locked -- serve

## Every test: formatting, lints, the proto lint, Rust unit and integration tests (real Redis
## processes started by the tests), and the Python client's tests against a real gate.
test: deps lint test-rust test-python

## Installs redis-server on a fresh Debian machine when it is missing.
deps:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "redis-server not found: installing it (Debian)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }
	@command -v redis-server >/dev/null

lint: fmt-check clippy lint-proto

fmt-check:
	$(CARGO) fmt --check

clippy:
	$(CARGO) clippy --locked --all-targets -- -D warnings

## buf lint, STANDARD rules (buf comes from the npm registry and runs offline).
lint-proto:
	cd proto && $(BUF) lint

test-rust:
	$(CARGO) test --locked --all-targets

$(VENV)/.installed: clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q './clients/python[test]'
	touch $@

test-python: $(VENV)/.installed
	$(CARGO) build --locked --bin oncegate
	$(VENV)/bin/pip install -q --no-deps --force-reinstall ./clients/python
	ONCEGATE_BIN=$(CURDIR)/target/debug/oncegate $(VENV)/bin/python -m pytest -q clients/python/tests

## The gate against the limit on this machine: release build, its own redis-server on a free
## loopback port, redis-benchmark, then the gate on Redis and on the embedded store; prints one
## table and writes it into BENCHMARKS.md (BENCH_ARGS passes options, e.g. --runs 5).
bench:
	$(CARGO) build --release --locked --bin oncegate
	$(PYTHON) scripts/bench.py $(BENCH_ARGS)

clean:
	$(CARGO) clean
	rm -rf $(VENV) oncegate-data
