"""``dws up`` stops on a signal whichever of its threads the signal lands on."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from opendws.cli.stack import Stopped, stop_on_signals, wait_for_a_signal


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs POSIX threads' signals")
def test_a_signal_delivered_to_another_thread_stops_the_wait_within_a_step() -> None:
    """The kernel delivers a signal sent to a process (``kill``, ``killpg``) to any thread
    that does not block it, and Python runs the handler only in the main thread, when that
    thread next runs. Here the signal lands on a helper thread while the main thread waits;
    the wait must notice it within one step. Should it not, the helper wakes the main thread
    itself after 5 s (while the handlers are still this test's), so a wait that sleeps longer
    fails this test instead of hanging it."""
    main = threading.get_ident()
    landed = threading.Event()
    finished = threading.Event()

    def elsewhere() -> None:
        time.sleep(0.3)  # the main thread is asleep by now
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # on this thread only
        landed.set()
        if not finished.wait(5):
            signal.pthread_kill(main, signal.SIGUSR2)  # the main thread's own: a long wait ends

    helper = threading.Thread(target=elsewhere, daemon=True)

    def wait() -> None:
        # The handler may run as soon as the helper has started: the wait must cover that.
        helper.start()
        wait_for_a_signal(step=0.2)

    started = time.monotonic()
    with stop_on_signals(signal.SIGUSR1, signal.SIGUSR2):
        try:
            with pytest.raises(Stopped) as stopped:
                wait()
        finally:
            # No signal may come once the handlers are restored (SIGUSR2 would end pytest).
            finished.set()
            helper.join()
    took = time.monotonic() - started
    assert landed.is_set()
    assert str(stopped.value) == "SIGUSR1"
    assert took < 2.0
