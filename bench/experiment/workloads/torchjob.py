"""torchjob.py: what the kit's PyTorch workloads share (issue 6).

Arguments common to resnet.py and transformer.py:
  --steps N          training steps on random data
  --batch B          batch size
  --footprint-gib G  hold at least G GiB on the GPU: after the first step a
                     "ballast" tensor tops the job up to G GiB (a stand-in
                     for a bigger model), so the peak is known in advance
  --cpu-ms MS        CPU work per step (an input pipeline), default 0
  --grow-steps K     reach --footprint-gib in K equal steps spread over the
                     run (at steps 0, N/K, 2N/K, ...) instead of all after
                     the first step: a job that grows, like a model whose
                     activations or caches grow (issue 12's growing mix)
Exit: 0 done, 2 CUDA out of memory, 3 no CUDA device or torch missing,
4 the ballast's data changed (it is checked at the end: a job suspended
and resumed must find it intact).
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
    ap.add_argument("--grow-steps", type=int, default=1)
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
    ballast = []
    # The step at which each growth happens -> the footprint to reach
    # there (a later growth at the same step wins: it asks for more).
    k = max(args.grow_steps, 1)
    grow_at = {}
    for i in range(k):
        grow_at[(i * args.steps) // k] = args.footprint_gib * (i + 1) / k
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
            if step in grow_at:
                torch.cuda.synchronize()
                want = int(grow_at[step] * 2**30) - torch.cuda.memory_reserved()
                if want > 0:
                    b = torch.empty(want, dtype=torch.uint8, device=dev)
                    b.fill_(1)
                    ballast.append(b)
                    if k > 1:
                        print("step %d grew to %.1f GiB reserved" % (
                            step, torch.cuda.memory_reserved() / 2**30), flush=True)
            if step % 50 == 0:
                print("step %d loss %.4f" % (step, loss.item()), flush=True)
        torch.cuda.synchronize()
        print("steps=%d seconds=%.1f" % (args.steps, time.time() - t0))
        print("peak_bytes=%d" % torch.cuda.max_memory_reserved())
        # Every ballast byte is still 1: nothing lost or moved in a
        # suspension (min and max: reductions with no temporary the size
        # of the ballast).
        for b in ballast:
            if int(b.min()) != 1 or int(b.max()) != 1:
                print("ballast changed", file=sys.stderr)
                return 4
        del ballast
        return 0
    except (RuntimeError, MemoryError) as e:
        if is_oom(e):
            print("out of memory: %s" % str(e).splitlines()[0], file=sys.stderr)
            return 2
        raise
