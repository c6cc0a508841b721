"""`offlab vm image`: build (or show the cached) guest kernel + initramfs."""

from __future__ import annotations

import json
from typing import Optional

import typer

app = typer.Typer(help="QEMU guests: the cached guest image.", no_args_is_help=True)


@app.command("image")
def image_cmd(
    kernel_version: Optional[str] = typer.Option(
        None, "--kernel-version", help="Debian cloud kernel: a series (6.12, 6.1: its newest) or an ABI (6.1.0-56)."),
    as_json: bool = typer.Option(False, "--json", help="Print the image as JSON."),
) -> None:
    """Build the guest from Debian packages into the cache, or show it when it is already there."""
    from offlab.vm import image as vm_image
    from offlab.vm import qemu

    qemu.qemu_binary()  # a guest image without QEMU to run it is no use: say so first (exit 3)
    img = vm_image.build(kernel_version)
    version = qemu.qemu_version()
    uso = all(p in qemu.nic_properties() for p in ("host_uso", "guest_uso4", "guest_uso6"))
    if as_json:
        typer.echo(json.dumps({**img.to_json(), "qemu_version": version, "qemu_has_uso": uso}, indent=2))
        return
    how = f"built in {img.build_seconds:g} s" if img.built_now else "cached"
    typer.echo(f"guest image {img.key} ({how})")
    typer.echo(f"  kernel    {img.kernel_package} {img.kernel_package_version} (uname -r {img.kernel_release})")
    typer.echo(f"  modules   {', '.join(img.modules) or 'none (all built in)'}")
    typer.echo(f"  tools     {', '.join(sorted(img.binaries))} + busybox")
    typer.echo(f"  initrd    {img.initrd_bytes / 2**20:.1f} MiB  {img.initrd}")
    typer.echo(f"  boots     {img.kernel}" + ("  (decompressed, PVH entry)" if img.pvh else ""))
    typer.echo(f"  QEMU      {version}" + ("" if uso else " (no host_uso/guest_uso4: USO in a guest cannot be tested)"))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="vm")
