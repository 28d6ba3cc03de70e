"""The config schema: the sections' declarations give default_config, validation and the kind tables."""
import math
import os

import ml_collections
import pytest

from fedjax_flat import schema
from fedjax_flat.config import data_fields
from fedjax_flat.config import schema as config_schema
from fedjax_flat.config.default_config import WHOLE_SECTIONS, default_config
from fedjax_flat.core import runs
from fedjax_flat.errors import ConfigError
from fedjax_flat.sweeps import report
from fedjax_flat.training import checkpoint
from tests.fixtures.paths import REPO


def _leaves(d, prefix=''):
  out = []
  for k, v in d.items():
    if isinstance(v, dict) and k not in ('data', 'model_kwargs', 'algo', 'published', 'probe_model_kwargs'):
      out += _leaves(v, f'{prefix}{k}.')
    else:
      out.append(prefix + k)
  return out


def test_every_default_field_is_declared_once_with_its_default():
  declared = {s.path(f): f for s in config_schema.SCHEMA for f in s.fields}
  cfg = default_config()
  leaves = _leaves(cfg.to_dict())
  assert sorted(leaves) == sorted(declared)
  for path in leaves:
    f = declared[path]
    if f.rule is not None:
      node = cfg
      for p in path.split('.'):
        node = node[p]
      assert node == f.rule.default, path
      assert f.rule.why_not(f.rule.default) is None, path   # every default passes its own rule


def test_kind_tables_follow_the_tags():
  # What each table held when it was written by hand: the tags must keep saying the same.
  assert checkpoint.COMPUTATION_FIELDS == (
      'seed', 'dataset', 'data', 'model', 'model_kwargs', 'augment', 'normalize', 'algorithm', 'algo',
      'clients_per_round', 'sampler', 'client', 'server', 'swa', 'wima', 'dp', 'man', 'engine.compute_dtype', 'system',
      'upload', 'attack')
  assert checkpoint.WARN_FIELDS == ('rounds', 'engine')
  assert checkpoint.SAME_RESULT_FIELDS == ('engine.rounds_per_call', 'engine.device_data', 'engine.device_data_max_mb',
                                         'engine.stacked_max_mb')
  assert set(WHOLE_SECTIONS) == {'data', 'model_kwargs', 'algo', 'published', 'grouping.probe_model_kwargs'}
  assert set(runs.VALUE_FIELDS) == {'client.lr', 'client.rho', 'client.rho0', 'client.momentum',
                                    'client.weight_decay', 'client.asam_eta', 'client.sam_every', 'client.looksam_k',
                                    'client.looksam_alpha', 'client.ascent_fraction', 'server.lr',
                                    'server.momentum',
                                    'swa.lr1', 'swa.lr2', 'wima.window', 'wima.subset', 'dp.clip',
                                    'dp.noise_multiplier', 'dp.target_epsilon', 'upload.fraction', 'upload.bits',
                                    'attack.scale'}
  assert runs.STATIC_TRUTH == ('client.momentum', 'client.weight_decay', 'server.momentum', 'dp.target_epsilon')
  assert report.RESULT_KEYS == {'engine.compute_dtype': 'float32'}
  assert set(report.EXECUTION_KEYS) == {
      'seed', 'host_devices', 'published', 'progress_every_s', 'checkpoint_every', 'keep_checkpoints', 'keep_rounds',
      'eval_batch_size', 'engine', 'client_state_store', 'client_state_device_max_mb', 'client_state_host_max_mb',
      'data.data_dir'}


def test_run_inputs_and_ignored_fields_equal_their_tags():
  # core/runs.py sits below config/: its INPUT / LOG tables are written there and checked here.
  everything = config_schema.SCHEMA
  assert runs.INPUT_FIELDS == schema.tagged(everything, schema.INPUT) + data_fields.tagged(schema.INPUT)
  assert runs.IGNORED_FIELDS == schema.tagged(everything, schema.LOG)
  assert runs.VALUE_FIELDS == schema.tagged(everything, schema.VALUE)
  assert runs.STATIC_TRUTH == schema.tagged(everything, schema.TRUTH)


@pytest.mark.parametrize('rule,value,why', [
    (schema.Num(1.0, lo=0, lo_open=True), 0.0, 'must be > 0'),
    (schema.Num(0.5, lo=0, hi=1, hi_open=True), 1.0, 'must be < 1'),
    (schema.Num(1.0, lo=0), 'x', 'must be a number'),
    (schema.Num(1.0, lo=0), math.inf, 'must be a finite number'),
    (schema.Int(1, lo=1), 1.5, 'must be an integer'),
    (schema.Int(1, lo=1), True, 'must be an integer'),
    (schema.Int(1, lo=0, hi=64), 65, 'must be <= 64'),
    (schema.Number(0.0, lo=0), -1, 'must be a number in [0, inf)'),
    (schema.Number(1.0, lo=0, lo_open=True, bound=True, finite=True), math.inf, 'must be a finite number > 0'),
    (schema.Integer(1, lo=1, note=' (x)'), 0, 'must be an integer >= 1 (x)'),
    (schema.Choice('b', ('b', 'a')), 'c', "allowed values: ['b', 'a']"),
    (schema.Choice('b', ('b', 'a'), sort=True), 'c', "allowed values: ['a', 'b']"),
    (schema.Flag(True), 1, 'must be True or False'),
    (schema.String('', 'must be a string (x)'), 3, 'must be a string (x)'),
    (schema.Pair((0, 0), lo_open=False, message='two'), (1, -1), 'two'),
    (schema.DataValue(0.5, 'number', 0, False, math.inf, False, 'w'), math.nan, 'must be finite (w)'),
    (schema.DataValue(1, 'int', 1, False, None, False, 'w'), 0, 'must be >= 1 (w)'),
])
def test_rules_say_why(rule, value, why):
  assert rule.why_not(value) == why
  assert rule.why_not(rule.default) is None


def test_data_value_allows_infinity_only_where_it_means_something():
  assert schema.DataValue(None, 'number', 0, False, math.inf, False, 'iid').why_not(math.inf) is None
  assert schema.DataValue(None, 'number', 0, False, None, False, 'x').why_not(math.inf) == 'must be finite (x)'


def test_a_new_field_is_one_declaration():
  # The field's default, rule, check order and kind all come from its one line.
  base = ml_collections.ConfigDict({'max_local_steps': 0, 'local_steps': 0})
  sec = schema.Section('client', (
      schema.Field('local_steps', schema.Int(0, lo=0), 'fixed steps'),
      schema.Field('max_local_steps', schema.Int(0, lo=0), 'cap', {schema.RESULT}),
  ))
  assert sec.build().to_dict() == base.to_dict()
  assert schema.tagged([sec], schema.RESULT) == ('client.max_local_steps',)
  assert schema.tagged([sec], schema.RESULT, top=True) == ('client',)
  cfg = ml_collections.ConfigDict({'client': {'local_steps': 0, 'max_local_steps': -1}})
  with pytest.raises(ConfigError, match=r'client\.max_local_steps=-1 is invalid: must be >= 0'):
    sec.validate(cfg)
  del cfg.client['max_local_steps']
  sec.validate(cfg)           # a config written before the field existed is still valid


def test_when_and_after_order():
  calls = []
  sec = schema.Section('s', (
      schema.Field('mode', schema.Choice('a', ('a', 'b')), '', after=lambda cfg: calls.append('after')),
      schema.Field('x', schema.Int(0, lo=0), '', when=lambda cfg: cfg.s.mode == 'b'),
  ), check=lambda cfg: calls.append('check'))
  sec.validate(ml_collections.ConfigDict({'s': {'mode': 'a', 'x': -1}}))   # x only checked in mode 'b'
  assert calls == ['after', 'check']
  with pytest.raises(ConfigError, match=r's\.x=-1'):
    sec.validate(ml_collections.ConfigDict({'s': {'mode': 'b', 'x': -1}}))


def test_field_reference_lists_every_field():
  lines = config_schema.field_reference()
  for s in config_schema.SCHEMA:
    for f in s.fields:
      assert any(line.startswith(f'| `{s.path(f)}` |') for line in lines), s.path(f)
  assert all(line.count(' | ') == 4 for line in lines[2:])     # 5 columns, no stray '|' in a cell


def test_unknown_tag_is_refused():
  with pytest.raises(ValueError, match='unknown tags'):
    schema.Field('x', schema.Flag(False), '', {'results'})


def test_configs_readme_holds_the_generated_field_reference():
  """Regenerate with `python -m fedjax_flat.config.table_index > configs/README.md` when this fails."""
  readme = open(os.path.join(REPO, 'configs', 'README.md')).read()
  assert '\n'.join(config_schema.field_reference()) in readme
  assert '\n'.join(config_schema.algo_reference()) in readme


def test_running_page_switch_table_names_every_config_section_and_cites_only_files_a_clone_has():
  # Issue 48: the switch table lacked dp.*, system.*, upload.*, engine.compute_dtype and the cheaper SAM clients,
  # and five rows cited ../shared/reference/*.md, which a clone does not have. The table is docs/running.md's.
  readme = open(os.path.join(REPO, 'docs', 'running.md')).read()
  start = readme.index('Composable switches')
  table = readme[start:readme.index('\n\n', readme.index('| what | config |', start))]
  missing = [s.name for s in config_schema.SCHEMA if s.name and f'`{s.name}.' not in table]
  assert not missing, f"docs/running.md's switch table names no field of {missing}"
  for key in ('engine.compute_dtype', 'sam_every', 'looksam', 'ksam', 'configs/README.md',
              'config_reference.md#field-reference'):
    assert key in table, key
  assert '## Field reference' in open(os.path.join(REPO, 'configs', 'README.md')).read()
  assert '../shared/' not in readme
