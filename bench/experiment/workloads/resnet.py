#!/usr/bin/env python3
"""resnet.py: trains a small ResNet-like CNN (no torchvision) on random
32x32 images for --steps steps. Arguments and exit codes: torchjob.py;
--width sets the channels of the first stage (default 64)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchjob  # noqa: E402


def build(torch, width):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                          if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + self.short(x))

    w = width
    layers = [nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
    cin = w
    for cout, stride in [(w, 1), (w, 1), (2 * w, 2), (2 * w, 1), (4 * w, 2), (4 * w, 1), (8 * w, 2), (8 * w, 1)]:
        layers.append(Block(cin, cout, stride))
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 100)]
    return nn.Sequential(*layers), nn.CrossEntropyLoss()


def main():
    ap = torchjob.parser(__doc__)
    ap.add_argument("--width", type=int, default=64)
    a = ap.parse_args()
    return torchjob.train(
        a, lambda torch: build(torch, a.width),
        lambda torch, dev: (torch.randn(a.batch, 3, 32, 32, device=dev),
                            torch.randint(0, 100, (a.batch,), device=dev)))


if __name__ == "__main__":
    sys.exit(main())
