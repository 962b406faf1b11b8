"""The statistics of ``squall compare``: is a candidate better, worse or the same as a baseline?

Pure functions of numbers (numpy and scipy.stats only; no files, Docker or CLI):

* :mod:`squall.compare.stats`: paired samples of one measure (run i of the baseline ran beside run
  i of the candidate) to a ratio, its confidence interval and a verdict;
* :mod:`squall.compare.sequential`: after each pair, whether the comparison is decided, for
  ``--max-runs`` to stop early without raising the false-alarm rate;
* :mod:`squall.compare.noise`: a noise model fitted to repeated runs measured on this host, and
  comparisons simulated from it (the tests and ``benchmarks/compare_power.py`` judge the method
  with them). The measured runs are ``noise_model.json`` beside this file.

docs/compare-statistics.md explains the method and the figures.
"""
