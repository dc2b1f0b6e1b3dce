#!/usr/bin/env python3
"""Per-label test times of the last ctest run, checked against the ceilings of the docs.

Reads the time of every test the last ctest run recorded (its JUnit file, written with
`ctest --output-junit FILE`, or build/Testing/Temporary/LastTest.log), the labels of every
test (`ctest --show-only=json-v1` in the build directory), and the ceilings of the table in
docs/ARCHITECTURE.md "Tests: labels and times" (between the markers `<!-- test-times:begin -->`
and `<!-- test-times:end -->`), so the documented budget and the check are one table.
Prints one row per label: the tests that ran out of those the label has, their seconds
summed, and the ceiling. A test with several labels counts for each; tests that did not
run (a filtered run, `ctest -R X`) count nothing, so a partial run is checked on what ran.

The table's optional `kind` column says what a label is: `folder` (the folder of tests/
a test lives in, or scripts) or `launcher` (mpi, cuda: how it runs, across folders). With
it, every test that ran must carry exactly one folder label, so the folder rows split the
run and add up to its total, and a launcher row is a second view of some of those tests.

Exit 0 when every label is within its ceiling (a ceiling of TODO is not checked); 1 naming
each label over its ceiling, each label of the run that has no row in the table, and each
test that ran without exactly one folder label; 2 for unreadable input (no times, no
table, an unknown kind).

Usage:
    test_times.py [--build DIR] [--junit FILE | --log FILE] [--labels-json FILE] [--doc FILE]
    test_times.py --self-test    a fake run with one label over its ceiling must fail
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BEGIN, END = "<!-- test-times:begin -->", "<!-- test-times:end -->"
SECTION = 'docs/ARCHITECTURE.md "Tests: labels and times"'
NO_LABEL = "(no label)"


class InputError(Exception):
    pass


def times_from_junit(path):
    """{test name: seconds} of the tests that ran (status other than notrun/disabled)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise InputError(f"{path}: cannot read the JUnit file: {e}")
    times = {}
    for case in root.iter("testcase"):
        if case.get("status", "run") in ("notrun", "disabled"):
            continue
        times[case.get("name")] = float(case.get("time") or 0.0)
    return times


TEST_RE = re.compile(r"^\d+/\d+ Test: (.+)$")
TIME_RE = re.compile(r"^Test time =\s*([0-9.]+) sec$")


def read_log(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read the ctest log: {e}")


def times_from_log(text):
    """{test name: seconds} from ctest's LastTest.log ("N/M Test: name" ... "Test time = s sec")."""
    times, current = {}, None
    for line in text.splitlines():
        m = TEST_RE.match(line)
        if m:
            current = m.group(1).strip()
            continue
        m = TIME_RE.match(line.strip())
        if m and current is not None:
            times[current] = float(m.group(1))
            current = None
    return times


def labels_from_json(text, source):
    """{test name: [labels]} from `ctest --show-only=json-v1` output."""
    try:
        tests = json.loads(text)["tests"]
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{source}: not ctest's json-v1 test list: {e}")
    labels = {}
    for test in tests:
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        labels[test["name"]] = list(props.get("LABELS", [])) or [NO_LABEL]
    return labels


def labels_from_ctest(build):
    try:
        out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise InputError(f"{build}: ctest --show-only=json-v1 failed: {e}")
    return labels_from_json(out, f"ctest --show-only=json-v1 in {build}")


KINDS = ("folder", "launcher")


def ceilings_from_doc(path, kinds=None):
    """{label: ceiling seconds or None for TODO} from the marked table of the doc; fills
    kinds (when given) with {label: kind} if the table has a kind column."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e}")
    if BEGIN not in text or END not in text.split(BEGIN, 1)[1]:
        raise InputError(f"{path}: no table between {BEGIN} and {END}")
    rows = [line.strip() for line in text.split(BEGIN, 1)[1].split(END, 1)[0].splitlines()
            if line.strip().startswith("|")]
    if len(rows) < 2:
        raise InputError(f"{path}: the test-times table has no rows")

    def cells(row):
        return [c.strip().strip("`").strip() for c in row.strip("|").split("|")]

    header = [c.lower() for c in cells(rows[0])]
    try:
        label_col = header.index("label")
        ceiling_col = next(i for i, h in enumerate(header) if h.startswith("ceiling"))
    except (ValueError, StopIteration):
        raise InputError(f"{path}: the test-times table needs a 'label' and a 'ceiling' column")
    kind_col = header.index("kind") if "kind" in header else None
    ceilings = {}
    for row in rows[2:]:  # rows[1] is the |---| line
        c = cells(row)
        if len(c) <= max(label_col, ceiling_col):
            raise InputError(f"{path}: short row in the test-times table: {row}")
        if kind_col is not None and kinds is not None:
            kind = c[kind_col] if kind_col < len(c) else ""
            if kind not in KINDS:
                raise InputError(f"{path}: label {c[label_col]}: kind '{kind}' is not one of "
                                 f"{', '.join(KINDS)}")
            kinds[c[label_col]] = kind
        value = c[ceiling_col]
        if value.upper().startswith("TODO"):
            ceilings[c[label_col]] = None
            continue
        try:
            ceilings[c[label_col]] = float(value)
        except ValueError:
            raise InputError(f"{path}: label {c[label_col]}: ceiling '{value}' is not a "
                             "number of seconds or TODO")
    return ceilings


def check(times, labels, ceilings, out=sys.stdout, kinds=None):
    """Prints the table; returns the problems (one line each, naming the label or test).
    kinds: {label: folder or launcher}, or None when the table has no kind column."""
    members, ran, seconds = {}, {}, {}
    for name, test_labels in labels.items():
        for label in test_labels:
            members[label] = members.get(label, 0) + 1
            if name in times:
                ran[label] = ran.get(label, 0) + 1
                seconds[label] = seconds.get(label, 0.0) + times[name]
    for name in times:  # ran but unknown to ctest's list (another build): no label
        if name not in labels:
            members[NO_LABEL] = members.get(NO_LABEL, 0) + 1
            ran[NO_LABEL] = ran.get(NO_LABEL, 0) + 1
            seconds[NO_LABEL] = seconds.get(NO_LABEL, 0.0) + times[name]
    problems = []
    if kinds:
        for name in sorted(times):
            folders = [l for l in labels.get(name, []) if kinds.get(l) == "folder"]
            if len(folders) != 1:
                problems.append(f"test {name}: {len(folders)} folder labels "
                                f"({', '.join(folders) or 'none'}); every test needs one")
    print(f"# test time per label ({len(times)} tests ran, {sum(times.values()):.1f} s in all; "
          f"ceilings from {SECTION})", file=out)
    print(f"# {'label':<12} {'tests':>9} {'seconds':>9} {'ceiling':>9}", file=out)
    order = [l for l in ceilings] + sorted(l for l in members if l not in ceilings)
    for label in order:
        n, total = ran.get(label, 0), seconds.get(label, 0.0)
        ceiling = ceilings.get(label)
        ceiling_text = "-" if label not in ceilings else ("TODO" if ceiling is None
                                                          else f"{ceiling:.0f}")
        mark = ""
        if ceiling is not None and total > ceiling:
            mark = "  OVER"
            problems.append(f"label {label}: {total:.1f} s, over its ceiling of {ceiling:.0f} s")
        elif label not in ceilings and label != NO_LABEL and n > 0:
            mark = "  NO ROW"
            problems.append(f"label {label}: {n} test(s) ran, but {SECTION} has no row for it")
        print(f"  {label:<12} {f'{n}/{members.get(label, 0)}':>9} {total:>9.1f} "
              f"{ceiling_text:>9}{mark}", file=out)
    return problems


def run(args, out=sys.stdout):
    build = os.path.abspath(args.build)
    log_path, log_text = None, None
    if args.junit:
        times = times_from_junit(args.junit)
    else:
        log_path = args.log or os.path.join(build, "Testing", "Temporary", "LastTest.log")
        log_text = read_log(log_path)
        times = times_from_log(log_text)
    if args.labels_json:
        try:
            with open(args.labels_json, encoding="utf-8") as f:
                labels = labels_from_json(f.read(), args.labels_json)
        except OSError as e:
            raise InputError(f"{args.labels_json}: cannot read: {e}")
    else:
        try:
            labels = labels_from_ctest(build)
        finally:
            # Every ctest call, --show-only too, rewrites the build's LastTest.log: put the
            # run's log back, so the check can be repeated.
            if log_path is not None:
                with open(log_path, "w", encoding="utf-8") as f:
                    f.write(log_text)
    kinds = {}
    ceilings = ceilings_from_doc(args.doc, kinds)
    problems = check(times, labels, ceilings, out, kinds)
    for p in problems:
        print(f"test_times: {p}", file=out)
    if not problems:
        print("test_times: ok, every label within its ceiling", file=out)
    return 1 if problems else 0


def self_test():
    """A fake doc, test list and run: label b is over its ceiling and must be named."""
    doc = f"""# Fake
{BEGIN}
| label | kind | tests | measured s | ceiling s |
|---|---|---|---|---|
| `a` | folder | 2 | 1.0 | 10 |
| `b` | launcher | 1 | 2.0 | 5 |
| `c` | folder | 1 | TODO | TODO |
{END}
"""
    labels = {"tests": [
        {"name": "a_one", "properties": [{"name": "LABELS", "value": ["a"]}]},
        {"name": "a_two", "properties": [{"name": "LABELS", "value": ["a", "b"]}]},
        {"name": "c_one", "properties": [{"name": "LABELS", "value": ["c"]}]},
        {"name": "loose", "properties": []},
    ]}
    junit = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="fake" tests="3">
  <testcase name="a_one" classname="a_one" time="3.0" status="run"/>
  <testcase name="a_two" classname="a_two" time="4.5" status="fail"/>
  <testcase name="c_one" classname="c_one" time="999" status="notrun"/>
</testsuite>
"""
    # c_one's ceiling is TODO: its 999 s are reported, not checked.
    log = "1/3 Testing: a_one\n1/3 Test: a_one\nTest time =   3.00 sec\n" \
          "2/3 Testing: a_two\n2/3 Test: a_two\nTest time =   4.50 sec\n" \
          "3/3 Testing: c_one\n3/3 Test: c_one\nTest time = 999.00 sec\n"
    ok = True
    with tempfile.TemporaryDirectory() as d:
        paths = {}
        for name, text in (("doc.md", doc), ("labels.json", json.dumps(labels)),
                           ("junit.xml", junit), ("LastTest.log", log)):
            paths[name] = os.path.join(d, name)
            with open(paths[name], "w") as f:
                f.write(text)

        def case(what, expect_rc, expect_text, **kw):
            nonlocal ok
            a = argparse.Namespace(build=d, junit=None, log=None, labels_json=paths["labels.json"],
                                   doc=paths["doc.md"])
            for k, v in kw.items():
                setattr(a, k, v)
            buf = _Buffer()
            try:
                rc = run(a, buf)
            except InputError as e:
                rc = 2
                buf.write(f"test_times: {e}\n")
            text = buf.text()
            print(text, end="")
            if rc != expect_rc or any(t not in text for t in expect_text):
                print(f"self-test: {what}: exit {rc} (expected {expect_rc}), expected text "
                      f"{expect_text}")
                ok = False

        # a = a_one + a_two = 7.5 s (ceiling 10), b (a launcher label) = a_two = 4.5 s
        # (ceiling 5); c_one did not run, nor did loose, which has no label. Then a_two
        # takes longer and b is over.
        case("junit, b within", 0, ["ok"], junit=paths["junit.xml"])
        over = junit.replace('time="4.5"', 'time="6.5"')
        with open(paths["junit.xml"], "w") as f:
            f.write(over)
        case("junit, b over", 1, ["label b: 6.5 s, over its ceiling of 5 s"],
             junit=paths["junit.xml"])
        case("LastTest.log, within", 0, ["ok"], log=paths["LastTest.log"])
        with open(paths["LastTest.log"], "w") as f:
            f.write(log.replace("4.50", "5.50"))
        case("LastTest.log, b over", 1, ["label b: 5.5 s, over"], log=paths["LastTest.log"])
        # Every test that ran needs exactly one folder label: loose has none, and a_two
        # with two (a and c) would count twice in the folder rows.
        with open(paths["LastTest.log"], "w") as f:
            f.write(log + "4/4 Testing: loose\n4/4 Test: loose\nTest time =   1.00 sec\n")
        case("a test without a folder label", 1, ["test loose: 0 folder labels (none)"],
             log=paths["LastTest.log"])
        two = json.loads(json.dumps(labels))
        two["tests"][1]["properties"][0]["value"] = ["a", "b", "c"]
        with open(paths["labels.json"], "w") as f:
            f.write(json.dumps(two))
        case("a test with two folder labels", 1, ["test a_two: 2 folder labels (a, c)"],
             log=paths["LastTest.log"])
        with open(paths["labels.json"], "w") as f:
            f.write(json.dumps(labels))
        with open(paths["LastTest.log"], "w") as f:
            f.write(log.replace("4.50", "5.50"))
        # A label of the run without a row in the doc fails, naming it.
        with open(paths["doc.md"], "w") as f:
            f.write(doc.replace("| `b` | launcher | 1 | 2.0 | 5 |\n", ""))
        case("a label without a row", 1, ["label b: 1 test(s) ran", "no row"],
             log=paths["LastTest.log"])
        # No table: bad input.
        with open(paths["doc.md"], "w") as f:
            f.write("# nothing\n")
        case("no table", 2, ["no table between"], log=paths["LastTest.log"])
        with open(paths["doc.md"], "w") as f:
            f.write(doc.replace("| `b` | launcher |", "| `b` | runner |"))
        case("an unknown kind", 2, ["label b: kind 'runner'"], log=paths["LastTest.log"])
    print("self-test: " + ("ok, an over-ceiling label fails and is named" if ok else "FAILED"))
    return 0 if ok else 1


class _Buffer:
    def __init__(self):
        self.parts = []

    def write(self, s):
        self.parts.append(s)

    def text(self):
        return "".join(self.parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"),
                        help="ctest's build directory (default: build/ of this repository)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--junit", help="the run's JUnit file (ctest --output-junit FILE)")
    source.add_argument("--log", help="ctest's LastTest.log (default: the build directory's)")
    parser.add_argument("--labels-json", help="ctest --show-only=json-v1 output (default: ask "
                        "ctest in the build directory)")
    parser.add_argument("--doc", default=os.path.join(ROOT, "docs", "ARCHITECTURE.md"),
                        help="the doc holding the table of ceilings")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    try:
        return run(args)
    except InputError as e:
        print(f"test_times: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
