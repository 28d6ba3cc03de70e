"""WiMA (algorithms/wrappers/wima.py): its window-averaged model 'wima' (the algorithm declares it reported,
over SWA's, once evaluated); nothing beyond its records."""
from fedjax_flat.training.evals.registry import Evaluation, register

register(Evaluation('wima', order=50, applies=lambda p: bool(p.config.wima.enabled), models=('wima',)))
