"""``stepscope diff --format json``: the :class:`~stepscope.report.diff_view.DiffView`'s document
(schema in ``docs/compare.md``), indented, on the output's stream."""

from __future__ import annotations

import orjson

from stepscope.report.diff_view import DiffView
from stepscope.report.render.output import Output


def render(view: DiffView, out: Output) -> list[str]:
    text = orjson.dumps(view.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n"
    if out.stream is not None:
        out.stream.write(text)
    return []
