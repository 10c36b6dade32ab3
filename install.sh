#!/bin/sh
# install.sh: install gpuwatch as a systemd service on this machine (a workstation, or each node of a lab).
#
# Usage: ./install.sh [--yes] [--dry-run] [--prefix DIR] [--port PORT] [--data-dir DIR] [--demo] [--no-service]
#
#   --yes         do it without asking
#   --dry-run     print every step, change nothing
#   --prefix DIR  where the virtual environment goes (default /opt/gpuwatch)
#   --port PORT   port to serve on (default 9842)
#   --data-dir D  where the DuckDB store lives (default /var/lib/gpuwatch)
#   --demo        simulate GPUs (for trying it on a machine without NVIDIA GPUs)
#   --no-service  install the program only; do not write or start a systemd unit
#
# Run it from a clone of the gpuwatch repository. It is safe to run again: an existing config file is kept,
# the venv is upgraded in place and the service restarted.
set -eu

prefix=/opt/gpuwatch
port=9842
data_dir=/var/lib/gpuwatch
yes=0
dry=0
demo=false
service=1
src=$(cd "$(dirname "$0")" && pwd)

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --yes|-y) yes=1 ;;
    --dry-run|-n) dry=1 ;;
    --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; }; prefix=$2; shift ;;
    --port) [ $# -ge 2 ] || { echo "install.sh: --port needs a number" >&2; exit 2; }; port=$2; shift ;;
    --data-dir) [ $# -ge 2 ] || { echo "install.sh: --data-dir needs a directory" >&2; exit 2; }; data_dir=$2; shift ;;
    --demo) demo=true ;;
    --no-service) service=0 ;;
    --help|-h) usage; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

case "$port" in
  ''|*[!0-9]*) echo "install.sh: --port must be a number, got '$port'" >&2; exit 2 ;;
esac

run() {
  if [ "$dry" = 1 ]; then
    echo "+ $*"
  else
    "$@"
  fi
}

write_file() {  # write_file PATH: stdin -> PATH
  if [ "$dry" = 1 ]; then
    echo "+ write $1:"
    sed 's/^/    /'
  else
    cat >"$1"
  fi
}

[ -f "$src/pyproject.toml" ] || { echo "install.sh: run me from a clone of the gpuwatch repository" >&2; exit 2; }
python=$(command -v python3 || true)
[ -n "$python" ] || { echo "install.sh: python3 not found; install it (Debian: apt-get install python3 python3-venv)" >&2; exit 2; }
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || { echo "install.sh: gpuwatch needs Python 3.10 or newer" >&2; exit 2; }
"$python" -c 'import venv' 2>/dev/null \
  || { echo "install.sh: the venv module is missing (Debian: apt-get install python3-venv)" >&2; exit 2; }

echo "gpuwatch will be installed into $prefix (data in $data_dir, port $port, demo=$demo, service=$service)."
if [ "$yes" = 0 ] && [ "$dry" = 0 ]; then
  printf 'Continue? [y/N] '
  read -r answer
  case "$answer" in y|Y|yes) ;; *) echo "Nothing done."; exit 1 ;; esac
fi

run mkdir -p "$prefix" "$data_dir"
[ -x "$prefix/venv/bin/python" ] || run "$python" -m venv "$prefix/venv"
run "$prefix/venv/bin/pip" install --quiet --upgrade "$src"

config=$prefix/gpuwatch.yml
if [ -f "$config" ]; then
  echo "Keeping the existing $config."
else
  write_file "$config" <<EOF
# gpuwatch settings; see README.md "Configuration" for every key.
port: $port
data_dir: $data_dir
demo: $demo
EOF
fi

if [ "$service" = 1 ]; then
  command -v systemctl >/dev/null 2>&1 || { echo "install.sh: systemd not found; rerun with --no-service" >&2; exit 2; }
  if ! id gpuwatch >/dev/null 2>&1; then
    run useradd --system --home-dir "$data_dir" --shell /usr/sbin/nologin gpuwatch
  fi
  run chown -R gpuwatch "$data_dir"
  write_file /etc/systemd/system/gpuwatch.service <<EOF
[Unit]
Description=gpuwatch GPU monitoring
After=network-online.target

[Service]
User=gpuwatch
# glibc: one heap for all threads, up to 16 MB of it kept when freed, so a query reuses warm memory (README, Storage).
Environment=MALLOC_ARENA_MAX=1 MALLOC_MMAP_THRESHOLD_=16777216 MALLOC_TRIM_THRESHOLD_=16777216
ExecStart=$prefix/venv/bin/gpuwatch serve --config $config
Restart=on-failure
KillSignal=SIGTERM
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
EOF
  run systemctl daemon-reload
  run systemctl enable gpuwatch
  run systemctl restart gpuwatch
  echo "gpuwatch is running: http://$(hostname):$port/ (logs: journalctl -u gpuwatch)"
else
  echo "Installed. Start it with: $prefix/venv/bin/gpuwatch serve --config $config"
fi
