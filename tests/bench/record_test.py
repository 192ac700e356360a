#!/usr/bin/env python3
"""bench/record.py keeps a benchmark's RESULT lines with where they were measured: checked against a
command whose output and exit status are known, one that prints no RESULT line, and a run kept as text
(--from-log); bench/results_table.py's page and the README's headline table generated from them."""
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

    # --from-log: a run kept as text, imported with the provenance given; a GPU machine's run in its own
    # folder beside the CPU machine's file of the same program, and both on the page, a table each.
    log = os.path.join(out, "pasted.txt")
    with open(log, "w") as f:
        f.write("bench_fake: a table\n  RESULT fake_ratio=1.5 goal<=1.5 PASS   (a comment)\n"
                "RESULT fake_gpu=7 goal>=5 PASS\nRESULT fake_ratio=1.0 / 2.0 (two runs, not a RESULT line)\n")
    run = subprocess.run([sys.executable, record, "--from-log", log, "--program", "bench_fake", "--date", "2026-11-26",
                          "--machine-cpu", "unknown", "--cpus", "16", "--gpu", "NVIDIA H100 80GB HBM3, 81559 MiB",
                          "--source", "printed by a GPU round, kept in a log", "--out", os.path.join(out, "h100")],
                         capture_output=True, text=True)
    check(run.returncode == 0, f"--from-log imports ({run.stderr})")
    path = os.path.join(out, "h100", "bench_fake.json")
    if os.path.isfile(path):
        with open(path) as f:
            data = json.load(f)
        check(data["results"] == [
            {"name": "fake_ratio", "value": 1.5, "op": "<=", "goal": 1.5, "verdict": "PASS"},
            {"name": "fake_gpu", "value": 7.0, "op": ">=", "goal": 5.0, "verdict": "PASS"},
        ], f"--from-log: the RESULT lines, a comment after one ignored (got {data['results']})")
        check(data["source"] == "imported: printed by a GPU round, kept in a log", "source kept")
        check(data["commit"] == "unknown" and data["date"] == "2026-11-26", "commit unknown unless given; date as given")
        check(data["machine"]["gpus"] == ["NVIDIA H100 80GB HBM3, 81559 MiB"] and data["machine"]["cpus"] == 16, "machine")
    else:
        check(False, "--from-log wrote h100/bench_fake.json")
    twice = os.path.join(out, "twice.txt")
    with open(twice, "w") as f:
        f.write("RESULT a=1 goal<=2 PASS\nRESULT a=3 goal<=2 MISS\n")
    run = subprocess.run([sys.executable, record, "--from-log", twice, "--program", "bench_two", "--date", "2026-11-26",
                          "--machine-cpu", "AMD EPYC", "--cpus", "2", "--source", "x", "--out", out],
                         capture_output=True, text=True)
    check(run.returncode == 1 and "one run" in run.stderr and not os.path.exists(os.path.join(out, "bench_two.json")),
          "--from-log: two runs pasted together are refused")
    run = subprocess.run([sys.executable, record, "--from-log", log, "--program", "bench_fake", "--out", out],
                         capture_output=True, text=True)
    check(run.returncode == 2 and "--date" in run.stderr, "--from-log: the date and machine are required")
    sys.path.insert(0, os.path.join(root, "bench"))
    import record as record_module  # noqa: E402
    check(record_module.gpu_folder([]) == "" and record_module.gpu_folder(["NVIDIA H200, 143771 MiB"]) == "h200"
          and record_module.gpu_folder(["NVIDIA H100 80GB HBM3, 81559 MiB"]) == "h100",
          "a GPU machine's default folder is named by its GPU")

    run = subprocess.run([sys.executable, table, "--results", out, "--out", page], capture_output=True, text=True)
    text = open(page).read() if os.path.isfile(page) else ""
    check(text.count("## bench_fake\n") == 1 and text.count("\n### ") == 2,
          f"one section a program, one table a machine (got {text})")
    check("### NVIDIA H100 80GB HBM3, 81559 MiB; 16 CPUs (model not recorded); 2026-11-26" in text,
          "the machine and date said once, in the table's heading")
    check("_Imported: printed by a GPU round, kept in a log._" in text, "an imported run says where it was kept")
    check("| `fake_gpu` | 7 | >= 5 | PASS |" in text, "the GPU run's rows")

    # The headline table: written between the README's markers, checked by --check, and a README without
    # the markers is left alone (--check --require-headline refuses it).
    readme = os.path.join(out, "README.md")
    with open(readme, "w") as f:
        f.write("# Title\n\n<!-- headline:begin -->\nold\n<!-- headline:end -->\n\nrest\n")
    sys.path.insert(0, os.path.join(root, "bench"))
    import results_table  # noqa: E402
    results_table.HEADLINES[:] = [("fake_ratio", "cpu", "what the fake ratio says"),
                                  ("fake_gpu", "gpu", "what the fake GPU result says")]
    records = results_table.load(out)
    block = results_table.headline(records)
    header = block[block.index("| result |"):].split("\n")[0]
    check(header.startswith("| result | what it says | goal | ") and "NVIDIA H100 80GB HBM3" in header,
          f"a column a machine, named once in the heading (got {header})")
    columns = [c.strip() for c in header.strip("|").split("|")]
    ratio_row = next((l for l in block.split("\n") if l.startswith("| `fake_ratio` |")), "")
    gpu_row = next((l for l in block.split("\n") if l.startswith("| `fake_gpu` |")), "")
    ratio_cells = [c.strip() for c in ratio_row.strip("|").split("|")]
    gpu_cells = [c.strip() for c in gpu_row.strip("|").split("|")]
    check(ratio_cells[:3] == ["`fake_ratio`", "what the fake ratio says", "<= 1.5"] and
          any(c.startswith("1.25 PASS (") for c in ratio_cells[3:]),
          f"a headline row: name, meaning, goal, then value and verdict under its machine (got {ratio_row})")
    check(len(gpu_cells) == len(columns) and
          gpu_cells[columns.index("NVIDIA H100 80GB HBM3")] == "7 PASS (2026-11-26)",
          f"the GPU result in its machine's column, with its date (got {gpu_row})")
    new = results_table.with_headline(open(readme).read(), block)
    check(new is not None and new.startswith("# Title\n\n<!-- headline:begin -->\n") and new.endswith(
          "<!-- headline:end -->\n\nrest\n") and "old" not in new, "the block replaced, the rest kept")
    check(results_table.with_headline("no markers\n", block) is None, "no markers: nothing replaced")
    run = subprocess.run([sys.executable, table, "--results", out, "--out", page, "--readme", readme],
                         capture_output=True, text=True)
    check(run.returncode == 0 and "headline:begin -->\n<!-- generated" in open(readme).read(),
          f"results_table.py writes the headline ({run.stderr})")
    run = subprocess.run([sys.executable, table, "--results", out, "--out", page, "--readme", readme, "--check",
                          "--require-headline"], capture_output=True, text=True)
    check(run.returncode == 0, f"--check: the headline agrees ({run.stderr})")
    with open(readme) as f:
        edited = f.read().replace("<!-- headline:end -->", "edited by hand\n<!-- headline:end -->")
    with open(readme, "w") as f:
        f.write(edited)
    run = subprocess.run([sys.executable, table, "--results", out, "--out", page, "--readme", readme, "--check"],
                         capture_output=True, text=True)
    check(run.returncode == 1 and "headline" in run.stderr, "--check: a headline edited by hand is refused")
    with open(readme, "w") as f:
        f.write("# Title\n\nno markers\n")
    run = subprocess.run([sys.executable, table, "--results", out, "--out", page, "--readme", readme],
                         capture_output=True, text=True)
    check(run.returncode == 0 and open(readme).read() == "# Title\n\nno markers\n" and "no headline markers" in run.stderr,
          "a README without the markers is left alone, saying so")
    run = subprocess.run([sys.executable, table, "--results", out, "--out", page, "--readme", readme, "--check"],
                         capture_output=True, text=True)
    check(run.returncode == 0, "--check without the markers: the page only")
    run = subprocess.run([sys.executable, table, "--results", out, "--out", page, "--readme", readme, "--check",
                          "--require-headline"], capture_output=True, text=True)
    check(run.returncode == 1 and "no headline markers" in run.stderr, "--require-headline: missing markers refused")

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
