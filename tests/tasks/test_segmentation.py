"""The segmentation task (seg_tasks.Segmentation): mIoU from a hand-computed confusion matrix, OHEM's pixel
selection against numpy references of FedDrive's HardNegativeMining and CoinCheung's OhemCELoss, the booster
heads' summed loss, evaluation at reduced resolution / in tiles, the poly lr schedule and the writers'
handling of array-valued metrics."""
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_flat.tasks import base as tasks
from fedjax_flat.tasks import segmentation as seg_tasks
from fedjax_flat.optimizers.schedules import client_round_hparams
from fedjax_flat.models import base as model_base
from fedjax_flat.models import tiling
from fedjax_flat.optimizers.client import make_client_tx
from fedjax_flat.optimizers.schedules import poly_lr
from fedjax_flat.training import writers

IGNORE = 255


def _np_ce(logits, labels):
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return -np.take_along_axis(logp, np.clip(labels, 0, logits.shape[-1] - 1)[..., None], -1)[..., 0]


def _onehot_logits(pred, c):
  return jnp.asarray(np.eye(c, dtype=np.float32)[pred] * 10.0)


def test_miou_from_hand_computed_confusion_matrix():
  # 2 images of 2x3 pixels, 3 classes; class 2 never in the ground truth (predicted once: a false positive).
  y = np.array([[[0, 0, 1], [1, 1, IGNORE]],
                [[0, 1, 1], [0, 7, 0]]])          # 7: outside [0, 3) -> void
  p = np.array([[[0, 1, 1], [1, 0, 2]],
                [[0, 1, 2], [0, 1, 1]]])
  mask = np.array([1.0, 1.0])
  task = seg_tasks.Segmentation()
  sums = task.eval_sums(_onehot_logits(p, 3), jnp.asarray(y), jnp.asarray(mask))
  # Valid pixels (true, pred): img0 (0,0)(0,1)(1,1)(1,1)(1,0) [ignore skipped]; img1 (0,0)(1,1)(1,2)(0,0)(0,1).
  expected = np.array([[3, 2, 0],
                       [1, 3, 1],
                       [0, 0, 0]], np.float32)
  np.testing.assert_array_equal(np.asarray(sums['confusion']), expected)
  assert float(sums['count']) == 10 and float(sums['correct']) == 6
  m = task.eval_metrics(sums)
  iou0 = 3 / (5 + 4 - 3)     # TP / (gt + pred - TP)
  iou1 = 3 / (5 + 5 - 3)
  np.testing.assert_allclose(np.asarray(m['iou'])[:2], [iou0, iou1], rtol=1e-6)
  assert np.isnan(np.asarray(m['iou'])[2])                    # absent from the ground truth
  assert float(m['miou']) == pytest.approx((iou0 + iou1) / 2)  # FedDrive: mean over present classes only
  assert float(m['accuracy']) == pytest.approx(0.6)
  # A padded example counts nowhere; the metrics are additive over batches.
  sums2 = task.eval_sums(_onehot_logits(p, 3), jnp.asarray(y), jnp.asarray([1.0, 0.0]))
  np.testing.assert_array_equal(np.asarray(sums2['confusion']).sum(), 5)
  a = task.eval_sums(_onehot_logits(p[:1], 3), jnp.asarray(y[:1]), jnp.ones(1))
  b = task.eval_sums(_onehot_logits(p[1:], 3), jnp.asarray(y[1:]), jnp.ones(1))
  np.testing.assert_array_equal(np.asarray(a['confusion'] + b['confusion']), expected)


def test_confusion_counts_are_integers_beyond_float32s_2_pow_24():
  """One evaluation batch whose cell (0, 0) holds more than 2^24 pixels: a 4200 x 4200 label map of class 0, of
  which 120 rows (504,000 pixels) are predicted as class 1 (int labels only: the counting path of `eval_sums`).
  Integers count every pixel; a float32 count stops at 2^24 = 16,777,216 and the IoU is then wrong."""
  h = w = 4200
  labels = jnp.zeros((1, h, w), jnp.int32)
  pred = labels.at[0, :120].set(1)
  valid = jnp.ones((1, h, w), bool)
  conf = np.asarray(seg_tasks.confusion_counts(labels, pred, valid, 2))
  assert conf.dtype == np.int32
  np.testing.assert_array_equal(conf, [[h * w - 120 * w, 120 * w], [0, 0]])
  assert conf[0, 0] == 17_136_000 > 2 ** 24
  miou, _ = seg_tasks.miou_from_confusion(conf)
  assert float(miou) == pytest.approx(17_136_000 / 17_640_000, rel=1e-6)
  # The float32 count of the same scatter-add (the code before) saturates, and the mIoU is off by 6e-4.
  idx = (labels * 2 + pred).reshape(-1)
  f32 = np.asarray(jnp.zeros((4,), jnp.float32).at[idx].add(1.0)).reshape(2, 2)
  assert f32[0, 0] == 2 ** 24 and f32[0, 0] != conf[0, 0]
  miou_f32, _ = seg_tasks.miou_from_confusion(f32)
  assert abs(float(miou_f32) - 17_136_000 / 17_640_000) > 5e-4
  # Across batches the evaluators add on the host in int64: past int32's range too.
  from fedjax_flat.evaluation.evaluator import host_add, host_sum
  total = None
  for _ in range(130):                    # 130 x 17.1M > 2^31
    total = host_add(total, {'confusion': conf})
  assert total['confusion'].dtype == np.int64 and total['confusion'][0, 0] == 130 * 17_136_000 > 2 ** 31
  assert host_sum(np.stack([conf, conf]))[0, 0] == 2 * 17_136_000


def test_eval_sums_count_in_integers():
  y = jnp.zeros((2, 3, 4), jnp.int32)
  sums = seg_tasks.Segmentation().eval_sums(_onehot_logits(np.zeros((2, 3, 4), int), 2), y, jnp.ones(2))
  for k in ('confusion', 'count', 'correct'):
    assert jnp.issubdtype(sums[k].dtype, jnp.integer), k
  assert int(sums['count']) == 24 and int(sums['confusion'][0, 0]) == 24


def _ohem_topk_ref(logits, y, mask, frac):
  """FedDrive's HardNegativeMining on CrossEntropyLoss(ignore_index=255, reduction='none')."""
  ce = np.where(y == IGNORE, 0.0, _np_ce(logits, y))
  b = ce.shape[0]
  flat = ce.reshape(b, -1)[mask > 0]
  k = int(frac * flat.shape[1])
  return np.sort(flat, axis=1)[:, ::-1][:, :k].mean()


def _ohem_thresh_ref(logits, y, thresh):
  """CoinCheung/BiSeNet OhemCELoss."""
  ce = _np_ce(logits, y)[y != IGNORE].ravel()
  n_min = ce.size // 16
  hard = ce[ce > -np.log(thresh)]
  if hard.size < n_min:
    hard = np.sort(ce)[::-1][:n_min]
  return hard.mean()


def test_ohem_topk_selects_each_images_hardest_pixels():
  rng = np.random.default_rng(0)
  logits = rng.normal(0, 2, (3, 8, 8, 4)).astype(np.float32)
  y = rng.integers(0, 4, (3, 8, 8))
  y[rng.random(y.shape) < 0.3] = IGNORE
  mask = np.array([1.0, 0.0, 1.0])
  task = seg_tasks.Segmentation(ohem='topk', ohem_fraction=0.25)
  s, n = task.loss_sums(jnp.asarray(logits), jnp.asarray(y), jnp.asarray(mask))
  assert float(n) == 2 * 16
  assert float(s / n) == pytest.approx(_ohem_topk_ref(logits, y, mask, 0.25), rel=1e-5)
  # The gradient reaches exactly the selected pixels: the 16 hardest of each valid image, nothing else.
  g = jax.grad(lambda z: task.loss_sums(z, jnp.asarray(y), jnp.asarray(mask))[0])(jnp.asarray(logits))
  touched = np.abs(np.asarray(g)).sum(-1) > 0
  ce = np.where(y == IGNORE, 0.0, _np_ce(logits, y))
  for i in range(3):
    if mask[i] == 0:
      assert not touched[i].any()
      continue
    top = np.argsort(ce[i].ravel())[::-1][:16]
    expect = np.zeros(64, bool)
    expect[top] = True
    expect &= (y[i].ravel() != IGNORE)        # a selected void pixel has loss 0 and no gradient
    np.testing.assert_array_equal(touched[i].ravel(), expect)


@pytest.mark.parametrize('scale', [3.0, 0.05])   # many pixels above the threshold / fewer than n_min
def test_ohem_thresh_matches_coincheung(scale):
  rng = np.random.default_rng(1)
  y = rng.integers(0, 4, (2, 16, 16))
  y[rng.random(y.shape) < 0.2] = IGNORE
  logits = (rng.normal(0, 1, (2, 16, 16, 4)) * scale).astype(np.float32)
  logits[..., 0] += scale * 3 * (y == 0)      # some easy pixels
  task = seg_tasks.Segmentation(ohem='thresh', ohem_thresh=0.7)
  s, n = task.loss_sums(jnp.asarray(logits), jnp.asarray(y), jnp.ones(2))
  assert float(s / n) == pytest.approx(_ohem_thresh_ref(logits, y, 0.7), rel=1e-5)


def test_aux_heads_are_summed_and_none_is_the_valid_mean():
  rng = np.random.default_rng(2)
  y = rng.integers(0, 3, (2, 4, 4))
  y[0, 0] = IGNORE
  heads = [rng.normal(0, 1, (2, 4, 4, 3)).astype(np.float32) for _ in range(3)]
  mean_ce = lambda z: _np_ce(z, y)[y != IGNORE].mean()  # noqa: E731
  t = seg_tasks.Segmentation(ohem='none', aux_weight=0.5)
  s, n = t.loss_sums(tuple(map(jnp.asarray, heads)), jnp.asarray(y), jnp.ones(2))
  assert float(n) == (y != IGNORE).sum()
  assert float(s / n) == pytest.approx(mean_ce(heads[0]) + 0.5 * (mean_ce(heads[1]) + mean_ce(heads[2])), rel=1e-5)
  # Evaluation only looks at the main head.
  e = t.eval_sums(tuple(map(jnp.asarray, heads)), jnp.asarray(y), jnp.ones(2))
  assert float(e['loss_sum'] / e['count']) == pytest.approx(mean_ce(heads[0]), rel=1e-5)


def test_task_registered_and_configured():
  t = tasks.get_task('segmentation')
  assert isinstance(t, seg_tasks.Segmentation) and t.ignore_index == 255 and t.ohem == 'topk'
  cfg = ml_collections.ConfigDict({'segmentation': {'ohem': 'thresh', 'ohem_fraction': 0.5, 'ohem_thresh': 0.6,
                                                    'aux_weight': 0.0}})
  t2 = tasks.from_config(t, cfg)
  assert (t2.ohem, t2.ohem_fraction, t2.ohem_thresh, t2.aux_weight) == ('thresh', 0.5, 0.6, 0.0)
  assert tasks.from_config(tasks.Classification(), cfg) == tasks.Classification()


# --- Evaluation resolution ---

def _per_pixel_model(c=3):
  """A 1x1 'network' (no spatial context): tiles must give exactly the full-image prediction."""
  w = jnp.asarray(np.random.default_rng(3).normal(0, 1, (3, c)).astype(np.float32))
  return model_base.Model('pp', init=None, apply=lambda p, x, train=False, **kw: x @ p, num_classes=c,
                          input_shape=(32, 32, 3)), w


def test_tiles_equal_full_image_for_a_per_pixel_model():
  m, w = _per_pixel_model()
  assert tiling.window_starts(96, 32, 1 / 3) == (0, 21, 42, 63, 64)
  assert tiling.window_starts(32, 32, 0.5) == (0,)
  x = jnp.asarray(np.random.default_rng(4).normal(0, 1, (2, 64, 96, 3)).astype(np.float32))
  full = jax.nn.log_softmax(m.apply(w, x))
  tiled = tiling.for_evaluation(m, 'tiles', overlap=1 / 3).apply(w, x)
  np.testing.assert_allclose(np.asarray(tiled), np.asarray(full), atol=1e-5)


def test_downscale_evaluates_at_reduced_resolution_and_metrics_at_label_size():
  m, w = _per_pixel_model()
  seen = []
  inner = m.apply
  m = m.__class__(**{**m.__dict__, 'apply': lambda p, x, **kw: (seen.append(x.shape), inner(p, x, **kw))[1]})
  ev = tiling.for_evaluation(m, 'downscale', scale=0.5)
  x = jnp.ones((1, 128, 192, 3))
  logits = ev.apply(w, x)
  assert seen[-1] == (1, 64, 96, 3) and logits.shape == (1, 64, 96, 3)
  y = jnp.zeros((1, 128, 192), jnp.int32)
  sums = seg_tasks.Segmentation().eval_sums(logits, y, jnp.ones(1))      # upsampled to the labels
  assert float(sums['count']) == 128 * 192
  assert tiling.scaled_size(1080, 0.5, 32) == 544 and tiling.scaled_size(1024, 0.5, 32) == 512


# --- Poly learning rate ---

def test_poly_lr_values_and_client_schedules():
  f = poly_lr(0.1, 0.9, 100)
  np.testing.assert_allclose([float(f(t)) for t in (0, 50, 99, 100, 150)],
                             [0.1, 0.1 * 0.5 ** 0.9, 0.1 * 0.01 ** 0.9, 0.0, 0.0], rtol=1e-6)
  cfg = ml_collections.ConfigDict({'optimizer': 'sgd', 'base_optimizer': 'sgd', 'lr': 0.1, 'momentum': 0.0,
                                   'weight_decay': 0.0, 'lr_schedule': 'poly_step', 'lr_power': 0.9,
                                   'lr_poly_max': 4, 'rho': 0.0})
  tx = make_client_tx(cfg, {'lr': jnp.float32(0.1), 'rho': jnp.float32(0.0)})
  state, p = tx.init(jnp.zeros(())), jnp.zeros(())
  steps = []
  for _ in range(5):
    u, state = tx.update(jnp.ones(()), state, p)
    steps.append(-float(u))
  np.testing.assert_allclose(steps, [0.1 * (1 - t / 4) ** 0.9 for t in range(5)], rtol=1e-6, atol=1e-9)
  cfg.lr_schedule = 'poly_round'
  cfg.lr_poly_max = 10
  hp = client_round_hparams(cfg)
  np.testing.assert_allclose(float(hp(5)['lr']), 0.1 * 0.5 ** 0.9, rtol=1e-6)


# --- Writers: array-valued metrics ---

def test_writers_handle_per_class_iou(tmp_path):
  w = writers.MetricsWriter(str(tmp_path), tensorboard=False)
  for r in (1, 2):
    w.write({'round': r, 'test_accuracy': 0.5 + r / 10, 'test_loss': 1.0 / r, 'test_miou': 0.2 * r,
             'test_unseen_miou': 0.1 * r, 'test_iou': np.array([0.1 * r, np.nan, 0.3]), 'train_loss': 1.0})
  lines = [json.loads(l) for l in open(os.path.join(tmp_path, 'metrics.jsonl'))]
  assert lines[1]['test_iou'] == [0.2, None, 0.3]                     # strict JSON: NaN -> null
  header = open(os.path.join(tmp_path, 'metrics.csv')).readline().strip().split(',')
  assert 'test_iou' not in header and 'test_miou' in header           # arrays: jsonl / summary only
  s = writers.summarize(w.records, 2, {'reported_model': 'global'})
  g = s['models']['global']
  assert g['final_test_iou'] == [0.2, None, 0.3]
  assert g['mean_last_2_test_miou'] == pytest.approx(0.3) and g['final_test_unseen_miou'] == pytest.approx(0.2)
  assert s['mean_last_2_test_unseen_miou'] == pytest.approx(0.15)      # the reported model's, top level
  writers.write_summary(str(tmp_path), s)
  md = open(os.path.join(tmp_path, 'summary.md')).read()
  assert '| global | 30.00 | all |' in md and '| global | 15.00 | unseen |' in md
  writers.plot_metrics(w.records, os.path.join(tmp_path, 'm.png'))
  assert os.path.getsize(os.path.join(tmp_path, 'm.png')) > 0
