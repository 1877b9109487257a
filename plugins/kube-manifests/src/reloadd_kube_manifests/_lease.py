"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Several reloadd processes (one per node) may watch copies of one manifests folder; only the holder of the
Lease applies and prunes. The algorithm is client-go's ``tryAcquireOrRenew``:

* **Fast path** (client-go 1.30, kubernetes#122069): the holder whose lease is still valid by its own clock
  PUTs its cached Lease at once, with the ``resourceVersion`` of its last GET or PUT answer: a renewal is one
  request. Only when that PUT fails (409: someone wrote the Lease since) does it take the slow path below.
* GET the Lease (404: POST one naming this process; success = leader).
* Whenever the Lease's spec differs from the last one seen, note *this process's* monotonic time: expiry is
  judged from when this process last saw the Lease change, plus the holder's ``leaseDurationSeconds``; no
  other host's clock is trusted.
* Held by another and not expired: not leader. Else PUT this process as holder, with the
  ``resourceVersion`` of the GET as precondition (a 409 loses the race).
* Acquire: try every ``retry_period`` (× up to 1.2, jittered): a standby reads the Lease once per retry period
  and writes nothing. Renew: every ``retry_period``, retrying for at most ``renew_deadline``; failing that,
  leadership is over.

Fencing: :meth:`LeaderElector.may_write` is true only while this process holds the Lease *and* its last
successful renewal is younger than ``renew_deadline`` on the monotonic clock, which keeps running while the
process is paused (SIGSTOP, a VM freeze): a leader resumed after its lease passed writes nothing, before its
renew loop has even noticed. The applier asks before every object it applies or deletes. A clean stop
releases the Lease (holder ``""``, ``leaseDurationSeconds: 1``), so a standby takes over within a retry period.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ._client import ApiError, ApiUnavailable, KubeClient

__all__ = ["LeaderElector", "LeaseSettings", "default_identity"]

_JITTER = 1.2


def default_identity() -> str:
    """``<hostname>_<uuid4>``: unique per process start, so two processes never share leadership."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def _micro_time() -> str:
    """A Kubernetes MicroTime: UTC RFC 3339 with exactly six fractional digits."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """The election's timings and Lease.

    Attributes:
        name: The Lease's name.
        namespace: Its namespace.
        lease_duration: Seconds a candidate waits after it last saw the Lease change (whole seconds, ≥ 1).
        renew_deadline: Seconds the leader keeps trying to renew before it stops writing.
        retry_period: Seconds between tries.
    """

    name: str
    namespace: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def problem(self) -> str | None:
        """Why these timings cannot work (client-go's checks), or ``None``."""
        if self.lease_duration < 1 or self.lease_duration != int(self.lease_duration):
            return "lease_duration must be a whole number of seconds, at least 1"
        if self.lease_duration <= self.renew_deadline:
            return "lease_duration must be longer than renew_deadline"
        if self.renew_deadline <= _JITTER * self.retry_period:
            return "renew_deadline must be longer than 1.2 × retry_period"
        if self.retry_period <= 0:
            return "retry_period must be positive"
        return None


class LeaderElector:
    """One process's side of the election.

    Args:
        client: A client of its own (lease traffic must not queue behind applies or watches), whose
            requests time out after ``max(1, renew_deadline / 2)`` and are not retried.
        settings: The Lease and timings.
        identity: This process's holder identity.
        on_started: Called when this process becomes the leader.
        on_stopped: Called when it stops being the leader (lost or released).
        clock: Monotonic clock.
    """

    def __init__(self, client: KubeClient, settings: LeaseSettings, *, identity: str | None = None,
                 on_started: Callable[[], None] = lambda: None, on_stopped: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic, logger: logging.Logger | None = None) -> None:
        self.client = client
        self.settings = settings
        self.identity = identity or default_identity()
        self.on_started = on_started
        self.on_stopped = on_stopped
        self._clock = clock
        self.log = logger or logging.getLogger(__name__)
        self.leading = False
        self.holder = ""
        """The holder last seen ("" when free or never read)."""
        self.holder_since = 0.0
        """Wall-clock time this process first saw the current holder."""
        self._observed: Mapping[str, Any] | None = None
        self._observed_at = 0.0
        self._last_renew = float("-inf")
        self._lease: Mapping[str, Any] | None = None
        """The Lease as the server last answered it (GET, POST or PUT): the fast path PUTs its resourceVersion."""
        self.stats = {"lease_writes": 0, "lease_reads": 0, "transitions": 0, "slow_path": 0}

    @property
    def _path(self) -> str:
        s = self.settings
        return f"/apis/coordination.k8s.io/v1/namespaces/{s.namespace}/leases/{s.name}"

    def may_write(self) -> bool:
        """Whether this process may write to the cluster now (holder, and renewed within ``renew_deadline``)."""
        return self.leading and self._clock() - self._last_renew < self.settings.renew_deadline

    def _see(self, spec: Mapping[str, Any]) -> None:
        if spec != self._observed:
            self._observed = dict(spec)
            self._observed_at = self._clock()
        holder = str(spec.get("holderIdentity") or "")
        if holder != self.holder:
            self.holder = holder
            self.holder_since = time.time()

    def _spec(self, old: Mapping[str, Any] | None) -> dict[str, Any]:
        now = _micro_time()
        ours = old is not None and old.get("holderIdentity") == self.identity
        transitions = int((old or {}).get("leaseTransitions") or 0)
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.settings.lease_duration),
            "acquireTime": (old or {}).get("acquireTime") if ours else now,
            "renewTime": now,
            "leaseTransitions": transitions if ours or old is None else transitions + 1,
        }

    def _body(self, lease: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
        """A full Lease for a PUT: ``spec`` with ``lease``'s resourceVersion as the precondition."""
        s = self.settings
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": s.name, "namespace": s.namespace,
                             "resourceVersion": (lease.get("metadata") or {}).get("resourceVersion")},
                "spec": dict(spec)}

    def _valid_holder(self) -> bool:
        """This process holds the Lease and, by its own clock, the lease has not run out (client-go's fast path)."""
        spec = (self._lease or {}).get("spec") or {}
        if self._lease is None or spec.get("holderIdentity") != self.identity:
            return False
        duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_duration)
        return self._observed_at + duration > self._clock()

    async def try_acquire_or_renew(self) -> bool:
        """One attempt (client-go's ``tryAcquireOrRenew``); ``True`` when this process holds the Lease now.

        A valid holder renews with one PUT of its cached Lease; everyone else (and a holder whose PUT failed)
        GETs first, so a standby costs one read per attempt and a conflict costs the holder one extra read.
        """
        s = self.settings
        cached = self._lease
        if cached is not None and self._valid_holder():
            if await self._write("PUT", self._path, self._body(cached, self._spec(cached.get("spec") or {}))):
                return True
            self.stats["slow_path"] += 1  # someone wrote the Lease since (409) or the PUT failed: read it
        try:
            self.stats["lease_reads"] += 1
            lease = await self.client.get(self._path, attempts=1)
        except ApiError as exc:
            if exc.status != 404 or exc.plain:
                self.log.debug("Cannot read Lease %s/%s: %s", s.namespace, s.name, exc)
                return False
            lease = None
        except ApiUnavailable as exc:
            self.log.debug("Cannot read Lease %s/%s: %s", s.namespace, s.name, exc)
            return False
        if lease is None:
            self._lease = None
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": s.name, "namespace": s.namespace}, "spec": self._spec(None)}
            return await self._write("POST", self._path.rsplit("/", 1)[0], body)
        self._lease = lease
        spec = lease.get("spec") or {}
        self._see(spec)
        holder = str(spec.get("holderIdentity") or "")
        duration = float(spec.get("leaseDurationSeconds") or s.lease_duration)
        if holder and holder != self.identity and self._observed_at + duration > self._clock():
            return False  # held, and not expired by what this process has seen
        return await self._write("PUT", self._path, self._body(lease, self._spec(spec)))

    async def _write(self, method: str, path: str, body: dict[str, Any]) -> bool:
        try:
            self.stats["lease_writes"] += 1
            answer = await self.client.request(method, path, body=body, attempts=1)
        except (ApiError, ApiUnavailable) as exc:
            self.log.debug("Cannot write Lease %s/%s: %s", self.settings.namespace, self.settings.name, exc)
            return False
        # The server's answer carries the new resourceVersion: the next renewal PUTs it without a GET.
        self._lease = answer if isinstance(answer, Mapping) and answer.get("metadata") else None
        self._see(body["spec"])
        return True

    async def run(self) -> None:
        """Acquire, lead (renewing) until the Lease is lost, and acquire again; until cancelled."""
        s = self.settings
        while True:
            await self._acquire()
            self._last_renew = self._clock()
            self.leading = True
            self.stats["transitions"] += 1
            self.log.info("Became the leader of Lease %s/%s as %s", s.namespace, s.name, self.identity)
            self.on_started()
            try:
                await self._renew()
            finally:
                self.leading = False
                self.log.warning("Lost the lead of Lease %s/%s (now held by %s); standing by", s.namespace, s.name,
                                 self.holder or "nobody")
                self.on_stopped()

    async def _acquire(self) -> None:
        """Try until this process holds the Lease: every retry period, jittered up to × 1.2."""
        while True:
            if await self.try_acquire_or_renew():
                return
            await asyncio.sleep(self.settings.retry_period * (1 + random.random() * (_JITTER - 1)))

    async def _renew(self) -> None:
        s = self.settings
        while True:
            await asyncio.sleep(s.retry_period)  # renew every retry period
            deadline = self._clock() + s.renew_deadline
            while True:
                if not self.may_write():
                    return  # paused past the deadline (SIGSTOP, a frozen VM): over, whatever the Lease says
                if await self.try_acquire_or_renew():
                    self._last_renew = self._clock()
                    break
                if self.holder and self.holder != self.identity:
                    return  # someone else holds it: lost at once (stricter than client-go)
                if self._clock() >= deadline:
                    return
                await asyncio.sleep(min(s.retry_period, max(0.0, deadline - self._clock())))

    async def release(self) -> None:
        """Give the Lease up if this process holds it (a clean stop): a standby takes over within a retry period.

        One PUT of the cached Lease (client-go's release); a GET only when that PUT meets a conflict.
        """
        if not self.leading and self.holder != self.identity:
            return
        self.leading = False
        lease = self._lease
        for _ in range(2):
            if lease is None:
                try:
                    self.stats["lease_reads"] += 1
                    lease = await self.client.get(self._path, attempts=1)
                except (ApiError, ApiUnavailable):
                    return
            spec = (lease or {}).get("spec") or {}
            if not lease or spec.get("holderIdentity") != self.identity:
                return
            now = _micro_time()
            freed = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now}
            if await self._write("PUT", self._path, self._body(lease, freed)):
                s = self.settings
                self.log.info("Released Lease %s/%s", s.namespace, s.name)
                return
            lease = None  # a conflict (or a failed PUT): read it once and try again
