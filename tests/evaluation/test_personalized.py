"""Personalized / OOD evaluation: AUC, the protocols on a toy setting with known answers, validation steps,
FedBN-style local normalization and leave-one-client-out end to end."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import label_binarize

from fedjax_flat.algorithms import personalization

from fedjax_flat.algorithms.wrappers import local_norm
from fedjax_flat.algorithms.wrappers import swa as swa_lib
from fedjax_flat.core.contract import FederatedAlgorithm

from fedjax_flat.data import validation_steps

from fedjax_flat.evaluation import metrics

from fedjax_flat.evaluation import personalized

from fedjax_flat.training import personalized_eval
from fedjax_flat.data import batching
from fedjax_flat.models import base as model_base
from fedjax_flat.models import registry as model_registry
from fedjax_flat.models.base import Model
from fedjax_flat.training import trainers
from fedjax_flat.config.default_config import default_config


# --- AUC ---

def test_binary_auc_hand_computed():
  # Pairs (pos, neg): (.35,.1) (.35,.4)x (.8,.1) (.8,.4) -> 3/4.
  assert metrics.binary_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
  # A tie counts 1/2: pos {.5, .9}, neg {.5, .2}: 0.5 + 1 + 1 + 1 = 3.5 / 4.
  assert metrics.binary_auc([0.5, 0.5, 0.2, 0.9], [1, 0, 0, 1]) == pytest.approx(0.875)
  assert np.isnan(metrics.binary_auc([0.1, 0.2], [1, 1]))


def test_auc_matches_sklearn():
  rng = np.random.default_rng(0)
  y = rng.integers(0, 4, 300)
  logits = rng.normal(0, 1, (300, 4)) + 1.5 * np.eye(4)[y]
  logits[:20] = np.round(logits[:20])            # some ties
  probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
  yb = label_binarize(y, classes=range(4))
  assert metrics.auc(logits, y) == pytest.approx(roc_auc_score(yb, probs, average='micro'), abs=1e-12)
  assert metrics.auc(logits, y, scores='logits') == pytest.approx(roc_auc_score(yb, logits, average='micro'), abs=1e-12)
  # Binary: the score of class 1 (softmax and logit difference rank identically).
  y2 = rng.integers(0, 2, 200)
  l2 = rng.normal(0, 1, (200, 2)) + np.eye(2)[y2]
  p1 = np.exp(l2[:, 1]) / np.exp(l2).sum(1)
  assert metrics.auc(l2, y2) == pytest.approx(roc_auc_score(y2, p1), abs=1e-12)
  assert metrics.auc(l2, y2, scores='logits') == pytest.approx(roc_auc_score(y2, p1), abs=1e-12)


# --- The protocols on a fixed toy setting: one-hot features f, a permutation model predicts sigma(f). ---

TOY = Model('toy', init=None, apply=lambda p, x, train=False, rng=None, with_activations=False: x @ p['W'],
            num_classes=3, input_shape=(3,))
M0 = {'W': jnp.eye(3)}                                       # predicts f
M1 = {'W': jnp.roll(jnp.eye(3), 1, axis=1)}                  # predicts (f + 1) % 3


def _set(f, y):
  return np.eye(3, dtype=np.float32)[np.asarray(f)], np.asarray(y)


def test_protocols_known_answers():
  sets = personalized.EvalSets(local=[_set([0, 1, 2, 0], [0, 1, 2, 1]), _set([0, 1], [1, 1])],
                    global_=_set([0, 1, 2], [0, 2, 2]), unseen=_set([2, 2], [2, 0]))
  predict = personalized.make_predict_fn(TOY, batch_size=2)              # batches smaller than the sets: padding path
  r = personalized.evaluate_protocols(predict, [M0, M1], M0, sets)
  # local: client 0 with M0: 3/4; client 1 with M1 predicts [1, 2]: 1/2.
  assert r['local']['acc_client_mean'] == pytest.approx((3 / 4 + 1 / 2) / 2)
  assert r['local']['acc_weighted'] == pytest.approx(4 / 6)
  assert [row['n'] for row in r['local']['per_client']] == [4, 2]
  # global: M0 predicts [0, 1, 2] (2/3), M1 predicts [1, 2, 0] (1/3).
  assert r['global']['acc_client_mean'] == pytest.approx(0.5)
  # other clients: M0 on client 1's set (1/2), M1 on client 0's set: [1, 2, 0, 1] vs [0, 1, 2, 1] (1/4).
  assert r['ood_other_clients']['acc_client_mean'] == pytest.approx(0.375)
  # unseen domain: M0 -> [2, 2] (1/2), M1 -> [0, 0] (1/2).
  assert r['unseen']['acc_client_mean'] == pytest.approx(0.5)
  # server model M0 everywhere.
  assert r['server']['global_acc'] == pytest.approx(2 / 3)
  assert r['server']['local_acc_weighted'] == pytest.approx(4 / 6)
  assert r['server']['unseen_acc'] == pytest.approx(0.5)
  # AUC: the same rank-based micro AUC on each model's logits.
  x, y = sets.global_
  assert r['global']['per_client'][0]['auc'] == pytest.approx(metrics.auc(np.asarray(x @ M0['W']), y))
  flat = personalized.headline(r)
  assert flat['local_acc_weighted'] == pytest.approx(4 / 6) and 'unseen_acc_client_mean' in flat


def test_default_personalizer_is_the_global_model():
  class Alg:
    name = 'fedprox'
    personalizer = None
    eval_models = staticmethod(lambda s: {'global': (s['params'], True)})
  assert personalization.personal_params(Alg, {'params': M0}, {'anything': 1}) is M0
  assert personalization.personalizer_name(Alg) is None


def test_server_wrappers_pass_the_personalizer_through():
  """The built algorithm carries its personal model: SWA / WiMA leave the client state alone and keep it, local
  normalization wraps it (its name then says so); no lookup by name."""
  soup = personalization.Personalizer('fedsoup', lambda alg, s, cs: cs['personal'])
  alg = FederatedAlgorithm('fedsoup', lambda p, r: {'params': p}, *([None] * 5),
                           lambda s: {'global': (s['params'], jnp.bool_(True))}, personalizer=soup)
  cfg = default_config()
  cfg.swa.enabled, cfg.rounds = True, 10
  wrapped = swa_lib.with_swa(alg, cfg)
  assert wrapped.name == 'fedsoup' and wrapped.wrappers == ('swa',) and wrapped.label == 'fedsoup+swa'
  assert personalization.personalizer_name(wrapped) == 'fedsoup' and wrapped.reported_models == ('swa',)
  assert personalization.personal_params(wrapped, {'params': M0}, {'personal': 7}) == 7
  ln = local_norm.with_local_norm(alg)
  assert ln.label == 'fedsoup+localnorm' and personalization.personalizer_name(ln) == 'fedsoup+localnorm'
  assert personalization.personalizer_name(local_norm.with_local_norm(alg, name='fedbn')) == 'fedbn'


def test_validation_steps_appended_last():
  from fedjax_flat.data.sources.feature_shift import load_digits_feature_shift
  d = load_digits_feature_shift(3, seed=0)
  S = batching.padded_num_steps(d.client_sizes(), 16)
  rb = batching.make_round_batches(d, [2, 0], round_idx=0, seed=0, batch_size=16, num_steps=S,
                                   pad_clients_to=3)
  s_val = validation_steps.validation_num_steps(d, 'val', 16)
  assert s_val == -(-int(d.client_val_sizes().max()) // 16)
  vb = validation_steps.append_validation_steps(rb, d, 'val', s_val)
  assert vb.x.shape[:3] == (3, S + s_val, 16) and set(vb.as_dict()) == {'x', 'y', 'mask', 'split'}
  np.testing.assert_array_equal(vb.x[:, :S], rb.x)
  vx, vy = d.client_val_examples(2)
  n = len(vy)
  np.testing.assert_array_equal(vb.x[0, S:].reshape((-1, 8, 8, 1))[:n], vx)
  np.testing.assert_array_equal(vb.y[0, S:].reshape(-1)[:n], vy)
  assert vb.mask[0, S:].sum() == n and vb.mask[2].sum() == 0       # padding client: nothing
  assert vb.split[:, S:].all() and not vb.split[:, :S].any()
  steps = validation_steps.validation_num_steps(d, 'local_test', 16)
  tb = validation_steps.append_validation_steps(rb, d, 'local_test', steps)
  assert tb.mask[1, S:].sum() == len(d.client_test_examples(0)[1])


# --- FedBN-style local normalization + leave-one-client-out, end to end. ---

class GNMLP(nn.Module):
  num_classes: int = 10

  @nn.compact
  def __call__(self, x, train=False):
    x = x.reshape(x.shape[:-3] + (-1,))
    x = nn.relu(nn.GroupNorm(num_groups=2, name='gn')(nn.Dense(16)(x)))
    return nn.Dense(self.num_classes)(x)


def _register_gn_model():
  if 'test_gn_mlp' not in model_registry.names():
    model_registry.register('test_gn_mlp')(
        lambda num_classes, input_shape, **kw: model_base.from_flax(GNMLP(num_classes), 'test_gn_mlp',
                                                                    num_classes, input_shape))


def test_norm_leaves_detected():
  p = GNMLP().init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))['params']
  flags = dict(zip([jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(p)[0]],
                   local_norm.norm_flags(p)))
  assert flags == {"['Dense_0']['bias']": False, "['Dense_0']['kernel']": False, "['Dense_1']['bias']": False,
                   "['Dense_1']['kernel']": False, "['gn']['bias']": True, "['gn']['scale']": True}


def test_fedbn_leave_one_out_end_to_end(tmp_path):
  _register_gn_model()
  c = default_config()
  c.dataset = 'digits_feature_shift'
  c.data = ml_collections.ConfigDict({'num_clients': 4, 'seed': 0, 'leave_out': 1})
  c.model = 'test_gn_mlp'
  c.algorithm = 'fedbn'
  c.rounds = 2
  c.clients_per_round = 3
  c.client.lr = 0.1
  c.client.batch_size = 64
  c.eval_every = 2
  c.progress_every_s = 1e9
  c.personalized.enabled = True
  t = trainers.make_trainer(c, str(tmp_path))
  init = jax.tree_util.tree_map(np.array, t.server_state['params'])
  s = t.train()
  srv = t.server_state['params']
  np.testing.assert_array_equal(srv['gn']['scale'], init['gn']['scale'])        # never aggregated
  np.testing.assert_array_equal(srv['gn']['bias'], init['gn']['bias'])
  assert not np.allclose(srv['Dense_0']['kernel'], init['Dense_0']['kernel'])    # the rest is FedAvg
  states = personalized_eval.client_states_of(t.store)
  assert sorted(states) == [0, 1, 2] and all(float(st['seen']) == 1 for st in states.values())
  biases = [np.asarray(st['norm'][0]) for st in states.values()]               # gn bias per client
  assert not np.allclose(biases[0], biases[1]) and not np.allclose(biases[0], init['gn']['bias'])
  pk = personalization.personal_params(t.algorithm, t.server_state, states[2])
  np.testing.assert_array_equal(pk['gn']['bias'], states[2]['norm'][0])
  np.testing.assert_array_equal(pk['Dense_0']['kernel'], srv['Dense_0']['kernel'])
  p = s['personalized']
  assert p['personal_model'] == 'fedbn' and p['num_clients'] == 3
  assert p['unseen']['per_client'][0]['n'] == len(t.data.unseen_examples()[1]) > 300
  assert 'unseen_acc' in p['server'] and 0 <= p['unseen']['acc_client_mean'] <= 1
  assert (tmp_path / 'personalized.png').stat().st_size > 10000      # the personalized metrics' plot


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_fedsoup_with_local_norm_one_round():
  _register_gn_model()
  c = default_config()
  c.dataset = 'digits_feature_shift'
  c.data = ml_collections.ConfigDict({'num_clients': 3, 'seed': 0})
  c.model = 'test_gn_mlp'
  c.algorithm = 'fedsoup'
  c.algo.local_norm = True
  c.algo.start_round = 0
  c.rounds = 1
  c.clients_per_round = 3
  c.client.batch_size = 64
  c.progress_every_s = 1e9
  t = trainers.make_trainer(c)
  init = jax.tree_util.tree_map(np.array, t.server_state['params'])
  t.train()
  assert t.algorithm.label == 'fedsoup+localnorm' and t.algorithm.wrappers == ('localnorm',)
  np.testing.assert_array_equal(t.server_state['params']['gn']['scale'], init['gn']['scale'])
  st = personalized_eval.client_states_of(t.store)[1]
  assert set(st) == {'norm', 'seen', 'inner'} and float(st['inner']['count']) in (0.0, 1.0)
  pk = personalization.personal_params(t.algorithm, t.server_state, st)
  # The soup-patched model with the client's own normalization params (those of its patched upload).
  np.testing.assert_array_equal(pk['Dense_0']['kernel'], st['inner']['personal']['Dense_0']['kernel'])
  np.testing.assert_array_equal(pk['gn']['scale'], st['norm'][1])
  np.testing.assert_array_equal(st['norm'][1], st['inner']['personal']['gn']['scale'])


def test_summary_md_shows_the_personalized_protocols(tmp_path):
  """training/writers.write_summary: summary.json's 'personalized' block -> a table in summary.md."""
  from fedjax_flat.training import writers
  res = {'personal_model': 'fedbn',
         'local': {'acc_client_mean': 0.9, 'acc_weighted': 0.875, 'auc_client_mean': 0.95, 'auc_pooled': 0.96,
                   'per_client': [{'client': 0}]},
         'ood_other_clients': {'acc_client_mean': 0.5, 'auc_client_mean': 0.7},
         'global': {'acc_client_mean': 0.6, 'auc_client_mean': None},
         'server': {'global_acc': 0.8, 'global_auc': 0.85, 'local_acc_client_mean': 0.81,
                    'local_acc_weighted': 0.82, 'local_auc_pooled': 0.83},
         'finetune': [{'epoch': 1, 'local_acc_client_mean': 0.91}, {'epoch': 2, 'local_acc_client_mean': 0.925,
                                                                    'local_auc_client_mean': 0.97}]}
  summary = {'experiment': 'x', 'models': {}, 'personalized': res}
  writers.write_summary(str(tmp_path), summary)
  md = (tmp_path / 'summary.md').read_text().splitlines()
  assert '## Personalized evaluation (client models: `fedbn`)' in md
  assert "| local: each client model on its own test split | 0.9000 | 0.8750 | 0.9500 | 0.9600 |" in md
  assert ("| leave-one-out: each client model on the other clients' test splits | 0.5000 | - | 0.7000 | - |"
          in md)
  assert '| global: each client model on the global test set | 0.6000 | - | - | - |' in md
  assert '| server model, local splits | 0.8100 | 0.8200 | - | 0.8300 |' in md
  assert '| server model, global test set | - | 0.8000 | - | 0.8500 |' in md
  assert 'Fine-tuned 2 epoch(s): local acc (client mean) 0.9250, AUC (client mean) 0.9700.' in md
  assert not any('unseen' in line for line in md)
  writers.write_summary(str(tmp_path), {'experiment': 'x', 'models': {}})     # no block: no section
  assert 'Personalized' not in (tmp_path / 'summary.md').read_text()
