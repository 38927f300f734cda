"""The blind evaluation: random bottleneck factors composed into training scripts, their ground
truth measured by ablation, and stepscope's verdict scored against it (``benchmarks/blind_eval.py``).

Modules, in the order the data flows:

- ``factors``: the bottleneck factors — how each is drawn (its size), the code it plants, and the
  switch that removes it;
- ``generate``: a seed → workloads (a base training loop and 1-3 factors) → a directory holding
  ``train.py`` (the standalone script) and ``launch.py`` (its launcher: a neighbour process beside
  the run while that factor is on);
- ``truth``: runs a workload under plain python, in full and once per factor with that factor
  switched off, and names the factor whose removal gains most;
- ``score``: the mapping table from a finding (family, rule, primary prescription) to the factors
  its change removes, and the scoring of one verdict against the truth; the summary and the
  calibration of confidence.
"""
