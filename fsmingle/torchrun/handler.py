"""The ``fsmingle`` torchrun handler: torch's policy, fsmingle's state, heartbeats and store.

torchrun finds it through the entry point ``fsmingle =
"fsmingle.torchrun.handler:handler"`` of the group ``torchrun.handlers``
(torch >= 2.6, ``torch/distributed/elastic/rendezvous/registry.py``).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from datetime import timedelta
from typing import Any

import psutil
import torch.distributed as dist
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)

from ..errors import ConfigError
from ..fs.jobdir import open_job_dir
from ..fs.layout import validate_job_id
from ..net.netaddr import interface_of, socket_ifname_env
from ..net.ports import listener
from . import conf
from .backend import FsRendezvousBackend, sleep_jitter
from .codec import StoreAddress
from .heartbeat import HeartbeatWriter
from .ops import GuardedCloseOp, LeaveOp
from .queuehold import HoldingExecutor, queue_watch
from .reach import RoundUnreachableError, confirm_round, reaches_any, sit_out
from .storeaddr import StoreAddressBoard

__all__ = ["FsRendezvousHandler", "create_rdzv_handler", "handler"]

log = logging.getLogger("fsmingle.torchrun")


# torch's registry imports this module while torch's rendezvous package is
# still being imported; the package __init__ makes sure that happens before
# any module of this package is half-initialised.
def handler():
    """Entry point of group ``torchrun.handlers``: returns the handler creator.

    torch's registry calls ``handler()`` once and registers the result under
    the entry point's name, ``fsmingle``.

    Returns:
        Callable[[RendezvousParameters], RendezvousHandler]: calls
        :func:`create_rdzv_handler`.
    """
    return _create


def _create(params):
    return create_rdzv_handler(params)


def _server_connect_host(addr: str) -> str:
    """The host the TCPStore master connects its own client to.

    The server listens on all interfaces; the master object also connects to
    it.  An announced IP that is not assigned here (``addr=`` behind NAT, a
    pod or load-balancer IP) is unreachable from this host itself, so that
    connection goes through loopback instead.
    """
    try:
        ip = ipaddress.ip_address(addr.split("%")[0])
    except ValueError:
        return addr  # a host name from --local-addr: the user vouches for it
    local = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    if str(ip) in local:
        return addr
    return "::1" if ip.version == 6 else "127.0.0.1"


KEEP_AGENT_STORES = 4  # agentstore-<E>-<R>/ directories kept (newest rounds), as KEEP_STORE_FILES


def agent_store_name(epoch: int, rnd: int) -> str:
    """``agentstore-<E>-<R>``: the FolderStore of round R of lineage E (``--rdzv-conf store=folder``)."""
    return f"agentstore-{epoch:012d}-{rnd:012d}"


def prune_agent_stores(store: Any, current: str, keep: int = KEEP_AGENT_STORES) -> None:
    """Retire all but the newest ``keep`` agent stores older than ``current`` (called by a round's rank 0).

    A round's agents use only their own round's store, so an older one is garbage once a newer
    round started; the newest few are kept for agents slow to notice the new round.  ``retire``
    moves a whole store aside atomically before deleting it (readers see it or nothing).
    """
    names = sorted(n for n in store.listdir("") if n.startswith("agentstore-") and n < current)
    for n in names[: max(0, len(names) - keep + 1)]:
        store.retire(n)


class FsRendezvousHandler(DynamicRendezvousHandler):
    """torch's ``DynamicRendezvousHandler`` on :class:`FsRendezvousBackend`, with its own c10d store.

    Differences from torch's c10d backend, each documented in ``docs/torchrun-backend.md``:

    * :meth:`next_rendezvous` waits for a *previous* run with the same id that
      is closed but still has live members to drain (bounded by
      ``join_timeout``), then starts a fresh lineage.
    * The c10d store of a round is a TCPStore hosted by the round's rank-0
      agent at its announced address, found through ``store-<E>-<R>.json``;
      the same server is shared with the workers (``MASTER_ADDR`` /
      ``MASTER_PORT``) unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``.
      Every round gets a new server on a new port: the workers of a
      restarted group must never read keys (gloo addresses) that the
      previous group's workers left in the store.  ``MASTER_ADDR`` /
      ``MASTER_PORT`` are therefore exchanged again every round.
    * :meth:`shutdown` closes the rendezvous (as torch does) only if this node
      was a member of the current lineage, and then removes this node from
      the state so that the run can be recognised as finished.

    Create it with :func:`create_rdzv_handler`.
    """

    _fs_backend: FsRendezvousBackend
    _board: StoreAddressBoard
    _beats: HeartbeatWriter
    _read_timeout: float
    _server: Any
    _client: Any

    def _fs_setup(self, backend: FsRendezvousBackend, read_timeout: float, store_kind: str = "tcp") -> None:
        self._fs_backend = backend
        self._store_kind = store_kind
        self._board = StoreAddressBoard(backend.store, self._settings.run_id)
        self._read_timeout = float(read_timeout)
        self._server = None
        self._client = None
        self._round: tuple[int, int, str, int] = (0, 0, "", 0)  # lineage, round, store host, port
        interval = self._settings.keep_alive_interval.total_seconds()
        self._beats = HeartbeatWriter(backend.store, self._settings.run_id, self._this_node, interval, backend.view)
        backend.set_node(self._this_node, self._beats)

    # -- keep-alives: heartbeat files, never the shared state --------------------

    def _start_heartbeats(self) -> None:
        # torch starts a timer whose _RendezvousKeepAliveOp writes the shared
        # state every keep_alive_interval; here the heartbeat file does that job.
        self._beats.start()

    def _stop_heartbeats(self) -> None:
        # torch stops keep-alives while a node re-joins, because its join loop
        # writes them into the state instead.  Heartbeat files keep going from
        # the first join until shutdown, so the join loop never has to.
        pass

    def _keep_alive(self) -> None:
        self._beats.beat()

    # -- rendezvous -------------------------------------------------------------

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round (see ``RendezvousHandler.next_rendezvous``).

        Returns:
            RendezvousInfo: the round's store (prefixed per lineage and round),
            this node's rank, the number of nodes, and ``MASTER_ADDR`` /
            ``MASTER_PORT`` for the workers.

        Raises:
            RendezvousClosedError: the run is closed (another agent of it
                exited), or an earlier run with this id stayed closed with live
                members for ``join_timeout`` seconds.
            RendezvousTimeoutError: the round did not complete within
                ``join_timeout`` seconds (not counting time held by peer jobs
                pending in the scheduler's queue), or rank 0's store address did
                not appear within ``read_timeout`` seconds; fsmingle's
                ``RendezvousTimeoutError`` when peer jobs stayed pending past
                ``queue_timeout`` seconds.
            PeerJobEndedError: a peer job ended without joining while fewer
                than ``MIN`` nodes had joined (names job, state and reason).
            RendezvousGracefulExitError: this node was redundant (``max``
                reached) and the run closed.
            RendezvousStateError: the state on disk is corrupt.
            RendezvousConnectionError: the directory cannot be read or written.

        A member that cannot reach the round's store (rank 0's TCPStore) within
        ``keep_alive_interval * keep_alive_max_attempt`` seconds, or whose
        confirmation rank 0 does not get within that time, loses the round
        (``fsmingle/torchrun/reach.py``): a node that then reaches no other
        member leaves the round and waits until one answers (a network cut);
        the others join the next round.  No error is raised for it.
        """
        if self._fs_backend.pinned_epoch is None:
            self._wait_for_previous_run()
        self._beats.start()  # before this node enters the state: its file must exist first
        # A new round gets a new store server (see _get_store), so torch's
        # cached MASTER_ADDR/PORT of the first round must not be reused: let
        # it exchange them again through this round's store.  (Rank 0 may
        # also change between rounds: ranks follow the sorted node list.)
        while True:
            self._bootstrap_store_info = None
            self._shared_tcp_store_server = None
            self._server = self._client = None
            try:
                info = super().next_rendezvous()
            except RoundUnreachableError as e:
                self._leave_round(str(e))
                continue
            # A member that cannot reach this round's store must not be in it (reach.py's doc).
            bound = self._fs_backend.view.liveness
            tcp = self._store_kind == "tcp"
            verdict = confirm_round(info.store, info.rank, info.world_size, bound) if tcp else "ok"
            if verdict == "ok":
                self._export_socket_ifname()
                return info
            self._leave_round(f"round {self._round[1]}: {verdict}")

    def _leave_round(self, why: str) -> None:
        # The round is lost.  A node that reaches no other member is the one cut off: it leaves the
        # round through the state (the filesystem still works), so that the members who reach each
        # other complete the next round without it, and joins again once it reaches one of them.
        # The others join the next round at once (torch's exit op leaves the round first).
        epoch, rnd, addr, port = self._round
        st = self._state_holder.state
        others = (set(st.participants) | st.wait_list | st.redundancy_list) - {self._this_node}
        # Never this node's own address (another agent of this host, or rank 0 here): a connect to it stays on the
        # host (loopback: accepted or refused, both "reachable"), so a cut host would always reach "someone".
        targets = sorted(({(n.addr, port) for n in others} | {(addr, port)}) - {(self._this_node.addr, port)})
        if not targets or reaches_any(targets):  # alone in the state: nobody to tell us apart from
            log.warning("round %d of lineage %d is lost (%s); joining the next round", rnd, epoch, why)
            return
        self._op_executor.run(LeaveOp(), self._get_deadline(self._settings.timeout.close))

        def closed() -> bool:
            rec = self._fs_backend.peek()
            return rec is not None and rec.state.closed

        sit_out(targets, closed, f"node {self._this_node} reaches no other member of round {rnd} ({why})")

    def _export_socket_ifname(self) -> None:
        """Hand the workers the interface of the address this agent announced.

        torchrun starts each worker with a copy of the agent's environment plus its own
        variables (``env_vars = os.environ.copy()`` in torch's
        ``distributed/elastic/multiprocessing/subprocess_handler/subprocess_handler.py``),
        so setting ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` here reaches every worker of
        this and later rounds -- the same rule as ``fsmingle run``
        (:func:`fsmingle.net.netaddr.socket_ifname_env`): never over a value the user set.
        """
        exports = socket_ifname_env(interface_of(self._this_node.addr) or "")
        for var, value in exports.items():
            os.environ[var] = value
            log.info("exporting %s=%s for the workers (the interface of %s)", var, value, self._this_node.addr)

    def _wait_for_previous_run(self) -> None:
        deadline = time.monotonic() + self._settings.timeout.join.total_seconds()
        warned = False
        while True:
            rec = self._fs_backend.peek()
            if rec is None or not rec.state.closed or self._fs_backend.is_finished(rec):
                return
            live = self._fs_backend.live_members(rec.state)
            if time.monotonic() > deadline:
                raise RendezvousClosedError(
                    f"the rendezvous '{self._settings.run_id}' is closed and its members "
                    f"{', '.join(map(repr, live))} are still alive; a run with this id is still ending"
                )
            if not warned:
                log.warning(
                    "rendezvous '%s' is closed but %d member(s) of that run are still alive (%s); waiting "
                    "for them to exit or to miss their heartbeats before starting a new run",
                    self._settings.run_id,
                    len(live),
                    ", ".join(map(repr, live)),
                )
                warned = True
            sleep_jitter(1.0)

    def _get_store(self) -> Any:
        state = self._state_holder.state
        epoch = self._fs_backend.epoch or 0
        rnd = state.round
        rank = state.participants[self._this_node]
        leaders = [n for n, r in sorted(state.participants.items()) if r == 0]
        if len(leaders) != 1:
            raise RendezvousStateError(
                f"round {rnd} of '{self._settings.run_id}' has {len(leaders)} nodes of rank 0; "
                "rank 0 left before the round could start"
            )
        leader = leaders[0]
        timeout = timedelta(seconds=self._read_timeout)
        prefix = f"torch.rendezvous.{self._settings.run_id}.{epoch}.{rnd}"
        if self._store_kind == "folder":
            # --rdzv-conf store=folder: the agents' store is a FolderStore of this round, in the run
            # directory (a new one per round, as the TCPStore is).  Rank 0's agent still hosts the
            # workers' TCPStore (torch asks it for one: _create_tcp_store_server).
            from ..fs.folderstore_torch import folder_store_class

            name = agent_store_name(epoch, rnd)
            base = folder_store_class()(self._fs_backend.store.path(name), timeout=timeout)
            if rank == 0:
                prune_agent_stores(self._fs_backend.store, name)
            return dist.PrefixStore(prefix, base)
        if rank == 0:
            server = self._new_server()
            self._board.publish(StoreAddress(epoch, rnd, self._this_node, self._this_node.addr, server.port))
            base = server
            self._round = (epoch, rnd, self._this_node.addr, server.port)
        else:
            a = self._board.wait(epoch, rnd, leader, self._read_timeout)
            self._round = (epoch, rnd, a.addr, a.port)
            # Connecting gets the keep-alive bound (a member silent that long is dead to torch),
            # not read_timeout: a member that cannot reach the store must leave the round before
            # rank 0 gives up on it (reach.py).  Later operations get read_timeout.
            bound = min(self._read_timeout, self._fs_backend.view.liveness)
            try:
                base = dist.TCPStore(
                    a.addr, a.port, is_master=False, multi_tenant=True, timeout=timedelta(seconds=bound)
                )
                base.set_timeout(timeout)
            except (RuntimeError, ValueError, TimeoutError) as e:
                raise RoundUnreachableError(
                    f"cannot connect to rank 0's store at {a.addr}:{a.port} ({e}); is that address "
                    "reachable from this node? choose it with --rdzv-conf iface=... or addr=..."
                ) from e
            self._client = base
        return dist.PrefixStore(prefix, base)

    def _new_server(self) -> Any:
        # One server per round, on a fresh ephemeral port.  torch's workers
        # use the agent's server without a per-attempt prefix ("we create a
        # new TCPStore for every retry", torch/distributed/rendezvous.py), so
        # reusing one server across rounds lets restarted workers read the
        # previous group's gloo addresses and fail with "connection refused".
        # The port: outside the kernel's ephemeral range, bound and listening here and handed to
        # torch as it is (master_listen_fd; torch owns and closes it), so no other process on
        # this host can be given it in between (fsmingle.net.ports); else torch's own port 0.
        held = listener(socket.AF_INET6 if ":" in self._this_node.addr else socket.AF_INET)
        try:
            self._server = dist.TCPStore(
                host_name=_server_connect_host(self._this_node.addr),
                port=held.getsockname()[1] if held is not None else 0,
                is_master=True,
                multi_tenant=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=self._read_timeout),
                **({"master_listen_fd": held.detach()} if held is not None else {}),
            )
        except (RuntimeError, ValueError) as e:
            raise RendezvousConnectionError(f"cannot host the rendezvous TCPStore ({e})") from e
        log.info("hosting the rendezvous TCPStore at %s:%d", self._this_node.addr, self._server.port)
        return self._server

    def _create_tcp_store_server(self, master_addr: str, master_port: int) -> Any:
        # torch's handler asks rank 0 for a store server to share with the
        # workers: it is the one this agent hosts for the round.
        return self._server if self._server is not None else self._new_server()

    # -- closing ----------------------------------------------------------------

    def _close(self) -> None:
        deadline = self._get_deadline(self._settings.timeout.close)
        self._op_executor.run(GuardedCloseOp(self._fs_backend), deadline)

    def set_closed(self) -> None:
        """Mark the run closed: agents still joining or re-joining get ``RendezvousClosedError``.

        Only a lineage this node was a member of is closed.

        Raises:
            RendezvousTimeoutError: not written within ``close_timeout`` seconds.
            RendezvousStateError, RendezvousConnectionError: as for :meth:`next_rendezvous`.
        """
        super().set_closed()

    def shutdown(self) -> bool:
        """Close the run (see :meth:`set_closed`) and remove this node from the state.

        Called by torchrun when the agent exits (not when it dies from a signal).

        Returns:
            bool: True if both steps were written, False if one failed with a
            ``RendezvousError`` (logged as a warning).
        """
        try:
            with self._heartbeat_lock:
                self._close()
                self._op_executor.run(LeaveOp(), self._get_deadline(self._settings.timeout.close))
            return True
        except (RendezvousError, KeyError) as ex:
            log.warning(
                "node %s failed to shut down the rendezvous '%s': %s: %s",
                self._this_node,
                self._settings.run_id,
                type(ex).__name__,
                ex,
            )
            return False
        finally:
            # After leaving: until then others must keep seeing this node alive.
            self._beats.stop(remove=True)


# --------------------------------------------------------------------------
# Creation
# --------------------------------------------------------------------------


def create_rdzv_handler(params: RendezvousParameters) -> FsRendezvousHandler:
    """Create the ``fsmingle`` rendezvous handler from torchrun's parameters.

    Args:
        params (RendezvousParameters): ``endpoint`` is the shared directory
            (absolute path), ``run_id`` the job id, ``min_nodes``/``max_nodes``
            from ``--nnodes``, ``local_addr`` from ``--local-addr``, and the
            ``--rdzv-conf`` keys of :mod:`fsmingle.torchrun.conf`.

    Returns:
        FsRendezvousHandler: whose ``get_backend()`` is ``"fsmingle"``.

    Raises:
        ConfigError: the endpoint is missing or not an absolute path, the run
            id is not a safe directory name, a ``--rdzv-conf`` value is not an
            integer or out of range, ``addr``/``iface`` is invalid, or
            ``peer_jobs``/``queue_timeout``/``queue_poll`` is refused by its option.
        StorageError: the endpoint's parent does not exist (shared filesystem
            not mounted?) or the directory cannot be created or written.
        UnsafeDirectoryError: the endpoint is world-writable without the
            sticky bit, or the run directory is not owned by you, is a
            symlink, or is group/world-writable.
    """
    endpoint = (params.endpoint or "").strip()
    if not endpoint:
        raise ConfigError(
            "--rdzv-endpoint is required: a directory on the filesystem all nodes share, e.g. /shared/rdzv"
        )
    if not os.path.isabs(endpoint):
        raise ConfigError(
            f"--rdzv-endpoint {endpoint!r} is not an absolute path; the fsmingle backend takes a directory "
            "on the filesystem all nodes share, e.g. /shared/rdzv (not host:port)"
        )
    run_id = validate_job_id(params.run_id)
    unknown = sorted(set(params.config) - conf.KNOWN_KEYS)
    if unknown:
        log.warning("ignoring --rdzv-conf keys the fsmingle backend does not know: %s", ", ".join(unknown))
    c = conf.parse(params)

    def td(v: int | None) -> timedelta | None:
        return None if v is None else timedelta(seconds=v)

    store = open_job_dir(endpoint, run_id)
    backend = FsRendezvousBackend(store, run_id, liveness_s=c.liveness_s, interval_s=float(c.keep_alive_interval))
    h = FsRendezvousHandler.from_backend(
        run_id,
        None,  # type: ignore[arg-type]  # the store is made per round, see _get_store
        backend,
        params.min_nodes,
        params.max_nodes,
        c.addr,
        RendezvousTimeout(td(c.join_timeout), td(c.last_call_timeout), td(c.close_timeout), td(c.heartbeat_timeout)),
        keep_alive_interval=c.keep_alive_interval,
        keep_alive_max_attempt=c.keep_alive_max_attempt,
    )
    assert isinstance(h, FsRendezvousHandler)
    h._fs_setup(backend, c.read_timeout, c.store)
    watch = queue_watch(params.config, os.environ, params.max_nodes)
    if watch is not None:  # peer jobs in the scheduler's queue hold join_timeout (queuehold's doc)
        per_job = os.environ.get("SLURM_NNODES", "")
        h._op_executor = HoldingExecutor(
            h._op_executor, watch, store, backend, run_id, int(per_job) if per_job.isdigit() else 1
        )
    return h
