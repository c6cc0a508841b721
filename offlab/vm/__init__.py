"""Guests: the image (kernel + initramfs from Debian packages, cached) and QEMU (command line,
accelerator probe, boot and stop). The guest's command channel is `offlab.hosts.guest`."""
