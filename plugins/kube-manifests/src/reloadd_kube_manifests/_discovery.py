"""API discovery: (group, version, kind) → resource URL, cached per group/version.

The classic walk (``/api``, ``/api/v1``, ``/apis``, ``/apis/<g>/<v>``) works on every server version;
aggregated discovery is a later optimisation 1.20 does not have. Start-up reads the group list and the core
group; any other group/version is read the first time a lookup needs it (a folder of ConfigMaps costs 2
requests, not the ~40 of the whole walk, nor the TLS handshakes of that many parallel requests). The cache
of a group/version is refreshed when a lookup misses (rate-limited, so a manifest full of unknown kinds
cannot hammer the server) and forcibly after a CRD of that group becomes established.

Discovery degrades per group/version, as kubectl's does: an aggregated API whose backend is down (an
``APIService`` answering 503, e.g. metrics-server on k3s) only makes *that* group/version unknown, with the
reason kept (:meth:`Discovery.problem`), so its objects wait while everything else is applied. A
group/version document of a named group is fetched once, without the client's backoff (nor its wait for
``Retry-After``): the aggregator's 503 is immediate, and retrying it for seconds would hold back every file
that needs discovery. The engine's own retry of the waiting file reads it again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from reloadd import ReloaddError

from ._client import ApiError, ApiUnavailable, KubeClient

__all__ = ["Discovery", "Resource", "split_api_version"]


def split_api_version(api_version: str) -> tuple[str, str]:
    """``"apps/v1"`` → ``("apps", "v1")``; ``"v1"`` → ``("", "v1")``."""
    group, _, version = api_version.rpartition("/")
    return group, version


@dataclass(frozen=True, slots=True)
class Resource:
    """A served resource type.

    Attributes:
        group: API group (``""`` for core).
        version: API version.
        kind: Object kind.
        plural: URL resource name.
        namespaced: Whether objects live in namespaces.
    """

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """``group/version`` or ``version`` for core."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_kind(self) -> str:
        """``Kind.group`` as the ApplySet spec spells it (``Kind`` for core)."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def path(self, namespace: str | None, name: str | None = None) -> str:
        """The collection URL, or the object URL when ``name`` is given."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        return base + f"/{quote(name, safe='')}" if name else base


def _gv_path(group: str, version: str) -> str:
    return f"/apis/{group}/{version}" if group else f"/api/{version}"


class Discovery:
    """A cache of what the server serves.

    Args:
        client: The REST client.
        min_refresh: Minimum seconds between two refreshes of one group/version on a miss.
        gv_attempts: Tries for one group/version document (1 = no retry).
        clock: Injectable monotonic clock.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        min_refresh: float = 1.0,
        gv_attempts: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._min_refresh = min_refresh
        self._gv_attempts = gv_attempts
        self._clock = clock
        self._by_gv: dict[tuple[str, str], dict[str, Resource]] = {}
        self._problems: dict[tuple[str, str], str] = {}
        self._versions: dict[str, list[str]] = {}
        self._fetched: dict[tuple[str, str], float] = {}
        self._preferred: dict[str, str] = {"": "v1"}
        self._groups_fetched = -1e9
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        """Read the group list and the core group; the other groups/versions are read on first use.

        A group/version that cannot be read (an unavailable aggregated API) is recorded as a problem
        when a lookup needs it; only the group list itself (the API server's own ``/apis``) must answer.

        Raises:
            ApiUnavailable: when the API server itself stays unreachable.
            ApiError: when it refuses the group list (e.g. 401/403).
        """
        await asyncio.gather(self._load_groups(), self._load_gv("", "v1"))

    async def _load_groups(self) -> None:
        body = await self._client.get("/apis")
        self._versions = {}
        self._preferred = {"": "v1"}  # a group that went away (its CRDs deleted) must not linger
        for grp in body.get("groups") or ():
            name = str(grp.get("name"))
            self._versions[name] = [str(v.get("version")) for v in grp.get("versions") or ()]
            pref = grp.get("preferredVersion") or {}
            if pref.get("version"):
                self._preferred[name] = str(pref["version"])
        self._groups_fetched = self._clock()

    async def _load_gv(self, group: str, version: str) -> None:
        gv = (group, version)
        self._fetched[gv] = self._clock()
        try:
            # The core group is the API server itself: give it the client's full retries.
            body = await self._client.get(_gv_path(group, version), attempts=None if not group else self._gv_attempts)
        except ApiError as exc:
            if exc.status == 404:
                self._by_gv[gv] = {}
                self._problems.pop(gv, None)
                return
            self._unreadable(gv, str(exc))
            return
        except ApiUnavailable as exc:  # the aggregated API's backend is down, or overloaded
            self._unreadable(gv, exc.last)
            return
        except ReloaddError as exc:
            self._unreadable(gv, str(exc))
            return
        self._problems.pop(gv, None)
        kinds: dict[str, Resource] = {}
        for res in body.get("resources") or ():
            name = str(res.get("name"))
            if "/" in name:
                continue  # a subresource such as deployments/status
            kinds[str(res.get("kind"))] = Resource(
                group, version, str(res.get("kind")), name, bool(res.get("namespaced"))
            )
        self._by_gv[gv] = kinds

    def _unreadable(self, gv: tuple[str, str], why: str) -> None:
        """Remember why ``gv`` could not be read; keep what an earlier read found (it is the best guess)."""
        self._by_gv.setdefault(gv, {})
        self._problems[gv] = f"{gv[0] + '/' if gv[0] else ''}{gv[1]} is unavailable ({why})"

    def problem(self, api_version: str) -> str | None:
        """Why ``apiVersion`` could not be discovered last time it was read (``None`` if it was read)."""
        return self._problems.get(split_api_version(api_version))

    def group_problem(self, group: str) -> str | None:
        """Why ``group`` cannot be looked at: its preferred version (or, lacking one, any version) is unavailable."""
        pref = self._preferred.get(group)
        if pref is not None:
            return self._problems.get((group, pref))
        return next((why for (g, _v), why in sorted(self._problems.items()) if g == group), None)

    async def resolve(self, api_version: str, kind: str) -> Resource | None:
        """The resource for ``apiVersion``/``kind``, refreshing a stale miss; ``None`` if not served."""
        group, version = split_api_version(api_version)
        found = self._by_gv.get((group, version), {}).get(kind)
        if found is not None:
            return found
        async with self._lock:
            if self._clock() - self._fetched.get((group, version), -1e9) >= self._min_refresh:
                await self._load_gv(group, version)
        return self._by_gv.get((group, version), {}).get(kind)

    async def resolve_group_kind(self, group: str, kind: str) -> Resource | None:
        """The resource for ``group``/``kind`` at the group's preferred (else any served) version."""
        async with self._lock:
            if group not in self._preferred and self._clock() - self._groups_fetched >= self._min_refresh:
                await self._load_groups()
        pref = self._preferred.get(group)
        if pref is not None:
            res = await self.resolve(f"{group}/{pref}" if group else pref, kind)
            if res is not None:
                return res
        for version in self._versions.get(group, []):
            if version != pref:
                res = await self.resolve(f"{group}/{version}" if group else version, kind)
                if res is not None:
                    return res
        for (g, _v), kinds in self._by_gv.items():
            if g == group and kind in kinds:
                return kinds[kind]
        return None

    async def reread(self, res: Resource) -> Resource | None:
        """The server answered "not served" for ``res``: re-read its group/version (and the group list when
        the version is gone) at once; the resource as served now, or ``None`` when it is gone."""
        async with self._lock:
            await self._load_gv(res.group, res.version)
            if res.group and not self._by_gv.get((res.group, res.version)):
                await self._load_groups()
        if (res.group, res.version) in self._problems:
            return res  # unreadable right now, not gone: let the caller report the error
        return self._by_gv.get((res.group, res.version), {}).get(res.kind)

    def invalidate(self, group: str) -> None:
        """Forget the fetch times of ``group`` so the next lookups re-read it (after a CRD change)."""
        for gv in [gv for gv in self._fetched if gv[0] == group]:
            del self._fetched[gv]
        self._groups_fetched = -1e9

    @staticmethod
    def parse_group_kind(value: str) -> tuple[str, str]:
        """``"Deployment.apps"`` → ``("apps", "Deployment")``; ``"ConfigMap"`` → ``("", "ConfigMap")``."""
        kind, _, group = value.partition(".")
        return group, kind

    def snapshot(self) -> Mapping[tuple[str, str], Mapping[str, Any]]:
        """The cached resources per group/version (for diagnostics and tests)."""
        return {gv: dict(kinds) for gv, kinds in self._by_gv.items()}
