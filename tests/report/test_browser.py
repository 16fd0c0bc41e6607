"""The offline browser check itself: a self-contained page passes, a page that reaches for the
network or logs an error is caught (so the check of the report can fail)."""

from __future__ import annotations

import pytest

from browser import PNG_MAGIC, chromium_available, visit

pytestmark = pytest.mark.skipif(not chromium_available(), reason="chromium not installed (make test installs it)")

SELF_CONTAINED = """<!doctype html><html><head><meta charset="utf-8"><title>inline only</title></head>
<body><h1>Inline chart</h1>
<svg xmlns="http://www.w3.org/2000/svg" width="400" height="200" role="img" aria-label="bars">
<rect x="10" y="60" width="80" height="140" fill="#4477aa"/><rect x="110" y="20" width="80" height="180" fill="#ee6677"/>
</svg>
<img alt="dot" src="data:image/gif;base64,R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7">
</body></html>"""

LEAKY = """<!doctype html><html><head><title>leaky</title></head>
<body><p>reaches out</p><img src="http://203.0.113.1/x.png"><script>console.error("boom")</script>
<table><tr><td style="white-space: nowrap">far too wide for any window: """ + "x" * 400 + """</td></tr></table></body></html>"""


def test_a_self_contained_page_asks_for_nothing_and_logs_no_error(tmp_path):
    page = tmp_path / "page.html"
    page.write_text(SELF_CONTAINED)
    seen = visit(page, tmp_path / "shots" / "first.png")
    assert seen.requests == [] and seen.errors == [] and seen.too_wide == []
    assert seen.title == "inline only" and "<svg" in seen.dom and "Inline chart" in seen.dom
    png = seen.screenshot.read_bytes()
    assert seen.screenshot == tmp_path / "shots" / "first.png"
    assert png[:8] == PNG_MAGIC and len(png) > 2000


def test_a_page_that_reaches_the_network_or_logs_an_error_is_caught(tmp_path):
    page = tmp_path / "leaky.html"
    page.write_text(LEAKY)
    seen = visit(page, tmp_path / "leaky.png")
    assert "http://203.0.113.1/x.png" in seen.requests
    assert any(e == "console.error: boom" for e in seen.errors), seen.errors
    assert any(w.startswith("TABLE far too wide") for w in seen.too_wide), seen.too_wide
    assert seen.screenshot.read_bytes()[:8] == PNG_MAGIC
