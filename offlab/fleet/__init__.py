"""`offlab fleet run PLAN --inventory FILE`: the plan on every host pair, driven by Ansible.

    controller: offlab ─ ansible-playbook offlab/fleet/ansible/fleet.yml (forks, serial batches)
        play 1, every host: unless installed from this bundle already (its sha256), the bundle copied and
                offlab installed offline in offlab_prefix; `hosts check --local`
        play 2, every pair's client host: a key pair made for the run, authorized on both ends (marked),
                `offlab run PLAN --inventory PAIR.json --pair A:IF,B:IF` there (per-sample ssh stays in
                the pair), its SQLite file fetched home
        play 3, every host: this run's keys and run directory removed (the installation stays); the
                records of what its lease put back while its controller was silent brought home
    controller: what the leases put back said; each pair's SQLite file `results import`ed into --db; one
                line per pair

Interrupted (SIGINT, SIGTERM, SIGHUP), the controller ends the playbook, then runs its `stop` tag: each
client host's `offlab run` is sent SIGTERM by the pid and start time it recorded (it puts both ends back
and keeps its samples, as after a Ctrl-C there), its SQLite file comes home, play 3 removes the run's keys
and directories; what was measured is imported and said per pair, and offlab exits as interrupted.

offlab schedules nothing itself: Ansible's forks and serial batches decide what runs at once, and a
pair that fails is rescued by the playbook, so the others go on.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from offlab.state import private_tmp
from offlab import interrupts
from offlab import inventory as inv_mod
from offlab.errors import BadInput, EnvironmentProblem, OfflabError
from offlab.hosts import LOCAL, lease
from offlab.hosts.process import START_TIME_SH, die_with_parent

PLAYBOOK = Path(__file__).parent / "ansible" / "fleet.yml"
# ansible-core's default ssh_args without -C, and with the keepalive offlab's own ssh uses: a host that
# drops off the network while Ansible's connection master to it persists would otherwise hold every
# task sent through that master until TCP gives up (a fleet run was seen waiting 15 min).
SSH_ARGS = "-o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=5 -o ServerAliveCountMax=3"
DEFAULT_BUNDLE = "dist/offlab-bundle.tar"
RUNDIR = "@RUNDIR@"
# A playbook asked to end (SIGTERM: it ends its workers and their commands) is killed after this long.
PLAYBOOK_END_S = 10
# How long the `stop` tag waits for a client host's offlab run to end after its SIGTERM: it puts both
# ends back first (seconds; README's signal bound is 5 s on a lab of this machine).
RUN_END_S = 60

# A run's SQLite file made whole (its WAL folded in) before it is fetched: `python -c CHECKPOINT_PY FILE`,
# by the run task after the run and by the `stop` tag after an interrupted one.
CHECKPOINT_PY = "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
# The client host's `offlab run` is started through this (sh -c RECORD_SH sh RUNDIR ARGV...): it writes its
# own pid and start time to RUNDIR/offlab.pid, then becomes the run (exec keeps both).
RECORD_SH = START_TIME_SH + 'd=$1; shift; echo "$$ $(st $$)" >"$d/offlab.pid.t" && mv "$d/offlab.pid.t" "$d/offlab.pid"; exec "$@"'
# The `stop` tag on a client host (sh -c STOP_SH sh RUNDIR PYTHON): that run sent SIGTERM while the pid
# still has its start time, waited for, its SQLite file checkpointed for the fetch; prints what it found:
# none (never started), ended, stopped, or still running.
STOP_SH = START_TIME_SH + f"""
d=$1; py=$2; f=$d/offlab.pid
[ -f "$f" ] || {{ echo none; exit 0; }}
p=; t=; read -r p t <"$f"
how=ended
if [ -n "$p" ] && [ -n "$t" ] && [ "$(st "$p")" = "$t" ]; then
  kill -TERM "$p" 2>/dev/null
  n=0; while [ "$(st "$p")" = "$t" ] && [ $n -lt {RUN_END_S * 10} ]; do sleep 0.1; n=$((n + 1)); done
  how=stopped; [ "$(st "$p")" = "$t" ] && how="still running"
fi
if [ -f "$d/results.db" ]; then
  "$py" -c {shlex.quote(CHECKPOINT_PY)} "$d/results.db" 2>/dev/null
fi
echo "$how"
"""


@dataclass
class PairResult:
    pair: str
    ok: bool
    why: str = ""
    run_id: int | None = None  # in the controller's database
    samples: int = 0
    interrupted: bool = False  # the fleet run was, and this pair's run with it

    def line(self) -> str:
        """The pair's one line: ok, failed or interrupted, with the run its samples went to."""
        if self.ok:
            return f"{self.pair}: ok: run {self.run_id} ({self.samples} samples)"
        kept = f" ({self.samples} samples kept in run {self.run_id})" if self.run_id is not None else ""
        return f"{self.pair}: {'interrupted' if self.interrupted else 'failed'}: {self.why}{kept}"


def ansible_playbook() -> str:
    """$OFFLAB_ANSIBLE_PLAYBOOK, else ansible-playbook beside this offlab (the `fleet` extra), else on PATH;
    exit 3 when absent."""
    given = os.environ.get("OFFLAB_ANSIBLE_PLAYBOOK")
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise EnvironmentProblem(f"OFFLAB_ANSIBLE_PLAYBOOK={given}: not an executable file: point it at "
                                     f"ansible-playbook, or unset it to use the fleet extra's")
        return given
    here = Path(sys.executable).parent / "ansible-playbook"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("ansible-playbook")
    if not found:
        raise EnvironmentProblem("ansible-playbook not found: install the fleet extra "
                                 "(pip install 'offlab[fleet]'; `make install` does) or put ansible-core on PATH")
    return found


def pairs_for(inv: inv_mod.Inventory, pairs: list[str] | None, group: str | None) -> list[str]:
    """--pair, else the inventory's pairs, else the hosts of --group paired in order (1st-2nd, 3rd-4th...),
    each on its first declared test interface. Each host in one pair at most."""
    if pairs:
        out = list(pairs)
    elif inv.pairs and group is None:
        out = list(inv.pairs)
    else:
        g = group or "all"
        names = [h.name for h in inv.hosts.values() if g == "all" or g in h.groups]
        if not names:
            raise BadInput(f"{inv.source}: group {g!r} has no hosts (groups: "
                           f"{', '.join(sorted({x for h in inv.hosts.values() for x in h.groups})) or 'none'})")
        if len(names) % 2:
            raise BadInput(f"{inv.source}: group {g!r} has {len(names)} hosts ({', '.join(names)}): pairs need an "
                           f"even number; add a host, or name the pairs with --pair A:IF,B:IF")
        inv.require_interfaces(names)
        out = [f"{a}:{inv.host(a).interfaces[0].name},{b}:{inv.host(b).interfaces[0].name}"
               for a, b in zip(names[::2], names[1::2], strict=True)]
    seen: dict[str, str] = {}
    for p in out:
        for ih, _ in inv_mod.parse_pair(p, inv):
            if ih.name in seen and seen[ih.name] != p:
                raise BadInput(f"--pair {p!r}: host {ih.name!r} is also in pair {seen[ih.name]!r}: a fleet run "
                               f"gives each host to one pair (run the other pair in another fleet run)")
            seen[ih.name] = p
    return out


def _known_hosts(ih: inv_mod.InventoryHost) -> str:
    """The known_hosts file the controller's inventory names for this host, else ~/.ssh/known_hosts."""
    args = list(ih.ssh_args)
    for i, a in enumerate(args):
        opt = a[2:] if a.startswith("-o") and len(a) > 2 else (args[i + 1] if a == "-o" and i + 1 < len(args) else "")
        key, _, val = opt.partition("=")
        if key.strip().lower() == "userknownhostsfile" and val.strip():
            return os.path.expanduser(val.strip().split()[0])
    return os.path.expanduser("~/.ssh/known_hosts")


def _end(ih: inv_mod.InventoryHost, rundir: str, address: str | None) -> dict:
    """One end as the client host's offlab reaches it: over ssh with the run's key and known_hosts."""
    entry: dict = {"ssh": address or ih.target, "identity_file": f"{rundir}/id",
                   "ssh_args": ["-o", f"UserKnownHostsFile={rundir}/known_hosts", "-o", "StrictHostKeyChecking=yes"],
                   "connect_timeout": ih.connect_timeout, "remote_dir": ih.remote_dir, "lease": ih.lease, "sudo": ih.become,
                   "interfaces": [{"name": i.name, "addresses": list(i.addresses)} for i in ih.interfaces],
                   "allow_management_traffic": ih.allow_management_traffic}
    if ih.user:
        entry["user"] = ih.user
    if ih.port:
        entry["port"] = ih.port
    if ih.ssh_config:
        entry["ssh_config"] = ih.ssh_config
    return entry


def run(plan_path: str, inventory: str, db: str, pairs: list[str] | None = None, *, group: str | None = None,
        forks: int = 5, serial: int | None = None, bundle: str | None = None,
        on_line: Callable[[str], None] = lambda line: None) -> list[PairResult]:
    from offlab.experiment.fanout import check_plan
    from offlab.experiment.plan import load_plan_file

    plan = load_plan_file(plan_path)
    check_plan(plan)
    inv = inv_mod.load(inventory)
    if inv.format != "ansible":
        raise BadInput(f"{inventory}: `offlab fleet run` takes an Ansible YAML inventory (this is offlab's own "
                       f"format: use `offlab run PLAN --inventory {inventory}`)")
    pairs = pairs_for(inv, pairs, group)
    if forks < 1 or (serial is not None and serial < 1):
        raise BadInput("--forks and --serial: 1 or more")
    bundle_path = Path(bundle or os.environ.get("OFFLAB_BUNDLE") or DEFAULT_BUNDLE)
    if not bundle_path.is_file():
        raise BadInput(f"--bundle {bundle_path}: no such file: build it with `make bundle` in offlab's checkout")
    player = ansible_playbook()
    from offlab.store import Store

    # The database answers (and has offlab's schema, not a newer one) before any host is touched: an
    # unreachable one is one line now, not after the whole fleet has run.
    Store.open(db).close()
    token = secrets.token_hex(6)
    with private_tmp("fleet") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        jobs, checks, hosts = {}, {}, []
        for i, p in enumerate(pairs):
            (client, cif), (server, sif) = inv_mod.parse_pair(p, inv)
            hosts += [client.name, server.name]
            rundir = RUNDIR  # replaced on the host by the playbook (offlab_prefix is the inventory's)
            jobs[client.name] = {
                "index": i, "pair": p, "server": server.name, "known_hosts": _known_hosts(server),
                "inventory": {"hosts": {client.name: _end(client, rundir, None),
                                        server.name: _end(server, rundir, None)}, "pairs": [p]}}
            for ih in (client, server):
                checks[ih.name] = {"hosts": {ih.name: {"ssh": "localhost", "remote_dir": ih.remote_dir,
                                                       "lease": ih.lease, "interfaces": [
                    {"name": x.name, "addresses": list(x.addresses)} for x in ih.interfaces]}}}
        extra = {"offlab_fleet_run": token, "offlab_fleet_lapsed_sh": lease.LAPSED_AND_TIDY_SH,
                 "offlab_fleet_record_sh": RECORD_SH, "offlab_fleet_stop_sh": STOP_SH,
                 "offlab_fleet_checkpoint_py": CHECKPOINT_PY,
                 "offlab_fleet_hosts": ",".join(hosts),
                 "offlab_fleet_clients": ",".join(jobs), "offlab_fleet_serial": serial or "100%",
                 "offlab_fleet_bundle": str(bundle_path.resolve()), "offlab_fleet_bundle_sha256": _sha256(bundle_path),
                 "offlab_fleet_plan": os.path.abspath(plan_path),
                 "offlab_fleet_out": str(out), "offlab_fleet_jobs": jobs, "offlab_fleet_checks": checks}
        (Path(tmp) / "extra.json").write_text(json.dumps(extra))
        argv = [player, "-i", os.path.abspath(inventory), str(PLAYBOOK), "-e", f"@{tmp}/extra.json",
                "--forks", str(forks)]
        log = Path(tmp) / "ansible.log"
        on_line(f"ansible-playbook: {len(pairs)} pair(s), {len(hosts)} host(s), forks {forks}, "
                f"serial {serial or 'all'}")
        with open(log, "w") as f:
            try:
                proc = _play(argv, Path(tmp), f)
            except BaseException as exc:
                if interrupts.is_interrupt(exc):
                    _stop(argv, Path(tmp), f, pairs, jobs, out, db, on_line)
                raise
        text = log.read_text()
        for line in lapses_brought_home(out):
            on_line(line)
        keep = os.environ.get("OFFLAB_FLEET_LOG")
        if keep:
            shutil.copyfile(log, keep)
        try:
            results = _collect(pairs, jobs, out, text, db, proc.returncode)
        except EnvironmentProblem as e:  # the database went away during the run: keep what was measured
            home = _keep(out, jobs)
            if home is None:
                raise
            raise EnvironmentProblem(f"{e}; {_kept_in(home, db)}") from None
    return results


def _keep(out: Path, jobs: dict) -> Path | None:
    """The pairs' SQLite files copied out of the run's temporary directory (which goes), one per pair, named
    after it; None when none has a sample."""
    kept = [f for f in sorted(out.glob("*.db")) if f.stat().st_size > 0]
    if not kept:
        return None
    home = Path(tempfile.mkdtemp(prefix="offlab-fleet-results."))
    for f in kept:
        shutil.copyfile(f, home / f"{jobs_by_index(jobs)[f.stem]}.db")
    return home


def _kept_in(home: Path, db: str) -> str:
    return (f"the pairs' results are kept in {home} (one SQLite file per pair): `offlab results import FILE "
            f"--db {db}` once it answers")


def _stop(argv: list[str], tmp: Path, log, pairs: list[str], jobs: dict, out: Path, db: str,
          on_line: Callable[[str], None]) -> None:
    """After an interrupt: the playbook's `stop` tag (each pair's run ended on its client host, its results
    brought home, the run's keys and directories removed), then what the pairs measured imported and said,
    one line each. offlab is ending: a second signal does not cut this short (the playbook runs in a session
    of its own, out of reach of the terminal's)."""
    on_line("offlab: interrupted: ending each pair's run on its client host and bringing its samples home")
    log.flush()
    try:
        proc = _play([*argv, "--tags", "stop"], tmp, log, own_session=True)
    except (OfflabError, OSError) as e:
        on_line(f"offlab: the pairs' runs could not be ended ({e}): `offlab fleet clean --inventory INV` puts "
                f"their hosts back")
        return
    for line in lapses_brought_home(out):
        on_line(line)
    try:
        results = _collect(pairs, jobs, out, (tmp / "ansible.log").read_text(), db, proc.returncode)
    except EnvironmentProblem as e:  # the database went away: keep what was measured
        home = _keep(out, jobs)
        on_line(f"offlab: {e}" + (f"; {_kept_in(home, db)}" if home is not None else ""))
        return
    for r in results:
        on_line(r.line())


def _sha256(path: Path) -> str:
    """The bundle's hash, once on the controller: a host installed from it keeps its installation without the
    bundle being copied or checksummed there again."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def jobs_by_index(jobs: dict) -> dict[str, str]:
    """Index (as in the fetched file's name) → the pair, as a file name (`a1_t1-b1_t1`)."""
    return {str(j["index"]): j["pair"].replace(":", "_").replace(",", "-") for j in jobs.values()}


def _play(argv: list[str], tmp: Path, out, *, own_session: bool = False) -> subprocess.CompletedProcess:
    """ansible-playbook with its ssh masters in our own directory, closed when it is done (Ansible leaves
    them to ControlPersist: a minute of idle sessions on every host). `own_session`: out of reach of the
    terminal's signals (the `stop` play, which a second Ctrl-C must not end)."""
    cp = tmp / "cp"
    cp.mkdir(mode=0o700, exist_ok=True)
    # Pipelining: a task is one ssh command (the module on its stdin), not four or five (temp directory,
    # transfer, chmod, run, remove), each paying the host's login shell. Set ANSIBLE_PIPELINING=False
    # to turn it off (a sudo with `requiretty` needs that).
    # Ansible's own ssh_args without its -C: the bundle is wheels, zip files already; compressing them
    # again costs CPU on both ends and made the copy slower, not faster (docs/remote.md). The
    # environment's ANSIBLE_SSH_ARGS or an inventory's ansible_ssh_args wins; an ansible.cfg's
    # ssh_args does not (Ansible ranks the environment above it): set ANSIBLE_SSH_ARGS to it.
    env = {"ANSIBLE_PIPELINING": "True", "ANSIBLE_SSH_ARGS": SSH_ARGS, **os.environ,
           "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_RETRY_FILES_ENABLED": "False",
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_DEPRECATION_WARNINGS": "False", "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp)}
    # An offlab killed outright (SIGKILL, a timeout's kill) takes the playbook with it: nothing else would end it.
    proc = LOCAL.spawn(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                       preexec_fn=die_with_parent, start_new_session=own_session)
    try:
        rc = proc.wait()
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: the playbook is ours to end
        proc.terminate()  # it ends its workers and their ssh commands on SIGTERM; SIGKILL would orphan them
        try:
            proc.wait(timeout=PLAYBOOK_END_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    finally:
        for sock in cp.iterdir():
            LOCAL.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "offlab-fleet"], check=False, timeout=30)
    return subprocess.CompletedProcess(argv, rc)


_UNREACHABLE = re.compile(r"^fatal: \[([^\]]+)\]: UNREACHABLE! => (\{.*)$", re.M)
_FATAL = re.compile(r"^fatal: \[([^\]]+)\]: FAILED! => (\{.*)$", re.M)


def _ansible_reason(text: str, host: str) -> str | None:
    for rx, what in ((_UNREACHABLE, "unreachable"), (_FATAL, "failed")):
        for m in rx.finditer(text):
            if m.group(1) == host:
                try:
                    msg = json.loads(m.group(2)).get("msg", "")
                except ValueError:
                    msg = m.group(2)[:200]
                return f"host {host} {what}: {' '.join(str(msg).split())[:300]}"
    return None


def _client_reason(status: dict, pair: str) -> str:
    """Why the client host's `offlab run` failed: its own line for the pair, else its last error line."""
    mine = f"{pair}: failed: "
    for line in reversed(status.get("stdout", [])):
        if line.startswith(mine):
            return re.sub(r"\s*\(samples kept in run \d+\)$", "", line[len(mine):]).removeprefix("offlab: error: ")
    lines = [l for l in status.get("stderr", []) if l.strip()]
    return lines[-1].removeprefix("offlab: error: ") if lines else "no message"


def _collect(pairs: list[str], jobs: dict, out: Path, text: str, db: str, ansible_rc: int) -> list[PairResult]:
    from offlab.store import Store

    results = []
    with Store.open(db) as target:
        for client, job in jobs.items():
            i, pair, server = job["index"], job["pair"], job["server"]
            r = PairResult(pair, ok=False)
            status_file, db_file = out / f"{i}.json", out / f"{i}.db"
            status = json.loads(status_file.read_text()) if status_file.is_file() else None
            if db_file.is_file() and db_file.stat().st_size > 0:
                with Store.open_read_only(db_file) as source:
                    uids = [source.get_run(x["id"])["uid"] for x in source.list_runs()]
                    r.samples = sum(len(source.samples(x["id"])) for x in source.list_runs())
                    target.import_from(source)
                ids = {target.get_run(x["id"])["uid"]: x["id"] for x in target.list_runs()}
                r.run_id = next((ids[u] for u in reversed(uids) if u in ids), None)
            if status is not None and "interrupted" in status:
                r.interrupted = True
                r.why = _interrupted_why(status["interrupted"], client, server)
            elif status is not None and status.get("rc") == 0:
                r.ok = True
            elif status is not None and status.get("rc", -1) > 0:
                r.why = f"offlab on {client} exit {status['rc']}: " + _client_reason(status, pair)
            else:
                why = []
                for h in (client, server):
                    hf = out / f"host-{h}.json"
                    if hf.is_file():
                        info = json.loads(hf.read_text())
                        why.append(f"host {h}: {info['task']}: {info['error']}")
                    else:
                        reason = _ansible_reason(text, h)
                        if reason and (status is None or "unreachable" in reason):
                            why.append(reason)
                if not why and status is not None:
                    why.append(status.get("error", ""))
                r.why = "; ".join(why) or f"no result from {client} (ansible-playbook exit {ansible_rc})"
            results.append(r)
    return results


def _interrupted_why(found: str, client: str, server: str) -> str:
    """What the `stop` tag found of a pair's run on its client host, said."""
    return {
        "none": "not started",
        "ended": f"its run on {client} had ended",
        "stopped": f"its run on {client} ended on SIGTERM and put {client} and {server} back",
        "unreachable": f"host {client} did not answer: `offlab fleet clean --inventory INV --host {client} "
                       f"--host {server}` once it does",
    }.get(found, f"its run on {client} did not end within {RUN_END_S} s of SIGTERM: `offlab fleet clean "
                 f"--inventory INV --host {client} --host {server}` once it has")


def clean(inventory: str, hosts: list[str] | None = None, *, forks: int = 5,
          on_line: Callable[[str], None] = lambda line: None) -> int:
    """`offlab fleet clean`: the playbook's `clean` tag: what each host's lease put back said (`on_line`), a
    crashed run's restore.sh run on each host, then offlab_prefix and any fleet key off the hosts."""
    inv = inv_mod.load(inventory)
    names = hosts or list(inv.hosts)
    for n in names:
        inv.host(n)
    player = ansible_playbook()
    with private_tmp("fleet") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        (Path(tmp) / "extra.json").write_text(json.dumps({
            "offlab_fleet_hosts": ",".join(names), "offlab_fleet_clients": ",".join(names),
            "offlab_fleet_serial": "100%", "offlab_fleet_run": "clean", "offlab_fleet_out": str(out),
            "offlab_fleet_lapsed_sh": lease.LAPSED_AND_TIDY_SH}))
        argv = [player, "-i", os.path.abspath(inventory), str(PLAYBOOK), "--tags", "clean",
                "-e", f"@{tmp}/extra.json", "--forks", str(forks)]
        rc = _play(argv, Path(tmp), None).returncode
        for line in lapses_brought_home(out):
            on_line(line)
        return rc


def lapses_brought_home(out: Path) -> list[str]:
    """The lapse records the playbook brought home from each host (lapsed-home.yml), as `offlab restore` says them:
    those read before the run (lapsed-HOST.before.txt) ahead of those read after it (lapsed-HOST.txt)."""
    lines = []
    for f in sorted(out.glob("lapsed-*.txt"), key=lambda f: (not f.name.endswith(".before.txt"), f.name)):
        host = f.name.removeprefix("lapsed-").removesuffix(".txt").removesuffix(".before")
        lines += lease.parse_lapses(host, f.read_text())
    return lines


def command_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
