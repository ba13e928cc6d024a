"""Helpers of the operations tests: throwaway databases, a superuser, an admin login over HTTP."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import httpx

from tests.e2e.fleet_processes import PY, ROOT, base_env
from tests.services import fresh_database, suite_is_postgres  # noqa: F401  (re-exported)

PASSWORD = "s3cret-pass-for-tests"


def create_superuser(db_url: str, data_dir: Path, username: str = "ops") -> None:
    """``manage.py createsuperuser --noinput`` with the fleet's DATABASE_URL and WORLDCELL_DATA_DIR (README.md)."""
    env = base_env(db_url, "unused", data_dir, DJANGO_SUPERUSER_USERNAME=username,
                   DJANGO_SUPERUSER_EMAIL=f"{username}@example.com", DJANGO_SUPERUSER_PASSWORD=PASSWORD)
    subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run([PY, "manage.py", "createsuperuser", "--noinput"], cwd=ROOT, env=env, check=True,
                   capture_output=True)


def _csrf_field(html: str) -> str:
    m = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert m, "no csrfmiddlewaretoken on the login page"
    return m.group(1)


def admin_login(url: str, username: str = "ops", *, origin: str | None = None, client: httpx.Client | None = None,
                cookies: dict[str, str] | None = None) -> tuple[httpx.Response, dict[str, str]]:
    """Log in to ``url``/admin/ with the login form; ``(POST response, cookies)``.

    Cookies are carried by hand (``cookies`` dict) so ``Secure`` cookies set
    behind a TLS-terminating proxy still travel over the test's plain HTTP.
    ``origin`` is the public origin the browser would send (default ``url``).
    """
    origin = origin or url
    jar: dict[str, str] = dict(cookies or {})
    c = client or httpx.Client(timeout=20)

    def _keep(resp: httpx.Response) -> None:
        for header in resp.headers.get_list("set-cookie"):
            name, _, rest = header.partition("=")
            jar[name.strip()] = rest.split(";", 1)[0]

    def _cookie_header() -> dict[str, str]:
        return {"Cookie": "; ".join(f"{k}={v}" for k, v in jar.items())} if jar else {}

    page = c.get(f"{url}/admin/login/?next=/admin/", headers=_cookie_header())
    assert page.status_code == 200, page.text[:300]
    _keep(page)
    resp = c.post(
        f"{url}/admin/login/?next=/admin/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": _csrf_field(page.text), "next": "/admin/"},
        headers={"Origin": origin, "Referer": f"{origin}/admin/login/", **_cookie_header()},
    )
    _keep(resp)
    return resp, jar


def cookie_header(jar: dict[str, str]) -> dict[str, str]:
    return {"Cookie": "; ".join(f"{k}={v}" for k, v in jar.items())}
