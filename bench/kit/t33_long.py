# t33 with its time limit (argv[1], s) and line count (argv[2]) as arguments. A 520-line batch whose answers are ~1.1 MB each: the output file would be ~575 MB, past V8's string limit
# (and Redis's 512 MB bulk limit). Does the batch finish? Router RSS and Redis memory while it retries.
import httpx, json, time, subprocess
import sys; LIMIT = float(sys.argv[1]) if len(sys.argv) > 1 else 40
R = "http://127.0.0.1:28097"; n = int(sys.argv[2]) if len(sys.argv) > 2 else 520; RP = int(open("./router13.pid").read())
def rss(): return int(open(f"/proc/{RP}/status").read().split("VmRSS:")[1].split()[0]) // 1024
def redis_mem(): return subprocess.run(["redis-cli", "-p", "26379", "info", "memory"], capture_output=True, text=True).stdout.split("used_memory_human:")[1].split()[0]
lines = "\n".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "open-model", "messages": [{"role": "user", "content": f"q{i}"}]}}) for i in range(n)) + "\n"
c = httpx.Client(base_url=R, timeout=60)
f = c.post("/v1/files", files={"file": ("in.jsonl", lines.encode())}, data={"purpose": "batch"}).json()
b = c.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}).json()
t0 = time.time(); last = None
while time.time() - t0 < LIMIT:
    s = c.get(f"/v1/batches/{b['id']}").json()
    st = (s["status"], s["request_counts"]["completed"])
    if st != last or int(time.time() - t0) % 10 == 0: print(f"{time.time()-t0:5.1f}s {st} router RSS {rss()} MB, redis {redis_mem()}"); last = st
    if s["status"] in ("completed", "failed", "cancelled", "expired"): break
    time.sleep(1); sys.stdout.flush()
print("final:", s["status"], s["request_counts"], "output_file_id", s.get("output_file_id"), "error_file_id", s.get("error_file_id"), "errors", s.get("errors"), "| batch", b["id"])
