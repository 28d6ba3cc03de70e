"""The segmentation data meet the training loop: the datasets declare the Segmentation task (OHEM, mIoU), the
round batches carry each step's client id when a style bank is used (so a client never receives its own
style, host and device paths alike), label maps stay uint8 in the batches, and a file source's test clients
are evaluated from streamed batches, never loaded whole."""
import jax
import numpy as np
import pytest

from fedjax_flat.tasks import base as tasks
from fedjax_flat.tasks import segmentation as seg_tasks
from fedjax_flat.evaluation import evaluator as evaluation
from fedjax_flat.data.transforms import augment, style_transfer
from fedjax_flat.data import batching
from fedjax_flat.data.sources import cityscapes, seg_synthetic
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.models import registry as model_registry
from fedjax_flat.models.base import num_params
from fedjax_flat.training import trainers
from fedjax_flat.config.default_config import default_config, segmentation_data
from tests.fixtures import seg_files as F
from tests.fixtures import seg_model  # noqa: F401  (registers the '_test_seg' model)

KEY = jax.random.PRNGKey(0)


def _constant_colour_clients(n_clients=3, per_client=5, hw=(6, 8)):
  """Client k's images are all one colour of its own (LAB std 0): a LAB transfer with entry e turns an image
  into exactly e's owner's colour, so an unchanged image means 'not restyled or given its own style'."""
  colours = np.array([[200, 40, 40], [40, 180, 60], [50, 60, 210], [220, 220, 30]], np.uint8)[:n_clients]
  x = np.repeat(colours, per_client, axis=0)[:, None, None, :] * np.ones(hw + (1,), np.uint8)
  y = np.zeros((len(x),) + hw, np.uint8)
  idx = [np.arange(k * per_client, (k + 1) * per_client) for k in range(n_clients)]
  return FederatedDataset.from_client_indices(x, y, idx, x[:1], y[:1], num_classes=2, name='colours',
                                              task='segmentation'), colours


def test_datasets_declare_the_segmentation_task():
  ds = seg_synthetic.load(num_domains=2, unseen_domains=1, clients_per_domain=1, examples_per_client=1,
                          client_test_examples=1, unseen_test_per_domain=1, image_size=(8, 8))
  for task in (tasks.task_of(ds),):
    assert isinstance(task, seg_tasks.Segmentation) and task.ignore_index == 255


def test_batches_carry_the_client_only_when_asked_and_host_equals_device():
  data, _ = _constant_colour_clients()
  sizes = data.client_sizes()
  ids = np.array([2, 0, -1], np.int32)
  for with_client in (False, True):
    plan = batching.batch_plan(sizes, batch_size=2, num_steps=3, with_client=with_client)
    rb = batching.make_round_batches(data, ids[ids >= 0], round_idx=4, seed=1, batch_size=2, num_steps=3,
                                     pad_clients_to=3, plan=plan)
    host = rb.as_dict()
    dev, _ = jax.jit(batching.gather_round_device, static_argnums=0)(plan, batching.device_data(data),
                                                                     jax.random.key(1), 4, ids)
    assert set(host) == set(dev) == ({'x', 'y', 'mask', 'client'} if with_client else {'x', 'y', 'mask'})
    for k in host:
      np.testing.assert_array_equal(np.asarray(dev[k]), host[k], err_msg=k)
    if with_client:
      np.testing.assert_array_equal(host['client'], [[2] * 3, [0] * 3, [-1] * 3])
  assert host['y'].dtype == np.uint8 and dev['y'].dtype == np.uint8     # uint8 label maps stay uint8


def _changed(out_x, in_x):
  return np.any(np.abs(np.asarray(out_x) - np.asarray(in_x)) > 2.0 / 255, axis=(-3, -2, -1))


def test_a_client_never_receives_its_own_style():
  data, colours = _constant_colour_clients()
  bank = style_transfer.build_style_bank('lab', data)
  seg = augment.make_seg_augment(crop=None, flip=False, mean=(0, 0, 0), std=(1, 1, 1), style=bank)
  assert seg.needs_client
  plan = batching.batch_plan(data.client_sizes(), batch_size=4, num_steps=2, with_client=True)
  rb = batching.make_round_batches(data, [0, 1, 2], round_idx=0, seed=0, batch_size=4, num_steps=2, plan=plan)
  steps = {k: v.reshape((-1,) + v.shape[2:]) for k, v in rb.as_dict().items()}     # [C*S] steps
  run = jax.jit(jax.vmap(lambda key, b: seg(key, b), in_axes=(0, None)))
  keys = jax.random.split(KEY, 16)
  for i in range(steps['mask'].shape[0]):
    batch = {k: v[i] for k, v in steps.items()}
    own = int(batch['client'])
    n_valid = int(batch['mask'].sum())
    out = run(keys, batch)
    assert 'client' not in out                       # consumed: the loss never sees it
    x_in = batch['x'].astype(np.float32) / 255
    changed = _changed(out['x'], x_in[None])         # [keys, B]
    # Exactly round(n/2) valid images restyled with ANOTHER client's colour; own style would leave it unchanged.
    np.testing.assert_array_equal(changed.sum(1), np.full(len(keys), int(np.floor(n_valid / 2 + 0.5))))
    got = np.round(np.asarray(out['x'])[changed][:, 0, 0] * 255)
    others = np.delete(colours, own, axis=0).astype(np.float32)
    assert np.all(np.min(np.abs(got[:, None, :] - others[None]).max(-1), axis=1) <= 2), own
  # Without the client id (the batches before this fix) the own style is drawn too: the test has teeth.
  batch = {k: v[0] for k, v in steps.items() if k != 'client'}
  changed = _changed(run(keys, batch)['x'], batch['x'].astype(np.float32)[None] / 255)
  assert changed.sum() < len(keys) * 2


def _synthetic_config(style='lab', device=True):
  c = default_config()
  c.dataset = 'seg_synthetic'
  c.data = segmentation_data('seg_synthetic', num_domains=3, unseen_domains=1, clients_per_domain=2,
                             examples_per_client=4, client_test_examples=1, unseen_test_per_domain=2,
                             image_size=(16, 16), crop=(16, 16), style=style)
  c.augment, c.normalize = 'segmentation', 'feddrive'
  c.model, c.model_kwargs = '_test_seg', {'norm': 'bn'}
  c.algorithm = 'silobn'
  c.rounds, c.clients_per_round, c.eval_every = 1, 2, 1
  c.client.batch_size, c.client.lr, c.client.microbatches = 2, 0.05, 2
  c.segmentation.predictions = 0
  c.engine.device_data = device
  c.engine.rounds_per_call = 1
  return c


@pytest.mark.slow     # default suite: the batching tests above + test_data_seg_e2e (LAB bank, device path)
@pytest.mark.parametrize('device', [False, True])
def test_trainer_feeds_client_ids_to_the_style_transform(device):
  c = _synthetic_config(device=device)
  t = trainers.make_trainer(c)
  assert t.plan.batch_plan.with_client and t.plan.train_transform.needs_client
  if not device:
    rb = t.driver.prepare_round(0)
    np.testing.assert_array_equal(rb.as_dict()['client'][:, 0], rb.client_ids)
  t.train()                                     # microbatches split the batch: 'client' must be gone by then
  rec = t.records[-1]
  assert isinstance(t.task, seg_tasks.Segmentation)
  for k in ('test_miou', 'test_seen_miou', 'test_unseen_miou'):
    assert 0.0 <= rec[k] <= 1.0, k
  assert not augment.make_seg_augment(crop=None, style=None).needs_client   # no bank: batches as before


def test_file_source_is_evaluated_from_streamed_test_batches(tmp_path, monkeypatch):
  F.make_cityscapes(str(tmp_path / 'cityscapes'), {'aachen': 4, 'bochum': 4}, {'frankfurt': 3, 'lindau': 2})
  src = cityscapes.load(str(tmp_path), distribution='heterogeneous', clients_per_city=2, double=False)
  assert isinstance(src.task, seg_tasks.Segmentation) and src.label_dtype == np.uint8
  c = default_config()
  c.dataset = 'cityscapes'
  c.data = segmentation_data('cityscapes', data_dir=str(tmp_path), clients_per_city=2, double=False)
  c.eval_batch_size = 2
  m = model_registry.get_model('_test_seg', src.num_classes, src.input_shape, norm='bn')
  ev = evaluation.make_evaluator(c, m, src, tasks.from_config(src.task, c))
  assert isinstance(ev, evaluation.HeldOutEvaluator)      # the Trainer's choice for a Segmentation task
  calls = []
  real = src.test_batches

  def counted(batch_size, client=None):
    for xy in real(batch_size, client):
      assert xy[1].dtype == np.uint8
      calls.append(len(xy[0]))
      yield xy

  def refuse(*a, **k):
    raise AssertionError('the evaluator loaded a whole test set')
  monkeypatch.setattr(src, 'test_batches', counted)
  monkeypatch.setattr(src, 'test_examples', refuse)
  monkeypatch.setattr(src, 'test_client_examples', refuse)
  res = ev(m.init(jax.random.key(0), np.zeros((1,) + src.input_shape, np.float32)))
  # The 5 unseen-city images, streamed in batches of eval_batch_size (test policy: running statistics).
  assert calls == [2, 2, 1] and 0.0 <= res['unseen_miou'] <= 1.0 and res['unseen_count'] > 0

def _seg_cnn_params(w, c):
  """Closed form: 3x3 convs without bias + BN (scale, bias) per CBR, 1x1 heads with bias."""
  cbr = lambda i, o: 9 * i * o + 2 * o       # noqa: E731
  return (cbr(3, w) + cbr(w, 2 * w) + cbr(2 * w, 2 * w) + cbr(2 * w, 4 * w) + cbr(4 * w, 4 * w)
          + cbr(6 * w, 2 * w) + cbr(3 * w, w) + (w + 1) * c + (4 * w + 1) * c)


@pytest.mark.parametrize('width', [8, 16])
def test_seg_cnn_parameter_count(width):
  for norm in ('bn', 'gn'):
    m = model_registry.get_model('seg_cnn', 4, (32, 48, 3), width=width, norm=norm)
    p = jax.eval_shape(lambda: m.init(jax.random.key(0), np.zeros((1, 32, 48, 3), np.float32)))
    trainable = p['params'] if norm == 'bn' else p
    assert num_params(trainable) == _seg_cnn_params(width, 4) == {8: 26_560, 16: 104_952}[width]
    if norm == 'bn':
      assert m.batch_stats and num_params(p['batch_stats']) == 2 * 16 * width   # mean + var per BN channel
    else:
      assert not m.batch_stats
  assert model_registry.uses_batch_stats('seg_cnn', {})
  assert not model_registry.uses_batch_stats('seg_cnn', {'norm': 'gn'})


def test_seg_cnn_shapes():
  m = model_registry.get_model('seg_cnn', 4, (32, 48, 3), width=8)
  p = jax.eval_shape(lambda: m.init(jax.random.key(0), np.zeros((1, 32, 48, 3), np.float32)))
  x = np.zeros((2, 32, 48, 3), np.float32)
  (main, aux), stats = jax.eval_shape(lambda q: m.apply(q, x, train=True, rng=jax.random.key(1),
                                                        with_batch_stats=True), p)
  assert main.shape == aux.shape == (2, 32, 48, 4)
  assert jax.tree_util.tree_structure(stats) == jax.tree_util.tree_structure(p['batch_stats'])
  assert jax.eval_shape(lambda q: m.apply(q, x), p).shape == (2, 32, 48, 4)     # evaluation: the main head only
  with pytest.raises(ValueError, match='divisible by 4'):
    jax.eval_shape(lambda q: m.apply(q, np.zeros((1, 30, 48, 3), np.float32)), p)
