# One command each on a fresh machine: `make demo` and `make test` (`make test-fast` skips the slow end-to-end tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned for development and CI; the package itself accepts a range.
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test test-fast typecheck venv bench clean

$(BIN)/stepscope: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_PIN)" -e ".[dev]"
	touch $(BIN)/stepscope

venv: $(BIN)/stepscope

demo: venv
	$(BIN)/stepscope demo

test: venv typecheck
	$(BIN)/python -m pytest -q

typecheck: venv
	$(BIN)/python -m mypy

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow"

bench: venv
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) stepscope-runs

# Headless Chromium for the HTML report's browser tests (they skip, saying why, without it).
.PHONY: browser
test: browser
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium could not be installed: the HTML report's browser tests will be skipped"
