"""A module that fails on import (benchmarks/drill/hostile.py: a user's method module with a bug in it)."""

raise RuntimeError("this module is broken on purpose (the fault drill)")
