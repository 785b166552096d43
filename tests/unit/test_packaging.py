"""An installed gpubox (pip install ., not editable) finds its templates, files and the burn-in
deploy inside the package: nothing is looked up through the repository checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent(
    """
    import pathlib, sys
    import gpubox
    from gpubox.base.rendering import FILES, TEMPLATES, render
    from gpubox import cli
    where = pathlib.Path(gpubox.__file__).resolve().parent
    assert str(where).startswith(sys.argv[1]), where
    names = sorted(p.name for p in TEMPLATES.glob("*.j2"))
    assert names, TEMPLATES
    assert (FILES / "blacklist-nouveau.conf").is_file(), FILES
    assert (FILES / "monitoring" / "alerts.yml").is_file(), FILES
    assert (where / "deploy" / "burnin.py").is_file()
    text = render("nvidia-persistenced-wanted.conf.j2")
    assert "nvidia-persistenced" in text
    print(len(names))
    """
)


def test_a_non_editable_install_has_its_templates_files_and_burnin_deploy(tmp_path: Path) -> None:
    target = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert build.returncode == 0, build.stderr[-2000:]
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(target.resolve())],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    shipped = sorted(p.name for p in (ROOT / "src" / "gpubox" / "templates").glob("*.j2"))
    assert int(probe.stdout.strip()) == len(shipped)
