"""config.client_eval: every client (or a sample fixed by the seed) evaluated on its own held-out examples
(evaluation/client_eval.py), the global model and with `personalize_steps=k` the model after k local fine-tuning
steps: the distribution over the clients in the evaluation records (`clients_acc_mean`, `_std`, `_p10`, `_p90`,
`_worst`, `_gini`, `clients_loss_mean`; `clients_ft_acc_*` after fine-tuning), every client's numbers in
WORKDIR/clients.jsonl (round, client, n, acc, loss[, ft_acc, ft_loss]), clients_cdf.png (the CDF of client
accuracy per client evaluation) and summary.json `client_eval` with a line in summary.md saying which clients and
which examples (`source`: 'own_split' | 'label_matched'). At evaluation rounds every `client_eval.every` rounds
(0: every evaluation) and at the last round. Clients without held-out examples are left out of the statistics.
An algorithm with personal models (a `Personalizer`: Ditto's v_k, FedRep's local heads, FedSoup, FedFomo, local
normalization) also has each client's own model evaluated on the same examples: `clients_personal_acc_*`,
`clients_personal_loss_mean`, the rows' `personal_acc` / `personal_loss` (a client never sampled: the global
model, as algorithms/personalization.py gives it)."""
from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.algorithms.personalization import global_params, if_seen, personal_params, personalizer_name
from fedjax_flat.errors import BadInputError
from fedjax_flat.evaluation.client_eval import ClientEvalProgram, check_data, distribution, select_clients
from fedjax_flat.evaluation.evaluator import fixed_batch_size
from fedjax_flat.training import writers
from fedjax_flat.training.evals.registry import Evaluation, register

FILE = 'clients.jsonl'
SOURCES = {'own_split': "each client's own test split",
           'label_matched': "pooled test examples drawn with each client's training label distribution"}


def _applies(plan) -> bool:
  ce = plan.config.get('client_eval')
  return ce is not None and ce.clients != 'off'


def _program(trainer) -> ClientEvalProgram:
  st = trainer.recorder.plugin_state
  if 'client_eval' not in st:        # built once per run: the clients, their examples, the compiled program
    p, c = trainer.plan, trainer.config
    ids = select_clients(c.client_eval.clients, p.data.num_clients, c.seed)
    st['client_eval'] = ClientEvalProgram(
        p.model, p.data, ids, seed=c.seed, batch_size=fixed_batch_size(c.eval_batch_size), preprocess=p.eval_transform,
        task=p.task, steps=int(c.client_eval.personalize_steps), client_cfg=c.client, augment_fn=p.train_transform)
    st['client_eval_times'] = []
  return st['client_eval']


def _due(trainer) -> bool:
  every = int(trainer.config.client_eval.every)
  return every == 0 or trainer.round % every == 0 or trainer.round >= trainer.config.rounds


def _path(trainer):
  return os.path.join(trainer.workdir, FILE) if (trainer.workdir and trainer.recorder.writer) else None


def _periodic(trainer) -> dict:
  if not _due(trainer):
    return {}
  prog = _program(trainer)
  alg = trainer.plan.algorithm
  params = alg.eval_models(trainer.server_state)['global'][0]
  t = time.perf_counter()
  res = prog(params, personal=_personal_models(trainer) if alg.personalizer is not None else None)
  trainer.recorder.plugin_state['client_eval_times'].append(time.perf_counter() - t)
  has = res['n'] > 0
  out = {f'clients_{k}': v for k, v in distribution(res['acc'][has]).items()} if has.any() else {}
  if has.any():
    out['clients_loss_mean'] = float(np.mean(res['loss'][has]))
    for pre in ('ft', 'personal'):
      if f'{pre}_acc' in res:
        out.update({f'clients_{pre}_{k}': v for k, v in distribution(res[f'{pre}_acc'][has]).items()})
        out[f'clients_{pre}_loss_mean'] = float(np.mean(res[f'{pre}_loss'][has]))
  path = _path(trainer)
  if path:
    keys = [k for k in ('acc', 'loss', 'ft_acc', 'ft_loss', 'personal_acc', 'personal_loss') if k in res]
    with open(path, 'a') as f:
      for i, cid in enumerate(res['ids']):
        row = {'round': trainer.round, 'client': int(cid), 'n': int(res['n'][i]),
               **{k: float(res[k][i]) for k in keys}}
        f.write(json.dumps(row) + '\n')
  return out


_UNTRACEABLE = (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError,
                jax.errors.TracerArrayConversionError)


def _personal_models(trainer):
  """fn(ids) -> the clients' personal models stacked [len(ids), ...]: their states read from the store at once
  (`gather`) and the personalizer mapped over them in one compiled program (a client never written: the global
  model, as `personal_params` gives it for no state)."""
  st = trainer.recorder.plugin_state
  alg, store, server_state = trainer.plan.algorithm, trainer.store, trainer.server_state
  if 'client_eval_personal' not in st:
    def one(state, cs, written):
      return if_seen(written, personal_params(alg, state, cs), global_params(alg, state))
    st['client_eval_personal'] = jax.jit(jax.vmap(one, in_axes=(None, 0, 0)))

  def stacked(ids):
    if store is None:          # no client state kept: every client's model is the global one
      return jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (len(ids),) + a.shape),
                                    global_params(alg, server_state))
    try:
      return st['client_eval_personal'](server_state, store.gather(ids), store.written(ids))
    except _UNTRACEABLE as e:        # a Python branch on a state value: the user's personalizer, one line
      raise BadInputError(
          f'personalizer {personalizer_name(alg)!r} of {alg.label!r} is not traceable ({type(e).__name__}): '
          "client_eval maps it over the clients' stacked states in one compiled program, so it must choose on state "
          "values with jnp.where (algorithms.personalization.if_seen), not a Python if; or turn "
          'config.client_eval.clients off') from None
  return stacked


def read_rows(path: str) -> list:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _resumed(trainer, records) -> bool:
  """Rows of rounds after the restored checkpoint (an interrupted run evaluated past it) are dropped: the resumed
  run writes them again."""
  path = _path(trainer)
  if path:
    writers.keep_rounds_through(path, trainer.round)
  return False


def _final(trainer, summary, reported):
  del reported
  st = trainer.recorder.plugin_state
  if 'client_eval' not in st:
    return
  prog, c = st['client_eval'], trainer.config
  last = next((r for r in reversed(trainer.recorder.records) if 'clients_acc_mean' in r), {})
  times = st['client_eval_times']
  examples = int(prog.n.sum()) + (len(prog.ids) * prog.steps * int(c.client.batch_size) if prog.steps else 0)
  if trainer.plan.algorithm.personalizer is not None:
    examples += int(prog.n.sum())      # the personal models read the same examples again
  spec = c.client_eval.clients
  out = {'clients': int(len(prog.ids)), 'population': int(trainer.plan.data.num_clients),
         'selection': 'all' if spec == 'all' else 'sampled from the seed', 'source': prog.source,
         'examples': int(prog.n.sum()), 'personalize_steps': prog.steps, 'model': 'global',
         **({'personal_model': personalizer_name(trainer.plan.algorithm)}
            if trainer.plan.algorithm.personalizer is not None else {}),
         'round': last.get('round'), **{k: v for k, v in last.items() if k.startswith('clients_')
                                        and ('_acc_' in k or k.endswith('loss_mean'))}}
    # the example rate of the fastest call (the first one compiles): evaluated + fine-tuning examples per second
  out['layout'] = prog.layout          # which layout computed the global model's numbers (the same bits)
  if prog.layout_check is not None:
    out['layout_check'] = prog.layout_check
  if times:
    out['examples_per_s'] = examples / max(min(times), 1e-9)
    out['seconds_per_evaluation'] = float(np.median(times))
  summary['client_eval'] = out
  tuned = f', and after {prog.steps} local fine-tuning steps' if prog.steps else ''
  if 'personal_model' in out:
    tuned += f", and each client's own model ({out['personal_model']})"
  acc = last.get('clients_acc_mean')
  nums = (f": mean {acc:.4f}, worst {last['clients_acc_worst']:.4f}, p10 {last['clients_acc_p10']:.4f}, "
          f"Gini {last['clients_acc_gini']:.4f} at round {last['round']}" if acc is not None else '')
  summary.setdefault('facts', {})['client_eval'] = (
      f"client evaluation: {out['clients']} of {out['population']} clients ({out['selection']}) on "
      f'{SOURCES[prog.source]}, the global model{tuned}{nums}')
  path = _path(trainer)
  if path and os.path.exists(path):
    by_round = {}
    for r in read_rows(path):
      e = by_round.setdefault(r['round'], {'round': r['round'], 'acc': [], 'ft_acc': []})
      if r['n'] > 0:
        e['acc'].append(r['acc'])
        if 'ft_acc' in r:
          e['ft_acc'].append(r['ft_acc'])
    writers.plot_client_cdf([by_round[k] for k in sorted(by_round)], os.path.join(trainer.workdir,
                            'clients_cdf.png'), title=f'{trainer.algorithm.label}: per-client accuracy',
                            accuracy_name=trainer.recorder.metric_names['accuracy'])


register(Evaluation('client_eval', order=22, applies=_applies, periodic=_periodic, final=_final, resumed=_resumed,
                    models=('global',), check=lambda plan: check_data(plan.data)))
