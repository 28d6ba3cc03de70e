"""The evaluation plug-ins (training/evals/): selected by the config, the reported model, their summary entries."""
import types

import numpy as np

from fedjax_flat.config.default_config import default_config
from fedjax_flat.training.evals import messages, registry, swa


def _stand_in(**over):
  c = default_config()
  for k, v in over.items():
    node = c
    *head, last = k.split('.')
    for h in head:
      node = node[h]
    node[last] = v
  t = types.SimpleNamespace(config=c, task=None, evaluator=None, style_clusters=None, data=None,
                            algorithm=types.SimpleNamespace(counters=None, chain=None, needs=frozenset()))
  t.plan = t        # one stand-in for the run plan (what `applies` reads) and the trainer (what `final` reads)
  return t


def test_a_plain_run_selects_only_the_plugins_every_run_has():
  names = [e.name for e in registry.selected(_stand_in())]
  assert names == ['centralized_reference', 'validation']


def test_config_declares_the_plugins_in_their_order():
  t = _stand_in(**{'swa.enabled': True, 'wima.enabled': True, 'personalized.enabled': True, 'eval_clients': True})
  names = [e.name for e in registry.selected(t)]
  assert names == ['centralized_reference', 'clients', 'validation', 'swa', 'wima', 'personalized']
  assert all(registry.EVALUATIONS.get(n).periodic is not None for n in ('clients', 'routed'))


def test_reported_model_is_the_first_declared_model_with_test_numbers():
  models = ('wima', 'swa')                      # an algorithm wrapped by SWA and WiMA declares these
  assert registry.reported_model(models, [{'test_accuracy': 0.5}]) == 'global'
  assert registry.reported_model(models, [{'swa/test_accuracy': 0.5}]) == 'swa'
  assert registry.reported_model(models, [{'swa/test_accuracy': 0.5}, {'wima/test_accuracy': 0.4}]) == 'wima'
  # A model evaluated that the algorithm does not declare reported is not reported.
  assert registry.reported_model((), [{'swa/test_accuracy': 0.5}]) == 'global'


def test_final_entries_of_swa_and_messages():
  t = _stand_in(**{'swa.enabled': True})
  t.round, t.config.rounds = 3, 3
  t.server_state = {'swa': {'n': np.int32(2)}, 'messages_up': np.float32(7.0)}
  t.algorithm = types.SimpleNamespace(counters=lambda s: {'messages_up': s['messages_up']}, chain=None,
                                        needs=frozenset())
  summary = {}
  swa._final(t, summary, 'swa')
  messages._final(t, summary, 'swa')
  assert summary == {'swa_averages': 2, 'messages': {'messages_up': 7.0}}
  summary = {}
  t.server_state = {'params': np.zeros(2)}          # no SWA buffer: nothing written
  swa._final(t, summary, 'global')
  assert summary == {}
  # an algorithm without counters: no plug-in
  t.algorithm = types.SimpleNamespace(counters=None, chain=None, needs=frozenset())
  assert 'messages' not in [e.name for e in registry.selected(t)]


def test_what_the_run_did_is_in_summary_json_and_summary_md(tmp_path):
  # LADD's clusters (client -> cluster, sizes, silhouettes, purity against the planted styles), FedVC's virtual
  # clients and an SWA model never averaged: fields of summary.json and lines of summary.md
  from fedjax_flat.grouping.style_clusters import StyleClustering
  from fedjax_flat.training import writers
  from fedjax_flat.training.evals import style_clusters, virtual_clients
  t = _stand_in(**{'swa.enabled': True, 'fedvc.virtual_size': 4})
  t.style_clusters = StyleClustering(2, np.array([0, 0, 1, 1, 1]), np.zeros((2, 3)), {2: 0.61, 3: 0.42}, 0.0)
  t.data = types.SimpleNamespace(client_style=np.array([1, 1, 0, 0, 1]), virtual_of=np.array([0, 0, 0, 1, 2, 2]))
  t.round, t.config.rounds = 3, 3
  t.server_state = {'swa': {'n': np.int32(0)}}
  assert {'style_clusters', 'virtual_clients', 'swa'} <= {e.name for e in registry.selected(t)}
  summary = {'rounds_completed': 3, 'models': {}}
  for plugin in (style_clusters, virtual_clients, swa):
    plugin._final(t, summary, 'global')
  assert summary['style_clusters'] == {'k': 2, 'client_cluster': [0, 0, 1, 1, 1], 'sizes': [2, 3],
                                       'silhouette': {'2': 0.61, '3': 0.42}, 'planted_purity': 0.8}
  assert summary['virtual_clients'] == {'virtual_size': 4, 'virtual_clients': 6, 'real_clients': 3,
                                        'per_real_client': [3, 1, 2]}
  assert summary['swa_averages'] == 0
  writers.write_summary(str(tmp_path), summary)
  md = (tmp_path / 'summary.md').read_text()
  assert '## What the run did' in md
  assert 'k = 2 clusters of sizes [2, 3]; purity against the 2 planted styles 0.800' in md
  assert 'cut into 6 virtual clients of 4 examples' in md and 'SWA never averaged a model in 3 rounds' in md


def test_a_never_averaged_swa_model_is_not_reported():
  from fedjax_flat.training import writers
  t = _stand_in(**{'swa.enabled': True, 'summary_last_k': 1})
  t.round, t.config.rounds = 3, 3
  t.server_state = {'swa': {'n': np.int32(0)}}
  rec = [{'round': 3, 'test_accuracy': 0.6267, 'test_loss': 1.0, 'swa/test_accuracy': 0.5543, 'swa/test_loss': 2.0}]
  summary = writers.summarize(rec, 1, {'reported_model': 'swa'})
  assert summary['final_test_accuracy'] == 0.5543
  swa._final(t, summary, 'swa')
  assert summary['reported_model'] == 'global' and summary['final_test_accuracy'] == 0.6267
  assert summary['mean_last_1_test_accuracy'] == 0.6267 and 'never averaged' in summary['reported_model_reason']
  t.server_state = {'swa': {'n': np.int32(2)}}     # averaged: SWA stays the result
  summary = writers.summarize(rec, 1, {'reported_model': 'swa'})
  swa._final(t, summary, 'swa')
  assert summary['reported_model'] == 'swa' and summary['final_test_accuracy'] == 0.5543
