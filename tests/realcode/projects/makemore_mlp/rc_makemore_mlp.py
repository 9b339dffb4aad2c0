"""A re-creation of the MLP language model of "Building makemore Part 2: MLP" (karpathy/nn-zero-to-hero
lectures/makemore/makemore_part2_mlp.ipynb, commit 73c3fcc741f0ec104ca850b1fb0df90e7e8d4cde; the Bengio et al.
2003 model of karpathy/makemore), in its final "now made respectable" form:

- vocabulary: '.' = 0 and the sorted letters 1..26 (stoi / itos);
- build_dataset(words): every name + '.' as (3 previous characters, next character) pairs, the context
  starting as [0, 0, 0];
- random.seed(42); random.shuffle(words); 80% / 10% / 10% train / dev / test split *by name*;
- parameters from torch.Generator().manual_seed(2147483647): C = randn(27, 10), W1 = randn(30, 200),
  b1 = randn(200), W2 = randn(200, 27), b2 = randn(27) — plain torch.randn, as in Part 2 (Part 3 is the
  lecture that rescales them);
- forward: emb = C[X]; h = tanh(emb.view(-1, 30) @ W1 + b1); logits = h @ W2 + b2; F.cross_entropy;
- 200,000 steps of a minibatch of 32 drawn with torch.randint (with replacement), p.grad = None,
  backward, p.data += -lr * p.grad with lr = 0.1 for i < 100,000 and 0.01 after;
- evaluation: the loss over the whole dev split.

Changed for the plugin, without changing the maths: the five tensors live in an nn.Module as Parameters;
the update p.data += -lr * p.grad is torch.optim.SGD(lr=0.1) (no momentum, no weight decay: the same
update) and the step drop is a LambdaLR (x0.1 from step 100,000); the randint minibatch is a DataLoader
whose RandomSampler draws with replacement. Shrunk: 320 names instead of 32,032 (rc_makemore_names.py)."""

import random

import torch
import torch.nn.functional as F
from rc_makemore_names import WORDS
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

block_size = 3  # context length: how many characters do we take to predict the next one?
n_embd = 10
n_hidden = 200
batch_size = 32
max_steps = 200000
lr_drop_at = 100000

words = list(WORDS)
chars = sorted(list(set("".join(words))))
stoi = {s: i + 1 for i, s in enumerate(chars)}
stoi["."] = 0
itos = {i: s for s, i in stoi.items()}
vocab_size = len(itos)  # 27


def build_dataset(words):
    X, Y = [], []
    for w in words:
        context = [0] * block_size
        for ch in w + ".":
            ix = stoi[ch]
            X.append(context)
            Y.append(ix)
            context = context[1:] + [ix]  # crop and append
    return torch.tensor(X), torch.tensor(Y)


random.seed(42)
random.shuffle(words)
n1 = int(0.8 * len(words))
n2 = int(0.9 * len(words))
Xtr, Ytr = build_dataset(words[:n1])
Xdev, Ydev = build_dataset(words[n1:n2])
Xte, Yte = build_dataset(words[n2:])


class MLP(torch.nn.Module):
    """C, W1, b1, W2, b2 of the notebook, drawn from the notebook's generator."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(2147483647)  # for reproducibility
        self.C = torch.nn.Parameter(torch.randn((vocab_size, n_embd), generator=g))
        self.W1 = torch.nn.Parameter(torch.randn((n_embd * block_size, n_hidden), generator=g))
        self.b1 = torch.nn.Parameter(torch.randn(n_hidden, generator=g))
        self.W2 = torch.nn.Parameter(torch.randn((n_hidden, vocab_size), generator=g))
        self.b2 = torch.nn.Parameter(torch.randn(vocab_size, generator=g))

    def forward(self, X):
        emb = self.C[X]  # (32, 3, 10)
        h = torch.tanh(emb.view(-1, n_embd * block_size) @ self.W1 + self.b1)  # (32, 200)
        return h @ self.W2 + self.b2  # (32, 27)


def make_training():
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # p.data += -lr * p.grad
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0 if i < lr_drop_at else 0.1)
    return {"model": model, "optimizer": optimizer, "lr_scheduler": scheduler}


def train_step(state, batch, index):
    """One iteration of `for i in range(200000)`."""
    model, optimizer, scheduler = state["model"], state["optimizer"], state["lr_scheduler"]
    Xb, Yb = batch
    logits = model(Xb)
    loss = F.cross_entropy(logits, Yb)
    for p in model.parameters():
        p.grad = None
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss


def train_loader():
    """ix = torch.randint(0, Xtr.shape[0], (32,)) at every step: a sampler drawing with replacement."""
    data = TensorDataset(Xtr, Ytr)
    return DataLoader(
        data, batch_size=batch_size, sampler=RandomSampler(data, replacement=True, num_samples=batch_size * max_steps)
    )


def dev_loader():
    """The notebook evaluates the dev split in one forward."""
    return DataLoader(TensorDataset(Xdev, Ydev), batch_size=Xdev.shape[0])


@torch.no_grad()
def split_loss(model, X, Y):
    return F.cross_entropy(model(X), Y).item()
