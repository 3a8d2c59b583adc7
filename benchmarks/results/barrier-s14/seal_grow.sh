cd /work/main
for round in 1 2 3; do
  for sg in 4 16; do
    while [ "$(cut -d. -f1 /proc/loadavg)" -ge 2 ]; do sleep 5; done
    out=/tmp/sg/r$round-sg$sg; rm -rf $out
    SG=$sg timeout 300 python -m benchmarks._sg_tmp --n 256 --fs bindfs2 --stores folder --k 2 --k-add 1 --limit 240 --no-strace --out $out > $out.log 2>&1
    python - $out $sg $round <<'PY'
import json,sys
r=json.load(open(sys.argv[1]+"/results.json"))
run=[v for v in r["runs"].values()][0] if isinstance(r["runs"],dict) else r["runs"][0]
def find(o):
    if isinstance(o,dict):
        if "barrier" in o and "timeline" in o: return o
        for v in o.values():
            x=find(v)
            if x: return x
    if isinstance(o,list):
        for v in o:
            x=find(v)
            if x: return x
x=find(r)
t=x["timeline"]
print(f"round {sys.argv[3]} SG={sys.argv[2]}: barrier {x['barrier']:.2f} s, add calls {x['add_meta']:.1f}, epochs {x.get('barrier_epochs')}, ranks cpu add1 {t['ranks_cpu_add1_s']}, daemons {t['daemons_cpu_s']}", flush=True)
PY
  done
done
