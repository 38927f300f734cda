"""What the report's view-model may hold besides its own types, for the two tests that hold it to
that: ``tests/unit/test_layers.py`` reads the view modules' field annotations, and
``tests/unit/report/test_view_purity.py`` renders real reports with the library-only fields made
unreadable. A plain module (``tests`` is on ``pythonpath``) so both read one list.
"""

from __future__ import annotations

#: The view modules: the types a renderer reads are defined here.
VIEWS = ("stepscope.report.model", "stepscope.report.run_view", "stepscope.report.command_views",
         "stepscope.report.diff_view")

#: The outside types the view-model passes on as they are, and why. Every other name a renderer
#: takes from the views, and every type a view's field holds, is a view's own.
PASSED_THROUGH = {
    "Finding": "the diagnosis's findings: their to_dict is report.json's schema (docs/report-json.md)",
    "OperatorRow": "a trace's operator table, printed column by column: thousands of plain rows in a large trace",
    "KernelRow": "a trace's kernel table, printed column by column: thousands of plain rows in a large trace",
    "DeviceSummary": "a trace's GPU metrics of one device: a row of plain numbers",
    "DeviceMemory": "a device's memory peak and its curve (long series a copy would only double)",
    "AllocatingOperator": "a row of the top allocating operators: a name and two counts",
}
#: Of those, the plain records: no method or property but the dataclass's own and ``to_dict``, so a
#: renderer reading one computes nothing. The findings keep the diagnosis's ``impact_measured`` and
#: ``from_dict``, the schema's own.
PLAIN_RECORDS = frozenset(PASSED_THROUGH) - {"Finding"}

#: Fields of the views kept for library users (``report.evidence`` feeds ``run --verify``, the run
#: index and ``diff``): no renderer reads them; report.json has what it needs of them as plain data.
LIBRARY_ONLY = frozenset({"Report.evidence", "Report.diagnosis", "Report.meta", "RankReport.evidence",
                          "RankReport.diagnosis", "TraceViews.analysis"})
