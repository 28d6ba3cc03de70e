"""FedDrive split procedures at full scale (file names only): the counts of the released split files."""
import collections

import pytest

from fedjax_flat.data.sources import cityscapes, feddrive_splits as fds


def _cityscapes_items():
  train = [(f'train/{c}/{c}_{i:06d}_000019_leftImg8bit.png', f'train/{c}/{c}_{i:06d}_000019_gtFine_labelIds.png', c)
           for c, n in cityscapes.TRAIN_CITIES.items() for i in range(n)]
  val = [(f'val/{c}/{c}_{i:06d}_000019_leftImg8bit.png', f'val/{c}/{c}_{i:06d}_000019_gtFine_labelIds.png', c)
         for c, n in cityscapes.VAL_CITIES.items() for i in range(n)]
  return train, val


def _idda_items(per_domain=60):
  doms = [f'T{t:02d}_{w}_{v}' for t in range(1, 8) for w in ('CN', 'CS', 'HRN') for v in 'ABJMV']
  doms.remove('T07_CN_M')                      # absent from IDDAsmall (and from every released split)
  return [(f'{d}/RGB/{1000 + i}_{d}.jpg', f'{d}/Semantic/{1000 + i}_{d}.png', d) for d in doms
          for i in range(per_domain)]


def test_cityscapes_uniform_matches_release():
  train, val = _cityscapes_items()
  s = fds.cityscapes_split(train, val, 'uniform', seed=0)
  sizes = collections.Counter(len(c.x) for c in s.train)
  assert len(s.train) == 146 and sizes == {10: 32, 15: 49, 25: 40, 30: 8, 40: 17}
  assert sum(sizes[k] * k for k in sizes) == 2975
  fds.check_split(s)
  assert {x for c in s.train for x in c.x} == {t[0] for t in train}          # every training image, once
  assert len({x.split('/')[1] for c in s.train for x in c.x}) == 18
  assert [c.name for c in s.test] == ['unseen'] and len(s.test[0].x) == 500
  assert not {x.split('/')[1] for x in s.test[0].x} & set(cityscapes.TRAIN_CITIES)


def test_cityscapes_heterogeneous_matches_release():
  train, val = _cityscapes_items()
  s = fds.cityscapes_split(train, val, 'heterogeneous', seed=0)
  assert len(s.train) == 144
  fds.check_split(s)
  for city, n in cityscapes.TRAIN_CITIES.items():
    cl = [c for c in s.train if c.name.rstrip('0123456789') == city]
    assert len(cl) == 8 and {len(c.x) for c in cl} == {n // 8}
    assert all(x.split('/')[1] == city for c in cl for x in c.x)
  sizes = [len(c.x) for c in s.train]
  assert (min(sizes), max(sizes), sum(sizes)) == (10, 45, 2904)      # the release: 10-45, 2,904 images


@pytest.mark.parametrize('setting,clients,seen,unseen', [('country', 90, 1080, 840), ('rainy', 69, 828, 2100),
                                                         ('bus', 83, 996, 1260)])
@pytest.mark.parametrize('distribution', ['heterogeneous', 'uniform'])
def test_idda_matches_release(setting, clients, seen, unseen, distribution):
  items = _idda_items()
  s = fds.idda_split(items, setting, distribution, seed=0)
  fds.check_split(s)
  assert len(s.train) == clients and {len(c.x) for c in s.train} == {48}
  assert [c.name for c in s.test] == ['seen', 'unseen']
  assert (len(s.test[0].x), len(s.test[1].x)) == (seen, unseen)
  dom = lambda p: p.split('/')[0]
  train_doms = {dom(x) for c in s.train for x in c.x}
  assert train_doms == {dom(x) for x in s.test[0].x}                    # seen test: the training domains
  assert not train_doms & {dom(x) for x in s.test[1].x}                  # unseen test: never trained on
  assert all(fds.idda_unseen(dom(x), setting) for x in s.test[1].x)
  per_dom = collections.Counter(dom(x) for c in s.train for x in c.x)
  assert set(per_dom.values()) == {48}
  if distribution == 'heterogeneous':
    assert all({dom(x) for x in c.x} == {c.name} for c in s.train)
  else:
    assert all(len({dom(x) for x in c.x}) == 48 for c in s.train)        # 48 distinct domains per client


def test_splits_are_deterministic_per_seed():
  train, val = _cityscapes_items()
  a = fds.cityscapes_split(train, val, 'uniform', seed=1)
  b = fds.cityscapes_split(list(reversed(train)), val, 'uniform', seed=1)   # input order does not matter
  c = fds.cityscapes_split(train, val, 'uniform', seed=2)
  assert a.train == b.train and a.train != c.train
  items = _idda_items(per_domain=10)
  assert fds.idda_split(items, 'rainy', 'uniform', 5).train == fds.idda_split(items[::-1], 'rainy', 'uniform', 5).train


def test_uniform_sizes_fallback_and_domain_names():
  assert fds.uniform_sizes(10, 3) == [4, 3, 3]
  with pytest.raises(ValueError):
    fds.uniform_sizes(2, 3)
  assert fds.idda_domain('T07_HRN_B') == ('T07', 'HRN', 'B')
  with pytest.raises(ValueError, match='not an IDDA domain'):
    fds.idda_domain('town7')


def test_released_file_table():
  assert len(fds.RELEASED_FILES) == 63 and len({p for p, _, _ in fds.RELEASED_FILES}) == 63
  assert all(len(sha) == 64 and size > 0 for _, size, sha in fds.RELEASED_FILES)
  assert fds.release_url('idda/heterogeneous/rainy/train/idda_by_city_rainy_train_clients.json').endswith(
      f'{fds.RELEASE_COMMIT}/data/idda/data/heterogeneous/rainy/train/idda_by_city_rainy_train_clients.json')
