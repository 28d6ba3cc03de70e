"""Style clustering (grouping/style_clusters.py): the silhouette by hand and against scikit-learn on planted
clusters, k-means against scikit-learn's inertia, k selection by the silhouette (Algorithm 7), force_k, routing."""
import numpy as np
import pytest

from fedjax_flat.grouping import style_clusters as S

sklearn_metrics = pytest.importorskip('sklearn.metrics')   # the venv ships scikit-learn; the hand case runs anyway
sklearn_cluster = pytest.importorskip('sklearn.cluster')


def _blobs(k=4, per=5, dim=27, spread=0.3, seed=0):
  rng = np.random.default_rng(seed)
  centres = rng.normal(0, 10, (k, dim))
  x = np.concatenate([c + rng.normal(0, spread, (per, dim)) for c in centres])
  return x, np.repeat(np.arange(k), per)


def test_silhouette_by_hand():
  x = np.array([[0.0], [1.0], [10.0], [11.0], [30.0]])
  labels = np.array([0, 0, 1, 1, 2])
  s = S.silhouette_samples(x, labels)
  # point 0: a = 1, b = min(mean(10, 11), 30) = 10.5; point 2: a = 1, b = min(mean(10, 9), 20) = 9.5
  np.testing.assert_allclose(s[:4], [9.5 / 10.5, 8.5 / 9.5, 8.5 / 9.5, 9.5 / 10.5])
  assert s[4] == 0.0                               # alone in its cluster
  np.testing.assert_allclose(S.silhouette_score(x, labels), np.mean(s))


@pytest.mark.parametrize('seed', [0, 1])
def test_silhouette_matches_scikit_learn(seed):
  x, planted = _blobs(seed=seed)
  rng = np.random.default_rng(seed)
  for labels in (planted, rng.integers(0, 3, len(x)), np.r_[planted[:-1], 9]):   # + a singleton cluster
    np.testing.assert_allclose(S.silhouette_samples(x, labels), sklearn_metrics.silhouette_samples(x, labels),
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(S.silhouette_score(x, labels), sklearn_metrics.silhouette_score(x, labels),
                               rtol=1e-9)


def test_kmeans_recovers_blobs_and_matches_scikit_learn_inertia():
  x, planted = _blobs(k=5, per=6, spread=1.0, seed=3)
  labels, centroids, inertia = S.kmeans(x, 5, n_init=10, rng=np.random.default_rng(0))
  assert S.agreement(labels, planted) == 1.0
  ref = sklearn_cluster.KMeans(5, n_init=10, random_state=0).fit(x)
  np.testing.assert_allclose(inertia, ref.inertia_, rtol=1e-6)
  np.testing.assert_allclose(inertia, np.sum((x - centroids[labels]) ** 2), rtol=1e-9)


def test_silhouette_selects_the_planted_number_of_clusters():
  x, planted = _blobs(k=4, per=5, seed=4)
  res = S.cluster_styles(x.reshape(20, 3, 3, 3), ks=range(2, 12), seed=0)
  assert res.k == 4 and S.agreement(res.labels, planted) == 1.0
  assert max(res.scores, key=res.scores.get) == 4 and set(res.scores) == set(range(2, 12))
  for k, score in res.scores.items():    # each candidate's score is the silhouette of its clustering
    assert -1.0 <= score <= 1.0
  np.testing.assert_array_equal(res.sizes(), [5, 5, 5, 5])
  forced = S.cluster_styles(x, force_k=2)
  assert forced.k == 2 and forced.scores == {} and len(np.unique(forced.labels)) == 2
  # ks are capped at K - 1 (the silhouette needs k <= K - 1): the release's 4..19 on 6 clients tries 4, 5.
  few = S.cluster_styles(x[:6], ks=S.RELEASE_KS)
  assert set(few.scores) == {4, 5}
  with pytest.raises(ValueError, match='force_k'):
    S.cluster_styles(x[:3], ks=S.RELEASE_KS)


def test_route_to_the_nearest_centroid():
  centroids = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
  pts = np.array([[1.0, 1.0], [9.0, 2.0], [-1.0, 7.0], [5.1, 0.0]])
  np.testing.assert_array_equal(S.route(pts, centroids), [0, 1, 2, 1])


def test_agreement():
  assert S.agreement([0, 0, 1, 1], [5, 5, 7, 7]) == 1.0
  assert S.agreement([0, 0, 0, 0], [0, 0, 1, 1]) == pytest.approx(2 / 6)
