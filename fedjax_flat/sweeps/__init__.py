"""Sweeps and reports (layer 8): a config x a grid x seeds as local processes, batched programs or a SLURM
array (sweep.py), and the runs aggregated into Markdown / CSV tables and plots beside published numbers
(report.py).
"""
