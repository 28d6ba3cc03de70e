"""WiMA (algorithms/wrappers/wima.py): its window-averaged model 'wima' is the reported one once evaluated
(over SWA's when both run)."""
from fedjax_flat.training.evals.registry import Evaluation, register

register(Evaluation('wima', order=50, applies=lambda t: bool(t.config.wima.enabled), reports='wima',
                    models=('wima',)))
