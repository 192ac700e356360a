"""Reference for tests/train/checkpoint.cpp: second-order gradients through
torch.utils.checkpoint.checkpoint(use_reentrant=False), on the same tiny double-precision models as
the C++ test (weights from sin/cos of aranges, no RNG). Prints one line per gradient,
"<experiment> <name> <values...>", or "<experiment> <name> none" for a gradient that is None:
  penalty  a WGAN-GP gradient penalty: x_hat = eps * real + (1 - eps) * G(z), the segment
           tanh(b(tanh(a(x_hat)))) checkpointed, g = d head(segment(x_hat)) / d x_hat by
           torch.autograd.grad(create_graph=True), penalty = mean((|g|_2 - 1)^2), penalty.backward().
  first    loss.backward(create_graph=True) through the same segment (b checkpointed inside it as
           well), x upstream of the segment: the gradients.
  hessian  then (|a.weight.grad|^2 + |x.grad|^2).backward(): the gradients of those."""
import torch
from torch.utils.checkpoint import checkpoint

torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)


def linear(inputs, outputs, k):
    m = torch.nn.Linear(inputs, outputs)
    with torch.no_grad():
        m.weight.copy_(torch.sin(torch.arange(inputs * outputs) * 0.37 + k).reshape(outputs, inputs) * 0.5)
        m.bias.copy_(torch.cos(torch.arange(outputs) * 0.5 + k) * 0.1)
    return m


def models():
    return {"G": linear(3, 4, 0), "a": linear(4, 8, 1), "b": linear(8, 8, 2), "head": linear(8, 1, 3)}


def show(experiment, named):
    for name, t in named:  # "none" for a gradient that is None
        values = ["none"] if t is None else [f"{v:.17g}" for v in t.detach().flatten().tolist()]
        print(experiment + " " + name + " " + " ".join(values))


def params(m):
    return [(f"{n}.{p}", getattr(m[n], p).grad) for n in ("G", "a", "b", "head") for p in ("weight", "bias")]


# penalty
m = models()
real = torch.sin(torch.arange(20) * 0.3).reshape(5, 4)
z = torch.cos(torch.arange(15) * 0.7).reshape(5, 3)
eps = torch.linspace(0.1, 0.9, 5).reshape(5, 1)
x_hat = eps * real + (1 - eps) * m["G"](z)
segment = lambda t: torch.tanh(m["b"](torch.tanh(m["a"](t))))
d = m["head"](checkpoint(segment, x_hat, use_reentrant=False))
(g,) = torch.autograd.grad(d.sum(), x_hat, create_graph=True)
((g.norm(2, dim=1) - 1) ** 2).mean().backward()
show("penalty", params(m))

# hessian
m = models()
x = torch.sin(torch.arange(20) * 0.21).reshape(5, 4).requires_grad_()
nested = lambda t: torch.tanh(checkpoint(lambda u: m["b"](u), torch.tanh(m["a"](t)), use_reentrant=False))
loss = m["head"](checkpoint(nested, x * 2 + 0.1, use_reentrant=False)).pow(2).sum()
loss.backward(create_graph=True)
show("first", [("x", x.grad)] + params(m)[2:])
s = m["a"].weight.grad.pow(2).sum() + x.grad.pow(2).sum()
for p in [x] + [getattr(m[n], q) for n in m for q in ("weight", "bias")]:
    p.grad = None
s.backward()
show("hessian", [("x", x.grad)] + params(m)[2:])
