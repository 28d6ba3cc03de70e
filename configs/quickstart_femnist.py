r"""FEMNIST quickstart: FedAvg with the Reddi et al. CNN on LEAF's FEMNIST (writers as clients, NIID).

Data: LEAF's JSON files (no download URL; fedjax_flat/data/sources/leaf.py says how to build them with LEAF's
scripts). Point data.data_dir at LEAF's `data/femnist/data` (holding all_data/):
  .venv/bin/python experiments/train.py --config=configs/quickstart_femnist.py --workdir=runs/femnist \
      --config.data.data_dir=/path/to/leaf/data/femnist/data
Quickstart size: 5% of the data (LEAF's niid sampling: whole writers, about 180 of the 3,550), 10 clients per
round, 50 rounds; per-writer 90/10 train/test split (LEAF's by-sample split). IID:
--config.data.split=iid (LEAF's iid resampling within each all_data file). The thesis' FEMNIST setting (Table
A.6): client lr 0.01, batch 20, no weight decay, 1 local epoch, 1,500 rounds, all writers
(--config.data.fraction=1.0 --config.rounds=1500); its centralized accuracy 87.52% (Table 5.1) is the
reference of summary.json's rounds_to_70pct_centralized / rounds_to_90pct_centralized here
(config.centralized.accuracy), or train your own with experiments/centralized.py and pass
--config.centralized.path=<its workdir>. Not a reproduction of a table cell: no published number.
"""

from fedjax_flat.config.default_config import data_section, default_config


def get_config():
  c = default_config()
  c.dataset = 'femnist'
  c.data = data_section(**{'data_dir': '', 'source': 'auto', 'split': 'niid', 'fraction': 0.05,
                             'min_samples': 0, 'train_split': 'sample', 'train_fraction': 0.9, 'seed': 0,
                             'shuffle': True})
  c.model = 'femnist_cnn'
  c.model_kwargs.variant = 'reddi'     # 'fedseq_release': without the ReLUs that release omits
  c.rounds = 50
  c.clients_per_round = 10
  c.client.lr = 0.01
  c.client.batch_size = 20
  c.client.weight_decay = 0.0
  c.client.local_epochs = 1
  c.eval_every = 5
  c.summary_last_k = 5
  c.centralized.accuracy = 0.8752        # thesis Table 5.1, centralized FEMNIST
  return c
