# oncegate: `make run` starts the gate on its embedded store; `make test` runs every test.
# The targets are exactly what CI runs (.ci/run calls `make test`).

CARGO ?= cargo
PYTHON ?= python3
VENV := .venv
BUF := npx --yes @bufbuild/buf@1.75.0

.PHONY: run test deps lint fmt-check clippy lint-proto test-rust test-python bench clean fuzz

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

## Fuzz each target (fuzz/fuzz_targets, seeds in fuzz/seeds) for FUZZ_SECONDS with cargo-fuzz. Stable
## Rust with RUSTC_BOOTSTRAP=1; cargo-fuzz is installed from crates.io when missing. Property tests
## over the same code run in `make test` (tests/integration/properties.rs).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := params request credentials
fuzz:
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	@for target in $(FUZZ_TARGETS); do \
	  echo "fuzzing $$target for $(FUZZ_SECONDS) s"; \
	  mkdir -p fuzz/corpus/$$target; \
	  RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run $$target fuzz/corpus/$$target fuzz/seeds/$$target \
	    -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

clean:
	$(CARGO) clean
	rm -rf $(VENV) oncegate-data
