"""The fault drill's parts (benchmarks/fault_drill.py is the command): `harness` (processes, records, digests, a
silent Hub endpoint), `resume` (kills, corruptions, a full disk, NaN), `runs` (overwrite, non-run folders, branches,
divergence, SIGHUP / second Ctrl-C, DDP), `inputs` (Hub waits, token echo, bad input per CLI), `report` (the table)."""
