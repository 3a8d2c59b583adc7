"""The recovery benchmark (issue 31): how long after a node's death or hang a job trains again.

``python -m benchmarks.recovery --help``; results and the table: ``benchmarks/README.md``.
"""
