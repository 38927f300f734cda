"""printable(): control characters from scripts and files become visible escapes."""

from __future__ import annotations

import io
import warnings

from rich.console import Console

from stepscope.capture.warn import emit
from stepscope.text import printable, say


def test_controls_are_escaped_and_unicode_kept():
    assert printable("aten::mm") == "aten::mm"
    assert printable("résumé 中文 ✓ → µs") == "résumé 中文 ✓ → µs"
    assert printable("\x1b]0;title\x07") == "\\x1b]0;title\\x07"  # OSC: retitles the terminal
    assert printable("\x1b]52;c;Zm9v\x07") == "\\x1b]52;c;Zm9v\\x07"  # OSC 52: writes the clipboard
    assert printable("a\nb\tc\rd") == "a\\nb\\tc\\rd"
    assert printable("\x9b31m\x7f\x00") == "\\x9b31m\\x7f\\x00"  # C1 CSI, DEL, NUL
    assert printable("evil\u202egnp.py") == "evil\\u202egnp.py"  # bidi override
    assert printable(None) == "" and printable(42) == "42"


def test_rich_prints_the_escaped_text_verbatim():
    out = io.StringIO()
    Console(file=out, force_terminal=False, width=200).print(printable("k\x1b[2Jernel"), highlight=False)
    assert out.getvalue() == "k\\x1b[2Jernel\n"


def test_say_prints_one_escaped_line(capsys):
    say("stepscope: wrote /tmp/run\x1b]0;pwned\x07/report.html")
    out = io.StringIO()
    say("stepscope: error: a\nb", out)
    assert capsys.readouterr().err == "stepscope: wrote /tmp/run\\x1b]0;pwned\\x07/report.html\n"
    assert out.getvalue() == "stepscope: error: a\\nb\n"


def test_capture_warnings_are_escaped():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        emit("could not write /data/\x1b[2Jrun/samples")
    assert [str(item.message) for item in caught] == ["could not write /data/\\x1b[2Jrun/samples"]
