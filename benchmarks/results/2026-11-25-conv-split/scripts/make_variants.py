"""Spec variants with top-level pallas keys set, generated into exp/<label>/ (device experiments)."""
import subprocess, sys
from pathlib import Path
VARIANTS = {
    "fma1": {"mace_large": {"pallas_fma": 1}, "nequip_toluene": {"pallas_fma": 1}},
}
for label, probs in VARIANTS.items():
    for prob, keys in probs.items():
        src = Path(f"examples/specs/{prob}.toml").read_text()
        lines = "".join(f"{k} = {v}\n" for k, v in keys.items())
        if "[tensor_product.tuning]\n" in src:
            # drop keys we override
            body = [l for l in src.splitlines(True) if l.split("=")[0].strip() not in keys]
            s = "".join(body).replace("[tensor_product.tuning]\n", "[tensor_product.tuning]\n" + lines, 1)
        else:
            i = src.index("[tensor_product.tuning.")
            s = src[:i] + "[tensor_product.tuning]\n" + lines + "\n" + src[i:]
        d = Path(f"exp/{label}"); d.mkdir(parents=True, exist_ok=True)
        (d / f"{prob}.toml").write_text(s)
        subprocess.run([sys.executable, "-m", "eqdsl", "generate", str(d / f"{prob}.toml"), "-o", str(d)], check=True)
