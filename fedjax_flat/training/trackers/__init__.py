"""The tracking back ends of training/tracking.py, one module per service (each imports its package at module level:
only the one a run asks for is loaded)."""
