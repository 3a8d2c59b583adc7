"""The options as typer parameters of ``fsmingle run`` / ``fsmingle env`` (:func:`rendezvous_command`).

Each row becomes one ``typer.Option`` (:func:`typer_option`) whose ``parser=`` is the row's
:meth:`~.spec.Option.parse`; a refused value is raised as :class:`BadOptionValue`, which
``fsmingle.cli.main`` prints as one line (exit 3).  The decorated command receives one
:class:`~.values.Values` holding what the user typed, unvalidated.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import typer

from ..errors import ConfigError
from .spec import Option
from .table import OPTIONS
from .values import Values


class BadOptionValue(typer.BadParameter):
    """A value an option refused; ``message`` is the whole line (``cli.main``: exit 3)."""


def _parser(o: Option) -> Callable[[str], Any]:
    """typer ``parser=`` for a row: :meth:`Option.parse`, a refusal as :class:`BadOptionValue`."""

    def parse(raw: str) -> Any:
        try:
            return o.parse(raw)
        except ConfigError as e:
            raise BadOptionValue(str(e)) from None

    parse.__name__ = o.type_name.lower()
    return parse


def typer_option(o: Option):
    """The ``typer.Option`` of one row (its help ends with the fallbacks and the computed default)."""
    text = o.help
    if o.env and o.envvar is None:
        text += f" [env: {', '.join(o.env)}]"
    if o.default_text:
        text += f" [default: {o.default_text}]"
    kw: dict[str, Any] = {"help": text, "envvar": o.envvar}
    if o.type is not bool:
        kw["parser"] = _parser(o)
        kw["metavar"] = o.type_name
    return typer.Option(o.default, *o.flags, **kw)


def typer_parameters(names: tuple[str, ...] | None = None) -> list[inspect.Parameter]:
    """``inspect.Parameter`` objects (defaults are ``typer.Option``) for the rows ``names`` (default: all)."""
    return [
        inspect.Parameter(
            o.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=typer_option(o),
            annotation=(bool if o.type is bool else o.type | None),
        )
        for o in OPTIONS
        if names is None or o.name in names
    ]


def rendezvous_command(before: tuple[inspect.Parameter, ...] = (), after: tuple[inspect.Parameter, ...] = ()):
    """Decorator: give a command function every option as a typer parameter; it receives one ``Values``.

    The decorated ``func(values, **others)`` gets ``values`` (:class:`Values`,
    unvalidated: what the user typed) and its own parameters ``before`` /
    ``after`` by name.  typer reads the generated signature.
    """

    def deco(func):
        own = [p.name for p in (*before, *after)]
        params = list(before) + typer_parameters() + list(after)

        def command(**kw):
            values = Values(**{o.name: kw.pop(o.name) for o in OPTIONS})
            return func(values, **{k: kw[k] for k in own})

        command.__name__ = func.__name__
        command.__qualname__ = func.__qualname__
        command.__doc__ = func.__doc__
        command.__module__ = func.__module__
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return deco
