"""The library behind the benchmark CLIs (compare_methods.py, throughput.py, profile_step.py), one concern a module:
provenance (commit, code hash, machine), protocol (methods, budgets, variants), plans (the table kinds), costs
(in-process cost ratios), farm (training runs with resume), summary (means, speed-ups, selections), report (README
and plot of a methods table), workers and throughput_report (throughput.py's measurements and table)."""
