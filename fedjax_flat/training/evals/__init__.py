"""Evaluation plug-ins of a run: each module declares one evaluation (what it reports, when it applies, which of
the algorithm's eval models it is about) and registers it; the trainer runs the ones a run's config and
algorithm select, at every evaluation round (`periodic`) or at the end (`final`), and knows none by name."""
