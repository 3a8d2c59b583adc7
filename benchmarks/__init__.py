"""Benchmarks of fsmingle (a package so that ``python -m benchmarks.rdzv`` works from the repository root)."""
