"""The test suite: one folder per fedjax_flat package (tests/<package>/), plus e2e/ (whole runs and the
binaries of experiments/ and benchmarks/) and fixtures/ (helpers and file writers shared by several tests)."""
