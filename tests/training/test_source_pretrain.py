"""Source pre-training (training/source_pretrain.py): it learns the source, is a function of the seed, restyles
with the bank when given one, and its checkpoint round-trips through the params file with shape checks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.data.sources import seg_synthetic_da as D
from fedjax_flat.data.transforms import fda
from fedjax_flat.models.registry import get_model
from fedjax_flat.training import source_pretrain as P


@pytest.fixture(scope='module')
def setup():
  ds = D.load(num_styles=2, clients_per_style=2, examples_per_client=4, source_examples=16, test_per_style=2,
              image_size=(16, 16))
  model = get_model('seg_cnn', num_classes=4, input_shape=(16, 16, 3), width=4)
  params0 = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 16, 16, 3)))
  return ds, model, params0


def test_pretraining_learns_and_is_deterministic(setup):
  ds, model, params0 = setup
  a, losses = P.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=40, batch_size=8, lr=0.05, seed=3)
  b, _ = P.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=40, batch_size=8, lr=0.05, seed=3)
  assert losses.shape == (40,) and np.all(np.isfinite(losses))
  assert losses[-10:].mean() < 0.8 * losses[:5].mean()
  for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  # BatchNorm statistics moved away from their initial values (written after each step).
  assert not np.allclose(np.asarray(jax.tree_util.tree_leaves(a['batch_stats'])[0]),
                         np.asarray(jax.tree_util.tree_leaves(params0['batch_stats'])[0]))


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_style_bank_changes_the_training(setup):
  ds, model, params0 = setup
  styles = fda.client_styles(ds)
  plain, _ = P.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=3, batch_size=4, seed=0)
  styled, _ = P.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=3, batch_size=4, seed=0,
                                styles=styles)
  diff = [not np.allclose(np.asarray(u), np.asarray(v))
          for u, v in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(styled))]
  assert any(diff)
  with pytest.raises(ValueError, match='steps=0'):
    P.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=0)


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_checkpoint_round_trip(setup, tmp_path):
  ds, model, params0 = setup
  trained, _ = P.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=2, batch_size=4)
  path = str(tmp_path / 'source.npz')
  P.save_source_model(path, trained)
  back = P.load_source_model(model, params0, path)
  for u, v in zip(jax.tree_util.tree_leaves(trained), jax.tree_util.tree_leaves(back)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  other = get_model('seg_cnn', num_classes=4, input_shape=(16, 16, 3), width=8)
  with pytest.raises(ValueError):
    P.load_source_model(other, other.init(jax.random.PRNGKey(0), jnp.zeros((1, 16, 16, 3))), path)
