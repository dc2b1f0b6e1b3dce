#!/usr/bin/env python3
"""Tests of the GPU check's helpers: the comparator (compare_runs.py), the benchmark table
(bench_report.py), the timed runner (timed_run.py), the library report (gpu_env.py), the
GEMM timing's arguments (gemm_peak.py) and gpu_check.sh's argument checks. Each verdict
is asserted by exit code AND message, and every PASS case has a FAIL twin, so the
comparator is known to be able to fail. ctest: gpu_check_compare."""
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_report  # noqa: E402
import compare_runs  # noqa: E402
import gemm_peak  # noqa: E402
import gpu_env  # noqa: E402
import timed_run  # noqa: E402


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = compare_runs.main(list(argv))
    return rc, out.getvalue() + err.getvalue()


class CompareRuns(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def metrics(self, name, losses, first=1, norms=None, header=True, tail=""):
        p = self.path(name)
        with open(p, "w") as f:
            if header:
                f.write('{"segment":{"run_id":"x","start_step":0}}\n')
            for i, loss in enumerate(losses):
                s = first + i
                norm = norms[i] if norms else 1.0 + s / 7
                f.write(json.dumps({"step": s, "loss": loss, "lr": 1e-3, "grad_norm": norm,
                                    "step_ms": 1.0, "tokens_per_s": 1.0, "mfu": 0.1}) + "\n")
            f.write(tail)
        return p

    def losses(self, n=30):
        return [5.5 - 0.07 * s + 1e-9 * s * s for s in range(1, n + 1)]

    def test_bitwise_identical_passes(self):
        a = self.metrics("a", self.losses())
        b = self.metrics("b", self.losses())
        rc, out = run("compare", a, b, "--steps", "1-30", "--bitwise", "--name", "x")
        self.assertEqual(rc, 0, out)
        self.assertIn("PASS x: bitwise: steps 1-30, loss and grad_norm identical", out)

    def test_bitwise_fails_on_one_ulp_of_one_loss(self):
        losses = self.losses()
        a = self.metrics("a", losses)
        changed = list(losses)
        changed[16] = float.fromhex(float.hex(losses[16]))  # same value ...
        changed[16] = changed[16] + abs(changed[16]) * 2.0**-52  # ... then one ulp up
        b = self.metrics("b", changed)
        rc, out = run("compare", a, b, "--steps", "1-30", "--bitwise", "--name", "x")
        self.assertEqual(rc, 1, out)
        self.assertIn("FAIL x: bitwise: step 17 loss", out)

    def test_bitwise_failure_counts_the_differing_steps(self):
        losses = self.losses()
        a = self.metrics("a", losses)
        b = self.metrics("b", losses[:20] + [x * (1 + 1e-3) for x in losses[20:]])
        rc, out = run("compare", a, b, "--steps", "1-30", "--bitwise", "--name", "x")
        self.assertEqual(rc, 1, out)
        self.assertIn("FAIL x: bitwise: step 21 loss", out)
        self.assertIn("10 of 30 steps differ, max loss rel 1.000e-03", out)

    def test_table_holds_every_step_and_its_difference(self):
        losses = self.losses()
        a = self.metrics("a", losses)
        b = self.metrics("b", [x * (1 + 2e-4) for x in losses])
        table = self.path("t.tsv")
        rc, out = run("compare", a, b, "--steps", "2-30", "--max-rel", "1e-3", "--table", table)
        self.assertEqual(rc, 0, out)
        with open(table) as f:
            rows = [line.rstrip("\n").split("\t") for line in f]
        self.assertEqual(rows[0], ["step", "loss_a", "loss_b", "rel", "grad_norm_a", "grad_norm_b"])
        self.assertEqual([r[0] for r in rows[1:]], [str(s) for s in range(2, 31)])
        self.assertEqual(float(rows[1][1]), losses[1])
        self.assertAlmostEqual(float(rows[1][3]), 2e-4, delta=1e-8)
        # A failing comparison writes its table too (the data to set a tolerance from).
        rc, out = run("compare", a, b, "--steps", "1-30", "--max-rel", "1e-5", "--table", table)
        self.assertEqual(rc, 1, out)
        with open(table) as f:
            self.assertEqual(len(f.readlines()), 31)

    def test_bitwise_fails_on_grad_norm(self):
        a = self.metrics("a", self.losses(), norms=[1.0] * 30)
        b = self.metrics("b", self.losses(), norms=[1.0] * 29 + [1.0000001])
        rc, out = run("compare", a, b, "--steps", "1-30", "--bitwise", "--name", "x")
        self.assertEqual(rc, 1, out)
        self.assertIn("step 30 grad_norm", out)

    def test_perturb_then_compare_fails(self):
        a = self.metrics("a", self.losses())
        b = self.path("b")
        self.assertEqual(run("perturb", a, b, "--step", "17", "--rel", "1e-7")[0], 0)
        rc, out = run("compare", a, b, "--steps", "1-30", "--bitwise", "--name", "x")
        self.assertEqual(rc, 1, out)
        self.assertIn("step 17 loss", out)
        rc, out = run("compare", a, b, "--steps", "1-30", "--max-rel", "1e-8", "--name", "x")
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"FAIL x: max rel 1\.0+e-07 > 1e-08 .*at step 17")
        rc, out = run("compare", a, b, "--steps", "1-30", "--max-rel", "1e-6", "--name", "x")
        self.assertEqual(rc, 0, out)
        self.assertIn("PASS x: max rel", out)

    def test_perturb_of_a_missing_step_is_an_error(self):
        a = self.metrics("a", self.losses(5))
        rc, out = run("perturb", a, self.path("b"), "--step", "9", "--rel", "1e-7")
        self.assertEqual(rc, 2, out)
        self.assertIn("no step 9 to perturb", out)

    def test_tolerances_first_and_mean(self):
        base = self.losses()
        a = self.metrics("a", base)
        b = self.metrics("b", [x * (1 + 1e-3) for x in base])
        rc, out = run("compare", a, b, "--steps", "1-30", "--first-rel", "1e-4", "--name", "x")
        self.assertEqual(rc, 1, out)
        self.assertIn("first rel 1.000e-03 > 0.0001", out)
        rc, out = run("compare", a, b, "--steps", "1-30", "--mean-rel", "2e-3", "--first-rel",
                      "2e-3", "--name", "x")
        self.assertEqual(rc, 0, out)
        self.assertIn("mean rel 1.000e-03", out)
        rc, out = run("compare", a, b, "--steps", "1-30", "--mean-rel", "5e-4", "--name", "x")
        self.assertEqual(rc, 1, out)
        self.assertIn("mean rel 1.000e-03 > 0.0005", out)

    def test_missing_step_fails_naming_it(self):
        a = self.metrics("a", self.losses())
        b = self.metrics("b", self.losses(20))
        rc, out = run("compare", a, b, "--steps", "1-30", "--bitwise", "--name", "x")
        self.assertEqual(rc, 1, out)
        self.assertIn("has no step 21, 22, 23, 24, 25 ... (10 of 30 steps missing)", out)

    def test_non_finite_loss_fails_even_when_equal(self):
        losses = self.losses()
        losses[3] = float("nan")
        a = self.metrics("a", losses)
        b = self.metrics("b", losses)
        rc, out = run("compare", a, b, "--steps", "1-30", "--bitwise", "--name", "x")
        self.assertEqual(rc, 1, out)
        self.assertIn("step 4: loss nan is not finite", out)

    def test_resumed_run_compares_the_later_steps(self):
        base = self.losses()
        a = self.metrics("a", base)
        # A resumed run's own file: steps 16-30 only.
        b = self.metrics("b", base[15:], first=16)
        rc, out = run("compare", a, b, "--steps", "16-30", "--bitwise", "--name", "x")
        self.assertEqual(rc, 0, out)
        rc, out = run("compare", a, b, "--steps", "1-30", "--bitwise", "--name", "x")
        self.assertEqual(rc, 1, out)
        self.assertIn("has no step 1, 2", out)

    def test_last_record_of_a_step_wins(self):
        base = self.losses(10)
        a = self.metrics("a", base)
        p = self.metrics("b", [9.0] * 10)  # a crashed first segment ...
        with open(p, "a") as f:          # ... then the resumed segment repeats every step
            f.write('{"segment":{"run_id":"y","start_step":0}}\n')
            for i, loss in enumerate(base):
                f.write(json.dumps({"step": i + 1, "loss": loss, "grad_norm": 1.0 + (i + 1) / 7})
                        + "\n")
        rc, out = run("compare", a, p, "--steps", "1-10", "--bitwise", "--name", "x")
        self.assertEqual(rc, 0, out)

    def test_partial_last_line_is_ignored_corrupt_middle_line_is_an_error(self):
        a = self.metrics("a", self.losses(), tail='{"step": 31, "lo')
        rc, out = run("compare", a, a, "--steps", "1-30", "--bitwise")
        self.assertEqual(rc, 0, out)
        b = self.path("b")
        with open(a) as f, open(b, "w") as g:
            lines = f.readlines()
            lines.insert(3, "garbage\n")
            g.writelines(lines)
        rc, out = run("compare", a, b, "--steps", "1-30", "--bitwise")
        self.assertEqual(rc, 2, out)
        self.assertIn(":4: not JSON", out)

    def test_usage_errors(self):
        a = self.metrics("a", self.losses())
        rc, out = run("compare", a, a, "--steps", "1-30")
        self.assertEqual(rc, 2, out)
        self.assertIn("give --bitwise or at least one of", out)
        rc, out = run("compare", a, a, "--steps", "30-1", "--bitwise")
        self.assertEqual(rc, 2, out)
        self.assertIn("--steps 30-1: expected 1 <= A <= B", out)
        rc, out = run("compare", a, self.path("nope"), "--steps", "1-3", "--bitwise")
        self.assertEqual(rc, 2, out)
        self.assertIn("nope: cannot read", out)

    def manifest(self, name, checksums):
        d = self.path(name)
        os.makedirs(d)
        tensors = {f"t{i}": {"dtype": "f32", "shape": [4],
                             "boxes": [{"checksum": c, "start": [0], "extent": [4]}]}
                   for i, c in enumerate(checksums)}
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump({"tensors": tensors, "step": 30}, f)
        return d

    def test_ckpt(self):
        a = self.manifest("a", ["aa", "bb", "cc"])
        b = self.manifest("b", ["aa", "bb", "cc"])
        c = self.manifest("c", ["aa", "bX", "cc"])
        d = self.manifest("d", ["aa", "bb"])
        rc, out = run("ckpt", a, b, "--name", "x")
        self.assertEqual(rc, 0, out)
        self.assertIn("PASS x: checkpoint: 3 tensors bitwise identical", out)
        rc, out = run("ckpt", a, c, "--name", "x")
        self.assertEqual(rc, 1, out)
        self.assertIn("FAIL x: checkpoint tensor t1 differs", out)
        rc, out = run("ckpt", a, d, "--name", "x")
        self.assertEqual(rc, 1, out)
        self.assertIn("differ in names, e.g. t2", out)
        rc, out = run("ckpt", a, self.path("none"))
        self.assertEqual(rc, 2, out)
        self.assertIn("manifest.json: cannot read", out)


class BenchReport(unittest.TestCase):
    def test_self_test(self):
        out = io.StringIO()
        with redirect_stdout(out):
            rc = bench_report.self_test()
        self.assertEqual(rc, 0, out.getvalue())
        self.assertIn("self-test PASS", out.getvalue())

    def test_header_has_the_rows_columns(self):
        out = io.StringIO()
        with redirect_stdout(out):
            bench_report.self_test()
        rows = [l for l in out.getvalue().splitlines() if l.startswith("| m |")]
        self.assertEqual(len(rows), 3)
        header, rule = bench_report.HEADER.splitlines()
        for r in rows:
            self.assertEqual(r.count("|"), header.count("|"), r)
        self.assertEqual(rule.count("---"), header.count("|") - 1)
        self.assertIn("MFU (measured GEMM peak)", header)

    def test_a_run_that_did_not_run_is_a_row_with_its_reason(self):
        cfg = os.path.join(HERE, "..", "..", "configs", "llama-1b.yaml")
        out = io.StringIO()
        with redirect_stdout(out):
            rc = bench_report.main(["trident", "--config", cfg, "--batch", "8", "--label",
                                    "trident cudnn", "--metrics", os.devnull, "--name", "llama-1b",
                                    "--status", "SKIPPED: the smoke run failed"])
        self.assertEqual(rc, 0)
        self.assertEqual(out.getvalue().strip(), "| llama-1b | trident cudnn | 8 x 2048 | - | - | - | "
                         "- | - | ? | - -> - | SKIPPED: the smoke run failed |")
        out = io.StringIO()
        with redirect_stdout(out):
            bench_report.main(["trident", "--config", cfg, "--batch", "8", "--metrics", os.devnull,
                               "--name", "llama-1b", "--rc", "139"])
        self.assertIn("| FAIL (exit 139, 0 timed steps) |", out.getvalue())


def timed(tmp, *cmd, timeout=0, marks=(), maps_at=""):
    log, js, maps = (os.path.join(tmp, n) for n in ("run.log", "run.json", "maps.txt"))
    argv = ["--log", log, "--json", js, "--timeout", str(timeout)]
    for m in marks:
        argv += ["--mark", m]
    if maps_at:
        argv += ["--maps", maps, "--maps-at", maps_at]
    rc = timed_run.main(argv + ["--"] + list(cmd))
    with open(log) as f:
        text = f.read()
    with open(js) as f:
        result = json.load(f)
    return rc, text, result, maps


class TimedRun(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def test_marks_times_and_exit_status(self):
        rc, text, r, maps = timed(self.dir.name, "sh", "-c",
                                  "echo 'info: backend: x'; sleep 0.3; echo 'step 1/5'; sleep 0.3; echo oops >&2; exit 3",
                                  marks=["backend=^info: backend:", "first=\\bstep 1/", "never=^nope"],
                                  maps_at="step 1/")
        self.assertEqual(rc, 3)
        self.assertEqual(r["rc"], 3)
        self.assertFalse(r["timed_out"])
        self.assertIsNone(r["marks"]["never"])
        self.assertLess(r["marks"]["backend"], 0.25)
        self.assertGreaterEqual(r["marks"]["first"], 0.25)
        self.assertRegex(text, r"\[ *[0-9.]+\] step 1/5\n")
        self.assertIn("] oops\n", text)  # stderr is in the log too
        self.assertEqual(r["tail"][-1], "oops")
        with open(maps) as f:
            libs = f.read()
        self.assertIn("libc.so", libs)  # what the shell had mapped when the line came

    def test_timeout_is_124_and_says_so(self):
        rc, text, r, _ = timed(self.dir.name, "sh", "-c", "echo start; sleep 30", timeout=0.5)
        self.assertEqual(rc, 124)
        self.assertTrue(r["timed_out"])
        self.assertLess(r["wall_s"], 10)
        self.assertIn("TIMEOUT after 0.5 s", text)

    def test_a_signal_is_128_plus_its_number(self):
        rc, _, _, _ = timed(self.dir.name, "sh", "-c", "kill -9 $$")
        self.assertEqual(rc, 137)

    def test_a_missing_program_is_127(self):
        rc, text, r, _ = timed(self.dir.name, "/nonexistent/program")
        self.assertEqual(rc, 127)
        self.assertIn("cannot start /nonexistent/program", text)

    def test_usage(self):
        err = io.StringIO()
        with redirect_stderr(err):
            self.assertEqual(timed_run.main(["--log", "x"]), 2)
            self.assertEqual(timed_run.main(["--log", "x", "--mark", "nameonly", "--", "true"]), 2)
        self.assertIn("expected NAME=REGEX", err.getvalue())


class GpuEnv(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def test_resolve_names_file_version_and_wheel(self):
        lib = os.path.join(self.dir.name, "nvidia", "cudnn", "lib")
        os.makedirs(lib)
        real = os.path.join(lib, "libcudnn.so.9.13.0")
        open(real, "w").close()
        os.symlink("libcudnn.so.9.13.0", os.path.join(lib, "libcudnn.so.9"))
        nccl = os.path.join(lib, "libnccl.so.2")
        open(nccl, "w").close()
        probe = {"wheels": [{"name": "nvidia-cudnn-cu13", "version": "9.13.0.50",
                             "dirs": [os.path.realpath(lib)]}]}
        text = (f"\tlibyaml-cpp.so.0.7 => /x/libyaml-cpp.so.0.7 (0x1)\n"
                f"\tlibcudnn.so.9 => {lib}/libcudnn.so.9 (0x2)\n"
                f"\tlibcublasLt.so.13 => not found\n"
                f"libnccl.so.2 {nccl}\n"
                f"{lib}/libcudnn.so.9\n")
        lines = gpu_env.resolve(text, probe)
        self.assertEqual(lines[0], f"libcudnn.so.9: {lib}/libcudnn.so.9 (file 9.13.0), from wheel "
                                   "nvidia-cudnn-cu13 9.13.0.50")
        self.assertEqual(lines[1], "libcublasLt.so.13: NOT FOUND")
        self.assertEqual(lines[2], f"libnccl.so.2: {nccl}, from wheel nvidia-cudnn-cu13 9.13.0.50")
        self.assertEqual(len(lines), 3, lines)  # yaml-cpp is not a CUDA library; no repeats

    def test_wheel_lib_dirs_finds_only_folders_with_libraries(self):
        site = self.dir.name
        for d, so in (("nvidia/cudnn/lib", "libcudnn.so.9"), ("nvidia/cu13/lib", "libcudart.so.13"),
                      ("nvidia/empty/lib", None)):
            os.makedirs(os.path.join(site, d))
            if so:
                open(os.path.join(site, d, so), "w").close()
        dirs = gpu_env.wheel_lib_dirs([site])
        self.assertEqual(dirs, sorted(os.path.realpath(os.path.join(site, d))
                                      for d in ("nvidia/cudnn/lib", "nvidia/cu13/lib")))

    def test_probe_answers_without_torch_or_wheels(self):
        facts = gpu_env.probe()
        self.assertIn("torch", facts)
        self.assertTrue("version" in facts["torch"] or "error" in facts["torch"])
        self.assertIsInstance(facts["wheels"], list)


class GemmPeak(unittest.TestCase):
    def test_bad_sizes_are_usage_errors(self):
        err = io.StringIO()
        with redirect_stderr(err):
            self.assertEqual(gemm_peak.main(["--n", "0"]), 2)
            self.assertEqual(gemm_peak.main(["--iters", "0"]), 2)
        self.assertIn("--n and --iters must be >= 1", err.getvalue())


class GpuCheckArguments(unittest.TestCase):
    script = os.path.join(HERE, "..", "gpu_check.sh")

    def run_script(self, *args):
        p = subprocess.run(["bash", self.script, *args], capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout + p.stderr

    def test_bad_arguments_exit_2_naming_them(self):
        for args, message in ((["--steps", "env,bogus"], "unknown step 'bogus'"),
                              (["--parity-steps", "7"], "expected an even integer >= 2"),
                              (["--budget", "soon"], "expected seconds"),
                              (["--jobs", "0"], "expected an integer >= 1"),
                              (["--frobnicate"], "unknown argument '--frobnicate'")):
            rc, out = self.run_script(*args)
            self.assertEqual(rc, 2, (args, out))
            self.assertIn(message, out)

    def test_help_exits_0(self):
        rc, out = self.run_script("--help")
        self.assertEqual(rc, 0, out)
        self.assertIn("--prepare", out)
        self.assertIn("--dry-run", out)


if __name__ == "__main__":
    unittest.main(verbosity=1)
