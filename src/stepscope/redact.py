"""Secrets kept out of everything stepscope stores or shows.

A script's command line often carries credentials (``--token=hf_…``, ``--api-key K``,
``https://user:pass@host/…``). Capture redacts the script's argv and the command lines of the
processes the sampler watches *before* anything is written, so the record, the samples, the report,
the HTML page, the run index and ``diff`` never see them.

The rule (:func:`redact_argv`):

- the value of an option (``--name=value``, ``--name value``, ``-name value``) whose name has a
  word (split at ``-``, ``_``, ``.``) in :data:`SECRET_WORDS` (``token``, ``password``, ``passwd``,
  ``pwd``, ``secret``, ``apikey``, ``auth``, ``credential``…) or a pair in :data:`SECRET_PAIRS`
  (``api-key``, ``private-key``, ``access-key``, ``secret-key``) becomes
  :data:`MASK`; a following word that is itself an option (``--token --verbose``) is left alone;
- ``NAME=value`` arguments (Hydra/OmegaConf overrides, environment-style) follow the same rule on
  ``NAME``;
- the user and password of a URL (``scheme://user:pass@host``) become :data:`MASK` anywhere in an
  argument;
- well-known token shapes (Hugging Face ``hf_…``, GitHub ``ghp_…``/``github_pat_…``, OpenAI
  ``sk-…``, AWS access key ids ``AKIA…``, Slack ``xox?-…``) are masked wherever they appear.

Opt-out: ``STEPSCOPE_REDACT=0`` in the environment of ``stepscope run`` keeps argv verbatim (for
a private machine where the exact command line matters more).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

MASK = "<redacted>"

#: Words of an option name (split at ``-``, ``_`` and ``.``) that mark its value as a secret.
SECRET_WORDS = frozenset({"token", "tokens", "password", "passwd", "pwd", "secret", "secrets", "apikey", "auth",
                          "credential", "credentials"})
#: Consecutive word pairs that do (``--api-key``, ``--private_key``, ``--access-key``, ``--secret-key``).
SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key")})

_OPTION = re.compile(r"^(-{1,2}[A-Za-z0-9][\w.\-]*)(=(.*))?$", re.DOTALL)
_ASSIGN = re.compile(r"^([A-Za-z_+~][\w.\-]*)=(.*)$", re.DOTALL)
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<cred>[^/\s@:]*(?::[^/\s@]*)?)@")
_TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|sk-[A-Za-z0-9_\-]{20,}|AKIA[0-9A-Z]{16}|xox[abposr]-[A-Za-z0-9\-]{10,})\b")


def enabled() -> bool:
    """Redaction is on unless ``STEPSCOPE_REDACT`` is ``0``/``false``/``no``/``off``."""
    return os.environ.get("STEPSCOPE_REDACT", "1").strip().lower() not in ("0", "false", "no", "off")


def is_secret_name(name: str) -> bool:
    """Whether an option or variable name looks like it holds a secret."""
    parts = [part for part in re.split(r"[-_.]+", name.lower()) if part]
    return any(part in SECRET_WORDS for part in parts) or any(pair in SECRET_PAIRS for pair in zip(parts, parts[1:]))


def redact_text(text: str) -> str:
    """``text`` with URL credentials and token-shaped words masked."""
    text = _URL_CREDENTIALS.sub(lambda match: f"{match['scheme']}{MASK}@", text)
    return _TOKEN_SHAPES.sub(MASK, text)


def redact_argv(argv: Iterable[str], *, force: bool = False) -> tuple[str, ...]:
    """``argv`` with secret values masked (the rule in the module docstring); unchanged when
    redaction is switched off (unless ``force``)."""
    words = [str(word) for word in argv]
    if not force and not enabled():
        return tuple(words)
    out: list[str] = []
    mask_next = False
    for word in words:
        if mask_next:
            mask_next = False
            if not word.startswith("-"):
                out.append(MASK)
                continue
        option = _OPTION.match(word)
        if option and is_secret_name(option.group(1)):
            if option.group(2) is None:
                out.append(word)
                mask_next = True
            else:
                out.append(f"{option.group(1)}={MASK}")
            continue
        assign = None if option else _ASSIGN.match(word)
        if assign and is_secret_name(assign.group(1)):
            out.append(f"{assign.group(1)}={MASK}")
            continue
        out.append(redact_text(word))
    return tuple(out)
