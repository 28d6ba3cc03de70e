"""The synthetic FFREEDA set (data/sources/seg_synthetic_da.py): layout, determinism, the registry, and planted
styles that FDA style clustering recovers."""
import numpy as np

from fedjax_flat.config.default_config import segmentation_data
from fedjax_flat.data import registry
from fedjax_flat.data.sources import seg_synthetic_da as D
from fedjax_flat.data.transforms import fda
from fedjax_flat.grouping import style_clusters

SMALL = dict(num_styles=3, clients_per_style=3, examples_per_client=5, source_examples=7, test_per_style=4,
             image_size=(16, 24))


def test_layout_and_determinism():
  ds = D.load(**SMALL, seed=1)
  assert ds.num_clients == 9 and ds.x.shape == (45, 16, 24, 3) and ds.y.shape == (45, 16, 24)
  assert ds.source_x.shape == (7, 16, 24, 3) and ds.source_y.shape == (7, 16, 24)
  assert ds.test_x.shape == (12, 16, 24, 3) and ds.num_classes == 4 and ds.ignore_index == 255
  assert ds.x.dtype == ds.source_x.dtype == np.uint8
  np.testing.assert_array_equal(ds.client_style, np.repeat([0, 1, 2], 3))
  np.testing.assert_array_equal(ds.test_style, np.repeat([0, 1, 2], 4))
  assert ds.test_client_names == ['style0', 'style1', 'style2']
  np.testing.assert_array_equal(ds.test_client_examples(1)[0], ds.test_x[4:8])
  assert set(np.unique(ds.source_y)) <= {0, 1, 2, 3, 255}
  again, other = D.load(**SMALL, seed=1), D.load(**SMALL, seed=2)
  for f in ('x', 'y', 'test_x', 'source_x', 'source_y'):
    np.testing.assert_array_equal(getattr(ds, f), getattr(again, f))
  assert not np.array_equal(ds.x, other.x)


def test_planted_styles_are_apart_and_found_by_style_clustering():
  g, o, gm = D.planted_styles(4, seed=0)
  assert g.shape == (4, 3) and o.shape == (4, 3) and gm.shape == (4,)
  ds = D.load(num_styles=4, clients_per_style=4, examples_per_client=12, seed=0)
  styles = fda.client_styles(ds)
  res = style_clusters.cluster_styles(styles, ks=range(2, 12), seed=0)
  assert res.k == 4 and style_clusters.agreement(res.labels, ds.client_style) == 1.0
  # Test images are routed by their OWN style (one image, as the release at test time), which carries the colour
  # noise of the image's content (random background colour) that a client's mean over 12 images averages out:
  # most, not all, reach their planted style's cluster (0.80 on this set; chance 0.25).
  test_styles = np.asarray(fda.extract_styles(fda.to_unit(ds.test_x))).reshape(len(ds.test_x), -1)
  routed = style_clusters.route(test_styles, res.centroids)
  cluster_of_style = {s: res.labels[ds.client_style == s][0] for s in range(4)}
  hit = np.mean([routed[i] == cluster_of_style[s] for i, s in enumerate(ds.test_style)])
  assert hit >= 0.75


def test_registry_builds_from_the_declared_config():
  cfg = segmentation_data('seg_synthetic_da', **SMALL)
  ds = registry.get_dataset('seg_synthetic_da', **cfg.to_dict())
  assert ds.num_clients == 9 and ds.source_x.shape[0] == 7
