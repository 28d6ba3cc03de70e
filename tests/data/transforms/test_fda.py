"""FDA styles (data/transforms/fda.py): the style window equals the DFT amplitude at the lowest frequencies computed
by an explicit DFT sum, client styles are the per-client means, the amplitude swap follows the release's formula
(numpy FFT) and puts the style in the window while leaving the rest of the amplitude alone."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.data.transforms import fda


def _dft_amp(img, u, v):
  """|sum_{m,n} x[m, n] exp(-2 pi i (u m / H + v n / W))| per channel: an explicit DFT, no FFT."""
  h, w = img.shape[:2]
  m, n = np.mgrid[0:h, 0:w]
  e = np.exp(-2j * np.pi * (u * m / h + v * n / w))
  return np.abs(np.sum(img * e[..., None], axis=(0, 1)))


@pytest.mark.parametrize('h,w,b', [(8, 8, 1), (9, 7, 1), (12, 10, 2)])
def test_style_is_the_low_frequency_amplitude(h, w, b):
  x = np.random.default_rng(0).random((2, h, w, 3)).astype(np.float32)
  got = np.asarray(fda.extract_styles(jnp.asarray(x), b))
  assert got.shape == (2, 2 * b + 1, 2 * b + 1, 3)
  for i in range(2):
    for du in range(-b, b + 1):
      for dv in range(-b, b + 1):
        # fftshift puts frequency 0 at index floor(H/2): window row b + du holds frequency du.
        np.testing.assert_allclose(got[i, b + du, b + dv], _dft_amp(x[i].astype(np.float64), du, dv), rtol=1e-4)
  rows, cols = fda.fda_window(h, w, b)
  assert (rows.start, rows.stop, cols.start, cols.stop) == (h // 2 - b, h // 2 + b + 1, w // 2 - b, w // 2 + b + 1)


def test_window_must_fit():
  with pytest.raises(ValueError, match='fda b=3'):
    fda.fda_window(5, 8, 3)


class _Clients:
  def __init__(self, xs):
    self.xs = xs
    self.num_clients = len(xs)

  def client_examples(self, k):
    return self.xs[k], None


def test_client_styles_are_means_over_the_first_images():
  rng = np.random.default_rng(1)
  xs = [rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8) for n in (3, 20, 5)]
  got = fda.client_styles(_Clients(xs), b=1, max_images=10, batch_size=4)
  assert got.shape == (3, 3, 3, 3) and got.dtype == np.float32
  for k, x in enumerate(xs):
    want = np.mean([np.abs(np.fft.fftshift(np.fft.fft2(im / 255.0, axes=(0, 1)), axes=(0, 1)))[3:6, 3:6]
                    for im in x[:10]], axis=0)
    np.testing.assert_allclose(got[k], want, rtol=1e-4)
  assert fda.style_bytes(got) == 27 * 4


def _np_swap(x, style, b):
  """The release's _apply_style on a float image (channels last), without its 8-bit rounding."""
  h, w = x.shape[:2]
  spec = np.fft.fft2(x, axes=(0, 1))
  amp, pha = np.abs(spec), np.angle(spec)
  amp = np.fft.fftshift(amp, axes=(0, 1))
  amp[h // 2 - b:h // 2 + b + 1, w // 2 - b:w // 2 + b + 1] = style
  out = np.real(np.fft.ifft2(np.fft.ifftshift(amp, axes=(0, 1)) * np.exp(1j * pha), axes=(0, 1)))
  return np.clip(out, 0, 1)


def test_swap_matches_the_release_formula_and_sets_the_window():
  rng = np.random.default_rng(2)
  x, y = rng.random((2, 10, 12, 3))
  style = np.asarray(fda.extract_styles(jnp.asarray(y[None], jnp.float32), 1))[0]
  got = np.asarray(fda.fda_swap(jnp.asarray(x, jnp.float32), jnp.asarray(style)))
  np.testing.assert_allclose(got, _np_swap(x, style, 1), atol=1e-5)
  # Without clipping: the window of the result's amplitude is the style, the rest is the image's own.
  raw = np.asarray(fda.fda_swap(jnp.asarray(x, jnp.float32), jnp.asarray(style), lo=-np.inf, hi=np.inf))
  a_new = np.abs(np.fft.fftshift(np.fft.fft2(raw, axes=(0, 1)), axes=(0, 1)))
  a_old = np.abs(np.fft.fftshift(np.fft.fft2(x, axes=(0, 1)), axes=(0, 1)))
  win = np.zeros((10, 12), bool)
  win[4:7, 5:8] = True
  np.testing.assert_allclose(a_new[win], style.reshape(-1, 3), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(a_new[~win], a_old[~win], rtol=1e-4, atol=1e-3)
  # Its own style gives the image back.
  own = np.asarray(fda.extract_styles(jnp.asarray(x[None], jnp.float32), 1))[0]
  np.testing.assert_allclose(np.asarray(fda.fda_swap(jnp.asarray(x, jnp.float32), jnp.asarray(own))), x,
                             atol=1e-5)


def test_restyle_batch_uses_bank_styles():
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.random((5, 8, 8, 3)), jnp.float32)
  bank = np.asarray(fda.extract_styles(jnp.asarray(rng.random((3, 8, 8, 3)), jnp.float32)))
  out = np.asarray(fda.restyle_batch(jax.random.PRNGKey(0), x, bank))
  used = set()
  for i in range(5):
    cands = [np.asarray(fda.fda_swap(x[i], jnp.asarray(s))) for s in bank]
    hits = [j for j, c in enumerate(cands) if np.allclose(out[i], c, atol=1e-6)]
    assert len(hits) == 1
    used.add(hits[0])
  again = np.asarray(fda.restyle_batch(jax.random.PRNGKey(0), x, bank))
  np.testing.assert_array_equal(out, again)
