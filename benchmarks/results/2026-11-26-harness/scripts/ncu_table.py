"""One line per kernel launch of an ncu --csv --page raw file (time, DRAM bytes, registers, occupancy, throughputs)."""
import csv, sys
for f in sys.argv[1:]:
    lines = [l for l in open(f) if l.startswith('"')]
    if not lines:
        print(f, "empty"); continue
    rd = list(csv.DictReader(lines)); units = rd[0]; rows = [r for r in rd if r.get("ID", "").isdigit()]
    mult = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1, "Gbyte": 1e3}
    def g(r, k):
        try:
            return float(r.get(k, "nan").replace(",", "")) * mult.get(units.get(k, ""), 1)
        except ValueError:
            return float("nan")
    print(f"{f}: {len(rows)} launches (us, MB)")
    for r in rows:
        print(f"  {r['Kernel Name'][:40]:40s} t={g(r,'gpu__time_duration.sum'):8.1f} rd={g(r,'dram__bytes_read.sum'):7.1f} "
              f"wr={g(r,'dram__bytes_write.sum'):7.1f} regs={r['launch__registers_per_thread']:>4s} "
              f"occ={g(r,'sm__warps_active.avg.pct_of_peak_sustained_active'):5.1f} "
              f"sm%={g(r,'sm__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f} "
              f"dram%={g(r,'dram__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f} "
              f"local_ld={g(r,'smsp__sass_inst_executed_op_local_ld.sum'):6.0f}")
