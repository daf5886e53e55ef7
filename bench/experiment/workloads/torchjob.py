"""torchjob.py: what the kit's PyTorch workloads share (issue 6).

Arguments common to resnet.py and transformer.py:
  --steps N          training steps on random data
  --batch B          batch size
  --footprint-gib G  hold at least G GiB on the GPU: after the first step a
                     "ballast" tensor tops the job up to G GiB (a stand-in
                     for a bigger model), so the peak is known in advance
  --cpu-ms MS        CPU work per step (an input pipeline), default 0
Exit: 0 done, 2 CUDA out of memory, 3 no CUDA device or torch missing.
Prints "peak_bytes=N": torch.cuda.max_memory_reserved() (the CUDA
context, about 0.5 GiB, comes on top). torch is imported only at run time.
"""
import argparse
import sys
import time


def parser(description):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--footprint-gib", type=float, default=0)
    ap.add_argument("--cpu-ms", type=float, default=0)
    ap.add_argument("--seed", type=int, default=0)
    return ap


def is_oom(e):
    return "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"


def train(args, build, batch_fn):
    """build(torch) -> (model, loss_fn); batch_fn(torch, device) -> (x, y)."""
    try:
        import torch
    except ImportError:
        print("torch is not installed", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 3
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    ballast = None
    try:
        model, loss_fn = build(torch)
        model = model.to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        t0 = time.time()
        for step in range(args.steps):
            if args.cpu_ms > 0:
                end = time.time() + args.cpu_ms / 1000.0
                x = 0.0
                while time.time() < end:
                    x += 1.0
            x, y = batch_fn(torch, dev)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            if step == 0:
                torch.cuda.synchronize()
                want = int(args.footprint_gib * 2**30) - torch.cuda.memory_reserved()
                if want > 0:
                    ballast = torch.empty(want, dtype=torch.uint8, device=dev)
                    ballast.fill_(1)
            if step % 50 == 0:
                print("step %d loss %.4f" % (step, loss.item()), flush=True)
        torch.cuda.synchronize()
        print("steps=%d seconds=%.1f" % (args.steps, time.time() - t0))
        print("peak_bytes=%d" % torch.cuda.max_memory_reserved())
        del ballast
        return 0
    except (RuntimeError, MemoryError) as e:
        if is_oom(e):
            print("out of memory: %s" % str(e).splitlines()[0], file=sys.stderr)
            return 2
        raise
