"""The shipped process definitions (contrib/systemd, Procfile) start the same commands README.md documents."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.any_database  # runs in the PostgreSQL pass only

ROOT = Path(__file__).resolve().parents[2]
UNITS = {name: ROOT / "contrib" / "systemd" / f"worldcell-{name}.service" for name in ("api", "worker", "beat")}


def _directives(path: Path) -> dict[str, list[str]]:
    text = path.read_text().replace("\\\n", " ")
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z]+)=(.*)$", line.strip())
        if m:
            out.setdefault(m.group(1), []).append(" ".join(m.group(2).split()))
    return out


@pytest.mark.parametrize("name", list(UNITS))
def test_units_restart_always_and_run_the_documented_command(name):
    d = _directives(UNITS[name])
    assert d["Restart"] == ["always"]
    assert d["EnvironmentFile"] == ["/etc/worldcell/worldcell.env"]
    exec_start = d["ExecStart"][0]
    expected = {"api": "--call worldcell.wsgi:checked_application",
                "worker": "celery -A worldcell worker --pool threads",
                "beat": "celery -A worldcell beat"}[name]
    assert expected in exec_start
    readme = " ".join((ROOT / "README.md").read_text().replace("\\\n", " ").split())
    assert expected in readme, f"README.md does not document {expected!r}"
    assert expected in (ROOT / "Procfile").read_text()


def _waitress_flags(text: str) -> list[str]:
    """The options of the (first) waitress-serve command in ``text``, without ``--listen``'s value."""
    line = " ".join(text.replace("\\\n", " ").split())
    m = re.search(r"waitress-serve (.*?--call \S+)", line)
    assert m, "no waitress-serve command"
    words = m.group(1).split()
    return [w for i, w in enumerate(words) if w != "--listen" and (i == 0 or words[i - 1] != "--listen")]


def test_the_api_unit_and_procfile_run_waitress_with_the_readmes_flags():
    readme = _waitress_flags((ROOT / "README.md").read_text())
    assert "--max-request-body-size" in readme and "--channel-timeout" in readme
    assert _waitress_flags(UNITS["api"].read_text()) == readme
    assert _waitress_flags((ROOT / "Procfile").read_text()) == readme


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_units_pass_systemd_analyze_verify(tmp_path):
    for name, unit in UNITS.items():
        (tmp_path / unit.name).write_text(unit.read_text().replace("/opt/worldcell", str(ROOT)))
    venv_bin = ROOT / ".venv" / "bin"
    if not (venv_bin / "gunicorn").exists():
        pytest.skip("the project's .venv is not installed here")
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", *sorted(map(str, tmp_path.glob("*.service")))],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
