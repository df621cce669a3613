"""The Acme Supplier Portal web server (standard library only).

``make_server()`` returns a threaded HTTP server with fresh state; run it with
``serve_forever()`` and stop it with ``shutdown()`` from another thread. It is meant for loopback:
the demo login is public.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, urlsplit

from pandaweb.demo_portal import lab, pages
from pandaweb.demo_portal.forms import validate_payment
from pandaweb.demo_portal.state import CURRENCY, PaymentError, PortalState, User

logger = logging.getLogger(__name__)

SESSION_COOKIE = "acme_session"
CONSENT_COOKIE = "acme_cookies"
CONSENT_CHOICES = ("accepted", "rejected")
PAGE_SIZE = 10
MAX_BODY_BYTES = 64 * 1024
HTML = "text/html; charset=utf-8"
_MONTH = re.compile(r"([0-9]{4})-(0[1-9]|1[0-2])")


@dataclass
class Request:
    method: str
    path: str
    target: str  # path and query, as a "next" to come back to
    query: dict[str, str]
    form: dict[str, str]
    cookies: dict[str, str]
    portal_port: int
    user: User | None = None


@dataclass
class Response:
    status: HTTPStatus
    body: bytes
    content_type: str = HTML
    headers: list[tuple[str, str]] = field(default_factory=list)


View = Callable[[PortalState, Request, re.Match[str]], Response]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    view: View
    login_required: bool = True


def html(body: str, status: HTTPStatus = HTTPStatus.OK) -> Response:
    return Response(status, body.encode())


def redirect(location: str, *headers: tuple[str, str]) -> Response:
    return Response(HTTPStatus.SEE_OTHER, b"", headers=[("Location", location), *headers])


def json_response(data: object, status: HTTPStatus = HTTPStatus.OK) -> Response:
    return Response(status, json.dumps(data).encode(), "application/json")


def safe_next(value: str) -> str:
    """A local path to go to after login, never another site (no open redirect)."""
    if value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/"


def _user(request: Request) -> User:
    if request.user is None:  # the router only calls login-required views with a user
        raise RuntimeError("view needs a signed-in user")
    return request.user


def _banner_next(request: Request) -> str | None:
    """Where the cookie banner returns to, or None once the visitor has chosen."""
    return None if request.cookies.get(CONSENT_COOKIE) in CONSENT_CHOICES else request.target


# Sign-in


def login_form(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    next_path = safe_next(request.query.get("next", "/"))
    if request.user is not None:
        return redirect(next_path)
    return html(pages.login_page(next_path=next_path))


def login(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    username = request.form.get("username", "").strip()
    next_path = safe_next(request.form.get("next", "/"))
    user = state.authenticate(username, request.form.get("password", ""))
    if user is None:
        page = pages.login_page(
            username=username, next_path=next_path, error="Invalid username or password"
        )
        return html(page, HTTPStatus.UNAUTHORIZED)
    token = state.open_session(user.username)
    cookie = f"{SESSION_COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax"
    return redirect(next_path, ("Set-Cookie", cookie))


def logout(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        state.close_session(token)
    cookie = f"{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax"
    return redirect("/login", ("Set-Cookie", cookie))


def cookie_consent(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    choice = request.form.get("choice", "")
    if choice not in CONSENT_CHOICES:
        return html(pages.message_page("Cookies", "Choose Accept or Reject.", user=request.user))
    cookie = f"{CONSENT_COOKIE}={choice}; Path=/; Max-Age=31536000; SameSite=Lax"
    return redirect(safe_next(request.form.get("next", "/")), ("Set-Cookie", cookie))


# Invoices


def dashboard(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    open_invoices = [invoice for invoice in state.invoices() if invoice.status == "open"]
    page = pages.dashboard_page(
        _user(request),
        open_invoices=open_invoices,
        payment_count=len(state.payments()),
        currency=CURRENCY,
        cookie_banner_next=_banner_next(request),
    )
    return html(page)


def invoice_list(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    listing = _listing(
        state,
        month=request.query.get("month", "").strip(),
        page_text=request.query.get("page", "").strip() or "1",
    )
    status = HTTPStatus.BAD_REQUEST if listing.error else HTTPStatus.OK
    body = pages.invoices_page(_user(request), listing, cookie_banner_next=_banner_next(request))
    return html(body, status)


def _listing(state: PortalState, *, month: str, page_text: str) -> pages.InvoiceListing:
    months = state.months()
    if month and not _MONTH.fullmatch(month):
        return pages.InvoiceListing.failed(months, f"“{month}” is not a month. Use YYYY-MM.")
    if not page_text.isdigit() or int(page_text) < 1:
        return pages.InvoiceListing.failed(months, f"“{page_text}” is not a page number.")
    invoices = state.invoices(month or None)
    page = int(page_text)
    page_count = max(1, math.ceil(len(invoices) / PAGE_SIZE))
    if page > page_count:
        there = "is 1 page" if page_count == 1 else f"are {page_count} pages"
        return pages.InvoiceListing.failed(months, f"Page {page} does not exist: there {there}.")
    start = (page - 1) * PAGE_SIZE
    return pages.InvoiceListing(
        months=months,
        month=month,
        invoices=invoices[start : start + PAGE_SIZE],
        page=page,
        pages=page_count,
        total=len(invoices),
        first=start + 1,
    )


def _not_found(request: Request) -> Response:
    page = pages.message_page(
        "Page not found", f"There is nothing at {request.path}.", user=request.user
    )
    return html(page, HTTPStatus.NOT_FOUND)


def invoice_detail(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    invoice = state.invoice(match["number"])
    if invoice is None:
        return _not_found(request)
    payments = [p for p in state.payments() if p.invoice == invoice.number]
    return html(pages.invoice_page(_user(request), invoice, payments))


def invoice_csv(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    invoice = state.invoice(match["number"])
    if invoice is None:
        return _not_found(request)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(
        [
            "Invoice number",
            "Issue date",
            "Due date",
            "Description",
            "Quantity",
            "Unit price",
            "Line total",
            "Currency",
        ]
    )
    for line in invoice.lines:
        writer.writerow(
            [
                invoice.number,
                invoice.issue_date.isoformat(),
                invoice.due_date.isoformat(),
                line.description,
                line.quantity,
                f"{line.unit_price:.2f}",
                f"{line.total:.2f}",
                invoice.currency,
            ]
        )
    disposition = f'attachment; filename="{invoice.number}.csv"'
    return Response(
        HTTPStatus.OK,
        buffer.getvalue().encode(),
        "text/csv; charset=utf-8",
        headers=[("Content-Disposition", disposition)],
    )


def pay_form(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    invoice = state.invoice(match["number"])
    if invoice is None:
        return _not_found(request)
    if invoice.status == "paid":
        return html(pages.already_paid_page(_user(request), invoice))
    values = {"amount": f"{invoice.amount_due:.2f}", "iban": "", "reference": invoice.number}
    return html(pages.pay_form_page(_user(request), invoice, values, {}, state.review_button))


def review_payment(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    invoice = state.invoice(match["number"])
    if invoice is None:
        return _not_found(request)
    user = _user(request)
    if invoice.status == "paid":
        return html(pages.already_paid_page(user, invoice))
    details, errors = validate_payment(request.form, invoice.amount_due, invoice.currency)
    if details is None:
        return html(pages.pay_form_page(user, invoice, request.form, errors, state.review_button))
    draft = state.create_draft(
        user.username, invoice.number, details.amount, details.iban, details.reference
    )
    return html(pages.confirm_page(user, invoice, draft))


def submit_payment(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    user = _user(request)
    number = match["number"]
    try:
        payment = state.submit_draft(request.form.get("token", ""), user.username, number)
    except PaymentError as error:
        page = pages.message_page(
            "Payment not submitted", str(error), user=user, link=f"/invoices/{number}"
        )
        return html(page, HTTPStatus.CONFLICT)
    # Post/redirect/get: reloading the receipt never re-posts the payment.
    return redirect(f"/receipts/{payment.receipt}")


def receipt(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    payment = state.payment(match["receipt"])
    if payment is None:
        return _not_found(request)
    return html(pages.receipt_page(_user(request), payment))


# API (no login: tests and the control room check outcomes without going through the robot)


def api_payments(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    return json_response([payment.as_json() for payment in state.payments()])


def api_draft(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    """What the review page polls: the reviewed payment's amount as the portal now sees it."""
    draft = state.draft(match["token"], _user(request).username)
    if draft is None:
        return _not_found(request)
    invoice = state.invoice(draft.invoice)
    currency = invoice.currency if invoice else ""
    return json_response(
        {"amount": str(draft.amount), "shown": pages.money(draft.amount, currency)}
    )


def api_reprice(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    """Test hook: the portal changes the amount of a reviewed payment (a new fee, a new rate)."""
    try:
        amount = Decimal(request.form.get("amount", ""))
    except InvalidOperation:
        return json_response({"error": "amount must be a number"})
    return json_response({"changed": state.reprice_drafts(request.form.get("invoice", ""), amount)})


def api_reset(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    state.reset()
    return json_response({"ok": True})


def api_wording(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    """Test hook: the portal renames its pay form's button, as portals do between two runs."""
    label = " ".join(str(request.form.get("review_button", "")).split())
    if not label:
        return json_response({"error": "give review_button"}, HTTPStatus.BAD_REQUEST)
    state.review_button = label[:60]
    return json_response({"review_button": state.review_button})


def api_expire_sessions(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    """Test hook: every signed-in browser is signed out (saved session cookies go stale)."""
    return json_response({"closed": state.close_all_sessions()})


# Lab


def _lab_view(render: Callable[[User], str]) -> View:
    def view(state: PortalState, request: Request, match: re.Match[str]) -> Response:
        return html(render(_user(request)))

    return view


def lab_iframe_inner(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    return html(lab.iframe_inner_page())


def lab_external(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    return html(lab.external_page(_user(request), request.portal_port))


def lab_sync(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    return html(lab.sync_page(_user(request), request.portal_port))


def lab_approval(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    invoice = state.invoice(match["number"])
    if invoice is None:
        return _not_found(request)
    approval = state.approval(invoice.number)
    approved_now = request.query.get("approved") == "1"
    return html(
        lab.invoice_approval_page(_user(request), invoice, approval, approved_now=approved_now)
    )


def lab_approve(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    user = _user(request)
    invoice = state.invoice(match["number"])
    if invoice is None:
        return _not_found(request)
    recorded, by, at = state.approve_invoice(invoice.number, user.username)
    if not recorded:
        # Refused where the user is looking, on a page that answers 200 like any other.
        page = lab.invoice_approval_page(user, invoice, (by, at), refused=(by, at))
        return html(page)
    return redirect(f"/lab/approvals/{invoice.number}?approved=1")


def lab_approval_request(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    invoice = state.invoice(match["number"])
    if invoice is None:
        return _not_found(request)
    return html(lab.approval_request_page(_user(request), invoice))


def lab_api_approve(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    """The approval request page's script approves through this JSON endpoint."""
    invoice = state.invoice(match["number"])
    if invoice is None:
        return json_response({"message": "No such invoice."}, HTTPStatus.NOT_FOUND)
    recorded, by, at = state.approve_invoice(invoice.number, _user(request).username)
    if not recorded:
        message = lab.already_approved(by, at)
        return json_response({"message": message}, HTTPStatus.CONFLICT)
    return json_response({"message": f"Invoice {invoice.number} approved for payment."})


def lab_transfer_send(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    return html(lab.transfer_unavailable_page(), HTTPStatus.SERVICE_UNAVAILABLE)


def lab_supplier(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    removed = lab.LAB_SUPPLIER in state.removed_suppliers()
    return html(lab.supplier_page(_user(request), removed=removed))


def lab_supplier_remove(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    if not state.remove_supplier(lab.LAB_SUPPLIER):
        return html(lab.supplier_page(_user(request), removed=True, refused=True))
    return redirect("/lab/supplier")


def lab_archive(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    archived = lab.LAB_ORDER in state.archived_orders()
    return html(lab.archive_page(_user(request), archived=archived))


def lab_archive_post(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    state.archive_order(lab.LAB_ORDER)
    return redirect("/lab/archive")


def lab_orders(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    return html(lab.orders_page(_user(request), refused=False))


def lab_order_cancel(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    return html(lab.orders_page(_user(request), refused=True))


def lab_sms(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    stage = request.query.get("stage", "start")
    if stage not in ("start", "sent", "wrong", "confirmed"):
        stage = "start"
    return html(lab.sms_page(_user(request), stage=stage))


def lab_sms_send(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    state.send_sms_code()
    return redirect("/lab/sms?stage=sent")


def lab_sms_confirm(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    confirmed = state.confirm_sms_code(request.form.get("code", "").strip())
    return redirect(f"/lab/sms?stage={'confirmed' if confirmed else 'wrong'}")


def api_last_code(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    """Test hook: the SMS the portal sent last, as the phone would show it."""
    code = state.last_sms_code()
    return json_response({"to": lab.LAB_SMS_PHONE, "code": code})


def api_lab(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    """Test hook: what the lab's irreversible pages recorded."""
    return json_response(
        {
            "approvals": [
                {"invoice": number, "by": by, "at": at.isoformat()}
                for number, (by, at) in sorted(state.approvals().items())
            ],
            "removed_suppliers": state.removed_suppliers(),
            "archived_orders": state.archived_orders(),
            "sms_confirmations": [at.isoformat() for at in state.sms_confirmations()],
        }
    )


def api_lab_approve(state: PortalState, request: Request, match: re.Match[str]) -> Response:
    """Test hook: a colleague approves an invoice in another browser."""
    recorded, by, _ = state.approve_invoice(match["number"], request.form.get("by", "colleague"))
    return json_response({"recorded": recorded, "by": by})


_INVOICE = r"(?P<number>INV-[0-9]{4,6})"

ROUTES: tuple[Route, ...] = (
    Route("GET", re.compile(r"/login"), login_form, login_required=False),
    Route("POST", re.compile(r"/login"), login, login_required=False),
    Route("POST", re.compile(r"/logout"), logout, login_required=False),
    Route("POST", re.compile(r"/cookies"), cookie_consent, login_required=False),
    Route("GET", re.compile(r"/"), dashboard),
    Route("GET", re.compile(r"/invoices"), invoice_list),
    Route("GET", re.compile(rf"/invoices/{_INVOICE}"), invoice_detail),
    Route("GET", re.compile(rf"/invoices/{_INVOICE}\.csv"), invoice_csv),
    Route("GET", re.compile(rf"/invoices/{_INVOICE}/pay"), pay_form),
    Route("POST", re.compile(rf"/invoices/{_INVOICE}/pay"), review_payment),
    Route("POST", re.compile(rf"/invoices/{_INVOICE}/pay/submit"), submit_payment),
    Route("GET", re.compile(r"/receipts/(?P<receipt>RCPT-[0-9]{4}-[0-9]{6})"), receipt),
    Route("GET", re.compile(r"/api/payments"), api_payments, login_required=False),
    Route("POST", re.compile(r"/api/reset"), api_reset, login_required=False),
    Route("POST", re.compile(r"/api/wording"), api_wording, login_required=False),
    Route("POST", re.compile(r"/api/sessions/expire"), api_expire_sessions, login_required=False),
    Route("GET", re.compile(r"/api/drafts/(?P<token>[A-Za-z0-9_-]{1,64})"), api_draft),
    Route("POST", re.compile(r"/api/drafts/reprice"), api_reprice, login_required=False),
    Route("GET", re.compile(r"/lab/late-content"), _lab_view(lab.late_content_page)),
    Route("GET", re.compile(r"/lab/modal"), _lab_view(lab.modal_page)),
    Route("GET", re.compile(r"/lab/draft-order"), _lab_view(lab.draft_order_page)),
    Route("GET", re.compile(r"/lab/consent"), _lab_view(lab.consent_page)),
    Route("GET", re.compile(r"/lab/checkpoint"), _lab_view(lab.checkpoint_page)),
    Route("GET", re.compile(r"/lab/iframe"), _lab_view(lab.iframe_page)),
    Route("GET", re.compile(r"/lab/iframe-inner"), lab_iframe_inner),
    Route("GET", re.compile(r"/lab/shadow"), _lab_view(lab.shadow_page)),
    Route("GET", re.compile(r"/lab/dropdown"), _lab_view(lab.dropdown_page)),
    Route("GET", re.compile(r"/lab/injection"), _lab_view(lab.injection_page)),
    Route("GET", re.compile(r"/lab/external"), lab_external),
    Route("GET", re.compile(r"/lab/sync"), lab_sync),
    Route("GET", re.compile(rf"/lab/approvals/{_INVOICE}"), lab_approval),
    Route("POST", re.compile(rf"/lab/approvals/{_INVOICE}"), lab_approve),
    Route("GET", re.compile(rf"/lab/approval-request/{_INVOICE}"), lab_approval_request),
    Route("POST", re.compile(rf"/lab/api/approvals/{_INVOICE}"), lab_api_approve),
    Route("GET", re.compile(r"/lab/transfer"), _lab_view(lab.transfer_page)),
    Route("POST", re.compile(r"/lab/transfer"), lab_transfer_send),
    Route("GET", re.compile(r"/lab/supplier"), lab_supplier),
    Route("POST", re.compile(r"/lab/supplier/remove"), lab_supplier_remove),
    Route("GET", re.compile(r"/lab/archive"), lab_archive),
    Route("GET", re.compile(r"/lab/transactions"), _lab_view(lab.dense_table_page)),
    Route("GET", re.compile(r"/lab/products"), _lab_view(lab.dense_grid_page)),
    Route("GET", re.compile(r"/lab/mega-menu"), _lab_view(lab.mega_menu_page)),
    Route("POST", re.compile(r"/lab/archive"), lab_archive_post),
    Route("GET", re.compile(r"/lab/orders"), lab_orders),
    Route("POST", re.compile(r"/lab/orders/cancel"), lab_order_cancel),
    Route("GET", re.compile(r"/lab/sms"), lab_sms),
    Route("POST", re.compile(r"/lab/sms/send"), lab_sms_send),
    Route("POST", re.compile(r"/lab/sms/confirm"), lab_sms_confirm),
    Route("GET", re.compile(r"/api/last-code"), api_last_code, login_required=False),
    Route("GET", re.compile(r"/api/lab"), api_lab, login_required=False),
    Route(
        "POST", re.compile(rf"/api/lab/approvals/{_INVOICE}"), api_lab_approve, login_required=False
    ),
)


def dispatch(state: PortalState, request: Request) -> Response:
    token = request.cookies.get(SESSION_COOKIE)
    request.user = state.session_user(token) if token else None
    path_matches = False
    for route in ROUTES:
        match = route.pattern.fullmatch(request.path)
        if match is None:
            continue
        path_matches = True
        if route.method != request.method:
            continue
        if route.login_required and request.user is None:
            # A POST cannot be replayed after signing in, so it only comes back to the dashboard.
            target = request.target if request.method == "GET" else "/"
            return redirect("/login?next=" + quote(target, safe="/"))
        return route.view(state, request, match)
    if path_matches:
        page = pages.message_page(
            "Method not allowed", f"{request.method} is not supported here.", user=request.user
        )
        return html(page, HTTPStatus.METHOD_NOT_ALLOWED)
    return _not_found(request)


class PortalServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: PortalState) -> None:
        # The socket family must be chosen before the base class creates and binds the socket.
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, PortalHandler)
        self.state = state
        # Seconds every answer is held back, as a remote portal's would be (benchmarks).
        self.latency = 0.0
        # Extra seconds for paths matching a pattern: an answer that is slow to come back after
        # the portal has already acted (tests of a worker lost in the middle of a payment).
        self.slow_paths: dict[str, float] = {}
        # Paths whose answer waits until the event is set (at most a minute): a test orders two
        # browsers' requests by what happened, not by how long it took.
        self.held_paths: dict[str, threading.Event] = {}
        # Paths whose answer to a POST is lost after the portal acted: the connection closes
        # without a response, as when a forwarder in front of the portal drops it.
        self.dropped_paths: set[str] = set()


class PortalHandler(BaseHTTPRequestHandler):
    server_version = "AcmePortal/1.0"
    sys_version = ""

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def log_message(self, format: str, *args: object) -> None:
        logger.info("%s %s", self.address_string(), format % args)

    def _handle(self, method: str) -> None:
        server = self.server
        if not isinstance(server, PortalServer):
            raise TypeError("PortalHandler serves only a PortalServer")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            page = pages.message_page("Bad request", "The request body is invalid.", user=None)
            self._send(html(page, HTTPStatus.BAD_REQUEST))
            return
        body = self.rfile.read(length)
        url = urlsplit(self.path)
        request = Request(
            method=method,
            path=url.path,
            target=url.path + (f"?{url.query}" if url.query else ""),
            query=_first_values(url.query),
            form=_first_values(body.decode("utf-8", "replace")) if method == "POST" else {},
            cookies=_cookies(self.headers.get("Cookie", "")),
            portal_port=server.server_port,
        )
        try:
            response = dispatch(server.state, request)
        except Exception:
            logger.exception("Demo portal failed on %s %s", method, self.path)
            response = html(
                pages.message_page("Server error", "Something went wrong.", user=None),
                HTTPStatus.INTERNAL_SERVER_ERROR,
            )
        delay = server.latency + sum(
            seconds
            for pattern, seconds in server.slow_paths.items()
            if re.search(pattern, url.path)
        )
        if delay > 0:
            time.sleep(delay)
        for pattern, released in list(server.held_paths.items()):
            if re.search(pattern, url.path):
                released.wait(60)
        if method == "POST" and any(re.search(p, url.path) for p in server.dropped_paths):
            self.close_connection = True
            return
        self._send(response)

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        # Account pages must not be served from a shared or back/forward cache.
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Frame-Options", "SAMEORIGIN")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "same-origin")
        for name, value in response.headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(response.body)


def _first_values(encoded: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(encoded, keep_blank_values=True).items()}


def _cookies(header: str) -> dict[str, str]:
    cookies: SimpleCookie = SimpleCookie()
    try:
        cookies.load(header)
    except CookieError:
        return {}
    return {name: morsel.value for name, morsel in cookies.items()}


def make_server(host: str = "127.0.0.1", port: int = 8001) -> PortalServer:
    """A portal with fresh state listening on ``host:port`` (port 0 picks a free port)."""
    return PortalServer((host, port), PortalState())
