"""Every config validation error: named field, bad value, exit status 2 from the binary, before compiling."""
import os
import subprocess
import sys

import pytest

from fedjax_flat.training import trainers

from fedjax_flat.config import validate
from fedjax_flat.config.default_config import default_config
from tests.fixtures.paths import REPO
from tests.fixtures.configs import small_config


CASES = [
    ('algorithm', 'fedfoo', 'allowed values'),
    ('dataset', 'imagenet22k', 'allowed values'),
    ('model', 'vit', 'allowed values'),
    ('client.lr', -0.1, '> 0'),
    ('client.lr', 0.0, '> 0'),
    ('client.momentum', 1.0, '< 1'),
    ('client.weight_decay', -1e-4, '>= 0'),
    ('eval_batch_size', 'fast', "'auto' or an integer >= 1"),
    ('eval_batch_size', 0, "'auto' or an integer >= 1"),
    ('client.batch_size', 0, '>= 1'),
    ('client.optimizer', 'adamw', 'allowed values'),
    ('client.rho', -0.05, '>= 0'),
    ('server.optimizer', 'lamb', 'allowed values'),
    ('server.lr', 0.0, '> 0'),
    ('rounds', 0, '>= 1'),
    ('clients_per_round', 0, '>= 1'),
    ('engine.strategy', 'pmap', 'allowed values'),
    ('engine.unroll', 0, 'integer >= 1'),
    ('engine.compute_dtype', 'float16', "allowed values: ['bfloat16', 'float32']"),
    ('swa.start_fraction', 1.5, '< 1'),
    ('swa.cycle', 0, '>= 1'),
    ('wima.window', 0, '>= 1'),
    ('wima.subset', 'head', 'allowed values'),
    ('man.zeta', -1.0, '>= 0'),
    ('man.convention', 'half', "allowed values: ['paper', 'code']"),
    ('augment', 'randaugment', 'allowed values'),
    ('eval_every', 0, '>= 1'),
]


def _set(c, path, value):
  *head, last = path.split('.')
  node = c
  for p in head:
    node = node[p]
  with node.ignore_type():
    node[last] = value


@pytest.mark.parametrize('field,value,allowed', CASES)
def test_invalid_field_is_named(field, value, allowed):
  c = default_config()
  _set(c, field, value)
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(c)
  assert e.value.field == field
  assert repr(value) in str(e.value) and allowed in str(e.value)


def test_unknown_algorithm_hyperparameter():
  c = default_config()
  c.algo.mu = 0.1  # fedavg has no mu
  with pytest.raises(validate.ConfigError, match='algo.mu'):
    validate.validate_config(c)


def test_clients_per_round_above_population():
  c = default_config()
  c.clients_per_round = 21   # digits default: 20 clients
  with pytest.raises(validate.ConfigError, match=r'clients_per_round=21.*population of 20'):
    trainers.make_trainer(c)


@pytest.mark.parametrize('flag', ['--config.client.lr=-1', '--config.algorithm=fedfoo',
                                  '--config.clients_per_round=1000', '--config.algo.mu=0.1',
                                  '--config.algorithm=fedprox --config.algo.mu=abc',
                                  '--config.algorithm=fedfoo --config.algo.mu=0.1'])
def test_binary_exits_2_with_one_message(tmp_path, flag):
  cmd = [sys.executable, os.path.join(REPO, 'experiments', 'train.py'),
         f'--config={os.path.join(REPO, "configs", "quickstart.py")}', f'--workdir={tmp_path / "w"}',
         *flag.split()]
  res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
  assert res.returncode == 2, res.stderr[-2000:]
  assert 'error: config.' in res.stderr
  assert 'Traceback' not in res.stderr


def test_unwritable_workdir(tmp_path):
  ro = tmp_path / 'ro'
  ro.mkdir()
  os.chmod(ro, 0o500)
  if os.access(ro, os.W_OK):   # running as root: permissions are not enforced; use a file as "directory"
    blocker = tmp_path / 'file'
    blocker.write_text('x')
    target = str(blocker / 'sub')
  else:
    target = str(ro / 'sub')
  from fedjax_flat.training import run
  with pytest.raises(validate.ConfigError, match='workdir'):
    run.run(default_config(), target)


def test_algo_flags_fill_defaults_and_parse_by_type():
  from fedjax_flat.config import algo_flags
  argv = ['train.py', '--config=x.py', '--config.algo.mu', '0.5', '--config.rounds=3',
          '--config.algo.adaptive_mu=true']
  rest, over = algo_flags.split_argv(argv)
  assert rest == ['train.py', '--config=x.py', '--config.rounds=3']
  assert over == [('mu', '0.5'), ('adaptive_mu', 'true')]
  c = default_config()
  c.algorithm = 'adabest'
  c.lock()
  algo_flags.apply(c, over)
  assert c.algo.mu == 0.5 and c.algo.adaptive_mu is True and 'beta' in c.algo   # defaults filled in
  validate.validate_config(c)
  c2 = default_config()
  c2.algorithm = 'fedprox'
  with pytest.raises(validate.ConfigError, match=r'algo.beta.*fedprox \(it has: mu\)'):
    algo_flags.apply(c2, [('beta', '1')])
  with pytest.raises(validate.ConfigError, match='expected true or false'):
    algo_flags.apply(c, [('adaptive_mu', 'maybe')])
  with pytest.raises(ValueError, match='needs a value'):
    algo_flags.split_argv(['--config.algo.mu'])


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_binary_takes_algo_flags_for_a_config_without_algo(tmp_path):
  wd = tmp_path / 'w'
  cmd = [sys.executable, os.path.join(REPO, 'experiments', 'train.py'),
         f'--config={os.path.join(REPO, "configs", "quickstart.py")}', f'--workdir={wd}',
         '--config.algorithm=fedprox', '--config.algo.mu=0.25', '--config.rounds=2', '--config.eval_every=1']
  res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  import json
  saved = json.loads((wd / 'config.json').read_text())
  assert saved['algorithm'] == 'fedprox' and saved['algo'] == {'mu': 0.25}


def test_adam_client_validation():
  c = default_config()
  c.client.base_optimizer = 'adam'
  validate.validate_config(c)
  c.client.momentum = 0.9
  with pytest.raises(validate.ConfigError, match='client.momentum'):
    validate.validate_config(c)
  c.client.momentum = 0.0
  c.client.adam_b2 = 1.0
  with pytest.raises(validate.ConfigError, match='client.adam_b2'):
    validate.validate_config(c)
  c.client.adam_b2 = 0.999
  c.client.base_optimizer = 'rmsprop'
  with pytest.raises(validate.ConfigError, match='client.base_optimizer'):
    validate.validate_config(c)
  c.client.base_optimizer = 'adam'
  c.algorithm = 'mime'
  with pytest.raises(validate.ConfigError, match='client.base_optimizer'):
    validate.validate_config(c)


def _config_files():
  d = os.path.join(REPO, 'configs')
  return sorted(f[:-3] for f in os.listdir(d) if f.endswith('.py') and not f.startswith('_'))


# Families whose default cell starts from a file an earlier step writes (LADD: the source model of
# experiments/pretrain_source.py): without it, one line naming that step.
NEEDS_SOURCE_MODEL = ('ladd',)


@pytest.mark.parametrize('name', _config_files())
def test_every_config_file_builds_and_validates(name, tmp_path):
  """Each configs/*.py returns a ConfigDict that passes validation (the binary's first step)."""
  import importlib
  import inspect
  mod = importlib.import_module(f'configs.{name}')
  c = mod.get_config() if not inspect.signature(mod.get_config).parameters else mod.get_config('')
  if name in NEEDS_SOURCE_MODEL:
    with pytest.raises(validate.ConfigError, match='pretrain_source.py'):
      validate.validate_config(c)
    (tmp_path / 'source_model.npz').write_bytes(b'')
    c.init.pretrained = str(tmp_path / 'source_model.npz')
  validate.validate_config(c)
  assert c.model_kwargs.to_dict().keys() >= {'conv_impl'}


NONFINITE_FIELDS = ['client.lr', 'client.rho', 'client.weight_decay', 'server.lr', 'server.eps', 'swa.lr1',
                    'man.zeta', 'progress_every_s', 'data.alpha', 'algo.mu']


@pytest.mark.parametrize('field', NONFINITE_FIELDS)
@pytest.mark.parametrize('value', [float('nan'), float('inf'), float('-inf')])
def test_nan_and_inf_are_refused(field, value):
  c = default_config()
  c.algorithm = 'fedprox'
  if field == 'algo.mu':
    c.algo.mu = 0.1
  if field == 'data.alpha' and value == float('inf'):
    _set(c, field, value)
    validate.validate_config(c)        # the one field where infinity means something: IID
    return
  _set(c, field, value)
  with pytest.raises(validate.ConfigError, match='finite|>= 0') as e:
    validate.validate_config(c)
  assert e.value.field == field


def test_every_data_field_is_checked_before_loading(monkeypatch, tmp_path):
  from fedjax_flat.data import registry
  from fedjax_flat.training import run
  monkeypatch.setattr(registry, 'get_dataset', lambda *a, **k: pytest.fail('data loaded before validation'))
  for path, value, needle in [('data.alpha', -1.0, '>= 0'), ('data.num_clients', 0, '>= 1'),
                              ('data.test_fraction', 1.0, '< 1'), ('data.examples_per_client', 0, '>= 1'),
                              ('data.quantity_skew', float('nan'), 'finite'), ('data.seed', -1, '>= 0')]:
    c = default_config()
    _set(c, path, value)
    with pytest.raises(validate.ConfigError, match=needle) as e:
      run.run(c, str(tmp_path / 'w'))
    assert e.value.field == path
  c = default_config()
  with c.unlocked():
    c.data.num_client = 5                                  # a typo the builder would silently ignore
  with pytest.raises(validate.ConfigError, match="num_client.*did you mean 'num_clients'"):
    validate.validate_config(c)
  c = default_config()
  c.data.split_json = 'x.json'                             # declared everywhere, but digits takes no split file
  with pytest.raises(validate.ConfigError, match="not a field of dataset 'digits'"):
    validate.validate_config(c)
  c = default_config()
  c.dataset = 'digits_feature_shift'
  c.data.num_clients = 7
  with pytest.raises(validate.ConfigError, match='2 <= num_clients <= 5'):
    validate.validate_config(c)


def test_every_config_declares_the_command_line_data_fields():
  """--config.data.split_json=... (and the other optional data fields) work with every config file."""
  import glob
  from fedjax_flat.data.registry import OPTIONAL_FIELDS
  from fedjax_flat.config.families import load_config
  for path in sorted(glob.glob(os.path.join(REPO, 'configs', '*.py'))):
    c = load_config(path)
    missing = sorted(set(OPTIONAL_FIELDS) - set(c.data.keys()))
    assert not missing, (path, missing)
    c.data.split_json = '/some/split.json'                 # typed str, settable on a locked config


@pytest.mark.parametrize('field,value', [('retrieval.margin', -0.1), ('retrieval.num_negatives', 0),
                                         ('retrieval.threshold', float('nan')), ('fedvc.virtual_size', -1)])
def test_retrieval_and_fedvc_fields_are_checked(field, value):
  c = default_config()
  section, name = field.split('.')
  c[section][name] = value
  with pytest.raises(validate.ConfigError, match=field.replace('.', r'\.')):
    validate.validate_config(c)


def test_man_measure_is_validated_before_the_model_is_built():
  from fedjax_flat.config.default_config import default_config
  from fedjax_flat.errors import ConfigError
  c = default_config()
  c.model = 'man_convnet'
  c.model_kwargs = {'man_measure': 'after'}
  with pytest.raises(ConfigError, match=r"model_kwargs.man_measure.*'after'.*paper, release"):
    validate.validate_config(c)
  c.model_kwargs = {'man_measure': 'release'}
  c.model = 'cifar_cnn'
  with pytest.raises(ConfigError, match="man_convnet's"):
    validate.validate_config(c)


INERT = [  # (field set away from its default, value, what turns its feature on), issue 48
    ('dp.clip', 0.5, "dp.mode='central', 'local' or 'distributed'"),
    ('dp.noise_multiplier', 0.3, "dp.mode='central', 'local' or 'distributed'"),
    ('upload.fraction', 0.1, "upload.compress='topk' or 'randk'"),
    ('upload.bits', 4, "upload.compress='qsgd'"),
    ('client.looksam_k', 3, "client.optimizer='looksam'"),
    ('client.adam_b2', 0.99, "client.base_optimizer='adam'"),
    ('system.speed_sigma', 2.0, "system.speed='lognormal'"),
    ('system.min_steps', 3, 'system.deadline_s > 0'),
]


@pytest.mark.parametrize('field,value,needs', INERT)
def test_a_field_set_while_its_feature_is_off_is_refused_like_algo_mu_for_fedavg(field, value, needs):
  """Silently ignored before (as algo.mu for FedAvg is not): one line naming the field, what turns its feature on
  and its default. At its default, or with the feature on, it is accepted."""
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(small_config(**{field: value}))
  msg = str(e.value)
  assert e.value.field == field and f'is read only with {needs}' in msg and 'at its default' in msg, msg
  assert '\n' not in msg


def test_fields_of_a_feature_that_is_on_or_at_their_defaults_are_accepted():
  validate.validate_config(small_config(**{'client.optimizer': 'sam', 'client.sam_every': 2, 'dp.clip': 0.1,
                                           'upload.fraction': 0.01}))
  validate.validate_config(small_config(**{'client.optimizer': 'looksam', 'client.looksam_k': 3}))
  validate.validate_config(small_config(**{'upload.compress': 'qsgd', 'upload.bits': 4}))
  validate.validate_config(small_config(**{'system.speed': 'lognormal', 'system.speed_sigma': 2.0}))
  with pytest.raises(validate.ConfigError, match=r"client\.sam_every=3 .* client\.optimizer='sam_every'"):
    validate.validate_config(small_config(**{'client.optimizer': 'sam', 'client.sam_every': 3}))
