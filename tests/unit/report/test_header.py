"""The summary's header line says how the run ended: its exit status, the signal that stopped it,
or — for a run killed by a signal capture cannot see — that there is no exit status, and why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from records import make_record, report_of
from stepscope.report.render.terminal import header


def _header(**meta) -> str:
    record = make_record(20)
    return header(report_of(replace(record, meta=replace(record.meta, **meta)))).plain


@pytest.mark.parametrize(("meta", "ending"), [
    ({"exit_code": 0}, " · exit 0"),
    ({"exit_code": 1, "exception": "ValueError"}, " · exit 1"),
    ({"exit_code": 143, "interrupted_by": "SIGTERM"}, " · exit 143 (SIGTERM)"),
    ({"exit_code": None}, " · killed: no exit status (SIGKILL?)"),
    ({"exit_code": None, "mode": "api"}, " · 20 steps in 0.00 ns"),  # a library session has no exit
])
def test_the_header_says_how_the_run_ended(meta, ending):
    text = _header(**meta)
    assert text.endswith(ending), text
    assert "None" not in text
