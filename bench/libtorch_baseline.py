"""The float32 baseline against libtorch's defaults: a CIFAR ResNet-20 (16-32-64 channels,
batch norm, ReLU, identity and 1x1-convolution shortcuts, as fp8lab's models::CifarResNet)
written in plain PyTorch, one SGD step (momentum 0.9) on a random batch, best of N steps,
in the default layout (NCHW) and channels-last. Same libtorch (the torch of .venv, which
bench_train links), same thread count as bench_train.

    .venv/bin/python bench/libtorch_baseline.py [batch] [steps]
"""
import sys
import time

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.shortcut is None else self.shortcut(x)))


def resnet20():
    layers = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            layers.append(Block(cin, cout, stride if i == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def best_step_ms(fmt, batch, steps):
    torch.manual_seed(0)
    model = resnet20().to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 32, 32).contiguous(memory_format=fmt)
    t = torch.randint(0, 10, (batch,))
    best = float("inf")
    for i in range(steps + 2):
        t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), t).backward()
        opt.step()
        if i >= 2:
            best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def main():
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    torch.set_num_threads(2)
    for name, fmt in (("NCHW (default)", torch.contiguous_format), ("channels-last", torch.channels_last)):
        print(f"ResNet-20 b{batch}, libtorch {torch.__version__}, {name}: {best_step_ms(fmt, batch, steps):.1f} ms")


if __name__ == "__main__":
    main()
