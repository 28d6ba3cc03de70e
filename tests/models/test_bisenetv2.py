"""BiSeNetV2 (models/bisenetv2.py): parameter counts equal the reference PyTorch modules' (measured by
instantiating them; benchmarks/reference/bisenetv2_reference.py compares outputs with copied weights), output shapes of
the main and booster heads, the torch-semantics helpers (pixel shuffle, align_corners upsampling), the
depthwise im2col lowering, rematerialisation (same values and gradients) and a short Trainer run."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.tasks import segmentation as seg_tasks
from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.models import bisenetv2 as B
from fedjax_flat.models import registry
from fedjax_flat.models.base import num_params, num_trainable_params
from fedjax_flat.models.layers import Conv
from tests.fixtures import arrays


def _shapes(variant='feddrive', classes=19, norm='bn', aux=True, hw=(64, 128)):
  m = registry.get_model('bisenetv2', classes, hw + (3,), variant=variant, norm=norm, aux=aux)
  return m, jax.eval_shape(lambda: m.init(jax.random.key(0), jnp.zeros((1,) + hw + (3,))))


@pytest.mark.parametrize('variant,classes,aux,expected', [
    ('feddrive', 19, True, 8_196_416), ('feddrive', 19, False, 4_585_552), ('feddrive', 16, True, 7_473_296),
    ('feddrive', 16, False, 4_388_752), ('coincheung', 19, True, 5_231_487), ('coincheung', 19, False, 3_358_627)])
def test_parameter_count_equals_the_reference(variant, classes, aux, expected):
  _, p = _shapes(variant, classes, aux=aux)
  assert num_trainable_params(p) == expected
  # Running statistics (torch buffers running_mean + running_var): 17,328 without the booster heads.
  assert num_params(p['batch_stats']) == ({'feddrive': 18_352, 'coincheung': 21_072}[variant] if aux else 17_328)


def test_parts_and_groupnorm():
  _, p = _shapes()
  parts = {k: num_params(v) for k, v in p['params'].items()}
  assert parts['detail'] == 519_232 and parts['bga'] == 478_720 and parts['head'] == 2_428_096
  assert sum(v for k, v in parts.items() if k.startswith('segment_')) == 1_159_504
  assert [parts[f'aux{i}'] for i in ('2', '3', '4', '5_4')] == [57_904, 193_984, 701_440, 2_657_536]
  m, g = _shapes(norm='gn')
  assert not m.batch_stats and num_params(g) == 8_196_416          # GN: same affine params, no statistics
  with pytest.raises(ValueError, match='gn_groups=16'):
    registry.get_model('bisenetv2', 19, (64, 64, 3), norm='gn', gn_groups=16)


@pytest.mark.parametrize('variant', ['feddrive', 'coincheung'])
def test_output_shapes_main_and_booster_heads(variant):
  m, p = _shapes(variant, 5)
  x = jnp.zeros((2, 64, 128, 3))
  train = jax.eval_shape(lambda q: m.apply(q, x, train=True, rng=jax.random.key(0), with_batch_stats=True), p)
  heads, stats = train
  assert len(heads) == 5 and all(h.shape == (2, 64, 128, 5) for h in heads)
  assert jax.tree_util.tree_structure(stats) == jax.tree_util.tree_structure(p['batch_stats'])
  assert jax.eval_shape(lambda q: m.apply(q, x), p).shape == (2, 64, 128, 5)        # evaluation: main head only
  with pytest.raises(ValueError, match='divisible by 32'):
    jax.eval_shape(lambda q: m.apply(q, jnp.zeros((1, 48, 64, 3))), p)


def test_torch_semantics_of_the_resampling_helpers():
  torch = pytest.importorskip('torch')
  rng = np.random.default_rng(0)
  x = rng.normal(0, 1, (2, 3, 5, 4 * 9)).astype(np.float32)       # NHWC, 4 classes x 3^2
  ref = torch.nn.functional.pixel_shuffle(torch.from_numpy(x.transpose(0, 3, 1, 2)), 3).numpy()
  np.testing.assert_array_equal(np.asarray(B.pixel_shuffle(jnp.asarray(x), 3)), ref.transpose(0, 2, 3, 1))
  y = rng.normal(0, 1, (1, 4, 6, 2)).astype(np.float32)
  yt = torch.from_numpy(y.transpose(0, 3, 1, 2))
  ac = torch.nn.functional.interpolate(yt, scale_factor=4, mode='bilinear', align_corners=True).numpy()
  np.testing.assert_allclose(np.asarray(B.upsample_bilinear_align_corners(jnp.asarray(y), 4)),
                             ac.transpose(0, 2, 3, 1), atol=1e-5)
  hp = torch.nn.functional.interpolate(yt, scale_factor=4, mode='bilinear', align_corners=False).numpy()
  np.testing.assert_allclose(np.asarray(B.upsample_bilinear(jnp.asarray(y), 4)), hp.transpose(0, 2, 3, 1), atol=1e-5)
  nn_ = torch.nn.functional.interpolate(yt, scale_factor=4, mode='nearest').numpy()
  np.testing.assert_array_equal(np.asarray(B.upsample_nearest(jnp.asarray(y), 4)), nn_.transpose(0, 2, 3, 1))


@pytest.mark.parametrize('stride,mult', [(1, 6), (2, 6), (2, 1)])
def test_depthwise_im2col_equals_lax(stride, mult):
  x = arrays.normal(0, (2, 10, 12, 4))
  a = Conv(4 * mult, (3, 3), strides=stride, feature_group_count=4, conv_impl='lax')
  b = Conv(4 * mult, (3, 3), strides=stride, feature_group_count=4, conv_impl='im2col')
  p = a.init(jax.random.key(1), x)
  np.testing.assert_allclose(b.apply(p, x), a.apply(p, x), atol=1e-5)
  ga = jax.grad(lambda q: jnp.sum(jnp.sin(a.apply(q, x))))(p)['params']['kernel']
  gb = jax.grad(lambda q: jnp.sum(jnp.sin(b.apply(q, x))))(p)['params']['kernel']
  np.testing.assert_allclose(gb, ga, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_remat_gives_the_same_loss_and_gradients():
  task = seg_tasks.Segmentation()
  batch = {'x': arrays.normal(0, (2, 32, 64, 3)),
           'y': jax.random.randint(jax.random.key(1), (2, 32, 64), 0, 4), 'mask': jnp.array([1.0, 0.0])}
  out = []
  for remat in (False, True):
    m = registry.get_model('bisenetv2', 4, (32, 64, 3), remat=remat)
    p = m.init(jax.random.key(0), jnp.zeros((1, 32, 64, 3)))
    loss = local_lib.make_loss(m, task=task)
    (v, aux), g = jax.jit(jax.value_and_grad(lambda q: loss(q, batch), has_aux=True))(p)
    out.append((v, g, aux[2]))
  np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-5)
  # Recomputed activations fuse differently, and the normalizations amplify fp32 rounding: against each leaf's
  # own scale the two agree to 4e-4 in fp32 (to 1e-12 in float64, where remat is exact); biases before a norm
  # have ~0 gradients (noise), hence the scale of the leaf, not elementwise rtol.
  for a, b in zip(jax.tree_util.tree_leaves(out[0][1:]), jax.tree_util.tree_leaves(out[1][1:])):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.max(np.abs(a - b)) <= 2e-3 * np.max(np.abs(a)) + 1e-5


@pytest.mark.slow
def test_trainer_rounds_with_bisenetv2(tmp_path):
  from tests.fixtures.seg_model import seg_data
  from fedjax_flat.training import trainers
  from fedjax_flat.config.default_config import default_config
  c = default_config()
  c.model, c.algorithm = 'bisenetv2', 'silobn'
  c.client.optimizer, c.client.rho, c.client.lr, c.client.momentum, c.client.batch_size = 'sam', 0.01, 0.05, 0.9, 2
  c.rounds, c.clients_per_round, c.eval_every, c.eval_batch_size = 2, 2, 1, 2
  c.segmentation.predictions = 2
  tr = trainers.make_trainer(c, str(tmp_path), data=seg_data(hw=(32, 32), sizes=(2, 3, 2, 3)))
  tr.train()
  assert 0 <= tr.records[-1]['test_unseen_miou'] <= 1 and (tmp_path / 'predictions.png').exists()
