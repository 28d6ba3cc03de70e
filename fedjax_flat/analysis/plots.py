"""PNG writers for the analysis results (matplotlib object API with the Agg canvas; no pyplot state).

Every function takes plain arrays (numpy / lists) and a path, writes one PNG and returns the path.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def _new_figure(figsize=(5.0, 4.0)) -> Figure:
  fig = Figure(figsize=figsize)
  FigureCanvasAgg(fig)
  return fig


def _save(fig: Figure, path: str, dpi: int) -> str:
  d = os.path.dirname(os.path.abspath(path))
  os.makedirs(d, exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=dpi, format='png')
  return path


def plot_eigenvalues(eigenvalues, path: str, *, title: str = 'Top Hessian eigenvalues', style: str = 'bar',
                     log: bool = False, labels: Optional[Sequence[str]] = None, dpi: int = 120) -> str:
  """Eigenvalue spectrum: eigenvalue vs index (1-based). `eigenvalues` is [k] or a list of [k] (one per
  model, with `labels`; drawn as lines)."""
  fig = _new_figure()
  ax = fig.add_subplot(1, 1, 1)
  series = [np.asarray(eigenvalues)] if np.ndim(eigenvalues) == 1 else [np.asarray(e) for e in eigenvalues]
  for i, ev in enumerate(series):
    idx = np.arange(1, len(ev) + 1)
    label = labels[i] if labels else None
    if style == 'bar' and len(series) == 1:
      ax.bar(idx, ev, color='tab:blue', label=label)
    else:
      ax.plot(idx, ev, marker='o', ms=3, label=label)
  if log:
    ax.set_yscale('symlog')
  ax.set_xlabel('index')
  ax.set_ylabel('eigenvalue')
  ax.set_title(title)
  if labels:
    ax.legend()
  return _save(fig, path, dpi)


def plot_density(grid, density, path: str, *, eigenvalues=None, log: bool = True,
                 title: str = 'Hessian spectral density (SLQ)', dpi: int = 120) -> str:
  """Spectral density curve; optional reference eigenvalues as vertical ticks."""
  fig = _new_figure()
  ax = fig.add_subplot(1, 1, 1)
  grid, density = np.asarray(grid), np.asarray(density)
  ax.plot(grid, np.maximum(density, 1e-12) if log else density, color='tab:blue')
  if log:
    ax.set_yscale('log')
    ax.set_ylim(bottom=max(1e-8, float(np.max(density)) * 1e-8))
  if eigenvalues is not None:
    for e in np.asarray(eigenvalues).reshape(-1):
      ax.axvline(float(e), color='tab:red', lw=0.6, alpha=0.6)
  ax.set_xlabel('eigenvalue')
  ax.set_ylabel('density')
  ax.set_title(title)
  return _save(fig, path, dpi)


def plot_interpolation(alphas, values, path: str, *, labels: Optional[Sequence[str]] = None,
                       ylabel: str = 'loss', endpoints: Sequence[str] = ('w1', 'w2'),
                       title: str = '1D interpolation', dpi: int = 120) -> str:
  """Curve(s) of a quantity along w(a) = (1 - a) w1 + a w2; `values` is [n] or a list of [n]."""
  fig = _new_figure()
  ax = fig.add_subplot(1, 1, 1)
  alphas = np.asarray(alphas)
  series = [np.asarray(values)] if np.ndim(values) == 1 else [np.asarray(v) for v in values]
  for i, v in enumerate(series):
    ax.plot(alphas, v, marker='.', label=labels[i] if labels else None)
  for a, name in zip((0.0, 1.0), endpoints):
    ax.axvline(a, color='gray', ls=':', lw=0.8)
    ax.annotate(name, (a, 1.0), xycoords=('data', 'axes fraction'), ha='center', va='bottom')
  ax.set_xlabel('alpha')
  ax.set_ylabel(ylabel)
  ax.set_title(title, pad=14)
  if labels:
    ax.legend()
  return _save(fig, path, dpi)


def plot_plane(xs, ys, values, path: str, *, coords=None, names: Sequence[str] = ('w1', 'w2', 'w3'),
               levels: int = 20, log_levels: bool = False, title: str = 'loss', cbar_label: str = '',
               dpi: int = 120) -> str:
  """Filled contour of a [len(ys), len(xs)] grid; marks the three models at `coords` [3, 2]."""
  fig = _new_figure((5.5, 4.5))
  ax = fig.add_subplot(1, 1, 1)
  z = np.asarray(values, np.float64)
  if log_levels and np.all(z > 0):
    lv = np.geomspace(z.min(), z.max(), levels)
  else:
    lv = np.linspace(z.min(), z.max() + 1e-12, levels)
  cs = ax.contourf(np.asarray(xs), np.asarray(ys), z, levels=lv, cmap='viridis')
  ax.contour(np.asarray(xs), np.asarray(ys), z, levels=lv, colors='k', linewidths=0.3)
  fig.colorbar(cs, ax=ax, label=cbar_label)
  if coords is not None:
    c = np.asarray(coords)
    ax.scatter(c[:, 0], c[:, 1], c='white', edgecolors='black', s=60, zorder=3)
    for (x, y), name in zip(c, names):
      ax.annotate(name, (x, y), textcoords='offset points', xytext=(6, 6), color='white', fontweight='bold')
  ax.set_aspect('equal', adjustable='box')
  ax.set_title(title)
  return _save(fig, path, dpi)


def plot_surface_3d(xs, ys, values, path: str, *, title: str = 'loss surface', style: str = 'solid',
                    zlabel: str = 'loss', elev: float = 30.0, azim: float = -60.0, dpi: int = 120) -> str:
  """3D surface of a [len(ys), len(xs)] grid (style 'solid' or 'net' = wireframe, as the thesis figures)."""
  fig = _new_figure((6.0, 5.0))
  ax = fig.add_subplot(1, 1, 1, projection='3d')
  gx, gy = np.meshgrid(np.asarray(xs), np.asarray(ys))
  z = np.asarray(values, np.float64)
  if style == 'net':
    ax.plot_wireframe(gx, gy, z, color='tab:blue', linewidth=0.5)
  else:
    ax.plot_surface(gx, gy, z, cmap='viridis', linewidth=0, antialiased=True)
  ax.view_init(elev=elev, azim=azim)
  ax.set_xlabel('d1')
  ax.set_ylabel('d2')
  ax.set_zlabel(zlabel)
  ax.set_title(title)
  return _save(fig, path, dpi)


def plot_reconstruction(truth, recon, path: str, *, psnr=None, ssim=None, title: str = 'gradient inversion',
                        dpi: int = 120) -> str:
  """True images (top row) above their reconstructions (bottom row), [N, H, W, C] each (C 1 or 3), with each
  reconstruction's PSNR / SSIM under it when given."""
  truth, recon = np.asarray(truth, np.float32), np.asarray(recon, np.float32)
  n = len(truth)
  fig = _new_figure((1.6 * n + 0.4, 3.6))
  lo, hi = float(min(truth.min(), recon.min())), float(max(truth.max(), recon.max()))
  for i in range(n):
    for row, (img, label) in enumerate(((truth[i], 'true'), (recon[i], 'reconstructed'))):
      ax = fig.add_subplot(2, n, row * n + i + 1)
      img = (img - lo) / max(hi - lo, 1e-12)      # one scale for both rows
      ax.imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap='gray' if img.shape[-1] == 1 else None,
                vmin=0.0, vmax=1.0, interpolation='nearest')
      ax.set_xticks([])
      ax.set_yticks([])
      if i == 0:
        ax.set_ylabel(label)
      if row == 1 and psnr is not None:
        ax.set_xlabel(f'{float(psnr[i]):.1f} dB' + (f'\nSSIM {float(ssim[i]):.2f}' if ssim is not None else ''),
                      fontsize=8)
  fig.suptitle(title, fontsize=9)
  return _save(fig, path, dpi)
