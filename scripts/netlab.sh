#!/usr/bin/env bash
# netlab: a cluster of N hosts on one machine, for testing peers against faults of the
# network rather than of processes. Each host is a network namespace with its own address
# (10.213.0.R+1) and one veth cable into a switch namespace, where the cables meet on a
# bridge. Nothing touches the machine's own namespace: only addresses inside namespaces
# this script created are used, and `down` removes them with every process inside.
#
#   netlab.sh check                       exit 0 if labs can be made here, else say why (exit 77)
#   netlab.sh up LAB N [--rate RATE]      make hosts 0..N-1 (RATE: tc tbf shaping of every
#                                         cable, both ways, e.g. 1gbit; default: none)
#   netlab.sh topology LAB GENERATOR N [PORT]   print a topology file whose peers are the hosts
#   netlab.sh exec LAB R CMD...           run CMD on host R (as srun would start a peer there)
#   netlab.sh link LAB R down|up          pull host R's cable out of the switch, or plug it back
#   netlab.sh shape LAB R RATE|off [BURST] tbf-shape host R's cable (both ways); BURST, the
#                                         bucket (default 64kb: enough for 1 Gbit/s)
#   netlab.sh partition LAB R...          move the named hosts onto a second bridge: the two
#                                         groups no longer reach each other
#   netlab.sh heal LAB                    put every host back on the first bridge
#   netlab.sh down LAB                    kill everything on the hosts, remove the lab
#   netlab.sh list                        the labs that exist (a crashed test may leave one)
#
# LAB is a short name of letters and digits (tests use their process id). Needs root and
# iproute2 (ip, tc); tc's netem is not assumed, only tbf.
set -euo pipefail

die() { echo "error: netlab: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

lab_name() {
  [[ $1 =~ ^[A-Za-z0-9]{1,10}$ ]] || die "lab name '$1' must be 1 to 10 letters or digits"
  echo "$1"
}
switch_ns() { echo "ptlab-$1-sw"; }
host_ns() { echo "ptlab-$1-$2"; }
host_address() { echo "10.213.$(($1 / 250)).$(($1 % 250 + 1))"; }
hosts_of() {  # the host ids of lab $1, in order
  ip netns list | awk '{print $1}' | sed -n "s/^ptlab-$1-\([0-9][0-9]*\)$/\1/p" | sort -n
}
need_lab() { ip netns list | awk '{print $1}' | grep -qx "$(switch_ns "$1")" || die "there is no lab '$1' (netlab.sh list)"; }
need_host() {
  [[ $2 =~ ^[0-9]+$ ]] || die "host '$2' is not a number"
  ip netns list | awk '{print $1}' | grep -qx "$(host_ns "$1" "$2")" || die "lab '$1' has no host $2"
}

check() {
  [[ $(id -u) == 0 ]] || { echo "netlab: needs root to make network namespaces (running as uid $(id -u))"; return 77; }
  command -v ip >/dev/null && command -v tc >/dev/null || { echo "netlab: needs iproute2 (ip, tc)"; return 77; }
  local probe="ptlab-probe$$"
  if ! err=$(ip netns add "$probe" 2>&1); then
    echo "netlab: cannot make a network namespace here: $err"
    return 77
  fi
  local ok=0
  if ! err=$(ip -n "$probe" link add br0 type bridge 2>&1); then
    echo "netlab: cannot make a bridge inside a namespace: $err"; ok=77
  elif ! err=$(ip -n "$probe" link add v0 type veth peer name v1 2>&1); then
    echo "netlab: cannot make veth pairs: $err"; ok=77
  elif ! err=$(ip -n "$probe" link set v0 up && tc -n "$probe" qdisc add dev v0 root tbf rate 1gbit burst 64kb latency 50ms 2>&1); then
    echo "netlab: cannot shape with tc tbf: $err"; ok=77
  fi
  ip netns del "$probe" 2>/dev/null || true
  return $ok
}

shape() {  # shape LAB R RATE|off [BURST]: both ends of host R's cable
  local lab=$1 r=$2 rate=$3 burst=${4:-64kb} sw
  sw=$(switch_ns "$lab")
  local ends=("$sw h$r" "$(host_ns "$lab" "$r") eth0")
  for end in "${ends[@]}"; do
    read -r ns dev <<<"$end"
    tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
    if [[ $rate != off ]]; then
      # burst: at least rate/HZ; 64 kB covers 1 Gbit/s at the kernel's 1000 Hz tick.
      tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 100ms ||
        die "tc cannot shape host $r's cable at '$rate' with a '$burst' bucket (a rate like 100mbit, a burst like 8kb)"
    fi
  done
}

up() {
  local lab=$1 n=$2 rate=off
  shift 2
  while (($#)); do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 1000)) || die "up: N '$n' must be a number from 1 to 1000"
  ip netns list | awk '{print $1}' | grep -q "^ptlab-$lab-" && die "lab '$lab' exists already (netlab.sh down $lab)"
  local sw
  sw=$(switch_ns "$lab")
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link add br1 type bridge  # the far side of a partition
  ip -n "$sw" link set br0 up
  ip -n "$sw" link set br1 up
  for ((r = 0; r < n; ++r)); do
    local ns
    ns=$(host_ns "$lab" "$r")
    ip netns add "$ns"
    ip -n "$sw" link add "h$r" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "h$r" master br0 up
    ip -n "$ns" addr add "$(host_address "$r")/16" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    [[ $rate == off ]] || shape "$lab" "$r" "$rate"
  done
}

down() {
  local lab=$1 ns pids
  for ns in $(ip netns list | awk '{print $1}' | grep "^ptlab-$lab-"); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -z $pids ]] || kill -CONT $pids 2>/dev/null || true
    [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
}

topology() {
  local lab=$1 generator=$2 n=$3 port=${4:-7000}
  [[ $n =~ ^[0-9]+$ ]] || die "topology: N '$n' is not a number"
  local have
  have=$(hosts_of "$lab" | wc -l)
  ((n <= have)) || die "topology: lab '$lab' has $have hosts, fewer than $n peers"
  echo "name: $generator$n-netlab-$lab"
  echo "graph: {generator: $generator, n: $n}"
  echo "peers:"
  for ((r = 0; r < n; ++r)); do echo "  - {id: $r, host: $(host_address "$r"), port: $port}"; done
}

cmd=${1:-}
[[ -n $cmd ]] || usage 2
shift
case $cmd in
  -h | --help | help) usage 0 ;;
  check) check ;;
  list) ip netns list | awk '{print $1}' | sed -n 's/^ptlab-\(.*\)-sw$/\1/p' ;;
  up) (($# >= 2)) || die "usage: netlab.sh up LAB N [--rate RATE]"; up "$(lab_name "$1")" "${@:2}" ;;
  down) (($# == 1)) || die "usage: netlab.sh down LAB"; down "$(lab_name "$1")" ;;
  topology) (($# >= 3)) || die "usage: netlab.sh topology LAB GENERATOR N [PORT]"; topology "$(lab_name "$1")" "${@:2}" ;;
  exec)
    (($# >= 3)) || die "usage: netlab.sh exec LAB R CMD..."
    need_lab "$1"; need_host "$1" "$2"
    exec ip netns exec "$(host_ns "$1" "$2")" "${@:3}" ;;
  link)
    (($# == 3)) || die "usage: netlab.sh link LAB R down|up"
    need_lab "$1"; need_host "$1" "$2"
    [[ $3 == down || $3 == up ]] || die "link: '$3' is not down or up"
    ip -n "$(switch_ns "$1")" link set "h$2" "$3" ;;
  shape)
    (($# == 3 || $# == 4)) || die "usage: netlab.sh shape LAB R RATE|off [BURST]"
    need_lab "$1"; need_host "$1" "$2"
    shape "$1" "$2" "$3" "${4:-64kb}" ;;
  partition)
    (($# >= 2)) || die "usage: netlab.sh partition LAB R..."
    need_lab "$1"
    lab=$1
    shift
    for r in "$@"; do need_host "$lab" "$r"; ip -n "$(switch_ns "$lab")" link set "h$r" master br1; done ;;
  heal)
    (($# == 1)) || die "usage: netlab.sh heal LAB"
    need_lab "$1"
    for r in $(hosts_of "$1"); do ip -n "$(switch_ns "$1")" link set "h$r" master br0; done ;;
  *) echo "error: netlab: unknown command '$cmd'" >&2; usage 2 ;;
esac
