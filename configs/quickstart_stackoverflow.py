r"""StackOverflow quickstart: FedAvg with the word-LSTM (embed 96, LSTM 670, 10,000 + 4 ids) on TFF's data.

Data: TFF's stackoverflow.sqlite + stackoverflow.word_count (fedjax_flat/data/sources/stackoverflow.py):
  .venv/bin/python experiments/download.py --dataset=stackoverflow --data_dir=/data/so
  .venv/bin/python experiments/train.py --config=configs/quickstart_stackoverflow.py --workdir=runs/so \
      --config.data.data_dir=/data/so
Quickstart size: 1,000 random training clients (<= 1,000 sentences each, 20 words), 10,000 random test
sentences, 10 clients per round, 30 rounds; the first load tokenizes and caches the arrays under
<data_dir>/stackoverflow_cache. Headline accuracy: TFF's, without pad / oov / bos / eos targets. The thesis'
setting: client lr 10^-1/2, batch 16 (Table A.6), 40,000 clients; centralized accuracy 28.50% (Table 5.1, the
rounds-to-X reference here). Not a reproduction of a table cell: no published number.
"""

from fedjax_flat.config.default_config import data_section, default_config


def get_config():
  c = default_config()
  c.dataset = 'stackoverflow'
  c.data = data_section(**{'data_dir': '', 'format': 'auto', 'num_clients': 1000, 'vocab_size': 10000,
                             'sequence_length': 20, 'max_sentences_per_client': 1000, 'test_examples': 10000,
                             'seed': 0, 'shuffle': True})
  c.model = 'word_lstm'
  c.model_kwargs.update({'embed': 96, 'hidden': 670, 'biases': 1, 'readout': 'sequence'})
  c.rounds = 30
  c.clients_per_round = 10
  c.client.lr = 10 ** -0.5
  c.client.batch_size = 16
  c.client.weight_decay = 0.0
  c.client.local_epochs = 1
  c.eval_every = 5
  c.eval_batch_size = 512
  c.summary_last_k = 5
  c.centralized.accuracy = 0.285         # thesis Table 5.1, centralized StackOverflow
  return c
