"""Where the benchmarks find the repository (configs/, experiments/, the side venvs) whatever folder they sit in."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
