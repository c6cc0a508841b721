"""Debian cloud kernels from the whole archive, fetched with offlab's own apt state.

offlab keeps a private apt state under its cache (`vm/archive/`: a sources list, a lists directory
and a cache directory) naming the suites that carry guest kernels (SUITES) on the archive the
machine's own apt sources name. `apt-get update` on that state checks every suite's signature with
Debian's archive keyring; the machine's sources, lists and installed packages are never touched.
From the signed package lists offlab makes an index of the cloud kernels (`index.json`) and fetches
a kernel's packages with `apt-helper download-file`, which checks each file's SHA256 against the
signed lists, into `vm/debs/` once.

A kernel is asked for as a series (`6.12`: its newest release), an exact release as Debian names
it (`6.12.57+deb12`, `6.1.0-56`; or the upstream version `6.1.192`), or `newest`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from offlab.errors import BadInput, EnvironmentProblem
from offlab.hosts import LOCAL

# Suites that carry cloud kernels, oldest first (bookworm-security holds the newer 6.1 ABIs).
SUITES = ("bookworm", "bookworm-security", "bookworm-backports", "trixie", "trixie-backports", "sid")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
APT_SOURCES = Path("/etc/apt")
APT_HELPER = "/usr/lib/apt/apt-helper"
# A cloud kernel's packages: linux-image-ABI-cloud-amd64 holds everything up to 6.18; from 6.19 it
# is empty and depends on linux-binary- (the kernel), linux-modules- and linux-base- of the same ABI.
_PACKAGE_RE = re.compile(r"^linux-(image|binary|modules|base)-(\d+\.\d+[0-9A-Za-z.+~-]*)-cloud-amd64$")
_SPEC_RE = re.compile(r"^(newest|\d+\.\d+|\d+\.\d+\.\d+(\.\d+)?([-+~][0-9A-Za-z.+~-]{1,30})?)$")
_FIELDS = ("Package", "Version", "Depends", "Filename", "SHA256", "Size")


@dataclass(frozen=True)
class Deb:
    name: str
    version: str
    url: str
    sha256: str
    size: int

    @property
    def file(self) -> str:
        return f"{self.name}_{self.version.replace(':', '%3a')}_amd64.deb"


@dataclass(frozen=True)
class Release:
    """One cloud kernel release in the archive: its ABI (uname -r is ABI + -cloud-amd64) and packages."""

    abi: str  # 6.12.57+deb12, 6.1.0-56
    version: str  # the package version, 6.12.57-1~bpo12+1
    suite: str
    debs: tuple[Deb, ...] = field(default=())

    @property
    def name(self) -> str:
        return f"linux-image-{self.abi}-cloud-amd64"

    @property
    def upstream(self) -> str:
        return self.version.split(":")[-1].split("-")[0]

    @property
    def series(self) -> str:
        return ".".join(self.upstream.split(".")[:2])


def state_dir() -> Path:
    from offlab.vm.image import cache_root

    return cache_root() / "archive"


def debs_dir() -> Path:
    from offlab.vm.image import cache_root

    return cache_root() / "debs"


# ---- the archive the machine's apt names ----------------------------------------------------
def archive_uris(etc: Path = APT_SOURCES) -> dict[str, str]:
    """{"debian": URI, "security": URI} from the machine's own apt sources (deb822 and one-line).

    OFFLAB_DEBIAN_MIRROR replaces both (security as MIRROR-security, Debian's layout)."""
    mirror = os.environ.get("OFFLAB_DEBIAN_MIRROR")
    if mirror:
        return {"debian": mirror.rstrip("/"), "security": mirror.rstrip("/") + "-security"}
    found: dict[str, str] = {}
    for uri, suites in _source_entries(etc):
        for suite in suites:
            kind = "security" if suite.endswith("-security") else "debian"
            if _debian_suite(suite) and kind not in found:
                found[kind] = uri.rstrip("/")
    return found


def _debian_suite(suite: str) -> bool:
    return suite.split("-")[0] in ("bookworm", "trixie", "forky", "sid", "stable", "testing", "unstable")


def _source_entries(etc: Path) -> list[tuple[str, list[str]]]:
    entries = []
    files = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]
    for f in files:
        try:
            lines = f.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb":
                entries.append((words[1], [words[2]]))
    for f in sorted((etc / "sources.list.d").glob("*.sources")):
        try:
            text = f.read_text()
        except OSError:
            continue
        for stanza in re.split(r"\n\s*\n", text):
            fields = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[0].isspace():
                    continue
                k, v = line.split(":", 1)
                fields[k.strip().lower()] = v.split()
            if "deb" in fields.get("types", []) and fields.get("enabled", ["yes"]) != ["no"]:
                entries += [(uri, fields.get("suites", [])) for uri in fields.get("uris", [])]
    return entries


# ---- the private apt state ------------------------------------------------------------------
def apt_options(state: Path) -> list[str]:
    """apt options that confine apt to `state`: its own sources, lists and cache, none of the machine's
    sources or pins (its apt.conf still applies, e.g. a proxy; dpkg's status is only read), and only
    the package lists fetched."""
    opts = {
        "Dir::Etc::sourcelist": str(state / "sources.list"), "Dir::Etc::sourceparts": str(state / "empty"),
        "Dir::Etc::preferences": str(state / "empty/preferences"), "Dir::Etc::preferencesparts": str(state / "empty"),
        "Dir::State::Lists": str(state / "lists"), "Dir::Cache": str(state / "cache"),
        "Acquire::Languages": "none", "APT::Architectures": "amd64", "APT::Sandbox::User": "root",
        # the machine's appstream config asks for DEP-11 metadata (15 MB) that no kernel needs
        "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled": "false",
        "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled": "false",
        "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled": "false",
        "Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled": "false",
    }
    return [a for k, v in opts.items() for a in ("-o", f"{k}={v}")]


def sources_list(uris: dict[str, str]) -> tuple[str, list[str]]:
    """The private sources.list text and the suites it names (security only where the machine names its archive)."""
    lines, suites = [], []
    for suite in SUITES:
        uri = uris.get("security" if suite.endswith("-security") else "debian")
        if uri:
            lines.append(f"deb [signed-by={KEYRING}] {uri} {suite} main\n")
            suites.append(suite)
    return "".join(lines), suites


def update(state: Path | None = None) -> dict:
    """`apt-get update` on offlab's own apt state, then the index of cloud kernels. Exit 3 naming
    every suite that could not be fetched or verified."""
    state = state or state_dir()
    uris = archive_uris()
    if "debian" not in uris:
        raise EnvironmentProblem(f"no Debian archive in the machine's apt sources ({APT_SOURCES}/sources.list*): "
                                 f"offlab fetches guest kernels from the archive they name (or set OFFLAB_DEBIAN_MIRROR)")
    if not os.path.exists(KEYRING):
        raise EnvironmentProblem(f"{KEYRING} is missing: `apt-get install debian-archive-keyring`")
    for d in ("lists/partial", "cache/archives/partial", "empty"):
        (state / d).mkdir(parents=True, exist_ok=True)
    text, suites = sources_list(uris)
    (state / "sources.list").write_text(text)
    start = time.monotonic()
    res = LOCAL.run(["apt-get", "-q", *apt_options(state), "update"], check=False, timeout=900)
    failed = unreachable_suites(res.stdout + "\n" + res.stderr, suites)
    if failed or not res.ok:
        last = (res.stderr.strip().splitlines() or res.stdout.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"Debian archive suite{'s' if len(failed) > 1 else ''} {', '.join(failed) or '?'} "
                                 f"could not be reached or verified ({uris['debian']}): {last.strip()}")
    index = make_index(state, suites, uris)
    index["update_seconds"] = round(time.monotonic() - start, 1)
    _write_json(state / "index.json", index)
    return index


def unreachable_suites(output: str, suites: list[str]) -> list[str]:
    """The suites apt-get update names in an Err line, a failed fetch or a signature error."""
    bad = []
    for line in output.splitlines():
        if not re.match(r"^(Err:\d+|W: Failed to fetch|E: Failed to fetch|W: GPG error|E: The repository|"
                        r"W: The repository|E: Release file)", line.strip()):
            continue
        for suite in suites:
            if re.search(rf"(\s|/dists/|')({re.escape(suite)})(\s|/|'|$)", line) and suite not in bad:
                bad.append(suite)
    return sorted(bad, key=SUITES.index)


def make_index(state: Path, suites: list[str], uris: dict[str, str]) -> dict:
    """{"suites": [...], "releases": [Release as dict, ...]} from the package lists apt fetched."""
    releases: list[Release] = []
    for suite in suites:
        lists = sorted((state / "lists").glob(f"*_dists_{suite}_main_binary-amd64_Packages*"))
        if not lists:
            raise EnvironmentProblem(f"Debian archive suite {suite}: no package list after `apt-get update`")
        base = uris["security" if suite.endswith("-security") else "debian"]
        text = LOCAL.run([APT_HELPER, "cat-file", str(lists[0])], timeout=120).stdout
        releases += releases_in(text, suite, base)
    return {"suites": suites, "releases": [asdict(r) for r in releases], "updated_at": time.time()}


def releases_in(packages_text: str, suite: str, base: str) -> list[Release]:
    """The cloud kernel releases in one suite's Packages text (Debian's own format)."""
    stanzas: dict[tuple[str, str], dict] = {}
    for m in re.finditer(r"^Package: linux-(?:image|binary|modules|base)-\d[^\n]*-cloud-amd64\n.*?(?=\n\n|\Z)",
                         packages_text, re.S | re.M):
        fields = {}
        for line in m.group(0).splitlines():
            k, _, v = line.partition(": ")
            if k in _FIELDS:
                fields[k] = v.strip()
        if _PACKAGE_RE.match(fields.get("Package", "")) and "Filename" in fields:
            stanzas[(fields["Package"], fields["Version"])] = fields
    out = []
    for (name, version), f in stanzas.items():
        kind, abi = _PACKAGE_RE.match(name).groups()
        if kind != "image":
            continue
        parts = []
        for dep in f.get("Depends", "").split(","):
            dm = re.match(r"\s*(linux-(?:binary|modules|base)-\S+-cloud-amd64)\s*\(=\s*([^)\s]+)\)", dep)
            if dm and (dm.group(1), dm.group(2)) in stanzas:
                parts.append(stanzas[(dm.group(1), dm.group(2))])
        debs = [f] if not parts else parts  # from 6.19 the image package is empty: its parts hold the files
        out.append(Release(abi, version, suite, tuple(
            Deb(d["Package"], d["Version"], f"{base}/{d['Filename']}", d["SHA256"], int(d["Size"])) for d in debs)))
    return out


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def index(refresh: bool = False) -> dict:
    """The kernel index, fetching the lists first when there are none yet (or `refresh`)."""
    path = state_dir() / "index.json"
    if not refresh:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            pass
    with _lock("update"):
        if not refresh:  # another offlab may have fetched it meanwhile
            try:
                return json.loads(path.read_text())
            except (OSError, ValueError):
                pass
        return update()


def releases(data: dict) -> list[Release]:
    """The index's releases, one per ABI and version (the first suite that has it), oldest first."""
    seen: dict[tuple[str, str], Release] = {}
    for r in data.get("releases", []):
        rel = Release(r["abi"], r["version"], r["suite"], tuple(Deb(**d) for d in r["debs"]))
        seen.setdefault((rel.abi, rel.version), rel)
    return sorted(seen.values(), key=lambda r: debian_key(r.version))


# ---- choosing a release ---------------------------------------------------------------------
def check_spec(spec: str, what: str = "kernel_version") -> str:
    spec = spec.strip()
    if not _SPEC_RE.fullmatch(spec):
        raise BadInput(f"{what} {spec!r}: write a series (6.12), a release as Debian names it (6.12.57+deb12, "
                       f"6.1.0-56) or newest")
    return spec


def choose(spec: str, known: list[Release], what: str = "kernel_version") -> Release:
    """The release `spec` names among `known` (oldest first); BadInput with the nearest that exist."""
    spec = check_spec(spec, what)
    if spec == "newest":
        if not known:
            raise EnvironmentProblem("the Debian archive index lists no cloud kernel")
        return known[-1]
    if re.fullmatch(r"\d+\.\d+", spec):
        found = [r for r in known if r.series == spec]
    else:
        found = [r for r in known if r.abi == spec] or [r for r in known if r.upstream == spec]
    if found:
        return found[-1]
    near = nearest(spec, known)
    series = sorted({r.series for r in known}, key=_numbers)
    hint = (f"series: {', '.join(series)}" if re.fullmatch(r"\d+\.\d+", spec)
            else f"nearest: {', '.join(near)}")
    raise BadInput(f"{what} {spec}: Debian's archive has no cloud kernel {spec}; {hint}")


def nearest(spec: str, known: list[Release], n: int = 4) -> list[str]:
    """The releases closest to `spec` by version numbers, as ABIs, in version order."""
    want = _numbers(spec)
    ranked = sorted(known, key=lambda r: (_distance(want, _numbers(r.upstream)), debian_key(r.version)))
    return [r.abi for r in sorted(ranked[:n], key=lambda r: debian_key(r.version))]


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0].split("-")[0])[:3])


def _distance(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    a, b = (a + (0, 0, 0))[:3], (b + (0, 0, 0))[:3]
    return tuple(abs(x - y) for x, y in zip(a, b, strict=True))


def resolve(spec: str, what: str = "kernel_version") -> Release:
    """The archive's release for `spec`; the lists are fetched first when offlab has none yet."""
    check_spec(spec, what)
    return choose(spec, releases(index()), what)


def check_known(spec: str, what: str = "kernel_version") -> None:
    """`spec`'s form, and that it exists where offlab has the archive's index already (no network)."""
    check_spec(spec, what)
    try:
        data = json.loads((state_dir() / "index.json").read_text())
    except (OSError, ValueError):
        return
    choose(spec, releases(data), what)


# ---- fetching -------------------------------------------------------------------------------
def fetch(release: Release) -> list[Path]:
    """The release's .deb files in the cache, each downloaded (SHA256 checked) only if absent."""
    out = []
    debs = debs_dir()
    debs.mkdir(parents=True, exist_ok=True)
    with _lock("fetch"):
        for deb in release.debs:
            path = debs / deb.file
            if not (path.exists() and path.stat().st_size == deb.size):
                part = debs / f".{deb.file}.{os.getpid()}.part"
                res = LOCAL.run([APT_HELPER, "-o", "APT::Sandbox::User=root", "download-file", deb.url, str(part),
                                 f"SHA256:{deb.sha256}"], check=False, timeout=1800)
                if not res.ok or not part.exists():
                    part.unlink(missing_ok=True)
                    last = (res.stderr.strip().splitlines() or res.stdout.strip().splitlines() or ["no output"])[-1]
                    raise EnvironmentProblem(f"Debian archive suite {release.suite}: {deb.name} {deb.version} could "
                                             f"not be fetched: {last.strip()}")
                os.replace(part, path)
            out.append(path)
    return out


def _lock(name: str):
    state = state_dir()
    state.mkdir(parents=True, exist_ok=True)
    f = open(state / f".{name}.lock", "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


# ---- what is cached -------------------------------------------------------------------------
@dataclass
class Cached:
    abi: str
    version: str
    suite: str | None
    deb_bytes: int
    images: list[str]  # image directories built from it
    image_bytes: int
    files: list[str]


def cached() -> list[Cached]:
    """The kernels whose packages are in the cache, with the images built from them and their disk use."""
    from offlab.vm.image import cache_root

    debs = debs_dir()
    try:
        data = json.loads((state_dir() / "index.json").read_text())
    except (OSError, ValueError):
        data = {}
    suites = {(r["abi"], r["version"]): r["suite"] for r in data.get("releases", [])}
    found: dict[tuple[str, str], Cached] = {}
    for f in sorted(debs.glob("linux-*.deb")) if debs.exists() else []:
        m = re.match(r"^(linux-(?:image|binary|modules|base)-(.+)-cloud-amd64)_([^_]+)_amd64\.deb$", f.name)
        if not m:
            continue
        abi, version = m.group(2), m.group(3).replace("%3a", ":")
        c = found.setdefault((abi, version), Cached(abi, version, suites.get((abi, version)), 0, [], 0, []))
        c.deb_bytes += f.stat().st_size
        c.files.append(str(f))
    for d in sorted(cache_root().glob("*/image.json")):
        try:
            img = json.loads(d.read_text())
        except (OSError, ValueError):
            continue
        abi = img.get("kernel_package", "")[len("linux-image-"):-len("-cloud-amd64")]
        key = (abi, img.get("kernel_package_version", ""))
        c = found.setdefault(key, Cached(key[0], key[1], suites.get(key), 0, [], 0, []))
        c.images.append(str(d.parent))
        c.image_bytes += _disk_use(d.parent)
    return sorted(found.values(), key=lambda c: debian_key(c.version))


def _disk_use(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def remove(spec: str) -> Cached:
    """Remove a cached kernel's packages and the images built from it; BadInput naming what is cached."""
    have = cached()
    spec = spec.strip()
    if re.fullmatch(r"\d+\.\d+", spec):
        hits = [c for c in have if ".".join(c.version.split(":")[-1].split("-")[0].split(".")[:2]) == spec]
    else:
        hits = [c for c in have if spec in (c.abi, c.version.split(":")[-1].split("-")[0])]
    if len(hits) != 1:
        listed = ", ".join(c.abi for c in have) or "none"
        why = "names several" if hits else "is not"
        raise BadInput(f"--remove {spec}: {why} in the cache (cached: {listed}); name one release")
    c = hits[0]
    for f in c.files:
        Path(f).unlink(missing_ok=True)
    for d in c.images:
        shutil.rmtree(d, ignore_errors=True)
    return c


# ---- Debian version order (Debian Policy 5.6.12) --------------------------------------------
def debian_key(version: str) -> tuple:
    epoch, _, rest = version.rpartition(":") if ":" in version else ("0", "", version)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "0")
    return (int(epoch or 0), _part_key(upstream), _part_key(revision))


def _part_key(text: str) -> tuple:
    out = []
    for alpha, num in re.findall(r"([^0-9]*)([0-9]*)", text):
        if not alpha and not num:
            continue
        out.append(tuple(_char_order(c) for c in alpha) + (_char_order(""),))
        out.append(int(num or 0))
    out.append((_char_order(""),))
    return tuple(out)


def _char_order(c: str) -> int:
    if c == "~":
        return -1
    if c == "":
        return 0
    return ord(c) if c.isalpha() else ord(c) + 256
