#!/usr/bin/env bash
# Two "hosts" on one Linux machine, for testing what a two-machine cluster
# breaks: each host gets its own network namespace (one end of a veth pair,
# its own address, loopback up), its own hostname, a private /tmp and
# /dev/shm, and, on host 2, an empty tmpfs over the run root so it cannot see
# host 1's run directory. Everything else (venvs, code, the model) is at the
# same paths on both, as on two machines built from one image.
#
#   scripts/two_hosts.sh up   NAME RUN_ROOT [SUBNET]   # SUBNET: 10.213.7 (a /24)
#   scripts/two_hosts.sh exec NAME 1|2 CMD...          # run CMD inside host 1 or 2
#   scripts/two_hosts.sh pids NAME 1|2                 # processes inside a host
#   scripts/two_hosts.sh down NAME                     # stop every process, remove
#
# Host N is NAME-hN at SUBNET.N; each /etc/hosts (via /etc/netns) names both.
# Root only (namespaces, mounts). Traffic stays on the veth pair: neither
# namespace has a route anywhere else. On two real machines none of this is
# needed: see docs/ray.md ("Two hosts").
set -euo pipefail

STATE=/run/marlaas-hosts

die() { echo "two_hosts.sh: $*" >&2; exit 2; }
[[ $(id -u) == 0 ]] || die "needs root (network and mount namespaces)"

cmd=${1:-}; name=${2:-}
[[ -n $cmd && -n $name ]] || die "usage: up|exec|pids|down NAME ..."
[[ $name =~ ^[a-z][a-z0-9-]{0,10}$ ]] || die "NAME: lower-case letters, digits, -; at most 11"
dir=$STATE/$name

ns() { echo "$name-h$1"; }

enter() {  # enter host $1's namespaces
  local h=$1; shift
  exec nsenter --net=/var/run/netns/"$(ns "$h")" --mount="$dir/h$h.mnt" \
    --uts="$dir/h$h.uts" -- "$@"
}

case $cmd in
up)
  root=${3:-}; subnet=${4:-10.213.7}
  [[ -n $root ]] || die "up NAME RUN_ROOT [SUBNET]"
  [[ -d $root ]] || die "RUN_ROOT $root is not a folder"
  root=$(realpath "$root")
  # Each host's /tmp and /dev/shm are its own: a root under them is on neither.
  [[ $root == /tmp/* || $root == /dev/shm/* ]] && \
    die "RUN_ROOT $root is under /tmp or /dev/shm, which each host replaces; use e.g. /var/tmp"
  [[ -e $dir ]] && die "$name is up already ($dir); run: $0 down $name"
  mkdir -p "$dir"
  # Persistent mount/uts namespaces are bind-mounted files, which must live
  # on a mount that does not propagate.
  mountpoint -q $STATE || { mount --bind $STATE $STATE; mount --make-private $STATE; }
  ip link add "$name-v1" type veth peer name "$name-v2"
  for h in 1 2; do
    ip netns add "$(ns $h)"
    ip link set "$name-v$h" netns "$(ns $h)"
    ip -n "$(ns $h)" addr add "$subnet.$h/24" dev "$name-v$h"
    ip -n "$(ns $h)" link set "$name-v$h" up
    ip -n "$(ns $h)" link set lo up
    mkdir -p /etc/netns/"$(ns $h)"
    { echo "127.0.0.1 localhost"; echo "$subnet.1 $name-h1"; echo "$subnet.2 $name-h2"; } \
      > /etc/netns/"$(ns $h)"/hosts
    echo "$name-h$h" > /etc/netns/"$(ns $h)"/hostname
    touch "$dir/h$h.mnt" "$dir/h$h.uts"
    hide=""
    [[ $h == 2 ]] && hide="mount -t tmpfs -o size=2g tmpfs '$root';"
    unshare --mount="$dir/h$h.mnt" --uts="$dir/h$h.uts" --propagation private \
      sh -c "hostname $name-h$h; mount -t tmpfs -o size=4g tmpfs /tmp; \
             mount -t tmpfs -o size=4g tmpfs /dev/shm; $hide
             mount --bind /etc/netns/$(ns $h)/hosts /etc/hosts"
  done
  echo "$subnet" > "$dir/subnet"
  echo "$root" > "$dir/root"
  echo "host 1: $name-h1 $subnet.1 (sees $root); host 2: $name-h2 $subnet.2"
  ;;
exec)
  h=${3:-}; shift 3 || true
  [[ $h == 1 || $h == 2 ]] || die "exec NAME 1|2 CMD..."
  [[ -e $dir/h$h.mnt ]] || die "$name is not up"
  enter "$h" "$@"
  ;;
pids)
  h=${3:-}
  ip netns pids "$(ns "$h")"
  ;;
down)
  for h in 1 2; do
    if ip netns list | grep -qw "$(ns $h)"; then
      pids=$(ip netns pids "$(ns $h)" || true)
      [[ -n $pids ]] && kill $pids 2>/dev/null || true
    fi
  done
  sleep 1
  for h in 1 2; do
    if ip netns list | grep -qw "$(ns $h)"; then
      pids=$(ip netns pids "$(ns $h)" || true)
      [[ -n $pids ]] && kill -9 $pids 2>/dev/null || true
      ip netns del "$(ns $h)"
    fi
    umount "$dir/h$h.mnt" "$dir/h$h.uts" 2>/dev/null || true
    rm -rf /etc/netns/"$(ns $h)"
  done
  rm -rf "$dir"
  ;;
*) die "unknown command $cmd: up|exec|pids|down" ;;
esac
