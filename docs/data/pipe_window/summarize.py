import json, glob, sys, numpy as np
files = sorted(glob.glob(sys.argv[1]))
runs = [json.load(open(f)) for f in files]
V = runs[0]["variants"]
print(f"{len(files)} runs; per variant: median of run medians [range of run medians]; pooled p25/median; ratio to variant 0 per run (median [range])")
base = [np.median(r["times"]["0"]) for r in runs]
for i, v in enumerate(V):
    meds = [np.median(r["times"][str(i)]) for r in runs]
    pooled = np.concatenate([r["times"][str(i)] for r in runs])
    ratios = [m / b for m, b in zip(meds, base)]
    name = ",".join(f"{k}={x}" for k, x in v.items())
    print(f"{name:30s} {np.median(meds):7.1f} [{min(meds):6.1f}-{max(meds):6.1f}]  p25 {np.percentile(pooled,25):6.1f} med {np.median(pooled):6.1f}  ratio {np.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")
