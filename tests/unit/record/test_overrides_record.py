"""`record.facts.overrides` survives save/load, is absent from older records, and is type-checked."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace

import pytest
from records import make_record

from stepscope.errors import InputError
from stepscope.record.run import CaptureFacts, Override, Overrides
from stepscope.record.store import load_record, save_record

OVERRIDES = Overrides(settings=(Override("dataloader.num_workers", 2, applied=1),
                                Override("dataloader.pin_memory", True, applied=0, skipped=("no loader",))),
                      max_steps=30, stopped_at_max_steps=True)


def test_round_trip(tmp_path):
    record = replace(make_record(), facts=CaptureFacts(trailing_ns=5, overrides=OVERRIDES))
    save_record(record, tmp_path / "record.rank0.json.gz")
    loaded = load_record(tmp_path)
    assert loaded.facts.overrides == OVERRIDES
    assert isinstance(loaded.facts.overrides.settings[1].value, bool)


def test_absent_is_none_and_a_damaged_one_is_refused(tmp_path):
    path = tmp_path / "record.rank0.json.gz"
    save_record(make_record(), path)
    assert load_record(tmp_path).facts.overrides is None
    document = json.loads(gzip.decompress(path.read_bytes()))
    document["facts"]["overrides"] = {"settings": [{"key": "x", "value": "lots"}], "max_steps": None}
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    with pytest.raises(InputError, match="Override.value"):
        load_record(tmp_path)


def test_the_summary_line():
    from stepscope.pipeline.views import overrides_line
    from stepscope.report.render.lines import overridden_line

    assert overridden_line(overrides_line(OVERRIDES)) == ("dataloader.num_workers=2 (1 loader) · dataloader.pin_memory=true "
                                          "(0 loaders) [1 note(s) in the record] · stopped after 30 steps (--max-steps)")
    threads = Overrides(settings=(Override("torch.num_threads", 1, applied=1),), max_steps=50)
    assert overridden_line(overrides_line(threads)) == "torch.num_threads=1 · --max-steps 50 (the script ended first)"
