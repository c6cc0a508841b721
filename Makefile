# offlab: `make demo` and `make test` install whatever is missing, then run.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
# The venv's interpreter must be one every user can run, so that read-only commands (results,
# compare, report, mtu calc, doctor --root) work for non-root users: Debian's python3, never a
# pyenv build under root's home (which others cannot even traverse).
PYTHON ?= /usr/bin/python3
# pytest workers for `make test` (tests/conftest.py groups them by module; 0 = one process). Four on
# this 2-CPU machine kind: fewer leave it idle while tests wait on guests, hosts and timeouts (two: a
# quarter of the time, pytest 851 s vs 598 s with three; three: 10 % idle, four: 3 %, pytest 531 s;
# benchmarks/suite_cpu, README).
TEST_JOBS ?= 4
export PATH := $(HOME)/.cargo/bin:$(PATH)

PYTEST := $(VENV)/bin/python -m pytest -q -p no:cacheprovider
ENGINE_TEST := CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=line-tables-only cargo test -q --manifest-path engine/Cargo.toml
# Tests start this checkout's offlab as `python -m offlab` hundreds of times; with PYTHONDONTWRITEBYTECODE
# set (as in this machine's shell) each start compiled every module again (one `measure`: 1.6 vs 1.1 CPU-s
# by /usr/bin/time): compiled once here. So are pytest's rewritten test modules, which every worker
# otherwise rewrote for itself at collection (6.6 vs 2.8 CPU-s a worker; scripts/pytest-rewrite-cache).
COMPILE := $(PY) -m compileall -q -j 0 offlab tests >/dev/null && $(PY) scripts/pytest-rewrite-cache

.PHONY: demo test test-fast install deps guest clean test-durations bundle

install: deps $(VENV)/.installed guest

# The guest image (Debian cloud kernel + busybox initramfs, docs/vm.md): built once, cached by the
# hash of its inputs, so this is a cache check when nothing changed.
guest: $(VENV)/.installed
	@$(VENV)/bin/offlab vm image >/dev/null

deps:
	@scripts/install-deps

$(VENV)/.installed: pyproject.toml $(shell find offlab engine/src -type f -not -name '*.pyc' 2>/dev/null) engine/Cargo.toml
	@if [ -e $(PY) ] && [ "$$(readlink -f $(PY))" != "$$(readlink -f $(PYTHON))" ]; then \
	  echo "offlab: rebuilding $(VENV) with $(PYTHON) (its interpreter was $$(readlink -f $(PY)))"; rm -rf $(VENV); fi
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# uv resolves, downloads and installs in parallel: a fresh venv in about half pip's time
	@# (benchmarks/install_speed). pyproject's build requirements go in too, at its versions: `make bundle`
	@# and the fleet tests build offlab's wheel with --no-build-isolation, and the setuptools 66 a
	@# bookworm venv starts with cannot read this pyproject.
	@test -x $(VENV)/bin/uv || $(PY) -m pip install -q 'uv>=0.5,<1'
	@$(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode --reinstall-package offlab \
	  'setuptools>=77' 'setuptools-rust>=1.9' wheel '.[test,fleet]'
	@chmod -R a+rX $(VENV)
	@scripts/check-traversable $(VENV)/bin/offlab
	@touch $@

demo: install
	$(VENV)/bin/offlab demo

test: install
	cargo clippy -q --release --all-targets --manifest-path engine/Cargo.toml -- -D warnings -D clippy::undocumented_unsafe_blocks
	@# not incremental, line tables only: a fresh clone's test build in 3 s, not 6
	$(ENGINE_TEST) --no-run
	@$(COMPILE)
	@# the engine's tests (5 s, mostly waiting on their peers' timeouts) run beside pytest's; their output
	@# follows pytest's, and either failing fails make test
	@log=$$(mktemp); $(ENGINE_TEST) >$$log 2>&1 & e=$$!; \
	  $(PYTEST) -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --durations=30 tests; p=$$?; \
	  wait $$e; c=$$?; echo "cargo test (the engine's tests, run beside pytest): exit $$c"; \
	  if [ $$c -ne 0 ]; then cat $$log; fi; rm -f $$log; [ $$p -eq 0 ] && [ $$c -eq 0 ]

# The inner loop: the tests recorded under a second that share no module's lab or guest (tests/conftest.py).
test-fast: install
	@$(COMPILE)
	$(PYTEST) -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --fast tests

# The offline bundle `offlab fleet run` copies to each host (docs/remote.md): offlab's wheel (with the
# offlab-engine binary, built by setuptools-rust), every dependency's wheel, for this interpreter and
# architecture, and uv's, which installs them there (`uv pip install --no-index --find-links`).
BUNDLE ?= dist/offlab-bundle.tar
BUNDLE_UV := 'uv>=0.5,<1'
bundle: $(BUNDLE)
$(BUNDLE): $(VENV)/.installed
	@rm -rf dist/offlab-bundle && mkdir -p dist
	@$(PY) -m pip wheel -q --no-build-isolation . $(BUNDLE_UV) -w dist/offlab-bundle
	@tar -cf $@.tmp -C dist/offlab-bundle . && mv $@.tmp $@
	@echo "offlab: bundle $@ ($$(ls dist/offlab-bundle | wc -l) wheels)"

# After a `make test`: its per-module and per-test durations become the order a fresh clone's first run
# starts from and what `make test-fast` takes.
test-durations:
	cp $(VENV)/test-durations.json tests/durations.json

clean:
	rm -rf $(VENV) build *.egg-info engine/target
