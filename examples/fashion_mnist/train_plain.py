"""Fashion-MNIST, a small ResNet-style CNN with GroupNorm, in plain PyTorch."""
import gzip
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DATA = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


def load(split):  # "train" or "t10k": images [n, 1, 28, 28] in [0, 1], labels
    with gzip.open(f"{DATA}/{split}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{DATA}/{split}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return TensorDataset(torch.tensor(x / np.float32(255)), torch.tensor(y).long())


def conv(c_in, c_out, stride=1):  # 3x3 convolution, then GroupNorm
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.GroupNorm(4, c_out))


class Block(nn.Module):  # a residual block: two convolutions and the shortcut
    def __init__(self, c):
        super().__init__()
        self.conv1, self.conv2 = conv(c, c), conv(c, c)

    def forward(self, x):
        return F.relu(x + self.conv2(F.relu(self.conv1(x))))


class Net(nn.Module):  # 28x28 -> 14x14x16 -> 7x7x32 -> 10 classes
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(conv(1, 16, 2), nn.ReLU(), Block(16),
                                    conv(16, 32, 2), nn.ReLU(), Block(32))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(self.layers(x).mean((2, 3)))


def evaluate(model, data):  # accuracy and mean loss on a dataset
    with torch.no_grad():
        logits = torch.cat([model.eval()(x) for x, _ in DataLoader(data, batch_size=500)])
    model.train()
    y = data.tensors[1]
    return {"accuracy": (logits.argmax(1) == y).float().mean().item(),
            "loss": F.cross_entropy(logits, y).item()}


def main():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(load("train"), batch_size=32, shuffle=True)
    for epoch in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: {evaluate(model, load('t10k'))}")


if __name__ == "__main__":
    main()
