"""`Work` handles tpu_dist returns: `wait()` blocks until the collective's results exist on the chips."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import torch
import torch.distributed as dist


class TpuWork(dist.Work):
    """Finishes a collective once: `finish()` blocks on its results (and, for a receive, writes them into
    the caller's tensor); `outputs` are the tensors torch's futures hand back."""

    def __init__(
        self, finish: Callable[[float | None], None], outputs: list[torch.Tensor], what: str
    ) -> None:
        super().__init__()
        self._finish = finish
        self._outputs = outputs
        self._what = what
        self._done = False
        self._error: BaseException | None = None

    def wait(self, timeout=None) -> bool:  # noqa: D401 - torch's signature
        if not self._done:
            seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
            if seconds is not None and seconds <= 0:
                seconds = None
            try:
                self._finish(seconds)
            except TimeoutError as exc:
                raise RuntimeError(f"tpu_dist {self._what}: not finished within {seconds} s") from exc
            except BaseException as exc:
                self._error = exc
                self._done = True
                raise
            self._done = True
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        try:
            self.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the future
            fut.set_exception(exc)
            return fut
        fut.set_result(self._outputs)
        return fut


def block_on(arrays: list, explain: Callable[[BaseException], BaseException] | None = None):
    """A finisher that waits for device arrays (collectives are already dispatched, asynchronously);
    `explain(exc)` turns a failure into the error to raise."""

    def finish(timeout: float | None) -> None:
        try:
            for a in arrays:
                a.block_until_ready()
        except Exception as exc:  # noqa: BLE001
            if explain is None:
                raise
            raise explain(exc) from exc

    return finish


def join_future(
    future: Future, then: Callable[[object], None] | None = None
) -> Callable[[float | None], None]:
    """A finisher for work running on a helper thread (point-to-point): wait for it, then `then(result)`."""

    def finish(timeout: float | None) -> None:
        value = future.result(timeout)
        if then is not None:
            then(value)
        else:
            value.block_until_ready()

    return finish
