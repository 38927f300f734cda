"""Secrets kept out of everything stepscope stores or shows.

A script's command line often carries credentials (``--token=hf_…``, ``--api-key K``,
``https://user:pass@host/…``). Capture redacts the script's argv and the command lines of the
processes the sampler watches *before* anything is written, so the record, the samples, the report,
the HTML page, the run index and ``diff`` never see them.

The rule (:func:`redact_argv`):

- a *secret name* is a name (of an option, a variable, a key, an HTTP header) with a word — split
  at ``-``, ``_``, ``.``, case ignored — that is or ends with one of :data:`SECRET_WORDS`
  (``token``, ``password``, ``passwd``, ``pwd``, ``secret``, ``apikey``, ``auth``, ``credential``,
  ``authorization``, ``cookie``…: ``MYTOKEN``, ``hfToken``, ``dbpassword``), or two consecutive
  words of :data:`SECRET_PAIRS` (``api-key``, ``private-key``, ``access-key``, ``secret-key``);
  ``--tokenizer``, ``--author`` and ``--keyframes`` are not secret names;
- the value of an option (``--name=value``, ``--name value``, ``-name value``) with a secret name
  becomes :data:`MASK`; a following word that is itself an option (``--token --verbose``) is left
  alone;
- ``NAME=value`` — a whole argument (Hydra/OmegaConf overrides, environment-style) or inside one
  (``env MYTOKEN=x python …``, a URL's ``?token=x&…``) — with a secret ``NAME``: the value, up to
  the next blank, ``&`` or ``;``, becomes :data:`MASK`;
- ``key: value`` — an HTTP header (``--header "Authorization: Bearer …"``, ``-H "X-Api-Key: …"``,
  ``Cookie: …``) or any ``key: value`` text (``"token: X"``, JSON's ``"token": "X"``) — with a secret
  ``key``: the value, to the end of its line, becomes :data:`MASK`; an argument that is only
  ``key:`` masks the next one;
- an HTTP ``Bearer``/``Basic`` credential (``Bearer eyJ…``) anywhere: the credential becomes
  :data:`MASK`;
- the user and password of a URL (``scheme://user:pass@host``) become :data:`MASK` anywhere in an
  argument;
- well-known token shapes (Hugging Face ``hf_…``, GitHub ``ghp_…``/``github_pat_…``, OpenAI
  ``sk-…``, AWS access key ids ``AKIA…``, Slack ``xox?-…``) are masked wherever they appear.

The rule is documented for users in ``docs/compare.md`` ("Secrets stay out of what is stored").

Opt-out: ``STEPSCOPE_REDACT=0`` in the environment of ``stepscope run`` keeps argv verbatim (for
a private machine where the exact command line matters more).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from stepscope.switches import switch

MASK = "<redacted>"

#: Words of a name (split at ``-``, ``_`` and ``.``) that mark its value as a secret; a word that
#: ends with one does too (``MYTOKEN``, ``hfToken``).
SECRET_WORDS = frozenset({"token", "tokens", "password", "passwd", "pwd", "secret", "secrets", "apikey", "auth",
                          "credential", "credentials", "authorization", "cookie", "cookies"})
#: Consecutive word pairs that do (``--api-key``, ``--private_key``, ``--access-key``, ``--secret-key``);
#: a word that ends with a pair written as one (``MYAPIKEY``, ``awssecretkey``) does too.
SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key")})
_SECRET_ENDINGS = tuple(sorted(SECRET_WORDS | {first + second for first, second in SECRET_PAIRS}))

_OPTION = re.compile(r"^(-{1,2}[A-Za-z0-9][\w.\-]*)(=(.*))?$", re.DOTALL)
_ASSIGN = re.compile(r"^([A-Za-z_+~][\w.\-]*)=(.*)$", re.DOTALL)
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<cred>[^/\s@:]*(?::[^/\s@]*)?)@")
# ``NAME=value`` or ``key: value`` inside a text (``"token": "x"``: the key may be quoted); the
# name must not continue a longer word (``x.token=`` is still found: ``.`` separates words)
_KEY_VALUE = re.compile(r"(?<![\w\-])(?P<name>[A-Za-z_][\w.\-]*)(?P<quote>[\"']?)(?P<sep>\s*:[ \t]*|=)")
_ASSIGN_VALUE_END = re.compile(r"[\s&;]")
_HTTP_CREDENTIAL = re.compile(r"\b(?P<scheme>[Bb]earer|BEARER|[Bb]asic|BASIC)(?P<space>[ \t]+)(?P<credential>[^\s,;\"']+)")
_HTTP_SCHEMES = frozenset({"bearer", "basic"})
_TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|sk-[A-Za-z0-9_\-]{20,}|AKIA[0-9A-Z]{16}|xox[abposr]-[A-Za-z0-9\-]{10,})\b")


def enabled() -> bool:
    """Redaction is on unless ``STEPSCOPE_REDACT`` is ``0``/``false``/``no``/``off`` (``stepscope.switches``)."""
    return switch("STEPSCOPE_REDACT", True)


def is_secret_name(name: str) -> bool:
    """Whether an option, variable, key or header name looks like it holds a secret (the rule in
    the module docstring)."""
    parts = [part for part in re.split(r"[-_.]+", name.lower()) if part]
    return (any(part.endswith(_SECRET_ENDINGS) for part in parts)
            or any(pair in SECRET_PAIRS for pair in zip(parts, parts[1:])))


def _mask_key_values(text: str) -> str:
    """``NAME=value`` and ``key: value`` with a secret name: the value masked (module docstring)."""
    if "=" not in text and ":" not in text:
        return text
    out: list[str] = []
    position = 0
    for match in _KEY_VALUE.finditer(text):
        if match.start() < position or not is_secret_name(match["name"]):
            continue
        start = match.end()
        quote = text[start:start + 1]
        if quote in ('"', "'") and text.find(quote, start + 1) > start:  # a quoted value: inside the quotes
            start, end = start + 1, text.find(quote, start + 1)
        elif match["sep"] == "=":
            found = _ASSIGN_VALUE_END.search(text, start)
            end = found.start() if found else len(text)
        else:  # to the end of the line, or of the quotes that open before the key ('Authorization: …')
            opening = text[match.start() - 1:match.start()]
            closing = text.find(opening, start) if opening in ('"', "'") and not match["quote"] else -1
            line_end = text.find("\n", start)
            end = min(point for point in (closing, line_end, len(text)) if point >= 0)
            while end > start and text[end - 1] in " \t\r":
                end -= 1
        if end > start:
            out += [text[position:start], MASK]
            position = end
    return "".join(out) + text[position:] if out else text


def redact_text(text: str) -> str:
    """``text`` with secret ``NAME=value`` / ``key: value`` values, HTTP ``Bearer``/``Basic``
    credentials, URL credentials and token-shaped words masked."""
    text = _mask_key_values(text)
    text = _HTTP_CREDENTIAL.sub(lambda match: f"{match['scheme']}{match['space']}{MASK}"
                                if match["credential"] != MASK else match[0], text)
    text = _URL_CREDENTIALS.sub(lambda match: f"{match['scheme']}{MASK}@", text)
    return _TOKEN_SHAPES.sub(MASK, text)


def _masks_next(word: str) -> bool:
    """An argument after which the next one is a secret: ``Authorization:``, ``token:``, ``Bearer``."""
    stripped = word.strip()
    if stripped.lower() in _HTTP_SCHEMES:
        return True
    return stripped.endswith(":") and len(stripped) > 1 and is_secret_name(stripped[:-1].strip("\"'"))


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
            if word.strip().lower() in _HTTP_SCHEMES:  # ``Authorization:`` ``Bearer`` ``<credential>``
                out.append(word)
                continue
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
        mask_next = _masks_next(word)
    return tuple(out)
