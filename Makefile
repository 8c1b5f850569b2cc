# oncegate: `make run` starts the gate on its embedded store; `make test` runs every test.
# The targets are exactly what CI runs (.ci/run calls `make test`).

CARGO ?= cargo
PYTHON ?= python3
VENV := .venv
BENCH_VENV := .venv-bench
BUF := npx --yes @bufbuild/buf@1.75.0
# What ships, and what `make bench` measures, is built with Cargo's `dist` profile (Cargo.toml): the
# wheel's native core too, through maturin's PEP 517 backend. `make dist` builds the wheel with
# WHEEL_PROFILE; `make test` checks the artifacts built with `release` (see test-artifacts).
DIST_WHEEL_ARGS := --config-settings=build-args='--profile dist'
WHEEL_PROFILE ?= dist

.PHONY: run clean-data test deps lint fmt-check clippy lint-proto test-deploy test-deploy-k8s test-rust test-python test-typescript test-mcp test-artifacts dist test-soak soak example-python example-typescript bench bench-postgres-rss clean fuzz

## Start the gate on 127.0.0.1:50051 with the embedded store in ./oncegate-data and the operator
## console on http://127.0.0.1:7480/ (ONCEGATE_CONSOLE_LISTEN moves it). ARGS passes flags
## to `oncegate serve`, e.g. make run ARGS="--config policies.toml --log-format json". The binary
## it builds is target/release/oncegate without the MCP gateway (`oncegate mcp`; `cargo build
## --release --bin oncegate` builds it too), which shortens the first build; the first build says
## so, and cargo shows its progress.
run:
	@test -x target/release/oncegate || echo "make run: first build of the gate: every dependency but the MCP gateway's compiles once (cargo prints each crate as it compiles); later runs rebuild only what changed."
	$(CARGO) build --release --locked --bin oncegate --no-default-features
	@echo "make run: starting the gate on 127.0.0.1:50051, embedded store in ./oncegate-data. On this machine target/release/oncegate admin needs no key (it uses ./oncegate-data/admin.sock). Operator console: http://$${ONCEGATE_CONSOLE_LISTEN-127.0.0.1:7480}/ (log in with the code target/release/oncegate admin console-login prints). Ctrl-C stops the gate."
	ONCEGATE_CONSOLE_LISTEN=$${ONCEGATE_CONSOLE_LISTEN-127.0.0.1:7480} target/release/oncegate serve $(ARGS)

## Start clean: delete the records `make run` keeps in ./oncegate-data (the build stays).
clean-data:
	rm -rf oncegate-data

## Every test: formatting, lints, the proto lint, the Prometheus rules, the Kubernetes manifests,
## Rust unit and integration tests (real Redis processes, Cluster and Sentinel deployments started by
## the tests), the Python and TypeScript clients' tests against a real gate, the MCP gateway's
## tests, and a two-minute soak under a nemesis on the embedded store and on Sentinel.
test: deps lint test-deploy test-deploy-k8s test-rust test-python test-typescript test-mcp test-artifacts test-soak

## Installs redis-server, PostgreSQL's server binaries (the tests start their own servers from
## `pg_config --bindir`), promtool (Debian's prometheus package), and chromium with chromedriver
## (the operator console's browser tests) when they are missing.
deps:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "redis-server not found: installing it (Debian)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }
	@command -v redis-server >/dev/null
	@{ command -v pg_config >/dev/null 2>&1 && test -x "$$(pg_config --bindir)/initdb"; } || { \
	  echo "PostgreSQL (pg_config, initdb) not found: installing Debian's postgresql"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; }
	@test -x "$$(pg_config --bindir)/initdb"
	@command -v promtool >/dev/null 2>&1 || { \
	  echo "promtool not found: installing Debian's prometheus package"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }
	@command -v promtool >/dev/null
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || { \
	  echo "chromium or chromedriver not found: installing Debian's chromium and chromium-driver (the console's browser tests)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver; }
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null

## The alert and recording rules: syntax, then promtool's unit tests on synthetic series.
test-deploy: deps
	promtool check rules deploy/prometheus/rules.yml
	promtool test rules deploy/prometheus/rules_test.yml

lint: fmt-check clippy lint-proto

fmt-check:
	$(CARGO) fmt --check

## The second line checks `make run`'s build (no `mcp` feature): the code only it compiles.
clippy:
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings
	$(CARGO) clippy --locked --bin oncegate --no-default-features -- -D warnings

## buf lint, STANDARD rules (buf comes from the npm registry and runs offline).
lint-proto:
	cd proto && $(BUF) lint

test-rust:
	$(CARGO) test --locked --workspace --all-targets

## The client with its test tools and every framework and orchestrator adapter's extra
## (oncegate.integrations), so the adapters' tests drive the real frameworks, Temporal and Celery;
## reinstalled only when pyproject.toml changes.
$(VENV)/.installed: clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q './clients/python[test,openai-agents,langgraph,pydantic-ai,temporal,celery]'
	touch $@

## The client's whole suite on its native core (oncegate._native, built by pip through maturin into
## this workspace's target/, so a warm run rebuilds nothing), then on grpcio alone
## (ONCEGATE_PURE_PYTHON=1, the fallback for TLS channels and channels with gRPC options): every
## suite that calls a gate, fake or real.
PURE_PYTHON_TESTS := test_native.py test_guard.py test_aio.py test_integration.py test_resolver.py \
  test_settle.py test_operator_receipts.py test_authorization.py test_errors.py test_local.py \
  test_resolver_reopen.py

test-python: $(VENV)/.installed
	$(CARGO) build --locked --bin oncegate
	$(VENV)/bin/pip install -q --no-deps --force-reinstall ./clients/python
	ONCEGATE_BIN=$(CURDIR)/target/debug/oncegate $(VENV)/bin/python -m pytest -q clients/python/tests
	ONCEGATE_PURE_PYTHON=1 ONCEGATE_BIN=$(CURDIR)/target/debug/oncegate $(VENV)/bin/python -m pytest -q \
	  $(addprefix clients/python/tests/,$(PURE_PYTHON_TESTS))
	$(VENV)/bin/python examples/python/agent_payment.py --spawn $(CURDIR)/target/debug/oncegate > /dev/null

## `oncegate mcp` between the Python MCP SDK's real client (stdio and Streamable HTTP) and a real
## upstream MCP server written with the same SDK (tests/mcp), on the in-process gate and on a gRPC
## gate with API keys. Own venv, rebuilt only when tests/mcp/requirements.txt changes.
MCP_VENV := .venv-mcp

$(MCP_VENV)/.installed: tests/mcp/requirements.txt
	$(PYTHON) -m venv $(MCP_VENV)
	$(MCP_VENV)/bin/pip install -q --upgrade pip
	$(MCP_VENV)/bin/pip install -q -r tests/mcp/requirements.txt
	touch $@

## The TypeScript MCP SDK's client (v2) for tests/mcp/test_typescript.py, from its lockfile.
tests/mcp/ts/node_modules/.installed: tests/mcp/ts/package-lock.json
	cd tests/mcp/ts && npm ci --no-audit --no-fund
	touch $@

test-mcp: $(MCP_VENV)/.installed tests/mcp/ts/node_modules/.installed
	$(CARGO) build --locked --bin oncegate
	ONCEGATE_BIN=$(CURDIR)/target/debug/oncegate $(MCP_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/mcp

## The soak (scripts/soak.py): deployments on loopback (embedded store; Sentinel and a 3-master
## Cluster, three gates each at durability level 1; PostgreSQL, a primary and a synchronous standby,
## three gates on the multi-host URL at level 1), clients running the Python guard against a fake
## provider, a seeded nemesis (gates SIGKILLed, Redis nodes and PostgreSQL servers paused,
## failovers, Cluster nodes restarted, clients paused past their lease, ambiguous provider timeouts,
## operator reconciliation), then the checker (scripts/soaklib/checker.py) on the recorded history;
## exits 1 on any violation. `make soak` runs all four for 5 minutes each on the release build
## (SOAK_ARGS passes options, e.g. --duration 1800 --seed 42); histories land in target/soak/.
## `make test-soak` (in `make test`): the checker's unit tests, then two minutes each on the
## embedded store and on Sentinel, there at durability level 2 (both replicas): at level 1 two
## failovers a few seconds apart lose acknowledged writes (found by `make soak`,
## docs/reliability.md), which would fail `make test` at random. `make soak` keeps level 1. Then one
## minute on PostgreSQL at level 1 (its failovers lose nothing: the standby is synchronous), and
## one minute on the embedded store with resolvers in place of the operator (--resolver,
## docs/reliability.md).
SOAK_ARGS ?=

soak: deps $(VENV)/.installed
	$(CARGO) build --release --locked --bin oncegate
	$(VENV)/bin/pip install -q --no-deps --force-reinstall ./clients/python
	$(VENV)/bin/python scripts/soak.py $(SOAK_ARGS)

test-soak: deps $(VENV)/.installed
	$(CARGO) build --locked --bin oncegate
	$(VENV)/bin/pip install -q --no-deps --force-reinstall ./clients/python
	cd scripts && $(CURDIR)/$(VENV)/bin/python -m pytest -q -p no:cacheprovider soaklib
	$(VENV)/bin/python scripts/soak.py --deployments embedded,sentinel --duration 120 \
	  --durability 2 --binary $(CURDIR)/target/debug/oncegate --out $(CURDIR)/target/soak-test
	$(VENV)/bin/python scripts/soak.py --deployments postgres --duration 60 --durability 1 \
	  --binary $(CURDIR)/target/debug/oncegate --out $(CURDIR)/target/soak-test-postgres
	$(VENV)/bin/python scripts/soak.py --deployments embedded --duration 60 --resolver \
	  --binary $(CURDIR)/target/debug/oncegate --out $(CURDIR)/target/soak-test-resolver

## The seeds' scenarios as a story: a Python agent, a fake bank, a real gate.
example-python: $(VENV)/.installed
	$(CARGO) build --locked --bin oncegate
	$(VENV)/bin/pip install -q --no-deps --force-reinstall ./clients/python
	$(VENV)/bin/python examples/python/agent_payment.py --spawn $(CURDIR)/target/debug/oncegate

## The TypeScript client (clients/typescript): `npm ci` from its committed lockfile (stamped, so it
## reruns only when the lockfile changes), then its node:test suites (stub freshness, fingerprint
## vectors, errors, the RPCs and the guard against a real gate), then the Vercel AI SDK example
## (examples/typescript, its own lockfile, linking the client) driven by the SDK's mock model.
TS_CLIENT := clients/typescript
TS_EXAMPLES := examples/typescript

$(TS_CLIENT)/node_modules/.installed: $(TS_CLIENT)/package-lock.json
	cd $(TS_CLIENT) && npm ci --no-audit --no-fund
	touch $@

$(TS_EXAMPLES)/node_modules/.installed: $(TS_EXAMPLES)/package-lock.json $(TS_CLIENT)/node_modules/.installed
	cd $(TS_EXAMPLES) && npm ci --no-audit --no-fund
	touch $@

test-typescript: $(TS_CLIENT)/node_modules/.installed $(TS_EXAMPLES)/node_modules/.installed
	$(CARGO) build --locked --bin oncegate
	cd $(TS_CLIENT) && ONCEGATE_BIN=$(CURDIR)/target/debug/oncegate npm test
	cd $(TS_EXAMPLES) && npm run build && node dist/ai-sdk-tool.js --spawn $(CURDIR)/target/debug/oncegate > /dev/null

## The installable artifacts in ./dist: the Python wheel (pip wheel through maturin: the package and
## its native core, one abi3 wheel for CPython 3.10 and later on this platform, its native core
## built with the `dist` profile) and the TypeScript client's npm tarball (npm pack, with its built
## dist/).
dist: $(VENV)/.installed $(TS_CLIENT)/node_modules/.installed
	rm -rf dist && mkdir -p dist
	$(VENV)/bin/pip wheel -q --no-deps --config-settings=build-args='--profile $(WHEEL_PROFILE)' \
	  --wheel-dir dist ./clients/python
	cd $(TS_CLIENT) && npm pack --silent --pack-destination $(CURDIR)/dist > /dev/null
	@ls dist

## Each artifact installed into a clean virtualenv / npm project outside the checkout, running a
## guarded action against a real gate, and the Python client on grpcio alone (clients/python/pure)
## installed on a PATH without cargo or rustc (tests/artifacts). The wheel is built with the
## `release` profile here (the variable reaches the `dist` prerequisite): the same files as `make
## dist`'s, without a second, link-time-optimized build of the native core in every `make test`.
test-artifacts: WHEEL_PROFILE = release
test-artifacts: dist
	$(CARGO) build --locked --bin oncegate
	ONCEGATE_BIN=$(CURDIR)/target/debug/oncegate ONCEGATE_DIST=$(CURDIR)/dist $(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/artifacts

## The Vercel AI SDK example as a story: a mock model retries a payment tool; the bank pays once.
example-typescript: $(TS_CLIENT)/node_modules/.installed $(TS_EXAMPLES)/node_modules/.installed
	$(CARGO) build --locked --bin oncegate
	cd $(TS_CLIENT) && npm run build
	cd $(TS_EXAMPLES) && npm run build && node dist/ai-sdk-tool.js --spawn $(CURDIR)/target/debug/oncegate

## Every Kubernetes manifest under deploy/, rendered (kubectl kustomize, when kubectl exists) and
## validated offline against the Kubernetes schemas (kubernetes-validate from PyPI, own venv).
DEPLOY_VENV := .venv-deploy

$(DEPLOY_VENV)/.installed:
	$(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/pip install -q 'kubernetes-validate==1.37.0'
	touch $@

test-deploy-k8s: $(DEPLOY_VENV)/.installed
	deploy/validate.sh $(CURDIR)/$(DEPLOY_VENV)/bin/kubernetes-validate

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

## The benchmarks (bench/README.md says what each scenario measures): `make bench` is SCENARIO=all,
## the gate on every store beside the limit, then the Python rows beside Powertools, written into
## BENCHMARKS.md. SCENARIO=stores, python, signing or instructions runs one part and prints it;
## SCENARIO=ab A=<binary> B=<binary> compares two builds. It measures the `dist` profile (what
## ships: fat LTO, one unit per crate; its first build is the longest) and says so; BENCH_ARGS
## passes options to bench/bench.py, e.g. --runs 5. With SCENARIO=all or stores, then the gate on
## PostgreSQL beside its limit: pgbench issuing the store's statements for a grant-complete pair at
## the same concurrency on the same server (bench/postgres.py, its own server on a free port;
## BENCH_PG_ARGS passes its options). `make bench-postgres-rss`: the gate's RSS over 10 minutes.
SCENARIO ?= all
bench: deps $(BENCH_VENV)/.installed
	@case "$(SCENARIO)" in all|instructions) command -v valgrind >/dev/null 2>&1 || { \
	  echo "valgrind not found: installing it (Debian; the bench counts instructions under callgrind)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends valgrind; };; esac
	$(CARGO) build --profile dist --locked --bin oncegate
	$(BENCH_VENV)/bin/pip install -q --no-deps --force-reinstall $(DIST_WHEEL_ARGS) ./clients/python
	$(PYTHON) bench/bench.py $(SCENARIO) --python $(BENCH_VENV)/bin/python \
	  $(if $(A),--a $(A)) $(if $(B),--b $(B)) $(BENCH_ARGS)
	@case "$(SCENARIO)" in all|stores) \
	  $(PYTHON) bench/postgres.py --bin target/dist/oncegate $(BENCH_PG_ARGS);; esac

## The gate on PostgreSQL under grant-complete load for 10 minutes, its RSS sampled every 10 s beside
## the tables' sizes (bench/postgres.py --rss-seconds; BENCH_PG_ARGS passes options).
bench-postgres-rss: deps
	$(CARGO) build --profile dist --locked --bin oncegate
	$(PYTHON) bench/postgres.py --bin target/dist/oncegate --rss-seconds 600 $(BENCH_PG_ARGS)

## The bench's own virtualenv: Powertools and redis-py for the Python comparison.
$(BENCH_VENV)/.installed: bench/requirements.txt clients/python/pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --upgrade pip
	$(BENCH_VENV)/bin/pip install -q $(DIST_WHEEL_ARGS) -r bench/requirements.txt ./clients/python
	touch $@

clean:
	$(CARGO) clean
	rm -rf $(VENV) $(DEPLOY_VENV) $(MCP_VENV) $(BENCH_VENV) oncegate-data
	rm -rf $(TS_CLIENT)/node_modules $(TS_CLIENT)/dist $(TS_EXAMPLES)/node_modules $(TS_EXAMPLES)/dist
