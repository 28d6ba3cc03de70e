"""Fixtures shared by tests/data/ and tests/data/sources/."""
import pytest

from tests.fixtures import http_server


@pytest.fixture
def server():
  """(handler class, base URL) of a fresh loopback server; handler.files maps URL paths to bodies."""
  httpd, handler, url = http_server.serve(http_server.Handler)
  yield handler, url
  httpd.shutdown()
  httpd.server_close()
