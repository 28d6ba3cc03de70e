"""Differential-privacy pieces that need nothing from the engine: the mechanisms (clipping, noise, adaptive clip;
config.dp) and privacy accounting."""
