"""algorithms/features.py: the cross-cutting features declare themselves (order, switch, the upload they act on);
the builder, config validation and the divergence hint read the declarations, never a list of algorithm names."""
import pytest

from fedjax_flat.algorithms import features, registry
from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.config.validate import validate_config
from fedjax_flat.errors import ConfigError
from fedjax_flat.training import trainers
from fedjax_flat.data.sources.builtin import synthetic
from tests.fixtures.configs import small_config

DP = {'dp.mode': 'central', 'dp.clip': 1.0, 'dp.noise_multiplier': 1.0, 'dp.delta': 1e-3,
      'server.weighting': 'uniform'}
TOPK = {'upload.compress': 'topk', 'upload.fraction': 0.5}
MEDIAN = {'server.aggregator': 'median'}


def test_the_features_wrap_in_their_declared_order_with_their_declared_upload():
  fs = features.ordered()
  assert [f.name for f in fs] == ['compress', 'robust', 'dp', 'attack', 'swa', 'wima']
  assert {f.name: f.upload for f in fs} == {'compress': 'delta', 'robust': 'delta', 'attack': 'delta', 'dp': 'delta',
                                            'swa': None, 'wima': None}
  assert {f.name: f.switch for f in fs}['dp'] == 'dp.mode'


def _builder(ctx):
  return fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)


@pytest.fixture
def declared_pair():
  """The same FedAvg builder registered twice: once declaring upload='delta', once declaring nothing."""
  def delta_builder(ctx):
    return _builder(ctx)

  def silent_builder(ctx):
    return _builder(ctx)

  registry.register('test_feat_delta', upload='delta')(delta_builder)
  registry.register('test_feat_silent')(silent_builder)
  yield
  for n in ('test_feat_delta', 'test_feat_silent'):
    registry.ALGORITHMS._entries.pop(n, None)


@pytest.mark.parametrize('fields,switch', [(DP, 'dp.mode'), (TOPK, 'upload.compress'),
                                           (MEDIAN, 'server.aggregator')])
def test_a_feature_reads_the_declared_upload_not_a_name(declared_pair, fields, switch):
  validate_config(small_config(algorithm='test_feat_delta', **{'data.num_clients': 10, **fields}))
  with pytest.raises(ConfigError) as e:
    validate_config(small_config(algorithm='test_feat_silent', **{'data.num_clients': 10, **fields}))
  msg = str(e.value)
  assert msg.startswith(f'config.{switch}=') and "declares upload='other'" in msg and "upload='delta'" in msg
  assert '\n' not in msg


def test_the_built_algorithm_carries_its_declaration_and_the_wrap_checks_it(declared_pair):
  data = synthetic(10, [5] * 10, input_shape=(3, 3, 1), num_classes=4, seed=0)
  t = trainers.make_trainer(small_config(algorithm='test_feat_delta', **{'data.num_clients': 10, **TOPK}), data=data)
  assert t.algorithm.upload == 'delta' and t.algorithm.wrappers == ('compress',)
  plain = t.algorithm.replace(upload='other', wrappers=())
  with pytest.raises(ConfigError, match="declares upload='other'"):
    features.wrap(plain, small_config(**TOPK), features.WrapContext())


def test_a_diverging_run_names_the_first_enabled_feature():
  c = small_config(**{'data.num_clients': 10, **TOPK})
  assert features.divergence_hints(c, 1000, 10)[0].startswith('Likely the compressed uploads')
  assert features.divergence_hints(small_config(), 1000, 10) == []
