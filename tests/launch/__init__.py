"""Sweeps and the processes they start."""
