"""Hostile clients on rank 0's port, as a separate process (``python tests/hostile.py MODE DIR JOB``).

Rank 0's port is found the way a member finds it: its endpoint record in
``DIR/JOB/gen-00000001/master/``.  Modes:

* ``reasker``: one connection that asks for a rank of the right job and generation every 0.5 s
  (and pings), never saying hello; reconnects whenever it is dropped.  With ``--secret`` it
  reads the channel secret from the endpoint record (a buggy peer of the same uid: it answers
  the challenge) -- the lease rules, not the authentication, must then keep the rank free.
* ``sources NSRC PER``: PER silent connections from each of NSRC source addresses (127.0.0.10,
  127.0.0.11, ...: all of 127/8 is loopback), each opened again as soon as rank 0 drops it
  (issue 29: 20 x 60 exhausted rank 0's open files at the common soft limit of 1,024).
* ``flood``: 200 connections at once -- 50 asks for the right job and generation, 50
  well-formed hellos with invented identities for the last rank, 50 silent, 50 random bytes --
  and every second each one that was closed is opened again.
* ``forger WHAT [V]``: rank 0's impostor (issue 29).  Started once rank 0 is dead, it binds rank 0's
  port from the endpoint record (it takes the port, the instance id and the generation -- all of
  which travel in clear -- never the secret) and plays rank 0 to whoever connects: a challenge,
  an offer to an asker, then to a hello a ``welcome`` naming rank 0's instance and, by ``WHAT``:
  ``go`` (a ``prepare`` then a ``go`` whose master is 10.66.6.6:29999), ``prepare`` (a
  ``prepare``, then silence), ``void``; its challenge announces wire version ``V``.  Prints
  ``hello``/``ack``/``sent`` lines.

Prints one line per event worth knowing to stdout (``dropped``, ``offer``...) for the test.
Works against fsmingle's older wire versions too (no challenge: it does not wait for one).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import resource
import secrets
import selectors
import socket
import sys
import threading
import time
import zlib
from pathlib import Path


def endpoint(d: str, job: str, gen: int = 1) -> dict:
    master = Path(d) / job / f"gen-{gen:08d}" / "master"
    while True:
        for f in sorted(master.glob("beacon-*.json")) if master.is_dir() else []:
            try:
                b = json.loads(f.read_bytes())
            except (OSError, ValueError):
                continue
            if b.get("rank") == 0 and b.get("master_port"):
                return b
        time.sleep(0.05)


V = 3  # the wire version rank 0 speaks (detect_version): the intruder speaks it too


def detect_version(b: dict) -> None:
    """Wire 3 (and later) challenge every connection at once, 4 and later saying their version;
    an older rank 0 says nothing."""
    global V
    with socket.create_connection((b["addr"], b["master_port"]), timeout=5) as s:
        s.settimeout(0.5)
        try:
            got = s.recv(4096)
            V = (json.loads(got.split(b"\n")[0]).get("v") or 3) if b'"challenge"' in got else 2
        except (OSError, ValueError):
            V = 2
    print("wire version", V, flush=True)


def who(b: dict, t: str) -> dict:
    return {
        "t": t,
        "v": V,
        "job": b["job_id"],
        "gen": b["generation"],
        "inst": secrets.token_hex(8),
        "mode": b["mode"],
        "size": b["size"],
        "restart_count": 0,
        "slurm_job_id": "",
    }


def hello(b: dict, rank: int) -> dict:
    host = {"hostname": "intruder", "boot_id": "x", "pidns": "x", "pid": 4242, "pid_start": 1.0}
    return {**who(b, "hello"), "rank": rank, "addr": "127.0.0.1", "explicit": False, "key": "", "host": host}


def line(m: dict) -> bytes:
    return json.dumps(m, separators=(",", ":")).encode() + b"\n"


def mac(secret: str, nonce: str, m: dict) -> str:
    rank = m.get("rank") if m["t"] == "hello" else None
    fields = [V, nonce, m["t"], m["job"], m["gen"], m["inst"], rank] + ([m.get("mnonce", "")] if V >= 4 else [])
    body = json.dumps(fields, separators=(",", ":"), sort_keys=True)
    return hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()


def read_lines(s: socket.socket, buf: bytearray) -> list[dict] | None:
    """Whatever complete lines are there (non-blocking); None once the peer closed."""
    try:
        data = s.recv(65536)
    except (BlockingIOError, InterruptedError):
        return []
    except OSError:
        return None
    if not data:
        return None
    buf += data
    out = []
    while b"\n" in buf:
        i = buf.index(b"\n")
        try:
            out.append(json.loads(bytes(buf[:i])))
        except ValueError:
            pass
        del buf[: i + 1]
    return out


def reasker(d: str, job: str, with_secret: bool) -> None:
    b = endpoint(d, job)
    detect_version(b)
    inst = secrets.token_hex(8)
    while True:
        s = socket.create_connection((b["addr"], b["master_port"]), timeout=5)
        s.setblocking(False)
        buf = bytearray()
        nonce = None
        if with_secret:  # wait for a challenge briefly (an older rank 0 sends none)
            end = time.monotonic() + 1.0
            while nonce is None and time.monotonic() < end:
                for m in read_lines(s, buf) or []:
                    if m.get("t") == "challenge":
                        nonce = m["nonce"]
                time.sleep(0.01)
        print("connected", flush=True)
        while True:
            m = {**who(b, "ask"), "inst": inst, "taken": []}
            if V >= 4:
                m["mnonce"] = secrets.token_hex(16)
            if nonce is not None:
                m["mac"] = mac(b["secret"], nonce, m)
            try:
                s.sendall(line(m) + line({"t": "ping"}))
            except OSError:
                break
            time.sleep(0.5)
            got = read_lines(s, buf)
            if got is None:
                break
            for m in got:
                if m.get("t") in ("offer", "reject"):
                    print(m["t"], json.dumps(m), flush=True)
        print("dropped", flush=True)
        s.close()
        time.sleep(0.1)


def flood(d: str, job: str) -> None:
    b = endpoint(d, job)
    detect_version(b)
    last = b["size"] - 1
    kinds = ["ask"] * 50 + ["hello"] * 50 + ["silent"] * 50 + ["random"] * 50
    socks: list[socket.socket | None] = [None] * len(kinds)
    opened = 0
    while True:
        for i, kind in enumerate(kinds):
            s = socks[i]
            if s is not None:
                try:
                    if s.recv(65536, socket.MSG_DONTWAIT) == b"":
                        s.close()
                        s = socks[i] = None
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    s.close()
                    s = socks[i] = None
            if s is not None:
                continue
            try:
                s = socket.create_connection((b["addr"], b["master_port"]), timeout=2)
            except OSError:
                continue
            opened += 1
            try:
                if kind == "random":
                    s.sendall(os.urandom(200) + b"\n")
                elif kind == "hello":
                    s.sendall(line(hello(b, last)))
                elif kind == "ask":
                    s.sendall(line({**who(b, "ask"), "taken": []}))
            except OSError:
                pass
            socks[i] = s
        print("opened", opened, flush=True)
        time.sleep(1.0)


def sources(d: str, job: str, nsrc: int, per: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds nsrc x per sockets
    b = endpoint(d, job)
    detect_version(b)
    sel = selectors.DefaultSelector()
    counts = {"opened": 0, "refused": 0}

    def open_one(src: str) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((src, 0))
        s.connect_ex((b["addr"], b["master_port"]))  # EINPROGRESS: done when it is readable
        sel.register(s, selectors.EVENT_READ, src)
        counts["opened"] += 1

    for i in range(nsrc):
        for _ in range(per):
            open_one(f"127.0.0.{10 + i}")
    last = 0.0
    while True:
        for key, _ in sel.select(0.2):
            s = key.fileobj
            try:
                data = s.recv(65536)  # the challenge: never answered
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
                counts["refused"] += 1
            if not data:  # dropped (or refused): open it again at once
                sel.unregister(s)
                s.close()
                open_one(key.data)
        if time.monotonic() - last >= 0.5:
            last = time.monotonic()
            print("opened", counts["opened"], "holding", len(sel.get_map()), "errors", counts["refused"], flush=True)


FORGED_MASTER = ("10.66.6.6", 29999)


def forger(d: str, job: str, what: str) -> None:
    b = endpoint(d, job)
    gen, inst = b["generation"], b["instance"]
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("", b["master_port"]))  # rank 0 is dead: its port is anybody's
    lsock.listen(16)
    print("listening", b["master_port"], flush=True)
    offered = iter(range(1, b["size"]))
    while True:
        s, _ = lsock.accept()
        threading.Thread(target=_impostor, args=(s, b, gen, inst, what, offered), daemon=True).start()


def _impostor(s: socket.socket, b: dict, gen: int, inst: str, what: str, offered) -> None:
    """Play rank 0 on one connection; nothing is signed (the impostor has no secret)."""
    buf = bytearray()
    s.setblocking(False)
    r, wants_members = 1, False

    def send(m: dict) -> None:
        s.sendall(line(m))
        print("sent", m["t"], flush=True)

    try:
        s.sendall(line({"t": "challenge", "nonce": secrets.token_hex(16), "v": V}))
        while True:
            got = read_lines(s, buf)
            if got is None:
                print("closed", flush=True)
                return
            for m in got:
                t = m.get("t")
                if t == "ask":
                    print("ask", flush=True)
                    send({"t": "offer", "gen": gen, "ranks": [next(offered, 1)]})
                elif t == "hello":
                    r, wants_members = m.get("rank"), m.get("members") is True
                    print("hello", r, flush=True)
                    send({"t": "welcome", "inst": inst, "gen": gen, "present": b["size"], "missing": [], "nmissing": 0})
                    if what in ("go", "prepare"):
                        send({"t": "prepare", "gen": gen})
                    elif what == "void":
                        send({"t": "void", "why": "forged"})
                elif t == "ack":
                    print("ack", flush=True)
                    if what == "go":
                        addr, port = FORGED_MASTER
                        if wants_members:  # the member list (hostfiles, `fsmingle env`), as rank 0 encodes it
                            hosts = [[f"forged{i}", addr, 0.0] for i in range(b["size"])]
                            data = base64.b64encode(zlib.compress(json.dumps(hosts).encode())).decode()
                            send({"t": "members", "gen": gen, "k": 0, "n": 1, "data": data})
                        pl = dict(generation=gen, master_addr=addr, master_port=port, mode=b["mode"], size=b["size"])
                        pl.update(rank=r, node_rank=r, nnodes=b["size"], local_rank=0, local_world_size=1)
                        send({"t": "go", "placement": pl})
            time.sleep(0.01)
    except OSError:
        print("closed", flush=True)


if __name__ == "__main__":
    mode, d, job = sys.argv[1:4]
    if mode == "reasker":
        reasker(d, job, "--secret" in sys.argv)
    elif mode == "sources":
        sources(d, job, int(sys.argv[4]), int(sys.argv[5]))
    elif mode == "forger":
        V = int(sys.argv[5]) if len(sys.argv) > 5 else 4  # the version a current rank 0 announces
        forger(d, job, sys.argv[4])
    else:
        flood(d, job)
