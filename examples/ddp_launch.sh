#!/usr/bin/env bash
# Starts N processes of a program on this machine with the variables torchrun would give them, without
# torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT (what
# nitro::dist::ProcessGroup::from_environment() reads; rank 0 then serves the store). It waits for all of
# them and exits with the first non-zero status any of them had; when one fails, the others get SIGTERM
# (and SIGKILL after DDP_LAUNCH_GRACE seconds, 30 by default). SIGINT and SIGTERM sent to the launcher
# reach every process as SIGTERM (processes a script starts in the background ignore SIGINT).
#
#   examples/ddp_launch.sh 2 build/examples/ddp --epochs 1              # one machine, 2 processes
#
#   # two machines, 4 processes each: the same command on both, NODE_RANK 0 on the one named MASTER_ADDR
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 MASTER_PORT=29500 examples/ddp_launch.sh 4 build/examples/ddp
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 MASTER_PORT=29500 examples/ddp_launch.sh 4 build/examples/ddp
#
# Ranks are NODE_RANK * N + i for i in [0, N); LOCAL_RANK is i. On one machine MASTER_ADDR defaults to
# 127.0.0.1 and MASTER_PORT to a free port; with NNODES > 1 both must be given. Between machines Gloo
# binds the address of the host's name, or the interface GLOO_SOCKET_IFNAME names (export it here).
set -uo pipefail

usage() {
  echo "usage: [NNODES=M NODE_RANK=R MASTER_ADDR=HOST MASTER_PORT=PORT] $0 N PROGRAM [ARGS...]" >&2
  exit 2
}
(($# >= 2)) || usage
n=$1
shift
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "ddp_launch: N must be a positive integer, got '$n'" >&2; usage; }
program=$1
if [[ $program != */* ]]; then
  program=$(command -v -- "$program") || { echo "ddp_launch: $1: not found" >&2; exit 2; }
fi
[[ -x $program && ! -d $program ]] || { echo "ddp_launch: $program is not an executable file" >&2; exit 2; }
shift

nnodes=${NNODES:-1}
node_rank=${NODE_RANK:-0}
[[ $nnodes =~ ^[1-9][0-9]*$ && $node_rank =~ ^[0-9]+$ ]] && ((node_rank < nnodes)) ||
  { echo "ddp_launch: need NNODES >= 1 and 0 <= NODE_RANK < NNODES, got NNODES=$nnodes NODE_RANK=$node_rank" >&2; exit 2; }
if ((nnodes > 1)) && [[ -z ${MASTER_ADDR:-} || -z ${MASTER_PORT:-} ]]; then
  echo "ddp_launch: NNODES=$nnodes: set MASTER_ADDR and MASTER_PORT (node 0's host and a free port) on every node" >&2
  exit 2
fi
master_addr=${MASTER_ADDR:-127.0.0.1}
master_port=${MASTER_PORT:-}
if [[ -z $master_port ]]; then
  # A port nobody listens on: a refused connection through bash's /dev/tcp (the store's server binds it
  # shortly after; another program could take it in between, which would fail rank 0 with a message).
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/$master_addr/$p") 2>/dev/null; then
      master_port=$p
      break
    fi
  done
  [[ -n $master_port ]] || { echo "ddp_launch: found no free port; set MASTER_PORT" >&2; exit 2; }
fi
world=$((nnodes * n))

declare -A rank_of=()
for ((i = 0; i < n; i++)); do
  rank=$((node_rank * n + i))
  RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$i LOCAL_WORLD_SIZE=$n GROUP_RANK=$node_rank \
    MASTER_ADDR=$master_addr MASTER_PORT=$master_port "$program" "$@" &
  rank_of[$!]=$rank
done

status=0
deadline=0
grace=${DDP_LAUNCH_GRACE:-30}
# A signal to the launcher goes to every rank as SIGTERM (they save and stop); the launcher then exits
# with 128 + the signal's number, as torchrun does, so a preempted job never looks finished.
signalled=0
forward() {
  echo "ddp_launch: $1: SIGTERM to ranks ${rank_of[*]}" >&2
  signalled=$2
  kill -TERM "${!rank_of[@]}" 2>/dev/null
  ((deadline == 0)) && deadline=$((SECONDS + grace))
}
trap 'forward SIGTERM 15' TERM
trap 'forward SIGINT 2' INT

# Polled (every 0.2 s) rather than `wait -n -p`, which needs bash 5.1: `wait PID` gives the status of a
# child bash has already reaped.
while ((${#rank_of[@]} > 0)); do
  for pid in "${!rank_of[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    wait "$pid"
    rc=$?
    if ((rc != 0 && status == 0)); then
      status=$rc
      echo "ddp_launch: rank ${rank_of[$pid]} (pid $pid) exited with status $rc; stopping the other ranks" >&2
      unset "rank_of[$pid]"
      ((${#rank_of[@]} > 0)) && kill -TERM "${!rank_of[@]}" 2>/dev/null
      deadline=$((SECONDS + grace))
    fi
    unset "rank_of[$pid]"
  done
  if ((deadline > 0 && SECONDS >= deadline && ${#rank_of[@]} > 0)); then
    echo "ddp_launch: ranks ${rank_of[*]} still running ${grace} s after SIGTERM; killing them" >&2
    kill -KILL "${!rank_of[@]}" 2>/dev/null
    deadline=0
  fi
  ((${#rank_of[@]} > 0)) && sleep 0.2
done
if ((status == 0 && signalled != 0)); then
  echo "ddp_launch: stopped by a signal; every rank exited with status 0" >&2
  exit $((128 + signalled))
fi
((status == 0)) && echo "ddp_launch: all $n processes exited with status 0" >&2
exit $status
