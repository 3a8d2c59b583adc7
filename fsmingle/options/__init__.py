"""Every rendezvous option, declared once: :data:`OPTIONS` in :mod:`fsmingle.options.table`.

One :class:`Option` row holds an option's name, its command-line flags
(torchrun's spelling first where the two overlap), type, default, unit, the
environment variables it falls back to, its validation and its help text.
Everything else is derived from the table, one module per form:

* :mod:`.spec` -- :class:`Option`, the fields of a row, and :meth:`Option.parse`;
* :mod:`.table` -- :data:`OPTIONS` (THE table) and the checks its rows use;
* :mod:`.values` -- :class:`Values` (one field per row) and :func:`validate`;
* :mod:`.typer_cli` -- the ``fsmingle run`` / ``fsmingle env`` options
  (:func:`typer_parameters`, :func:`rendezvous_command`), which hand the command one :class:`Values`;
* :mod:`.api_params` -- the keyword parameters of :func:`fsmingle.rendezvous` (:func:`api_signature`);
* :mod:`.rdzv_conf` -- the torchrun backend's ``--rdzv-conf`` keys that mean the same thing
  (:func:`from_rdzv_conf`);
* :mod:`.markdown` -- the option table of ``docs/cli.md`` (:func:`markdown_table`, kept in sync by
  ``tests/test_docs.py``);
* the scheduler fallbacks :func:`fsmingle.config.resolve` reads (``Option.env``).

Every public name of those modules is importable from here (``fsmingle.options.X``).

**Adding an option** = one ``Option(...)`` row in ``fsmingle/options/table.py``, plus the code
that uses its value (``values.<name>`` in :mod:`fsmingle.api`).  The model is submitit's
single source of parameters: in ``submitit/slurm/slurm.py`` the ``sbatch``
options are the keyword parameters of ``_make_sbatch_string`` and
``_get_default_parameters`` reads them back with ``inspect``; its
``JobEnvironment`` classes map names to scheduler variables in a table
(``_env``).  A signature carries only a name and a default, and fsmingle
needs flags, a unit, fallbacks and a check per option, so here the table is
the source and the signatures (CLI and API) are generated from it.

Nothing here imports torch; of the command-line libraries only :mod:`.typer_cli` imports typer.
"""

from __future__ import annotations

from .api_params import api_docs, api_signature
from .markdown import markdown_table
from .rdzv_conf import from_rdzv_conf
from .spec import Option
from .table import OPTIONS, POLL_MAX_DEFAULT, get
from .typer_cli import BadOptionValue, rendezvous_command, typer_option, typer_parameters
from .values import Values, local_addresses, validate

__all__ = [
    "OPTIONS",
    "POLL_MAX_DEFAULT",
    "BadOptionValue",
    "Option",
    "Values",
    "api_docs",
    "api_signature",
    "from_rdzv_conf",
    "get",
    "local_addresses",
    "markdown_table",
    "rendezvous_command",
    "typer_option",
    "typer_parameters",
    "validate",
]
