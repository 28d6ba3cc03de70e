"""The algorithm registry's contract (algorithms/registry.py, algorithms/hparams.py): typed rules and their
messages, declared needs against what the built algorithms do, and the client optimizer built once
(optimizers/client.py) against the optax chain written out by hand, bit for bit."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_flat.algorithms import fedavg as fedavg_lib, fedseq, hparams, registry
from fedjax_flat.algorithms.local import make_loss
from fedjax_flat.config.default_config import default_config, segmentation_data
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.errors import ConfigError
from fedjax_flat.registry import DuplicateName
from fedjax_flat.grouping.style_clusters import StyleClustering
from fedjax_flat.models.registry import get_model
from fedjax_flat.optimizers import client as client_lib
from fedjax_flat.optimizers.asam import asam
from fedjax_flat.optimizers.sam import sam
from fedjax_flat.optimizers.schedules import poly_lr


@pytest.mark.parametrize('rule,value,why', [
    (hparams.Number(0.1, lo=0), -1, 'must be a number in [0, inf)'),
    (hparams.Number(0.1, lo=0, lo_open=True, hi=1), 1.5, 'must be a number in (0, 1]'),
    (hparams.Number(0.1, lo=0, hi=1, hi_open=True), 1, 'must be a number in [0, 1)'),
    (hparams.Number(0.1, lo=0, hi=1), True, 'must be a number in [0, 1]'),
    (hparams.Number(1.0, lo=0, lo_open=True, bound=True), 0, 'must be a number > 0'),
    (hparams.Number(1.0, lo=0, bound=True, finite=True), float('inf'), 'must be a finite number >= 0'),
    (hparams.Number(0.2, lo=0, lo_open=True, hi=1, note=': C'), 0, 'must be a number in (0, 1]: C'),
    (hparams.Integer(1, lo=1), 0, 'must be an integer >= 1'),
    (hparams.Integer(1, lo=1), 1.0, 'must be an integer >= 1'),
    (hparams.Population(), -1, "must be an integer >= 0 (0 = the dataset's number of clients)"),
    (hparams.Flag(True), 1, 'must be True or False'),
    (hparams.Choice('a', ('b', 'a')), 'c', "allowed values: ['b', 'a']"),
])
def test_rule_messages(rule, value, why):
  assert rule.why_not(value) == why
  assert rule.why_not(rule.default) is None
  with pytest.raises(ConfigError, match='algo.x') as e:
    hparams.check({'x': rule}, {'x': value})
  assert why in str(e.value)


# Algorithms that run only on their own network (their `check` refuses the rest): the model their checks need.
OWN_MODEL = {'fedcg': 'fedcg_net', 'ladd': 'seg_cnn'}
# Algorithms that run only on their own kind of data (LADD self-trains on label maps): the dataset they need.
OWN_DATA = {'ladd': 'seg_synthetic_da'}


def _own_data(cfg, name):
  if name in OWN_DATA:
    cfg.dataset, cfg.data = OWN_DATA[name], segmentation_data(OWN_DATA[name])
  if name == 'ladd':        # LADD adapts a source model (the file is the pre-training's; not read here)
    cfg.init.pretrained = 'source_model.npz'
  return cfg


def _clusters(name, k=4):
  """What the trainer passes to an algorithm that needs 'style_clusters' (two clusters over k clients)."""
  if 'style_clusters' not in registry.needs(name):
    return None
  return StyleClustering(2, np.arange(k, dtype=np.int32) % 2, np.zeros((2, 27)), {}, 0.0)


def _groups(name, k=4):
  """What the trainer passes to an algorithm that needs 'client_groups' (two groups over k clients)."""
  if 'client_groups' not in registry.needs(name):
    return None
  return {'labels': np.arange(k) % 2, 'examples': np.ones(2), 'per_group': 1}


def test_every_algorithm_declares_rules_and_known_needs():
  names = registry.names()
  assert {'fedavg', 'fedprox', 'scaffold', 'fedgloss', 'fedseq', 'fedsoup', 'fednova'} <= set(names)
  for name in names:
    spec = registry.spec(name)
    assert all(isinstance(r, hparams.Rule) for r in spec.hparams.values()), name
    assert spec.needs <= set(registry.NEEDS), name
    assert registry.default_hparams(name) == {k: r.default for k, r in spec.hparams.items()}
    cfg = default_config()
    cfg.algorithm = name
    cfg.model = OWN_MODEL.get(name, cfg.model)
    _own_data(cfg, name)
    cfg.algo.update(registry.default_hparams(name))
    if spec.client_optimizers is not None:
      cfg.client.optimizer = spec.client_optimizers[0]
    spec.validate(cfg)                                  # the declared defaults pass the declared rules
  assert registry.default_hparams('no_such_algorithm') == {}
  assert registry.needs('') == frozenset()


def test_register_refuses_untyped_defaults_and_unknown_needs():
  with pytest.raises(TypeError, match='rule of algorithms/hparams.py'):
    registry.register('_untyped', hparams={'mu': 0.1})
  with pytest.raises(ValueError, match='unknown needs'):
    registry.register('_needy', needs=('gpu',))


def test_chains_need_is_what_the_chain_trainer_reads():
  assert registry.with_need('chains') == ['fedasyncseq', 'fedcyclic', 'fedseq', 'fedseq2par']
  assert all((registry.spec(n).chain is not None) == ('chains' in registry.needs(n)) for n in registry.names())
  assert registry.declared('') is None
  chains = {n: registry.spec(n).chain for n in registry.with_need('chains')}
  assert chains['fedcyclic'].over == 'clients' and chains['fedseq2par'].regroup and chains['fedasyncseq'].slots
  assert chains['fedseq'] == fedseq.ChainSpec() and chains['fedseq2par'].auto_lanes == 'one'
  with pytest.raises(ValueError, match='go together'):
    registry.register('_chainless', needs=('chains',))


def test_client_state_need_matches_the_built_algorithms():
  model = get_model('mlp', 3, (2, 1, 1), hidden=())
  for name in registry.names():
    if 'chains' in registry.needs(name):
      continue                                        # built by the chain trainer with its plan
    cfg = default_config()
    cfg.dataset, cfg.model, cfg.algorithm = 'synthetic', OWN_MODEL.get(name, 'mlp'), name
    cfg.data.num_clients = 4
    _own_data(cfg, name)
    spec = registry.spec(name)
    if spec.client_optimizers is not None:
      cfg.client.optimizer = spec.client_optimizers[0]
    own = get_model(cfg.model, 3, (2, 1, 1)) if name in OWN_MODEL else model
    alg = registry.build_algorithm(cfg, own, population=4, client_clusters=_clusters(name),
                                   client_groups=_groups(name))
    assert ('client_state' in spec.needs) == (alg.client_state_init is not None), name


def _client_cfg(optimizer='sgd', base='sgd', schedule='constant', momentum=0.9, clip=0.0):
  c = default_config().client
  c.optimizer, c.base_optimizer, c.lr_schedule, c.grad_clip = optimizer, base, schedule, clip
  c.momentum = 0.0 if base == 'adam' else momentum
  c.weight_decay, c.lr_poly_max, c.lr_power = 1e-3, 7, 0.9
  return c


def _by_hand(c, hp):
  """The chain as the client optimizer was written before it was built once: every leaf from hp's values."""
  parts = []
  if c.optimizer == 'sam':
    parts.append(sam(hp['rho']))
  elif c.optimizer == 'asam':
    parts.append(asam(hp['rho'], c.asam_eta))
  parts.append(client_lib.add_correction())
  if c.grad_clip:
    parts.append(optax.clip_by_global_norm(c.grad_clip))
  parts.append(optax.add_decayed_weights(c.weight_decay))
  lr = poly_lr(hp['lr'], c.lr_power, c.lr_poly_max) if c.lr_schedule == 'poly_step' else hp['lr']
  if c.base_optimizer == 'sgd':
    parts.append(optax.sgd(lr, momentum=c.momentum or None))
  else:
    parts.append(optax.adam(lr, b1=c.adam_b1, b2=c.adam_b2, eps=c.adam_eps))
  return optax.chain(*parts)


@pytest.mark.parametrize('kw', [{}, {'optimizer': 'sam'}, {'optimizer': 'asam', 'clip': 0.5},
                                {'base': 'adam'}, {'schedule': 'poly_step'}, {'momentum': 0.0}])
def test_client_optimizer_built_once_is_bit_identical(kw):
  c = _client_cfg(**kw)
  model = get_model('mlp', 3, (2, 1, 1), hidden=(4,))
  params = model.init(jax.random.key(0), jnp.zeros((1, 2, 1, 1)))
  loss = make_loss(model)
  rng = np.random.default_rng(0)
  batches = [{'x': jnp.asarray(rng.normal(size=(5, 2, 1, 1)), jnp.float32),
              'y': jnp.asarray(rng.integers(0, 3, 5)), 'mask': jnp.ones(5, jnp.float32)} for _ in range(4)]
  once = client_lib.client_optimizer(c)

  @jax.jit
  def run(hp):
    """4 steps of the optimizer built once, and of a chain built by hand per step from the traced hp."""
    p1 = p2 = params
    s1, s2 = once.init(params), _by_hand(c, hp).init(params)
    for b in batches:
      grad_fn = lambda q, b=b: jax.grad(lambda r: loss(r, b)[0])(q)  # noqa: E731
      corr = jax.tree_util.tree_map(lambda w: 0.01 * w, p1)
      u1, s1 = once.update(grad_fn(p1), s1, p1, hparams=hp, grad_fn=grad_fn, correction=corr)
      u2, s2 = _by_hand(c, hp).update(grad_fn(p2), s2, p2, grad_fn=grad_fn, correction=corr)
      p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    return p1, p2, s1, s2

  p1, p2, s1, s2 = run({'lr': jnp.float32(0.1), 'rho': jnp.float32(0.05)})
  assert jax.tree_util.tree_structure(s1) == jax.tree_util.tree_structure(s2)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), (p1, s1),
                         (p2, s2))
  fixed = client_lib.make_client_tx(c, {'lr': 0.1, 'rho': 0.05})   # fixed hparams: no hparams argument
  g = jax.tree_util.tree_map(jnp.ones_like, params)
  u, _ = fixed.update(g, fixed.init(params), params, grad_fn=lambda q: g)
  assert jax.tree_util.tree_structure(u) == jax.tree_util.tree_structure(params)
  with pytest.raises(ValueError, match="needs the round's hyperparameters"):
    once.update(g, once.init(params), params, grad_fn=lambda q: g)


def test_a_taken_name_is_refused_unless_replaced_on_purpose():
  def mine(ctx):
    return fedavg_lib.fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)
  with pytest.raises(DuplicateName, match="algorithm 'fedavg' is already registered .*replace=True"):
    registry.register('fedavg')(mine)
  assert registry.ALGORITHMS.get('fedavg') is not mine
  try:
    registry.register('_test_mine')(mine)
    registry.register('_test_mine')(mine)           # the same definition again (a re-run cell): quietly kept
    assert registry.name_of(mine) == '_test_mine'

    def mine2(ctx):
      return mine(ctx)
    with pytest.raises(DuplicateName):
      registry.register('_test_mine')(mine2)
    registry.register('_test_mine', replace=True)(mine2)
    assert registry.ALGORITHMS.get('_test_mine') is mine2 and registry.name_of(mine) is None
  finally:
    registry.ALGORITHMS._entries.pop('_test_mine', None)


def test_the_builder_gets_its_name_hyperparameters_and_schedule_resolved_once():
  """build_algorithm resolves, once, what a builder reads: ctx.name (the built algorithm's label, whatever the inner
  builder calls itself), ctx.hp (config.algo over the declared defaults; read-only, so a builder cannot change what
  the built algorithm reports) and ctx.hparams_fn (the round's {lr, rho}: here lr 0.2 decayed over 10 rounds with
  power 1, rho warmed up 0 -> 0.1 over 4 rounds), which FedAvg's broadcast sends as it is."""
  seen = []

  def mine(ctx):
    seen.append(ctx)
    return fedavg_lib.fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)
  try:
    registry.register('_test_ctx', hparams={'mu': hparams.Number(0.5, lo=0), 'k': hparams.Integer(3, lo=1)})(mine)
    c = default_config()
    c.algorithm, c.algo = '_test_ctx', {'k': 7}
    c.client.optimizer, c.client.lr, c.client.rho, c.client.rho0, c.client.rho_warmup_rounds = 'sam', 0.2, 0.1, 0.0, 4
    c.client.lr_schedule, c.client.lr_power, c.client.lr_poly_max = 'poly_round', 1.0, 10
    alg = registry.build_algorithm(c, get_model('mlp', 10, (8, 8, 1)))
    (ctx,) = seen
    assert ctx.name == '_test_ctx' and alg.name == '_test_ctx' and alg.label == '_test_ctx'
    assert dict(ctx.hp) == {'mu': 0.5, 'k': 7} == dict(alg.hparams) and ctx.hparams is ctx.hp
    with pytest.raises(TypeError):
      ctx.hp['mu'] = 1.0
    state = alg.server_init({'w': jnp.zeros(2)}, None)
    for r, lr, rho in ((0, 0.2, 0.0), (2, 0.16, 0.05), (5, 0.1, 0.1)):
      sent = alg.broadcast(state, r)['hparams']
      np.testing.assert_allclose([float(sent['lr']), float(sent['rho'])], [lr, rho], rtol=1e-6, atol=1e-8)
      assert all(float(sent[k]) == float(ctx.hparams_fn(r)[k]) for k in ('lr', 'rho'))
  finally:
    registry.ALGORITHMS._entries.pop('_test_ctx', None)


def test_a_builder_that_leaves_out_server_init_and_broadcast_gets_fedavgs_before_the_wrappers():
  """server_init / broadcast left None by the builder: FedAvg's, from ctx.server_tx (here momentum 0.9) and
  ctx.hparams_fn, filled in before the features wrap the algorithm (SWA's server state wraps FedAvg's)."""
  def mine(ctx):
    base = fedavg_lib.fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)
    return FederatedAlgorithm(ctx.name, client_init=base.client_init, client_step=base.client_step,
                              client_final=base.client_final, server_update=base.server_update)
  try:
    registry.register('_test_defaults')(mine)
    c = default_config()
    c.algorithm, c.rounds, c.client.lr = '_test_defaults', 10, 0.3
    c.server.momentum = 0.9
    model = get_model('mlp', 10, (8, 8, 1))
    params = {'w': jnp.arange(2.0)}
    alg = registry.build_algorithm(c, model)
    state = alg.server_init(params, None)
    assert set(state) == {'params', 'opt_state'} and state['params'] is params
    np.testing.assert_array_equal(state['opt_state'][0].trace['w'], np.zeros(2))   # the server momentum's
    sent = alg.broadcast(state, 2)
    assert sent['params'] is params and float(sent['hparams']['lr']) == pytest.approx(0.3)
    c.swa.enabled = True
    swa = registry.build_algorithm(c, model)
    assert swa.wrappers == ('swa',) and {'params', 'opt_state'} <= set(swa.server_init(params, None))
  finally:
    registry.ALGORITHMS._entries.pop('_test_defaults', None)
