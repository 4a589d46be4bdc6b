#!/usr/bin/env bash
# dstrain under a real Slurm (issue 25): a one-node cluster (munged, slurmctld, slurmd from
# Debian's slurm-wlm on 127.0.0.1, test/slurm/cluster.sh) started for this test and stopped at its
# end. Every way users start jobs: srun per node and srun per rank train as a run without Slurm
# does; the batch script of a multi-task job is refused naming srun; two jobs at once on one node
# and two steps in one allocation; scancel of a step, of a batch script that exec'ed dstrain and of
# one whose shell is killed; a rank that waits in rendezvous stops at once on SIGTERM; ranks keep
# their own logs and failure records; hostlists expand as scontrol does. Skips (77) where a cluster
# cannot run (not root, Slurm not installed).
source "$(dirname "$0")/../lib.sh"
source "$SRC/test/slurm/cluster.sh"
set +e
slurm_start "$WORK/slurm"
status=$?
set -e
[ $status -eq 77 ] && exit 77
[ $status -eq 0 ] || fail "the test cluster did not start"
trap 'rc=$?; slurm_stop; [ $rc -eq 0 ] && rm -rf "$WORK" || echo "(scratch kept in $WORK)"; exit $rc' EXIT
ok "a one-node Slurm cluster is up ($(sinfo -h -o '%N %c CPUs'))"

common=(--set train.steps=8 --set schedule.warmup_steps=2 --set checkpoint.interval_steps=4 --set launch.threads_per_worker=1
        --set logging.steps_per_print=100)
losses() { python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["loss"]) for l in open(sys.argv[1])))' "$1/metrics.jsonl"; }

expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=plain --nproc-per-node 2
expect_status 0 srun -N1 -n1 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=per_node --set launch.nproc_per_node=2
expect_status 0 srun -n2 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=per_rank
[ "$(losses per_node)" = "$(losses plain)" ] && [ "$(losses per_rank)" = "$(losses plain)" ] || fail "losses differ under Slurm:
plain    $(losses plain)
per node $(losses per_node)
per rank $(losses per_rank)"
ok "srun -N1 -n1 (a launcher per node) and srun -n2 (a task per rank) train bit-identically to a run without Slurm"

[ -f per_rank/logs/rank_00001.log ] && grep -q "INFO" per_rank/logs/rank_00000.log || fail "srun -n2: the ranks kept no logs/rank_*.log"

set +e
OUT=$(DSTRAIN_TEST_FAULTS="fact=1:libtorch=2.10.0" srun -n2 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=mismatch 2>&1)
rc=$?
set -e
[ $rc -ne 0 ] || fail "srun -n2 with differing environments succeeded"
python3 - mismatch/failures.jsonl <<'PY' || fail "srun -n2: no failure records in failures.jsonl"
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
assert {r["rank"] for r in records} == {0, 1}, records
assert all(r["exit_code"] == 5 and "libtorch" in r["what"] for r in records), records
PY
grep -q "libtorch" mismatch/logs/rank_00001.log || fail "rank 1's log lacks its error"
ok "one task per rank: each rank keeps logs/rank_XXXXX.log and records its own failure in failures.jsonl (defect 7)"

cat > batch_multi.sh <<EOF
#!/bin/bash
#SBATCH --ntasks=2
"$DSTRAIN" train "$demo_recipe" --set run_dir=$WORK/batch_multi
EOF
jobid=$(sbatch --parsable -o batch_multi.out batch_multi.sh)
for _ in $(seq 1 100); do squeue -h -j "$jobid" 2>/dev/null | grep -q . || break; sleep 0.2; done
grep -q "srun" batch_multi.out || fail "the batch script of a 2-task job was not refused naming srun: $(cat batch_multi.out)"
ok "dstrain started in the batch script of a multi-task job is refused at once, naming srun (defect 1)"

# Two 1-CPU jobs at once on one node: each step derives its own store port (defect 2).
j1=$(sbatch --parsable -c1 -o two1.out --wrap "srun -n1 $DSTRAIN train $demo_recipe ${common[*]} --set run_dir=$WORK/two1 --set launch.nproc_per_node=1")
j2=$(sbatch --parsable -c1 -o two2.out --wrap "srun -n1 $DSTRAIN train $demo_recipe ${common[*]} --set run_dir=$WORK/two2 --set launch.nproc_per_node=1")
for _ in $(seq 1 600); do squeue -h -j "$j1,$j2" 2>/dev/null | grep -q . || break; sleep 0.2; done
for n in 1 2; do
  [ -f "two$n/ckpt/step_00000008/COMMITTED" ] || fail "job $n of two at once did not finish: $(tail -5 two$n.out)"
done
ok "two jobs at once on one node both train (store ports derived from job and step ids)"

# Two steps in one allocation on the same run_dir: the second resumes the first (its own run id:
# defect 3). The first stops itself after its first steps (--max-time) with a checkpoint.
cat > steps.sh <<SCRIPT
#!/bin/bash
#SBATCH --ntasks=2
srun -n2 "$DSTRAIN" train "$demo_recipe" ${common[*]} --set run_dir=$WORK/steps --set checkpoint.interval_steps=0 --max-time 0.003
echo "first step: \$?"
ls $WORK/steps/ckpt > $WORK/steps_first.txt
srun -n2 "$DSTRAIN" resume $WORK/steps
echo "second step: \$?"
SCRIPT
jobid=$(sbatch --parsable -o steps.out steps.sh)
for _ in $(seq 1 600); do
  ! squeue -h -j "$jobid" 2>/dev/null | grep -q . && grep -q "second step:" steps.out && break
  sleep 0.2
done
grep -q "first step: 75" steps.out && grep -qE "second step: (0|75)" steps.out || fail "two steps in one allocation: $(tail -20 steps.out)"
[ "$(grep step_ steps_first.txt | sort | tail -1)" != "$(ls steps/ckpt | grep step_ | sort | tail -1)" ] || fail "the second step made no progress"
ok "two srun steps in one allocation: the second resumes the first's run and goes on"

# scancel of a batch script that exec'ed dstrain, and of one whose shell is killed (defect 6).
long=(--set train.steps=100000 --set checkpoint.interval_steps=0 --set launch.threads_per_worker=1)
for form in exec shell; do
  prefix=""; [ $form = exec ] && prefix="exec"
  printf '#!/bin/bash\n%s "%s" train "%s" %s --set run_dir=%s --set launch.nproc_per_node=2\n' "$prefix" "$DSTRAIN" "$demo_recipe" \
    "${long[*]}" "$WORK/batch_$form" > "batch_$form.sh"
  jobid=$(sbatch --parsable -o "batch_$form.out" "batch_$form.sh")
  for _ in $(seq 1 300); do grep -q "step " "batch_$form/logs/rank_00000.log" 2>/dev/null && break; sleep 0.2; done
  if [ $form = exec ]; then scancel --batch --signal=TERM "$jobid"; else scancel --batch --signal=KILL "$jobid"; fi
  for _ in $(seq 1 150); do pgrep -f "run_dir=$WORK/batch_$form" >/dev/null || break; sleep 0.2; done
  ! pgrep -f "run_dir=$WORK/batch_$form" >/dev/null || fail "$form: dstrain outlived its batch script"
  ls "batch_$form"/ckpt/step_*/COMMITTED >/dev/null 2>&1 || fail "$form: no checkpoint at the stop: $(tail -5 batch_$form.out)"
done
ok "a batch script's dstrain stops with a checkpoint when the script is signalled (exec) or its shell is killed"

# --requeue with --resume auto: scontrol requeue stops the run with a checkpoint (exit 75), and
# the requeued job resumes it; its losses are those of a run never interrupted.
requeue=(--set train.steps=40 --set checkpoint.interval_steps=10 --set launch.threads_per_worker=1 --set logging.steps_per_print=100)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${requeue[@]}" --set run_dir=straight
printf '#!/bin/bash\nexec "%s" train "%s" %s --set run_dir=%s --resume auto\n' "$DSTRAIN" "$demo_recipe" "${requeue[*]}" "$WORK/requeued" > requeue.sh
jobid=$(sbatch --parsable --requeue --open-mode=append -o requeue.out requeue.sh)
for _ in $(seq 1 300); do [ -f requeued/ckpt/step_00000010/COMMITTED ] && break; sleep 0.1; done
scontrol requeue "$jobid"
# Slurm holds a requeued job back for a while (pending, reason BeginTime). It is released here once
# the first start has ended and its node is no longer completing: released before, Slurm may start
# it while the first start's credential is being revoked, and kill it ("Job credential revoked").
for _ in $(seq 1 300); do
  ! pgrep -f "run_dir=$WORK/requeued" >/dev/null && [ "$(squeue -h -j "$jobid" -o '%T %r' 2>/dev/null)" = "PENDING BeginTime" ] &&
    [ -z "$(sinfo -h -N -t COMPLETING -o %N 2>/dev/null)" ] && break
  sleep 0.1
done
scontrol update jobid="$jobid" StartTime=now
# Done when the requeued run has resumed and the job has left the queue (it may vanish from squeue
# for a moment while Slurm requeues it, before the second start).
for _ in $(seq 1 600); do
  ! squeue -h -j "$jobid" 2>/dev/null | grep -q . && grep -q "resumed from" requeue.out && break
  sleep 0.2
done
grep -q "stopped as asked" requeue.out && grep -q "resumed from" requeue.out || fail "requeue: $(tail -5 requeue.out)"
by_step() { python3 -c 'import json,sys; d={}; [d.__setitem__(r["step"], r["loss"]) for r in map(json.loads, open(sys.argv[1]))]; print(d)' "$1/metrics.jsonl"; }
[ "$(by_step requeued)" = "$(by_step straight)" ] || fail "requeue: the resumed run's losses differ from an uninterrupted run's"
ok "sbatch --requeue with --resume auto: scontrol requeue stops with a checkpoint, the requeued job resumes bit-identically"

# A rank that waits in rendezvous for a peer that never comes stops at once on SIGTERM (defect 10).
port=$((20000 + RANDOM % 20000))
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TORCHELASTIC_RUN_ID=lonely \
  "$DSTRAIN" train "$demo_recipe" --set run_dir=lonely > lonely.out 2>&1 &
pid=$!
sleep 3
kill -TERM $pid
start=$(date +%s%N)
set +e
wait $pid
rc=$?
set -e
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ $rc -eq 130 ] && [ $elapsed_ms -lt 1000 ] || fail "a rank in rendezvous exited $rc $elapsed_ms ms after SIGTERM: $(tail -3 lonely.out)"
ok "a rank waiting in rendezvous exits 130 within ${elapsed_ms} ms of SIGTERM"

"$(dirname "$DSTRAIN")/test/dstrain_unit_tests" "[.scontrol]" > hostlists.out 2>&1 || fail "hostlists differ from scontrol: $(cat hostlists.out)"
ok "hostlists expand as scontrol show hostnames does ($(grep -o '[0-9]* assertions' hostlists.out))"
finish
