"""Epoch boundaries: work that recurs at each epoch start and that run-level averages hide.

A DataLoader without ``persistent_workers`` starts its worker processes anew at every epoch: the
step that starts an epoch waits for the fork, the dataset's pickling, each worker's
``worker_init_fn`` and the first batch the new workers owe. The evidence bundle measures it per
boundary (:class:`~stepscope.analysis.bundle.EpochBoundaries`: the epoch-start steps' data wait
beyond an ordinary step's, or beyond one batch's making where the workers timed their batches and
that is longer: kept workers still make each epoch's first batch, nothing is prefetched across
epochs; priced beyond the ordinary wait, restarts of one worker at 65-81 ms a batch read 31-39 % of
the step where keeping it gained 6-21 %, and outranked the costly samples that gained 57-64 %);
when the epoch starts cost more of the step than every other step's wait for data, this is the
finding, with ``persistent_workers=True`` as its fix. The input and storage families judge the rest
of the wait (their fetch wait leaves the epoch starts' excess out), and a periodic stall that is the
epoch starts is left to this one.
"""

from __future__ import annotations

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

#: Epoch starts above this share of the step are worth keeping the workers (XProf's 3 % "moderate"
#: level for secondary categories, as the input family's worker start-up line).
EPOCH_START_MODERATE = 0.03


def worker_startup(ev: RunEvidence) -> Finding | None:
    """DataLoader workers started anew at every epoch (no ``persistent_workers``) when the epoch starts
    cost more of the step than every other step's wait for data: a cost at each epoch boundary that
    run-level averages hide, measured per boundary (the epoch-start steps' data wait beyond an
    ordinary step's: ``__iter__``'s start-up and the first batch the new workers owe) and fixed by
    keeping the workers."""
    steady, loader, edges = ev.steady, ev.main_loader, ev.boundaries
    if steady is None or loader is None or not common.restarts_workers(ev):
        return None
    # the epoch-start steps' wait beyond an ordinary step's: the start-up and the first batch owed
    startup = common.restart_share(ev)
    ordinary = edges.ordinary_wait_share if edges is not None else common.warm_fetch_wait_share(ev)
    if startup < EPOCH_START_MODERATE or startup < ordinary:
        return None
    boundaries = edges.count if edges is not None else max(1, loader.iterators)
    per_boundary = edges.per_boundary_s if edges is not None else loader.init_ns / max(1, loader.iterators) / 1e9
    evidence = [
        Evidence("epoch_start_share", round(startup, 4), EPOCH_START_MODERATE, "steps", "ratio",
                 "the epoch-start steps' data wait beyond an ordinary step's: worker start-up and the first batch"),
        Evidence("startup_per_epoch_s", round(per_boundary, 4), None, "steps", "s",
                 f"{boundaries} epoch start(s) in the steady steps, {loader.num_workers} workers each"),
        Evidence("ordinary_wait_share", round(ordinary, 4), None, "steps", "ratio",
                 "the data wait of the other steps"),
        Evidence("persistent_workers", False, True, "loader", "flag", f"loader #{loader.loader_id}"),
    ]
    title = (f"DataLoader workers restart every epoch: each epoch start costs ~{common.ms(per_boundary)}, "
             f"{common.pct(startup)} of the step")
    first_batch = edges.first_batch_s if edges is not None else None
    what = ("fork, the dataset's pickling, worker_init_fn; beyond the first batch itself, "
            f"{common.ms(first_batch)} as the workers timed it, which kept workers still make at each epoch start"
            if first_batch is not None else "fork, the dataset's pickling, the first sample")
    summary = (f"Each of the {boundaries} epochs started {loader.num_workers} worker processes anew and waited for "
               f"their first batch (~{common.ms(per_boundary)} each time: {what}), more than all the other steps "
               "waited for batches. Keeping the workers between epochs removes that cost.")
    prescriptions = [Prescription(
        "DataLoader(persistent_workers=True)", f"epoch starts cost {common.pct(startup)} of the step, "
        f"~{common.ms(per_boundary)} at each of {boundaries}", "persistent_workers", False, True,
        expected_gain=round(startup, 4), set={"dataloader.persistent_workers": True},
        expected_range=common.rounded_range(startup, "restarts"))]
    return common.finding("epoch_boundary.worker_startup", "epoch_boundary", title, startup, 0.8, evidence,
                          prescriptions, summary, claims=("data_wait",), boundaries=boundaries)



FAMILY = FamilyEntry(
    "epoch_boundary", (worker_startup,),
    diagnoses="DataLoader workers restarted at every epoch: each epoch start waits for them",
    evidence="The epoch-start steps' data wait beyond an ordinary step's (worker start-up and the first batch) ≥ 3 % of the step and above every other step's wait for data; workers not persistent",
    supersedes=frozenset(), cpu_based=True)
