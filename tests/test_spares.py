"""Issue 24: a node that arrives when the world is full (or released) waits as a spare, is shown
as one by ``fsmingle status``, and takes a place when the world comes back for one (a member
died, the survivors re-run under their restart loop)."""

from __future__ import annotations

import json
import time

from helpers import run_cli, wait_for


def _status(d, job: str) -> dict:
    return json.loads(run_cli("status", job, "--dir", d, "--json").stdout or "{}")


def test_spare_takes_the_place_of_a_dead_member(procs, d):
    a = procs.env(d, "sp", "--nnodes", 2, timeout=60, name="a")
    b = procs.env(d, "sp", "--nnodes", 2, timeout=60, name="b")
    first = [a.result(30), b.result(30)]
    assert {r["generation"] for r in first} == {1}
    # The world of generation 1 is running (its fsmingle processes exec'd or returned). A third
    # node arrives: a spare, waiting in generation 2.
    c = procs.env(d, "sp", "--nnodes", 2, timeout=60, name="c")
    st = wait_for(
        lambda: (lambda s: s if s.get("generation") == 2 and s["participants"] else None)(_status(d, "sp")), 20, "c"
    )
    assert [p["spare_for"] for p in st["participants"]] == [1], st
    text = run_cli("status", "sp", "--dir", d).stdout
    assert "generation 2" in text
    assert "as a spare" in c.stderr() or wait_for(lambda: "as a spare" in c.stderr(), 5, "note")
    # Member b's training dies; a's restart loop runs fsmingle again: the spare takes b's place.
    time.sleep(1)
    t0 = time.monotonic()
    a2 = procs.env(d, "sp", "--nnodes", 2, timeout=60, name="a2")
    second = [a2.result(30), c.result(30)]
    took = time.monotonic() - t0
    print(
        f"world of generation 2 released {took:.2f} s after the survivor's fsmingle started (python start-up included)"
    )
    assert {r["generation"] for r in second} == {2}
    assert sorted(r["node_rank"] for r in second) == [0, 1]
    assert took < 10
