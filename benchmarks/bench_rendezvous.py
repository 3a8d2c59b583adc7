#!/usr/bin/env python3
"""Rendezvous benchmark entry point: ``python benchmarks/bench_rendezvous.py --help``.

The code lives in the package :mod:`benchmarks.rdzv` (harness, backends, fsops, report, cli);
this file only makes the historical path keep working.  See benchmarks/README.md.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.rdzv.cli import main

if __name__ == "__main__":
    sys.exit(main())
