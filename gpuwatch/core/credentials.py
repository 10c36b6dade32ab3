"""Credentials: named tokens with a role, the viewer and admin passwords, the browser session key.

All of it lives in one file, `<data_dir>/access.json` (mode 0600), written atomically. Secrets are
stored hashed: a token (32 random bytes) as its SHA-256, a password (chosen by a person) with scrypt
and a salt. Checks compare in constant time. `gpuwatch token ...` and `gpuwatch password set` write
the file while a server runs; the server sees the change on the next request (it compares the file's
mtime and size).

Roles, weakest first: `viewer` (pages and read APIs), `machine` (also pushes, imports, posted
alerts: what the SDK, push_to_gateway and other Prometheus servers send), `admin` (also silences,
reload, deletes of stored data, settings).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwatch.core.errors import GpuwatchError

ROLES = ("viewer", "machine", "admin")
PASSWORD_ROLES = ("viewer", "admin")
FILE_NAME = "access.json"
FIRST_TOKEN_FILE = "machine-token"  # the machine token made on first start, readable by the owner only
FIRST_TOKEN_NAME = "local"
TOKEN_PREFIX = "gwt_"
MIN_PASSWORD_LENGTH = 8
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}


class AccessError(GpuwatchError):
    """A token or password command cannot be done (bad name, unknown token, unreadable file)."""

    http_status = 400


def role_at_least(role: str | None, needed: str) -> bool:
    """True when `role` may do what `needed` may (admin > machine > viewer)."""
    return role is not None and ROLES.index(role) >= ROLES.index(needed)


def hash_token(secret: str) -> str:
    """The stored form of a token: hex SHA-256 (a token is 256 random bits; no salt or stretching needed)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def hash_password(password: str, salt: bytes | None = None) -> str:
    """The stored form of a password: `scrypt$n$r$p$salt$hash`, base64 parts."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, dklen=32, **_SCRYPT)
    b64 = base64.b64encode
    return f"scrypt${_SCRYPT['n']}${_SCRYPT['r']}${_SCRYPT['p']}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, stored: str) -> bool:
    """Check `password` against `hash_password`'s output, in constant time."""
    try:
        kind, n, r, p, salt_b64, digest_b64 = stored.split("$")
        if kind != "scrypt":
            return False
        salt, expected = base64.b64decode(salt_b64), base64.b64decode(digest_b64)
        got = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=int(n), r=int(r), p=int(p), dklen=32)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, expected)


@dataclass(frozen=True)
class Token:
    """One named token as stored (never its secret)."""

    name: str
    role: str
    created_ms: int
    sha256: str

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "created_ms": self.created_ms}


@dataclass(frozen=True)
class Credentials:
    """What access.json holds, parsed."""

    tokens: tuple[Token, ...] = ()
    passwords: tuple[tuple[str, str], ...] = ()  # (role, scrypt hash)
    session_key: str = ""

    def password_hash(self, role: str) -> str | None:
        return dict(self.passwords).get(role)


def _parse(data: Any, path: Path) -> Credentials:
    if not isinstance(data, dict):
        raise AccessError(f"{path}: expected a JSON object")
    try:
        tokens = tuple(
            Token(str(t["name"]), str(t["role"]), int(t["created_ms"]), str(t["sha256"]))
            for t in data.get("tokens", [])
        )
        passwords = tuple(sorted((str(k), str(v)) for k, v in dict(data.get("passwords", {})).items()))
    except (KeyError, TypeError, ValueError) as e:
        raise AccessError(f"{path}: malformed entry ({type(e).__name__}: {e})") from None
    for t in tokens:
        if t.role not in ROLES:
            raise AccessError(f"{path}: token {t.name!r} has an unknown role {t.role!r}")
    return Credentials(tokens, passwords, str(data.get("session_key", "")))


def _dump(creds: Credentials) -> dict[str, Any]:
    return {
        "tokens": [
            {"name": t.name, "role": t.role, "created_ms": t.created_ms, "sha256": t.sha256}
            for t in creds.tokens
        ],
        "passwords": dict(creds.passwords),
        "session_key": creds.session_key,
    }


def new_token_secret() -> str:
    """A fresh token: `gwt_` and 43 URL-safe characters (32 random bytes)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class AccessFile:
    """`<data_dir>/access.json`: read (and re-read when it changes) by the server, written by the CLI."""

    def __init__(self, data_dir: Path | None) -> None:
        """`data_dir` None: no file, no tokens, no passwords (a process without a data directory)."""
        self.data_dir = Path(data_dir) if data_dir is not None else Path("/nonexistent/gpuwatch")
        self.path = self.data_dir / FILE_NAME
        self._memory_key = secrets.token_hex(32) if data_dir is None else ""
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._creds = Credentials()
        self._verified: set[str] = set()

    # -- reading ---------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.path.exists()

    def credentials(self) -> Credentials:
        """The current credentials, re-read when the file's mtime or size changed (one stat a call)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return Credentials()
        except OSError as e:
            raise AccessError(f"cannot read {self.path}: {e.strerror or e}") from None
        key = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if key != self._seen:
                self._creds = self._read()
                self._seen = key
            return self._creds

    def _read(self) -> Credentials:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return Credentials()
        except OSError as e:
            raise AccessError(f"cannot read {self.path}: {e.strerror or e}") from None
        try:
            return _parse(json.loads(text), self.path)
        except json.JSONDecodeError as e:
            raise AccessError(f"{self.path}: not valid JSON: {e}") from None

    def check_token(self, secret: str) -> Token | None:
        """The token whose secret this is, or None; every stored hash is compared in constant time."""
        digest = hash_token(secret)
        found = None
        for t in self.credentials().tokens:
            if hmac.compare_digest(digest, t.sha256):
                found = t
        return found

    def check_password(self, password: str, roles: tuple[str, ...] = ("admin", "viewer")) -> str | None:
        """The first of `roles` whose password this is, or None. A match is remembered (by digest) so
        that HTTP Basic with a password costs one scrypt per process, not one per request."""
        creds = self.credentials()
        for role in roles:
            stored = creds.password_hash(role)
            if stored is None:
                continue
            key = hashlib.sha256(f"{stored}\0{password}".encode()).hexdigest()
            if key in self._verified or verify_password(password, stored):
                with self._lock:
                    if len(self._verified) > 64:
                        self._verified.clear()
                    self._verified.add(key)
                return role
        return None

    def password_fingerprint(self, role: str) -> str:
        """A short digest of the role's stored password hash: a session ends when the password changes."""
        stored = self.credentials().password_hash(role) or ""
        return hashlib.sha256(stored.encode()).hexdigest()[:16]

    # -- writing ---------------------------------------------------------------------------------
    def _write(self, creds: Credentials) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(_dump(creds), f, indent=1)
            f.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    def _update(self, change: Any) -> Any:
        """Read, change and write the file under an exclusive lock (the CLI and the server may both write)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lock_path = self.data_dir / f".{FILE_NAME}.lock"
        fd = os.open(lock_path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            creds, result = change(self._read())
            if not creds.session_key:
                creds = Credentials(creds.tokens, creds.passwords, secrets.token_hex(32))
            self._write(creds)
            return result
        finally:
            os.close(fd)

    def first_token(self) -> str | None:
        """The `local` machine token from `<data_dir>/machine-token`, or None (never made, or revoked)."""
        try:
            secret = (self.data_dir / FIRST_TOKEN_FILE).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return secret if secret and self.check_token(secret) is not None else None

    def ensure(self, now_ms: int) -> str | None:
        """Create the file on first start: a session key and one machine token named `local`, whose
        secret is also written to `<data_dir>/machine-token` (0600). Return that secret when made now."""
        if self.path.exists():
            self.credentials()
            return None
        secret = new_token_secret()

        def change(creds: Credentials) -> tuple[Credentials, str | None]:
            if self.path.exists():  # another process made it meanwhile
                return creds, None
            token = Token(FIRST_TOKEN_NAME, "machine", now_ms, hash_token(secret))
            return Credentials((*creds.tokens, token), creds.passwords, creds.session_key), secret

        made: str | None = self._update(change)
        if made is not None:
            first = self.data_dir / FIRST_TOKEN_FILE
            fd = os.open(first, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(made + "\n")
        self.credentials()
        return made

    def session_key(self) -> str:
        """The key browser session cookies are signed with (made with the file)."""
        key = self._memory_key or self.credentials().session_key
        if not key:
            self._update(lambda creds: (creds, None))
            key = self.credentials().session_key
        return key

    def create_token(self, name: str, role: str, now_ms: int) -> str:
        """Add a token; return its secret (shown once, never stored). AccessError: bad or taken name."""
        if not _NAME.match(name):
            raise AccessError(
                f"bad token name {name!r}: use 1-64 letters, digits, '_', '.', '@' or '-' (not first)"
            )
        if role not in ROLES:
            raise AccessError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
        secret = new_token_secret()

        def change(creds: Credentials) -> tuple[Credentials, None]:
            if any(t.name == name for t in creds.tokens):
                raise AccessError(f"a token named {name!r} exists; revoke it first or choose another name")
            token = Token(name, role, now_ms, hash_token(secret))
            return Credentials((*creds.tokens, token), creds.passwords, creds.session_key), None

        self._update(change)
        return secret

    def revoke(self, name: str) -> Token:
        """Remove the token `name`; return what it was. AccessError: no such token."""

        def change(creds: Credentials) -> tuple[Credentials, Token]:
            gone = [t for t in creds.tokens if t.name == name]
            if not gone:
                known = ", ".join(t.name for t in creds.tokens) or "none"
                raise AccessError(f"no token named {name!r} (tokens: {known})")
            kept = tuple(t for t in creds.tokens if t.name != name)
            return Credentials(kept, creds.passwords, creds.session_key), gone[0]

        revoked: Token = self._update(change)
        if name == FIRST_TOKEN_NAME:
            (self.data_dir / FIRST_TOKEN_FILE).unlink(missing_ok=True)
        return revoked

    def tokens(self) -> tuple[Token, ...]:
        return self.credentials().tokens

    def set_password(self, role: str, password: str) -> None:
        """Set the viewer or admin password for the browser login (and HTTP Basic as user `role`)."""
        if role not in PASSWORD_ROLES:
            raise AccessError(f"passwords exist for {' and '.join(PASSWORD_ROLES)} only, not {role!r}")
        if len(password) < MIN_PASSWORD_LENGTH:
            raise AccessError(f"the password is too short: at least {MIN_PASSWORD_LENGTH} characters")
        stored = hash_password(password)

        def change(creds: Credentials) -> tuple[Credentials, None]:
            passwords = dict(creds.passwords)
            passwords[role] = stored
            return Credentials(creds.tokens, tuple(sorted(passwords.items())), creds.session_key), None

        self._update(change)

    def has_password(self, role: str) -> bool:
        return self.credentials().password_hash(role) is not None
