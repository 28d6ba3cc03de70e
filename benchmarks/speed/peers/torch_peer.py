r"""The PyTorch reference pattern: the one torch implementation the benchmarks compare against.

What the FedSAM reference code (debcaldarola/fedsam) does in a round, on the same models as ours:
sequential clients; each loads the server weights, trains E local epochs with a fresh torch SGD (weight decay
inside the optimizer, no momentum) over shuffled mini-batches (the last one partial); SAM is the reference
minimizer (gradient, ascent to w + rho g/||g||, second gradient there, restore w, then the SGD step); the
server sets its weights to the example-weighted average of the clients' weights (FedAvg, server lr 1), or their
plain average with spec `weighting='uniform'` (pfl-research's CIFAR10 protocol; model 'pfl_cnn', whose
dropout is on unless spec `dropout` is False).
Generous to torch: each client's data are torch tensors (NCHW) made once at set-up, not a DataLoader.

Used two ways:
  * imported (benchmarks/speed/cnn_step.py): `build_net`, `local_step` for the step-level comparison;
  * as a peer subprocess (benchmarks/speed/peers/protocol.py), `python torch_peer.py --serve`: the round-level
    comparisons (round_throughput.py, rounds_per_s.py, accelerator.py).
  python -m benchmarks.speed.peers.torch_peer --check      builds every model, runs two rounds of a tiny problem
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from benchmarks.speed.peers import protocol


class CifarCNN(nn.Module):
  """The FedSAM CIFAR CNN (models/cnn.py CifarCNN): conv5-64, pool, conv5-64, pool, fc384, fc192, fc."""

  def __init__(self, num_classes=100):
    super().__init__()
    self.conv1, self.conv2 = nn.Conv2d(3, 64, 5), nn.Conv2d(64, 64, 5)
    self.fc1, self.fc2, self.fc3 = nn.Linear(1600, 384), nn.Linear(384, 192), nn.Linear(192, num_classes)

  def forward(self, v):
    v = F.max_pool2d(torch.relu(self.conv1(v)), 2)
    v = F.max_pool2d(torch.relu(self.conv2(v)), 2)
    v = torch.relu(self.fc1(v.flatten(1)))
    return self.fc3(torch.relu(self.fc2(v)))


class DigitsCNN(nn.Module):
  """models/cnn.py DigitsCNN (no GroupNorm): conv3-32 SAME x2, pool, fc128, fc."""

  def __init__(self, num_classes=10, hw=(8, 8), cin=1):
    super().__init__()
    self.conv1, self.conv2 = nn.Conv2d(cin, 32, 3, padding=1), nn.Conv2d(32, 32, 3, padding=1)
    self.fc1 = nn.Linear(32 * (hw[0] // 2) * (hw[1] // 2), 128)
    self.fc2 = nn.Linear(128, num_classes)

  def forward(self, v):
    v = F.max_pool2d(torch.relu(self.conv2(torch.relu(self.conv1(v)))), 2)
    return self.fc2(torch.relu(self.fc1(v.flatten(1))))


class PflCNN(nn.Module):
  """models/cnn.py PflCNN as pfl-research's PyTorch port writes `simple_cnn` (benchmarks/model/pytorch/cnn.py):
  conv3-32, ReLU, conv3-64, ReLU, maxpool 2, dropout 0.25, flatten (CHW), fc128, ReLU, dropout 0.5, fc;
  xavier_uniform_ weights. `dropout=False`: without the two dropout layers (exact comparisons)."""

  def __init__(self, num_classes=10, hw=(32, 32), cin=3, dropout=True):
    super().__init__()
    self.conv1, self.conv2 = nn.Conv2d(cin, 32, 3), nn.Conv2d(32, 64, 3)
    self.fc1 = nn.Linear(64 * ((hw[0] - 4) // 2) * ((hw[1] - 4) // 2), 128)
    self.fc2 = nn.Linear(128, num_classes)
    self.drop1 = nn.Dropout(0.25) if dropout else nn.Identity()
    self.drop2 = nn.Dropout(0.5) if dropout else nn.Identity()
    for m in (self.conv1, self.conv2, self.fc1, self.fc2):
      nn.init.xavier_uniform_(m.weight)

  def forward(self, v):
    v = self.drop1(F.max_pool2d(torch.relu(self.conv2(torch.relu(self.conv1(v)))), 2))
    return self.fc2(self.drop2(torch.relu(self.fc1(v.flatten(1)))))


class MLP(nn.Module):
  def __init__(self, num_in, hidden, num_classes):
    super().__init__()
    dims = [num_in, *hidden]
    self.hidden = nn.ModuleList([nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:])])
    self.out = nn.Linear(dims[-1], num_classes)

  def forward(self, v):
    v = v.flatten(1)
    for layer in self.hidden:
      v = torch.relu(layer(v))
    return self.out(v)


class BasicBlock(nn.Module):
  def __init__(self, cin, cout, stride, groups=2):
    super().__init__()
    self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
    self.gn1 = nn.GroupNorm(groups, cout)
    self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
    self.gn2 = nn.GroupNorm(groups, cout)
    self.shortcut = nn.Sequential()
    if stride != 1 or cin != cout:
      self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(groups, cout))

  def forward(self, v):
    y = torch.relu(self.gn1(self.conv1(v)))
    return torch.relu(self.gn2(self.conv2(y)) + self.shortcut(v))


class ResNet18GN(nn.Module):
  """models/resnet.py resnet18 (CIFAR stem, GroupNorm 2 groups, projection shortcuts)."""

  def __init__(self, num_classes=100, cin=3):
    super().__init__()
    self.stem = nn.Sequential(nn.Conv2d(cin, 64, 3, 1, 1, bias=False), nn.GroupNorm(2, 64), nn.ReLU())
    blocks, c = [], 64
    for i, w in enumerate((64, 128, 256, 512)):
      for j in range(2):
        blocks.append(BasicBlock(c, w, 2 if (i > 0 and j == 0) else 1))
        c = w
    self.blocks = nn.Sequential(*blocks)
    self.fc = nn.Linear(512, num_classes)

  def forward(self, v):
    return self.fc(self.blocks(self.stem(v)).mean(dim=(2, 3)))


def build_net(model: str, num_classes: int, input_shape, hidden=(32,), dropout: bool = True) -> nn.Module:
  """input_shape: NHWC of one example, as our models take it."""
  h, w, c = input_shape
  if model == 'cifar_cnn':
    return CifarCNN(num_classes)
  if model == 'pfl_cnn':
    return PflCNN(num_classes, (h, w), c, dropout=dropout)
  if model == 'digits_cnn':
    return DigitsCNN(num_classes, (h, w), c)
  if model == 'mlp':
    return MLP(h * w * c, tuple(hidden), num_classes)
  if model == 'resnet18_gn':
    return ResNet18GN(num_classes, c)
  raise protocol.PeerError(f'torch peer: unknown model {model!r}')


def local_step(net, opt, x, y, rho: float = 0.0, asam_eta: float = -1.0):
  """One client step: SGD (weight decay in `opt`), or SAM as the FedSAM reference minimizer when rho > 0, or
  ASAM (asam_eta >= 0: e = rho T^2 g / ||T g||, T = |w| + eta on the 'weight' tensors, 1 on the biases; the
  FedSAM reference's ASAM minimizer)."""
  opt.zero_grad()
  F.cross_entropy(net(x), y).backward()
  if rho > 0:   # ascent to w + e; the gradient there; back to w; the SGD step with it
    named = [(n, p) for n, p in net.named_parameters() if p.grad is not None]
    params = [p for _, p in named]
    with torch.no_grad():
      if asam_eta >= 0:
        t = [(torch.abs(p) + asam_eta) if n.endswith('weight') else torch.ones_like(p) for n, p in named]
        norm = torch.norm(torch.stack([(ti * p.grad).norm(2) for ti, p in zip(t, params)]), 2)
        eps = [ti * ti * p.grad * (rho / (norm + 1e-12)) for ti, p in zip(t, params)]
      else:
        norm = torch.norm(torch.stack([p.grad.norm(2) for p in params]), 2)
        eps = [p.grad * (rho / (norm + 1e-12)) for p in params]
      for p, e in zip(params, eps):
        p.add_(e)
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    with torch.no_grad():
      for p, e in zip(params, eps):
        p.sub_(e)
  opt.step()


class FedAvgRound:
  """One problem: the clients' tensors, the server weights, `round()` runs one FedAvg round."""

  def __init__(self, spec: dict, device: str = 'cpu'):
    self.spec, self.device = spec, torch.device(device)
    clients = protocol.read_problem(spec['data'])
    shape = clients[0][0].shape[1:]
    if len(shape) == 1:
      shape = (1, 1, shape[0])
    torch.manual_seed(int(spec['seed']))
    self.net = build_net(spec['model'], int(spec['num_classes']), shape, spec.get('hidden', (32,)),
                         dropout=bool(spec.get('dropout', True))).to(self.device)
    if spec.get('weighting', 'examples') not in ('examples', 'uniform'):
      raise protocol.PeerError(f"spec weighting={spec['weighting']!r}; allowed: 'examples', 'uniform'")
    to_nchw = lambda x: torch.from_numpy(
        np.ascontiguousarray(x.reshape((len(x),) + tuple(shape)).transpose(0, 3, 1, 2)))
    self.clients = [(to_nchw(x).to(self.device), torch.from_numpy(y.astype(np.int64)).to(self.device))
                    for x, y in clients]
    self.server = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
    self.gen = torch.Generator().manual_seed(int(spec['seed']))
    self.round_idx = 0

  def round(self):
    s = self.spec
    k = len(self.clients)
    m = min(int(s['clients_per_round']), k)
    ids = (range(k) if m == k else
           np.random.default_rng([int(s['seed']), self.round_idx]).choice(k, m, replace=False))
    total, acc = 0.0, None
    rho = float(s['rho']) if s['optimizer'] in ('sam', 'asam') else 0.0
    eta = float(s.get('asam_eta', 0.01)) if s['optimizer'] == 'asam' else -1.0
    for cid in ids:
      x, y = self.clients[cid]
      self.net.load_state_dict(self.server)
      opt = torch.optim.SGD(self.net.parameters(), lr=float(s['lr']), weight_decay=float(s['weight_decay']))
      b = int(s['batch_size'])
      for _ in range(int(s['epochs'])):
        order = torch.randperm(len(y), generator=self.gen).to(self.device)
        for i in range(0, len(y), b):
          sel = order[i:i + b]
          local_step(self.net, opt, x[sel], y[sel], rho, eta)
      n = float(len(y)) if s.get('weighting', 'examples') == 'examples' else 1.0   # uniform: per user
      with torch.no_grad():
        sd = self.net.state_dict()
        if acc is None:
          acc = {q: v * n for q, v in sd.items()}
        else:
          for q, v in sd.items():
            acc[q].add_(v, alpha=n)
      total += n
    self.server = {q: v / total for q, v in acc.items()}
    self.round_idx += 1

  def evaluate(self, x, y, batch_size: int):
    """(accuracy, mean loss) of the server model on x [N, ...] (NHWC numpy) / y, in batches, as a torch user
    evaluates: eval mode, no_grad; the test tensors made once."""
    if getattr(self, '_test', None) is None or self._test[0] is not x:
      shape = self.clients[0][0].shape[1:]           # C, H, W
      xt = torch.from_numpy(np.ascontiguousarray(x.reshape((len(x),) + (shape[1], shape[2], shape[0]))
                                                 .transpose(0, 3, 1, 2))).to(self.device)
      self._test = (x, xt, torch.from_numpy(y.astype(np.int64)).to(self.device))
    _, xt, yt = self._test
    self.net.load_state_dict(self.server)
    self.net.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
      for i in range(0, len(yt), batch_size):
        out = self.net(xt[i:i + batch_size])
        correct += int((out.argmax(1) == yt[i:i + batch_size]).sum())
        loss += float(F.cross_entropy(out, yt[i:i + batch_size], reduction='sum'))
    self.net.train()
    return correct / len(yt), loss / len(yt)

  def sync(self):
    if self.device.type == 'cuda':
      torch.cuda.synchronize()

  def peak_mem(self):
    return torch.cuda.max_memory_allocated() if self.device.type == 'cuda' else protocol.peak_rss_bytes()

  def reset_peak(self):
    if self.device.type == 'cuda':
      torch.cuda.reset_peak_memory_stats()


DEFAULT_THREADS = torch.get_num_threads()


class ThreadedRound(FedAvgRound):
  """A problem with its own torch thread count (spec `threads`, 0 = torch's default): set before each round,
  since the count is process-wide and one peer serves several problems."""

  def __init__(self, spec, device='cpu'):
    self.threads = int(spec.get('threads', 0) or 0) or DEFAULT_THREADS
    torch.set_num_threads(self.threads)
    super().__init__(spec, device)

  def round(self):
    if torch.get_num_threads() != self.threads:
      torch.set_num_threads(self.threads)
    super().round()


def _make_problem(spec):
  return ThreadedRound(spec, spec.get('device', 'cpu'))


def _info():
  return {'stack': 'torch', 'torch': torch.__version__, 'threads': torch.get_num_threads(),
          'cuda': torch.cuda.is_available()}


if __name__ == '__main__':
  server = protocol.ProblemServer(_make_problem, _info)
  if protocol.whole_run_arg(sys.argv):
    protocol.whole_run(_make_problem, protocol.whole_run_arg(sys.argv))
  elif '--serve' in sys.argv:
    server.serve()
  elif '--check' in sys.argv:
    server.check(('cifar_cnn', 'digits_cnn', 'mlp', 'resnet18_gn', 'pfl_cnn'))
  else:
    print(__doc__)
