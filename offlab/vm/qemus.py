"""QEMU versions beside the installed one: Debian's packages unpacked into offlab's cache, run from there.

A QEMU is asked for as a series (`7.2`, `10.0`) or `installed` (the default). The installed
qemu-system-x86 answers for its own series. Another series comes from the Debian archive, read
through offlab's own apt state (offlab.vm.kernels: its suites and signed lists; the machine's apt
sources, lists and packages are never touched): the newest qemu-system-x86 of that series whose
C library this machine has, and with it

- the packages of QEMU's own source it depends on (qemu-system-common: the modules, TCG among them
  in Debian's 7.2; qemu-system-data: pvh.bin, qboot and the option ROMs), in its own version, and
- every other package its Depends name that the machine lacks or has in a version that does not
  satisfy them, recursively (never libc6: a program runs with the machine's C library or not at all).

Each .deb is fetched once with its SHA256 checked (kernels.fetch) into the cache and unpacked with
`dpkg-deb -x` into `vm/qemu/<version>/root` — never installed. It runs as
`env QEMU_MODULE_DIR=ROOT/usr/lib/x86_64-linux-gnu/qemu [LD_LIBRARY_PATH=<unpacked library dirs>]
ROOT/usr/bin/qemu-system-x86_64 -L ROOT/usr/share/qemu`; `ldd` of the binary and of the TCG module
must find every library before it is used. qemu-system-common's own Depends serve modules loaded on
demand (audio, SPICE, USB); those the machine lacks are not fetched, and the modules that cannot load
here are named in the manifest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from offlab.errors import BadInput, EnvironmentProblem
from offlab.hosts import LOCAL
from offlab.vm import kernels

PACKAGE = "qemu-system-x86"
SIBLINGS = ("qemu-system-common", "qemu-system-data")  # QEMU's own source: taken in QEMU's version
NEVER_FETCHED = ("libc6",)  # the dynamic loader and C library of this machine are the only ones
BINARY = "usr/bin/qemu-system-x86_64"
MODULE_DIR = "usr/lib/x86_64-linux-gnu/qemu"
DATA_DIR = "usr/share/qemu"
# Firmware QEMU's Depends bring from other packages, where Debian puts it: a relocatable QEMU looks for
# it beside its own binary, so an unpacked one is told with -L (the machine's copy, or the fetched one).
FIRMWARE_DIRS = {"seabios": "usr/share/seabios", "ipxe-qemu": "usr/lib/ipxe/qemu"}
TCG_MODULE = "accel-tcg-x86_64.so"
MANIFEST = "qemu.json"
_SPEC_RE = re.compile(r"^(installed|\d+\.\d+)$")
_FIELDS = ("Package", "Version", "Depends", "Pre-Depends", "Filename", "SHA256", "Size", "Source", "Provides")


# ---- Debian's package text ------------------------------------------------------------------
def stanzas(text: str) -> list[dict[str, str]]:
    """The fields offlab reads of each stanza of a Packages file (or `apt-cache show`), continuation
    lines joined."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += " " + line.strip()
                continue
            k, sep, v = line.partition(":")
            key = k if sep and k in _FIELDS else None
            if key:
                fields[key] = v.strip()
        if "Package" in fields and "Version" in fields:
            out.append(fields)
    return out


@dataclass(frozen=True)
class Relation:
    """One alternative of a Depends entry: `name (op version)`."""

    name: str
    op: str = ""
    version: str = ""

    def satisfied_by(self, version: str) -> bool:
        if not self.op:
            return True
        a, b = kernels.debian_key(version), kernels.debian_key(self.version)
        return {"<<": a < b, "<=": a <= b, "=": a == b, ">=": a >= b, ">>": a > b}[self.op]

    def __str__(self) -> str:
        return f"{self.name} ({self.op} {self.version})" if self.op else self.name


def depends(text: str) -> list[list[Relation]]:
    """`a (>= 1), b | c` → [[a ≥ 1], [b, c]] (architecture qualifiers dropped)."""
    out = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        alts = []
        for alt in entry.split("|"):
            m = re.match(r"^\s*([a-z0-9][a-z0-9+.-]*)(?::\w+)?\s*(?:\(\s*(<<|<=|=|>=|>>)\s*([^)\s]+)\s*\))?", alt)
            if m:
                alts.append(Relation(m.group(1), m.group(2) or "", m.group(3) or ""))
        if alts:
            out.append(alts)
    return out


def series_of(version: str) -> str:
    """'1:7.2+dfsg-7+deb12u18+b3' → '7.2'; '10.0.2' → '10.0'."""
    upstream = version.split(":")[-1]
    m = re.match(r"^(\d+)\.(\d+)", upstream)
    return f"{m.group(1)}.{m.group(2)}" if m else upstream


@dataclass(frozen=True)
class Candidate:
    """One qemu-system-x86 in one suite, and whether this machine's C library can run it."""

    version: str
    suite: str
    libc_needed: str  # the version its Depends ask of libc6 ("" none)

    @property
    def series(self) -> str:
        return series_of(self.version)


@dataclass(frozen=True)
class Machine:
    """What is installed here: package → version (dpkg's status, only read), and virtual names."""

    installed: dict[str, str]
    provides: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, dpkg_query: str) -> "Machine":
        """From `dpkg-query -W -f '${Package}\\t${Version}\\t${db:Status-Abbrev}\\t${Provides}\\n'`."""
        installed: dict[str, str] = {}
        provides: dict[str, list[str]] = {}
        for line in dpkg_query.splitlines():
            parts = line.split("\t")
            if len(parts) < 3 or not parts[2].startswith("ii"):
                continue
            installed[parts[0]] = parts[1]
            for rel in depends(parts[3] if len(parts) > 3 else ""):
                provides.setdefault(rel[0].name, []).append(rel[0].version)
        return cls(installed, provides)

    def satisfies(self, rel: Relation) -> bool:
        have = self.installed.get(rel.name)
        if have is not None and rel.satisfied_by(have):
            return True
        return any(rel.satisfied_by(v) if v else not rel.op for v in self.provides.get(rel.name, []))

    @property
    def libc(self) -> str:
        return self.installed.get("libc6", "")


def machine() -> Machine:
    out = LOCAL.run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\t${Provides}\n"],
                    timeout=60).stdout
    return Machine.parse(out)


def candidates(by_suite: dict[str, list[dict[str, str]]]) -> list[Candidate]:
    """Every qemu-system-x86 the suites offer, oldest first."""
    out = []
    for suite, found in by_suite.items():
        for f in found:
            if f["Package"] != PACKAGE:
                continue
            libc = next((a.version for alts in depends(f.get("Depends", "")) for a in alts if a.name == "libc6"), "")
            out.append(Candidate(f["Version"], suite, libc))
    return sorted(out, key=lambda c: kernels.debian_key(c.version))


def runnable(c: Candidate, m: Machine) -> bool:
    return not c.libc_needed or Relation("libc6", ">=", c.libc_needed).satisfied_by(m.libc or "0")


# ---- choosing a version -----------------------------------------------------------------------
def check_spec(spec: object, what: str = "qemu") -> str:
    text = str(spec).strip() if isinstance(spec, (str, int, float)) and not isinstance(spec, bool) else ""
    if not _SPEC_RE.fullmatch(text):
        raise BadInput(f"{what} {spec!r}: write a QEMU series as a string (\"7.2\", \"10.0\") or installed")
    return text


def choose(spec: str, installed_version: str, found: list[Candidate], m: Machine, what: str = "qemu") -> Candidate | None:
    """None for the installed QEMU (asked for, or of the series asked for); else the newest
    runnable candidate of the series; BadInput listing what this machine can have."""
    spec = check_spec(spec, what)
    if spec == "installed" or spec == series_of(installed_version):
        return None
    ok = [c for c in found if c.series == spec and runnable(c, m)]
    if ok:
        return ok[-1]
    raise BadInput(f"{what} {spec}: {available(installed_version, found, m, spec)}")


def available(installed_version: str, found: list[Candidate], m: Machine, spec: str = "") -> str:
    """One line: what Debian has for this machine, and what it has that needs a newer C library."""
    ok: dict[str, list[str]] = {}
    for c in found:
        if runnable(c, m) and c.series != series_of(installed_version):
            ok.setdefault(c.series, []).append(c.suite)
    have = [f"{s} ({', '.join(sorted(set(suites), key=_suite_order))})" for s, suites in ok.items()]
    have.append(f"{series_of(installed_version)} (installed)")
    head = (f"Debian has no qemu-system-x86 {spec} for this machine; " if spec else "") + \
        f"available: {', '.join(have)}"
    too_new = [f"{c.series} in {c.suite} (glibc >= {c.libc_needed})" for c in found if not runnable(c, m)]
    if not too_new:
        return head
    return head + f"; newer builds need a newer glibc than this machine's {m.libc.split('-')[0] or '?'}: " + \
        ", ".join(too_new)


def _suite_order(suite: str) -> int:
    return kernels.SUITES.index(suite) if suite in kernels.SUITES else len(kernels.SUITES)


@dataclass(frozen=True)
class Deb:
    name: str
    version: str
    suite: str
    why: str  # "QEMU", "QEMU's own source", or the relation that needed it


def closure(pick: Candidate, by_suite: dict[str, list[dict[str, str]]], m: Machine) -> tuple[list[Deb], list[str]]:
    """(the packages to fetch for `pick`, the sibling Depends left to the machine or unmet).

    qemu-system-x86 and its siblings in its own version (from its suite); every other Depends of
    what is fetched, unless the machine satisfies it, as the newest runnable version that does,
    preferring `pick`'s suite. EnvironmentProblem when one cannot be had (libc6 never is)."""
    index: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for suite, found in by_suite.items():
        for f in found:
            index.setdefault(f["Package"], []).append((suite, f))
    order = list(by_suite)

    def find(rel: Relation) -> tuple[str, dict[str, str]] | None:
        fits = [(s, f) for s, f in index.get(rel.name, []) if rel.satisfied_by(f["Version"])
                and all(Relation("libc6", ">=", a.version).satisfied_by(m.libc or "0")
                        for alts in depends(f.get("Depends", "")) for a in alts if a.name == "libc6" and a.op)]
        if not fits:
            return None
        same = [x for x in fits if x[0] == pick.suite]
        return max(same or fits, key=lambda x: (kernels.debian_key(x[1]["Version"]), -order.index(x[0])))

    main = next((f for s, f in index.get(PACKAGE, []) if s == pick.suite and f["Version"] == pick.version), None)
    if main is None:
        raise EnvironmentProblem(f"qemu-system-x86 {pick.version} is not in the {pick.suite} list")
    source_version = main["Version"]
    fetch: dict[str, Deb] = {PACKAGE: Deb(PACKAGE, pick.version, pick.suite, "QEMU")}
    stanza_of = {PACKAGE: main}
    unmet_optional: list[str] = []
    for name in SIBLINGS:
        rel = next((a for alts in depends(main.get("Depends", "")) for a in alts if a.name == name), Relation(name))
        # the sibling of QEMU's own build: its version, or the source version of an arch-all package
        own = [f for s, f in index.get(name, []) if s == pick.suite and rel.satisfied_by(f["Version"])
               and f["Version"] in (source_version, _source_version(main))]
        if not own:
            raise EnvironmentProblem(f"{name} for qemu-system-x86 {pick.version} is not in the {pick.suite} list")
        fetch[name] = Deb(name, own[0]["Version"], pick.suite, "QEMU's own source")
        stanza_of[name] = own[0]
    todo = [PACKAGE]
    while todo:
        name = todo.pop(0)
        for alts in depends(stanza_of[name].get("Pre-Depends", "") + "," + stanza_of[name].get("Depends", "")):
            if any(a.name in fetch and a.satisfied_by(fetch[a.name].version) for a in alts):
                continue
            if any(m.satisfies(a) for a in alts):
                continue
            wanted = " | ".join(map(str, alts))
            if any(a.name in NEVER_FETCHED for a in alts):
                raise EnvironmentProblem(f"qemu-system-x86 {pick.version} needs {wanted}; this machine has "
                                         f"libc6 {m.libc or 'none'}, and offlab does not bring a C library")
            got = next(((a, x) for a in alts if (x := find(a)) is not None), None)
            if got is None:
                raise EnvironmentProblem(f"qemu-system-x86 {pick.version} needs {wanted} ({name}'s Depends): "
                                         f"neither installed here nor in the archive's lists")
            rel, (suite, f) = got
            fetch[rel.name] = Deb(rel.name, f["Version"], suite, f"{name}: {wanted}")
            stanza_of[rel.name] = f
            todo.append(rel.name)
    for name in SIBLINGS:  # their own Depends serve modules loaded on demand: not fetched, named
        for alts in depends(stanza_of[name].get("Depends", "")):
            if not any(m.satisfies(a) or (a.name in fetch and a.satisfied_by(fetch[a.name].version)) for a in alts):
                unmet_optional.append(" | ".join(map(str, alts)))
    return list(fetch.values()), unmet_optional


def _source_version(stanza: dict[str, str]) -> str:
    """'qemu (1:7.2+dfsg-7+deb12u18)' → that version (a binNMU's source); else the package's own."""
    m = re.search(r"\(([^)]+)\)", stanza.get("Source", ""))
    return m.group(1) if m else stanza["Version"]


# ---- the archive's lists ---------------------------------------------------------------------
def lists(packages: tuple[str, ...] | None = (PACKAGE, *SIBLINGS)) -> dict[str, list[dict[str, str]]]:
    """suite → the stanzas of `packages` (None: all) in offlab's apt lists, fetched first if there
    are none (kernels.index); suites in kernels.SUITES order."""
    data = kernels.index()
    state = kernels.state_dir()
    out: dict[str, list[dict[str, str]]] = {}
    for suite in data.get("suites", []):
        found = sorted((state / "lists").glob(f"*_dists_{suite}_main_binary-amd64_Packages*"))
        if not found:
            continue
        text = LOCAL.run([kernels.APT_HELPER, "cat-file", str(found[0])], timeout=120).stdout
        if packages is not None:
            want = "|".join(map(re.escape, packages))
            text = "\n\n".join(m.group(0) for m in re.finditer(rf"^Package: (?:{want})\n.*?(?=\n\n|\Z)", text,
                                                                re.S | re.M))
        out[suite] = stanzas(text)
    return out


def known_candidates() -> list[Candidate]:
    """The archive's qemu-system-x86 versions: read from offlab's lists once per change of them
    (kept in vm/qemu/candidates.json; reading six suites' lists takes seconds)."""
    stamp = list(_stat(kernels.state_dir() / "index.json") or ())
    cache = qemu_root() / "candidates.json"
    try:
        data = json.loads(cache.read_text())
        if data["stamp"] == stamp:
            return [Candidate(**c) for c in data["candidates"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    found = candidates(lists())
    stamp = list(_stat(kernels.state_dir() / "index.json") or ())  # lists() may have fetched them just now
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"stamp": stamp, "candidates": [asdict(c) for c in found]}) + "\n")
        os.replace(tmp, cache)
    except OSError:
        pass  # only a shortcut
    return found


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
        return st.st_size, st.st_mtime_ns
    except OSError:
        return None


# ---- what runs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Qemu:
    """One QEMU offlab can run: the installed one, or one unpacked into the cache."""

    version: str  # as `--version` prints it: 7.2.22, 10.0.2
    package_version: str  # Debian's: 1:7.2+dfsg-7+deb12u18+b3
    suite: str  # "installed" or the archive suite it came from
    binary: str
    env: tuple[tuple[str, str], ...] = ()  # QEMU_MODULE_DIR, LD_LIBRARY_PATH for an unpacked one
    data_dirs: tuple[str, ...] = ()  # -L for an unpacked one: its own data, then its firmware packages

    @property
    def series(self) -> str:
        return series_of(self.version)

    @property
    def installed(self) -> bool:
        return self.suite == "installed"

    def argv(self) -> list[str]:
        """What starts it: the binary, behind `env` for an unpacked one (same process: env execs)."""
        if not self.env:
            return [self.binary]
        return ["env", *(f"{k}={v}" for k, v in self.env), self.binary]

    def data_args(self) -> list[str]:
        return [a for d in self.data_dirs for a in ("-L", d)]

    def to_json(self) -> dict:
        return asdict(self)


def qemu_root() -> Path:
    from offlab.vm.image import cache_root

    return cache_root() / "qemu"


def _dir_name(version: str) -> str:
    return version.replace(":", "%3a")


def resolve(spec: str | None, what: str = "qemu") -> Qemu:
    """The QEMU `spec` names, fetched and unpacked first if it is not in the cache. BadInput (one
    line, nothing fetched) for a version this machine cannot have."""
    from offlab.vm import qemu as vm_qemu

    spec = check_spec(spec if spec is not None else "installed", what)
    installed = vm_qemu.installed()
    if spec == "installed" or spec == installed.series:
        return installed
    cached = _cached_of(spec)
    if cached is not None:
        return cached
    m = machine()
    pick = choose(spec, installed.version, known_candidates(), m, what)
    assert pick is not None
    return unpack(pick, m)


def check_known(spec: object, what: str = "qemu") -> None:
    """`spec`'s form, and that this machine can have it where offlab has the archive's lists already
    (no network): for checking a plan."""
    from offlab.vm import qemu as vm_qemu

    text = check_spec(spec, what)
    if text == "installed" or _cached_of(text) is not None:
        return
    if not (kernels.state_dir() / "index.json").exists():
        return
    try:
        installed = vm_qemu.installed().version
    except EnvironmentProblem:
        return
    choose(text, installed, known_candidates(), machine(), what)


def unpack(pick: Candidate, m: Machine) -> Qemu:
    """Fetch `pick` and what it needs, unpack it into the cache, check it with ldd; the Qemu."""
    by_suite = lists(None)
    debs, optional = closure(pick, by_suite, m)
    uris = kernels.archive_uris()
    files = []
    for deb in debs:
        f = next(x for x in by_suite[deb.suite] if x["Package"] == deb.name and x["Version"] == deb.version)
        base = uris["security" if deb.suite.endswith("-security") else "debian"]
        files += kernels.fetch(kernels.Release(deb.name, deb.version, deb.suite, (kernels.Deb(
            deb.name, deb.version, f"{base}/{f['Filename']}", f["SHA256"], int(f["Size"])),)))
    root_dir = qemu_root()
    root_dir.mkdir(parents=True, exist_ok=True)
    with kernels._lock("qemu"):
        target = root_dir / _dir_name(pick.version)
        if (target / MANIFEST).exists():
            return _load(target)
        tmp = root_dir / f".unpack-{_dir_name(pick.version)}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            (tmp / "root").mkdir(parents=True)
            for path in files:
                LOCAL.run(["dpkg-deb", "-x", str(path), str(tmp / "root")], timeout=300)
            planned = _qemu_in(tmp, target, pick, debs)
            unloadable, version = _check_libraries(tmp, planned, target)
            qemu = replace(planned, version=version)
            manifest = {"qemu": qemu.to_json(), "debs": [asdict(d) for d in debs],
                        "files": [str(f) for f in files], "sibling_depends_not_fetched": optional,
                        "modules_that_cannot_load": unloadable, "unpacked_at": time.time()}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return _load(target)


def _qemu_in(tree: Path, target: Path, pick: Candidate, debs: list[Deb]) -> Qemu:
    """How the QEMU unpacked in `tree` will run once it is renamed to `target`."""
    root = target / "root"
    env = [("QEMU_MODULE_DIR", str(root / MODULE_DIR))]
    libdirs = [str(root / d) for d in ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu")
               if any(x.name not in (PACKAGE, *SIBLINGS) for x in debs) and _has_libraries(tree / "root" / d)]
    if libdirs:
        env.append(("LD_LIBRARY_PATH", ":".join(libdirs)))
    fetched = {d.name for d in debs}
    firmware = [str(root / d) if name in fetched else f"/{d}" for name, d in FIRMWARE_DIRS.items()]
    return Qemu(series_of(pick.version), pick.version, pick.suite, str(root / BINARY), tuple(env),
                (str(root / DATA_DIR), *firmware))


def _has_libraries(d: Path) -> bool:
    return d.is_dir() and any(p.name.startswith("lib") and ".so" in p.name for p in d.iterdir())


def _check_libraries(tmp: Path, final: Qemu, target: Path) -> tuple[list[str], str]:
    """ldd of the binary and the TCG module find every library (EnvironmentProblem naming the missing
    ones); (the other modules that cannot load here, the version `--version` prints)."""
    moved = lambda p: p.replace(str(target), str(tmp))  # noqa: E731  paths inside the temporary tree
    env = [(k, moved(v)) for k, v in final.env]
    binary, modules = Path(moved(final.binary)), Path(moved(str(target / "root" / MODULE_DIR)))
    def missing(path: Path) -> list[str]:
        res = LOCAL.run(["env", *(f"{k}={v}" for k, v in env), "ldd", str(path)], check=False, timeout=60)
        return [line.split("=>")[0].strip() for line in res.stdout.splitlines() if "not found" in line]

    for must in (binary, modules / TCG_MODULE):
        if must.exists() and (lost := missing(must)):
            raise EnvironmentProblem(f"QEMU {final.package_version}: {must.name} needs {', '.join(lost)}, found neither "
                                     f"on this machine nor in the packages offlab fetched")
    unloadable = []
    for mod in sorted(modules.glob("*.so")) if modules.is_dir() else []:
        lost = missing(mod)
        if lost:
            unloadable.append(f"{mod.name} ({', '.join(lost)})")
    out = LOCAL.run(["env", *(f"{k}={v}" for k, v in env), str(binary), "--version"], timeout=30).stdout
    m = re.search(r"version (\d+\.\d+(?:\.\d+)?)", out)
    if not m:
        raise EnvironmentProblem(f"QEMU {final.package_version} unpacked does not run: {out.strip()[:120]!r}")
    return unloadable, m.group(1)


def _load(target: Path) -> Qemu:
    data = json.loads((target / MANIFEST).read_text())
    return Qemu(**{**data["qemu"], "env": tuple(tuple(x) for x in data["qemu"]["env"]),
                   "data_dirs": tuple(data["qemu"]["data_dirs"])})


def _cached_of(spec: str) -> Qemu | None:
    for c in cached():
        if c.qemu.series == spec:
            return c.qemu
    return None


# ---- what cannot boot ------------------------------------------------------------------------
# QEMU series and guest kernel releases seen not to boot together here (TCG), each with why;
# measured, not guessed (docs/vm.md "QEMU versions"). A lab refuses them (exit 3), a plan skips them.
_PANIC_72 = ("Debian's QEMU 7.2 (TCG) panics this kernel early in boot (general protection fault in "
             "do_sync_core, double fault in kmem_cache_alloc_noprof), with the fast and the classic boot")
UNBOOTABLE: dict[tuple[str, str], str] = {
    ("7.2", "6.12.95+deb12"): _PANIC_72,
}


def cannot_boot(q: Qemu, kernel_release: str) -> str | None:
    """Why QEMU `q` cannot boot a guest kernel (`uname -r`, with or without -cloud-amd64), or None."""
    abi = kernel_release.removesuffix("-cloud-amd64")
    why = UNBOOTABLE.get((q.series, abi))
    if why is None:
        return None
    return f"QEMU {q.version} cannot boot guest kernel {abi}: {why}"


# ---- what is cached ---------------------------------------------------------------------------
@dataclass
class Cached:
    qemu: Qemu
    dir: str
    bytes: int  # the unpacked tree and the .deb files only it uses
    debs: list[str]
    modules_that_cannot_load: list[str]


def cached() -> list[Cached]:
    root = qemu_root()
    out = []
    for manifest in sorted(root.glob(f"*/{MANIFEST}")) if root.exists() else []:
        try:
            data = json.loads(manifest.read_text())
            q = _load(manifest.parent)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        files = [Path(f) for f in data.get("files", [])]
        size = kernels._disk_use(manifest.parent) + sum(f.stat().st_blocks * 512 for f in files if f.exists())
        out.append(Cached(q, str(manifest.parent), size, [str(f) for f in files],
                          data.get("modules_that_cannot_load", [])))
    return sorted(out, key=lambda c: kernels.debian_key(c.qemu.package_version))


def remove(spec: str) -> Cached:
    """Remove an unpacked QEMU and its .deb files; BadInput naming what is cached."""
    text = str(spec).strip()
    have = cached()
    hits = [c for c in have if text in (c.qemu.series, c.qemu.version, c.qemu.package_version)]
    if len(hits) != 1:
        listed = ", ".join(f"{c.qemu.version} ({c.qemu.suite})" for c in have) or "none"
        why = "names several" if hits else "is not"
        raise BadInput(f"--remove {text}: {why} in the cache (cached: {listed}; the installed QEMU is not "
                       f"offlab's to remove)")
    gone = hits[0]
    others = {f for c in have if c is not gone for f in c.debs}
    shutil.rmtree(gone.dir, ignore_errors=True)
    for f in gone.debs:
        if f not in others:
            Path(f).unlink(missing_ok=True)
    return gone


__all__ = ["Candidate", "Machine", "Qemu", "Relation", "available", "cached", "check_known", "check_spec",
           "choose", "closure", "depends", "remove", "resolve", "series_of", "stanzas"]
