"""Credentials for the API server, all of them: the in-cluster service account, a kubeconfig
file, and what the official client's loader reads for the kubeconfigs we do not. The one module
that reads tokens, certificates, kubeconfigs and exec plugins; :func:`load` is what
``client.connect`` asks, and nothing else in the driver reads credentials.

Why not only the official client's loaders: importing them pulls in the whole generated client
(~0.3 s and ~18 MiB), a large share of a node plugin's start-up time and memory. The cases the
plugin and the controller meet (a pod's service account; a kubeconfig with certificates or a
token) are read here with the standard library and yaml. A kubeconfig that needs anything else
(exec plugins, auth providers, basic auth, a proxy, plain http, tls-server-name) is read by the
official loader (:func:`from_official_loader`, imported only then), as is a ``$KUBECONFIG`` that
lists several files to merge.

A service account token is re-read from its file when it is older than a minute, because bound
tokens are rotated by the kubelet while the process runs, and at once when the API server
answered 401 (:meth:`Auth.renew`: the client then sends the request once more; for the official
loader's credentials, the whole kubeconfig is loaded again, running an exec plugin anew). Inline
certificate data is written to a private temporary file only for as long as ``ssl`` needs to
load it.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_MAX_AGE_S = 60.0


class Unsupported(Exception):
    """The kubeconfig uses an auth method this module does not read."""


class CredentialsError(Exception):
    """The credentials cannot be read; the message names the file or field."""


class Auth(Protocol):
    """The headers that authenticate a request."""

    def headers(self) -> dict[str, str]: ...

    def renew(self) -> None:
        """Read the credentials again at the next :meth:`headers` (the server answered 401)."""


@dataclasses.dataclass(frozen=True)
class Credentials:
    host: str  # https://host[:port], or http:// (only from the official loader)
    ssl_context: ssl.SSLContext | None  # None for plain http
    auth: Auth
    server_hostname: str | None = None  # the kubeconfig's tls-server-name
    proxy: str | None = None  # the kubeconfig's proxy-url (wins over the environment's)
    proxy_headers: Mapping[str, str] | None = None


class StaticToken:
    """A bearer token given once (none: no header, e.g. a client certificate authenticates)."""

    def __init__(self, token: str = "") -> None:
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    def headers(self) -> dict[str, str]:
        return dict(self._headers)

    def renew(self) -> None:
        pass  # nothing to read again


class _FileToken:
    """A bearer token in a file (a service account's), read again when a minute old."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()  # guards _value and _read_at; taken by any request thread
        self._value = ""
        self._read_at = -TOKEN_MAX_AGE_S

    def renew(self) -> None:
        with self._lock:
            self._read_at = -TOKEN_MAX_AGE_S

    def headers(self) -> dict[str, str]:
        with self._lock:
            if time.monotonic() - self._read_at >= TOKEN_MAX_AGE_S:
                try:
                    self._value = self._path.read_text().strip()
                except OSError as err:
                    if not self._value:
                        raise CredentialsError(f"cannot read token {self._path}: {err}") from err
                self._read_at = time.monotonic()
            return {"Authorization": f"Bearer {self._value}"}


def in_cluster(env: Mapping[str, str] = os.environ, sa_dir: Path = SA_DIR) -> Credentials:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise CredentialsError(
            "not running in a cluster (KUBERNETES_SERVICE_HOST/PORT unset); pass --kubeconfig"
        )
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    try:
        ctx = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
    except (OSError, ssl.SSLError) as err:
        raise CredentialsError(f"cannot load {sa_dir / 'ca.crt'}: {err}") from err
    return Credentials(f"https://{host}:{port}", ctx, _FileToken(sa_dir / "token"))


@contextlib.contextmanager
def _as_files(*blobs: bytes) -> Iterator[list[str]]:
    with tempfile.TemporaryDirectory(prefix="dra-gpu-creds-") as tmp:
        paths = []
        for i, blob in enumerate(blobs):
            path = Path(tmp) / str(i)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            paths.append(str(path))
        yield paths


def _blob(entry: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    """``<key>-data`` (base64) or the file ``<key>`` (relative to the kubeconfig's folder)."""
    data = entry.get(f"{key}-data")
    if data:
        return base64.b64decode(str(data))
    name = entry.get(key)
    if not name:
        return None
    path = base / str(name)
    try:
        return path.read_bytes()
    except OSError as err:
        raise CredentialsError(f"cannot read {key} {path}: {err}") from err


def _named(doc: Mapping[str, Any], kind: str, name: str) -> Mapping[str, Any]:
    for item in doc.get(f"{kind}s") or []:
        if item.get("name") == name:
            return item.get(kind) or {}
    raise CredentialsError(f"kubeconfig has no {kind} named {name!r}")


def _ssl_context(cluster: Mapping[str, Any], user: Mapping[str, Any], base: Path) -> ssl.SSLContext:
    if cluster.get("insecure-skip-tls-verify"):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ca = _blob(cluster, "certificate-authority", base)
        ctx = ssl.create_default_context(cadata=ca.decode() if ca else None)
    cert, key = _blob(user, "client-certificate", base), _blob(user, "client-key", base)
    if cert and key:
        with _as_files(cert, key) as (cert_file, key_file):
            ctx.load_cert_chain(cert_file, key_file)
    return ctx


def from_kubeconfig(path: Path) -> Credentials:
    """Credentials of the current context; raises Unsupported or CredentialsError."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise CredentialsError(f"cannot read kubeconfig {path}: {err}") from err
    context = _named(doc, "context", str(doc.get("current-context", "")))
    cluster = _named(doc, "cluster", str(context.get("cluster", "")))
    user = _named(doc, "user", str(context.get("user", "")))
    if any(k in user for k in ("exec", "auth-provider", "username", "password")):
        raise Unsupported("kubeconfig user needs an auth method read by the official client")
    server = str(cluster.get("server", "")).rstrip("/")
    if not server.startswith("https://") or any(
        cluster.get(k) for k in ("tls-server-name", "proxy-url")
    ):
        raise Unsupported("plain http, tls-server-name or proxy-url: left to the official client")
    try:
        ctx = _ssl_context(cluster, user, path.parent)
    except (ssl.SSLError, ValueError) as err:
        raise CredentialsError(f"bad certificate or key in kubeconfig {path}: {err}") from err
    return Credentials(server, ctx, _token(user, path.parent))


def default_kubeconfig(env: Mapping[str, str] = os.environ) -> Path | None:
    """The kubeconfig kubectl would read: ``$KUBECONFIG``, else ``~/.kube/config``.

    None when ``$KUBECONFIG`` lists several files: merging them is left to the official loader.
    """
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if len(listed) > 1:
        return None
    return Path(listed[0] if listed else "~/.kube/config").expanduser()


def _token(user: Mapping[str, Any], base: Path) -> Auth:
    if user.get("tokenFile"):
        return _FileToken(base / str(user["tokenFile"]))
    return StaticToken(str(user.get("token") or ""))


def load(kubeconfig: Path | None, *, kubectl_default: bool = False) -> Credentials:
    """The credentials from a kubeconfig file, or of the in-cluster service account when None.

    With ``kubectl_default``, a process outside a cluster falls back to the kubeconfig kubectl
    would read (``$KUBECONFIG``, else ``~/.kube/config``). A kubeconfig :func:`from_kubeconfig`
    leaves ``Unsupported`` goes to :func:`from_official_loader`. Raises ``CredentialsError``,
    whose message names the file or variable.
    """
    if kubeconfig is None:
        try:
            return in_cluster()
        except CredentialsError as err:
            if not kubectl_default:
                raise
            kubeconfig = default_kubeconfig()
            if kubeconfig is None:  # several files to merge: the official loader's job
                return from_official_loader(None)
            if not kubeconfig.exists():
                raise CredentialsError(f"{err}; and no {kubeconfig}") from err
    try:
        return from_kubeconfig(kubeconfig)
    except Unsupported:
        return from_official_loader(kubeconfig)


def from_official_loader(kubeconfig: Path | None) -> Credentials:
    """What the official client's loader reads from ``kubeconfig`` (None: ``$KUBECONFIG``, its
    files merged): exec plugins, auth providers, proxy-url, tls-server-name, plain http.
    Raises ``CredentialsError``."""
    from kubernetes import client as kclient  # heavy: only for exotic kubeconfigs
    from kubernetes import config as kconfig

    source = str(kubeconfig) if kubeconfig is not None else "$KUBECONFIG"

    def load() -> Any:
        cfg = kclient.Configuration()
        try:
            kconfig.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig is not None else None,
                client_configuration=cfg,
            )
        except Exception as err:  # the loader raises assorted types for one cause: bad config
            raise CredentialsError(f"cannot load credentials from {source}: {err}") from err
        return cfg

    cfg = load()
    host = str(cfg.host)
    try:
        tls = _official_tls(cfg) if host.startswith("https://") else None
    except OSError as err:  # ssl.SSLError is an OSError
        raise CredentialsError(f"cannot use the server settings from {source}: {err}") from err
    return Credentials(
        host,
        tls,
        _OfficialAuth(cfg, load),
        server_hostname=cfg.tls_server_name or None,
        proxy=str(cfg.proxy) if cfg.proxy else None,
        proxy_headers=cfg.proxy_headers,
    )


class _OfficialAuth:
    """The credentials the official loader read; :meth:`renew` loads the kubeconfig again."""

    def __init__(self, cfg: Any, load: Callable[[], Any]) -> None:
        self._cfg = cfg  # replaced whole by renew; requests read whichever is current
        self._load = load

    def headers(self) -> dict[str, str]:
        # auth_settings() runs the loader's refresh hook, so expiring tokens are picked up.
        settings: Any = self._cfg.auth_settings()
        return {
            str(s["key"]): str(s["value"])
            for s in settings.values()
            if s.get("in") == "header" and s.get("value")
        }

    def renew(self) -> None:
        # The refresh hook renews only a token whose expiry passed; after a 401 run the whole
        # loader again (an exec plugin, a token file), whatever the expiry said.
        self._cfg = self._load()


def _official_tls(cfg: Any) -> ssl.SSLContext:
    """The TLS settings the official loader read, as its own urllib3 client applies them."""
    if cfg.verify_ssl:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
    else:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ctx
