from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions.engine.sandbox.microvm import image, recipe

_MIB = 1024 * 1024


class Command(BaseCommand):
    help = (
        "Build the microVM guest image (kernel, initramfs, squashfs root with Chromium) from "
        "Debian packages, unless the image for the current recipe is already built. Needs root "
        "and the Debian mirror; about a minute. Idempotent."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--root",
            type=Path,
            default=None,
            help="image directory (default: PANDAWEB_MICROVM_IMAGE_DIR or var/microvm)",
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--force",
            action="store_true",
            help="rebuild even if built (picks up Debian security updates, which keep the key)",
        )
        mode.add_argument(
            "--check",
            action="store_true",
            help="build nothing: describe the current image, or fail if it is not built",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["check"] and options["force"]:
            raise CommandError("--check and --force exclude each other")
        root = Path(options["root"] or settings.ENGINE_CONFIG.microvm_image_dir).absolute()
        if root.exists() and not root.is_dir():
            raise CommandError(f"{root} is not a directory")

        if options["check"]:
            found = image.find_image(root)
            if found is None:
                raise CommandError(
                    f"no guest image for key {recipe.current_key()[:16]} in {root}; "
                    "build it with `manage.py microvm_image`"
                )
            self._describe(found)
            return

        try:
            built = image.build_image(root, progress=self.stdout.write, force=options["force"])
        except recipe.ImageBuildError as exc:
            raise CommandError(str(exc)) from exc
        self._describe(built)

    def _describe(self, guest: image.GuestImage) -> None:
        manifest = guest.manifest
        sizes = manifest.get("sizes", {})
        self.stdout.write(self.style.SUCCESS(f"guest image {guest.key[:16]}: {guest.directory}"))
        rows = (
            ("kernel", guest.kernel, manifest.get("kernel_version", "?")),
            ("initrd", guest.initrd, ", ".join(manifest.get("modules_loaded", []))),
            ("rootfs", guest.rootfs, manifest.get("chromium_version", "?")),
        )
        for role, path, detail in rows:
            size = sizes.get(role, 0) / _MIB
            self.stdout.write(f"  {role:<7}{path.name:<17}{size:8.1f} MiB  {detail}")
        self.stdout.write(
            f"  built {manifest.get('built_at', '?')} in {manifest.get('build_seconds', '?')} s"
        )
