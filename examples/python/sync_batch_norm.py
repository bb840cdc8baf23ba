"""Data-parallel training with normgrad.torch.SyncBatchNorm on two processes.

Each process (gloo on loopback, as torch.distributed runs on one machine)
holds half the batch of a small CNN whose batch norms
`normgrad.torch.convert_sync_batchnorm` swapped, wrapped in
DistributedDataParallel. The batch norms' statistics and backward sums are
all-reduced, so both processes train exactly like one process on the whole
batch; the script checks that against torch's own BatchNorm on the full
batch and prints both loss curves.

Run: PYTHONPATH=build/python /usr/bin/python3 examples/python/sync_batch_norm.py
"""
import os
import tempfile

import torch
import torch.distributed as dist

import normgrad.ranks

STEPS = 5


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1, stride=2), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10))


def data():
    torch.manual_seed(1)
    return torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))


def train(net, x, y):
    # The loss of a half batch is a mean over half the images: DDP averages the
    # two processes' gradients, which gives the full batch's mean-loss gradient.
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def worker(rank, workdir):
    """One process of two: normgrad.ranks.run_ranks has joined it to the
    process group (gloo, meeting through a file in workdir)."""
    import normgrad.torch as ngt
    net = torch.nn.parallel.DistributedDataParallel(ngt.convert_sync_batchnorm(model()))
    x, y = data()
    half = slice(rank * 8, rank * 8 + 8)
    losses = train(net, x[half], y[half])
    torch.save({"losses": losses, "state": net.module.state_dict()},
               os.path.join(workdir, "%d.pt" % rank))
    # Both processes past their last collective before either leaves (the
    # runner then ends each process at once, with no teardown to wait in).
    dist.barrier()


def main():
    with tempfile.TemporaryDirectory() as d:
        normgrad.ranks.run_ranks(worker, 2, workdir=d)
        runs = [torch.load(os.path.join(d, "%d.pt" % r)) for r in range(2)]
    x, y = data()
    ref = model()
    ref_losses = train(ref, x, y)
    mean_losses = [(a + b) / 2 for a, b in zip(runs[0]["losses"], runs[1]["losses"])]
    print("one process, torch BatchNorm, full batch:", " ".join("%.5f" % v for v in ref_losses))
    print("two processes, normgrad SyncBatchNorm:   ", " ".join("%.5f" % v for v in mean_losses))
    worst = 0.0
    for k, v in ref.state_dict().items():
        for r in runs:
            w = r["state"][k]
            if v.is_floating_point():
                worst = max(worst, ((w - v).norm() / v.norm().clamp_min(1e-12)).item())
    print("weights and running statistics after %d steps, worst relative difference: %.1e"
          % (STEPS, worst))
    assert worst < 1e-4, "the two processes did not train like one"
    print("sync batch norm: ok")


if __name__ == "__main__":
    main()
