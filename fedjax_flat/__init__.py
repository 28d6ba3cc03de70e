"""fedjax_flat: federated-learning simulation in JAX/Flax, built around flat minima.

The public face: what a researcher imports to write, run, sweep and analyse an algorithm.

    import fedjax_flat as ff

    @ff.register('clipped_fedavg', hparams={'clip': ff.Number(1.0, lo=0, lo_open=True)})
    def clipped_fedavg(ctx):    # ctx: ff.BuildContext (model, loss, optimizers, schedule, hp, config)
      base = ff.fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)
      clip = lambda bcast, out: {**out, 'weighted': ff.clip_by_global_norm(out['weighted'], ctx.hp['clip'])}
      return ff.map_upload(base, clip)

    config = ff.default_config()                   # the embedded digits; any configs/*.py cell works too
    result = ff.train(clipped_fedavg, config)      # -> ff.TrainResult(summary, params, ...)
    pairs = ff.analysis.top_eigenpairs(...)        # Hessian spectrum of result.params

The whole walk-through, run by the test suite: docs/tutorial_custom_algorithm.py; a dataset and an NNX model of
one's own, a robust aggregator and ff.sweep: docs/tutorial_data_and_models.py.

The contract      FederatedAlgorithm (server_init, broadcast, client_init, client_step, client_final,
                  server_update, eval_models), BuildContext, register (hyperparameter rules Number, Integer,
                  Flag, Choice, Population; `needs`, `client_optimizers`)
Building blocks   fedavg (the FedAvg / FedOpt / FedSAM builder), map_upload, clip_by_global_norm, local_step,
                  LocalState, make_loss
Data and models   register_dataset (arrays or a generator per client, or a function per client: config.dataset),
                  register_model (a Flax Linen or NNX module: config.model)
Running           default_config, train -> TrainResult (a builder runs unregistered: the registry is unchanged
                  after), sweep -> [SweepRun] (grid x seeds, runs sharing one compiled program), run_batch + RunSpec
Aggregation       aggregators (mean, median, trimmed_mean, krum, multi_krum, geometric_median over a round's
                  stacked uploads; an algorithm with aggregate='stacked' gets them: docs/aggregation.md)
Analysis          analysis (Hessian eigenvalues, trace, density, loss landscapes)

Names are resolved on first use (PEP 562), so `import fedjax_flat.devices` (which must run before jax starts)
and the package's own modules pay for none of them; no module of the package imports this face.
"""
import importlib

# public name -> the module that defines it
_EXPORTS = {
    'FederatedAlgorithm': 'fedjax_flat.core.contract',
    'BuildContext': 'fedjax_flat.algorithms.registry',
    'register': 'fedjax_flat.algorithms.registry',
    'Number': 'fedjax_flat.schema',
    'Integer': 'fedjax_flat.schema',
    'Flag': 'fedjax_flat.schema',
    'Choice': 'fedjax_flat.schema',
    'Population': 'fedjax_flat.schema',
    'fedavg': 'fedjax_flat.algorithms.fedavg',
    'map_upload': 'fedjax_flat.algorithms.compose',
    'clip_by_global_norm': 'fedjax_flat.algorithms.compose',
    'local_step': 'fedjax_flat.algorithms.local',
    'LocalState': 'fedjax_flat.algorithms.local',
    'make_loss': 'fedjax_flat.algorithms.local',
    'default_config': 'fedjax_flat.config.default_config',
    'train': 'fedjax_flat.training.api',
    'TrainResult': 'fedjax_flat.training.api',
    'sweep': 'fedjax_flat.sweeps.api',
    'SweepRun': 'fedjax_flat.sweeps.api',
    'register_dataset': 'fedjax_flat.data.user',
    'register_model': 'fedjax_flat.models.user',
    'run_batch': 'fedjax_flat.training.batched',
    'RunSpec': 'fedjax_flat.training.batched',
    'analysis': 'fedjax_flat.analysis',
    'aggregators': 'fedjax_flat.aggregators',
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  module = _EXPORTS.get(name)
  if module is None:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}; its public names: {__all__}')
  mod = importlib.import_module(module)
  value = mod if module == f'{__name__}.{name}' else getattr(mod, name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))
