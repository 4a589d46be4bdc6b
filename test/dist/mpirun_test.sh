#!/usr/bin/env bash
# Real mpirun (Open MPI) starts 4 dstrain processes: they find their ranks in OMPI_COMM_WORLD_*,
# rank 0 hosts the store, and they pass the collective check.
source "$(dirname "$0")/../lib.sh"
if ! command -v mpirun >/dev/null; then echo "SKIPPED: mpirun not installed (scripts/setup.sh --test installs openmpi-bin)"; exit 77; fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
expect_status 0 timeout 300 mpirun --allow-run-as-root --oversubscribe -n 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port \
  "$DSTRAIN" bench comm --check
expect_out "collective check on 4 ranks (gloo): 82 passed, 0 failed"
ok "mpirun -n 4: every rank found its place and every collective is correct"
finish
