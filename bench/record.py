#!/usr/bin/env python3
"""Runs one benchmark command and keeps its RESULT lines as data, with where they were measured.

    python3 bench/record.py [--out DIR] [--name NAME] [--build DIR] -- COMMAND [ARGS...]

The command runs as it would alone (its output passes through, its exit status is record.py's); the
lines it prints of the form `RESULT <name>=<value> goal<op><goal> PASS|MISS` are then written to
DIR/NAME.json (default DIR: bench/results beside this script; NAME: the command's file name without
its extension), replacing the last run's file, with:
  - date (UTC), the git commit of this tree (with "-dirty" when it has uncommitted changes);
  - the machine: CPU model and count of CPUs (lscpu, nproc), GPUs (nvidia-smi), the OS;
  - the compiler the benchmark was built with (CMAKE_CXX_COMPILER of --build DIR's CMakeCache.txt,
    default build-release; its first --version line);
  - the command, its exit status and how long it ran.
A number then exists in one place: the documents are generated from these files, and git keeps their
history. A run that prints no RESULT line writes no file.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

RESULT = re.compile(r"^RESULT (\S+)=(\S+) goal(<=|>=)(\S+) (PASS|MISS)\s*$")


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


def parse_results(lines):
    results = []
    for line in lines:
        m = RESULT.match(line)
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
    parser.add_argument("--out", default=os.path.join(here, "results"), help="the results folder")
    parser.add_argument("--name", help="the file's name (default: the command's file name)")
    parser.add_argument("--build", default=os.path.join(root, "build-release"),
                        help="the build folder whose compiler built the benchmark")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    options = parser.parse_args(argv)
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
    os.makedirs(options.out, exist_ok=True)
    path = os.path.join(options.out, name + ".json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    print(f"record.py: {len(results)} RESULT line(s) of {name} written to {os.path.relpath(path)}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
