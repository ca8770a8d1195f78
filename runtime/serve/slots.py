"""N generation slots over one model: each a Context (its own KV cache) that a request holds while it generates.

A request takes the free slot whose cache shares the longest prefix with its prompt (then the least recently used),
so a conversation that comes back lands where its history is cached and prefills only the new turn. When every
slot is busy, requests wait in arrival order. The generation runs on a thread of its own (the C loop blocks); its
text pieces reach the event loop through an asyncio queue. A consumer that goes away (client disconnect) cancels
its generation, which stops at the next token, and the slot is released once the C loop has returned."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import anyio

from ..python.api import Context, Runtime


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass
class Slot:
    id: int
    ctx: Context
    busy: bool = False
    last_used: float = 0.0
    requests: int = 0
    # the last request's cancel: the context's decode count when it was cancelled and when its C loop returned
    # (cancelled_at -1: it was not)
    last: dict = field(default_factory=dict)


@dataclass
class Finished:
    result: dict          # Context.stream's _result: ids, text, prompt_tokens, cached_tokens, finish_reason, timings


class SlotPool:
    def __init__(self, runtime: Runtime, n: int, threads: int | None = None, disk=None):
        self.runtime = runtime
        self.disk = disk   # a PromptCacheDir (--prompt-cache-dir), or None
        self.slots = [Slot(i, runtime.new_context(threads)) for i in range(n)]
        self.waiting = 0
        self._cond: asyncio.Condition | None = None
        self._pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="edgellm-slot")

    def close(self) -> None:
        for s in self.slots:
            s.ctx.cancel()
        self._pool.shutdown(wait=True)

    @property
    def busy(self) -> int:
        return sum(s.busy for s in self.slots)

    async def acquire(self, ids: list[int]) -> Slot:
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            self.waiting += 1
            try:
                await self._cond.wait_for(lambda: any(not s.busy for s in self.slots))
            finally:
                self.waiting -= 1
            free = [s for s in self.slots if not s.busy]
            best = max(free, key=lambda s: (common_prefix(s.ctx.cached, ids), -s.last_used))
            best.busy = True
            return best

    async def release(self, slot: Slot) -> None:
        async with self._cond:
            slot.busy = False
            slot.last_used = time.monotonic()
            slot.requests += 1
            self._cond.notify()

    async def generate(self, ids: list[int], params: dict):
        """Yields text pieces (str), then one Finished. Waits for a slot first. Raises EdgeLLMError from the runtime
        (bad sampling values, a prompt that does not fit). Closing the generator early cancels the generation."""
        slot = await self.acquire(ids)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        done, stop = threading.Event(), threading.Event()

        def work():
            r: dict = {}
            try:
                if self.disk is not None:   # a saved prefix of this prompt, where the slot holds less of it
                    self.disk.prepare(slot.ctx, ids)
                pieces = slot.ctx.stream(ids, reuse_prefix=True, _result=r, **params)
                if stop.is_set():   # cancelled before the stream existed
                    slot.ctx.cancel()
                for piece in pieces:
                    loop.call_soon_threadsafe(queue.put_nowait, piece)
                if self.disk is not None and r.get("finish_reason") != "cancelled":
                    self.disk.remember(slot.ctx, ids)   # before the slot is free: nothing else runs on it
                loop.call_soon_threadsafe(queue.put_nowait, Finished(r))
            except Exception as e:  # noqa: BLE001 - the consumer re-raises it: a runtime error or a bug, never a hang
                loop.call_soon_threadsafe(queue.put_nowait, e)
            finally:
                done.set()

        future = loop.run_in_executor(self._pool, work)
        released = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                if isinstance(item, Finished):   # free the slot before the last item: the caller may stop here
                    await future
                    slot.last = {"cancelled_at": -1}
                    await self.release(slot)
                    released = True
                    yield item
                    return
                yield item
        finally:
            if not released:
                # shielded: a cancelled request (client gone) must still wait for its C loop and free the slot
                with anyio.CancelScope(shield=True):
                    if not done.is_set():
                        stop.set()
                        slot.ctx.cancel()
                        # read after the flag is set: what the C loop runs past it (the token in flight), not how
                        # long a loaded host took to schedule this thread between a read and the cancel
                        at = slot.ctx.stats()["decode_tokens"]
                        await future
                        slot.last = {"cancelled_at": at, "ended_at": slot.ctx.stats()["decode_tokens"]}
                    else:
                        await future
                    await self.release(slot)
