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
#   --hub            this is the lab's hub, its nodes push to it: make (once) the machine token
#                    'nodes' and print the command to run on each node
#   --hub NODES      this is the lab's hub and scrapes NODES (host[:port],...) through their /federate:
#                    for nodes the hub can reach but that cannot reach the hub
#   --node HUB_URL   this is a node of the hub at HUB_URL; with a token it sends every sample it stores
#                    to HUB_URL/api/v1/write, without one it prints how to get one (and the hub's
#                    scrape entry for it, to have the hub pull instead)
#   --hub-token TOKEN       with --node: the hub's machine token (what ./install.sh --hub printed)
#   --hub-token-file FILE   with --node: read that token from FILE instead
#   --name NAME      this node's name in the hub's scrape entry (default: this machine's host name)
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
hub=0
hub_nodes=
hub_url=
hub_token=
hub_token_file=
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
    --hub)
      hub=1
      if [ $# -ge 2 ]; then  # the node list is optional: without it the nodes push
        case "$2" in
          -*) ;;
          '') die "--hub got an empty node list: give host[:port],... or nothing (the nodes push)" ;;
          *) hub_nodes=$2; shift ;;
        esac
      fi ;;
    --node) need_arg "$1" $#; hub_url=$2; shift ;;
    --hub-token) need_arg "$1" $#; hub_token=$2; shift; [ -n "$hub_token" ] || die "--hub-token is empty" ;;
    --hub-token-file) need_arg "$1" $#; hub_token_file=$2; shift ;;
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
for value in "$prefix" "$data_dir" "$host" "$hub_nodes" "$hub_url" "$node_name" "$wheelhouse"; do
  case "$value" in *"'"*|*'"'*|*\\*) die "quotes and backslashes are not allowed in options, got '$value'" ;; esac
done
case "$prefix" in /*) ;; *) die "--prefix must be an absolute path, got '$prefix'" ;; esac
[ "$prefix" != / ] || die "--prefix must not be /"
[ "$purge" = 0 ] || [ "$uninstall" = 1 ] || die "--purge goes with --uninstall"
[ "$hub" = 0 ] || [ -z "$hub_url" ] || die "--hub and --node exclude each other: a machine is the hub or a node"
case "$hub_url" in
  *[[:space:]]*) die "--node needs the hub's URL (http://HOST:PORT), got '$hub_url'" ;;
  ''|http://?*|https://?*) ;;
  *) die "--node needs the hub's URL (http://HOST:PORT), got '$hub_url'" ;;
esac
if [ -n "$hub_token" ] || [ -n "$hub_token_file" ]; then
  [ -n "$hub_url" ] || die "--hub-token and --hub-token-file go with --node HUB_URL"
  [ -z "$hub_token" ] || [ -z "$hub_token_file" ] || die "--hub-token and --hub-token-file exclude each other"
fi
if [ -n "$hub_token_file" ]; then
  [ -f "$hub_token_file" ] && [ -r "$hub_token_file" ] || die "--hub-token-file: cannot read $hub_token_file"
  hub_token=$(head -n 1 "$hub_token_file" | tr -d ' \t\r')
  [ -n "$hub_token" ] || die "--hub-token-file: $hub_token_file holds no token"
fi
case "$hub_token" in
  *[!A-Za-z0-9_.~+/=-]*) die "--hub-token: not a token (letters, digits and _.~+/=- only; gwt_... from ./install.sh --hub)" ;;
esac
while [ "${hub_url%/}" != "$hub_url" ]; do hub_url=${hub_url%/}; done
hub_url=${hub_url%/api/v1/write}  # the hub's base URL, also when given as its remote write URL

config=$prefix/gpuwatch.yml
venv=$prefix/venv
token_path=$prefix/hub-token      # a pushing node's token for the hub (the service user's, 0600)
nodes_token_path=$prefix/nodes-token  # a hub's token for its nodes, kept to print it again (root's, 0600)
if [ -z "$data_dir" ] && [ -f "$config" ]; then  # --uninstall --purge and reruns find the store here
  data_dir=$(sed -n "s/^data_dir: *'\{0,1\}\([^']*\)'\{0,1\} *$/\1/p" "$config" | head -n 1)
fi
[ -n "$data_dir" ] || data_dir=/var/lib/gpuwatch
if [ -f "$config" ]; then  # its host and port win over --host and --port, as its other settings do
  config_port=$(sed -n 's/^port: *\([0-9][0-9]*\) *$/\1/p' "$config" | head -n 1)
  [ -z "$config_port" ] || port=$config_port
  config_host=$(sed -n "s/^host: *'\{0,1\}\([^' ]*\)'\{0,1\} *$/\1/p" "$config" | head -n 1)
  [ -z "$config_host" ] || host=$config_host
fi
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
    for file in "$config" "$token_path" "$nodes_token_path"; do
      [ ! -f "$file" ] || run rm -f "$file"
    done
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
[ "$hub" = 0 ] || role="the hub of a lab (its nodes push to it)"
[ -z "$hub_nodes" ] || role="the hub of $hub_nodes (it scrapes them)"
[ -z "$hub_url" ] || role="node $node_name of the hub $hub_url (no hub token: see the end)"
[ -z "$hub_token" ] || role="node $node_name of the hub $hub_url (it pushes to the hub)"
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

write_url=$hub_url/api/v1/write
case "$token_path" in *[,\[\]{}#:]*) token_yaml="'$token_path'" ;; *) token_yaml=$token_path ;; esac
push_entry() {  # the node's remote_write entry
  echo "  - url: $write_url"
  echo "    name: hub"
  echo "    authorization: {credentials_file: $token_yaml}"
  echo "    queue_config: {live_first: true}  # after an outage, new samples first; the hub takes older ones"
}

append_file() {  # append_file PATH: stdin >> PATH
  if [ "$dry" = 1 ]; then
    echo "+ append to $1:"
    sed 's/^/    /'
  else
    cat >>"$1"
  fi
}

if [ -f "$config" ]; then
  echo "Keeping the existing $config (its settings win over this run's options)."
  if [ -n "$hub_nodes" ] && ! grep -q 'gpuwatch-nodes' "$config"; then
    echo "Add the nodes to it under scrape_configs:"
    hub_job gpuwatch-nodes "$targets"
  fi
  if [ -n "$hub_token" ]; then
    if grep -qF "url: $write_url" "$config"; then
      echo "It sends to the hub already (remote_write to $write_url)."
    elif grep -q '^remote_write[[:space:]]*:' "$config"; then
      echo "It has a remote_write block already: add this entry to it, then restart gpuwatch:"
      push_entry
    else
      {
        [ -z "$(tail -c 1 "$config")" ] || echo  # the last line ends with a newline
        echo "remote_write:  # every stored sample, sent to the hub (docs/remote-write.md)"
        push_entry
      } | append_file "$config"
    fi
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
    if [ -n "$hub_token" ]; then
      echo "remote_write:  # every stored sample, sent to the hub (docs/remote-write.md)"
      push_entry
    fi
  } | write_file "$config"
fi
if [ -n "$hub_token" ]; then  # written anew each run: a new token replaces the old one
  if [ "$dry" = 1 ]; then
    echo "+ write $token_path (mode 0600): the hub's token"
  else
    (umask 077 && printf '%s\n' "$hub_token" >"$token_path")
    chmod 600 "$token_path"
  fi
fi

# -- tokens -------------------------------------------------------------------------------------
token=  # a node's viewer token, for the hub's scrape entry
if [ -n "$hub_url" ] && [ -z "$hub_token" ]; then
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

# The hub's one machine token for its pushing nodes: made once, kept in $nodes_token_path (root's
# 0600: gpuwatch stores only its hash) so that a rerun prints the same command.
nodes_token=
if [ "$hub" = 1 ] && [ -z "$hub_nodes" ]; then
  if [ "$dry" = 1 ]; then
    echo "+ $venv/bin/gpuwatch token list --config $config"
    echo "+ $venv/bin/gpuwatch token create nodes --role machine --config $config   (unless 'nodes' is listed)"
    echo "+ write $nodes_token_path (mode 0600): that token"
    nodes_token='<the token made above>'
  else
    listed=$("$venv/bin/gpuwatch" token list --config "$config" 2>&1) \
      || { echo "install.sh: cannot list the hub's tokens: $listed" >&2; exit 1; }
    if ! echo "$listed" | grep -q '^nodes '; then
      made=$("$venv/bin/gpuwatch" token create nodes --role machine --config "$config" 2>&1) \
        || { echo "install.sh: cannot make the nodes' token: $made" >&2; exit 1; }
      nodes_token=$(echo "$made" | tail -n 1)  # the token alone on the last line
      (umask 077 && printf '%s\n' "$nodes_token" >"$nodes_token_path")
      chmod 600 "$nodes_token_path"
      echo "Made the machine token 'nodes' for the nodes (kept in $nodes_token_path)."
    elif [ -s "$nodes_token_path" ]; then
      nodes_token=$(head -n 1 "$nodes_token_path")
      echo "Reusing the machine token 'nodes' (kept in $nodes_token_path)."
    else
      echo "The token 'nodes' exists, but $nodes_token_path does not keep it: use the one made before, or"
      echo "make a new one (the nodes given the old one then need it) with:"
      echo "  $venv/bin/gpuwatch token revoke nodes --config $config && ./install.sh --hub"
    fi
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
  [ -z "$hub_token" ] || run chown gpuwatch: "$token_path"  # the service reads it, nobody else
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
case "$host" in  # how the nodes reach this machine
  ''|0.0.0.0|::) here=$(hostname) ;;
  *:*) here="[$host]" ;;
  *) here=$host ;;
esac
scheme=http
if [ -f "$config" ] && grep -q '^tls_cert_file[[:space:]]*:' "$config"; then scheme=https; fi
if [ -n "$hub_token" ]; then
  echo "This node sends every sample it stores to the hub by remote write ($write_url, token in"
  echo "$token_path); nothing to add on the hub, and nothing is lost while the hub is down."
elif [ -n "$hub_url" ]; then
  echo "This node does not send to the hub yet. To push to it (nothing lost while the hub is down): on the"
  echo "hub, ./install.sh --hub prints the command to run here (or make a token there with"
  echo "'gpuwatch token create nodes --role machine': its last line), then rerun here:"
  echo "  ./install.sh --node $hub_url --hub-token TOKEN"
  echo "Or have the hub pull from this node instead (a hub that can reach the node):"
  [ "$dry" = 0 ] || token='<the token made above>'
  if [ -n "$token" ]; then
    echo "on the hub ($hub_url), add this node under scrape_configs in its gpuwatch.yml, then restart it:"
    hub_job "gpuwatch-node-$node_name" "'$node_name:$port'" "$token"
  else
    echo "on the hub ($hub_url), add '$node_name:$port' to the targets of the gpuwatch-nodes job in its"
    echo "gpuwatch.yml, then restart it."
  fi
fi
if [ -n "$hub_nodes" ]; then
  echo "The hub scrapes $targets; on each node: ./install.sh --node $scheme://$here:$port (it prints"
  echo "the scrape entry to add here)."
elif [ "$hub" = 1 ]; then
  echo "The nodes push to this hub. On each node, from a copy of this checkout (or wheelhouse), run:"
  echo "./install.sh --node $scheme://$here:$port --hub-token ${nodes_token:-<TOKEN>}"
fi
finish
