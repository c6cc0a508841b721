# offlab: `make demo` and `make test` install whatever is missing, then run.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: demo test install deps clean

install: deps $(VENV)/.installed

deps:
	@scripts/install-deps

$(VENV)/.installed: pyproject.toml $(shell find offlab engine/src -type f -not -name '*.pyc' 2>/dev/null) engine/Cargo.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip setuptools setuptools-rust wheel
	@$(PY) -m pip install -q '.[test]'
	@touch $@

demo: install
	$(VENV)/bin/offlab demo

test: install
	cargo test -q --manifest-path engine/Cargo.toml
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider tests

clean:
	rm -rf $(VENV) build *.egg-info engine/target
