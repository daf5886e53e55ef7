#!/usr/bin/env python3
"""suspend-torch.py: a deterministic PyTorch training loop for checking that
a job suspended through the driver's checkpoint API (bench-suspend --pid)
carries on where it stopped with the same numbers.

Trains an MLP on fixed random data with deterministic algorithms; prints
"step N loss L t=SECONDS" every --every steps and "final L" at the end, and
writes its PID to --pidfile once the model is on the GPU. Two runs with the
same --seed print the same losses, bit for bit, whether or not the process
was suspended and resumed in between; the t= stamps show the pause.
"""
import argparse
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=3000)
ap.add_argument("--every", type=int, default=250)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--width", type=int, default=4096)
ap.add_argument("--pidfile", default="")
a = ap.parse_args()

torch.manual_seed(a.seed)
torch.use_deterministic_algorithms(True)
dev = torch.device("cuda")
w = a.width
model = torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(),
                            torch.nn.Linear(w, w), torch.nn.ReLU(),
                            torch.nn.Linear(w, 10)).to(dev)
x = torch.randn(512, w, device=dev)
y = torch.randint(0, 10, (512,), device=dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()
torch.cuda.synchronize()
if a.pidfile:
    with open(a.pidfile, "w") as f:
        f.write("%d\n" % os.getpid())
t0 = time.time()
for step in range(a.steps):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    if step % a.every == 0:
        print("step %d loss %.9f t=%.2f" % (step, loss.item(), time.time() - t0),
              flush=True)
torch.cuda.synchronize()
print("final %.9f reserved=%d t=%.2f" % (loss.item(), torch.cuda.memory_reserved(),
                                         time.time() - t0), flush=True)
