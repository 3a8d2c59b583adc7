"""What one option declares (:class:`Option`, a row of ``OPTIONS``) and how a raw value is parsed.

:meth:`Option.parse` is the one conversion and check every form shares: the typer command line
(:mod:`.typer_cli`), the environment fallbacks, ``--rdzv-conf`` (:mod:`.rdzv_conf`) and the
Python API (:func:`.values.validate`).  A refusal is a one-line :class:`~fsmingle.errors.ConfigError`
naming where the value came from (exit 3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class Option:
    """One option of the rendezvous (a row of :data:`OPTIONS`).

    Attributes:
        name (str): Python name: ``Values`` field and :func:`fsmingle.rendezvous` keyword.
        flags (tuple[str, ...]): command-line spellings, the canonical one first.
        type (type): ``int``, ``float``, ``str`` or ``bool`` (a flag).
        help (str): one or two sentences for ``--help`` and ``docs/cli.md``.
        default (Any): value when neither the flag nor a fallback is set (None: unset).
        unit (str): ``"s"`` for seconds, else "".
        env (tuple[str, ...]): environment variables it falls back to, first set wins
            (read by :func:`fsmingle.config.resolve` / :mod:`fsmingle.net.netaddr`).
        envvar (str | None): the one variable click itself reads for the flag (shown in ``--help``).
        check (Callable | None): ``check(value) -> str | None``: what is wrong with a value.
        conf_key (str | None): the torchrun ``--rdzv-conf`` key with the same meaning.
        cli_only (bool): not a keyword of :func:`fsmingle.rendezvous` (output settings).
        default_text (str | None): how the default reads in help and docs when it is computed.
        metavar (str | None): placeholder in usage lines (default: from the type).
    """

    name: str
    flags: tuple[str, ...]
    type: type
    help: str
    default: Any = None
    unit: str = ""
    env: tuple[str, ...] = ()
    envvar: str | None = None
    check: Callable[[Any], str | None] | None = None
    conf_key: str | None = None
    cli_only: bool = False
    default_text: str | None = None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return self.flags[0]

    @property
    def type_name(self) -> str:
        """Placeholder for the value: ``SECONDS``, ``INT``, ``IP``..."""
        if self.metavar:
            return self.metavar
        return "SECONDS" if self.unit == "s" else {int: "INT", float: "FLOAT", str: "TEXT"}.get(self.type, "")

    def parse(self, raw: Any, source: str | None = None) -> Any:
        """Convert ``raw`` (a string from the command line, the environment or ``--rdzv-conf``) and check it.

        Args:
            raw: the value; None passes through; values already of ``type`` are only checked.
            source (str | None): how the user gave it, for the message (default: the flag).

        Returns:
            The value as ``self.type``.

        Raises:
            ConfigError: not convertible, or ``check`` refuses it; one line naming ``source``.
        """
        if raw is None:
            return None
        source = source or self.flag
        value = raw
        if self.type is bool:
            if not isinstance(raw, bool):
                text = str(raw).strip().lower()
                if text not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ConfigError(f"{source} {raw!r} is not a yes/no value; give true or false")
                value = text in ("1", "true", "yes", "on")
        elif not (isinstance(raw, self.type) and not isinstance(raw, bool)) and not (
            self.type is float and isinstance(raw, int) and not isinstance(raw, bool)
        ):
            try:
                value = self.type(str(raw).strip())
            except ValueError:
                what = {int: "a whole number", float: "a number"}.get(self.type, self.type.__name__)
                example = "29500" if self.name == "port" else {int: "2", float: "30"}.get(self.type, "")
                raise ConfigError(
                    f"{source} {raw!r} is not {what}" + (f"; give e.g. {source} {example}" if example else "")
                ) from None
        if self.type is float:
            value = float(value)
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise ConfigError(f"{source} {problem}" if not problem.startswith(source) else problem)
        return value
