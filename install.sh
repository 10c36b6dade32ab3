#!/bin/sh
# install.sh: install gpuwatch on this machine (a workstation, or the hub or a node of a lab), as a
# systemd service where systemd runs, else as a program to start yourself. Details: docs/deploy.md.
#
# Usage: ./install.sh [OPTION]...
#
#   --yes            do it without asking
#   --dry-run        print what it would do, change nothing
#   --prefix DIR     where the virtual environment and gpuwatch.yml go (default /opt/gpuwatch)
#   --data-dir DIR   where the DuckDB store lives (default /var/lib/gpuwatch)
#   --port PORT      port to serve on (default 9842)
#   --host ADDR      address to listen on (default 0.0.0.0: every address)
#   --wheelhouse DIR install from the wheels in DIR only, no network
#                    (make it with: pip wheel -w DIR '.[tensorboard]')
#   --demo           simulate GPUs (to try it on a machine without NVIDIA GPUs)
#   --no-service     install the program only, even where systemd runs
#   --hub NODES      this is the lab's hub: scrape NODES (host[:port],...) through their /federate
#   --node HUB_URL   this is a node of the hub at HUB_URL: make its token, print the hub's scrape entry
#   --name NAME      this node's name on the hub (default: this machine's host name)
#   --uninstall      remove the service and the program; keep gpuwatch.yml and the data
#   --purge          with --uninstall: remove gpuwatch.yml, the data and the gpuwatch user too
#   --help           print this
#
# From a clone of the gpuwatch repository (or beside a wheelhouse). Safe to run again: an existing
# gpuwatch.yml is kept, the program is upgraded in place and the service restarted.
set -eu

prefix=/opt/gpuwatch
port=9842
host=0.0.0.0
data_dir=
yes=0
dry=0
demo=false
service=auto
wheelhouse=
hub_nodes=
hub_url=
node_name=
uninstall=0
purge=0
src=$(cd "$(dirname "$0")" && pwd)
unit=/etc/systemd/system/gpuwatch.service

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "install.sh: $*" >&2; exit 2; }
need_arg() { [ "$2" -ge 2 ] || die "$1 needs a value (see --help)"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --yes|-y) yes=1 ;;
    --dry-run|-n) dry=1 ;;
    --prefix) need_arg "$1" $#; prefix=$2; shift ;;
    --data-dir) need_arg "$1" $#; data_dir=$2; shift ;;
    --port) need_arg "$1" $#; port=$2; shift ;;
    --host) need_arg "$1" $#; host=$2; shift ;;
    --wheelhouse) need_arg "$1" $#; wheelhouse=$2; shift ;;
    --demo) demo=true ;;
    --no-service) service=0 ;;
    --hub) need_arg "$1" $#; hub_nodes=$2; shift ;;
    --node) need_arg "$1" $#; hub_url=$2; shift ;;
    --name) need_arg "$1" $#; node_name=$2; shift ;;
    --uninstall) uninstall=1 ;;
    --purge) purge=1 ;;
    --help|-h) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done

case "$port" in
  ''|*[!0-9]*) die "--port must be a number, got '$port'" ;;
esac
[ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "--port must be from 1 to 65535, got '$port'"
for value in "$prefix" "$data_dir" "$host" "$hub_nodes" "$node_name" "$wheelhouse"; do
  case "$value" in *"'"*|*'"'*|*\\*) die "quotes and backslashes are not allowed in options, got '$value'" ;; esac
done
case "$prefix" in /*) ;; *) die "--prefix must be an absolute path, got '$prefix'" ;; esac
[ "$prefix" != / ] || die "--prefix must not be /"
[ "$purge" = 0 ] || [ "$uninstall" = 1 ] || die "--purge goes with --uninstall"
[ -z "$hub_nodes" ] || [ -z "$hub_url" ] || die "--hub and --node exclude each other: a machine is the hub or a node"
case "$hub_url" in ''|http://*|https://*) ;; *) die "--node needs the hub's URL (http://HOST:PORT), got '$hub_url'" ;; esac

config=$prefix/gpuwatch.yml
venv=$prefix/venv
if [ -z "$data_dir" ] && [ -f "$config" ]; then  # --uninstall --purge and reruns find the store here
  data_dir=$(sed -n "s/^data_dir: *'\{0,1\}\([^']*\)'\{0,1\} *$/\1/p" "$config" | head -n 1)
fi
[ -n "$data_dir" ] || data_dir=/var/lib/gpuwatch
case "$data_dir" in /*) ;; *) die "--data-dir must be an absolute path, got '$data_dir'" ;; esac
[ "$data_dir" != / ] || die "--data-dir must not be /"

# systemd only where it runs: containers and WSL may have systemctl without a running systemd.
if [ "$service" = auto ]; then
  if [ -d /run/systemd/system ]; then service=1; else service=0; fi
  [ "$service" = 1 ] || echo "systemd is not running here (no /run/systemd/system): installing the program only."
fi
if [ "$service" = 1 ] && [ "$(id -u)" != 0 ] && [ "$dry" = 0 ]; then
  die "the systemd service needs root: rerun with sudo, or with --no-service"
fi

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

confirm() {
  if [ "$yes" = 0 ] && [ "$dry" = 0 ]; then
    printf 'Continue? [y/N] '
    answer=
    read -r answer || true
    case "$answer" in y|Y|yes) ;; *) echo "Nothing done."; exit 1 ;; esac
  fi
}

finish() {
  if [ "$dry" = 1 ]; then
    echo "Dry run: nothing was changed."
  fi
}

# -- uninstall ----------------------------------------------------------------------------------
if [ "$uninstall" = 1 ]; then
  if [ "$purge" = 1 ]; then
    echo "gpuwatch will be removed from $prefix, with its settings, the data in $data_dir and its service's user."
  else
    echo "gpuwatch will be removed from $prefix; $config and the data in $data_dir are kept."
  fi
  confirm
  ours=0  # the unit of this prefix only: never another installation's service
  if [ -f "$unit" ] && grep -q "ExecStart=$venv/bin/gpuwatch " "$unit"; then
    ours=1
  fi
  if [ "$ours" = 1 ]; then
    if [ -d /run/systemd/system ]; then
      run systemctl disable --now gpuwatch
    fi
    run rm -f "$unit"
    [ ! -d /run/systemd/system ] || run systemctl daemon-reload
  fi
  [ ! -d "$venv" ] || run rm -rf "$venv"
  if [ "$purge" = 1 ]; then
    [ ! -f "$config" ] || run rm -f "$config"
    [ ! -d "$prefix" ] || run rmdir "$prefix" 2>/dev/null || echo "Left $prefix: it holds files that are not gpuwatch's."
    if [ -d "$data_dir" ]; then
      if [ -f "$data_dir/gpuwatch.duckdb" ] || [ -z "$(ls -A "$data_dir")" ]; then
        run rm -rf "$data_dir"
      else
        echo "Left $data_dir: it holds no gpuwatch.duckdb, so it may not be gpuwatch's."
      fi
    fi
    if [ "$ours" = 1 ] && id gpuwatch >/dev/null 2>&1; then  # the service's user, made by install.sh
      run userdel gpuwatch
    fi
    echo "gpuwatch is uninstalled, its data and settings removed."
  else
    echo "gpuwatch is uninstalled; kept $config and $data_dir (--uninstall --purge removes them)."
  fi
  finish
  exit 0
fi

# -- checks -------------------------------------------------------------------------------------
if [ -n "$wheelhouse" ]; then
  [ -d "$wheelhouse" ] || die "--wheelhouse: no directory $wheelhouse"
  wheelhouse=$(cd "$wheelhouse" && pwd)
  if ls "$wheelhouse"/gpuwatch-*.whl >/dev/null 2>&1; then
    what=gpuwatch
  elif [ -f "$src/pyproject.toml" ]; then
    what=$src
  else
    die "no gpuwatch wheel in $wheelhouse and no checkout here (make one with: pip wheel -w $wheelhouse '.[tensorboard]')"
  fi
  from="the wheels in $wheelhouse (no network)"
else
  [ -f "$src/pyproject.toml" ] || die "run me from a clone of the gpuwatch repository, or pass --wheelhouse DIR"
  what=$src
  from="the checkout $src"
fi
python=$(command -v python3 || true)
[ -n "$python" ] || die "python3 not found; install it (Debian: apt-get install python3 python3-venv)"
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || die "gpuwatch needs Python 3.10 or newer"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -c 'import venv, ensurepip' 2>/dev/null \
    || die "the venv module is missing (Debian: apt-get install python3-venv)"
fi
if [ -z "$node_name" ]; then
  node_name=$(hostname)
fi
if [ -n "$hub_nodes" ]; then
  targets=
  for node in $(echo "$hub_nodes" | tr ',' ' '); do
    case "$node" in *:*) ;; *) node=$node:9842 ;; esac
    targets="$targets${targets:+, }'$node'"
  done
  [ -n "$targets" ] || die "--hub needs the nodes as host[:port],host[:port]"
fi

role=standalone
[ -z "$hub_nodes" ] || role="the hub of $hub_nodes"
[ -z "$hub_url" ] || role="node $node_name of the hub $hub_url"
if [ "$service" = 1 ]; then how="a systemd service (user gpuwatch)"; else how="a program (no service)"; fi
echo "gpuwatch will be installed into $venv from $from, as $how, $role."
if [ -f "$config" ]; then
  echo "Its settings stay as they are in $config."
else
  echo "Settings in $config: data in $data_dir, listening on $host:$port, demo=$demo."
fi
confirm

# -- program ------------------------------------------------------------------------------------
run mkdir -p "$prefix" "$data_dir"
[ -x "$venv/bin/python" ] || run "$python" -m venv "$venv"
# The tensorboard extra (tensorboardX, protobuf, google-crc32c: ~0.5 MB): `tensorboard_dirs` and
# `gpuwatch import` read TensorBoard event files with it.
if [ -n "$wheelhouse" ]; then
  run "$venv/bin/python" -m pip install --quiet --no-index --find-links "$wheelhouse" --upgrade "${what}[tensorboard]"
else
  run "$venv/bin/python" -m pip install --quiet --upgrade "${what}[tensorboard]"
fi

# -- settings -----------------------------------------------------------------------------------
hub_job() {  # hub_job JOB TARGETS [TOKEN]: one scrape_configs entry of the hub
  echo "  - job_name: $1"
  echo "    scrape_interval: 15s"
  echo "    metrics_path: /federate"
  echo "    params: {'match[]': ['{__name__=~\".+\"}']}   # every series the node stored"
  echo "    honor_labels: true   # the node's own job/instance labels win"
  [ -z "${3:-}" ] || echo "    authorization: {credentials: $3}"
  echo "    static_configs:"
  echo "      - targets: [$2]"
  [ "$1" = gpuwatch-nodes ] || echo "        labels: {job: gpuwatch-nodes}"
}

if [ -f "$config" ]; then
  echo "Keeping the existing $config (its settings win over this run's options)."
  if [ -n "$hub_nodes" ] && ! grep -q 'gpuwatch-nodes' "$config"; then
    echo "Add the nodes to it under scrape_configs:"
    hub_job gpuwatch-nodes "$targets"
  fi
else
  {
    echo "# gpuwatch settings; see README.md \"Configuration\" for every key."
    echo "host: '$host'"
    echo "port: $port"
    echo "data_dir: '$data_dir'"
    echo "demo: $demo"
    if [ -n "$hub_nodes" ]; then
      echo "scrape_configs:"
      hub_job gpuwatch-nodes "$targets"
    fi
  } | write_file "$config"
fi

# -- node token ---------------------------------------------------------------------------------
token=
if [ -n "$hub_url" ]; then
  if [ "$dry" = 1 ]; then
    echo "+ $venv/bin/gpuwatch token create hub --role viewer --config $config"
  elif "$venv/bin/gpuwatch" token --help >/dev/null 2>&1; then
    if out=$("$venv/bin/gpuwatch" token create hub --role viewer --config "$config" 2>&1); then
      token=$(echo "$out" | grep -o 'gwt_[A-Za-z0-9_-]*' | head -n 1 || true)
      [ -n "$token" ] || echo "$out"
    else
      echo "No new token: $out"
      echo "(a token 'hub' exists already? see: $venv/bin/gpuwatch token list --config $config)"
    fi
  else
    echo "This gpuwatch has no access tokens (no 'gpuwatch token' command): the hub scrapes it without one."
  fi
fi

# -- service ------------------------------------------------------------------------------------
if [ "$service" = 1 ]; then
  # The dedicated user must open /dev/nvidia*: they are 0666 on most systems, else owned by a group
  # (the driver's NVreg_DeviceFileGID, often video).
  groups=
  for dev in /dev/nvidiactl /dev/nvidia0; do
    if [ -e "$dev" ]; then
      g=$(stat -c %G "$dev")
      [ "$g" = root ] || groups=$g
      break
    fi
  done
  if [ -z "$groups" ] && getent group video >/dev/null 2>&1; then
    groups=video
  fi
  if ! id gpuwatch >/dev/null 2>&1; then
    run useradd --system --user-group --home-dir "$data_dir" --shell /usr/sbin/nologin gpuwatch
  fi
  [ -z "$groups" ] || run usermod -a -G "$groups" gpuwatch
  run chown -R gpuwatch: "$data_dir"
  protect_home=yes
  case "$prefix/ $data_dir/" in *"/home/"*|*"/root/"*) protect_home=read-only ;; esac
  write_file "$unit" <<EOF
[Unit]
Description=gpuwatch GPU monitoring
Wants=network-online.target
After=network-online.target

[Service]
User=gpuwatch
Group=gpuwatch
${groups:+SupplementaryGroups=$groups}
# glibc: one heap for all threads, up to 16 MB of it kept when freed, so a query reuses warm memory (README, Storage).
Environment=MALLOC_ARENA_MAX=1 MALLOC_MMAP_THRESHOLD_=16777216 MALLOC_TRIM_THRESHOLD_=16777216
ExecStart=$venv/bin/gpuwatch serve --config $config
Restart=on-failure
RestartSec=5
KillSignal=SIGTERM
TimeoutStopSec=30
# Hardening: no privilege gain, the system read-only but the data, no home directories, own /tmp.
# Not PrivateDevices: NVML needs /dev/nvidia*.
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths=$data_dir
ProtectHome=$protect_home
PrivateTmp=yes

[Install]
WantedBy=multi-user.target
EOF
  run systemctl daemon-reload
  run systemctl enable gpuwatch
  run systemctl restart gpuwatch
  if [ "$dry" = 0 ]; then
    if systemctl is-active --quiet gpuwatch; then
      echo "gpuwatch is running: http://$(hostname):$port/ (logs: journalctl -u gpuwatch)"
    else
      echo "gpuwatch did not start; see: journalctl -u gpuwatch" >&2
      exit 1
    fi
  fi
else
  [ "$dry" = 1 ] || echo "Installed. Start it with: $venv/bin/gpuwatch serve --config $config"
fi

# -- lab ----------------------------------------------------------------------------------------
if [ -n "$hub_url" ]; then
  [ "$dry" = 0 ] || token='<the token made above>'
  if [ -n "$token" ]; then
    echo "On the hub ($hub_url), add this node under scrape_configs in its gpuwatch.yml, then restart it:"
    hub_job "gpuwatch-node-$node_name" "'$node_name:$port'" "$token"
  else
    echo "On the hub ($hub_url), add '$node_name:$port' to the targets of the gpuwatch-nodes job in its"
    echo "gpuwatch.yml, then restart it."
  fi
fi
if [ -n "$hub_nodes" ]; then
  echo "The hub scrapes $targets; on each node: ./install.sh --node http://$(hostname):$port"
fi
finish
