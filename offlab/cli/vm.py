"""`offlab vm image`: build (or show the cached) guest kernel + initramfs; list and remove cached kernels.
`offlab vm qemu`: fetch another QEMU version from Debian's archive into the cache; list and remove them."""

from __future__ import annotations

import json
from typing import Optional

import typer

from offlab.cli.console import command_group

app = command_group("QEMU guests: the cached guest image and QEMU versions.")

KERNEL_HELP = ("Debian cloud kernel from any suite of the archive: a series (6.1, 6.12, 7.2: its newest), a release "
               "as Debian names it (6.12.57+deb12, 6.1.0-56) or newest. Default: the newest 6.12 the machine's apt knows.")


@app.command("image")
def image_cmd(
    kernel_version: Optional[str] = typer.Option(None, "--kernel-version", help=KERNEL_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the image (or the list) as JSON."),
    list_: bool = typer.Option(False, "--list", help="List the cached kernels, the images built from them and their disk use."),
    remove: Optional[str] = typer.Option(None, "--remove", metavar="VERSION", help="Remove a cached kernel (its packages and images)."),
    refresh: bool = typer.Option(False, "--refresh", help="Fetch the archive's package lists again (for a newer `newest`)."),
) -> None:
    """Build the guest from Debian packages into the cache, or show it when it is already there."""
    from offlab.errors import BadInput
    from offlab.vm import image as vm_image
    from offlab.vm import kernels, qemu

    if list_ and remove is not None:
        raise BadInput("--list and --remove: give one of them")
    if list_:
        _list(kernels.cached(), as_json)
        return
    if remove is not None:
        gone = kernels.remove(remove)
        typer.echo(f"removed {gone.abi} ({gone.version}): {(gone.deb_bytes + gone.image_bytes) / 2**20:.0f} MiB, "
                   f"{len(gone.files)} package(s), {len(gone.images)} image(s)")
        return
    if refresh:
        idx = kernels.index(refresh=True)
        typer.echo(f"archive lists fetched in {idx.get('update_seconds', 0):g} s: "
                   f"{len(kernels.releases(idx))} cloud kernels in {', '.join(idx['suites'])}")
    if kernel_version is not None:
        kernels.resolve(kernel_version, "--kernel-version")  # bad input: one line, before anything is built
    qemu.qemu_binary()  # a guest image without QEMU to run it is no use: say so first (exit 3)
    img = vm_image.build(kernel_version)
    version = qemu.qemu_version()
    uso = all(p in qemu.nic_properties() for p in ("host_uso", "guest_uso4", "guest_uso6"))
    if as_json:
        typer.echo(json.dumps({**img.to_json(), "qemu_version": version, "qemu_has_uso": uso}, indent=2))
        return
    how = f"built in {img.build_seconds:g} s" if img.built_now else "cached"
    typer.echo(f"guest image {img.key} ({how})")
    typer.echo(f"  kernel    {img.kernel_package} {img.kernel_package_version} (uname -r {img.kernel_release}; "
               f"{img.kernel_suite or 'from the machine’s apt'})")
    typer.echo(f"  modules   {', '.join(img.modules) or 'none (all built in)'}")
    typer.echo(f"  tools     {', '.join(sorted(img.binaries))} + busybox")
    typer.echo(f"  initrd    {img.initrd_bytes / 2**20:.1f} MiB  {img.initrd}")
    typer.echo(f"  boots     {img.kernel}" + ("  (decompressed, PVH entry)" if img.pvh else
                                            f"  (classic boot: {img.pvh_why or 'no PVH entry'})"))
    typer.echo(f"  QEMU      {version}" + ("" if uso else " (no host_uso/guest_uso4: USO in a guest cannot be tested)"))


def _list(cached: list, as_json: bool) -> None:
    from dataclasses import asdict

    if as_json:
        typer.echo(json.dumps([asdict(c) for c in cached], indent=2))
        return
    if not cached:
        typer.echo("no kernels cached")
        return
    typer.echo(f"{'release':<22} {'package version':<22} {'suite':<19} {'packages':>9} {'images':>12}")
    for c in cached:
        images = f"{len(c.images)}: {c.image_bytes / 2**20:.0f} MiB"
        typer.echo(f"{c.abi:<22} {c.version:<22} {c.suite or '-':<19} {c.deb_bytes / 2**20:>5.0f} MiB {images:>12}")
    total = sum(c.deb_bytes + c.image_bytes for c in cached)
    typer.echo(f"total {total / 2**20:.0f} MiB; `offlab vm image --remove RELEASE` removes one")


@app.command("qemu")
def qemu_cmd(
    version: Optional[str] = typer.Option(None, "--qemu", metavar="VERSION", help=(
        "A QEMU series Debian has for this machine (7.2 from bookworm; the installed 10.0 is the machine's own): "
        "fetched with what it needs and unpacked into offlab's cache once, never installed.")),
    list_: bool = typer.Option(False, "--list", help="List the installed QEMU and the cached ones with their disk use."),
    remove: Optional[str] = typer.Option(None, "--remove", metavar="VERSION", help="Remove a cached QEMU (its unpacked tree and packages)."),
    as_json: bool = typer.Option(False, "--json", help="Print as JSON."),
) -> None:
    """QEMU versions for guests (`lab up --qemu V`, a plan's `topology: {qemu: "7.2"}`): fetch, list, remove."""
    from offlab.errors import BadInput
    from offlab.vm import qemu, qemus

    if sum(x is not None and x is not False for x in (version, remove, list_ or None)) != 1:
        raise BadInput("offlab vm qemu: give one of --qemu V, --list, --remove V")
    if remove is not None:
        gone = qemus.remove(remove)
        typer.echo(f"removed QEMU {gone.qemu.version} ({gone.qemu.package_version}, {gone.qemu.suite}): "
                   f"{gone.bytes / 2**20:.0f} MiB")
        return
    if version is not None:
        q = qemus.resolve(version, "--qemu")
        if as_json:
            typer.echo(json.dumps(q.to_json(), indent=2))
            return
        uso = all(p in qemu.nic_properties(q) for p in ("host_uso", "guest_uso4", "guest_uso6"))
        typer.echo(f"QEMU {q.version} ({q.package_version}, {'the machine’s own' if q.installed else q.suite})")
        typer.echo(f"  runs      {' '.join([*q.argv(), *q.data_args()])}")
        typer.echo("  USO       " + ("host_uso, guest_uso4, guest_uso6" if uso else
                                     "no host_uso/guest_uso4/guest_uso6: a guest's USO cannot be tested on it"))
        return
    have = [(qemu.installed(), "-", 0, [])] + [(c.qemu, c.dir, c.bytes, c.modules_that_cannot_load)
                                              for c in qemus.cached()]
    if as_json:
        typer.echo(json.dumps([{**q.to_json(), "dir": d, "bytes": b, "modules_that_cannot_load": m}
                               for q, d, b, m in have], indent=2))
        return
    typer.echo(f"{'version':<9} {'package version':<30} {'from':<19} {'disk':>8}")
    for q, _, b, _ in have:
        typer.echo(f"{q.version:<9} {q.package_version:<30} {q.suite:<19} "
                   f"{'-' if q.installed else f'{b / 2**20:.0f} MiB':>8}")
    typer.echo("`offlab vm qemu --remove VERSION` removes a cached one; the installed one is the machine's")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="vm")
