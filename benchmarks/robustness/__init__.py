"""Hardening trials of the binaries and the cost of the integrity checks."""
