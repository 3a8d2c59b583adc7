"""The ``fsmingle check`` command: run :func:`.doctor.check`, print it (rich tables or JSON), exit code."""

from __future__ import annotations

import json
import sys

from ...errors import ConfigError, FsmingleError, UnsupportedFilesystemError
from .doctor import check


def render(r: dict, console=None) -> None:
    """Print a :func:`check` result as tables (rich; plain text when not a terminal)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    m = {k: escape(v) if isinstance(v, str) else v for k, v in r["mount"].items()}  # paths may contain [ ]
    t = Table(title=f"fsmingle check {escape(r['dir'])}", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("filesystem", f"{m['fstype']} ({r['family']})")
    t.add_row("source", m["source"])
    t.add_row("mount point", m["mount_point"])
    t.add_row("options that matter", escape(", ".join(f"{k}={v}" if v else k for k, v in r["options"].items()) or "-"))
    for name, label in (("link", "link() claim"), ("rename", "rename() replace"), ("o_excl", "O_CREAT|O_EXCL")):
        p = r["probes"][name]
        t.add_row(label, ("[green]ok[/] " if p["ok"] else "[red]FAILS[/] ") + escape(p["detail"]))
    o = r["owner"]
    t.add_row(
        "owner / mode",
        f"uid {o['uid']} gid {o['gid']} mode {o['mode']}" + ("" if o["writable"] else " (not writable by you)"),
    )
    for prob in o["problems"]:
        t.add_row("", f"[yellow]{escape(prob)}[/]")
    p = r.get("peers")
    if p:
        t.add_row("peers", escape(f"{p['peers']}: {', '.join(p['hosts'])}"))
        t.add_row("link() races", f"{p['races']} races, {p['link_double_wins']} with several winners")
        t.add_row("O_EXCL races", f"{p['races']} races, {p['excl_double_wins']} with several winners")
        t.add_row(
            "visibility",
            f"listed after {p['list_delay_max_s']:.2f} s, openable by name after {p['open_delay_max_s']:.2f} s",
        )
    colour = {"ok": "green", "local": "yellow", "unsafe": "red"}[r["verdict"]]
    t.add_row("verdict", f"[bold {colour}]{r['verdict']}[/]")
    for why in r["reasons"]:
        t.add_row("", escape(why))
    if r["settings"]:
        s = r["settings"]
        t.add_row("settings", f"--stale-after {s['stale_after']} --poll-max {s['poll_max']}")
    console.print(t)


def main(
    directory: str | None, peers: int = 1, timeout: float = 120.0, session: str = "default", as_json: bool = False
) -> int:
    """``fsmingle check``: examine, print, and return the exit code (0 ok or local, 10 unsafe;
    3 bad option, 5 unusable directory, 7 peers missing -- those print one error line)."""
    try:
        if not directory:
            raise ConfigError("no directory: pass --dir or set FSMINGLE_DIR")
        r = check(directory, peers=peers, timeout=timeout, session=session)
    except FsmingleError as e:
        print(f"fsmingle: error: {e}", file=sys.stderr)
        return e.exit_code
    if as_json:
        print(json.dumps(r, indent=2, sort_keys=True))
    else:
        render(r)
    return UnsupportedFilesystemError.exit_code if r["verdict"] == "unsafe" else 0
