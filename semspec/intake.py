"""How an engine reads ``generate_many``'s request source: one entry at a time, as slots free.

A full batch still reads it, so that an :class:`~semspec.types.Abort` marker reaches the
engine while every slot decodes: the worker's loop (``semjobs.worker.batching``) sends nothing else
then. A request read that way waits here for the next free slot, and nothing more is read
until it has one, so a plain list is still taken one request per free slot (give or take one).
"""

from __future__ import annotations

from typing import Iterable

from .types import Abort, Request, as_requests


class Intake:
    def __init__(self, prompts: Iterable):
        self._source = iter(as_requests(prompts))
        self._early: Request | None = None  # read while the batch was full
        self.exhausted = False  # the source has ended and every request was handed out

    def next(self, room: bool) -> Request | Abort | None:
        """The next entry: a request (only when there is ``room`` for it) or an Abort;
        None when nothing is ready now, or the source has ended (``exhausted``)."""
        if self._early is not None:
            if not room:
                return None
            req, self._early = self._early, None
            return req
        if self.exhausted:
            return None
        try:
            req = next(self._source)
        except StopIteration:
            self.exhausted = True
            return None
        if isinstance(req, Request) and not room:
            self._early = req
            return None
        return req
