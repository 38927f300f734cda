"""The phases a step is split into: the record's, and every view's, order (no other import)."""

from __future__ import annotations

#: Phases, in the order they are rendered. They partition each step exactly:
#: ``data_wait + forward + backward + optimizer + communication + other + compile == duration``.
#: (``compile`` — torch.compile compiling inside the step — came last so that older phase indices
#: stay valid.)
PHASES: tuple[str, ...] = ("data_wait", "forward", "backward", "optimizer", "communication", "other", "compile")
