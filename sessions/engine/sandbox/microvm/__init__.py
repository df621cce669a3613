"""The microVM sandbox: each run's browser lives in its own QEMU microvm with its own kernel.

``image`` builds and finds the guest image (kernel, initramfs, read-only root) the VMs boot.
"""
