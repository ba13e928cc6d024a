"""The repository stands alone: no file of it names a path outside the checkout.

Docs, scripts and code cite what they use by a path inside the repository (the micro benchmark
is ``contrib/bench-micro/bench.py``, the wire contract ``docs/protocol.md``), so a fresh clone on
another machine has everything they name. The files checked are those git knows about: tracked
ones plus new ones not ignored (``git ls-files --cached --others --exclude-standard``), as they
are in the working tree; binary files are skipped.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.any_database  # runs in the PostgreSQL pass only

ROOT = Path(__file__).resolve().parents[2]

# Written in pieces so that this file does not match itself.
OUTSIDE = re.compile(
    "|".join(re.escape(p) for p in (
        "/" + "work/",  # the machine's shared work area (where checkouts and team tools live)
        "../" + "shared",  # a sibling of the checkout
        "shared/" + "bench/",  # the benchmark's old home, named relative to the work area
        "shared/" + "spec/",  # the upstream protocol text (the repo's own is docs/protocol.md)
    ))
)


def repo_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()
    return sorted({ROOT / name for name in out.split("\0") if name})


def offending_lines(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):  # deleted in the working tree; a submodule
            continue
        if b"\0" in data[:8192]:
            continue  # binary
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{name}:{number}: {line.strip()[:160]}")
    return found


def test_the_checker_sees_the_repository_and_catches_an_outside_path(tmp_path):
    files = repo_files()
    names = {p.relative_to(ROOT).as_posix() for p in files}
    assert {"README.md", "manage.py", "contrib/bench-micro/bench.py", "docs/benchmarks.md"} <= names
    probe = tmp_path / "probe.md"
    probe.write_text("fine\nrun python3 /" + "work/x/bench.py\nsee ../" + "shared/x\n")
    assert [line.split(":")[1] for line in offending_lines([probe])] == ["2", "3"]


def test_no_tracked_file_names_a_path_outside_the_repository():
    found = offending_lines(repo_files())
    assert not found, "paths outside the repository (cite the in-repo copy instead):\n" + "\n".join(found)
