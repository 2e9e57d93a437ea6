import subprocess
import sys

from zoo.cli import build_parser


def test_demo_writes_its_plot(tmp_path):
    out = tmp_path / "band.png"
    proc = subprocess.run(
        [sys.executable, "-m", "zoo", "demo", "--steps", "60", "--quiet", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "test rmse" in proc.stdout and "coverage_95" in proc.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_demo_help_names_every_option():
    text = build_parser()._subparsers._group_actions[0].choices["demo"].format_help()
    for option in ("--guide", "--steps", "--lr", "--points", "--seed", "--out", "--quiet"):
        assert option in text
