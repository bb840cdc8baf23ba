#!/usr/bin/env python3
"""Runs the code blocks of README.md, examples/README.md and docs/*.md
against a build, as a reader would paste them.

Blocks fenced as sh, cpp and python run; others (output, JSON, CMake lines)
are shown, not run. An HTML comment on the line before a fence says how:

  <!-- snippet: skip: REASON -->          not run; the reason is printed
  <!-- snippet: compile-only: REASON -->  C++: compiled and linked, not run
  <!-- snippet: continues -->             C++: the same program as the
                                           previous cpp block of the page

sh blocks run with bash -euo pipefail, in a scratch directory whose build/,
examples/, tests/, python/ and scripts/ are the repository's (so relative
paths work and nothing is written into the tree), with the build's bin/
first on a plain Debian PATH and PYTHONPATH at the build's package, under
a time bound. cpp blocks without a main() are wrapped in one (after
`#include <normgrad/normgrad.hpp>` and `using namespace normgrad;`), built
against the build installed into a scratch prefix (`cmake --install`), and
run. python blocks run with
/usr/bin/python3.

Usage: doc_snippets.py --source DIR --build DIR [--only FILE] [--list]
Exit status: 0 when every block that runs passed, 1 otherwise, 77 (skipped)
under NORMGRAD_JIT (CI's emulated-ISA passes: the pages run once).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time

RUN_LANGS = ("sh", "cpp", "python")
MARK = re.compile(r"<!--\s*snippet:\s*(skip|compile-only|continues)\s*:?\s*(.*?)\s*-->")


class Block:
    def __init__(self, page, line, lang, text, mark, reason):
        self.page, self.line, self.lang, self.text = page, line, lang, text
        self.mark, self.reason = mark, reason

    def where(self):
        return "%s:%d (%s)" % (self.page, self.line, self.lang)


def blocks_of(path, rel):
    """The fenced blocks of one page, with the mark on the line before each."""
    out, lines = [], open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        mark = reason = None
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k >= 0:
            mm = MARK.search(lines[k])
            if mm:
                mark, reason = mm.group(1), mm.group(2)
        indent = len(lines[start]) - len(lines[start].lstrip())
        body = "\n".join(l[indent:] if l[:indent].isspace() else l for l in lines[start + 1:j])
        out.append(Block(rel, start + 1, lang, body, mark, reason))
        i = j + 1
    return out


def scratch_dir(source, build):
    # The pages write to /tmp/ng, /tmp/consumer, ...; each run gets its own
    # copy of /tmp (see private_tmp), so another clone's CMake cache there, or
    # a concurrent run, cannot meet this one.
    d = os.path.join(build, "doc-snippets")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for name in ("examples", "tests", "python", "scripts", "docs"):
        os.symlink(os.path.join(source, name), os.path.join(d, name))
    os.symlink(build, os.path.join(d, "build"))
    return d


def environment(build):
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.join(build, "bin"), "/usr/local/bin", "/usr/bin",
                                   "/bin"])
    env["PYTHONPATH"] = os.path.join(build, "python")
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def private_tmp(text, work):
    """A shell snippet with its /tmp/ paths moved under this run's scratch
    directory."""
    tmp = os.path.join(work, "tmp")
    os.makedirs(tmp, exist_ok=True)
    return re.sub(r"(?<![\w/])/tmp/", tmp + "/", text)


def run(cmd, cwd, env, bound, stdin=None):
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, input=stdin, capture_output=True, text=True,
                           timeout=bound)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or "") + (e.stderr or "")
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        return 124, out + "\n(still running after %d s)" % bound


def cpp_program(text):
    if re.search(r"\bint\s+main\s*\(", text):
        return text
    return ("#include <normgrad/normgrad.hpp>\n#include <cstdio>\n#include <vector>\n"
            "using namespace normgrad;\n\nint main() {\n" + text + "\n  return 0;\n}\n")


def install(build, work):
    """The build installed into a scratch prefix: C++ snippets build against
    it, as a user's program does after `cmake --install`."""
    prefix = os.path.join(work, "prefix")
    rc, out = run(["cmake", "--install", build, "--prefix", prefix], work, None, 300)
    if rc != 0:
        raise SystemExit("doc snippets: cmake --install failed:\n" + out)
    libs = [os.path.dirname(p) for p in glob.glob(os.path.join(prefix, "lib*", "**",
                                                               "libnormgrad.so"), recursive=True)]
    return os.path.join(prefix, "include"), libs[0]


def build_cpp(source_text, prefix, work, name):
    include, lib = prefix
    src = os.path.join(work, name + ".cpp")
    exe = os.path.join(work, name)
    with open(src, "w") as f:
        f.write(source_text)
    cmd = ["c++", "-std=c++17", "-O1", "-I", include, src, "-o", exe, "-L" + lib,
           "-Wl,-rpath," + lib, "-lnormgrad"]
    mpi = shutil.which("mpicxx")
    if "mpi" in source_text.lower() and mpi:
        cmd[0] = mpi
    rc, out = run(cmd, work, None, 300)
    return exe if rc == 0 else None, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--only", help="one page (README.md, docs/cli.md, ...)")
    ap.add_argument("--list", action="store_true", help="list the blocks and what is done")
    ap.add_argument("--bound", type=int, default=600, help="seconds per block")
    args = ap.parse_args(argv)
    if os.environ.get("NORMGRAD_JIT") and not args.list:
        print("doc snippets: skipped under NORMGRAD_JIT=%s: the pages are run once, on the "
              "host's own path" % os.environ["NORMGRAD_JIT"])
        return 77
    source, build = os.path.abspath(args.source), os.path.abspath(args.build)
    pages = ["README.md", "examples/README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(source, "docs"))
                                   if f.endswith(".md"))
    if args.only:
        pages = [args.only]
    env = environment(build)
    work = scratch_dir(source, build)
    failed, ran, skipped = [], 0, 0
    prefix = None
    try:
        for page in pages:
            program = None  # the C++ program a `continues` block adds to
            for b in blocks_of(os.path.join(source, page), page):
                if b.lang not in RUN_LANGS:
                    continue
                if b.mark == "skip":
                    skipped += 1
                    print("skip %s: %s" % (b.where(), b.reason), flush=True)
                    continue
                if args.list:
                    print("run  %s%s" % (b.where(), " (%s)" % b.mark if b.mark else ""))
                    continue
                t0 = time.monotonic()
                if b.lang == "sh":
                    rc, out = run(["bash", "-euo", "pipefail", "-c", private_tmp(b.text, work)],
                                  work, env, args.bound)
                elif b.lang == "python":
                    rc, out = run(["/usr/bin/python3", "-"], work, env, args.bound, stdin=b.text)
                else:
                    if b.mark == "continues" and program is not None:
                        program = program + "\n" + b.text
                    else:
                        program = b.text
                    name = "snippet_%s_%d" % (re.sub(r"\W", "_", page), b.line)
                    prefix = prefix or install(build, work)
                    exe, out = build_cpp(cpp_program(program), prefix, work, name)
                    rc = 0 if exe else 1
                    if exe and b.mark != "compile-only":
                        rc, out = run([exe], work, env, args.bound)
                ran += 1
                status = "ok  " if rc == 0 else "FAIL"
                print("%s %s %.1fs%s" % (status, b.where(), time.monotonic() - t0,
                                         " (compiled only: %s)" % b.reason
                                         if b.mark == "compile-only" else ""), flush=True)
                if rc != 0:
                    failed.append(b)
                    print("---- %s\n%s\n---- output (exit %d):\n%s" % (b.where(), b.text, rc,
                                                                     out[-4000:]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.list:
        return 0
    print("doc snippets: %d ran, %d failed, %d skipped with a reason" % (ran, len(failed), skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
