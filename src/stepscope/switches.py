"""On/off switches read from the environment, with one vocabulary for all of stepscope's.

Unset or empty: the switch's default. ``0``, ``false``, ``no`` or ``off`` (any case, surrounding
spaces ignored): off. Any other value: on (``1``, ``true``, ``yes``, ``on``, or a value that only
says "set"). The switches (docs/capture.md, "Environment variables"): ``STEPSCOPE_REDACT``,
``STEPSCOPE_THREAD_ACCOUNT``, ``STEPSCOPE_WAIT_SAMPLER``, ``STEPSCOPE_WORKER_BATCHES`` and
``STEPSCOPE_DDP_HOOK`` (on unless turned off), ``STEPSCOPE_PURE_PYTHON`` (off unless turned on).
"""

from __future__ import annotations

import os

OFF_WORDS = frozenset({"0", "false", "no", "off"})
#: The words that say "on" where a setting takes only on or off (``--set``'s booleans,
#: ``STEPSCOPE_REUSE_MEMORY``): anything else is refused there.
ON_WORDS = frozenset({"1", "true", "yes", "on"})


def switch(name: str, default: bool) -> bool:
    """Whether the environment's switch ``name`` is on (see the module's docstring)."""
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value not in OFF_WORDS
