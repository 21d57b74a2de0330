"""exp/fused: mace_large with pallas_fuse_bwd = 1 (the fused backward in its q_j form)."""
import subprocess, sys
from pathlib import Path
src = Path("examples/specs/mace_large.toml").read_text()
assert "pallas_fuse_bwd = 0" in src
d = Path("exp/fused"); d.mkdir(parents=True, exist_ok=True)
(d / "mace_large.toml").write_text(src.replace("pallas_fuse_bwd = 0", "pallas_fuse_bwd = 1"))
subprocess.run([sys.executable, "-m", "eqdsl", "generate", str(d / "mace_large.toml"), "-o", str(d)], check=True)
