"""Who may do what: every route is classed public, read, machine or admin, and one `before_request`
hook checks each request's credential against its class (docs/security.md).

A credential is `Authorization: Bearer <token>`, HTTP Basic (password = a token, or user `viewer` /
`admin` with that password), a browser session from /login, or, unless `trust_loopback` is false,
a request from this machine's loopback that came through no proxy (it acts as admin). A route or
method missing from ROUTES is admin-only: a new write cannot slip in open (tests/test_access.py
lists every registered rule).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import logging
import secrets
import socket
from dataclasses import dataclass, fields
from typing import Any, Protocol
from urllib.parse import urlsplit

from flask import Flask, Request, Response, jsonify, redirect, render_template, request, session, url_for
from flask.sessions import SecureCookieSessionInterface

from gpuwatch.core.clock import Clock
from gpuwatch.core.credentials import AccessError, AccessFile, role_at_least
from gpuwatch.web.ratelimit import RateLimiter

log = logging.getLogger("gpuwatch.web")

PUBLIC, READ, MACHINE, ADMIN = "public", "read", "machine", "admin"
NEEDED_ROLE = {READ: "viewer", MACHINE: "machine", ADMIN: "admin"}
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SESSION_LIFETIME_S = 12 * 3600
FAILURES_PER_MINUTE = 10  # wrong passwords one client may try (a burst of 20); tokens are unguessable
_PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-IP")

_R = {"GET": READ}
_PROM = {"GET": READ, "POST": READ}  # Grafana and Prometheus clients send long queries as POST forms
# endpoint -> method -> class. HEAD is GET's; OPTIONS (Flask's automatic answer) is public.
ROUTES: dict[str, dict[str, str]] = {
    "static": {"GET": PUBLIC},
    "dash_assets.plotly_js": {"GET": PUBLIC},  # a vendored library, as static files are
    # The dashboard's pages and their JSON twins: reads.
    **{
        endpoint: _R
        for endpoint in (
            "dash_cluster.index",
            "dash_cluster.cluster_json",
            "dash_usage.usage_page",
            "dash_usage.usage_json",
            "dash_gpu.gpu_page",
            "dash_gpu.gpu_json",
            "dash_explore.explore",
            "dash_explore.explore_json",
            "dash_explore.explore_parse",
            "dash_timeline.timeline",
            "dash_timeline.timeline_json",
            "dash_training.runs_page",
            "dash_training.runs_json",
            "dash_training.run_page",
            "dash_training.run_json",
            "dash_inference.services_page",
            "dash_inference.services_json",
            "dash_inference.service_page",
            "dash_inference.service_json",
            "dash_alerts.alerts_page",
            "dash_alerts.alerts_json",
            "dash_targets.targets_page",
            "dash_targets.targets_json",
            "dash_logs.logs_page",
            "dash_logs.logs_json",
        )
    },
    "ops.health": {"GET": PUBLIC},
    "ops.ready": {"GET": PUBLIC},
    "ops.healthy": {"GET": PUBLIC},
    "auth.login": {"GET": PUBLIC},
    "auth.login_post": {"POST": PUBLIC},
    "auth.logout": {"POST": PUBLIC},
    "ops.version": _R,
    "ops.jobs": _R,
    "ops.settings": _R,
    "ops.metrics": _R,
    "pages.overview_json": _R,
    "promapi.query": _PROM,
    "promapi.query_range": _PROM,
    "promapi.series": _PROM,
    "promapi.labels": _PROM,
    "promapi.label_values": _R,
    "promapi.metadata": _R,
    "promapi.query_exemplars": _PROM,
    "promapi.buildinfo": _R,
    "exportapi.export": _PROM,
    "federate.federate": _R,
    "targets.targets": _R,
    "logs.logs": _R,
    "notify.notifications": _R,
    "rules.alerts": _R,
    "rules.rules": _R,
    "rules.reload": {"POST": ADMIN},
    "push.pushgateway": {"PUT": MACHINE, "POST": MACHINE, "DELETE": MACHINE},
    "push.push_json": {"POST": MACHINE},
    "push.runs_list": _R,
    "push.runs_update": {"POST": MACHINE},
    "importapi.import_prometheus": {"POST": MACHINE, "PUT": MACHINE},
    "remotewrite.remote_write": {"POST": MACHINE},
    "alertmanager.status": _R,
    "alertmanager.receivers": _R,
    "alertmanager.silences": _R,
    "alertmanager.get_silence": _R,
    "alertmanager.alerts": _R,
    "alertmanager.alert_groups": _R,
    "alertmanager.post_silence": {"POST": ADMIN},
    "alertmanager.delete_silence": {"DELETE": ADMIN},
    "alertmanager.post_alerts": {"POST": MACHINE},
}


def route_class(endpoint: str | None, method: str) -> str:
    """The class of `method` on `endpoint`; anything not in ROUTES is admin-only."""
    if endpoint is None or method == "OPTIONS":  # no route matched: 404/405 answers, nothing runs
        return PUBLIC
    return ROUTES.get(endpoint, {}).get("GET" if method == "HEAD" else method, ADMIN)


class AccessSettings(Protocol):
    """The settings this module reads (config.Settings has them)."""

    @property
    def auth(self) -> str: ...
    @property
    def read_access(self) -> str: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def trust_loopback(self) -> bool: ...
    @property
    def trusted_proxies(self) -> tuple[str, ...]: ...
    @property
    def write_rate_limit(self) -> float: ...
    @property
    def write_max_bytes(self) -> int: ...


@dataclass(frozen=True)
class AccessPolicy:
    """The access settings as the gate uses them; the defaults are options.py's (the safe ones)."""

    auth: str = "on"
    read_access: str = "open"
    read_only: bool = False
    trust_loopback: bool = True
    trusted_proxies: tuple[str, ...] = ()
    write_rate_limit: float = 100.0
    write_max_bytes: int = 64 * 1024 * 1024

    @classmethod
    def of(cls, settings: object) -> AccessPolicy:
        """The policy of `settings`; a partial settings object (a test's, a bench's) gets the defaults."""
        names = [f.name for f in fields(cls)]
        return cls(**{n: getattr(settings, n) for n in names if hasattr(settings, n)})


@dataclass(frozen=True)
class Identity:
    """Who sent a request: a role (None: nobody known), how it was shown, and a name for logs."""

    role: str | None
    via: str  # token, password, session, loopback, anonymous, auth-off
    name: str = ""


class Refused(Exception):
    """A request is answered `status` with `message` (and its headers) instead of running."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text, strict=False)


def _address(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address((text or "").strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


class Gate:
    """The access checks of one app: settings, the credentials file, rate limiters."""

    def __init__(self, settings: AccessSettings | AccessPolicy, access: AccessFile, clock: Clock) -> None:
        self.settings = AccessPolicy.of(settings)
        self.access = access
        self.clock = clock
        monotonic = clock.monotonic
        self.proxies = tuple(_network(p) for p in self.settings.trusted_proxies)
        rate = self.settings.write_rate_limit
        self.writes = RateLimiter(rate, 2 * rate, monotonic)
        self.failures = RateLimiter(FAILURES_PER_MINUTE / 60.0, 2 * FAILURES_PER_MINUTE, monotonic)
        self.local_names = {"localhost", socket.gethostname().lower()}

    # -- where a request came from ------------------------------------------------------------------
    def _trusted_proxy(self, addr: Any) -> bool:
        return addr is not None and any(addr.version == n.version and addr in n for n in self.proxies)

    def peer(self, req: Request) -> Any:
        return _address(req.environ.get("REMOTE_ADDR"))

    def client(self, req: Request) -> str:
        """The client's address: the peer, or behind a trusted proxy the last untrusted X-Forwarded-For hop."""
        peer = self.peer(req)
        if self._trusted_proxy(peer):
            for hop in reversed(req.headers.get("X-Forwarded-For", "").split(",")):
                addr = _address(hop)
                if addr is not None and not self._trusted_proxy(addr):
                    return str(addr)
        return str(peer) if peer is not None else "unknown"

    def is_secure(self, req: Request) -> bool:
        """HTTPS, directly or at a trusted proxy (X-Forwarded-Proto: https)."""
        if req.is_secure:
            return True
        proto = req.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
        return proto == "https" and self._trusted_proxy(self.peer(req))

    def host(self, req: Request) -> str:
        """The host:port the client asked for (X-Forwarded-Host from a trusted proxy)."""
        forwarded = req.headers.get("X-Forwarded-Host", "").split(",")[0].strip()
        if forwarded and self._trusted_proxy(self.peer(req)):
            return forwarded.lower()
        return (req.host or "").lower()

    def loopback_trusted(self, req: Request) -> bool:
        """A request from this machine's loopback, through no proxy, naming a local host (not a
        rebound DNS name): it acts as admin unless `trust_loopback` is false."""
        peer = self.peer(req)
        if not self.settings.trust_loopback or peer is None or not peer.is_loopback:
            return False
        if self._trusted_proxy(peer) or any(h in req.headers for h in _PROXY_HEADERS):
            return False
        name = urlsplit("//" + (req.host or "")).hostname or ""
        return name in self.local_names or name.endswith(".localhost") or _address(name) is not None

    # -- credentials ----------------------------------------------------------------------------------
    def _failed(self, req: Request, message: str) -> Refused:
        client = self.client(req)
        self.failures.allow(client)
        log.warning("refused a credential from %s on %s %s: %s", client, req.method, req.path, message)
        return Refused(401, message, {"WWW-Authenticate": 'Bearer realm="gpuwatch"'})

    def identify(self, req: Request) -> Identity:
        """Who sent `req`. Refused(401): a credential was sent and is wrong (or too many were)."""
        header = req.headers.get("Authorization", "").strip()
        if header:
            return self._from_header(req, header)
        role = session.get("role")
        if isinstance(role, str) and self._session_valid(role):
            return Identity(role, "session", role)
        if self.loopback_trusted(req):
            return Identity("admin", "loopback", "loopback")
        return Identity(None, "anonymous")

    def _from_header(self, req: Request, header: str) -> Identity:
        scheme, _, value = header.partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer" and value:
            token = self.access.check_token(value)
            if token is None:
                raise self._failed(req, "the bearer token is not valid (revoked or mistyped?)")
            return Identity(token.role, "token", token.name)
        if scheme == "basic" and value:
            try:
                user, _, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise self._failed(req, "the Basic credential is not base64 of user:password") from None
            token = self.access.check_token(password)
            if token is not None:
                return Identity(token.role, "token", token.name)
            if user in ("viewer", "admin"):  # a password: guessable, so limited (tokens are not)
                client = self.client(req)
                if self.failures.empty(client):
                    retry = str(self.failures.retry_after(client))
                    raise Refused(429, "too many wrong passwords from this address", {"Retry-After": retry})
                role = self.access.check_password(password, (user,))
                if role is not None:
                    return Identity(role, "password", role)
            raise self._failed(req, "the Basic password is neither a valid token nor the user's password")
        raise self._failed(req, "unsupported Authorization header: send 'Bearer <token>' or HTTP Basic")

    def _session_valid(self, role: str) -> bool:
        exp = session.get("exp")
        if not isinstance(exp, (int, float)) or exp < self.clock.now():
            return False
        fingerprint = session.get("pw")
        return isinstance(fingerprint, str) and hmac.compare_digest(
            fingerprint, self.access.password_fingerprint(role)
        )

    # -- the checks -----------------------------------------------------------------------------------
    def cross_site(self, req: Request) -> str | None:
        """Why an unsafe request is refused as cross-site, or None. Browsers send Origin with every
        cross-origin POST/PUT/DELETE and Sec-Fetch-Site with most; tools send neither."""
        site = req.headers.get("Sec-Fetch-Site", "").strip().lower()
        if site and site not in ("same-origin", "none"):
            return f"cross-site request refused (Sec-Fetch-Site: {site})"
        origin = (req.headers.get("Origin") or "").strip()
        if origin and (origin.lower() == "null" or urlsplit(origin).netloc.lower() != self.host(req)):
            return f"cross-site request refused (Origin {origin} is not this server)"
        return None

    def check(self, req: Request) -> Identity:
        """Allow `req` or raise Refused. Order: cross-site, read-only, size, credential, rate, role, CSRF."""
        if req.url_rule is None:  # no route: 404 or 405 answers and nothing runs
            return Identity(None, "anonymous")
        cls = route_class(req.url_rule.endpoint, req.method)
        unsafe = req.method not in SAFE_METHODS
        if unsafe and (why := self.cross_site(req)) is not None:
            raise Refused(403, why)
        if cls == PUBLIC and not unsafe:
            return Identity(None, "anonymous")
        writes = cls in (MACHINE, ADMIN) or (unsafe and cls == PUBLIC)
        if writes and cls != PUBLIC and self.settings.read_only:
            raise Refused(403, "gpuwatch is read-only (read_only: true): no writes are taken")
        if writes:
            size = req.content_length
            if size is not None and size > self.settings.write_max_bytes:
                raise Refused(
                    413, f"request body larger than write_max_bytes ({self.settings.write_max_bytes})"
                )
        who = Identity("admin", "auth-off") if self.settings.auth == "off" else self.identify(req)
        if writes and who.via != "loopback":  # this machine's own processes are not limited
            client = self.client(req)
            if not self.writes.allow(client):
                retry = str(self.writes.retry_after(client))
                raise Refused(
                    429, "too many writes from this address (write_rate_limit)", {"Retry-After": retry}
                )
        if who.via == "auth-off":
            return who
        if cls == PUBLIC:  # the login and logout forms
            self._check_csrf(req, Identity(who.role, "session"))
            return who
        role = who.role
        if role is None and cls == READ and self.settings.read_access == "open":
            role = "viewer"
        needed = NEEDED_ROLE[cls]
        if not role_at_least(role, needed):
            if who.role is None:
                raise Refused(401, _needs(cls), {"WWW-Authenticate": 'Bearer realm="gpuwatch"'})
            raise Refused(403, f"{who.via} {who.name!r} has the role {who.role}; this needs {needed}")
        if unsafe:
            self._check_csrf(req, who)
        return who

    def _check_csrf(self, req: Request, who: Identity) -> None:
        """A browser session's unsafe request must carry the session's CSRF token."""
        if who.via != "session":
            return
        expected = session.get("csrf")
        sent = req.headers.get("X-CSRF-Token") or req.form.get("csrf_token") or ""
        if not isinstance(expected, str) or not hmac.compare_digest(sent.encode(), expected.encode()):
            raise Refused(403, "missing or wrong CSRF token (reload the page and try again)")


def _needs(cls: str) -> str:
    if cls == READ:
        return "this page needs a login (read_access: login): sign in at /login or send a token"
    what = "a machine or admin token" if cls == MACHINE else "an admin token or login"
    return (
        f"this write needs {what}: send 'Authorization: Bearer <token>' (or HTTP Basic with the token as "
        "password); `gpuwatch token create NAME --role machine|admin` makes one"
    )


def csrf_token() -> str:
    """The current session's CSRF token (made on first use); templates call it as `csrf_token()`."""
    token = session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        session["csrf"] = token
    return token


def _wants_json(req: Request) -> bool:
    return (
        req.path.startswith(("/api/", "/-/", "/metrics")) or req.accept_mimetypes.best == "application/json"
    )


class _SessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions; the cookie is Secure whenever the request came over HTTPS."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or self.gate.is_secure(request)


def install(app: Flask, gate: Gate, session_key: str) -> None:
    """Put the gate in front of every route of `app`, with sessions and the `csrf_token()` global."""
    app.secret_key = session_key
    app.config.update(
        SESSION_COOKIE_NAME="gpuwatch_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        MAX_CONTENT_LENGTH=gate.settings.write_max_bytes,
    )
    app.session_interface = _SessionInterface(gate)
    app.extensions["gpuwatch.gate"] = gate
    app.jinja_env.globals["csrf_token"] = csrf_token

    @app.before_request
    def _gate() -> Any:
        try:
            who = gate.check(request)
        except Refused as r:
            return _refusal(r)
        except AccessError as e:  # access.json unreadable: refuse, say why, keep serving
            log.error("%s", e)
            return _refusal(Refused(503, str(e)))
        request.environ["gpuwatch.identity"] = who
        return None


def _refusal(r: Refused) -> Response:
    if r.status == 401 and not _wants_json(request) and request.method == "GET":
        resp = redirect(url_for("auth.login", next=request.full_path.rstrip("?")))
        return resp  # type: ignore[return-value]
    if _wants_json(request):
        resp = jsonify(
            {"status": "error", "errorType": _ERROR_TYPES.get(r.status, "bad_data"), "error": r.message}
        )
    else:
        resp = Response(render_template("error.html", code=r.status, message=r.message), mimetype="text/html")
    resp.status_code = r.status
    resp.headers.update(r.headers)
    return resp


_ERROR_TYPES = {
    401: "unauthorized",
    403: "forbidden",
    413: "bad_data",
    429: "unavailable",
    503: "unavailable",
}


def identity(req: Request) -> Identity:
    """Who the gate found the request to be from."""
    who = req.environ.get("gpuwatch.identity")
    return who if isinstance(who, Identity) else Identity(None, "anonymous")
