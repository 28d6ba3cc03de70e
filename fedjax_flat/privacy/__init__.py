"""Differential-privacy pieces that need nothing from the engine: privacy accounting."""
