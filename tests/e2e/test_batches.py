from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from pandaweb.core.roles import Role
from tests.e2e.conftest import Stack
from tests.e2e.test_dashboard import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def counts(stack: Stack) -> tuple[int, int]:
    """Runs and batches in the stack's database."""
    out = stack.manage(
        "shell",
        "-c",
        "from sessions.models import Run; from pandaweb.schedules.models import Batch; "
        "print(Run.objects.count(), Batch.objects.count())",
    )
    runs, batches = out.strip().splitlines()[-1].split()
    return int(runs), int(batches)


def test_a_batch_with_a_bad_row_launches_nothing_then_the_fixed_file_launches(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    stack.manage("demo_workflow")
    runs_before, _ = counts(stack)
    bad = tmp_path / "invoices.csv"
    bad.write_text("invoice,amount\nINV-1001,10.00\n1002,20.00\n")
    good = tmp_path / "invoices-fixed.csv"
    good.write_text("invoice,amount\nINV-1001,10.00\n")
    log_in(page, stack, Role.OPERATORS)
    page.goto(f"{stack.url}/workflows/acme-pay-invoice/")

    page.get_by_role("link", name="Batch launch from CSV").click()
    page.get_by_label("CSV file").set_input_files(bad)
    page.get_by_role("button", name="Check and launch").click()

    problems = page.locator("#batch-problems")
    expect(problems).to_contain_text("1 problem in the file; nothing was launched.")
    expect(problems).to_contain_text("Line 3, invoice: must match the pattern")
    assert counts(stack) == (runs_before, 0)

    page.goto(f"{stack.url}/workflows/acme-pay-invoice/")
    page.get_by_role("link", name="Batch launch from CSV").click()
    page.get_by_label("CSV file").set_input_files(good)
    page.get_by_role("button", name="Check and launch").click()

    expect(page.get_by_role("heading", level=1)).to_contain_text("Batch #")
    row = page.locator("#line-2")
    expect(row).to_contain_text("INV-1001")
    expect(row.get_by_role("link", name="#")).to_be_visible()
    expect(page.get_by_role("link", name="Download outputs (CSV)")).to_be_visible()
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    assert counts(stack) == (runs_before + 1, 1)
