"""Capture: the only code that runs inside the user's training process.

Nothing here may raise into user code: failures become one :class:`~stepscope.errors.CaptureWarning`
and a note in the record.
"""
