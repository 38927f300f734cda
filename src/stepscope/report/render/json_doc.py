"""``report.json`` and ``--format json``: :meth:`~stepscope.report.model.Report.to_dict` as JSON
(schema in ``docs/report-json.md``). To a path it is written atomically (a temporary file beside
it, then renamed); to a stream, indented text and a newline."""

from __future__ import annotations

import orjson

from stepscope.report.model import Report
from stepscope.report.render.output import Output
from stepscope.safe_write import atomic_write, json_bytes

OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def document(report: Report) -> bytes:
    """The report as indented JSON bytes."""
    return json_bytes(report.to_dict(), OPTIONS)


def render(report: Report, out: Output) -> list[str]:
    payload = document(report)
    if out.path is not None:
        atomic_write(out.path, payload)
    if out.stream is not None:
        out.stream.write(payload.decode() + "\n")
    return []
