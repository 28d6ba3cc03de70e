r"""Federated semantic segmentation on FedDrive (BiSeNetV2): thesis Table 4.10 and FedDrive Tables 6.2 / 6.3.

One cell per command:
  .venv/bin/python experiments/train.py --workdir=runs/idda_country_silobn_asam \
      --config=configs/feddrive.py:idda_country,silobn_asam
  .venv/bin/python experiments/train.py --workdir=runs/cs_silobn_lab \
      --config=configs/feddrive.py:cityscapes,silobn,lab,feddrive

Grammar (defaults: idda_country, heterogeneous, fedavg, no SWA, no style transfer, paper=thesis):
  dataset  = cityscapes | idda_country | idda_rainy
  split    = heterogeneous | uniform
  method   = fedavg | fedsam | fedasam | silobn | silobn_sam | silobn_asam | fedbn
  swa      (flag: server SWA from 75% of the rounds, Table A.3)
  style    = none | cfsi | lab      (style-transfer DG on half of each client's data, FedDrive section 6.2)
  paper    = thesis | feddrive      (which table's setting and number: thesis Table 4.10 or FedDrive 6.2 / 6.3)
CELLS lists the 68 cells of the three tables; each carries its published numbers in config.published:
`miou` (Cityscapes: the unseen-city test client) or `miou_seen` / `miou_unseen` (IDDA), in percent, with
`*_std` where published. Ours: 100 x summary.json `mean_last_100_test_miou` (Cityscapes) or
`mean_last_100_test_seen_miou` / `mean_last_100_test_unseen_miou` (IDDA).

Setting. Thesis (Table A.1-A.3; "mIoU at 1.5k rounds"): 1,500 rounds, 5 clients per round, 2 local epochs,
batch 8 (FedDrive's 16 halved: no mixed precision), client SGD momentum 0.9; Cityscapes lr 0.05, wd 5e-4;
IDDA lr 0.1, wd 0. SAM rho 0.01 (both); ASAM rho 0.1 (Cityscapes) / 0.5 (IDDA), eta 0.2. SWA c = 5, lr 5e-2
-> 5e-4 (Cityscapes) / 1e-1 -> 1e-3 (IDDA), start 1,125. FedDrive (its release configs/*.txt): 1,600 rounds,
batch 16, otherwise the same. Both: BiSeNetV2 (the FedDrive variant, BatchNorm, booster heads, 8,196,416
parameters for 19 classes), OHEM on the hardest 25% of each image's pixels, the heads' losses summed, the
client's poly lr schedule over its local steps (T = 10000 x E x 5 steps: the release's T = 10000 x E x
len(loader), so the rate decays by < 0.1% within a round), server FedAvg (SGD lr 1). Data (h16data,
fedjax_flat/data: cityscapes / idda): Cityscapes random scale 0.5-1.5 + crop 512x1024, colour jitter 0.4,
the data doubled with flipped copies (release `double_dataset`); IDDA images 1024x1856, random resized crop
(area 0.5-2.0) to 512x928, random flip; normalization mean = std = 0.5. FedDrive's uniform and heterogeneous
splits (146 / 144 Cityscapes clients; 90 / 69 IDDA clients in country / rainy).
Test protocol: evaluation every 50 rounds and every round of the last 100; reported = mean over those last
100 (the release averages every 5th round of the last 100: 21 evaluations; the thesis says "at 1.5k rounds",
[U] whether it averaged). Cityscapes test images at full resolution (1024x2048; `segmentation.eval_mode=
tiles` evaluates them in 512x1024 windows where memory is short, e.g. on CPU); IDDA at half resolution with
the logits upsampled x2 (the release's `use_test_resize`: eval_mode=downscale). BatchNorm at test time
(config.bn.test_policy auto): FedAvg the averaged running statistics; SiloBN / FedBN each test batch of 8
normalized with its own statistics (the release's `dd_batch_size` 8 for unseen domains). Not reproduced:
the release evaluates SiloBN's *seen-domain* IDDA client with the stored statistics of the training client of
the same domain ('_by_domain'); here the seen client also uses batch statistics.

Published mIoU (%). Thesis Table 4.10 (IDDA columns: country seen / unseen, rainy seen / unseen):
  uniform        country seen  unseen   rainy seen  unseen   Cityscapes
  FedAvg         63.31         48.60    65.16       27.38    43.61
  FedSAM         64.22         49.74    64.81       30.00    44.58
  FedASAM        62.74         48.73    64.74       31.32    45.86
  FedAvg+SWA     63.91         43.28    63.24       47.72    45.64
  FedSAM+SWA     62.26         46.26    63.69       48.40    45.29
  FedASAM+SWA    60.78         44.23    63.18       51.76    45.69
  heterogeneous
  FedAvg         42.06         36.04    39.50       24.59    38.65
  FedSAM         43.28         37.83    39.65       29.27    41.22
  FedASAM        43.67         36.11    41.68       30.07    42.27
  FedAvg+SWA     37.16         37.48    37.06       42.33    42.48
  FedSAM+SWA     44.26         40.45    38.15       45.25    43.42
  FedASAM+SWA    45.23         39.72    42.09       45.40    43.02
  SiloBN         45.86         32.77    48.09       39.67    45.96
  SiloBN+SAM     46.88         33.71    48.22       40.08    49.10
  SiloBN+ASAM    46.57         35.22    48.33       40.76    49.75
FedDrive Table 6.2 (Cityscapes; heterogeneous unless "uniform"): FedAvg uniform 45.71 +- 0.37; FedAvg
43.85 +- 1.24; FedAvg+CFSI 41.50 +- 0.98; FedAvg+LAB 39.20 +- 1.37; SiloBN 44.20 +- 1.43; SiloBN+CFSI
40.48 +- 1.40; SiloBN+LAB 42.23 +- 1.23.
FedDrive Table 6.3 (IDDA; country seen / unseen, rainy seen / unseen):
  FedAvg uniform  63.57 +- 0.60  49.74 +- 0.79  62.72 +- 3.65  27.61 +- 2.80
  FedAvg          42.43 +- 1.78  40.01 +- 1.26  38.18 +- 1.40  26.75 +- 2.32
  FedAvg+CFSI     54.70 +- 1.12  45.70 +- 1.73  55.24 +- 1.65  31.05 +- 2.68
  FedAvg+LAB      56.59 +- 0.90  45.68 +- 1.04  58.85 +- 0.89  26.82 +- 1.78
  FedBN           54.39          -              56.45          -
  SiloBN          58.82 +- 2.93  45.32 +- 0.90  62.48 +- 1.42  50.03 +- 0.79
  SiloBN+CFSI     61.22 +- 3.88  49.17 +- 1.01  63.04 +- 0.31  50.54 +- 0.88
  SiloBN+LAB      64.32 +- 0.76  50.43 +- 0.63  65.85 +- 0.91  53.99 +- 0.79
Not cells: FedDrive's server-optimizer runs (no numbers in the digest), FedBN on unseen clients (a new client
has no BN of its own: no number published), Table 6.2 has no FedBN row. Combinations outside the tables build
(e.g. fedasam,swa,lab) but carry no published number.
"""
import ml_collections

from fedjax_flat.config import families as config_strings, paper_hparams

FAMILY = 'configs/feddrive.py'
METHODS = ('fedavg', 'fedsam', 'fedasam', 'silobn', 'silobn_sam', 'silobn_asam', 'fedbn')
FIELDS = {'dataset': ('idda_country', ('cityscapes', 'idda_country', 'idda_rainy')),
          'split': ('heterogeneous', ('heterogeneous', 'uniform')),
          'method': ('fedavg', METHODS),
          'swa': (False, bool),
          'style': ('none', ('none', 'cfsi', 'lab')),
          'paper': ('thesis', ('thesis', 'feddrive'))}

# Table 4.10: (split, method, swa) -> (country seen, country unseen, rainy seen, rainy unseen, Cityscapes).
TABLE_4_10 = {
    ('uniform', 'fedavg', False): (63.31, 48.60, 65.16, 27.38, 43.61),
    ('uniform', 'fedsam', False): (64.22, 49.74, 64.81, 30.00, 44.58),
    ('uniform', 'fedasam', False): (62.74, 48.73, 64.74, 31.32, 45.86),
    ('uniform', 'fedavg', True): (63.91, 43.28, 63.24, 47.72, 45.64),
    ('uniform', 'fedsam', True): (62.26, 46.26, 63.69, 48.40, 45.29),
    ('uniform', 'fedasam', True): (60.78, 44.23, 63.18, 51.76, 45.69),
    ('heterogeneous', 'fedavg', False): (42.06, 36.04, 39.50, 24.59, 38.65),
    ('heterogeneous', 'fedsam', False): (43.28, 37.83, 39.65, 29.27, 41.22),
    ('heterogeneous', 'fedasam', False): (43.67, 36.11, 41.68, 30.07, 42.27),
    ('heterogeneous', 'fedavg', True): (37.16, 37.48, 37.06, 42.33, 42.48),
    ('heterogeneous', 'fedsam', True): (44.26, 40.45, 38.15, 45.25, 43.42),
    ('heterogeneous', 'fedasam', True): (45.23, 39.72, 42.09, 45.40, 43.02),
    ('heterogeneous', 'silobn', False): (45.86, 32.77, 48.09, 39.67, 45.96),
    ('heterogeneous', 'silobn_sam', False): (46.88, 33.71, 48.22, 40.08, 49.10),
    ('heterogeneous', 'silobn_asam', False): (46.57, 35.22, 48.33, 40.76, 49.75),
}
# Table 6.2 (Cityscapes): (split, method, style) -> (mIoU, std).
TABLE_6_2 = {
    ('uniform', 'fedavg', 'none'): (45.71, 0.37), ('heterogeneous', 'fedavg', 'none'): (43.85, 1.24),
    ('heterogeneous', 'fedavg', 'cfsi'): (41.50, 0.98), ('heterogeneous', 'fedavg', 'lab'): (39.20, 1.37),
    ('heterogeneous', 'silobn', 'none'): (44.20, 1.43), ('heterogeneous', 'silobn', 'cfsi'): (40.48, 1.40),
    ('heterogeneous', 'silobn', 'lab'): (42.23, 1.23),
}
# Table 6.3 (IDDA): (split, method, style) -> ((country seen, std), (country unseen, std), (rainy seen, std),
# (rainy unseen, std)); None = not published.
TABLE_6_3 = {
    ('uniform', 'fedavg', 'none'): ((63.57, 0.60), (49.74, 0.79), (62.72, 3.65), (27.61, 2.80)),
    ('heterogeneous', 'fedavg', 'none'): ((42.43, 1.78), (40.01, 1.26), (38.18, 1.40), (26.75, 2.32)),
    ('heterogeneous', 'fedavg', 'cfsi'): ((54.70, 1.12), (45.70, 1.73), (55.24, 1.65), (31.05, 2.68)),
    ('heterogeneous', 'fedavg', 'lab'): ((56.59, 0.90), (45.68, 1.04), (58.85, 0.89), (26.82, 1.78)),
    ('heterogeneous', 'fedbn', 'none'): ((54.39, None), None, (56.45, None), None),
    ('heterogeneous', 'silobn', 'none'): ((58.82, 2.93), (45.32, 0.90), (62.48, 1.42), (50.03, 0.79)),
    ('heterogeneous', 'silobn', 'cfsi'): ((61.22, 3.88), (49.17, 1.01), (63.04, 0.31), (50.54, 0.88)),
    ('heterogeneous', 'silobn', 'lab'): ((64.32, 0.76), (50.43, 0.63), (65.85, 0.91), (53.99, 0.79)),
}


def _cell(dataset, split, method, swa, style, paper):
  return ','.join([dataset] + ([split] if split != 'heterogeneous' else []) + [method] + (['swa'] if swa else [])
                  + ([style] if style != 'none' else []) + (['feddrive'] if paper == 'feddrive' else []))


CELLS = ([_cell(d, s, m, w, 'none', 'thesis') for d in FIELDS['dataset'][1] for (s, m, w) in TABLE_4_10]
         + [_cell('cityscapes', s, m, False, st, 'feddrive') for (s, m, st) in TABLE_6_2]
         + [_cell(d, s, m, False, st, 'feddrive') for d in ('idda_country', 'idda_rainy') for (s, m, st) in TABLE_6_3])


def _published(c, o):
  ds, key = o['dataset'], (o['split'], o['method'])
  if o['paper'] == 'thesis':
    row = TABLE_4_10.get(key + (o['swa'],)) if o['style'] == 'none' else None
    if row is None:
      return
    name = {'fedavg': 'FedAvg', 'fedsam': 'FedSAM', 'fedasam': 'FedASAM', 'silobn': 'SiloBN',
            'silobn_sam': 'SiloBN+SAM', 'silobn_asam': 'SiloBN+ASAM'}[o['method']] + ('+SWA' if o['swa'] else '')
    c.published.source = f'thesis Table 4.10 (FedDrive, BiSeNetV2, mIoU at 1.5k rounds), {name}, {o["split"]}, {ds}'
    if ds == 'cityscapes':
      c.published.miou = row[4]
    else:
      i = 0 if ds == 'idda_country' else 2
      c.published.miou_seen, c.published.miou_unseen = row[i], row[i + 1]
    return
  if o['swa'] or o['method'] not in ('fedavg', 'silobn', 'fedbn'):
    return
  skey = key + (o['style'],)
  name = {'fedavg': 'FedAvg', 'silobn': 'SiloBN', 'fedbn': 'FedBN'}[o['method']]
  name += ({'none': '', 'cfsi': ' + CFSI', 'lab': ' + LAB'}[o['style']]
           + (' (uniform)' if o['split'] == 'uniform' else ''))
  if ds == 'cityscapes':
    if skey not in TABLE_6_2:
      return
    c.published.source = f'FedDrive Table 6.2 (Cityscapes, mIoU, mean +- std), {name}'
    c.published.miou, c.published.miou_std = TABLE_6_2[skey]
    return
  if skey not in TABLE_6_3:
    return
  cs, cu, rs, ru = TABLE_6_3[skey]
  seen, unseen = (cs, cu) if ds == 'idda_country' else (rs, ru)
  c.published.source = f'FedDrive Table 6.3 (IDDA {ds[5:]}, mIoU, mean +- std), {name}'
  for field, val in (('miou_seen', seen), ('miou_unseen', unseen)):
    if val is not None:
      c.published[field] = val[0]
      if val[1] is not None:
        c.published[f'{field}_std'] = val[1]


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  from fedjax_flat.config.default_config import default_config, segmentation_data
  c = default_config()
  ds = o['dataset']
  base = 'cityscapes' if ds == 'cityscapes' else 'idda'
  c.dataset = base
  extra = {} if base == 'cityscapes' else {'setting': ds[len('idda_'):]}
  c.data = segmentation_data(base, distribution=o['split'], style=o['style'], **extra)
  c.augment = 'segmentation'
  c.normalize = 'feddrive'
  c.model = 'bisenetv2'
  c.model_kwargs = ml_collections.ConfigDict({'conv_impl': 'auto', 'norm': 'bn', 'variant': 'feddrive',
                                              'aux': True, 'remat': False})
  paper_hparams.apply_training(c, base)
  c.clients_per_round = 5
  if o['paper'] == 'feddrive':
    c.rounds, c.client.batch_size = 1600, 16
  c.client.lr_schedule, c.client.lr_power = 'poly_step', 0.9
  c.client.lr_poly_max = 10000 * c.client.local_epochs * 5
  method = o['method']
  c.algorithm = {'silobn_sam': 'silobn', 'silobn_asam': 'silobn'}.get(method, method)
  opt = {'fedsam': 'fedsam', 'silobn_sam': 'fedsam', 'fedasam': 'fedasam', 'silobn_asam': 'fedasam'}.get(method,
                                                                                                      'fedavg')
  for k, v in paper_hparams.client_optimizer(base, None, opt).items():
    c.client[k] = v
  if method in ('fedsam', 'fedasam'):
    c.algorithm = 'fedavg'
  paper_hparams.apply_swa(c, base, enabled=o['swa'])
  c.segmentation.ohem, c.segmentation.ohem_fraction, c.segmentation.aux_weight = 'topk', 0.25, 1.0
  c.segmentation.eval_mode = 'full' if base == 'cityscapes' else 'downscale'
  c.segmentation.eval_scale = 0.5
  c.segmentation.by_test_client = True
  c.bn.test_policy, c.bn.test_batch_size = 'auto', 8
  c.eval_batch_size = 1 if base == 'cityscapes' else 8
  c.eval_every, c.eval_every_last, c.summary_last_k = 50, 100, 100
  _published(c, o)
  return c
