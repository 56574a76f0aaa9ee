"""Integer-programming formulations of optimal scheduling (filled by the solver work)."""
