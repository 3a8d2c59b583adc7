"""Issue 30: ``list_keys``/``num_keys`` are linearizable (fsmingle/fs/folderstore_keys.py: a double collect).

Two keys, three nodes whose listings lag up to 3 s, operations run inside others' filesystem calls,
compaction every 2, 3 or 32 versions; every call and return is recorded and the history of the set
of keys is checked by the Wing-Gong checker (tests/lincheck.py).  Before, ``list_keys`` answered
from the client's cached listings: a key set (or deleted) before the call began was missing (or
still there), and keys read one after another could show a set of keys that never existed at once.
"""

from __future__ import annotations

import os

from folderstore_fakefs import lagging_stores
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lincheck import History, check

KEYS = ("a", "b")


def _keys_step(state, op):
    """The sequential spec of which keys exist (a frozenset), for :func:`lincheck.check`."""
    if op.name == "set":
        return True, state | {op.args[0]}
    if op.name == "del":
        return op.result == (op.args[0] in state), state - {op.args[0]}
    return op.result == sorted(state), state  # list


OPS = st.tuples(
    st.integers(0, 2),  # node
    st.sampled_from(["set", "set", "del", "list", "list"]),
    st.sampled_from(KEYS),
    st.one_of(
        st.none(), st.tuples(st.integers(0, 12), st.integers(0, 2), st.sampled_from(["set", "del", "list", "move"]))
    ),
)


@settings(max_examples=int(os.environ.get("FSMINGLE_MODEL_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(lags=st.lists(st.floats(0, 3), min_size=3, max_size=3), ops=st.lists(OPS, min_size=1, max_size=12),
       seal_at=st.sampled_from([2, 3, 32]))  # fmt: skip
def test_model_list_keys_is_linearizable(lags, ops, seal_at):
    fs, views, kvs = lagging_stores(lags, seal_at)
    h = History()

    def run(node, op, key):
        kv = kvs[node]
        if op == "list":
            c = h.call("list", who=f"n{node}")
            h.ret(c, kv.list_keys())
        elif op == "set":
            c = h.call("set", key, who=f"n{node}")
            h.ret(c, kv.set(key, b"x"))
        else:
            c = h.call("del", key, who=f"n{node}")
            h.ret(c, kv.delete(key))

    for node, op, key, nested in ops:
        v = views[node]
        if nested is not None:
            at, other, nop = nested
            other = other if other != node else (node + 1) % 3
            other_key = KEYS[1 - KEYS.index(key)]  # the other key: a list between two writes must see one state
            if nop == "move":  # delete a, then set b: a list that read a before and b after must not say [a, b]
                v.arm_hook(at, lambda other=other: (run(other, "del", "a"), run(other, "set", "b")))
            else:
                v.arm_hook(at, lambda other=other, nop=nop, k=other_key: run(other, nop, k))
        run(node, op, key)
        v.disarm()
        fs.advance(0.05)
    final = h.call("list", who="n2")
    h.ret(final, kvs[2].list_keys())
    bad = check(h.ops, frozenset(), _keys_step)
    assert bad is None, bad
