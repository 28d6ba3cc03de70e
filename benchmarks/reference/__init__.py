"""Checks against reference implementations and released splits / published numbers."""
