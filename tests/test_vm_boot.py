"""The fast cold boot's command line and image parts (no guest is booted here; the boots are in
test_vm.py and the lab tests)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="QEMU is not installed (scripts/install-deps installs it)")


@pytest.fixture(scope="module")
def image():
    from offlab.vm import image as vm_image

    img = vm_image.show()
    if img is None:
        pytest.skip("no guest image (`offlab vm image` builds it)")
    return img


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_fast_boot_is_slim_q35_qboot_the_pvh_kernel_and_a_quiet_command_line(image, tmp_path):
    from offlab.vm import qemu

    argv = qemu.command(image, socket=str(tmp_path / "s"), console=str(tmp_path / "c"),
                        nics=[qemu.Nic("olvbtap0", "52:54:00:66:00:01")])
    assert _arg(argv, "-machine") == qemu.MACHINE and "sata=off" in qemu.MACHINE
    if Path("/usr/share/qemu/qboot.rom").exists():
        assert _arg(argv, "-bios") == "qboot.rom"
    assert image.pvh and _arg(argv, "-kernel") == image.kernel and image.kernel.endswith("/vmlinux")
    assert _arg(argv, "-append").split()[:3] == ["console=ttyS0", "panic=-1", "quiet"]
    assert "virtio-net-pci,id=nic0,netdev=n0,mac=52:54:00:66:00:01" in argv

    classic = qemu.command(image, socket=str(tmp_path / "s"), console=str(tmp_path / "c"), classic=True)
    assert _arg(classic, "-machine") == "q35" and "-bios" not in classic
    assert _arg(classic, "-kernel") == image.bzimage and "quiet" not in _arg(classic, "-append")


def test_the_image_keeps_the_kernel_decompressed_with_its_pvh_entry_and_an_uncompressed_initramfs(image):
    from offlab.vm.image import _has_pvh_note

    with open(image.kernel, "rb") as f:
        assert _has_pvh_note(f.read())
    with open(image.bzimage, "rb") as f:
        assert not _has_pvh_note(f.read())  # the bzImage is no ELF: it would be booted as it is
    with open(image.initrd, "rb") as f:
        assert f.read(6) == b"070701"  # newc cpio, not gzip
