#!/usr/bin/env python3
"""Runs one benchmark command and keeps its RESULT lines as data, with where they were measured.

    python3 bench/record.py [--out DIR] [--name NAME] [--build DIR] -- COMMAND [ARGS...]
    python3 bench/record.py --from-log FILE --program NAME --date DATE --machine-cpu MODEL --cpus N
                            [--gpu "NAME, MEMORY"]... [--compiler TEXT] [--commit HASH] [--os TEXT]
                            [--command "COMMAND"] --source TEXT [--out DIR]

The command runs as it would alone (its output passes through, its exit status is record.py's); the
lines it prints of the form `RESULT <name>=<value> goal<op><goal> PASS|MISS` are then written to
DIR/NAME.json (default DIR: bench/results beside this script, or bench/results/<gpu>/ on a machine
with a GPU, <gpu> the first GPU's model such as h100, so that a CPU and a GPU run of one program both
keep a file; NAME: the command's file name without its extension), replacing the last run's file, with:
  - date (UTC), the git commit of this tree (with "-dirty" when it has uncommitted changes);
  - the machine: CPU model and count of CPUs (lscpu, nproc), GPUs (nvidia-smi), the OS;
  - the compiler the benchmark was built with (CMAKE_CXX_COMPILER of --build DIR's CMakeCache.txt,
    default build-release; its first --version line);
  - the command, its exit status and how long it ran.
A number then exists in one place: the documents are generated from these files, and git keeps their
history. A run that prints no RESULT line writes no file.

--from-log imports a run that was not recorded this way: the RESULT lines found in FILE ("-": standard
input; text pasted from a run's output, one run of one program: a name twice is refused), with the
date, machine, compiler and commit given (the commit "unknown" unless given; never guessed), and a
field "source": "imported: TEXT" saying where the lines were kept. Nothing is run. A RESULT line may
carry a comment after its verdict; any other line is ignored.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time

RESULT = re.compile(r"^RESULT (\S+)=(\S+) goal(<=|>=)(\S+) (PASS|MISS)\s*$")
# A RESULT line as pasted into a log: indented, or followed by a comment ("(second run: 2.249 PASS)").
LOGGED = re.compile(r"^\s*RESULT (\S+)=(\S+) goal(<=|>=)(\S+) (PASS|MISS)(?:\s.*)?$")


def run_text(args, cwd=None):
    """What `args` prints, stripped; "" when it cannot run or fails."""
    try:
        out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def number(text):
    try:
        return float(text)
    except ValueError:
        return text  # kept as printed (e.g. "nan")


def parse_results(lines, pattern=RESULT):
    results = []
    for line in lines:
        m = pattern.match(line)
        if m:
            results.append({"name": m.group(1), "value": number(m.group(2)), "op": m.group(3),
                            "goal": number(m.group(4)), "verdict": m.group(5)})
    return results


def cpu_model():
    for line in run_text(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def gpus():
    if not shutil.which("nvidia-smi"):
        return []
    text = run_text(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    return [line.strip() for line in text.splitlines() if line.strip()]


def compiler(build):
    cache = os.path.join(build, "CMakeCache.txt")
    if not os.path.isfile(cache):
        return None
    with open(cache, errors="replace") as f:
        for line in f:
            if line.startswith("CMAKE_CXX_COMPILER:"):
                path = line.split("=", 1)[1].strip()
                version = run_text([path, "--version"])
                return version.splitlines()[0] if version else path
    return None


def gpu_folder(gpus):
    """The results folder of a machine with these GPUs: "" without one, else the first GPU's model,
    e.g. "NVIDIA H100 80GB HBM3, 81559 MiB" -> "h100"."""
    if not gpus:
        return ""
    name = gpus[0].split(",")[0].strip()
    name = re.sub(r"^nvidia\s+", "", name, flags=re.IGNORECASE)
    word = name.split()[0] if name.split() else ""
    return re.sub(r"[^a-z0-9_.-]", "", word.lower()) or "gpu"


def write_record(record, out):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, record["program"] + ".json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


def commit(root):
    head = run_text(["git", "-C", root, "rev-parse", "HEAD"])
    if not head:
        return None
    dirty = run_text(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"])
    return head + ("-dirty" if dirty else "")


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the results folder (default: bench/results, or bench/results/<gpu>/ "
                        "where there is a GPU)")
    parser.add_argument("--name", help="the file's name (default: the command's file name)")
    parser.add_argument("--build", default=os.path.join(root, "build-release"),
                        help="the build folder whose compiler built the benchmark")
    log = parser.add_argument_group("--from-log: import a run's RESULT lines kept as text (nothing is run)")
    log.add_argument("--from-log", metavar="FILE", help='the text with the RESULT lines ("-": standard input)')
    log.add_argument("--program", help="the program that printed them (the file's name)")
    log.add_argument("--date", help="when it ran, as the text gives it: YYYY-MM-DD, or an ISO date and time")
    log.add_argument("--machine-cpu", help='the CPU model as the text gives it (e.g. "AMD EPYC"; "unknown")')
    log.add_argument("--cpus", type=int, help="the machine's count of CPUs")
    log.add_argument("--gpu", action="append", default=[], help='a GPU, "NAME, MEMORY" as nvidia-smi gives it')
    log.add_argument("--compiler", default="unknown", help="the compiler the program was built with")
    log.add_argument("--commit", default="unknown", help='the commit measured ("unknown" unless the text gives it)')
    log.add_argument("--os", default="unknown", help="the operating system")
    log.add_argument("--command", dest="log_command", help="the command that ran, where the text gives it")
    log.add_argument("--source", help='where the lines were kept: stored as "imported: SOURCE"')
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    options = parser.parse_args(argv)
    if options.from_log is not None:
        return import_log(parser, options, here)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("no command given: bench/record.py [options] -- COMMAND [ARGS...]")
    name = options.name or os.path.splitext(os.path.basename(command[0]))[0]
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        parser.error(f"--name {name!r}: use letters, digits, '_', '.' and '-' only")

    started = time.monotonic()
    date = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    lines = []
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=None, text=True, bufsize=1)
    except OSError as e:
        print(f"record.py: cannot run {command[0]}: {e}", file=sys.stderr)
        return 127
    for line in process.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line.rstrip("\n"))
    status = process.wait()
    seconds = round(time.monotonic() - started, 1)

    results = parse_results(lines)
    if not results:
        print(f"record.py: {name} printed no RESULT line; nothing written", file=sys.stderr)
        return status
    record = {
        "program": name,
        "date": date,
        "commit": commit(root),
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "gpus": gpus(),
                    "os": platform.platform()},
        "compiler": compiler(options.build),
        "command": command,
        "exit_status": status,
        "seconds": seconds,
        "results": results,
    }
    out = options.out or os.path.join(here, "results", gpu_folder(record["machine"]["gpus"]))
    path = write_record(record, out)
    print(f"record.py: {len(results)} RESULT line(s) of {name} written to {os.path.relpath(path)}", file=sys.stderr)
    return status


def import_log(parser, options, here):
    """--from-log: the RESULT lines of a kept text, as a results file with the given provenance."""
    if options.command and options.command != ["--"]:
        parser.error("--from-log runs nothing: give no command")
    missing = [flag for flag, value in (("--program", options.program), ("--date", options.date),
                                        ("--machine-cpu", options.machine_cpu), ("--cpus", options.cpus),
                                        ("--source", options.source)) if value is None]
    if missing:
        parser.error("--from-log needs " + ", ".join(missing))
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", options.program):
        parser.error(f"--program {options.program!r}: use letters, digits, '_', '.' and '-' only")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}([T ][0-9:]+(\+00:00|Z)?)?", options.date):
        parser.error(f"--date {options.date!r}: YYYY-MM-DD, or YYYY-MM-DDTHH:MM[:SS][+00:00]")
    try:
        datetime.date.fromisoformat(options.date[:10])
    except ValueError:
        parser.error(f"--date {options.date!r} is not a date of the calendar")
    if options.cpus < 1:
        parser.error("--cpus must be at least 1")
    try:
        if options.from_log == "-":
            lines = sys.stdin.read().splitlines()
        else:
            with open(options.from_log, errors="replace") as f:
                lines = f.read().splitlines()
    except OSError as e:
        print(f"record.py: cannot read {options.from_log}: {e}", file=sys.stderr)
        return 2
    results = parse_results(lines, LOGGED)
    if not results:
        print(f"record.py: no RESULT line in {options.from_log}; nothing written", file=sys.stderr)
        return 1
    names = [r["name"] for r in results]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        print(f"record.py: {', '.join(twice)} more than once in {options.from_log}: paste one run only; "
              "nothing written", file=sys.stderr)
        return 1
    not_numbers = [f"{r['name']}={r['value']} goal{r['op']}{r['goal']}" for r in results
                   if not isinstance(r["value"], float) or not isinstance(r["goal"], float)]
    if not_numbers:
        print(f"record.py: not numbers in {options.from_log}: {'; '.join(not_numbers)}; nothing written", file=sys.stderr)
        return 1
    for r in results:
        v, g = r["value"], r["goal"]
        if isinstance(v, float) and isinstance(g, float):
            holds = v <= g if r["op"] == "<=" else v >= g
            if holds != (r["verdict"] == "PASS"):
                print(f"record.py: warning: {r['name']}={v} goal{r['op']}{g} says {r['verdict']}; kept as printed",
                      file=sys.stderr)
    source = options.source if options.source.startswith("imported:") else "imported: " + options.source
    record = {
        "program": options.program,
        "date": options.date,
        "commit": options.commit,
        "machine": {"cpu": options.machine_cpu, "cpus": options.cpus, "gpus": options.gpu, "os": options.os},
        "compiler": options.compiler,
        "command": shlex.split(options.log_command) if options.log_command else None,
        "exit_status": None,
        "seconds": None,
        "source": source,
        "results": results,
    }
    out = options.out or os.path.join(here, "results", gpu_folder(options.gpu))
    existing = os.path.join(out, options.program + ".json")
    if os.path.isfile(existing):
        try:
            newer = json.load(open(existing)).get("date", "")[:10] > options.date[:10]
        except (OSError, ValueError):
            newer = False
        if newer:
            print(f"record.py: {os.path.relpath(existing)} holds a later run than {options.date}; nothing written "
                  "(remove it first to replace it)", file=sys.stderr)
            return 1
    path = write_record(record, out)
    print(f"record.py: {len(results)} RESULT line(s) of {options.program} imported into {os.path.relpath(path)}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
