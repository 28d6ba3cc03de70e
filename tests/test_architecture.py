"""The package's architecture, read from the source with `ast` (nothing is imported):

  (a) every fedjax_flat import, at module level or inside a function, points to the same or a lower layer
      of LAYERS (the single declaration of the layer rule);
  (b) no import circle between modules (module-level imports, which run at import time; an `__init__.py`
      that imports its submodules counts as a module);
  (c) a package `__init__.py` holds a docstring and nothing else, except a declared public face (FACES): it
      only re-exports names of its own package and none of that package's modules imports it;
  (d) the entry points (experiments/, benchmarks/, configs/, tests/) never edit `sys.path`: they run from the
      repository root against the installed package;
  (e) the algorithm is resolved once: outside algorithms/, the algorithm registry is read only through
      `declared` (the static declarations, before the algorithm is built) and `build_algorithm` (which returns
      the FederatedAlgorithm carrying what the run needs), except by config validation (config/).

Each failure lists every offending import as `file:line -> target`.
"""
import ast
import importlib
import inspect
import os
import re
import subprocess
import sys

from tests.fixtures.paths import REPO

# Lowest layer first. A module may import its own layer and the layers below it, never one above.
LAYERS = [
    ['errors', 'registry', 'cpu_paths', 'devices', 'schema', 'run_dir'],
    ['tasks', 'models', 'optimizers', 'privacy', 'systems', 'aggregators', 'merging'],
    ['data'],
    ['core'],
    ['algorithms'],
    ['evaluation', 'grouping', 'analysis'],
    ['config'],
    ['training'],
    ['sweeps'],
]
PACKAGE = 'fedjax_flat'
ENTRY_POINT_DIRS = ('experiments', 'benchmarks', 'configs', 'tests')

RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules():
  """{dotted module name: path relative to the repo}, packages under their package name."""
  out = {}
  for d, dirs, files in os.walk(os.path.join(REPO, PACKAGE)):
    dirs[:] = sorted(x for x in dirs if x != '__pycache__')
    for f in sorted(files):
      if f.endswith('.py'):
        rel = os.path.relpath(os.path.join(d, f), REPO)
        name = rel[:-3].replace(os.sep, '.')
        out[name[:-len('.__init__')] if name.endswith('.__init__') else name] = rel
  return out


MODULES = _modules()


def _is_package(name):
  return MODULES.get(name, '').endswith('__init__.py')


def _resolve(name):
  """The longest prefix of a dotted name that is a module of the package ('a.b.SomeClass' -> 'a.b')."""
  parts = name.split('.')
  for k in range(len(parts), 0, -1):
    cand = '.'.join(parts[:k])
    if cand in MODULES:
      return cand
  return None


def _imports(module):
  """[(line, target module, at_module_level, under_type_checking)] of the package imports of one module."""
  tree = ast.parse(open(os.path.join(REPO, MODULES[module])).read(), MODULES[module])
  package = module if _is_package(module) else module.rpartition('.')[0]
  found = []

  def targets(node):
    if isinstance(node, ast.Import):
      return [a.name for a in node.names]
    base = node.module or ''
    if node.level:                                  # relative: from . import x, from ..core import y
      anchor = package.split('.')
      anchor = anchor[:len(anchor) - (node.level - 1)]
      base = '.'.join(anchor + ([base] if base else []))
    return [f'{base}.{a.name}' if a.name != '*' else base for a in node.names]

  def walk(node, module_level, type_checking):
    for child in ast.iter_child_nodes(node):
      in_func = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
      tc = type_checking or (isinstance(child, ast.If) and 'TYPE_CHECKING' in ast.unparse(child.test))
      if isinstance(child, (ast.Import, ast.ImportFrom)):
        for name in targets(child):
          if name == PACKAGE or name.startswith(PACKAGE + '.'):
            found.append((child.lineno, _resolve(name) or name, module_level, type_checking))
      walk(child, module_level and not in_func, tc)

  walk(tree, True, False)
  return found


def _layer(module):
  parts = module.split('.')
  return RANK.get(parts[1]) if len(parts) > 1 else None


def test_every_module_is_in_a_layer():
  top = sorted({m.split('.')[1] for m in MODULES if m != PACKAGE})
  missing = [t for t in top if t not in RANK]
  assert not missing, (f'{PACKAGE}/{{{", ".join(missing)}}} belong to no layer: add each to LAYERS in '
                       f'tests/test_architecture.py, at the layer whose modules it may import')


def test_imports_point_to_the_same_or_a_lower_layer():
  bad = []
  for module in MODULES:
    src = _layer(module)
    for line, target, module_level, _ in _imports(module):
      dst = _layer(target)
      if src is not None and dst is not None and dst > src:
        where = '' if module_level else ' (inside a function)'
        bad.append(f'{MODULES[module]}:{line} -> {target}{where}  '
                   f'[layer {src} {LAYERS[src]} imports layer {dst} {LAYERS[dst]}]')
  assert not bad, f'{len(bad)} import(s) point to a higher layer:\n' + '\n'.join(bad)


def _import_graph():
  """Module-level edges (runtime imports): importing a.b.c runs a.b's __init__ too, except the importer's own
  ancestors (already running when it is imported)."""
  edges = {}
  for module in MODULES:
    ancestors = {module.rsplit('.', k)[0] for k in range(1, module.count('.') + 1)}
    out = edges.setdefault(module, {})
    for line, target, module_level, type_checking in _imports(module):
      if not module_level or type_checking:
        continue
      parts = target.split('.')
      for k in range(2, len(parts) + 1):
        dst = '.'.join(parts[:k])
        if dst in MODULES and dst != module and dst not in ancestors:
          out.setdefault(dst, line)
  return edges


def _cycles(edges):
  """Strongly connected components with more than one module (Tarjan), each as a sorted list."""
  index, low, stack, on, comps = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in edges.get(v, {}):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        comps.append(sorted(comp))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return comps


def test_no_import_circles():
  edges = _import_graph()
  report = []
  for comp in _cycles(edges):
    members = set(comp)
    report.append(f'circle of {len(comp)} modules: {", ".join(comp)}')
    for src in comp:
      for dst, line in sorted(edges[src].items()):
        if dst in members:
          report.append(f'  {MODULES[src]}:{line} -> {dst}')
  assert not report, 'module-level import circles:\n' + '\n'.join(report)


# Public faces: `from fedjax_flat import analysis; analysis.top_eigenpairs(...)` is the documented API of the
# Hessian tools (README). A face re-exports its own package's names only and is imported by none of them.
FACES = {'fedjax_flat/analysis/__init__.py'}


def _face_problems(rel):
  pkg = rel[:-len('/__init__.py')].replace('/', '.')
  out = []
  for node in ast.parse(open(os.path.join(REPO, rel)).read(), rel).body[1:]:
    own = isinstance(node, ast.ImportFrom) and (node.module == pkg or (node.module or '').startswith(pkg + '.'))
    all_ = isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ['__all__']
    # a lazy face (PEP 562, like the top face): `_EXPORTS` maps each name to one of its own modules
    lazy = ((isinstance(node, ast.Import) and [a.name for a in node.names] == ['importlib'])
            or (isinstance(node, ast.FunctionDef) and node.name in ('__getattr__', '__dir__'))
            or (isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ['_EXPORTS']
                and isinstance(node.value, ast.Dict)
                and all(isinstance(v, ast.Constant) and str(v.value).startswith(pkg + '.') for v in node.value.values)))
    if not (own or all_ or lazy):
      out.append(f'{rel}:{node.lineno}: a face only re-exports its own modules: {ast.unparse(node)[:80]}')
  for other_rel in MODULES.values():
    if other_rel.startswith(rel[:-len('__init__.py')]) and other_rel != rel:
      for node in ast.walk(ast.parse(open(os.path.join(REPO, other_rel)).read(), other_rel)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ''] if isinstance(node, ast.ImportFrom) else [])
        if pkg in names or (isinstance(node, ast.ImportFrom) and node.module == pkg.rpartition('.')[0]
                            and any(a.name == pkg.rpartition('.')[2] for a in node.names)):
          out.append(f'{other_rel}:{node.lineno} imports its own package face {pkg}')
  return out


def test_package_inits_hold_only_a_docstring():
  bad = []
  for module, rel in MODULES.items():
    if not rel.endswith('__init__.py') or rel == TOP_FACE:
      continue
    if rel in FACES:
      bad += _face_problems(rel)
      continue
    body = ast.parse(open(os.path.join(REPO, rel)).read(), rel).body
    for k, node in enumerate(body):
      is_docstring = (k == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                      and isinstance(node.value.value, str))
      if not is_docstring:
        what = ast.unparse(node).splitlines()[0][:100]
        bad.append(f'{rel}:{node.lineno}: {what}')
  assert not bad, ('package __init__.py files must hold only a docstring (import the module that defines a '
                   'name, not its package):\n' + '\n'.join(bad))


# The package's front door (fedjax_flat/__init__.py): `import fedjax_flat as ff; ff.train(...)`. It names each
# public object's defining module and resolves it on first use, so importing the package starts no jax.
TOP_FACE = f'{PACKAGE}/__init__.py'


def test_the_front_door_lists_documented_public_names_that_resolve():
  ff = importlib.import_module(PACKAGE)
  assert ff.__all__ == sorted(ff._EXPORTS) and len(ff.__all__) >= 10
  undocumented, misplaced = [], []
  for name in ff.__all__:
    obj = getattr(ff, name)
    if not (inspect.getdoc(obj) or '').strip():
      undocumented.append(name)
    where = obj.__name__ if inspect.ismodule(obj) else getattr(obj, '__module__', '')
    if where != ff._EXPORTS[name]:
      misplaced.append(f'{name}: defined in {where}, listed under {ff._EXPORTS[name]}')
  assert not undocumented, f'public names without a docstring: {undocumented}'
  assert not misplaced, '\n'.join(misplaced)
  body = ast.parse(open(os.path.join(REPO, TOP_FACE)).read()).body
  imports = [ast.unparse(n) for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
  assert imports == ['import importlib'], f'{TOP_FACE} imports nothing of the package at import time: {imports}'


def test_no_module_of_the_package_imports_the_front_door():
  bad = []
  for module, rel in MODULES.items():
    for node in ast.walk(ast.parse(open(os.path.join(REPO, rel)).read(), rel)):
      if isinstance(node, ast.Import) and any(a.name == PACKAGE for a in node.names):
        bad.append(f'{rel}:{node.lineno}')
      if isinstance(node, ast.ImportFrom) and node.module == PACKAGE and not node.level:
        bad += [f'{rel}:{node.lineno} ({a.name})' for a in node.names if f'{PACKAGE}.{a.name}' not in MODULES]
  assert not bad, 'package modules import the front door (import the defining module instead): ' + ', '.join(bad)


def test_importing_the_package_starts_no_jax():
  code = 'import sys, fedjax_flat, fedjax_flat.devices; assert "jax" not in sys.modules, sorted(sys.modules)'
  assert subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True).returncode == 0


def _sys_path_edits(path):
  """Lines of a file that touch sys.path: attribute uses in code, and code strings run with `python -c`."""
  src = open(path).read()
  tree = ast.parse(src, path)
  lines = []
  needle = 'sys.' + 'path'
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and node.attr == 'path' and isinstance(node.value, ast.Name)
        and node.value.id == 'sys'):
      lines.append(node.lineno)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      for verb in ('.insert(', '.append(', '.extend(', '[:0]', ' = ', '+='):
        if needle + verb in node.value:
          lines.append(node.lineno)
          break
  return sorted(set(lines))


def test_entry_points_never_edit_sys_path():
  bad = []
  me = os.path.abspath(__file__)
  for top in ENTRY_POINT_DIRS:
    for d, dirs, files in os.walk(os.path.join(REPO, top)):
      dirs[:] = sorted(x for x in dirs if x != '__pycache__')
      for f in sorted(files):
        path = os.path.join(d, f)
        if f.endswith('.py') and os.path.abspath(path) != me:
          bad += [f'{os.path.relpath(path, REPO)}:{line}' for line in _sys_path_edits(path)]
  assert not bad, ('sys.path edited (run from the repository root: scripts as `python experiments/x.py`, '
                   'benchmarks and helpers as `python -m benchmarks.kind.name`; the package is installed):\n'
                   + '\n'.join(bad))


# (e) What the modules outside algorithms/ may read of the algorithm registry (config/ validates the declarations).
REGISTRY_MODULE = 'fedjax_flat.algorithms.registry'
# `register` / `name_of` (training/api.py: an algorithm object run by its registration) look nothing up by name
REGISTRY_DOORS = {'declared', 'build_algorithm', 'register', 'name_of'}
REGISTRY_FREE = ('fedjax_flat.algorithms', 'fedjax_flat.config')


def _registry_reads(module):
  """[(line, name)] of what `module` takes from the algorithm registry: `from ..registry import name` and
  `alias.name` of every alias bound to the registry module."""
  tree = ast.parse(open(os.path.join(REPO, MODULES[module])).read(), MODULES[module])
  aliases, found = set(), []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module == REGISTRY_MODULE:
      found += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module == 'fedjax_flat.algorithms':
      aliases |= {a.asname or a.name for a in node.names if a.name == 'registry'}
    elif isinstance(node, ast.Import):
      aliases |= {a.asname for a in node.names if a.name == REGISTRY_MODULE and a.asname}
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
      found.append((node.lineno, node.attr))
  return found


def test_no_module_outside_algorithms_reads_the_algorithm_registry_by_name():
  bad = [f'{MODULES[m]}:{line} -> registry.{name}' for m in sorted(MODULES)
         if not m.startswith(REGISTRY_FREE) for line, name in _registry_reads(m) if name not in REGISTRY_DOORS]
  assert not bad, ('outside algorithms/, read the built FederatedAlgorithm (needs, hparams, personalizer, ...) or '
                   'the static declarations through registry.declared(config):\n' + '\n'.join(bad))
  # the check sees what it must: the run plan builds through the registry
  assert (any(name == 'build_algorithm' for _, name in _registry_reads('fedjax_flat.training.plan')))


def test_package_readmes_are_generated_from_the_current_docstrings():
  p = subprocess.run([sys.executable, 'experiments/package_readmes.py', '--check'], cwd=REPO, capture_output=True,
                     text=True)
  assert p.returncode == 0, p.stderr


def test_workspace_is_a_map_with_short_lines_and_links_that_resolve():
  text = open(os.path.join(REPO, 'WORKSPACE.md')).read()
  long_lines = [i + 1 for i, line in enumerate(text.splitlines()) if len(line) > 200]
  assert not long_lines, f'WORKSPACE.md lines over 200 characters: {long_lines}'
  missing = [t for t in re.findall(r'\]\(([^)#]+)\)', text) if not os.path.exists(os.path.join(REPO, t))]
  assert not missing, f'WORKSPACE.md links to missing files: {missing}'
