"""A GPT-style language model on the Brown corpus, in plain PyTorch."""
import time

import torch
from torch.utils.data import DataLoader

import brown
import lm
from model import GPT, optimizer


def main():
    args = lm.options(__doc__)
    torch.set_num_threads(1)  # one core per process (see docs/language-model.md)
    torch.manual_seed(args.seed)
    texts = lm.load_corpus()
    tok = lm.tokenizer(texts, args.model.vocab_size)
    names = brown.training_texts(list(texts))
    validation = lm.spread(lm.windows(lm.texts_of(texts, brown.validation_texts(list(texts))),
                                      tok, args.model.context), args.eval_windows)
    model = GPT(args.model)
    opt = optimizer(model, args.lr)
    schedule = lm.warmup(opt, args.warmup)
    loader = DataLoader(lm.windows(lm.texts_of(texts, names), tok, args.model.context),
                        batch_size=args.batch, shuffle=True, drop_last=True)
    start, step, done = time.monotonic(), 0, False
    while not done:
        for batch in loader:
            loss = model.loss(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
            step += 1
            elapsed = time.monotonic() - start
            done = elapsed >= 60 * args.minutes or step == args.steps
            if step % args.report_every == 0 or done:
                metrics = lm.evaluate(model.eval(), validation)
                model.train()
                print("%6.0f s  step %6d  train loss %.3f  validation loss %.3f  "
                      "perplexity %.1f" % (elapsed, step, loss.item(), metrics["loss"],
                                           metrics["perplexity"]), flush=True)
            if done:
                break


if __name__ == "__main__":
    main()
