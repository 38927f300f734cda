"""One pipeline from inputs to the report: load once (:mod:`~stepscope.pipeline.inputs`), diagnose
(:func:`~stepscope.pipeline.diagnose.diagnose`, the only caller of the engine), render through the
one table of outputs (:mod:`stepscope.report.render`). ``stepscope run``, ``report``, ``analyze``,
``diff``, the library API and the Lightning / Hugging Face integrations all go through it."""
