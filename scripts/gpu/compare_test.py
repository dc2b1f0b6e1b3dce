#!/usr/bin/env python3
"""Tests of the GPU check's comparator (compare_runs.py) and benchmark table
(bench_report.py): each verdict is asserted by exit code AND message, and every PASS case
has a FAIL twin, so the comparator is known to be able to fail. ctest: gpu_check_compare."""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_report  # noqa: E402
import compare_runs  # noqa: E402


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


if __name__ == "__main__":
    unittest.main(verbosity=1)
