"""The Kubernetes side: SandboxSession objects and their token Secrets, through the API server.

How the cluster is found: `kubeconfig=` when given; else `$KUBECONFIG` or `~/.kube/config` when
there is one; else the in-cluster ServiceAccount (a platform running as a pod). What the caller
needs (docs/sdk.md): create, get, list, watch and delete `sandboxsessions.sandboxd.dev` (and
`sandboxsnapshots.sandboxd.dev` to take snapshots), and get Secrets in the namespace.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import anyio
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from .errors import (
    ApiServerError,
    SandboxError,
    SandboxLostError,
    SandboxNotFoundError,
    SandboxPreparationError,
    SandboxTimeoutError,
    SnapshotFailedError,
)

__all__ = (
    "GROUP",
    "PLURAL",
    "SNAPSHOT_PLURAL",
    "VERSION",
    "Cluster",
    "Credentials",
    "SessionInfo",
    "SessionRef",
    "SnapshotInfo",
)

GROUP = "sandboxd.dev"
VERSION = "v1alpha1"
PLURAL = "sandboxsessions"
SNAPSHOT_PLURAL = "sandboxsnapshots"
SESSION_TOKEN_TYPE = "sandboxd.dev/session-token"

_log = logging.getLogger("sandboxd")

READY_PHASES = ("Running", "Sleeping", "Reclaimed")
"""Phases a workspace operation can use: a Sleeping or Reclaimed session is woken by it."""
FINAL_PHASES = ("Lost", "Failed")

Info = TypeVar("Info")


@dataclass(frozen=True)
class SessionRef:
    """Names one SandboxSession object: a new object of the same name is another session."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}/{self.uid}"

    @classmethod
    def parse(cls, text: str) -> SessionRef:
        """The inverse of `str(ref)`: `namespace/name/uid`."""
        parts = text.split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"a SandboxSession ref is namespace/name/uid, not {text!r}")
        return cls(*parts)


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """What the token Secret of a session holds: how to call its sandboxd."""

    endpoint: str
    session_id: str
    token: str
    ca_pem: str | None


@dataclass(frozen=True, kw_only=True)
class SessionInfo:
    """A SandboxSession as the operator last reported it."""

    name: str
    namespace: str
    uid: str
    tenant: str
    scope: str
    subject: str
    phase: str | None
    message: str | None
    runtime: str | None
    host: str | None
    briefing: str | None
    deleting: bool
    launch: str | None = None
    """How its container came to be: `warm`, `cold`, or `restored` (from its `from_snapshot`)."""
    from_snapshot: str | None = None
    """The SandboxSnapshot it opened from (`spec.from.snapshot`); None for an empty workspace."""
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Its `metadata.labels` (a snapshot of it carries them, so the operator sees it)."""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> SessionInfo:
        meta = obj.get("metadata", {})
        spec = obj.get("spec", {})
        status = obj.get("status") or {}
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            uid=str(meta.get("uid", "")),
            tenant=str(spec.get("tenant", "")),
            scope=str(spec.get("scope", "")),
            subject=str(spec.get("subject", "")),
            phase=status.get("phase"),
            message=status.get("message"),
            runtime=status.get("runtime"),
            host=status.get("host"),
            briefing=status.get("briefing"),
            deleting=meta.get("deletionTimestamp") is not None,
            launch=status.get("launch"),
            from_snapshot=(spec.get("from") or {}).get("snapshot"),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, kw_only=True)
class SnapshotInfo:
    """A SandboxSnapshot as the operator last reported it: once `phase` is `Ready`, `key` is its
    key in the object store (`<namespace>/<name>`), `host` the SandboxHost that took it, `bytes`
    (and `size`, as people read it) the bytes of its files, `entries` its files, folders and
    symlinks, `chunk_count` the distinct chunks it needs, and `message` the operator's words."""

    name: str
    namespace: str
    uid: str
    session: str
    phase: str | None
    message: str | None
    key: str | None
    host: str | None
    bytes: int | None
    size: str | None
    entries: int | None
    chunk_count: int | None
    chunks_sent: int | None
    paused_milliseconds: int | None
    taken_at: str | None
    deleting: bool

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> SnapshotInfo:
        meta = obj.get("metadata", {})
        spec = obj.get("spec", {})
        status = obj.get("status") or {}
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            uid=str(meta.get("uid", "")),
            session=str(spec.get("session", "")),
            phase=status.get("phase"),
            message=status.get("message"),
            key=status.get("key"),
            host=status.get("host"),
            bytes=_int(status.get("bytes")),
            size=status.get("size"),
            entries=_int(status.get("entries")),
            chunk_count=_int(status.get("chunkCount")),
            chunks_sent=_int(status.get("chunksSent")),
            paused_milliseconds=_int(status.get("pausedMilliseconds")),
            taken_at=status.get("takenAt"),
            deleting=meta.get("deletionTimestamp") is not None,
        )


class Cluster:
    """The API server, found lazily: building it does no I/O."""

    def __init__(self, kubeconfig: str | os.PathLike[str] | None = None) -> None:
        self._kubeconfig = kubeconfig
        self._configuration: client.Configuration | None = None
        self._lock = anyio.Lock()

    async def _config(self) -> Any:
        async with self._lock:
            if self._configuration is None:
                configuration = client.Configuration()
                path = self._kubeconfig or os.environ.get("KUBECONFIG")
                default = Path.home() / ".kube" / "config"
                if path is None and default.exists():
                    path = str(default)
                if path is not None:
                    # A KUBECONFIG list names several files; the first holds the context here.
                    first = str(path).split(os.pathsep)[0]
                    await config.load_kube_config(config_file=first, client_configuration=configuration)
                else:
                    try:
                        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
                    except config.ConfigException as error:
                        raise SandboxError(
                            "no cluster to talk to: pass kubeconfig=, set KUBECONFIG, or run in a pod "
                            f"with a ServiceAccount ({error})"
                        ) from error
                self._configuration = configuration
            return self._configuration

    async def _api(self) -> Any:
        return client.ApiClient(configuration=await self._config())

    async def create(
        self,
        namespace: str,
        name: str,
        spec: Mapping[str, Any],
        labels: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
    ) -> SessionInfo:
        """Creates the SandboxSession, or returns the one of that name already there."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxSession",
            "metadata": metadata,
            "spec": dict(spec),
        }
        async with await self._api() as api:
            objects = client.CustomObjectsApi(api)
            try:
                created = await objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
                return SessionInfo.of(created)
            except ApiException as error:
                if error.status != 409:
                    raise _api_error(error, f"could not create SandboxSession {namespace}/{name}") from error
            existing = await self.get(namespace, name)
            if existing is None:
                raise SandboxError(f"SandboxSession {namespace}/{name} existed and is gone: try again")
            return existing

    async def get(self, namespace: str, name: str) -> SessionInfo | None:
        """The SandboxSession, or None when there is none of that name."""
        async with await self._api() as api:
            try:
                obj = await client.CustomObjectsApi(api).get_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name
                )
            except ApiException as error:
                if error.status == 404:
                    return None
                raise _api_error(error, f"could not read SandboxSession {namespace}/{name}") from error
            return SessionInfo.of(obj)

    async def list(self, namespace: str, *, label_selector: str | None = None) -> list[SessionInfo]:
        """The SandboxSessions of a namespace."""
        async with await self._api() as api:
            try:
                found = await client.CustomObjectsApi(api).list_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, label_selector=label_selector or ""
                )
            except ApiException as error:
                raise _api_error(error, f"could not list SandboxSessions in {namespace}") from error
            return [SessionInfo.of(obj) for obj in found.get("items", [])]

    async def delete(self, ref: SessionRef) -> bool:
        """Deletes the object the ref names (only that uid); False when it was already gone."""
        async with await self._api() as api:
            body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=ref.uid))
            try:
                await client.CustomObjectsApi(api).delete_namespaced_custom_object(
                    GROUP, VERSION, ref.namespace, PLURAL, ref.name, body=body
                )
            except ApiException as error:
                if error.status in (404, 409):
                    return False
                raise _api_error(error, f"could not delete SandboxSession {ref}") from error
            return True

    async def wait_ready(
        self,
        ref: SessionRef,
        *,
        timeout: float,
        on_status: Callable[[str], object] | None = None,
    ) -> SessionInfo:
        """Watches the session until a workspace operation can use it (Running, Sleeping or
        Reclaimed), reporting "preparing sandbox…" while it is Pending or Preparing. Raises
        `SandboxNotFoundError` when it is gone or replaced, `SandboxLostError` when Lost or
        Failed (with the operator's message)."""
        said: tuple[str | None, str | None] | None = None

        last: SessionInfo | None = None

        def check(info: SessionInfo | None) -> SessionInfo | None:
            nonlocal said, last
            last = info
            if info is None or info.uid != ref.uid:
                raise SandboxNotFoundError(
                    f"SandboxSession {ref.namespace}/{ref.name} with uid {ref.uid} is gone"
                    + ("" if info is None else " (an object of that name is another session now)")
                )
            if info.deleting:
                raise SandboxNotFoundError(f"SandboxSession {ref.namespace}/{ref.name} is being deleted")
            if info.phase in FINAL_PHASES:
                raise SandboxLostError(
                    info.message or f"SandboxSession {ref.namespace}/{ref.name} is {info.phase}",
                    phase=str(info.phase),
                )
            if info.phase in READY_PHASES:
                return info
            if said != (info.phase, info.message):
                said = (info.phase, info.message)
                words = f"preparing sandbox… ({info.phase or 'Pending'}{': ' + info.message if info.message else ''})"
                _log.info("%s/%s: %s", ref.namespace, ref.name, words)
                if on_status is not None:
                    on_status(words)
            return None

        try:
            with anyio.fail_after(timeout):
                attempt = 0
                while True:
                    try:
                        ready = await self._look(
                            f"SandboxSession {ref}", ref.namespace, PLURAL, ref.name, SessionInfo.of, check
                        )
                    except Exception as error:
                        if not is_transient(error):
                            raise
                        attempt += 1
                        _log.warning("%s: the API server is away (%s); trying again", ref, error)
                        await anyio.sleep(min(5.0, 0.25 * 2**attempt))
                        continue
                    attempt = 0
                    if ready is not None:
                        return ready
        except TimeoutError as error:
            where = "no status yet" if last is None else f"{last.phase}: {last.message or 'no message'}"
            raise SandboxPreparationError(
                f"SandboxSession {ref.namespace}/{ref.name} was not ready within {timeout:g} s ({where})"
            ) from error

    async def _look(
        self,
        what: str,
        namespace: str,
        plural: str,
        name: str,
        parse: Callable[[Mapping[str, Any]], Info],
        check: Callable[[Info | None], Info | None],
    ) -> Info | None:
        """One list and one watch (of at most 30 s) of one object (`what`, in errors): what
        `check` found done, or None to look again; `check` gets None when the object is gone."""
        async with await self._api() as api:
            objects = client.CustomObjectsApi(api)
            try:
                found = await objects.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural, field_selector=f"metadata.name={name}"
                )
            except ApiException as error:
                raise _api_error(error, f"could not read {what}") from error
            items = found.get("items", [])
            done = check(parse(items[0]) if items else None)
            if done is not None:
                return done
            version = found["metadata"]["resourceVersion"]
            # The watch holds a client of its own: closed by its context.
            async with watch.Watch() as watcher:
                stream = watcher.stream(
                    objects.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    plural,
                    field_selector=f"metadata.name={name}",
                    resource_version=version,
                    timeout_seconds=30,
                )
                try:
                    async for event in stream:
                        if event.get("type") == "ERROR":
                            break  # an expired resourceVersion: list again
                        obj = event.get("object")
                        if not isinstance(obj, Mapping):
                            continue
                        done = check(None if event.get("type") == "DELETED" else parse(obj))
                        if done is not None:
                            return done
                except ApiException as error:
                    if error.status != 410:
                        raise _api_error(error, f"could not watch {what}") from error
        return None

    async def create_snapshot(
        self, namespace: str, name: str, *, session: str, labels: Mapping[str, str]
    ) -> SnapshotInfo:
        """Creates SandboxSnapshot `name` of SandboxSession `session` (of the same namespace),
        carrying `labels` (the session's: the operator sees only objects its selector matches).
        A name taken already is refused (`ApiServerError` with status 409), never reused: a
        snapshot is taken once."""
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxSnapshot",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": {"session": session},
        }
        async with await self._api() as api:
            try:
                created = await client.CustomObjectsApi(api).create_namespaced_custom_object(
                    GROUP, VERSION, namespace, SNAPSHOT_PLURAL, body
                )
            except ApiException as error:
                if error.status == 409:
                    raise ApiServerError(
                        f"SandboxSnapshot {namespace}/{name} exists already: a snapshot is taken once, "
                        "so name another one (or delete that one first)",
                        status=409,
                    ) from error
                raise _api_error(error, f"could not create SandboxSnapshot {namespace}/{name}") from error
        return SnapshotInfo.of(created)

    async def get_snapshot(self, namespace: str, name: str) -> SnapshotInfo | None:
        """The SandboxSnapshot, or None when there is none of that name."""
        async with await self._api() as api:
            try:
                obj = await client.CustomObjectsApi(api).get_namespaced_custom_object(
                    GROUP, VERSION, namespace, SNAPSHOT_PLURAL, name
                )
            except ApiException as error:
                if error.status == 404:
                    return None
                raise _api_error(error, f"could not read SandboxSnapshot {namespace}/{name}") from error
        return SnapshotInfo.of(obj)

    async def wait_snapshot(self, namespace: str, name: str, *, uid: str, timeout: float) -> SnapshotInfo:
        """Watches SandboxSnapshot `name` (the object of that `uid`) until it is Ready. Raises
        `SnapshotFailedError` (the operator's message) when it Failed, `SandboxNotFoundError`
        when it is gone or replaced (deleting its session deletes it), and `SandboxTimeoutError`
        (where it stood) when it is not Ready within `timeout` seconds; it is left as it is then,
        and may be Ready later. The API server being away for a moment is waited out."""
        what = f"SandboxSnapshot {namespace}/{name}"
        last: SnapshotInfo | None = None

        def check(info: SnapshotInfo | None) -> SnapshotInfo | None:
            nonlocal last
            if info is None or info.uid != uid:
                why = "deleting its session deletes it" if info is None else "an object of that name is another one now"
                raise SandboxNotFoundError(f"{what} with uid {uid} is gone ({why})")
            last = info
            if info.phase == "Failed":
                raise SnapshotFailedError(info.message or "no message", name=name, namespace=namespace)
            if info.phase == "Ready":
                return info
            return None

        try:
            with anyio.fail_after(timeout):
                attempt = 0
                while True:
                    try:
                        ready = await self._look(what, namespace, SNAPSHOT_PLURAL, name, SnapshotInfo.of, check)
                    except Exception as error:
                        if not is_transient(error):
                            raise
                        attempt += 1
                        _log.warning("%s: the API server is away (%s); trying again", what, error)
                        await anyio.sleep(min(5.0, 0.25 * 2**attempt))
                        continue
                    attempt = 0
                    if ready is not None:
                        return ready
        except TimeoutError as error:
            where = "no status yet"
            if last is not None and last.phase is not None:
                where = f"{last.phase}: {last.message or 'no message'}"
            raise SandboxTimeoutError(f"{what} was not Ready within {timeout:g} s ({where})") from error

    async def credentials(self, namespace: str, secret: str) -> Credentials:
        """The session's token Secret: its sandboxd endpoint, id there, token and CA."""
        async with await self._api() as api:
            try:
                found = await client.CoreV1Api(api).read_namespaced_secret(secret, namespace)
            except ApiException as error:
                raise _api_error(error, f"could not read the token Secret {namespace}/{secret}") from error
        data = found.data or {}

        def field(name: str) -> str | None:
            value = data.get(name)
            return None if value is None else base64.b64decode(value).decode()

        token, endpoint, session_id = field("token"), field("endpoint"), field("session")
        if not token or not endpoint or not session_id:
            raise SandboxError(
                f"the token Secret {namespace}/{secret} lacks token, endpoint or session: "
                "it is not a session's token Secret"
            )
        return Credentials(endpoint=endpoint, session_id=session_id, token=token, ca_pem=field("ca.crt"))

    async def credentials_secret(self, ref: SessionRef) -> str:
        """The name of the session's token Secret, from its status."""
        async with await self._api() as api:
            try:
                obj = await client.CustomObjectsApi(api).get_namespaced_custom_object(
                    GROUP, VERSION, ref.namespace, PLURAL, ref.name
                )
            except ApiException as error:
                if error.status == 404:
                    raise SandboxNotFoundError(f"SandboxSession {ref} is gone") from error
                raise _api_error(error, f"could not read SandboxSession {ref}") from error
        name = (obj.get("status") or {}).get("credentialsSecret")
        if not name:
            raise SandboxError(f"SandboxSession {ref} has no status.credentialsSecret yet")
        return str(name)


TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
"""API server answers that say "try again": it is starting, overloaded or restarting."""


def is_transient(error: BaseException) -> bool:
    """Whether `error` is the API server being away for a moment (restarting, overloaded), which
    a wait with a deadline rides out, rather than a refusal."""
    if isinstance(error, ApiServerError):
        return error.status in TRANSIENT_STATUSES
    if isinstance(error, ApiException):
        return error.status in TRANSIENT_STATUSES
    return isinstance(error, aiohttp.ClientError | ConnectionError)


def _api_error(error: ApiException, what: str) -> ApiServerError:
    reason = error.reason
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        reason = json.loads(error.body or b"").get("message", reason)
    return ApiServerError(f"{what}: the API server answered {error.status} ({reason})", status=int(error.status or 0))
