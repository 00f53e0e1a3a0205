"""A script that ran a backward on pjrt exits cleanly (torch_pjrt/_autograd_exit.py).

The crash it prevents (exit 134, "terminate called without an active exception") comes
when the device's autograd thread drops a finished backward's state, which holds a
Python object, after the interpreter began to finalize. What the exit handler does is
checked directly: once it returns, the autograd thread holds nothing of the last
backward. The child keeps the GIL (a long switch interval) and slows the autograd
thread, so without the handler's wait that thread still holds the backward's state in
most runs."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import atexit, json, os, sys
calls = []
atexit.register(lambda: print(json.dumps({"drained_at_exit": len(calls)})))  # runs after torch_pjrt's
import torch, torch_pjrt
from torch_pjrt import _autograd_exit
drain = _autograd_exit.drain_device_threads
_autograd_exit.drain_device_threads = lambda: (calls.append(1), drain())
contexts = []
os.sched_setaffinity(0, {0})  # the autograd thread, made at the first backward, shares this CPU

def hook(grad):  # runs on the device's autograd thread, in the backward's thread-local state
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # it wakes after this thread
    contexts.append(torch._C._get_obj_in_tls("context"))  # what torch's backward stashed there
    return grad

leaf = torch.ones(3).to("pjrt").requires_grad_()
leaf.register_hook(hook)
sys.setswitchinterval(100)  # this thread keeps the GIL, which the autograd thread needs to let go
(leaf * 2).sum().backward()
drain()
# References left: `contexts` and getrefcount's argument; a third would be the autograd thread's.
refs = sys.getrefcount(contexts[0])
compiles = torch_pjrt.metrics()["compiles"]
drain()
print(json.dumps({"refs": refs, "grad": leaf.grad.cpu().tolist(),
                  "drain_compiles": torch_pjrt.metrics()["compiles"] - compiles}))
"""


def test_the_exit_handler_waits_until_no_autograd_thread_holds_a_finished_backward() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.strip().splitlines()[-2:]]
    assert lines[0]["grad"] == [2.0, 2.0, 2.0]
    assert lines[0]["refs"] == 2, lines
    assert lines[0]["drain_compiles"] == 0, lines  # a view's backward on empty tensors: no program
    assert lines[1] == {"drained_at_exit": 1}, lines  # the handler ran at exit, once
