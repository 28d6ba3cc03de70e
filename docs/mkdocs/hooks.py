"""Generates the API reference pages (api/*.md) at build time, from the package's layout and public face, and
config_reference.md from configs/README.md (the field reference and the paper tables' cells, itself generated).

api/index.md documents every name of `fedjax_flat.__all__` where it is defined; api/<package>.md documents every
module of a package (its docstring and public members). The modules are found by walking fedjax_flat/, so a new
module or public name is in the reference without an edit here. The face's names are resolved by importing
fedjax_flat (names resolve lazily, PEP 562) and reading each object's defining module.
"""
from __future__ import annotations

import importlib
import os
import types

from mkdocs.structure.files import File

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = 'fedjax_flat'


def _modules(pkg_dir):
  """Dotted names of the modules of one package directory (not its subpackages), sorted."""
  mods = sorted(f[:-3] for f in os.listdir(pkg_dir) if f.endswith('.py') and f != '__init__.py')
  dotted = os.path.relpath(pkg_dir, REPO).replace(os.sep, '.')
  return [f'{dotted}.{m}' for m in mods if not m.startswith('_')]


def packages():
  """[(page name, [(package dotted name, [module dotted names])])]: one page per top-level package, its
  subpackages on the same page; the top-level modules of fedjax_flat on a page of their own."""
  root = os.path.join(REPO, PACKAGE)
  pages = [('top_level', [(PACKAGE, _modules(root))])]
  for name in sorted(os.listdir(root)):
    top = os.path.join(root, name)
    if not os.path.isfile(os.path.join(top, '__init__.py')):
      continue
    groups = []
    for d, dirs, files in os.walk(top):
      dirs[:] = sorted(x for x in dirs if os.path.isfile(os.path.join(d, x, '__init__.py')))
      groups.append((os.path.relpath(d, REPO).replace(os.sep, '.'), _modules(d)))
    pages.append((name, groups))
  return pages


def public_face():
  """[(public name, the dotted path of the object where it is defined)] for every name of fedjax_flat.__all__."""
  ff = importlib.import_module(PACKAGE)
  out = []
  for name in ff.__all__:
    obj = getattr(ff, name)
    if isinstance(obj, types.ModuleType):
      out.append((name, obj.__name__))
    else:
      out.append((name, f'{obj.__module__}.{obj.__qualname__}'))
  return out


def face_page():
  lines = ['# The public face: `import fedjax_flat as ff`', '',
           'Every name of `ff.__all__`, documented where it is defined (`ff.<name>` is that object). '
           'The walk-through that uses them is `docs/tutorial_custom_algorithm.py`.', '']
  for name, path in public_face():
    lines += [f'## `ff.{name}`', '', f'::: {path}', '    options:', '      show_root_heading: true',
              '      heading_level: 3', '']
  return '\n'.join(lines)


def package_page(page, groups):
  title = f'`{PACKAGE}` top-level modules' if page == 'top_level' else f'`{PACKAGE}.{page}`'
  lines = [f'# {title}', '']
  for pkg, mods in groups:
    if pkg != PACKAGE:
      lines += [f'::: {pkg}', '    options:', '      members: false', '']
    for mod in mods:
      lines += [f'::: {mod}', '    options:', '      heading_level: 3' if pkg != PACKAGE else '      heading_level: 2',
                '']
  return '\n'.join(lines)


def on_config(config):
  api = [{'Public face (ff)': 'api/index.md'}]
  api += [{('Top-level modules' if p == 'top_level' else p): f'api/{p}.md'} for p, _ in packages()]
  config['nav'] = [item for item in config['nav'] if not (isinstance(item, dict) and 'API reference' in item)]
  config['nav'].append({'API reference': api})
  return config


def config_reference():
  with open(os.path.join(REPO, 'configs', 'README.md')) as f:
    return f.read()


def on_files(files, config):
  files.append(File.generated(config, 'config_reference.md', content=config_reference()))
  files.append(File.generated(config, 'api/index.md', content=face_page()))
  for page, groups in packages():
    files.append(File.generated(config, f'api/{page}.md', content=package_page(page, groups)))
  return files
