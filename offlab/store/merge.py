"""`results import`: another database's runs and bisects copied into this one, each once (by uid)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import sqlalchemy as sa

from offlab.errors import EnvironmentProblem
from offlab.store.codec import dumps

if TYPE_CHECKING:
    from offlab.store import Store


def import_from(store: "Store", other: "Store", on_line: Callable[[str], None]) -> tuple[int, int]:
    """Copy every run of `other` that this database does not hold yet (by its uid), with its cells,
    samples, metrics and series, each run in one transaction; (imported, skipped)."""
    imported = skipped = 0
    for listed in other.list_runs():
        run = other.get_run(listed["id"])
        have = store._q("SELECT id FROM runs WHERE uid = :u", {"u": run["uid"]})
        if have:
            skipped += 1
            on_line(f"run {run['id']} ({run['name']}): already here as run {have[0][0]}")
            continue
        cells = other.cells(run["id"])
        samples = other.samples(run["id"])
        try:
            with store._tx() as c:
                new = store._insert_run(c, {
                    "name": run["name"], "status": run["status"], "note": run["note"],
                    "started_at": run["started_at"], "finished_at": run["finished_at"],
                    "offlab_version": run["offlab_version"], "seed": run["seed"], "plan_text": run["plan_text"],
                    "plan": dumps(run["plan"]), "env": dumps(run["env"]),
                    "baseline": None if run["baseline"] is None else dumps(run["baseline"]),
                    "repeat": dumps(run["repeat"]), "uid": run["uid"]})
                ids = {cell["id"]: store._insert_cell(c, {
                    "run_id": new, "key": cell["key"], "position": cell["position"],
                    "params": dumps(cell["params"]), "settings": dumps(cell["settings"]),
                    "status": cell["status"], "reason": cell["reason"]}) for cell in cells}
                for smp in samples:
                    store._insert_sample(c, new, ids[smp["cell_id"]], smp["round"], smp["created_at"],
                                        smp["sample"], smp["metrics"], smp["requested_vs_actual"])
        except EnvironmentProblem:
            if store._q("SELECT id FROM runs WHERE uid = :u", {"u": run["uid"]}):
                skipped += 1  # another import took it at the same moment (the unique uid said no to us)
                on_line(f"run {run['id']} ({run['name']}): already here (imported at the same time)")
                continue
            raise
        imported += 1
        on_line(f"run {run['id']} ({run['name']}): imported as run {new}, {len(cells)} cells, "
                f"{len(samples)} samples")
    _import_bisects(store, other, on_line)
    return imported, skipped

def _import_bisects(store: "Store", other: "Store", on_line: Callable[[str], None]) -> None:
    """Copy `other`'s bisects not held here (by uid), each step pointing to its run as imported here.
    A bisect whose process has ended arrives interrupted (an owner's pid means nothing on this host)."""
    if other.schema_version() < 4:
        return
    bisects = [dict(r._mapping) for r in other._q("SELECT * FROM bisects ORDER BY id")]
    if not bisects:
        return
    # run id there → run id here, by uid: one query on each side, not two per step
    uid_of = {rid: uid for rid, uid in other._q("SELECT id, uid FROM runs WHERE uid IS NOT NULL")}
    id_here = {uid: rid for rid, uid in store._q("SELECT id, uid FROM runs WHERE uid IS NOT NULL")}
    for raw in bisects:
        have = store._q("SELECT id FROM bisects WHERE uid = :u", {"u": raw["uid"]})
        if have:
            on_line(f"bisect {raw['id']} ({raw['plan_name']}): already here as bisect {have[0][0]}")
            continue
        read = other.get_bisect(raw["id"])  # its status as its owner's liveness makes it
        steps = [dict(r._mapping) for r in other._q("SELECT * FROM bisect_steps WHERE bisect_id = :b ORDER BY id",
                                                    {"b": raw["id"]})]
        runs = {st["run_id"]: id_here.get(uid_of.get(st["run_id"])) for st in steps if st["run_id"] is not None}
        with store._tx() as c:
            new = int(c.execute(sa.text(
                "INSERT INTO bisects(plan_name, plan_text, spec, status, note, result, owner, started_at, "
                "finished_at, offlab_version, uid) VALUES (:n, :t, :s, :st, :no, :r, :o, :at, :f, :v, :u) "
                "RETURNING id"),
                {"n": raw["plan_name"], "t": raw["plan_text"], "s": raw["spec"], "st": read["status"],
                 "no": read["note"], "r": raw["result"], "o": raw["owner"] if read["status"] == "running" else None,
                 "at": raw["started_at"], "f": raw["finished_at"], "v": raw["offlab_version"],
                 "u": raw["uid"]}).scalar_one())
            for st in steps:
                c.execute(sa.text(
                    "INSERT INTO bisect_steps(bisect_id, position, release, package_version, suite, run_id, "
                    "verdict, detail, created_at, decided_at) VALUES (:b, :p, :rel, :pv, :su, :run, :v, :d, :at, "
                    ":dec)"), {"b": new, "p": st["position"], "rel": st["release"], "pv": st["package_version"],
                               "su": st["suite"], "run": runs.get(st["run_id"]), "v": st["verdict"],
                               "d": st["detail"], "at": st["created_at"], "dec": st["decided_at"]})
        on_line(f"bisect {raw['id']} ({raw['plan_name']}): imported as bisect {new}, {len(steps)} steps")
