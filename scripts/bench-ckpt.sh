#!/usr/bin/env bash
# Checkpoint speed on this machine's disk: a 57M-parameter dense model on 2 ranks at ZeRO stage 2
# (fp32 master weights + Adam moments: 12 bytes per parameter, 0.68 GB per checkpoint). Prints
# the disk's sequential write speed (dd with fdatasync) next to how long a synchronous save blocks
# training, how long an asynchronous one does, load (resume) and verify times, and the Young/Daly
# interval the log suggests.
#   scripts/bench-ckpt.sh [WORK_DIR]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/build.sh" >/dev/null
work="${1:-$(mktemp -d "$DSTRAIN_ROOT/build/bench-ckpt.XXXX")}"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
cd "$work"
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); disk of $work: $(df -h . | awk 'NR==2 {print $1, $2}')"
dd_out=$(dd if=/dev/zero of=dd.bin bs=1M count=1024 conv=fdatasync 2>&1 | tail -1)
rm -f dd.bin
echo "dd 1 GiB, fdatasync: $dd_out"
model=(--set model.hidden_size=768 --set model.num_layers=8 --set model.num_heads=12 --set model.intermediate_size=2048
       --set data.seq_len=64 --set model.max_seq_len=64 --set train.micro_batch_size=1 --set train.global_batch_size=2)
run=(--nproc-per-node 2 --set launch.threads_per_worker=1 --set zero.stage=2 --set train.steps=4 --set checkpoint.interval_steps=2
     --set checkpoint.keep_last=0 --set schedule.warmup_steps=1)
"$DSTRAIN_BUILD_DIR/dstrain" train "$DSTRAIN_ROOT/recipes/demo.yaml" "${model[@]}" "${run[@]}" --set run_dir=sync > sync.log 2>&1
"$DSTRAIN_BUILD_DIR/dstrain" train "$DSTRAIN_ROOT/recipes/demo.yaml" "${model[@]}" "${run[@]}" --set run_dir=async --set checkpoint.async=true > async.log 2>&1
bytes=$(du -sb sync/ckpt/step_00000004 | cut -f1)
rm -r sync/ckpt/step_00000004 && printf 'step_00000002\n' > sync/ckpt/latest
"$DSTRAIN_BUILD_DIR/dstrain" resume sync > resume.log 2>&1
start=$(date +%s.%N); "$DSTRAIN_BUILD_DIR/dstrain" inspect-ckpt sync/ckpt/step_00000002 --verify > /dev/null; end=$(date +%s.%N)
python3 - "$bytes" "$dd_out" "$start" "$end" <<'PY'
import re, sys
bytes_, dd, start, end = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
m = re.search(r"([\d.]+) ([MG])B/s", dd)
dd_gbs = float(m.group(1)) / (1000 if m.group(2) == "M" else 1)
def blocked(path):
    return [float(x) for x in re.findall(r"training blocked ([\d.]+) s", open(path).read())]
sync, async_ = blocked("sync.log"), blocked("async.log")
bg = [float(x) for x in re.findall(r"saved in the background: \S+ \(([\d.]+) s\)", open("async/logs/rank_00000.log").read())]
load = float(re.search(r"loaded in ([\d.]+) s", open("resume.log").read()).group(1))
yd = re.findall(r"Young/Daly interval for an MTBF of ([\d.]+) h: ([\d.]+) min", open("sync.log").read())[-1]
gb = bytes_ / 1e9
print(f"checkpoint size           {gb:.3f} GB (2 rank files + manifest)")
print(f"disk sequential write     {dd_gbs:.2f} GB/s (dd)")
print(f"synchronous save          {min(sync):.2f} s blocked  -> {gb / min(sync):.2f} GB/s, {gb / min(sync) / dd_gbs:.2f}x dd")
print(f"asynchronous save         {min(async_):.3f} s blocked (host copy); written in the background in {min(bg):.2f} s")
print(f"blocked time async / sync {min(async_) / min(sync):.3f}")
print(f"load (resume, 2 ranks)    {load:.2f} s -> {gb / load:.2f} GB/s")
print(f"verify (CRC of all files) {end - start:.2f} s -> {gb / (end - start):.2f} GB/s")
print(f"Young/Daly interval       {yd[1]} min for an MTBF of {yd[0]} h (from the measured save)")
PY
