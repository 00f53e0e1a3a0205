"""Compile cache: scalars never recompile; the disk tier warms a second process."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import torch

import torch_pjrt

PY = sys.executable


def test_scalar_loop_compiles_a_bounded_number_of_times(dev):
    x = torch.ones(16, device=dev)
    x = x * 0.9 + 0  # warm the programs once
    torch_pjrt.reset_metrics()
    for i in range(1000):
        x = x * 0.9 + i
    value = x.cpu()
    m = torch_pjrt.metrics()
    assert m["compiles"] <= 2, m["compiles_by_op"]
    assert m["executions"] >= 2000
    expected = torch.ones(16)
    for i in range(1000):
        expected = expected * 0.9 + i
    torch.testing.assert_close(value, expected)


def test_slicing_at_many_offsets_does_not_recompile(dev):
    x = torch.arange(1000.0, device=dev)
    _ = x[3:13] * 2
    torch_pjrt.reset_metrics()
    total = sum(float((x[i:i + 10] * 2).sum().item()) for i in range(100))
    assert torch_pjrt.metrics()["compiles"] <= 1
    assert total == sum(2 * sum(range(i, i + 10)) for i in range(100))


CHILD = """
import json, torch, torch_pjrt
x = torch.arange(12.0, device="pjrt").reshape(3, 4)
y = (x.t() @ x).softmax(-1).sum(0)
v = y.cpu().tolist()
m = torch_pjrt.metrics()
print(json.dumps({"compiles": m["compiles"], "disk_hits": m["disk_cache_hits"],
                  "rejects": m["disk_cache_rejects"], "value": v}))
"""


def run_child(cache_dir: str) -> dict:
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache_dir)
    r = subprocess.run([PY, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_disk_cache_hit_in_second_process_and_corruption_recompiles(tmp_path):
    cache = str(tmp_path / "cache")
    cold = run_child(cache)
    assert cold["compiles"] > 0 and cold["disk_hits"] == 0
    entries = glob.glob(os.path.join(cache, "*.pjrtexe"))
    assert len(entries) == cold["compiles"]
    warm = run_child(cache)
    assert warm["compiles"] == 0 and warm["disk_hits"] == cold["compiles"]
    assert warm["value"] == cold["value"]
    # Corrupt one entry and truncate another: both are recompiled, never loaded.
    with open(entries[0], "r+b") as f:
        f.seek(-10, os.SEEK_END)
        f.write(b"\x00garbage!\x00")
    with open(entries[1], "r+b") as f:
        f.truncate(30)
    again = run_child(cache)
    assert again["compiles"] == 2 and again["rejects"] == 2
    assert again["value"] == cold["value"]
    # The recompiled entries were rewritten whole.
    assert run_child(cache)["compiles"] == 0


def test_disk_cache_can_be_disabled(tmp_path):
    result = run_child("off")
    assert result["disk_hits"] == 0 and result["compiles"] > 0
    assert not os.path.exists("off")


def test_concurrent_processes_share_a_cache_dir(tmp_path):
    cache = str(tmp_path / "shared")
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache)
    procs = [subprocess.Popen([PY, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    values = {json.dumps(json.loads(o[0].strip().splitlines()[-1])["value"]) for o in outs}
    assert len(values) == 1
    assert not glob.glob(os.path.join(cache, "*.tmp.*"))  # no half-written entries left behind
    assert run_child(cache)["compiles"] == 0


FLEET_CHILD = """
import json, os, sys, time, torch, torch_pjrt
open(f"{sys.argv[1]}.ready.{os.getpid()}", "w").close()
while not os.path.exists(sys.argv[1]):  # start together: every process misses at once
    time.sleep(0.005)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to("pjrt")
x = torch.randn(5, 8).to("pjrt")
loss = model(x).logsumexp(-1).mean()
loss.backward()
m = torch_pjrt.metrics()
print(json.dumps({"loss": loss.item(), "grads": [p.grad.cpu().tolist() for p in model.parameters()],
                  **{k: m[k] for k in ("compiles", "disk_cache_hits", "disk_cache_rejects", "disk_cache_waits",
                                       "disk_cache_stale_locks", "disk_cache_lock_timeouts")}}))
"""


def _fleet(cache: str, start_file: str, n: int) -> list[dict]:
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache, TORCH_PJRT_EAGER_MODE="strict")
    procs = [subprocess.Popen([PY, "-c", FLEET_CHILD, start_file], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(n)]
    if not os.path.exists(start_file):
        import time

        # All of them imported and waiting (a fixed sleep was not enough on a loaded machine:
        # one process compiled every program before the others arrived, and none waited).
        deadline = time.monotonic() + 300
        while len(glob.glob(glob.escape(start_file) + ".ready.*")) < n:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [p.communicate()[1][-800:] for p in procs if p.poll() is not None]
            time.sleep(0.01)
        open(start_file, "w").close()
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-800:] for o in outs]
    return [json.loads(o[0].strip().splitlines()[-1]) for o in outs]


def _reference() -> tuple[float, list]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    x = torch.randn(5, 8).double()
    loss = model(x).logsumexp(-1).mean()
    loss.backward()
    return loss.item(), [p.grad for p in model.parameters()]


def test_a_fleet_of_processes_compiles_each_program_once(tmp_path):
    # The programs one process compiles alone, in a cache of its own.
    alone = _fleet(str(tmp_path / "alone"), str(tmp_path / "go-alone"), 1)[0]
    programs = alone["compiles"]
    assert programs > 3
    # Four processes starting together on one directory: one compile per program in
    # all, the others wait for it and read the entry; every result the same.
    fleet = _fleet(str(tmp_path / "shared"), str(tmp_path / "go"), 4)
    assert sum(r["compiles"] for r in fleet) == programs, fleet
    assert all(r["compiles"] + r["disk_cache_hits"] == programs for r in fleet), fleet
    assert sum(r["disk_cache_waits"] for r in fleet) > 0, fleet  # they did meet on the same programs
    assert all(r["disk_cache_rejects"] == 0 and r["disk_cache_lock_timeouts"] == 0 for r in fleet), fleet
    assert all(r["loss"] == alone["loss"] and r["grads"] == alone["grads"] for r in fleet)
    loss, grads = _reference()  # and right: float32 against a float64 reference
    assert abs(alone["loss"] - loss) <= 1e-5 * abs(loss)
    for got, want in zip(alone["grads"], grads):
        torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), want, rtol=1e-4, atol=1e-6)
    assert not glob.glob(str(tmp_path / "shared" / "*.lock")) and not glob.glob(str(tmp_path / "shared" / "*.tmp.*"))


def test_a_killed_compilers_locks_are_taken_over(tmp_path):
    import signal
    import socket

    first = tmp_path / "first"
    alone = _fleet(str(first), str(tmp_path / "go-first"), 1)[0]
    names = [os.path.basename(p) for p in glob.glob(str(first / "*.pjrtexe"))]
    assert len(names) == alone["compiles"]
    # A compiler on this host that was killed while holding every program's lock.
    victim = subprocess.Popen(["sleep", "600"])
    shared = tmp_path / "shared"
    shared.mkdir()
    for name in names:
        (shared / (name + ".lock")).write_text(f"{socket.gethostname()} {victim.pid}\n")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    import time

    start = time.monotonic()
    result = _fleet(str(shared), str(tmp_path / "go-shared"), 1)[0]
    assert time.monotonic() - start < 120  # not the 30-minute wait: the dead holder is noticed
    assert result["disk_cache_stale_locks"] == len(names) and result["compiles"] == len(names), result
    assert result["loss"] == alone["loss"]
    assert not glob.glob(str(shared / "*.lock"))


WARM_CHILD = """
import json, torch, torch_pjrt
from torch._dynamo.utils import counters
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("pjrt")
x = torch.randn(5, 8).to("pjrt")

@torch.compile(backend="pjrt")
def loss_fn(x):
    with torch.autocast("pjrt", enabled=False):  # an autocast region, as models have
        return model(x).logsumexp(-1).mean()

loss = loss_fn(x)
loss.backward()
m = torch_pjrt.metrics()
print(json.dumps({"loss": loss.item(), "grads": [p.grad.cpu().tolist() for p in model.parameters()],
                  "hits": counters["aot_autograd"]["autograd_cache_hit"],
                  "misses": counters["aot_autograd"]["autograd_cache_miss"],
                  "bypasses": counters["aot_autograd"]["autograd_cache_bypass"], "compiles": m["compiles"]}))
"""


def _warm_child(cache: str, **env: str) -> dict:
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=os.path.join(cache, "pjrt"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"), **env)
    r = subprocess.run([PY, "-c", WARM_CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_second_process_reads_compiled_graphs_from_aotautograds_cache(tmp_path):
    cache = str(tmp_path)
    cold = _warm_child(cache)
    assert cold["misses"] == 1 and cold["hits"] == 0 and cold["bypasses"] == 0 and cold["compiles"] > 0, cold
    # Dynamo still traces; AOTAutograd's tracing and partitioning come from its cache (the
    # forward and backward graph), XLA's programs from the disk tier: nothing compiled.
    warm = _warm_child(cache)
    assert warm["hits"] == 1 and warm["misses"] == 0 and warm["compiles"] == 0, warm
    assert (warm["loss"], warm["grads"]) == (cold["loss"], cold["grads"])
    # Another compile configuration (here an XLA option) is another key: never served.
    other = _warm_child(cache, TORCH_PJRT_XLA_OPTIONS="xla_cpu_enable_fast_math=false")
    assert other["hits"] == 0 and other["misses"] == 1, other
    # Corrupted entries are a miss (recompiled), never a crash or a wrong graph.
    entries = [os.path.join(d, f) for d, _, files in os.walk(os.path.join(cache, "inductor")) for f in files]
    assert entries
    for path in entries:
        with open(path, "r+b") as f:
            f.seek(0)
            f.write(b"\x00garbage\x00" * 4)
    again = _warm_child(cache)
    assert again["hits"] == 0 and (again["loss"], again["grads"]) == (cold["loss"], cold["grads"]), again


BOUNDED_CHILD = """
import json, torch, torch_pjrt
from torch._dynamo.utils import counters
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("pjrt")
loss_fn = torch.compile(lambda x: model(x).softmax(1).amax(1).mean(), backend="pjrt")
out = []
for n in (5, 23):
    x = torch.randn(2, n, 8).to("pjrt")
    torch._dynamo.mark_dynamic(x, 1, min=2, max=32)
    for p in model.parameters():
        p.grad = None
    loss = loss_fn(x)
    loss.backward()
    out.append([loss.item(), [p.grad.cpu().tolist() for p in model.parameters()]])
[stats] = torch_pjrt.metrics()["compiled"].values()
print(json.dumps({"out": out, "bounded": stats["bounded"]["graphs"], "programs": stats["programs"],
                  "hits": counters["aot_autograd"]["autograd_cache_hit"]}))
"""


def test_a_bounded_graphs_plan_is_kept_in_aotautograds_cache(tmp_path):
    # The padded graph and its plan (which inputs to pad, which outputs to cut; the forward
    # handing its saved tensors over padded) come back from the cache as they were saved.
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(tmp_path / "pjrt"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"))
    runs = []
    for _ in range(2):
        r = subprocess.run([PY, "-c", BOUNDED_CHILD], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["hits"] == 0 and warm["hits"] == 1, runs
    for run in runs:
        assert run["programs"] == 2 and [g.split(" for ")[0] for g in run["bounded"]] == \
            ["forward: one program", "backward: one program"], run
    assert warm["out"] == cold["out"]


SHIPPED_CHILD = """
import json, sys, torch, torch_pjrt
from torch._dynamo.utils import counters
mode, bundle = sys.argv[1], sys.argv[2]
shipped = 0
if mode == "load":
    with open(bundle, "rb") as f:
        info = torch.compiler.load_cache_artifacts(f.read())
    shipped = len(info.pjrt_executable_artifacts)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("pjrt")
x = torch.randn(5, 8).to("pjrt")
loss = torch.compile(lambda x: model(x).logsumexp(-1).mean(), backend="pjrt")(x)
loss.backward()
if mode == "save":
    data, info = torch.compiler.save_cache_artifacts()
    shipped = len(info.pjrt_executable_artifacts)
    with open(bundle, "wb") as f:
        f.write(data)
print(json.dumps({"loss": loss.item(), "grads": [p.grad.cpu().tolist() for p in model.parameters()],
                  "hits": counters["aot_autograd"]["autograd_cache_hit"], "shipped": shipped,
                  "compiles": torch_pjrt.metrics()["compiles"]}))
"""


def test_a_saved_cache_bundle_carries_the_xla_programs(tmp_path):
    # torch.compiler.save_cache_artifacts() in one process, load_cache_artifacts() in another
    # whose cache directories are empty (another machine): AOTAutograd's graphs and XLA's
    # programs both come from the bundle, so nothing is traced by AOTAutograd or compiled.
    bundle = str(tmp_path / "bundle.bin")

    def child(mode: str, cache: str) -> dict:
        env = dict(os.environ, TORCH_PJRT_CACHE_DIR=os.path.join(cache, "pjrt"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"))
        r = subprocess.run([PY, "-c", SHIPPED_CHILD, mode, bundle], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    saved = child("save", str(tmp_path / "a"))
    assert saved["compiles"] > 0 and saved["shipped"] >= 2, saved  # the forward and backward programs at least
    loaded = child("load", str(tmp_path / "b"))
    assert loaded["shipped"] == saved["shipped"] and loaded["hits"] == 1 and loaded["compiles"] == 0, loaded
    assert (loaded["loss"], loaded["grads"]) == (saved["loss"], saved["grads"])
    # A bundle's entry is checked like any disk entry: corrupted, it is compiled again, not run.
    for path in glob.glob(str(tmp_path / "b" / "pjrt" / "*.pjrtexe")):
        with open(path, "r+b") as f:
            f.seek(40)
            f.write(b"\x00garbage\x00")
    again = child("run", str(tmp_path / "b"))
    assert again["compiles"] > 0 and (again["loss"], again["grads"]) == (saved["loss"], saved["grads"]), again


PRECOMPILE_CHILD = """
import json, sys, torch, torch_pjrt
import torch.nn.functional as F
from torch._dynamo.utils import counters
batch = int(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(11, 16), torch.nn.Linear(16, 16), torch.nn.GELU(),
                            torch.nn.Linear(16, 11)).to("pjrt")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)  # an op, not a traced step
tokens = torch.randint(0, 11, (batch, 6)).to("pjrt")

def loss_fn(tokens):
    return F.cross_entropy(model(tokens[:, :-1]).reshape(-1, 11), tokens[:, 1:].reshape(-1))

loss = torch.compile(loss_fn, backend="pjrt")
losses = []
for _ in range(2):
    opt.zero_grad()
    value = loss(tokens)
    value.backward()
    opt.step()
    losses.append(value.item())
torch.compiler.save_cache_artifacts()  # writes Dynamo's precompile entries
eager = loss_fn(tokens).item()  # the same model, uncompiled: the reference for the last state
compiled = loss(tokens).item()
print(json.dumps({"losses": losses, "eager": eager, "compiled": compiled,
                  "frames": counters["frames"]["total"], "compiles": torch_pjrt.metrics()["compiles"],
                  "params": [p.detach().cpu().sum().item() for p in model.parameters()]}))
"""


def test_dynamo_precompile_with_a_fused_optimizer_skips_tracing_in_a_second_process(tmp_path):
    # PyTorch's precompile cache (TORCH_CACHING_PRECOMPILE=1) keeps Dynamo's bytecode and
    # guards with the AOTAutograd graphs: a second process runs the compiled loss without
    # tracing anything; the fused AdamW is one pjrt op, nothing to trace.
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(tmp_path / "pjrt"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"),
               TORCH_CACHING_PRECOMPILE="1")

    def child(batch: int) -> dict:
        r = subprocess.run([PY, "-c", PRECOMPILE_CHILD, str(batch)], capture_output=True, text=True, env=env,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    cold = child(4)
    assert cold["frames"] >= 1 and cold["compiles"] > 0, cold
    warm = child(4)
    assert warm["frames"] == 0 and warm["compiles"] == 0, warm  # no Dynamo, no AOTAutograd, no XLA compile
    assert (warm["losses"], warm["params"]) == (cold["losses"], cold["params"])
    # (A shape the saved guards reject is traced anew in the cold process; in a warm one,
    # torch 2.13's Dynamo fails that retrace: "Name '__builtins_dict___0' already exists
    # in scope". README, "Compiling", says so.)
    for run in (cold, warm):
        assert abs(run["compiled"] - run["eager"]) <= 1e-5 * max(1.0, abs(run["eager"])), run
