"""How long to wait before trying again: 0.5 s doubling to 30 s, with jitter."""

from __future__ import annotations

import random
from collections.abc import Callable

INITIAL_S = 0.5
CAP_S = 30.0


class Backoff:
    """Exponential backoff with "equal jitter": each delay is half the step plus a random part
    of the other half, so agents that lost the function together do not come back together."""

    def __init__(
        self,
        initial_s: float = INITIAL_S,
        cap_s: float = CAP_S,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._initial_s = initial_s
        self._cap_s = cap_s
        self._rand = rand
        self._attempt = 0

    def next_delay(self) -> float:
        step = min(self._cap_s, self._initial_s * 2.0**self._attempt)
        if step < self._cap_s:
            self._attempt += 1
        return step / 2 + self._rand() * step / 2

    def reset(self) -> None:
        self._attempt = 0
