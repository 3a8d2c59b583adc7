"""The options as keyword parameters of :func:`fsmingle.rendezvous`: its signature and docstring lines."""

from __future__ import annotations

import inspect

from .table import OPTIONS, get


def api_signature(
    first: tuple[str, ...] = ("dir", "job_id"), extra: tuple[inspect.Parameter, ...] = ()
) -> inspect.Signature:
    """Signature of :func:`fsmingle.rendezvous`: ``first`` positional-or-keyword, every other option keyword-only.

    Every option defaults to None ("unset": its fallbacks and default apply).
    """
    params = [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=get(n).type | None)
        for n in first
    ]
    params += [
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=o.type | None)
        for o in OPTIONS
        if not o.cli_only and o.name not in first
    ]
    return inspect.Signature(params + list(extra))


def api_docs() -> str:
    """The option keywords, one line each, for the docstring of :func:`fsmingle.rendezvous`."""
    lines = []
    for o in OPTIONS:
        if o.cli_only:
            continue
        default = o.default_text or (
            f"{o.default:g} {o.unit}".strip() if isinstance(o.default, float) else repr(o.default)
        )
        env = f" Falls back to {', '.join(o.env)}." if o.env else ""
        lines.append(f"        {o.name} ({o.type.__name__} | None): {o.help} ``{o.flag}``; default {default}.{env}")
    return "\n".join(lines)
