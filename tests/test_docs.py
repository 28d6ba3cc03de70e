"""The documentation: the site under docs/ builds with warnings as errors (mkdocs --strict: broken links, a page
outside the nav, a docstring griffe cannot parse), its API reference covers the public face and every module, and
the two front pages stay maps (README.md <= 10 KB, WORKSPACE.md <= 12 KB) holding the commands CI runs.

The build is a real one (about 15 s): a missing mkdocs fails here, it is not skipped (`.ci/setup.sh` installs the
`docs` extra).
"""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.fixtures.paths import REPO

CONFIG = os.path.join(REPO, 'docs', 'mkdocs', 'mkdocs.yml')


def _hooks():
  spec = importlib.util.spec_from_file_location('docs_hooks', os.path.join(REPO, 'docs', 'mkdocs', 'hooks.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.fixture(scope='module')
def site(tmp_path_factory):
  out = tmp_path_factory.mktemp('site')
  # The hook imports fedjax_flat: this checkout's, whatever the venv's editable install points at.
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join(p for p in (REPO, os.environ.get('PYTHONPATH')) if p)}
  p = subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '--strict', '-f', CONFIG, '-d', str(out)],
                     cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
  assert p.returncode == 0, 'mkdocs build --strict failed:\n' + p.stderr[-4000:]
  return out


def _ids(html):
  return set(re.findall(r'id="([^"]+)"', html))


def test_the_site_builds_strictly_with_every_page(site):
  for page in ('index.html', 'contributing/index.html', 'scaling/index.html', 'aggregation/index.html',
               'api/index.html'):
    assert (site / page).is_file(), page


def test_the_api_reference_documents_every_public_name_where_it_is_defined(site):
  import fedjax_flat as ff
  face = _hooks().public_face()
  assert [name for name, _ in face] == list(ff.__all__)
  ids = _ids((site / 'api' / 'index.html').read_text())
  missing = [path for _, path in face if path not in ids]
  assert not missing, f'api/index.html documents none of {missing}'


def test_the_api_reference_documents_every_module_of_every_package(site):
  missing = []
  for page, groups in _hooks().packages():
    ids = _ids((site / 'api' / page / 'index.html').read_text())
    missing += [m for _, mods in groups for m in mods if m not in ids]
  assert not missing, f'modules missing from the API reference: {missing}'
  # the walk sees the package: every module file of fedjax_flat/ (private ones aside) is on some page
  found = {m for _, groups in _hooks().packages() for _, mods in groups for m in mods}
  files = {os.path.relpath(os.path.join(d, f), REPO)[:-3].replace(os.sep, '.')
           for d, _, fs in os.walk(os.path.join(REPO, 'fedjax_flat')) for f in fs
           if f.endswith('.py') and f != '__init__.py' and not f.startswith('_')}
  assert found == files


def test_readme_is_a_front_page_with_the_two_commands_ci_runs():
  with open(os.path.join(REPO, 'README.md'), 'rb') as f:
    raw = f.read()
  assert len(raw) <= 10_000, f'README.md is {len(raw)} bytes; move detail to docs/ (limit 10,000)'
  readme = raw.decode()
  assert ('bash .ci/setup.sh && .venv/bin/python experiments/train.py --config=configs/quickstart.py '
          '--workdir=runs/quickstart') in readme
  # .ci/run says it runs exactly the README's lint + test command: the same commands, in the same order
  with open(os.path.join(REPO, '.ci', 'run')) as f:
    ci = [line.strip() for line in f if line.startswith(('bash ', '.venv/'))]
  assert ' && '.join(ci) in readme, ci
  assert 'docs/index.md' in readme


def test_workspace_stays_a_map_and_links_the_contributor_guide():
  with open(os.path.join(REPO, 'WORKSPACE.md'), 'rb') as f:
    raw = f.read()
  assert len(raw) <= 12_000, f'WORKSPACE.md is {len(raw)} bytes; move how-to detail to docs/ (limit 12,000)'
  assert '(docs/contributing.md)' in raw.decode()
