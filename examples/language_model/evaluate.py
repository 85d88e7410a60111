"""The evaluator of a site (one per site): the validation perplexity and
loss of the site's model snapshots on the held-out texts, and the loss on a
fixed sample of the site's own training texts (the intra-site policy's
loss evaluations, SkewScout's scores)."""
import meridian
import torch

import brown
import lm
from model import GPT

args = lm.options(__doc__)
torch.set_num_threads(1)  # the machine's cores are shared by every process of the job
texts = lm.load_corpus()
tok = lm.tokenizer(texts, args.model.vocab_size)
held_out = lm.texts_of(texts, brown.validation_texts(list(texts)))
validation = lm.spread(lm.windows(held_out, tok, args.model.context), args.eval_windows)
site, sites, _, _ = lm.place()
own = lm.texts_of(texts, brown.site_texts(list(texts), sites, site, args.split))
sample = lm.spread(lm.windows(own, tok, args.model.context), args.sample_windows)
meridian.Evaluator(GPT(args.model)).serve(
    validation=lambda model: (lm.evaluate(model, validation), len(validation)),
    training_sample=lambda model: (lm.evaluate(model, sample), len(sample)))
