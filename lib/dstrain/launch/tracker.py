# dstrain's experiment tracker: a side process of the launcher on node 0 that follows
# run_dir/metrics.jsonl and logs every metric at its step to Weights & Biases and/or MLflow
# through their own SDKs, so that nothing in the training loop waits for the network.
# Built into the dstrain binary (launch/tracker.cpp) and run as `PYTHON -c SCRIPT SPEC_JSON`.
#   SPEC_JSON: {"run_dir", "metrics", "config", "state", "report_dir", "name", "sinks": [...],
#               "wandb": {"project", "entity", "group"}, "mlflow": {"experiment"}}
# Protocol: one line "ready" on stdout once every SDK has started its run (anything else, or an
# exit, is a failure the launcher reports before any worker starts); then it polls the metrics
# until stdin closes, logs what is left, uploads the report's charts and exits 0.
import json
import math
import os
import secrets
import select
import sys


def flat_config(path):
    """The resolved recipe (config.resolved.json's "config"), flattened to "section.key": value."""
    try:
        with open(path) as f:
            config = json.load(f).get("config", {})
    except (OSError, ValueError, AttributeError):
        return {}
    out = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            out[prefix] = value

    walk("", config)
    return out


def metrics_of(record):
    """(kind, step, {name: number}) of one metrics.jsonl line; kind "train" or "eval/<set>"."""
    step = record.get("step")
    if not isinstance(step, int):
        return None
    kind = "train"
    prefix = ""
    if isinstance(record.get("eval"), str):
        kind = "eval/" + record["eval"]
        prefix = kind + "/"
    values = {}
    for key, value in record.items():
        if key in ("step", "time", "eval"):
            continue
        if isinstance(value, bool):
            values[prefix + key] = int(value)
        elif isinstance(value, (int, float)):
            if math.isfinite(value):
                values[prefix + key] = value
        elif isinstance(value, list) and key != "stragglers":  # an objective's metric with several values (mtp_loss: per depth)
            for depth, loss in enumerate(value, 1):
                if isinstance(loss, (int, float)) and math.isfinite(loss):
                    values[f"{prefix}{key}/{depth}"] = loss
    return kind, step, values


class State:
    """What was logged, kept in run_dir so that `dstrain resume` continues the same runs."""

    def __init__(self, path):
        self.path = path
        self.data = {"version": 1, "wandb_id": None, "mlflow_run_id": None, "last_step": {}}
        try:
            with open(path) as f:
                self.data.update(json.load(f))
        except (OSError, ValueError):
            pass

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f)
        os.replace(tmp, self.path)


class WandbSink:
    def __init__(self, spec, state, params):
        import wandb

        self.wandb = wandb
        options = spec.get("wandb", {})
        run_id = state.data.get("wandb_id") or secrets.token_hex(4)  # kept in run_dir: a resume continues this run
        self.run = wandb.init(project=options.get("project") or "dstrain", entity=options.get("entity") or None,
                              group=options.get("group") or None, name=spec["name"], id=run_id, resume="allow",
                              dir=spec["run_dir"], config=params)
        state.data["wandb_id"] = run_id

    def log(self, step, values):
        self.run.log(values, step=step)

    def finish(self, report_dir, pngs):
        if pngs:
            artifact = self.wandb.Artifact(f"report-{self.run.id}", type="report")
            for png in pngs:
                artifact.add_file(png, name=os.path.basename(png))
            self.run.log_artifact(artifact)
        self.run.finish()


class MlflowSink:
    def __init__(self, spec, state, params):
        import mlflow

        self.mlflow = mlflow
        mlflow.set_experiment(spec.get("mlflow", {}).get("experiment") or "dstrain")
        run_id = state.data.get("mlflow_run_id")
        self.run = mlflow.start_run(run_id=run_id) if run_id else mlflow.start_run(run_name=spec["name"])
        state.data["mlflow_run_id"] = self.run.info.run_id
        if not run_id:
            items = [(k, str(v)[:6000]) for k, v in params.items()]
            for i in range(0, len(items), 100):  # MLflow takes at most 100 parameters per call
                mlflow.log_params(dict(items[i:i + 100]))

    def log(self, step, values):
        self.mlflow.log_metrics(values, step=step)

    def finish(self, report_dir, pngs):
        for png in pngs:
            self.mlflow.log_artifact(png, artifact_path="report")
        self.mlflow.end_run()


class Follower:
    """Complete lines appended to metrics.jsonl since the last read."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def lines(self):
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.offset:  # rewritten (a resume keeps the lines through its checkpoint)
                    self.offset, self.partial = 0, b""
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return []
        self.offset += len(chunk)
        data = self.partial + chunk
        *complete, self.partial = data.split(b"\n")
        return complete


def main():
    spec = json.loads(sys.argv[1])
    state = State(spec["state"])
    params = flat_config(spec["config"])
    factories = {"wandb": WandbSink, "mlflow": MlflowSink}
    sinks = [factories[name](spec, state, params) for name in spec["sinks"]]
    state.save()
    print("ready", flush=True)
    # The launcher reads nothing more: what the SDKs (and their service processes) print goes to the log.
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    follower = Follower(spec["metrics"])
    last = state.data["last_step"]

    def drain():
        logged = 0
        for line in follower.lines():
            try:
                parsed = metrics_of(json.loads(line))
            except ValueError:
                continue
            if parsed is None:
                continue
            kind, step, values = parsed
            if step <= last.get(kind, 0) or not values:
                continue  # logged before a resume rewound metrics.jsonl to its checkpoint
            for sink in sinks:
                sink.log(step, values)
            last[kind] = step
            logged += 1
        if logged:
            state.save()

    while True:
        readable, _, _ = select.select([sys.stdin], [], [], 0.5)
        if readable and not sys.stdin.buffer.read1(4096):
            break  # the launcher is done: the run ended
        drain()
    drain()
    report_dir = spec.get("report_dir", "")
    pngs = sorted(os.path.join(report_dir, f) for f in os.listdir(report_dir) if f.endswith(".png")) if os.path.isdir(report_dir) else []
    for sink in sinks:
        sink.finish(report_dir, pngs)
    state.save()


if __name__ == "__main__":
    main()
