"""The optional C core of capture's step recorder (``stepscope.capture._fastrec``).

Everything else is declared in pyproject.toml. The extension is optional: where it cannot be
built, capture runs on the same state machine in Python (slower hooks, same records). Its source
hash is compiled in, so a checkout whose C source changed since the build falls back to Python
instead of running older rules (``stepscope.capture.recorder``).
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "src/stepscope/capture/_fastrec.c"
SHA = hashlib.sha256(Path(__file__).with_name("src").joinpath("stepscope/capture/_fastrec.c").read_bytes()).hexdigest()[:16]

setup(ext_modules=[Extension("stepscope.capture._fastrec", [SOURCE], optional=True,
                             define_macros=[("STEPSCOPE_SOURCE_SHA", f'"{SHA}"')])])
