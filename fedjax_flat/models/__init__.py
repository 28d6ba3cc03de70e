"""Model definitions (Flax modules) and their registry (models/registry.py)."""
