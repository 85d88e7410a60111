"""The evaluator of a site: scores the site's model snapshots (`meridian run` starts one per site)."""
import meridian
import torch

from train import Net, evaluate, load

torch.set_num_threads(1)  # the machine's cores are shared by every process of the job
validation = load("t10k")
sample = meridian.data.fashion_mnist_training_sample(samples=1000)  # of this site's share
meridian.Evaluator(Net()).serve(
    validation=lambda model: (evaluate(model, validation), len(validation)),
    training_sample=lambda model: (evaluate(model, sample), len(sample)))
