"""The guest image: a Debian cloud kernel and a busybox initramfs, built into a cache.

Built for a fast boot under TCG: the kernel is also kept decompressed (`vmlinux`, booted through
its PVH entry point, so the guest does not spend seconds decompressing itself) when the package's
kernel has one, and the initramfs is an uncompressed cpio (unpacking a gzip one cost the guest
~0.6–1.4 s; copying 22 MB into QEMU costs it nothing measurable).

Everything comes from Debian packages on this machine or its archive: the default kernel package is
fetched with `apt-get download`, one asked for by version from any suite of the archive with offlab's
own apt state (offlab.vm.kernels); either is unpacked with `dpkg-deb -x` (never installed), busybox-static
gives the userland, and the binaries the guest runs (iperf3, ethtool, iproute2, tcpdump,
offlab-engine, offlab-agent) are copied from the host with every library `ldd` names. The cache key hashes
every input, so a changed input builds a new image; an image is built in a temporary directory
and renamed into place, so a half-written one is never used.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import lzma
import os
import re
import shutil
import stat
import struct
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from offlab.state import private_tmp
from offlab.errors import EnvironmentProblem
from offlab.hosts import LOCAL, which
from offlab.vm import guestfs, kernels

BUILDER_VERSION = "4"  # 4: LZ4 kernels (Debian up to 6.1) unpacked for PVH too
DEFAULT_SERIES = "6.12"  # virtio-net USO in the guest needs >= 6.2
DEFAULT_CACHE = "/var/cache/offlab"
INSTALL_HINT = "run `scripts/install-deps` as root (adds bookworm-backports, installs qemu-system-x86 and busybox-static)"

# Host binaries the guest gets (busybox provides sysctl, ping, ps and the rest).
GUEST_BINARIES = ("iperf3", "ethtool", "ip", "ss", "nstat", "tc", "tcpdump")
# Debian's busybox prefers its own applets to PATH, in its shell and in every applet that runs a
# command (taskset ip ... would run busybox's ip): so the command shell is dash, and the
# helpers that exec an argv are the real ones too.
EXEC_HELPERS = ("dash", "env", "taskset", "timeout", "setsid", "nice", "nohup")
# What a virtio-net NIC and the virtio-serial channel need; built in on some kernels.
GUEST_MODULES = ("virtio_pci", "virtio_console", "virtio_net")

_PASSWD = "root:x:0:0:root:/root:/bin/sh\ntcpdump:x:104:104:tcpdump:/nonexistent:/bin/false\n"
_GROUP = "root:x:0:\ntcpdump:x:104:\n"


def cache_root() -> Path:
    return Path(os.environ.get("OFFLAB_CACHE_DIR", DEFAULT_CACHE)) / "vm"


@dataclass
class Image:
    """A built guest: where its kernel and initramfs are, and what went into them."""

    key: str
    dir: str
    kernel: str  # what QEMU boots: vmlinux (PVH entry) when there is one, else vmlinuz
    initrd: str
    kernel_package: str
    kernel_package_version: str
    kernel_release: str
    modules: list[str] = field(default_factory=list)
    binaries: dict[str, str] = field(default_factory=dict)
    initrd_bytes: int = 0
    built_at: float = 0.0
    build_seconds: float = 0.0
    built_now: bool = False  # this call built it (False: taken from the cache)
    pvh: bool = False  # the kernel is the decompressed vmlinux, entered through PVH
    pvh_why: str = ""  # why not (the guest then boots the bzImage the classic way)
    bzimage: str = ""  # the package's vmlinuz (a boot that wants the classic path)
    kernel_suite: str = ""  # the archive suite it came from ("" : the machine's own apt)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class KernelPackage:
    name: str
    version: str
    suite: str = ""  # set when it comes from offlab's own view of the archive (offlab.vm.kernels)
    debs: tuple = ()  # kernels.Deb: the files that hold it (its parts from 6.19 on)

    @property
    def abi(self) -> str:
        """The name's middle part, e.g. 6.12.95+deb12 (uname -r is this + -cloud-amd64)."""
        return self.name[len("linux-image-"):-len("-cloud-amd64")]


# ---- kernel package ------------------------------------------------------------
def resolve_kernel(kernel_version: str | None = None) -> KernelPackage:
    """The cloud kernel package: by default the newest 6.12 the machine's apt knows; a version asked
    for (a series, a release or newest) from the whole archive (offlab.vm.kernels)."""
    if kernel_version is not None:
        release = kernels.resolve(kernel_version)
        return KernelPackage(release.name, release.version, release.suite, release.debs)
    remembered = _remembered_default_kernel()
    if remembered is not None:
        return remembered
    pattern = "^linux-image-" + re.escape(DEFAULT_SERIES) + r"\.[0-9][^ ]*-cloud-amd64$"
    res = LOCAL.run(["apt-cache", "search", "--names-only", pattern], check=False, timeout=60)
    names = [line.split(" - ")[0].strip() for line in res.stdout.splitlines() if line.strip()]
    names = [n for n in names if re.fullmatch(pattern, n)]
    found = _candidates(names)
    if not found:
        raise EnvironmentProblem(
            f"no Debian cloud kernel package for {DEFAULT_SERIES} in the machine's apt lists "
            f"(linux-image-{DEFAULT_SERIES}*-cloud-amd64): {INSTALL_HINT}, then `apt-get update`; or name one "
            f"with --kernel-version (offlab then fetches it from the archive itself)")
    newest = functools.reduce(lambda a, b: b if _newer(b.version, a.version) else a, found)
    _remember_default_kernel(newest)
    return newest


# Asking apt costs two `apt-cache` runs (1.5-2 CPU-s each where apt keeps no binary cache, as in
# Docker's Debian images): the answer is kept in the guest cache while apt's lists are unchanged
# (size, mtime, inode of the lists directory and dpkg's status), so an image rebuilt after another of
# its inputs changed does not ask again.
_APT_LISTS = ("/var/lib/apt/lists", "/var/lib/dpkg/status")


def _default_kernel_file() -> Path:
    return cache_root() / f"kernel-default-{DEFAULT_SERIES}.json"


def _remembered_default_kernel() -> KernelPackage | None:
    try:
        data = json.loads(_default_kernel_file().read_text())
        if data["apt"] == {f: _meta(f) for f in _APT_LISTS}:
            return KernelPackage(data["name"], data["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _remember_default_kernel(kernel: KernelPackage) -> None:
    path = _default_kernel_file()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"apt": {f: _meta(f) for f in _APT_LISTS}, "name": kernel.name,
                                   "version": kernel.version}) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass  # only a shortcut


def _candidates(names: list[str]) -> list[KernelPackage]:
    if not names:
        return []
    res = LOCAL.run(["apt-cache", "show", "--no-all-versions", *names], check=False, timeout=60)
    found, name = [], None
    for line in res.stdout.splitlines():
        if line.startswith("Package: "):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("Version: ") and name:
            found.append(KernelPackage(name, line.split(":", 1)[1].strip()))
            name = None
    return found


def _newer(a: str, b: str) -> bool:
    return LOCAL.run(["dpkg", "--compare-versions", a, "gt", b], check=False, timeout=10).rc == 0


def fetch_kernel(pkg: KernelPackage) -> list[Path]:
    """The package's .deb files in the cache, downloaded if absent."""
    if pkg.debs:
        return kernels.fetch(kernels.Release(pkg.abi, pkg.version, pkg.suite, pkg.debs))
    return [_apt_download(pkg)]


def _apt_download(pkg: KernelPackage) -> Path:
    """The default kernel's .deb, fetched with the machine's apt (`apt-get download`, nothing installed)."""
    debs = cache_root() / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    deb = debs / f"{pkg.name}_{pkg.version.replace(':', '%3a')}_amd64.deb"
    if deb.exists():
        return deb
    res = LOCAL.run(["env", "-C", str(debs), "apt-get", "-q", "-o", "APT::Sandbox::User=root",
                     "download", f"{pkg.name}={pkg.version}"], check=False, timeout=600)
    if not deb.exists():
        matches = sorted(debs.glob(f"{pkg.name}_*.deb"))
        if res.ok and len(matches) == 1:
            return matches[0]
        last = (res.stderr.strip().splitlines() or ["no file"])[-1]
        raise EnvironmentProblem(f"`apt-get download {pkg.name}={pkg.version}` failed: {last}")
    return deb


# ---- inputs and the cache key -----------------------------------------------------
# offlab's own binaries, built from engine/ by `make install`: the traffic engine and the guest's agent.
OWN_BINARIES = ("offlab-engine", "offlab-agent")


def _engine_path(name: str = "offlab-engine") -> str | None:
    """offlab-engine or offlab-agent (both built by `make install`): next to this Python, else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    return which(name)


def _guest_binaries() -> dict[str, str]:
    """Host path of each binary the guest gets; EnvironmentProblem naming what is missing."""
    found, missing = {}, []
    for tool in (*GUEST_BINARIES, *EXEC_HELPERS):
        path = which(tool)
        if path is None:
            missing.append(tool)
        else:
            found[tool] = os.path.realpath(path)
    for name in OWN_BINARIES:
        path = _engine_path(name)
        if path is None:
            missing.append(name)
        else:
            found[name] = os.path.realpath(path)
    if missing:
        raise EnvironmentProblem(f"the guest image needs {', '.join(missing)}: run `make install` "
                                 f"(or `apt-get install iperf3 ethtool iproute2 tcpdump`)")
    return found


def _busybox() -> str:
    for path in (which("busybox"), "/bin/busybox", "/usr/bin/busybox"):
        if path and os.path.exists(path):
            res = LOCAL.run(["ldd", path], check=False, timeout=10)
            if "not a dynamic executable" in (res.stdout + res.stderr):
                return os.path.realpath(path)
    raise EnvironmentProblem(f"busybox-static is not installed: {INSTALL_HINT}")


def _libraries(binary: str) -> list[str]:
    """Every shared library `ldd` names for a binary (paths as the loader looks them up)."""
    res = LOCAL.run(["ldd", binary], check=False, timeout=30)
    libs = []
    for line in res.stdout.splitlines():
        m = re.search(r"=>\s*(/\S+)", line) or re.match(r"\s*(/\S+)", line)
        if m:
            libs.append(m.group(1))
    return libs


def _sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class _Inputs:
    kernel: KernelPackage
    busybox: str
    binaries: dict[str, str]  # guest path → host path
    libraries: list[str]

    def key(self) -> str:
        h = hashlib.sha256()
        parts = {
            "builder": BUILDER_VERSION,
            "kernel": [self.kernel.name, self.kernel.version],
            "modules": list(GUEST_MODULES),
            "busybox": _sha256(self.busybox),
            "binaries": {dst: _sha256(src) for dst, src in sorted(self.binaries.items())},
            "libraries": {lib: _sha256(lib) for lib in sorted(self.libraries)},
            "files": [guestfs.INITTAB, guestfs.RC, guestfs.FSTAB, guestfs.AGENT, _PASSWD, _GROUP],
        }
        h.update(json.dumps(parts, sort_keys=True).encode())
        return h.hexdigest()[:16]


def _inputs(kernel_version: str | None) -> _Inputs:
    kernel = resolve_kernel(kernel_version)
    busybox = _busybox()
    binaries = {}
    for tool, path in _guest_binaries().items():
        guest = f"/usr/bin/{tool}" if tool in OWN_BINARIES else _guest_location(tool, path)
        binaries[guest] = path
        if tool == "dash":
            binaries["/bin/sh"] = path
    libraries = sorted({lib for path in binaries.values() for lib in _libraries(path)})
    return _Inputs(kernel, busybox, binaries, libraries)


def _guest_location(tool: str, host_path: str) -> str:
    """sbin tools go to /usr/sbin, the rest to /usr/bin (the guest has no merged /usr)."""
    return f"/usr/sbin/{tool}" if "/sbin/" in host_path or tool in ("ip", "tc", "ethtool") else f"/usr/bin/{tool}"


# ---- building -------------------------------------------------------------------
# Hashing every input and asking apt which kernel is newest took seconds per `lab up` (14 s at load
# 11): the key found last time is reused while no file it was computed from has changed (size,
# mtime, inode), no tool resolves elsewhere and apt's lists are unchanged.
_APT_STATE = ("/var/lib/apt/lists", "/var/lib/dpkg/status", "/etc/ld.so.cache")


def _apt_state() -> list[str]:
    return [*_APT_STATE, str(kernels.state_dir() / "index.json")]


def _meta(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _fingerprint(kernel_version: str | None, files: list[str]) -> str:
    parts = {"builder": BUILDER_VERSION, "want": _wanted(kernel_version), "modules": list(GUEST_MODULES),
             "texts": [guestfs.INITTAB, guestfs.RC, guestfs.FSTAB, guestfs.AGENT, _PASSWD, _GROUP],
             "tools": {t: which(t) for t in (*GUEST_BINARIES, *EXEC_HELPERS, "busybox")}, "engine": _engine_path(),
             "files": {f: _meta(f) for f in sorted({*files, *_apt_state()})}}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _remembered(kernel_version: str | None) -> Path:
    return cache_root() / f"inputs-{_wanted(kernel_version)}.json"


def _wanted(kernel_version: str | None) -> str:
    """What the remembered key is for: the default kernel (the machine's apt's newest 6.12) is not the
    series 6.12 asked for by name (the archive's newest 6.12, trixie's +deb13): each its own file, or a
    guest of one would boot the other's image."""
    return kernel_version if kernel_version is not None else f"default-{DEFAULT_SERIES}"


def _remembered_key(kernel_version: str | None) -> str | None:
    try:
        data = json.loads(_remembered(kernel_version).read_text())
        if data["fingerprint"] == _fingerprint(kernel_version, data["files"]):
            return data["key"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _remember(kernel_version: str | None, inputs: _Inputs, key: str) -> None:
    files = [inputs.busybox, *inputs.binaries.values(), *inputs.libraries]
    data = {"key": key, "files": files, "fingerprint": _fingerprint(kernel_version, files)}
    path = _remembered(kernel_version)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass  # only a shortcut


def build(kernel_version: str | None = None) -> Image:
    """The cached image for these inputs, built first if it is not there (or is incomplete)."""
    known = _remembered_key(kernel_version)
    if known is not None:
        image = _load(cache_root() / known)
        if image is not None:
            return image
    inputs = _inputs(kernel_version)
    key = inputs.key()
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / ".lock", "w")
    except PermissionError:
        raise EnvironmentProblem(f"cannot write the guest cache {root}: run as root, or set OFFLAB_CACHE_DIR "
                                 f"to a directory you own") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; the others then find it cached
        image = _load(root / key)
        if image is not None:
            _remember(kernel_version, inputs, key)
            return image
        shutil.rmtree(root / key, ignore_errors=True)  # incomplete: never used
        _remove_stale_temps(root)
        start = time.monotonic()
        tmp = root / f".build-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            image = _build_into(tmp, key, inputs)
            image.build_seconds = round(time.monotonic() - start, 2)
            _write_manifest(tmp, image)
            os.rename(tmp, root / key)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    image = _load(root / key)
    assert image is not None
    _remember(kernel_version, inputs, key)
    image.built_now = True
    image.build_seconds = round(time.monotonic() - start, 2)
    return image


def show(kernel_version: str | None = None) -> Image | None:
    """The cached image for the current inputs, or None when it would have to be built."""
    known = _remembered_key(kernel_version)
    if known is not None and (image := _load(cache_root() / known)) is not None:
        return image
    inputs = _inputs(kernel_version)
    return _load(cache_root() / inputs.key())


def _load(d: Path) -> Image | None:
    """The image in `d` if its manifest is there and every file it names has the recorded size."""
    try:
        data = json.loads((d / "image.json").read_text())
        image = Image(**{k: v for k, v in data.items() if k in Image.__dataclass_fields__})
        sizes = data["sizes"]
        for name, size in sizes.items():
            if (d / name).stat().st_size != size:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    image.dir, image.initrd, image.bzimage = str(d), str(d / "initrd.img"), str(d / "vmlinuz")
    image.kernel = str(d / ("vmlinux" if image.pvh else "vmlinuz"))
    image.built_now = False
    return image


def _write_manifest(d: Path, image: Image) -> None:
    data = image.to_json()
    names = ("vmlinuz", "initrd.img", *(("vmlinux",) if image.pvh else ()))
    data["sizes"] = {name: (d / name).stat().st_size for name in names}
    tmp = d / "image.json.tmp"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.rename(tmp, d / "image.json")


def _remove_stale_temps(root: Path) -> None:
    for p in root.glob(".build-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if not (pid.isdigit() and os.path.exists(f"/proc/{pid}")) or int(pid) == os.getpid():
            shutil.rmtree(p, ignore_errors=True)


def _build_into(tmp: Path, key: str, inputs: _Inputs) -> Image:
    debs = fetch_kernel(inputs.kernel)
    pkg = tmp / "pkg"
    for deb in debs:
        LOCAL.run(["dpkg-deb", "-x", str(deb), str(pkg)], timeout=600)
    vmlinuz, moddir = _kernel_files(pkg, inputs.kernel)
    release = moddir.name
    shutil.copyfile(vmlinuz, tmp / "vmlinuz")
    pvh_why = _pvh_vmlinux(tmp / "vmlinuz", tmp / "vmlinux")
    pvh = not pvh_why

    rootfs = tmp / "root"
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc/offlab", "proc", "sys", "dev", "tmp", "run",
              "root", "lib/modules/offlab", "var/run"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    os.chmod(rootfs / "tmp", 0o1777)

    _copy(inputs.busybox, rootfs / "bin/busybox")
    applets = LOCAL.run([inputs.busybox, "--list"], timeout=10).stdout.split()
    shipped = {Path(g).name for g in inputs.binaries}
    for applet in applets:
        # a busybox -> busybox self-link would replace the binary; shipped tools must not be shadowed
        if applet == "busybox" or "/" in applet or applet in shipped:
            continue
        (rootfs / "bin" / applet).symlink_to("busybox")
    (rootfs / "init").symlink_to("bin/busybox")
    for guest, host in inputs.binaries.items():
        _copy(host, rootfs / guest.lstrip("/"))
    for lib in inputs.libraries:
        _copy(lib, rootfs / lib.lstrip("/"))

    modules = _modules(moddir, rootfs / "lib/modules/offlab")
    _write(rootfs / "etc/offlab/modules", "".join(m + "\n" for m in modules))
    _write(rootfs / "etc/inittab", guestfs.INITTAB)
    _write(rootfs / "etc/fstab", guestfs.FSTAB)
    _write(rootfs / "etc/offlab/rc", guestfs.RC, 0o755)
    _write(rootfs / "etc/offlab/agent", guestfs.AGENT, 0o755)
    _write(rootfs / "etc/passwd", _PASSWD)
    _write(rootfs / "etc/group", _GROUP)
    _write(rootfs / "etc/hostname", "offlab-guest\n")
    _cpio(rootfs, inputs.busybox, tmp / "initrd.img")
    shutil.rmtree(pkg)
    shutil.rmtree(rootfs)
    return Image(
        key=key, dir="", kernel="", initrd="",
        kernel_package=inputs.kernel.name, kernel_package_version=inputs.kernel.version,
        kernel_release=release, modules=modules,
        binaries={Path(g).name: h for g, h in inputs.binaries.items()},
        initrd_bytes=(tmp / "initrd.img").stat().st_size, built_at=time.time(), pvh=pvh, pvh_why=pvh_why,
        kernel_suite=inputs.kernel.suite,
    )


def _kernel_files(pkg: Path, kernel: KernelPackage) -> tuple[Path, Path]:
    """The unpacked kernel's bzImage and module directory: /boot/vmlinuz-REL and /lib/modules/REL up
    to 6.18, /usr/lib/modules/REL/vmlinuz (merged /usr, the linux-binary part) from 6.19 on."""
    moddirs = sorted(d for base in ("lib/modules", "usr/lib/modules") for d in (pkg / base).glob("*") if d.is_dir())
    parts = {d.name.split("-")[1] for d in kernel.debs}
    if not moddirs and "binary" in parts and "modules" not in parts:
        # trixie-backports' 6.19 → 7.1 in the lists of 2026-11-28: only linux-binary-… is listed
        raise EnvironmentProblem(f"{kernel.name} {kernel.version}: the archive's lists carry its linux-binary "
                                 f"package but not its linux-modules and linux-base parts: no modules (virtio_net), "
                                 f"so no guest can be built from it")
    if len(moddirs) != 1:
        raise EnvironmentProblem(f"{kernel.name} {kernel.version}: expected one lib/modules/RELEASE directory, "
                                 f"found {len(moddirs)}: is it a Debian kernel package?")
    moddir = moddirs[0]
    for vmlinuz in (pkg / "boot" / f"vmlinuz-{moddir.name}", moddir / "vmlinuz"):
        if vmlinuz.is_file():
            return vmlinuz, moddir
    raise EnvironmentProblem(f"{kernel.name} {kernel.version}: no /boot/vmlinuz-{moddir.name} nor "
                             f"{moddir.relative_to(pkg)}/vmlinuz in the package")


# The payload of a bzImage starts with its compressor's magic (Debian: LZ4 up to 6.1, then zstd);
# PVH needs the ELF note XEN_ELFNOTE_PHYS32_ENTRY (type 18, owner "Xen") in the decompressed vmlinux.
_PAYLOADS = ((b"\x28\xb5\x2f\xfd", "zstd"), (b"\x02\x21\x4c\x18", "lz4"), (b"\xfd7zXZ\x00", "xz"),
             (b"\x1f\x8b\x08", "gzip"))
_PVH_NOTE = 18


def _pvh_vmlinux(bzimage: Path, out: Path) -> str:
    """Write the decompressed kernel to `out` if it has a PVH entry point and return ""; else why
    not (and no file): the guest then boots the bzImage, which decompresses itself."""
    data = bzimage.read_bytes()
    missing = []
    for magic, kind in _PAYLOADS:
        at = data.find(magic)
        if at >= 0 and kind in ("zstd", "lz4") and which(kind) is None:
            missing.append(kind)
            continue
        while at >= 0:
            elf = _decompress(data[at:], kind)
            if elf[:4] == b"\x7fELF":
                if not _has_pvh_note(elf):
                    return "the kernel has no PVH entry point (XEN_ELFNOTE_PHYS32_ENTRY; CONFIG_PVH off)"
                out.write_bytes(elf)
                return ""
            at = data.find(magic, at + 1)
    if missing:
        return f"{missing[0]} is not installed to unpack the kernel (`apt-get install {missing[0]}`)"
    return "the kernel's payload could not be unpacked (none of zstd, lz4, xz, gzip)"


def _decompress(payload: bytes, kind: str) -> bytes:
    """The decompressed stream, trailing bytes after it ignored; b"" if it is not one."""
    try:
        if kind == "xz":
            return lzma.LZMADecompressor().decompress(payload)
        if kind == "gzip":
            return zlib.decompressobj(wbits=31).decompress(payload)
    except (lzma.LZMAError, zlib.error):
        return b""
    tool = which(kind)
    if tool is None:
        return b""
    # zstd and lz4 exit 1 on the size trailer after the stream, having written the whole kernel
    # (through files: a host's run() carries text, and a kernel is bytes)
    with private_tmp("unpack") as tmp:
        src, dst = Path(tmp) / "in", Path(tmp) / "out"
        src.write_bytes(payload)
        # to stdout, redirected: with -o, zstd deletes what it wrote when it then trips on the trailer
        LOCAL.run(["sh", "-c", '"$1" -d -c -q "$2" > "$3"', "sh", tool, str(src), str(dst)], check=False, timeout=120)
        return dst.read_bytes() if dst.exists() else b""


def _has_pvh_note(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF has a Xen PHYS32_ENTRY note in a PT_NOTE segment."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return False
    phoff, phentsize, phnum = struct.unpack_from("<Q", elf, 32)[0], *struct.unpack_from("<HH", elf, 54)
    for i in range(phnum):
        ptype, _, offset, _, _, filesz = struct.unpack_from("<IIQQQQ", elf, phoff + i * phentsize)
        if ptype != 4:  # PT_NOTE
            continue
        pos, end = offset, offset + filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == _PVH_NOTE:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def _modules(moddir: Path, dest: Path) -> list[str]:
    """GUEST_MODULES and their dependencies, decompressed into `dest`, in load order."""
    builtin = set()
    builtin_file = moddir / "modules.builtin"
    if builtin_file.exists():
        builtin = {Path(line.strip()).name.split(".ko")[0].replace("-", "_")
                   for line in builtin_file.read_text().splitlines() if line.strip()}
    files = {}
    for f in moddir.rglob("*.ko*"):
        files[f.name.split(".ko")[0].replace("-", "_")] = f
    order: list[str] = []

    def visit(name: str, chain: tuple[str, ...]) -> None:
        name = name.replace("-", "_")
        if name in order or name in builtin:
            return
        src = files.get(name)
        if src is None:
            raise EnvironmentProblem(f"kernel {moddir.name} has neither a built-in nor a module {name!r} "
                                     f"(needed by {' <- '.join(chain) or 'the guest'})")
        out = dest / f"{name}.ko"
        _unpack_module(src, out)
        deps = LOCAL.run(["modinfo", "-F", "depends", str(out)], timeout=10).stdout.strip()
        for dep in filter(None, deps.split(",")):
            visit(dep, (name, *chain))
        order.append(name)

    for m in GUEST_MODULES:
        visit(m, ())
    return order


def _unpack_module(src: Path, out: Path) -> None:
    """A module as plain .ko: busybox insmod hands the file to finit_module without the flag that
    lets the kernel decompress it, and logs "Invalid ELF header" before falling back."""
    if src.name.endswith(".ko.xz"):
        out.write_bytes(lzma.decompress(src.read_bytes()))
    elif src.name.endswith(".ko.zst"):
        tool = which("zstd")
        if tool is None:
            raise EnvironmentProblem(f"{src.name} is zstd-compressed: `apt-get install zstd` to build this guest")
        LOCAL.run([tool, "-d", "-q", "-f", str(src), "-o", str(out)], timeout=60)
    elif src.name.endswith(".ko.gz"):
        out.write_bytes(zlib.decompress(src.read_bytes(), wbits=31))
    else:
        shutil.copyfile(src, out)


def _copy(src: str | Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)  # follows symlinks: the guest gets the file itself
    os.chmod(dst, stat.S_IMODE(os.stat(src).st_mode) | 0o400)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)


def _cpio(rootfs: Path, busybox: str, out: Path) -> None:
    """newc archive of `rootfs`, uncompressed (the guest unpacks it fastest so). The host has no
    cpio: `busybox cpio -o -H newc` with the file list on stdin; Host.run is text-only, so the
    archive goes to a file via a fixed shell line."""
    names = sorted(str(p.relative_to(rootfs)) for p in rootfs.rglob("*"))
    LOCAL.run(["sh", "-c", 'cd "$1" && "$2" cpio -o -H newc >"$3"', "sh", str(rootfs), busybox, str(out)],
              input="".join(n + "\n" for n in names), timeout=300)
