"""A GPT-style language model on the Brown corpus, trained with Meridian:
each worker trains on its share of its site's texts with AdamW."""
import os

import meridian
import torch
from torch.utils.data import DataLoader

import brown
import lm
from model import GPT, optimizer


def main():
    args = lm.options(__doc__)
    torch.set_num_threads(1)  # one core per process (see docs/language-model.md)
    torch.manual_seed(args.seed)
    model = GPT(args.model)
    if args.write_weights:  # the initial weights every site starts from
        # Where the job wants them (model.weights_command), else here.
        path = os.environ.get("MERIDIAN_WEIGHTS", "initial.safetensors")
        return meridian.save_initial_weights(model, path,
                                             {"model": repr(args.model)})
    texts = lm.load_corpus()
    tok = lm.tokenizer(texts, args.model.vocab_size)
    site, sites, worker, workers = lm.place()
    names = brown.worker_texts(brown.site_texts(list(texts), sites, site, args.split),
                               workers, worker)
    opt = optimizer(model, args.lr)
    schedule = lm.warmup(opt, args.warmup)
    loader = DataLoader(lm.windows(lm.texts_of(texts, names), tok, args.model.context),
                        batch_size=args.batch, shuffle=True, drop_last=True)
    with meridian.Session(model, opt) as session:  # joins this worker's site
        for batch in session.batches(loader):  # epoch after epoch, until the job ends
            loss = model.loss(batch)
            opt.zero_grad()
            loss.backward()
            session.step(loss)  # opt.step(), then commit and pull as the site plans
            schedule.step()


if __name__ == "__main__":
    main()
