"""Hessian and loss-geometry analysis (jit-compiled): HVPs, top eigenpairs, trace, spectral density,
1D/2D/3D loss landscapes, per-client sharpness, plots, and the one-call `analyze` report; the landscape lab's
measures (client drift, update sparsity, Hessian alignment, feature effective rank, loss-vs-gradient profile); mode
connectivity (loss barriers, Bezier curves); privacy attacks as measurements (gradient inversion with PSNR / SSIM,
membership inference with an empirical epsilon bound).

Typical use::

  from fedjax_flat import analysis
  batches = analysis.make_fixed_batches(x_test, y_test, batch_size=100)
  hvp = analysis.make_hvp(model, params, batches)
  dim = analysis.param_dim(params)
  pairs = analysis.top_eigenpairs(hvp, dim, k=5)     # Lanczos; pairs.residuals, pairs.converged
  trace, stderr = analysis.hutchinson_trace(hvp, dim, num_probes=50)

Names are resolved on first use (PEP 562), as in the package face: a module that imports one analysis module
(the config importing `analysis.lab` for its section) pays for none of the others (plots, scipy).
"""
import importlib

# public name -> the module that defines it
_EXPORTS = {
    'barrier_markdown': 'fedjax_flat.analysis.connectivity',
    'barrier_table': 'fedjax_flat.analysis.connectivity',
    'bezier_curve': 'fedjax_flat.analysis.connectivity',
    'bezier_point': 'fedjax_flat.analysis.connectivity',
    'loss_barrier': 'fedjax_flat.analysis.connectivity',
    'make_fixed_batches': 'fedjax_flat.analysis.data',
    'num_valid': 'fedjax_flat.analysis.data',
    'stack_batches': 'fedjax_flat.analysis.data',
    'SpectralDensity': 'fedjax_flat.analysis.density',
    'density_from_nodes': 'fedjax_flat.analysis.density',
    'slq_nodes_weights': 'fedjax_flat.analysis.density',
    'spectral_density': 'fedjax_flat.analysis.density',
    'CheckedPairs': 'fedjax_flat.analysis.eigen',
    'LanczosResult': 'fedjax_flat.analysis.eigen',
    'check_pairs': 'fedjax_flat.analysis.eigen',
    'lanczos': 'fedjax_flat.analysis.eigen',
    'top_eigenpairs': 'fedjax_flat.analysis.eigen',
    'top_eigenpairs_lanczos': 'fedjax_flat.analysis.eigen',
    'top_eigenpairs_power': 'fedjax_flat.analysis.eigen',
    'tridiagonal': 'fedjax_flat.analysis.eigen',
    'cross_entropy': 'fedjax_flat.analysis.hvp',
    'dense_hessian': 'fedjax_flat.analysis.hvp',
    'flatten_params': 'fedjax_flat.analysis.hvp',
    'make_eval_fn': 'fedjax_flat.analysis.hvp',
    'make_full_loss_fn': 'fedjax_flat.analysis.hvp',
    'make_hvp': 'fedjax_flat.analysis.hvp',
    'make_loss_fn': 'fedjax_flat.analysis.hvp',
    'param_dim': 'fedjax_flat.analysis.hvp',
    'Plane': 'fedjax_flat.analysis.landscape',
    'evaluate_plane': 'fedjax_flat.analysis.landscape',
    'evaluate_three_model_plane': 'fedjax_flat.analysis.landscape',
    'filter_normalized_direction': 'fedjax_flat.analysis.landscape',
    'filter_norms': 'fedjax_flat.analysis.landscape',
    'interpolate_1d': 'fedjax_flat.analysis.landscape',
    'plane_grid': 'fedjax_flat.analysis.landscape',
    'plane_through_three': 'fedjax_flat.analysis.landscape',
    'surface_2d': 'fedjax_flat.analysis.landscape',
    'client_lambda_max': 'fedjax_flat.analysis.per_client',
    'client_lambda_max_estimates': 'fedjax_flat.analysis.per_client',
    'analyze': 'fedjax_flat.analysis.report',
    'hutchinson_samples': 'fedjax_flat.analysis.trace',
    'hutchinson_trace': 'fedjax_flat.analysis.trace',
    'plots': 'fedjax_flat.analysis.plots',
    'batch_gradient': 'fedjax_flat.analysis.inversion',
    'gradient_from_delta': 'fedjax_flat.analysis.inversion',
    'infer_labels': 'fedjax_flat.analysis.inversion',
    'invert_gradients': 'fedjax_flat.analysis.inversion',
    'invert_upload': 'fedjax_flat.analysis.inversion',
    'local_update': 'fedjax_flat.analysis.inversion',
    'ClientUpload': 'fedjax_flat.analysis.inversion',
    'dp_observed': 'fedjax_flat.analysis.inversion',
    'psnr': 'fedjax_flat.analysis.inversion',
    'score_reconstruction': 'fedjax_flat.analysis.inversion',
    'ssim': 'fedjax_flat.analysis.inversion',
    'attack_report': 'fedjax_flat.analysis.membership',
    'clopper_pearson': 'fedjax_flat.analysis.membership',
    'empirical_epsilon': 'fedjax_flat.analysis.membership',
    'epsilon_bound': 'fedjax_flat.analysis.membership',
    'example_stats': 'fedjax_flat.analysis.membership',
    'lira': 'fedjax_flat.analysis.membership',
    'lira_from_shadows': 'fedjax_flat.analysis.membership',
    'lira_scores': 'fedjax_flat.analysis.membership',
    'roc': 'fedjax_flat.analysis.membership',
    'train_shadows': 'fedjax_flat.analysis.membership',
    'update_drift': 'fedjax_flat.analysis.drift',
    'flat_updates': 'fedjax_flat.analysis.drift',
    'update_sparsity': 'fedjax_flat.analysis.drift',
    'subspace_fraction': 'fedjax_flat.analysis.alignment',
    'top_subspace': 'fedjax_flat.analysis.alignment',
    'effective_rank': 'fedjax_flat.analysis.feature_rank',
    'layer_feature_ranks': 'fedjax_flat.analysis.feature_rank',
    'layer_features': 'fedjax_flat.analysis.feature_rank',
    'loss_gradnorm_profile': 'fedjax_flat.analysis.loss_profile',
    'per_example_loss_gradnorm': 'fedjax_flat.analysis.loss_profile',
}

__all__ = list(_EXPORTS)


def __getattr__(name):
  module = _EXPORTS.get(name)
  if module is None:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  mod = importlib.import_module(module)
  value = mod if module == f'{__name__}.{name}' else getattr(mod, name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))
