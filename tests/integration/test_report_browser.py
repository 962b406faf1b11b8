"""The report page in a real browser: headless Chromium loads it with no console error and shows every plot.

The page is the realistic one of ``tests/unit/test_report_page.py`` (four protocols, three
profiles, two seeds, a failed calibration, provenance). A copy gets a probe script as the first
thing in its ``<head>``: it records ``console.error``/``console.warn`` calls, uncaught errors and
failed resource loads (capture phase, so a broken ``<img>`` counts), and after ``load`` writes
what it saw and each image's ``naturalWidth`` into the DOM, which ``--dump-dom`` prints.
Chromium's own console log (``--enable-logging=stderr``) is checked too.

Chromium is installed with apt-get when it is missing and we are root; otherwise the test is
skipped on a developer's machine and fails under ``CI=true``.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from squall.cluster.engine import in_ci
from squall.report.page import html_page
from tests.unit.test_report_page import realistic_results

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

PROBE = """<script>
(function () {
  var seen = [];
  ["error", "warn"].forEach(function (level) {
    var orig = console[level];
    console[level] = function () {
      seen.push(level + ": " + Array.prototype.map.call(arguments, String).join(" "));
      return orig.apply(console, arguments);
    };
  });
  window.addEventListener("error", function (e) {
    var t = e.target || {};
    var what = "failed to load " + (t.tagName || "?") + " " + String(t.src || "").slice(0, 60);
    seen.push("error: " + (e.message || what));
  }, true);
  window.addEventListener("unhandledrejection", function (e) { seen.push("rejection: " + e.reason); });
  window.addEventListener("load", function () {
    var imgs = Array.prototype.map.call(document.images, function (img) {
      return {alt: img.alt, complete: img.complete, width: img.naturalWidth, height: img.naturalHeight};
    });
    var out = document.createElement("pre");
    out.id = "squall-probe";
    out.textContent = JSON.stringify({errors: seen, images: imgs, title: document.title,
                                      headings: Array.prototype.map.call(document.querySelectorAll("h2"),
                                                                         function (h) { return h.textContent; })});
    document.body.appendChild(out);
  });
})();
</script>"""


def _install() -> str | None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"], env=env, check=False,
                   capture_output=True, timeout=900)
    return next((p for b in BROWSERS if (p := shutil.which(b))), None)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Name: chromium. Scope: module. The path of a Chromium binary (installed with apt-get when missing)."""
    found = next((p for b in BROWSERS if (p := shutil.which(b))), None) or _install()
    if found is None:
        why = "headless Chromium is not installed and could not be: apt-get install chromium"
        if in_ci():
            pytest.fail(f"{why} (CI=true: a missing prerequisite is a failure, not a skip)")
        pytest.skip(why)
    return found


def load_in_browser(browser: str, page: Path) -> tuple[dict[str, object], str]:
    """The probe's findings and Chromium's stderr, for ``page`` loaded headless."""
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", f"--user-data-dir={page.parent / 'prof'}",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180, check=False)
    found = re.search(r'<pre id="squall-probe">(.*?)</pre>', done.stdout, re.S)
    assert found, f"the probe did not report (rc {done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(html.unescape(found.group(1))), done.stderr


def test_the_report_loads_in_chromium_with_every_plot_shown(chromium: str, tmp_path: Path) -> None:
    page = html_page(realistic_results())
    assert page.count("<head>") == 1
    probed = tmp_path / "report.html"
    probed.write_text(page.replace("<head>", "<head>" + PROBE, 1))
    seen, stderr = load_in_browser(chromium, probed)
    assert seen["errors"] == [], seen["errors"]
    console = [line for line in stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console
    images = seen["images"]
    assert isinstance(images, list)
    # heatmap, bytes to target, loss against time, loss against bytes, drift
    assert len(images) == 5 == page.count("<img ")
    for img in images:
        assert img["complete"] and img["width"] > 200 and img["height"] > 100, img
    assert seen["headings"] == ["1. What network?", "2. Was the emulation faithful?",
                                "3. How do the protocols compare?", "4. How do I reproduce it?"]
    assert seen["title"] == "Squall demo"
