# chive: build, test, demo and benchmark from one place.
#   make demo   start a 3-relay network, fetch 1 MiB and 10 MiB through it, stop it
#   make test   cargo tests + the lab's pytest suite (with an end-to-end test)
# Everything installs what it needs first (`make deps`), so these work on a
# fresh Debian machine that has Rust (cargo) installed.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

# rustup installs cargo here; a non-login shell (CI) may not have it on PATH.
export PATH := $(HOME)/.cargo/bin:$(PATH)
# `time STEP` in a recipe prints how long the step took, one greppable line (CI's log then
# shows where `make test` spends its time: docs/testing.md).
export TIMEFORMAT := [time] %1R s wall, %1U s user

CARGO ?= cargo
PYTHON ?= python3
VENV := .venv
VENV_STAMP := $(VENV)/.chive-lab-installed

.PHONY: help deps venv build test demo bench fuzz lint clean

help:
	@echo "make build   cargo build --release and the lab's Python environment (.venv)"
	@echo "make test    build, cargo test --release --workspace, pytest lab/tests (docs/testing.md)"
	@echo "make demo    build, start a 3-relay network, curl 1 MiB and 10 MiB through it, stop it"
	@echo "make bench   cargo bench (crypto per cell, scheduler per cell), the 3-hop 50 MB goodput benchmark and CPU per relayed byte vs tor"
	@echo "make fuzz    every cargo-fuzz target, 10M executions each (nightly; installs cargo-fuzz); table of execs/cov;"
	@echo "            then the lab's scenario files for FUZZ_SCENARIO_SECONDS (atheris)"
	@echo "make lint    cargo fmt --check, clippy -D warnings, Python compile (+ pyflakes if present)"
	@echo "make clean   remove build products (target/, .venv, caches); keeps runs/"

# apt packages (curl, python3-venv, ca-certificates) only when missing.
deps:
	@PYTHON=$(PYTHON) bash lab/scripts/deps.sh
	@$(MAKE) --silent --no-print-directory venv

# The lab, installed editable: source changes need no reinstall; a changed
# pyproject.toml triggers one.
venv: $(VENV_STAMP)

$(VENV_STAMP): lab/pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/pip install --quiet --disable-pip-version-check -e 'lab[test]'
	@touch $@

build: deps
	time $(CARGO) build --release

# The lab's tests in two passes (docs/testing.md): those that start nothing on two workers
# (pytest-xdist), then those marked serial (processes, ports, namespaces, timing) alone.
# check-features first: a crate that `cargo build` and the tests resolve with different features
# would make the binary built here (with the test targets' dev-dependencies) differ from
# `make build`'s, and `make build` after `make test` would compile it again.
# One cargo build makes the binary (what `make build` makes) and every test target together, so
# cargo keeps both cores busy across what were two builds (the binary's last crates link one
# after the other); `cargo test` then only runs them. `--examples` builds the IO floor's
# forwarder (chive-tools' tcpfwd), which a serial lab test runs. Each step is timed (`[time]` lines); the
# pytest passes list their slowest tests.
test: deps
	$(PYTHON) .ci/check-features
	time $(CARGO) build --release --workspace --lib --bins --tests --examples
	time $(CARGO) test --release --workspace
	time $(VENV)/bin/pytest -q -n 2 -m "not serial" --durations=10 lab/tests
	time $(VENV)/bin/pytest -q -m serial --durations=25 lab/tests

demo: build
	bash lab/scripts/demo.sh

# The criterion benches live in crates/benches (chive-benches), so that `make test` does not compile
# criterion; tls_record runs inside relay_cpu.py (the IO floor).
# CPU per relayed byte (docs/performance.md): chive and tor 0.4.9 in one run, with the crypto floor.
RELAY_CPU_BYTES ?= 200000000
bench: build
	$(CARGO) bench -p chive-benches --bench crypto
	$(CARGO) bench -p chive-benches --bench sched
	$(CARGO) bench -p chive-benches --bench forward
	bash lab/scripts/bench_goodput.sh
	$(VENV)/bin/python lab/scripts/relay_cpu.py --bytes $(RELAY_CPU_BYTES) --runs 2 --markdown
	@# Where a middle's CPU goes (groups and a flame graph), where perf can record.
	@if perf record -q -o /dev/null -- true >/dev/null 2>&1; then \
		$(VENV)/bin/python lab/scripts/relay_profile.py --roles middle --out runs/relay-profile; \
	else echo "bench: perf record does not work here (linux-perf, root): relay_profile.py skipped"; fi

# Long fuzzing runs (docs/fuzzing.md). `make test` only replays the checked-in seeds and
# regression inputs (on stable, in chive-fuzz-targets' tests). Each target stops after
# FUZZ_RUNS executions or FUZZ_SECONDS, whichever comes first; FUZZ_SANITIZER=address for an
# AddressSanitizer build (several times slower: the signature-heavy targets then need hours).
FUZZ_RUNS ?= 10000000
FUZZ_SECONDS ?= 3600
FUZZ_SANITIZER ?= none
# Then the lab's scenario files (Python, atheris): a time budget, FUZZ_SCENARIO_SECONDS, since a
# Python target runs tens to hundreds of inputs a second, not the Rust targets' thousands.
FUZZ_SCENARIO_SECONDS ?= 600
fuzz: venv
	FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_SANITIZER=$(FUZZ_SANITIZER) \
		bash fuzz/scripts/fuzz.sh
	@$(VENV)/bin/python -c 'import atheris' 2>/dev/null || \
		$(VENV)/bin/pip install --quiet --disable-pip-version-check 'atheris>=2.3'
	nice -n 19 $(VENV)/bin/python lab/scripts/fuzz_scenarios.py --runs $(FUZZ_RUNS) \
		--seconds $(FUZZ_SCENARIO_SECONDS)

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings
	$(VENV)/bin/python -m compileall -q lab/chive_lab lab/tests
	@if $(VENV)/bin/python -m pyflakes --version >/dev/null 2>&1; then \
		$(VENV)/bin/python -m pyflakes lab/chive_lab lab/tests; \
	elif command -v pyflakes >/dev/null 2>&1; then \
		pyflakes lab/chive_lab lab/tests; \
	else \
		echo "lint: pyflakes not installed, skipped (pip install pyflakes to enable)"; \
	fi

clean:
	$(CARGO) clean
	rm -rf $(VENV) lab/*.egg-info .pytest_cache lab/.pytest_cache
	find lab -name __pycache__ -type d -prune -exec rm -rf {} +
