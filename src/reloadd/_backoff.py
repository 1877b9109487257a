"""One backoff for reloadd and its plugins: exponential delays on tenacity's wait strategies.

The work queue's retries, the source supervisor, and the plugins' own retry and poll loops
(containerd content writes, the start-up image check, the Kubernetes client, CRD waits) all
take their delays from :class:`Backoff`, so one rule says how reloadd waits: ``initial`` doubled
per attempt, capped at ``maximum``, plus up to ``initial`` of random jitter when asked (so a
fleet of nodes retrying one server does not retry in step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tenacity

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """Exponential delays: ``initial × 2^(attempt-1)``, capped at ``maximum``, with optional jitter.

    Attributes:
        initial: The first delay, seconds.
        maximum: No delay is longer (jitter included).
        jitter: Add up to ``initial`` seconds at random.
    """

    initial: float = 0.1
    maximum: float = 30.0
    jitter: bool = True
    _wait: tenacity.wait.wait_base = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        wait: tenacity.wait.wait_base = tenacity.wait_exponential(multiplier=self.initial, max=self.maximum)
        if self.jitter:
            wait = wait + tenacity.wait_random(0, self.initial)
        object.__setattr__(self, "_wait", wait)

    def wait(self, retry_state: tenacity.RetryCallState) -> float:
        """The delay after ``retry_state``'s attempt: a tenacity ``wait=`` for ``tenacity.AsyncRetrying``."""
        return min(self.maximum, float(self._wait(retry_state)))

    def delay(self, attempt: int) -> float:
        """The wait before try number ``attempt + 1`` (``attempt`` 1 is the first failure)."""
        state = tenacity.RetryCallState(retry_object=tenacity.AsyncRetrying(), fn=None, args=(), kwargs={})
        state.attempt_number = max(1, attempt)
        return self.wait(state)
