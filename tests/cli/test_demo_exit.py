"""`stepscope demo` leaves its scenario's objects out of the interpreter's final collections (its
own code: nothing to finalize there); `run` keeps the whole teardown for the user's script."""

from __future__ import annotations

from support import run_python, write_script
from stepscope.record.store import load_record

#: stepscope's console entry, with an exit handler registered first (so it runs last) that says
#: whether the objects were frozen out of the final collections by then.
PROBE = """
    import atexit, gc, sys

    atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))
    from stepscope.cli.entry import console_main

    sys.argv = ["stepscope", *sys.argv[1:]]
    console_main()
"""


def test_a_demo_is_frozen_before_its_teardown_and_a_run_of_a_users_script_is_not(tmp_path):
    write_script(tmp_path, "probe.py", PROBE)
    write_script(tmp_path, "user.py", "print('user script')\n")
    demo = run_python(["probe.py", "demo", "healthy", "--steps", "3", "--no-monitor", "--stacks-hz", "0",
                       "--no-summary", "-o", "demo"], tmp_path)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert demo.stdout.splitlines()[-1] == "frozen at exit: True", demo.stdout
    assert len(load_record(tmp_path / "demo").steps) == 3
    run = run_python(["probe.py", "run", "--no-monitor", "--no-summary", "-o", "run", "user.py"], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == ["user script", "frozen at exit: False"], run.stdout
