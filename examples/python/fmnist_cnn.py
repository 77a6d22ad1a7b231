#!/usr/bin/env python3
"""A plain PyTorch training script: a small ResNet (the quickstart's CIFAR ResNet-8, width 16)
on Fashion-MNIST, trained in 8 bits by fp8lab with the lines marked "fp8lab".

    python3 examples/python/fmnist_cnn.py                      # the paper's mixed 1.4.3/1.5.2 recipe
    python3 examples/python/fmnist_cnn.py --recipe fp32        # plain PyTorch, no fp8lab
    python3 examples/python/fmnist_cnn.py --recipe resnet32-152 --loss-scale backoff --db results.db

The training settings are those of `fp8lab quickstart` (SGD with momentum 0.9, weight decay
5e-4, learning rate 0.1 divided by 10 at 50 % and 75 % of the steps, batch 128, 2 epochs).
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import Progress, fashion_mnist, use_cores

import fp8lab.torch as ft  # fp8lab


class BasicBlock(nn.Module):
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
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet8(nn.Module):
    def __init__(self, width=16, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.stages = nn.Sequential(BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2),
                                    BasicBlock(2 * width, 4 * width, 2))
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x):
        y = self.stages(F.relu(self.bn(self.stem(x))))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


def accuracy(model, x, y, batch=1000):
    model.eval()
    with torch.no_grad():
        right = sum((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item() for i in range(0, len(x), batch))
    model.train()
    return 100.0 * right / len(x)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="resnet32-mixed", help="fp32, a recipe preset, a line or a .toml file")
    p.add_argument("--loss-scale", default="none", help="none, static:K, backoff, logmax:c=1, ...")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="libtorch threads (0: every core)")
    p.add_argument("--train-limit", type=int, default=0, help="use only the first N training images")
    p.add_argument("--db", help="record the run in this fp8lab results store")
    a = p.parse_args()
    use_cores(a.threads)
    xtr, ytr, xte, yte = fashion_mnist()
    if a.train_limit:
        xtr, ytr = xtr[:a.train_limit], ytr[:a.train_limit]
    torch.manual_seed(a.seed)
    model = ResNet8()
    scaler = None
    if a.recipe != "fp32":
        model = ft.quantize_model(model, a.recipe, seed=a.seed)  # fp8lab
        scaler = ft.LossScaler(a.loss_scale, recipe=a.recipe)  # fp8lab
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    steps_per_epoch = (len(xtr) + a.batch - 1) // a.batch
    total = steps_per_epoch * a.epochs
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [int(0.5 * total), int(0.75 * total)], 0.1)
    run = ft.RunRecorder(a.db, "python-fmnist-resnet8", model=model if scaler else None, scaler=scaler,
                         seed=a.seed, config=vars(a)) if a.db else None
    gen = torch.Generator().manual_seed(a.seed)
    bar = Progress(total)
    step, loss_ema = 0, None
    for epoch in range(a.epochs):
        order = torch.randperm(len(xtr), generator=gen)
        for i in range(0, len(xtr), a.batch):
            idx = order[i:i + a.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()  # fp8lab
                scaler.step(opt)  # fp8lab
                scaler.update()
            sched.step()
            step += 1
            loss_ema = loss.item() if loss_ema is None else 0.98 * loss_ema + 0.02 * loss.item()
            bar.update(step, f"epoch {epoch + 1} loss {loss_ema:.3f}")
            if run and step % 50 == 0:
                run.log(step, train_loss=loss.item())
        acc = accuracy(model, xte, yte)
        print(f"epoch {epoch + 1}: test accuracy {acc:.2f} %, train loss {loss_ema:.3f}")
        if run:
            run.log(step, test_accuracy=acc)
    if scaler is not None:
        print(ft.quant_state(model))
        print(f"loss scale 2^{scaler.trace[-1][1] if scaler.trace else 0}, skipped steps {scaler.skipped_steps}")
    if run:
        run.finish(acc, "test_accuracy")
    print(f"recipe {a.recipe}: test accuracy {acc:.2f} %")


if __name__ == "__main__":
    main()
