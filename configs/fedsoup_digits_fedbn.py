r"""FedBN (Li et al. 2021) on the cross-silo feature-shift digits: FedAvg with the normalization layers kept local.

A baseline of the FedSoup comparison (paper Table 1 row "FedBN"), in the setting of
configs/fedsoup_digits_fedavg.py, on `digits_cnn` with GroupNorm after each conv (model_kwargs.gn_groups=4):
the GN scale/bias never leave the client; a client's personalized model is the global model with its own
norm params (core/personalized.with_local_norm). For a like-for-like comparison run the other methods on the
same network: --config.model_kwargs.gn_groups=4 (benchmarks/fedsoup_compare.py --gn_groups=4).

Command:
  .venv/bin/python experiments/train.py --config=configs/fedsoup_digits_fedbn.py --workdir=runs/fs_fedbn

Paper Table 1 row (real data; ResNet-18 with BatchNorm, Adam; mean over folds x seeds), for reference only:
                 Pathology (Camelyon17, 5 clients)       Retina (4 institutions)
                 Local Acc  Local AUC  Glob Acc  Glob AUC   Local Acc  Local AUC  Glob Acc  Glob AUC
  FedBN          82.32      90.07      65.16     71.61      89.70      95.49      75.11     82.70
"""
import importlib


def get_config():
  c = importlib.import_module('configs.fedsoup_digits_fedavg').get_config()
  c.algorithm = 'fedbn'
  c.model_kwargs.gn_groups = 4
  return c
