"""The FedSeq chapter's CIFAR splits: 500 clients x 100 images at alpha in {0, 0.2, 0.5, 100} (thesis 5.2,
digest section 2.1) with the existing Dirichlet partitioner, on label vectors of CIFAR-10/100's sizes."""
import numpy as np
import pytest

from fedjax_flat.data.sources import cifar

from fedjax_flat.data import partition


@pytest.mark.parametrize('num_classes', [10, 100])
def test_500_clients_of_100_images(num_classes):
  labels = np.repeat(np.arange(num_classes), 50000 // num_classes)
  np.random.default_rng(0).shuffle(labels)
  stats = {}
  for alpha in cifar.ALPHA_GRID_FEDSEQ:
    split = partition.dirichlet_split(labels, 500, alpha, examples_per_client=100, num_classes=num_classes, seed=0)
    assert [len(s) for s in split] == [100] * 500
    flat = np.concatenate(split)
    assert len(np.unique(flat)) == 50000          # disjoint, and 500 x 100 uses the whole training set
    stats[alpha] = st = partition.split_statistics(labels, split)
    if alpha == 0:
      assert st['classes_per_client_max'] == 1   # one class per client, each class on 500 / C clients
      owners = np.bincount([labels[s[0]] for s in split], minlength=num_classes)
      assert np.all(owners == 500 // num_classes)
  cpc = [stats[a]['classes_per_client_mean'] for a in cifar.ALPHA_GRID_FEDSEQ]
  assert cpc == sorted(cpc) and cpc[0] == 1 < cpc[1] < cpc[2] < cpc[3]
  if num_classes == 10:
    # alpha = 100: nearly every class everywhere (the last-filled clients take the leftovers: min < 10)
    assert stats[100.0]['classes_per_client_mean'] > 9.8 and stats[100.0]['dominant_fraction_median'] < 0.2
    assert stats[0.2]['dominant_fraction_median'] > 0.9     # Dir(0.2 / C): mostly one class per client
  else:                                            # 100 draws from 100 classes at alpha=100: ~63 distinct
    assert 55 < stats[100.0]['classes_per_client_mean'] < 70
