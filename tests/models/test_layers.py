"""Dense's kernel-gradient forms (models/layers.py `grad_impl`): 'direct' against autodiff's, and how it is chosen."""
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat import cpu_paths
from fedjax_flat.core import engine
from fedjax_flat.models import layers
from fedjax_flat.models.registry import get_model


def _dense(grad_impl, features=5):
  return layers.Dense(features, grad_impl=grad_impl)


@pytest.mark.parametrize('x_shape', [(10, 12), (4, 7, 6)])     # a batch; a batch of sequences (LSTM/transformer heads)
def test_direct_gradients_equal_autodiff(x_shape):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
  params = _dense('xla').init(jax.random.key(0), x)

  def grads(impl, batch1):
    loss = lambda p, x: jnp.sum(jnp.tanh(_dense(impl).apply(p, x)) ** 2)  # noqa: E731
    g = jax.grad(loss, argnums=(0, 1))
    if batch1:     # the engine's one-client CPU path: each step under a vmap over an axis of size 1
      g = engine.under_batch1(g)
    return jax.jit(g)(params, x)

  for batch1 in (False, True):
    ref, got = grads('xla', batch1), grads('direct', batch1)
    for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got)):
      assert a.shape == b.shape
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)
  # The forward pass is the same op in both forms.
  np.testing.assert_array_equal(_dense('direct').apply(params, x), _dense('xla').apply(params, x))


def test_direct_sgd_steps_of_the_pfl_cnn_equal_autodiffs():
  """Five SGD steps of the pfl CNN's client (B=10) run as the engine's sequential path runs them: the same
  parameters to fp32 rounding (bit for bit on the machines measured: benchmarks/robustness/bit_identity.py)."""
  rng = np.random.default_rng(1)
  xs = jnp.asarray(rng.standard_normal((5, 10, 32, 32, 3)), jnp.float32)
  ys = jnp.asarray(rng.integers(0, 10, (5, 10)), jnp.int32)

  def run(impl):
    model = get_model('pfl_cnn', 10, (32, 32, 3), dropout=False)
    params = model.init(jax.random.key(0), xs[0])

    def loss(p, x, y):
      logits = model.apply(p, x, train=True)
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    def step(p, b):
      g = engine.under_batch1(jax.grad(loss))(p, b[0], b[1])
      return jax.tree_util.tree_map(lambda a, d: a - 0.1 * d, p, g), None

    with pytest.MonkeyPatch.context() as m:
      m.setenv(cpu_paths.ENV, 'dense_direct' if impl == 'direct' else 'default')
      program = str(jax.make_jaxpr(lambda p: step(p, (xs[0], ys[0])))(params))
      return jax.jit(lambda p: jax.lax.scan(step, p, (xs, ys))[0])(params), program

  (ref, ref_program), (got, got_program) = run('xla'), run('direct')
  assert ref_program != got_program              # the path really changes the traced step
  for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)


def test_direct_has_no_forward_mode_outside_autodiff_dense():
  x = jnp.ones((3, 4), jnp.float32)
  params = _dense('direct').init(jax.random.key(0), x)
  f = lambda x: _dense('direct').apply(params, x)  # noqa: E731
  with pytest.raises(TypeError, match='forward-mode'):
    jax.jvp(f, (x,), (x,))
  with layers.autodiff_dense():
    out, tangent = jax.jvp(f, (x,), (x,))
  ref = jax.jvp(lambda x: _dense('xla').apply(params, x), (x,), (x,))
  np.testing.assert_array_equal(tangent, ref[1])
  np.testing.assert_array_equal(out, ref[0])


def test_hvps_and_hessians_work_under_direct():
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.standard_normal((6, 4)), jnp.float32)
  params = _dense('xla', 3).init(jax.random.key(0), x)
  flat, unravel = jax.flatten_util.ravel_pytree(params)
  v = jnp.asarray(rng.standard_normal(flat.shape), jnp.float32)

  def hvp_and_hessian(impl):
    loss = lambda w: jnp.sum(jnp.tanh(_dense(impl, 3).apply(unravel(w), x)) ** 2)  # noqa: E731
    hv = jax.jvp(jax.grad(loss), (flat,), (v,))[1]          # forward-over-reverse, as analysis/hvp.py
    return hv, jax.hessian(loss)(flat)

  for a, b in zip(hvp_and_hessian('xla'), hvp_and_hessian('direct')):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_auto_follows_the_cpu_path(monkeypatch):
  monkeypatch.delenv(cpu_paths.ENV, raising=False)
  assert layers.resolve_grad_impl('auto') == 'xla'          # the default: every earlier run's program
  monkeypatch.setenv(cpu_paths.ENV, 'default')
  assert layers.resolve_grad_impl('auto') == 'xla'
  monkeypatch.setenv(cpu_paths.ENV, 'dense_direct')
  assert layers.resolve_grad_impl('auto') == ('direct' if jax.default_backend() == 'cpu' else 'xla')
  with layers.autodiff_dense():
    assert layers.resolve_grad_impl('auto') == 'xla' and layers.resolve_grad_impl('direct') == 'xla'
  assert layers.resolve_grad_impl('xla') == 'xla'
  with pytest.raises(ValueError, match="grad_impl='dense'"):
    layers.resolve_grad_impl('dense')


def test_dense_direct_is_a_path_with_a_program_option():
  assert cpu_paths.flags_of('dense_direct') == ''
  assert cpu_paths.program_option('dense_grad', 'xla', {cpu_paths.ENV: 'dense_direct'}) == 'direct'
  assert cpu_paths.program_option('dense_grad', 'xla', {cpu_paths.ENV: 'onednn'}) == 'xla'
  env = {}
  rec = cpu_paths.configure('dense_direct', env, jax_started=True)   # trace time: applies after jax started too
  assert rec['path'] == 'dense_direct' and env[cpu_paths.ENV] == 'dense_direct' and 'XLA_FLAGS' not in env

