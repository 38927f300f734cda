"""The optional C extensions: capture's step recorder (``stepscope.capture._fastrec``), the
column reader of decoded trace events (``stepscope.traces._columns``) and the reader of a batch's
JSON bytes into columns (``stepscope.traces._scan``).

Everything else is declared in pyproject.toml. Both are optional: where they cannot be built,
capture runs on the same state machine in Python (slower hooks, same records) and traces load
through the same conversions in Python (slower, same tables). Each source's hash is compiled in,
so a checkout whose C source changed since the build falls back to Python instead of running
older rules (``stepscope.capture.recorder``, ``stepscope.traces.fastpath``).
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup



def extension(module: str, source: str) -> Extension:
    sha = hashlib.sha256((Path(__file__).parent / source).read_bytes()).hexdigest()[:16]
    return Extension(module, [source], optional=True, define_macros=[("STEPSCOPE_SOURCE_SHA", f'"{sha}"')])


setup(ext_modules=[extension("stepscope.capture._fastrec", "src/stepscope/capture/_fastrec.c"),
                   extension("stepscope.traces._columns", "src/stepscope/traces/_columns.c"),
                   extension("stepscope.traces._scan", "src/stepscope/traces/_scan.c")])
