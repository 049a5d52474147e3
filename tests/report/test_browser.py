"""The HTML report in a real browser: headless Chromium loads the page and every embedded image decodes.

Needs Debian's `chromium` (/usr/bin/chromium); the test is skipped where it is not installed.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from explorl.report import PLOTS, analyze

CHROMIUM = Path("/usr/bin/chromium")

# appended to a test-only copy of the page (the report itself has no script): after `load`, write into the DOM how
# many images there are and how many failed to decode (complete with naturalWidth 0)
CHECK = """<script>
window.addEventListener("load", function () {
  var imgs = document.images, bad = 0;
  for (var i = 0; i < imgs.length; i++) { if (!(imgs[i].complete && imgs[i].naturalWidth > 0)) bad++; }
  var out = document.createElement("pre");
  out.id = "image-check";
  out.textContent = "IMAGES " + imgs.length + " BROKEN " + bad;
  document.body.appendChild(out);
});
</script>"""


def _synthetic_run(path: Path, steps: int = 6) -> Path:
    """A small run directory in the format `explorl train` writes (no model needed), with every plotted metric
    (an EAD run's `temperature/at_min_frac` too, and each function's `reward/<name>` of two reward functions)."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("run:\n  seed: 0\n  out_dir: x\n  eval_every: 3\nsampling:\n  temperature: 1.0\n"
                                      "task:\n  reward: [math, exact]\n")
    lines = []
    for s in range(1, steps + 1):
        lines.append({"step": s, "reward/mean": 0.1 * s, "reward/all_wrong_frac": 0.5 / s, "entropy/mean": 1.0 / s,
                      "entropy/pos": None if s == 1 else 0.8 / s, "entropy/neg": 1.1 / s,
                      "temperature/mean": 1.0, "temperature/at_min_frac": 0.1 * s,
                      "rollouts/per_prompt_min": 4, "rollouts/per_prompt_max": 8,
                      "rollouts/per_prompt_mean": 6.0, "length/mean": 20.0 + s, "optim/grad_norm": 1.0 / s,
                      "reward/math": 0.1 * s, "reward/exact": 0.05 * s,
                      "kl/mean": 0.01 * s, "loss/ppo_kl": 0.001, "loss/clip_frac_low": 0.02,
                      "loss/clip_frac_high": 0.01, "mismatch/k3_kl": 1e-4 / s, "mismatch/kl": 1e-3 / s,
                      "mismatch/ratio_oob": 0.02 / s, "mismatch/ratio_low": 0.015 / s, "mismatch/ratio_high": 0.005 / s,
                      "entropy/by_position": [0.5, 0.3, 0.2, 0.2, 0.2, 0.2, 0.2, 0.3, None, 0.6]})
        if s % 3 == 0:
            lines[-1].update({"eval/pass@1": 0.05 * s, "eval/pass@8": 0.1 * s})
    lines.append({"step": steps, "eval/pass@1": 0.3, "eval/pass@8": 0.6})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (path / "eval.json").write_text(json.dumps({"step": steps, "problems": 4, "n": 8, "pass@1": 0.3, "pass@8": 0.6}))
    return path


@pytest.mark.skipif(not CHROMIUM.exists(), reason="chromium not installed: apt-get install chromium")
def test_every_image_loads_in_headless_chromium(tmp_path):
    report = analyze(_synthetic_run(tmp_path / "run"))
    n_plots = sum(p.path is not None for p in report.plots)
    assert n_plots == len(PLOTS)
    html = report.html.read_text(encoding="utf-8")
    assert "<script" not in html
    page = tmp_path / "check.html"  # the test copy, away from the PNG files: only the data URIs can load
    page.write_text(html.replace("</body>", CHECK + "</body>"), encoding="utf-8")
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}",
           "--run-all-compositor-stages-before-draw", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r"IMAGES (\d+) BROKEN (\d+)", proc.stdout)
    assert found, f"the check script did not run; stderr: {proc.stderr[-2000:]}"
    assert (int(found.group(1)), int(found.group(2))) == (n_plots, 0)
