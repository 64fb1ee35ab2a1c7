"""The harness's own errors: what it could not build or feed is never counted against the backend."""

from __future__ import annotations


class HarnessError(Exception):
    """The harness could not build or plan the model: never counted against the backend."""


class InputError(HarnessError):
    """An input the builder cannot make for this model (names the model and the argument)."""
