#!/usr/bin/env bash
# Weights & Biases and MLflow sinks (issue 56): a 2-rank run with validation, killed once and
# resumed, logs to W&B in offline mode and to an MLflow file store, with no network. Read back
# with the SDKs (W&B's own protobuf records of its .wandb file; MLflow's client), each holds every
# metric of metrics.jsonl at its step with its value, the run's config as parameters, and the
# report's charts as artifacts; the resumed launch continues the same W&B and MLflow runs. A
# missing SDK, or an interpreter that does not exist, stops the run at start with what to install.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
"$py" -c 'import wandb, mlflow' 2>/dev/null || { echo "SKIP: wandb and mlflow are not in $DSTRAIN_VENV (scripts/setup.sh --test)"; exit 77; }
export WANDB_MODE=offline WANDB_SILENT=true WANDB_DISABLE_GIT=true MLFLOW_TRACKING_URI="file://$WORK/mlruns" MLFLOW_ALLOW_FILE_STORE=true
run=(--nproc-per-node 2 --set launch.threads_per_worker=1 --set train.micro_batch_size=4 --set train.global_batch_size=16
     --set schedule.warmup_steps=2 --set checkpoint.interval_steps=10 --set "eval.paths=[$SRC/recipes/data/demo_corpus.txt]" --set eval.max_batches=2 --set eval.interval_steps=5
     --set logging.python="$py" --set 'logging.sinks=[console, jsonl, wandb, mlflow]' --set logging.run_name=tracked)

# A run stopped by a killed worker at step 13 or so (rank 1 slowed, so that the kill lands mid-run), then resumed to 30.
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${run[@]}" --set train.steps=30 --set run_dir=t --dry-run
DSTRAIN_TEST_FAULTS=slow_rank=1:4 "$DSTRAIN" train "$demo_recipe" "${run[@]}" --set train.steps=30 --set run_dir=t > first.log 2>&1 &
launcher=$!
for _ in $(seq 1 1200); do
  n=$(grep -c '"loss"' t/metrics.jsonl 2>/dev/null || true)
  [ "${n:-0}" -ge 13 ] && break
  kill -0 $launcher 2>/dev/null || fail "the run ended before step 13: $(tail -12 first.log)"
  sleep 0.05
done
kill -9 "$(pgrep -P $launcher -f "dstrain worker" | head -n1)"
set +e; wait $launcher; status=$?; set -e
allow_worker_signals
[ $status -eq 7 ] || fail "the killed run exited $status: $(tail -5 first.log)"
grep -q "metrics go to wandb and mlflow too, through $py" first.log || fail "the launcher did not start the side process: $(cat first.log)"
ids_before=$(python3 -c "import json; s=json.load(open('t/tracker.json')); print(s['wandb_id'], s['mlflow_run_id'])")
logged_before=$(python3 -c "import json; print(json.load(open('t/tracker.json'))['last_step']['train'])")
expect_status 0 "$DSTRAIN" resume t
expect_out "metrics go to wandb and mlflow too"
ids_after=$(python3 -c "import json; s=json.load(open('t/tracker.json')); print(s['wandb_id'], s['mlflow_run_id'])")
[ "$ids_before" = "$ids_after" ] || fail "the resumed launch started new W&B/MLflow runs: $ids_before -> $ids_after"
[ -f t/report/index.html ] || fail "the report was not written for the trackers"
ok "a run killed at step 13 or so and resumed logs to one W&B run and one MLflow run ($ids_after)"

"$py" - t "$WORK/mlruns" "$logged_before" <<'PY' || fail "the W&B or MLflow run does not hold metrics.jsonl"
import glob, json, math, os, struct, sys
from mlflow.tracking import MlflowClient
from wandb.proto import wandb_internal_pb2

run_dir, mlruns, logged_before = sys.argv[1], sys.argv[2], int(sys.argv[3])
state = json.load(open(os.path.join(run_dir, "tracker.json")))
# Steps after the checkpoint at 10 that the first launch logged ran again after the resume:
# bit-identical math, but their own timings (the trackers keep the first run's).
timing = ("_ms", "tokens_per_s", "samples_per_s", "tflops_per_rank", "mfu", "peak_tflops", "host_rss_mb", "host_peak_rss_mb")
def comparable(name, step):
    return not (10 < step <= logged_before and name.endswith(timing))

# What metrics.jsonl holds, as the sinks name it: train keys plain, eval keys under eval/<set>/.
want = {}  # name -> {step: value}
for line in open(os.path.join(run_dir, "metrics.jsonl")):
    r = json.loads(line)
    prefix = f"eval/{r['eval']}/" if "eval" in r else ""
    for k, v in r.items():
        if k in ("step", "time", "eval") or v is None or isinstance(v, (list, str)):
            continue
        want.setdefault(prefix + k, {})[r["step"]] = float(v)
steps = sorted(want["loss"])
assert steps == list(range(1, 31)), steps
assert len(want["eval/demo_corpus/val_loss"]) == 6, want["eval/demo_corpus/val_loss"]

def close(a, b):
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)

# MLflow: every metric's history.
client = MlflowClient(f"file://{mlruns}")
run = client.get_run(state["mlflow_run_id"])
assert run.info.run_name == "tracked", run.info.run_name
assert run.data.params["train.steps"] == "30" and run.data.params["optimizer.lr"], list(run.data.params)[:10]
for name, values in want.items():
    history = client.get_metric_history(state["mlflow_run_id"], name)
    got = {m.step: m.value for m in history}
    assert set(got) == set(values) and len(history) == len(got), (name, sorted(set(values) ^ set(got)), len(history))
    for step, v in values.items():
        assert not comparable(name, step) or close(got[step], v), (name, step, got[step], v)
arts = [a.path for a in client.list_artifacts(state["mlflow_run_id"], "report")]
assert any(p.endswith("loss.png") for p in arts), arts

# W&B offline: the run's records through W&B's own protobuf (the file is LevelDB-log framed).
def records(path):
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:7]
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            yield pending
            pending = b""

files = sorted(glob.glob(os.path.join(run_dir, "wandb", f"offline-run-*-{state['wandb_id']}", "*.wandb")))
assert len(files) == 2, files  # the first launch and the resumed one
history, config, artifacts = {}, {}, []
for f in files:
    for raw in records(f):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            history.setdefault(row["_step"], {}).update(row)
        elif kind in ("config", "run"):  # the config comes with the run record, and in updates after it
            for i in (rec.config if kind == "config" else rec.run.config).update:
                config[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
        elif kind == "artifact":
            artifacts.append(rec.artifact.type)
        elif kind == "run":
            assert rec.run.display_name == "tracked" and rec.run.run_id == state["wandb_id"], rec.run
for name, values in want.items():
    for step, v in values.items():
        assert step in history and name in history[step], (name, step)
        assert not comparable(name, step) or close(float(history[step][name]), v), (name, step, history[step][name], v)
assert config.get("train.steps") == 30, {k: config[k] for k in list(config)[:5]}
assert "report" in artifacts, artifacts
print(f"{len(want)} metrics x {len(steps)} steps in MLflow and W&B")
PY
ok "MLflow (file store) and W&B (offline) hold every metric of metrics.jsonl at its step, the config as parameters, the charts as artifacts"

# A rank started by another launcher (torchrun's variables): rank 0 hosts the side process.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TORCHELASTIC_RUN_ID=tr \
  expect_status 0 "$DSTRAIN" train "$demo_recipe" --set train.steps=6 --set schedule.warmup_steps=1 --set checkpoint.interval_steps=0 \
  --set logging.python="$py" --set 'logging.sinks=[console, mlflow]' --set logging.run_name=as-rank --set run_dir=asrank
"$py" - asrank "$WORK/mlruns" <<'PY' || fail "a rank started by torchrun did not log to MLflow"
import json, os, sys
from mlflow.tracking import MlflowClient
state = json.load(open(os.path.join(sys.argv[1], "tracker.json")))
losses = [json.loads(l)["loss"] for l in open(os.path.join(sys.argv[1], "metrics.jsonl")) if '"loss"' in l]
got = [m.value for m in sorted(MlflowClient(f"file://{sys.argv[2]}").get_metric_history(state["mlflow_run_id"], "loss"), key=lambda m: m.step)]
assert len(losses) == 6 and got == losses, (got, losses)
PY
ok "a rank started with torchrun's variables (no dstrain launcher): rank 0 hosts the side process; MLflow holds its 6 losses"

# A missing SDK or interpreter stops the run before any worker starts, saying what to install.
python3 -c 'import wandb' 2>/dev/null && { echo "SKIP: the system python3 has wandb"; finish; exit 0; }
expect_status 5 "$DSTRAIN" train "$demo_recipe" "${run[@]}" --set train.steps=4 --set run_dir=nosdk --set logging.python=python3
expect_out "logging.sinks: the wandb and mlflow side process (python3) did not start"
expect_out "No module named"
expect_out "python3 -m pip install"
[ ! -e nosdk/metrics.jsonl ] || fail "workers started without the SDK"
expect_status 5 "$DSTRAIN" train "$demo_recipe" "${run[@]}" --set train.steps=4 --set run_dir=nopy --set logging.python=/no/such/python
expect_out "cannot run '/no/such/python'"
ok "a missing SDK or interpreter is an error at start (exit 5) naming what to install, before any worker"
finish
