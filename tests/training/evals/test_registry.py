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
  return types.SimpleNamespace(config=c, task=None, evaluator=None, style_clusters=None)


def test_a_plain_run_selects_only_the_plugins_every_run_has():
  names = [e.name for e in registry.selected(_stand_in())]
  assert names == ['centralized_reference', 'validation', 'messages']


def test_config_declares_the_plugins_in_their_order():
  t = _stand_in(**{'swa.enabled': True, 'wima.enabled': True, 'personalized.enabled': True, 'eval_clients': True})
  names = [e.name for e in registry.selected(t)]
  assert names == ['centralized_reference', 'clients', 'validation', 'messages', 'swa', 'wima', 'personalized']
  assert all(registry.EVALUATIONS.get(n).periodic is not None for n in ('clients', 'routed'))


def test_reported_model_is_the_last_declared_model_with_test_numbers():
  evs = registry.selected(_stand_in(**{'swa.enabled': True, 'wima.enabled': True}))
  assert registry.reported_model(evs, [{'test_accuracy': 0.5}]) == 'global'
  assert registry.reported_model(evs, [{'swa/test_accuracy': 0.5}]) == 'swa'
  assert registry.reported_model(evs, [{'swa/test_accuracy': 0.5}, {'wima/test_accuracy': 0.4}]) == 'wima'
  # A model evaluated without its plug-in selected is not reported.
  assert registry.reported_model(registry.selected(_stand_in()), [{'swa/test_accuracy': 0.5}]) == 'global'


def test_final_entries_of_swa_and_messages():
  t = _stand_in(**{'swa.enabled': True})
  t.round, t.config.rounds = 3, 3
  t.server_state = {'swa': {'n': np.int32(2)}, 'messages_up': np.float32(7.0), 'messages_vec': np.zeros(2)}
  summary = {}
  swa._final(t, summary, 'swa')
  messages._final(t, summary, 'swa')
  assert summary == {'swa_averages': 2, 'messages': {'messages_up': 7.0}}
  summary = {}
  t.server_state = {'params': np.zeros(2)}          # no counters, no SWA buffer: nothing written
  swa._final(t, summary, 'global')
  messages._final(t, summary, 'global')
  assert summary == {}
