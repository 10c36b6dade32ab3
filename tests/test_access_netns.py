"""Access over a real network: `gpuwatch serve` on one end of a veth pair, every client in a network
namespace at the other end (another host, as far as the server can tell). Needs root and `ip`
(iproute2); skipped with the reason where a namespace cannot be made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuwatch.core.credentials import AccessFile
from tests.conftest import ROOT, Server, clean_env, free_port, require_tool, wait_until


@dataclass(frozen=True)
class Netns:
    name: str
    host_addr: str  # the server's side
    ns_addr: str  # the clients' side

    def run(self, *argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv], capture_output=True, text=True, timeout=120, **kw
        )  # type: ignore[call-overload]


@pytest.fixture
def netns() -> Iterator[Netns]:
    if os.geteuid() != 0:
        pytest.skip("making a network namespace needs root")
    if shutil.which("ip") is None:
        pytest.skip("ip (iproute2) is not installed")
    pid = os.getpid()
    name, host_if, ns_if = f"gw{pid}", f"gwh{pid}"[:15], f"gwn{pid}"[:15]
    third, fourth = (pid // 64) % 256, (pid % 64) * 4
    host_addr, ns_addr = f"10.213.{third}.{fourth + 1}", f"10.213.{third}.{fourth + 2}"
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
        ["ip", "link", "set", ns_if, "netns", name],
        ["ip", "addr", "add", f"{host_addr}/30", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "netns", "exec", name, "ip", "addr", "add", f"{ns_addr}/30", "dev", ns_if],
        ["ip", "netns", "exec", name, "ip", "link", "set", ns_if, "up"],
        ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
    ]
    try:
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                pytest.skip(f"cannot make a network namespace here: {' '.join(step)}: {done.stderr.strip()}")
        yield Netns(name, host_addr, ns_addr)
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


class RemoteServer(Server):
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@pytest.mark.slow
def test_another_host_needs_credentials_and_every_client_sends_them(netns: Netns, tmp_path: Path) -> None:
    promtool, amtool = require_tool("promtool"), require_tool("amtool")
    data = tmp_path / "data"
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwatch.cli.main",
            "token",
            "create",
            "grafana",
            "--role",
            "viewer",
            "--data-dir",
            str(data),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    tokens = {"viewer": made.stdout.strip().splitlines()[-1]}
    access = AccessFile(data)
    tokens["machine"] = access.create_token("trainer", "machine", 0)
    tokens["admin"] = access.create_token("ops", "admin", 0)

    srv = RemoteServer(
        ["--host", netns.host_addr],
        data,
        free_port(),
        clean_env(
            GPUWATCH_FLUSH_INTERVAL="0.5s", GPUWATCH_READ_ACCESS="login", GPUWATCH_BUILTIN_RULES="false"
        ),
    )
    srv.host = netns.host_addr
    srv.start()
    try:
        wait_until(lambda: "access: " in srv.log, 10, f"no access line in the log:\n{srv.log}")
        assert "access: writes need a token" in srv.log and "pages and reads need a login" in srv.log
        env = {**clean_env(), "PYTHONPATH": str(ROOT)}
        seen = netns.run(
            sys.executable, str(ROOT / "tests" / "netns_client.py"), srv.url, json.dumps(tokens), env=env
        )
        assert seen.returncode == 0, seen.stderr + srv.log
        got = json.loads(seen.stdout)
        for method, path, bare, authed in got["writes"]:
            assert bare == 401, (method, path, bare)
            assert authed in (200, 404), (method, path, authed)  # 404: the made-up silence id
        assert got["viewer_silence"] == 403
        assert (got["viewer_query"], got["anonymous_query"]) == (200, 401)
        assert got["cross_site_form"] == 403
        assert (got["sdk_finished"], got["sdk_rejected"]) == (True, 0)
        assert got["sdk_without_token_rejected"] >= 1 and "netns-no-token" not in got["runs"]
        assert "netns-sdk" in got["runs"]
        assert (got["push_to_gateway"], got["push_to_gateway_without"]) == ("ok", 401)

        # promtool (2.42 has no --http.config.file for queries: Basic from the URL's user info)
        host = f"{netns.host_addr}:{srv.port}"
        q = netns.run(promtool, "query", "instant", f"http://grafana:{tokens['viewer']}@{host}", "netns_up")
        assert q.returncode == 0, q.stderr
        refused = netns.run(promtool, "query", "instant", f"http://{host}", "netns_up")
        assert refused.returncode != 0 and "401" in refused.stderr + refused.stdout

        # gpuwatch's own commands: --token-file, and a one-line refusal without it
        (tmp_path / "admin.token").write_text(tokens["admin"] + "\n")
        cli = [sys.executable, "-m", "gpuwatch.cli.main", "silence", "add", "CliTest", "-c", "netns"]
        cli += ["--url", f"http://{host}"]
        added = netns.run(*cli, "--token-file", str(tmp_path / "admin.token"), env=env)
        assert added.returncode == 0 and len(added.stdout.strip()) == 36, added.stderr
        refused_cli = netns.run(*cli, env=env)
        assert refused_cli.returncode == 1 and refused_cli.stderr.count("\n") == 1, refused_cli.stderr
        assert "needs an admin token" in refused_cli.stderr
        expire = [sys.executable, "-m", "gpuwatch.cli.main", "silence", "expire", added.stdout.strip()]
        expired = netns.run(*expire, "--url", f"http://{host}", "--token", tokens["admin"], env=env)
        assert expired.returncode == 0, expired.stderr

        # amtool with an http_config file, as for a real Alertmanager behind auth
        for role in ("admin", "viewer"):
            (tmp_path / f"amtool-{role}.yml").write_text(f"authorization:\n  credentials: {tokens[role]}\n")
        add = [amtool, f"--alertmanager.url=http://{host}", "silence", "add", "alertname=NetnsTest"]
        add += ["--comment=from the namespace", "--author=netns"]
        ok = netns.run(*add[:2], f"--http.config.file={tmp_path / 'amtool-admin.yml'}", *add[2:])
        assert ok.returncode == 0 and len(ok.stdout.strip()) == 36, ok.stderr
        as_viewer = netns.run(*add[:2], f"--http.config.file={tmp_path / 'amtool-viewer.yml'}", *add[2:])
        assert as_viewer.returncode != 0
        bare = netns.run(*add)
        assert bare.returncode != 0
        listed = netns.run(
            amtool,
            f"--alertmanager.url=http://{host}",
            f"--http.config.file={tmp_path / 'amtool-admin.yml'}",
            "silence",
            "query",
            "-q",
        )
        # the client's admin-authorized silence and amtool's; none of the refused ones
        assert ok.stdout.strip() in listed.stdout.split() and len(listed.stdout.split()) == 2
    finally:
        srv.stop()
