"""`semjobs run` across several engine processes on one machine, and how many engine
processes `semjobs run` and `semjobs worker` start (`plan`).

On a CPU one engine process with one torch thread per core outruns one process using every
core: decoding is a chain of small matrix products that torch's threads split poorly, while
two processes on two cores each keep 0.75-0.9 of a lone process's one-thread speed
(docs/batching.md, "One engine process per core"). The parent validates and stores the job,
hands every process a contiguous share of the items, shows one progress bar and exports;
each child loads its own engine and runs the same per-item code as a worker
(`semjobs.worker.process.run_items`: claim, decode, commit), so a child that dies loses only its
items in flight, which the next run of the same command resumes. The parent hands the items out
a block at a time, in the job's order, as each child has started the ones it holds: static
shares finished up to a fifth apart (one share held the long answers), the faster process idle.

Children are spawned, not forked: the parent may have imported torch, and a forked copy of
torch's thread pool hangs. They load their engines before the parent stores anything, so a
model that cannot load stores no job, as in one process.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import queue
import signal
import sys
from typing import Callable

from semjobs.settings import settings
from semjobs.worker.engine import EngineLoadError


class EngineProcessLost(RuntimeError):
    """A child engine process died before finishing its items."""


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _runs_on_cpu() -> bool:
    if settings.device == "cpu":
        return True
    if settings.device != "auto":
        return False
    import torch

    return not torch.cuda.is_available()


# Below this many items per process, one process decodes them faster in one batch than
# several processes in smaller ones: a pass over 8 sequences costs one core about 1.5x a
# pass over 1, and two processes on two cores each run at 0.75-0.9 of one alone.
MIN_ITEMS_PER_PROCESS = 8


def plan(n_items: int | None = None) -> tuple[int, int | None]:
    """(engine processes, torch threads in each) for ``n_items`` items (None: a worker's
    stream of them). ``settings.processes`` when set, the cores shared out among them unless
    ``settings.threads`` says otherwise. Else one on an accelerator (torch's threads); on a
    CPU one process per core (per ``settings.threads`` cores), each with one thread, but no
    more processes than keep ``MIN_ITEMS_PER_PROCESS`` items each busy: on this project's
    2-core CPU one thread ran 3.7x faster than two for a process decoding 3 items
    (docs/batching.md, "One engine process per core")."""
    cores = usable_cores()
    if settings.processes is not None:
        processes = settings.processes
        return processes, settings.threads or (max(1, cores // processes) if processes > 1 else None)
    if not _runs_on_cpu():
        return 1, settings.threads
    threads = settings.threads or 1
    processes = max(1, cores // threads)
    if n_items is not None:
        processes = max(1, min(processes, n_items // MIN_ITEMS_PER_PROCESS))
    return processes, threads


def die_with_parent() -> None:
    """Linux: SIGTERM this process when the parent dies (killed, it cannot stop its children),
    so no orphan keeps decoding items a rerun would claim again."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _child(index: int, overrides: dict, request: tuple, inbox, outbox) -> None:
    """One engine process: load, say so, then run the items it is sent."""
    from semjobs.worker import engine as engines
    from semjobs.worker.process import run_items

    die_with_parent()

    for name, value in overrides.items():
        setattr(settings, name, value)
    try:
        try:
            engine = engines.get_engine(*request)
        except EngineLoadError as e:
            outbox.put(("failed", index, str(e)))
            return
        outbox.put(("ready", index, engines.method_problems(engine)))
        work = inbox.get()
        if work is None:
            return
        job_id, seqs, url = work

        def refill() -> list[int]:
            outbox.put(("more", index, None))
            return inbox.get()

        run_items(job_id, seqs, url=url, on_item=lambda _key, seq: outbox.put(("item", index, seq)), refill=refill)
        outbox.put(("done", index, None))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        pass


class InProcessEngine:
    """The same interface over this process's own engine (one engine process)."""

    def __init__(self, request: tuple):
        self.request = request

    def __enter__(self) -> InProcessEngine:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def wait_loaded(self) -> dict[str, str]:
        """Load the engine (kept for run_items, which decodes with it); the methods it
        cannot run, with why (``semjobs.worker.engine.method_problems``)."""
        from semjobs.worker import engine as engines

        return engines.method_problems(engines.get_engine(*self.request))

    def run(self, job_id: str, seqs: list[int], url: str, on_item: Callable[[int], None],
            block: int = 1) -> None:  # noqa: ARG002 -- one process takes them all, in the order given
        from semjobs.worker.process import run_items

        run_items(job_id, seqs, url=url, on_item=lambda _key, seq: on_item(seq))


def open_engines(n: int, threads: int | None, request: tuple) -> InProcessEngine | EngineProcesses:
    """Where `semjobs run` decodes a job (``request``: what it asks of the engine,
    ``semjobs.worker.process.engine_request``): this process for ``n`` = 1, else ``n`` children."""
    if n == 1:
        if threads is not None:
            settings.threads = threads
        return InProcessEngine(request)
    return EngineProcesses(n, threads, request)


class EngineProcesses:
    """``n`` child engine processes, each with ``threads`` torch threads; use as a context
    manager (leaving it stops every child)."""

    def __init__(self, n: int, threads: int | None, request: tuple):
        ctx = mp.get_context("spawn")
        overrides = settings.model_dump()
        overrides["threads"] = threads
        overrides["method"] = request[0]  # each child loads the engine that serves it
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(n)]
        self._children = [
            ctx.Process(target=_child, args=(i, overrides, request, self._inboxes[i], self._outbox),
                        name=f"semjobs-engine-{i}", daemon=True)
            for i in range(n)
        ]
        for child in self._children:
            child.start()

    def __enter__(self) -> EngineProcesses:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _next(self, waiting: set[int]) -> tuple[str, int, object]:
        """The next message from a child: (kind, child, detail); ("lost", i, exit code) when
        child i of ``waiting`` died with nothing more to say."""
        while True:
            try:
                return self._outbox.get(timeout=1.0)
            except queue.Empty:
                pass
            for i in waiting:
                code = self._children[i].exitcode
                if code is not None:
                    try:  # its last words may still be in the pipe
                        return self._outbox.get(timeout=1.0)
                    except queue.Empty:
                        return "lost", i, code

    def wait_loaded(self) -> dict[str, str]:
        """Return once every child holds its engine, with the methods their engines cannot
        run and why (the children load alike); EngineLoadError if one could not load."""
        waiting = set(range(len(self._children)))
        problems: dict[str, str] = {}
        while waiting:
            kind, index, detail = self._next(waiting)
            if kind == "failed":
                raise EngineLoadError(detail)
            if kind == "lost":
                raise EngineLoadError(f"engine process {index} exited with code {detail} while loading")
            problems.update(detail or {})
            waiting.discard(index)
        return problems

    def run(self, job_id: str, seqs: list[int], url: str, on_item: Callable[[int], None], block: int = 1) -> None:
        """Run ``seqs`` of the job in their order, ``block`` seqs at a time to whichever child
        has started all it holds (``block``: an input's samples, adjacent seqs, so that one
        process prefills their shared prompt once); ``on_item`` is called with each finished
        item's seq. A child that dies does not stop the others: once they are done,
        EngineProcessLost names it (its unfinished items stay unfinished in the database, for
        the next run to resume)."""
        blocks = [seqs[i:i + max(1, block)] for i in range(0, len(seqs), max(1, block))]
        blocks.reverse()  # popped from the end: in the job's order
        waiting, lost = set(), []
        for i, inbox in enumerate(self._inboxes):
            if blocks:
                inbox.put((job_id, blocks.pop(), url))
                waiting.add(i)
            else:
                inbox.put(None)  # nothing for it: it exits
        while waiting:
            kind, index, detail = self._next(waiting)
            if kind == "more":
                self._inboxes[index].put(blocks.pop() if blocks else [])
            elif kind == "item":
                on_item(detail)
            elif kind in ("done", "lost"):
                waiting.discard(index)
                if kind == "lost":
                    lost.append(f"engine process {index} exited with code {detail}")
        if lost:
            raise EngineProcessLost("; ".join(lost))

    def close(self) -> None:
        for child, inbox in zip(self._children, self._inboxes):
            if child.is_alive():
                inbox.put(None)  # a child still waiting for work exits
        for child in self._children:
            child.join(timeout=10)
            if child.is_alive():
                child.terminate()
                child.join()
