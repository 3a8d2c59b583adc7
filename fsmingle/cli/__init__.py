"""The command line (a face): ``fsmingle run|env|status|clean|check|demo``.

Layer: a face, the top.  It may import every layer below (``fsmingle.errors``, ``fs``, ``net``,
``protocol``, ``preflight``) and the other faces' entry points (``fsmingle.api``,
``fsmingle.options``, ``fsmingle.config``); nothing below imports it.

Modules: ``commands`` (the typer app and ``main``, the console script's entry point), ``status`` and
``stragglers`` (``fsmingle status``), ``progress`` (the progress line), ``hostfile``
(``env --format hostfile|json``), ``demo`` (``fsmingle demo``).
"""

from .commands import app, main

__all__ = ["app", "main"]
