"""The close-up of an approval's target, cut once from its outlined picture and kept beside it:
the decision page shows it first, and chat cards carry it."""

from __future__ import annotations

import uuid

from approvals.crop import crop_around
from approvals.models import ApprovalRequest
from sessions.services.runstate import run_files_dir


def approval_target_crop(approval: ApprovalRequest) -> str:
    """The run-relative path of the close-up of the target, cut once from the outlined picture
    and kept beside it; "" when there is no box or no picture."""

    target = (approval.evidence or {}).get("target") or {}
    box = target.get("box")
    if not box or not approval.outlined or not box.get("width") or not box.get("height"):
        return ""
    root = run_files_dir(approval.run_id)
    outlined = root / approval.outlined
    cropped = outlined.with_name(outlined.name.removesuffix(".outlined.png") + ".target.png")
    if not cropped.is_file():
        if not outlined.is_file():
            return ""
        # Written to a temporary name and renamed, so two viewers never serve half a file.
        partial = cropped.with_suffix(f".{uuid.uuid4().hex}.part")
        partial.write_bytes(crop_around(outlined.read_bytes(), box, target.get("context_box")))
        partial.replace(cropped)
    return str(cropped.relative_to(root))
