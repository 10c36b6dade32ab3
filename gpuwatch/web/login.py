"""The browser login: `GET/POST /login` with the viewer or admin password, `POST /logout`.

A login puts the role, an expiry and a digest of the password's hash in the signed session cookie
(HttpOnly, SameSite=Lax, Secure over HTTPS): changing the password ends every session of that role.
Both forms carry the session's CSRF token (`csrf_token()`), which the gate checks.
"""

from __future__ import annotations

import secrets

from flask import Blueprint, current_app, redirect, render_template, request, session, url_for
from flask.typing import ResponseReturnValue

from gpuwatch.web.access import SESSION_LIFETIME_S, Gate

bp = Blueprint("auth", __name__)


def _gate() -> Gate:
    gate: Gate = current_app.extensions["gpuwatch.gate"]
    return gate


def _next() -> str:
    """Where to go after login: a path on this server only (never another site)."""
    target = request.values.get("next", "") or "/"
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


@bp.get("/login")
def login() -> ResponseReturnValue:
    gate = _gate()
    return render_template(
        "login.html",
        next=_next(),
        error=None,
        role=session.get("role"),
        has_password=any(gate.access.has_password(r) for r in ("viewer", "admin")),
    )


@bp.post("/login")
def login_post() -> ResponseReturnValue:
    gate = _gate()
    client = gate.client(request)
    error = None
    if gate.failures.empty(client):
        error, code = "Too many wrong passwords from this address; wait a minute.", 429
    else:
        role = gate.access.check_password(request.form.get("password", ""))
        if role is not None:
            session.clear()
            session.update(
                role=role,
                exp=gate.clock.now() + SESSION_LIFETIME_S,
                pw=gate.access.password_fingerprint(role),
                csrf=secrets.token_urlsafe(32),  # a new token at every login
            )
            return redirect(_next())
        gate.failures.allow(client)
        error, code = "Wrong password.", 401
    page = render_template("login.html", next=_next(), error=error, role=None, has_password=True)
    return page, code


@bp.post("/logout")
def logout() -> ResponseReturnValue:
    session.clear()
    return redirect(url_for("auth.login"))
