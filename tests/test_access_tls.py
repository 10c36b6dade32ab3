"""`gpuwatch serve` over HTTPS (tls_cert_file/tls_key_file): a self-signed certificate made by openssl."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from gpuwatch.core.credentials import AccessFile
from tests.conftest import Server, clean_env, free_port, wait_until


class TlsServer(Server):
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *(
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=localhost",
            ),
            *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@pytest.mark.slow
def test_https_serves_with_secure_session_cookies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = _certificate(tmp_path)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))  # the test's own requests trust the certificate
    env = clean_env(GPUWATCH_TLS_CERT_FILE=str(cert), GPUWATCH_TLS_KEY_FILE=str(key))
    AccessFile(tmp_path / "data").set_password("viewer", "viewer pass")
    srv = TlsServer([], tmp_path / "data", free_port(), env)
    srv.start()
    try:
        wait_until(lambda: "access: " in srv.log, 10, f"no access line:\n{srv.log}")
        assert f"serving https://127.0.0.1:{srv.port}/" in srv.log
        assert srv.get("/-/health").status_code == 200
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{srv.port}/-/health", timeout=5)
        page = srv.get("/login")
        assert page.status_code == 200 and "Secure" in page.headers["Set-Cookie"]
        assert "HttpOnly" in page.headers["Set-Cookie"]
    finally:
        assert srv.stop() == 0


def test_an_unreadable_certificate_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch.cli.main", "serve", "--data-dir", str(tmp_path / "d")],
        env=clean_env(GPUWATCH_TLS_CERT_FILE=str(missing), GPUWATCH_TLS_KEY_FILE=str(missing)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "nope.pem" in done.stderr
