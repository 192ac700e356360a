#!/usr/bin/env python3
"""bench/record.py keeps a benchmark's RESULT lines with where they were measured: checked against a
command whose output and exit status are known, and one that prints no RESULT line."""
import json
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
record = os.path.join(root, "bench", "record.py")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what)


with tempfile.TemporaryDirectory() as out:
    script = ('echo "bench_fake: a table"; echo "RESULT fake_ratio=1.25 goal<=1.5 PASS"; '
              'echo "RESULT fake_speedup=0.75 goal>=1 MISS"; echo "RESULT not a result"; exit 3')
    run = subprocess.run([sys.executable, record, "--out", out, "--name", "bench_fake", "--build", out, "--",
                          "sh", "-c", script], capture_output=True, text=True)
    check(run.returncode == 3, f"the command's exit status is record.py's (got {run.returncode})")
    check("bench_fake: a table" in run.stdout and "RESULT fake_ratio=1.25" in run.stdout,
          "the command's output passes through")
    path = os.path.join(out, "bench_fake.json")
    check(os.path.isfile(path), "the results file is written")
    if os.path.isfile(path):
        with open(path) as f:
            data = json.load(f)
        check(data["program"] == "bench_fake", "program")
        check(data["results"] == [
            {"name": "fake_ratio", "value": 1.25, "op": "<=", "goal": 1.5, "verdict": "PASS"},
            {"name": "fake_speedup", "value": 0.75, "op": ">=", "goal": 1.0, "verdict": "MISS"},
        ], f"the RESULT lines, and only they (got {data['results']})")
        check(data["exit_status"] == 3, "exit status kept")
        check(data["command"][:2] == ["sh", "-c"], "command kept")
        check(data["machine"]["cpus"] == os.cpu_count() and data["machine"]["cpu"], "machine named")
        check(data["compiler"] is None, "no compiler where the build folder has no CMakeCache.txt")
        check(len(data["date"]) >= 20 and data["date"].endswith("+00:00"), "date in UTC")
        check(data["commit"] is None or len(data["commit"].split("-")[0]) == 40, "commit")

    # The page generated from the results: the program's section, its RESULT lines as rows; --check
    # agrees with what was written and not with a page edited by hand.
    table = os.path.join(root, "bench", "results_table.py")
    page = os.path.join(out, "benchmarks.md")
    run = subprocess.run([sys.executable, table, "--results", out, "--out", page], capture_output=True, text=True)
    check(run.returncode == 0 and os.path.isfile(page), f"results_table.py writes the page ({run.stderr})")
    if os.path.isfile(page):
        text = open(page).read()
        check("## bench_fake" in text, "a section per program")
        check("| `fake_ratio` | 1.25 | <= 1.5 | PASS |" in text, f"a row per RESULT line (got {text})")
        check("| `fake_speedup` | 0.75 | >= 1 | MISS |" in text, "a miss shown as a miss")
        check("exited with status 3" in text, "a failed run said so")
        run = subprocess.run([sys.executable, table, "--results", out, "--out", page, "--check"])
        check(run.returncode == 0, "--check: the page agrees with the results")
        with open(page, "a") as f:
            f.write("edited by hand\n")
        run = subprocess.run([sys.executable, table, "--results", out, "--out", page, "--check"],
                             capture_output=True, text=True)
        check(run.returncode == 1 and "make docs" in run.stderr, "--check: an edited page is refused")

    # No RESULT line: nothing written, the status passed on.
    run = subprocess.run([sys.executable, record, "--out", out, "--name", "bench_quiet", "--", "true"],
                         capture_output=True, text=True)
    check(run.returncode == 0, "status of a quiet command")
    check(not os.path.exists(os.path.join(out, "bench_quiet.json")), "a run without RESULT lines writes nothing")
    # A bad name is refused with a message.
    run = subprocess.run([sys.executable, record, "--out", out, "--name", "../x", "--", "true"],
                         capture_output=True, text=True)
    check(run.returncode == 2 and "--name" in run.stderr, "a name with a path is refused")

print("record_test:", "FAILED" if failures else "ok")
sys.exit(1 if failures else 0)
