r"""Shakespeare quickstart: FedAvg with the char-LSTM (embed 8, 2 x LSTM 100, 90 ids) on LEAF's Shakespeare.

Data: LEAF's JSON files (fedjax_flat/data/sources/leaf.py: built with LEAF's scripts; no download URL). Point
data.data_dir at LEAF's `data/shakespeare/data` (holding all_data/):
  .venv/bin/python experiments/train.py --config=configs/quickstart_shakespeare.py --workdir=runs/shakespeare \
      --config.data.data_dir=/path/to/leaf/data/shakespeare/data
Clients are speaking roles (NIID; --config.data.split=iid for LEAF's iid resampling). Each example is 80
characters and the model predicts the next 80 (shift by one); accuracy over non-pad targets
(text_tasks.NextToken). The LEAF / FedSeq-release protocol of one next character per window:
--config.data.target=next --config.model_kwargs.readout=last.
Quickstart size: 5% of the data, users with more than 100 windows, 10 clients per round, 30 rounds. The
thesis' setting (Table A.6): client lr 1, batch 100, 250 rounds; centralized accuracy 52.00% (Table 5.1, the
rounds-to-X reference here). Not a reproduction of a table cell: no published number.
"""

from fedjax_flat.config.default_config import data_section, default_config


def get_config():
  c = default_config()
  c.dataset = 'shakespeare'
  c.data = data_section(**{'data_dir': '', 'source': 'auto', 'split': 'niid', 'fraction': 0.05,
                             'min_samples': 100, 'train_split': 'sample', 'train_fraction': 0.9, 'seed': 0,
                             'target': 'sequence', 'shuffle': True})
  c.model = 'char_lstm'
  c.model_kwargs.update({'embed': 8, 'hidden': 100, 'num_layers': 2, 'biases': 2, 'readout': 'sequence'})
  c.rounds = 30
  c.clients_per_round = 10
  c.client.lr = 1.0
  c.client.batch_size = 100
  c.client.weight_decay = 0.0
  c.client.local_epochs = 1
  c.eval_every = 5
  c.eval_batch_size = 512
  c.summary_last_k = 5
  c.centralized.accuracy = 0.52          # thesis Table 5.1, centralized Shakespeare
  return c
