"""Launching runs: sweeps (grid, values, local and SLURM launchers), SLURM jobs, processes."""
