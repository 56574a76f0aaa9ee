"""Solver backends behind one `solve` interface (filled by the solver work)."""
