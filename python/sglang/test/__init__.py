"""Helpers shared by the tests (test/) and the benchmarks (benchmark/)."""
