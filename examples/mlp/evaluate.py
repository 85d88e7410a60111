"""The evaluator of a site for examples/mlp/train.py's model: test accuracy
and mean cross-entropy on the job's test set (normalised as the site
servers normalise it), and the same on a fixed sample of the site's
training share for the site's own questions (ADSP's loss evaluations,
SkewScout's scores).

    evaluator { command: ["python3", "evaluate.py", "--hidden", "256"] }
"""
import argparse

import meridian
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from train import Mlp


def evaluate(model, data):
    """{"accuracy", "loss"} of `model` on a TensorDataset, and its size."""
    logits = torch.cat([model(x) for x, _ in DataLoader(data, batch_size=1000)])
    labels = data.tensors[1]
    return ({"accuracy": (logits.argmax(1) == labels).float().mean().item(),
             "loss": F.cross_entropy(logits, labels).item()}, len(data))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, nargs="*", default=[256])
    parser.add_argument("--sample", type=int, default=2000,
                        help="training samples of a TRAINING_SAMPLE task")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the machine's cores are shared by the job
    validation = meridian.data.fashion_mnist_validation()
    sample = meridian.data.fashion_mnist_training_sample(samples=args.sample)
    model = Mlp([validation[0][0].numel(), *args.hidden, 10])
    meridian.Evaluator(model).serve(
        validation=lambda m: evaluate(m, validation),
        training_sample=lambda m: evaluate(m, sample))


if __name__ == "__main__":
    main()
