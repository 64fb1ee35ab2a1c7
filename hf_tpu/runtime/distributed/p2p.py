"""Point-to-point on tpu_dist: send, recv (from a named rank or any source), as a mixin of the group.

Each message runs on a helper thread per (sender, receiver) direction, so a rank may post a send and a
receive (a ring, `batch_isend_irecv`) without either blocking the other; each direction keeps program
order, which is how sends match receives. A receive from any source (`src=None`) waits on a thread of its
own for the first rank whose next message to it has been posted (every send posts its half of the
send/recv agreement in the store first), then takes that message as a named receive would.
"""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.buffers.dtypes import to_jax_dtype
from hf_tpu.runtime.distributed import programs
from hf_tpu.runtime.distributed.agreement import TIMEOUT_ENV, PeerGoneError, peer_failure
from hf_tpu.runtime.distributed.arguments import check_tensors, signature
from hf_tpu.runtime.distributed.work import TpuWork, join_future
from hf_tpu.runtime.tensors.tensor import to_jax, write

_executors: dict[tuple[int, int], ThreadPoolExecutor] = {}
_executors_lock = threading.Lock()


def _direction(sender: int, receiver: int) -> ThreadPoolExecutor:
    """One thread per (sender, receiver): messages of a direction keep their order."""
    with _executors_lock:
        ex = _executors.get((sender, receiver))
        if ex is None:
            ex = _executors[(sender, receiver)] = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"tpu_dist_p2p_{sender}_{receiver}"
            )
        return ex


class PointToPoint:
    """send/recv/recv_anysource of `ProcessGroupTPU` (which gives `_ranks`, `_group_rank`, `_agreement`)."""

    def _peer(self, peer: int, collective: str) -> int:
        if not 0 <= peer < len(self._ranks) or peer == self._group_rank:
            raise ValueError(
                f"tpu_dist {collective}: peer {peer} must be another rank of this group of {len(self._ranks)}"
            )
        return self._ranks[peer]

    def send(self, tensors, dst: int, tag: int = 0):
        (t,) = tensors
        check_tensors([t], "send")
        me, peer = self._ranks[self._group_rank], self._peer(dst, "send")
        x = to_jax(t)
        with _p2p_lock:  # numbered and queued in one step: a direction's thread runs them in number order
            pair = self._pair_check(me, peer, "send", t)
            future = _direction(me, peer).submit(_exchange, pair, (me, peer), x)
        return TpuWork(join_future(future), [t], "send")

    def recv(self, tensors, src: int, tag: int = 0):
        (t,) = tensors
        check_tensors([t], "recv")
        me, peer = self._ranks[self._group_rank], self._peer(src, "recv")
        jnp = platform.jax().numpy
        x = jnp.zeros(tuple(t.shape), to_jax_dtype(t.dtype))
        with _p2p_lock:
            if _deferred[0] == 0:
                future = self._post_recv(peer, me, t, x)
                return TpuWork(join_future(future, lambda y: write(t, y)), [t], "recv")
            # a receive from any source posted before this one is not matched yet: this receive takes the
            # next message from `src` after it, so it is numbered once that one is (in posting order)
            _deferred[0] += 1
            claim = _any_source_thread().submit(self._post_deferred, peer, me, t, x)
        return TpuWork(_join_claim(claim, lambda y: write(t, y)), [t], "recv")

    def _post_recv(self, sender: int, me: int, t: torch.Tensor, x):
        """Number the next message from `sender` for this receive and queue its exchange (under _p2p_lock)."""
        pair = self._pair_check(sender, me, "recv", t)
        return _direction(sender, me).submit(_exchange, pair, (sender, me), x)

    def _post_deferred(self, sender: int, me: int, t: torch.Tensor, x):
        with _p2p_lock:
            try:
                return self._ranks.index(sender), self._post_recv(sender, me, t, x)
            finally:
                _deferred[0] -= 1

    def _pair_check(self, sender: int, receiver: int, role: str, t: torch.Tensor):
        """The send/recv agreement of this message (numbered in its direction's order now, run on the
        direction's thread before the exchange), or None when the exchange is off."""
        with _executors_lock:
            seq = _p2p_seq[(sender, receiver)] = _p2p_seq.get((sender, receiver), -1) + 1
        if not self._agreement.active:
            return None
        return functools.partial(self._agreement.pair, sender, receiver, seq, role, signature([t]))

    def recv_anysource(self, tensors, tag: int = 0):
        """A receive from whichever rank of the group sends first (`dist.recv(t)` / `dist.irecv(t)` without
        `src`). Every send posts its half of the send/recv agreement in the store before it moves data;
        this receive (on a thread of its own, so `irecv` returns at once) watches for the first rank whose
        next message to this rank is posted, takes that message as a receive from it would, and answers
        the sender's group rank from `_source_rank()`. Receives named after it wait for it to be matched
        (a receive takes the next message of its sender in posting order, as every receive does here);
        tags are not matched, as for every tpu_dist send and receive (messages match in order)."""
        (t,) = tensors
        check_tensors([t], "recv")
        me = self._ranks[self._group_rank]
        senders = [r for r in self._ranks if r != me]
        if not senders:
            raise ValueError("tpu_dist recv from any source: this group has no other rank to receive from")
        if not self._agreement.active:
            raise RuntimeError(
                "tpu_dist recv from any source (src=None) finds the sender through the send/recv agreement "
                "in the c10d store, which HF_TPU_DIST_CHECK=0 turns off: name the sender rank (src=...), or "
                "leave HF_TPU_DIST_CHECK on"
            )
        jnp = platform.jax().numpy
        x = jnp.zeros(tuple(t.shape), to_jax_dtype(t.dtype))
        with _p2p_lock:
            _deferred[0] += 1
            claim = _any_source_thread().submit(self._claim_any, senders, me, t, x)
        return AnySourceWork(claim, t)

    def _claim_any(self, senders: list[int], me: int, t: torch.Tensor, x):
        """The any-source thread: wait until some sender has posted its next message to this rank, then
        queue the receive of that message on its direction (returns the sender's group rank, the future)."""
        try:
            timeout = self._agreement.timeout()
            start = time.monotonic()
            delay = 0.0005
            while True:
                for sender in senders:
                    with _executors_lock:
                        seq = _p2p_seq.get((sender, me), -1) + 1
                    if self._agreement.posted(sender, me, seq):
                        with _p2p_lock:
                            return self._ranks.index(sender), self._post_recv(sender, me, t, x)
                waited = time.monotonic() - start
                if waited > timeout:
                    raise PeerGoneError(
                        f"tpu_dist recv from any source (rank {me}, group ranks {list(self._ranks)}): no rank sent "
                        f"to rank {me} within {waited:.0f} s: the senders exited or are stuck elsewhere. "
                        f"{TIMEOUT_ENV} sets this timeout (now {timeout:g} s)."
                    )
                time.sleep(delay)
                delay = min(delay * 2, 0.02)
        finally:
            with _p2p_lock:
                _deferred[0] -= 1


class AnySourceWork(TpuWork):
    """The Work of a receive from any source: `wait()` fills the tensor, `_source_rank()` answers the
    sender's group rank (torch's `recv` returns it, as a global rank)."""

    def __init__(self, claim: Future, t: torch.Tensor) -> None:
        found: list[int] = []
        super().__init__(
            _join_claim(claim, lambda y: write(t, y), found.append), [t], "recv (from any source)"
        )
        self._found = found

    def _source_rank(self) -> int:
        self.wait()
        return self._found[0]

    def source_rank(self) -> int:
        return self._source_rank()


def _join_claim(claim: Future, write_back, found=None):
    """A finisher for a receive queued through the any-source thread: wait for its message to be chosen
    (`claim` gives the sender's group rank and the exchange's future), then for the exchange."""

    def finish(timeout: float | None) -> None:
        sender, future = claim.result(timeout)
        if found is not None:
            found(sender)
        write_back(future.result(timeout))

    return finish


_p2p_seq: dict[tuple[int, int], int] = {}  # messages numbered per (sender, receiver)
_p2p_lock = threading.RLock()  # numbering a message and queueing its exchange are one step
_deferred = [0]  # receives queued on the any-source thread and not numbered yet
_any_source: list[ThreadPoolExecutor] = []


def _any_source_thread() -> ThreadPoolExecutor:
    """One thread numbers the receives from any source (and the receives posted while one is pending),
    in posting order."""
    with _executors_lock:
        if not _any_source:
            _any_source.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpu_dist_p2p_any"))
        return _any_source[0]


def _exchange(pair, ranks: tuple, x):
    """A direction's thread: agree with the peer on the message (`pair`), then move it."""
    if pair is not None:
        pair()
    try:
        return programs.run(ranks, programs.send_body(), x)
    except Exception as exc:  # noqa: BLE001
        raise peer_failure("send/recv", ranks, exc) from exc
