"""The study's pieces without executing notebooks (tests/notebooks executes them)."""
