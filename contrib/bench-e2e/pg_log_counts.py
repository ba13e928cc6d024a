#!/usr/bin/env python3
"""Transactions and statements per run, by client role and by shape, from a ``BENCH_PG_LOG=1`` round.

    python3 contrib/bench-e2e/pg_log_counts.py <run dir>/pg/postgres.log --runs 220 [--top 40]

The log's lines start ``<time>|<application_name>|<backend pid>|<xid>|`` (run.sh sets
``log_line_prefix``; worldcell-pg's processes name themselves ``api``, ``worker`` and ``beat``).
Each backend's statements are grouped into transactions: ``BEGIN`` … ``COMMIT``/``ROLLBACK``, a
one-trip ``BEGIN; …; COMMIT`` string, or one statement in autocommit mode. A transaction's *shape*
is the list of its statements' verb and first table (``SELECT queueing_message``,
``UPDATE queueing_queuecell`` …); it *writes* when one of them is an INSERT, UPDATE, DELETE or
``FOR UPDATE``. ``--runs``: the workflow runs the log covers (warm-up runs included: the log
starts with the cluster), to print figures per run. Standard library only.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict

LINE = re.compile(r"^(?P<ts>[^|]*)\|(?P<app>[^|]*)\|(?P<pid>\d+)\|(?P<xid>\d*)\|(?P<rest>.*)$")
STMT = re.compile(r"^(?:LOG|LOG:)?\s*statement: (?P<sql>.*)$")
VERB = re.compile(
    r"^\s*(SELECT|INSERT INTO|UPDATE|DELETE FROM|WITH|SET|SAVEPOINT|RELEASE SAVEPOINT|ROLLBACK TO SAVEPOINT|"
    r"BEGIN|COMMIT|ROLLBACK|LISTEN|NOTIFY|SHOW)\b",
    re.I,
)
TABLE = re.compile(r'"([a-z_]+_[a-z_]+)"')
WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b|FOR UPDATE|\bNOTIFY\b", re.I)


def split_script(sql: str) -> list[str]:
    """Split a simple-query string on top-level ``;`` (outside quotes)."""
    parts, cur, quote = [], [], None
    for ch in sql:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
            cur.append(ch)
        elif ch == ";":
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return [p for p in parts if p]


def shape(stmt: str) -> str:
    m = VERB.match(stmt)
    verb = m.group(1).upper() if m else stmt.split(None, 1)[0][:12].upper()
    if verb in ("BEGIN", "COMMIT", "ROLLBACK", "SET", "SHOW", "LISTEN", "NOTIFY") or "SAVEPOINT" in verb:
        return verb if verb != "SET" else " ".join(stmt.split()[:2]).upper()
    t = TABLE.search(stmt)
    lock = " FOR UPDATE" if "FOR UPDATE" in stmt.upper() else ""
    return f"{verb} {t.group(1) if t else '?'}{lock}"


def parse(path: str):
    """Yield ``(app, pid, sql)`` for every logged statement (continuation lines joined)."""
    cur = None
    with open(path, errors="replace") as fh:
        for raw in fh:
            line = raw.rstrip("\n")
            m = LINE.match(line)
            if m is None:
                if cur is not None and (line.startswith("\t") or not line.strip() == ""):
                    cur[2].append(line.strip())
                continue
            if cur is not None:
                yield cur[0], cur[1], " ".join(cur[2])
                cur = None
            s = STMT.match(m.group("rest"))
            if s:
                cur = [m.group("app") or "?", m.group("pid"), [s.group("sql")]]
    if cur is not None:
        yield cur[0], cur[1], " ".join(cur[2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--runs", type=float, required=True, help="workflow runs the log covers")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args(argv)
    open_tx: dict[str, list[str]] = {}
    tx = Counter()  # (app, shape) -> transactions
    tx_app, stmts_app, writes_app = Counter(), Counter(), Counter()
    for app, pid, sql in parse(args.log):
        parts = split_script(sql)
        for stmt in parts:
            key = pid
            sh = shape(stmt)
            if sh == "BEGIN":
                open_tx[key] = []
                continue
            if sh in ("COMMIT", "ROLLBACK"):
                body = open_tx.pop(key, [])
                record(app, body, tx, tx_app, writes_app, rolled_back=sh == "ROLLBACK")
                continue
            stmts_app[app] += 1
            if key in open_tx:
                open_tx[key].append(stmt)
            else:
                record(app, [stmt], tx, tx_app, writes_app)
    n = args.runs
    print(f"per run ({n:g} runs): transactions / writing / statements by role")
    for app in sorted(tx_app):
        print(f"  {app:8s} {tx_app[app] / n:7.1f} {writes_app[app] / n:7.1f} {stmts_app[app] / n:7.1f}")
    print(f"  {'total':8s} {sum(tx_app.values()) / n:7.1f} {sum(writes_app.values()) / n:7.1f} "
          f"{sum(stmts_app.values()) / n:7.1f}")
    print(f"\ntop transaction shapes (per run):")
    for (app, sh), c in tx.most_common(args.top):
        print(f"  {c / n:7.2f}  {app:7s} {sh}")
    return 0


def record(app, body, tx, tx_app, writes_app, rolled_back=False) -> None:
    shapes = [shape(s) for s in body]
    # collapse repeats: "UPDATE x ×3"
    out: list[str] = []
    for sh in shapes:
        if out and out[-1].split(" ×")[0] == sh:
            base, _, k = out[-1].partition(" ×")
            out[-1] = f"{base} ×{int(k or 1) + 1}"
        else:
            out.append(sh)
    label = " ; ".join(out) or "(empty)"
    if rolled_back:
        label += " [ROLLBACK]"
    tx[(app, label)] += 1
    tx_app[app] += 1
    if any(WRITE.search(s) for s in body):
        writes_app[app] += 1


if __name__ == "__main__":
    sys.exit(main())
