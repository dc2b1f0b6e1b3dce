#!/usr/bin/env python3
# `trident plan --calibrate` against a real multi-rank run on this machine (docs/PLAN.md
# "Calibration"): trains a small GPT-2 for a few steps on 2 MPI ranks (dp 2, ZeRO-1),
# fits the cpu entry of the hardware table to its metrics file, and checks that
#   - the calibrated `trident plan --gpu cpu --hardware OUT` predicts that run's step time
#     (the median of its steps after the first, read here from the metrics file) within
#     20%, where the uncalibrated plan is printed beside it for comparison;
#   - bad input exits 2 naming the file: a missing file, a file with no steps, and a run
#     whose layout is not the config's (world size in the segment header, coordinates in
#     the summary);
#   - several --calibrate runs: alike ones (the run under two names) get the bandwidth-only
#     fit, said so; a second run's --calibrate-set layout is checked against its file; the
#     same file twice exits 2.
#   calibrate_cpu_test.py BUILD_DIR SOURCE_DIR [MPIEXEC]
import json, os, statistics, subprocess, sys, tempfile

build, source = sys.argv[1], sys.argv[2]
trident = os.path.join(build, "trident")
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=source, **kw)


with tempfile.TemporaryDirectory() as work:
    text = os.path.join(work, "text.txt")
    with open(text, "w") as f:
        for name in sorted(os.listdir(os.path.join(source, "docs"))):
            f.write(open(os.path.join(source, "docs", name)).read())
    r = run([trident, "prepare", "--input", text, "--out", os.path.join(work, "data"), "--tokenizer", "byte"])
    assert r.returncode == 0, r.stderr
    config = os.path.join(work, "run.yaml")
    with open(config, "w") as f:
        f.write("model: {arch: gpt2, vocab_size: 256, seq_len: 128, n_layers: 2, n_heads: 2, d_model: 128}\n"
                "parallel: {dp: 2, zero_stage: 1, micro_batch_size: 1}\n"
                f"data: {{train: '{work}/data/train_*.bin'}}\n"
                "training: {global_batch_size: 8, max_steps: 6, lr: 3.0e-4, warmup_steps: 0}\n"
                f"checkpoint: {{dir: '{work}/ck', save_final: false}}\n"
                f"logging: {{metrics: '{work}/metrics.jsonl', log_interval: 1}}\n")
    mpirun = [sys.argv[3] if len(sys.argv) > 3 else "mpirun", "--oversubscribe", "--mca", "btl", "self,vader", "--timeout", "120", "-np", "2"]
    if os.geteuid() == 0:
        mpirun.insert(1, "--allow-run-as-root")
    r = run(mpirun + [trident, "train", "--config", config])
    assert r.returncode == 0, r.stdout + r.stderr
    metrics = os.path.join(work, "metrics.jsonl")
    steps = [j for j in map(json.loads, open(metrics)) if "step_ms" in j]
    measured = statistics.median(s["step_ms"] for s in steps[1:]) / 1e3
    out = os.path.join(work, "calibrated.yaml")
    r = run([trident, "plan", "--calibrate", metrics, "--config", config, "--gpu", "cpu",
             "--write-hardware", out])
    print(r.stdout, r.stderr)
    check(r.returncode == 0 and os.path.exists(out), "calibrate exits 0 and writes the table")

    def predicted(extra):
        r = run([trident, "plan", "--config", config, "--devices", "2", "--gpu", "cpu", "--configured-only",
                 "--json"] + extra)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["configured"]["step_time_s"]

    calibrated, plain = predicted(["--hardware", out]), predicted([])
    print(f"measured {1e3 * measured:.1f} ms/step (median of {len(steps) - 1}); calibrated plan "
          f"{1e3 * calibrated:.1f} ms ({100 * (calibrated / measured - 1):+.1f}%); uncalibrated plan "
          f"{1e3 * plain:.1f} ms ({100 * (plain / measured - 1):+.1f}%)")
    check(abs(calibrated / measured - 1) <= 0.2, "the calibrated plan predicts the run's step within 20%")

    def refused(metrics_file, sets, needle):
        r = run([trident, "plan", "--calibrate", metrics_file, "--config", config, "--gpu", "cpu",
                 "--write-hardware", os.path.join(work, "bad.yaml")] + sets)
        check(r.returncode == 2 and metrics_file in r.stderr and needle in r.stderr,
              f"{os.path.basename(metrics_file)} {sets}: exit 2 naming the file and '{needle}' ({r.stderr.strip()})")

    refused(os.path.join(work, "missing.jsonl"), [], "cannot open")
    nosteps = os.path.join(work, "nosteps.jsonl")
    with open(nosteps, "w") as f:
        f.write(open(metrics).readline())  # the segment header alone
    refused(nosteps, [], "no step records")
    refused(metrics, ["--set", "parallel.dp=1"], "world_size 2")
    refused(metrics, ["--set", "parallel.dp=1", "--set", "parallel.tp=2"], "summary")

    # Several runs: the same run under two names has one calls-per-byte ratio, so the fit
    # is the bandwidth-only one, said so; a second run's own layout (--calibrate-set) is
    # checked against its file, and the same file twice is refused.
    twin = os.path.join(work, "twin.jsonl")
    with open(twin, "w") as f:
        f.write(open(metrics).read())
    two = os.path.join(work, "two.yaml")
    r = run([trident, "plan", "--calibrate", metrics, "--calibrate", twin, "--calibrate-set", "parallel.zero_stage=1",
             "--config", config, "--gpu", "cpu", "--write-hardware", two])
    print(r.stdout, r.stderr)
    check(r.returncode == 0 and "bandwidth only over" in r.stdout and "of 2 runs" in r.stdout and
          predicted(["--hardware", two]) > 0, "two alike runs: the bandwidth-only fit, said so, and a table plan reads")
    r = run([trident, "plan", "--calibrate", metrics, "--calibrate", twin, "--calibrate-set", "parallel.dp=1",
             "--calibrate-set", "parallel.tp=2", "--config", config, "--gpu", "cpu", "--write-hardware", two])
    check(r.returncode == 2 and twin in r.stderr and "summary" in r.stderr,
          f"a second run that is not its --calibrate-set layout: exit 2 naming it ({r.stderr.strip()})")
    r = run([trident, "plan", "--calibrate", metrics, "--calibrate", twin, "--calibrate-set", "parallel.tp=2",
             "--config", config, "--gpu", "cpu", "--write-hardware", two])
    check(r.returncode == 2 and twin in r.stderr and "same devices" in r.stderr,
          f"a second run on other devices: exit 2 naming it ({r.stderr.strip().splitlines()[0]})")
    r = run([trident, "plan", "--calibrate", metrics, "--calibrate", metrics, "--config", config, "--gpu", "cpu",
             "--write-hardware", two])
    check(r.returncode == 2 and "given twice" in r.stderr, "the same file twice: exit 2")
sys.exit(1 if failures else 0)
