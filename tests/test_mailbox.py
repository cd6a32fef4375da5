"""The scheduler-to-event-loop mailbox: order kept, one wake-up per batch."""

from __future__ import annotations

import asyncio
import threading

from oxillama.serving.mailbox import Mailbox


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
