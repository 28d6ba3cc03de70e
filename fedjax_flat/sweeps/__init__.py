"""Sweeps and reports (layer 8): a config x a grid x seeds (grid.py) run as local processes (local.py), batched
programs or a SLURM array (sweep.py, the driver; its files: status.py), and the runs aggregated into Markdown / CSV
tables and plots beside published numbers (report.py).
"""
