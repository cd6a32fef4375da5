"""The scheduler-to-event-loop mailbox: order kept, one wake-up per batch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from oxillama.serving.mailbox import Mailbox, wakeups_held


def test_posts_from_a_thread_arrive_in_order() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        box = Mailbox(loop)
        got: list[int] = []
        done = asyncio.Event()

        def producer() -> None:
            # Five "steps" of eight deliveries each, as a batched decode
            # step of eight streams posts them.
            for step in range(5):
                for i in range(8):
                    box.post(got.append, step * 8 + i)
                box.post(lambda _: None, None)
            box.post(lambda _: done.set(), None)

        t = threading.Thread(target=producer)
        t.start()
        await done.wait()
        t.join()
        return got

    assert asyncio.run(main()) == list(range(40))


def test_a_batch_posted_while_the_loop_is_busy_wakes_it_once() -> None:
    async def main() -> tuple[list[str], int]:
        loop = asyncio.get_running_loop()
        box = Mailbox(loop)
        got: list[str] = []
        wakes = 0
        real = loop.call_soon_threadsafe

        def counting(*a: object, **k: object) -> asyncio.Handle:
            nonlocal wakes
            wakes += 1
            return real(*a, **k)  # type: ignore[arg-type]

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        # The loop is busy (this coroutine does not yield) while the thread
        # posts: every post after the first finds a wake-up already due.
        t = threading.Thread(target=lambda: [box.post(got.append, c) for c in "abcdefgh"])
        t.start()
        t.join()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return got, wakes

    got, wakes = asyncio.run(main())
    assert got == list("abcdefgh")
    assert wakes == 1


def test_posting_to_a_closed_loop_is_silent() -> None:
    loop = asyncio.new_event_loop()
    box = Mailbox(loop)
    loop.close()
    box.post(print, "never delivered")  # must not raise


async def _until(cond: Callable[[], bool]) -> None:
    """Lets the loop run until ``cond`` holds (a thread is working)."""
    for _ in range(2000):
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("timed out")


def test_held_wakeups_wake_each_loop_once_when_the_block_ends() -> None:
    async def main() -> tuple[list[str], list[int]]:
        loop = asyncio.get_running_loop()
        box = Mailbox(loop)
        got: list[str] = []
        wakes: list[int] = []  # how many items had arrived at each wake-up
        real = loop.call_soon_threadsafe

        def counting(*a: object, **k: object) -> asyncio.Handle:
            wakes.append(len(got))
            return real(*a, **k)  # type: ignore[arg-type]

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        posted = threading.Event()
        go_on = threading.Event()

        def producer() -> None:
            # A scheduler step: eight pieces sampled under held wake-ups.
            with wakeups_held():
                for c in "abcdefgh":
                    box.post(got.append, c)
                posted.set()
                go_on.wait(10)
            box.post(got.append, "i")  # the next step, held no more

        t = threading.Thread(target=producer)
        t.start()
        await _until(posted.is_set)
        await asyncio.sleep(0.01)
        # Everything is posted; nothing woke the loop, nothing arrived.
        held = (list(got), list(wakes))
        go_on.set()
        await _until(lambda: len(got) == 9)
        t.join()
        assert held == ([], [])
        return got, wakes

    got, wakes = asyncio.run(main())
    assert got == list("abcdefghi")
    # One wake-up for the held eight; "i" found it due or woke once more.
    assert wakes[0] == 0 and len(wakes) <= 2


def test_held_wakeups_still_wake_when_the_block_raises() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        box = Mailbox(loop)
        got: list[int] = []

        def producer() -> None:
            try:
                with wakeups_held():
                    box.post(got.append, 1)
                    with wakeups_held():  # nested: the outer exit wakes
                        box.post(got.append, 2)
                    raise RuntimeError("a step failed")
            except RuntimeError:
                pass

        t = threading.Thread(target=producer)
        t.start()
        await _until(lambda: len(got) == 2)
        t.join()
        return got

    assert asyncio.run(main()) == [1, 2]
