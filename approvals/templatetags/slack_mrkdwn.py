"""Slack's mrkdwn as HTML, for the card preview: *bold*, `code`, <url|links>, <!date^…|dates>."""

from __future__ import annotations

import html
import re

from django import template
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

_TOKEN = re.compile(r"<(!date\^\d+\^[^|>]*\|([^>]*)|([^|>!][^|>]*)\|([^>]*))>")
_BOLD = re.compile(r"\*([^*\n]+)\*")
_CODE = re.compile(r"`([^`\n]+)`")
_EMOJI = {":white_check_mark:": "✅", ":x:": "❌", ":hourglass:": "⌛", ":no_entry_sign:": "🚫"}


def _inline(text: str) -> str:
    escaped = html.escape(html.unescape(text), quote=False)
    for name, emoji in _EMOJI.items():
        escaped = escaped.replace(name, emoji)
    escaped = _CODE.sub(r"<code>\1</code>", escaped)
    return _BOLD.sub(r"<strong>\1</strong>", escaped)


@register.filter
def slack_mrkdwn(text: str) -> SafeString:
    out, position = [], 0
    for match in _TOKEN.finditer(text):
        out.append(_inline(text[position : match.start()]))
        if match.group(2) is not None:  # a date: its fallback text
            out.append(html.escape(html.unescape(match.group(2))))
        else:
            url, label = html.unescape(match.group(3)), html.unescape(match.group(4))
            out.append(f'<a href="{html.escape(url)}">{html.escape(label)}</a>')
        position = match.end()
    out.append(_inline(text[position:]))
    return mark_safe("".join(out).replace("\n", "<br>"))  # noqa: S308 (escaped above)
