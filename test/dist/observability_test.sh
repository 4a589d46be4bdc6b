#!/usr/bin/env bash
# Observability (issue 11): a 2-rank run with every sink, the wall-clock breakdown, a slowed rank
# and a worker killed once. Checks: every metrics.jsonl line parses with the documented keys;
# tokens/s and MFU agree with an independent computation (parameters counted from the checkpoint,
# PaLM's FLOPs formula); the real TensorBoard reader sees every scalar at every step with the
# JSONL's values; the CSV files match; the straggler report names the slowed rank; the console
# line follows its documented format; a TTY gets a progress bar that no log receives;
# `dstrain report` writes an HTML page that headless Chromium renders (not blank, every series)
# and PNG charts.
source "$(dirname "$0")/../lib.sh"
py="${DSTRAIN_VENV:-$HOME/.cache/dstrain/venv-torch-2.11.0}/bin/python"
run=(--nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps=30 --set checkpoint.interval_steps=10
     --set train.micro_batch_size=4 --set train.global_batch_size=16 --set 'logging.sinks=[console, jsonl, csv, tensorboard]'
     --set logging.wall_clock_breakdown=true --set logging.straggler_interval=5 --set logging.steps_per_print=5)
DSTRAIN_TEST_FAULTS=slow_rank=1:4 "$DSTRAIN" train "$demo_recipe" "${run[@]}" --max-restarts 1 --set run_dir=obs > obs.log 2>&1 &
launcher=$!
for _ in $(seq 1 1200); do [ "$(wc -l 2>/dev/null < obs/metrics.jsonl || echo 0)" -ge 17 ] && break; sleep 0.05; done
kill -9 "$(pgrep -P $launcher -f worker | head -n1)"
set +e; wait $launcher; status=$?; set -e
[ $status -eq 0 ] || fail "the observed run failed (exit $status): $(tail -5 obs.log)"
ok "a 2-rank run with every sink, a slowed rank 1 and one restart completed"

# --- metrics.jsonl: documented keys, and numbers that agree with an independent computation
python3 - obs <<'PY' || fail "metrics.jsonl is wrong"
import json, sys, glob, os
run = sys.argv[1]
keys = ["step", "time", "loss", "lr", "grad_norm", "loss_scale", "skipped", "bad_steps", "tokens", "epoch", "accumulation", "step_ms", "tokens_per_s",
        "samples_per_s", "tflops_per_rank", "mfu", "peak_tflops", "data_wait_ms", "comm_wait_ms", "host_rss_mb", "host_peak_rss_mb",
        "device_alloc_peak_mb", "device_reserved_peak_mb", "expert_imbalance", "all_to_all_ms", "pipeline_bubble",
        "forward_ms", "backward_ms", "issue_ms", "reduce_ms", "gather_ms",
        "optimizer_ms", "checkpoint_ms", "stragglers"]
rows = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
assert [r["step"] for r in rows] == list(range(1, 31)), [r["step"] for r in rows]
for r in rows:
    assert list(r.keys()) == keys, (list(r.keys()), keys)
    assert r["forward_ms"] > 0 and r["backward_ms"] > 0 and r["optimizer_ms"] > 0 and r["host_rss_mb"] > 0, r
    assert r["device_alloc_peak_mb"] is None and r["expert_imbalance"] is None and r["all_to_all_ms"] is None, r  # CPU, dense
    assert r["pipeline_bubble"] is None, r  # no pipeline
    assert r["issue_ms"] is None, r  # measured on GPUs only
# A save's time is on the next step's line: the saves at 10 and 20 show on 11 and 21 (11 only when
# the restart resumed from a later checkpoint than 10); the final save at 30 has no next line.
saved = [r["step"] for r in rows if r["checkpoint_ms"] > 0]
assert 21 in saved and set(saved) <= {11, 21}, saved
cfg = json.load(open(f"{run}/config.resolved.json"))["config"]
m, T = cfg["model"], cfg["data"]["seq_len"]
G, world = cfg["train"]["global_batch_size"], cfg["launch"]["nproc_per_node"]
# Parameters from the checkpoint's manifest: the matmul ones, i.e. all but the input embedding.
manifest = json.load(open(sorted(glob.glob(f"{run}/ckpt/step_*/manifest.json"))[-1]))
n = 0
for t in manifest["tensors"]:
    if t["name"].startswith(("model.", "lm_head.")) and t["name"] != "model.embed_tokens.weight":
        size = 1
        for d in t["shape"]: size *= d
        n += size
L, H, d = m["num_layers"], m["num_heads"], m["hidden_size"]
flops_per_token = 6 * n + 12 * L * H * (d // H) * T  # PaLM appendix B, no causal discount
worst_tps = worst_mfu = 0.0
for r in rows:
    tps = G * T / (r["step_ms"] / 1000)
    mfu = tps * flops_per_token / (world * r["peak_tflops"] * 1e12)
    worst_tps = max(worst_tps, abs(tps / r["tokens_per_s"] - 1))
    worst_mfu = max(worst_mfu, abs(mfu / r["mfu"] - 1))
    assert abs(r["samples_per_s"] * T / r["tokens_per_s"] - 1) < 1e-6, r
assert worst_tps < 1e-6 and worst_mfu < 1e-2, (worst_tps, worst_mfu)
print(f"tokens/s agree within {worst_tps:.1e}, MFU within {worst_mfu:.1e} ({n} matmul parameters, {flops_per_token:.4g} FLOPs/token)")
PY
ok "every JSONL line has the documented keys; tokens/s and MFU agree with an independent computation"

# --- TensorBoard, read by the real reader
"$py" - obs <<'PY' || fail "TensorBoard does not read the event files right"
import json, sys, glob, math, warnings
warnings.filterwarnings("ignore")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run = sys.argv[1]
assert len(glob.glob(f"{run}/tensorboard/events.out.tfevents.*")) == 2  # one per launch (the restart)
acc = EventAccumulator(f"{run}/tensorboard", size_guidance={"scalars": 0})
acc.Reload()
rows = {r["step"]: r for r in map(json.loads, open(f"{run}/metrics.jsonl"))}
tags = acc.Tags()["scalars"]
checked = 0
for key in ["loss", "lr", "grad_norm", "tokens_per_s", "mfu", "step_ms", "host_rss_mb", "forward_ms", "checkpoint_ms", "loss_scale", "skipped"]:
    events = acc.Scalars(f"train/{key}")
    by_step = {e.step: e.value for e in events}
    assert sorted(by_step) == list(range(1, 31)), (key, sorted(by_step))
    for step, value in by_step.items():
        want = rows[step][key]
        want = float(want) if not isinstance(want, bool) else float(want)
        assert math.isclose(value, want, rel_tol=1e-6, abs_tol=1e-9), (key, step, value, want)
        checked += 1
for tag in tags:
    key = tag.split("/", 1)[1]
    assert all(rows[e.step][key] is not None for e in acc.Scalars(tag)), tag
assert "train/device_alloc_peak_mb" not in tags  # not applicable on CPU: not written
print(f"{len(tags)} scalar tags, {checked} values checked against metrics.jsonl")
PY
ok "TensorBoard's own reader sees every scalar tag at every step with the JSONL's values (the restart's replayed steps purged)"

# --- CSV
python3 - obs <<'PY' || fail "the CSV files do not match metrics.jsonl"
import csv, json, sys, math
run = sys.argv[1]
rows = {r["step"]: r for r in map(json.loads, open(f"{run}/metrics.jsonl"))}
for key in ["loss", "lr", "tokens_per_s", "mfu"]:
    lines = list(csv.reader(open(f"{run}/csv/{key}.csv")))
    assert lines[0] == ["step", key], lines[0]
    assert [int(l[0]) for l in lines[1:]] == list(range(1, 31)), key
    assert all(math.isclose(float(v), rows[int(s)][key], rel_tol=1e-8) for s, v in lines[1:]), key
PY
ok "CSV: one file per metric, one row per step, equal to metrics.jsonl"

# --- stragglers, console format, failures
grep -q "WARN stragglers\? over steps [0-9]*-[0-9]*: rank 1 on .*: compute .* ms/step vs median .* ms (+[0-9]*%)" obs.log ||
  fail "the straggler report does not name rank 1: $(grep -i stragg obs.log | head -3)"
python3 - obs <<'PY' || fail "stragglers.jsonl / metrics do not name rank 1"
import json, sys
checks = [json.loads(l) for l in open(f"{sys.argv[1]}/stragglers.jsonl")]
assert checks and all([r["rank"] for r in c["ranks"] if r["slow"]] == [1] for c in checks), checks
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
assert all(r["stragglers"] == [1] for r in rows if r["step"] % 5 == 0), [r["stragglers"] for r in rows]
PY
grep -qE "^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} \[rank 0\] INFO step 5/30 \| loss [0-9.]+ \| lr [0-9.e+-]+ \| grad_norm [0-9.]+ \| [0-9]+ tok/s \| [0-9]+ ms/step \| mfu [0-9.]+%$" obs.log ||
  fail "the console line does not follow the documented format: $(grep 'step 5/30' obs.log)"
ok "the slowed rank is reported as a straggler by rank and host (log, metrics, stragglers.jsonl); console lines as documented"

# --- a progress bar on a terminal, and never in the logs
script -qfec "$DSTRAIN train $demo_recipe --nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps=12 --set schedule.warmup_steps=2 --set checkpoint.interval_steps=0 --set run_dir=tty" /dev/null > tty.out 2>&1 ||
  fail "the run on a terminal failed: $(tail -5 tty.out)"
grep -q "12/12 100% | ETA 0:00:00 | [0-9]* tok/s | loss" tty.out || fail "no progress bar on the terminal: $(tail -c 600 tty.out)"
! grep -q "@@progress" tty.out tty/logs/*.log || fail "progress lines leaked into the output or the logs"
! grep -q "ETA" obs.log || fail "a progress bar was drawn although stderr was not a terminal"
ok "a terminal gets a progress bar (step/total, %, ETA, tokens/s, loss); logs and pipes get plain lines"

# --- dstrain report, rendered by headless Chromium
expect_status 0 "$DSTRAIN" report obs
expect_out "obs/report/index.html (30 steps, 8 charts"
chromium=$(command -v chromium || command -v chromium-browser || true)
[ -n "$chromium" ] || fail "chromium is not installed (scripts/setup.sh --test installs it)"
timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=900,2800 --screenshot="$WORK/shot.png" \
  "file://$WORK/obs/report/index.html" > chromium.log 2>&1 || fail "chromium failed: $(tail -5 chromium.log)"
python3 - "$WORK/shot.png" obs/report <<'PY' || fail "the report does not render as expected"
import re, struct, sys, zlib, glob, collections
def decode(path):  # a small PNG reader: 8-bit RGB/RGBA, all five filters
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0], "chunk CRC"
        if kind == b"IHDR": w, h, depth, ctype = struct.unpack(">IIBB", body[:10]); bpp = {2: 3, 6: 4}[ctype]
        if kind == b"IDAT": idat += body
        pos += 12 + n
    raw, rows, prev, stride = zlib.decompress(idat), [], bytearray(w * bpp), w * bpp
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0; b = prev[i]; c = prev[i - bpp] if i >= bpp else 0
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + [0, a, b, (a + b) // 2, a if pa <= pb and pa <= pc else (b if pb <= pc else c)][f]) & 0xFF
        rows.append(bytes(line)); prev = line
    return w, h, bpp, rows
w, h, bpp, rows = decode(sys.argv[1])
colors = collections.Counter(r[i:i + 3] for r in rows[::4] for i in range(0, w * bpp, bpp * 4))
white = colors[b"\xff\xff\xff"] / sum(colors.values())
assert len(colors) > 20 and white < 0.97, (len(colors), white)
html = open(f"{sys.argv[2]}/index.html").read()
series = dict(re.findall(r'data-series="([^"]+)" data-points="(\d+)"', html))
for name in ["loss", "lr", "tokens_per_s", "mfu %", "loss_scale", "grad_norm", "step_ms", "forward_ms", "backward_ms", "optimizer_ms", "checkpoint_ms", "step"]:
    assert series.get(name) == "30", (name, series)
assert series.get("failures") == "1", series
assert "<tr class=\"slow\"><td>1</td>" in html, "straggler table"
assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in html, "the page must not reach the network"
pngs = sorted(glob.glob(f"{sys.argv[2]}/*.png"))
assert len(pngs) == 8, pngs
import os
for p in pngs:
    pw, ph, pbpp, prow = decode(p)
    assert (pw, ph) == (720, 280) and len({r[i:i + 3] for r in prow for i in range(0, pw * 3, 3)}) > 3, p
    assert os.path.getsize(p) <= 60_000, (p, os.path.getsize(p))  # compressed
    ink = lambda x0, x1, y0, y1, rgb: sum(prow[y][x * 3:x * 3 + 3] == rgb for y in range(y0, y1) for x in range(x0, x1))
    assert ink(84, 400, 6, 22, b"\x22\x22\x22") > 40, f"{p}: no title"              # the title, 2x glyphs
    assert ink(0, 84, 30, 240, b"\x33\x33\x33") > 40, f"{p}: no y tick numbers or label"
    assert ink(84, 700, 246, 280, b"\x33\x33\x33") > 40, f"{p}: no x tick numbers or label"
    assert ink(560, 700, 30, 60, b"\x33\x33\x33") > 10, f"{p}: no legend text"
print(f"screenshot {w}x{h}: {len(colors)} colours, {white:.0%} white; {len(series)} series; {len(pngs)} PNGs of at most "
      f"{max(os.path.getsize(p) for p in pngs)} bytes with titles, ticks, labels and legends")
PY
ok "dstrain report: headless Chromium renders the page (not blank, every series, the failure and the straggler); 8 compressed PNG charts a person can read (title, ticks, axis labels, legend)"

# --- logging.profile_step: one step recorded with the PyTorch profiler, a trace per rank
"$DSTRAIN" train "$demo_recipe" --nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps=4 --set schedule.warmup_steps=1 \
  --set train.micro_batch_size=4 --set train.global_batch_size=16 --set checkpoint.interval_steps=0 --set logging.profile_step=3 \
  --set run_dir=prof > prof.log 2>&1 || fail "the profiled run failed: $(tail -5 prof.log)"
for r in 00000 00001; do
  grep -q "profile of step 3: [1-9][0-9]* CPU ops, 0 kernel launches, 0 GPU kernels (0.0 ms of kernel time), 0 GPU copies; trace .*/prof/profile/step_3_rank_$r.json" \
    "prof/logs/rank_$r.log" || fail "rank $r logged no profile summary: $(grep -i profile "prof/logs/rank_$r.log")"
done
python3 - prof <<'PY' || fail "the profile traces are wrong"
import glob, json, sys
run = sys.argv[1]
traces = sorted(glob.glob(f"{run}/profile/*"))
assert [t.split("/")[-1] for t in traces] == ["step_3_rank_00000.json", "step_3_rank_00001.json"], traces
for t in traces:
    events = json.load(open(t))["traceEvents"]
    names = {e.get("name") for e in events}
    # The step's matmuls forward and backward, and its gradient all-reduce on Gloo.
    assert "aten::mm" in names and any(n and "gloo" in n.lower() or n and "all_reduce" in n for n in names), sorted(n for n in names if n)[:40]
    print(f"{t}: {len(events)} events")
PY
[ "$(wc -l < prof/metrics.jsonl)" -eq 4 ] || fail "the profiled run did not record its 4 steps' metrics"
err=$("$DSTRAIN" train "$demo_recipe" --set train.steps=4 --set schedule.warmup_steps=1 --set logging.profile_step=9 --dry-run 2>&1) && fail "profile_step past the end was accepted"
grep -q "logging.profile_step 9 (--set) is past the run's last step 4" <<< "$err" || fail "unclear error: $err"
ok "logging.profile_step: each rank writes a Chrome trace of step 3 (its matmuls and collectives) and logs its op counts; a step past the end is refused"
finish
