"""The synthetic domain-shift segmentation set, and the segmentation config fields (declared, validated, used)."""
import inspect
import math

import jax
import numpy as np
import pytest

from fedjax_flat.data import registry

from fedjax_flat.data.sources import seg_synthetic
from fedjax_flat.data.transforms import pipeline as transforms
from fedjax_flat.config import validate
from fedjax_flat.config.default_config import default_config, segmentation_data
from fedjax_flat.data import registry as data_registry

SMALL = dict(num_domains=4, unseen_domains=1, clients_per_domain=2, examples_per_client=6, client_test_examples=2,
             unseen_test_per_domain=5, image_size=(32, 48))


def test_deterministic_from_seed():
  a, b = seg_synthetic.load(**SMALL, seed=3), seg_synthetic.load(**SMALL, seed=3)
  c = seg_synthetic.load(**SMALL, seed=4)
  for f in ('x', 'y', 'test_x', 'test_y', 'client_index', 'test_population_index'):
    np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
  assert not np.array_equal(a.x, c.x) and not np.array_equal(a.y, c.y)


def test_layout_labels_and_domains():
  ds = seg_synthetic.load(**SMALL)
  assert ds.num_clients == 6 and ds.x.shape == (36, 32, 48, 3) and ds.y.shape == (36, 32, 48)
  assert ds.x.dtype == np.uint8 and ds.y.dtype == np.uint8 and ds.num_classes == 4
  assert set(np.unique(ds.y)) == {0, 1, 2, 3, 255} and ds.ignore_index == 255 and ds.label_shape == (32, 48)
  # Ignore pixels sit on shape borders only: every 255 pixel touches a different label.
  y = ds.y[0].astype(int)
  for r, c in zip(*np.nonzero(y == 255)):
    nb = [y[rr, cc] for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)) if 0 <= rr < 32 and 0 <= cc < 48]
    assert any(v != 255 for v in nb)
  # Heterogeneous: one domain per client; the unseen domain never trains.
  np.testing.assert_array_equal(ds.client_domain, [0, 0, 1, 1, 2, 2])
  assert ds.unseen_domain_ids == [3] and 3 not in ds.client_domain
  assert ds.test_client_names == ['seen', 'unseen'] and ds.num_test_clients == 2
  seen_x, seen_y = ds.test_client_examples(0)
  unseen_x, _ = ds.test_client_examples(1)
  assert len(seen_x) == 12 and len(unseen_x) == 5
  np.testing.assert_array_equal(seen_x, np.concatenate([ds.client_test_examples(k)[0] for k in range(6)]))
  pop = ds.test_population_index
  assert set(ds.test_domain[pop[:12]]) == {0, 1, 2} and set(ds.test_domain[pop[12:]]) == {3}
  # Domain styles shift the colours: per-domain mean colours differ more than within a domain.
  means = np.array([ds.client_examples(k)[0].reshape(-1, 3).mean(0) for k in range(6)])
  within = np.abs(means[0::2] - means[1::2]).mean()
  across = np.abs(means[0] - means[2]).mean() + np.abs(means[2] - means[4]).mean()
  assert across / 2 > within


def test_registry_builds_from_the_declared_config():
  cfg = segmentation_data('seg_synthetic', **SMALL)
  ds = registry.get_dataset('seg_synthetic', **cfg.to_dict())
  assert ds.num_clients == 6


def test_builder_defaults_equal_declared_defaults():
  from fedjax_flat.data.sources import cityscapes, idda
  for name, fn in (('cityscapes', cityscapes._cityscapes), ('idda', idda._idda),
                   ('seg_synthetic', seg_synthetic._seg_synthetic)):
    declared = data_registry.declared_fields(name)
    for p in inspect.signature(fn).parameters.values():
      if p.kind is p.VAR_KEYWORD:
        continue
      assert p.name in declared, (name, p.name)
      assert tuple(declared[p.name]) == tuple(p.default) if isinstance(p.default, tuple) else \
          declared[p.name] == p.default, (name, p.name)


def _seg_config(dataset='seg_synthetic', **data):
  c = default_config()
  c.dataset = dataset
  c.data = segmentation_data(dataset, **data)
  c.augment = 'segmentation'
  c.normalize = 'feddrive'
  return c


@pytest.mark.parametrize('dataset', data_registry.declaring_datasets())
def test_declared_defaults_validate(dataset):
  validate.validate_config(_seg_config(dataset))


@pytest.mark.parametrize('field,value', [
    ('jitter', math.nan), ('jitter', math.inf), ('scale', (2.0, 1.0)), ('scale', (0.5, math.nan)),
    ('crop', (0, 8)), ('crop', (8,)), ('style', 'fda'), ('style_fraction', 1.5), ('cfsi_window', 0.0),
    ('scale_mode', 'rrc'), ('flip', 1), ('image_size', (4, 4)), ('unseen_domains', 6), ('class_alpha', math.nan),
    ('seed', -1)])
def test_bad_fields_are_config_errors(field, value):
  # NaN / inf anywhere are refused first, naming the element (data.scale[1]=nan)
  with pytest.raises(validate.ConfigError, match=rf'config\.data\.{field}(\[\d\])?='):
    validate.validate_config(_seg_config(**{field: value}))


def test_unknown_fields_and_augment_pairing():
  c = _seg_config()
  c.data.crops = (8, 8)
  with pytest.raises(validate.ConfigError, match=r'config\.data\.crops=.*its fields'):
    validate.validate_config(c)
  for dataset, field, value in (('cityscapes', 'distribution', 'iid'), ('idda', 'setting', 'snowy'),
                                ('idda', 'split_source', 'web'), ('cityscapes', 'num_workers', 0)):
    with pytest.raises(validate.ConfigError, match=rf'config\.data\.{field}='):
      validate.validate_config(_seg_config(dataset, **{field: value}))
  c = _seg_config()
  c.augment = 'cifar'
  with pytest.raises(validate.ConfigError, match=r'config\.augment='):
    validate.validate_config(c)
  c = _seg_config(style='lab')
  c.augment = 'none'
  with pytest.raises(validate.ConfigError, match=r'config\.data\.style='):
    validate.validate_config(c)
  c = default_config()
  c.augment = 'segmentation'
  with pytest.raises(validate.ConfigError, match=r'config\.augment=.*segmentation datasets'):
    validate.validate_config(c)


def test_transforms_build_the_style_bank_and_run():
  cfg = _seg_config(**SMALL, style='lab', crop=(24, 24))
  ds = registry.get_dataset('seg_synthetic', **cfg.data.to_dict())
  train, pre = transforms.make_transforms(cfg, ds.num_classes, data=ds)
  assert train.needs_client and train.style_bank.kind == 'lab' and train.style_bank.nbytes == 36 * 24
  x, y = ds.client_examples(0)
  out = jax.jit(train)(jax.random.PRNGKey(0), {'x': x[:4], 'y': y[:4], 'mask': np.ones(4, np.float32)})
  assert out['x'].shape == (4, 24, 24, 3) and out['y'].shape == (4, 24, 24)
  assert set(np.unique(np.asarray(out['y']))) <= {0, 1, 2, 3, 255}
  np.testing.assert_allclose(np.asarray(pre(x[:1])), x[:1] / 127.5 - 1.0, atol=1e-6)
  train_plain, _ = transforms.make_transforms(_seg_config(**SMALL), ds.num_classes)
  assert train_plain.style_bank is None


@pytest.mark.parametrize('name', ['cityscapes', 'idda', 'seg_synthetic'])
def test_every_declared_field_has_its_modules_rule(name):
  # A segmentation dataset's fields are checked by rules its module declares (data/registry.py `rules=`), the
  # shared augmentation rules (data/transforms/pipeline.py) and the split seed: none is left unchecked.
  from fedjax_flat.data.transforms.pipeline import SEG_AUGMENT_RULES
  own = data_registry.DATASETS.meta(name, 'rules')
  unchecked = set(data_registry.declared_fields(name)) - set(own) - set(SEG_AUGMENT_RULES) - {'seed'}
  assert not unchecked, unchecked
  for k, rule in own.items():   # the declared default passes its own rule
    assert rule.why_not(data_registry.declared_fields(name)[k]) is None, (name, k)


def test_dataset_rules_must_be_schema_rules():
  with pytest.raises(TypeError, match=r"rules\['n'\] must be a fedjax_flat.schema rule"):
    data_registry.register('tuple_rules_refused', rules={'n': ('int', 0, False, None, False, 'n')})(lambda: None)
  assert 'tuple_rules_refused' not in data_registry.names()


def test_limits_are_stored_as_schema_rules():
  limit = data_registry.DATASETS.meta('camelyon17', 'limits')['num_clients']
  assert limit.why_not(5) is None
  assert limit.why_not(4) == "dataset 'camelyon17' needs 5 <= num_clients <= 5 (the five hospitals)"
