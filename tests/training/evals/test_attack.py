"""training/evals/attack.py: a backdoor run's records carry attack_success_rate beside test_accuracy, equal to
the global model's accuracy toward the target on the triggered non-target test images; summary.json keeps the
last one; the other kinds' records do not carry it."""
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.data import attacks
from fedjax_flat.training import loop
from tests.fixtures.configs import small_config


def _train(**over):
  c = small_config(**{'data.num_clients': 8, 'clients_per_round': 4, 'rounds': 2, 'eval_every': 1,
                      'attack.fraction': 0.25, **over})
  t = loop.Trainer(c, write_files=False)
  t.summary = t.train()
  return t


def test_backdoor_records_carry_the_success_rate_of_the_global_model():
  t = _train(**{'attack.kind': 'backdoor', 'attack.scale': 2.0, 'attack.target_label': 1})
  assert all('attack_success_rate' in r and 'test_accuracy' in r for r in t.records if 'test_accuracy' in r)
  tx, ty = t.plan.data.test_examples()
  x, y = attacks.triggered_test(tx, ty, t.config.attack, attacks.trigger_value(t.plan.data.x))
  assert len(y) and np.all(y == 1)
  params = t.algorithm.eval_models(t.server_state)['global'][0]
  logits = t.model.apply(params, jnp.asarray(t.plan.eval_transform(x) if t.plan.eval_transform else x))
  want = float(np.mean(np.argmax(np.asarray(jax.device_get(logits)), -1) == 1))
  np.testing.assert_allclose(t.records[-1]['attack_success_rate'], want, atol=1e-6)
  assert t.summary['attack']['success_rate'] == t.records[-1]['attack_success_rate']
  assert t.summary['attack']['kind'] == 'backdoor' and t.summary['attack']['num_attackers'] == 2


def test_untargeted_attacks_report_no_success_rate():
  t = _train(**{'attack.kind': 'sign_flip'})
  assert not any('attack_success_rate' in r for r in t.records)
  assert 'success_rate' not in t.summary['attack'] and t.summary['attack']['num_attackers'] == 2
