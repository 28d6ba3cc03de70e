"""Test configs: dotted-path overrides (set_fields) and the small synthetic-data run (small_config)."""


def set_fields(config, over):
  """Sets each 'a.b.c' key of `over` on the ConfigDict (in place) and returns it."""
  for key, value in over.items():
    node = config
    *path, last = key.split('.')
    for p in path:
      node = node[p]
    node[last] = value
  return config


def small_config(**over):
  """4 rounds of FedAvg with an MLP on synthetic data, 3 clients a round; `over` as in set_fields."""
  from fedjax_flat.config.default_config import default_config
  c = default_config()
  c.dataset = 'synthetic'
  c.model = 'mlp'
  c.rounds = 4
  c.clients_per_round = 3
  c.client.batch_size = 4
  c.client.lr = 0.1
  c.eval_every = 2
  c.progress_every_s = 1e9
  return set_fields(c, over)
