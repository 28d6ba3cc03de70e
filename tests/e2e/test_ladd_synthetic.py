"""The LADD synthetic study (benchmarks/studies/ladd_synthetic.py) is a function of its seed: the same seed gives
the same clusters, mIoU and final parameters to the last bit, twice in one process and in a fresh process.

Default suite: the study's LADD part (style clustering, then its `run_federated` rounds of LADD with KD) at a
tiny size with a 1 x 1-conv model, twice. Slow marks: the whole pipeline (FDA pre-training of seg_cnn, LADD,
routed evaluation), twice in one process and once more in a fresh process (compiling seg_cnn's programs takes
minutes on the shared 2-core machine)."""
import json
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from benchmarks.studies import ladd_synthetic as study
from fedjax_flat.algorithms import ladd as ladd_lib
from fedjax_flat.algorithms.common import client_parts
from fedjax_flat.config.default_config import default_config
from fedjax_flat.data.sources import seg_synthetic_da
from fedjax_flat.data.transforms import fda
from fedjax_flat.grouping import style_clusters
from fedjax_flat.models import base
from fedjax_flat.training import source_pretrain
from tests.fixtures.paths import REPO


class Tiny(nn.Module):
  """enc (1x1 conv) -> relu -> head (1x1 conv): a per-pixel classifier of 4 classes."""

  @nn.compact
  def __call__(self, x, train=False):
    return nn.Conv(4, (1, 1), name='head')(nn.relu(nn.Conv(4, (1, 1), name='enc')(x)))


def _ladd_part(seed):
  ds = seg_synthetic_da.load(num_styles=2, clients_per_style=2, examples_per_client=3, source_examples=2,
                             test_per_style=1, image_size=(8, 8))
  clus = style_clusters.cluster_styles(fda.client_styles(ds), ks=range(2, 4), seed=seed)
  model = base.from_flax(Tiny(), 'tiny', 4, (8, 8, 3))
  pre = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 8, 8, 3)))
  cfg = default_config().client
  cfg.lr, cfg.momentum, cfg.weight_decay = 0.05, 0.9, 0.0
  alg = ladd_lib.ladd(model, *client_parts(cfg), optax.sgd(1.0), num_clusters=clus.k, pretrained=pre,
                      cluster_layers='cls',
                      lambda_kd=20.0)
  state, _ = study.run_federated(alg, pre, ds, seed=seed, rounds=2, clients_per_round=2, batch_size=2,
                                 prep=source_pretrain.normalize, cluster_of=clus.labels)
  return clus, study.digest((state['params'], state['cluster'], state['teacher']))


def test_the_studys_ladd_rounds_are_bit_identical_for_one_seed():
  (c1, d1), (c2, d2) = _ladd_part(0), _ladd_part(0)
  assert c1.k == c2.k == 2
  np.testing.assert_array_equal(c1.labels, c2.labels)
  np.testing.assert_array_equal(c1.centroids, c2.centroids)
  assert d1 == d2


def test_digest_sees_one_bit():
  a = {'w': np.zeros(3, np.float32)}
  b = {'w': np.array([0.0, np.nextafter(np.float32(0), np.float32(1)), 0.0], np.float32)}
  assert study.digest(a) == study.digest({'w': np.zeros(3, np.float32)})
  assert study.digest(a) != study.digest(b)
  assert study.digest(a) != study.digest({'v': np.zeros(3, np.float32)})     # the path counts


# The whole pipeline at a tiny size: 2 planted styles x 2 clients of 4 images of 16 x 16, a width-4 seg_cnn,
# 3 pre-training steps, 2 rounds of 2 clients.
TINY = ['--num_styles=2', '--clients_per_style=2', '--examples_per_client=4', '--source_examples=8',
        '--test_per_style=2', '--image_size=16', '--width=4', '--source_steps=3', '--rounds=2',
        '--clients_per_round=2', '--batch_size=4', '--methods=fda_pretrained,ladd_all']


def _same(a, b):
  assert a['clusters'] == b['clusters']
  assert a['miou'] == b['miou']            # floats compared exactly
  assert a['digest'] == b['digest']
  assert set(a['digest']) == {'fda_pretrained', 'ladd_all'}


@pytest.mark.slow
def test_one_seed_twice_in_one_process_and_in_a_fresh_process_is_bit_identical(tmp_path):
  args = study.parse_args(TINY + ['--seeds=0'])
  env = study.setting(args)
  first, second = study.run_seed(args, 0, env), study.run_seed(args, 0, env)
  _same(first, second)
  assert first['clusters']['k'] == 2
  out = tmp_path / 'run.json'
  subprocess.run([sys.executable, '-m', 'benchmarks.studies.ladd_synthetic', *TINY, '--seeds=0',
                  f'--json={out}'], cwd=REPO, check=True, capture_output=True, timeout=900)
  with open(out) as f:
    theirs = json.load(f)['runs'][0]
  first['clusters']['scores'] = {str(k): v for k, v in first['clusters']['scores'].items()}   # JSON's keys
  _same(first, theirs)
