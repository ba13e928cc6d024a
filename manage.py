#!/usr/bin/env python3
"""worldcell's Django command-line entry point.

On a fresh clone, ``python3 manage.py <command>`` first makes sure the project's
dependencies are importable: if Django is missing it creates ``.venv`` next to
this file, installs the project into it (``pip install -e .``) and re-runs the
same command with the virtualenv's interpreter. Set ``WORLDCELL_NO_BOOTSTRAP=1``
to turn that off (e.g. when you manage your own environment).
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def _bootstrap_virtualenv() -> None:
    """Create ``.venv`` and install the project into it, then re-exec there.

    Raises SystemExit with pip's exit code when the install fails.
    """
    venv = ROOT / ".venv"
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if python.exists() and Path(sys.prefix).resolve() == venv.resolve():
        return  # already inside the project's virtualenv; let the import error surface
    if not python.exists():
        print(f"worldcell: creating {venv} (first run)", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
    marker = venv / ".worldcell-installed"
    pyproject = ROOT / "pyproject.toml"
    if not marker.exists() or marker.stat().st_mtime < pyproject.stat().st_mtime:
        print("worldcell: installing dependencies into .venv", file=sys.stderr)
        rc = subprocess.call([str(python), "-m", "pip", "install", "-q", "-e", f"{ROOT}[dev]"])
        if rc != 0:
            raise SystemExit(rc)
        marker.touch()
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])


def main() -> None:
    """Run a Django management command (``python3 manage.py help`` lists them)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "worldcell.settings")
    try:
        import django  # noqa: F401
    except ImportError:
        if os.environ.get("WORLDCELL_NO_BOOTSTRAP"):
            raise
        _bootstrap_virtualenv()
        raise
    from django.core.management import execute_from_command_line
    from django.db.utils import OperationalError

    try:
        execute_from_command_line(sys.argv)
    except OperationalError as exc:
        if "--traceback" in sys.argv or not _is_connection_error(exc):
            raise
        from worldcell.startup import EXIT_CONFIG, describe_database_error

        # one line instead of a traceback (README.md "PostgreSQL"); --traceback shows it all
        print(f"worldcell: {describe_database_error(exc)}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None


def _is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be opened (not a failing query)."""
    text = str(exc)
    return any(s in text for s in ("connection failed", "could not connect", "Connection refused",
                                   "does not exist", "unable to open database file", "password authentication"))


if __name__ == "__main__":
    main()
