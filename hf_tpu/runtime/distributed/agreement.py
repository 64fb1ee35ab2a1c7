"""Agreeing on a collective before it runs: every rank posts what it is about to do, then checks the others.

JAX's cross-process collectives trust every process to run the same program: ranks that pass tensors of
different shapes or dtypes compile different programs, and gloo then aborts the process ("Received data
size doesn't match expected size") or waits forever. So before each collective, every rank of the group
writes a small signature (the collective, shapes, dtypes, op, root, split sizes, or the error its own
arguments raised) to the group's c10d store and reads everyone's. Any difference becomes one clear error,
raised on every rank, naming the collective and each rank's shapes/dtypes; a rank that never posts (it
died, or is stuck elsewhere) becomes a `PeerGoneError` naming it once the timeout has passed.

The timeout is `HF_TPU_DIST_TIMEOUT` (seconds), else `init_process_group(timeout=...)` when given, else
600 s (NCCL's default). `HF_TPU_DIST_CHECK=0` turns the exchange off (a little faster; mismatches then abort or hang).
Keys are `tpu_dist/<n>/<group rank>` in the group's own (prefixed) store; each rank deletes its key of
collective n-1 once collective n is agreed (by then every rank has read it).
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from hf_tpu.runtime.distributed import launch_env

DEFAULT_TIMEOUT_S = 600.0  # NCCL's default watchdog timeout
TIMEOUT_ENV = launch_env.COLLECTIVE_TIMEOUT_ENV
CHECK_ENV = "HF_TPU_DIST_CHECK"


class CollectiveMismatchError(RuntimeError):
    """The ranks of a group called a collective with arguments that do not fit together."""


class PeerGoneError(RuntimeError):
    """A rank of the group did not reach the collective within the timeout (it exited, or hangs)."""


def timeout_s(pg_timeout: timedelta | None = None) -> float:
    """The collective timeout: HF_TPU_DIST_TIMEOUT, else a timeout given to init_process_group, else 600 s."""
    seconds = launch_env.collective_timeout_s()
    if seconds is not None:
        return seconds
    if pg_timeout is not None and pg_timeout != dist.distributed_c10d.default_pg_timeout:
        return pg_timeout.total_seconds()
    return DEFAULT_TIMEOUT_S


def enabled() -> bool:
    return os.environ.get(CHECK_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def describe(sig: dict) -> str:
    """One rank's signature in words: 'shape (4,) float32, op SUM'."""
    if "error" in sig:
        return f"its own arguments failed: {sig['error']}"
    parts = []
    for key, value in sig.items():
        if key == "op_name":
            continue
        if key.endswith("shapes") and isinstance(value, list):
            parts.append(f"{key.replace('_', ' ')} " + ", ".join(str(tuple(s)) for s in value))
        elif key.endswith("dtypes") and isinstance(value, list):
            parts.append(f"{key.replace('_', ' ')} " + ", ".join(map(str, value)))
        elif isinstance(value, list) and key.endswith("shape"):
            parts.append(f"{key.replace('_', ' ')} {tuple(value)}")
        else:
            parts.append(f"{key.replace('_', ' ')} {value}")
    return ", ".join(parts)


class Agreement:
    """The signature exchange of one process group (ranks: global ranks, in group-rank order)."""

    def __init__(self, store, ranks: tuple, group_rank: int, pg_timeout: timedelta | None = None) -> None:
        self._store = store
        self._ranks = ranks
        self._me = group_rank
        self._pg_timeout = pg_timeout
        self._seq = 0
        # a store client blocks while it waits: each point-to-point thread waits on its own clone, so a
        # pending send never holds up the caller's next collective or receive (a ring would deadlock)
        self._local = threading.local()

    @property
    def active(self) -> bool:
        return self._store is not None and len(self._ranks) > 1 and enabled()

    def timeout(self) -> float:
        return timeout_s(self._pg_timeout)

    def _key(self, seq: int, group_rank: int) -> str:
        return f"tpu_dist/{seq}/{group_rank}"

    def exchange(self, collective: str, mine: dict) -> list[dict]:
        """Post this rank's signature of `collective`; return every rank's (in group-rank order).
        `mine` may hold "error": the message this rank's own arguments raised (the others then fail too)."""
        seq = self._seq
        self._seq += 1
        timeout = timeout_s(self._pg_timeout)
        store = self._store
        keys = [self._key(seq, r) for r in range(len(self._ranks))]
        try:
            store.set(keys[self._me], json.dumps({"op_name": collective, **mine}))
        except Exception as exc:  # noqa: BLE001 - the store's host (rank 0) is gone
            raise self._store_gone(collective, exc) from exc
        start = time.monotonic()
        try:
            store.wait(keys, timedelta(seconds=timeout))
        except Exception as exc:  # noqa: BLE001 - DistStoreError on timeout, a network error if rank 0 died
            missing = self._missing(keys)
            if missing is None:
                raise self._store_gone(collective, exc) from exc
            raise PeerGoneError(
                f"tpu_dist {collective} (collective #{seq} of group ranks {list(self._ranks)}): "
                f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not reach it within "
                f"{time.monotonic() - start:.0f} s: the process exited or is stuck elsewhere (a peer is gone, "
                f"or called a different number of collectives). {TIMEOUT_ENV} sets this timeout (now {timeout:g} s)."
            ) from exc
        try:
            values = store.multi_get(keys)
            if seq > 0:
                store.delete_key(self._key(seq - 1, self._me))
        except Exception as exc:  # noqa: BLE001
            raise self._store_gone(collective, exc) from exc
        return [json.loads(v) for v in values]

    def _thread_store(self):
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = self._store.clone()
        return store

    def posted(self, sender: int, receiver: int, seq: int) -> bool:
        """Whether `sender` has posted its half of message #`seq` to `receiver` (a receive from any source
        looks for the first sender that has; the sender's key stays until the receive's `pair` reads it)."""
        try:
            return bool(self._thread_store().check([f"tpu_dist/p2p/{sender}-{receiver}/{seq}/send"]))
        except Exception as exc:  # noqa: BLE001
            raise self._store_gone("recv", exc) from exc

    def pair(self, sender: int, receiver: int, seq: int, role: str, sig: dict) -> None:
        """A send and its recv agree on shape and dtype (`role` "send" on the sender, "recv" on the
        receiver; `seq` numbers the messages of that direction): a clear error on both sides if not."""
        other = "recv" if role == "send" else "send"
        peer = receiver if role == "send" else sender
        base = f"tpu_dist/p2p/{sender}-{receiver}/{seq}/"
        timeout = timeout_s(self._pg_timeout)
        try:
            store = self._thread_store()
            store.set(base + role, json.dumps(sig))
        except Exception as exc:  # noqa: BLE001
            raise self._store_gone(role, exc) from exc
        try:
            store.wait([base + other], timedelta(seconds=timeout))
        except Exception as exc:  # noqa: BLE001
            try:
                store.check([base + other])
            except Exception:  # noqa: BLE001
                raise self._store_gone(role, exc) from exc
            raise PeerGoneError(
                f"tpu_dist {role} (message #{seq} from rank {sender} to rank {receiver}): rank {peer} did not "
                f"post the matching {other} within {timeout:g} s: the process exited or is stuck elsewhere. "
                f"{TIMEOUT_ENV} sets this timeout."
            ) from exc
        try:
            theirs = json.loads(store.get(base + other))
            store.delete_key(base + other)  # each side reads the other's key once
        except Exception as exc:  # noqa: BLE001
            raise self._store_gone(role, exc) from exc
        if theirs != sig:
            sent, received = (sig, theirs) if role == "send" else (theirs, sig)
            raise CollectiveMismatchError(
                f"tpu_dist {role}: message #{seq} from rank {sender} to rank {receiver} does not fit: rank "
                f"{sender} sends {describe(sent)}, rank {receiver} receives into {describe(received)}; "
                "nothing was sent"
            )

    def _missing(self, keys: list[str]) -> list[int] | None:
        """The global ranks whose key is absent (None when the store itself cannot be asked)."""
        try:
            return [self._ranks[r] for r, k in enumerate(keys) if not self._store.check([k])]
        except Exception:  # noqa: BLE001
            return None

    def _store_gone(self, collective: str, exc: BaseException) -> PeerGoneError:
        return PeerGoneError(
            f"tpu_dist {collective}: the c10d store (hosted by rank 0 at MASTER_ADDR:MASTER_PORT) cannot be "
            f"reached ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): rank "
            f"{self._ranks[0] if self._ranks else 0} has exited (or destroyed its process group, after an error of "
            f"its own). {TIMEOUT_ENV} sets how long ranks wait for each other."
        )

    def mismatch(self, collective: str, sigs: list[dict], what: str) -> CollectiveMismatchError:
        lines = [f"  rank {self._ranks[r]}: {describe(_public(s))}" for r, s in enumerate(sigs)]
        return CollectiveMismatchError(
            f"tpu_dist {collective}: the ranks of group {list(self._ranks)} disagree ({what}); nothing was "
            "sent:\n" + "\n".join(lines)
        )


def _public(sig: dict) -> dict:
    return {k: v for k, v in sig.items() if k != "op_name"}


_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket closed")


def peer_failure(collective: str, ranks: tuple, exc: BaseException) -> BaseException:
    """`exc` from inside a collective's exchange, explained when it says a peer went away (the rank died
    after agreeing on the collective); any other error comes back as it is."""
    text = str(exc)
    if not any(s in text for s in _PEER_LOST):
        return exc
    return PeerGoneError(
        f"tpu_dist {collective}: a peer of group ranks {list(ranks)} is gone: its connection closed during "
        f"the exchange (the process exited or was killed). {TIMEOUT_ENV} sets how long ranks wait for each "
        f"other. ({type(exc).__name__}: {text.splitlines()[0] if text else ''})"
    )
