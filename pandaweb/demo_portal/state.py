"""The portal's in-memory world: one demo customer, the invoices Acme sent it, its payments.

Everything is deterministic and lives in memory, so each start (or ``POST /api/reset``) gives demos
and tests exactly the same invoices. The server is threaded: every access goes through one lock,
and invoices are immutable snapshots, so a reader never sees a half-recorded payment.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

DEMO_USERNAME = "acme-demo"
DEMO_PASSWORD = "portal-demo-2026"  # noqa: S105 - the published demo login of a loopback-only site
CURRENCY = "EUR"
# The demo world's fiscal year: receipt numbers stay the same whatever the machine's clock says.
DEMO_YEAR = 2026
PAYEE_NAME = "Acme Industrial Supplies GmbH"
PAYEE_IBAN = "DE97200400600123456789"
PAYMENT_TERM = timedelta(days=30)
ZERO = Decimal("0.00")

# How many invoices Acme issued in each month of the demo period.
_INVOICES_PER_MONTH: tuple[tuple[int, int, int], ...] = (
    (2026, 8, 10),
    (2026, 9, 9),
    (2026, 10, 11),
    (2026, 11, 10),
)
_FIRST_INVOICE_NUMBER = 1001

_CATALOGUE: tuple[tuple[str, Decimal], ...] = (
    ("Hex bolts M8x40, zinc plated (box of 200)", Decimal("38.90")),
    ("Stainless washers M8 (box of 500)", Decimal("21.40")),
    ('Hydraulic hose 1/2" x 10 m', Decimal("112.00")),
    ("Safety gloves, cut level C (10 pairs)", Decimal("46.50")),
    ("Pallet wrap film 500 mm x 300 m", Decimal("17.80")),
    ("Ball bearings 6204-2RS (pack of 10)", Decimal("63.50")),
    ("Cable ties 300 mm, black (pack of 1000)", Decimal("29.90")),
    ("Industrial degreaser, 25 l canister", Decimal("89.00")),
    ("Forklift maintenance visit", Decimal("240.00")),
    ("Shelving bay 2000 x 1000 mm", Decimal("315.00")),
    ("Express freight surcharge", Decimal("45.00")),
)

# (invoice description, catalogue entries it bills)
_ORDERS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("Fasteners restock", (0, 1, 6)),
    ("Hydraulics spare parts", (2, 5)),
    ("Workshop safety equipment", (3,)),
    ("Packaging materials", (4, 6)),
    ("Cleaning supplies", (7, 3)),
    ("Forklift service", (8, 10)),
    ("Warehouse shelving", (9, 0)),
    ("Bearings and fasteners", (5, 0, 1)),
)


@dataclass(frozen=True)
class User:
    username: str
    password: str
    display_name: str
    company: str
    customer_number: str


@dataclass(frozen=True)
class LineItem:
    description: str
    quantity: int
    unit_price: Decimal

    @property
    def total(self) -> Decimal:
        return self.unit_price * self.quantity


@dataclass(frozen=True)
class Invoice:
    number: str
    issue_date: date
    due_date: date
    description: str
    lines: tuple[LineItem, ...]
    amount_paid: Decimal = ZERO
    currency: str = CURRENCY

    @property
    def amount(self) -> Decimal:
        return sum((line.total for line in self.lines), ZERO)

    @property
    def amount_due(self) -> Decimal:
        return self.amount - self.amount_paid

    @property
    def status(self) -> str:
        return "paid" if self.amount_due <= ZERO else "open"

    @property
    def month(self) -> str:
        return self.issue_date.strftime("%Y-%m")


@dataclass(frozen=True)
class Payment:
    receipt: str
    invoice: str
    amount: Decimal
    currency: str
    iban: str
    reference: str
    created_at: datetime

    def as_json(self) -> dict[str, str]:
        return {
            "receipt": self.receipt,
            "invoice": self.invoice,
            "amount": str(self.amount),
            "currency": self.currency,
            "iban": self.iban,
            "reference": self.reference,
            "created_at": self.created_at.isoformat(),
        }


@dataclass
class PaymentDraft:
    """A reviewed payment waiting for "Submit payment"; its token may be used only once."""

    token: str
    username: str
    invoice: str
    amount: Decimal
    iban: str
    reference: str
    receipt: str | None = None


class PaymentError(Exception):
    """A payment that cannot be recorded; the message is shown to the user."""


def initial_users() -> list[User]:
    return [
        User(
            username=DEMO_USERNAME,
            password=DEMO_PASSWORD,
            display_name="Dana Fischer",
            company="Northwind Trading GmbH",
            customer_number="C-20417",
        )
    ]


def initial_invoices() -> list[Invoice]:
    """Forty invoices, August to November 2026, oldest first; older ones are mostly paid."""
    invoices: list[Invoice] = []
    for year, month, count in _INVOICES_PER_MONTH:
        for position in range(count):
            index = len(invoices)
            description, items = _ORDERS[index % len(_ORDERS)]
            lines = tuple(
                LineItem(
                    description=_CATALOGUE[item][0],
                    quantity=1 + (index * 7 + offset * 3) % 9,
                    unit_price=_CATALOGUE[item][1],
                )
                for offset, item in enumerate(items)
            )
            issue_date = date(year, month, 2 + position * 26 // count)
            invoice = Invoice(
                number=f"INV-{_FIRST_INVOICE_NUMBER + index}",
                issue_date=issue_date,
                due_date=issue_date + PAYMENT_TERM,
                description=description,
                lines=lines,
            )
            if _initially_paid(month, position):
                invoice = dataclasses.replace(invoice, amount_paid=invoice.amount)
            invoices.append(invoice)
    return invoices


def _initially_paid(month: int, position: int) -> bool:
    if month == 8:
        return position < 8
    if month == 9:
        return position % 2 == 0
    if month == 10:
        return position in (0, 3)
    return False


REVIEW_BUTTON = "Review payment"


class PortalState:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users: dict[str, User] = {}
        self._invoices: dict[str, Invoice] = {}
        self._sessions: dict[str, str] = {}
        self._payments: list[Payment] = []
        self._drafts: dict[str, PaymentDraft] = {}
        # Lab: invoice approvals (number → who, when) and removed suppliers, each recorded once.
        self._approvals: dict[str, tuple[str, datetime]] = {}
        self._removed_suppliers: list[str] = []
        self._archived_orders: list[str] = []
        # Lab: the SMS code last sent (one at a time, like a bank's), and the confirmations.
        self._sms_code: str | None = None
        self._sms_confirmed: list[datetime] = []
        # Lab: the pay form's button, as a portal that renames it would say it (healing tests).
        self.review_button = REVIEW_BUTTON
        self.reset()

    def reset(self) -> None:
        """Back to the initial invoices; payments, drafts and sessions are forgotten."""
        with self._lock:
            self._users = {user.username: user for user in initial_users()}
            self._invoices = {invoice.number: invoice for invoice in initial_invoices()}
            self._sessions = {}
            self._payments = []
            self._drafts = {}
            self._approvals = {}
            self._removed_suppliers = []
            self._archived_orders = []
            self._sms_code = None
            self._sms_confirmed = []
            self.review_button = REVIEW_BUTTON

    # Users and sessions

    def authenticate(self, username: str, password: str) -> User | None:
        with self._lock:
            user = self._users.get(username)
        if user is None:
            return None
        if not secrets.compare_digest(user.password.encode(), password.encode()):
            return None
        return user

    def open_session(self, username: str) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[token] = username
        return token

    def session_user(self, token: str) -> User | None:
        with self._lock:
            username = self._sessions.get(token)
            return None if username is None else self._users.get(username)

    def close_session(self, token: str) -> None:
        with self._lock:
            self._sessions.pop(token, None)

    def close_all_sessions(self) -> int:
        """Sign everybody out, as a portal does after a password change or a deployment; returns
        how many sessions were open. Invoices and payments stay."""
        with self._lock:
            count = len(self._sessions)
            self._sessions = {}
        return count

    # Invoices

    def invoices(self, month: str | None = None) -> list[Invoice]:
        """Newest first, optionally only those issued in ``month`` (YYYY-MM)."""
        with self._lock:
            invoices = list(self._invoices.values())
        selected = [invoice for invoice in invoices if month is None or invoice.month == month]
        return sorted(selected, key=lambda invoice: invoice.number, reverse=True)

    def invoice(self, number: str) -> Invoice | None:
        with self._lock:
            return self._invoices.get(number)

    def months(self) -> list[str]:
        """The months (YYYY-MM) with invoices, newest first."""
        with self._lock:
            return sorted({invoice.month for invoice in self._invoices.values()}, reverse=True)

    # Payments

    def payments(self) -> list[Payment]:
        with self._lock:
            return list(self._payments)

    def payment(self, receipt: str) -> Payment | None:
        with self._lock:
            return next((p for p in self._payments if p.receipt == receipt), None)

    def draft(self, token: str, username: str) -> PaymentDraft | None:
        with self._lock:
            draft = self._drafts.get(token)
            if draft is None or draft.username != username:
                return None
            return dataclasses.replace(draft)

    def reprice_drafts(self, invoice: str, amount: Decimal) -> int:
        """Change the amount of every reviewed, unsubmitted payment of ``invoice``, as a portal
        does that applies a new fee or rate after the review; returns how many changed."""
        with self._lock:
            changed = [
                d for d in self._drafts.values() if d.invoice == invoice and d.receipt is None
            ]
            for draft in changed:
                draft.amount = amount
        return len(changed)

    def create_draft(
        self, username: str, invoice: str, amount: Decimal, iban: str, reference: str
    ) -> PaymentDraft:
        draft = PaymentDraft(
            token=secrets.token_urlsafe(24),
            username=username,
            invoice=invoice,
            amount=amount,
            iban=iban,
            reference=reference,
        )
        with self._lock:
            self._drafts[draft.token] = draft
        # A copy: the stored draft is only ever changed under the lock.
        return dataclasses.replace(draft)

    def submit_draft(self, token: str, username: str, invoice_number: str) -> Payment:
        """Record the reviewed payment once; resubmitting its token returns the same payment."""
        with self._lock:
            draft = self._drafts.get(token)
            if draft is None or draft.username != username or draft.invoice != invoice_number:
                raise PaymentError(
                    "This payment form is no longer valid. Please start the payment again."
                )
            if draft.receipt is not None:
                return next(p for p in self._payments if p.receipt == draft.receipt)
            invoice = self._invoices[draft.invoice]
            if draft.amount > invoice.amount_due:
                raise PaymentError(
                    f"{invoice.number} has only {invoice.currency} {invoice.amount_due:,.2f} due "
                    "now, less than this payment. Nothing was paid."
                )
            payment = Payment(
                receipt=f"RCPT-{DEMO_YEAR}-{len(self._payments) + 1:06d}",
                invoice=invoice.number,
                amount=draft.amount,
                currency=invoice.currency,
                iban=draft.iban,
                reference=draft.reference,
                created_at=datetime.now(UTC),
            )
            self._payments.append(payment)
            self._invoices[invoice.number] = dataclasses.replace(
                invoice, amount_paid=invoice.amount_paid + draft.amount
            )
            draft.receipt = payment.receipt
            return payment

    # Lab ----------------------------------------------------------------------------------

    def approve_invoice(self, number: str, username: str) -> tuple[bool, str, datetime]:
        """Approve ``number`` once: (True, who, when) for this approval, or (False, who, when)
        of the earlier one, which stands; a second approval is never recorded."""
        with self._lock:
            earlier = self._approvals.get(number)
            if earlier is not None:
                return False, *earlier
            self._approvals[number] = (username, datetime.now(UTC))
            return True, *self._approvals[number]

    def approval(self, number: str) -> tuple[str, datetime] | None:
        with self._lock:
            return self._approvals.get(number)

    def approvals(self) -> dict[str, tuple[str, datetime]]:
        with self._lock:
            return dict(self._approvals)

    def remove_supplier(self, name: str) -> bool:
        """Remove ``name`` from the suppliers; False when it was already removed."""
        with self._lock:
            if name in self._removed_suppliers:
                return False
            self._removed_suppliers.append(name)
            return True

    def removed_suppliers(self) -> list[str]:
        with self._lock:
            return list(self._removed_suppliers)

    def archive_order(self, number: str) -> None:
        with self._lock:
            if number not in self._archived_orders:
                self._archived_orders.append(number)

    def archived_orders(self) -> list[str]:
        with self._lock:
            return list(self._archived_orders)

    def send_sms_code(self) -> str:
        """A fresh six-digit code; any earlier one stops working."""
        with self._lock:
            self._sms_code = f"{secrets.randbelow(1_000_000):06d}"
            return self._sms_code

    def last_sms_code(self) -> str | None:
        with self._lock:
            return self._sms_code

    def confirm_sms_code(self, code: str) -> bool:
        """True when ``code`` is the code last sent; a code confirms once."""
        with self._lock:
            if self._sms_code is None or not secrets.compare_digest(code, self._sms_code):
                return False
            self._sms_code = None
            self._sms_confirmed.append(datetime.now(UTC))
            return True

    def sms_confirmations(self) -> list[datetime]:
        with self._lock:
            return list(self._sms_confirmed)
