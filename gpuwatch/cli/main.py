"""Command line: gpuwatch serve | demo | smi | doctor | health | import | query | export | report | rules check | rules export |
dashboards export | notify test | silence | token | password | --version."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from gpuwatch import __version__
from gpuwatch.app.config import Settings, load
from gpuwatch.cli.logthrottle import LogThrottle
from gpuwatch.core.errors import GpuwatchError, NvmlUnavailable, StoreError, StoreInUse

if TYPE_CHECKING:  # the type only: `gpuwatch smi` and `query` start without loading the whole app
    from gpuwatch.app.runtime import Runtime

log = logging.getLogger("gpuwatch")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="YAML settings file (also GPUWATCH_CONFIG)")
    p.add_argument("--demo", action="store_const", const=True, default=None, help="simulate GPUs")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuwatch",
        description="GPU, training and LLM-inference monitoring in one process.",
    )
    parser.add_argument("--version", action="version", version=f"gpuwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    for name, help_text in (
        ("serve", "sample GPUs, store the history and serve pages, APIs and /metrics"),
        ("demo", "the same as 'serve --demo': simulated GPUs, so every figure moves"),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_common(p)
        p.add_argument("--host", help="address to listen on (default 0.0.0.0)")
        p.add_argument("--port", help="TCP port (default 9842)")
        p.add_argument("--data-dir", dest="data_dir", help="directory of the DuckDB store")
        p.add_argument(
            "--scrape",
            action="append",
            metavar="URL",
            help="also scrape this Prometheus /metrics URL (repeatable; job 'scrape')",
        )

    p = sub.add_parser("smi", help="print the GPUs' current figures once, like nvidia-smi")
    _add_common(p)
    help_text = "check this box's GPUs, driver and NVML binding the way gpuwatch reads them (for bug reports)"
    p = sub.add_parser("doctor", help=help_text, description=help_text)
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument(
        "--seconds",
        type=float,
        default=3.0,
        help="how long to sample for the energy and GPM checks (default 3)",
    )
    help_text = "ask a running gpuwatch for /-/health: exit 0 when ok, 1 when degraded or not answering"
    p = sub.add_parser("health", help=help_text, description=help_text)
    p.add_argument("--config", type=Path, help="YAML settings file (also GPUWATCH_CONFIG)")
    p.add_argument("--url", help="the server's /-/health URL (default: this machine, the configured port)")

    from gpuwatch.cli.access import add_access_commands, add_token_arguments
    from gpuwatch.cli.export import add_export_arguments
    from gpuwatch.cli.query import add_import_arguments, add_query_arguments
    from gpuwatch.cli.report import add_report_arguments

    help_text = "import Prometheus text or OpenMetrics files (with timestamps) into the store"
    add_import_arguments(p := sub.add_parser("import", help=help_text, description=help_text))
    add_token_arguments(p)
    help_text = "evaluate a PromQL expression on a running server (--url) or a stopped data directory"
    add_query_arguments(p := sub.add_parser("query", help=help_text, description=help_text))
    add_token_arguments(p)
    help_text = "write a PromQL answer, or a selector's raw samples, to a Parquet or CSV file"
    add_export_arguments(p := sub.add_parser("export", help=help_text, description=help_text))
    add_token_arguments(p)
    help_text = "who used the GPUs: GPU-hours allocated, busy and idle-but-held, energy and cost per group"
    add_report_arguments(p := sub.add_parser("report", help=help_text, description=help_text))
    add_token_arguments(p)
    help_text = "check Prometheus rule files, as promtool check rules does"
    rules = sub.add_parser("rules", help="alert and recording rule files").add_subparsers(
        dest="rules_command", metavar="ACTION", required=True
    )
    check = rules.add_parser("check", help=help_text, description=help_text)
    check.add_argument("files", nargs="+", type=Path, metavar="FILE")
    help_text = "write the active rules (built-in as configured, and rule_files) as one Prometheus rule file"
    export = rules.add_parser("export", help=help_text, description=help_text)
    export.add_argument("--config", type=Path, help="YAML settings file (also GPUWATCH_CONFIG)")
    export.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here instead of stdout")
    dashboards = sub.add_parser("dashboards", help="the dashboard's pages for other tools").add_subparsers(
        dest="dashboards_command", metavar="ACTION", required=True
    )
    help_text = "write the cluster, GPU, training run and inference service pages as Grafana dashboards"
    dash_export = dashboards.add_parser("export", help=help_text, description=help_text)
    dash_export.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help="directory for one <uid>.json per dashboard (default: the current one); '-': a JSON list on stdout",
    )
    from gpuwatch.cli.silence import add_silence_arguments

    help_text = "add, list or expire silences of a running gpuwatch (Alertmanager's API)"
    add_silence_arguments(sub.add_parser("silence", help=help_text, description=help_text))
    notify = sub.add_parser("notify", help="notification receivers").add_subparsers(
        dest="notify_command", metavar="ACTION", required=True
    )
    help_text = "send a test notification to RECEIVER (from the config file's notify: receivers)"
    test = notify.add_parser("test", help=help_text, description=help_text)
    test.add_argument("--config", type=Path, help="YAML settings file (also GPUWATCH_CONFIG)")
    test.add_argument("receiver", metavar="RECEIVER")
    add_access_commands(sub)
    return parser


def _settings(args: argparse.Namespace, env: dict[str, str]) -> Settings:
    overrides: dict[str, object] = {"demo": True if args.command == "demo" else args.demo}
    for key in ("host", "port", "data_dir", "scrape"):
        overrides[key] = getattr(args, key, None)
    return load(args.config, env, overrides)


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(LogThrottle())  # one line per condition per minute under load
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
    # APScheduler logs every run at INFO; keep the user's terminal for things that matter.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def _hostname(settings: Settings) -> str:
    return settings.hostname or socket.gethostname()


def _serve(settings: Settings) -> int:
    from gpuwatch.app.build import build_runtime
    from gpuwatch.cli.access import access_line
    from gpuwatch.cli.deploy import hostname_warning, in_container, unwritable_data_dir
    from gpuwatch.cli.gctune import tune_for_serving
    from gpuwatch.web import create_app
    from gpuwatch.web.admission import admission_of
    from gpuwatch.web.serving import TlsError, make_server, stop_server, threads_for, tls_context

    problem = unwritable_data_dir(settings.data_dir)
    if problem is not None:
        print(f"gpuwatch: {problem}", file=sys.stderr)
        return 2
    _setup_logging(settings.log_level)
    warning = hostname_warning(settings.hostname, socket.gethostname(), in_container())
    if warning is not None:
        log.warning("%s", warning)
    tls = None
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        try:
            tls = tls_context(settings.tls_cert_file, settings.tls_key_file)
        except TlsError as e:
            print(f"gpuwatch: tls_cert_file: {e}", file=sys.stderr)
            return 2
    try:
        runtime = build_runtime(settings, _hostname(settings))
    except StoreInUse as e:
        print(f"gpuwatch: {e}", file=sys.stderr)
        return 2
    try:
        app = create_app(runtime)
        try:
            threads = threads_for(settings.query_max_concurrency, settings.query_max_queued)
            server = make_server(app, settings.host, settings.port, tls, threads)
        except OSError as e:
            print(
                f"gpuwatch: cannot listen on {settings.host}:{settings.port}: {e.strerror or e}; "
                "choose another port with --port",
                file=sys.stderr,
            )
            return 2

        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        if runtime.rules is not None:
            rules = runtime.rules
            signal.signal(signal.SIGHUP, lambda signum, frame: rules.reload())
        runtime.start()
        tune_for_serving()  # after start-up: fewer GC scans (gctune.py)
        gpus = f"{len(runtime.gpu.gpus)} GPU(s)" if runtime.gpu is not None else "no GPUs"
        mode = " (demo: simulated GPUs)" if settings.demo else ""
        everywhere = settings.host in ("0.0.0.0", "::", "")
        shown_host = "localhost" if everywhere else settings.host
        log.info(
            "gpuwatch %s serving %s://%s:%s/%s with %s%s; data in %s",
            __version__,
            "https" if tls is not None else "http",
            shown_host,
            settings.port,
            f" (listening on all interfaces, {settings.host or '0.0.0.0'})" if everywhere else "",
            gpus,
            mode,
            settings.data_dir,
        )
        level = logging.WARNING if settings.auth == "off" else logging.INFO
        logging.getLogger("gpuwatch.access").log(level, "%s", access_line(settings, runtime.first_token))

        # The HTTP server runs in its own thread so that the main thread only waits for a signal and
        # then shuts down in order: stop accepting, stop sampling, flush and checkpoint the store.
        def serve_http() -> None:
            try:
                server.run()
            except (OSError, ValueError) as e:  # closing the sockets under the loop at shutdown: EBADF
                if not stop.is_set():
                    log.error("the HTTP server failed: %s", e)

        web = threading.Thread(target=serve_http, name="gpuwatch-http", daemon=True)
        web.start()
        while not stop.wait(5.0):
            if not web.is_alive():
                log.error("the HTTP server stopped unexpectedly; shutting down")
                break
        log.info("shutting down: flushing the store")
        runtime.stop_demo()  # the simulated training run's last push must reach the server before it closes
        admission_of(app).close()  # queries waiting for a turn are answered 503 rather than run
        stop_server(server)
    finally:
        closed = _close(runtime)
    return 0 if closed else 1


def _close(runtime: Runtime) -> bool:
    """Close the runtime; a store that cannot write its last samples (a full disk) is one log line."""
    try:
        runtime.close()
    except StoreError as e:
        log.error("%s", e)
        return False
    return True


def _smi(settings: Settings) -> int:
    from gpuwatch.app.build import make_nvml
    from gpuwatch.cli.smi import format_smi
    from gpuwatch.collect.nvml import GpuCollector
    from gpuwatch.core.clock import SystemClock

    with tempfile.TemporaryDirectory(prefix="gpuwatch-smi-") as tmp:
        nvml = make_nvml(settings, SystemClock(), _hostname(settings))
        proc_root = settings.proc_root
        if settings.demo:
            proc_root = Path(tmp)
            nvml.write_proc_root(proc_root)
        collector = GpuCollector(nvml, hostname=_hostname(settings), proc_root=proc_root)
        try:
            collector.open()
        except NvmlUnavailable as e:
            print(f"gpuwatch: {e}", file=sys.stderr)
            return 1
        try:
            print(format_smi(collector.snapshot(), driver_version=collector.driver_version), end="")
        finally:
            collector.close()
    return 0


def _gpu_command(args: argparse.Namespace, settings: Settings) -> int:
    """serve, demo, doctor and smi: the commands that open the GPUs."""
    if args.command in ("serve", "demo"):
        return _serve(settings)
    if args.command == "doctor":
        from gpuwatch.cli.doctor import run_command

        return run_command(settings, _hostname(settings), as_json=args.json, seconds=max(0.5, args.seconds))
    return _smi(settings)


def _health(args: argparse.Namespace, env: dict[str, str]) -> int:
    from gpuwatch.cli.deploy import check_health, health_url

    try:
        url = args.url or health_url(load(args.config, env, {}))
    except GpuwatchError as e:  # exit 1, not 2: Docker reserves 2 in a HEALTHCHECK
        print(f"gpuwatch: {e}", file=sys.stderr)
        return 1
    healthy, line = check_health(url)
    print(f"gpuwatch: {line}", file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


def _rules_check(files: Sequence[Path]) -> int:
    from gpuwatch.rules.load import RuleFileError, load_files

    failed = False
    for path in files:
        try:
            groups = load_files([path])
        except RuleFileError as e:
            failed = True
            print(f"{path}: FAILED:", file=sys.stderr)
            for line in e.errors:
                print(f"  {line}", file=sys.stderr)
            continue
        print(f"{path}: {sum(len(g.rules) for g in groups)} rules found")
    return 1 if failed else 0


def _notify_test(args: argparse.Namespace, env: dict[str, str]) -> int:
    from gpuwatch.app.build import external_url
    from gpuwatch.core.clock import SystemClock
    from gpuwatch.notify.config import load_templates
    from gpuwatch.notify.delivery import DeliveryError
    from gpuwatch.notify.testsend import UnknownReceiver, send_test

    settings = load(args.config, env, {})
    hostname = _hostname(settings)
    base = settings.config_file.parent if settings.config_file is not None else None
    notify = load_templates(settings.notify, base)
    try:
        line = send_test(
            notify,
            args.receiver,
            SystemClock(),
            hostname=hostname,
            external_url=external_url(settings, hostname),
        )
    except UnknownReceiver as e:
        print(f"gpuwatch: {e}", file=sys.stderr)
        return 2
    except DeliveryError as e:
        print(f"gpuwatch: {e}", file=sys.stderr)
        return 1
    print(f"gpuwatch: {line}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "rules" and args.rules_command == "check":
        return _rules_check(args.files)
    if args.command == "rules":
        from gpuwatch.cli.rules import run_export

        return run_export(args.config, args.output, dict(os.environ))
    if args.command == "dashboards":
        from gpuwatch.cli.dashboards import run_export as export_dashboards

        return export_dashboards(args.output)
    if args.command in ("token", "password"):
        from gpuwatch.cli.access import run_access

        return run_access(args, dict(os.environ))
    if args.command == "silence":
        from gpuwatch.cli.silence import run_silence

        try:
            return run_silence(args, dict(os.environ))
        except KeyboardInterrupt:
            return 130
    if args.command in ("import", "query", "export", "report"):
        from gpuwatch.cli import query as querycli
        from gpuwatch.cli.export import run_export as export_samples
        from gpuwatch.cli.report import run_report

        run = {
            "import": querycli.run_import,
            "query": querycli.run_query,
            "export": export_samples,
            "report": run_report,
        }[args.command]
        try:
            return run(args, dict(os.environ))
        except KeyboardInterrupt:
            return 130
    try:
        if args.command == "notify":
            return _notify_test(args, dict(os.environ))
        if args.command == "health":
            return _health(args, dict(os.environ))
        return _gpu_command(args, _settings(args, dict(os.environ)))
    except GpuwatchError as e:
        print(f"gpuwatch: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the last line of defence: one line for the user, details in the debug log
        log.debug("unexpected error", exc_info=True)
        print(
            f"gpuwatch: internal error: {type(e).__name__}: {e} (run with GPUWATCH_LOG_LEVEL=debug for details)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
