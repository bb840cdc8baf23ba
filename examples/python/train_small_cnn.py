"""Trains a small CNN twice from the same seed: with torch's BatchNorm2d and
with normgrad.torch's (convert), and prints both loss curves and where the
backward ran. Run: PYTHONPATH=build/python /usr/bin/python3 examples/python/train_small_cnn.py"""
import torch

import normgrad
import normgrad.torch as ngt


def model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, padding=1, stride=2), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10))


def train(net, data, labels, steps=20):
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(data), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    torch.manual_seed(0)
    data = torch.randn(32, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (32,))
    a = model()
    b = model()
    b.load_state_dict(a.state_dict())
    ngt.convert(b)
    la = train(a, data, labels)
    with ngt.recording() as ran:  # the compiled graphs the normgrad model runs
        lb = train(b, data, labels)
    for step in (0, 9, 19):
        print("step %2d  torch %.6f  normgrad %.6f" % (step, la[step], lb[step]))
    worst = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
    print("largest relative difference of the losses: %.1e" % worst)
    kernels = sorted({p.kernel for cg in ran for p in cg.partitions})
    print("normgrad %s ran: %s" % (normgrad.__version__, ", ".join(kernels)))
    if worst > 1e-4:
        raise SystemExit("the loss curves differ")


if __name__ == "__main__":
    main()
