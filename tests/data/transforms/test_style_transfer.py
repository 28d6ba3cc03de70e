"""CFSI and LAB style transfer: jnp against independent numpy formulas, value ranges, the bank and its size."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.data.sources import seg_synthetic
from fedjax_flat.data.transforms import style_transfer as S

KEY = jax.random.PRNGKey(0)

# ------------------------------------------------------------------------ independent numpy references

# sRGB primaries and the reference white, from which the RGB -> XYZ matrix is derived (not copied).
_PRIMARIES = {'r': (0.64, 0.33), 'g': (0.30, 0.60), 'b': (0.15, 0.06)}
_WHITE = np.array([0.95047, 1.0, 1.08883])
_EPS, _KAPPA = 216 / 24389, 24389 / 27          # CIE standard constants (Lindbloom's formulation)


def _rgb_to_xyz_matrix():
  p = np.array([[x / y, 1.0, (1 - x - y) / y] for x, y in _PRIMARIES.values()]).T   # columns: XYZ of R, G, B
  return p * np.linalg.solve(p, _WHITE)[None, :]


def np_rgb_to_lab(rgb):
  rgb = np.asarray(rgb, np.float64)
  lin = np.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
  t = (lin @ _rgb_to_xyz_matrix().T) / _WHITE
  f = np.where(t > _EPS, np.cbrt(t), (_KAPPA * t + 16) / 116)
  return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1)


def np_lab_to_rgb(lab):
  lab = np.asarray(lab, np.float64)
  fy = (lab[..., 0] + 16) / 116
  fx, fz = fy + lab[..., 1] / 500, fy - lab[..., 2] / 200
  xr = np.where(fx ** 3 > _EPS, fx ** 3, (116 * fx - 16) / _KAPPA)
  yr = np.where(lab[..., 0] > _KAPPA * _EPS, fy ** 3, lab[..., 0] / _KAPPA)
  zr = np.where(fz ** 3 > _EPS, fz ** 3, (116 * fz - 16) / _KAPPA)
  lin = np.clip((np.stack([xr, yr, zr], -1) * _WHITE) @ np.linalg.inv(_rgb_to_xyz_matrix()).T, 0, 1)
  return np.clip(np.where(lin > 0.0031308, 1.055 * lin ** (1 / 2.4) - 0.055, 12.92 * lin), 0, 1)


def np_cfsi(x, target_image, lam, alpha=0.05):
  """The FedDrive release's CFSI steps, in numpy float64, with the target's *full* amplitude spectrum."""
  f = np.fft.fft2(x, axes=(0, 1))
  amp, pha = np.abs(f), np.angle(f)
  a_local = np.fft.fftshift(amp, axes=(0, 1))
  a_trg = np.fft.fftshift(np.abs(np.fft.fft2(target_image, axes=(0, 1))), axes=(0, 1))
  h, w, _ = x.shape
  hl, wl = int(np.floor(h * alpha)), int(np.floor(w * alpha))
  ch, cw = h // 2, w // 2
  win = (slice(ch - hl, ch + hl + 1), slice(cw - wl, cw + wl + 1))
  a_local[win] = a_local[win] * (1 - lam) + a_trg[win] * lam
  out = np.abs(np.fft.ifft2(np.fft.ifftshift(a_local, axes=(0, 1)) * np.exp(1j * pha), axes=(0, 1)))
  return np.clip(out, 0, 1)


def _images(n=3, h=40, w=60, seed=0):
  rng = np.random.default_rng(seed)
  base = rng.random((n, 1, 1, 3)) * 0.6 + 0.2
  yy, xx = np.mgrid[0:h, 0:w]
  tex = 0.15 * np.sin(0.3 * xx + 0.2 * yy)[None, :, :, None] + 0.05 * rng.standard_normal((n, h, w, 3))
  return np.clip(base + tex, 0, 1).astype(np.float32)


# ------------------------------------------------------------------------------------------ LAB

def test_matrix_and_lab_anchor_values():
  np.testing.assert_allclose(_rgb_to_xyz_matrix(), S._RGB2XYZ, atol=2e-4)
  lab = np.asarray(jax.jit(S.rgb_to_lab)(jnp.array([[1., 1., 1.], [1., 0., 0.], [0., 1., 0.], [0., 0., 1.],
                                                    [0., 0., 0.]])))
  # Published sRGB (D65) values: white, red, green, blue, black.
  np.testing.assert_allclose(lab, [[100, 0, 0], [53.2408, 80.0925, 67.2032], [87.7347, -86.1827, 83.1793],
                                   [32.2970, 79.1875, -107.8602], [0, 0, 0]], atol=0.01)


def test_rgb_lab_against_numpy_and_roundtrip():
  rgb = np.random.default_rng(1).random((500, 3)).astype(np.float32)
  rgb[:5] = [[0.001, 0.002, 0.0], [0.04, 0.03, 0.05], [1, 1, 1], [0.5, 0.5, 0.5], [0, 0, 0]]   # both curve branches
  lab = np.asarray(jax.jit(S.rgb_to_lab)(rgb))
  np.testing.assert_allclose(lab, np_rgb_to_lab(rgb), atol=2e-3)
  np.testing.assert_allclose(np.asarray(jax.jit(S.lab_to_rgb)(lab)), rgb, atol=2e-4)
  lab_box = np.stack([np.linspace(0, 100, 64), np.linspace(-60, 60, 64), np.linspace(50, -50, 64)], -1)
  np.testing.assert_allclose(np.asarray(jax.jit(S.lab_to_rgb)(lab_box.astype(np.float32))), np_lab_to_rgb(lab_box),
                             atol=1e-3)


def test_lab_transfer_equals_formula_and_identity():
  x, t = _images(2)
  target = np.stack([np_rgb_to_lab(t).mean((0, 1)), np_rgb_to_lab(t).std((0, 1))])
  out = np.asarray(jax.jit(S.lab_transfer)(x, target.astype(np.float32)))
  lab = np_rgb_to_lab(x)
  ref = (lab - lab.mean((0, 1))) / lab.std((0, 1)) * target[1] + target[0]
  ref = np_lab_to_rgb(np.clip(ref, [0, -128, -128], [100, 127, 127]))
  assert out.shape == x.shape and out.dtype == np.float32 and out.min() >= 0 and out.max() <= 1
  np.testing.assert_allclose(out, ref, atol=2e-3)
  # The transferred image has the target's LAB moments (up to gamut clipping), and own moments = identity.
  got = np_rgb_to_lab(out)
  np.testing.assert_allclose(got.mean((0, 1)), target[0], atol=1.5)     # a few pixels leave the sRGB gamut
  np.testing.assert_allclose(got.std((0, 1)), target[1], atol=1.5)
  own = np.asarray(jax.jit(S.lab_moments)(x[None]))[0]
  np.testing.assert_allclose(np.asarray(jax.jit(S.lab_transfer)(x, own)), x, atol=2e-4)
  flat = np.full((8, 8, 3), 0.5, np.float32)       # sigma_S = 0: no NaN, the channel becomes mu_T
  assert np.isfinite(np.asarray(jax.jit(S.lab_transfer)(flat, target.astype(np.float32)))).all()


# ------------------------------------------------------------------------------------------ CFSI

def test_cfsi_equals_release_formula():
  x, t, u = _images(3)
  amp = np.asarray(jax.jit(S.amplitude_window)(t[None]))[0]
  assert amp.shape == (2 * 2 + 1, 2 * 3 + 1, 3)          # floor(0.05 * 40) = 2, floor(0.05 * 60) = 3
  f = jax.jit(S.cfsi)
  for lam in (0.0, 0.3, 1.0):
    out = np.asarray(f(x, amp, lam))
    assert out.shape == x.shape and out.dtype == np.float32 and out.min() >= 0 and out.max() <= 1
    np.testing.assert_allclose(out, np_cfsi(x.astype(np.float64), t.astype(np.float64), lam), atol=1e-4)
  np.testing.assert_allclose(np.asarray(f(x, amp, 0.0)), x, atol=1e-5)           # lambda = 0: unchanged
  own = np.asarray(jax.jit(S.amplitude_window)(x[None]))[0]
  np.testing.assert_allclose(np.asarray(f(x, own, 0.7)), x, atol=1e-5)           # own amplitude: unchanged
  assert np.abs(np.asarray(f(x, amp, 1.0)) - x).mean() > 1e-3
  # Only the low frequencies move: the phase and the amplitude outside the window are the image's own.
  out = np.asarray(f(x, np.asarray(jax.jit(S.amplitude_window)(u[None]))[0], 1.0)).astype(np.float64)
  fo = np.fft.fftshift(np.fft.fft2(out, axes=(0, 1)), axes=(0, 1))
  fx = np.fft.fftshift(np.fft.fft2(x, axes=(0, 1)), axes=(0, 1))
  far = np.ones((40, 60), bool)
  far[12:29, 18:43] = False
  assert np.abs(np.abs(fo) - np.abs(fx))[far].mean() < 0.05 * np.abs(fx)[far].mean()


# ------------------------------------------------------------------------------------------ bank

@pytest.fixture(scope='module')
def synth():
  return seg_synthetic.load(num_domains=3, unseen_domains=1, clients_per_domain=2, examples_per_client=5,
                            client_test_examples=1, unseen_test_per_domain=2, image_size=(24, 40))


def test_bank_entries_owners_and_bytes(synth):
  lab = S.build_style_bank('lab', synth, batch_size=4)
  assert lab.entries.shape == (20, 2, 3) and lab.entry_bytes == 24 and lab.nbytes == 20 * 24
  np.testing.assert_array_equal(lab.owners, np.repeat(np.arange(4), 5))
  np.testing.assert_array_equal(lab.upload_bytes, [5 * 24] * 4)
  x0, _ = synth.client_examples(0)
  np.testing.assert_allclose(lab.entries[:5], np.asarray(S.lab_moments(x0.astype(np.float32) / 255)), atol=1e-4)
  cf = S.build_style_bank('cfsi', synth, max_per_client=3)
  assert cf.entries.shape == (12, 2 * 1 + 1, 2 * 2 + 1, 3) and cf.image_shape == (24, 40)
  assert cf.entry_bytes == 3 * 5 * 3 * 4 and cf.nbytes == 12 * cf.entry_bytes
  np.testing.assert_array_equal(cf.upload_bytes, [3 * cf.entry_bytes] * 4)
  s = cf.summary()
  assert s['total_bytes'] == cf.nbytes and s['kind'] == 'cfsi'
  with pytest.raises(ValueError, match='cfsi, lab'):
    S.build_style_bank('fda', synth)


def test_subset_and_entry_sampling():
  mask = jnp.array([1, 1, 1, 0, 1, 1, 1, 0, 0, 1], jnp.float32)         # 7 valid
  f = jax.jit(lambda k: S.select_subset(k, mask, 0.5))
  picks = [np.asarray(f(jax.random.PRNGKey(i))) for i in range(20)]
  assert all(p.sum() == 4 and not p[np.asarray(mask) == 0].any() for p in picks)    # round(3.5) = 4, never padding
  assert len({p.tobytes() for p in picks}) > 5
  owners = np.array([0, 0, 1, 1, 2, 2], np.int32)
  idx = np.asarray(jax.jit(lambda k: S.sample_entries(k, owners, 600, client=1))(KEY))
  assert not np.isin(idx, [2, 3]).any() and set(idx) == {0, 1, 4, 5}
  idx = np.asarray(jax.jit(lambda k: S.sample_entries(k, owners, 600))(KEY))
  assert set(idx) == set(range(6))
  only = np.zeros(3, np.int32)                                          # a bank of this client alone
  assert set(np.asarray(S.sample_entries(KEY, only, 50, client=0))) <= {0, 1, 2}


@pytest.mark.parametrize('kind', ['cfsi', 'lab'])
def test_apply_style_changes_exactly_the_chosen_half(synth, kind):
  bank = S.build_style_bank(kind, synth)
  x, _ = synth.client_examples(1)
  x = jnp.asarray(x[:4], jnp.float32) / 255
  mask = jnp.array([1.0, 1.0, 1.0, 0.0])                              # a partial batch: 3 valid
  out = np.asarray(jax.jit(lambda k: S.apply_style(k, x, mask, bank, 0.5, client=1))(KEY))
  assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
  changed = np.abs(out - np.asarray(x)).reshape(4, -1).max(1) > 1e-6
  chosen = np.asarray(S.select_subset(jax.random.split(KEY, 3)[0], mask, 0.5))
  assert chosen.sum() == 2 and not chosen[3]                            # round(1.5) = 2, never the padding
  np.testing.assert_array_equal(out[~chosen], np.asarray(x)[~chosen])   # the other half is untouched
  assert changed[chosen].any()
  with pytest.raises(ValueError, match='style bank was built at'):
    S.apply_style(KEY, x[:, :20], mask, bank)
