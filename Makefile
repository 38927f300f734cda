# One command each on a fresh machine: `make demo` and `make test` (`make test-fast` skips the slow end-to-end tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned for development and CI; the package itself accepts a range.
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test test-fast typecheck bytecode venv bench clean

# setup.py builds the optional C extensions (the step recorder's core, the trace column reader; a
# checkout whose C source changed since the build runs their Python equivalents until this target reinstalls).
# Nothing is compiled to bytecode at install: the demo and the tests write the bytecode of what they
# import, once (WRITE_BYTECODE below), which is a quarter of the installed modules.
#
# uv installs the packages (the venv in 36 s on 2 cores with uv's cache empty, against 61 s with pip:
# benchmarks/bench_venv.py); pip still chooses the torch wheel, so its configuration (a local wheel
# directory, an index, a constraint) decides which torch build comes, as it did before. Where uv
# cannot be installed or fails, pip installs everything as before.
$(BIN)/stepscope: pyproject.toml setup.py src/stepscope/capture/_fastrec.c src/stepscope/traces/_columns.c \
		src/stepscope/traces/_scan.c
	$(PYTHON) -m venv $(VENV)
	@rm -rf $(VENV)/torch-wheel; \
	if $(BIN)/python -m pip install --quiet --no-compile uv \
	   && $(BIN)/python -m pip download --quiet --no-deps --dest $(VENV)/torch-wheel "$(TORCH_PIN)" \
	   && $(BIN)/uv pip install --quiet --python $(BIN)/python $(VENV)/torch-wheel/torch-*.whl -e ".[dev]"; \
	then echo "installed with uv"; \
	else echo "uv did not install the packages: pip installs them"; \
	  $(BIN)/python -m pip install --quiet --upgrade pip \
	  && $(BIN)/python -m pip install --quiet --no-compile "$(TORCH_PIN)" -e ".[dev]"; \
	fi; status=$$?; rm -rf $(VENV)/torch-wheel; exit $$status
	touch $(BIN)/stepscope

# Run with WRITE_BYTECODE, Python writes the bytecode of each module it imports and has none for,
# even where the caller's environment sets PYTHONDONTWRITEBYTECODE (each process would otherwise
# compile torch's modules again). Compiling every installed module at install instead took 25 s on
# 2 cores (13,100 modules, 42 s of CPU); a whole `make test` writes ~4,800 of them.
WRITE_BYTECODE := PYTHONDONTWRITEBYTECODE=

venv: $(BIN)/stepscope

demo: venv
	$(WRITE_BYTECODE) $(BIN)/stepscope demo

# The tests run on every core (pytest-xdist), then the `serial` ones alone: their verdicts and
# speed-ups need the cores to themselves. Both parts always run; either failing fails the target.
# The parallel part keeps its own cache directory, so a CPU peak measured while the cores are
# shared never reaches the cache the serial part (and the user's runs) read.
# One worker more than the cores: the end-to-end tests wait on their child processes (a start-up, a
# deadline, a signal) ~20 % of the time, which a worker per core leaves idle (2 cores: 466-506 s with
# two workers, 445 s with three; the same tests pass).
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))

# mypy runs beside a collection-only pass of pytest that writes the test modules' assertion-rewritten
# bytecode (pytest writes it only where Python may write bytecode, which PYTHONDONTWRITEBYTECODE
# forbids): each of the test processes then reads them instead of rewriting every assert again
# (collection 6.9 s -> 3.3 s a process; the pass itself takes mypy's idle core).
test: venv bytecode
	@$(WRITE_BYTECODE) $(BIN)/python -m pytest -q --collect-only -p no:xdist -p no:cacheprovider \
		>/dev/null 2>&1 & warm=$$!; \
	$(BIN)/python -m mypy; typed=$$?; wait $$warm; [ $$typed -eq 0 ]
	@status=0; cache=$$(mktemp -d); \
	$(WRITE_BYTECODE) XDG_CACHE_HOME=$$cache $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m "not serial" || status=1; \
	rm -rf "$$cache"; \
	$(WRITE_BYTECODE) $(BIN)/python -m pytest -q -p no:xdist -m serial || status=1; \
	exit $$status

# The checkout's modules, compiled once before the tests: they start hundreds of Python processes that
# import them, and where PYTHONDONTWRITEBYTECODE is set each would compile them again (+0.26-0.34 s of
# CPU a `stepscope run`, +0.10-0.13 s a `stepscope report`: benchmarks/bench_bytecode.py), as an
# installed package never does.
bytecode: venv
	@$(BIN)/python -m compileall -q src

typecheck: venv
	$(BIN)/python -m mypy

test-fast: venv bytecode
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m "not slow and not serial"

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
