#!/usr/bin/env python3
"""transformer.py: trains a stack of transformer blocks (self-attention +
MLP, pre-norm) on random token sequences for --steps steps. Arguments and
exit codes: torchjob.py; --seq (default 512), --dim (default 1024),
--layers (default 4), --vocab (default 32000)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchjob  # noqa: E402


def build(torch, a):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.n1 = nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.n2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            h = self.n1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.n2(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(a.vocab, a.dim)
            self.blocks = nn.Sequential(*[Block(a.dim, max(1, a.dim // 64)) for _ in range(a.layers)])
            self.head = nn.Linear(a.dim, a.vocab)

        def forward(self, tok):
            return self.head(self.blocks(self.emb(tok)))

    ce = nn.CrossEntropyLoss()
    return Model(), lambda out, y: ce(out.reshape(-1, a.vocab), y.reshape(-1))


def main():
    ap = torchjob.parser(__doc__)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    a = ap.parse_args()
    return torchjob.train(
        a, lambda torch: build(torch, a),
        lambda torch, dev: (torch.randint(0, a.vocab, (a.batch, a.seq), device=dev),
                            torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)))


if __name__ == "__main__":
    sys.exit(main())
