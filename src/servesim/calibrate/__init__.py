"""``servesim calibrate``: fit a deployment's timing to the user's own measurements.

:mod:`~servesim.calibrate.measurements` reads benchmark results (CSV, vLLM bench serve,
AIPerf / GenAI-Perf exports), :mod:`~servesim.calibrate.fit` fits the corrections by
replaying each point, :mod:`~servesim.calibrate.run` ties them to a compiled config and
writes the calibration file (:mod:`servesim.timing.calibration`).
"""
