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
"""
from fedjax_flat.analysis.connectivity import (barrier_markdown, barrier_table, bezier_curve, bezier_point,
                                               loss_barrier)
from fedjax_flat.analysis.alignment import subspace_fraction, top_subspace
from fedjax_flat.analysis.data import make_fixed_batches, num_valid, stack_batches
from fedjax_flat.analysis.density import (SpectralDensity, density_from_nodes, slq_nodes_weights,
                                          spectral_density)
from fedjax_flat.analysis.drift import flat_updates, update_drift, update_sparsity
from fedjax_flat.analysis.eigen import (CheckedPairs, LanczosResult, check_pairs, lanczos, top_eigenpairs,
                                        top_eigenpairs_lanczos, top_eigenpairs_power, tridiagonal)
from fedjax_flat.analysis.feature_rank import effective_rank, layer_feature_ranks, layer_features
from fedjax_flat.analysis.hvp import (cross_entropy, dense_hessian, flatten_params, make_eval_fn,
                                      make_full_loss_fn, make_hvp, make_loss_fn, param_dim)
from fedjax_flat.analysis.landscape import (Plane, evaluate_plane, evaluate_three_model_plane,
                                            filter_normalized_direction, filter_norms, interpolate_1d,
                                            plane_grid, plane_through_three, surface_2d)
from fedjax_flat.analysis.inversion import (batch_gradient, gradient_from_delta, infer_labels, invert_gradients,
                                            psnr, score_reconstruction, ssim)
from fedjax_flat.analysis.membership import (attack_report, clopper_pearson, empirical_epsilon, epsilon_bound,
                                             example_stats, lira, lira_scores, roc, train_shadows)
from fedjax_flat.analysis.loss_profile import loss_gradnorm_profile, per_example_loss_gradnorm
from fedjax_flat.analysis.per_client import client_lambda_max, client_lambda_max_estimates
from fedjax_flat.analysis.report import analyze
from fedjax_flat.analysis.trace import hutchinson_samples, hutchinson_trace
from fedjax_flat.analysis import plots

__all__ = [
    'barrier_markdown', 'barrier_table', 'bezier_curve', 'bezier_point', 'loss_barrier',
    'make_fixed_batches', 'num_valid', 'stack_batches', 'SpectralDensity', 'density_from_nodes',
    'slq_nodes_weights', 'spectral_density', 'CheckedPairs', 'LanczosResult', 'check_pairs', 'lanczos',
    'top_eigenpairs', 'top_eigenpairs_lanczos', 'top_eigenpairs_power', 'tridiagonal', 'cross_entropy',
    'dense_hessian', 'flatten_params', 'make_eval_fn', 'make_full_loss_fn', 'make_hvp', 'make_loss_fn', 'param_dim',
    'Plane', 'evaluate_plane', 'evaluate_three_model_plane', 'filter_normalized_direction', 'filter_norms',
    'interpolate_1d', 'plane_grid', 'plane_through_three', 'surface_2d', 'client_lambda_max',
    'client_lambda_max_estimates', 'analyze',
    'hutchinson_samples', 'hutchinson_trace', 'plots',
    'batch_gradient', 'gradient_from_delta', 'infer_labels', 'invert_gradients', 'psnr', 'score_reconstruction',
    'ssim', 'attack_report', 'clopper_pearson', 'empirical_epsilon', 'epsilon_bound', 'example_stats', 'lira',
    'lira_scores', 'roc', 'train_shadows', 'update_drift', 'flat_updates', 'update_sparsity',
    'subspace_fraction', 'top_subspace', 'effective_rank', 'layer_feature_ranks', 'layer_features',
    'loss_gradnorm_profile', 'per_example_loss_gradnorm'
]
