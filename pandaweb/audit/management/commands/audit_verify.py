from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pandaweb.audit.chain import VerifyResult
from pandaweb.audit.checkpoints import audit_verify_checkpoints, pinned_fingerprint
from pandaweb.audit.export import UnreadableExport, fingerprint, verify_export
from pandaweb.audit.models import AuditEvent
from pandaweb.audit.services import audit_verify_database, audit_verify_team
from pandaweb.core.models import Team


class Command(BaseCommand):
    help = (
        "Verify the audit trail's hash chain in the database, or with --export an export zip "
        "offline (signature by the pinned key, file hashes, its own chain); with --checkpoints, "
        "against the signed checkpoints of its head. Exit 1 if it is broken (naming the "
        "first bad sequence number), 2 if the export cannot be read. With --team, one team's "
        "own chain in the database (a team's export is checked on its team chain by --export)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--team",
            metavar="SLUG",
            help="verify only this team's chain in the database, without the other teams' events",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=5000,
            help="rows read per round trip (memory stays bounded by it)",
        )
        parser.add_argument(
            "--export", metavar="FILE.zip", help="check this export instead of the database"
        )
        parser.add_argument(
            "--since-export",
            metavar="FILE.zip",
            help="also require the database chain to still hold the last event of this earlier "
            "export, unchanged: a chain cut short after it would otherwise look intact",
        )
        parser.add_argument(
            "--public-key",
            metavar="B64",
            help="the key the export must be signed with (see audit_public_key); without it the "
            "export must be signed by the key whose fingerprint PANDAWEB_AUDIT_PUBLIC_KEY_"
            "FINGERPRINT names (by default this installation's own)",
        )
        parser.add_argument(
            "--checkpoints",
            metavar="DIR",
            help="also require the database chain to hold, unchanged, the head of every signed "
            "checkpoint in DIR (PANDAWEB_AUDIT_CHECKPOINT_DIR): catches a tail cut off and a "
            "chain rewritten with recomputed hashes",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["export"]:
            self._verify_export(options["export"], options["public_key"])
            return
        if options["public_key"]:
            raise CommandError("--public-key needs --export")
        if options["team"]:
            if options["since_export"] or options["checkpoints"]:
                # Both hold heads of the whole chain, which a team's chain cannot be held to.
                raise CommandError(
                    "--team checks one team's chain: not with --since-export or --checkpoints"
                )
            self._verify_team(options["team"], options["batch_size"])
            return
        result = audit_verify_database(batch_size=options["batch_size"])
        if result.ok and options["since_export"]:
            result = self._reaches(result, options["since_export"])
        checked = None
        if options["checkpoints"]:
            directory = Path(options["checkpoints"])
            if not directory.is_dir():
                raise CommandError(f"--checkpoints {directory}: no such directory")
            result, checked = audit_verify_checkpoints(result, directory)
        if result.ok:
            against = f"; matches {checked} signed checkpoint(s)" if checked is not None else ""
            self.stdout.write(
                f"audit chain OK: {result.count} events, head {result.last_hash}{against}"
            )
            return
        self.stderr.write(
            f"audit chain BROKEN at sequence {result.first_bad_sequence}: {result.reason}"
        )
        # A plain exit status, not CommandError: scripts and monitoring read the code, and the
        # message above is already the whole story.
        raise SystemExit(1)

    def _verify_team(self, slug: str, batch_size: int) -> None:
        team_id = Team.objects.filter(slug=slug).values_list("pk", flat=True).first()
        if team_id is None:
            raise CommandError(f"no team has the slug {slug!r}")
        result = audit_verify_team(team_id=team_id, batch_size=batch_size)
        if result.ok:
            self.stdout.write(
                f"audit chain of team {slug} OK: {result.count} events, "
                f"team head {result.last_hash}"
            )
            return
        self.stderr.write(
            f"audit chain of team {slug} BROKEN at sequence {result.first_bad_sequence}: "
            f"{result.reason}"
        )
        raise SystemExit(1)

    def _verify_export(self, path: str, public_key: str | None) -> None:
        try:
            check = verify_export(path, public_key=public_key)
        except (UnreadableExport, ValueError) as exc:
            self.stderr.write(f"audit export UNREADABLE: {path}: {exc}")
            raise SystemExit(2) from None
        if check.ok and public_key is None and check.manifest is not None:
            # Without --public-key the export is pinned to the configured fingerprint: a copy
            # re-signed with any other key proves only that someone signed it.
            pinned = pinned_fingerprint()
            signer = fingerprint(check.manifest["public_key"])
            if "".join(signer.split()).lower() != "".join(pinned.split()).lower():
                self.stderr.write(
                    f"audit export BROKEN: signed by key {signer}, not by the pinned key "
                    f"{pinned} (PANDAWEB_AUDIT_PUBLIC_KEY_FINGERPRINT, or this installation's)"
                )
                raise SystemExit(1)
        if not check.ok:
            where = (
                f" at sequence {check.first_bad_sequence}"
                if check.first_bad_sequence is not None
                else ""
            )
            self.stderr.write(f"audit export BROKEN{where}: {check.reason}")
            raise SystemExit(1)
        manifest = check.manifest or {}
        span = (
            f"sequences {manifest['first_sequence']}..{manifest['last_sequence']}"
            if check.count
            else "no events"
        )
        pinned = "the expected key" if public_key else "the pinned key"
        team = manifest.get("team")
        whose = (
            f" of team {team['slug']}, its chain checked alone (team head {team['last_team_hash']})"
            if team
            else ""
        )
        self.stdout.write(
            f"audit export OK: {check.count} events{whose} ({span}), head {manifest['last_hash']}, "
            f"signed by key {fingerprint(manifest['public_key'])} ({pinned})"
        )

    def _reaches(self, result: VerifyResult, path: str) -> VerifyResult:
        """``result`` unless the chain no longer holds the last event ``path`` exported."""
        try:
            check = verify_export(path)
        except (UnreadableExport, ValueError) as exc:
            self.stderr.write(f"audit export UNREADABLE: {path}: {exc}")
            raise SystemExit(2) from None
        if not check.ok or check.manifest is None:
            self.stderr.write(f"audit export BROKEN: {path}: {check.reason}")
            raise SystemExit(2)
        last, head = check.manifest["last_sequence"], check.manifest["last_hash"]
        if last is None:
            return result
        if (result.last_sequence or 0) < last:
            seen = result.last_sequence or 0
            return replace(
                result,
                ok=False,
                first_bad_sequence=seen + 1,
                reason=f"the chain ends at sequence {seen}, but {path} holds events up to "
                f"{last} (truncated)",
            )
        stored = AuditEvent.objects.filter(sequence=last).values_list("hash", flat=True).first()
        if stored != head:
            return replace(
                result,
                ok=False,
                first_bad_sequence=last,
                reason=f"event {last} differs from the one exported in {path}",
            )
        return result
