"""The fault drill's parts (benchmarks/fault_drill.py is the command): `harness` (processes, records, digests, a
silent Hub endpoint), `resume` (kills, corruptions, a full disk, NaN), `runs` (overwrite, non-run folders, branches
inside and outside the run, divergence, SIGHUP / second Ctrl-C, DDP), `inputs` (Hub waits, secret echo, bad input
and odd output paths per CLI), `hostile` (checkpoints with hostile contents, users' methods that fail), `report`
(the table)."""
