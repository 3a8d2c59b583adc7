"""GlusterFS nfs60: the create race as the protocol makes it; a host whose publish fails keeps trying: for how long?"""
import json, os, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests"))
import cluster as cl

HOST = r'''
import json, sys, time, os
from fsmingle.errors import StorageError
from fsmingle.fs import readback
from fsmingle.fs.jobdir import open_job_dir
rdzv, job, host, t0 = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
while time.time() < t0: pass
st = open_job_dir(rdzv, job, create_base=False)
res = {"host": host, "made": None, "broken": "", "ok_at": None, "tries": 0}
try:
    res["made"] = readback.make_dir(st, "gen-00000001")
    readback.publish(st, f"gen-00000001/beacon-{host}", host.encode())
except FileNotFoundError:
    res["broken"] = "ENOENT"
except StorageError as e:
    res["broken"] = str(e)[:200]
    start = time.monotonic()
    while time.monotonic() - start < 180:
        time.sleep(1.0); res["tries"] += 1
        try:
            st.publish(f"gen-00000001/beacon-{host}", host.encode()); res["ok_at"] = round(time.monotonic() - start, 1); break
        except StorageError as e2:
            res["last"] = str(e2)[:120]
            try: os.listdir(os.path.join(rdzv, job, "gen-00000001"))
            except OSError as e3: res["list"] = str(e3)[:80]
print(json.dumps(res))
'''
with cl.Cluster(4, fs="glusterfs-nfs60") as c:
    rd = os.path.join(c.shared, "rdzv"); os.makedirs(rd, mode=0o700, exist_ok=True)
    broken = 0
    for i in range(int(sys.argv[1])):
        os.mkdir(os.path.join(rd, f"r{i}"), 0o700)
        t0 = time.time() + 1.5
        ps = [h.popen([sys.executable, "-c", HOST, rd, f"r{i}", h.name, str(t0)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for h in c]
        for p in ps:
            o, e = p.communicate(timeout=300)
            try: r = json.loads(o.strip().splitlines()[-1])
            except Exception: print("bad", i, o[-300:], e[-800:], flush=True); continue
            if r["broken"] and r["broken"] != "ENOENT":
                broken += 1; print(i, json.dumps(r), flush=True)
        if i % 20 == 0: print("round", i, "broken", broken, time.strftime("%T"), flush=True)
