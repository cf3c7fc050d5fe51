"""Benchmarks: `dockflow bench SCENARIO` (see docs/benchmarks.md)."""
