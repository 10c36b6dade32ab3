"""Access: every route has a class, writes need a credential from another host, roles, sessions with
CSRF, cross-site refusals, proxies, read-only, size and rate limits (in-process, on the fake clock).

Requests "from another host" set REMOTE_ADDR to 10.9.8.7; the netns test (test_access_netns.py)
does the same over a real network.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.cli.access import access_line, run_access
from gpuwatch.cli.main import _parser
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.credentials import AccessFile, hash_token
from gpuwatch.core.units import format_rfc3339_millis as format_time
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.remote.wire import compress, encode_request, encode_series
from gpuwatch.web import create_app
from gpuwatch.web.access import ADMIN, MACHINE, READ, ROUTES, route_class

REMOTE = {"REMOTE_ADDR": "10.9.8.7"}
PUSH_BODY = "# TYPE job_up gauge\njob_up 1\n"
REMOTE_WRITE_BODY = compress(
    encode_request([encode_series([("__name__", "written")], [1_790_000_000_000], [1.0])])
)


def silence(clock: FakeClock) -> dict[str, Any]:
    return {
        "matchers": [{"name": "alertname", "value": ".+", "isRegex": True}],
        "startsAt": format_time(clock.now_ms()),
        "endsAt": format_time(clock.now_ms() + 365 * 86400_000),
        "createdBy": "intruder",
        "comment": "everything, for a year",
    }


# (method, path, keyword arguments, class): one request to every write route
def writes(clock: FakeClock) -> list[tuple[str, str, dict[str, Any], str]]:
    return [
        ("PUT", "/metrics/job/train/instance/a", {"data": PUSH_BODY}, MACHINE),
        ("POST", "/metrics/job/train/instance/a", {"data": PUSH_BODY}, MACHINE),
        ("DELETE", "/metrics/job/train/instance/a", {}, MACHINE),
        ("POST", "/api/v1/push", {"json": {"run": "r1", "step": 1, "metrics": {"loss": 1.0}}}, MACHINE),
        ("POST", "/api/v1/runs", {"json": {"run": "r1", "action": "init"}}, MACHINE),
        ("POST", "/api/v1/import/prometheus", {"data": "imported_total 1 1790000000000\n"}, MACHINE),
        ("POST", "/api/v1/write", {"data": REMOTE_WRITE_BODY}, MACHINE),
        ("POST", "/api/v2/alerts", {"json": [{"labels": {"alertname": "Posted"}}]}, MACHINE),
        ("POST", "/api/v2/silences", {"json": silence(clock)}, ADMIN),
        ("DELETE", "/api/v2/silence/0d6e5ca0-0000-4000-8000-000000000000", {}, ADMIN),
        ("POST", "/-/reload", {}, ADMIN),
    ]


@pytest.fixture
def make(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., tuple[Runtime, FlaskClient]]]:
    """Build a runtime and test client with setting overrides; all are closed at the end."""
    made: list[Runtime] = []

    def build(**overrides: Any) -> tuple[Runtime, FlaskClient]:
        data = tmp_path / f"data{len(made)}"
        settings = load(None, {}, {"data_dir": str(data), "demo": True, "builtin_rules": False, **overrides})
        rt = build_runtime(settings, "node-1", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock))
        made.append(rt)
        return rt, create_app(rt).test_client()

    yield build
    for rt in made:
        rt.close()


def tokens(rt: Runtime, clock: FakeClock) -> dict[str, str]:
    assert rt.access is not None
    return {
        role: rt.access.create_token(f"t-{role}", role, clock.now_ms())
        for role in ("viewer", "machine", "admin")
    }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_every_registered_route_and_method_is_classified(app: Flask) -> None:
    unclassified = []
    for rule in app.url_map.iter_rules():
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            if method not in ROUTES.get(rule.endpoint, {}):
                unclassified.append(f"{method} {rule.rule} ({rule.endpoint})")
    assert not unclassified, "classify these in gpuwatch/web/access.py ROUTES: " + ", ".join(unclassified)
    assert route_class("some.new_route", "GET") == ADMIN  # unknown: the strictest class
    assert route_class("promapi.query", "HEAD") == READ
    resp = app.test_client().post("/api/v1/alerts", environ_base=REMOTE)  # GET only: 405, not a refusal
    assert resp.status_code == 405


def test_every_write_refuses_another_host_without_a_credential_and_takes_one(
    make: Callable[..., tuple[Runtime, FlaskClient]], clock: FakeClock
) -> None:
    rt, client = make()
    tok = tokens(rt, clock)
    for method, path, kw, cls in writes(clock):
        resp = client.open(path, method=method, environ_base=REMOTE, **kw)
        assert resp.status_code == 401, (method, path, resp.get_data(as_text=True))
        assert resp.get_json()["errorType"] == "unauthorized"
        assert "Bearer" in resp.headers["WWW-Authenticate"]
        wrong = client.open(path, method=method, environ_base=REMOTE, headers=bearer("gwt_wrong"), **kw)
        assert wrong.status_code == 401
        for role in ("viewer", "machine", "admin"):
            resp = client.open(path, method=method, environ_base=REMOTE, headers=bearer(tok[role]), **kw)
            allowed = role == "admin" or (role == "machine" and cls == MACHINE)
            if allowed:
                assert resp.status_code not in (401, 403), (role, method, path, resp.get_data(as_text=True))
            else:
                assert resp.status_code == 403, (role, method, path)
                assert f"has the role {role}" in resp.get_json()["error"]
    # nothing a refused request sent was kept: the year-long silence exists only once, from the admin
    silences = client.get("/api/v2/silences", environ_base=REMOTE).get_json()
    assert [s["createdBy"] for s in silences if s["status"]["state"] == "active"] == ["intruder"]


def test_reads_are_open_and_loopback_acts_as_admin(
    make: Callable[..., tuple[Runtime, FlaskClient]], clock: FakeClock
) -> None:
    _, client = make()
    for path in ("/", "/api/v1/query?query=up", "/api/v2/silences", "/metrics", "/-/settings"):
        assert client.get(path, environ_base=REMOTE).status_code == 200, path
    assert client.post("/api/v1/query", data={"query": "1"}, environ_base=REMOTE).status_code == 200
    assert client.post("/api/v2/silences", json=silence(clock)).status_code == 200  # 127.0.0.1
    assert client.post("/-/reload").status_code == 200


def test_loopback_through_a_proxy_or_under_a_foreign_name_is_not_trusted(
    make: Callable[..., tuple[Runtime, FlaskClient]],
) -> None:
    _, client = make(trusted_proxies=["127.0.0.1"])
    assert client.post("/-/reload").status_code == 401  # the proxy on loopback forwards the network
    _, client = make()
    for headers in (
        {"X-Forwarded-For": "203.0.113.5"},
        {"Forwarded": "for=203.0.113.5"},
        {"X-Real-IP": "203.0.113.5"},
        {"Host": "rebound.example.com:9842"},  # DNS rebinding: a foreign name resolving to 127.0.0.1
    ):
        assert client.post("/-/reload", headers=headers).status_code == 401, headers
    assert client.post("/-/reload", headers={"Host": "127.0.0.1:9842"}).status_code == 200
    _, client = make(trust_loopback=False)
    assert client.post("/-/reload").status_code == 401


def test_http_basic_with_a_token_or_a_password_and_wrong_ones_are_limited(
    make: Callable[..., tuple[Runtime, FlaskClient]], clock: FakeClock
) -> None:
    rt, client = make()
    tok = tokens(rt, clock)
    assert rt.access is not None
    rt.access.set_password("admin", "correct horse")
    body = {"json": silence(clock), "environ_base": REMOTE}
    assert client.post("/api/v2/silences", headers=basic("anyone", tok["admin"]), **body).status_code == 200
    assert client.post("/api/v2/silences", headers=basic("admin", "correct horse"), **body).status_code == 200
    assert (
        client.post("/api/v2/silences", headers=basic("viewer", "correct horse"), **body).status_code == 401
    )
    for _ in range(19):  # with the one above: a burst of 20 wrong passwords (no viewer password: no scrypt)
        client.post("/-/reload", headers=basic("viewer", "guess"), environ_base=REMOTE)
    resp = client.post("/-/reload", headers=basic("admin", "correct horse"), environ_base=REMOTE)
    assert resp.status_code == 429 and int(resp.headers["Retry-After"]) >= 1
    assert client.post("/-/reload", headers=bearer(tok["admin"]), environ_base=REMOTE).status_code == 200
    assert client.post("/-/reload", headers=bearer("gwt_guess"), environ_base=REMOTE).status_code == 401
    clock.advance(180)
    resp = client.post("/-/reload", headers=basic("admin", "correct horse"), environ_base=REMOTE)
    assert resp.status_code == 200


def test_read_access_login_pages_sessions_and_csrf(
    make: Callable[..., tuple[Runtime, FlaskClient]], clock: FakeClock
) -> None:
    rt, client = make(read_access="login")
    assert rt.access is not None
    rt.access.set_password("viewer", "viewer pass")
    rt.access.set_password("admin", "admin pass")
    page = client.get("/", environ_base=REMOTE)
    assert page.status_code == 302 and page.headers["Location"].startswith("/login?next=")
    assert client.get("/api/v1/query?query=up", environ_base=REMOTE).status_code == 401
    assert client.get("/-/health", environ_base=REMOTE).status_code == 200  # for load balancers
    tok = tokens(rt, clock)
    assert (
        client.get("/api/v1/query?query=up", headers=bearer(tok["viewer"]), environ_base=REMOTE).status_code
        == 200
    )

    form = client.get("/login", environ_base=REMOTE).get_data(as_text=True)
    csrf = form.split('name="csrf_token" value="')[1].split('"')[0]
    no_csrf = client.post("/login", data={"password": "viewer pass"}, environ_base=REMOTE)
    assert no_csrf.status_code == 403
    wrong = client.post("/login", data={"password": "nope", "csrf_token": csrf}, environ_base=REMOTE)
    assert wrong.status_code == 401 and "Wrong password" in wrong.get_data(as_text=True)
    ok = client.post(
        "/login", data={"password": "viewer pass", "csrf_token": csrf, "next": "/"}, environ_base=REMOTE
    )
    assert ok.status_code == 302 and ok.headers["Location"] == "/"
    cookie = ok.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" not in cookie
    assert client.get("/", environ_base=REMOTE).status_code == 200
    # a viewer cannot silence, CSRF token or not
    assert client.post("/api/v2/silences", json=silence(clock), environ_base=REMOTE).status_code == 403

    login = client.get("/login", environ_base=REMOTE).get_data(as_text=True)
    csrf = login.split('name="csrf_token" value="')[1].split('"')[0]
    client.post("/login", data={"password": "admin pass", "csrf_token": csrf}, environ_base=REMOTE)
    resp = client.post("/api/v2/silences", json=silence(clock), environ_base=REMOTE)
    assert resp.status_code == 403 and "CSRF" in resp.get_json()["error"]
    csrf = client.get("/login", environ_base=REMOTE).get_data(as_text=True).split('value="')[1].split('"')[0]
    resp = client.post(
        "/api/v2/silences", json=silence(clock), headers={"X-CSRF-Token": csrf}, environ_base=REMOTE
    )
    assert resp.status_code == 200
    # a new admin password ends the admin's sessions
    rt.access.set_password("admin", "another pass")
    resp = client.post(
        "/api/v2/silences", json=silence(clock), headers={"X-CSRF-Token": csrf}, environ_base=REMOTE
    )
    assert resp.status_code == 401


def test_cross_site_form_posts_are_refused_even_from_loopback(
    make: Callable[..., tuple[Runtime, FlaskClient]], clock: FakeClock
) -> None:
    rt, client = make()
    tok = tokens(rt, clock)
    form = {"data": {"matchers": "x"}, "content_type": "application/x-www-form-urlencoded"}
    for headers in (
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "https://evil.example", **bearer(tok["admin"])},
    ):
        resp = client.post("/api/v2/silences", headers=headers, **form)
        assert resp.status_code == 403 and "cross-site" in resp.get_json()["error"], headers
    same = {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"}
    assert client.post("/api/v2/silences", json=silence(clock), headers=same).status_code == 200


def test_read_only_refuses_every_write_even_from_an_admin(
    make: Callable[..., tuple[Runtime, FlaskClient]], clock: FakeClock
) -> None:
    rt, client = make(read_only=True)
    tok = tokens(rt, clock)
    for method, path, kw, _ in writes(clock):
        resp = client.open(path, method=method, headers=bearer(tok["admin"]), **kw)
        assert resp.status_code == 403 and "read-only" in resp.get_json()["error"], (method, path)
    assert client.get("/api/v1/query?query=1", environ_base=REMOTE).status_code == 200


def test_write_size_and_rate_limits(
    make: Callable[..., tuple[Runtime, FlaskClient]], clock: FakeClock
) -> None:
    rt, client = make(write_rate_limit=2, write_max_bytes=2048)
    tok = tokens(rt, clock)
    big = client.post(
        "/api/v1/import/prometheus", data="x 1\n" * 1000, headers=bearer(tok["machine"]), environ_base=REMOTE
    )
    assert big.status_code == 413
    codes = [
        client.post(
            "/api/v1/push",
            json={"run": "r", "metrics": {"a": 1}},
            headers=bearer(tok["machine"]),
            environ_base=REMOTE,
        ).status_code
        for _ in range(6)
    ]
    assert codes[:3] == [200, 200, 200] and codes[-1] == 429  # a burst of twice the rate, then refused
    assert client.get("/api/v1/runs", environ_base=REMOTE).status_code == 200  # reads are not limited
    clock.advance(1)
    resp = client.post(
        "/api/v1/push",
        json={"run": "r", "metrics": {"a": 1}},
        headers=bearer(tok["machine"]),
        environ_base=REMOTE,
    )
    assert resp.status_code == 200


def test_auth_off_lets_anyone_write(make: Callable[..., tuple[Runtime, FlaskClient]]) -> None:
    _, client = make(auth="off")
    assert client.post("/-/reload", environ_base=REMOTE).status_code == 200


def test_a_revoked_token_stops_at_once_and_secrets_are_stored_hashed(
    make: Callable[..., tuple[Runtime, FlaskClient]], clock: FakeClock
) -> None:
    rt, client = make()
    tok = tokens(rt, clock)
    assert client.post("/-/reload", headers=bearer(tok["admin"]), environ_base=REMOTE).status_code == 200
    other = AccessFile(rt.settings.data_dir)  # as `gpuwatch token revoke` does, in another process
    other.revoke("t-admin")
    assert client.post("/-/reload", headers=bearer(tok["admin"]), environ_base=REMOTE).status_code == 401
    path = rt.settings.data_dir / "access.json"
    text = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert tok["machine"] not in text and hash_token(tok["machine"]) in text
    first = (rt.settings.data_dir / "machine-token").read_text().strip()
    assert (
        rt.first_token == first
        and stat.S_IMODE((rt.settings.data_dir / "machine-token").stat().st_mode) == 0o600
    )
    assert (
        client.post(
            "/api/v1/push", json={"run": "r", "metrics": {"a": 1}}, headers=bearer(first), environ_base=REMOTE
        ).status_code
        == 200
    )


def test_behind_a_trusted_proxy_the_forwarded_client_and_https_count(
    make: Callable[..., tuple[Runtime, FlaskClient]], clock: FakeClock
) -> None:
    rt, client = make(trusted_proxies=["10.9.8.0/24"], write_rate_limit=1)
    assert rt.access is not None
    rt.access.set_password("viewer", "viewer pass")
    tok = tokens(rt, clock)
    via = {"environ_base": REMOTE, "json": {"run": "r", "metrics": {"a": 1}}}
    first = {**bearer(tok["machine"]), "X-Forwarded-For": "198.51.100.1"}
    second = {**bearer(tok["machine"]), "X-Forwarded-For": "198.51.100.2"}
    assert [client.post("/api/v1/push", headers=first, **via).status_code for _ in range(3)] == [
        200,
        200,
        429,
    ]
    assert client.post("/api/v1/push", headers=second, **via).status_code == 200  # another client's bucket
    proxied = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "gpu.lab.example"}
    form = client.get("/login", headers=proxied, environ_base=REMOTE).get_data(as_text=True)
    csrf = form.split('name="csrf_token" value="')[1].split('"')[0]
    resp = client.post(
        "/login",
        data={"password": "viewer pass", "csrf_token": csrf},
        headers={**proxied, "Origin": "https://gpu.lab.example"},
        environ_base=REMOTE,
    )
    assert resp.status_code == 302 and "Secure" in resp.headers["Set-Cookie"]


def test_the_demo_training_run_sends_the_first_machine_token(
    make: Callable[..., tuple[Runtime, FlaskClient]],
) -> None:
    rt, _ = make(trust_loopback=False)
    assert rt.demo is not None and rt.demo.training is not None
    assert rt.first_token is not None and rt.demo.training.options["token"] == rt.first_token


def _cli(tmp_path: Path, clock: FakeClock, *argv: str, stdin: str = "") -> tuple[int, str, str]:
    args: argparse.Namespace = _parser().parse_args([*argv, "--data-dir", str(tmp_path / "cli-data")])
    out, err = io.StringIO(), io.StringIO()
    code = run_access(args, {}, out=out, err=err, stdin=io.StringIO(stdin), clock=clock)
    return code, out.getvalue(), err.getvalue()


def test_token_and_password_commands(tmp_path: Path, clock: FakeClock) -> None:
    code, out, err = _cli(tmp_path, clock, "token", "create", "ci-runner", "--role", "admin")
    assert (code, err) == (0, "")
    secret = out.strip().splitlines()[-1]
    assert secret.startswith("gwt_") and len(secret) > 40
    access = AccessFile(tmp_path / "cli-data")
    token = access.check_token(secret)
    assert token is not None and (token.name, token.role) == ("ci-runner", "admin")
    code, _, err = _cli(tmp_path, clock, "token", "create", "ci-runner")
    assert code == 2 and err.count("\n") == 1 and "exists" in err
    code, _, err = _cli(tmp_path, clock, "token", "create", "bad name!")
    assert code == 2 and "bad token name" in err
    code, out, _ = _cli(tmp_path, clock, "token", "list")
    assert code == 0 and "ci-runner" in out and "admin" in out and secret not in out
    assert _cli(tmp_path, clock, "password", "set", "viewer", stdin="short\n")[0] == 2
    code, out, _ = _cli(tmp_path, clock, "password", "set", "viewer", stdin="a long passphrase\n")
    assert code == 0 and access.check_password("a long passphrase") == "viewer"
    code, out, _ = _cli(tmp_path, clock, "token", "revoke", "ci-runner")
    assert code == 0 and access.check_token(secret) is None
    code, _, err = _cli(tmp_path, clock, "token", "revoke", "ci-runner")
    assert code == 2 and "no token named" in err
    assert "a long passphrase" not in json.dumps(
        json.loads((tmp_path / "cli-data" / "access.json").read_text())
    )


def test_the_start_up_line_names_the_mode(tmp_path: Path) -> None:
    def line(first: str | None = None, **overrides: Any) -> str:
        return access_line(load(None, {}, {"data_dir": str(tmp_path), **overrides}), first)

    assert "writes need a token" in line() and "loopback acts as admin" in line()
    assert "gwt_abc" in line("gwt_abc") and str(tmp_path / "machine-token") in line("gwt_abc")
    assert "loopback is not trusted" in line(trust_loopback=False)
    assert "pages and reads need a login" in line(read_access="login")
    assert line(read_only=True).startswith("access: read-only")
    assert line(auth="off").startswith("access: auth off: anyone")
    for text in (line(), line("gwt_abc"), line(auth="off")):
        assert "\n" not in text


def test_tls_needs_both_files(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="go together"):
        load(None, {}, {"data_dir": str(tmp_path), "tls_cert_file": str(tmp_path / "c.pem")})
    load(None, {"GPUWATCH_TOKEN": "gwt_x"}, {})  # the clients' variable is not a setting


def test_a_broken_credentials_file_refuses_writes_and_says_why(
    make: Callable[..., tuple[Runtime, FlaskClient]], clock: FakeClock
) -> None:
    rt, client = make()
    tok = tokens(rt, clock)
    (rt.settings.data_dir / "access.json").write_text('{"tokens": [{"name": "x", "role": "root"')
    resp = client.post("/-/reload", headers=bearer(tok["admin"]), environ_base=REMOTE)
    assert resp.status_code == 503 and "access.json" in resp.get_json()["error"]
    assert client.get("/-/health", environ_base=REMOTE).status_code == 200
