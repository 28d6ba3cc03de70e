"""The torch side of flat2024_releases.py: runs ONE release's own code on the tensors of an .npz and writes what
it produced to another .npz. Runs under .venv-torch (torch + numpy only), started by the driver with the release's
exported checkout on PYTHONPATH (its modules import each other as top-level names: `from utils import *`).

  .venv-torch/bin/python -m benchmarks.reference.flat2024_torch_side --method=M --release_dir=D --inp=A --out=B

The shims (each one printed to the log and returned in the output as 'shims'):
  * a top-level module the release imports and .venv-torch lacks (tqdm, torchvision, ray, ...) is replaced by an
    empty stand-in, only when its import fails, and only the names the exercised code never calls;
  * data: the release's data loaders are replaced by the driver's fixed batches, in order (no shuffling);
  * what a run writes or evaluates (test passes, checkpoints to /mnt/..., summaries) is replaced by a no-op;
  * client sampling is replaced by the driver's fixed schedule;
  * main_FedNSAM.py / main_FedSWA.py do their work at import time (argparse, ray, a CIFAR download): their
    DataWorker class and server functions are taken from the file with `ast`, unchanged, and executed with the
    globals they read (args, device, the model class) set here instead.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.machinery
import os
import sys
import types

import numpy as np
import torch
from torch import nn

SHIMS: list[str] = []


class _Stub(types.ModuleType):
  pass


def _stub(name):
  """An importable stand-in for a missing third-party module: every attribute is another stand-in."""
  class _Any(_Stub):
    def __getattr__(self, attr):
      if attr.startswith('__'):
        raise AttributeError(attr)
      return _Any(f'{self.__name__}.{attr}')

    def __call__(self, *a, **k):
      return _Any(self.__name__ + '()')

  mod = _Any(name)
  mod.__path__ = []
  mod.__spec__ = importlib.machinery.ModuleSpec(name, None)   # torch._dynamo's find_spec reads it
  return mod


def import_with_stubs(modname):
  """importlib.import_module, stubbing each missing top-level dependency (recorded in SHIMS) and retrying."""
  for _ in range(30):
    try:
      return importlib.import_module(modname)
    except ModuleNotFoundError as e:
      top = e.name.split('.')[0]
      here = os.path.join(os.environ.get('RELEASE_DIR', ''), top)
      if os.path.exists(here) or os.path.exists(here + '.py') or top == modname.split('.')[0]:
        raise
      SHIMS.append(f'missing module {e.name!r} replaced by an empty stand-in')
      parts = e.name.split('.')
      for i in range(1, len(parts) + 1):
        name = '.'.join(parts[:i])
        if not isinstance(sys.modules.get(name), _Stub):
          sys.modules[name] = _stub(name)
  raise RuntimeError(f'could not import {modname}')


class MLP(nn.Module):
  """The driver's network: Linear(d, h), ReLU, Linear(h, classes) = fedjax_flat's 'mlp' with hidden=(h,)."""

  def __init__(self, d, h, k):
    super().__init__()
    self.l1, self.l2 = nn.Linear(d, h), nn.Linear(h, k)

  def forward(self, x):
    return self.l2(torch.relu(self.l1(x.reshape(len(x), -1))))

  # main_FedSWA.py's update_FedMoSWA reads and writes the model through these two (its networks define them)
  def get_weights(self):
    return {k: v.cpu() for k, v in self.state_dict().items()}

  def set_weights(self, weights):
    self.load_state_dict(weights)


def flat(model):
  return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().astype(np.float64)


def load_flat(model, vec):
  i = 0
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.as_tensor(vec[i:i + p.numel()], dtype=torch.float32).reshape(p.shape))
      i += p.numel()
  return model


class Problem:
  """The driver's tensors: w0 (flat, torch order), x [C, S, B, d], y [C, S, B], schedule [R, |S|], hparams."""

  def __init__(self, path):
    z = np.load(path, allow_pickle=False)
    self.w0 = z['w0']
    self.x, self.y = z['x'], z['y']
    self.schedule = [list(map(int, r)) for r in z['schedule']]
    self.hp = {k[3:]: float(z[k]) for k in z.files if k.startswith('hp_')}
    self.C, self.S, self.B, self.d = self.x.shape
    self.h, self.k = int(self.hp['hidden']), int(self.hp['classes'])

  def model(self):
    return load_flat(MLP(self.d, self.h, self.k), self.w0)

  def batches(self, c):
    return [(torch.as_tensor(self.x[c, s]), torch.as_tensor(self.y[c, s]).long()) for s in range(self.S)]


# ---------------------------------------------------------------- FedLESAM (-S, -D) and FedWMSAM: server.train()

def per_tensor_first_step(cls, model_fn):
  """The per-tensor reading of LESAM/WMSAM.first_step: g_update handed to it as the list of per-parameter tensors
  its loop indexes (`g_update[idx]`), instead of the flat vector (whose idx-th entry is one scalar)."""
  orig = cls.first_step
  shapes = [p.shape for p in model_fn().parameters()]

  def first_step(self, g_update):
    if g_update is not None:
      parts, i = [], 0
      for s in shapes:
        n = int(np.prod(s))
        parts.append(g_update[i:i + n].reshape(s))
        i += n
      g_update = parts
    return orig(self, g_update)
  cls.first_step = first_step
  SHIMS.append(f'{cls.__name__}.first_step given g_update split per parameter tensor (the per-tensor reading)')


def run_server_framework(pb, server_name, client_opt, per_tensor, extra_args):
  """FedLESAM's / FedWMSAM's Server.train() as released, for len(schedule) rounds on the driver's batches."""
  pkg = types.ModuleType('server')   # server/__init__.py imports modules this checkout lacks (FedSpeed, FedGAMMA)
  pkg.__path__ = [os.path.join(os.environ['RELEASE_DIR'], 'server')]
  sys.modules['server'] = pkg
  SHIMS.append('server/__init__.py skipped (it imports server/FedSpeed.py, FedGAMMA.py: not in the checkout); '
               f'server/{server_name}.py imported directly')
  srv_base = import_with_stubs('server.server')
  srv = import_with_stubs(f'server.{server_name}')
  optim = import_with_stubs('optimizer')
  if per_tensor:
    per_tensor_first_step(getattr(optim, client_opt), pb.model)
  model_fn = pb.model
  # data: DataLoader(Dataset(client_x[c], client_y[c], ...), batch_size, shuffle=True) -> the fixed batches
  client_x = [pb.x[c].reshape(pb.S * pb.B, pb.d) for c in range(pb.C)]
  client_y = [pb.y[c].reshape(pb.S * pb.B) for c in range(pb.C)]
  loader = types.SimpleNamespace(DataLoader=lambda ds, batch_size, shuffle=False, **kw: [
      (torch.as_tensor(ds[0][i:i + batch_size]), torch.as_tensor(ds[1][i:i + batch_size]))
      for i in range(0, len(ds[0]), batch_size)])
  cl_base = import_with_stubs('client.client')
  for mod in (srv_base, cl_base):   # FedLESAM's server builds the loader, FedWMSAM's client does
    if hasattr(mod, 'Dataset'):
      mod.Dataset = lambda x, y, **kw: (x, y)
      mod.data = loader
      SHIMS.append(f'{mod.__name__}.data.DataLoader / Dataset -> the fixed batches in order')
  hp = pb.hp
  args = types.SimpleNamespace(
      total_client=pb.C, comm_rounds=len(pb.schedule), local_learning_rate=hp['lr'], weight_decay=hp['wd'],
      rho=hp['rho'], local_epochs=1, use_RI=False, global_learning_rate=1.0, lr_decay=1.0, batchsize=pb.B,
      mode='normal', method=server_name, seed=0, active_ratio=1.0, dataset='synthetic', beta=0.1, **extra_args)
  datasets = types.SimpleNamespace(client_x=client_x, client_y=client_y)
  cls = getattr(srv, server_name)
  w0 = torch.as_tensor(pb.w0, dtype=torch.float32)
  server = cls(device='cpu', model_func=model_fn, init_model=model_fn(), init_par_list=w0.clone(),
               datasets=datasets, method=server_name, args=args)
  schedule = list(pb.schedule)
  rounds, clients = [], []
  server._activate_clients_ = lambda t: np.array(schedule[t])
  orig_global = server.global_update

  def global_update(selected, avg_update, avg_model):   # records each round's clients' models, then theirs
    clients.append(server.clients_params_list[selected].numpy().astype(np.float64).copy())
    out = orig_global(selected, avg_update, avg_model)
    rounds.append(out.numpy().astype(np.float64).copy())
    return out
  server.global_update = global_update
  server._test_ = lambda t, sel: None
  server._save_results_ = server._summary_ = lambda: None
  SHIMS.append('Server._activate_clients_ -> the fixed schedule; _test_ / _save_results_ / _summary_ -> no-ops '
               '(they evaluate and write to /mnt/workspace); global_update wrapped to record its input and output')
  server.train()
  return {'rounds': np.stack(rounds), 'clients': np.stack(clients)}


# ---------------------------------------------------------------- FedGF: fedlab's StandalonePipeline

def run_fedgf(pb):
  fg = import_with_stubs('fedlab.contrib.algorithm.fedgf')
  standalone = import_with_stubs('fedlab.core.standalone')
  hp = pb.hp
  model = pb.model()
  handler = fg.FedGfServerHandler(model=model, global_round=len(pb.schedule), num_clients=pb.C,
                                  sample_ratio=len(pb.schedule[0]) / pb.C, cuda=False)
  handler.device = 'cpu'   # set by the model maintainer only when cuda=True (the release runs on 'cuda:0')
  SHIMS.append("handler.device = 'cpu' (ModelMaintainer sets it only with cuda=True)")
  handler.setup_optim(hp['rho_global'], hp['threshold'], int(hp['window']))
  trainer = fg.FedGfSerialClientTrainer(model, pb.C, rho=hp['rho'], cuda=False)
  trainer.setup_optim(1, pb.B, hp['lr'], weight_decay=hp['wd'], momentum=0)
  trainer.setup_dataset(types.SimpleNamespace(get_dataloader=lambda cid, bs: pb.batches(cid)))
  schedule = list(pb.schedule)
  rounds, perturbed, clients, cs = [], [], [], []
  handler.sample_clients = lambda num_to_sample=None: schedule.pop(0)
  type(handler).if_stop = property(lambda self: not schedule)
  orig_local, orig_global = trainer.local_process, handler.global_update

  def local_process(payload, ids):
    orig_local(payload, ids)
    clients.append(np.stack([p[0].numpy().astype(np.float64) for p in trainer.cache]))

  def global_update(buffer, upload_res=False):
    cs.append(float(handler.c))
    orig_global(buffer)
    rounds.append(handler.model_parameters.numpy().astype(np.float64).copy())
    perturbed.append(handler.perturbed_model_parameters.numpy().astype(np.float64).copy())
  trainer.local_process, handler.global_update = local_process, global_update
  pipe = standalone.StandalonePipeline(handler, trainer)
  pipe.evaluate = lambda: None
  SHIMS.append('trainer dataset -> the fixed batches; handler.sample_clients -> the fixed schedule, if_stop when '
               'it is used up; pipeline.evaluate -> no-op; local_process / global_update wrapped to record')
  pipe.main()
  return {'rounds': np.stack(rounds), 'perturbed': np.stack(perturbed), 'clients': np.stack(clients),
          'c_used': np.asarray(cs + [float(handler.c)])}


# ---------------------------------------------------------------- FedNSAM / FedSWA: main_*.py, taken with ast

def script_objects(path, names, env):
  """Executes the named top-level classes / functions of a script, unchanged (a class's decorators dropped:
  @ray.remote), in a namespace holding `env`; returns the namespace."""
  tree = ast.parse(open(path).read(), path)
  body = []
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
      if isinstance(node, ast.ClassDef):
        node.decorator_list = []
      body.append(node)
  found = {n.name for n in body}
  if found != set(names):
    raise RuntimeError(f'{path}: not found: {set(names) - found}')
  ns = dict(env)
  exec(compile(ast.Module(body=body, type_ignores=[]), path, 'exec'), ns)
  SHIMS.append(f'{os.path.basename(path)}: {sorted(names)} executed unchanged (DataWorker without @ray.remote) '
               f'with the globals {sorted(k for k in env if not k.startswith("__"))} set here')
  return ns


def _state(model):
  return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _flat_state(sd, model):
  return np.concatenate([sd[k].detach().reshape(-1).numpy().astype(np.float64) for k, _ in model.named_parameters()])


def _worker(ns, pb, alg):
  w = ns['DataWorker'].__new__(ns['DataWorker'])
  # DataWorker.__init__ builds the CIFAR network and reads the script's data globals; these are its fields
  w.model, w.criterion, w.ci, w.alg, w.num_workers = pb.model(), nn.CrossEntropyLoss(), {}, alg, pb.C
  return w


def run_script(pb, method):
  hp = pb.hp
  script = 'main_FedNSAM.py' if method == 'fednsam' else 'main_FedSWA.py'
  path = os.path.join(os.environ['RELEASE_DIR'], script)
  sam = import_with_stubs('sam')
  n_sel = len(pb.schedule[0])
  args = types.SimpleNamespace(K=pb.S, gamma=hp.get('gamma', 0.85), rho=0.05, lora=0, num_workers=pb.C,
                               selection=n_sel / pb.C, lg=1.0)
  from copy import deepcopy
  env = {'args': args, 'device': 'cpu', 'torch': torch, 'nn': nn, 'deepcopy': deepcopy, 'SAM': sam.SAM,
         'selection': n_sel / pb.C, 'c_dict': {}, 'ci_dict': {}, 'alg': hp.get('alg_name', '')}
  if method == 'fednsam':
    ns = script_objects(path, ['DataWorker', 'apply_weights_avgACG'], env)
  else:
    ns = script_objects(path, ['DataWorker', 'apply_weights_avg', 'apply_weights_SCAF'], env)
  ns['alg'] = {'fedswa': 'FedSWA', 'fedmoswa': 'FedMoSWA', 'scafplus': 'MoFedSWA'}.get(method, 'FedNSAM')
  workers = {c: _worker(ns, pb, ns['alg']) for c in range(pb.C)}
  for c, wk in workers.items():
    wk.data_id_loader = (lambda cc: lambda index: setattr(workers[cc], 'data_iterator', pb.batches(cc)))(c)
  SHIMS.append('DataWorker.data_id_loader -> the fixed batches of the client; one DataWorker per client (the '
               'script keeps a client\'s c_i in the global c_dict / ci_dict, set here to {})')
  server = pb.model()
  momen, ps_c = {}, {}
  rounds, clients, ms = [], [], []
  for ids in pb.schedule:
    weights = _state(server)
    outs = []
    for c in ids:
      wk = workers[c]
      if method == 'fednsam':
        outs.append(wk.update_NSAM(deepcopy(weights), 1, c, deepcopy(momen), hp['lr']))
      elif method == 'fedswa':
        outs.append(wk.update_FedSWA(deepcopy(weights), 1, c, hp['lr']))
      elif method == 'fedmoswa':
        outs.append(wk.update_FedMoSWA(deepcopy(weights), 1, c, deepcopy(ps_c), hp['lr']))
      else:
        outs.append(wk.update_scafplus(deepcopy(weights), 1, c, deepcopy(ps_c), hp['lr']))
    clients.append(np.stack([flat(workers[c].model) for c in ids]))   # the client's model after its steps
    if method == 'fednsam':
      _, momen = ns['apply_weights_avgACG'](pb.C, outs, server, momen)
      ms.append(_flat_state(momen, server))
    elif method == 'fedswa':
      ns['apply_weights_avg'](pb.C, outs, server)
    else:
      _, ps_c = ns['apply_weights_SCAF'](pb.C, outs, server, ps_c)
      ms.append(_flat_state(ps_c, server))
    rounds.append(flat(server))
  out = {'rounds': np.stack(rounds), 'clients': np.stack(clients)}
  if ms:
    out['state'] = np.stack(ms)
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--method', required=True)
  ap.add_argument('--variant', default='per_tensor')
  ap.add_argument('--inp', required=True)
  ap.add_argument('--out', required=True)
  a = ap.parse_args()
  pb = Problem(a.inp)
  torch.set_num_threads(1)
  per_tensor = a.variant == 'per_tensor'
  if a.method in ('fedlesam', 'fedlesam_s', 'fedlesam_d'):
    name, opt = {'fedlesam': ('FedLESAM', 'LESAM'), 'fedlesam_s': ('FedLESAM_S', 'LESAM_S'),
                 'fedlesam_d': ('FedLESAM_D', 'LESAM_D')}[a.method]
    out = run_server_framework(pb, name, opt, per_tensor, {'lamb': pb.hp['lamb'], 'alpha': 0.1})
  elif a.method == 'fedwmsam':
    out = run_server_framework(pb, 'FedWMSAM', 'WMSAM', per_tensor, {'alpha': pb.hp['alpha'], 'lamb': 0.1})
  elif a.method == 'fedgf':
    out = run_fedgf(pb)
  else:
    out = run_script(pb, a.method)
  np.savez(a.out, shims=np.asarray(SHIMS), torch_version=np.asarray(torch.__version__), **out)
  print('\n'.join(SHIMS))


if __name__ == '__main__':
  main()
